//! Anthropic Messages API: `POST {base_url}/v1/messages`.
//!
//! Headers: `x-api-key` (from the configured env var), `anthropic-version: 2023-06-01`.
//! Mapping from the common [`Message`] shape:
//! - system messages → the top-level `system` string (joined by blank lines);
//! - user text → a `text` block; assistant text and tool calls → `text` + `tool_use`
//!   (`id`, `name`, `input`) blocks;
//! - tool results → `tool_result` blocks (`tool_use_id`, `content`) in a user message;
//!   consecutive messages of the same role (e.g. several tool results, or tool results
//!   followed by user text) are merged into one message, as the API expects;
//! - empty text is omitted (the API rejects empty text blocks).
//!
//! Response: `content` blocks — `text` → content, `tool_use` → [`ToolCall`], `thinking` →
//! [`ChatResponse::reasoning`] (`redacted_thinking` and unknown block types are skipped);
//! `stop_reason` `end_turn`/`stop_sequence` → Stop, `tool_use` → ToolCalls, `max_tokens`
//! → Length; `usage.input_tokens`/`output_tokens`.
//!
//! Streaming (with a sink): `message_start`, `content_block_start`, `content_block_delta`
//! (`text_delta` → Token, `thinking_delta` → Reasoning, `input_json_delta` concatenated per
//! block, `signature_delta` ignored), `content_block_stop`, `message_delta` (`stop_reason`,
//! output usage), `message_stop`; `ping` is ignored and an `error` event fails the call.
//!
//! Extended thinking is not requested by this provider (there is no place in the common
//! message shape to carry signed thinking blocks back, which the API requires with tool
//! use); thinking returned anyway (e.g. by a gateway that enables it) is reported. For the
//! same reason the provider has no reasoning setting: [`crate::ChatRequest::reasoning_effort`]
//! is ignored.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName};
use serde_json::{Value, json};

use crate::http;
use crate::{
    BoxFuture, ChatRequest, ChatResponse, DEFAULT_ANTHROPIC_MAX_TOKENS, DEFAULT_REQUEST_TIMEOUT, FinishReason, Message,
    ModelError, Provider, Role, StreamSink, ToolCall, Usage,
};

/// `base_url` when none is configured.
pub const DEFAULT_ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";
/// The `anthropic-version` header sent with every request.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// The variable read for the key when `api_key_env` is not mentioned.
pub const DEFAULT_ANTHROPIC_KEY_ENV: &str = "ANTHROPIC_API_KEY";

/// Settings of an [`AnthropicProvider`].
#[derive(Debug, Clone)]
pub struct AnthropicOptions {
    /// The provider's key in `models.providers`.
    pub name: String,
    /// API root, without `/v1/messages`.
    pub base_url: String,
    /// Environment variable holding the key (`x-api-key`); `None` sends none.
    pub api_key_env: Option<String>,
    /// Deadline per completion.
    pub timeout: Duration,
}

impl AnthropicOptions {
    pub fn new(name: impl Into<String>, base_url: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            base_url: base_url.into(),
            api_key_env: Some(DEFAULT_ANTHROPIC_KEY_ENV.into()),
            timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }
}

/// An Anthropic Messages API provider.
#[derive(Debug)]
pub struct AnthropicProvider {
    opts: AnthropicOptions,
    url: String,
    client: reqwest::Client,
}

impl AnthropicProvider {
    pub fn new(opts: AnthropicOptions) -> Result<Self, ModelError> {
        let client = http::client(&opts.name)?;
        let url = format!("{}/v1/messages", opts.base_url.trim_end_matches('/'));
        Ok(Self { opts, url, client })
    }

    async fn run(&self, req: ChatRequest, sink: Option<StreamSink>) -> Result<ChatResponse, ModelError> {
        let name = self.opts.name.as_str();
        let key = http::read_key(name, self.opts.api_key_env.as_deref())?;
        let timeout = http::effective_timeout(req.timeout, self.opts.timeout);
        let result = http::with_deadline(name, timeout, async {
            let mut headers = HeaderMap::new();
            if let Some(key) = &key {
                headers.insert(HeaderName::from_static("x-api-key"), http::secret_header(name, key)?);
            }
            http::header(&mut headers, "anthropic-version", ANTHROPIC_VERSION);
            let body = request_body(&req, sink.is_some());
            tracing::debug!(provider = name, model = %req.model, url = %self.url, stream = sink.is_some(),
                messages = req.messages.len(), tools = req.tools.len(), "anthropic messages request");
            let resp = http::post_json(name, &self.client, &self.url, headers, &body).await?;
            match sink {
                Some(sink) if http::is_event_stream(&resp) => read_stream(name, resp, &sink).await,
                sink => http::buffered(name, resp, sink.as_ref(), parse_response).await,
            }
        })
        .await;
        http::redacted(name, "anthropic request failed", result, key.as_deref())
    }
}

impl Provider for AnthropicProvider {
    fn name(&self) -> &str {
        &self.opts.name
    }

    fn complete<'a>(
        &'a self,
        req: ChatRequest,
        sink: Option<StreamSink>,
    ) -> BoxFuture<'a, Result<ChatResponse, ModelError>> {
        Box::pin(self.run(req, sink))
    }
}

/// The JSON request body for `req`.
pub fn request_body(req: &ChatRequest, stream: bool) -> Value {
    let system: Vec<&str> = req
        .messages
        .iter()
        .filter(|m| m.role == Role::System && !m.content.is_empty())
        .map(|m| m.content.as_str())
        .collect();
    let mut messages: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for m in &req.messages {
        let (role, blocks) = match m.role {
            Role::System => continue,
            Role::User => ("user", text_block(&m.content).into_iter().collect::<Vec<_>>()),
            Role::Tool => (
                "user",
                vec![json!({
                    "type": "tool_result",
                    "tool_use_id": m.tool_call_id.clone().unwrap_or_default(),
                    "content": m.content,
                })],
            ),
            Role::Assistant => {
                let mut blocks: Vec<Value> = text_block(&m.content).into_iter().collect();
                blocks.extend(m.tool_calls.iter().map(
                    |c| json!({"type": "tool_use", "id": c.id, "name": c.name, "input": tool_input(&c.arguments)}),
                ));
                ("assistant", blocks)
            }
        };
        if blocks.is_empty() {
            continue;
        }
        match messages.last_mut() {
            Some((last, existing)) if *last == role => existing.extend(blocks),
            _ => messages.push((role, blocks)),
        }
    }
    let messages: Vec<Value> =
        messages.into_iter().map(|(role, content)| json!({"role": role, "content": content})).collect();
    let mut body = json!({
        "model": req.model,
        "max_tokens": req.max_tokens.unwrap_or(DEFAULT_ANTHROPIC_MAX_TOKENS),
        "messages": messages,
    });
    if !system.is_empty() {
        body["system"] = json!(system.join("\n\n"));
    }
    if !req.tools.is_empty() {
        body["tools"] = req
            .tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.input_schema}))
            .collect();
    }
    if stream {
        body["stream"] = json!(true);
    }
    body
}

fn text_block(text: &str) -> Option<Value> {
    (!text.is_empty()).then(|| json!({"type": "text", "text": text}))
}

/// `tool_use.input` must be an object.
fn tool_input(args: &Value) -> Value {
    match args {
        Value::Object(_) => args.clone(),
        Value::Null => json!({}),
        other => json!({ "value": other }),
    }
}

fn malformed(provider: &str, detail: impl Into<String>) -> ModelError {
    ModelError::Malformed { provider: provider.to_owned(), detail: detail.into() }
}

/// `{"type":"error","error":{"type":…,"message":…}}`, if `v` is one.
fn api_error(provider: &str, v: &Value) -> Option<ModelError> {
    if v.get("type").and_then(Value::as_str) != Some("error") {
        return None;
    }
    let err = v.get("error").cloned().unwrap_or(Value::Null);
    Some(ModelError::Provider {
        provider: provider.to_owned(),
        kind: err.get("type").and_then(Value::as_str).unwrap_or("error").to_owned(),
        message: err.get("message").and_then(Value::as_str).map(str::to_owned).unwrap_or_else(|| err.to_string()),
    })
}

fn stop_reason(s: Option<&str>, has_tool_calls: bool) -> FinishReason {
    match s {
        Some("end_turn") | Some("stop_sequence") => FinishReason::Stop,
        Some("tool_use") => FinishReason::ToolCalls,
        Some("max_tokens") => FinishReason::Length,
        Some(other) => FinishReason::Other(other.to_owned()),
        None if has_tool_calls => FinishReason::ToolCalls,
        None => FinishReason::Stop,
    }
}

fn tool_call(provider: &str, i: usize, b: &Value) -> Result<ToolCall, ModelError> {
    let id = b
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| malformed(provider, format!("`content[{i}]` (tool_use) has no `id`")))?;
    let name = b
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| malformed(provider, format!("`content[{i}]` (tool_use) has no `name`")))?;
    Ok(ToolCall {
        id: id.to_owned(),
        name: name.to_owned(),
        arguments: b.get("input").cloned().unwrap_or_else(|| json!({})),
    })
}

/// Parse a non-streaming Messages API body.
pub fn parse_response(provider: &str, body: &[u8]) -> Result<ChatResponse, ModelError> {
    let v = http::parse_json(provider, "messages response body", body)?;
    if let Some(e) = api_error(provider, &v) {
        return Err(e);
    }
    let blocks =
        v.get("content").and_then(Value::as_array).ok_or_else(|| malformed(provider, "missing `content` array"))?;
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(
                b.get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| malformed(provider, format!("`content[{i}]` (text) has no `text`")))?,
            ),
            Some("thinking") => reasoning.push_str(b.get("thinking").and_then(Value::as_str).unwrap_or_default()),
            Some("tool_use") => calls.push(tool_call(provider, i, b)?),
            Some(_) => {} // redacted_thinking, server tool blocks, …
            None => return Err(malformed(provider, format!("`content[{i}]` has no `type`"))),
        }
    }
    let usage = v.get("usage").filter(|u| u.is_object()).map(|u| Usage {
        input_tokens: u.get("input_tokens").and_then(Value::as_u64).unwrap_or(0),
        output_tokens: u.get("output_tokens").and_then(Value::as_u64).unwrap_or(0),
    });
    let finish = stop_reason(v.get("stop_reason").and_then(Value::as_str), !calls.is_empty());
    Ok(ChatResponse {
        message: Message::assistant_tool_calls(text, calls),
        finish_reason: finish,
        reasoning: (!reasoning.is_empty()).then_some(reasoning),
        usage,
    })
}

enum Block {
    Text(String),
    Thinking(String),
    ToolUse { id: String, name: String, initial: Value, json: String },
    Other,
}

async fn read_stream(provider: &str, resp: reqwest::Response, sink: &StreamSink) -> Result<ChatResponse, ModelError> {
    let mut blocks: BTreeMap<u64, Block> = BTreeMap::new();
    let mut usage = Usage::default();
    let mut usage_seen = false;
    let mut stop: Option<String> = None;
    let mut stopped = false;

    http::read_sse(provider, resp, |ev| {
        if ev.data.trim().is_empty() {
            return Ok(false);
        }
        let v = http::parse_json(provider, "stream event", ev.data.as_bytes())?;
        if let Some(e) = api_error(provider, &v) {
            return Err(e);
        }
        let kind = v.get("type").and_then(Value::as_str).or(ev.event.as_deref()).unwrap_or_default();
        let index = || {
            v.get("index")
                .and_then(Value::as_u64)
                .ok_or_else(|| malformed(provider, format!("`{kind}` event without `index`")))
        };
        match kind {
            "message_start" => {
                if let Some(u) = v.pointer("/message/usage") {
                    usage_seen = true;
                    usage.input_tokens = u.get("input_tokens").and_then(Value::as_u64).unwrap_or(0);
                    usage.output_tokens = u.get("output_tokens").and_then(Value::as_u64).unwrap_or(0);
                }
            }
            "content_block_start" => {
                let i = index()?;
                let b = v
                    .get("content_block")
                    .ok_or_else(|| malformed(provider, "`content_block_start` without `content_block`"))?;
                let block = match b.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        let t = b.get("text").and_then(Value::as_str).unwrap_or_default();
                        sink.token(t);
                        Block::Text(t.to_owned())
                    }
                    Some("thinking") => {
                        let t = b.get("thinking").and_then(Value::as_str).unwrap_or_default();
                        sink.reasoning(t);
                        Block::Thinking(t.to_owned())
                    }
                    Some("tool_use") => {
                        let c = tool_call(provider, i as usize, b)?;
                        Block::ToolUse { id: c.id, name: c.name, initial: c.arguments, json: String::new() }
                    }
                    _ => Block::Other,
                };
                blocks.insert(i, block);
            }
            "content_block_delta" => {
                let i = index()?;
                let d = v.get("delta").ok_or_else(|| malformed(provider, "`content_block_delta` without `delta`"))?;
                let block = blocks.get_mut(&i).ok_or_else(|| {
                    malformed(provider, format!("`content_block_delta` for block {i} before its start"))
                })?;
                match (d.get("type").and_then(Value::as_str), block) {
                    (Some("text_delta"), Block::Text(t)) => {
                        let s = d.get("text").and_then(Value::as_str).unwrap_or_default();
                        sink.token(s);
                        t.push_str(s);
                    }
                    (Some("thinking_delta"), Block::Thinking(t)) => {
                        let s = d.get("thinking").and_then(Value::as_str).unwrap_or_default();
                        sink.reasoning(s);
                        t.push_str(s);
                    }
                    (Some("input_json_delta"), Block::ToolUse { json, .. }) => {
                        json.push_str(d.get("partial_json").and_then(Value::as_str).unwrap_or_default());
                    }
                    (Some("signature_delta"), _) | (_, Block::Other) => {}
                    (t, _) => {
                        return Err(malformed(provider, format!("delta type {t:?} does not fit content block {i}")));
                    }
                }
            }
            "message_delta" => {
                if let Some(s) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    stop = Some(s.to_owned());
                }
                if let Some(o) = v.pointer("/usage/output_tokens").and_then(Value::as_u64) {
                    usage_seen = true;
                    usage.output_tokens = o;
                }
            }
            "message_stop" => {
                stopped = true;
                return Ok(true);
            }
            _ => {} // ping, content_block_stop, future event types
        }
        Ok(false)
    })
    .await?;

    if !stopped {
        return Err(malformed(provider, "stream ended before `message_stop`"));
    }
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for block in blocks.into_values() {
        match block {
            Block::Text(t) => text.push_str(&t),
            Block::Thinking(t) => reasoning.push_str(&t),
            Block::ToolUse { id, name, initial, json } => {
                let arguments = if json.trim().is_empty() {
                    initial
                } else {
                    serde_json::from_str(&json).map_err(|e| {
                        malformed(
                            provider,
                            format!("streamed input of tool call `{name}` ({id}) is not valid JSON ({e})"),
                        )
                    })?
                };
                calls.push(ToolCall { id, name, arguments });
            }
            Block::Other => {}
        }
    }
    let finish = stop_reason(stop.as_deref(), !calls.is_empty());
    Ok(ChatResponse {
        message: Message::assistant_tool_calls(text, calls),
        finish_reason: finish,
        reasoning: (!reasoning.is_empty()).then_some(reasoning),
        usage: usage_seen.then_some(usage),
    })
}
