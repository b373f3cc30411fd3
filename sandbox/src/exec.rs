//! Running one command inside a session container with a hard timeout and capped output.
//!
//! Docker cannot kill an exec, so every command runs under a small bash wrapper: coreutils
//! `timeout` puts the command in its own process group and signals the whole group on expiry
//! (TERM, then KILL after a grace period). When the command ends — normally or not — the
//! wrapper sweeps its process group with SIGKILL (a builtin loop, so it works even when the
//! pids limit is exhausted): background children (`sleep 1000 &`, fork bombs) never outlive
//! the call. Only a process that deliberately leaves the group (`setsid`) survives, until the
//! session ends; if that wedges the container (pids exhausted), the host removes it and the
//! next call gets a fresh one on the same workspace volume.
//! The command's stdout/stderr go to files in the container's /tmp so that background
//! children holding the pipes cannot keep a call open, and are streamed back afterwards.
//! If even the wrapper overruns, the host kills the group from a second exec.
//!
//! Docker's exec round trip is the dominant cost of a tool call, so the wrapper runs as a
//! long-lived *agent*: one exec per concurrently busy call slot, kept in a per-session pool,
//! taking NUL-separated requests on its stdin. A warm call is a write and a read on an open
//! connection plus the command's own processes.
//!
//! This module must never log environment values (they carry per-task secrets), never run a
//! command without the timeout wrapper (except the host's own kill sweep), and never buffer
//! more than the capture limit per stream.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::query_parameters::InspectContainerOptions;
use futures_util::{Stream, StreamExt};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::error::{SandboxError, docker_status};

/// Seconds between the TERM sent to a timed-out process group and the KILL that follows.
pub(crate) const KILL_GRACE_SECS: u64 = 2;
/// Extra time the host waits beyond timeout + grace before it kills the group itself:
/// covers streaming the captured output back and a slow Docker engine.
pub(crate) const HOST_DEADLINE_SLACK: Duration = Duration::from_secs(10);
/// Host-side limit for the kill sweep exec that runs when the wrapper itself overran.
pub(crate) const KILL_SWEEP_TIMEOUT: Duration = Duration::from_secs(10);
/// Exit status of coreutils `timeout` when the TERM it sent ended the command.
pub(crate) const EXIT_TIMEOUT: i64 = 124;
/// Exit status of a process killed by SIGKILL (timeout's KILL, or the OOM killer).
pub(crate) const EXIT_SIGKILL: i64 = 137;

/// The in-container agent: a bash loop on a long-lived exec that runs one request at a time
/// under the timeout wrapper. `$1` is the agent id (names its files in /tmp/.warden).
/// Request on stdin, NUL-separated: tag, timeout secs, kill grace secs, env count, env
/// `K=V`..., argc, argv... Response: the command's stdout then an end marker on stdout, its
/// stderr then the same marker on stderr; the marker carries the tag and the exit status.
const AGENT: &str = r#"d=/tmp/.warden
[ -d "$d" ] || mkdir -p -m 700 "$d" || exit 125
a="$d/agent-$1"; o="$a.out"; e="$a.err"
trap 'rm -f "$o" "$e" "$a.pid"' EXIT
while IFS= read -r -d '' tag && IFS= read -r -d '' t && IFS= read -r -d '' k && IFS= read -r -d '' n; do
  env=()
  for ((i = 0; i < n; i++)); do IFS= read -r -d '' x || exit 0; env+=("$x"); done
  IFS= read -r -d '' n || exit 0
  argv=()
  for ((i = 0; i < n; i++)); do IFS= read -r -d '' x || exit 0; argv+=("$x"); done
  (
    for x in "${env[@]}"; do export "$x"; done
    exec timeout -k "$k" "$t" "${argv[@]}"
  ) >"$o" 2>"$e" </dev/null &
  p=$!
  echo "$p" >"$a.pid"
  { wait "$p"; } 2>/dev/null
  rc=$?
  n=0
  while kill -KILL -- "-$p" 2>/dev/null && [ "$n" -lt 10000 ]; do n=$((n + 1)); done
  [ -s "$o" ] && cat "$o"
  printf '\036warden-end:%s:%d\n' "$tag" "$rc"
  [ -s "$e" ] && cat "$e" >&2
  printf '\036warden-end:%s:%d\n' "$tag" "$rc" >&2
done
"#;

/// Kills an agent's current process group from a second exec, by the agent's pid file.
const KILL_SWEEP: &str = r#"p=$(cat "/tmp/.warden/agent-$1.pid" 2>/dev/null) || exit 0
for i in 1 2 3 4 5; do kill -KILL -- "-$p" 2>/dev/null || break; done
exit 0"#;

/// Idle agents kept per session; more concurrent calls start more, the extra ones exit.
pub(crate) const MAX_IDLE_AGENTS: usize = 4;
/// Longest end marker: prefix, 16 hex digits of tag, `:`, status digits, newline.
const MARKER_WINDOW: usize = 64;

/// Makes exec tags unique within this host process.
static EXEC_COUNTER: AtomicU64 = AtomicU64::new(0);

/// One command to run in a session container.
pub(crate) struct ExecRequest<'a> {
    /// The command and its arguments (not interpreted by a shell unless argv says so).
    pub argv: Vec<String>,
    /// Extra environment for this exec only (per-task secrets); never logged.
    pub env: &'a [(String, String)],
    /// Hard wall-clock limit for the command.
    pub timeout: Duration,
    /// Bytes kept per stream (head + tail).
    pub capture_limit: usize,
}

/// What a finished exec produced.
#[derive(Debug)]
pub(crate) struct ExecResult {
    pub stdout: Captured,
    pub stderr: Captured,
    /// Exit status (128+N for a signal).
    pub exit_code: i64,
    /// True when the hard timeout ended the command.
    pub timed_out: bool,
}

/// Why an exec did not produce an [`ExecResult`].
#[derive(Debug)]
pub(crate) enum ExecFailure {
    /// The container is gone or not running; the command never started. Safe to retry
    /// after recreating the container.
    ContainerGone(String),
    /// The engine could not start a process in the container (pids exhausted, runtime
    /// error); the command never started. The container must be replaced.
    ContainerWedged(String),
    /// The command may have run but the container stopped cooperating (the wrapper could
    /// not run or report, or the host deadline passed and the kill sweep failed). The
    /// container must be replaced; the command is not retried.
    Broken(String),
    /// Anything else.
    Failed(SandboxError),
}

/// A stream's output with only head and tail kept.
#[derive(Debug, Default)]
pub(crate) struct Captured {
    limit: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
}

impl Captured {
    /// An empty capture keeping at most `limit` bytes (half head, half tail).
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            limit,
            ..Default::default()
        }
    }

    /// Appends a chunk, dropping the middle when over the limit.
    pub(crate) fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        let head_cap = self.limit / 2;
        let tail_cap = self.limit - head_cap;
        if self.head.len() < head_cap {
            let take = (head_cap - self.head.len()).min(data.len());
            self.head.extend_from_slice(&data[..take]);
            data = &data[take..];
        }
        if data.len() >= tail_cap {
            self.tail.clear();
            self.tail.extend(&data[data.len() - tail_cap..]);
        } else {
            self.tail.extend(data);
            let excess = self.tail.len().saturating_sub(tail_cap);
            self.tail.drain(..excess);
        }
    }

    /// Bytes dropped from the middle.
    pub(crate) fn truncated(&self) -> u64 {
        self.total - self.head.len() as u64 - self.tail.len() as u64
    }

    /// True when nothing was captured.
    pub(crate) fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// The kept bytes, head then tail (only meaningful when nothing was truncated).
    pub(crate) fn bytes(&self) -> Vec<u8> {
        let mut v = self.head.clone();
        v.extend(self.tail.iter());
        v
    }

    /// Lossy text with the truncation stated where the middle was dropped.
    pub(crate) fn text(&self) -> String {
        let head = String::from_utf8_lossy(&self.head);
        let tail: Vec<u8> = self.tail.iter().copied().collect();
        match self.truncated() {
            0 => format!("{head}{}", String::from_utf8_lossy(&tail)),
            n => format!(
                "{head}\n[... {n} bytes truncated ...]\n{}",
                String::from_utf8_lossy(&tail)
            ),
        }
    }
}

/// Cuts text to at most `max` bytes, keeping head and tail and stating what was dropped.
pub(crate) fn cap_text(text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let notice_room = 64;
    let keep = max.saturating_sub(notice_room);
    let mut head_end = keep / 2;
    while !text.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = text.len() - (keep - keep / 2);
    while !text.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    let dropped = tail_start - head_end;
    format!(
        "{}\n[... {dropped} bytes truncated ...]\n{}",
        &text[..head_end],
        &text[tail_start..]
    )
}

/// A long-lived exec running [`AGENT`], with its attached stdin and output.
pub(crate) struct Agent {
    container: String,
    id: String,
    exec_id: String,
    input: Pin<Box<dyn AsyncWrite + Send>>,
    output: Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>,
}

/// A session's idle agents (checked out for one request at a time).
#[derive(Default)]
pub(crate) struct AgentPool {
    idle: Mutex<Vec<Agent>>,
}

impl AgentPool {
    fn take(&self, container: &str) -> Option<Agent> {
        let mut idle = self.idle.lock().expect("agent pool lock");
        idle.retain(|a| a.container == container);
        idle.pop()
    }

    fn give(&self, agent: Agent) {
        let mut idle = self.idle.lock().expect("agent pool lock");
        if idle.len() < MAX_IDLE_AGENTS {
            idle.push(agent);
        }
    }

    /// Drops every idle agent (their execs see EOF and exit).
    pub(crate) fn clear(&self) {
        self.idle.lock().expect("agent pool lock").clear();
    }
}

/// Watches one output stream for this request's end marker.
struct EndWatch {
    prefix: Vec<u8>,
    window: Vec<u8>,
    /// (exit status, marker length) once seen.
    seen: Option<(i64, usize)>,
}

impl EndWatch {
    fn new(tag: &str) -> Self {
        Self {
            prefix: format!("\x1ewarden-end:{tag}:").into_bytes(),
            window: Vec::new(),
            seen: None,
        }
    }

    fn feed(&mut self, chunk: &[u8]) {
        self.window.extend_from_slice(chunk);
        let excess = self.window.len().saturating_sub(MARKER_WINDOW);
        self.window.drain(..excess);
        if self.window.last() != Some(&b'\n') {
            return;
        }
        let Some(pos) = self
            .window
            .windows(self.prefix.len())
            .rposition(|w| w == self.prefix.as_slice())
        else {
            return;
        };
        let digits = &self.window[pos + self.prefix.len()..self.window.len() - 1];
        if let Some(code) = std::str::from_utf8(digits)
            .ok()
            .and_then(|d| d.parse::<i64>().ok())
        {
            self.seen = Some((code, self.window.len() - pos));
        }
    }
}

/// Why a request on an agent did not complete.
enum AgentFailure {
    /// The agent's stream ended (or broke) before any byte of the response.
    DeadBeforeOutput,
    /// The stream ended mid-response.
    DeadMidway,
    /// The host deadline passed.
    Overran,
    /// Docker refused something.
    Docker(ExecFailure),
}

impl Captured {
    /// Drops the last `n` bytes (the end marker, always the last thing on a stream).
    fn drop_last(&mut self, n: usize) {
        if self.tail.len() >= n {
            self.tail.truncate(self.tail.len() - n);
        } else {
            let from_head = (n - self.tail.len()).min(self.head.len());
            self.tail.clear();
            self.head.truncate(self.head.len() - from_head);
        }
        self.total = self.total.saturating_sub(n as u64);
    }
}

fn random_tag() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(EXEC_COUNTER.fetch_add(1, Ordering::Relaxed));
    format!("{:016x}", h.finish())
}

async fn spawn_agent(docker: &Docker, container: &str, user: &str) -> Result<Agent, ExecFailure> {
    let id = format!(
        "{}-{}",
        std::process::id(),
        EXEC_COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let cmd = vec![
        "bash".into(),
        "-c".into(),
        AGENT.into(),
        "warden-agent".into(),
        id.clone(),
    ];
    let exec_id = create(docker, container, user, cmd, true).await?;
    match docker.start_exec(&exec_id, None).await {
        Ok(StartExecResults::Attached { output, input }) => Ok(Agent {
            container: container.to_string(),
            id,
            exec_id,
            input,
            output,
        }),
        Ok(StartExecResults::Detached) => Err(ExecFailure::Failed(SandboxError::Docker {
            action: "start agent".into(),
            message: "engine detached an attached exec".into(),
        })),
        Err(e) => Err(classify("start agent", e)),
    }
}

fn request_bytes(tag: &str, req: &ExecRequest<'_>) -> Vec<u8> {
    let mut fields: Vec<String> = vec![
        tag.to_string(),
        format!("{:.3}", req.timeout.as_secs_f64().max(0.001)),
        KILL_GRACE_SECS.to_string(),
        req.env.len().to_string(),
    ];
    fields.extend(req.env.iter().map(|(k, v)| format!("{k}={v}")));
    fields.push(req.argv.len().to_string());
    fields.extend(req.argv.iter().cloned());
    let mut out = Vec::new();
    for f in fields {
        out.extend_from_slice(f.as_bytes());
        out.push(0);
    }
    out
}

impl Agent {
    async fn request(
        &mut self,
        req: &ExecRequest<'_>,
        stdout: &mut Captured,
        stderr: &mut Captured,
    ) -> Result<i64, AgentFailure> {
        let tag = random_tag();
        let bytes = request_bytes(&tag, req);
        if self.input.write_all(&bytes).await.is_err() || self.input.flush().await.is_err() {
            return Err(AgentFailure::DeadBeforeOutput);
        }
        let (mut out_end, mut err_end) = (EndWatch::new(&tag), EndWatch::new(&tag));
        let mut got_any = false;
        let deadline = req.timeout + Duration::from_secs(KILL_GRACE_SECS) + HOST_DEADLINE_SLACK;
        let read = tokio::time::timeout(deadline, async {
            while out_end.seen.is_none() || err_end.seen.is_none() {
                match self.output.next().await {
                    Some(Ok(LogOutput::StdOut { message }))
                    | Some(Ok(LogOutput::Console { message })) => {
                        got_any = true;
                        stdout.push(&message);
                        out_end.feed(&message);
                    }
                    Some(Ok(LogOutput::StdErr { message })) => {
                        got_any = true;
                        stderr.push(&message);
                        err_end.feed(&message);
                    }
                    Some(Ok(LogOutput::StdIn { .. })) => {}
                    Some(Err(e)) if !got_any => {
                        return Err(match docker_status(&e) {
                            Some(_) => AgentFailure::Docker(classify("read agent output", e)),
                            None => AgentFailure::DeadBeforeOutput,
                        });
                    }
                    Some(Err(_)) => return Err(AgentFailure::DeadMidway),
                    None if got_any => return Err(AgentFailure::DeadMidway),
                    None => return Err(AgentFailure::DeadBeforeOutput),
                }
            }
            Ok(())
        })
        .await;
        match read {
            Err(_) => Err(AgentFailure::Overran),
            Ok(Err(f)) => Err(f),
            Ok(Ok(())) => {
                let (code, out_len) = out_end.seen.expect("seen");
                let (_, err_len) = err_end.seen.expect("seen");
                stdout.drop_last(out_len);
                stderr.drop_last(err_len);
                Ok(code)
            }
        }
    }
}

/// Kills a command's process group when the call waiting for it is dropped (the task
/// was canceled or its deadline passed): Docker cannot kill an exec, and without this
/// the command would run on until its own timeout.
struct CancelSweep {
    armed: Option<(Docker, String, String, String)>,
}

impl CancelSweep {
    fn arm(docker: &Docker, container: &str, user: &str, agent: &str) -> Self {
        CancelSweep { armed: Some((docker.clone(), container.to_owned(), user.to_owned(), agent.to_owned())) }
    }

    fn disarm(&mut self) {
        self.armed = None;
    }
}

impl Drop for CancelSweep {
    fn drop(&mut self) {
        let Some((docker, container, user, agent)) = self.armed.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        tracing::info!(container = %container, agent = %agent, "call dropped mid-exec; killing its process group");
        runtime.spawn(async move {
            kill_sweep(&docker, &container, &user, &agent).await;
        });
    }
}

/// Runs `req` in `container` as `user` under the timeout wrapper, on a pooled agent.
pub(crate) async fn run(
    docker: &Docker,
    pool: &AgentPool,
    container: &str,
    user: &str,
    req: ExecRequest<'_>,
) -> Result<ExecResult, ExecFailure> {
    let started = Instant::now();
    loop {
        let (mut agent, reused) = match pool.take(container) {
            Some(a) => (a, true),
            None => (spawn_agent(docker, container, user).await?, false),
        };
        let mut stdout = Captured::new(req.capture_limit);
        let mut stderr = Captured::new(req.capture_limit + MARKER_WINDOW);
        let mut on_cancel = CancelSweep::arm(docker, container, user, &agent.id);
        let outcome = agent.request(&req, &mut stdout, &mut stderr).await;
        on_cancel.disarm();
        match outcome {
            Ok(exit_code) => {
                pool.give(agent);
                let timed_out = (exit_code == EXIT_TIMEOUT || exit_code == EXIT_SIGKILL)
                    && started.elapsed() >= req.timeout;
                return Ok(ExecResult {
                    stdout,
                    stderr,
                    exit_code,
                    timed_out,
                });
            }
            // A pooled agent that died while idle (container killed, engine restarted):
            // the command never reached it; try a fresh one (which detects a gone container).
            Err(AgentFailure::DeadBeforeOutput) if reused => continue,
            Err(AgentFailure::Docker(f)) => return Err(f),
            Err(AgentFailure::Overran) => {
                tracing::warn!(container, agent = %agent.id, "exec overran its host deadline; killing its process group");
                let swept = kill_sweep(docker, container, user, &agent.id).await;
                drop(agent);
                if swept {
                    return Ok(ExecResult {
                        stdout,
                        stderr,
                        exit_code: EXIT_SIGKILL,
                        timed_out: true,
                    });
                }
                return Err(ExecFailure::Broken(format!(
                    "the command overran its {:?} timeout and could not be killed",
                    req.timeout
                )));
            }
            Err(AgentFailure::DeadBeforeOutput | AgentFailure::DeadMidway) => {
                // The agent itself died: killed by the OOM killer (a normal outcome for a
                // memory hog), or the container is going away.
                let code = docker
                    .inspect_exec(&agent.exec_id)
                    .await
                    .ok()
                    .and_then(|i| i.exit_code);
                return match code {
                    Some(EXIT_SIGKILL) => Ok(ExecResult {
                        stdout,
                        stderr,
                        exit_code: EXIT_SIGKILL,
                        timed_out: false,
                    }),
                    other => match docker
                        .inspect_container(container, None::<InspectContainerOptions>)
                        .await
                    {
                        Ok(c) if c.state.as_ref().and_then(|s| s.running) == Some(true) => {
                            Err(ExecFailure::Broken(format!(
                                "the sandbox agent exited unexpectedly (exit {other:?}): {}",
                                stderr.text().trim()
                            )))
                        }
                        _ => Err(ExecFailure::ContainerGone(
                            "the container stopped during the call".into(),
                        )),
                    },
                };
            }
        }
    }
}

/// Runs a command directly (no wrapper) with a host-side limit; for the host's own
/// housekeeping only (kill sweeps, workspace setup). Returns the exit code.
pub(crate) async fn run_housekeeping(
    docker: &Docker,
    container: &str,
    user: &str,
    cmd: Vec<String>,
    limit: Duration,
) -> Result<i64, ExecFailure> {
    let exec = create(docker, container, user, cmd, false).await?;
    let finished = tokio::time::timeout(limit, async {
        match docker.start_exec(&exec, None).await {
            Ok(StartExecResults::Attached { mut output, .. }) => {
                while output.next().await.is_some() {}
            }
            Ok(StartExecResults::Detached) => {}
            Err(e) => return Err(classify("start exec", e)),
        }
        Ok(())
    })
    .await;
    match finished {
        Ok(r) => r?,
        Err(_) => {
            return Err(ExecFailure::Failed(SandboxError::Exec {
                session: container.to_string(),
                message: format!("housekeeping exec did not finish within {limit:?}"),
            }));
        }
    }
    match docker.inspect_exec(&exec).await {
        Ok(i) => Ok(i.exit_code.unwrap_or(-1)),
        Err(e) => Err(classify("inspect exec", e)),
    }
}

async fn create(
    docker: &Docker,
    container: &str,
    user: &str,
    cmd: Vec<String>,
    stdin: bool,
) -> Result<String, ExecFailure> {
    let opts = CreateExecOptions::<String> {
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        attach_stdin: Some(stdin),
        tty: Some(false),
        cmd: Some(cmd),
        user: Some(user.to_string()),
        working_dir: Some(crate::container::WORKSPACE.to_string()),
        ..Default::default()
    };
    docker
        .create_exec(container, opts)
        .await
        .map(|r| r.id)
        .map_err(|e| classify("create exec", e))
}

/// Kills a wrapper's process group from a second exec; false when that failed.
async fn kill_sweep(docker: &Docker, container: &str, user: &str, agent: &str) -> bool {
    let cmd = vec![
        "bash".into(),
        "-c".into(),
        KILL_SWEEP.into(),
        "warden-kill".into(),
        agent.into(),
    ];
    match run_housekeeping(docker, container, user, cmd, KILL_SWEEP_TIMEOUT).await {
        Ok(0) => true,
        other => {
            tracing::warn!(container, agent, result = ?other, "kill sweep failed");
            false
        }
    }
}

/// 404 (no such container) and 409 (not running) mean the container is gone.
/// 404 (no such container) and 409 (not running) mean the container is gone; a 500 from
/// the OCI runtime means it cannot start processes any more.
fn classify(action: &str, e: bollard::errors::Error) -> ExecFailure {
    match docker_status(&e) {
        Some(404) | Some(409) => ExecFailure::ContainerGone(e.to_string()),
        Some(500) if e.to_string().contains("OCI runtime") => {
            ExecFailure::ContainerWedged(e.to_string())
        }
        _ => ExecFailure::Failed(SandboxError::from_docker(action, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_keeps_head_and_tail() {
        let mut c = Captured::new(10);
        c.push(b"0123456789abcdefghij");
        assert_eq!(c.truncated(), 10);
        assert_eq!(c.text(), "01234\n[... 10 bytes truncated ...]\nfghij");
    }

    #[test]
    fn end_marker_is_found_and_stripped() {
        let mut c = Captured::new(1000);
        let mut w = EndWatch::new("abc");
        for chunk in [&b"oops\n\x1ewarden-en"[..], b"d:abc:3\n"] {
            c.push(chunk);
            w.feed(chunk);
        }
        let (code, len) = w.seen.unwrap();
        assert_eq!(code, 3);
        c.drop_last(len);
        assert_eq!(c.text(), "oops\n");
    }

    #[test]
    fn cap_text_states_truncation() {
        let s = "é".repeat(1000);
        let out = cap_text(s, 200);
        assert!(out.len() <= 200 + 8, "{}", out.len());
        assert!(out.contains("bytes truncated"));
    }
}
