//! The embedded task store: task records, their events and (optionally) plugin state,
//! in one file at `store.path`.
//!
//! Why redb: it is pure Rust (no C toolchain, no bundled SQLite to compile on every
//! clean build), ACID with copy-on-write pages so a `kill -9` mid-write leaves the last
//! committed transaction intact, and its ordered tuple keys give exactly the two access
//! paths the engine needs — a task by id, and a task's events in sequence order from
//! any `Last-Event-ID`. We need no ad-hoc queries, which is what SQLite would add.
//!
//! Writes go through one writer thread that commits whatever is queued in one
//! transaction (group commit): a burst of events from 200 concurrent tasks costs a
//! handful of fsyncs, not hundreds. Callers that need durability before answering
//! (a finished task) wait for the commit with [`Store::flush`].
//!
//! What is stored is what the engine hands over: it redacts `tool_context` secrets
//! before anything reaches this module. Plugin state, which the engine does not see, is
//! scrubbed in [`Store::write`] of every secret the host knows.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{Deserialize, Serialize};

pub use crate::task_state::{FinishReason, TaskState};
use tokio::sync::{mpsc, oneshot};

const TASKS: TableDefinition<&str, &[u8]> = TableDefinition::new("tasks");
const EVENTS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("events");
const STATE: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("plugin_state");

/// Largest number of queued writes committed in one transaction.
const MAX_BATCH: usize = 4096;

/// Default retention of finished tasks: a week covers a parent agent coming back to a
/// background result after a weekend, without the file growing for ever.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Why the store failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("task store {path}: {message}")]
pub struct StoreError {
    pub path: PathBuf,
    pub message: String,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// One task as stored and as `GET /v1/tasks/{id}` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    pub task_id: String,
    pub status: TaskState,
    pub subagent_type: String,
    pub description: String,
    pub session_id: String,
    pub user_id: String,
    /// The API principal that submitted the task (`None` for tasks from before
    /// principals, and for tasks not submitted over the API).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub principal: Option<String>,
    #[serde(default)]
    pub background: bool,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub output: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
    /// Why the task ended.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub finish_reason: Option<FinishReason>,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub finished_at_ms: Option<u64>,
    /// The plugin build that ran the task: id, version and SHA-256 of its file.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub plugin: Option<crate::plugin::PluginRef>,
}

impl TaskRecord {
    /// Whether the task has ended (it will not change again).
    pub fn is_finished(&self) -> bool {
        self.finished_at_ms.is_some()
    }
}

/// One queued write.
// Writes travel boxed (`Msg::Write(Box<Write>)`), so the largest variant's size costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Write {
    Task(TaskRecord),
    Event { task_id: String, seq: u64, event: serde_json::Value },
    StateSet { plugin: String, key: String, value: Vec<u8> },
    StateDelete { plugin: String, key: String },
}

enum Msg {
    Write(Box<Write>),
    Flush(oneshot::Sender<Result<(), String>>),
}

/// The store. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    db: Arc<Database>,
    path: PathBuf,
    tx: mpsc::UnboundedSender<Msg>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

impl Store {
    /// Opens (or creates) the store at `path`, creating parent directories. Fails if
    /// another process holds it.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let err = |m: String| StoreError { path: path.to_owned(), message: m };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| err(format!("cannot create {}: {e}", dir.display())))?;
        }
        let db = Database::create(path).map_err(|e| err(e.to_string()))?;
        Self::with_database(db, path)
    }

    /// A store kept in memory only, gone with the process: for one-shot commands
    /// (`warden run`, `warden demo`) that run their task through the engine like the server
    /// does but have nothing to keep.
    pub fn in_memory() -> Result<Store, StoreError> {
        let label = Path::new("(in memory)");
        let db = Database::builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .map_err(|e| StoreError { path: label.to_owned(), message: e.to_string() })?;
        Self::with_database(db, label)
    }

    fn with_database(db: Database, path: &Path) -> Result<Store, StoreError> {
        let err = |m: String| StoreError { path: path.to_owned(), message: m };
        {
            let w = db.begin_write().map_err(|e| err(e.to_string()))?;
            w.open_table(TASKS).map_err(|e| err(e.to_string()))?;
            w.open_table(EVENTS).map_err(|e| err(e.to_string()))?;
            w.open_table(STATE).map_err(|e| err(e.to_string()))?;
            w.commit().map_err(|e| err(e.to_string()))?;
        }
        let db = Arc::new(db);
        let (tx, rx) = mpsc::unbounded_channel();
        {
            let db = db.clone();
            let path = path.to_owned();
            std::thread::Builder::new()
                .name("warden-store".into())
                .spawn(move || writer(db, path, rx))
                .map_err(|e| err(format!("cannot start the writer thread: {e}")))?;
        }
        Ok(Store { db, path: path.to_owned(), tx })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, e: impl std::fmt::Display) -> StoreError {
        StoreError { path: self.path.clone(), message: e.to_string() }
    }

    /// Queues a write; it is committed with the next batch.
    pub fn write(&self, w: Write) {
        // The engine scrubs what it hands over with the task's session secrets; plugin
        // state (a transcript quoting a prompt) is opaque to it, so it is scrubbed here of
        // every secret the host knows, key and value, before it reaches the file.
        let all = crate::redact::registry().all();
        let w = match w {
            Write::StateSet { plugin, key, value } => Write::StateSet {
                plugin,
                key: all.scrub(&key).into_owned(),
                value: all.scrub_bytes(&value).into_owned(),
            },
            Write::StateDelete { plugin, key } => Write::StateDelete { plugin, key: all.scrub(&key).into_owned() },
            other => other,
        };
        if self.tx.send(Msg::Write(Box::new(w))).is_err() {
            tracing::error!(store = %self.path.display(), "task store writer is gone; write dropped");
        }
    }

    /// Waits until every write queued before this call is committed.
    pub async fn flush(&self) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Msg::Flush(tx)).map_err(|_| self.err("writer thread is gone"))?;
        rx.await.map_err(|_| self.err("writer thread is gone"))?.map_err(|e| self.err(e))
    }

    pub fn task(&self, id: &str) -> Result<Option<TaskRecord>, StoreError> {
        let r = self.db.begin_read().map_err(|e| self.err(e))?;
        let t = r.open_table(TASKS).map_err(|e| self.err(e))?;
        match t.get(id).map_err(|e| self.err(e))? {
            None => Ok(None),
            Some(v) => {
                serde_json::from_slice(v.value()).map(Some).map_err(|e| self.err(format!("corrupt task {id}: {e}")))
            }
        }
    }

    /// Events of `task_id` with a sequence number greater than `after`, in order.
    pub fn events_after(&self, task_id: &str, after: u64) -> Result<Vec<(u64, serde_json::Value)>, StoreError> {
        let r = self.db.begin_read().map_err(|e| self.err(e))?;
        let t = r.open_table(EVENTS).map_err(|e| self.err(e))?;
        let mut out = vec![];
        let Some(start) = after.checked_add(1) else { return Ok(out) };
        for item in t.range((task_id, start)..=(task_id, u64::MAX)).map_err(|e| self.err(e))? {
            let (k, v) = item.map_err(|e| self.err(e))?;
            let ev = serde_json::from_slice(v.value()).map_err(|e| self.err(format!("corrupt event: {e}")))?;
            out.push((k.value().1, ev));
        }
        Ok(out)
    }

    /// Every task record (recovery and retention scans; bounded by retention).
    pub fn tasks(&self) -> Result<Vec<TaskRecord>, StoreError> {
        let r = self.db.begin_read().map_err(|e| self.err(e))?;
        let t = r.open_table(TASKS).map_err(|e| self.err(e))?;
        let mut out = vec![];
        for item in t.iter().map_err(|e| self.err(e))? {
            let (_, v) = item.map_err(|e| self.err(e))?;
            if let Ok(rec) = serde_json::from_slice(v.value()) {
                out.push(rec);
            }
        }
        Ok(out)
    }

    /// Number of stored events (metrics, tests).
    pub fn event_count(&self) -> Result<u64, StoreError> {
        let r = self.db.begin_read().map_err(|e| self.err(e))?;
        let t = r.open_table(EVENTS).map_err(|e| self.err(e))?;
        t.len().map_err(|e| self.err(e))
    }

    /// Marks every task that was not finished as `failed` / "host restarted" (the
    /// previous host died with it running), with a final `error` and `finish` event.
    /// Returns their ids. Call before accepting new tasks.
    pub async fn recover_interrupted(&self) -> Result<Vec<String>, StoreError> {
        let now = now_ms();
        let mut ids = vec![];
        for mut rec in self.tasks()? {
            if rec.is_finished() {
                continue;
            }
            let last = self.events_after(&rec.task_id, 0)?.last().map(|(s, _)| *s).unwrap_or(0);
            rec.status = TaskState::Failed;
            rec.error = Some(HOST_RESTARTED.into());
            rec.finish_reason = Some(FinishReason::HostRestarted);
            rec.updated_at_ms = now;
            rec.finished_at_ms = Some(now);
            self.write(Write::Event {
                task_id: rec.task_id.clone(),
                seq: last + 1,
                event: serde_json::json!({ "type": "error", "message": HOST_RESTARTED }),
            });
            self.write(Write::Event {
                task_id: rec.task_id.clone(),
                seq: last + 2,
                event: serde_json::json!({ "type": "finish", "status": "failed", "reason": "host_restarted", "error": HOST_RESTARTED }),
            });
            ids.push(rec.task_id.clone());
            self.write(Write::Task(rec));
        }
        self.flush().await?;
        Ok(ids)
    }

    /// Deletes finished tasks (and their events) that finished more than `retention` ago.
    pub fn purge(&self, retention: Duration) -> Result<usize, StoreError> {
        let cutoff = now_ms().saturating_sub(retention.as_millis() as u64);
        let old: Vec<String> = self
            .tasks()?
            .into_iter()
            .filter(|r| r.finished_at_ms.is_some_and(|f| f < cutoff))
            .map(|r| r.task_id)
            .collect();
        if old.is_empty() {
            return Ok(0);
        }
        let w = self.db.begin_write().map_err(|e| self.err(e))?;
        {
            let mut tasks = w.open_table(TASKS).map_err(|e| self.err(e))?;
            let mut events = w.open_table(EVENTS).map_err(|e| self.err(e))?;
            for id in &old {
                tasks.remove(id.as_str()).map_err(|e| self.err(e))?;
                events
                    .retain_in((id.as_str(), 0u64)..=(id.as_str(), u64::MAX), |_, _| false)
                    .map_err(|e| self.err(e))?;
            }
        }
        w.commit().map_err(|e| self.err(e))?;
        Ok(old.len())
    }

    /// Plugin state value (the `state` capability when backed by this store).
    pub fn state_get(&self, plugin: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let r = self.db.begin_read().map_err(|e| self.err(e))?;
        let t = r.open_table(STATE).map_err(|e| self.err(e))?;
        Ok(t.get((plugin, key)).map_err(|e| self.err(e))?.map(|v| v.value().to_vec()))
    }

    /// Every plugin state entry: (plugin, key, value), for loading at start.
    pub fn state_all(&self) -> Result<Vec<(String, String, Vec<u8>)>, StoreError> {
        let r = self.db.begin_read().map_err(|e| self.err(e))?;
        let t = r.open_table(STATE).map_err(|e| self.err(e))?;
        let mut out = vec![];
        for entry in t.iter().map_err(|e| self.err(e))? {
            let (k, v) = entry.map_err(|e| self.err(e))?;
            let (plugin, key) = k.value();
            out.push((plugin.to_owned(), key.to_owned(), v.value().to_vec()));
        }
        Ok(out)
    }
}

/// The error text of a task the host was running when it stopped.
pub const HOST_RESTARTED: &str = "host restarted";

fn writer(db: Arc<Database>, path: PathBuf, mut rx: mpsc::UnboundedReceiver<Msg>) {
    while let Some(first) = rx.blocking_recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(m) => batch.push(m),
                Err(_) => break,
            }
        }
        let result = commit(&db, &batch).map_err(|e| e.to_string());
        if let Err(e) = &result {
            tracing::error!(store = %path.display(), error = %e, writes = batch.len(), "task store commit failed");
        }
        for m in batch {
            if let Msg::Flush(ack) = m {
                let _ = ack.send(result.clone());
            }
        }
    }
}

fn commit(db: &Database, batch: &[Msg]) -> Result<(), Box<redb::Error>> {
    if !batch.iter().any(|m| matches!(m, Msg::Write(_))) {
        return Ok(());
    }
    let w = db.begin_write().map_err(redb::Error::from)?;
    {
        let mut tasks = w.open_table(TASKS).map_err(redb::Error::from)?;
        let mut events = w.open_table(EVENTS).map_err(redb::Error::from)?;
        let mut state = w.open_table(STATE).map_err(redb::Error::from)?;
        for m in batch {
            let Msg::Write(write) = m else { continue };
            match write.as_ref() {
                Write::Task(rec) => {
                    let bytes = serde_json::to_vec(rec).expect("a task record always serialises");
                    tasks.insert(rec.task_id.as_str(), bytes.as_slice()).map_err(redb::Error::from)?;
                }
                Write::Event { task_id, seq, event } => {
                    let bytes = serde_json::to_vec(event).expect("JSON always serialises");
                    events.insert((task_id.as_str(), *seq), bytes.as_slice()).map_err(redb::Error::from)?;
                }
                Write::StateSet { plugin, key, value } => {
                    state.insert((plugin.as_str(), key.as_str()), value.as_slice()).map_err(redb::Error::from)?;
                }
                Write::StateDelete { plugin, key } => {
                    state.remove((plugin.as_str(), key.as_str())).map_err(redb::Error::from)?;
                }
            }
        }
    }
    w.commit().map_err(redb::Error::from)?;
    Ok(())
}
