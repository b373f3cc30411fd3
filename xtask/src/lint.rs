//! Style and lint gates run by `cargo xtask test` before anything is built, and the
//! formatter behind `cargo xtask fmt`.
//!
//! - Format: `rustfmt.toml` at the root is the one style for the host workspace and for every
//!   guest crate (bundled plugins, test plugins, the Rust guest SDK, the plugin templates); each
//!   guest crate is its own Cargo project (excluded from the workspace), so it is checked by
//!   its own manifest.
//! - Lint: `cargo clippy --workspace --all-targets -- -D warnings` on the host workspace, and
//!   on the guest crates that have native tests (the SDK and the bundled plugins), in the same
//!   target dir as those tests so nothing is compiled twice for them.

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

/// `cargo clippy -D warnings` over the host workspace (all targets: tests and benches too)
/// and over the guest crates with native tests.
pub fn clippy(layout: &Layout) -> Result<()> {
    println!("xtask: clippy (warnings are errors)");
    let workspace = ["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"];
    process::run(cargo().current_dir(&layout.root).args(workspace))
        .context("clippy found problems in the host workspace")?;
    for dir in crate::guest::native_test_dirs(layout) {
        let manifest = dir.join("Cargo.toml");
        process::run(
            cargo()
                .current_dir(&layout.root)
                .env("CARGO_TARGET_DIR", layout.target.join("guest-native"))
                .args(["clippy", "--all-targets", "--manifest-path"])
                .arg(&manifest)
                .args(["--", "-D", "warnings"]),
        )
        .with_context(|| format!("clippy found problems in {}", layout.rel(&manifest).display()))?;
    }
    Ok(())
}
