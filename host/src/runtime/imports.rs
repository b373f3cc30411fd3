//! Host side of the WIT imports. Each function first asks the capability checker
//! ([`crate::capability::Grants`]), then does the work bounded by the call's deadline
//! and the limits in [`crate::services`]. Expected failures are WIT `error` values;
//! nothing here may trap on plugin input, and nothing here may hand a secret to a plugin.

use std::time::Duration;

use wasmtime::component::Resource;

use super::bindings::types::{self, Error};
use super::bindings::warden::plugin::{events, http, log, model, resources, state, tools};
use super::host_state::{BodyStream, HostState, SecretScrubber};
use std::sync::Arc;

use crate::capability::{Capability, Denied, Grants};
use crate::event::{ModelStream, TaskEvent};
use crate::plugin::PluginEvent;
use crate::services::{
    MAX_EVENT_BYTES, MAX_EVENT_KIND_BYTES, MAX_HTTP_HEADER_BYTES, MAX_HTTP_HEADERS, MAX_HTTP_METHOD_BYTES,
    MAX_HTTP_REDIRECTS, MAX_HTTP_REQUEST_BODY, MAX_HTTP_RESPONSE_BODY, MAX_LOG_LINE, MAX_MODEL_MESSAGES,
    MAX_MODEL_REQUEST_BYTES, MAX_MODEL_TOOLS, MAX_NAME_BYTES, MAX_RESOURCE_BYTES, MAX_SECRET_NAME_BYTES,
    MAX_TOOL_ARGUMENT_BYTES, MAX_TOOL_CALLS_PER_BATCH, MAX_URL_BYTES, StateStore,
};

/// Refuses an input above a fixed bound: `what` names it, the text names the limit.
fn bounded(what: &str, got: usize, max: usize) -> Result<(), Error> {
    if got > max {
        return Err(Error::InvalidInput(format!("{what} is {got}; the limit is {max}")));
    }
    Ok(())
}

/// A per-call budget from `plugins.budgets` ran out: the text names it and its key.
fn over_budget(what: &str, limit: u64, key: &str) -> Error {
    Error::Denied(format!("{what}: this call's budget of {limit} is used up (plugins.budgets.{key})"))
}

/// Request headers a plugin may not set: framing and routing are the host's (a forged
/// `Host` would send an allow-listed address's request to another virtual host).
const RESERVED_REQUEST_HEADERS: [&str; 10] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
];

impl From<Denied> for Error {
    fn from(d: Denied) -> Self {
        Error::Denied(d.to_string())
    }
}

impl HostState {
    fn check(&self, c: Capability) -> Result<(), Error> {
        self.scope.grants.check(c).map_err(|d| {
            tracing::warn!(plugin = %self.scope.plugin, capability = %c, "capability denied");
            Error::from(d)
        })
    }

    fn task_id(&self) -> &str {
        self.scope.task.as_ref().map(|t| t.task_id.as_str()).unwrap_or("")
    }

    fn session_id(&self) -> &str {
        self.scope.task.as_ref().map(|t| t.session_id.as_str()).unwrap_or("")
    }

    /// The deadline-bounded timeout for host I/O; errors once the deadline has passed.
    fn io_timeout(&self, requested_ms: Option<u32>) -> Result<Duration, Error> {
        let remaining = self.scope.remaining();
        if remaining.is_zero() {
            return Err(Error::Timeout("the call's deadline has passed".into()));
        }
        Ok(match requested_ms {
            Some(ms) => remaining.min(Duration::from_millis(ms as u64)),
            None => remaining,
        })
    }
}

impl types::Host for HostState {}

impl log::Host for HostState {
    async fn write(&mut self, level: log::Level, message: String) -> Result<(), Error> {
        self.check(Capability::Log)?;
        let budgets = self.scope.services.budgets;
        let usage = &mut self.usage;
        if usage.log_lines >= budgets.max_log_lines_per_call {
            return Err(over_budget("log lines", budgets.max_log_lines_per_call.into(), "max_log_lines_per_call"));
        }
        if usage.log_bytes + message.len() as u64 > budgets.max_log_bytes_per_call {
            return Err(over_budget("log bytes", budgets.max_log_bytes_per_call, "max_log_bytes_per_call"));
        }
        usage.log_lines += 1;
        usage.log_bytes += message.len() as u64;
        let mut message = message;
        if message.len() > MAX_LOG_LINE {
            message.truncate(floor_char_boundary(&message, MAX_LOG_LINE));
            message.push_str(" [truncated]");
        }
        // One write is one line: newlines and terminal controls are escaped.
        let message = crate::text::escape_control(&message);
        let (plugin, task, session) = (&*self.scope.plugin, self.task_id(), self.session_id());
        match level {
            log::Level::Trace => tracing::trace!(plugin, task_id = task, session, "{message}"),
            log::Level::Debug => tracing::debug!(plugin, task_id = task, session, "{message}"),
            log::Level::Info => tracing::info!(plugin, task_id = task, session, "{message}"),
            log::Level::Warn => tracing::warn!(plugin, task_id = task, session, "{message}"),
            log::Level::Error => tracing::error!(plugin, task_id = task, session, "{message}"),
        }
        Ok(())
    }
}

/// The largest index `<= at` on a char boundary of `s`.
fn floor_char_boundary(s: &str, at: usize) -> usize {
    let mut cut = at.min(s.len());
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    cut
}

impl events::Host for HostState {
    async fn emit(&mut self, kind: String, data: String) -> Result<(), Error> {
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
        let data: serde_json::Value = serde_json::from_str(&data)
            .map_err(|e| Error::InvalidInput(format!("event data must be a JSON object: {e}")))?;
        if !data.is_object() {
            return Err(Error::InvalidInput("event data must be a JSON object".into()));
        }
        self.usage.events += 1;
        self.usage.event_bytes += raw_len;
        let Some(sink) = &self.scope.events else { return Ok(()) };
        let event = TaskEvent::Plugin(PluginEvent { plugin: self.scope.plugin.to_string(), kind, data });
        sink.send(event).await.map_err(|_| Error::Unavailable("the task's event stream is closed".into()))
    }
}

impl state::Host for HostState {
    async fn get(&mut self, key: String) -> Result<Option<Vec<u8>>, Error> {
        self.check(Capability::State)?;
        StateStore::check_key(&key, &self.scope.services.budgets).map_err(|e| Error::InvalidInput(e.to_string()))?;
        Ok(self.scope.services.state.get(&self.scope.plugin, &key))
    }

    async fn set(&mut self, key: String, value: Vec<u8>) -> Result<(), Error> {
        self.check(Capability::State)?;
        let budgets = &self.scope.services.budgets;
        self.scope
            .services
            .state
            .set(&self.scope.plugin, &key, value, budgets)
            .map_err(|e| Error::Denied(e.to_string()))
    }

    async fn delete(&mut self, key: String) -> Result<(), Error> {
        self.check(Capability::State)?;
        StateStore::check_key(&key, &self.scope.services.budgets).map_err(|e| Error::InvalidInput(e.to_string()))?;
        self.scope.services.state.delete(&self.scope.plugin, &key);
        Ok(())
    }
}

/// Checks the sizes of a `model.complete` request before anything is converted.
fn check_model_request(req: &model::CompletionRequest) -> Result<(), Error> {
    bounded("the number of messages", req.messages.len(), MAX_MODEL_MESSAGES)?;
    bounded("the number of tools", req.tools.len(), MAX_MODEL_TOOLS)?;
    bounded("the model name (bytes)", req.model.len(), MAX_NAME_BYTES)?;
    let mut total = 0usize;
    for m in &req.messages {
        bounded("a message role (bytes)", m.role.len(), MAX_NAME_BYTES)?;
        bounded("a tool-call id (bytes)", m.tool_call_id.as_ref().map_or(0, String::len), MAX_NAME_BYTES)?;
        bounded("the tool calls of one message", m.tool_calls.len(), MAX_TOOL_CALLS_PER_BATCH)?;
        total = total.saturating_add(m.content.len());
        for c in &m.tool_calls {
            check_tool_call(&c.id, &c.name, &c.arguments)?;
            total = total.saturating_add(c.arguments.len());
        }
    }
    for t in &req.tools {
        bounded("a tool name (bytes)", t.name.len(), MAX_NAME_BYTES)?;
        total = total.saturating_add(t.description.len()).saturating_add(t.input_schema.len());
    }
    bounded("the request's text (bytes)", total, MAX_MODEL_REQUEST_BYTES)
}

fn check_tool_call(id: &str, name: &str, arguments: &str) -> Result<(), Error> {
    bounded("a tool-call id (bytes)", id.len(), MAX_NAME_BYTES)?;
    bounded("a tool name (bytes)", name.len(), MAX_NAME_BYTES)?;
    bounded("a tool call's arguments (bytes)", arguments.len(), MAX_TOOL_ARGUMENT_BYTES)
}

/// Smallest timeout handed to a model request: below this the call is already lost.
const MIN_MODEL_TIMEOUT: Duration = Duration::from_millis(1);

fn to_model_message(m: model::Message) -> Result<warden_models::Message, Error> {
    use warden_models::Role;
    let role = match m.role.as_str() {
        "system" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        other => {
            return Err(Error::InvalidInput(format!(
                "message role {other:?}; expected system, user, assistant or tool"
            )));
        }
    };
    let tool_calls = m
        .tool_calls
        .into_iter()
        .map(|c| {
            let arguments = parse_arguments(&c.name, &c.arguments)?;
            Ok(warden_models::ToolCall { id: c.id, name: c.name, arguments })
        })
        .collect::<Result<_, Error>>()?;
    Ok(warden_models::Message { role, content: m.content, tool_calls, tool_call_id: m.tool_call_id })
}

fn parse_arguments(tool: &str, text: &str) -> Result<serde_json::Value, Error> {
    if text.trim().is_empty() {
        return Ok(serde_json::json!({}));
    }
    serde_json::from_str(text)
        .map_err(|e| Error::InvalidInput(format!("arguments of tool call {tool:?} are not JSON: {e}")))
}

fn from_model_message(m: warden_models::Message) -> model::Message {
    use warden_models::Role;
    model::Message {
        role: match m.role {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
        .into(),
        content: m.content,
        tool_calls: m
            .tool_calls
            .into_iter()
            .map(|c| model::ToolCall { id: c.id, name: c.name, arguments: c.arguments.to_string() })
            .collect(),
        tool_call_id: m.tool_call_id,
    }
}

impl model::Host for HostState {
    async fn complete(&mut self, req: model::CompletionRequest) -> Result<model::Completion, Error> {
        self.check(Capability::Model)?;
        check_model_request(&req)?;
        let router = self.scope.services.models.clone().map_err(Error::Unavailable)?;
        let name = if req.model.trim().is_empty() { None } else { Some(req.model.as_str()) };
        let (provider, model_name) = router.resolve(name).map_err(|e| Error::InvalidInput(e.to_string()))?;
        let timeout = self.io_timeout(None)?.max(MIN_MODEL_TIMEOUT);
        let messages = req.messages.into_iter().map(to_model_message).collect::<Result<Vec<_>, _>>()?;
        let tools = req
            .tools
            .into_iter()
            .map(|t| {
                let input_schema = serde_json::from_str(&t.input_schema)
                    .map_err(|e| Error::InvalidInput(format!("input schema of tool {:?} is not JSON: {e}", t.name)))?;
                Ok(warden_models::ToolSpec { name: t.name, description: t.description, input_schema })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let mut request = warden_models::ChatRequest::new(model_name, messages);
        request.tools = tools;
        request.max_tokens = req.max_tokens;
        request.timeout = Some(timeout);
        // Streamed tokens and reasoning become task events; a full sink drops them
        // rather than stalling the provider.
        let sink =
            self.scope.events.clone().filter(|_| self.scope.grants.check(Capability::Events).is_ok()).map(|events| {
                let plugin = self.scope.plugin.to_string();
                warden_models::StreamSink::new(move |ev| {
                    let (stream, text) = match ev {
                        warden_models::ModelEvent::Token(t) => (ModelStream::Token, t),
                        warden_models::ModelEvent::Reasoning(t) => (ModelStream::Reasoning, t),
                        _ => return,
                    };
                    let _ = events.try_send(TaskEvent::Model { plugin: plugin.clone(), stream, text });
                })
            });
        let response = provider.complete(request, sink).await.map_err(|e| match e {
            warden_models::ModelError::Timeout { .. } => Error::Timeout(e.to_string()),
            warden_models::ModelError::Config(_) | warden_models::ModelError::UnknownModel { .. } => {
                Error::Unavailable(e.to_string())
            }
            _ => Error::Remote(e.to_string()),
        })?;
        tracing::debug!(plugin = %self.scope.plugin, task_id = self.task_id(), provider = provider.name(), "model call done");
        Ok(model::Completion {
            message: from_model_message(response.message),
            finish_reason: match response.finish_reason {
                warden_models::FinishReason::Stop => "stop".into(),
                warden_models::FinishReason::ToolCalls => "tool_calls".into(),
                warden_models::FinishReason::Length => "length".into(),
                warden_models::FinishReason::Other(o) => o,
            },
            reasoning: response.reasoning,
        })
    }
}

impl HostState {
    fn tool_host(&self) -> Result<(Arc<crate::tools::ToolHost>, crate::tools::ToolScope), Error> {
        self.check(Capability::Tools)?;
        let host = self
            .scope
            .services
            .tools
            .clone()
            .ok_or_else(|| Error::Unavailable("sandbox tools are not configured in this host".into()))?;
        let scope = self
            .scope
            .tools
            .clone()
            .ok_or_else(|| Error::Unavailable("tools can only be used while executing a task".into()))?;
        Ok((host, scope))
    }
}

impl tools::Host for HostState {
    async fn list(&mut self) -> Result<Vec<model::ToolSpec>, Error> {
        let (host, scope) = self.tool_host()?;
        Ok(host
            .list(&scope)
            .await
            .into_iter()
            .map(|t| model::ToolSpec {
                name: t.name,
                description: t.description,
                input_schema: t.input_schema.to_string(),
            })
            .collect())
    }

    async fn call(&mut self, calls: Vec<model::ToolCall>) -> Result<Vec<tools::ToolResult>, Error> {
        let (host, scope) = self.tool_host()?;
        bounded("the number of tool calls in one batch", calls.len(), MAX_TOOL_CALLS_PER_BATCH)?;
        for c in &calls {
            check_tool_call(&c.id, &c.name, &c.arguments)?;
        }
        let calls = calls
            .into_iter()
            .map(|c| {
                let input = parse_arguments(&c.name, &c.arguments)?;
                Ok(crate::tools::ToolCall { id: c.id, name: c.name, input })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let results = host.call_batch(&scope, calls).await;
        if scope.tool_budget.as_ref().is_some_and(|b| b.exceeded()) {
            // The task is over: stop the plugin's loop here rather than let it carry on.
            return Err(Error::Denied("the task reached its tool-call limit (max_tool_iterations)".into()));
        }
        Ok(results
            .into_iter()
            .map(|r| tools::ToolResult { id: r.id, content: r.content, is_error: r.is_error })
            .collect())
    }
}

impl resources::Host for HostState {
    async fn read(&mut self, uri: String) -> Result<Vec<u8>, Error> {
        self.check(Capability::Resources)?;
        bounded("the resource URI (bytes)", uri.len(), MAX_URL_BYTES)?;
        if uri.contains('\0') {
            return Err(Error::InvalidInput("the resource URI contains a NUL byte".into()));
        }
        if uri.starts_with("http://") || uri.starts_with("https://") {
            let req = http::Request {
                method: "GET".into(),
                url: uri,
                headers: vec![],
                body: None,
                timeout_ms: None,
                auth_secret: None,
            };
            let resp = http::Host::send(self, req).await?;
            if !(200..300).contains(&resp.status) {
                return Err(Error::Remote(format!("resource fetch returned HTTP {}", resp.status)));
            }
            return Ok(resp.body);
        }
        if let Some(text) = crate::builtin::agent_text(&uri) {
            return text.map(|t| t.as_bytes().to_vec()).map_err(Error::NotFound);
        }
        let path = uri.strip_prefix("file://").unwrap_or(&uri).to_owned();
        let roots = self.scope.services.resource_roots.clone();
        let timeout = self.io_timeout(None)?;
        // File system calls block: off the async workers, bounded by the deadline.
        let read = tokio::task::spawn_blocking(move || read_resource_file(&path, &roots));
        match tokio::time::timeout(timeout, read).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => Err(Error::Internal(format!("reading the resource failed: {e}"))),
            Err(_) => Err(Error::Timeout("reading the resource timed out".into())),
        }
    }
}

/// Reads a regular file under one of `roots`, at most [`MAX_RESOURCE_BYTES`] (through
/// [`crate::bounded_read`]: no FIFO or device ever blocks a thread).
fn read_resource_file(path: &str, roots: &[std::path::PathBuf]) -> Result<Vec<u8>, Error> {
    let shown = crate::text::escape_control(path).into_owned();
    let canonical = std::fs::canonicalize(path).map_err(|e| Error::NotFound(format!("{shown}: {e}")))?;
    if !roots.iter().any(|r| canonical.starts_with(r)) {
        return Err(Error::Denied(format!(
            "capability `resources` denied: {shown} is outside the configured agent directories"
        )));
    }
    use crate::bounded_read::{ReadError, read_regular};
    match read_regular(&canonical, MAX_RESOURCE_BYTES) {
        Ok(out) => Ok(out),
        Err(ReadError::Io(e)) => Err(Error::NotFound(format!("{shown}: {e}"))),
        Err(ReadError::NotRegular) => Err(Error::InvalidInput(format!("{shown} is not a regular file"))),
        Err(ReadError::TooLarge { size, grew: false }) => {
            Err(Error::InvalidInput(format!("{shown} is {size} bytes; the limit is {MAX_RESOURCE_BYTES}")))
        }
        Err(ReadError::TooLarge { grew: true, .. }) => {
            Err(Error::InvalidInput(format!("{shown} grew past the limit of {MAX_RESOURCE_BYTES} bytes")))
        }
    }
}

/// What the HTTP import needs from one request after validation.
struct Outbound {
    method: reqwest::Method,
    url: reqwest::Url,
    headers: reqwest::header::HeaderMap,
    body: Option<Vec<u8>>,
    timeout: Duration,
    /// The secret injected into this request: its header and its value (to strip on a
    /// redirect to another origin and to scrub from the response).
    secret: Option<(reqwest::header::HeaderName, String)>,
}

/// The allow-list for `url`, and for an address literal the address check too (names
/// are checked after resolution, by the plugin client's resolver).
fn check_destination(grants: &Grants, url: &reqwest::Url) -> Result<(), Error> {
    grants.check_url(url)?;
    let host = url.host_str().unwrap_or_default();
    if let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>() {
        grants.check_address(&ip.to_string(), ip)?;
    }
    Ok(())
}

impl HostState {
    fn prepare(&self, req: http::Request) -> Result<Outbound, Error> {
        bounded("the URL (bytes)", req.url.len(), MAX_URL_BYTES)?;
        let url = reqwest::Url::parse(&req.url).map_err(|e| {
            Error::InvalidInput(format!("invalid URL {:?}: {e}", crate::text::escape_control(&req.url)))
        })?;
        // The allow-list is checked before anything touches the network.
        check_destination(&self.scope.grants, &url)?;
        bounded("the HTTP method (bytes)", req.method.len(), MAX_HTTP_METHOD_BYTES)?;
        let method = reqwest::Method::from_bytes(req.method.to_ascii_uppercase().as_bytes()).map_err(|_| {
            Error::InvalidInput(format!("invalid HTTP method {:?}", crate::text::escape_control(&req.method)))
        })?;
        bounded("the number of request headers", req.headers.len(), MAX_HTTP_HEADERS)?;
        let header_bytes = req.headers.iter().fold(0usize, |n, (k, v)| n.saturating_add(k.len() + v.len()));
        bounded("the request headers (bytes)", header_bytes, MAX_HTTP_HEADER_BYTES)?;
        bounded("the secret name (bytes)", req.auth_secret.as_ref().map_or(0, String::len), MAX_SECRET_NAME_BYTES)?;
        let mut headers = reqwest::header::HeaderMap::new();
        for (k, v) in &req.headers {
            let shown = || crate::text::escape_control(k).into_owned();
            let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| Error::InvalidInput(format!("invalid header name {:?}", shown())))?;
            if RESERVED_REQUEST_HEADERS.contains(&name.as_str()) {
                return Err(Error::Denied(format!("header {:?} is set by the host, not by plugins", name.as_str())));
            }
            let value = reqwest::header::HeaderValue::from_str(v)
                .map_err(|_| Error::InvalidInput(format!("invalid value for header {:?}", shown())))?;
            headers.try_append(name, value).map_err(|_| Error::InvalidInput("too many request headers".into()))?;
        }
        let mut injected = None;
        if let Some(secret) = &req.auth_secret {
            // Only to the origins the operator named for this secret.
            let rule = self.scope.grants.secret_for(secret, &url)?;
            let value = std::env::var(&rule.grant.env).map_err(|_| {
                Error::Unavailable(format!("secret `{secret}` is configured but its environment variable is not set"))
            })?;
            let name = reqwest::header::HeaderName::from_bytes(rule.grant.header.to_ascii_lowercase().as_bytes())
                .map_err(|_| Error::Unavailable(format!("secret `{secret}` has an invalid header name")))?;
            if headers.contains_key(&name) {
                return Err(Error::InvalidInput(format!(
                    "header {:?} carries secret `{secret}`; the plugin may not set it too",
                    name.as_str()
                )));
            }
            let mut header = reqwest::header::HeaderValue::from_str(&rule.grant.header_value(&value))
                .map_err(|_| Error::Unavailable(format!("secret `{secret}` is not a valid header value")))?;
            header.set_sensitive(true);
            headers.insert(name.clone(), header);
            injected = Some((name, value));
        }
        bounded("the request body (bytes)", req.body.as_ref().map_or(0, Vec::len), MAX_HTTP_REQUEST_BODY)?;
        let timeout = self.io_timeout(req.timeout_ms)?;
        Ok(Outbound { method, url, headers, body: req.body, timeout, secret: injected })
    }
}

/// Sends, following redirects by hand so every hop passes the allow-list. Takes owned
/// handles (not `&HostState`) so the future stays `Send` across awaits.
async fn dispatch(client: reqwest::Client, grants: Arc<Grants>, mut out: Outbound) -> Result<reqwest::Response, Error> {
    {
        let started = std::time::Instant::now();
        for _ in 0..=MAX_HTTP_REDIRECTS {
            let timeout = out.timeout.saturating_sub(started.elapsed());
            let mut rb = client.request(out.method.clone(), out.url.clone());
            rb = rb.headers(out.headers.clone()).timeout(timeout);
            if let Some(b) = &out.body {
                rb = rb.body(b.clone());
            }
            let resp = rb.send().await.map_err(|e| {
                if let Some(denied) = denied_in(&e) {
                    // The resolver refused every address of the name.
                    Error::Denied(denied.to_string())
                } else if e.is_timeout() {
                    Error::Timeout(format!("HTTP request to {} timed out", out.url))
                } else {
                    Error::Remote(format!("HTTP request to {} failed: {}", out.url, error_chain(&e)))
                }
            })?;
            if !resp.status().is_redirection() {
                return Ok(resp);
            }
            let Some(location) = resp.headers().get(reqwest::header::LOCATION).and_then(|l| l.to_str().ok()) else {
                return Ok(resp);
            };
            let next = out
                .url
                .join(location)
                .map_err(|e| Error::Remote(format!("invalid redirect location {location:?}: {e}")))?;
            check_destination(&grants, &next)?;
            if next.origin() != out.url.origin() {
                // Credentials never follow a redirect to another origin.
                out.headers.remove(reqwest::header::AUTHORIZATION);
                out.headers.remove(reqwest::header::COOKIE);
                if let Some((name, _)) = &out.secret {
                    out.headers.remove(name);
                }
            }
            if resp.status() == reqwest::StatusCode::SEE_OTHER {
                out.method = reqwest::Method::GET;
                out.body = None;
            }
            out.url = next;
        }
        Err(Error::Remote(format!("more than {MAX_HTTP_REDIRECTS} redirects")))
    }
}

/// The capability denial inside a request error (from the plugin client's resolver).
fn denied_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a Denied> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(d) = c.downcast_ref::<Denied>() {
            return Some(d);
        }
        cur = c.source();
    }
    None
}

/// A failure while reading a response body: a timeout is a timeout, not a remote fault.
fn body_error(e: &reqwest::Error) -> Error {
    if e.is_timeout() {
        Error::Timeout(format!("reading the HTTP response body timed out: {}", error_chain(e)))
    } else {
        Error::Remote(error_chain(e))
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// The response headers a plugin sees, with an injected secret's value scrubbed.
fn response_headers(resp: &reqwest::Response, secret: Option<&str>) -> Vec<(String, String)> {
    resp.headers()
        .iter()
        .filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str().to_owned(), v.to_owned())))
        .map(|(k, v)| match secret {
            Some(s) if !s.is_empty() && v.contains(s) => (k, v.replace(s, "[redacted]")),
            _ => (k, v),
        })
        .collect()
}

impl http::Host for HostState {
    async fn send(&mut self, req: http::Request) -> Result<http::Response, Error> {
        let out = self.prepare(req)?;
        let timeout = out.timeout;
        let secret = out.secret.as_ref().map(|(_, v)| v.clone());
        let mut resp = dispatch(self.scope.http.clone(), self.scope.grants.clone(), out).await?;
        let status = resp.status().as_u16();
        let headers = response_headers(&resp, secret.as_deref());
        if resp.content_length().is_some_and(|n| n > MAX_HTTP_RESPONSE_BODY) {
            return Err(Error::Remote(format!("response body exceeds the limit of {MAX_HTTP_RESPONSE_BODY} bytes")));
        }
        let mut body = Vec::new();
        let read = async {
            while let Some(chunk) = resp.chunk().await.map_err(|e| body_error(&e))? {
                if body.len() as u64 + chunk.len() as u64 > MAX_HTTP_RESPONSE_BODY {
                    return Err(Error::Remote(format!(
                        "response body exceeds the limit of {MAX_HTTP_RESPONSE_BODY} bytes"
                    )));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(())
        };
        tokio::time::timeout(timeout, read)
            .await
            .map_err(|_| Error::Timeout("reading the HTTP response body timed out".into()))??;
        if let Some(secret) = &secret {
            body = SecretScrubber::scrub_all(secret, &body);
        }
        Ok(http::Response { status, headers, body })
    }

    async fn send_streaming(&mut self, req: http::Request) -> Result<(http::StreamHead, Resource<BodyStream>), Error> {
        let budgets = self.scope.services.budgets;
        if self.usage.open_streams >= budgets.max_http_streams_per_call {
            return Err(over_budget(
                "open HTTP response streams",
                budgets.max_http_streams_per_call.into(),
                "max_http_streams_per_call",
            ));
        }
        let out = self.prepare(req)?;
        let secret = out.secret.as_ref().map(|(_, v)| v.clone());
        let resp = dispatch(self.scope.http.clone(), self.scope.grants.clone(), out).await?;
        let head =
            http::StreamHead { status: resp.status().as_u16(), headers: response_headers(&resp, secret.as_deref()) };
        let scrubber = secret.as_deref().and_then(SecretScrubber::new);
        let handle = self
            .table
            .push(BodyStream { response: resp, delivered: 0, scrubber, ended: false })
            .map_err(|e| Error::Internal(format!("cannot hold the response stream: {e}")))?;
        self.usage.open_streams += 1;
        Ok((head, handle))
    }
}

impl http::HostBodyStream for HostState {
    async fn next(&mut self, stream: Resource<BodyStream>) -> Result<Option<Vec<u8>>, Error> {
        let timeout = self.io_timeout(None)?;
        let body = self.table.get_mut(&stream).map_err(|e| Error::InvalidInput(format!("unknown body stream: {e}")))?;
        if body.ended {
            let rest = body.scrubber.as_mut().map(SecretScrubber::finish).unwrap_or_default();
            return Ok((!rest.is_empty()).then_some(rest));
        }
        let chunk = tokio::time::timeout(timeout, body.response.chunk())
            .await
            .map_err(|_| Error::Timeout("reading the HTTP response stream timed out".into()))?
            .map_err(|e| body_error(&e))?;
        let Some(chunk) = chunk else {
            body.ended = true;
            let rest = body.scrubber.as_mut().map(SecretScrubber::finish).unwrap_or_default();
            return Ok((!rest.is_empty()).then_some(rest));
        };
        body.delivered += chunk.len() as u64;
        if body.delivered > MAX_HTTP_RESPONSE_BODY {
            return Err(Error::Remote(format!("response stream exceeds the limit of {MAX_HTTP_RESPONSE_BODY} bytes")));
        }
        Ok(Some(match body.scrubber.as_mut() {
            Some(s) => s.feed(&chunk),
            None => chunk.to_vec(),
        }))
    }

    async fn drop(&mut self, stream: Resource<BodyStream>) -> wasmtime::Result<()> {
        self.table.delete(stream)?;
        self.usage.open_streams = self.usage.open_streams.saturating_sub(1);
        Ok(())
    }
}
