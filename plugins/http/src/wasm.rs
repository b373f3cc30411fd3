//! The WIT exports over the host imports (wasm32 only).

wit_bindgen::generate!({
    path: "../../wit",
    world: "plugin",
});

use exports::warden::plugin::{executor, meta, resolver};
use warden::plugin::types::{
    Capability, Error, PluginInfo, SubagentDefinition, SubagentReference, TaskCall, TaskContext,
};
use warden::plugin::{http, log};

use crate::{Endpoint, KIND};

struct Http;

impl meta::Guest for Http {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "http".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            kinds: vec![KIND.into()],
            capabilities: vec![Capability::Http, Capability::Log],
        }
    }
}

impl resolver::Guest for Http {
    fn can_resolve(reference: SubagentReference) -> bool {
        reference.kind.eq_ignore_ascii_case(KIND)
            && (reference.uri.trim().starts_with("http://") || reference.uri.trim().starts_with("https://"))
    }

    fn resolve(reference: SubagentReference) -> Result<SubagentDefinition, Error> {
        let endpoint = Endpoint::from_reference(&reference.uri, &reference.metadata).map_err(Error::InvalidInput)?;
        Ok(SubagentDefinition {
            name: endpoint.name.clone(),
            description: endpoint.description.clone(),
            kind: KIND.into(),
            protocol_data: serde_json::json!({
                "method": endpoint.method,
                "response_pointer": endpoint.response_pointer,
                "timeout_ms": endpoint.timeout_ms,
                "uses_secret": endpoint.auth_secret.is_some(),
            })
            .to_string(),
            reference,
        })
    }
}

impl executor::Guest for Http {
    fn execute(ctx: TaskContext, call: TaskCall, definition: SubagentDefinition) -> Result<String, Error> {
        let reference = &definition.reference;
        let endpoint = Endpoint::from_reference(&reference.uri, &reference.metadata).map_err(Error::InvalidInput)?;
        // The configured timeout, kept a little inside the call's deadline so it ends
        // as an error value rather than an interrupted call.
        let margin = (ctx.deadline_ms / 10).min(500);
        let deadline = u32::try_from(ctx.deadline_ms.saturating_sub(margin)).unwrap_or(u32::MAX);
        let timeout_ms = endpoint.timeout_ms.map_or(deadline, |t| t.min(deadline));
        let url = endpoint.render_url(&call.prompt, &call.description);
        let req = http::Request {
            method: endpoint.method.clone(),
            url: url.clone(),
            headers: endpoint.request_headers(),
            body: endpoint.render_body(&call.prompt, &call.description).map(String::into_bytes),
            timeout_ms: Some(timeout_ms),
            auth_secret: endpoint.auth_secret.clone(),
        };
        let _ = log::write(log::Level::Debug, &format!("{} {} (timeout {timeout_ms} ms)", endpoint.method, endpoint.url));
        let resp = http::send(&req)?;
        endpoint.extract(resp.status, &resp.body).map_err(Error::Remote)
    }
}

export!(Http);
