//! The component side: binds [`crate::exec`] to the warden plugin world (WIT 0.3.0)
//! through the `warden-guest` SDK, whose `clock` paces the backoff and keeps the deadline
//! reserve and whose `cancel` tells the executor the warden task was canceled.

use serde_json::Value;
use warden_guest::http::{self, BodyStream, Request, Response, StreamHead};
use warden_guest::{
    Capability, Error, Metadata, Plugin, PluginInfo, SubagentDefinition, SubagentReference, TaskCall, TaskContext,
    cancel, clock, events, log, state,
};

use crate::exec::{self, ChunkStream};

struct A2a;

impl ChunkStream for BodyStream {
    fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, Error> {
        BodyStream::next_chunk(self)
    }
}

/// The host imports as an [`exec::Host`].
struct Imports;

impl exec::Host for Imports {
    fn send(&mut self, req: Request) -> Result<Response, Error> {
        http::send(&req)
    }

    fn send_streaming(&mut self, req: Request) -> Result<(StreamHead, Box<dyn ChunkStream>), Error> {
        let (head, body) = http::send_streaming(&req)?;
        Ok((head, Box::new(body)))
    }

    fn emit(&mut self, kind: &str, data: &Value) {
        let _ = events::emit(kind, data);
    }

    fn state_get(&mut self, key: &str) -> Result<Option<Vec<u8>>, Error> {
        state::get(key)
    }

    fn state_set(&mut self, key: &str, value: &[u8]) -> Result<(), Error> {
        state::set(key, value)
    }

    fn state_delete(&mut self, key: &str) {
        let _ = state::delete(key);
    }

    fn now_ms(&mut self) -> u64 {
        clock::now_ms()
    }

    fn sleep_ms(&mut self, ms: u64) -> Result<(), Error> {
        clock::sleep(ms)
    }

    fn canceled(&mut self) -> bool {
        cancel::is_canceled()
    }

    fn log(&mut self, message: &str) {
        log::debug(message);
    }
}

impl Plugin for A2a {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "a2a".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            kinds: vec!["A2A".into()],
            capabilities: vec![Capability::Http, Capability::Events, Capability::State, Capability::Log],
        }
    }

    fn can_resolve(reference: SubagentReference) -> bool {
        reference.kind.eq_ignore_ascii_case("A2A")
    }

    fn resolve(reference: SubagentReference) -> Result<SubagentDefinition, Error> {
        let (info, card_url) = exec::resolve(&mut Imports, &reference.uri, &reference.metadata)?;
        let meta = Metadata::new(&reference.metadata);
        let name = meta.get("name").map(str::to_string).unwrap_or_else(|| info.name.clone());
        let description = meta.get("description").map(str::to_string).unwrap_or_else(|| info.description.clone());
        Ok(SubagentDefinition {
            name,
            description,
            kind: "A2A".into(),
            tools: None,
            permission_mode: None,
            mcp_servers: vec![],
            agent_mcp_servers: vec![],
            egress: None,
            protocol_data: exec::protocol_data(&info, &card_url),
            reference,
        })
    }

    fn execute(ctx: TaskContext, call: TaskCall, definition: SubagentDefinition) -> Result<String, Error> {
        let plan = exec::Plan::from_definition(&definition.protocol_data, &definition.reference.metadata)?;
        let call = exec::Call {
            task_id: &ctx.task_id,
            prompt: &call.prompt,
            resume: call.resume.as_deref().filter(|r| !r.is_empty()),
            deadline_ms: ctx.deadline_ms,
        };
        exec::execute(&mut Imports, plan, &call)
    }
}

warden_guest::export!(A2a);
