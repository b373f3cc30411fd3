//! OpenAI-compatible chat completions: `POST {base_url}/chat/completions`.
//!
//! Request: `messages` (system / user / assistant with `tool_calls` / tool with
//! `tool_call_id`), `tools` as `{"type":"function","function":{name, description,
//! parameters}}`, optional `max_tokens`, optional `reasoning_effort` (from
//! [`ChatRequest::reasoning_effort`]: `low`, `medium`, `high`, `xhigh` as named; `max`, which
//! the API does not name, as its highest level `xhigh`); with a sink, `stream: true` (and
//! `stream_options.include_usage`). The key, when configured, goes in
//! `Authorization: Bearer …`.
//!
//! Response: `choices[0].message` (`content`, `tool_calls[].function.arguments` as a JSON
//! string, `reasoning_content` — or `reasoning`, as newer vLLM names it), `finish_reason`,
//! `usage`. Streaming: `data:` chunks with `choices[0].delta` — content → [`ModelEvent::Token`],
//! `reasoning_content` → [`ModelEvent::Reasoning`], `tool_calls` fragments keyed by `index`
//! (id and name arrive once, `arguments` is concatenated) — ending with `data: [DONE]`.
//!
//! Normalisations (documented, deliberate): a response with tool calls but
//! `finish_reason: stop` (some local servers) is reported as [`FinishReason::ToolCalls`];
//! empty `arguments` mean `{}`; a tool call without an id gets `call_<index>`.
//!
//! [`ModelEvent::Token`]: crate::ModelEvent::Token
//! [`ModelEvent::Reasoning`]: crate::ModelEvent::Reasoning

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap};
use serde_json::{Value, json};

use crate::http;
use crate::{
    BoxFuture, ChatRequest, ChatResponse, DEFAULT_REQUEST_TIMEOUT, FinishReason, Message, ModelError, Provider,
    ReasoningEffort, Role, StreamSink, ToolCall, Usage,
};

/// `base_url` when none is configured.
pub const DEFAULT_OPENAI_BASE_URL: &str = "https://api.openai.com/v1";

/// The chat-completions field that carries a [`ReasoningEffort`].
pub const REASONING_SETTING: &str = "reasoning_effort";

/// The `reasoning_effort` value for `effort`: the API's own names, and its highest level
/// (`xhigh`) for `max`, which it does not name.
pub fn reasoning_effort(effort: ReasoningEffort) -> &'static str {
    match effort {
        ReasoningEffort::Low => "low",
        ReasoningEffort::Medium => "medium",
        ReasoningEffort::High => "high",
        ReasoningEffort::XHigh | ReasoningEffort::Max => "xhigh",
    }
}

/// Settings of an [`OpenAiProvider`].
#[derive(Debug, Clone)]
pub struct OpenAiOptions {
    /// The provider's key in `models.providers` (errors and logs name it).
    pub name: String,
    /// API root, without `/chat/completions`.
    pub base_url: String,
    /// Environment variable holding the bearer key; `None` sends no `Authorization`.
    pub api_key_env: Option<String>,
    /// Deadline per completion.
    pub timeout: Duration,
}

impl OpenAiOptions {
    pub fn new(name: impl Into<String>, base_url: impl Into<String>) -> Self {
        Self { name: name.into(), base_url: base_url.into(), api_key_env: None, timeout: DEFAULT_REQUEST_TIMEOUT }
    }
}

/// An OpenAI-compatible chat-completions provider.
#[derive(Debug)]
pub struct OpenAiProvider {
    opts: OpenAiOptions,
    url: String,
    client: reqwest::Client,
}

impl OpenAiProvider {
    pub fn new(opts: OpenAiOptions) -> Result<Self, ModelError> {
        let client = http::client(&opts.name)?;
        let url = format!("{}/chat/completions", opts.base_url.trim_end_matches('/'));
        Ok(Self { opts, url, client })
    }

    async fn run(&self, req: ChatRequest, sink: Option<StreamSink>) -> Result<ChatResponse, ModelError> {
        let name = self.opts.name.as_str();
        let key = http::read_key(name, self.opts.api_key_env.as_deref())?;
        let timeout = http::effective_timeout(req.timeout, self.opts.timeout);
        let result = http::with_deadline(name, timeout, async {
            let mut headers = HeaderMap::new();
            if let Some(key) = &key {
                headers.insert(AUTHORIZATION, http::secret_header(name, &format!("Bearer {key}"))?);
            }
            let body = request_body(&req, sink.is_some());
            tracing::debug!(provider = name, model = %req.model, url = %self.url, stream = sink.is_some(),
                messages = req.messages.len(), tools = req.tools.len(), "openai chat completion");
            let resp = http::post_json(name, &self.client, &self.url, headers, &body).await?;
            match sink {
                Some(sink) if http::is_event_stream(&resp) => read_stream(name, resp, &sink).await,
                sink => http::buffered(name, resp, sink.as_ref(), parse_response).await,
            }
        })
        .await;
        http::redacted(name, "openai completion failed", result, key.as_deref())
    }
}

impl Provider for OpenAiProvider {
    fn name(&self) -> &str {
        &self.opts.name
    }

    fn reasoning_setting(&self) -> Option<&'static str> {
        Some(REASONING_SETTING)
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
    let messages: Vec<Value> = req.messages.iter().map(message_json).collect();
    let mut body = json!({ "model": req.model, "messages": messages });
    if !req.tools.is_empty() {
        body["tools"] = req
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.input_schema,
                }})
            })
            .collect();
    }
    if let Some(max) = req.max_tokens {
        body["max_tokens"] = json!(max);
    }
    if let Some(effort) = req.reasoning_effort {
        body[REASONING_SETTING] = json!(reasoning_effort(effort));
    }
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

fn message_json(m: &Message) -> Value {
    match m.role {
        Role::System => json!({"role": "system", "content": m.content}),
        Role::User => json!({"role": "user", "content": m.content}),
        Role::Tool => json!({
            "role": "tool",
            "tool_call_id": m.tool_call_id.clone().unwrap_or_default(),
            "content": m.content,
        }),
        Role::Assistant => {
            let mut v = json!({"role": "assistant"});
            // `content` may be null when the message only calls tools.
            v["content"] =
                if m.content.is_empty() && !m.tool_calls.is_empty() { Value::Null } else { json!(m.content) };
            if !m.tool_calls.is_empty() {
                v["tool_calls"] = m
                    .tool_calls
                    .iter()
                    .map(|c| {
                        json!({"id": c.id, "type": "function", "function": {
                            "name": c.name,
                            // The wire format carries arguments as a JSON *string*.
                            "arguments": c.arguments.to_string(),
                        }})
                    })
                    .collect();
            }
            v
        }
    }
}

fn malformed(provider: &str, detail: impl Into<String>) -> ModelError {
    ModelError::Malformed { provider: provider.to_owned(), detail: detail.into() }
}

/// A provider-reported `{"error": {...}}` object, if `v` is one.
fn api_error(provider: &str, v: &Value) -> Option<ModelError> {
    let err = v.get("error")?;
    if err.is_null() {
        return None;
    }
    let message = err.get("message").and_then(Value::as_str).map(str::to_owned).unwrap_or_else(|| err.to_string());
    let kind = err
        .get("type")
        .or_else(|| err.get("code"))
        .map(|k| k.as_str().map(str::to_owned).unwrap_or_else(|| k.to_string()))
        .unwrap_or_else(|| "error".into());
    Some(ModelError::Provider { provider: provider.to_owned(), kind, message })
}

fn parse_arguments(provider: &str, name: &str, id: &str, raw: &str) -> Result<Value, ModelError> {
    if raw.trim().is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_str(raw).map_err(|e| {
        malformed(
            provider,
            format!(
                "arguments of tool call `{name}` ({id}) are not valid JSON ({e}): {}",
                http::excerpt(raw.as_bytes())
            ),
        )
    })
}

fn finish_reason(s: Option<&str>, has_tool_calls: bool) -> FinishReason {
    let reason = match s {
        Some("stop") | None => FinishReason::Stop,
        Some("tool_calls") | Some("function_call") => FinishReason::ToolCalls,
        Some("length") => FinishReason::Length,
        Some(other) => FinishReason::Other(other.to_owned()),
    };
    if has_tool_calls && reason == FinishReason::Stop { FinishReason::ToolCalls } else { reason }
}

fn usage(v: &Value) -> Option<Usage> {
    let u = v.get("usage").filter(|u| u.is_object())?;
    Some(Usage {
        input_tokens: u.get("prompt_tokens").and_then(Value::as_u64).unwrap_or(0),
        output_tokens: u.get("completion_tokens").and_then(Value::as_u64).unwrap_or(0),
    })
}

fn reasoning_of(v: &Value) -> Option<&str> {
    v.get("reasoning_content").and_then(Value::as_str).or_else(|| v.get("reasoning").and_then(Value::as_str))
}

/// Parse a non-streaming chat-completion body.
pub fn parse_response(provider: &str, body: &[u8]) -> Result<ChatResponse, ModelError> {
    let v = http::parse_json(provider, "chat completion body", body)?;
    if let Some(e) = api_error(provider, &v) {
        return Err(e);
    }
    let choice = v
        .get("choices")
        .and_then(Value::as_array)
        .ok_or_else(|| malformed(provider, "missing `choices` array"))?
        .first()
        .ok_or_else(|| malformed(provider, "`choices` is empty"))?;
    let msg = choice
        .get("message")
        .filter(|m| m.is_object())
        .ok_or_else(|| malformed(provider, "missing `choices[0].message`"))?;
    let content = match msg.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(malformed(provider, format!("`choices[0].message.content` is not a string: {other}")));
        }
    };
    let mut tool_calls = Vec::new();
    if let Some(calls) = msg.get("tool_calls").filter(|c| !c.is_null()) {
        let calls = calls.as_array().ok_or_else(|| malformed(provider, "`message.tool_calls` is not an array"))?;
        for (i, c) in calls.iter().enumerate() {
            let f =
                c.get("function").ok_or_else(|| malformed(provider, format!("`tool_calls[{i}].function` missing")))?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| malformed(provider, format!("`tool_calls[{i}].function.name` missing")))?;
            let id = c
                .get("id")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map_or_else(|| format!("call_{i}"), str::to_owned);
            let arguments = match f.get("arguments") {
                None | Some(Value::Null) => json!({}),
                Some(Value::String(raw)) => parse_arguments(provider, name, &id, raw)?,
                // Some servers send an object instead of a string; accept it as is.
                Some(obj) => obj.clone(),
            };
            tool_calls.push(ToolCall { id, name: name.to_owned(), arguments });
        }
    }
    let finish = finish_reason(choice.get("finish_reason").and_then(Value::as_str), !tool_calls.is_empty());
    Ok(ChatResponse {
        message: Message::assistant_tool_calls(content, tool_calls),
        finish_reason: finish,
        reasoning: reasoning_of(msg).filter(|r| !r.is_empty()).map(str::to_owned),
        usage: usage(&v),
    })
}

#[derive(Default)]
struct PartialCall {
    id: Option<String>,
    name: String,
    arguments: String,
}

async fn read_stream(provider: &str, resp: reqwest::Response, sink: &StreamSink) -> Result<ChatResponse, ModelError> {
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut calls: BTreeMap<u64, PartialCall> = BTreeMap::new();
    let mut finish: Option<String> = None;
    let mut usage_seen: Option<Usage> = None;
    let mut done = false;

    http::read_sse(provider, resp, |ev| {
        let data = ev.data.trim();
        if data == "[DONE]" {
            done = true;
            return Ok(true);
        }
        if data.is_empty() {
            return Ok(false);
        }
        let v = http::parse_json(provider, "stream chunk", data.as_bytes())?;
        if let Some(e) = api_error(provider, &v) {
            return Err(e);
        }
        if let Some(u) = usage(&v) {
            usage_seen = Some(u);
        }
        let Some(choice) = v.get("choices").and_then(Value::as_array).and_then(|c| c.first()) else {
            return Ok(false); // e.g. the final usage-only chunk
        };
        if let Some(delta) = choice.get("delta") {
            if let Some(r) = reasoning_of(delta) {
                reasoning.push_str(r);
                sink.reasoning(r);
            }
            if let Some(t) = delta.get("content").and_then(Value::as_str) {
                content.push_str(t);
                sink.token(t);
            }
            if let Some(frags) = delta.get("tool_calls").and_then(Value::as_array) {
                for (pos, frag) in frags.iter().enumerate() {
                    let index = frag.get("index").and_then(Value::as_u64).unwrap_or(pos as u64);
                    let call = calls.entry(index).or_default();
                    if let Some(id) = frag.get("id").and_then(Value::as_str).filter(|s| !s.is_empty()) {
                        call.id.get_or_insert_with(|| id.to_owned());
                    }
                    if let Some(f) = frag.get("function") {
                        if let Some(n) = f.get("name").and_then(Value::as_str) {
                            // Normally sent once (rarely in pieces); some servers repeat
                            // the whole name in every fragment — never double it.
                            if call.name != n {
                                call.name.push_str(n);
                            }
                        }
                        if let Some(a) = f.get("arguments").and_then(Value::as_str) {
                            call.arguments.push_str(a);
                        }
                    }
                }
            }
        }
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            finish = Some(f.to_owned());
        }
        Ok(false)
    })
    .await?;

    if !done && finish.is_none() {
        return Err(malformed(provider, "stream ended before a finish_reason or `data: [DONE]`"));
    }
    let mut tool_calls = Vec::with_capacity(calls.len());
    for (index, c) in calls {
        if c.name.is_empty() {
            return Err(malformed(provider, format!("streamed tool call #{index} has no function name")));
        }
        let id = c.id.unwrap_or_else(|| format!("call_{index}"));
        let arguments = parse_arguments(provider, &c.name, &id, &c.arguments)?;
        tool_calls.push(ToolCall { id, name: c.name, arguments });
    }
    let finish = finish_reason(finish.as_deref(), !tool_calls.is_empty());
    Ok(ChatResponse {
        message: Message::assistant_tool_calls(content, tool_calls),
        finish_reason: finish,
        reasoning: (!reasoning.is_empty()).then_some(reasoning),
        usage: usage_seen,
    })
}
