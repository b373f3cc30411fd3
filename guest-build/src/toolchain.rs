//! Finding a Rust toolchain that builds [`WASM_TARGET`] guests, and running cargo with it.
//!
//! In order of preference:
//! 1. rustup with the `wasm32-unknown-unknown` target installed: plain `cargo build --target`.
//! 2. Debian's `rustc-web` (`/usr/bin/rustc`, `/usr/bin/cargo`) with `rust-web-src` and
//!    `rust-lld`: `RUSTC_BOOTSTRAP=1 ... -Zbuild-std=std,panic_abort` (Debian ships no
//!    precompiled wasm standard library, so it is built from source once per target dir).
//!
//! Otherwise [`Error::NoWasmToolchain`] says what to install. Installing is the caller's
//! choice (xtask installs Debian's packages when it runs as root; `warden` never does).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::process::{self, stdout_of, which};
use crate::{Error, Result, absolute};

/// The target guests are built for: no WASI, so a guest imports only what its WIT world
/// imports (all I/O goes through host capabilities).
pub const WASM_TARGET: &str = "wasm32-unknown-unknown";

/// Debian packages that make up the rustc-web wasm toolchain (`rust-lld` links to `lld-22`).
pub const DEBIAN_PACKAGES: &[&str] = &["rustc-web", "cargo-web", "rust-web-src", "rust-web-llvm", "lld-22"];
const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
const DEBIAN_CARGO: &str = "/usr/bin/cargo";

/// A toolchain able to build guest crates for [`WASM_TARGET`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WasmToolchain {
    /// `cargo` on `PATH` (rustup) with the target's standard library installed.
    Rustup,
    /// Debian's rustc-web: builds the standard library from source (`-Zbuild-std`).
    Debian { rustc: PathBuf, cargo: PathBuf },
}

/// The cargo profile of a guest build.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Profile {
    /// `--release`: small and fast, what is deployed.
    #[default]
    Release,
    /// The dev profile: quicker to build, larger and slower.
    Debug,
}

/// One `cargo build` of a guest crate.
#[derive(Debug, Default)]
pub struct CargoBuild<'a> {
    /// `CARGO_TARGET_DIR`; `None` leaves it to cargo (the crate's `target/`, or the
    /// caller's environment and cargo configuration).
    pub target_dir: Option<&'a Path>,
    /// Cargo features to enable.
    pub features: &'a [String],
    pub profile: Profile,
}

impl WasmToolchain {
    /// The toolchain present here, rustup's first.
    pub fn detect() -> Result<Self> {
        if rustup_has_target() {
            return Ok(Self::Rustup);
        }
        if debian_toolchain_complete() {
            return Ok(Self::Debian { rustc: DEBIAN_RUSTC.into(), cargo: DEBIAN_CARGO.into() });
        }
        Err(Error::NoWasmToolchain)
    }

    /// For progress lines.
    pub fn describe(&self) -> &'static str {
        match self {
            Self::Rustup => "rustup toolchain",
            Self::Debian { .. } => "debian toolchain, build-std",
        }
    }

    /// Builds the crate in `crate_dir` for [`WASM_TARGET`] and returns the core module
    /// cargo wrote (the crate's `cdylib`, carrying wit-bindgen's component-type section).
    pub fn build(&self, crate_dir: &Path, build: &CargoBuild<'_>) -> Result<PathBuf> {
        let crate_dir = absolute(crate_dir)?;
        let manifest = crate_dir.join("Cargo.toml");
        let mut cmd = self.cargo_build(&crate_dir, build);
        let command = process::echo(&cmd);
        // stdout carries cargo's JSON messages; diagnostics and progress stay on stderr.
        let mut child =
            cmd.stdout(Stdio::piped()).spawn().map_err(|source| Error::Spawn { command: command.clone(), source })?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut modules = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.map_err(Error::io("reading the output of", Path::new(&command)))?;
            modules.extend(core_modules(&line));
        }
        let status = child.wait().map_err(|source| Error::Spawn { command: command.clone(), source })?;
        if !status.success() {
            return Err(Error::Failed { command, status });
        }
        // Only the crate's own library: a dependency's artifacts never are a cdylib `.wasm`,
        // but a parent workspace's members could be.
        let ours = std::fs::canonicalize(&manifest).ok();
        let mut ours_only = modules.iter().filter(|(m, _)| ours.is_some() && std::fs::canonicalize(m).ok() == ours);
        match (ours_only.next(), modules.len()) {
            (Some((_, core)), _) => Ok(core.clone()),
            (None, 1) => Ok(modules.remove(0).1),
            (None, _) => Err(Error::NoCoreModule { manifest }),
        }
    }

    /// `cargo build --target wasm32-unknown-unknown --message-format=json...` for one crate.
    fn cargo_build(&self, crate_dir: &Path, build: &CargoBuild<'_>) -> Command {
        let mut cmd = match self {
            Self::Rustup => Command::new("cargo"),
            Self::Debian { rustc, cargo } => {
                let mut cmd = Command::new(cargo);
                cmd.env("RUSTC_BOOTSTRAP", "1").env("RUSTC", rustc);
                cmd
            }
        };
        // Guest crates are standalone (`[workspace]`); run from their directory so only
        // their own `.cargo/config.toml` (and their parents') applies. A compiler wrapper
        // for the caller's own workspace (`cargo clippy`, or `cargo xtask test`, which lints
        // with clippy-driver as `RUSTC_WORKSPACE_WRAPPER`) belongs to the caller's
        // toolchain, not to this one: inherited, it would compile the guest with another
        // toolchain's sysroot.
        cmd.current_dir(crate_dir).env_remove("RUSTC_WORKSPACE_WRAPPER").env_remove("CLIPPY_ARGS");
        if let Some(dir) = build.target_dir {
            cmd.env("CARGO_TARGET_DIR", dir);
        }
        cmd.arg("build");
        if build.profile == Profile::Release {
            cmd.arg("--release");
        }
        cmd.arg("--manifest-path").arg(crate_dir.join("Cargo.toml")).args([
            "--target",
            WASM_TARGET,
            "--message-format=json-render-diagnostics",
        ]);
        if matches!(self, Self::Debian { .. }) {
            cmd.arg("-Zbuild-std=std,panic_abort");
        }
        if !build.features.is_empty() {
            cmd.arg("--features").arg(build.features.join(","));
        }
        cmd
    }
}

/// The `.wasm` files of a `cdylib` in one line of cargo's JSON output, with the manifest
/// of the package that built them; nothing for every other line.
fn core_modules(line: &str) -> Vec<(PathBuf, PathBuf)> {
    let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
        return Vec::new();
    };
    let is_cdylib = msg["target"]["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "cdylib"));
    if msg["reason"] != "compiler-artifact" || !is_cdylib {
        return Vec::new();
    }
    let manifest = PathBuf::from(msg["manifest_path"].as_str().unwrap_or_default());
    msg["filenames"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f.as_str())
        .filter(|f| f.ends_with(".wasm"))
        .map(|f| (manifest.clone(), PathBuf::from(f)))
        .collect()
}

fn rustup_has_target() -> bool {
    stdout_of(Command::new("rustup").args(["target", "list", "--installed"]))
        .is_some_and(|list| list.lines().any(|line| line.trim() == WASM_TARGET))
}

/// rustc-web, cargo-web, the standard library source (`rust-web-src`) and a working
/// `rust-lld` (`rust-web-llvm` links it to `lld-22`; a dangling link counts as missing).
fn debian_toolchain_complete() -> bool {
    if !Path::new(DEBIAN_RUSTC).is_file() || !Path::new(DEBIAN_CARGO).is_file() {
        return false;
    }
    let Some(sysroot) = stdout_of(Command::new(DEBIAN_RUSTC).args(["--print", "sysroot"])) else {
        return false;
    };
    let std_src = Path::new(sysroot.trim()).join("lib/rustlib/src/rust/library/std/Cargo.toml");
    std_src.is_file() && which("rust-lld").is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(cmd: &Command) -> Vec<String> {
        cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn debian_builds_std_and_rustup_does_not() {
        let features = ["v2".to_string(), "extra".to_string()];
        let build = CargoBuild { target_dir: Some(Path::new("t")), features: &features, profile: Profile::Release };
        let rustup = WasmToolchain::Rustup.cargo_build(Path::new("g"), &build);
        assert_eq!(rustup.get_program(), "cargo");
        let a = args(&rustup);
        assert!(a.contains(&"--release".into()) && a.contains(&WASM_TARGET.into()), "{a:?}");
        assert!(a.ends_with(&["--features".into(), "v2,extra".into()]), "{a:?}");
        assert!(!a.iter().any(|a| a.starts_with("-Zbuild-std")), "{a:?}");
        assert!(rustup.get_envs().any(|(k, v)| k == "CARGO_TARGET_DIR" && v == Some("t".as_ref())));

        let debian = WasmToolchain::Debian { rustc: "/r".into(), cargo: "/c".into() };
        let cmd = debian.cargo_build(Path::new("g"), &CargoBuild { profile: Profile::Debug, ..CargoBuild::default() });
        assert_eq!(cmd.get_program(), "/c");
        let a = args(&cmd);
        assert!(a.contains(&"-Zbuild-std=std,panic_abort".into()) && !a.contains(&"--release".into()), "{a:?}");
        assert!(cmd.get_envs().any(|(k, v)| k == "RUSTC" && v == Some("/r".as_ref())));
        assert!(!cmd.get_envs().any(|(k, _)| k == "CARGO_TARGET_DIR"), "left to cargo");
    }

    #[test]
    fn finds_the_cdylib_wasm_among_cargo_messages() {
        let ours = r#"{"reason":"compiler-artifact","manifest_path":"/p/Cargo.toml","target":{"kind":["cdylib","rlib"],"name":"echo"},"filenames":["/t/release/libecho.rlib","/t/release/echo.wasm"],"fresh":false}"#;
        assert_eq!(core_modules(ours), [(PathBuf::from("/p/Cargo.toml"), PathBuf::from("/t/release/echo.wasm"))]);
        let dep = r#"{"reason":"compiler-artifact","manifest_path":"/d/Cargo.toml","target":{"kind":["lib"]},"filenames":["/t/libdep.rlib"]}"#;
        assert!(core_modules(dep).is_empty());
        let done = r#"{"reason":"build-finished","success":true}"#;
        assert!(core_modules(done).is_empty());
        assert!(core_modules("   Compiling echo v0.1.0").is_empty());
    }
}
