//! `warden plugin build [DIR]`: a plugin project → a component, for plugin authors.
//!
//! A `Cargo.toml` makes DIR a Rust plugin, built for `wasm32-unknown-unknown` with whichever
//! toolchain is present and encoded into a component inside warden (no wasm-tools); an
//! `app.py` makes it a Python plugin, built by componentize-py from DIR's `.venv` or `PATH`
//! against DIR's `wit/`. How is [`warden_guest_build`]'s, shared with `cargo xtask build`.
//! The component's path is the only line on stdout; then it is loaded as
//! `warden plugin inspect` loads it, so a build warden cannot load fails here, not at deploy.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use warden_guest_build::{CargoBuild, ComponentizePy, GuestManifest, Language, Profile, WasmToolchain};

use super::{EXIT_USAGE, Ungranted, esc, load_ungranted};
use crate::config::Config;

/// What `warden plugin build` was asked to do.
#[derive(clap::Args, Debug)]
pub struct BuildArgs {
    /// The plugin project: a Rust crate (Cargo.toml) or a Python plugin (app.py).
    #[arg(default_value = ".")]
    pub dir: PathBuf,
    /// Where to write the component (default: DIR/target/NAME.wasm, NAME being the Rust
    /// package's or the Python project directory's name).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Rust only: cargo's dev profile instead of --release (builds quicker; the component
    /// is larger and slower).
    #[arg(long)]
    pub debug: bool,
}

/// A plugin project directory and what it is.
/// Longest output name (`NAME.wasm`; the plugin id the file is deployed under): as long as
/// cargo's package names in practice, far below any file-name limit.
const MAX_NAME_LEN: usize = 64;

/// Checks a name the output file is made from (the Rust package's name as warden read it,
/// or the Python project's directory name): one path component of `[A-Za-z0-9_-]`, so a
/// crafted manifest can never make the build write outside `DIR/target/`.
fn checked_name(name: String, from: &str) -> anyhow::Result<String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    anyhow::ensure!(
        ok,
        "{from} {:?}: expected 1-{MAX_NAME_LEN} letters, digits, '_' or '-' (it names the output file); rename it or pass --out",
        crate::text::escape_control(&name)
    );
    Ok(name)
}

struct Project {
    /// As given: the default output path is made from it (`target/x.wasm`, not absolute).
    dir: PathBuf,
    /// Absolute, for messages (`.` says little) and for the build.
    full: PathBuf,
    language: Language,
    /// The output's file stem.
    name: String,
}

impl Project {
    fn open(dir: &Path) -> anyhow::Result<Self> {
        let full = std::path::absolute(dir).with_context(|| format!("resolving {}", dir.display()))?;
        anyhow::ensure!(
            full.is_dir(),
            "{}: not a directory; expected a plugin project (a Rust crate or a Python app.py)",
            full.display()
        );
        let Some(language) = Language::of_dir(&full) else {
            anyhow::bail!(
                "{}: no Cargo.toml (a Rust plugin) or app.py (a Python plugin) here; \
                 `warden plugin new NAME --kind KIND` makes a project",
                full.display()
            );
        };
        let name = match language {
            Language::Rust => {
                let manifest = full.join(language.marker());
                checked_name(
                    GuestManifest::read(&manifest)?.package_name,
                    &format!("{}: package name", manifest.display()),
                )?
            }
            Language::Python => {
                let wit = full.join("wit");
                anyhow::ensure!(
                    wit.is_dir(),
                    "{}: missing; a Python plugin is built against the WIT package in wit/ \
                     (`warden plugin new` vendors it)",
                    wit.display()
                );
                let real = std::fs::canonicalize(&full).with_context(|| format!("resolving {}", full.display()))?;
                let name = real.file_name().and_then(|n| n.to_str()).map(str::to_owned).with_context(|| {
                    format!("{}: the directory name is not usable as a file name; pass --out", real.display())
                })?;
                checked_name(name, &format!("{}: directory name", real.display()))?
            }
        };
        Ok(Project { dir: dir.to_owned(), full, language, name })
    }

    /// `DIR/target/NAME.wasm` (`target/NAME.wasm` for the current directory).
    fn default_out(&self) -> PathBuf {
        let out = self.dir.join("target").join(format!("{}.wasm", self.name));
        out.strip_prefix(".").map(Path::to_path_buf).unwrap_or(out)
    }

    /// Builds the component at `out`; progress on stderr.
    fn build(&self, out: &Path, profile: Profile) -> anyhow::Result<()> {
        if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        match self.language {
            Language::Rust => {
                let toolchain = WasmToolchain::detect()?;
                eprintln!(
                    "building the Rust plugin {} in {} ({})...",
                    self.name,
                    self.full.display(),
                    toolchain.describe()
                );
                let core = toolchain
                    .build(&self.full, &CargoBuild { profile, ..CargoBuild::default() })
                    .with_context(|| format!("building the Rust plugin in {}", self.full.display()))?;
                eprintln!("encoding {} as a component", core.display());
                warden_guest_build::encode_component(&core, out)?;
            }
            Language::Python => {
                let componentize = ComponentizePy::find(&self.full)?;
                eprintln!(
                    "building the Python plugin {} in {} ({})...",
                    self.name,
                    self.full.display(),
                    componentize.program().display()
                );
                componentize
                    .componentize(&self.full, &self.full.join("wit"), &[], out)
                    .with_context(|| format!("building the Python plugin in {}", self.full.display()))?;
            }
        }
        Ok(())
    }
}

pub async fn run(config: Config, args: BuildArgs) -> anyhow::Result<ExitCode> {
    let project = Project::open(&args.dir)?;
    anyhow::ensure!(
        !(args.debug && project.language == Language::Python),
        "--debug: only Rust plugins have build profiles ({} is a Python plugin)",
        project.full.display()
    );
    let profile = if args.debug { Profile::Debug } else { Profile::Release };
    let out = args.out.unwrap_or_else(|| project.default_out());
    anyhow::ensure!(
        out.file_name().is_some() && !out.is_dir(),
        "--out {}: expected a file path (the component is written there), not a directory",
        out.display()
    );
    let started = Instant::now();
    let written = out.clone();
    tokio::task::spawn_blocking(move || project.build(&written, profile)).await.context("the build panicked")??;
    out!("{}", out.display());
    let Ungranted { loaded, .. } = load_ungranted(&config, &out).await?;
    match loaded {
        Ok(plugin) => {
            let info = &plugin.info;
            let caps: Vec<_> = info.capabilities.iter().map(|c| c.name()).collect();
            eprintln!(
                "built {} {}: kinds {}, requests [{}] ({}, {:.1}s)",
                esc(&info.name),
                esc(&info.version),
                esc(&info.kinds.join(", ")),
                caps.join(", "),
                warden_guest_build::size_of(&out),
                started.elapsed().as_secs_f64()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("error: {}: built, but warden cannot load it: {}", out.display(), esc(&e.to_string()));
            Ok(ExitCode::from(EXIT_USAGE))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_project_is_named_by_its_package_or_directory() {
        let root = tempfile::tempdir().unwrap();
        let rust = root.path().join("dir-name");
        std::fs::create_dir_all(&rust).unwrap();
        std::fs::write(rust.join("Cargo.toml"), "[package]\nname = \"pkg-name\"\n").unwrap();
        let p = Project::open(&rust).unwrap();
        assert_eq!((p.language, p.name.as_str()), (Language::Rust, "pkg-name"));
        assert_eq!(p.default_out(), rust.join("target/pkg-name.wasm"));

        let py = root.path().join("py-proj");
        std::fs::create_dir_all(py.join("wit")).unwrap();
        std::fs::write(py.join("app.py"), "").unwrap();
        let p = Project::open(&py).unwrap();
        assert_eq!((p.language, p.name.as_str()), (Language::Python, "py-proj"));
        // The current directory gives a path relative to it.
        let here = Project { dir: ".".into(), full: "/p".into(), language: Language::Python, name: "x".into() };
        assert_eq!(here.default_out(), Path::new("target/x.wasm"));
    }

    /// Regression (review of issue 14): a manifest whose text fools warden's reading of the
    /// package name (cargo sees another) made the build write outside `DIR/target/`.
    #[test]
    fn a_name_that_is_not_one_plain_component_is_refused() {
        for bad in ["../../x", "a/b", "", ".", "..", "a b", "x\u{1b}]0;t", &"n".repeat(MAX_NAME_LEN + 1)] {
            let err = checked_name(bad.to_owned(), "Cargo.toml: package name").unwrap_err().to_string();
            assert!(err.contains("expected 1-64 letters") && !err.contains('\u{1b}'), "{bad:?}: {err}");
        }
        for good in ["rpc", "my-proto", "a_b-9", &"n".repeat(MAX_NAME_LEN)] {
            assert_eq!(checked_name(good.to_owned(), "x").unwrap(), good);
        }
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("Cargo.toml"), "[package]\nname = \"../../../escaped\"\n").unwrap();
        let err = format!("{:#}", Project::open(root.path()).err().unwrap());
        assert!(err.contains("package name") && err.contains("--out"), "{err}");
    }

    #[test]
    fn what_is_not_a_project_is_named_with_what_was_expected() {
        let root = tempfile::tempdir().unwrap();
        let err = Project::open(root.path()).err().unwrap().to_string();
        assert!(
            err.contains(&root.path().display().to_string()) && err.contains("no Cargo.toml") && err.contains("app.py"),
            "{err}"
        );
        let err = Project::open(&root.path().join("missing")).err().unwrap().to_string();
        assert!(err.contains("not a directory"), "{err}");
        std::fs::write(root.path().join("app.py"), "").unwrap();
        let err = Project::open(root.path()).err().unwrap().to_string();
        assert!(err.contains("wit") && err.contains("missing"), "{err}");
        std::fs::write(root.path().join("Cargo.toml"), "not a manifest").unwrap();
        let err = format!("{:#}", Project::open(root.path()).err().unwrap());
        assert!(err.contains("Cargo.toml") && err.contains("[package]"), "{err}");
    }
}
