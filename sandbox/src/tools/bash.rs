//! Bash: one shell command per call, with the working directory persisting per session.
//!
//! The session's shell state is the working directory only: after each command the agent
//! reports the shell's physical working directory (read from /proc, never from anything
//! the command wrote), `shell_state` checks it, and the next call starts there. Variables
//! do not carry over: every call starts with the same environment (`environment`) plus
//! its task's variables, so nothing an earlier call exported steers a later one. Processes the command starts (also `&` jobs, `setsid` and
//! double-forked daemons) are killed when it ends — a call is the unit of work; nothing
//! runs on unobserved. Commands of one session can read each other's environment, so a
//! command runs beside the session's others only when they carry the same secrets
//! (`lanes`; otherwise it waits, within its timeout). This module must never log the
//! command's environment, never persist a secret, and never run a command outside the agent.

use std::time::{Duration, Instant};

use serde::Deserialize;

use super::ToolOutput;
use crate::agent::Op;
use crate::error::SandboxError;
use crate::exec::{Captured, EXIT_SIGKILL, cap_text};
use crate::lanes::LaneTimeout;
use crate::session::SessionCtx;

/// Longest timeout a Bash call may ask for, milliseconds (Claude Code's maximum, 10 min).
pub const MAX_TIMEOUT_MS: u64 = 600_000;
/// Room kept in the output cap for the notes (stderr label, truncation, exit code).
const NOTE_ROOM: usize = 256;
/// A wait for the session's lanes at least this long is named in a timeout note: the
/// model should know its command had less time than it asked for, and why.
const WAIT_WORTH_SAYING: Duration = Duration::from_secs(1);

/// What a call that never got its lane says (`lanes`).
fn lane_timeout_text(timeout: Duration) -> String {
    format!(
        "[not run: for its whole timeout of {} ms, commands of other tasks of this session (with other secrets) \
         were running, and commands with different secrets never run at the same time; retry later or with a \
         longer timeout]",
        timeout.as_millis()
    )
}

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
        Some(0) => {
            Err(SandboxError::InvalidInput { tool: "Bash".into(), message: "timeout must be at least 1 ms".into() })
        }
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
        return Err(SandboxError::InvalidInput { tool: "Bash".into(), message: "command must not be empty".into() });
    }
    // Only commands with the same secrets run at once (`lanes`); the wait is part of the
    // call's timeout.
    let waiting = Instant::now();
    let mut lane = match ctx.secret_lane(ctx.env, timeout).await {
        Ok(pass) => Some(pass),
        Err(LaneTimeout) => return Ok(ToolOutput::error(lane_timeout_text(timeout))),
    };
    let waited = waiting.elapsed();
    let Some(left) = timeout.checked_sub(waited).filter(|left| !left.is_zero()) else {
        return Ok(ToolOutput::error(lane_timeout_text(timeout)));
    };
    // The directory the gate judged the command's files from (pinned), else the one the
    // commands that ran meanwhile left (read after the wait).
    let cwd = ctx.approved_path.map_or_else(|| ctx.shell_cwd(), |p| p.path.clone());
    let op = Op::Bash { command: &input.command, env: ctx.env, cwd: &cwd };
    let r = ctx.call_in_lane(op, left, &mut lane).await?;
    drop(lane);
    match r.outcome.status() {
        crate::agent::Status::Refused(why) => {
            return Err(SandboxError::InvalidInput { tool: "Bash".into(), message: why });
        }
        // The directory is gone (or is no longer a real directory of the workspace): the
        // command did not run, and the shell goes back to /workspace.
        crate::agent::Status::Error(why) => {
            ctx.shell_reset();
            return Ok(ToolOutput::error(format!("[not run: {why}; the shell is back in /workspace, run it again]")));
        }
        // Ran, and was killed (timed out, or exit 137) or finished: reported below.
        crate::agent::Status::Ok | crate::agent::Status::Outside | crate::agent::Status::Killed => {}
    }
    if let Some(state) = &r.state {
        ctx.shell_update(state);
    }
    let mut content = streams_text(&r.stdout, &r.stderr, cap.saturating_sub(NOTE_ROOM).max(2));
    let is_error = r.timed_out || r.exit_code != 0;
    if r.timed_out {
        if !content.is_empty() && !content.ends_with('\n') {
            content.push('\n');
        }
        let queued = if waited >= WAIT_WORTH_SAYING {
            format!(", {} ms of it waiting for other tasks' commands in this session", waited.as_millis())
        } else {
            String::new()
        };
        content.push_str(&format!(
            "[timed out after {} ms{queued}: the command and all its child processes were killed]",
            timeout.as_millis()
        ));
    } else if r.exit_code != 0 {
        if !content.is_empty() && !content.ends_with('\n') {
            content.push('\n');
        }
        let hint = if r.exit_code == EXIT_SIGKILL { " (killed: out of memory or process limit?)" } else { "" };
        content.push_str(&format!("[exit code: {}{hint}]", r.exit_code));
    }
    Ok(ToolOutput { content: cap_text(content, cap), is_error })
}

/// stdout, then stderr under a `[stderr]` label, within `budget` kept bytes in all: each
/// stream gets what it needs up to half, the rest goes to the other; every truncation note
/// states the stream's true dropped size.
fn streams_text(stdout: &Captured, stderr: &Captured, budget: usize) -> String {
    let (o, e) = (stdout.kept(), stderr.kept());
    let e_budget = e.min(budget.saturating_sub(o.min(budget / 2)));
    let o_budget = budget - e_budget;
    let mut content = stdout.text_within(o_budget);
    if !stderr.is_empty() {
        if !content.is_empty() && !content.ends_with('\n') {
            content.push('\n');
        }
        content.push_str("[stderr]\n");
        content.push_str(&stderr.text_within(e_budget));
    }
    content
}
