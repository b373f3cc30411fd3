//! `warden plugin new NAME --kind KIND --lang rust|python`: a plugin project that builds
//! anywhere — the WIT of this warden vendored into `wit/`, versions pinned, the plugin's
//! name and kind filled in, a sample `warden.yaml` and a README with the build and test
//! commands. The templates are the repository's `templates/` folders, embedded at build
//! time. It never overwrites an existing directory.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use warden_guest_build::{COMPONENTIZE_PY, DEBIAN_PACKAGES, WASM_TARGET};

/// The current WIT version this binary hosts (`wit/0.3.0`), vendored into every new project.
const WIT: &[(&str, &str)] = &[
    ("world.wit", include_str!("../../../wit/0.3.0/world.wit")),
    ("types.wit", include_str!("../../../wit/0.3.0/types.wit")),
    ("imports.wit", include_str!("../../../wit/0.3.0/imports.wit")),
    ("exports.wit", include_str!("../../../wit/0.3.0/exports.wit")),
];
/// Embeds files of a folder of this repository under their names relative to it.
macro_rules! embed {
    ($dir:literal: $($file:literal),* $(,)?) => {
        &[$(($file, include_str!(concat!("../../../", $dir, "/", $file)))),*]
    };
}

/// The Rust guest SDK (`sdk/rust`), vendored into a Rust project as `warden-guest/` (with
/// the WIT in `warden-guest/wit/`), so the project builds with no warden checkout.
/// `embedded_sdk_lists_every_file` keeps this list complete.
const SDK_RUST: &[(&str, &str)] = embed!("sdk/rust":
    "Cargo.toml", "src/alloc.rs", "src/bindings.rs", "src/cancel.rs", "src/clock.rs", "src/error.rs", "src/events.rs", "src/http.rs",
    "src/lib.rs", "src/log.rs", "src/metadata.rs", "src/model.rs", "src/plugin.rs", "src/resources.rs", "src/state.rs",
    "src/text.rs", "src/wire/http.rs", "src/wire/mod.rs", "src/wire/model.rs",
);
/// The Python guest SDK (`sdk/python/warden_guest`), vendored next to `app.py` (where
/// componentize-py's default path `.` finds it).
const SDK_PYTHON: &[(&str, &str)] = embed!("sdk/python/warden_guest":
    "__init__.py", "_wit.py", "cancel.py", "clock.py", "errors.py", "events.py", "http.py", "log.py", "metadata.py",
    "plugin.py", "state.py",
);
const RUST_CARGO_TOML: &str = include_str!("../../../templates/rust-plugin/Cargo.toml");
const RUST_CARGO_LOCK: &str = include_str!("../../../templates/rust-plugin/Cargo.lock");
const RUST_LIB: &str = include_str!("../../../templates/rust-plugin/src/lib.rs");
const PYTHON_APP: &str = include_str!("../../../templates/python-plugin/app.py");

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lang {
    Rust,
    Python,
}

/// Checks a plugin name (lower-case letters, digits, `-`; it becomes the file name and
/// the Rust package name) and a kind (`[A-Za-z0-9_-]`, as `meta.info` requires).
fn validate(name: &str, kind: &str) -> anyhow::Result<()> {
    let name_ok = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    anyhow::ensure!(name_ok, "NAME {name:?}: expected lower-case letters, digits and '-', starting with a letter");
    let kind_ok =
        !kind.is_empty() && kind.len() <= 64 && kind.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    anyhow::ensure!(kind_ok, "--kind {kind:?}: expected letters, digits, '_' and '-'");
    Ok(())
}

fn write(dir: &Path, rel: &str, text: &str) -> anyhow::Result<()> {
    let path = dir.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
}

pub fn new(name: &str, kind: &str, lang: Lang, dir: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    validate(name, kind)?;
    let dir = dir.unwrap_or_else(|| PathBuf::from(name));
    anyhow::ensure!(!dir.exists(), "{} already exists; choose another --dir", dir.display());
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    // The WIT is the contract: Python builds against `wit/`, the Rust SDK against its copy.
    let wit_dir = match lang {
        Lang::Rust => "warden-guest/wit",
        Lang::Python => "wit",
    };
    for (file, text) in WIT {
        write(&dir, &format!("{wit_dir}/{file}"), text)?;
    }
    let uri = format!("{}://example", kind.to_ascii_lowercase());
    // The plugin id the output is built and deployed under (its file stem, the key of its
    // grants): the Rust package's name, or a Python project's directory name, as
    // `warden plugin build` names it.
    let id = match lang {
        Lang::Rust => name.to_owned(),
        Lang::Python => std::path::absolute(&dir)
            .ok()
            .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| name.to_owned()),
    };
    let wasm = format!("target/{id}.wasm");
    let (build, needs) = match lang {
        Lang::Rust => {
            for (file, text) in SDK_RUST {
                write(&dir, &format!("warden-guest/{file}"), text)?;
            }
            let manifest = RUST_CARGO_TOML
                .replace("name = \"rust-plugin\"", &format!("name = \"{name}\""))
                .replace("path = \"../../sdk/rust\"", "path = \"warden-guest\"");
            // The template's header speaks of the repository; a project gets its own.
            let manifest = manifest.trim_start_matches(|c| c != '[');
            write(
                &dir,
                "Cargo.toml",
                &format!("# The warden protocol plugin `{name}`, made by `warden plugin new`.\n{manifest}"),
            )?;
            write(
                &dir,
                "Cargo.lock",
                &RUST_CARGO_LOCK.replace("name = \"rust-plugin\"", &format!("name = \"{name}\"")),
            )?;
            let lib = RUST_LIB
                .replace("\"rust-plugin\"", &format!("\"{name}\""))
                .replace("\"TEMPLATE\"", &format!("\"{kind}\""))
                .replace("kind `TEMPLATE`", &format!("kind `{kind}`"));
            write(&dir, "src/lib.rs", &lib)?;
            (
                format!("warden plugin build   # -> {wasm}"),
                format!(
                    "It needs a Rust toolchain for `{WASM_TARGET}` and uses whichever is present:\n`rustup target add {WASM_TARGET}`, or on Debian 12+\n`apt-get install {}`.\n\n",
                    DEBIAN_PACKAGES.join(" ")
                ),
            )
        }
        Lang::Python => {
            let app = PYTHON_APP
                .replace("NAME = \"python-plugin\"", &format!("NAME = \"{name}\""))
                .replace("KIND = \"TEMPLATE\"", &format!("KIND = \"{kind}\""))
                .replace("`python-plugin`", &format!("`{name}`"))
                .replace("kind `TEMPLATE`", &format!("kind `{kind}`"))
                .replace(
                    "componentize-py -d wit -w plugin componentize app -o python-plugin.wasm",
                    "warden plugin build",
                )
                .replace("python-plugin.wasm", &wasm)
                .replace("template://hello", &uri);
            write(&dir, "app.py", &app)?;
            for (file, text) in SDK_PYTHON {
                write(&dir, &format!("warden_guest/{file}"), text)?;
            }
            write(&dir, "requirements.txt", &format!("{COMPONENTIZE_PY}\n"))?;
            (
                format!(
                    "python3 -m venv .venv && .venv/bin/pip install -r requirements.txt   # once\nwarden plugin build   # -> {wasm}"
                ),
                "It runs componentize-py from `.venv`, else from `PATH`.\n\n".to_owned(),
            )
        }
    };
    write(
        &dir,
        "warden.yaml",
        &format!(
            "# A deployment that loads this plugin: copy {wasm} into ./plugins.\nplugins:\n  dir: ./plugins\n  grants:\n    {id}: {{ log: true }}   # grant only what the plugin asks for (warden plugin inspect)\nsubagents:\n  agent_dirs: []\n  references:\n    - {{ uri: \"{uri}\", kind: {kind}, metadata: {{ description: \"An example subagent\" }} }}\n"
        ),
    )?;
    write(
        &dir,
        "README.md",
        &format!(
            "# {name}\n\nA warden protocol plugin serving kind `{kind}`, made with `warden plugin new`.\n\n## Build\n\n```sh\n{build}\n```\n\n{needs}## Try it\n\n```sh\nwarden plugin inspect {wasm}\nwarden plugin test {wasm} --ref {uri} --grant log --prompt \"hello\"\n```\n\n## Deploy\n\nCopy `{wasm}` into the plugin directory of a running warden (it is loaded without a\nrestart) and grant it what it needs under `plugins.grants.{id}`; `warden.yaml` here is a\nstarting point. The WIT in `{wit_dir}/` is the version this project targets.\n"
        ),
    )?;
    out!("{}", dir.display());
    eprintln!("created a {lang:?} plugin `{name}` (kind {kind}) in {}; see its README.md", dir.display());
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file of the SDK folders is embedded (a new SDK module must not be missing from
    /// the projects `warden plugin new` makes).
    #[test]
    fn embedded_sdk_lists_every_file() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for (dir, embedded, ext) in [("sdk/rust/src", SDK_RUST, "rs"), ("sdk/python/warden_guest", SDK_PYTHON, "py")] {
            // Every file below `dir`, as a path relative to it (SDK modules may be folders).
            fn files(base: &Path, dir: &Path, ext: &str, out: &mut Vec<String>) {
                for e in std::fs::read_dir(dir).unwrap().flatten() {
                    let p = e.path();
                    if p.is_dir() && p.file_name().is_some_and(|n| n != "__pycache__") {
                        files(base, &p, ext, out);
                    } else if p.extension().is_some_and(|x| x == ext) {
                        out.push(p.strip_prefix(base).unwrap().to_string_lossy().into_owned());
                    }
                }
            }
            let mut on_disk = vec![];
            files(&root.join(dir), &root.join(dir), ext, &mut on_disk);
            on_disk.sort();
            let prefix = if ext == "rs" { "src/" } else { "" };
            let mut listed: Vec<String> = embedded
                .iter()
                .filter(|(f, _)| f.ends_with(ext))
                .map(|(f, _)| f.strip_prefix(prefix).unwrap_or(f).to_owned())
                .collect();
            listed.sort();
            assert_eq!(listed, on_disk, "{dir}");
        }
    }

    #[test]
    fn names_and_kinds_are_checked() {
        assert!(validate("json-rpc", "JSONRPC").is_ok());
        for (name, kind) in [("", "K"), ("Bad", "K"), ("1x", "K"), ("a_b", "K"), ("ok", ""), ("ok", "a b"), ("ok", "é")]
        {
            assert!(validate(name, kind).is_err(), "{name:?} {kind:?}");
        }
    }
}
