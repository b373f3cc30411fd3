//! The import journal of a durable task: what its plugin call asked of the host, in order,
//! and what the host answered, so that another process can run the same plugin again and
//! answer from the journal instead of the world (a *replay*), then go on live.
//!
//! A plugin is a WebAssembly component: its execution is deterministic except through
//! its imports, and every import goes through warden. The journal holds, per task:
//! - entry 0, the [`JournalHeader`]: the call, the plugin build (id and SHA-256) and
//!   when the task started;
//! - one [`CallEntry`] per import call: the import ([`Import`]), a digest of its
//!   arguments, and its result — or only that it `started`, for a call with effects
//!   outside warden that was under way when the process died.
//!
//! This module owns the journal's format, its bound and the replay cursor
//! ([`TaskJournal`]); the runtime (`runtime/host/journal.rs`) decides per import what is
//! journaled and how an interrupted call ends, and the engine decides which tasks are
//! durable and takes them over. It never runs plugin code, and it holds no secret: a
//! journal is written from what the plugin saw, which the host has already scrubbed.
//!
//! Writes go through the store's queue, which commits in queue order, so an entry that
//! is committed implies every entry (and every task event) queued before it is too.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::plugin::{PluginRef, TaskCall};
use crate::store::{Store, StoreError, Write};

pub use crate::config::DEFAULT_JOURNAL_MAX_BYTES;

/// Hex characters of an argument digest kept in an entry: 128 bits of SHA-256, enough
/// that two different arguments never share one by chance, short enough to read.
const DIGEST_HEX: usize = 32;

/// One import of the plugin interface (every WIT version's calls reach the latest's, so
/// one name serves all). Serialised as the WIT name, e.g. `model.complete`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Import {
    #[serde(rename = "log.write")]
    LogWrite,
    #[serde(rename = "events.emit")]
    EventsEmit,
    #[serde(rename = "state.get")]
    StateGet,
    #[serde(rename = "state.set")]
    StateSet,
    #[serde(rename = "state.delete")]
    StateDelete,
    #[serde(rename = "model.complete")]
    ModelComplete,
    #[serde(rename = "tools.list")]
    ToolsList,
    #[serde(rename = "tools.call")]
    ToolsCall,
    #[serde(rename = "http.send")]
    HttpSend,
    #[serde(rename = "http.send-streaming")]
    HttpSendStreaming,
    #[serde(rename = "body-stream.next")]
    BodyStreamNext,
    #[serde(rename = "resources.read")]
    ResourcesRead,
    #[serde(rename = "clock.now-ms")]
    ClockNowMs,
    #[serde(rename = "clock.remaining-ms")]
    ClockRemainingMs,
    #[serde(rename = "clock.sleep")]
    ClockSleep,
    #[serde(rename = "cancel.is-canceled")]
    CancelIsCanceled,
    #[serde(rename = "cancel.wait")]
    CancelWait,
}

impl std::fmt::Display for Import {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = serde_json::to_value(self).expect("an import name serialises");
        f.write_str(v.as_str().unwrap_or("?"))
    }
}

/// What a durable task ran: enough to run it again elsewhere.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JournalHeader {
    /// The call as the parent made it.
    pub call: TaskCall,
    /// The plugin build that ran it: a replay needs exactly this build.
    pub plugin: PluginRef,
    /// When the task started running (ms since the Unix epoch): its deadlines count
    /// from here, wherever it runs next.
    pub started_at_ms: u64,
    /// The submission's tool-call cap.
    #[serde(default)]
    pub max_tool_iterations: Option<u32>,
    /// The submission's egress narrowing.
    #[serde(default)]
    pub egress: Option<Vec<String>>,
    /// The task's session and user, as the plugin was told them (an offline replay,
    /// `warden plugin test --replay`, tells it the same).
    #[serde(default)]
    pub session_id: String,
    #[serde(default)]
    pub user_id: String,
}

/// One import call.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CallEntry {
    pub import: Import,
    /// [`digest`] of the call's arguments.
    pub digest: String,
    /// Stored beside the other fields: `"state": "done", "result": …`.
    #[serde(flatten)]
    pub state: CallState,
}

/// Where an import call got to.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum CallState {
    /// It was under way (its effects may have happened); `running` names the tool calls
    /// of a `tools.call` batch that had passed the gate and started.
    Started {
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        running: Vec<String>,
    },
    /// It returned `result` (the import's `result<T, error>` as JSON) to the plugin.
    Done { result: serde_json::Value },
}

/// One entry of a journal, as stored.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Entry {
    Header(Box<JournalHeader>),
    Call(CallEntry),
    /// The journal reached its bound here; the task is no longer durable.
    Overflow {
        max_bytes: u64,
    },
}

/// The digest of an import's arguments: SHA-256 of their JSON.
pub fn digest(args: &serde_json::Value) -> String {
    let bytes = serde_json::to_vec(args).expect("JSON always serialises");
    let mut hex = hex::encode(Sha256::digest(&bytes));
    hex.truncate(DIGEST_HEX);
    hex
}

/// A replay that does not match the journal: the plugin is not deterministic (or its
/// input changed), and the task cannot continue from its journal.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "the plugin is not deterministic: its import call #{seq} was {got} with arguments {got_digest}, but the journal \
     recorded {recorded} with arguments {recorded_digest}; the task cannot be resumed from its journal"
)]
pub struct Divergence {
    pub seq: u64,
    pub got: Import,
    pub got_digest: String,
    pub recorded: Import,
    pub recorded_digest: String,
}

/// What the journal says about the next import call.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Answered from the journal: the recorded result; nothing is run.
    Recorded(serde_json::Value),
    /// The call was under way when the process died (its entry `started`, never `done`):
    /// the caller decides how it ends; `running` as in [`CallState::Started`].
    Interrupted { seq: u64, running: Vec<String> },
    /// Past the journal: run it, then record it under `seq` (`None`: not journaled, the
    /// task is past its bound).
    Live { seq: Option<u64> },
}

/// A read journal, split for a replay.
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    pub header: Option<JournalHeader>,
    pub calls: Vec<(u64, CallEntry)>,
    /// Where it reached its bound, if it did.
    pub overflowed: bool,
    /// Bytes it holds.
    pub bytes: u64,
}

impl Recorded {
    /// The journal of `task_id` as stored (an entry that cannot be read is an error).
    pub async fn read(store: &Store, task_id: &str) -> Result<Recorded, String> {
        let rows = store.journal(task_id).await.map_err(|e| e.to_string())?;
        Recorded::from_rows(task_id, rows)
    }

    /// The journal of `task_id` from its entries, `(seq, entry)` in order (as stored, or
    /// as `GET /v1/tasks/{id}/journal` gives them).
    pub fn from_rows(task_id: &str, rows: Vec<(u64, serde_json::Value)>) -> Result<Recorded, String> {
        let mut out = Recorded::default();
        for (seq, value) in rows {
            out.bytes += value.to_string().len() as u64;
            match serde_json::from_value::<Entry>(value) {
                Ok(Entry::Header(h)) => out.header = Some(*h),
                Ok(Entry::Call(c)) => out.calls.push((seq, c)),
                Ok(Entry::Overflow { .. }) => out.overflowed = true,
                Err(e) => return Err(format!("journal entry {seq} of {task_id} cannot be read: {e}")),
            }
        }
        Ok(out)
    }
}

/// How a task's journal begins, decided by the engine and opened once the plugin that
/// runs the task is known ([`JournalPlan::open`]).
pub struct JournalPlan {
    pub store: Store,
    /// `server.journal_max_bytes`.
    pub max_bytes: u64,
    /// `plugins.durable`: plugin id → durable (unlisted: durable).
    pub plugins: std::collections::BTreeMap<String, bool>,
    pub start: JournalStart,
}

/// A task's journal: a new one, or one to replay.
pub enum JournalStart {
    Fresh { max_tool_iterations: Option<u32>, egress: Option<Vec<String>> },
    Replay(Box<Recorded>),
}

impl JournalPlan {
    /// The task's journal once `plugin` runs `call`: `None` when the plugin's tasks are
    /// not durable (or its header could not be committed: the task runs, not durable).
    /// A replay needs the very build that ran the task; an error says why it cannot go on.
    pub async fn open(
        self,
        task: &crate::plugin::TaskContext,
        call: &TaskCall,
        plugin: &PluginRef,
    ) -> Result<Option<std::sync::Arc<TaskJournal>>, String> {
        let task_id = task.task_id.as_str();
        match self.start {
            JournalStart::Replay(recorded) => {
                let Some(header) = &recorded.header else {
                    return Err("its journal has no header".into());
                };
                if header.plugin.sha256 != plugin.sha256 {
                    return Err(format!(
                        "the plugin build that ran it ({} {}, sha256 {}) is no longer loaded (now sha256 {}); a task \
                         continues only on the build that began it",
                        header.plugin.id, header.plugin.version, header.plugin.sha256, plugin.sha256
                    ));
                }
                Ok(Some(std::sync::Arc::new(TaskJournal::replaying(task_id, self.store, self.max_bytes, *recorded))))
            }
            JournalStart::Fresh { max_tool_iterations, egress } => {
                if !self.plugins.get(&plugin.id).copied().unwrap_or(true) {
                    return Ok(None);
                }
                let header = JournalHeader {
                    call: call.clone(),
                    plugin: plugin.clone(),
                    started_at_ms: crate::store::now_ms(),
                    max_tool_iterations,
                    egress,
                    session_id: task.session_id.clone(),
                    user_id: task.user_id.clone(),
                };
                let journal = TaskJournal::fresh(task_id, self.store, self.max_bytes, &header);
                if let Err(e) = journal.flush().await {
                    tracing::error!(task_id, error = %e, "the task's journal could not be begun; the task is not durable");
                    return Ok(None);
                }
                Ok(Some(std::sync::Arc::new(journal)))
            }
        }
    }
}

/// The journal of one running task: the replay cursor over what was recorded, and the
/// writer of what happens live.
pub struct TaskJournal {
    task_id: String,
    store: Store,
    max_bytes: u64,
    /// When the task first started (ms since the Unix epoch): its deadlines count from here.
    started_at_ms: u64,
    inner: Mutex<Inner>,
}

struct Inner {
    replay: VecDeque<(u64, CallEntry)>,
    next_seq: u64,
    bytes: u64,
    overflowed: bool,
    replayed: u64,
    /// The latest `clock.now-ms` the plugin saw, and the offset live readings get so
    /// they continue from it (`None` until the first live reading).
    last_clock: u64,
    clock_offset: Option<u64>,
    /// The call recorded `started` and not yet `done`.
    in_flight: Option<(u64, CallEntry)>,
}

impl TaskJournal {
    /// A live `clock.now-ms` reading `raw` (this process's origin) made to continue the
    /// readings the plugin saw before (another process's origin): never going backwards.
    pub fn monotonic(&self, raw: u64) -> u64 {
        let mut inner = self.inner.lock().unwrap();
        let last = inner.last_clock;
        let offset = *inner.clock_offset.get_or_insert(last.saturating_sub(raw));
        raw.saturating_add(offset)
    }

    /// The plugin saw `clock.now-ms` = `ms`.
    pub fn saw_clock(&self, ms: u64) {
        let mut inner = self.inner.lock().unwrap();
        inner.last_clock = inner.last_clock.max(ms);
    }

    /// A journal for a task that starts now: `header` is written first (and committed
    /// before the plugin runs, by the caller's [`TaskJournal::flush`]).
    pub fn fresh(task_id: &str, store: Store, max_bytes: u64, header: &JournalHeader) -> TaskJournal {
        let mut journal = TaskJournal::with(task_id, store, max_bytes, VecDeque::new(), 1, 0, false);
        journal.started_at_ms = header.started_at_ms;
        let entry = serde_json::to_value(Entry::Header(Box::new(header.clone()))).expect("a header serialises");
        journal.inner.lock().unwrap().bytes += entry.to_string().len() as u64;
        journal.store.write(Write::Journal { task_id: task_id.to_owned(), seq: 0, entry });
        journal
    }

    /// A journal to replay: `recorded` is answered first, then calls go on live.
    pub fn replaying(task_id: &str, store: Store, max_bytes: u64, recorded: Recorded) -> TaskJournal {
        let next = recorded.calls.last().map_or(1, |(seq, _)| seq + 1);
        let started_at_ms = recorded.header.as_ref().map_or_else(crate::store::now_ms, |h| h.started_at_ms);
        let calls = recorded.calls.into_iter().collect();
        let mut journal =
            TaskJournal::with(task_id, store, max_bytes, calls, next, recorded.bytes, recorded.overflowed);
        journal.started_at_ms = started_at_ms;
        journal
    }

    fn with(
        task_id: &str,
        store: Store,
        max_bytes: u64,
        replay: VecDeque<(u64, CallEntry)>,
        next_seq: u64,
        bytes: u64,
        overflowed: bool,
    ) -> TaskJournal {
        TaskJournal {
            task_id: task_id.to_owned(),
            store,
            max_bytes,
            started_at_ms: crate::store::now_ms(),
            inner: Mutex::new(Inner {
                replay,
                next_seq,
                bytes,
                overflowed,
                replayed: 0,
                last_clock: 0,
                clock_offset: None,
                in_flight: None,
            }),
        }
    }

    /// The same journal with its task started now: an offline replay keeps the plugin's
    /// whole time budget, however long ago the task ran.
    pub fn restarted(mut self) -> Self {
        self.started_at_ms = crate::store::now_ms();
        self
    }

    /// Time since the task first started, wherever it ran.
    pub fn elapsed(&self) -> std::time::Duration {
        std::time::Duration::from_millis(crate::store::now_ms().saturating_sub(self.started_at_ms))
    }

    /// Whether recorded calls remain to be answered.
    pub fn is_replaying(&self) -> bool {
        !self.inner.lock().unwrap().replay.is_empty()
    }

    /// How many calls were answered from the journal so far.
    pub fn replayed(&self) -> u64 {
        self.inner.lock().unwrap().replayed
    }

    /// What to do with the next import call, `import` with arguments digest `digest`.
    pub fn next(&self, import: Import, digest: &str) -> Result<Next, Divergence> {
        let mut inner = self.inner.lock().unwrap();
        if let Some((seq, entry)) = inner.replay.front() {
            if entry.import != import || entry.digest != digest {
                return Err(Divergence {
                    seq: *seq,
                    got: import,
                    got_digest: digest.to_owned(),
                    recorded: entry.import,
                    recorded_digest: entry.digest.clone(),
                });
            }
            let (seq, entry) = inner.replay.pop_front().expect("looked at above");
            inner.replayed += 1;
            return Ok(match entry.state {
                CallState::Done { result } => Next::Recorded(result),
                CallState::Started { running } => Next::Interrupted { seq, running },
            });
        }
        if inner.overflowed {
            return Ok(Next::Live { seq: None });
        }
        let seq = inner.next_seq;
        inner.next_seq += 1;
        Ok(Next::Live { seq: Some(seq) })
    }

    /// Records call `seq` as under way (its effects are about to happen), `running` the
    /// tool calls of it that started. Commit it ([`TaskJournal::flush`]) before the effect.
    pub fn started(&self, seq: u64, import: Import, digest: &str, running: Vec<String>) {
        let call = CallEntry { import, digest: digest.to_owned(), state: CallState::Started { running } };
        self.inner.lock().unwrap().in_flight = Some((seq, call.clone()));
        self.put(seq, call);
    }

    /// The tool call `id` of the `tools.call` under way passed the gate and starts now:
    /// committed before it runs, so a takeover never runs it again. (Without a call under
    /// way, as for a task that is not durable, nothing is written.)
    pub async fn running(&self, id: &str) {
        let marked = {
            let mut inner = self.inner.lock().unwrap();
            match &mut inner.in_flight {
                Some((_, CallEntry { state: CallState::Started { running }, .. })) => {
                    running.push(id.to_owned());
                    inner.in_flight.clone()
                }
                _ => None,
            }
        };
        let Some((seq, call)) = marked else { return };
        self.put(seq, call);
        if let Err(e) = self.flush().await {
            tracing::error!(task_id = %self.task_id, error = %e, "a running tool call could not be journaled");
        }
    }

    /// Records what call `seq` returned.
    pub fn done(&self, seq: u64, import: Import, digest: &str, result: serde_json::Value) {
        self.inner.lock().unwrap().in_flight = None;
        self.put(seq, CallEntry { import, digest: digest.to_owned(), state: CallState::Done { result } });
    }

    fn put(&self, seq: u64, call: CallEntry) {
        let entry = serde_json::to_value(Entry::Call(call)).expect("an entry serialises");
        let size = entry.to_string().len() as u64;
        let mut inner = self.inner.lock().unwrap();
        if inner.overflowed {
            return;
        }
        if inner.bytes + size > self.max_bytes {
            inner.overflowed = true;
            drop(inner);
            tracing::warn!(task_id = %self.task_id, max_bytes = self.max_bytes, "the task's journal reached server.journal_max_bytes; the task is no longer durable");
            let entry = serde_json::to_value(Entry::Overflow { max_bytes: self.max_bytes }).expect("serialises");
            self.store.write(Write::Journal { task_id: self.task_id.clone(), seq, entry });
            return;
        }
        inner.bytes += size;
        drop(inner);
        self.store.write(Write::Journal { task_id: self.task_id.clone(), seq, entry });
    }

    /// Waits until everything written so far is committed.
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.store.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(import: Import, args: serde_json::Value, result: serde_json::Value) -> CallEntry {
        CallEntry { import, digest: digest(&args), state: CallState::Done { result } }
    }

    fn recorded(calls: Vec<CallEntry>) -> Recorded {
        Recorded {
            calls: calls.into_iter().enumerate().map(|(i, c)| (i as u64 + 1, c)).collect(),
            ..Recorded::default()
        }
    }

    #[test]
    fn import_names_are_the_wit_names() {
        assert_eq!(Import::ModelComplete.to_string(), "model.complete");
        assert_eq!(Import::HttpSendStreaming.to_string(), "http.send-streaming");
        let back: Import = serde_json::from_str("\"body-stream.next\"").unwrap();
        assert_eq!(back, Import::BodyStreamNext);
    }

    #[tokio::test]
    async fn a_replay_answers_from_the_journal_then_goes_live_and_names_the_first_difference() {
        let store = Store::in_memory().unwrap();
        let args = serde_json::json!({ "ms": 5 });
        let rec = recorded(vec![
            call(Import::ClockNowMs, serde_json::json!({}), serde_json::json!({ "Ok": 7 })),
            call(Import::ClockSleep, args.clone(), serde_json::json!({ "Ok": null })),
        ]);
        let j = TaskJournal::replaying("t", store.clone(), DEFAULT_JOURNAL_MAX_BYTES, rec.clone());
        assert!(j.is_replaying());
        assert_eq!(
            j.next(Import::ClockNowMs, &digest(&serde_json::json!({}))),
            Ok(Next::Recorded(serde_json::json!({ "Ok": 7 })))
        );
        assert_eq!(j.next(Import::ClockSleep, &digest(&args)), Ok(Next::Recorded(serde_json::json!({ "Ok": null }))));
        assert!(!j.is_replaying());
        assert_eq!(j.next(Import::LogWrite, "x"), Ok(Next::Live { seq: Some(3) }));
        assert_eq!(j.replayed(), 2);

        // The same journal, replayed by a plugin that sleeps for another time.
        let j = TaskJournal::replaying("t", store, DEFAULT_JOURNAL_MAX_BYTES, rec);
        j.next(Import::ClockNowMs, &digest(&serde_json::json!({}))).unwrap();
        let other = digest(&serde_json::json!({ "ms": 6 }));
        let d = j.next(Import::ClockSleep, &other).unwrap_err();
        assert_eq!((d.seq, d.got, d.recorded), (2, Import::ClockSleep, Import::ClockSleep));
        assert!(d.to_string().contains("import call #2 was clock.sleep"), "{d}");
    }

    #[tokio::test]
    async fn a_call_under_way_is_interrupted_and_a_full_journal_stops_recording() {
        let store = Store::in_memory().unwrap();
        let header = JournalHeader {
            call: TaskCall { subagent_type: "a".into(), prompt: "p".into(), ..TaskCall::default() },
            plugin: PluginRef { id: "p".into(), version: "1".into(), sha256: "ab".into() },
            started_at_ms: 1,
            max_tool_iterations: None,
            egress: None,
            session_id: "s".into(),
            user_id: "u".into(),
        };
        let j = TaskJournal::fresh("t", store.clone(), 4096, &header);
        let Next::Live { seq: Some(seq) } = j.next(Import::ToolsCall, "d").unwrap() else { panic!() };
        j.started(seq, Import::ToolsCall, "d", vec!["c1".into()]);
        j.flush().await.unwrap();
        let rec = Recorded::read(&store, "t").await.unwrap();
        assert_eq!(rec.header.as_ref(), Some(&header));
        let again = TaskJournal::replaying("t", store.clone(), 4096, rec);
        assert_eq!(again.next(Import::ToolsCall, "d"), Ok(Next::Interrupted { seq: 1, running: vec!["c1".into()] }));
        // Past the bound: an overflow mark, then nothing more is journaled.
        let Next::Live { seq: Some(seq) } = again.next(Import::LogWrite, "e").unwrap() else { panic!() };
        again.done(seq, Import::LogWrite, "e", serde_json::json!({ "Ok": "x".repeat(5000) }));
        assert_eq!(again.next(Import::LogWrite, "e"), Ok(Next::Live { seq: None }));
        again.flush().await.unwrap();
        assert!(Recorded::read(&store, "t").await.unwrap().overflowed);
    }
}
