//! Host side of the WIT imports. Each function first asks the capability checker
//! ([`crate::capability::Grants`]), then does the work bounded by the call's deadline
//! and the limits in [`crate::services`]. Expected failures are WIT `error` values;
//! nothing here may trap on plugin input, and nothing here may hand a secret to a plugin.

use std::time::Duration;

use wasmtime::component::Resource;

use super::bindings::types::{self, Error};
use super::bindings::warden::plugin::{events, http, log, model, resources, state, tools};
use super::host_state::{BodyStream, HostState};
use std::sync::Arc;

use crate::capability::{Capability, Denied, Grants};
use crate::plugin::PluginEvent;
use crate::services::{
    MAX_EVENT_BYTES, MAX_EVENTS_PER_CALL, MAX_HTTP_REDIRECTS, MAX_HTTP_REQUEST_BODY, MAX_HTTP_RESPONSE_BODY,
    MAX_LOG_LINE, MAX_RESOURCE_BYTES,
};

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
        let mut message = message;
        if message.len() > MAX_LOG_LINE {
            let mut cut = MAX_LOG_LINE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push_str(" [truncated]");
        }
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

impl events::Host for HostState {
    async fn emit(&mut self, kind: String, data: String) -> Result<(), Error> {
        self.check(Capability::Events)?;
        if data.len() > MAX_EVENT_BYTES {
            return Err(Error::InvalidInput(format!(
                "event data of {} bytes exceeds the limit of {MAX_EVENT_BYTES} bytes",
                data.len()
            )));
        }
        if kind.is_empty() || kind.len() > 64 || !kind.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(Error::InvalidInput(format!("event kind {kind:?} must be 1-64 characters of [A-Za-z0-9_]")));
        }
        let data: serde_json::Value = serde_json::from_str(&data)
            .map_err(|e| Error::InvalidInput(format!("event data must be a JSON object: {e}")))?;
        if !data.is_object() {
            return Err(Error::InvalidInput("event data must be a JSON object".into()));
        }
        self.events_emitted += 1;
        if self.events_emitted > MAX_EVENTS_PER_CALL {
            return Err(Error::Denied(format!("more than {MAX_EVENTS_PER_CALL} events in one call")));
        }
        let Some(sink) = &self.scope.events else { return Ok(()) };
        let event = PluginEvent { plugin: self.scope.plugin.to_string(), kind, data };
        sink.send(event).await.map_err(|_| Error::Unavailable("the task's event stream is closed".into()))
    }
}

impl state::Host for HostState {
    async fn get(&mut self, key: String) -> Result<Option<Vec<u8>>, Error> {
        self.check(Capability::State)?;
        Ok(self.scope.services.state.get(&self.scope.plugin, &key))
    }

    async fn set(&mut self, key: String, value: Vec<u8>) -> Result<(), Error> {
        self.check(Capability::State)?;
        self.scope.services.state.set(&self.scope.plugin, &key, value).map_err(Error::InvalidInput)
    }

    async fn delete(&mut self, key: String) -> Result<(), Error> {
        self.check(Capability::State)?;
        self.scope.services.state.delete(&self.scope.plugin, &key);
        Ok(())
    }
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
        other => return Err(Error::InvalidInput(format!("message role {other:?}; expected system, user, assistant or tool"))),
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
    serde_json::from_str(text).map_err(|e| Error::InvalidInput(format!("arguments of tool call {tool:?} are not JSON: {e}")))
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
        let router = self.scope.services.models.clone().map_err(Error::Unavailable)?;
        let name = if req.model.trim().is_empty() { None } else { Some(req.model.as_str()) };
        let (provider, model_name) = router.resolve(name).map_err(|e| Error::InvalidInput(e.to_string()))?;
        let timeout = self.io_timeout(None)?.max(MIN_MODEL_TIMEOUT);
        let messages = req.messages.into_iter().map(to_model_message).collect::<Result<Vec<_>, _>>()?;
        let tools = req
            .tools
            .into_iter()
            .map(|t| {
                let input_schema = serde_json::from_str(&t.input_schema).map_err(|e| {
                    Error::InvalidInput(format!("input schema of tool {:?} is not JSON: {e}", t.name))
                })?;
                Ok(warden_models::ToolSpec { name: t.name, description: t.description, input_schema })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let mut request = warden_models::ChatRequest::new(model_name, messages);
        request.tools = tools;
        request.max_tokens = req.max_tokens;
        request.timeout = Some(timeout);
        // Streamed tokens and reasoning become task events; a full sink drops them
        // rather than stalling the provider.
        let sink = self.scope.events.clone().filter(|_| self.scope.grants.check(Capability::Events).is_ok()).map(|events| {
            let plugin = self.scope.plugin.to_string();
            warden_models::StreamSink::new(move |ev| {
                let (kind, text) = match ev {
                    warden_models::ModelEvent::Token(t) => ("token", t),
                    warden_models::ModelEvent::Reasoning(t) => ("reasoning", t),
                    _ => return,
                };
                let _ = events.try_send(PluginEvent {
                    plugin: plugin.clone(),
                    kind: kind.into(),
                    data: serde_json::json!({ "text": text }),
                });
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
            .map(|t| model::ToolSpec { name: t.name, description: t.description, input_schema: t.input_schema.to_string() })
            .collect())
    }

    async fn call(&mut self, calls: Vec<model::ToolCall>) -> Result<Vec<tools::ToolResult>, Error> {
        let (host, scope) = self.tool_host()?;
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
        if let Some(name) = uri.strip_prefix("builtin://") {
            return crate::BUILTIN_AGENTS
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, text)| text.as_bytes().to_vec())
                .ok_or_else(|| Error::NotFound(format!("no built-in agent {name:?}")));
        }
        let path = uri.strip_prefix("file://").unwrap_or(&uri);
        let canonical = std::fs::canonicalize(path).map_err(|e| Error::NotFound(format!("{path}: {e}")))?;
        let roots = &self.scope.services.resource_roots;
        if !roots.iter().any(|r| canonical.starts_with(r)) {
            return Err(Error::Denied(format!(
                "capability `resources` denied: {path} is outside the configured agent directories"
            )));
        }
        let meta = std::fs::metadata(&canonical).map_err(|e| Error::NotFound(format!("{path}: {e}")))?;
        if meta.len() > MAX_RESOURCE_BYTES {
            return Err(Error::InvalidInput(format!(
                "{path} is {} bytes; the limit is {MAX_RESOURCE_BYTES}",
                meta.len()
            )));
        }
        tokio::fs::read(&canonical).await.map_err(|e| Error::NotFound(format!("{path}: {e}")))
    }
}

/// What the HTTP import needs from one request after validation.
struct Outbound {
    method: reqwest::Method,
    url: reqwest::Url,
    headers: reqwest::header::HeaderMap,
    body: Option<Vec<u8>>,
    timeout: Duration,
}

impl HostState {
    fn prepare(&self, req: http::Request) -> Result<Outbound, Error> {
        let url = reqwest::Url::parse(&req.url)
            .map_err(|e| Error::InvalidInput(format!("invalid URL {:?}: {e}", req.url)))?;
        // The allow-list is checked before anything touches the network.
        self.scope.grants.check_url(&url)?;
        let method = reqwest::Method::from_bytes(req.method.to_ascii_uppercase().as_bytes())
            .map_err(|_| Error::InvalidInput(format!("invalid HTTP method {:?}", req.method)))?;
        let mut headers = reqwest::header::HeaderMap::new();
        for (k, v) in &req.headers {
            let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| Error::InvalidInput(format!("invalid header name {k:?}")))?;
            let value = reqwest::header::HeaderValue::from_str(v)
                .map_err(|_| Error::InvalidInput(format!("invalid value for header {k:?}")))?;
            headers.append(name, value);
        }
        if let Some(secret) = &req.auth_secret {
            let env = self.scope.grants.secret_env(secret)?;
            let value = std::env::var(env).map_err(|_| {
                Error::Unavailable(format!("secret `{secret}` is configured but its environment variable is not set"))
            })?;
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {value}"))
                .map_err(|_| Error::Unavailable(format!("secret `{secret}` is not a valid header value")))?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        if let Some(b) = &req.body {
            if b.len() > MAX_HTTP_REQUEST_BODY {
                return Err(Error::InvalidInput(format!(
                    "request body of {} bytes exceeds the limit of {MAX_HTTP_REQUEST_BODY} bytes",
                    b.len()
                )));
            }
        }
        let timeout = self.io_timeout(req.timeout_ms)?;
        Ok(Outbound { method, url, headers, body: req.body, timeout })
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
                if e.is_timeout() {
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
            grants.check_url(&next)?;
            if next.origin() != out.url.origin() {
                // Credentials never follow a redirect to another origin.
                out.headers.remove(reqwest::header::AUTHORIZATION);
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

fn response_headers(resp: &reqwest::Response) -> Vec<(String, String)> {
    resp.headers()
        .iter()
        .filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str().to_owned(), v.to_owned())))
        .collect()
}

impl http::Host for HostState {
    async fn send(&mut self, req: http::Request) -> Result<http::Response, Error> {
        let out = self.prepare(req)?;
        let timeout = out.timeout;
        let mut resp = dispatch(self.scope.services.http.clone(), self.scope.grants.clone(), out).await?;
        let status = resp.status().as_u16();
        let headers = response_headers(&resp);
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
        Ok(http::Response { status, headers, body })
    }

    async fn send_streaming(
        &mut self,
        req: http::Request,
    ) -> Result<(http::StreamHead, Resource<BodyStream>), Error> {
        let out = self.prepare(req)?;
        let resp = dispatch(self.scope.services.http.clone(), self.scope.grants.clone(), out).await?;
        let head = http::StreamHead { status: resp.status().as_u16(), headers: response_headers(&resp) };
        let handle = self
            .table
            .push(BodyStream { response: resp, delivered: 0 })
            .map_err(|e| Error::Internal(format!("cannot hold the response stream: {e}")))?;
        Ok((head, handle))
    }
}

impl http::HostBodyStream for HostState {
    async fn next(&mut self, stream: Resource<BodyStream>) -> Result<Option<Vec<u8>>, Error> {
        let timeout = self.io_timeout(None)?;
        let body = self
            .table
            .get_mut(&stream)
            .map_err(|e| Error::InvalidInput(format!("unknown body stream: {e}")))?;
        let chunk = tokio::time::timeout(timeout, body.response.chunk())
            .await
            .map_err(|_| Error::Timeout("reading the HTTP response stream timed out".into()))?
            .map_err(|e| body_error(&e))?;
        let Some(chunk) = chunk else { return Ok(None) };
        body.delivered += chunk.len() as u64;
        if body.delivered > MAX_HTTP_RESPONSE_BODY {
            return Err(Error::Remote(format!("response stream exceeds the limit of {MAX_HTTP_RESPONSE_BODY} bytes")));
        }
        Ok(Some(chunk.to_vec()))
    }

    async fn drop(&mut self, stream: Resource<BodyStream>) -> wasmtime::Result<()> {
        self.table.delete(stream)?;
        Ok(())
    }
}
