//! Style and lint gates run by `cargo xtask test` before anything is built, and the
//! formatter behind `cargo xtask fmt`.
//!
//! - Format: `rustfmt.toml` at the root is the one style for the host workspace and for every
//!   guest crate (bundled plugins, test plugins, the Rust guest SDK, the plugin templates); each
//!   guest crate is its own Cargo project (excluded from the workspace), so it is checked by
//!   its own manifest.
//! - Lint: clippy with warnings as errors on every target of the host workspace and of the
//!   guest crates with native tests (the SDK and the bundled plugins). It runs *as the
//!   compiler* of the test build ([`Clippy::wrap`]: clippy-driver as cargo's
//!   `RUSTC_WORKSPACE_WRAPPER`, which is what `cargo clippy` does, in build rather than check
//!   mode), so linting costs no second compile of the dependencies: a separate
//!   `cargo clippy` checked all ~400 of them again (6 minutes of a clean CI run).

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result};

use crate::layout::Layout;
use crate::process;

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Every guest crate's manifest, sorted: `plugins/*`, `tests/plugins/*`, `templates/*`
/// (those with a `Cargo.toml`) and the Rust guest SDK.
fn guest_manifests(layout: &Layout) -> Vec<PathBuf> {
    let mut manifests = vec![layout.rust_sdk().join("Cargo.toml")];
    for parent in ["plugins", "tests/plugins", "templates"] {
        let Ok(entries) = fs::read_dir(layout.root.join(parent)) else { continue };
        let mut found: Vec<_> =
            entries.flatten().map(|e| e.path().join("Cargo.toml")).filter(|m| m.is_file()).collect();
        found.sort();
        manifests.extend(found);
    }
    manifests
}

/// Fails naming the first crate whose files differ from `rustfmt.toml`'s style (with the
/// diff on stdout and the command that fixes it); with `apply`, rewrites them instead.
pub fn format(layout: &Layout, apply: bool) -> Result<()> {
    let check: &[&str] = if apply { &[] } else { &["--", "--check"] };
    let hint = "run `cargo xtask fmt` to apply the project's style";
    println!("xtask: {} the Rust style (rustfmt.toml)", if apply { "applying" } else { "checking" });
    process::run(cargo().current_dir(&layout.root).args(["fmt", "--all"]).args(check))
        .with_context(|| format!("the host workspace is not formatted; {hint}"))?;
    for manifest in guest_manifests(layout) {
        process::run(cargo().current_dir(&layout.root).arg("fmt").arg("--manifest-path").arg(&manifest).args(check))
            .with_context(|| format!("{} is not formatted; {hint}", layout.rel(&manifest).display()))?;
    }
    Ok(())
}

/// Fails listing every import cycle and every module reaching into its crate root, in any
/// crate of the repository ([`crate::layering`]).
pub fn layering(layout: &Layout) -> Result<()> {
    println!("xtask: checking the module layering (no import cycles)");
    let problems: Vec<String> = crate::layering::crate_sources(&layout.root)
        .iter()
        .flat_map(|src| crate::layering::crate_problems(src))
        .collect();
    if !problems.is_empty() {
        anyhow::bail!("layering problems:\n{}", problems.join("\n"));
    }
    Ok(())
}

/// Clippy as the compiler of the workspace's own crates, warnings as errors: set on every
/// cargo command of a test run (the same wrapper everywhere, so nothing is rebuilt between
/// them). Dependencies are compiled by plain rustc, as under `cargo clippy`.
pub struct Clippy {
    driver: PathBuf,
}

/// What `cargo clippy -- -D warnings` hands clippy-driver (`CLIPPY_ARGS`, arguments joined
/// by clippy's separator).
const CLIPPY_ARGS: &str = "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__";

impl Clippy {
    /// The clippy-driver of the toolchain running xtask (beside its `cargo`), else the one
    /// on `PATH`.
    pub fn locate() -> Result<Clippy> {
        let beside_cargo = std::env::var_os("CARGO")
            .map(PathBuf::from)
            .map(|cargo| cargo.with_file_name(format!("clippy-driver{}", std::env::consts::EXE_SUFFIX)))
            .filter(|p| p.is_file());
        let driver = beside_cargo.unwrap_or_else(|| PathBuf::from("clippy-driver"));
        let found = Command::new(&driver).arg("--version").output();
        match found {
            Ok(out) if out.status.success() => Ok(Clippy { driver }),
            _ => anyhow::bail!(
                "clippy-driver not found ({}); install it with `rustup component add clippy`",
                driver.display()
            ),
        }
    }

    /// `cmd` with clippy linting the workspace's crates as it compiles them.
    pub fn wrap<'a>(&self, cmd: &'a mut Command) -> &'a mut Command {
        cmd.env("RUSTC_WORKSPACE_WRAPPER", &self.driver).env("CLIPPY_ARGS", CLIPPY_ARGS)
    }
}
