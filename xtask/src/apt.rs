//! Installing Debian packages with apt-get, when this is a Debian system and we are root.

use std::path::Path;
use std::process::Command;

use anyhow::Result;

use crate::process;

/// Whether packages can be installed here: Debian (or derivative) with apt-get, as root.
pub fn available() -> bool {
    Path::new("/etc/debian_version").exists() && process::which("apt-get").is_some() && process::is_root()
}

/// `apt-get install -y <packages>`, with progress; runs `apt-get update` and retries once
/// when the first attempt fails (stale or missing package lists).
pub fn install(packages: &[&str]) -> Result<()> {
    println!("xtask: installing with apt-get: {}", packages.join(" "));
    let install = || {
        process::run(
            Command::new("apt-get").env("DEBIAN_FRONTEND", "noninteractive").args(["install", "-y"]).args(packages),
        )
    };
    if install().is_ok() {
        return Ok(());
    }
    println!("xtask: apt-get install failed; updating the package lists and retrying");
    process::run(Command::new("apt-get").env("DEBIAN_FRONTEND", "noninteractive").arg("update"))?;
    install()
}
