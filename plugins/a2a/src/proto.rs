//! JSON-RPC requests and responses of A2A 1.0 and 0.3, normalised into one [`Event`]
//! type and accumulated by a [`Tracker`].
//!
//! 1.0 (ProtoJSON): methods `SendMessage`, `SendStreamingMessage`, `GetTask`,
//! `CancelTask`; roles `ROLE_USER`/`ROLE_AGENT`; parts `{"text": ..}`; states
//! `TASK_STATE_*`; send results wrap the payload (`{"task": ..}` / `{"message": ..}`),
//! stream results add `statusUpdate` / `artifactUpdate`; `GetTask` returns a bare task.
//! 0.3: methods `message/send`, `message/stream`, `tasks/get`, `tasks/cancel`; objects
//! carry `kind` (`message`, `task`, `status-update`, `artifact-update`; parts `text`,
//! `data`, `file`); roles `user`/`agent`; states `input-required`, ...

use serde_json::{Value, json};
use warden_guest::text::truncate;

use crate::card::Version;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Send,
    Stream,
    Get,
    Cancel,
}

pub fn method(version: Version, op: Op) -> &'static str {
    match (version, op) {
        (Version::V1_0, Op::Send) => "SendMessage",
        (Version::V1_0, Op::Stream) => "SendStreamingMessage",
        (Version::V1_0, Op::Get) => "GetTask",
        (Version::V1_0, Op::Cancel) => "CancelTask",
        (Version::V0_3, Op::Send) => "message/send",
        (Version::V0_3, Op::Stream) => "message/stream",
        (Version::V0_3, Op::Get) => "tasks/get",
        (Version::V0_3, Op::Cancel) => "tasks/cancel",
    }
}

/// HTTP headers for a JSON-RPC call.
pub fn headers(version: Version, streaming: bool) -> Vec<(String, String)> {
    let mut h = vec![
        ("content-type".to_string(), "application/json".to_string()),
        ("accept".to_string(), if streaming { "text/event-stream" } else { "application/json" }.to_string()),
    ];
    if version == Version::V1_0 {
        h.push(("A2A-Version".to_string(), "1.0".to_string()));
    }
    h
}

/// The user message carrying the prompt as one text part.
pub fn user_message(
    version: Version,
    message_id: &str,
    text: &str,
    context_id: Option<&str>,
    task_id: Option<&str>,
) -> Value {
    let mut m = match version {
        Version::V1_0 => json!({ "messageId": message_id, "role": "ROLE_USER", "parts": [{ "text": text }] }),
        Version::V0_3 => json!({
            "kind": "message", "messageId": message_id, "role": "user",
            "parts": [{ "kind": "text", "text": text }],
        }),
    };
    if let Some(c) = context_id {
        m["contextId"] = json!(c);
    }
    if let Some(t) = task_id {
        m["taskId"] = json!(t);
    }
    m
}

/// Params of a send (blocking: the server answers once the task is terminal or interrupted).
pub fn send_params(version: Version, message: Value) -> Value {
    match version {
        Version::V1_0 => json!({ "message": message, "configuration": { "returnImmediately": false } }),
        Version::V0_3 => json!({ "message": message, "configuration": { "blocking": true } }),
    }
}

pub fn task_params(id: &str) -> Value {
    json!({ "id": id })
}

/// A JSON-RPC 2.0 request body.
pub fn request(id: u64, method: &str, params: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))
        .expect("JSON values serialize")
}

/// Task states of both versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Submitted,
    Working,
    InputRequired,
    AuthRequired,
    Completed,
    Failed,
    Canceled,
    Rejected,
    Unknown,
}

impl State {
    /// `TASK_STATE_INPUT_REQUIRED` (1.0) and `input-required` (0.3) alike.
    pub fn parse(s: &str) -> State {
        let s = s.trim();
        let s = s.strip_prefix("TASK_STATE_").unwrap_or(s).to_ascii_lowercase().replace('_', "-");
        match s.as_str() {
            "submitted" => State::Submitted,
            "working" => State::Working,
            "input-required" => State::InputRequired,
            "auth-required" => State::AuthRequired,
            "completed" => State::Completed,
            "failed" => State::Failed,
            "canceled" | "cancelled" => State::Canceled,
            "rejected" => State::Rejected,
            _ => State::Unknown,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            State::Submitted => "submitted",
            State::Working => "working",
            State::InputRequired => "input-required",
            State::AuthRequired => "auth-required",
            State::Completed => "completed",
            State::Failed => "failed",
            State::Canceled => "canceled",
            State::Rejected => "rejected",
            State::Unknown => "unknown",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, State::Completed | State::Failed | State::Canceled | State::Rejected)
    }

    pub fn is_interrupted(self) -> bool {
        matches!(self, State::InputRequired | State::AuthRequired)
    }

    /// Nothing more will happen without the client: stop streaming or polling.
    pub fn is_settled(self) -> bool {
        self.is_terminal() || self.is_interrupted()
    }
}

/// The text of a list of parts: text parts as is, data parts as JSON; files by name.
pub fn parts_text(parts: Option<&Value>) -> String {
    let Some(Value::Array(parts)) = parts else { return String::new() };
    parts.iter().filter_map(part).map(|p| p.text().to_string()).collect::<Vec<_>>().join("\n")
}

/// One part of an artifact, reduced to its text.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text(String),
    /// A data part (as JSON) or a file (by name): it stands on its own line.
    Other(String),
}

impl Part {
    fn text(&self) -> &str {
        match self {
            Part::Text(t) | Part::Other(t) => t,
        }
    }
}

fn part(p: &Value) -> Option<Part> {
    if let Some(t) = p.get("text").and_then(Value::as_str) {
        return Some(Part::Text(t.to_string()));
    }
    if let Some(d) = p.get("data") {
        return Some(Part::Other(d.to_string()));
    }
    let f = p.get("file").or_else(|| p.get("url"))?;
    let name = f.get("name").or_else(|| p.get("filename")).and_then(Value::as_str);
    let uri = f.get("uri").and_then(Value::as_str).or_else(|| f.as_str());
    Some(Part::Other(format!("[file {}]", name.or(uri).unwrap_or("(unnamed)"))))
}

/// An artifact's parts, in order.
pub fn artifact_parts(parts: Option<&Value>) -> Vec<Part> {
    match parts {
        Some(Value::Array(parts)) => parts.iter().filter_map(part).collect(),
        _ => Vec::new(),
    }
}

/// The text of an artifact: adjacent text parts joined as they are, a data or file part
/// on its own line. One rule however the parts arrived — whole in a task, appended chunk
/// by chunk to a stream (`append: true` adds parts), or a polled task holding the chunks
/// streamed so far as parts — so a stream cut short and followed by polling (after a
/// takeover of the warden task) gives the text an uninterrupted stream gives.
pub fn artifact_text(parts: &[Part]) -> String {
    let mut out = String::new();
    let mut after_other = false;
    for p in parts {
        let other = matches!(p, Part::Other(_));
        if !out.is_empty() && (other || after_other) {
            out.push('\n');
        }
        out.push_str(p.text());
        after_other = other;
    }
    out
}

fn is_agent_role(role: Option<&str>) -> bool {
    matches!(role, Some("agent" | "ROLE_AGENT"))
}

/// A message, reduced to what the executor needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Msg {
    pub from_agent: bool,
    pub text: String,
    pub task_id: Option<String>,
    pub context_id: Option<String>,
}

fn msg(v: &Value) -> Msg {
    Msg {
        from_agent: is_agent_role(v.get("role").and_then(Value::as_str)),
        text: parts_text(v.get("parts")),
        task_id: str_field(v, "taskId"),
        context_id: str_field(v, "contextId"),
    }
}

fn str_field(v: &Value, f: &str) -> Option<String> {
    v.get(f).and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_string)
}

/// A task snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskView {
    pub id: String,
    pub context_id: Option<String>,
    pub state: State,
    pub status_message: Option<Msg>,
    /// `(artifactId, parts)` in order.
    pub artifacts: Vec<(String, Vec<Part>)>,
    /// The last agent message in the history.
    pub last_agent_message: Option<String>,
}

/// One normalised server event (a send result, a stream event or a polled task).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Task(TaskView),
    Message(Msg),
    Status { task_id: Option<String>, context_id: Option<String>, state: State, message: Option<Msg> },
    Artifact { task_id: Option<String>, artifact_id: String, parts: Vec<Part>, append: bool },
}

fn task_view(t: &Value) -> Result<TaskView, String> {
    let id = str_field(t, "id").ok_or("task without `id`")?;
    let status = t.get("status");
    let state = status.and_then(|s| s.get("state")).and_then(Value::as_str).map(State::parse).unwrap_or(State::Unknown);
    let status_message = status.and_then(|s| s.get("message")).filter(|m| m.is_object()).map(msg);
    let artifacts = match t.get("artifacts") {
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, a)| {
                (str_field(a, "artifactId").unwrap_or_else(|| format!("#{i}")), artifact_parts(a.get("parts")))
            })
            .collect(),
        _ => Vec::new(),
    };
    let last_agent_message = match t.get("history") {
        Some(Value::Array(h)) => h.iter().rev().map(msg).find(|m| m.from_agent && !m.text.is_empty()).map(|m| m.text),
        _ => None,
    };
    Ok(TaskView { id, context_id: str_field(t, "contextId"), state, status_message, artifacts, last_agent_message })
}

fn status_event(s: &Value) -> Event {
    let status = s.get("status");
    Event::Status {
        task_id: str_field(s, "taskId"),
        context_id: str_field(s, "contextId"),
        state: status
            .and_then(|st| st.get("state"))
            .and_then(Value::as_str)
            .map(State::parse)
            .unwrap_or(State::Unknown),
        message: status.and_then(|st| st.get("message")).filter(|m| m.is_object()).map(msg),
    }
}

fn artifact_event(a: &Value) -> Event {
    let artifact = a.get("artifact").cloned().unwrap_or(Value::Null);
    Event::Artifact {
        task_id: str_field(a, "taskId"),
        artifact_id: str_field(&artifact, "artifactId").unwrap_or_default(),
        parts: artifact_parts(artifact.get("parts")),
        append: a.get("append").and_then(Value::as_bool).unwrap_or(false),
    }
}

/// Normalises a JSON-RPC `result` of any method of either version.
pub fn parse_result(result: &Value) -> Result<Event, String> {
    if !result.is_object() {
        return Err(format!("expected a JSON object as the result, got {result}"));
    }
    if let Some(kind) = result.get("kind").and_then(Value::as_str) {
        return match kind {
            "task" => task_view(result).map(Event::Task),
            "message" => Ok(Event::Message(msg(result))),
            "status-update" => Ok(status_event(result)),
            "artifact-update" => Ok(artifact_event(result)),
            other => Err(format!("unknown result kind {other:?}")),
        };
    }
    if let Some(t) = result.get("task") {
        return task_view(t).map(Event::Task);
    }
    if let Some(m) = result.get("message") {
        return Ok(Event::Message(msg(m)));
    }
    if let Some(s) = result.get("statusUpdate") {
        return Ok(status_event(s));
    }
    if let Some(a) = result.get("artifactUpdate") {
        return Ok(artifact_event(a));
    }
    if result.get("id").is_some() && result.get("status").is_some() {
        return task_view(result).map(Event::Task);
    }
    Err(format!("unrecognised A2A result: {}", truncate(&result.to_string(), 300)))
}

/// A JSON-RPC response body → its result, or the remote error as text.
pub fn parse_response(body: &[u8]) -> Result<Value, RpcError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        RpcError::Malformed(format!("response is not JSON ({e}): {}", truncate(&String::from_utf8_lossy(body), 200)))
    })?;
    if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
        let Some(code) = err.get("code").and_then(Value::as_i64) else {
            return Err(RpcError::Malformed(format!("not a JSON-RPC error: {}", truncate(&err.to_string(), 200))));
        };
        let message = err.get("message").and_then(Value::as_str).unwrap_or("(no message)");
        return Err(RpcError::Remote { code, message: message.to_string() });
    }
    match v.get("result") {
        Some(r) => Ok(r.clone()),
        None => Err(RpcError::Malformed(format!(
            "JSON-RPC response has neither result nor error: {}",
            truncate(&v.to_string(), 200)
        ))),
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum RpcError {
    Remote { code: i64, message: String },
    Malformed(String),
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RpcError::Remote { code, message } => write!(f, "A2A error {code}: {message}"),
            RpcError::Malformed(m) => f.write_str(m),
        }
    }
}

/// Everything known about the remote task so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tracker {
    pub task_id: Option<String>,
    pub context_id: Option<String>,
    pub state: Option<State>,
    /// Text of the latest status message.
    pub status_text: Option<String>,
    /// `(artifactId, parts)` in order.
    pub artifacts: Vec<(String, Vec<Part>)>,
    pub last_agent_message: Option<String>,
}

impl Tracker {
    /// Applies one event; returns a progress note worth relaying (state and text), if any.
    pub fn apply(&mut self, event: Event) -> Option<(State, Option<String>)> {
        match event {
            Event::Task(t) => {
                self.task_id = Some(t.id);
                self.context_id = t.context_id.or(self.context_id.take());
                let changed = self.state != Some(t.state);
                self.state = Some(t.state);
                if !t.artifacts.is_empty() {
                    self.artifacts = t.artifacts;
                }
                if let Some(m) = t.last_agent_message {
                    self.last_agent_message = Some(m);
                }
                let text = t.status_message.map(|m| m.text).filter(|s| !s.is_empty());
                let text_changed = text.is_some() && text != self.status_text;
                if let Some(tx) = &text {
                    self.status_text = Some(tx.clone());
                    self.last_agent_message = Some(tx.clone());
                }
                (changed || text_changed).then_some((t.state, text))
            }
            Event::Message(m) => {
                // A direct reply: the interaction is over.
                self.task_id = m.task_id.or(self.task_id.take());
                self.context_id = m.context_id.or(self.context_id.take());
                if !m.text.is_empty() {
                    self.last_agent_message = Some(m.text);
                }
                if self.state.is_none_or(|s| !s.is_settled()) {
                    self.state = Some(State::Completed);
                }
                None
            }
            Event::Status { task_id, context_id, state, message } => {
                self.task_id = task_id.or(self.task_id.take());
                self.context_id = context_id.or(self.context_id.take());
                self.state = Some(state);
                let text = message.map(|m| m.text).filter(|s| !s.is_empty());
                if let Some(tx) = &text {
                    self.status_text = Some(tx.clone());
                    self.last_agent_message = Some(tx.clone());
                }
                Some((state, text))
            }
            Event::Artifact { task_id, artifact_id, parts, append } => {
                self.task_id = task_id.or(self.task_id.take());
                match self.artifacts.iter_mut().find(|(id, _)| *id == artifact_id) {
                    Some((_, existing)) if append => existing.extend(parts),
                    Some((_, existing)) => *existing = parts,
                    None => self.artifacts.push((artifact_id, parts)),
                }
                None
            }
        }
    }

    /// The result text: the artifacts, else the last agent message.
    pub fn result_text(&self) -> String {
        let texts: Vec<String> = self.artifacts.iter().map(|(_, parts)| artifact_text(parts)).collect();
        let artifacts: Vec<&str> = texts.iter().map(|t| t.trim_end()).filter(|t| !t.is_empty()).collect();
        if !artifacts.is_empty() {
            return artifacts.join("\n");
        }
        self.last_agent_message.clone().unwrap_or_default()
    }
}
