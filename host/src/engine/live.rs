//! One task the engine runs: its record and events in memory ([`LiveTask`]), the
//! turning of [`TaskEvent`]s into its stream (scrubbed of the session's secrets, streamed
//! text through a [`StreamScrubber`] per stream), its status while approvals wait, and
//! the signals that stop it. It never decides how a task ends; [`super::Engine`] does.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;

use crate::event::{EventSink, GateChange, HostEvent, TaskEvent};
use crate::redact::{Redactor, StreamScrubber};
use crate::store::{Store, TaskRecord, Write, now_ms};
use crate::task_state::TaskState;

pub(super) struct Inner {
    pub(super) record: TaskRecord,
    pub(super) events: Vec<Value>,
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
    /// Held tails of streamed text, per (plugin, kind).
    pub(super) streams: Mutex<BTreeMap<(String, String), StreamScrubber>>,
    /// The task's tool-call budget (`max_tool_iterations`); `None` = unlimited.
    pub(super) tool_budget: Option<Arc<crate::tools::ToolBudget>>,
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

    /// Appends an event (scrubbed of secrets) and queues it for the store.
    pub(super) fn push(&self, mut event: Value) {
        self.redactor().scrub_value(&mut event);
        let (task_id, seq) = {
            let mut inner = self.inner.lock().unwrap();
            inner.events.push(event.clone());
            (inner.record.task_id.clone(), inner.events.len() as u64)
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
