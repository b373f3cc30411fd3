//! `events`: progress events into the task's stream; host kinds refused, budgeted per call,
//! scrubbed of the task's secrets (every one of its session's `tool_context` values and the
//! host's) before they leave the call.

use super::super::bindings::latest::events;
use super::journal::{Durability, Interrupted};
use super::{Error, HostState, ImportError, bounded, floor_char_boundary, over_budget};
use crate::capability::Capability;
use crate::event::TaskEvent;
use crate::journal::Import;
use crate::plugin::PluginEvent;
use crate::services::{MAX_EVENT_BYTES, MAX_EVENT_KIND_BYTES};

impl HostState {
    /// `events.emit` (the WIT error is made of its error by [`super::to_plugin`]).
    async fn events_emit(&mut self, kind: String, data: String) -> Result<(), Error> {
        self.check(Capability::Events)?;
        bounded("event data (bytes)", data.len(), MAX_EVENT_BYTES)?;
        if kind.is_empty()
            || kind.len() > MAX_EVENT_KIND_BYTES
            || !kind.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            let shown =
                crate::text::escape_control(&kind[..floor_char_boundary(&kind, MAX_EVENT_KIND_BYTES)]).into_owned();
            return Err(Error::InvalidInput(format!(
                "event kind {shown:?} must be 1-{MAX_EVENT_KIND_BYTES} characters of [A-Za-z0-9_]"
            )));
        }
        if crate::plugin::is_host_event_kind(&kind) {
            return Err(Error::Denied(format!(
                "event kind {kind:?} is reserved for the host ({}); use another name, e.g. `progress`",
                crate::plugin::HOST_EVENT_KINDS.join(", ")
            )));
        }
        let budgets = self.scope.services.budgets;
        if self.usage.events >= budgets.max_events_per_call {
            return Err(over_budget("events", budgets.max_events_per_call.into(), "max_events_per_call"));
        }
        if self.usage.event_bytes + data.len() as u64 > budgets.max_event_bytes_per_call {
            return Err(over_budget("event bytes", budgets.max_event_bytes_per_call, "max_event_bytes_per_call"));
        }
        let raw_len = data.len() as u64;
        let mut data: serde_json::Value = serde_json::from_str(&data)
            .map_err(|e| Error::InvalidInput(format!("event data must be a JSON object: {e}")))?;
        if !data.is_object() {
            return Err(Error::InvalidInput("event data must be a JSON object".into()));
        }
        let secrets = self.scope.redactor();
        if secrets.finds(kind.as_bytes()) {
            return Err(Error::Denied("the event kind is a secret of this task".into()));
        }
        // Every string and key, with all the task's secrets (the engine scrubs again).
        secrets.scrub_value(&mut data);
        self.usage.events += 1;
        self.usage.event_bytes += raw_len;
        let Some(sink) = self.scope.events() else { return Ok(()) };
        let event = TaskEvent::Plugin(PluginEvent { plugin: self.scope.plugin.to_string(), kind, data });
        sink.send(event).await.map_err(|_| Error::Unavailable("the task's event stream is closed".into()))
    }
}

impl events::Host for HostState {
    async fn emit(&mut self, kind: String, data: String) -> Result<(), ImportError> {
        let args = serde_json::json!({ "kind": &kind, "data": &data });
        self.journaled(Import::EventsEmit, args, Durability::Queued, Interrupted::Rerun, move |s| {
            Box::pin(s.events_emit(kind, data))
        })
        .await
    }
}
