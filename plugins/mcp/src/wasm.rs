//! The WIT exports over the host imports (wasm32 only): the MCP client runs over
//! `http.send-streaming`, progress becomes `status` events.

use std::cell::RefCell;
use std::rc::Rc;

use warden_guest::http::{self, BodyStream, Request};
use warden_guest::{
    Capability, Error, Plugin, PluginInfo, SubagentDefinition, SubagentReference, TaskCall, TaskContext, ToolCall,
    events, log, model,
};
use warden_mcp_protocol::{self as mcp, Client, ClientInfo, McpError, Update};

use crate::{KIND, ProtocolData, Target};

struct Mcp;

/// The host error behind the last transport failure, so its kind (denied, timeout,
/// ...) reaches the task unchanged.
type LastError = Rc<RefCell<Option<Error>>>;

struct HostTransport {
    url: String,
    auth_secret: Option<String>,
    timeout_ms: Option<u32>,
    last_error: LastError,
}

struct HostBody {
    stream: BodyStream,
    last_error: LastError,
}

fn transport_error(e: Error, slot: &LastError) -> McpError {
    let message = e.message().to_owned();
    let m = if matches!(e, Error::Timeout(_)) { McpError::Timeout(message) } else { McpError::Transport(message) };
    *slot.borrow_mut() = Some(e);
    m
}

impl mcp::Body for HostBody {
    fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, McpError> {
        self.stream.next_chunk().map_err(|e| transport_error(e, &self.last_error))
    }
}

impl mcp::Transport for HostTransport {
    type Body = HostBody;
    fn send(&mut self, request: &mcp::HttpRequest) -> Result<(u16, mcp::Headers, HostBody), McpError> {
        let req = Request {
            method: request.method.into(),
            url: self.url.clone(),
            headers: request.headers.clone(),
            body: request.body.clone(),
            timeout_ms: self.timeout_ms,
            auth_secret: self.auth_secret.clone(),
        };
        let (head, stream) = http::send_streaming(&req).map_err(|e| transport_error(e, &self.last_error))?;
        Ok((head.status, head.headers, HostBody { stream, last_error: self.last_error.clone() }))
    }
}

fn client(target: &Target, timeout_ms: Option<u32>) -> (Client<HostTransport>, LastError) {
    let last_error = LastError::default();
    let transport = HostTransport {
        url: target.endpoint.clone(),
        auth_secret: target.auth_secret.clone(),
        timeout_ms,
        last_error: last_error.clone(),
    };
    let info = ClientInfo { name: "warden-mcp".into(), version: env!("CARGO_PKG_VERSION").into() };
    (Client::new(transport, info, target.preference), last_error)
}

/// An MCP failure as a task error: the host's own error for transport failures,
/// `timeout` for timeouts, `remote` (naming the endpoint) for everything the server did.
fn to_wit(e: McpError, last: &LastError, endpoint: &str) -> Error {
    match e {
        McpError::Timeout(m) => last.borrow_mut().take().unwrap_or(Error::Timeout(m)),
        McpError::Transport(m) => last.borrow_mut().take().unwrap_or(Error::Remote(m)),
        other => Error::Remote(format!("MCP server {endpoint}: {other}")),
    }
}

impl Plugin for Mcp {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "mcp".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            kinds: vec![KIND.into()],
            capabilities: vec![Capability::Http, Capability::Events, Capability::Log, Capability::Tools],
        }
    }

    fn can_resolve(reference: SubagentReference) -> bool {
        reference.kind.eq_ignore_ascii_case(KIND) && Target::from_reference(&reference.uri, &reference.metadata).is_ok()
    }

    fn resolve(reference: SubagentReference) -> Result<SubagentDefinition, Error> {
        let target = Target::from_reference(&reference.uri, &reference.metadata).map_err(Error::InvalidInput)?;
        if let Some(server) = &target.stdio {
            // A stdio server runs in a task's sandbox session: there is none to ask now,
            // so its tool is chosen when the task runs (metadata `tool`/`argument` pin it).
            let data = ProtocolData {
                endpoint: target.endpoint.clone(),
                tool: target.tool.clone().unwrap_or_default(),
                argument: target.argument.clone().unwrap_or_default(),
                protocol_version: String::new(),
                server: Some(server.clone()),
                input_schema: serde_json::json!({}),
                mcp_servers: vec![server.clone()],
            };
            let what = target.tool.clone().map(|t| format!("tool {t}")).unwrap_or_else(|| "the agent tool".into());
            return Ok(SubagentDefinition {
                name: target.name.clone().unwrap_or_else(|| server.clone()),
                description: target
                    .description
                    .clone()
                    .unwrap_or_else(|| format!("MCP {what} of the stdio server {server}")),
                kind: KIND.into(),
                tools: None,
                permission_mode: None,
                // The operator's server this subagent runs on: the host lets its calls through.
                mcp_servers: vec![server.clone()],
                agent_mcp_servers: vec![],
                egress: None,
                protocol_data: serde_json::to_string(&data).map_err(|e| Error::Internal(e.to_string()))?,
                reference,
            });
        }
        let (mut c, last) = client(&target, None);
        let err = |e: McpError| to_wit(e, &last, &target.endpoint);
        let server = c.connect().map_err(err)?.clone();
        let tools = c.list_all_tools().map_err(err);
        c.close();
        let tools = tools?;
        let (tool, agent) = mcp::select_agent_tool(&tools, target.tool.as_deref(), target.argument.as_deref())
            .map_err(|m| Error::InvalidInput(format!("MCP server {}: {m}", target.endpoint)))?;
        log::debug(&format!(
            "resolved {} (revision {}): tool {} argument {}",
            target.endpoint, server.protocol_version, agent.tool, agent.argument
        ));
        let data = ProtocolData {
            endpoint: target.endpoint.clone(),
            tool: agent.tool,
            argument: agent.argument,
            protocol_version: server.protocol_version.clone(),
            server: server.name.clone(),
            input_schema: tool.input_schema.clone(),
            mcp_servers: vec![],
        };
        Ok(SubagentDefinition {
            name: crate::definition_name(&target, &server, &tool),
            description: crate::definition_description(&target, &server, &tool),
            kind: KIND.into(),
            tools: None,
            permission_mode: None,
            mcp_servers: vec![],
            agent_mcp_servers: vec![],
            egress: None,
            protocol_data: serde_json::to_string(&data).map_err(|e| Error::Internal(e.to_string()))?,
            reference,
        })
    }

    fn execute(ctx: TaskContext, call: TaskCall, definition: SubagentDefinition) -> Result<String, Error> {
        let reference = &definition.reference;
        let target = Target::from_reference(&reference.uri, &reference.metadata).map_err(Error::InvalidInput)?;
        let data: ProtocolData = serde_json::from_str(&definition.protocol_data)
            .map_err(|e| Error::InvalidInput(format!("definition protocol-data is not from this plugin: {e}")))?;
        if let Some(server) = &target.stdio {
            return execute_stdio(server, &target, &call);
        }
        // Leave a little of the call's time so a timeout comes back as an error value
        // rather than the host interrupting the call.
        let timeout_ms = http::timeout_within(ctx.deadline_ms);
        let (mut c, last) = client(&target, Some(timeout_ms));
        let err = |e: McpError| to_wit(e, &last, &target.endpoint);
        c.connect().map_err(err)?;
        let arguments = serde_json::json!({ data.argument.as_str(): call.prompt });
        let mut on_update = |u: Update| match u {
            Update::Progress(p) => {
                let _ = events::emit("progress", &crate::progress_event(&p));
            }
            Update::Log { level, data } => {
                let text = data.as_str().map(str::to_owned).unwrap_or_else(|| data.to_string());
                log::info(&format!("MCP server log ({level}): {text}"));
            }
            Update::ServerRequest { method, .. } => {
                log::warn(&format!("MCP server sent a request ({method}) that this client does not answer"));
            }
            Update::Notification { .. } => {}
        };
        let result = c.call_tool(&data.tool, arguments, Some(ctx.task_id.clone().into()), &mut on_update).map_err(err);
        c.close();
        let result = result?;
        if result.is_error {
            let text =
                if result.text.trim().is_empty() { "the tool reported an error".to_owned() } else { result.text };
            return Err(Error::Remote(text));
        }
        Ok(result.text)
    }
}

/// A task on an operator's stdio server: its tools come through the host's `tools`
/// capability (the server runs in the task's sandbox session; every call passes the gate).
fn execute_stdio(server: &str, target: &Target, call: &TaskCall) -> Result<String, Error> {
    let available = crate::stdio_tools(server, &model::list_tools()?);
    if available.is_empty() {
        return Err(Error::Unavailable(format!(
            "the stdio MCP server {server:?} offers no tools to this task (is it in mcp_servers, and may this plugin use tools?)"
        )));
    }
    let (_, agent) = mcp::select_agent_tool(&available, target.tool.as_deref(), target.argument.as_deref())
        .map_err(|m| Error::InvalidInput(format!("MCP server {server}: {m}")))?;
    let arguments = serde_json::json!({ agent.argument.as_str(): call.prompt });
    let request = ToolCall {
        id: "mcp-agent".into(),
        name: mcp::claude_tool_name(server, &agent.tool),
        arguments: arguments.to_string(),
    };
    let result =
        model::call_tools(&[request])?.pop().ok_or_else(|| Error::Internal("no result for the tool call".into()))?;
    if result.is_error {
        return Err(Error::Remote(result.content));
    }
    Ok(result.content)
}

warden_guest::export!(Mcp);
