//! Append-only JSONL audit log: one line per decision, flushed per line.
//!
//! Each line records who asked (task, session, subagent, plugin), for what
//! (tool and a SHA-256 digest of the canonical JSON arguments), which rule
//! matched, the outcome, who decided and how long it waited.
//!
//! Lines are written by one thread per log ([`AuditLog`]): producers queue whole lines
//! and never wait for the disk, a record that could not be queued or written is counted
//! and reported by an `audit_gap` line ([`GapRecord`]), and a record that allows a call
//! is confirmed on disk ([`Written::wait`]) before the call runs.
//!
//! This module must never write tool arguments (they may hold secrets) — only
//! their digest — never rewrite or truncate the file (it is opened in append mode and
//! each record is one `write_all` of a full line by the one writer), and never block
//! a producer on the disk.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// What happened to a call, as written in the audit log and events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditDecision {
    /// Allowed by policy without asking.
    Allow,
    /// Denied by policy (or mode) without asking.
    Deny,
    /// A person approved.
    Approve,
    /// A person declined, or the wait ended without an approval (client gone,
    /// canceled, error).
    Decline,
    /// Nobody decided within the timeout; declined.
    Timeout,
    /// Allowed without asking because of `bypassPermissions`.
    Bypass,
}

impl AuditDecision {
    /// Whether the call may run.
    pub fn allows(self) -> bool {
        matches!(self, AuditDecision::Allow | AuditDecision::Approve | AuditDecision::Bypass)
    }
}

/// One audit line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// RFC 3339 UTC time of the decision.
    pub ts: String,
    /// Approval request id (`apr_...`) when the call was asked.
    pub request_id: Option<String>,
    /// Task the call belongs to.
    pub task_id: Option<String>,
    /// Session (sandbox) the call belongs to.
    pub session_id: Option<String>,
    /// The user whose task made the call.
    #[serde(default)]
    pub user_id: Option<String>,
    /// Subagent that made the call.
    pub subagent: String,
    /// Plugin that made the call.
    pub plugin: Option<String>,
    /// The OCI runtime the call's sandbox session runs under when the subagent was put under
    /// one (`sandbox.runtime_overrides`); absent: `sandbox.runtime` (the engine's default,
    /// runc, when that is unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_runtime: Option<String>,
    /// Tool name.
    pub tool: String,
    /// Hex SHA-256 of the canonical JSON arguments ([`args_digest`]).
    pub args_sha256: String,
    /// The rule that matched, if any.
    pub rule: Option<String>,
    /// The outcome.
    pub decision: AuditDecision,
    /// `policy`, `user:<who>`, `timeout`, `disconnect`, `bypass`, `error`, `mode`.
    pub decided_by: String,
    /// How long the call waited for a decision, in milliseconds.
    pub waited_ms: u64,
    /// Why the policy decided as it did ([`audit_reason`]: the call's own text left out, as
    /// the arguments are). Absent in lines written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Longest [`AuditRecord::reason`] kept, in characters: a reason names a rule, a path and
/// a construct; more is cut (with `…`) so one line stays bounded whatever the call held.
pub const MAX_AUDIT_REASON: usize = 512;

/// A decision's reason as the audit log keeps it: every backtick-quoted part (the command
/// or a part of it, a rule — the rule has its own field) becomes `` `…` ``, since the log
/// holds a digest of the arguments, never the arguments; at most [`MAX_AUDIT_REASON`]
/// characters.
pub fn audit_reason(reason: &str) -> String {
    let mut out = String::new();
    for (i, piece) in reason.split('`').enumerate() {
        out.push_str(if i % 2 == 1 { "`…`" } else { piece });
    }
    if out.chars().count() > MAX_AUDIT_REASON {
        out = out.chars().take(MAX_AUDIT_REASON - 1).chain(std::iter::once('…')).collect();
    }
    out
}

impl AuditRecord {
    /// Current time as RFC 3339 (UTC, millisecond precision).
    pub fn now() -> String {
        humantime::format_rfc3339_millis(SystemTime::now()).to_string()
    }

    /// Milliseconds of a wait, saturating.
    pub fn millis(d: Duration) -> u64 {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
    }
}

/// One egress decision of a sandbox's proxy (`sandbox.egress`), as an audit line: which
/// session asked for which host and port, the outcome, the rule, the bytes moved, and the
/// name (never the value) of a credential the proxy added. Told apart from tool-call lines
/// by `event: "egress"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressRecord {
    /// RFC 3339 UTC time the decision was recorded (a tunnel's when it closed).
    pub ts: String,
    /// Always `egress`.
    pub event: String,
    /// The session whose sandbox asked.
    pub session_id: String,
    /// Its user.
    pub user_id: String,
    /// `connect` (a tunnel) or `http <METHOD>` (a plain-HTTP request).
    pub kind: String,
    /// The host as asked for.
    pub host: String,
    /// The port.
    pub port: u16,
    /// `allow` or `deny`.
    pub decision: AuditDecision,
    /// The rule that decided.
    pub rule: String,
    /// Bytes from the sandbox to the server.
    pub bytes_sent: u64,
    /// Bytes from the server to the sandbox.
    pub bytes_received: u64,
    /// The credential the proxy added (`sandbox.egress.credentials[i]`), if any.
    pub credential: Option<String>,
}

/// A session's egress decisions past its record budget (`sandbox.egress`), counted instead
/// of written one by one: how many were refused and allowed, the bytes the allowed ones
/// moved, and a few of the hosts asked for. Told apart by `event: "egress_suppressed"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressSuppressedRecord {
    /// RFC 3339 UTC time the count was recorded.
    pub ts: String,
    /// Always `egress_suppressed`.
    pub event: String,
    /// The session whose sandbox asked.
    pub session_id: String,
    /// Its user.
    pub user_id: String,
    /// Refused decisions not written one by one.
    pub refused: u64,
    /// Allowed decisions not written one by one.
    pub allowed: u64,
    /// Connections closed at once because the session had its most open.
    pub connections_closed: u64,
    /// Bytes the allowed ones sent.
    pub bytes_sent: u64,
    /// Bytes the allowed ones received.
    pub bytes_received: u64,
    /// The first few distinct `host:port`s asked for.
    pub hosts: Vec<String>,
    /// Seconds from the first decision counted to this record.
    pub seconds: u64,
}

/// Hex SHA-256 of the canonical JSON form of `args` (object keys sorted
/// recursively, no insignificant whitespace), so equal arguments always give
/// the same digest whatever their key order.
pub fn args_digest(args: &Value) -> String {
    let mut canonical = String::new();
    write_canonical(args, &mut canonical);
    hex::encode(Sha256::digest(canonical.as_bytes()))
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// An audit log could not be opened or written.
#[derive(Debug, thiserror::Error)]
#[error("audit log {path}: {source}")]
pub struct AuditError {
    /// The log file.
    pub path: PathBuf,
    /// The I/O error.
    #[source]
    pub source: std::io::Error,
}

/// Whose a record is: the user and session of the call it records (`None` when the call
/// belongs to no task), so a scrubber uses that session's secrets and nobody else's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordOwner<'a> {
    pub user_id: Option<&'a str>,
    pub session_id: Option<&'a str>,
}

/// Rewrites one free-text field of a record before it is written (the host's secret
/// scrubber): names and rules come from plugins, models and grants. Only those fields
/// pass through it, never ids, the decision or who decided, and never the serialised
/// line, so whatever a scrubber replaces, each line stays one JSON object whose outcome
/// and identities are as recorded.
pub type TextFilter = std::sync::Arc<dyn Fn(RecordOwner<'_>, &str) -> String + Send + Sync>;

/// A record the log writes: its owner and its free-text fields.
pub trait Record: Serialize {
    fn owner(&self) -> RecordOwner<'_>;
    /// Each free-text field, for [`TextFilter`].
    fn free_text(&mut self) -> Vec<&mut String>;
}

impl Record for AuditRecord {
    fn owner(&self) -> RecordOwner<'_> {
        RecordOwner { user_id: self.user_id.as_deref(), session_id: self.session_id.as_deref() }
    }

    fn free_text(&mut self) -> Vec<&mut String> {
        let mut fields = vec![&mut self.subagent, &mut self.tool];
        fields.extend(self.plugin.as_mut());
        fields.extend(self.rule.as_mut());
        fields.extend(self.reason.as_mut());
        fields
    }
}

impl Record for EgressRecord {
    fn owner(&self) -> RecordOwner<'_> {
        RecordOwner { user_id: Some(&self.user_id), session_id: Some(&self.session_id) }
    }

    fn free_text(&mut self) -> Vec<&mut String> {
        let mut fields = vec![&mut self.kind, &mut self.host, &mut self.rule];
        fields.extend(self.credential.as_mut());
        fields
    }
}

impl Record for EgressSuppressedRecord {
    fn owner(&self) -> RecordOwner<'_> {
        RecordOwner { user_id: Some(&self.user_id), session_id: Some(&self.session_id) }
    }

    fn free_text(&mut self) -> Vec<&mut String> {
        self.hosts.iter_mut().collect()
    }
}

/// Lines waiting for the writer at most: at a flush per line a disk writes thousands a
/// second, and every producer is bounded upstream (tool calls by their tasks, egress
/// decisions by each session's record budget), so a full queue means a disk that stalls,
/// not a busy host. Past it a record is dropped and counted ([`GapRecord`]), never waited
/// for: no producer ever blocks on the disk.
pub const AUDIT_QUEUE_LINES: usize = 4096;
/// While records were lost (queue full, a write failed), how often the writer tries to
/// write the [`GapRecord`] that says so.
pub const GAP_RETRY: Duration = Duration::from_secs(1);
/// Longest [`AuditLog::sync`] waits for the writer (a disk that hangs must not hang a
/// shutdown or an admin's read for ever).
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(10);

/// The line the writer adds where records are missing: how many were lost since the last
/// line written, and why. Told apart by `event: "audit_gap"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GapRecord {
    /// RFC 3339 UTC time the gap was recorded.
    pub ts: String,
    /// Always `audit_gap`.
    pub event: String,
    /// Records dropped because the writer's queue ([`AUDIT_QUEUE_LINES`]) was full.
    pub dropped_queue_full: u64,
    /// Records whose write failed.
    pub failed_writes: u64,
}

/// What the writer thread is asked to do, in order.
enum Msg {
    /// A whole line; `done` hears how its write went.
    Line { line: String, done: Option<tokio::sync::oneshot::Sender<Result<(), String>>> },
    /// Answered once every message before it is done.
    Sync(std::sync::mpsc::SyncSender<()>),
}

/// The producers' side of the writer: its queue and the count of records it never got.
struct Queue {
    tx: std::sync::mpsc::SyncSender<Msg>,
    dropped: AtomicU64,
}

/// A log's writer, as the process's exit waits for it.
struct OpenLog {
    queue: Weak<Queue>,
    writer: std::thread::JoinHandle<()>,
}

/// Every log's writer that may still have lines to write, so the process can wait for
/// them before it exits ([`sync_open_logs`]); an entry goes once its writer has ended.
static OPEN: Mutex<Vec<OpenLog>> = Mutex::new(Vec::new());

/// Waits (up to [`SYNC_TIMEOUT`] each) until every audit log has written what was queued,
/// open ones and dropped ones whose writer still drains its queue: the binary calls it
/// before it exits, since the writer threads do not outlive the process.
pub fn sync_open_logs() {
    let logs = std::mem::take(&mut *OPEN.lock().unwrap_or_else(|p| p.into_inner()));
    let mut kept = Vec::new();
    for log in logs {
        match log.queue.upgrade() {
            Some(q) => {
                let _ = sync_queue(&q);
                kept.push(log);
            }
            None => {
                // Dropped: its writer ends once the queue is drained.
                let deadline = Instant::now() + SYNC_TIMEOUT;
                while !log.writer.is_finished() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }
    OPEN.lock().unwrap_or_else(|p| p.into_inner()).extend(kept);
}

/// Sends a [`Msg::Sync`] through `q` and waits for its answer, within [`SYNC_TIMEOUT`].
fn sync_queue(q: &Queue) -> Result<(), String> {
    let deadline = Instant::now() + SYNC_TIMEOUT;
    let (ack, answered) = std::sync::mpsc::sync_channel(1);
    let mut msg = Msg::Sync(ack);
    loop {
        match q.tx.try_send(msg) {
            Ok(()) => break,
            Err(std::sync::mpsc::TrySendError::Full(m)) if Instant::now() < deadline => {
                msg = m;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(std::sync::mpsc::TrySendError::Full(_)) => return Err("the writer's queue stayed full".into()),
            Err(std::sync::mpsc::TrySendError::Disconnected(_)) => return Err("the writer has stopped".into()),
        }
    }
    answered
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .map_err(|_| format!("the writer did not catch up within {}s", SYNC_TIMEOUT.as_secs()))
}

/// A queued audit record: [`Written::wait`] says whether it reached the file.
#[must_use = "a record that allows a call is confirmed before the call runs"]
pub struct Written {
    path: PathBuf,
    done: tokio::sync::oneshot::Receiver<Result<(), String>>,
}

impl Written {
    /// Waits (without blocking a thread) until the writer wrote the line and flushed it,
    /// or failed to.
    pub async fn wait(self) -> Result<(), AuditError> {
        let failed = |m: String| AuditError { path: self.path.clone(), source: std::io::Error::other(m) };
        match self.done.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(m)) => Err(failed(m)),
            Err(_) => Err(failed("the writer stopped before writing the record".into())),
        }
    }
}

/// The audit log file, written by a thread of its own: producers (the gate on the async
/// runtime, the egress proxy's tasks) only queue whole lines ([`AUDIT_QUEUE_LINES`]) and
/// never touch the disk, so a slow or full disk stalls no runtime worker. Lines are
/// written in the order they were queued, each with one `write_all` and a flush; a record
/// that could not be queued or written is counted, and the next line the writer manages
/// is a [`GapRecord`] saying how many are missing. Queued lines are written after the log
/// is dropped too; [`AuditLog::sync`] (and [`sync_open_logs`] at exit) waits for them.
pub struct AuditLog {
    path: PathBuf,
    queue: Arc<Queue>,
    filter: Option<TextFilter>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog").field("path", &self.path).finish_non_exhaustive()
    }
}

impl AuditLog {
    /// Open (creating if needed) `path` for appending, and start its writer thread.
    pub fn open(path: impl AsRef<Path>) -> Result<AuditLog, AuditError> {
        let path = path.as_ref().to_path_buf();
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|source| AuditError { path: path.clone(), source })?;
        let (tx, rx) = std::sync::mpsc::sync_channel(AUDIT_QUEUE_LINES);
        let queue = Arc::new(Queue { tx, dropped: AtomicU64::new(0) });
        let writer = Writer { file, path: path.clone(), queue: Arc::downgrade(&queue), failed: 0, failing: false };
        let writer = std::thread::Builder::new()
            .name("warden-audit".into())
            .spawn(move || writer.run(rx))
            .map_err(|source| AuditError { path: path.clone(), source })?;
        let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|log| !log.writer.is_finished());
        open.push(OpenLog { queue: Arc::downgrade(&queue), writer });
        Ok(AuditLog { path, queue, filter: None })
    }

    /// Passes every free-text field through `filter` before a record is written (names
    /// and rules come from plugins and models, so the host scrubs them of secrets).
    pub fn with_filter(mut self, filter: TextFilter) -> Self {
        self.filter = Some(filter);
        self
    }

    /// The log file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Queues one decision as one line; [`Written::wait`] says when it is on disk. Never
    /// blocks: a full queue is an error at once (the record is counted as dropped).
    pub fn append(&self, record: &AuditRecord) -> Result<Written, AuditError> {
        let (done, heard) = tokio::sync::oneshot::channel();
        self.queue_line(record.clone(), Some(done))?;
        Ok(Written { path: self.path.clone(), done: heard })
    }

    /// Queues one egress decision (or a session's count of decisions not recorded one by
    /// one) as one line, without waiting for it. Never blocks.
    pub fn append_egress(&self, record: &EgressRecord) -> Result<(), AuditError> {
        self.queue_line(record.clone(), None)
    }

    /// Queues a session's count of egress decisions past its record budget as one line,
    /// without waiting for it. Never blocks.
    pub fn append_egress_suppressed(&self, record: &EgressSuppressedRecord) -> Result<(), AuditError> {
        self.queue_line(record.clone(), None)
    }

    /// Blocks until every line queued before the call is written (at most
    /// [`SYNC_TIMEOUT`]): for readers of the file (the admin's audit view, tests) and
    /// shutdown. Never call it on an async worker.
    pub fn sync(&self) -> Result<(), AuditError> {
        sync_queue(&self.queue).map_err(|m| AuditError { path: self.path.clone(), source: std::io::Error::other(m) })
    }

    fn queue_line(
        &self,
        mut record: impl Record,
        done: Option<tokio::sync::oneshot::Sender<Result<(), String>>>,
    ) -> Result<(), AuditError> {
        if let Some(f) = &self.filter {
            let (user, session) = {
                let o = record.owner();
                (o.user_id.map(str::to_owned), o.session_id.map(str::to_owned))
            };
            let owner = RecordOwner { user_id: user.as_deref(), session_id: session.as_deref() };
            for field in record.free_text() {
                *field = f(owner, field);
            }
        }
        let mut line = serde_json::to_string(&record)
            .map_err(|e| AuditError { path: self.path.clone(), source: std::io::Error::other(e) })?;
        line.push('\n');
        match self.queue.tx.try_send(Msg::Line { line, done }) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.queue.dropped.fetch_add(1, Ordering::Relaxed);
                let why = match e {
                    std::sync::mpsc::TrySendError::Full(_) => {
                        format!(
                            "the writer's queue of {AUDIT_QUEUE_LINES} lines is full (AUDIT_QUEUE_LINES); record dropped"
                        )
                    }
                    std::sync::mpsc::TrySendError::Disconnected(_) => "the writer has stopped; record dropped".into(),
                };
                Err(AuditError { path: self.path.clone(), source: std::io::Error::other(why) })
            }
        }
    }
}

/// The writer thread's side: the file, and what it lost since its last good line.
struct Writer {
    file: File,
    path: PathBuf,
    queue: Weak<Queue>,
    /// Writes that failed since the last line written.
    failed: u64,
    /// Whether the last write failed (its error is logged once, not per line).
    failing: bool,
}

impl Writer {
    fn run(mut self, rx: std::sync::mpsc::Receiver<Msg>) {
        loop {
            let msg = if self.lost() > 0 {
                match rx.recv_timeout(GAP_RETRY) {
                    Ok(m) => Some(m),
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => None,
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                }
            } else {
                match rx.recv() {
                    Ok(m) => Some(m),
                    Err(_) => break,
                }
            };
            match msg {
                Some(Msg::Line { line, done }) => {
                    self.write_gap();
                    let written = self.write(line.as_bytes());
                    if let Some(done) = done {
                        let _ = done.send(written);
                    }
                }
                Some(Msg::Sync(ack)) => {
                    self.write_gap();
                    let _ = ack.send(());
                }
                None => self.write_gap(),
            }
        }
        self.write_gap();
    }

    /// Records lost and not yet reported in a gap line.
    fn lost(&self) -> u64 {
        self.failed + self.queue.upgrade().map_or(0, |q| q.dropped.load(Ordering::Relaxed))
    }

    /// Writes the [`GapRecord`] of what was lost, if anything was.
    fn write_gap(&mut self) {
        let dropped = self.queue.upgrade().map_or(0, |q| q.dropped.load(Ordering::Relaxed));
        if dropped + self.failed == 0 {
            return;
        }
        let gap = GapRecord {
            ts: AuditRecord::now(),
            event: "audit_gap".into(),
            dropped_queue_full: dropped,
            failed_writes: self.failed,
        };
        let Ok(mut line) = serde_json::to_string(&gap) else { return };
        line.push('\n');
        let failed = self.failed;
        if self.write(line.as_bytes()).is_ok() {
            self.failed = 0;
            if let Some(q) = self.queue.upgrade() {
                q.dropped.fetch_sub(dropped, Ordering::Relaxed);
            }
            tracing::warn!(
                path = %self.path.display(), dropped_queue_full = dropped, failed_writes = failed,
                "audit records were lost; an audit_gap line says how many"
            );
        } else {
            // The gap line itself is not a record: it is retried, not counted.
            self.failed = failed;
        }
    }

    /// One line, written whole and flushed; a failure is counted and logged once.
    fn write(&mut self, line: &[u8]) -> Result<(), String> {
        match self.file.write_all(line).and_then(|()| self.file.flush()) {
            Ok(()) => {
                self.failing = false;
                Ok(())
            }
            Err(e) => {
                self.failed += 1;
                if !self.failing {
                    tracing::error!(path = %self.path.display(), error = %e, "audit log write failed");
                }
                self.failing = true;
                Err(e.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_is_key_order_independent() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"y":[1,"x"],"x":null}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"x":null,"y":[1,"x"]},"b":1}"#).unwrap();
        assert_eq!(args_digest(&a), args_digest(&b));
        assert_ne!(args_digest(&a), args_digest(&serde_json::json!({"b": 2})));
        assert_eq!(args_digest(&a).len(), 64);
    }
}
