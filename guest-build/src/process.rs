//! Running the external programs of a build (cargo, rustup, componentize-py): echoed on
//! stderr before they run, their output on stderr, failures with their exit status.

use std::env;
use std::io;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::{Error, Result};

/// `program arg arg ...`, for progress lines and errors.
pub fn command_line(cmd: &Command) -> String {
    let mut line = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}

/// Runs `cmd` with its progress showing on stderr (its stdout too, so the caller's stdout
/// carries only results) and fails unless it succeeds.
pub fn run(cmd: &mut Command) -> Result<()> {
    let command = echo(cmd);
    let status = cmd
        .stdout(Stdio::from(io::stderr()))
        .status()
        .map_err(|source| Error::Spawn { command: command.clone(), source })?;
    if !status.success() {
        return Err(Error::Failed { command, status });
    }
    Ok(())
}

/// Prints `  $ <command line>` on stderr and returns the line.
pub(crate) fn echo(cmd: &Command) -> String {
    let line = command_line(cmd);
    eprintln!("  $ {line}");
    line
}

/// The standard output of `cmd`, if it runs and succeeds.
pub fn stdout_of(cmd: &mut Command) -> Option<String> {
    let out = cmd.stdin(Stdio::null()).stderr(Stdio::null()).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The first executable named `name` on `PATH` (symlinks followed, so a dangling link is absent).
pub fn which(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path).map(|dir| dir.join(name)).find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_program_is_named_with_its_status() {
        let err = run(Command::new("sh").args(["-c", "exit 3"])).unwrap_err();
        assert!(matches!(&err, Error::Failed { status, .. } if status.code() == Some(3)), "{err:?}");
        assert_eq!(err.to_string(), "`sh -c exit 3` failed (exit status: 3)");
        let err = run(&mut Command::new("warden-guest-build-no-such-program")).unwrap_err();
        assert!(matches!(err, Error::Spawn { .. }), "{err:?}");
        run(Command::new("sh").args(["-c", "exit 0"])).unwrap();
    }

    #[test]
    fn stdout_of_is_none_for_a_failure() {
        assert_eq!(stdout_of(Command::new("sh").args(["-c", "echo hi"])).as_deref(), Some("hi\n"));
        assert_eq!(stdout_of(Command::new("sh").args(["-c", "echo hi; exit 1"])), None);
    }
}
