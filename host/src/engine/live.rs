//! One task the engine runs: its record and events in memory ([`LiveTask`]), the
//! turning of [`TaskEvent`]s into its stream (scrubbed of the session's secrets, streamed
//! text through a [`StreamScrubber`] per stream), its status while approvals wait, and
//! the signals that stop it. It never decides how a task ends; [`super::Engine`] does.
//!
//! Every event a task stores and streams — its plugin's, the tool host's, the gate's, the
//! host's own — passes [`LiveTask::push`], which holds the task to its [`EventBudget`].
//! Approval events are kept past the budget (watchers must see a question to answer it),
//! but bounded all the same: a request's `input` is cut to [`MAX_APPROVAL_EVENT_INPUT`],
//! and past the budget they are kept within [`APPROVALS_PAST_BUDGET`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;

use crate::event::{EventSink, GateChange, HostEvent, TaskEvent};
use crate::redact::{Redactor, StreamScrubber};
use crate::store::{Store, TaskRecord, Write, now_ms};
use crate::task_state::TaskState;

/// What one task may store and stream (`server.max_events_per_task`,
/// `server.max_event_bytes_per_task`). Past either limit its events are dropped and one
/// `events_dropped` event says which limit; the `finish` event is always kept, so a task
/// holds at most the budget plus those two events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventBudget {
    pub max_events: u64,
    /// Bytes of the events as JSON.
    pub max_bytes: u64,
}

impl Default for EventBudget {
    fn default() -> Self {
        EventBudget {
            max_events: crate::config::DEFAULT_MAX_EVENTS_PER_TASK,
            max_bytes: crate::config::DEFAULT_MAX_EVENT_BYTES_PER_TASK,
        }
    }
}

/// The event type a task's stream always ends with: stored whatever the budget.
const FINISH: &str = "finish";

/// Event types stored whatever the budget: the stream's end, and the approval requests and
/// their resolutions, which a person, an MCP client's elicitation or an A2A client must see
/// to answer (a task that filled its budget with tool output would otherwise hide every
/// later question, and watchers would never be asked).
///
/// Regression: they were exempt from the budget altogether, on the assumption that they
/// come at the gate's pace. But a request carried its call's whole `input` (up to 1 MiB,
/// 64 calls a batch), and a decider that answers at once (`warden mcp` declining when
/// nobody can be asked) lets a plugin loop: gigabytes of events per task. So approval
/// events count against the budget like any other; past it they are still stored, within
/// [`APPROVALS_PAST_BUDGET`], and a request's `input` is cut to [`MAX_APPROVAL_EVENT_INPUT`].
const ALWAYS_STORED: [&str; 3] = [FINISH, GateChange::Requested.kind(), GateChange::Resolved.kind()];

/// Longest `input` an `approval_request` event carries, in characters of its JSON text.
/// Equal to the longest arguments an approval question shows whole (the server's
/// `MAX_QUESTION_ARGUMENTS`, which asserts it at compile time), so every input a front could
/// ask a person about from the event is carried whole; a longer one is cut to this many
/// characters (a JSON string then), marked `input_cut: true` with its whole length in
/// `input_length`, and never put to a person from the event: the gate keeps the whole
/// input, which `GET /v1/approvals` lists and the decision is made on.
pub const MAX_APPROVAL_EVENT_INPUT: usize = 16 * 1024;

/// What approval events a task may store past its [`EventBudget`]: 512 events (256
/// questions and their answers — far more than a person answers once a task has filled
/// its budget) and 4 MiB (about a whole batch, 64 requests, of the longest input even in
/// 4-byte characters). Past these, approval events are dropped too (one `events_dropped` marker
/// names this bound; `GET /v1/approvals` still lists every waiting request), so a task's
/// events never exceed its budget by more than this.
pub const APPROVALS_PAST_BUDGET: EventBudget = EventBudget { max_events: 512, max_bytes: 4 * 1024 * 1024 };

/// The name an `events_dropped` marker gives [`APPROVALS_PAST_BUDGET`].
const APPROVALS_PAST_BUDGET_NAME: &str = "APPROVALS_PAST_BUDGET";

/// Cuts the `input` of an `approval_request` event to [`MAX_APPROVAL_EVENT_INPUT`]
/// characters of its JSON text, marked as cut; any other event is left as it is.
fn bound_approval_input(event: &mut Value) {
    if event.get("type").and_then(Value::as_str) != Some(GateChange::Requested.kind()) {
        return;
    }
    let Some(input) = event.get_mut("input") else { return };
    let text = input.to_string();
    let length = text.chars().count();
    if length <= MAX_APPROVAL_EVENT_INPUT {
        return;
    }
    *input = Value::String(text.chars().take(MAX_APPROVAL_EVENT_INPUT).collect());
    event["input_cut"] = Value::Bool(true);
    event["input_length"] = json!(length);
}

/// How much of its [`EventBudget`] a task has used.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct EventsStored {
    count: u64,
    bytes: u64,
    /// The budget ran out (and the `events_dropped` marker was stored).
    over: bool,
    /// Approval events stored past the budget, of [`APPROVALS_PAST_BUDGET`].
    past_count: u64,
    past_bytes: u64,
    /// [`APPROVALS_PAST_BUDGET`] ran out too (and its marker was stored).
    past_over: bool,
}

/// The bound an event of `size` bytes would exceed after `count` events of `bytes`: its
/// (name, value, what it counts), or `None` when it fits.
fn exceeded(
    budget: &EventBudget,
    count: u64,
    bytes: u64,
    size: u64,
    names: [&'static str; 2],
) -> Option<(&'static str, u64, &'static str)> {
    if count + 1 > budget.max_events {
        Some((names[0], budget.max_events, "events"))
    } else if bytes.saturating_add(size) > budget.max_bytes {
        Some((names[1], budget.max_bytes, "bytes of events"))
    } else {
        None
    }
}

impl EventsStored {
    /// What `events` (a task's events so far) use.
    pub(super) fn of(events: &[Value]) -> Self {
        EventsStored { count: events.len() as u64, bytes: events.iter().map(json_len).sum(), ..Default::default() }
    }

    /// Whether an event of `size` bytes is kept, and the `events_dropped` markers to store
    /// before it (or in its place): one for the first event past the budget, one for the
    /// first approval event past [`APPROVALS_PAST_BUDGET`]. `finish` is always kept;
    /// approval events ([`ALWAYS_STORED`]) count against the budget and, past it, are kept
    /// within [`APPROVALS_PAST_BUDGET`].
    fn admit(&mut self, budget: &EventBudget, event: &Value, size: u64) -> Admit {
        let kind = event.get("type").and_then(Value::as_str);
        if kind == Some(FINISH) {
            return Admit::keep();
        }
        let mut markers = vec![];
        if !self.over {
            let names = ["server.max_events_per_task", "server.max_event_bytes_per_task"];
            match exceeded(budget, self.count, self.bytes, size, names) {
                None => {
                    self.count += 1;
                    self.bytes += size;
                    return Admit::keep();
                }
                Some((key, value, what)) => {
                    self.over = true;
                    markers.push(json!({
                        "type": "events_dropped",
                        "limit": key,
                        "value": value,
                        "message": format!(
                            "this task reached its limit of {value} {what} ({key}); its later events are not stored or \
                             streamed, except approval requests and their decisions (up to {} events and {} bytes more)",
                            APPROVALS_PAST_BUDGET.max_events, APPROVALS_PAST_BUDGET.max_bytes
                        ),
                    }));
                }
            }
        }
        let approval = kind.is_some_and(|t| ALWAYS_STORED.contains(&t));
        if !approval || self.past_over {
            return Admit { markers, keep: false };
        }
        let names = [APPROVALS_PAST_BUDGET_NAME, APPROVALS_PAST_BUDGET_NAME];
        match exceeded(&APPROVALS_PAST_BUDGET, self.past_count, self.past_bytes, size, names) {
            None => {
                self.past_count += 1;
                self.past_bytes += size;
                Admit { markers, keep: true }
            }
            Some((key, value, what)) => {
                self.past_over = true;
                markers.push(json!({
                    "type": "events_dropped",
                    "limit": key,
                    "value": value,
                    "message": format!(
                        "this task stored {value} {what} of approval requests and decisions past its event budget \
                         ({key}); later ones are not stored or streamed (GET /v1/approvals lists every waiting request)"
                    ),
                }));
                Admit { markers, keep: false }
            }
        }
    }
}

/// What [`EventsStored::admit`] decided for one event.
struct Admit {
    /// `events_dropped` markers to store first.
    markers: Vec<Value>,
    /// Whether the event itself is stored.
    keep: bool,
}

impl Admit {
    fn keep() -> Self {
        Admit { markers: vec![], keep: true }
    }
}

/// The length of `v` as JSON text, as the event budgets count it.
fn json_len(v: &Value) -> u64 {
    warden_mcp_protocol::json_len(v) as u64
}

pub(super) struct Inner {
    pub(super) record: TaskRecord,
    pub(super) events: Vec<Value>,
    /// What `events` use of the task's [`EventBudget`].
    pub(super) stored: EventsStored,
    pub(super) pending_approvals: usize,
    /// The running call's event channel: gate events travel through it too, so an
    /// `approval_request` always follows the `tool_call` it is about.
    pub(super) sink: Option<EventSink>,
    /// Set once the task is finishing: late gate events are dropped.
    pub(super) closed: bool,
}

/// A task the engine is running (or queueing).
pub struct LiveTask {
    pub(super) inner: Mutex<Inner>,
    /// Bumped on every change (event appended, status changed).
    pub(super) version: watch::Sender<u64>,
    /// Set once the task is canceled.
    pub(super) canceled: watch::Sender<bool>,
    /// (user id, session id): whose secrets scrub this task's text.
    pub(super) session: (String, String),
    /// Whether the task takes one of its user's `server.max_tasks_per_user` (every task but
    /// a nested subagent, which runs inside its root task's).
    pub(super) counts_for_user: bool,
    /// Held tails of streamed text, per (plugin, kind).
    pub(super) streams: Mutex<BTreeMap<(String, String), StreamScrubber>>,
    /// The task's tool-call budget (`max_tool_iterations`); `None` = unlimited.
    pub(super) tool_budget: Option<Arc<crate::tools::ToolBudget>>,
    /// What the task may store and stream.
    pub(super) event_budget: EventBudget,
    pub(super) store: Store,
    /// The engine's feed of task record changes (live task lists).
    pub(super) changes: tokio::sync::broadcast::Sender<Arc<TaskRecord>>,
    /// Set by the first [`Engine::finish`] of this task: a task ends once.
    pub(super) finishing: std::sync::atomic::AtomicBool,
    /// Approval requests the task and the nested subagents it started have made so far.
    pub(super) questions: std::sync::atomic::AtomicU64,
    /// Aborts the task's driver (cancel uses it when the driver does not wind down).
    pub(super) driver: Mutex<Option<tokio::task::AbortHandle>>,
    /// Another process runs the task now ([`super::Engine::relinquish`]): nothing more of
    /// it is written from here.
    pub(super) relinquished: std::sync::atomic::AtomicBool,
}

impl LiveTask {
    pub fn id(&self) -> String {
        self.inner.lock().unwrap().record.task_id.clone()
    }

    pub fn record(&self) -> TaskRecord {
        self.inner.lock().unwrap().record.clone()
    }

    /// Events with a sequence number above `after` (sequence = index + 1).
    pub fn events_after(&self, after: u64) -> Vec<(u64, Value)> {
        self.events_page(after, usize::MAX)
    }

    /// At most `limit` of the task's events after sequence number `after`: a follower
    /// copies one page at a time, not the whole log (up to the event budget) at once.
    pub fn events_page(&self, after: u64, limit: usize) -> Vec<(u64, Value)> {
        let inner = self.inner.lock().unwrap();
        let from = usize::try_from(after).unwrap_or(usize::MAX).min(inner.events.len());
        inner.events[from..].iter().take(limit).enumerate().map(|(i, e)| ((from + i) as u64 + 1, e.clone())).collect()
    }

    /// How many approval requests the task and every nested subagent below it have made:
    /// a client answering without naming a request answers the only question ever asked
    /// in the chain, never one it was not shown.
    pub fn questions_asked(&self) -> u64 {
        self.questions.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How many events the task has (the sequence number of its last one).
    pub fn event_count(&self) -> u64 {
        self.inner.lock().unwrap().events.len() as u64
    }

    /// A receiver that changes whenever the task does.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Queues `rec` (the task's record as it is now) for the store and tells followers
    /// of the engine's task list; no follower is fine.
    pub(super) fn save_record(&self, rec: TaskRecord) {
        if self.relinquished.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let change = shared_if_followed(&self.changes, &rec);
        self.store.write(Write::Task(rec));
        if let Some(change) = change {
            let _ = self.changes.send(change);
        }
    }

    pub(super) fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }

    pub(super) fn scrub(&self, text: &str) -> String {
        self.redactor().scrub(text).into_owned()
    }

    /// The redactor of the task's session as it is now: every secret given to any task
    /// of the session so far (later tasks of the session may add more).
    pub fn redactor(&self) -> Arc<Redactor> {
        crate::redact::registry().session(&self.session.0, &self.session.1)
    }

    /// Passes streamed text (`token`, `reasoning`) through its stream's scrubber; what
    /// may not be shown yet is held. Returns the event to append, if any text is ready.
    pub(super) fn stream_text(
        &self,
        plugin: &str,
        kind: &str,
        mut event: serde_json::Map<String, Value>,
    ) -> Option<Value> {
        let Some(Value::String(text)) = event.get("text") else { return Some(Value::Object(event)) };
        let ready = {
            let mut streams = self.streams.lock().unwrap();
            streams.entry((plugin.to_owned(), kind.to_owned())).or_default().push(&self.redactor(), text)
        };
        if ready.is_empty() {
            return None;
        }
        event.insert("text".into(), Value::String(ready));
        Some(Value::Object(event))
    }

    /// Emits every held stream tail (before any other event, and at the end).
    pub(super) fn flush_streams(&self) {
        let held: Vec<((String, String), String)> = {
            let mut streams = self.streams.lock().unwrap();
            let redactor = self.redactor();
            std::mem::take(&mut *streams).into_iter().map(|(k, mut s)| (k, s.finish(&redactor))).collect()
        };
        let name = self.inner.lock().unwrap().record.subagent_type.clone();
        for ((plugin, kind), text) in held {
            if !text.is_empty() {
                self.push(json!({ "type": kind, "text": text, "name": name, "plugin": plugin, "source": "plugin" }));
            }
        }
    }

    /// Appends an event (scrubbed of secrets) and queues it for the store: the one way into
    /// a task's stream, where its [`EventBudget`] holds (past it, the event is dropped and
    /// the first one dropped leaves an `events_dropped` marker).
    pub(super) fn push(&self, mut event: Value) {
        if self.relinquished.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        self.redactor().scrub_value(&mut event);
        bound_approval_input(&mut event);
        let size = json_len(&event);
        let (task_id, appended) = {
            let mut inner = self.inner.lock().unwrap();
            let Admit { markers, keep } = inner.stored.admit(&self.event_budget, &event, size);
            for marker in &markers {
                tracing::warn!(task_id = %inner.record.task_id, limit = %marker["limit"], "task event budget reached; later events dropped");
            }
            let appended: Vec<(u64, Value)> = markers
                .into_iter()
                .chain(keep.then_some(event))
                .map(|event| {
                    inner.events.push(event.clone());
                    (inner.events.len() as u64, event)
                })
                .collect();
            (inner.record.task_id.clone(), appended)
        };
        if appended.is_empty() {
            return;
        }
        for (seq, event) in appended {
            self.store.write(Write::Event { task_id: task_id.clone(), seq, event });
        }
        self.bump();
    }

    pub(super) fn set_status(&self, status: TaskState) {
        let rec = {
            let mut inner = self.inner.lock().unwrap();
            if inner.record.is_finished() || inner.record.status == status {
                return;
            }
            inner.record.status = status;
            inner.record.updated_at_ms = now_ms();
            inner.record.clone()
        };
        self.save_record(rec);
        self.push(json!({ "type": "status", "status": status }));
    }

    pub(super) fn request_cancel(&self) {
        self.canceled.send_replace(true);
    }

    /// Resolves once the task is canceled.
    pub(super) async fn canceled(&self) {
        let mut rx = self.canceled.subscribe();
        // The sender lives in `self`: `wait_for` cannot fail while we are borrowed.
        let _ = rx.wait_for(|c| *c).await;
    }

    /// Waits until the task finishes or `timeout` passes; returns the record either way.
    pub async fn wait_finished(&self, timeout: Duration) -> TaskRecord {
        let mut rx = self.watch();
        let until = tokio::time::Instant::now() + timeout;
        loop {
            let rec = self.record();
            if rec.is_finished() {
                return rec;
            }
            match tokio::time::timeout_at(until, rx.changed()).await {
                Ok(Ok(())) => continue,
                _ => return self.record(),
            }
        }
    }

    /// Resolves with the final record once the task has finished.
    pub(super) async fn finished(&self) -> TaskRecord {
        let mut rx = self.watch();
        loop {
            let rec = self.record();
            if rec.is_finished() || rx.changed().await.is_err() {
                return rec;
            }
        }
    }

    /// One event of the running task, into its stream (and the task's state).
    pub(super) fn task_event(&self, ev: TaskEvent) {
        if let TaskEvent::Barrier(barrier) = &ev {
            // Everything sent before it has been pushed (queued for the store) above.
            self.flush_streams();
            return barrier.pass();
        }
        let subagent = self.inner.lock().unwrap().record.subagent_type.clone();
        match &ev {
            // Queued while the call ran: recorded even if the call has ended since (the
            // pump drains the channel before the task's `finish`).
            TaskEvent::Gate { change, .. } => {
                let change = *change;
                return self.record_gate_event(ev.into_json(&subagent), change);
            }
            TaskEvent::Host(HostEvent::PluginBuild(build)) => {
                // The task's record names the plugin build that runs it.
                let rec = {
                    let mut inner = self.inner.lock().unwrap();
                    inner.record.plugin = Some(build.clone());
                    inner.record.clone()
                };
                self.save_record(rec);
            }
            _ => {}
        }
        if let Some((plugin, kind)) = ev.text_stream() {
            let (plugin, kind) = (plugin.to_owned(), kind.to_owned());
            if let Value::Object(out) = ev.into_json(&subagent)
                && let Some(ev) = self.stream_text(&plugin, &kind, out)
            {
                self.push(ev);
            }
            return;
        }
        self.flush_streams();
        self.push(ev.into_json(&subagent));
    }
}

impl LiveTask {
    /// A gate event that did not travel through the call's event channel: dropped once
    /// the task is closing (nothing of the call can be waiting any more).
    pub(super) fn gate_event(&self, event: Value, change: GateChange) {
        if self.inner.lock().unwrap().closed {
            return;
        }
        self.record_gate_event(event, change);
    }

    /// Regression: the decision of a quickly declined call was still in the channel when
    /// the call ended, and was dropped as "late": the stream showed the request and the
    /// call's result, never the decision.
    pub(super) fn record_gate_event(&self, event: Value, change: GateChange) {
        self.flush_streams();
        self.push(event);
        let now_waiting = {
            let mut inner = self.inner.lock().unwrap();
            match change {
                GateChange::Requested => inner.pending_approvals += 1,
                GateChange::Resolved => inner.pending_approvals = inner.pending_approvals.saturating_sub(1),
            }
            inner.pending_approvals > 0
        };
        self.set_status(if now_waiting { TaskState::InputRequired } else { TaskState::Working });
    }
}

/// `rec` as a change to send on `changes`, or `None` when no one follows the task list
/// (the common case: the record is then not copied on the task's path).
pub(super) fn shared_if_followed(
    changes: &tokio::sync::broadcast::Sender<Arc<TaskRecord>>,
    rec: &TaskRecord,
) -> Option<Arc<TaskRecord>> {
    (changes.receiver_count() > 0).then(|| Arc::new(rec.clone()))
}

#[cfg(test)]
impl LiveTask {
    /// A live task of its own (not run by an engine): `user`'s, taking a share of the
    /// user's tasks when `counts_for_user`, holding to `budget`, recording into `store`.
    pub(super) fn detached(user: &str, counts_for_user: bool, budget: EventBudget, store: Store) -> Arc<LiveTask> {
        let record = TaskRecord::submitted(
            "task_live_test".into(),
            &crate::plugin::TaskCall::default(),
            "s1".into(),
            user.into(),
            None,
            now_ms(),
        );
        Arc::new(LiveTask {
            session: (record.user_id.clone(), record.session_id.clone()),
            counts_for_user,
            inner: Mutex::new(Inner {
                record,
                events: vec![],
                stored: EventsStored::default(),
                pending_approvals: 0,
                sink: None,
                closed: false,
            }),
            version: watch::channel(0).0,
            canceled: watch::channel(false).0,
            streams: Mutex::new(BTreeMap::new()),
            tool_budget: None,
            event_budget: budget,
            store,
            changes: tokio::sync::broadcast::channel(1).0,
            finishing: std::sync::atomic::AtomicBool::new(false),
            questions: std::sync::atomic::AtomicU64::new(0),
            driver: Mutex::new(None),
            relinquished: std::sync::atomic::AtomicBool::new(false),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What [`LiveTask::push`] keeps of `events` (type, text) under `budget`.
    fn kept(budget: EventBudget, events: &[(String, String)]) -> Vec<Value> {
        let mut stored = EventsStored::default();
        let mut out = vec![];
        for (kind, text) in events {
            let event = json!({ "type": kind, "text": text });
            let size = json_len(&event);
            let Admit { markers, keep } = stored.admit(&budget, &event, size);
            out.extend(markers);
            if keep {
                out.push(event);
            }
        }
        out
    }

    /// A live task of its own (not run by an engine) holding to `budget`.
    fn live_task(budget: EventBudget) -> Arc<LiveTask> {
        LiveTask::detached("u1", true, budget, Store::in_memory().unwrap())
    }

    /// An `approval_request` event of the gate for a call with `input`.
    fn approval_request(n: usize, input: Value) -> Value {
        json!({
            "type": "approval_request", "id": format!("apr_{n}"), "tool": "Bash", "input": input,
            "subagent": "worker", "task_id": "task_live_test", "reason": "asked", "scopes": ["once"],
        })
    }

    /// Regression: approval events were stored whatever the budget, each request with its
    /// call's whole input (up to 1 MiB, 64 calls a batch). A plugin whose calls were
    /// declined at once looped: a task's events grew by gigabytes. Now every stored request
    /// carries at most [`MAX_APPROVAL_EVENT_INPUT`] characters of input, marked as cut, and
    /// all of a task's events stay within its budget plus [`APPROVALS_PAST_BUDGET`].
    #[tokio::test]
    async fn regression_approval_events_cannot_exceed_the_event_budget_by_their_input() {
        let budget = EventBudget { max_events: 1_000, max_bytes: 256 * 1024 };
        let live = live_task(budget);
        let big = json!({ "command": format!("echo {}", "x".repeat(64 * 1024)) });
        // Ten batches of 64 asking calls, each declined at once.
        for round in 0..10 {
            for i in 0..64 {
                let n = round * 64 + i;
                live.record_gate_event(approval_request(n, big.clone()), GateChange::Requested);
                let resolved = json!({ "type": "approval_resolved", "request_id": format!("apr_{n}"),
                    "task_id": "task_live_test", "decision": "decline", "decided_by": "disconnect" });
                live.record_gate_event(resolved, GateChange::Resolved);
            }
        }
        let events: Vec<Value> = live.events_after(0).into_iter().map(|(_, e)| e).collect();
        let requests: Vec<&Value> = events.iter().filter(|e| e["type"] == "approval_request").collect();
        assert!(!requests.is_empty());
        for r in &requests {
            let input = r["input"].as_str().expect("a long input is cut to a string");
            assert_eq!(input.chars().count(), MAX_APPROVAL_EVENT_INPUT);
            assert!(big.to_string().starts_with(input));
            assert_eq!((&r["input_cut"], &r["input_length"]), (&json!(true), &json!(big.to_string().len())));
        }
        let markers: Vec<&Value> = events.iter().filter(|e| e["type"] == "events_dropped").collect();
        let marked: u64 = markers.iter().map(|m| json_len(m)).sum();
        let total: u64 = events.iter().map(json_len).sum();
        assert!(
            total <= budget.max_bytes + APPROVALS_PAST_BUDGET.max_bytes + marked,
            "{total} bytes of events stored for a budget of {} bytes",
            budget.max_bytes
        );
        assert!(events.len() as u64 <= budget.max_events + APPROVALS_PAST_BUDGET.max_events + markers.len() as u64);
        let limits: Vec<&str> = markers.iter().map(|m| m["limit"].as_str().unwrap()).collect();
        assert_eq!(limits, ["server.max_event_bytes_per_task", APPROVALS_PAST_BUDGET_NAME]);
        // What the store has is what the stream had.
        live.store.flush().await.unwrap();
        let stored = live.store.events_after("task_live_test", 0).await.unwrap();
        assert_eq!(stored.len(), events.len());
    }

    /// Characters to build inputs of: ASCII, a quote and a backslash (escaped in JSON), a
    /// control character (escaped by questions), 2- and 4-byte characters.
    fn input_text() -> impl Strategy<Value = String> {
        (
            proptest::collection::vec(
                prop_oneof![Just('a'), Just('"'), Just('\\'), Just('\u{1}'), Just('é'), Just('😀')],
                1..6,
            ),
            0usize..7000,
        )
            .prop_map(|(pattern, n)| pattern.iter().cycle().take(pattern.len() * n).collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Read page by page from any sequence number, a task's events are every event after
        /// it, once each, in order, with their sequence numbers — whatever the page size.
        #[test]
        fn pages_of_events_are_the_events_after(n in 0usize..40, after in 0u64..45, page in 1usize..9) {
            let live = live_task(EventBudget::default());
            live.inner.lock().unwrap().events = (0..n).map(|i| json!({ "type": "progress", "n": i })).collect();
            let mut read = vec![];
            let mut next = after;
            loop {
                let got = live.events_page(next, page);
                prop_assert!(got.len() <= page);
                let more = got.len() == page;
                if let Some((seq, _)) = got.last() {
                    next = *seq;
                }
                read.extend(got);
                if !more {
                    break;
                }
            }
            prop_assert_eq!(&read, &live.events_after(after));
            let expected: Vec<u64> = ((after + 1)..=(n as u64)).collect();
            prop_assert_eq!(read.iter().map(|(seq, _)| *seq).collect::<Vec<_>>(), expected);
            for (seq, ev) in &read {
                prop_assert_eq!(&ev["n"], &json!(*seq - 1));
            }
            prop_assert_eq!(live.event_count(), n as u64);
        }

        /// Whatever the input: a request event carries it whole exactly when its JSON text
        /// has at most [`MAX_APPROVAL_EVENT_INPUT`] characters — so every input an approval
        /// question could show whole (the server's bound, asserted at compile time) — and otherwise
        /// the text's first that many characters, marked as cut with the whole length.
        #[test]
        fn an_approval_event_carries_its_input_whole_or_marked_as_cut(text in input_text(), nested in any::<bool>()) {
            let input = if nested { json!({ "command": text, "n": [1, 2] }) } else { Value::String(text) };
            let mut event = approval_request(1, input.clone());
            bound_approval_input(&mut event);
            let whole = input.to_string();
            let length = whole.chars().count();
            if length <= MAX_APPROVAL_EVENT_INPUT {
                prop_assert_eq!(&event["input"], &input);
                prop_assert!(event.get("input_cut").is_none());
            } else {
                let cut = event["input"].as_str().unwrap();
                prop_assert_eq!(cut.chars().count(), MAX_APPROVAL_EVENT_INPUT);
                prop_assert!(whole.starts_with(cut));
                prop_assert_eq!(&event["input_cut"], &json!(true));
                prop_assert_eq!(&event["input_length"], &json!(length));
            }
            // The other events are left as they are.
            let mut other = json!({ "type": "tool_call", "input": input.clone() });
            bound_approval_input(&mut other);
            prop_assert_eq!(&other["input"], &input);
        }
    }

    proptest! {
        /// Regression: a task stored and streamed every event it was sent (a plugin's
        /// per-call budget aside, host tool events and every call of a resumed task added
        /// up without limit). Whatever the events, a task keeps at most its budget, one
        /// marker naming the limit's key, and its `finish`.
        #[test]
        fn regression_a_task_keeps_at_most_its_event_budget(
            max_events in 0u64..40,
            max_bytes in 0u64..4000,
            events in proptest::collection::vec(
                (
                    prop_oneof![
                        Just("token"),
                        Just("tool_result"),
                        Just("status"),
                        Just("progress"),
                        Just("approval_request"),
                        Just("approval_resolved"),
                    ],
                    ".{0,300}",
                ),
                0..120,
            ),
            finish in any::<bool>(),
        ) {
            let budget = EventBudget { max_events, max_bytes };
            let mut events: Vec<(String, String)> = events.into_iter().map(|(k, t)| (k.to_owned(), t)).collect();
            if finish {
                events.push(("finish".into(), "done".into()));
            }
            let out = kept(budget, &events);
            let markers: Vec<&Value> = out.iter().filter(|e| e["type"] == "events_dropped").collect();
            let always = |e: &Value| ALWAYS_STORED.iter().any(|t| e["type"] == *t);
            let ordinary: Vec<&Value> = out.iter().filter(|e| e["type"] != "events_dropped" && !always(e)).collect();
            // Regression: once tool output filled the budget, later approval requests were
            // dropped, so watchers were never asked. Every one is kept, in order.
            let questions = |v: Vec<&Value>| v.into_iter().filter(|e| e["type"] != FINISH && always(e)).cloned().collect::<Vec<_>>();
            let sent: Vec<Value> = events.iter().map(|(k, t)| json!({ "type": k, "text": t })).collect();
            prop_assert_eq!(questions(out.iter().collect()), questions(sent.iter().collect()));
            prop_assert!(ordinary.len() as u64 <= max_events);
            prop_assert!(ordinary.iter().map(|e| json_len(e)).sum::<u64>() <= max_bytes);
            prop_assert!(markers.len() <= 1);
            if ordinary.len() + events.iter().filter(|(k, _)| ALWAYS_STORED.contains(&k.as_str())).count() < events.len() {
                prop_assert_eq!(markers.len(), 1, "events were dropped without a marker");
                let key = markers[0]["limit"].as_str().unwrap();
                prop_assert!(key == "server.max_events_per_task" || key == "server.max_event_bytes_per_task");
                prop_assert!(markers[0]["message"].as_str().unwrap().contains(key));
            }
            prop_assert_eq!(out.last().map(|e| e["type"] == FINISH).unwrap_or(false), finish, "finish is always kept, last");
        }
    }
}
