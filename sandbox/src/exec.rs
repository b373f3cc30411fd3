//! Running one request in a session container on a pooled in-container agent, with a hard
//! deadline and capped output.
//!
//! Docker cannot kill an exec, and its round trip is the dominant cost of a tool call, so
//! every request runs on a long-lived *agent* (`agent.py`, one exec per concurrently busy
//! call slot, kept in a per-session pool) that speaks the framed protocol of `agent.rs`.
//! The agent runs each command in a session of its own with the timeout (TERM, then KILL
//! after a grace period), and when it ends kills its process group and then every process
//! of the sandbox user that no other live call owns (double-forked and `setsid` processes
//! included): nothing a call starts outlives it. The command's output goes to files in the
//! container's /tmp, so background children holding pipes cannot keep a call open, and only
//! head and tail (the capture limit) come back, with the true total size.
//! If even the agent overruns, the host kills it and its tree from a second exec.
//!
//! This module must never log environment values (they carry per-task secrets), never run a
//! command without the agent (except the host's own housekeeping), and never buffer more
//! than the capture limit per stream.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::query_parameters::InspectContainerOptions;
use futures_util::{Stream, StreamExt};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::agent::{AGENT_SOURCE, Frame, FrameReader, Op, Outcome, SETTLED_DIR, WORKSPACE};
use crate::error::{SandboxError, docker_status};
use crate::lanes::LanePass;

/// Seconds between the TERM sent to a timed-out process group and the KILL that follows.
pub(crate) const KILL_GRACE_SECS: u64 = 2;
/// Extra time the host waits beyond timeout + grace before it kills the agent itself:
/// covers streaming the captured output back and a slow Docker engine.
pub(crate) const HOST_DEADLINE_SLACK: Duration = Duration::from_secs(10);
/// Host-side limit for the kill sweep exec that runs when the agent itself overran.
pub(crate) const KILL_SWEEP_TIMEOUT: Duration = Duration::from_secs(10);
/// Exit status of a process killed by SIGKILL (timeout's KILL, or the OOM killer).
pub(crate) const EXIT_SIGKILL: i64 = 137;
/// Idle agents kept per session; more concurrent calls start more, the extra ones exit.
pub(crate) const MAX_IDLE_AGENTS: usize = 4;

/// Makes agent ids unique within this host process.
static EXEC_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The agent's source without comment lines: a shorter argv for every agent exec, and no
/// prose in the container's process list.
fn agent_code() -> &'static str {
    static CODE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    CODE.get_or_init(|| {
        AGENT_SOURCE
            .lines()
            .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
            .collect::<Vec<_>>()
            .join("\n")
    })
}

/// The uid and gid parts of a `uid[:gid]` user (the gid is the uid when not given), as the
/// agent's root modes take them.
fn uid_and_gid(user: &str) -> (&str, &str) {
    user.split_once(':').unwrap_or((user, user))
}

/// The interpreter command line that starts the agent source in `mode`.
pub(crate) fn agent_argv(mode: &str, arg: Option<&str>) -> Vec<String> {
    let mut v: Vec<String> =
        vec!["python3".into(), "-I".into(), "-S".into(), "-c".into(), agent_code().into(), mode.into()];
    v.extend(arg.map(str::to_string));
    v
}

/// One request to run in a session container.
pub(crate) struct ExecRequest<'a> {
    pub op: Op<'a>,
    /// Hard wall-clock limit for a command (file operations get [`FILE_OP_TIMEOUT`]).
    pub timeout: Duration,
    /// Bytes kept per stream (head + tail).
    pub capture_limit: usize,
}

/// Host-side limit for a file operation (stat, read, write) on the agent.
pub(crate) const FILE_OP_TIMEOUT: Duration = Duration::from_secs(60);

/// What a finished request produced.
#[derive(Debug)]
pub(crate) struct ExecResult {
    pub stdout: Captured,
    pub stderr: Captured,
    /// File bytes (`read`).
    pub data: Vec<u8>,
    /// The Bash shell's physical working directory at its end, as the agent read it.
    pub state: Option<Vec<u8>>,
    /// The agent's result fields.
    pub outcome: Outcome,
    /// Exit status (128+N for a signal); 0 for file operations.
    pub exit_code: i64,
    /// True when the hard timeout ended the command.
    pub timed_out: bool,
    /// Commands the agent started for this request (0 or 1).
    pub new_commands: u64,
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
    /// The command may have run but the container stopped cooperating (the agent could
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
        Self { limit, ..Default::default() }
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

    /// Records the stream's true size (the agent sends only head and tail).
    pub(crate) fn set_total(&mut self, total: u64) {
        self.total = total.max((self.head.len() + self.tail.len()) as u64);
    }

    /// Bytes kept (head + tail).
    pub(crate) fn kept(&self) -> usize {
        self.head.len() + self.tail.len()
    }

    /// Lossy text of at most about `budget` kept bytes (head and tail), with one note that
    /// states every byte dropped: by the capture limit and by this budget together.
    pub(crate) fn text_within(&self, budget: usize) -> String {
        let kept = self.bytes();
        if self.truncated() == 0 && kept.len() <= budget {
            return String::from_utf8_lossy(&kept).into_owned();
        }
        let head_n = self.head.len().min(budget / 2);
        let tail_n = self.tail.len().min(budget - head_n);
        let tail: Vec<u8> = self.tail.iter().skip(self.tail.len() - tail_n).copied().collect();
        let dropped = self.total - (head_n + tail_n) as u64;
        format!(
            "{}\n[... {dropped} bytes truncated ...]\n{}",
            String::from_utf8_lossy(&self.head[..head_n]),
            String::from_utf8_lossy(&tail)
        )
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
            n => format!("{head}\n[... {n} bytes truncated ...]\n{}", String::from_utf8_lossy(&tail)),
        }
    }
}

/// Cuts text to at most `max` bytes, keeping head and tail and stating what was dropped
/// (every tool output's bound: the sandbox tools' here, MCP tool results in the host).
pub fn cap_text(text: String, max: usize) -> String {
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
    format!("{}\n[... {dropped} bytes truncated ...]\n{}", &text[..head_end], &text[tail_start..])
}

/// A long-lived exec running the agent, with its attached stdin and output.
pub(crate) struct Agent {
    container: String,
    exec_id: String,
    /// The agent's pid and start time in the container (its hello frame): what the kill
    /// sweep aims at, so a reused pid is never hit.
    pid: (u64, u64),
    /// Commands this agent reported started so far.
    started: u64,
    input: Pin<Box<dyn AsyncWrite + Send>>,
    output: Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>,
}

/// What a replica's agents carry on their command line (`serve <uid> <gid> <replica>
/// <life>`, or after `prepare-serve <port> <uid> <gid>`), so that the replica, restarted under the same id, sweeps the agents (and
/// commands) of its earlier lives in a container and no one else's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AgentTag {
    /// `sandbox.replica_id` (label-safe, checked by the settings).
    pub replica: String,
    /// Unique per `Sandbox`: this life of the replica.
    pub life: String,
}

/// A session's idle agents (checked out for one request at a time).
#[derive(Default)]
pub(crate) struct AgentPool {
    idle: Mutex<Vec<Agent>>,
    /// The tag of the agents this pool starts (`None`: no replicas).
    tag: Option<Arc<AgentTag>>,
}

impl AgentPool {
    /// An empty pool whose agents carry `tag`.
    pub(crate) fn new(tag: Option<Arc<AgentTag>>) -> Self {
        Self { idle: Mutex::default(), tag }
    }

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

    /// Takes over `other`'s idle agents (a pooled container's, when it is handed out).
    pub(crate) fn absorb(&self, other: AgentPool) {
        let agents = other.idle.into_inner().expect("agent pool lock");
        agents.into_iter().for_each(|a| self.give(a));
    }

    /// Starts the just-started `container`'s first agent, which prepares the container
    /// (agent.py's `prepare`, waiting for the egress forwarder on `forwarder_port` unless
    /// 0) before it serves, and keeps it idle: the preparation and the first agent's
    /// start-up in one exec round trip instead of two, and the first request (a pool
    /// container's, a new session's, a resumed one's) skips the agent's start-up.
    pub(crate) async fn spawn_preparing(
        &self,
        docker: &Docker,
        container: &str,
        user: &str,
        forwarder_port: u16,
    ) -> Result<(), PrepareFailure> {
        let start = AgentStart::PrepareThenServe { forwarder_port };
        let agent = spawn_agent(docker, container, user, self.tag.as_deref(), start).await?;
        self.give(agent);
        Ok(())
    }
}

/// How a new agent starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AgentStart {
    /// It serves at once: the container is prepared.
    Serve,
    /// It prepares the container first, as root, then serves (`prepare-serve`).
    PrepareThenServe { forwarder_port: u16 },
}

/// Why an agent that prepares its container did not start serving.
#[derive(Debug)]
pub(crate) enum PrepareFailure {
    /// Its process ended before it served, with this exit code (the preparation's verdict;
    /// 126: the runtime could not start it) and stderr.
    Exited(i64, String),
    /// The exec failed otherwise.
    Exec(ExecFailure),
}

impl From<ExecFailure> for PrepareFailure {
    fn from(f: ExecFailure) -> Self {
        PrepareFailure::Exec(f)
    }
}

impl From<PrepareFailure> for ExecFailure {
    fn from(f: PrepareFailure) -> Self {
        match f {
            PrepareFailure::Exited(_, stderr) => ExecFailure::Broken(format!(
                "the agent exited at start: {} (the sandbox image needs python3)",
                stderr.trim()
            )),
            PrepareFailure::Exec(f) => f,
        }
    }
}

/// Why a request on an agent did not complete.
enum AgentFailure {
    /// The agent's stream ended (or broke) before any byte of the response.
    DeadBeforeOutput,
    /// The stream ended mid-response.
    DeadMidway,
    /// The agent wrote something that is not the protocol.
    Garbled(String),
    /// The host deadline passed.
    Overran,
    /// Docker refused something.
    Docker(ExecFailure),
}

/// Longest wait for a new agent's hello frame (interpreter start-up on a busy machine).
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);

/// Starts an agent as root (`exec_user`, which it drops at once to `user`), tagged with
/// `tag`, and waits for its hello frame; with [`AgentStart::PrepareThenServe`] it prepares
/// the container first.
async fn spawn_agent(
    docker: &Docker,
    container: &str,
    user: &str,
    tag: Option<&AgentTag>,
    start: AgentStart,
) -> Result<Agent, PrepareFailure> {
    let (uid, gid) = uid_and_gid(user);
    let argv = {
        let mut v = match start {
            AgentStart::Serve => agent_argv("serve", Some(uid)),
            AgentStart::PrepareThenServe { forwarder_port } => {
                let mut v = agent_argv("prepare-serve", Some(&forwarder_port.to_string()));
                v.push(uid.to_string());
                v
            }
        };
        v.push(gid.to_string());
        v.extend(tag.into_iter().flat_map(|t| [t.replica.clone(), t.life.clone()]));
        v
    };
    let exec_id = create(docker, container, AGENT_EXEC_USER, argv, true).await?;
    let (input, mut output) = match docker.start_exec(&exec_id, None).await {
        Ok(StartExecResults::Attached { output, input }) => (input, output),
        Ok(StartExecResults::Detached) => {
            return Err(ExecFailure::Failed(SandboxError::Docker {
                action: "start agent".into(),
                message: "engine detached an attached exec".into(),
            })
            .into());
        }
        Err(e) => return Err(classify("start agent", e).into()),
    };
    let mut frames = FrameReader::default();
    let mut stderr = Captured::new(4096);
    let hello = tokio::time::timeout(HELLO_TIMEOUT, async {
        loop {
            match output.next().await {
                Some(Ok(LogOutput::StdOut { message })) | Some(Ok(LogOutput::Console { message })) => {
                    frames.feed(&message);
                    match frames.next() {
                        Ok(Some(Frame::Hello(fields))) => return Ok(fields),
                        Ok(None) => {}
                        Ok(Some(_)) | Err(_) => {
                            return Err(Some("the agent did not start with a hello frame".to_string()));
                        }
                    }
                }
                Some(Ok(LogOutput::StdErr { message })) => stderr.push(&message),
                Some(Ok(_)) => {}
                Some(Err(e)) if docker_status(&e).is_some() => return Err(Some(e.to_string())),
                // It ended before serving: its exit code says why.
                Some(Err(_)) | None => return Err(None),
            }
        }
    })
    .await;
    let hello = match hello {
        Ok(Ok(h)) => Outcome::from_agent(h),
        Ok(Err(Some(why))) => return Err(ExecFailure::Broken(why).into()),
        Ok(Err(None)) => {
            let code = docker.inspect_exec(&exec_id).await.ok().and_then(|i| i.exit_code).unwrap_or(-1);
            return Err(PrepareFailure::Exited(code, stderr.text()));
        }
        Err(_) => {
            return Err(ExecFailure::Broken(format!("the agent did not start within {HELLO_TIMEOUT:?}")).into());
        }
    };
    Ok(Agent {
        container: container.to_string(),
        exec_id,
        pid: (hello.num("pid").max(0) as u64, hello.num("starttime").max(0) as u64),
        started: 0,
        input,
        output,
    })
}

/// The user agents are started as: root, with only CAP_SETUID and CAP_SETGID (the session
/// container's capabilities), to drop to the sandbox user (see `agent.py`).
pub(crate) const AGENT_EXEC_USER: &str = "0:0";

/// A fresh request nonce: the agent echoes it in its result frame, so a result that
/// belongs to no request of ours (forged, or out of step) is detected.
fn nonce() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(EXEC_COUNTER.fetch_add(1, Ordering::Relaxed));
    format!("{:016x}", h.finish())
}

impl Agent {
    async fn request(&mut self, req: &ExecRequest<'_>, sink: &mut Replies) -> Result<Outcome, AgentFailure> {
        let nonce = nonce();
        let bytes = req.op.encode(&nonce, req.timeout, Duration::from_secs(KILL_GRACE_SECS), req.capture_limit);
        if self.input.write_all(&bytes).await.is_err() || self.input.flush().await.is_err() {
            return Err(AgentFailure::DeadBeforeOutput);
        }
        let mut frames = FrameReader::default();
        let mut got_any = false;
        let deadline = match req.op {
            Op::Exec { .. } | Op::Bash { .. } => {
                req.timeout + Duration::from_secs(KILL_GRACE_SECS) + HOST_DEADLINE_SLACK
            }
            _ => FILE_OP_TIMEOUT,
        };
        let read = tokio::time::timeout(deadline, async {
            loop {
                match self.output.next().await {
                    Some(Ok(LogOutput::StdOut { message })) | Some(Ok(LogOutput::Console { message })) => {
                        got_any = true;
                        frames.feed(&message);
                        while let Some(frame) = frames.next().map_err(AgentFailure::Garbled)? {
                            match frame {
                                Frame::Result(fields) if fields.get("nonce") == Some(&nonce) => {
                                    return Ok(Outcome::from_agent(fields));
                                }
                                Frame::Result(_) => {
                                    return Err(AgentFailure::Garbled("a result for another request".into()));
                                }
                                other => sink.take(other, &req.op).map_err(AgentFailure::Garbled)?,
                            }
                        }
                    }
                    // The agent's own stderr: only an interpreter crash writes there.
                    Some(Ok(LogOutput::StdErr { message })) => sink.agent_stderr.push(&message),
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
        })
        .await;
        match read {
            Err(_) => Err(AgentFailure::Overran),
            Ok(r) => r,
        }
    }
}

/// Where a request's frames go.
struct Replies {
    stdout: Captured,
    stderr: Captured,
    data: Vec<u8>,
    state: Option<Vec<u8>>,
    agent_stderr: Captured,
}

impl Replies {
    fn new(cap: usize) -> Self {
        Replies {
            stdout: Captured::new(cap),
            stderr: Captured::new(cap),
            data: Vec::new(),
            state: None,
            agent_stderr: Captured::new(4096),
        }
    }

    /// Accepts a frame only where the request can produce it: file data for a read (up to
    /// its limit), shell state once for a Bash command, output for commands.
    fn take(&mut self, frame: Frame, op: &Op<'_>) -> Result<(), String> {
        match (frame, op) {
            (Frame::Stdout(d), Op::Exec { .. } | Op::Bash { .. }) => self.stdout.push(&d),
            (Frame::Stderr(d), Op::Exec { .. } | Op::Bash { .. }) => self.stderr.push(&d),
            (Frame::Data(d), Op::Read { max, .. }) if (self.data.len() + d.len()) as u64 <= *max => self.data.extend(d),
            (Frame::State(d), Op::Bash { .. }) if self.state.is_none() => self.state = Some(d),
            (frame, _) => return Err(format!("unexpected {} frame for this request", frame.kind_name())),
        }
        Ok(())
    }
}

/// Kills a command's process group when the call waiting for it is dropped (the task
/// was canceled or its deadline passed): Docker cannot kill an exec, and without this
/// the command would run on until its own timeout. The command's lane (`lanes`) goes with
/// the kill and is let go only after it: no command of another fingerprint starts while the
/// dropped one may still run.
struct CancelSweep<'h> {
    armed: Option<(Docker, String, String, (u64, u64))>,
    lane: &'h mut Option<LanePass>,
}

impl<'h> CancelSweep<'h> {
    fn arm(docker: &Docker, container: &str, user: &str, agent: (u64, u64), lane: &'h mut Option<LanePass>) -> Self {
        CancelSweep { armed: Some((docker.clone(), container.to_owned(), user.to_owned(), agent)), lane }
    }

    fn disarm(&mut self) {
        self.armed = None;
    }
}

impl Drop for CancelSweep<'_> {
    fn drop(&mut self) {
        let Some((docker, container, user, agent)) = self.armed.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        tracing::info!(container = %container, agent_pid = agent.0, "call dropped mid-exec; killing its agent and command");
        let lane = self.lane.take();
        runtime.spawn(async move {
            kill_sweep(&docker, &container, &user, agent).await;
            drop(lane);
        });
    }
}

/// Runs `req` in `container` as `user` on a pooled agent. `lane`: the command's lane
/// (`lanes`), which this keeps until the command's processes are gone if the call is
/// dropped midway (otherwise the caller lets go of it when this returns).
pub(crate) async fn run(
    docker: &Docker,
    pool: &AgentPool,
    container: &str,
    user: &str,
    req: ExecRequest<'_>,
    lane: &mut Option<LanePass>,
) -> Result<ExecResult, ExecFailure> {
    loop {
        let (mut agent, reused) = match pool.take(container) {
            Some(a) => (a, true),
            None => (spawn_agent(docker, container, user, pool.tag.as_deref(), AgentStart::Serve).await?, false),
        };
        let started_before = agent.started;
        let mut replies = Replies::new(req.capture_limit);
        let mut on_cancel = CancelSweep::arm(docker, container, user, agent.pid, lane);
        let outcome = agent.request(&req, &mut replies).await;
        on_cancel.disarm();
        drop(on_cancel);
        let Replies { mut stdout, mut stderr, data, state, agent_stderr } = replies;
        let killed = |stdout, stderr, timed_out| ExecResult {
            stdout,
            stderr,
            data: Vec::new(),
            state: None,
            outcome: Outcome::killed_by_host(),
            exit_code: EXIT_SIGKILL,
            timed_out,
            new_commands: 0,
        };
        match outcome {
            Ok(outcome) => {
                let started = outcome.num("started").max(0) as u64;
                let new_commands = started.saturating_sub(started_before);
                agent.started = started;
                pool.give(agent);
                stdout.set_total(outcome.num("out_total").max(0) as u64);
                stderr.set_total(outcome.num("err_total").max(0) as u64);
                let exit_code = outcome.num("code");
                let timed_out = outcome.get("timed_out") == "1";
                return Ok(ExecResult { stdout, stderr, data, state, outcome, exit_code, timed_out, new_commands });
            }
            // A pooled agent that died while idle (container killed, engine restarted, or
            // retired: a command changed its settings): the command never reached it; try a
            // fresh one (which detects a gone container).
            Err(AgentFailure::DeadBeforeOutput)
                if reused
                    && docker.inspect_exec(&agent.exec_id).await.ok().and_then(|i| i.exit_code)
                        != Some(CONTAINER_POISONED) =>
            {
                continue;
            }
            // The agent would not serve: the container's init no longer has the limits
            // recorded at its start (under gVisor a command's `prlimit` of any process
            // changes them for every process of the container), or a new agent started with
            // settings not the init's. No agent of this container is trusted again.
            Err(AgentFailure::DeadBeforeOutput)
                if matches!(
                    docker.inspect_exec(&agent.exec_id).await.ok().and_then(|i| i.exit_code),
                    Some(CONTAINER_POISONED | AGENT_RETIRED)
                ) =>
            {
                return Err(ExecFailure::ContainerWedged(POISONED.into()));
            }
            Err(AgentFailure::Docker(f)) => return Err(f),
            Err(AgentFailure::Garbled(why)) => {
                kill_sweep(docker, container, user, agent.pid).await;
                return Err(ExecFailure::Broken(format!("the sandbox agent broke the protocol: {why}")));
            }
            Err(AgentFailure::Overran) => {
                tracing::warn!(
                    container,
                    agent_pid = agent.pid.0,
                    "request overran its host deadline; killing the agent and its processes"
                );
                let swept = kill_sweep(docker, container, user, agent.pid).await;
                drop(agent);
                if swept {
                    return Ok(killed(stdout, stderr, true));
                }
                return Err(ExecFailure::Broken(format!(
                    "the command overran its {:?} timeout and could not be killed",
                    req.timeout
                )));
            }
            Err(AgentFailure::DeadBeforeOutput | AgentFailure::DeadMidway) => {
                // The agent itself died: killed by the OOM killer (a normal outcome for a
                // memory hog), or the container is going away.
                let code = docker.inspect_exec(&agent.exec_id).await.ok().and_then(|i| i.exit_code);
                if code == Some(EXIT_SIGKILL) {
                    // The agent never swept its command's processes: the command may have
                    // killed it (`kill -9 $PPID`) to leave a `setsid` child behind. Sweep
                    // here, before the call (and its egress narrowing) ends; a container
                    // that cannot be swept is replaced.
                    if !kill_sweep(docker, container, user, agent.pid).await {
                        return Err(ExecFailure::Broken(
                            "the sandbox agent was killed and its processes could not be swept".into(),
                        ));
                    }
                    return Ok(killed(stdout, stderr, false));
                }
                return match docker.inspect_container(container, None::<InspectContainerOptions>).await {
                    Ok(c) if c.state.as_ref().and_then(|s| s.running) == Some(true) => {
                        Err(ExecFailure::Broken(format!(
                            "the sandbox agent exited unexpectedly (exit {code:?}): {}{}",
                            agent_stderr.text().trim(),
                            if code == Some(127) { " (the sandbox image needs python3)" } else { "" }
                        )))
                    }
                    _ => Err(ExecFailure::ContainerGone("the container stopped during the call".into())),
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
            Ok(StartExecResults::Attached { mut output, .. }) => while output.next().await.is_some() {},
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

/// Starts `cmd` in `container` as `user` and leaves it running (the egress forwarder): no
/// output is attached, nothing waits for it; it lives as long as the container.
pub(crate) async fn start_detached(
    docker: &Docker,
    container: &str,
    user: &str,
    cmd: Vec<String>,
) -> Result<(), SandboxError> {
    let opts = exec_options(user, cmd, "/", Attach::Nothing);
    let fail = |e: bollard::errors::Error| SandboxError::from_docker("start the egress forwarder", e);
    let exec = docker.create_exec(container, opts).await.map_err(fail)?;
    let start = bollard::exec::StartExecOptions { detach: true, ..Default::default() };
    docker.start_exec(&exec.id, Some(start)).await.map_err(fail).map(drop)
}

/// What an exec has attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attach {
    /// Nothing: it runs detached.
    Nothing,
    /// Its stdout and stderr.
    Output,
    /// Its stdin, stdout and stderr.
    Stdio,
}

/// The options of every exec warden makes: `cmd` as `user` in `dir`, no TTY, `attach`ed.
pub(crate) fn exec_options(user: &str, cmd: Vec<String>, dir: &str, attach: Attach) -> CreateExecOptions<String> {
    CreateExecOptions::<String> {
        attach_stdout: Some(attach != Attach::Nothing),
        attach_stderr: Some(attach != Attach::Nothing),
        attach_stdin: Some(attach == Attach::Stdio),
        tty: Some(false),
        cmd: Some(cmd),
        user: Some(user.to_string()),
        working_dir: Some(dir.to_string()),
        ..Default::default()
    }
}

/// An attached exec's stdin and stdout as one byte stream (an egress channel). Its stderr
/// is dropped: the forwarder writes there only when it fails, and then the stream ends.
pub(crate) struct AttachedIo {
    input: Pin<Box<dyn AsyncWrite + Send>>,
    output: Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>,
    /// Received and not yet read.
    pending: bytes::Bytes,
}

impl tokio::io::AsyncRead for AttachedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        loop {
            if !self.pending.is_empty() {
                let n = buf.remaining().min(self.pending.len());
                let chunk = self.pending.split_to(n);
                buf.put_slice(&chunk);
                return Poll::Ready(Ok(()));
            }
            match std::task::ready!(self.output.as_mut().poll_next(cx)) {
                Some(Ok(LogOutput::StdOut { message } | LogOutput::Console { message })) => self.pending = message,
                Some(Ok(_)) => {}
                Some(Err(e)) => return Poll::Ready(Err(std::io::Error::other(e))),
                None => return Poll::Ready(Ok(())),
            }
        }
    }
}

impl AsyncWrite for AttachedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.input.as_mut().poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        self.input.as_mut().poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.input.as_mut().poll_shutdown(cx)
    }
}

/// Starts `cmd` in `container` as `user` (in `/`) with stdin and stdout attached, as one
/// byte stream: the egress channel's exec. It ends when either side closes.
pub(crate) async fn start_attached(
    docker: &Docker,
    container: &str,
    user: &str,
    cmd: Vec<String>,
) -> Result<AttachedIo, SandboxError> {
    let opts = exec_options(user, cmd, "/", Attach::Stdio);
    let fail = |e: bollard::errors::Error| SandboxError::from_docker("open the egress channel", e);
    let exec = docker.create_exec(container, opts).await.map_err(fail)?;
    match docker.start_exec(&exec.id, None).await.map_err(fail)? {
        StartExecResults::Attached { output, input } => Ok(AttachedIo { input, output, pending: bytes::Bytes::new() }),
        StartExecResults::Detached => Err(SandboxError::Docker {
            action: "open the egress channel".into(),
            message: "engine detached an attached exec".into(),
        }),
    }
}

async fn create(
    docker: &Docker,
    container: &str,
    user: &str,
    cmd: Vec<String>,
    stdin: bool,
) -> Result<String, ExecFailure> {
    let opts = exec_options(user, cmd, WORKSPACE, if stdin { Attach::Stdio } else { Attach::Output });
    docker.create_exec(container, opts).await.map(|r| r.id).map_err(|e| classify("create exec", e))
}

/// Kills an agent, its command and every orphan of the sandbox user from a second exec
/// (the agent's `kill-agent` mode); false when that failed.
pub(crate) async fn kill_sweep(docker: &Docker, container: &str, user: &str, agent: (u64, u64)) -> bool {
    let argv = sweeper_argv("kill-agent", user, [agent.0.to_string(), agent.1.to_string()]);
    match run_housekeeping(docker, container, AGENT_EXEC_USER, argv, KILL_SWEEP_TIMEOUT).await {
        Ok(0) => true,
        other => {
            tracing::warn!(container, agent_pid = agent.0, result = ?other, "kill sweep failed");
            false
        }
    }
}

/// The command line of a once-off sweep (`kill-agent`, `sweep-all`, `sweep-lives`): started
/// as root ([`AGENT_EXEC_USER`]) like a serving agent, it opens the container's sweep lock
/// (`agent.py`'s `SWEEP_LOCK`) and drops to `user` before it reads or signals anything.
fn sweeper_argv<const N: usize>(mode: &str, user: &str, args: [String; N]) -> Vec<String> {
    let (uid, gid) = uid_and_gid(user);
    let mut argv = agent_argv(mode, Some(uid));
    argv.push(gid.to_string());
    argv.extend(args);
    argv
}

/// After a host restart: kills every process of the sandbox user in an adopted container
/// except its init and main process (commands of interrupted tasks, their daemons, agents
/// of the dead host). Returns whether the sweep ran.
pub(crate) async fn sweep_all(docker: &Docker, container: &str, user: &str) -> bool {
    let argv = sweeper_argv("sweep-all", user, []);
    matches!(run_housekeeping(docker, container, AGENT_EXEC_USER, argv, KILL_SWEEP_TIMEOUT).await, Ok(0))
}

/// A replica adopting its own container: kills the agents of its earlier lives (tagged
/// with `tag.replica` and another life) and their trees, and nothing else (other replicas'
/// agents and calls run on). Returns whether the sweep ran.
pub(crate) async fn sweep_earlier_lives(docker: &Docker, container: &str, user: &str, tag: &AgentTag) -> bool {
    let argv = sweeper_argv("sweep-lives", user, [tag.replica.clone(), tag.life.clone()]);
    matches!(run_housekeeping(docker, container, AGENT_EXEC_USER, argv, KILL_SWEEP_TIMEOUT).await, Ok(0))
}

/// `agent.py`'s `AGENT_RETIRED`: a serving agent whose settings (limits, niceness,
/// scheduling policy, CPU affinity) are not the container's init's exits with it,
/// unanswered, before its next request.
const AGENT_RETIRED: i64 = 9;
/// `agent.py`'s `CONTAINER_POISONED`: what a serving agent exits with, unanswered, when the
/// container's init no longer has the limits recorded at the container's start.
const CONTAINER_POISONED: i64 = 10;
/// Why a container whose processes' settings a command changed is replaced.
pub(crate) const POISONED: &str =
    "a command changed the resource limits, niceness or CPU affinity the container's processes run with";

/// `agent.py`'s `settle` exit status when no exec root carries the tag (the process ended,
/// or cleared its environment).
const SETTLE_NOT_FOUND: i64 = 3;
/// `agent.py`'s `settle` exit status when the record directory is not root's own.
const SETTLE_UNTRUSTED: i64 = 5;
/// Host-side limit for the settle exec: an interpreter start, one scan of /proc and a small
/// file write, on a busy machine.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Records the session process tagged `tag` in `container` with the descendants it has now
/// as its steady state (the agent's `settle`, one root exec): from then on, every command
/// of the session starts only after whatever else that process started is killed.
pub(crate) async fn settle(docker: &Docker, container: &str, user: &str, tag: &str) -> Result<(), SandboxError> {
    let (uid, gid) = uid_and_gid(user);
    let mut argv = agent_argv("settle", Some(uid));
    argv.extend([gid.to_string(), tag.to_string()]);
    let why = match run_housekeeping(docker, container, AGENT_EXEC_USER, argv, SETTLE_TIMEOUT).await {
        Ok(0) => return Ok(()),
        Ok(SETTLE_NOT_FOUND) => "the process is gone or cleared its environment".to_string(),
        Ok(SETTLE_UNTRUSTED) => format!("{SETTLED_DIR} is not root's own directory"),
        Ok(code) => format!("the agent's settle exited with {code}"),
        Err(ExecFailure::Failed(e)) => e.to_string(),
        Err(ExecFailure::ContainerGone(m) | ExecFailure::ContainerWedged(m) | ExecFailure::Broken(m)) => m,
    };
    Err(SandboxError::Exec {
        session: container.to_string(),
        message: format!("could not settle a session process: {why}"),
    })
}

/// What the use mark of a session container says (`agent.py`'s `use-hold`).
pub(crate) enum UseCheck {
    /// No call is running and no replica used it for the whole period; no call starts while
    /// the hold lives (hold it until the container is removed).
    Idle(UseHold),
    /// A call is running, or some replica used it within the period.
    InUse,
    /// It has no use mark (made by an older warden).
    NoMark,
    /// The check could not run (the container stopped or is gone, the engine failed).
    Failed,
}

/// A root exec holding the use mark's exclusive lock: agents wait before their next request
/// until it drops (its stdin closes) or the container goes.
pub(crate) struct UseHold {
    _input: Pin<Box<dyn AsyncWrite + Send>>,
    _output: Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>,
}

/// Whether any replica ran a call in `container` within `period`, or runs one now; when
/// neither, holds the container idle (see [`UseCheck::Idle`]). One root exec (the mark is
/// root's), a few tens of milliseconds.
pub(crate) async fn use_check(docker: &Docker, container: &str, period: Duration) -> UseCheck {
    let argv = agent_argv("use-hold", Some(&period.as_secs().max(1).to_string()));
    let checked = tokio::time::timeout(KILL_SWEEP_TIMEOUT, async {
        let exec_id = create(docker, container, AGENT_EXEC_USER, argv, true).await.ok()?;
        let Ok(StartExecResults::Attached { output, input }) = docker.start_exec(&exec_id, None).await else {
            return None;
        };
        let mut output = output;
        let mut said = Vec::new();
        while !said.contains(&b'\n') {
            match output.next().await? {
                Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => said.extend(&message),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
        Some(match said.split(|b| *b == b'\n').next() {
            Some(b"idle") => UseCheck::Idle(UseHold { _input: input, _output: output }),
            Some(b"in-use") => UseCheck::InUse,
            Some(b"none") => UseCheck::NoMark,
            _ => UseCheck::Failed,
        })
    })
    .await;
    checked.ok().flatten().unwrap_or(UseCheck::Failed)
}

/// 404 (no such container) and 409 (not running) mean the container is gone; a 500 from
/// the OCI runtime means it cannot start processes any more.
fn classify(action: &str, e: bollard::errors::Error) -> ExecFailure {
    match docker_status(&e) {
        Some(404) | Some(409) => ExecFailure::ContainerGone(e.to_string()),
        Some(500) if e.to_string().contains("OCI runtime") => ExecFailure::ContainerWedged(e.to_string()),
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
    fn text_within_states_every_dropped_byte() {
        let mut c = Captured::new(100);
        c.push(&[b'a'; 50]);
        c.push(&[b'z'; 50]);
        c.set_total(1_000_000_000);
        let t = c.text_within(20);
        assert!(t.contains("[... 999999980 bytes truncated ...]"), "{t}");
        assert!(t.starts_with("aaaaaaaaaa\n") && t.ends_with("\nzzzzzzzzzz"), "{t}");
    }

    #[test]
    fn cap_text_states_truncation() {
        let s = "é".repeat(1000);
        let out = cap_text(s, 200);
        assert!(out.len() <= 200 + 8, "{}", out.len());
        assert!(out.contains("bytes truncated"));
    }

    #[test]
    fn the_agent_uses_the_same_settle_exit_codes() {
        assert!(AGENT_SOURCE.contains(&format!("\nSETTLE_NOT_FOUND = {SETTLE_NOT_FOUND}\n")));
        assert!(AGENT_SOURCE.contains(&format!("\nAGENT_RETIRED = {AGENT_RETIRED}\n")));
        assert!(AGENT_SOURCE.contains(&format!("\nCONTAINER_POISONED = {CONTAINER_POISONED}\n")));
        assert!(AGENT_SOURCE.contains(&format!("\nSETTLE_UNTRUSTED = {SETTLE_UNTRUSTED}\n")));
    }
}
