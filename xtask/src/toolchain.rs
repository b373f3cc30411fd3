//! The wasm toolchain for `cargo xtask build`: the one present (see
//! [`warden_guest_build::WasmToolchain`]), else Debian's rustc-web installed with apt-get
//! when this is Debian and we are root, else the error saying what to install.

use anyhow::{Result, bail};
use warden_guest_build::{DEBIAN_PACKAGES, WasmToolchain};

use crate::apt;

/// Finds a usable toolchain, installing Debian's when that is possible.
pub fn ensure() -> Result<WasmToolchain> {
    let missing = match WasmToolchain::detect() {
        Ok(found) => return Ok(found),
        Err(e) => e,
    };
    if !apt::available() {
        return Err(missing.into());
    }
    println!("xtask: no wasm toolchain found; installing Debian's rustc-web toolchain");
    apt::install(DEBIAN_PACKAGES)?;
    match WasmToolchain::detect() {
        Ok(found) => Ok(found),
        Err(_) => bail!(
            "installed {} but the toolchain is still incomplete \
             (need /usr/bin/rustc, /usr/bin/cargo, the rust-src for it and rust-lld)",
            DEBIAN_PACKAGES.join(" ")
        ),
    }
}
