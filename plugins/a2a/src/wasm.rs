//! The component side: binds [`crate::exec`] to the warden:plugin world (plus a
//! monotonic clock for backoff and the deadline reserve; see `wit/world.wit`).

wit_bindgen::generate!({
    path: ["../../wit", "wit"],
    world: "warden:a2a-plugin/a2a",
    generate_all,
});

use exports::warden::plugin::{executor, meta, resolver};
use warden::plugin::types::{
    Capability, Error, PluginInfo, SubagentDefinition, SubagentReference, TaskCall, TaskContext,
};
use warden::plugin::{events, http, log, state};
use wasi::clocks::monotonic_clock;

use crate::Failure;
use crate::exec::{self, ChunkStream, HttpRequest, HttpResponse};

struct A2a;

fn to_wit(f: Failure) -> Error {
    match f {
        Failure::NotFound(m) => Error::NotFound(m),
        Failure::InvalidInput(m) => Error::InvalidInput(m),
        Failure::Denied(m) => Error::Denied(m),
        Failure::Timeout(m) => Error::Timeout(m),
        Failure::Remote(m) => Error::Remote(m),
        Failure::Unavailable(m) => Error::Unavailable(m),
        Failure::InputRequired(m) => Error::InputRequired(m),
        Failure::Internal(m) => Error::Internal(m),
    }
}

fn from_wit(e: Error) -> Failure {
    match e {
        Error::NotFound(m) => Failure::NotFound(m),
        Error::InvalidInput(m) => Failure::InvalidInput(m),
        Error::Denied(m) => Failure::Denied(m),
        Error::Timeout(m) => Failure::Timeout(m),
        Error::Remote(m) => Failure::Remote(m),
        Error::Unavailable(m) => Failure::Unavailable(m),
        Error::InputRequired(m) => Failure::InputRequired(m),
        Error::Internal(m) => Failure::Internal(m),
    }
}

fn wit_request(r: HttpRequest) -> http::Request {
    http::Request {
        method: r.method.to_string(),
        url: r.url,
        headers: r.headers,
        body: r.body,
        timeout_ms: r.timeout_ms,
        auth_secret: r.auth_secret,
    }
}

struct Stream(http::BodyStream);

impl ChunkStream for Stream {
    fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, Failure> {
        self.0.next().map_err(from_wit)
    }
}

/// The host imports as an [`exec::Host`].
struct Imports;

impl exec::Host for Imports {
    fn send(&mut self, req: HttpRequest) -> Result<HttpResponse, Failure> {
        let r = http::send(&wit_request(req)).map_err(from_wit)?;
        Ok(HttpResponse { status: r.status, headers: r.headers, body: r.body })
    }

    fn send_streaming(&mut self, req: HttpRequest) -> Result<(u16, Vec<(String, String)>, Box<dyn ChunkStream>), Failure> {
        let (head, body) = http::send_streaming(&wit_request(req)).map_err(from_wit)?;
        Ok((head.status, head.headers, Box::new(Stream(body))))
    }

    fn emit(&mut self, kind: &str, data: &serde_json::Value) {
        let _ = events::emit(kind, &data.to_string());
    }

    fn state_get(&mut self, key: &str) -> Result<Option<Vec<u8>>, Failure> {
        state::get(key).map_err(from_wit)
    }

    fn state_set(&mut self, key: &str, value: &[u8]) -> Result<(), Failure> {
        state::set(key, value).map_err(from_wit)
    }

    fn state_delete(&mut self, key: &str) {
        let _ = state::delete(key);
    }

    fn now_ms(&mut self) -> u64 {
        monotonic_clock::now() / 1_000_000
    }

    fn sleep_ms(&mut self, ms: u64) {
        monotonic_clock::subscribe_duration(ms * 1_000_000).block();
    }

    fn log(&mut self, message: &str) {
        let _ = log::write(log::Level::Debug, message);
    }
}

impl meta::Guest for A2a {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "a2a".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            kinds: vec!["A2A".into()],
            capabilities: vec![Capability::Http, Capability::Events, Capability::State, Capability::Log],
        }
    }
}

impl resolver::Guest for A2a {
    fn can_resolve(reference: SubagentReference) -> bool {
        reference.kind.eq_ignore_ascii_case("A2A")
    }

    fn resolve(reference: SubagentReference) -> Result<SubagentDefinition, Error> {
        let (info, card_url) = exec::resolve(&mut Imports, &reference.uri, &reference.metadata).map_err(to_wit)?;
        let name = crate::metadata(&reference.metadata, "name").map(str::to_string).unwrap_or_else(|| info.name.clone());
        let description = crate::metadata(&reference.metadata, "description")
            .map(str::to_string)
            .unwrap_or_else(|| info.description.clone());
        Ok(SubagentDefinition {
            name,
            description,
            kind: "A2A".into(),
            protocol_data: exec::protocol_data(&info, &card_url),
            reference,
        })
    }
}

impl executor::Guest for A2a {
    fn execute(ctx: TaskContext, call: TaskCall, definition: SubagentDefinition) -> Result<String, Error> {
        let plan = exec::Plan::from_definition(&definition.protocol_data, &definition.reference.metadata).map_err(to_wit)?;
        let call = exec::Call {
            task_id: &ctx.task_id,
            prompt: &call.prompt,
            resume: call.resume.as_deref().filter(|r| !r.is_empty()),
            deadline_ms: ctx.deadline_ms,
        };
        exec::execute(&mut Imports, plan, &call).map_err(to_wit)
    }
}

export!(A2a);
