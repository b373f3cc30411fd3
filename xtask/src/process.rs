//! Running external programs: echoed before they run, failures with their exit status.

use std::env;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// `program arg arg ...`, for progress lines and errors.
pub fn display(cmd: &Command) -> String {
    let mut line = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}

/// Runs `cmd` with inherited stdio (so its progress shows) and fails unless it succeeds.
pub fn run(cmd: &mut Command) -> Result<()> {
    let line = display(cmd);
    println!("  $ {line}");
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    Ok(())
}

/// Whether `cmd` runs and exits successfully; its output is discarded.
pub fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The standard output of `cmd`, if it runs and succeeds.
pub fn stdout_of(cmd: &mut Command) -> Option<String> {
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The first executable named `name` on `PATH` (symlinks followed, so a dangling link is absent).
pub fn which(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Whether this process runs as root (needed for apt-get and debootstrap).
pub fn is_root() -> bool {
    stdout_of(Command::new("id").arg("-u")).is_some_and(|uid| uid.trim() == "0")
}
