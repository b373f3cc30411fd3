//! # warden-models — the model providers behind warden's `model` capability
//!
//! Plugins (the Claude-format agent loop above all) ask the host for chat completions
//! with tool calls. This crate is what the host answers them with:
//!
//! - [`openai::OpenAiProvider`] — any OpenAI-compatible `POST {base_url}/chat/completions`
//!   (OpenAI, vLLM, llama.cpp, Ollama, LM Studio, …), with tool calls, SSE streaming and
//!   `reasoning_content`.
//! - [`anthropic::AnthropicProvider`] — the Anthropic Messages API (`POST /v1/messages`),
//!   with `tool_use` / `tool_result` blocks, thinking, and SSE streaming.
//! - [`scripted::ScriptedProvider`] — an offline stand-in for an LLM that replays turns
//!   from a YAML file, for demos and tests. It is not a model and never pretends to be one.
//! - [`ModelRouter`] — built from the `models:` section of `warden.yaml`
//!   ([`ModelsConfig`]); turns a model name (`provider/model`, an alias such as `sonnet`,
//!   or nothing) into a provider and a provider-local model name.
//!
//! Every provider implements [`Provider::complete`]: one [`ChatRequest`] in, one
//! [`ChatResponse`] out; while streaming, text and reasoning fragments go to an optional
//! [`StreamSink`] as [`ModelEvent`]s (the host turns them into `token` / `reasoning`
//! events of the task's event stream).
//!
//! ## What this crate must never do
//! - **Leak an API key.** Keys are read from the environment variable named in the
//!   configuration (`api_key_env`), at request time, and only ever put into a request
//!   header marked sensitive. They are never logged (tracing fields carry provider, model
//!   and URL only), never part of a [`ModelError`] text (errors are scrubbed of the key even
//!   if a server echoes it back), and never returned to a caller — so never to a plugin.
//!   Redirects are never followed, so the key never goes to a location a server chose
//!   ([`ModelError::Redirect`]).
//! - **Hang or grow without bound.** Every request has a deadline ([`DEFAULT_REQUEST_TIMEOUT`]
//!   unless configured) and response bodies are capped ([`MAX_RESPONSE_BYTES`]).
//! - **Guess.** A body that does not have the documented shape is a
//!   [`ModelError::Malformed`] naming what was wrong, not a silently empty answer.
//! - **Retry behind the caller's back.** A 429 or 5xx is reported as [`ModelError::Http`]
//!   (with `retry_after` when the server sent one); the caller decides.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub mod anthropic;
pub mod config;
mod http;
pub mod openai;
pub mod router;
pub mod scripted;

pub use config::{ApiKeyEnv, ModelsConfig, ProviderConfig, ProviderKind};
pub use router::ModelRouter;

/// Deadline for one whole completion (connect, request, and the full — possibly
/// streamed — response) when the provider's `timeout` is not configured. Generous,
/// because long answers from slow local models take minutes; the host additionally
/// bounds every call by the plugin call's own deadline via [`ChatRequest::timeout`].
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(300);

/// Deadline for establishing the TCP/TLS connection to a provider.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest response body (or total streamed bytes) accepted from a provider.
/// A chat completion is kilobytes; anything near this is a broken or hostile server.
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// How much of an error response body is kept in [`ModelError::Http::body_excerpt`].
pub const MAX_ERROR_EXCERPT_CHARS: usize = 512;

/// `max_tokens` sent to the Anthropic Messages API (where it is mandatory) when the
/// request does not set one.
pub const DEFAULT_ANTHROPIC_MAX_TOKENS: u32 = 4096;

/// A boxed, `Send` future — the return type of [`Provider::complete`] (same shape as
/// `futures::future::BoxFuture`, without the dependency).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Who wrote a [`Message`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    /// The result of a tool call; [`Message::tool_call_id`] says which call.
    Tool,
}

/// A tool call the model asked for (in an assistant message).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Provider-assigned id; echoed back in the [`Role::Tool`] message answering it.
    pub id: String,
    pub name: String,
    /// The arguments as a JSON value (normally an object).
    pub arguments: serde_json::Value,
}

/// One message of a conversation, in a provider-neutral shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    /// Text content. For [`Role::Tool`], the tool's result text.
    #[serde(default)]
    pub content: String,
    /// Tool calls (assistant messages only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The call this message answers ([`Role::Tool`] messages only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    fn new(role: Role, content: impl Into<String>) -> Self {
        Self { role, content: content.into(), tool_calls: Vec::new(), tool_call_id: None }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content)
    }
    /// An assistant message that calls tools.
    pub fn assistant_tool_calls(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        Self { tool_calls, ..Self::new(Role::Assistant, content) }
    }
    /// The result of tool call `tool_call_id`.
    pub fn tool_result(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self { tool_call_id: Some(tool_call_id.into()), ..Self::new(Role::Tool, content) }
    }
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the arguments object.
    pub input_schema: serde_json::Value,
}

/// One completion request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// Provider-local model name (what [`ModelRouter::resolve`] returned).
    pub model: String,
    pub messages: Vec<Message>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// How hard the model should think, for providers with a reasoning setting
    /// ([`Provider::reasoning_setting`]); the others ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<ReasoningEffort>,
    /// Deadline for this request; the shorter of this and the provider's configured
    /// timeout applies. The host passes the plugin call's remaining deadline here.
    #[serde(skip)]
    pub timeout: Option<Duration>,
}

impl ChatRequest {
    pub fn new(model: impl Into<String>, messages: Vec<Message>) -> Self {
        Self {
            model: model.into(),
            messages,
            tools: Vec::new(),
            max_tokens: None,
            reasoning_effort: None,
            timeout: None,
        }
    }
}

/// A reasoning effort level, as Claude Code's `effort` names them (`low` … `max`). What a
/// provider sends for it is the provider's business ([`Provider::reasoning_setting`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReasoningEffort {
    Low,
    Medium,
    High,
    /// Above `high` (Claude Code's `xhigh`; OpenAI's `xhigh`).
    #[serde(rename = "xhigh")]
    XHigh,
    /// The most a model offers (Claude Code's `max`).
    Max,
}

impl ReasoningEffort {
    /// Every level, lowest first.
    pub const ALL: [ReasoningEffort; 5] = [Self::Low, Self::Medium, Self::High, Self::XHigh, Self::Max];

    /// The level named as in agent files (`low`, `medium`, `high`, `xhigh`, `max`; case and
    /// surrounding blanks ignored), or `None`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.as_str().eq_ignore_ascii_case(name.trim()))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
            Self::XHigh => "xhigh",
            Self::Max => "max",
        }
    }
}

impl fmt::Display for ReasoningEffort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A natural end of the answer (or a stop sequence).
    Stop,
    /// The model wants the tool calls in [`ChatResponse::message`] run.
    ToolCalls,
    /// Cut off by `max_tokens`.
    Length,
    /// Anything else the provider reported, verbatim.
    Other(String),
}

/// Token accounting, when the provider reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// The result of one completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    /// The assistant message (text and/or tool calls).
    pub message: Message,
    pub finish_reason: FinishReason,
    /// Reasoning / thinking text, when the model exposed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// A fragment produced while a completion streams.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModelEvent {
    /// Answer text, in order; the fragments concatenate to the final content.
    Token(String),
    /// Reasoning / thinking text, in order.
    Reasoning(String),
}

/// Where streamed [`ModelEvent`]s go. Cheap to clone; called synchronously from the
/// provider's task, so it should not block (push into a channel or an event log).
#[derive(Clone)]
pub struct StreamSink(Arc<dyn Fn(ModelEvent) + Send + Sync>);

impl StreamSink {
    pub fn new(f: impl Fn(ModelEvent) + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// A sink feeding an unbounded channel, and its receiving end. Events sent after
    /// the receiver is dropped are discarded.
    pub fn channel() -> (Self, tokio::sync::mpsc::UnboundedReceiver<ModelEvent>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (Self::new(move |ev| drop(tx.send(ev))), rx)
    }

    pub fn send(&self, event: ModelEvent) {
        (self.0)(event)
    }

    pub(crate) fn token(&self, text: &str) {
        if !text.is_empty() {
            self.send(ModelEvent::Token(text.to_owned()))
        }
    }

    pub(crate) fn reasoning(&self, text: &str) {
        if !text.is_empty() {
            self.send(ModelEvent::Reasoning(text.to_owned()))
        }
    }
}

impl fmt::Debug for StreamSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StreamSink")
    }
}

/// Everything that can go wrong with a completion. Texts name the provider key from the
/// configuration and what went wrong; they never contain an API key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The provider answered with a non-success HTTP status (429, 5xx, 401, 400, …).
    #[error("model provider `{provider}`: HTTP {status}{}: {body_excerpt}", fmt_retry(retry_after))]
    Http {
        provider: String,
        status: u16,
        /// From a `Retry-After` header (seconds form), when present.
        retry_after: Option<Duration>,
        /// The start of the response body (at most [`MAX_ERROR_EXCERPT_CHARS`]).
        body_excerpt: String,
    },
    /// The provider answered with a redirect (3xx). Redirects are never followed: the
    /// request carries the API key, which must not travel to a location the server chose.
    #[error(
        "model provider `{provider}`: HTTP {status} redirect to {}; redirects are not followed \
         (the API key would go with it): set `base_url` to the final address",
        location.as_deref().unwrap_or("(no Location header)")
    )]
    Redirect {
        provider: String,
        status: u16,
        /// The `Location` header, as sent (lossily decoded), when present.
        location: Option<String>,
    },
    /// The response was not what the API documents: bad JSON, a missing field, a
    /// stream that ended early. `detail` says which.
    #[error("model provider `{provider}`: malformed response: {detail}")]
    Malformed { provider: String, detail: String },
    /// No complete response within the deadline.
    #[error("model provider `{provider}`: no complete response within {}", humantime::format_duration(*after))]
    Timeout { provider: String, after: Duration },
    /// The provider could not be reached (refused, DNS, TLS).
    #[error("model provider `{provider}`: cannot connect to {url}: {detail}")]
    Connect { provider: String, url: String, detail: String },
    /// The provider reported an error inside a successful response (e.g. an SSE
    /// `error` event such as `overloaded_error`).
    #[error("model provider `{provider}`: provider error ({kind}): {message}")]
    Provider { provider: String, kind: String, message: String },
    /// Another transport failure (connection reset mid-body, …).
    #[error("model provider `{provider}`: request failed: {detail}")]
    Transport { provider: String, detail: String },
    /// Bad or incomplete configuration (unknown type, missing `script`, unset key variable…).
    #[error("model configuration: {0}")]
    Config(String),
    /// A model name that is neither `provider/model` with a configured provider nor an alias.
    #[error("unknown model `{name}`; {available}")]
    UnknownModel { name: String, available: String },
    /// The scripted model has no turn left for this request.
    #[error(
        "scripted model `{provider}`: script {script} has {turns} turn(s) and all are used \
         (the request already holds {turns} assistant message(s))"
    )]
    ScriptExhausted { provider: String, script: String, turns: usize },
    /// A scripted `error:` turn: a simulated provider failure.
    #[error("scripted model `{provider}`: simulated provider failure at turn {turn}: {message}")]
    ScriptedFailure { provider: String, turn: usize, message: String },
    /// A scripted turn's `expect:` did not hold for the request.
    #[error("scripted model `{provider}`: turn {turn} expectation failed: {detail}")]
    ScriptMismatch { provider: String, turn: usize, detail: String },
}

fn fmt_retry(retry_after: &Option<Duration>) -> String {
    match retry_after {
        Some(d) => format!(" (retry after {})", humantime::format_duration(*d)),
        None => String::new(),
    }
}

impl ModelError {
    /// Whether retrying the same request later may succeed (429, 5xx, timeouts,
    /// connection failures, provider-side overload).
    pub fn is_transient(&self) -> bool {
        match self {
            ModelError::Http { status, .. } => *status == 429 || *status >= 500,
            ModelError::Timeout { .. }
            | ModelError::Connect { .. }
            | ModelError::Transport { .. }
            | ModelError::Provider { .. } => true,
            _ => false,
        }
    }

    /// Replace every occurrence of `secret` in the error's texts with `[REDACTED]`.
    pub(crate) fn redact(self, secret: Option<&str>) -> Self {
        let Some(secret) = secret.filter(|s| !s.is_empty()) else { return self };
        let r = |s: String| if s.contains(secret) { s.replace(secret, "[REDACTED]") } else { s };
        match self {
            ModelError::Http { provider, status, retry_after, body_excerpt } => {
                ModelError::Http { provider, status, retry_after, body_excerpt: r(body_excerpt) }
            }
            ModelError::Redirect { provider, status, location } => {
                ModelError::Redirect { provider, status, location: location.map(r) }
            }
            ModelError::Malformed { provider, detail } => ModelError::Malformed { provider, detail: r(detail) },
            ModelError::Connect { provider, url, detail } => {
                ModelError::Connect { provider, url: r(url), detail: r(detail) }
            }
            ModelError::Provider { provider, kind, message } => {
                ModelError::Provider { provider, kind: r(kind), message: r(message) }
            }
            ModelError::Transport { provider, detail } => ModelError::Transport { provider, detail: r(detail) },
            ModelError::Config(s) => ModelError::Config(r(s)),
            other => other,
        }
    }
}

/// A chat-completion backend. Implementations are stateless per call (the whole
/// conversation is in the request), so one instance serves any number of concurrent tasks.
pub trait Provider: Send + Sync {
    /// The provider's key in `models.providers` (used in errors and logs).
    fn name(&self) -> &str;

    /// The request field [`ChatRequest::reasoning_effort`] becomes (`reasoning_effort` for
    /// OpenAI-compatible servers), or `None` when the provider has no reasoning setting and
    /// ignores it.
    fn reasoning_setting(&self) -> Option<&'static str> {
        None
    }

    /// Run one completion. With a `sink`, the provider streams and sends text and
    /// reasoning fragments to it as they arrive; the returned response is complete
    /// either way.
    fn complete<'a>(
        &'a self,
        req: ChatRequest,
        sink: Option<StreamSink>,
    ) -> BoxFuture<'a, Result<ChatResponse, ModelError>>;
}
