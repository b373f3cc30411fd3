//! Running external programs: echoed before they run, failures with their exit status.
//! Unlike [`warden_guest_build::process::run`], output stays where the child writes it
//! (test results on stdout); the shared helpers are re-exported from there.

use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

pub use warden_guest_build::process::{command_line, stdout_of, which};

/// Runs `cmd` with inherited stdio (so its progress shows) and fails unless it succeeds.
pub fn run(cmd: &mut Command) -> Result<()> {
    let line = command_line(cmd);
    println!("  $ {line}");
    let status = cmd.status().with_context(|| format!("could not start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    Ok(())
}

/// Whether `cmd` runs and exits successfully; its output is discarded.
pub fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// Whether this process runs as root (needed for apt-get and debootstrap).
pub fn is_root() -> bool {
    stdout_of(Command::new("id").arg("-u")).is_some_and(|uid| uid.trim() == "0")
}
