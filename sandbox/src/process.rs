//! Long-running programs in a session's container whose stdin and stdout the host holds:
//! stdio MCP servers. One `docker exec` each, as the sandbox user, in /workspace, with the
//! container's limits, network and file system — the same sandbox as the session's tool
//! calls, never the host.
//!
//! A session process is its own exec root, so the agents' sweeps after each command leave
//! it alone; it lives until its stdin closes, it exits, or the session's container stops
//! or is removed (idle reaping, `end_session`, shutdown), whichever comes first. Docker
//! cannot kill an exec: dropping the [`SessionProcess`] closes its stdin, which ends a
//! well-behaved server, and the container's end ends any other. A process the host must
//! end sooner on purpose (an agent-defined MCP server, ended with its task) is started
//! *owned* ([`Sandbox::spawn_owned_process`]: the agent's `exec-owned` says its pid and
//! start time, then becomes it) and ended with its whole tree by
//! [`Sandbox::end_process`].
//!
//! What such a process starts while it serves (a tool call running git, which runs a hook
//! the model wrote) is its descendant, not an orphan, so the sweeps would leave that too.
//! Once the process is in its steady state (an MCP server: after its handshake and first
//! tool listing) its owner *settles* it ([`Settler::settle`]): the agent records it and the
//! descendants it has then (a `uvx` or `npx` wrapper keeps the real server as a child), and
//! kills every other descendant, then the orphans, before every command of the session
//! starts and whenever the owner asks after a call of the process ([`Sandbox::contain`]):
//! nothing such a call starts outlives it. Until it is
//! settled, nothing of the session may rely on it: its owner settles it before its first
//! use, or drops it. Each process carries a random tag in its environment
//! ([`crate::agent::PROCESS_TAG_VAR`]) by which the agent finds it.
//!
//! This module must never log the environment it passes (it may carry secrets), and
//! never keeps more than [`STDERR_TAIL`] bytes of a process's stderr.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::agent::PROCESS_TAG_VAR;
use crate::error::SandboxError;
use crate::session::{Sandbox, SessionKey};

/// Bytes of a session process's stderr kept for error messages (its last words).
pub const STDERR_TAIL: usize = 8 * 1024;
/// Longest argv of a session process (arguments and their total bytes): operator
/// configuration, but bounded like every other input.
pub const MAX_ARGS: usize = 256;
const MAX_ARGV_BYTES: usize = 64 * 1024;

/// A program running in a session container, its stdin and stdout held by the host.
pub struct SessionProcess {
    /// The program's stdin; dropping it closes the stream.
    pub stdin: Pin<Box<dyn AsyncWrite + Send>>,
    /// The program's stdout (stderr is kept apart, see [`SessionProcess::stderr_tail`]);
    /// ends when the program or its container does.
    pub stdout: Pin<Box<dyn AsyncRead + Send>>,
    stderr: Arc<Mutex<VecDeque<u8>>>,
    settler: Settler,
}

impl SessionProcess {
    /// The last [`STDERR_TAIL`] bytes the program wrote to stderr (lossy UTF-8).
    pub fn stderr_tail(&self) -> String {
        let tail = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&tail.iter().copied().collect::<Vec<u8>>()).into_owned()
    }

    /// A handle to the stderr tail that outlives the process's streams.
    pub fn stderr_handle(&self) -> StderrTail {
        StderrTail(self.stderr.clone())
    }

    /// The handle that settles this process ([`Settler::settle`]), usable after its streams
    /// moved elsewhere.
    pub fn settler(&self) -> Settler {
        self.settler.clone()
    }
}

/// Settles one session process: records its steady state in its container.
#[derive(Clone)]
pub struct Settler {
    docker: bollard::Docker,
    container: String,
    user: String,
    tag: String,
}

impl Settler {
    /// Records the process and the descendants it has now as its steady state: from then
    /// on, before every command of its session starts, every other descendant of it is
    /// killed (see the module docs). Call it once the process is ready for use and before
    /// its first use; a process already settled keeps its first record. An error means the
    /// process is not contained: its owner must not use it.
    pub async fn settle(&self) -> Result<(), SandboxError> {
        crate::exec::settle(&self.docker, &self.container, &self.user, &self.tag).await
    }
}

impl std::fmt::Debug for Settler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settler").field("container", &self.container).finish_non_exhaustive()
    }
}

/// A fresh tag for a session process ([`PROCESS_TAG_VAR`]): a random UUID's 32 hex digits,
/// unique among the processes of a container (it names, it guards nothing: only the host
/// starts exec roots).
fn process_tag() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// A session process's kept stderr, readable after its streams moved elsewhere.
#[derive(Clone)]
pub struct StderrTail(Arc<Mutex<VecDeque<u8>>>);

impl StderrTail {
    pub fn text(&self) -> String {
        let tail = self.0.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&tail.iter().copied().collect::<Vec<u8>>()).into_owned()
    }
}

impl std::fmt::Debug for SessionProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionProcess").finish_non_exhaustive()
    }
}

/// Refuses an argv the container could not run as given: empty, NUL bytes, too long.
fn validate_argv(argv: &[String]) -> Result<(), SandboxError> {
    let bad = |message: String| SandboxError::InvalidInput { tool: "session process".into(), message };
    if argv.is_empty() || argv[0].trim().is_empty() {
        return Err(bad("the command is empty".into()));
    }
    if argv.len() > MAX_ARGS || argv.iter().map(String::len).sum::<usize>() > MAX_ARGV_BYTES {
        return Err(bad(format!("more than {MAX_ARGS} arguments or {MAX_ARGV_BYTES} bytes")));
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(bad("an argument contains a NUL byte".into()));
    }
    Ok(())
}

/// Who an owned session process is in its container: its pid and start time there (a
/// reused pid never names it), and the container. [`Sandbox::end_process`] ends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessId {
    container: String,
    pid: u64,
    start_time: u64,
}

/// Longest wait for an owned process's first line (its pid and start time).
const OWNED_HELLO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// Longest first line of an owned process (two decimal numbers).
const OWNED_HELLO_BYTES: u64 = 64;

impl Sandbox {
    /// Ends whatever the settled session processes of `key`'s session started and their
    /// records do not hold, then the session's orphans (processes no live call owns);
    /// returns how many processes it killed. Call it after every tool call of a session
    /// process (an MCP server's `tools/call`), when its reply is in: nothing the call
    /// started — a git hook the model wrote, a daemon it double-forked — outlives the call,
    /// and so nothing it left runs on under the session's un-narrowed egress (a held
    /// narrowing ends with its call). Cheap: one request on a pooled agent, no exec. A
    /// session this sandbox does not hold has nothing to contain here (`Ok(0)`, no
    /// container is made). What another session process is running for a call at this
    /// moment is killed too (that call fails), as at every command's start.
    pub async fn contain(&self, key: &SessionKey) -> Result<u64, SandboxError> {
        // A paused session runs nothing (and is not started again just to be contained).
        if !self.holds_session(key) || self.is_paused(key) {
            return Ok(0);
        }
        let ctx = self.session(key, &[]).await?;
        let r = ctx.call(crate::agent::Op::Contain, crate::exec::FILE_OP_TIMEOUT).await?;
        match r.outcome.status() {
            crate::agent::Status::Ok => {}
            other => {
                return Err(SandboxError::Exec {
                    session: key.to_string(),
                    message: format!("could not contain the session's processes: {other:?}"),
                });
            }
        }
        let killed = r.outcome.num("killed").max(0) as u64;
        if killed > 0 {
            tracing::info!(session = %key.session_id, killed, "killed what a session process's call left running");
        }
        Ok(killed)
    }

    /// Like [`Sandbox::spawn_process`], for a process the host must be able to end on
    /// purpose, with every process it started, before its session ends (e.g. one a task
    /// started, ended with the task): the in-container agent's `exec-owned` mode says the
    /// process's pid and start time, then becomes `argv` (same process, no shell between).
    pub async fn spawn_owned_process(
        &self,
        key: &SessionKey,
        argv: &[String],
        env: &[(String, String)],
    ) -> Result<(SessionProcess, ProcessId), SandboxError> {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt};
        validate_argv(argv)?;
        let mut cmd = crate::exec::agent_argv("exec-owned", None);
        cmd.extend(argv.iter().cloned());
        let (process, container) = self.spawn_argv(key, cmd, &argv[0], env).await?;
        let mut stdout = tokio::io::BufReader::new(process.stdout);
        let mut hello = String::new();
        let failed = |message: String| SandboxError::Docker { action: "start owned session process".into(), message };
        let mut first_line = (&mut stdout).take(OWNED_HELLO_BYTES);
        match tokio::time::timeout(OWNED_HELLO_TIMEOUT, first_line.read_line(&mut hello)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(failed(e.to_string())),
            Err(_) => return Err(failed(format!("no pid within {OWNED_HELLO_TIMEOUT:?}"))),
        }
        let mut numbers = hello.split_ascii_whitespace().map(str::parse::<u64>);
        let (Some(Ok(pid)), Some(Ok(start_time)), None) = (numbers.next(), numbers.next(), numbers.next()) else {
            let stderr = StderrTail(process.stderr.clone()).text();
            return Err(failed(format!("it did not say its pid ({:?}); stderr: {stderr}", hello.trim())));
        };
        let process = SessionProcess {
            stdin: process.stdin,
            stdout: Box::pin(stdout),
            stderr: process.stderr,
            settler: process.settler,
        };
        Ok((process, ProcessId { container, pid, start_time }))
    }

    /// Ends an owned process (see [`Sandbox::spawn_owned_process`]) and every process it
    /// started, then the session's orphans; nothing when it already ended (its pid now
    /// names another process or none). Returns whether the kill ran.
    pub async fn end_process(&self, key: &SessionKey, id: &ProcessId) -> Result<bool, SandboxError> {
        // A pause ended every process of the session (and a resumed container is another).
        if self.is_paused(key) {
            return Ok(false);
        }
        let ctx = self.session(key, &[]).await?;
        Ok(crate::exec::kill_sweep(ctx.docker, &id.container, ctx.user(), (id.pid, id.start_time)).await)
    }

    /// Starts `argv` in `key`'s container (creating the session's container if needed) as
    /// the sandbox user, in /workspace, with `env` added to the container's environment.
    pub async fn spawn_process(
        &self,
        key: &SessionKey,
        argv: &[String],
        env: &[(String, String)],
    ) -> Result<SessionProcess, SandboxError> {
        validate_argv(argv)?;
        Ok(self.spawn_argv(key, argv.to_vec(), &argv[0], env).await?.0)
    }

    /// Starts `cmd` (checked by the caller; `program` names it in logs) in `key`'s
    /// container; also returns the container's id.
    async fn spawn_argv(
        &self,
        key: &SessionKey,
        cmd: Vec<String>,
        program: &str,
        env: &[(String, String)],
    ) -> Result<(SessionProcess, String), SandboxError> {
        crate::tools::validate_env(env)?;
        let ctx = self.session(key, &[]).await?;
        let container = ctx.container().await?;
        let tag = process_tag();
        let mut environment = vec![format!("PATH={}", crate::environment::CONTAINER_PATH)];
        environment.extend(env.iter().filter(|(k, _)| k != PROCESS_TAG_VAR).map(|(k, v)| format!("{k}={v}")));
        environment.push(format!("{PROCESS_TAG_VAR}={tag}"));
        let opts = CreateExecOptions {
            env: Some(environment),
            ..crate::exec::exec_options(ctx.user(), cmd, crate::container::WORKSPACE, crate::exec::Attach::Stdio)
        };
        let docker = ctx.docker;
        let settler =
            Settler { docker: docker.clone(), container: container.clone(), user: ctx.user().to_string(), tag };
        let exec = docker
            .create_exec(&container, opts)
            .await
            .map_err(|e| SandboxError::Docker { action: "create session process".into(), message: e.to_string() })?;
        let (input, output) = match docker.start_exec(&exec.id, None).await {
            Ok(StartExecResults::Attached { output, input }) => (input, output),
            Ok(StartExecResults::Detached) => {
                return Err(SandboxError::Docker {
                    action: "start session process".into(),
                    message: "engine detached an attached exec".into(),
                });
            }
            Err(e) => {
                return Err(SandboxError::Docker { action: "start session process".into(), message: e.to_string() });
            }
        };
        let stderr: Arc<Mutex<VecDeque<u8>>> = Arc::default();
        let tail = stderr.clone();
        let stdout = output.filter_map(move |item| {
            let tail = tail.clone();
            async move {
                match item {
                    Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => Some(Ok(message)),
                    Ok(LogOutput::StdErr { message }) => {
                        let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                        t.extend(message.iter().copied());
                        let excess = t.len().saturating_sub(STDERR_TAIL);
                        t.drain(..excess);
                        None
                    }
                    Ok(LogOutput::StdIn { .. }) => None,
                    Err(e) => Some(Err(io::Error::other(e.to_string()))),
                }
            }
        });
        tracing::debug!(session = %key.session_id, program, "session process started");
        let process = SessionProcess {
            stdin: input,
            stdout: Box::pin(tokio_util::io::StreamReader::new(stdout)),
            stderr,
            settler,
        };
        Ok((process, container))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_is_bounded_and_nul_free() {
        assert!(validate_argv(&[]).is_err());
        assert!(validate_argv(&[" ".into()]).is_err());
        assert!(validate_argv(&["a\0b".into()]).is_err());
        assert!(validate_argv(&vec!["x".to_string(); MAX_ARGS + 1]).is_err());
        assert!(validate_argv(&["mcp-server-time".into(), "--local-timezone".into(), "UTC".into()]).is_ok());
    }

    #[test]
    fn process_tags_are_distinct_hex_words() {
        let (a, b) = (process_tag(), process_tag());
        assert_ne!(a, b);
        // One word of an environment entry, which `agent.py`'s `settle` compares bytewise.
        assert!(a.len() == 32 && a.bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
    }
}
