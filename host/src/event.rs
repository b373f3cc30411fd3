//! Task events: the one typed vocabulary for what happens inside a running task, sent
//! down the task's bounded channel ([`EventSink`]) by whoever saw it — the plugin's
//! `events.emit`, the model import streaming text, the tool host, the approval gate, the
//! host itself — and turned into the task's JSON stream by the engine alone.
//!
//! Who sent an event is its variant, never a string: a plugin cannot produce a
//! [`TaskEvent::Tool`], [`TaskEvent::Gate`] or [`TaskEvent::Host`] (the runtime only ever
//! wraps what a plugin emits in [`TaskEvent::Plugin`], whose kind `events.emit` has already
//! checked against [`crate::plugin::HOST_EVENT_KINDS`]). This module holds data only.

use serde_json::Value;
use tokio::sync::mpsc;

use crate::plugin::{PluginEvent, PluginRef, is_host_event_kind};

/// Where a task's events go. Bounded: a plugin that floods is told so, the host never
/// buffers without limit.
pub type EventSink = mpsc::Sender<TaskEvent>;

/// One thing that happened in a task.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskEvent {
    /// A plugin's own event (`events.emit`): never one of the host's kinds.
    Plugin(PluginEvent),
    /// Model text streamed while a plugin's `model.complete` runs.
    Model { plugin: String, stream: ModelStream, text: String },
    /// The tool host about one tool call of `plugin`'s.
    Tool { plugin: String, event: ToolEvent },
    /// The approval gate: a request opened for one of the task's calls, or resolved.
    Gate { change: GateChange, data: Value },
    /// The host's own notes about the task.
    Host(HostEvent),
    /// Not an event: a marker the engine answers once every event sent before it is
    /// queued for the store (a durable task's journal is written after its events).
    Barrier(EventBarrier),
}

/// See [`TaskEvent::Barrier`]: passed by whoever drains the task's channel.
#[derive(Clone)]
pub struct EventBarrier(std::sync::Arc<std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>>);

impl EventBarrier {
    /// A barrier, and what is answered when it is passed (or dropped unpassed).
    pub fn new() -> (EventBarrier, tokio::sync::oneshot::Receiver<()>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (EventBarrier(std::sync::Arc::new(std::sync::Mutex::new(Some(tx)))), rx)
    }

    /// Everything sent before it is queued.
    pub fn pass(&self) {
        if let Some(tx) = self.0.lock().unwrap().take() {
            let _ = tx.send(());
        }
    }
}

impl std::fmt::Debug for EventBarrier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventBarrier")
    }
}

impl PartialEq for EventBarrier {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Kinds whose `text` streams in chunks: scrubbed by a stream scrubber (a secret may be
/// split over chunks) rather than event by event.
pub const STREAMED_KINDS: [&str; 2] = ["token", "reasoning"];

impl TaskEvent {
    /// `(plugin, kind)` when this event's `text` is streamed text (see [`STREAMED_KINDS`]).
    pub fn text_stream(&self) -> Option<(&str, &str)> {
        match self {
            TaskEvent::Model { plugin, stream, .. } => Some((plugin, stream.kind())),
            TaskEvent::Plugin(ev) => STREAMED_KINDS.iter().find(|k| **k == ev.kind).map(|k| (ev.plugin.as_str(), *k)),
            _ => None,
        }
    }

    /// The event as the task's stream shows it: `type`, its fields, `name` (the subagent,
    /// unless the event names one) and `plugin`; events a plugin produced carry
    /// `source: plugin`, and a plugin kind that collides with a host kind is shown as
    /// `subagent_<kind>` (a plugin cannot fake the end of a stream or a decision).
    pub fn into_json(self, subagent: &str) -> Value {
        let (kind, plugin, data, from_plugin) = match self {
            TaskEvent::Gate { data, .. } => return data,
            // Never shown: the engine passes it before anything is turned into JSON.
            TaskEvent::Barrier(_) => return Value::Null,
            TaskEvent::Host(HostEvent::Takeover(data)) => {
                let plugin = data["plugin"].as_str().unwrap_or_default().to_owned();
                ("takeover".to_owned(), plugin, data, false)
            }
            TaskEvent::Plugin(ev) => {
                let kind = if is_host_event_kind(&ev.kind) { format!("subagent_{}", ev.kind) } else { ev.kind };
                (kind, ev.plugin, ev.data, true)
            }
            TaskEvent::Model { plugin, stream, text } => {
                (stream.kind().to_owned(), plugin, serde_json::json!({ "text": text }), true)
            }
            TaskEvent::Tool { plugin, event } => (event.kind().to_owned(), plugin, event.into_data(), false),
            TaskEvent::Host(HostEvent::PluginBuild(build)) => {
                let plugin = build.id.clone();
                ("plugin".to_owned(), plugin, serde_json::to_value(build).unwrap_or_default(), false)
            }
        };
        let mut out = serde_json::Map::new();
        out.insert("type".into(), Value::String(kind));
        match data {
            Value::Object(m) => {
                for (k, v) in m {
                    if k != "type" && !v.is_null() && v != Value::String(String::new()) {
                        out.insert(k, v);
                    }
                }
            }
            Value::Null => {}
            other => {
                out.insert("data".into(), other);
            }
        }
        out.entry("name").or_insert(Value::String(subagent.to_owned()));
        out.insert("plugin".into(), Value::String(plugin));
        if from_plugin {
            out.insert("source".into(), Value::String("plugin".into()));
        }
        Value::Object(out)
    }
}

/// Which text a model streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelStream {
    Token,
    Reasoning,
}

impl ModelStream {
    /// The stream event's `type`.
    pub fn kind(self) -> &'static str {
        match self {
            ModelStream::Token => "token",
            ModelStream::Reasoning => "reasoning",
        }
    }
}

/// What the tool host reports; each carries the event's fields.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolEvent {
    /// A call about to be judged and run (`tool_call`).
    Call(Value),
    /// Its result, or why it did not run (`tool_result`).
    Result(Value),
    /// A connection the session's egress proxy allowed or refused while the call ran.
    Egress(Value),
    /// An allowed `Agent` call started a child task (`subagent`): its id, so a follower
    /// can open the child's stream.
    Subagent(Value),
}

impl ToolEvent {
    /// The stream event's `type`.
    pub fn kind(&self) -> &'static str {
        match self {
            ToolEvent::Call(_) => "tool_call",
            ToolEvent::Result(_) => "tool_result",
            ToolEvent::Egress(_) => "egress",
            ToolEvent::Subagent(_) => "subagent",
        }
    }

    pub fn into_data(self) -> Value {
        match self {
            ToolEvent::Call(d) | ToolEvent::Result(d) | ToolEvent::Egress(d) | ToolEvent::Subagent(d) => d,
        }
    }
}

/// How an approval request changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateChange {
    /// A request opened: the task now waits on a person (`approval_request`).
    Requested,
    /// A request was decided, timed out or withdrawn (`approval_resolved`).
    Resolved,
}

impl GateChange {
    /// The stream event's `type`.
    pub const fn kind(self) -> &'static str {
        match self {
            GateChange::Requested => "approval_request",
            GateChange::Resolved => "approval_resolved",
        }
    }
}

/// The host's own notes.
#[derive(Debug, Clone, PartialEq)]
pub enum HostEvent {
    /// Which plugin build runs the task (`plugin`).
    PluginBuild(PluginRef),
    /// The task moved to this process after its previous one died (`takeover`): from
    /// where, and how many journal entries were replayed.
    Takeover(Value),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever kind and fields a plugin emits, its event is marked as the plugin's and
    /// never takes a host event's type.
    #[test]
    fn a_plugin_event_never_reads_as_a_host_event() {
        for kind in crate::plugin::HOST_EVENT_KINDS.iter().copied().chain(["progress", "Tool_Call", "FINISH"]) {
            let data = serde_json::json!({ "type": "finish", "source": "host", "plugin": "other", "x": 1 });
            let ev = TaskEvent::Plugin(PluginEvent { plugin: "p".into(), kind: kind.into(), data });
            let json = ev.into_json("agent");
            let ty = json["type"].as_str().unwrap();
            assert!(!is_host_event_kind(ty), "{kind} -> {ty}");
            assert_eq!((json["source"].as_str(), json["plugin"].as_str()), (Some("plugin"), Some("p")), "{json}");
            assert_eq!(json["name"], "agent");
        }
    }

    #[test]
    fn host_events_carry_their_type_and_no_plugin_source() {
        let call =
            TaskEvent::Tool { plugin: "p".into(), event: ToolEvent::Call(serde_json::json!({ "name": "Bash" })) };
        let json = call.into_json("agent");
        assert_eq!((json["type"].as_str(), json["name"].as_str()), (Some("tool_call"), Some("Bash")));
        assert!(json.get("source").is_none());
        let build = PluginRef { id: "claude".into(), version: "1".into(), sha256: "ab".into() };
        let json = TaskEvent::Host(HostEvent::PluginBuild(build)).into_json("agent");
        assert_eq!((json["type"].as_str(), json["plugin"].as_str()), (Some("plugin"), Some("claude")));
    }
}
