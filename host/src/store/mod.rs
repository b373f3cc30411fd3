//! The task store: task records, their events and plugin state, behind one facade
//! ([`Store`]) over two backends with the same behaviour:
//!
//! - [`redb`] (the embedded default): one file at `store.path`;
//! - [`postgres`]: a PostgreSQL database at `store.url`, for deployments that keep their
//!   state in a database server.
//!
//! This module owns what both backends must do alike, so no path can bypass it:
//!
//! - **Group commit.** [`Store::write`] queues; one writer per store (a thread for redb, a
//!   task for PostgreSQL) commits whatever is queued in one transaction, so a burst of
//!   events from 200 concurrent tasks costs a handful of commits, not hundreds. Callers
//!   that need durability before answering (a finished task) wait with [`Store::flush`].
//! - **Secret scrubbing of plugin state** in [`Store::write`]: what the engine hands over
//!   (records, events) it has already redacted of `tool_context` secrets; plugin state is
//!   opaque to it, so it is scrubbed here of every secret the host knows.
//! - **Recovery and retention**: [`Store::recover_interrupted`], [`Store::purge`] (finished
//!   tasks) and [`Store::state_expire`] (plugin state not written within the retention).
//! - **Naming the backend in errors** ([`StoreError`]) without the password of a URL.
//!
//! It never interprets events or decides a task's outcome (the engine does), never logs
//! a value it stores, and hands no caller a backend to write to directly.

mod egress_board;
mod postgres;
mod queue;
mod redb;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

pub use crate::task_state::{FinishReason, TaskState};
pub use egress_board::StoreEgressBoard;
pub use queue::{Claimed, ControlMessages, Enqueued, OrphanedApproval, QueueLimits, RemoteApproval};

/// Largest number of queued writes committed in one transaction.
const MAX_BATCH: usize = 4096;

/// Default retention of finished tasks: a week covers a parent agent coming back to a
/// background result after a weekend, without the store growing for ever.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Why the store failed. `location` names the backend: the file, or the database URL with
/// its password replaced by `***`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("task store {location}: {message}")]
pub struct StoreError {
    pub location: String,
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
    /// The replica that ran (or runs) the task, when warden runs as several replicas on
    /// one database (`warden serve --replica-id`); absent for a task no replica claimed.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub replica: Option<String>,
    /// The task whose subagent started this one with the `Agent` tool (nested subagents);
    /// absent for a task the parent agent submitted.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub parent_task_id: Option<String>,
    /// Where the task ran when it ran in a fork of its session (a definition's or the
    /// task's `isolation`), and once it ended, what it changed there.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub isolation: Option<crate::isolation::Isolated>,
}

impl TaskRecord {
    /// A new task's first record (`submitted`, as of `now`) for `call`.
    pub fn submitted(
        task_id: String,
        call: &crate::plugin::TaskCall,
        session_id: String,
        user_id: String,
        principal: Option<String>,
        now: u64,
    ) -> TaskRecord {
        TaskRecord {
            task_id,
            status: TaskState::Submitted,
            subagent_type: call.subagent_type.clone(),
            description: call.description.clone(),
            session_id,
            user_id,
            principal,
            background: call.run_in_background,
            output: None,
            error: None,
            finish_reason: None,
            created_at_ms: now,
            updated_at_ms: now,
            finished_at_ms: None,
            plugin: None,
            replica: None,
            parent_task_id: None,
            isolation: None,
        }
    }

    /// Whether the task has ended (it will not change again).
    pub fn is_finished(&self) -> bool {
        self.finished_at_ms.is_some()
    }
}

/// Most tasks one page of a task listing holds ([`Store::list_tasks`]).
pub const MAX_TASK_PAGE: usize = 500;

/// Where a page of a task listing ended: the `(created_at_ms, task_id)` of its last task.
/// Listings are newest first, so the next page holds the tasks strictly before it in that
/// order — a keyset, not an offset: a page costs the same however deep it is, and tasks
/// submitted meanwhile neither repeat nor push others off a page.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct TaskCursor {
    pub created_at_ms: u64,
    pub task_id: String,
}

impl TaskCursor {
    /// Before every task (the first page). `created_at_ms` is milliseconds since 1970:
    /// none is near the maximum.
    pub const START: TaskCursor = TaskCursor { created_at_ms: i64::MAX as u64, task_id: String::new() };

    /// The cursor as an opaque token (`<created>.<task id>`).
    pub fn token(&self) -> String {
        format!("{}.{}", self.created_at_ms, self.task_id)
    }

    /// A token read back; `None` for text no listing gave out.
    pub fn from_token(token: &str) -> Option<TaskCursor> {
        let (created, id) = token.split_once('.')?;
        let created_at_ms: u64 = created.parse().ok()?;
        (created_at_ms <= i64::MAX as u64 && !id.is_empty() && id.len() <= MAX_TASK_ID_BYTES)
            .then(|| TaskCursor { created_at_ms, task_id: id.to_owned() })
    }

    /// The cursor just after `rec` in a listing (the next page starts after it).
    pub fn of(rec: &TaskRecord) -> TaskCursor {
        TaskCursor { created_at_ms: rec.created_at_ms, task_id: rec.task_id.clone() }
    }
}

/// Longest task id a cursor token may carry (ids warden makes are far shorter).
const MAX_TASK_ID_BYTES: usize = 256;

/// One page of a task listing: whose tasks, where the previous page ended, how many.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskQuery {
    /// Only this user's tasks; `None` for every user's (an admin's listing). A tenant's
    /// listing always names its user: the store never hands it another user's task.
    pub user_id: Option<String>,
    /// The previous page's cursor; [`TaskCursor::START`] for the first page.
    pub before: TaskCursor,
    /// At most this many tasks (capped at [`MAX_TASK_PAGE`]).
    pub limit: usize,
}

/// A page of tasks, newest first, and the cursor of the next page when there may be one.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskPage {
    pub tasks: Vec<TaskRecord>,
    pub next: Option<TaskCursor>,
}

impl TaskPage {
    /// The page of `tasks` (read newest first, one more than `limit` when more follow).
    fn of(mut tasks: Vec<TaskRecord>, limit: usize) -> TaskPage {
        let more = tasks.len() > limit;
        tasks.truncate(limit);
        let next = if more { tasks.last().map(TaskCursor::of) } else { None };
        TaskPage { tasks, next }
    }
}

/// One queued write.
// Writes travel boxed (`Msg::Write(Box<Write>)`), so the largest variant's size costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Write {
    Task(TaskRecord),
    Event {
        task_id: String,
        seq: u64,
        event: serde_json::Value,
    },
    /// Entry `seq` of a durable task's import journal ([`crate::journal`]); a later write
    /// of the same `seq` replaces it (a call `started`, then `done`).
    Journal {
        task_id: String,
        seq: u64,
        entry: serde_json::Value,
    },
    /// Plugin state `key` = `value` in `namespace` (a
    /// [`crate::plugin_state::StateNamespace::store_key`]), written at `written_at_ms`
    /// (ms since the Unix epoch; expiry counts from it, [`Store::state_expire`]).
    StateSet {
        namespace: String,
        key: String,
        value: Vec<u8>,
        written_at_ms: u64,
    },
    StateDelete {
        namespace: String,
        key: String,
    },
    /// Replicas only (a shared store; the embedded one ignores it): `owner` holds the task
    /// until `lease_until_ms` — it runs it, or keeps it because its secrets live only in
    /// that replica's memory. Written with the task's first record, so a task is never
    /// unfinished and unheld.
    Claim {
        task_id: String,
        owner: String,
        lease_until_ms: u64,
    },
    /// Replicas only: the task left the queue. Written with its finished record.
    Release {
        task_id: String,
    },
    /// Replicas only: an approval request waiting in `owner`'s gate, for every replica to
    /// list and decide (`pending` is the gate's [`warden_approval::PendingApproval`]).
    ApprovalPublished {
        request_id: String,
        task_id: Option<String>,
        owner: String,
        pending: serde_json::Value,
    },
    /// Replicas only: the request was resolved (decided, expired or its task ended).
    ApprovalWithdrawn {
        request_id: String,
    },
}

/// What a writer receives: a write, or a flush to acknowledge once everything queued
/// before it is committed (with the commit's error, if it failed).
enum Msg {
    Write(Box<Write>),
    Flush(oneshot::Sender<Result<(), String>>),
}

/// The writes of a batch, in queue order.
fn writes(batch: &[Msg]) -> impl Iterator<Item = &Write> {
    batch.iter().filter_map(|m| match m {
        Msg::Write(w) => Some(w.as_ref()),
        Msg::Flush(_) => None,
    })
}

/// `first` and whatever else is queued right now, up to [`MAX_BATCH`]: one transaction.
fn take_batch(first: Msg, rx: &mut mpsc::UnboundedReceiver<Msg>) -> Vec<Msg> {
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(m) => batch.push(m),
            Err(_) => break,
        }
    }
    batch
}

/// Reports a batch's commit: a failure is logged (without the values), every flush in it
/// is answered. A failed batch with no flush in it is remembered in `unreported` and
/// answered to the next flush: a flush waits for every write queued before it, so a write
/// that failed in an earlier batch fails it too (regression: the flush after a failed
/// batch said the failed write was committed).
fn settle(batch: Vec<Msg>, result: Result<(), String>, location: &str, unreported: &mut Option<String>) {
    if let Err(e) = &result {
        tracing::error!(store = %location, error = %e, writes = batch.len(), "task store commit failed");
    }
    let has_flush = batch.iter().any(|m| matches!(m, Msg::Flush(_)));
    let result = match (result, unreported.take()) {
        (Err(e), _) | (Ok(()), Some(e)) if has_flush => Err(e),
        (Err(e), _) => {
            *unreported = Some(e);
            return;
        }
        (Ok(()), pending) => {
            *unreported = pending;
            Ok(())
        }
    };
    for m in batch {
        if let Msg::Flush(ack) = m {
            let _ = ack.send(result.clone());
        }
    }
}

/// The backend behind a [`Store`]. Every backend keeps the same semantics (the store's
/// test suite runs against each); dispatch is by match, so adding a backend is a
/// compile error at every operation until it is handled.
enum Backend {
    Redb(redb::RedbBackend),
    // Boxed: its connections and settings dwarf the embedded backend's handle.
    Postgres(Box<postgres::PgBackend>),
}

struct Inner {
    backend: Backend,
    /// The backend's name in errors and logs: a path, or a URL without its password.
    location: String,
    /// The writer's queue; the writer ends (and lets go of the file or connection) when
    /// the last clone of the store is dropped.
    tx: mpsc::UnboundedSender<Msg>,
}

/// The store. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("location", &self.inner.location).finish()
    }
}

impl Store {
    /// Opens (or creates) the embedded store at `path`, creating parent directories. Fails
    /// if another process holds it.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let location = path.display().to_string();
        let (tx, rx) = mpsc::unbounded_channel();
        let backend = redb::RedbBackend::open(path, rx, location.clone())
            .map_err(|message| StoreError { location: location.clone(), message })?;
        Ok(Store { inner: Arc::new(Inner { backend: Backend::Redb(backend), location, tx }) })
    }

    /// A store kept in memory only, gone with the process: for one-shot commands
    /// (`warden run`, `warden demo`) that run their task through the engine like the server
    /// does but have nothing to keep.
    pub fn in_memory() -> Result<Store, StoreError> {
        let location = "(in memory)".to_owned();
        let (tx, rx) = mpsc::unbounded_channel();
        let backend = redb::RedbBackend::in_memory(rx, location.clone())
            .map_err(|message| StoreError { location: location.clone(), message })?;
        Ok(Store { inner: Arc::new(Inner { backend: Backend::Redb(backend), location, tx }) })
    }

    /// Connects to the PostgreSQL database at `url` (`postgres://user:password@host:port/db`)
    /// and applies the migrations it lacks. Needs a Tokio runtime.
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        let location = redact_url(url);
        let (tx, rx) = mpsc::unbounded_channel();
        let backend = postgres::PgBackend::open(url, rx, location.clone())
            .await
            .map_err(|message| StoreError { location: location.clone(), message })?;
        Ok(Store { inner: Arc::new(Inner { backend: Backend::Postgres(Box::new(backend)), location, tx }) })
    }

    /// The backend's name: a path, or a URL without its password.
    pub fn location(&self) -> &str {
        &self.inner.location
    }

    fn err(&self, message: impl std::fmt::Display) -> StoreError {
        StoreError { location: self.inner.location.clone(), message: message.to_string() }
    }

    /// Queues a write; it is committed with the next batch.
    ///
    /// What is handed over is already scrubbed by whoever knows whose it is: the engine
    /// with the task's session secrets, plugin state at the `state` import with the
    /// calling task's ([`crate::runtime`]'s `CallScope::redactor`).
    pub fn write(&self, w: Write) {
        if self.inner.tx.send(Msg::Write(Box::new(w))).is_err() {
            tracing::error!(store = %self.inner.location, "task store writer is gone; write dropped");
        }
    }

    /// Waits until every write queued before this call is committed.
    pub async fn flush(&self) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        self.inner.tx.send(Msg::Flush(tx)).map_err(|_| self.err("the writer is gone"))?;
        rx.await.map_err(|_| self.err("the writer is gone"))?.map_err(|e| self.err(e))
    }

    /// The task `id`, if stored.
    pub async fn task(&self, id: &str) -> Result<Option<TaskRecord>, StoreError> {
        match &self.inner.backend {
            Backend::Redb(b) => {
                let (b, id) = (b.clone(), id.to_owned());
                blocking(move || b.task(&id)).await
            }
            Backend::Postgres(b) => b.task(id).await,
        }
        .map_err(|e| self.err(e))
    }

    /// Every entry of `task_id`'s import journal, in order ([`crate::journal`]).
    pub async fn journal(&self, task_id: &str) -> Result<Vec<(u64, serde_json::Value)>, StoreError> {
        match &self.inner.backend {
            Backend::Redb(b) => {
                let (b, task_id) = (b.clone(), task_id.to_owned());
                blocking(move || b.journal(&task_id)).await
            }
            Backend::Postgres(b) => b.journal(task_id).await,
        }
        .map_err(|e| self.err(e))
    }

    /// Every event of `task_id` with a sequence number greater than `after`, in order (a
    /// task's events are bounded by its event budget). Readers that follow a task for a
    /// client read it in pages ([`Store::events_page`]) instead.
    pub async fn events_after(&self, task_id: &str, after: u64) -> Result<Vec<(u64, serde_json::Value)>, StoreError> {
        self.events_page(task_id, after, usize::MAX).await
    }

    /// At most `limit` events of `task_id` with a sequence number greater than `after`, in
    /// order, read off the async threads: a client's replay of a long log costs one page
    /// of memory at a time, and no reader stalls the server's other requests.
    pub async fn events_page(
        &self,
        task_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, serde_json::Value)>, StoreError> {
        match &self.inner.backend {
            Backend::Redb(b) => {
                let (b, task_id) = (b.clone(), task_id.to_owned());
                blocking(move || b.events_after(&task_id, after, limit)).await
            }
            Backend::Postgres(b) => b.events_after(task_id, after, limit).await,
        }
        .map_err(|e| self.err(e))
    }

    /// Every task record (recovery and retention scans; bounded by retention). A record
    /// that no longer parses is left out.
    pub async fn tasks(&self) -> Result<Vec<TaskRecord>, StoreError> {
        match &self.inner.backend {
            Backend::Redb(b) => {
                let b = b.clone();
                blocking(move || b.tasks()).await
            }
            Backend::Postgres(b) => b.tasks().await,
        }
        .map_err(|e| self.err(e))
    }

    /// One page of a task listing ([`TaskQuery`]), newest first (`created_at_ms`, then
    /// `task_id`, descending), read through an index: the cost of a page does not grow
    /// with the number of tasks stored or with how deep the page is.
    pub async fn list_tasks(&self, query: &TaskQuery) -> Result<TaskPage, StoreError> {
        let limit = query.limit.min(MAX_TASK_PAGE);
        let user = query.user_id.clone();
        let before = query.before.clone();
        // One more than the page, to know whether another page follows.
        let read = limit + 1;
        match &self.inner.backend {
            Backend::Redb(b) => {
                let b = b.clone();
                blocking(move || b.list_tasks(user.as_deref(), &before, read)).await
            }
            Backend::Postgres(b) => b.list_tasks(user.as_deref(), &before, read).await,
        }
        .map(|tasks| TaskPage::of(tasks, limit))
        .map_err(|e| self.err(e))
    }

    /// Number of stored events (metrics, tests).
    pub async fn event_count(&self) -> Result<u64, StoreError> {
        match &self.inner.backend {
            Backend::Redb(b) => b.event_count(),
            Backend::Postgres(b) => b.event_count().await,
        }
        .map_err(|e| self.err(e))
    }

    /// Plugin state value of `key` in `namespace` (a
    /// [`crate::plugin_state::StateNamespace::store_key`]; the `state` capability when
    /// backed by this store).
    pub async fn state_get(&self, namespace: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match &self.inner.backend {
            Backend::Redb(b) => {
                let (b, namespace, key) = (b.clone(), namespace.to_owned(), key.to_owned());
                blocking(move || b.state_get(&namespace, &key)).await
            }
            Backend::Postgres(b) => b.state_get(namespace, key).await,
        }
        .map_err(|e| self.err(e))
    }

    /// Stores plugin state `key` = `value` in `namespace`, written at `written_at_ms`, at
    /// once (not through the queue) unless the namespace would then hold more than
    /// `max_namespace_bytes` (keys + values, as stored): one transaction that counts what
    /// the namespace holds, checks and writes, so writers in several processes at once
    /// cannot together pass the limit (PostgreSQL: under a per-namespace advisory lock;
    /// redb: its write transactions are serial). Committed when it returns. Key and value
    /// come scrubbed, as for [`Store::write`]. Not ordered with queued writes of
    /// the same key: flush those first.
    pub async fn state_put(
        &self,
        namespace: &str,
        key: &str,
        value: &[u8],
        written_at_ms: u64,
        max_namespace_bytes: u64,
    ) -> Result<StatePut, StoreError> {
        match &self.inner.backend {
            Backend::Redb(b) => {
                let (b, namespace, key, value) = (b.clone(), namespace.to_owned(), key.to_owned(), value.to_vec());
                blocking(move || b.state_put(&namespace, &key, &value, written_at_ms, max_namespace_bytes)).await
            }
            Backend::Postgres(b) => b.state_put(namespace, key, value, written_at_ms, max_namespace_bytes).await,
        }
        .map_err(|e| self.err(e))
    }

    /// Deletes plugin state `key` of `namespace`; committed when it returns.
    pub async fn state_delete(&self, namespace: &str, key: &str) -> Result<(), StoreError> {
        self.write(Write::StateDelete { namespace: namespace.to_owned(), key: key.to_owned() });
        self.flush().await
    }

    /// Bytes (keys + values, as stored) `namespace` holds.
    pub async fn state_bytes(&self, namespace: &str) -> Result<u64, StoreError> {
        match &self.inner.backend {
            Backend::Redb(b) => {
                let (b, namespace) = (b.clone(), namespace.to_owned());
                blocking(move || b.state_bytes(&namespace)).await
            }
            Backend::Postgres(b) => b.state_bytes(namespace).await,
        }
        .map_err(|e| self.err(e))
    }

    /// Every plugin state entry, ordered by namespace and key, for loading at start.
    pub async fn state_all(&self) -> Result<Vec<StateEntry>, StoreError> {
        match &self.inner.backend {
            Backend::Redb(b) => {
                let b = b.clone();
                blocking(move || b.state_all()).await
            }
            Backend::Postgres(b) => b.state_all().await,
        }
        .map_err(|e| self.err(e))
    }

    /// Deletes every plugin state entry last written before `cutoff` (ms since the Unix
    /// epoch), in one transaction; an entry stored before write times were kept counts as
    /// written at 0. Returns how many went. Called by [`crate::plugin_state::StateStore::expire`],
    /// the retention sweep of plugin state.
    pub async fn state_expire(&self, cutoff: u64) -> Result<usize, StoreError> {
        match &self.inner.backend {
            Backend::Redb(b) => {
                let b = b.clone();
                blocking(move || b.state_expire(cutoff)).await
            }
            Backend::Postgres(b) => b.state_expire(cutoff).await,
        }
        .map_err(|e| self.err(e))
    }

    /// Marks every task that was not finished as `failed` / "host restarted" (the
    /// previous host died with it running), with a final `error` and `finish` event.
    /// Returns their ids. Call before accepting new tasks. (The engine takes durable
    /// tasks over instead: [`Store::unfinished`].)
    pub async fn recover_interrupted(&self) -> Result<Vec<String>, StoreError> {
        let mut ids = vec![];
        for rec in self.unfinished().await? {
            ids.push(rec.task_id.clone());
            self.end_unrun(rec, TaskState::Failed, FinishReason::HostRestarted, HOST_RESTARTED).await?;
        }
        self.flush().await?;
        ids.sort();
        Ok(ids)
    }

    /// Every task that was not finished (an embedded store at start: the previous host
    /// died with them running).
    pub async fn unfinished(&self) -> Result<Vec<TaskRecord>, StoreError> {
        Ok(self.tasks().await?.into_iter().filter(|r| !r.is_finished()).collect())
    }

    /// Deletes finished tasks (and their events) that finished more than `retention` ago.
    /// Returns how many tasks went.
    pub async fn purge(&self, retention: Duration) -> Result<usize, StoreError> {
        let cutoff = now_ms().saturating_sub(retention.as_millis() as u64);
        match &self.inner.backend {
            Backend::Redb(b) => {
                let b = b.clone();
                blocking(move || b.purge_finished_before(cutoff)).await
            }
            Backend::Postgres(b) => b.purge_finished_before(cutoff).await,
        }
        .map_err(|e| self.err(e))
    }
}

/// One plugin state entry as stored ([`Store::state_all`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateEntry {
    /// A [`crate::plugin_state::StateNamespace::store_key`].
    pub namespace: String,
    pub key: String,
    pub value: Vec<u8>,
    /// When it was last written (ms since the Unix epoch); 0 when the store did not
    /// record it (entries from before write times were kept).
    pub written_at_ms: u64,
}

/// What [`Store::state_put`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatePut {
    /// Committed; the namespace now holds `total` bytes (keys + values).
    Stored { total: u64 },
    /// Nothing written: the namespace would have held `total` bytes, over the limit.
    OverLimit { total: u64 },
}

/// The error text of a task the host was running when it stopped.
pub const HOST_RESTARTED: &str = "host restarted";

/// Runs a redb read off the async threads: a read may scan a table or parse a long
/// log, and must not stall the requests and heartbeats that share those threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, String> + Send + 'static) -> Result<T, String> {
    tokio::task::spawn_blocking(f).await.map_err(|e| format!("the read was interrupted: {e}"))?
}

/// How errors and logs name a PostgreSQL store: the URL as the driver reads it — user,
/// hosts, ports, database — with `***` for a password, whatever the URL's spelling (a
/// `/`, `?` or `@` in the password, a percent-encoded `password` parameter). Built from
/// the parsed configuration, never from the text, so what the driver takes as the
/// password is what is left out. A file path is returned as is; text the driver cannot
/// parse is never printed. A URL with a password and more than one `@` is not printed
/// either: the driver ends the password at the first `@`, so a raw `@` in the password
/// (`postgres://u:p@ss/w@host/db`) would put the rest of it into the host, the database
/// name or the parameters (regression: `ss` and `w@host/db` were printed).
pub fn redact_url(url: &str) -> String {
    if !url.contains("://") && !url.contains('=') && !url.contains('@') {
        return url.to_owned();
    }
    const UNREADABLE: &str = "(a PostgreSQL connection string warden cannot read)";
    let Ok(c) = url.parse::<tokio_postgres::Config>() else {
        return UNREADABLE.into();
    };
    if c.get_password().is_some() && url.contains("://") && url.matches('@').count() > 1 {
        return UNREADABLE.into();
    }
    // A raw `@` in a password makes the driver read the rest as the host name: a host
    // name with characters no host name has is not printed either.
    let plain_host = |h: &str| h.bytes().all(|b| b.is_ascii_alphanumeric() || b".-_:[]%".contains(&b));
    if c.get_hosts().iter().any(|h| matches!(h, tokio_postgres::config::Host::Tcp(n) if !plain_host(n))) {
        return UNREADABLE.into();
    }
    let user = match (c.get_user(), c.get_password().is_some()) {
        (Some(u), true) => format!("{u}:***@"),
        (Some(u), false) => format!("{u}@"),
        (None, true) => ":***@".into(),
        (None, false) => String::new(),
    };
    let ports = c.get_ports();
    let hosts: Vec<String> = c
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let host = match h {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                tokio_postgres::config::Host::Unix(dir) => dir.display().to_string(),
            };
            match ports.get(i).or(ports.first()) {
                Some(p) => format!("{host}:{p}"),
                None => host,
            }
        })
        .collect();
    format!("postgres://{user}{}/{}", hosts.join(","), c.get_dbname().unwrap_or(""))
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn a_url_is_named_without_its_password() {
        assert_eq!(redact_url("postgres://warden:s3cr3t@db:5432/warden"), "postgres://warden:***@db:5432/warden");
        assert_eq!(redact_url("postgresql://u:p%40ss@h/d?sslmode=disable"), "postgres://u:***@h:5432/d");
        // Regression (review): the user info ended at the first `/`, printing the rest.
        assert_eq!(redact_url("postgres://warden:Ab/c+d=@db/warden"), "postgres://warden:***@db:5432/warden");
        assert_eq!(
            redact_url("postgres://h/d?user=u&pass%77ord=s3cr3t&application_name=w"),
            "postgres://u:***@h:5432/d"
        );
        assert_eq!(redact_url("postgres://u@h:1/d"), "postgres://u@h:1/d");
        assert_eq!(redact_url("host=h password=s3cr3t"), "postgres://:***@h/");
        assert_eq!(
            redact_url("postgres://u:s3cr3t@h/d?bogus_option=1"),
            "(a PostgreSQL connection string warden cannot read)"
        );
        assert_eq!(redact_url("./state.db"), "./state.db");
    }

    #[test]
    fn regression_a_raw_at_sign_in_a_password_printed_the_rest_of_it() {
        for url in [
            "postgres://u:p@ss/w@host/db",
            "postgresql://u:p@ss/w@host/",
            "postgres://u:p@ss?user=w@host/db",
            "https://u:p@ss/w@host/",
        ] {
            let shown = redact_url(url);
            assert_eq!(shown, "(a PostgreSQL connection string warden cannot read)", "{url}");
        }
    }

    proptest::proptest! {
        /// A raw password of any characters (`@`, `/`, `?`, `:`...) in a URL: what is
        /// printed is either the URL as meant, password hidden, or nothing of it at all —
        /// never a piece of the password as a host, database or user.
        #[test]
        fn no_part_of_a_raw_password_is_printed(
            pw in "[A-Za-z0-9/?#@:&=+.!$*,;-]{1,24}",
            scheme in proptest::sample::select(vec!["postgres", "postgresql", "https"]),
        ) {
            let url = format!("{scheme}://warden:{pw}@db/warden");
            let shown = redact_url(&url);
            let unreadable = "(a PostgreSQL connection string warden cannot read)";
            proptest::prop_assert!(
                shown == unreadable || shown == "postgres://warden:***@db:5432/warden",
                "{url} -> {shown}"
            );
        }

        /// Whatever the password's characters, the named store never contains it.
        #[test]
        fn no_password_survives(pw in "[A-Za-z0-9/?#@:&=+%.!$*-]{6,24}") {
            let encoded: String = pw.bytes().map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") }).collect();
            for url in [
                format!("postgres://warden:{pw}@db/warden"),
                format!("postgres://warden:{encoded}@db/warden"),
                format!("postgres://db/warden?user=warden&password={encoded}"),
            ] {
                let shown = redact_url(&url);
                proptest::prop_assert!(!shown.contains(&pw), "{url} -> {shown}");
            }
        }
    }
}
