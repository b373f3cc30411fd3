//! The plugin's exports over the host imports (wasm32 only).

use warden_guest::http::{self, Request, timeout_within};
use warden_guest::{
    Capability, Error, Plugin, PluginInfo, SubagentDefinition, SubagentReference, TaskCall, TaskContext, log,
};

use crate::{Endpoint, KIND};

struct Http;

impl Plugin for Http {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "http".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            kinds: vec![KIND.into()],
            capabilities: vec![Capability::Http, Capability::Log],
        }
    }

    fn can_resolve(reference: SubagentReference) -> bool {
        reference.kind.eq_ignore_ascii_case(KIND)
            && (reference.uri.trim().starts_with("http://") || reference.uri.trim().starts_with("https://"))
    }

    fn resolve(reference: SubagentReference) -> Result<SubagentDefinition, Error> {
        let endpoint = Endpoint::from_reference(&reference.uri, &reference.metadata)?;
        Ok(SubagentDefinition {
            name: endpoint.name.clone(),
            description: endpoint.description.clone(),
            kind: KIND.into(),
            tools: None,
            permission_mode: None,
            mcp_servers: vec![],
            agent_mcp_servers: vec![],
            egress: None,
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

    fn execute(ctx: TaskContext, call: TaskCall, definition: SubagentDefinition) -> Result<String, Error> {
        let reference = &definition.reference;
        let endpoint = Endpoint::from_reference(&reference.uri, &reference.metadata)?;
        let deadline = timeout_within(ctx.deadline_ms);
        let timeout_ms = endpoint.timeout_ms.map_or(deadline, |t| t.min(deadline));
        let req = Request {
            method: endpoint.method.clone(),
            url: endpoint.render_url(&call.prompt, &call.description),
            headers: endpoint.request_headers(),
            body: endpoint.render_body(&call.prompt, &call.description).map(String::into_bytes),
            timeout_ms: Some(timeout_ms),
            auth_secret: endpoint.auth_secret.clone(),
        };
        log::debug(&format!("{} {} (timeout {timeout_ms} ms)", endpoint.method, endpoint.url));
        let resp = http::send(&req)?;
        endpoint.extract(resp.status, &resp.body).map_err(Error::Remote)
    }
}

warden_guest::export!(Http);
