//! The repository's guest plugins: where they are, where their components go, and when a
//! build is up to date. How a guest is built is [`warden_guest_build`]'s.
//!
//! A guest is a directory under `plugins/` (bundled, output `target/plugins/`),
//! `tests/plugins/` or `templates/` (test-only, output `target/test-plugins/`) that holds
//! either
//! - a `Cargo.toml`: a standalone Rust crate (own empty `[workspace]`) built for
//!   `wasm32-unknown-unknown` with wit-bindgen, then encoded with `wit-component`; extra
//!   builds with other features are listed in `[package.metadata.warden.variants]`
//!   (see [`warden_guest_build::manifest`]); or
//! - an `app.py`: a Python component built with the componentize-py of the project's
//!   virtualenv (see [`crate::python`]), against the WIT and the Python guest SDK.
//!
//! Other directories are ignored. Output names are `<directory name>.wasm` (variants:
//! `<variant name>.wasm`); outputs are replaced atomically (write + rename) so a watching
//! host never sees half a file.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use anyhow::{Context, Result};
pub use warden_guest_build::size_of;
use warden_guest_build::{CargoBuild, GuestManifest, Language, WasmToolchain, encode_component};

use crate::layout::Layout;
use crate::python::Python;

struct Guest {
    name: String,
    dir: PathBuf,
    language: Language,
    out_dir: PathBuf,
}

/// Runs the native unit tests of the Rust guest SDK (`sdk/rust`, with its bindings, so the
/// plugin-facing API is checked on the host target too) and of the bundled plugins
/// (`plugins/*` with a Cargo.toml): their protocol logic is plain Rust, tested with the
/// host toolchain in a separate target dir (`target/guest-native`), every target linted by
/// `clippy` (warnings are errors) as it is compiled.
pub fn test_native(layout: &Layout, clippy: &crate::lint::Clippy) -> Result<()> {
    for dir in native_test_dirs(layout) {
        println!("xtask: native unit tests of {} (linted by clippy)", layout.rel(&dir).display());
        let cargo = || {
            let mut cmd = std::process::Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
            clippy.wrap(&mut cmd).current_dir(&layout.root).env("CARGO_TARGET_DIR", layout.target.join("guest-native"));
            cmd
        };
        let manifest = dir.join("Cargo.toml");
        crate::process::run(cargo().args(["test", "--all-targets", "--no-run", "--manifest-path"]).arg(&manifest))
            .with_context(|| {
                format!("building {} (or clippy found problems in it)", layout.rel(&manifest).display())
            })?;
        crate::process::run(cargo().args(["test", "--manifest-path"]).arg(&manifest))
            .with_context(|| format!("native tests of {} failed", dir.display()))?;
    }
    Ok(())
}

/// The guest crates with native tests: the Rust guest SDK, then `plugins/*` with a Cargo.toml.
pub fn native_test_dirs(layout: &Layout) -> Vec<PathBuf> {
    let mut dirs: Vec<_> = fs::read_dir(layout.root.join("plugins"))
        .map(|rd| rd.flatten().map(|e| e.path()).filter(|p| p.join("Cargo.toml").is_file()).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs.insert(0, layout.rust_sdk());
    dirs
}

/// Builds every guest; returns the component files written (or already up to date).
pub fn build_all(layout: &Layout) -> Result<Vec<PathBuf>> {
    let mut guests = discover(&layout.root.join("plugins"), &layout.plugins_out())?;
    guests.extend(discover(&layout.root.join("tests/plugins"), &layout.test_plugins_out())?);
    // The plugin templates are built like test plugins so the docs never rot.
    guests.extend(discover(&layout.root.join("templates"), &layout.test_plugins_out())?);
    if guests.is_empty() {
        println!("xtask: no plugins to build");
        return Ok(Vec::new());
    }

    let mut toolchain = None;
    let mut python = None;
    let mut outputs = Vec::new();
    for guest in &guests {
        fs::create_dir_all(&guest.out_dir).with_context(|| format!("creating {}", guest.out_dir.display()))?;
        match guest.language {
            Language::Rust => {
                if toolchain.is_none() {
                    toolchain = Some(crate::toolchain::ensure()?);
                }
                let toolchain = toolchain.as_ref().expect("set above");
                outputs.extend(build_rust(layout, toolchain, guest)?);
            }
            Language::Python => {
                if python.is_none() {
                    python = Some(Python::ensure(layout)?);
                }
                let python = python.as_ref().expect("set above");
                outputs.push(build_python(layout, python, guest)?);
            }
        }
    }
    Ok(outputs)
}

/// The guest directories directly under `dir`, sorted by name; none if `dir` is missing.
fn discover(dir: &Path, out_dir: &Path) -> Result<Vec<Guest>> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut guests = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        let Some(language) = Language::of_dir(&path) else {
            continue;
        };
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .with_context(|| format!("plugin directory name is not UTF-8: {}", path.display()))?
            .to_string();
        guests.push(Guest { name, dir: path, language, out_dir: out_dir.to_path_buf() });
    }
    guests.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(guests)
}

/// Builds the crate once per variant (the default build first) and encodes each result.
fn build_rust(layout: &Layout, toolchain: &WasmToolchain, guest: &Guest) -> Result<Vec<PathBuf>> {
    let manifest = GuestManifest::read(&guest.dir.join("Cargo.toml"))?;
    let target_dir = layout.wasm_build();
    let mut builds = vec![(guest.name.clone(), Vec::new())];
    builds.extend(manifest.variants.iter().cloned());
    let mut outputs = Vec::new();
    for (name, features) in builds {
        let with = if features.is_empty() { String::new() } else { format!(", features {}", features.join(",")) };
        println!("xtask: building plugin {name} ({}{with})...", toolchain.describe());
        let started = Instant::now();
        let build = CargoBuild { target_dir: Some(&target_dir), features: &features, ..CargoBuild::default() };
        let core = toolchain.build(&guest.dir, &build).with_context(|| format!("building plugin {name}"))?;
        let out = guest.out_dir.join(format!("{name}.wasm"));
        if is_newer(&out, std::slice::from_ref(&core)) {
            println!("xtask: {} is up to date", layout.rel(&out).display());
        } else {
            encode_component(&core, &out).with_context(|| format!("encoding plugin {name}"))?;
        }
        println!(
            "xtask: plugin {name} -> {} ({}, {:.1}s)",
            layout.rel(&out).display(),
            size_of(&out),
            started.elapsed().as_secs_f64()
        );
        outputs.push(out);
    }
    Ok(outputs)
}

/// componentize-py on the guest's `app.py` against the repository's WIT, with the app's own
/// directory first on the module path, then the Python guest SDK (`warden_guest`; see
/// [`warden_guest_build::ComponentizePy::componentize`]). Skipped when the output is newer
/// than the app's `.py` files, the SDK's and the WIT files. Returns the output.
fn build_python(layout: &Layout, python: &Python, guest: &Guest) -> Result<PathBuf> {
    let (name, dir) = (&guest.name, &guest.dir);
    let out = guest.out_dir.join(format!("{name}.wasm"));
    let sdk = layout.python_sdk();
    let mut inputs = files_with_extension(dir, "py")?;
    inputs.extend(files_with_extension(&sdk.join(PYTHON_SDK_PACKAGE), "py")?);
    inputs.extend(files_with_extension(&layout.wit(), "wit")?);
    if is_newer(&out, &inputs) {
        println!("xtask: plugin {name} is up to date ({})", layout.rel(&out).display());
        return Ok(out);
    }
    println!("xtask: building plugin {name} (python, componentize-py)...");
    let started = Instant::now();
    python
        .componentize_py()
        .componentize(dir, &layout.wit(), &[&sdk], &out)
        .with_context(|| format!("building plugin {name}"))?;
    println!(
        "xtask: plugin {name} -> {} ({}, {:.1}s)",
        layout.rel(&out).display(),
        size_of(&out),
        started.elapsed().as_secs_f64()
    );
    Ok(out)
}

/// The Python guest SDK's package directory inside [`Layout::python_sdk`].
const PYTHON_SDK_PACKAGE: &str = "warden_guest";

/// Files directly in `dir` whose extension is `ext`.
fn files_with_extension(dir: &Path, ext: &str) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == ext) {
            files.push(path);
        }
    }
    Ok(files)
}

/// Whether `output` exists and is newer than every existing file in `inputs`.
fn is_newer(output: &Path, inputs: &[PathBuf]) -> bool {
    let mtime = |p: &Path| fs::metadata(p).and_then(|m| m.modified()).ok();
    let Some(out_time) = mtime(output) else {
        return false;
    };
    inputs.iter().filter_map(|input| mtime(input)).all(|in_time: SystemTime| in_time < out_time)
}
