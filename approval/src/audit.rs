//! Append-only JSONL audit log: one line per decision, flushed per line.
//!
//! Each line records who asked (task, session, subagent, plugin), for what
//! (tool and a SHA-256 digest of the canonical JSON arguments), which rule
//! matched, the outcome, who decided and how long it waited.
//!
//! This module must never write tool arguments (they may hold secrets) — only
//! their digest — and never rewrite or truncate the file: it is opened in
//! append mode and each record is one `write_all` of a full line under a lock.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

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

/// The audit log file.
pub struct AuditLog {
    path: PathBuf,
    file: Mutex<File>,
    filter: Option<TextFilter>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog").field("path", &self.path).finish_non_exhaustive()
    }
}

impl AuditLog {
    /// Open (creating if needed) `path` for appending.
    pub fn open(path: impl AsRef<Path>) -> Result<AuditLog, AuditError> {
        let path = path.as_ref().to_path_buf();
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|source| AuditError { path: path.clone(), source })?;
        Ok(AuditLog { path, file: Mutex::new(file), filter: None })
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

    /// Append one record as one line and flush it.
    pub fn append(&self, record: &AuditRecord) -> Result<(), AuditError> {
        self.append_line(record.clone())
    }

    /// Append one egress decision as one line and flush it.
    pub fn append_egress(&self, record: &EgressRecord) -> Result<(), AuditError> {
        self.append_line(record.clone())
    }

    fn append_line(&self, mut record: impl Record) -> Result<(), AuditError> {
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
        // A poisoned lock only means another writer panicked mid-call; the file
        // handle itself is still fine to append to.
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.write_all(line.as_bytes())
            .and_then(|()| file.flush())
            .map_err(|source| AuditError { path: self.path.clone(), source })
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
