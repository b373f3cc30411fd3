//! One task the engine runs: its record and events in memory ([`LiveTask`]), the
//! turning of [`TaskEvent`]s into its stream (scrubbed of the session's secrets, streamed
//! text through a [`StreamScrubber`] per stream), its status while approvals wait, and
//! the signals that stop it. It never decides how a task ends; [`super::Engine`] does.
//!
//! Every event a task stores and streams — its plugin's, the tool host's, the gate's, the
//! host's own — passes [`LiveTask::push`], which holds the task to its [`EventBudget`].

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
/// later question, and watchers would never be asked). They come at the gate's pace — each
/// request waits on a person or its timeout, at most one per tool call — not a plugin's.
const ALWAYS_STORED: [&str; 3] = [FINISH, GateChange::Requested.kind(), GateChange::Resolved.kind()];

/// How much of its [`EventBudget`] a task has used.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct EventsStored {
    count: u64,
    bytes: u64,
    /// The budget ran out (and the `events_dropped` marker was stored).
    over: bool,
}

impl EventsStored {
    /// What `events` (a task's events so far) use.
    pub(super) fn of(events: &[Value]) -> Self {
        EventsStored { count: events.len() as u64, bytes: events.iter().map(json_len).sum(), over: false }
    }

    /// Whether an event of `size` bytes fits; the first that does not yields the marker to
    /// store in its place. The [`ALWAYS_STORED`] types always fit.
    fn admit(&mut self, budget: &EventBudget, event: &Value, size: u64) -> Admit {
        if event.get("type").and_then(Value::as_str).is_some_and(|t| ALWAYS_STORED.contains(&t)) {
            return Admit::Store;
        }
        if self.over {
            return Admit::Drop;
        }
        let limit = if self.count + 1 > budget.max_events {
            Some(("server.max_events_per_task", budget.max_events, "events"))
        } else if self.bytes.saturating_add(size) > budget.max_bytes {
            Some(("server.max_event_bytes_per_task", budget.max_bytes, "bytes of events"))
        } else {
            None
        };
        match limit {
            None => {
                self.count += 1;
                self.bytes += size;
                Admit::Store
            }
            Some((key, value, what)) => {
                self.over = true;
                Admit::DropAfter(json!({
                    "type": "events_dropped",
                    "limit": key,
                    "value": value,
                    "message": format!(
                        "this task reached its limit of {value} {what} ({key}); its later events are not stored or streamed"
                    ),
                }))
            }
        }
    }
}

enum Admit {
    Store,
    Drop,
    /// Drop the event; store this marker instead.
    DropAfter(Value),
}

/// The length of `v` as JSON, without building the text.
fn json_len(v: &Value) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a `Value` into a sink that never fails cannot fail.
    let _ = serde_json::to_writer(&mut count, v);
    count.0
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
    /// Aborts the task's driver (cancel uses it when the driver does not wind down).
    pub(super) driver: Mutex<Option<tokio::task::AbortHandle>>,
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
        let inner = self.inner.lock().unwrap();
        inner.events.iter().enumerate().skip(after as usize).map(|(i, e)| (i as u64 + 1, e.clone())).collect()
    }

    /// A receiver that changes whenever the task does.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Queues `rec` (the task's record as it is now) for the store and tells followers
    /// of the engine's task list; no follower is fine.
    pub(super) fn save_record(&self, rec: TaskRecord) {
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
        self.redactor().scrub_value(&mut event);
        let size = json_len(&event);
        let (task_id, seq, event) = {
            let mut inner = self.inner.lock().unwrap();
            let event = match inner.stored.admit(&self.event_budget, &event, size) {
                Admit::Store => event,
                Admit::Drop => return,
                Admit::DropAfter(marker) => {
                    tracing::warn!(task_id = %inner.record.task_id, limit = %marker["limit"], "task event budget reached; later events dropped");
                    marker
                }
            };
            inner.events.push(event.clone());
            (inner.record.task_id.clone(), inner.events.len() as u64, event)
        };
        self.store.write(Write::Event { task_id, seq, event });
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
            match stored.admit(&budget, &event, size) {
                Admit::Store => out.push(event),
                Admit::Drop => {}
                Admit::DropAfter(marker) => out.push(marker),
            }
        }
        out
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
