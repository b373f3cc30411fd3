//! Finding (or installing) a Rust toolchain that can build `wasm32-unknown-unknown` guests.
//!
//! In order of preference:
//! 1. rustup with the `wasm32-unknown-unknown` target installed: plain `cargo build --target`.
//! 2. Debian's `rustc-web` (`/usr/bin/rustc`, `/usr/bin/cargo`) with `rust-web-src` and
//!    `rust-lld`: `RUSTC_BOOTSTRAP=1 ... -Zbuild-std=std,panic_abort` (Debian ships no
//!    precompiled wasm standard library, so it is built from source once per target dir).
//! 3. On Debian as root: install those packages with apt-get, then use 2.
//!
//! Otherwise the build fails with the commands that would fix it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Result, bail};

use crate::{apt, process};

pub const WASM_TARGET: &str = "wasm32-unknown-unknown";

/// Debian packages that make up the rustc-web wasm toolchain (`rust-lld` links to `lld-22`).
const DEBIAN_PACKAGES: &[&str] = &[
    "rustc-web",
    "cargo-web",
    "rust-web-src",
    "rust-web-llvm",
    "lld-22",
];
const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
const DEBIAN_CARGO: &str = "/usr/bin/cargo";

/// A toolchain able to build guest crates for [`WASM_TARGET`].
pub enum WasmToolchain {
    /// `cargo` on `PATH` (rustup) with the target's standard library installed.
    Rustup,
    /// Debian's rustc-web: builds the standard library from source (`-Zbuild-std`).
    Debian { rustc: PathBuf, cargo: PathBuf },
}

impl WasmToolchain {
    /// Finds a usable toolchain, installing Debian's when that is possible.
    pub fn ensure() -> Result<Self> {
        if let Some(found) = Self::detect() {
            return Ok(found);
        }
        if apt::available() {
            println!("xtask: no wasm toolchain found; installing Debian's rustc-web toolchain");
            apt::install(DEBIAN_PACKAGES)?;
            if let Some(found) = Self::detect() {
                return Ok(found);
            }
            bail!(
                "installed {} but the toolchain is still incomplete \
                 (need {DEBIAN_RUSTC}, {DEBIAN_CARGO}, the rust-src for it and rust-lld)",
                DEBIAN_PACKAGES.join(" ")
            );
        }
        bail!(
            "no Rust toolchain can build {WASM_TARGET} plugins here. Install one of:\n  \
             rustup target add {WASM_TARGET}\n  \
             apt-get install {}   (Debian 12+, as root; builds std from source)",
            DEBIAN_PACKAGES.join(" ")
        )
    }

    fn detect() -> Option<Self> {
        if rustup_has_target() {
            return Some(Self::Rustup);
        }
        debian_toolchain_complete().then(|| Self::Debian {
            rustc: DEBIAN_RUSTC.into(),
            cargo: DEBIAN_CARGO.into(),
        })
    }

    /// For progress lines.
    pub fn describe(&self) -> &'static str {
        match self {
            Self::Rustup => "rustup toolchain",
            Self::Debian { .. } => "debian toolchain, build-std",
        }
    }

    /// `cargo build --release --target wasm32-unknown-unknown` for one guest crate.
    pub fn cargo_build(&self, crate_dir: &Path, target_dir: &Path, features: &[String]) -> Command {
        let mut cmd = match self {
            Self::Rustup => Command::new("cargo"),
            Self::Debian { rustc, cargo } => {
                let mut cmd = Command::new(cargo);
                cmd.env("RUSTC_BOOTSTRAP", "1").env("RUSTC", rustc);
                cmd
            }
        };
        // Guest crates are standalone (`[workspace]`); run from their directory so no
        // parent `.cargo/config.toml` other than the project's applies.
        cmd.current_dir(crate_dir)
            .env("CARGO_TARGET_DIR", target_dir)
            .arg("build")
            .arg("--release")
            .arg("--manifest-path")
            .arg(crate_dir.join("Cargo.toml"))
            .args(["--target", WASM_TARGET]);
        if matches!(self, Self::Debian { .. }) {
            cmd.arg("-Zbuild-std=std,panic_abort");
        }
        if !features.is_empty() {
            cmd.arg("--features").arg(features.join(","));
        }
        cmd
    }
}

fn rustup_has_target() -> bool {
    process::stdout_of(Command::new("rustup").args(["target", "list", "--installed"]))
        .is_some_and(|list| list.lines().any(|line| line.trim() == WASM_TARGET))
}

/// rustc-web, cargo-web, the standard library source (`rust-web-src`) and a working
/// `rust-lld` (`rust-web-llvm` links it to `lld-22`; a dangling link counts as missing).
fn debian_toolchain_complete() -> bool {
    if !Path::new(DEBIAN_RUSTC).is_file() || !Path::new(DEBIAN_CARGO).is_file() {
        return false;
    }
    let Some(sysroot) = process::stdout_of(Command::new(DEBIAN_RUSTC).args(["--print", "sysroot"]))
    else {
        return false;
    };
    let std_src = Path::new(sysroot.trim()).join("lib/rustlib/src/rust/library/std/Cargo.toml");
    std_src.is_file() && process::which("rust-lld").is_some()
}
