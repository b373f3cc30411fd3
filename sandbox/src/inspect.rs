//! Commands the host runs in a session's container on its own account, to look at the
//! session's workspace (e.g. what a task that ran in a fork of another session changed:
//! the host's `isolation` module). Never a tool call of an agent: no approval gate, no
//! shell state (the command starts in /workspace and leaves the session's working
//! directory as it was), no task environment or secret lane (the command gets the
//! container's environment only, so it has no secret to show). The host writes every byte
//! of such a command; the caller is responsible for it reading the workspace and never
//! running code the workspace holds.

use std::time::Duration;

use crate::agent::{Op, Status, WORKSPACE};
use crate::error::SandboxError;
use crate::session::{Sandbox, SessionKey};

/// What a host command printed and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostCommandOutput {
    /// Its standard output, whole unless [`HostCommandOutput::stdout_dropped`] says
    /// otherwise (then the head and the tail, at most `sandbox.max_output` together).
    pub stdout: Vec<u8>,
    /// Bytes of standard output dropped from the middle (over `sandbox.max_output`).
    pub stdout_dropped: u64,
    /// Its standard error as text (bounded the same way, the cut stated).
    pub stderr: String,
    /// Exit status (128+N for a signal).
    pub exit_code: i64,
    /// The timeout ended it.
    pub timed_out: bool,
}

impl Sandbox {
    /// Makes `key`'s session exist: its container on an empty workspace when this
    /// sandbox does not hold it; nothing when it does (a paused session stays paused).
    pub async fn open_session(&self, key: &SessionKey) -> Result<(), SandboxError> {
        if self.holds_session(key) {
            return Ok(());
        }
        self.session(key, &[]).await.map(drop)
    }

    /// The most standard output a host command returns whole (`sandbox.max_output`).
    pub fn max_host_command_output(&self) -> usize {
        self.config().max_output.0 as usize
    }

    /// Runs the bash `command` in `key`'s container for the host (see the module docs):
    /// in /workspace, as the session's user, with the container's environment, within
    /// `timeout`; creates the session's container if needed. `Err` when it could not run.
    #[tracing::instrument(skip(self, command), fields(user = %key.user_id, session = %key.session_id))]
    pub async fn run_host_command(
        &self,
        key: &SessionKey,
        command: &str,
        timeout: Duration,
    ) -> Result<HostCommandOutput, SandboxError> {
        let ctx = self.session(key, &[]).await?;
        let r = ctx
            .call(Op::Bash { command, env: &[], cwd: WORKSPACE }, timeout)
            .await
            .map_err(|e| self.name_host(key, e))?;
        match r.outcome.status() {
            Status::Refused(why) | Status::Error(why) => {
                Err(SandboxError::Exec { session: key.to_string(), message: format!("host command not run: {why}") })
            }
            // Killed: the command ran and was killed; its exit code and timeout say how.
            Status::Ok | Status::Outside | Status::Killed => Ok(HostCommandOutput {
                stdout: r.stdout.bytes(),
                stdout_dropped: r.stdout.truncated(),
                stderr: r.stderr.text(),
                exit_code: r.exit_code,
                timed_out: r.timed_out,
            }),
        }
    }
}
