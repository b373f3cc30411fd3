//! Bash: one shell command per call, with cwd and exported variables persisting per session.
//!
//! Each call sources the session's state file (/tmp/.warden/state.sh in the container),
//! runs the command, and on exit writes `export -p` plus the working directory back. The
//! per-task secrets in `env` win over persisted variables and are removed before the state
//! is saved, so they never outlive the call. Processes the command starts (also `&` jobs)
//! are killed when it ends — a call is the unit of work; nothing runs on unobserved. This module must never log the command's
//! environment, never persist a secret, and never run a command outside the timeout wrapper.

use std::time::Duration;

use serde::Deserialize;

use super::ToolOutput;
use crate::error::SandboxError;
use crate::exec::{EXIT_SIGKILL, cap_text};
use crate::session::SessionCtx;

/// Longest timeout a Bash call may ask for, milliseconds (Claude Code's maximum, 10 min).
pub const MAX_TIMEOUT_MS: u64 = 600_000;

/// Runs the user's command in a shell that restores and saves the session state.
/// `$1` the command, `$2` space-separated names of per-task secrets.
const RUNNER: &str = r#"__warden_state=/tmp/.warden/state.sh
__warden_secrets=$2
cd /workspace 2>/dev/null
declare -A __warden_keep
for __warden_n in $__warden_secrets; do __warden_keep[$__warden_n]=${!__warden_n}; done
if [ -r "$__warden_state" ]; then . "$__warden_state" >/dev/null 2>&1; fi
for __warden_n in $__warden_secrets; do export "$__warden_n=${__warden_keep[$__warden_n]}"; done
unset __warden_keep __warden_n
__warden_save() {
  local n
  for n in $__warden_secrets; do unset "$n" 2>/dev/null; done
  { export -p; printf 'cd -- %q 2>/dev/null\n' "$PWD"; } >"$__warden_state.$$" 2>/dev/null \
    && mv -f "$__warden_state.$$" "$__warden_state"
}
trap __warden_save EXIT
eval "$1""#;

#[derive(Debug, Deserialize)]
pub(crate) struct BashInput {
    command: String,
    timeout: Option<u64>,
    #[allow(dead_code)]
    description: Option<String>,
    #[serde(default)]
    run_in_background: bool,
}

/// The call's timeout: its own (ms, bounded) or the configured default.
pub(crate) fn timeout_of(input: &BashInput, default: Duration) -> Result<Duration, SandboxError> {
    match input.timeout {
        None => Ok(default),
        Some(0) => Err(SandboxError::InvalidInput {
            tool: "Bash".into(),
            message: "timeout must be at least 1 ms".into(),
        }),
        Some(ms) if ms > MAX_TIMEOUT_MS => Err(SandboxError::InvalidInput {
            tool: "Bash".into(),
            message: format!("timeout {ms} ms is over the maximum of {MAX_TIMEOUT_MS} ms"),
        }),
        Some(ms) => Ok(Duration::from_millis(ms)),
    }
}

pub(crate) async fn run(
    ctx: &SessionCtx<'_>,
    input: BashInput,
    timeout: Duration,
    cap: usize,
) -> Result<ToolOutput, SandboxError> {
    if input.run_in_background {
        return Ok(ToolOutput::error(
            "run_in_background is not supported in the sandbox; start it with `cmd > /workspace/cmd.log 2>&1 &` and read the log later",
        ));
    }
    if input.command.trim().is_empty() {
        return Err(SandboxError::InvalidInput {
            tool: "Bash".into(),
            message: "command must not be empty".into(),
        });
    }
    let secret_names = ctx
        .env
        .iter()
        .map(|(k, _)| k.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    let argv = vec![
        "bash".into(),
        "-c".into(),
        RUNNER.into(),
        "warden-bash".into(),
        input.command,
        secret_names,
    ];
    let r = ctx.exec(argv, timeout, true).await?;
    let mut content = r.stdout.text();
    if !r.stderr.is_empty() {
        if !content.is_empty() && !content.ends_with('\n') {
            content.push('\n');
        }
        content.push_str("[stderr]\n");
        content.push_str(&r.stderr.text());
    }
    let is_error = r.timed_out || r.exit_code != 0;
    if r.timed_out {
        if !content.is_empty() && !content.ends_with('\n') {
            content.push('\n');
        }
        content.push_str(&format!(
            "[timed out after {} ms: the command and all its child processes were killed]",
            timeout.as_millis()
        ));
    } else if r.exit_code != 0 {
        if !content.is_empty() && !content.ends_with('\n') {
            content.push('\n');
        }
        let hint = if r.exit_code == EXIT_SIGKILL {
            " (killed: out of memory or process limit?)"
        } else {
            ""
        };
        content.push_str(&format!("[exit code: {}{hint}]", r.exit_code));
    }
    Ok(ToolOutput {
        content: cap_text(content, cap),
        is_error,
    })
}
