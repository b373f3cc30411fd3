//! Every subagent as an A2A agent: `GET /a2a` (the directory of cards),
//! `GET /a2a/{subagent}/.well-known/agent-card.json` (one card) and `POST /a2a/{subagent}`
//! (JSON-RPC 2.0).
//!
//! One card serves both generations of clients: protocol 1.0 (`supportedInterfaces`, here
//! with a 1.0 and a 0.3 JSON-RPC interface at the same URL) and the 0.3 fields (`url`,
//! `preferredTransport`, `protocolVersion`). The method name picks the dialect of the
//! answer: `SendMessage`, `SendStreamingMessage`, `GetTask`, `CancelTask`,
//! `SubscribeToTask`, `ListTasks` speak 1.0 (ProtoJSON: `TASK_STATE_*`, `ROLE_*`, results
//! wrapped as `{"task": ..}` / `{"statusUpdate": ..}`); `message/send`, `message/stream`,
//! `tasks/get`, `tasks/cancel`, `tasks/resubscribe` speak 0.3 (`kind`-tagged objects,
//! lowercase-hyphen states).
//!
//! This module owns the translation only; it is a thin layer over the task engine with
//! one task model: an A2A task id *is* the warden task id, an A2A `contextId` *is* the
//! warden session (same sandbox), a follow-up message in a context resumes the subagent's
//! previous task there, and an approval the task waits for is the A2A `input-required`
//! state, answered by a message on the same task. It reads task events only through
//! [`super::follow::follow`], decides approvals only through [`super::resolve_approval`]
//! and only on an explicit `approve`/`decline` answer, shows a principal only the tasks
//! [`super::visible_task`] lets it see, and never sends text that was not scrubbed with
//! the task's session secrets. It never runs, changes or ends a task by other means than
//! the engine's `submit` and `cancel`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, UNIX_EPOCH};

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use warden_approval::{Authority, PendingApproval, Resolution, Scope};

use super::streams::StreamPermit;
use super::{ApiError, AppState, Fault, Principal, ServerState};
use crate::engine::Submission;
use crate::plugin::{SubagentDefinition, TaskCall};
use crate::store::{TaskCursor, TaskQuery, TaskRecord};
use crate::task_state::TaskState;

/// Longest `Host` value card URLs are built from: a DNS name is at most 253 bytes, plus
/// `:` and a port.
pub const MAX_HOST_LEN: usize = 260;
/// Longest `contextId` (it names the sandbox session: the engine's session id rule).
pub const MAX_CONTEXT_ID_LEN: usize = 128;
/// Longest task id or approval request id looked up (warden's are ~41 bytes); longer
/// ones cannot exist and are not echoed back.
pub const MAX_ID_LEN: usize = 128;
/// Parts one message may carry (a prompt is a few; more is a mistake or an attack).
pub const MAX_PARTS: usize = 64;
/// Characters of a message's first line that become the task description.
pub const DESCRIPTION_CHARS: usize = 80;
/// ListTasks page size when the client names none (A2A's default).
pub const DEFAULT_PAGE_SIZE: usize = 50;
/// Largest ListTasks page (A2A's maximum): every task of a page is rendered and scrubbed.
pub const MAX_PAGE_SIZE: usize = 100;
/// Contexts whose tasks are remembered for `resume`, per user; past this that user's
/// memory starts over (another user's is untouched) and forgotten contexts are found in
/// the task store.
pub const MAX_REMEMBERED_CONTEXTS: usize = 10_000;
/// Most stored tasks one `ListTasks` call reads to fill its page: the caller's own,
/// newest first (tasks of another subagent, context or state are skipped within this
/// budget). A page that runs out of it comes back short, with a `nextPageToken` that
/// continues after the last task read, so no call costs more however the tasks lie.
pub const MAX_LIST_SCAN: usize = 1_000;
/// Most of a user's newest stored tasks searched for the task a message in a context
/// the process does not remember resumes (after a restart): one page of the store.
pub const MAX_CONTEXT_SCAN: usize = crate::store::MAX_TASK_PAGE;
/// Tasks remembered per context (newest kept): resume needs the latest finished one.
pub const MAX_TASKS_PER_CONTEXT: usize = 16;
/// Stream events buffered per client before the producer waits for it.
const STREAM_BUFFER: usize = 32;
/// Longest a blocking send waits: the task's own deadline ends it first.
const SYNC_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// The routes of the A2A server (merged into [`super::app`]).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/a2a", get(directory))
        .route("/a2a/{subagent}", axum::routing::post(rpc))
        .route("/a2a/{subagent}/", axum::routing::post(rpc))
        .route("/a2a/{subagent}/.well-known/agent-card.json", get(card))
        // The 0.2 location, for clients that still look there.
        .route("/a2a/{subagent}/.well-known/agent.json", get(card))
}

// ---------------------------------------------------------------------------------
// Cards

/// `scheme://host` of this server as the client reached it, from `Host` (or the
/// `:authority` of an HTTP/2 request) and `X-Forwarded-Proto` (`http` or `https` only).
/// A missing, oversized or malformed host is refused: it ends up in URLs.
pub fn base_url(headers: &HeaderMap, authority: Option<&str>) -> Result<String, ApiError> {
    let host = headers.get(header::HOST).map(|v| v.to_str().unwrap_or("\u{0}")).or(authority);
    let host = host.ok_or_else(|| {
        ApiError::bad_request("invalid_host", "a Host header is required to build the agent card's URLs")
    })?;
    if !valid_host(host) {
        return Err(ApiError::bad_request(
            "invalid_host",
            format!(
                "the Host header must be a host name or address with an optional port, at most {MAX_HOST_LEN} bytes"
            ),
        ));
    }
    let scheme = match headers.get("x-forwarded-proto").and_then(|v| v.to_str().ok()).map(str::trim) {
        Some(p) if p.eq_ignore_ascii_case("https") => "https",
        _ => "http",
    };
    Ok(format!("{scheme}://{host}"))
}

/// A host name, IPv4 address or bracketed IPv6 address, with an optional port.
pub fn valid_host(host: &str) -> bool {
    if host.is_empty() || host.len() > MAX_HOST_LEN {
        return false;
    }
    let (name, port) = match host.rsplit_once(':') {
        Some((n, p)) if !n.contains(':') || (n.starts_with('[') && n.ends_with(']')) => (n, Some(p)),
        _ => (host, None),
    };
    if let Some(p) = port
        && (p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return false;
    }
    if let Some(inner) = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        !inner.is_empty() && inner.bytes().all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
    } else {
        !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
    }
}

/// A path segment with everything but unreserved characters percent-encoded.
fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The JSON-RPC URL of a subagent's agent.
pub fn agent_url(base: &str, subagent: &str) -> String {
    format!("{base}/a2a/{}", encode_segment(subagent))
}

/// The card of one subagent: the 1.0 card, plus the 0.3 fields older clients read.
/// `bearer`: the API requires a bearer token (declared the 0.3 way, which the 1.x
/// client converts).
pub fn card_json(def: &SubagentDefinition, base: &str, bearer: bool) -> Value {
    let url = agent_url(base, &def.name);
    let description = match def.description.trim() {
        "" => format!("The warden subagent `{}`", def.name),
        d => d.to_owned(),
    };
    let modes = json!(["text/plain", "application/json"]);
    let mut card = json!({
        "name": def.name,
        "description": description,
        "version": env!("CARGO_PKG_VERSION"),
        "supportedInterfaces": [
            { "url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0" },
            { "url": url, "protocolBinding": "JSONRPC", "protocolVersion": "0.3" },
        ],
        "capabilities": { "streaming": true, "pushNotifications": false },
        "defaultInputModes": modes,
        "defaultOutputModes": modes,
        "skills": [{
            "id": def.name,
            "name": def.name,
            "description": description,
            "tags": ["warden", def.kind.to_ascii_lowercase()],
        }],
        // A2A 0.3
        "url": url,
        "preferredTransport": "JSONRPC",
        "protocolVersion": "0.3.0",
        "additionalInterfaces": [{ "url": url, "transport": "JSONRPC" }],
    });
    if bearer {
        card["securitySchemes"] = json!({ "bearer": { "type": "http", "scheme": "bearer" } });
        card["security"] = json!([{ "bearer": [] }]);
    }
    card
}

fn definition(s: &ServerState, name: &str) -> Result<SubagentDefinition, ApiError> {
    let snap = s.engine.registry().snapshot();
    snap.definitions
        .get(name)
        .map(|r| r.definition.clone())
        .ok_or_else(|| ApiError::not_found("unknown_subagent", format!("no subagent `{}`", truncate(name, MAX_ID_LEN))))
}

async fn directory(
    State(s): State<AppState>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Result<Json<Value>, ApiError> {
    let base = base_url(&headers, uri.authority().map(|a| a.as_str()))?;
    let snap = s.engine.registry().snapshot();
    let bearer = !s.credentials.is_empty();
    let cards: Vec<Value> = snap.definitions.values().map(|r| card_json(&r.definition, &base, bearer)).collect();
    Ok(Json(Value::Array(cards)))
}

async fn card(
    State(s): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Result<Json<Value>, ApiError> {
    let Path(name) = name?;
    let def = definition(&s, &name)?;
    let base = base_url(&headers, uri.authority().map(|a| a.as_str()))?;
    Ok(Json(card_json(&def, &base, !s.credentials.is_empty())))
}

// ---------------------------------------------------------------------------------
// States

/// The A2A task states warden's tasks can be in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum A2aState {
    Submitted,
    Working,
    InputRequired,
    Completed,
    Failed,
    Canceled,
    Unknown,
}

/// The two wire dialects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// A2A 1.0, ProtoJSON.
    V1,
    /// A2A 0.3.
    V03,
}

impl A2aState {
    pub const ALL: [A2aState; 7] = [
        A2aState::Submitted,
        A2aState::Working,
        A2aState::InputRequired,
        A2aState::Completed,
        A2aState::Failed,
        A2aState::Canceled,
        A2aState::Unknown,
    ];

    pub fn wire(self, d: Dialect) -> &'static str {
        match (d, self) {
            (Dialect::V1, A2aState::Submitted) => "TASK_STATE_SUBMITTED",
            (Dialect::V1, A2aState::Working) => "TASK_STATE_WORKING",
            (Dialect::V1, A2aState::InputRequired) => "TASK_STATE_INPUT_REQUIRED",
            (Dialect::V1, A2aState::Completed) => "TASK_STATE_COMPLETED",
            (Dialect::V1, A2aState::Failed) => "TASK_STATE_FAILED",
            (Dialect::V1, A2aState::Canceled) => "TASK_STATE_CANCELED",
            (Dialect::V1, A2aState::Unknown) => "TASK_STATE_UNSPECIFIED",
            (Dialect::V03, A2aState::Submitted) => "submitted",
            (Dialect::V03, A2aState::Working) => "working",
            (Dialect::V03, A2aState::InputRequired) => "input-required",
            (Dialect::V03, A2aState::Completed) => "completed",
            (Dialect::V03, A2aState::Failed) => "failed",
            (Dialect::V03, A2aState::Canceled) => "canceled",
            (Dialect::V03, A2aState::Unknown) => "unknown",
        }
    }

    /// A state in either dialect (`TASK_STATE_INPUT_REQUIRED`, `input-required`).
    pub fn parse(s: &str) -> Option<A2aState> {
        A2aState::ALL.into_iter().find(|st| st.wire(Dialect::V1) == s || st.wire(Dialect::V03) == s)
    }

    /// Nothing more will happen to the task.
    pub fn is_terminal(self) -> bool {
        matches!(self, A2aState::Completed | A2aState::Failed | A2aState::Canceled)
    }

    /// Nothing more happens without the client: a stream ends here.
    pub fn is_settled(self) -> bool {
        self.is_terminal() || self == A2aState::InputRequired
    }
}

/// A warden task's A2A state: `status` of its record, whether it has `finished`, and
/// whether it `waits` for an approval nobody has answered yet. A running task shows
/// `input-required` exactly while it waits; a finished `input_required` task (its plugin
/// asked a question) stays `input-required`.
pub fn state_of(status: TaskState, finished: bool, waits: bool) -> A2aState {
    if !finished && waits {
        return A2aState::InputRequired;
    }
    match (status, finished) {
        (TaskState::Submitted, false) => A2aState::Submitted,
        (TaskState::InputRequired, true) => A2aState::InputRequired,
        (TaskState::Completed, true) => A2aState::Completed,
        (TaskState::Failed, true) => A2aState::Failed,
        (TaskState::Canceled, true) => A2aState::Canceled,
        // An unfinished task is at work (an approval it waits on is `waits`).
        (_, false) => A2aState::Working,
        // A finished record says how it ended; `submitted`/`working` there is corrupt.
        (TaskState::Submitted | TaskState::Working, true) => A2aState::Unknown,
    }
}

// ---------------------------------------------------------------------------------
// JSON-RPC

/// A JSON-RPC error answer.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

impl RpcError {
    pub const PARSE: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL: i64 = -32603;
    pub const TASK_NOT_FOUND: i64 = -32001;
    pub const TASK_NOT_CANCELABLE: i64 = -32002;
    pub const UNSUPPORTED_OPERATION: i64 = -32004;
    pub const CONTENT_TYPE_NOT_SUPPORTED: i64 = -32005;
    pub const VERSION_NOT_SUPPORTED: i64 = -32009;
    /// The server refused to admit the work for now (a full queue, draining, the user's
    /// share of tasks or secrets): worth retrying later, unlike -32602 and -32603.
    pub const REFUSED: i64 = -32050;

    fn new(code: i64, message: impl Into<String>) -> Self {
        RpcError { code, message: message.into() }
    }

    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(Self::INVALID_PARAMS, message)
    }

    fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(Self::INVALID_REQUEST, message)
    }

    fn task_not_found(id: &str) -> Self {
        Self::new(Self::TASK_NOT_FOUND, format!("no task `{}` for this agent", truncate(id, MAX_ID_LEN)))
    }

    /// An API failure through the one edge ([`ApiError::client`]): the client's mistakes
    /// are -32602 with their message, refusals -32050 naming the bound, host faults
    /// -32603 with fixed text and the error id their detail is logged under.
    fn edge(e: ApiError) -> Self {
        let c = e.client();
        let code = match c.fault {
            Fault::Client => Self::INVALID_PARAMS,
            Fault::Refusal => Self::REFUSED,
            Fault::Host(_) => Self::INTERNAL,
        };
        Self::new(code, c.message)
    }
}

/// The JSON-RPC methods, with the dialect their name belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Send,
    Stream,
    Get,
    Cancel,
    Subscribe,
    List,
}

pub fn method_of(name: &str) -> Option<(Method, Dialect)> {
    Some(match name {
        "SendMessage" => (Method::Send, Dialect::V1),
        "SendStreamingMessage" => (Method::Stream, Dialect::V1),
        "GetTask" => (Method::Get, Dialect::V1),
        "CancelTask" => (Method::Cancel, Dialect::V1),
        "SubscribeToTask" => (Method::Subscribe, Dialect::V1),
        "ListTasks" => (Method::List, Dialect::V1),
        "message/send" => (Method::Send, Dialect::V03),
        "message/stream" => (Method::Stream, Dialect::V03),
        "tasks/get" => (Method::Get, Dialect::V03),
        "tasks/cancel" => (Method::Cancel, Dialect::V03),
        "tasks/resubscribe" => (Method::Subscribe, Dialect::V03),
        _ => return None,
    })
}

/// A well-formed JSON-RPC request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The request's id (`null` when it says `null`).
    pub id: Value,
    /// The request has no `id` member: a JSON-RPC notification, which is never answered
    /// (A2A defines none, so it is not executed either).
    pub notification: bool,
    pub method: Method,
    pub dialect: Dialect,
    pub params: Value,
}

/// Reads a JSON-RPC 2.0 request; on failure, the id to answer with (null when it could
/// not be read) and the error.
pub fn parse_request(body: &[u8]) -> Result<Request, (Value, RpcError)> {
    // One read of the body into the request's members; serde's derived reader refuses a
    // member given twice (`"id":1,"id":2`), which different parsers read differently (a
    // proxy may route or log the first, serde would keep the last). Only a body that fails
    // is read again, to say why.
    let env = serde_json::from_slice::<Envelope>(body).map_err(|e| {
        let why = match serde_json::from_slice::<Value>(body) {
            Err(e) => return (Value::Null, RpcError::new(RpcError::PARSE, format!("the body is not JSON: {e}"))),
            Ok(Value::Array(_)) => "batch requests are not supported".to_owned(),
            Ok(Value::Object(_)) => format!("malformed request: {e}"),
            Ok(_) => "a request must be a JSON object".to_owned(),
        };
        (Value::Null, RpcError::invalid_request(why))
    })?;
    let notification = env.id.is_none();
    let id = match env.id {
        None | Some(Value::Null) => Value::Null,
        Some(id @ (Value::String(_) | Value::Number(_))) => id,
        Some(_) => return Err((Value::Null, RpcError::invalid_request("`id` must be a string, a number or null"))),
    };
    if env.jsonrpc.as_ref().and_then(Value::as_str) != Some("2.0") {
        return Err((id, RpcError::invalid_request("`jsonrpc` must be \"2.0\"")));
    }
    let Some(name) = env.method.as_ref().and_then(Value::as_str) else {
        return Err((id, RpcError::invalid_request("`method` must be a string")));
    };
    let Some((method, dialect)) = method_of(name) else {
        return Err((
            id,
            RpcError::new(RpcError::METHOD_NOT_FOUND, format!("method `{}` not found", truncate(name, 64))),
        ));
    };
    let params = match env.params {
        None => Value::Object(Map::new()),
        Some(p @ Value::Object(_)) => p,
        Some(_) => return Err((id, RpcError::invalid_params("`params` must be an object"))),
    };
    Ok(Request { id, notification, method, dialect, params })
}

/// The members of a JSON-RPC request (others are ignored). `id` is `Some(Value::Null)`
/// for `"id": null` and `None` only when the member is absent (a notification).
#[derive(serde::Deserialize)]
struct Envelope {
    jsonrpc: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    id: Option<Value>,
    method: Option<Value>,
    params: Option<Value>,
}

/// A member that is present, `null` included.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    <Value as serde::Deserialize>::deserialize(d).map(Some)
}

/// Whether the `A2A-Version` header (if any) names a protocol this server speaks.
pub fn version_supported(header: Option<&str>) -> bool {
    match header.map(str::trim) {
        None | Some("") => true,
        Some(v) => {
            let major = v.strip_prefix(['v', 'V']).unwrap_or(v).split('.').next().unwrap_or("");
            matches!(major, "0" | "1")
        }
    }
}

fn rpc_result(id: &Value, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

fn rpc_error(id: &Value, e: &RpcError) -> Value {
    // Not scrubbed with every tenant's secrets: messages quote the caller's own request,
    // and an all-tenant scrub turned them into an oracle for other tenants' secrets
    // (see `ApiError::into_response`).
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": e.code, "message": e.message } })
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &s[..cut])
}

// ---------------------------------------------------------------------------------
// Params

/// What a send carries.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SendParams {
    /// The text parts, joined.
    pub text: String,
    /// The data parts' values.
    pub data: Vec<Value>,
    pub context_id: Option<String>,
    pub task_id: Option<String>,
    /// Wait for the task to finish or ask (default); `returnImmediately` (1.0) or
    /// `blocking: false` (0.3) turn it off.
    pub blocking: bool,
}

fn opt_str<'a>(obj: &'a Value, field: &str) -> Result<Option<&'a str>, RpcError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(RpcError::invalid_params(format!("`{field}` must be a string"))),
    }
}

fn opt_bool(obj: &Value, field: &str) -> Result<Option<bool>, RpcError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(RpcError::invalid_params(format!("`{field}` must be a boolean"))),
    }
}

/// A context id names a sandbox session: 1-128 of `[A-Za-z0-9_.-]`.
pub fn valid_context_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_CONTEXT_ID_LEN
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Reads `SendMessage` / `message/send` params (both dialects' spellings accepted).
pub fn parse_send(params: &Value) -> Result<SendParams, RpcError> {
    let message = match params.get("message") {
        Some(m @ Value::Object(_)) => m,
        Some(_) => return Err(RpcError::invalid_params("`message` must be an object")),
        None => return Err(RpcError::invalid_params("missing `message`")),
    };
    match opt_str(message, "role")? {
        None | Some("ROLE_USER" | "user" | "ROLE_UNSPECIFIED") => {}
        Some(_) => return Err(RpcError::invalid_params("`message.role` must be the user's (`ROLE_USER` or `user`)")),
    }
    let parts = match message.get("parts") {
        Some(Value::Array(p)) if !p.is_empty() => p,
        Some(Value::Array(_)) | None | Some(Value::Null) => {
            return Err(RpcError::invalid_params("`message.parts` must hold at least one part"));
        }
        Some(_) => return Err(RpcError::invalid_params("`message.parts` must be an array")),
    };
    if parts.len() > MAX_PARTS {
        return Err(RpcError::invalid_params(format!("a message may carry at most {MAX_PARTS} parts")));
    }
    let mut texts = vec![];
    let mut data = vec![];
    for (i, p) in parts.iter().enumerate() {
        if !p.is_object() {
            return Err(RpcError::invalid_params(format!("`message.parts[{i}]` must be an object")));
        }
        let kind = opt_str(p, "kind")?;
        if let Some(t) = p.get("text") {
            let Value::String(t) = t else {
                return Err(RpcError::invalid_params(format!("`message.parts[{i}].text` must be a string")));
            };
            if kind.is_some_and(|k| k != "text") {
                return Err(RpcError::invalid_params(format!("`message.parts[{i}]` is not a text part")));
            }
            texts.push(t.clone());
        } else if let Some(d) = p.get("data") {
            if kind.is_some_and(|k| k != "data") {
                return Err(RpcError::invalid_params(format!("`message.parts[{i}]` is not a data part")));
            }
            data.push(d.clone());
        } else if ["raw", "url", "file"].iter().any(|f| p.get(f).is_some()) || kind == Some("file") {
            return Err(RpcError::new(
                RpcError::CONTENT_TYPE_NOT_SUPPORTED,
                "file parts are not supported: send text (files go into the sandbox through the subagent's tools)",
            ));
        } else {
            return Err(RpcError::invalid_params(format!("`message.parts[{i}]` is neither a text nor a data part")));
        }
    }
    let context_id = opt_str(message, "contextId")?;
    if let Some(c) = context_id
        && !valid_context_id(c)
    {
        return Err(RpcError::invalid_params(format!(
            "`message.contextId` must be 1-{MAX_CONTEXT_ID_LEN} characters of [A-Za-z0-9_.-] (it names the sandbox session)"
        )));
    }
    let task_id = opt_str(message, "taskId")?;
    let blocking = match params.get("configuration") {
        None | Some(Value::Null) => true,
        Some(c @ Value::Object(_)) => match (opt_bool(c, "returnImmediately")?, opt_bool(c, "blocking")?) {
            (Some(immediately), _) => !immediately,
            (None, Some(b)) => b,
            (None, None) => true,
        },
        Some(_) => return Err(RpcError::invalid_params("`configuration` must be an object")),
    };
    Ok(SendParams {
        text: texts.join("\n\n"),
        data,
        context_id: context_id.map(str::to_owned),
        task_id: task_id.map(str::to_owned),
        blocking,
    })
}

/// The `id` of `GetTask`, `CancelTask`, `SubscribeToTask` and their 0.3 forms.
pub fn parse_task_id(params: &Value) -> Result<String, RpcError> {
    match opt_str(params, "id")? {
        Some(id) => Ok(id.to_owned()),
        None => Err(RpcError::invalid_params("missing task `id`")),
    }
}

/// `ListTasks` params.
#[derive(Debug, Clone, PartialEq)]
pub struct ListParams {
    pub context_id: Option<String>,
    pub state: Option<A2aState>,
    pub page_size: usize,
    /// Where the previous page ended (`pageToken`); `None` for the first page.
    pub after: Option<PageToken>,
    pub include_artifacts: bool,
}

/// A `ListTasks` page token: how many tasks the pages before listed, and the store
/// cursor after the last task they read.
#[derive(Debug, Clone, PartialEq)]
pub struct PageToken {
    pub listed: u64,
    pub cursor: TaskCursor,
}

impl PageToken {
    /// The token as sent (`<listed>.<store cursor>`).
    pub fn token(&self) -> String {
        format!("{}.{}", self.listed, self.cursor.token())
    }

    /// A token read back; `None` for text this server never gave out.
    pub fn parse(token: &str) -> Option<PageToken> {
        let (listed, cursor) = token.split_once('.')?;
        Some(PageToken { listed: listed.parse().ok()?, cursor: TaskCursor::from_token(cursor)? })
    }
}

pub fn parse_list(params: &Value) -> Result<ListParams, RpcError> {
    let context_id = opt_str(params, "contextId")?.map(str::to_owned);
    let state = match opt_str(params, "status")? {
        None | Some("TASK_STATE_UNSPECIFIED") => None,
        Some(s) => Some(A2aState::parse(s).ok_or_else(|| RpcError::invalid_params("`status` is not a task state"))?),
    };
    let page_size = match params.get("pageSize") {
        None | Some(Value::Null) => DEFAULT_PAGE_SIZE,
        Some(n) => match n.as_u64() {
            Some(0) => DEFAULT_PAGE_SIZE,
            Some(n) if n as usize <= MAX_PAGE_SIZE => n as usize,
            _ => {
                return Err(RpcError::invalid_params(format!("`pageSize` must be a number from 1 to {MAX_PAGE_SIZE}")));
            }
        },
    };
    let after = match opt_str(params, "pageToken")? {
        None | Some("") => None,
        Some(t) => Some(
            PageToken::parse(t).ok_or_else(|| RpcError::invalid_params("`pageToken` is not one this server gave"))?,
        ),
    };
    let include_artifacts = opt_bool(params, "includeArtifacts")?.unwrap_or(false);
    Ok(ListParams { context_id, state, page_size, after, include_artifacts })
}

/// An answer to an approval question.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub resolution: Resolution,
    /// Which request it answers (needed only when several wait).
    pub request_id: Option<String>,
    pub scope: Scope,
}

/// Words that approve, and words that decline (compared without case and trailing
/// `.`/`!`). Anything else answers nothing.
const APPROVE_WORDS: [&str; 4] = ["approve", "approved", "yes", "allow"];
const DECLINE_WORDS: [&str; 5] = ["decline", "declined", "no", "deny", "reject"];

fn word_resolution(s: &str) -> Option<Resolution> {
    let w = s.trim().trim_end_matches(['.', '!']).trim().to_ascii_lowercase();
    if APPROVE_WORDS.contains(&w.as_str()) {
        Some(Resolution::Approve)
    } else if DECLINE_WORDS.contains(&w.as_str()) {
        Some(Resolution::Decline)
    } else {
        None
    }
}

/// Reads an approval answer from a message's text (`approve`/`yes`, `decline`/`no`) and
/// data parts (`{"decision": "approve"|"decline", "request_id"?, "scope"?}`). Anything
/// unclear — no answer, an unknown word, two answers that disagree — is an error, never
/// an approval.
pub fn parse_answer(text: &str, data: &[Value]) -> Result<Answer, RpcError> {
    const HOW: &str = "answer the question with `approve` or `decline` (or a data part {\"decision\": \"approve\"|\"decline\", \"request_id\": ...})";
    let mut from_data: Option<Answer> = None;
    for d in data {
        let Some(decision) = d.get("decision") else { continue };
        if from_data.is_some() {
            return Err(RpcError::invalid_params(format!("the message holds more than one decision; {HOW}")));
        }
        let resolution = match decision.as_str() {
            Some("approve") => Resolution::Approve,
            Some("decline") => Resolution::Decline,
            _ => return Err(RpcError::invalid_params(format!("`decision` must be \"approve\" or \"decline\"; {HOW}"))),
        };
        let request_id = match d.get("request_id") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_ID_LEN => Some(s.clone()),
            Some(_) => return Err(RpcError::invalid_params("`request_id` must be a pending request's id")),
        };
        let scope = match d.get("scope") {
            None | Some(Value::Null) => Scope::Once,
            Some(Value::String(s)) => match s.as_str() {
                "once" => Scope::Once,
                "session" => Scope::Session,
                "always" => Scope::Always,
                _ => return Err(RpcError::invalid_params("`scope` must be \"once\", \"session\" or \"always\"")),
            },
            Some(_) => return Err(RpcError::invalid_params("`scope` must be a string")),
        };
        from_data = Some(Answer { resolution, request_id, scope });
    }
    let text = text.trim();
    let from_text = if text.is_empty() {
        None
    } else {
        Some(
            word_resolution(text)
                .ok_or_else(|| RpcError::invalid_params(format!("the task waits for an approval; {HOW}")))?,
        )
    };
    match (from_data, from_text) {
        (Some(a), Some(r)) if a.resolution != r => {
            Err(RpcError::invalid_params(format!("the text and the data part answer differently; {HOW}")))
        }
        (Some(a), _) => Ok(a),
        (None, Some(resolution)) => Ok(Answer { resolution, request_id: None, scope: Scope::Once }),
        (None, None) => Err(RpcError::invalid_params(format!("the task waits for an approval; {HOW}"))),
    }
}

/// The prompt a message makes: its text, then each data part as JSON.
fn prompt_of(p: &SendParams) -> String {
    let mut prompt = p.text.clone();
    for d in &p.data {
        if !prompt.is_empty() {
            prompt.push_str("\n\n");
        }
        prompt.push_str(&d.to_string());
    }
    prompt
}

fn description_of(prompt: &str) -> String {
    let first = prompt.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
    let mut d: String = first.chars().take(DESCRIPTION_CHARS).collect();
    if first.chars().count() > DESCRIPTION_CHARS {
        d.push('…');
    }
    if d.is_empty() { "A2A message".to_owned() } else { format!("A2A: {d}") }
}

// ---------------------------------------------------------------------------------
// Rendering

/// A task as a reply shows it: its record and the approvals it waits for, each offering
/// the scopes its reader may choose ([`PendingApproval::offered_to`]).
struct View {
    rec: TaskRecord,
    waiting: Vec<PendingApproval>,
}

fn text_part(d: Dialect, text: &str) -> Value {
    match d {
        Dialect::V1 => json!({ "text": text }),
        Dialect::V03 => json!({ "kind": "text", "text": text }),
    }
}

fn data_part(d: Dialect, data: Value) -> Value {
    match d {
        Dialect::V1 => json!({ "data": data }),
        Dialect::V03 => json!({ "kind": "data", "data": data }),
    }
}

fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// The question an approval asks, as text: every quoted field one escaped line, the
/// arguments whole (or, when too long to show, said so: never cut silently).
fn question(p: &PendingApproval) -> String {
    let line = |s: &str| crate::text::escape_control(s.trim()).into_owned();
    let input = match super::question_arguments(&p.input) {
        Ok(text) => text,
        Err(n) => format!(
            "arguments of {n} characters, too long to show here: read `input` in the data part before answering"
        ),
    };
    let reason = if p.reason.trim().is_empty() { String::new() } else { format!(" ({})", line(&p.reason)) };
    format!(
        "Approval needed: subagent `{}` wants to run `{}` with {input}{reason}. Reply `approve` or `decline` (request {}).",
        line(&p.subagent),
        line(&p.tool),
        p.id
    )
}

impl View {
    fn state(&self) -> A2aState {
        state_of(self.rec.status, self.rec.is_finished(), !self.waiting.is_empty())
    }

    fn message(&self, d: Dialect, message_id: String, parts: Vec<Value>) -> Value {
        let mut m = json!({
            "messageId": message_id,
            "taskId": self.rec.task_id,
            "contextId": self.rec.session_id,
            "role": if d == Dialect::V1 { "ROLE_AGENT" } else { "agent" },
            "parts": parts,
        });
        if d == Dialect::V03 {
            m["kind"] = json!("message");
        }
        m
    }

    /// The agent's message that goes with the state: the approval question(s), the
    /// plugin's question, or why the task failed.
    fn status_message(&self, d: Dialect) -> Option<Value> {
        let rec = &self.rec;
        match self.state() {
            A2aState::InputRequired if !self.waiting.is_empty() => {
                let text: Vec<String> = self.waiting.iter().map(question).collect();
                let mut parts = vec![text_part(d, &text.join("\n"))];
                for p in &self.waiting {
                    parts.push(data_part(
                        d,
                        json!({
                            "type": "approval_request",
                            "request_id": p.id,
                            "tool": p.tool,
                            "input": p.input,
                            "reason": p.reason,
                            "matched_rule": p.matched_rule,
                            "scopes": p.scopes,
                            "expires_at": p.expires_at,
                            "decisions": ["approve", "decline"],
                        }),
                    ));
                }
                Some(self.message(d, format!("{}-ask-{}", rec.task_id, self.waiting[0].id), parts))
            }
            A2aState::InputRequired => {
                let q = rec.output.as_deref().unwrap_or("the subagent needs more input");
                Some(self.message(d, format!("{}-question", rec.task_id), vec![text_part(d, q)]))
            }
            A2aState::Failed => {
                let e = rec.error.as_deref().unwrap_or("the task failed");
                Some(self.message(d, format!("{}-error", rec.task_id), vec![text_part(d, e)]))
            }
            _ => None,
        }
    }

    fn status(&self, d: Dialect) -> Value {
        let mut s = json!({ "state": self.state().wire(d), "timestamp": rfc3339(self.rec.updated_at_ms) });
        if let Some(m) = self.status_message(d) {
            s["message"] = m;
        }
        s
    }

    /// The final text as an artifact, once the task completed with one.
    fn artifact(&self, d: Dialect) -> Option<Value> {
        if self.state() != A2aState::Completed {
            return None;
        }
        let out = self.rec.output.as_deref()?;
        Some(json!({ "artifactId": "output", "name": "output", "parts": [text_part(d, out)] }))
    }

    fn task(&self, d: Dialect, with_artifacts: bool) -> Value {
        let mut t = json!({ "id": self.rec.task_id, "contextId": self.rec.session_id, "status": self.status(d) });
        if with_artifacts && let Some(a) = self.artifact(d) {
            t["artifacts"] = json!([a]);
        }
        if d == Dialect::V03 {
            t["kind"] = json!("task");
        }
        self.scrubbed(t)
    }

    fn status_update(&self, d: Dialect) -> Value {
        let mut u = json!({ "taskId": self.rec.task_id, "contextId": self.rec.session_id, "status": self.status(d) });
        let u = match d {
            Dialect::V1 => json!({ "statusUpdate": u }),
            Dialect::V03 => {
                u["kind"] = json!("status-update");
                u["final"] = json!(self.state().is_settled());
                u
            }
        };
        self.scrubbed(u)
    }

    fn artifact_update(&self, d: Dialect) -> Option<Value> {
        let artifact = self.artifact(d)?;
        let mut u = json!({
            "taskId": self.rec.task_id, "contextId": self.rec.session_id,
            "artifact": artifact, "append": false, "lastChunk": true,
        });
        let u = match d {
            Dialect::V1 => json!({ "artifactUpdate": u }),
            Dialect::V03 => {
                u["kind"] = json!("artifact-update");
                u
            }
        };
        Some(self.scrubbed(u))
    }

    /// A `working` update saying which tool the subagent runs (`ev`: its `tool_call` event).
    fn tool_update(&self, d: Dialect, ev: &Value) -> Value {
        let tool = ev.get("name").and_then(Value::as_str).unwrap_or("a tool");
        let call = ev.get("id").and_then(Value::as_str).unwrap_or("");
        let mut status = self.status(d);
        status["message"] = self.message(
            d,
            format!("{}-tool-{call}", self.rec.task_id),
            vec![text_part(d, &format!("running tool `{tool}`"))],
        );
        let u = json!({ "taskId": self.rec.task_id, "contextId": self.rec.session_id, "status": status });
        let u = match d {
            Dialect::V1 => json!({ "statusUpdate": u }),
            Dialect::V03 => {
                let mut u = u;
                u["kind"] = json!("status-update");
                u["final"] = json!(false);
                u
            }
        };
        self.scrubbed(u)
    }

    /// Everything sent about a task is scrubbed with its session's secrets as they are now.
    fn scrubbed(&self, v: Value) -> Value {
        crate::redact::registry().session(&self.rec.user_id, &self.rec.session_id).scrubbed(&v)
    }
}

/// A send's or get's result in the dialect: 1.0 wraps a send's task as `{"task": ..}`.
fn send_result(d: Dialect, task: Value) -> Value {
    match d {
        Dialect::V1 => json!({ "task": task }),
        Dialect::V03 => task,
    }
}

// ---------------------------------------------------------------------------------
// Contexts: which task a follow-up message resumes

/// A context of one user: (session, subagent).
type ContextKey = (String, String);
/// One user's remembered contexts.
type UserContexts = HashMap<ContextKey, Vec<String>>;

/// The tasks A2A messages started per user, then per (session, subagent), newest last:
/// hints for `resume`, always checked against the engine. Per process; bounded per user
/// (users are the configured principals' own), so one user's churn never evicts
/// another's contexts.
fn contexts() -> &'static Mutex<HashMap<String, UserContexts>> {
    static CONTEXTS: OnceLock<Mutex<HashMap<String, UserContexts>>> = OnceLock::new();
    CONTEXTS.get_or_init(Default::default)
}

/// `user`'s contexts, made room in for `key` ([`MAX_REMEMBERED_CONTEXTS`] per user).
fn room_for<'a>(map: &'a mut HashMap<String, UserContexts>, user: &str, key: &ContextKey) -> &'a mut UserContexts {
    let mine = map.entry(user.to_owned()).or_default();
    if mine.len() >= MAX_REMEMBERED_CONTEXTS && !mine.contains_key(key) {
        mine.clear();
    }
    mine
}

fn remember(user: &str, key: ContextKey, task_id: &str) {
    let mut map = contexts().lock().unwrap();
    let ids = room_for(&mut map, user, &key).entry(key).or_default();
    ids.push(task_id.to_owned());
    if ids.len() > MAX_TASKS_PER_CONTEXT {
        ids.remove(0);
    }
}

/// The tasks remembered for `user`'s context `key`, newest last.
fn remembered(user: &str, key: &ContextKey) -> Option<Vec<String>> {
    contexts().lock().unwrap().get(user).and_then(|mine| mine.get(key)).cloned()
}

/// Whether a finished task of `kind` in `status` can be continued with `resume`: an
/// interrupted one always; a completed one unless its plugin resumes only interrupted
/// tasks (the A2A plugin continues a remote task that asked for input, nothing else).
pub fn resumable(kind: &str, status: TaskState) -> bool {
    match status {
        TaskState::InputRequired => true,
        TaskState::Completed => !kind.eq_ignore_ascii_case("A2A"),
        _ => false,
    }
}

/// The task a new message in context `session` resumes: the newest finished, resumable
/// task `user` ran there with this subagent.
async fn previous_task(s: &ServerState, user: &str, session: &str, def: &SubagentDefinition) -> Option<String> {
    let key: ContextKey = (session.to_owned(), def.name.clone());
    let hinted = remembered(user, &key);
    let mut candidates: Vec<TaskRecord> = match hinted {
        Some(ids) => {
            let mut found = vec![];
            for id in ids.iter().rev() {
                if let Ok(Some(r)) = s.engine.get(id).await {
                    found.push(r);
                }
            }
            found
        }
        None => {
            // Not started here since this process began: the store knows, among this
            // user's newest tasks (never another user's).
            let store = s.engine.store().clone();
            if let Err(e) = store.flush().await {
                tracing::warn!(session_id = %session, error = %e, "store flush before a context lookup failed");
            }
            let query =
                TaskQuery { user_id: Some(user.to_owned()), before: TaskCursor::START, limit: MAX_CONTEXT_SCAN };
            let newest = store.list_tasks(&query).await.ok()?.tasks;
            let mine: Vec<TaskRecord> = newest
                .into_iter()
                .filter(|r| r.user_id == user && r.session_id == session && r.subagent_type == def.name)
                .take(MAX_TASKS_PER_CONTEXT)
                .collect();
            let ids = mine.iter().rev().map(|r| r.task_id.clone()).collect();
            let mut map = contexts().lock().unwrap();
            room_for(&mut map, user, &key).insert(key, ids);
            mine
        }
    };
    candidates.retain(|r| r.user_id == user && r.session_id == session && r.subagent_type == def.name);
    candidates.into_iter().find(|r| r.is_finished() && resumable(&def.kind, r.status)).map(|r| r.task_id)
}

// ---------------------------------------------------------------------------------
// Handlers

/// The approvals task `id` waits for that are not in `answered`.
fn waiting_for(s: &ServerState, id: &str, answered: &[String]) -> Vec<PendingApproval> {
    let gate = s.engine.gate();
    // The task's own requests and those of the subagents it started (nested subagents):
    // the A2A client answers for the whole chain.
    let of_task =
        |p: &PendingApproval| p.task_id.as_deref() == Some(id) || p.chain.iter().any(|link| link.task_id == id);
    gate.pending().into_iter().filter(|p| of_task(p) && !answered.contains(&p.id)).collect()
}

/// Task `rec` as a reader with `authority` is shown it.
fn view(s: &ServerState, rec: TaskRecord, answered: &[String], authority: Authority) -> View {
    let waiting = if rec.is_finished() { vec![] } else { waiting_for(s, &rec.task_id, answered) };
    View { rec, waiting: waiting.into_iter().map(|p| p.offered_to(authority)).collect() }
}

/// The task `id` if `who` may see it and it ran `subagent`; otherwise "not found".
async fn task_of(s: &ServerState, who: &Principal, subagent: &str, id: &str) -> Result<TaskRecord, RpcError> {
    if id.len() > MAX_ID_LEN {
        return Err(RpcError::task_not_found(id));
    }
    match super::visible_task(s, who, id).await {
        Ok(r) if r.subagent_type == subagent => Ok(r),
        Ok(_) => Err(RpcError::task_not_found(id)),
        Err(e) if e.code == "task_not_found" => Err(RpcError::task_not_found(id)),
        Err(e) => Err(RpcError::edge(e)),
    }
}

/// Waits until task `id` finishes or waits for an approval not in `answered`.
async fn settle(s: &ServerState, id: &str, answered: &[String]) -> Result<TaskRecord, RpcError> {
    if let Some(live) = s.engine.live(id) {
        let mut changed = live.watch();
        let until = tokio::time::Instant::now() + SYNC_WAIT;
        loop {
            changed.borrow_and_update();
            if live.record().is_finished() || !waiting_for(s, id, answered).is_empty() {
                break;
            }
            match tokio::time::timeout_at(until, changed.changed()).await {
                Ok(Ok(())) => {}
                _ => break,
            }
        }
    }
    match s.engine.get(id).await {
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err(RpcError::task_not_found(id)),
        Err(e) => Err(RpcError::edge(e.into())),
    }
}

fn submit_error(e: crate::engine::SubmitError) -> RpcError {
    use crate::engine::SubmitError as E;
    use crate::task::TaskError as T;
    match e {
        E::Invalid(T::MissingField("prompt")) => RpcError::invalid_params("the message has no text"),
        other => RpcError::edge(other.into()),
    }
}

/// What a send did: the task to report and the approvals it just answered.
struct Sent {
    task_id: String,
    answered: Vec<String>,
}

/// Starts a task for a message, or answers the question a task asks. Returns once the
/// task is started or the answer delivered; waiting is the caller's.
async fn accept_message(
    s: &ServerState,
    who: &Principal,
    def: &SubagentDefinition,
    p: &SendParams,
) -> Result<Sent, RpcError> {
    let user = who.user_for(None).map_err(|e| RpcError::invalid_params(e.message))?;
    let (session, resume) = match &p.task_id {
        None => {
            let resume = match &p.context_id {
                Some(ctx) => previous_task(s, &user, ctx, def).await,
                None => None,
            };
            (p.context_id.clone(), resume)
        }
        Some(tid) => {
            let rec = task_of(s, who, &def.name, tid).await?;
            if p.context_id.as_deref().is_some_and(|c| c != rec.session_id) {
                return Err(RpcError::invalid_params(format!("task `{tid}` belongs to another context")));
            }
            if !rec.is_finished() {
                return answer(s, who, &rec, p).await;
            }
            if rec.status != TaskState::InputRequired {
                return Err(RpcError::new(
                    RpcError::UNSUPPORTED_OPERATION,
                    format!(
                        "task `{tid}` is {} and takes no more messages; send a new message with its contextId to continue the conversation",
                        state_of(rec.status, true, false).wire(Dialect::V03)
                    ),
                ));
            }
            // The subagent asked and its task ended: the answer resumes it as a new task.
            (Some(rec.session_id.clone()), Some(rec.task_id.clone()))
        }
    };
    let prompt = prompt_of(p);
    let sub = Submission {
        call: TaskCall {
            description: description_of(&prompt),
            prompt,
            subagent_type: def.name.clone(),
            model: None,
            resume: resume.clone(),
            run_in_background: !p.blocking,
        },
        session_id: session,
        user_id: Some(user.clone()),
        principal: Some(who.name.clone()),
        ..Default::default()
    };
    let rec = s.engine.submit(sub).await.map_err(submit_error)?.record;
    remember(&user, (rec.session_id.clone(), def.name.clone()), &rec.task_id);
    tracing::info!(task_id = %rec.task_id, session_id = %rec.session_id, subagent = %def.name, resume = ?resume, "A2A message started a task");
    if !p.blocking {
        // An accepted task survives a crash: its record is committed before the answer.
        if let Err(e) = s.engine.store().flush().await {
            tracing::warn!(task_id = %rec.task_id, error = %e, "could not commit the accepted task");
        }
    }
    Ok(Sent { task_id: rec.task_id, answered: vec![] })
}

/// How many approval requests `task_id` and the nested subagents it started have made so
/// far (its record on another replica: the ones in its own stream).
///
/// Regression: only the task's own stream was counted, so a nested subagent's expired
/// question followed by a new one let a bare `approve` answer the new one unseen.
async fn questions_asked(s: &ServerState, task_id: &str) -> u64 {
    if let Some(live) = s.engine.live(task_id) {
        return live.questions_asked();
    }
    let events = s.engine.store().events_after(task_id, 0).await.unwrap_or_default();
    events.iter().filter(|(_, e)| e["type"] == "approval_request").count() as u64
}

/// A message on a running task: the answer to the approval it waits for.
async fn answer(s: &ServerState, who: &Principal, rec: &TaskRecord, p: &SendParams) -> Result<Sent, RpcError> {
    let waiting = waiting_for(s, &rec.task_id, &[]);
    if waiting.is_empty() {
        return Err(RpcError::invalid_params(format!(
            "task `{}` is working and waits for no input; follow it with SubscribeToTask or GetTask",
            rec.task_id
        )));
    }
    let a = parse_answer(&p.text, &p.data)?;
    let request_id = match &a.request_id {
        Some(id) if waiting.iter().any(|w| &w.id == id) => id.clone(),
        Some(id) => {
            return Err(RpcError::invalid_params(format!(
                "task `{}` waits for no request `{}`",
                rec.task_id,
                truncate(id, MAX_ID_LEN)
            )));
        }
        // A bare answer is unambiguous only if the task asked one question in all: when an
        // earlier one expired and another took its place, the person may be answering
        // the question they saw, not the one now pending (a late "approve" approved a
        // call the parent was never shown).
        None if waiting.len() == 1 && questions_asked(s, &rec.task_id).await <= 1 => waiting[0].id.clone(),
        None if waiting.len() == 1 => {
            return Err(RpcError::invalid_params(format!(
                "task `{}` has asked more than one question; name the one you answer with a data part {{\"decision\": ..., \"request_id\": \"{}\"}}",
                rec.task_id, waiting[0].id
            )));
        }
        None => {
            let ids: Vec<&str> = waiting.iter().map(|w| w.id.as_str()).collect();
            return Err(RpcError::invalid_params(format!(
                "task `{}` waits for several approvals ({}): name one with a data part {{\"decision\": ..., \"request_id\": ...}}",
                rec.task_id,
                ids.join(", ")
            )));
        }
    };
    super::resolve_approval(s, who, &request_id, a.resolution, a.scope)
        .await
        .map_err(|e| RpcError::invalid_params(e.message))?;
    tracing::info!(task_id = %rec.task_id, request_id = %request_id, decision = ?a.resolution, principal = %who.name, "approval answered over A2A");
    Ok(Sent { task_id: rec.task_id.clone(), answered: vec![request_id] })
}

async fn rpc(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let name = match name {
        Ok(Path(n)) => n,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let def = match definition(&s, &name) {
        Ok(d) => d,
        Err(e) => return e.into_response(),
    };
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            // Too large (413) or unreadable: the HTTP status says so, the body in JSON-RPC.
            let err = RpcError::invalid_request(format!("unreadable request body: {}", e.body_text()));
            return (e.status(), Json(rpc_error(&Value::Null, &err))).into_response();
        }
    };
    let req = match parse_request(&body) {
        Ok(r) => r,
        Err((id, e)) => return Json(rpc_error(&id, &e)).into_response(),
    };
    if req.notification {
        // JSON-RPC: a notification gets no reply; A2A has no notifications to act on.
        return http::StatusCode::NO_CONTENT.into_response();
    }
    let version = headers.get("a2a-version").map(|v| v.to_str().unwrap_or("?"));
    if !version_supported(version) {
        let e = RpcError::new(RpcError::VERSION_NOT_SUPPORTED, "this server speaks A2A 1.0 and 0.3");
        return Json(rpc_error(&req.id, &e)).into_response();
    }
    let d = req.dialect;
    let out = match req.method {
        Method::Send => send(&s, &who, &def, &req.params, d).await,
        Method::Get => get_task(&s, &who, &def, &req.params, d).await,
        Method::Cancel => cancel(&s, &who, &def, &req.params, d).await,
        Method::List => list(&s, &who, &def, &req.params).await,
        // Admitted before anything starts: a refused stream leaves no task running.
        Method::Stream => match admit_stream(&s, &who) {
            Ok(permit) => match stream_send(&s, &who, &def, &req.params).await {
                Ok(sent) => return stream(permit, s.clone(), req.id, d, sent, who.authority()).into_response(),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        },
        Method::Subscribe => match admit_stream(&s, &who) {
            Ok(permit) => match subscribe(&s, &who, &def, &req.params).await {
                Ok(sent) => return stream(permit, s.clone(), req.id, d, sent, who.authority()).into_response(),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        },
    };
    match out {
        Ok(result) => Json(rpc_result(&req.id, result)).into_response(),
        // Logged where it was made, by the edge (`RpcError::edge`): a host fault at
        // `error` under its id, a refusal at `warn`.
        Err(e) => Json(rpc_error(&req.id, &e)).into_response(),
    }
}

async fn send(
    s: &ServerState,
    who: &Principal,
    def: &SubagentDefinition,
    params: &Value,
    d: Dialect,
) -> Result<Value, RpcError> {
    let p = parse_send(params)?;
    // A blocking send is a long poll: admitted before its task starts.
    let _long_poll = if p.blocking { Some(admit_stream(s, who)?) } else { None };
    let sent = accept_message(s, who, def, &p).await?;
    let rec = if p.blocking {
        settle(s, &sent.task_id, &sent.answered).await?
    } else {
        s.engine.get(&sent.task_id).await.ok().flatten().ok_or_else(|| RpcError::task_not_found(&sent.task_id))?
    };
    Ok(send_result(d, view(s, rec, &sent.answered, who.authority()).task(d, true)))
}

async fn get_task(
    s: &ServerState,
    who: &Principal,
    def: &SubagentDefinition,
    params: &Value,
    d: Dialect,
) -> Result<Value, RpcError> {
    let id = parse_task_id(params)?;
    let rec = task_of(s, who, &def.name, &id).await?;
    Ok(view(s, rec, &[], who.authority()).task(d, true))
}

async fn cancel(
    s: &ServerState,
    who: &Principal,
    def: &SubagentDefinition,
    params: &Value,
    d: Dialect,
) -> Result<Value, RpcError> {
    use crate::engine::CancelOutcome;
    let id = parse_task_id(params)?;
    task_of(s, who, &def.name, &id).await?;
    let out = s.engine.cancel(&id).await.map_err(|e| RpcError::edge(e.into()))?;
    match out {
        CancelOutcome::Canceled(rec) => {
            tracing::info!(task_id = %id, principal = %who.name, "task canceled over A2A");
            Ok(view(s, rec, &[], who.authority()).task(d, true))
        }
        CancelOutcome::AlreadyFinished(rec) => Err(RpcError::new(
            RpcError::TASK_NOT_CANCELABLE,
            format!("task `{id}` already ended: {}", state_of(rec.status, true, false).wire(d)),
        )),
        CancelOutcome::NotFound => Err(RpcError::task_not_found(&id)),
    }
}

/// `ListTasks`: the caller's tasks of this subagent, newest first, a page at a time. Reads
/// only the caller's user's tasks from the store (an admin's span every user), by keyset
/// from where the previous page ended, at most [`MAX_LIST_SCAN`] of them per call.
/// `totalSize` counts the tasks this page and the ones before it listed (the page token
/// carries the count): exact on the last page (empty `nextPageToken`), a lower bound
/// before it — counting every match up front would read all of the caller's tasks.
async fn list(s: &ServerState, who: &Principal, def: &SubagentDefinition, params: &Value) -> Result<Value, RpcError> {
    let p = parse_list(params)?;
    let d = Dialect::V1;
    let store = s.engine.store().clone();
    if let Err(e) = store.flush().await {
        tracing::warn!(error = %e, "store flush before ListTasks failed");
    }
    let (listed, mut before) = match p.after {
        Some(t) => (t.listed, t.cursor),
        None => (0, TaskCursor::START),
    };
    let user_id = who.listing_user();
    let mut page: Vec<Value> = vec![];
    let (mut scanned, mut more) = (0, true);
    while more && page.len() < p.page_size && scanned < MAX_LIST_SCAN {
        let query = TaskQuery { user_id: user_id.clone(), before: before.clone(), limit: MAX_LIST_SCAN - scanned };
        let got = store.list_tasks(&query).await.map_err(|e| RpcError::edge(e.into()))?;
        more = got.next.is_some();
        let read = got.tasks.len();
        for (i, r) in got.tasks.into_iter().enumerate() {
            scanned += 1;
            before = TaskCursor::of(&r);
            if r.subagent_type != def.name
                || !who.owns(&r.user_id)
                || p.context_id.as_deref().is_some_and(|c| c != r.session_id)
            {
                continue;
            }
            // A running task's record in the store may lag behind the live one.
            let v = view(s, s.engine.live(&r.task_id).map(|l| l.record()).unwrap_or(r), &[], who.authority());
            if p.state.is_some_and(|st| v.state() != st) {
                continue;
            }
            page.push(v.task(d, p.include_artifacts));
            if page.len() == p.page_size {
                more |= i + 1 < read;
                break;
            }
        }
    }
    let listed = listed.saturating_add(page.len() as u64);
    let next_token = if more { PageToken { listed, cursor: before }.token() } else { String::new() };
    Ok(json!({ "tasks": page, "nextPageToken": next_token, "pageSize": p.page_size, "totalSize": listed }))
}

/// One more stream or long poll of `who` ([`super::streams::Streams::admit`]), refused as an
/// invalid request naming `server.max_streams_per_principal`.
fn admit_stream(s: &ServerState, who: &Principal) -> Result<StreamPermit, RpcError> {
    s.streams.admit(who).map_err(|e| RpcError::invalid_request(e.message))
}

async fn stream_send(
    s: &ServerState,
    who: &Principal,
    def: &SubagentDefinition,
    params: &Value,
) -> Result<Sent, RpcError> {
    let p = parse_send(params)?;
    accept_message(s, who, def, &p).await
}

async fn subscribe(
    s: &ServerState,
    who: &Principal,
    def: &SubagentDefinition,
    params: &Value,
) -> Result<Sent, RpcError> {
    let id = parse_task_id(params)?;
    let rec = task_of(s, who, &def.name, &id).await?;
    Ok(Sent { task_id: rec.task_id, answered: vec![] })
}

/// The SSE answer to a stream or subscribe: the task as it is now, then its status and
/// artifact updates as they happen, ending when the task finishes or waits for the client;
/// shown to a reader with `authority`.
fn stream(
    permit: StreamPermit,
    s: AppState,
    rpc_id: Value,
    d: Dialect,
    sent: Sent,
    authority: Authority,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let (tx, rx) = mpsc::channel::<Value>(STREAM_BUFFER);
    let heartbeat = s.heartbeat;
    tokio::spawn(async move { produce(permit, s, d, sent, rpc_id, tx, authority).await });
    let events = futures_util::stream::unfold(rx, |mut rx| async move {
        let v = rx.recv().await?;
        let mut ev = Event::default().data(v.to_string());
        if v.get("error").is_some() {
            ev = ev.event("error");
        }
        Some((Ok(ev), rx))
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(heartbeat))
}

/// Holds `permit` (the stream's admission) until the stream ends.
async fn produce(
    permit: StreamPermit,
    s: AppState,
    d: Dialect,
    sent: Sent,
    rpc_id: Value,
    tx: mpsc::Sender<Value>,
    authority: Authority,
) {
    let send = |v: Value| {
        let tx = tx.clone();
        let id = rpc_id.clone();
        async move { tx.send(rpc_result(&id, v)).await.is_ok() }
    };
    // The stream starts with the task as it is, then follows the events after it: the
    // events are counted before the record is read, so the record is at least as new as
    // every event left out (later events that repeat its state are not sent again).
    let after = s.engine.live(&sent.task_id).map(|l| l.event_count()).unwrap_or(0);
    let Ok(Some(rec)) = s.engine.get(&sent.task_id).await else {
        let _ = tx.send(rpc_error(&rpc_id, &RpcError::task_not_found(&sent.task_id))).await;
        return;
    };
    let first = view(&s, rec.clone(), &sent.answered, authority);
    let mut last = first.state();
    if !send(send_result(d, first.task(d, true))).await || last.is_settled() {
        return;
    }
    let session = (rec.user_id.clone(), rec.session_id.clone());
    let mut events = super::follow::follow(permit, s.engine.clone(), rec.task_id.clone(), session, after, authority);
    while let Some((_, ev)) = events.recv().await {
        // Each update says what the event says, not what the record says by now (a fast
        // task is finished before its `working` event is read).
        let Some(v) = at_event(&s, &rec, &ev, &sent.answered, authority) else { continue };
        let state = v.state();
        if ev.get("type").and_then(Value::as_str) == Some("tool_call") {
            if state == A2aState::Working && last == A2aState::Working && !send(v.tool_update(d, &ev)).await {
                return;
            }
            continue;
        }
        if (state == last && !state.is_terminal()) || (state == A2aState::Submitted && last != A2aState::Submitted) {
            continue;
        }
        if let Some(a) = v.artifact_update(d)
            && !send(a).await
        {
            return;
        }
        if !send(v.status_update(d)).await {
            return;
        }
        last = state;
        if state.is_settled() {
            return;
        }
    }
    // The events ended without the task settling in them (it ended elsewhere): the
    // stream still ends with where the task stands.
    if let Ok(Some(rec)) = s.engine.get(&sent.task_id).await {
        let v = view(&s, rec, &sent.answered, authority);
        if v.state() != last {
            if let Some(a) = v.artifact_update(d)
                && !send(a).await
            {
                return;
            }
            send(v.status_update(d)).await;
        }
    }
}

/// The task as one of its events leaves it, for the events a stream reports: `status`
/// (submitted, working), `approval_request` (while it is still pending and not just
/// answered), `tool_call` (progress) and `finish`; `None` for every other event. Shown to
/// a reader with `authority`.
fn at_event(s: &ServerState, rec: &TaskRecord, ev: &Value, answered: &[String], authority: Authority) -> Option<View> {
    let mut rec = rec.clone();
    let field = |f: &str| ev.get(f).and_then(Value::as_str);
    match field("type")? {
        "status" => {
            let status: TaskState = serde_json::from_value(ev.get("status")?.clone()).ok()?;
            if !matches!(status, TaskState::Submitted | TaskState::Working) {
                return None; // `input_required` is told by its `approval_request`
            }
            rec.status = status;
            rec.finished_at_ms = None;
            Some(View { rec, waiting: vec![] })
        }
        "approval_request" => {
            let id = field("id")?;
            let waiting: Vec<PendingApproval> = waiting_for(s, &rec.task_id, answered)
                .into_iter()
                .filter(|p| p.id == id)
                .map(|p| p.offered_to(authority))
                .collect();
            if waiting.is_empty() {
                return None; // already decided: later events tell how it went on
            }
            rec.status = TaskState::InputRequired;
            rec.finished_at_ms = None;
            Some(View { rec, waiting })
        }
        "tool_call" => {
            rec.status = TaskState::Working;
            rec.finished_at_ms = None;
            Some(View { rec, waiting: vec![] })
        }
        "finish" => {
            rec.status = serde_json::from_value(ev.get("status")?.clone()).ok()?;
            rec.output = field("output").map(str::to_owned);
            rec.error = field("error").map(str::to_owned);
            rec.finished_at_ms = Some(rec.finished_at_ms.unwrap_or(rec.updated_at_ms));
            Some(View { rec, waiting: vec![] })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const STATUSES: [&str; 6] = ["submitted", "working", "input_required", "completed", "failed", "canceled"];

    /// A task state by its wire name.
    fn st(name: &str) -> TaskState {
        serde_json::from_value(json!(name)).unwrap()
    }

    #[test]
    fn warden_statuses_map_to_a2a_states() {
        let cases = [
            (("submitted", false, false), A2aState::Submitted),
            (("working", false, false), A2aState::Working),
            (("working", false, true), A2aState::InputRequired),
            // Set while an approval waits; once it is answered (not yet reflected) the task works.
            (("input_required", false, true), A2aState::InputRequired),
            (("input_required", false, false), A2aState::Working),
            // The plugin asked a question and the task ended there.
            (("input_required", true, false), A2aState::InputRequired),
            (("completed", true, false), A2aState::Completed),
            (("failed", true, false), A2aState::Failed),
            (("canceled", true, false), A2aState::Canceled),
            // A finished task waits for nothing, whatever the gate still lists.
            (("completed", true, true), A2aState::Completed),
        ];
        for ((status, finished, waits), want) in cases {
            assert_eq!(state_of(st(status), finished, waits), want, "{status} finished={finished} waits={waits}");
        }
        assert_eq!(A2aState::InputRequired.wire(Dialect::V1), "TASK_STATE_INPUT_REQUIRED");
        assert_eq!(A2aState::InputRequired.wire(Dialect::V03), "input-required");
        assert_eq!(A2aState::Canceled.wire(Dialect::V1), "TASK_STATE_CANCELED");
    }

    proptest! {
        #[test]
        fn state_mapping_is_total_and_consistent(
            status in proptest::sample::select(STATUSES.to_vec()).prop_map(st),
            finished: bool,
            waits: bool,
        ) {
            let st = state_of(status, finished, waits);
            // A running task is never reported as ended (or unknown); an ended one never as running.
            if !finished {
                prop_assert!(!st.is_terminal() && st != A2aState::Unknown);
                prop_assert_eq!(st == A2aState::InputRequired, waits);
            } else {
                prop_assert!(!matches!(st, A2aState::Submitted | A2aState::Working));
            }
            for d in [Dialect::V1, Dialect::V03] {
                prop_assert_eq!(A2aState::parse(st.wire(d)), Some(st));
            }
        }

        #[test]
        fn hostile_bytes_never_panic_the_request_reader(body in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse_request(&body);
        }

        #[test]
        fn hostile_params_never_panic_and_answers_approve_only_when_asked_to(
            params in arb_json(),
            text in ".{0,40}",
            data in proptest::collection::vec(arb_json(), 0..3),
        ) {
            let _ = parse_send(&params);
            let _ = parse_task_id(&params);
            let _ = parse_list(&params);
            let req = json!({ "jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params });
            let _ = parse_request(req.to_string().as_bytes());
            if let Ok(a) = parse_answer(&text, &data)
                && a.resolution == Resolution::Approve
            {
                let said = word_resolution(&text) == Some(Resolution::Approve)
                    || data.iter().any(|d| d.get("decision") == Some(&json!("approve")));
                prop_assert!(said, "approved without being asked to: {text:?} {data:?}");
                prop_assert!(word_resolution(&text) != Some(Resolution::Decline));
            }
        }

        #[test]
        fn only_plain_context_ids_are_accepted(ctx in ".{0,140}") {
            let params = json!({ "message": { "role": "ROLE_USER", "parts": [{ "text": "hi" }], "contextId": ctx } });
            let r = parse_send(&params);
            let plain = !ctx.is_empty() && ctx.len() <= 128
                && ctx.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
            if ctx.is_empty() {
                prop_assert_eq!(r.unwrap().context_id, None);
            } else if plain {
                prop_assert_eq!(r.unwrap().context_id, Some(ctx));
            } else {
                prop_assert_eq!(r.unwrap_err().code, RpcError::INVALID_PARAMS);
            }
        }

        #[test]
        fn hosts_with_anything_but_name_and_port_are_refused(host in ".{0,300}") {
            if valid_host(&host) {
                prop_assert!(host.len() <= MAX_HOST_LEN);
                prop_assert!(!host.contains(['\r', '\n', '/', '@', ' ', '?', '#']));
            }
        }
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            prop_oneof![Just("approve".to_owned()), Just("decline".to_owned()), Just("yes".to_owned()), ".{0,12}"]
                .prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            let keys = prop_oneof![
                Just("message".to_owned()),
                Just("parts".to_owned()),
                Just("text".to_owned()),
                Just("data".to_owned()),
                Just("decision".to_owned()),
                Just("request_id".to_owned()),
                Just("scope".to_owned()),
                Just("contextId".to_owned()),
                Just("taskId".to_owned()),
                Just("role".to_owned()),
                Just("configuration".to_owned()),
                Just("pageSize".to_owned()),
                Just("id".to_owned()),
                "[a-z]{1,6}",
            ];
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(keys, inner, 0..5).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    #[test]
    fn json_rpc_framing_errors_have_their_codes() {
        let code = |b: &[u8]| parse_request(b).unwrap_err().1.code;
        assert_eq!(code(b"{not json"), RpcError::PARSE);
        assert_eq!(code(b""), RpcError::PARSE);
        assert_eq!(code(br#"[{"jsonrpc":"2.0","id":1,"method":"GetTask"}]"#), RpcError::INVALID_REQUEST);
        assert_eq!(code(br#""x""#), RpcError::INVALID_REQUEST);
        assert_eq!(code(br#"{"id":1,"method":"GetTask"}"#), RpcError::INVALID_REQUEST);
        assert_eq!(code(br#"{"jsonrpc":"2.0","id":{},"method":"GetTask"}"#), RpcError::INVALID_REQUEST);
        assert_eq!(code(br#"{"jsonrpc":"2.0","id":1}"#), RpcError::INVALID_REQUEST);
        assert_eq!(
            code(br#"{"jsonrpc":"2.0","id":1,"method":"tasks/pushNotificationConfig/set"}"#),
            RpcError::METHOD_NOT_FOUND
        );
        assert_eq!(code(br#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":[1]}"#), RpcError::INVALID_PARAMS);
        let (id, e) = parse_request(br#"{"jsonrpc":"2.0","id":"abc","method":"Nope"}"#).unwrap_err();
        assert_eq!((id, e.code), (json!("abc"), RpcError::METHOD_NOT_FOUND));
        let r = parse_request(br#"{"jsonrpc":"2.0","id":7,"method":"message/send","params":{}}"#).unwrap();
        assert_eq!((r.id, r.notification, r.method, r.dialect), (json!(7), false, Method::Send, Dialect::V03));
        // A member twice is refused, whichever copy a parser would keep.
        for dup in [
            r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"GetTask"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","method":"CancelTask"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{},"params":{"id":"x"}}"#,
            r#"{"jsonrpc":"2.0","jsonrpc":"2.0","id":1,"method":"GetTask"}"#,
        ] {
            assert_eq!(code(dup.as_bytes()), RpcError::INVALID_REQUEST, "{dup}");
        }
        // No `id` member: a notification; `"id": null` is an ordinary request.
        assert!(parse_request(br#"{"jsonrpc":"2.0","method":"GetTask"}"#).unwrap().notification);
        assert!(!parse_request(br#"{"jsonrpc":"2.0","id":null,"method":"GetTask"}"#).unwrap().notification);
        assert!(version_supported(None) && version_supported(Some("1.0")) && version_supported(Some("0.3")));
        assert!(!version_supported(Some("2.0")) && !version_supported(Some("x")));
    }

    #[test]
    fn send_params_of_both_dialects() {
        let v1 = json!({
            "message": { "messageId": "m1", "role": "ROLE_USER", "parts": [{ "text": "hello" }, { "data": { "k": 1 } }], "contextId": "ctx-1" },
            "configuration": { "returnImmediately": true },
        });
        let p = parse_send(&v1).unwrap();
        assert_eq!((p.text.as_str(), p.context_id.as_deref(), p.blocking), ("hello", Some("ctx-1"), false));
        assert_eq!(prompt_of(&p), "hello\n\n{\"k\":1}");
        let v03 = json!({
            "message": { "kind": "message", "messageId": "m1", "role": "user", "parts": [{ "kind": "text", "text": "hi" }], "taskId": "task_1" },
            "configuration": { "blocking": true },
        });
        let p = parse_send(&v03).unwrap();
        assert_eq!((p.text.as_str(), p.task_id.as_deref(), p.blocking), ("hi", Some("task_1"), true));
        let err = |params: Value| parse_send(&params).unwrap_err().code;
        assert_eq!(err(json!({})), RpcError::INVALID_PARAMS);
        assert_eq!(
            err(json!({ "message": { "role": "ROLE_AGENT", "parts": [{ "text": "x" }] } })),
            RpcError::INVALID_PARAMS
        );
        assert_eq!(err(json!({ "message": { "parts": [] } })), RpcError::INVALID_PARAMS);
        assert_eq!(
            err(json!({ "message": { "parts": [{ "url": "http://x/y" }] } })),
            RpcError::CONTENT_TYPE_NOT_SUPPORTED
        );
        assert_eq!(
            err(json!({ "message": { "parts": [{ "kind": "file", "file": {} }] } })),
            RpcError::CONTENT_TYPE_NOT_SUPPORTED
        );
        assert_eq!(err(json!({ "message": { "parts": [{ "text": 3 }] } })), RpcError::INVALID_PARAMS);
        assert_eq!(
            err(json!({ "message": { "parts": [{ "text": "x" }], "contextId": "../etc" } })),
            RpcError::INVALID_PARAMS
        );
        assert_eq!(
            err(json!({ "message": { "parts": [{ "text": "x" }] }, "configuration": { "blocking": "yes" } })),
            RpcError::INVALID_PARAMS
        );
        let many: Vec<Value> = (0..=MAX_PARTS).map(|_| json!({ "text": "x" })).collect();
        assert_eq!(err(json!({ "message": { "parts": many } })), RpcError::INVALID_PARAMS);
        assert_eq!(description_of("  \nfirst line\nsecond"), "A2A: first line");
    }

    #[test]
    fn answers_are_explicit_or_errors() {
        let ok = |t: &str, d: Vec<Value>| parse_answer(t, &d).map(|a| a.resolution);
        assert_eq!(ok("approve", vec![]), Ok(Resolution::Approve));
        assert_eq!(ok("  Yes. ", vec![]), Ok(Resolution::Approve));
        assert_eq!(ok("no", vec![]), Ok(Resolution::Decline));
        assert_eq!(ok("DECLINE!", vec![]), Ok(Resolution::Decline));
        assert_eq!(ok("", vec![json!({ "decision": "approve" })]), Ok(Resolution::Approve));
        assert_eq!(ok("approve", vec![json!({ "decision": "approve" })]), Ok(Resolution::Approve));
        for unclear in ["maybe", "yes please", "approve it", "ok", "", "not approve", "approve\nno"] {
            let e = parse_answer(unclear, &[]).unwrap_err();
            assert_eq!(e.code, RpcError::INVALID_PARAMS, "{unclear:?}");
        }
        assert!(parse_answer("no", &[json!({ "decision": "approve" })]).is_err(), "disagreeing answers");
        assert!(parse_answer("", &[json!({ "decision": "yes" })]).is_err());
        assert!(parse_answer("", &[json!({ "decision": "approve" }), json!({ "decision": "approve" })]).is_err());
        assert!(parse_answer("", &[json!({ "decision": "approve", "scope": "forever" })]).is_err());
        let a =
            parse_answer("", &[json!({ "decision": "approve", "request_id": "apr_1", "scope": "session" })]).unwrap();
        assert_eq!(
            a,
            Answer { resolution: Resolution::Approve, request_id: Some("apr_1".into()), scope: Scope::Session }
        );
    }

    #[test]
    fn hosts_and_base_urls() {
        for good in ["127.0.0.1:8080", "localhost", "[::1]:3000", "agents.example.com", "a-b_c.d"] {
            assert!(valid_host(good), "{good}");
        }
        for bad in [
            "",
            "a b",
            "x\r\nSet-Cookie: a",
            "evil.com/path",
            "user@host",
            "h:",
            "h:123456",
            "h:8a",
            "::1",
            "[zz]",
            &"a".repeat(300),
        ] {
            assert!(!valid_host(bad), "{bad:?}");
        }
        let mut h = HeaderMap::new();
        assert!(base_url(&h, None).is_err());
        h.insert(header::HOST, "127.0.0.1:9".parse().unwrap());
        assert_eq!(base_url(&h, None).unwrap(), "http://127.0.0.1:9");
        h.insert("x-forwarded-proto", "https".parse().unwrap());
        assert_eq!(base_url(&h, None).unwrap(), "https://127.0.0.1:9");
        h.insert(header::HOST, "evil.com/x".parse().unwrap());
        assert_eq!(base_url(&h, None).unwrap_err().code, "invalid_host");
    }

    #[test]
    fn one_card_for_both_generations() {
        let reference =
            crate::plugin::SubagentReference { uri: "x".into(), kind: "CLAUDE".into(), metadata: Default::default() };
        let def = SubagentDefinition::new("code reviewer".into(), "Reviews code".into(), reference, "{}".into());
        let c = card_json(&def, "http://h:1", false);
        let url = "http://h:1/a2a/code%20reviewer";
        assert_eq!(
            c["supportedInterfaces"][0],
            json!({ "url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0" })
        );
        assert_eq!(c["supportedInterfaces"][1]["protocolVersion"], "0.3");
        assert_eq!(
            (c["url"].as_str(), c["preferredTransport"].as_str(), c["protocolVersion"].as_str()),
            (Some(url), Some("JSONRPC"), Some("0.3.0"))
        );
        assert_eq!(c["capabilities"]["streaming"], true);
        assert_eq!(c["skills"][0]["id"], "code reviewer");
        assert_eq!(c["skills"][0]["description"], "Reviews code");
        assert!(c.get("security").is_none());
        let c = card_json(&def, "http://h:1", true);
        assert_eq!(c["security"], json!([{ "bearer": [] }]));
    }

    #[test]
    fn only_resumable_tasks_are_resumed() {
        assert!(resumable("CLAUDE", TaskState::Completed) && resumable("CLAUDE", TaskState::InputRequired));
        assert!(resumable("A2A", TaskState::InputRequired) && !resumable("a2a", TaskState::Completed));
        assert!(
            !resumable("CLAUDE", TaskState::Failed)
                && !resumable("CLAUDE", TaskState::Canceled)
                && !resumable("CLAUDE", TaskState::Working)
        );
    }

    /// Regression: the remembered contexts were one map for every user, cleared whole when
    /// it filled, so one tenant opening many contexts pushed every other tenant's lookups
    /// onto a scan of the task store. Each user's contexts are bounded on their own.
    #[test]
    fn regression_one_users_context_churn_never_evicts_anothers() {
        let (alice, bob) = ("regression-churn-alice", "regression-churn-bob");
        let key = |n: usize| (format!("ctx-{n}"), "greeter".to_owned());
        remember(alice, key(0), "task_alice");
        for n in 0..=MAX_REMEMBERED_CONTEXTS {
            remember(bob, key(n), &format!("task_bob_{n}"));
        }
        assert_eq!(remembered(alice, &key(0)), Some(vec!["task_alice".to_owned()]));
        // Bob's own memory started over when it filled, and holds his newest context.
        assert_eq!(remembered(bob, &key(0)), None);
        let newest = key(MAX_REMEMBERED_CONTEXTS);
        assert_eq!(remembered(bob, &newest), Some(vec![format!("task_bob_{MAX_REMEMBERED_CONTEXTS}")]));
    }

    proptest! {
        /// A page token reads back as given; text it never gave out is refused.
        #[test]
        fn page_tokens_read_back(listed in any::<u64>(), created in 0..=i64::MAX as u64, id in "[a-z0-9_]{1,40}") {
            let t = PageToken { listed, cursor: TaskCursor { created_at_ms: created, task_id: id } };
            prop_assert_eq!(PageToken::parse(&t.token()), Some(t));
        }
    }

    #[test]
    fn made_up_page_tokens_are_invalid_params() {
        for junk in ["50", "x.1.task_a", "1.x.task_a", "1.2.", "-1.2.task_a", "1.2"] {
            let e = parse_list(&json!({ "pageToken": junk })).unwrap_err();
            assert_eq!(e.code, RpcError::INVALID_PARAMS, "{junk}");
        }
    }
}
