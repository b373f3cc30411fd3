//! The embedded backend (the default): task records, events and plugin state in one redb
//! file at `store.path`.
//!
//! Why redb: it is pure Rust (no C toolchain, no bundled SQLite to compile on every
//! clean build), ACID with copy-on-write pages so a `kill -9` mid-write leaves the last
//! committed transaction intact, and its ordered tuple keys give exactly the two access
//! paths the engine needs — a task by id, and a task's events in sequence order from
//! any `Last-Event-ID`. We need no ad-hoc queries, which is what SQLite would add.
//!
//! Owns the file's tables and its writer thread; the semantics every backend shares
//! (batching, scrubbing, recovery) are the facade's ([`super`]). Never reached except
//! through [`super::Store`].

use std::path::Path;
use std::sync::Arc;

use ::redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition};
use tokio::sync::mpsc;

use super::{Msg, TaskRecord, Write};

const TASKS: TableDefinition<&str, &[u8]> = TableDefinition::new("tasks");
const EVENTS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("events");
/// A durable task's import journal: (task, seq) → the entry's JSON ([`crate::journal`]).
const JOURNAL: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("journal");
/// Plugin state: (namespace, key) → value.
const STATE: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("plugin_state");
/// Task listings (every user's): `(created_at_ms, task_id)`, kept with [`TASKS`].
const TASKS_BY_CREATED: TableDefinition<(u64, &str), ()> = TableDefinition::new("tasks_by_created");
/// A user's task listing: `(user_id, created_at_ms, task_id)`, kept with [`TASKS`].
const TASKS_BY_USER: TableDefinition<(&str, u64, &str), ()> = TableDefinition::new("tasks_by_user");
/// When each plugin state entry was last written (ms since the Unix epoch), for expiry; an
/// entry without a row here (written before this table existed) counts as written at 0.
const STATE_WRITTEN: TableDefinition<(&str, &str), u64> = TableDefinition::new("plugin_state_written");

/// The open file. Cheap to clone (scans run on a blocking thread with their own clone).
#[derive(Clone)]
pub(super) struct RedbBackend {
    db: Arc<Database>,
}

impl RedbBackend {
    /// Opens (or creates) the file, creating parent directories, and starts its writer.
    pub(super) fn open(path: &Path, rx: mpsc::UnboundedReceiver<Msg>, location: String) -> Result<Self, String> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let db = Database::create(path).map_err(|e| e.to_string())?;
        Self::with_database(db, rx, location)
    }

    /// A database in memory only, gone with the process.
    pub(super) fn in_memory(rx: mpsc::UnboundedReceiver<Msg>, location: String) -> Result<Self, String> {
        let db = Database::builder()
            .create_with_backend(::redb::backends::InMemoryBackend::new())
            .map_err(|e| e.to_string())?;
        Self::with_database(db, rx, location)
    }

    fn with_database(db: Database, rx: mpsc::UnboundedReceiver<Msg>, location: String) -> Result<Self, String> {
        {
            let w = db.begin_write().map_err(|e| e.to_string())?;
            w.open_table(TASKS).map_err(|e| e.to_string())?;
            w.open_table(EVENTS).map_err(|e| e.to_string())?;
            w.open_table(STATE).map_err(|e| e.to_string())?;
            index_tasks(&w).map_err(|e| e.to_string())?;
            w.open_table(STATE_WRITTEN).map_err(|e| e.to_string())?;
            w.commit().map_err(|e| e.to_string())?;
        }
        let db = Arc::new(db);
        {
            let db = db.clone();
            std::thread::Builder::new()
                .name("warden-store".into())
                .spawn(move || writer(db, location, rx))
                .map_err(|e| format!("cannot start the writer thread: {e}"))?;
        }
        Ok(RedbBackend { db })
    }

    pub(super) fn task(&self, id: &str) -> Result<Option<TaskRecord>, String> {
        let r = self.db.begin_read().map_err(|e| e.to_string())?;
        let t = r.open_table(TASKS).map_err(|e| e.to_string())?;
        match t.get(id).map_err(|e| e.to_string())? {
            None => Ok(None),
            Some(v) => serde_json::from_slice(v.value()).map(Some).map_err(|e| format!("corrupt task {id}: {e}")),
        }
    }

    /// Every entry of `task_id`'s journal, in order.
    pub(super) fn journal(&self, task_id: &str) -> Result<Vec<(u64, serde_json::Value)>, String> {
        let r = self.db.begin_read().map_err(|e| e.to_string())?;
        let t = match r.open_table(JOURNAL) {
            Ok(t) => t,
            // A file no durable task has written to yet.
            Err(::redb::TableError::TableDoesNotExist(_)) => return Ok(vec![]),
            Err(e) => return Err(e.to_string()),
        };
        let mut out = vec![];
        for item in t.range((task_id, 0u64)..=(task_id, u64::MAX)).map_err(|e| e.to_string())? {
            let (k, v) = item.map_err(|e| e.to_string())?;
            let entry = serde_json::from_slice(v.value()).map_err(|e| format!("corrupt journal entry: {e}"))?;
            out.push((k.value().1, entry));
        }
        Ok(out)
    }

    pub(super) fn events_after(
        &self,
        task_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, serde_json::Value)>, String> {
        let r = self.db.begin_read().map_err(|e| e.to_string())?;
        let t = r.open_table(EVENTS).map_err(|e| e.to_string())?;
        let mut out = vec![];
        let Some(start) = after.checked_add(1) else { return Ok(out) };
        for item in t.range((task_id, start)..=(task_id, u64::MAX)).map_err(|e| e.to_string())?.take(limit) {
            let (k, v) = item.map_err(|e| e.to_string())?;
            let ev = serde_json::from_slice(v.value()).map_err(|e| format!("corrupt event: {e}"))?;
            out.push((k.value().1, ev));
        }
        Ok(out)
    }

    pub(super) fn tasks(&self) -> Result<Vec<TaskRecord>, String> {
        let r = self.db.begin_read().map_err(|e| e.to_string())?;
        let t = r.open_table(TASKS).map_err(|e| e.to_string())?;
        let mut out = vec![];
        for item in t.iter().map_err(|e| e.to_string())? {
            let (_, v) = item.map_err(|e| e.to_string())?;
            if let Ok(rec) = serde_json::from_slice(v.value()) {
                out.push(rec);
            }
        }
        Ok(out)
    }

    /// Up to `limit` tasks before `before`, newest first (of `user` alone, or everyone's).
    pub(super) fn list_tasks(
        &self,
        user: Option<&str>,
        before: &super::TaskCursor,
        limit: usize,
    ) -> Result<Vec<TaskRecord>, String> {
        let r = self.db.begin_read().map_err(|e| e.to_string())?;
        let tasks = r.open_table(TASKS).map_err(|e| e.to_string())?;
        let (c, id) = (before.created_at_ms, before.task_id.as_str());
        let ids: Vec<String> = match user {
            Some(u) => {
                let t = r.open_table(TASKS_BY_USER).map_err(|e| e.to_string())?;
                let range = t.range((u, 0u64, "")..(u, c, id)).map_err(|e| e.to_string())?;
                range.rev().take(limit).map(|k| k.map(|(k, _)| k.value().2.to_owned())).collect::<Result<_, _>>()
            }
            None => {
                let t = r.open_table(TASKS_BY_CREATED).map_err(|e| e.to_string())?;
                let range = t.range(..(c, id)).map_err(|e| e.to_string())?;
                range.rev().take(limit).map(|k| k.map(|(k, _)| k.value().1.to_owned())).collect::<Result<_, _>>()
            }
        }
        .map_err(|e: ::redb::StorageError| e.to_string())?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(v) = tasks.get(id.as_str()).map_err(|e| e.to_string())?
                && let Ok(rec) = serde_json::from_slice(v.value())
            {
                out.push(rec);
            }
        }
        Ok(out)
    }

    pub(super) fn event_count(&self) -> Result<u64, String> {
        let r = self.db.begin_read().map_err(|e| e.to_string())?;
        let t = r.open_table(EVENTS).map_err(|e| e.to_string())?;
        t.len().map_err(|e| e.to_string())
    }

    /// Deletes tasks finished before `cutoff` (ms) and their events, in one transaction.
    pub(super) fn purge_finished_before(&self, cutoff: u64) -> Result<usize, String> {
        let old: Vec<TaskRecord> =
            self.tasks()?.into_iter().filter(|r| r.finished_at_ms.is_some_and(|f| f < cutoff)).collect();
        if old.is_empty() {
            return Ok(0);
        }
        let w = self.db.begin_write().map_err(|e| e.to_string())?;
        {
            let mut tasks = w.open_table(TASKS).map_err(|e| e.to_string())?;
            let mut events = w.open_table(EVENTS).map_err(|e| e.to_string())?;
            let mut journal = w.open_table(JOURNAL).map_err(|e| e.to_string())?;
            let mut by_created = w.open_table(TASKS_BY_CREATED).map_err(|e| e.to_string())?;
            let mut by_user = w.open_table(TASKS_BY_USER).map_err(|e| e.to_string())?;
            for rec in &old {
                let id = &rec.task_id;
                tasks.remove(id.as_str()).map_err(|e| e.to_string())?;
                by_created.remove((rec.created_at_ms, id.as_str())).map_err(|e| e.to_string())?;
                by_user.remove((rec.user_id.as_str(), rec.created_at_ms, id.as_str())).map_err(|e| e.to_string())?;
                events
                    .retain_in((id.as_str(), 0u64)..=(id.as_str(), u64::MAX), |_, _| false)
                    .map_err(|e| e.to_string())?;
                journal
                    .retain_in((id.as_str(), 0u64)..=(id.as_str(), u64::MAX), |_, _| false)
                    .map_err(|e| e.to_string())?;
            }
        }
        w.commit().map_err(|e| e.to_string())?;
        Ok(old.len())
    }

    pub(super) fn state_get(&self, namespace: &str, key: &str) -> Result<Option<Vec<u8>>, String> {
        let r = self.db.begin_read().map_err(|e| e.to_string())?;
        let t = r.open_table(STATE).map_err(|e| e.to_string())?;
        Ok(t.get((namespace, key)).map_err(|e| e.to_string())?.map(|v| v.value().to_vec()))
    }

    /// See [`super::Store::state_put`]: one write transaction (redb's are serial).
    pub(super) fn state_put(
        &self,
        namespace: &str,
        key: &str,
        value: &[u8],
        written_at_ms: u64,
        max_namespace_bytes: u64,
    ) -> Result<super::StatePut, String> {
        let w = self.db.begin_write().map_err(|e| e.to_string())?;
        let outcome = {
            let mut t = w.open_table(STATE).map_err(|e| e.to_string())?;
            let (held, old) = usage(&t, namespace, Some(key))?;
            let total = held - old + (key.len() + value.len()) as u64;
            if total > max_namespace_bytes {
                super::StatePut::OverLimit { total }
            } else {
                t.insert((namespace, key), value).map_err(|e| e.to_string())?;
                let mut written = w.open_table(STATE_WRITTEN).map_err(|e| e.to_string())?;
                written.insert((namespace, key), written_at_ms).map_err(|e| e.to_string())?;
                super::StatePut::Stored { total }
            }
        };
        match outcome {
            super::StatePut::Stored { .. } => w.commit().map_err(|e| e.to_string())?,
            super::StatePut::OverLimit { .. } => w.abort().map_err(|e| e.to_string())?,
        }
        Ok(outcome)
    }

    pub(super) fn state_bytes(&self, namespace: &str) -> Result<u64, String> {
        let r = self.db.begin_read().map_err(|e| e.to_string())?;
        let t = r.open_table(STATE).map_err(|e| e.to_string())?;
        Ok(usage(&t, namespace, None)?.0)
    }

    pub(super) fn state_all(&self) -> Result<Vec<super::StateEntry>, String> {
        let r = self.db.begin_read().map_err(|e| e.to_string())?;
        let t = r.open_table(STATE).map_err(|e| e.to_string())?;
        let written = r.open_table(STATE_WRITTEN).map_err(|e| e.to_string())?;
        let mut out = vec![];
        for entry in t.iter().map_err(|e| e.to_string())? {
            let (k, v) = entry.map_err(|e| e.to_string())?;
            let (namespace, key) = k.value();
            let written_at_ms = written.get((namespace, key)).map_err(|e| e.to_string())?.map(|t| t.value());
            out.push(super::StateEntry {
                namespace: namespace.to_owned(),
                key: key.to_owned(),
                value: v.value().to_vec(),
                written_at_ms: written_at_ms.unwrap_or(0),
            });
        }
        Ok(out)
    }

    /// See [`super::Store::state_expire`]: one write transaction.
    pub(super) fn state_expire(&self, cutoff: u64) -> Result<usize, String> {
        let w = self.db.begin_write().map_err(|e| e.to_string())?;
        let gone = {
            let mut t = w.open_table(STATE).map_err(|e| e.to_string())?;
            let mut written = w.open_table(STATE_WRITTEN).map_err(|e| e.to_string())?;
            let mut old: Vec<(String, String)> = vec![];
            for entry in t.iter().map_err(|e| e.to_string())? {
                let (k, _) = entry.map_err(|e| e.to_string())?;
                let (namespace, key) = k.value();
                let at = written.get((namespace, key)).map_err(|e| e.to_string())?.map(|t| t.value()).unwrap_or(0);
                if at < cutoff {
                    old.push((namespace.to_owned(), key.to_owned()));
                }
            }
            for (namespace, key) in &old {
                t.remove((namespace.as_str(), key.as_str())).map_err(|e| e.to_string())?;
                written.remove((namespace.as_str(), key.as_str())).map_err(|e| e.to_string())?;
            }
            old.len()
        };
        w.commit().map_err(|e| e.to_string())?;
        Ok(gone)
    }
}

/// Bytes (keys + values) `namespace` holds in `t`, and of those the entry `key`'s.
fn usage(
    t: &impl ReadableTable<(&'static str, &'static str), &'static [u8]>,
    namespace: &str,
    key: Option<&str>,
) -> Result<(u64, u64), String> {
    let (mut held, mut old) = (0u64, 0u64);
    for entry in t.range((namespace, "")..).map_err(|e| e.to_string())? {
        let (k, v) = entry.map_err(|e| e.to_string())?;
        let (p, k) = k.value();
        if p != namespace {
            break;
        }
        let size = (k.len() + v.value().len()) as u64;
        held += size;
        if key == Some(k) {
            old = size;
        }
    }
    Ok((held, old))
}

/// The writer thread: one transaction per batch; ends when the store is dropped.
fn writer(db: Arc<Database>, location: String, mut rx: mpsc::UnboundedReceiver<Msg>) {
    let mut unreported = None;
    while let Some(first) = rx.blocking_recv() {
        let batch = super::take_batch(first, &mut rx);
        let result = commit(&db, &batch).map_err(|e| e.to_string());
        super::settle(batch, result, &location, &mut unreported);
    }
}

fn commit(db: &Database, batch: &[Msg]) -> Result<(), Box<::redb::Error>> {
    if super::writes(batch).next().is_none() {
        return Ok(());
    }
    let w = db.begin_write().map_err(::redb::Error::from)?;
    {
        let mut tasks = w.open_table(TASKS).map_err(::redb::Error::from)?;
        let mut events = w.open_table(EVENTS).map_err(::redb::Error::from)?;
        let mut journal = w.open_table(JOURNAL).map_err(::redb::Error::from)?;
        let mut state = w.open_table(STATE).map_err(::redb::Error::from)?;
        let mut by_created = w.open_table(TASKS_BY_CREATED).map_err(::redb::Error::from)?;
        let mut by_user = w.open_table(TASKS_BY_USER).map_err(::redb::Error::from)?;
        let mut written = w.open_table(STATE_WRITTEN).map_err(::redb::Error::from)?;
        for write in super::writes(batch) {
            match write {
                Write::Task(rec) => {
                    let bytes = serde_json::to_vec(rec).expect("a task record always serialises");
                    let id = rec.task_id.as_str();
                    let earlier = tasks.insert(id, bytes.as_slice()).map_err(::redb::Error::from)?;
                    // A task's creation time and user never change: its index rows are
                    // written with its first record only, not with every update.
                    if earlier.is_none() {
                        by_created.insert((rec.created_at_ms, id), ()).map_err(::redb::Error::from)?;
                        by_user
                            .insert((rec.user_id.as_str(), rec.created_at_ms, id), ())
                            .map_err(::redb::Error::from)?;
                    }
                }
                Write::Event { task_id, seq, event } => {
                    let bytes = serde_json::to_vec(event).expect("JSON always serialises");
                    events.insert((task_id.as_str(), *seq), bytes.as_slice()).map_err(::redb::Error::from)?;
                }
                Write::Journal { task_id, seq, entry } => {
                    let bytes = serde_json::to_vec(entry).expect("JSON always serialises");
                    journal.insert((task_id.as_str(), *seq), bytes.as_slice()).map_err(::redb::Error::from)?;
                }
                Write::StateSet { namespace, key, value, written_at_ms } => {
                    let k = (namespace.as_str(), key.as_str());
                    state.insert(k, value.as_slice()).map_err(::redb::Error::from)?;
                    written.insert(k, *written_at_ms).map_err(::redb::Error::from)?;
                }
                Write::StateDelete { namespace, key } => {
                    let k = (namespace.as_str(), key.as_str());
                    state.remove(k).map_err(::redb::Error::from)?;
                    written.remove(k).map_err(::redb::Error::from)?;
                }
                // One process owns an embedded store: there is no other replica to tell.
                Write::Claim { .. }
                | Write::Release { .. }
                | Write::ApprovalPublished { .. }
                | Write::ApprovalWithdrawn { .. } => {}
            }
        }
    }
    w.commit().map_err(::redb::Error::from)?;
    Ok(())
}

/// The listing indexes, built from [`TASKS`] when they do not cover it: a file written
/// before they existed (the embedded store's counterpart of migration `0003`), once.
fn index_tasks(w: &::redb::WriteTransaction) -> Result<(), Box<::redb::Error>> {
    let tasks = w.open_table(TASKS).map_err(::redb::Error::from)?;
    let mut by_created = w.open_table(TASKS_BY_CREATED).map_err(::redb::Error::from)?;
    let mut by_user = w.open_table(TASKS_BY_USER).map_err(::redb::Error::from)?;
    let held = tasks.len().map_err(::redb::Error::from)?;
    if by_created.len().map_err(::redb::Error::from)? == held && by_user.len().map_err(::redb::Error::from)? == held {
        return Ok(());
    }
    by_created.retain(|_, _| false).map_err(::redb::Error::from)?;
    by_user.retain(|_, _| false).map_err(::redb::Error::from)?;
    for item in tasks.iter().map_err(::redb::Error::from)? {
        let (k, v) = item.map_err(::redb::Error::from)?;
        if let Ok(rec) = serde_json::from_slice::<TaskRecord>(v.value()) {
            by_created.insert((rec.created_at_ms, k.value()), ()).map_err(::redb::Error::from)?;
            by_user.insert((rec.user_id.as_str(), rec.created_at_ms, k.value()), ()).map_err(::redb::Error::from)?;
        }
    }
    Ok(())
}
