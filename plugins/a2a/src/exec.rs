//! The resolver and executor flows, written against [`Host`] (the warden capabilities
//! the plugin uses) so they run natively in tests against a scripted host.
//!
//! Execute: one fresh messageId per call (reused when a send is retried, so retries are
//! idempotent); streaming when the card says so (status updates relayed as `status`
//! events), else a blocking send; if the task is still running afterwards (or the stream
//! broke), `GetTask` polling with backoff until a terminal or interrupted state. A reserve
//! before the deadline is kept to cancel the remote task (`CancelTask`/`tasks/cancel`)
//! and report a timeout rather than be cut off by the host. When the warden task is
//! canceled (the host's `cancel` signal, polled between steps; a wait under way ends with
//! `canceled`), the remote task is canceled too, within the host's grace period.

use serde_json::{Value, json};
use warden_guest::http::{Request, Response, StreamHead, header};
use warden_guest::text::truncate;
use warden_guest::{Error, Metadata};

use crate::card::{self, CardInfo, Version};
use crate::proto::{self, Op, RpcError, State, Tracker};
use crate::sse::SseParser;

pub trait ChunkStream {
    fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, Error>;
}

/// The capabilities the plugin uses. In the component these are the host's imports.
pub trait Host {
    fn send(&mut self, req: Request) -> Result<Response, Error>;
    fn send_streaming(&mut self, req: Request) -> Result<(StreamHead, Box<dyn ChunkStream>), Error>;
    fn emit(&mut self, kind: &str, data: &Value);
    fn state_get(&mut self, key: &str) -> Result<Option<Vec<u8>>, Error>;
    fn state_set(&mut self, key: &str, value: &[u8]) -> Result<(), Error>;
    fn state_delete(&mut self, key: &str);
    /// Monotonic milliseconds.
    fn now_ms(&mut self) -> u64;
    /// Sleeps; `Err(Canceled)` when the warden task is canceled meanwhile.
    fn sleep_ms(&mut self, ms: u64) -> Result<(), Error>;
    /// Whether the warden task has been canceled.
    fn canceled(&mut self) -> bool {
        false
    }
    fn log(&mut self, message: &str);
}

// ---------------------------------------------------------------- resolve

/// Fetches and parses the card for a reference (`uri` + metadata).
pub fn resolve(host: &mut impl Host, uri: &str, meta: &[(String, String)]) -> Result<(CardInfo, String), Error> {
    let meta = Metadata::new(meta);
    let forced = match meta.get("protocol_version") {
        None => None,
        Some(v) => Some(Version::parse(v).ok_or_else(|| {
            Error::InvalidInput(format!("metadata `protocol_version` must be `1.0` or `0.3`, got {v:?}"))
        })?),
    };
    if !(uri.starts_with("http://") || uri.starts_with("https://")) {
        return Err(Error::InvalidInput(format!("an A2A reference uri must be an http(s) URL, got {uri:?}")));
    }
    let mut tried = Vec::new();
    for url in card::card_urls(uri) {
        let resp = host.send(Request {
            method: "GET".into(),
            url: url.clone(),
            headers: vec![("accept".into(), "application/json".into())],
            body: None,
            timeout_ms: Some(10_000),
            auth_secret: None,
        })?;
        if resp.status == 404 || resp.status == 410 {
            tried.push(format!("{url} (HTTP {})", resp.status));
            continue;
        }
        if !(200..300).contains(&resp.status) {
            return Err(Error::Remote(format!("fetching the agent card {url} returned HTTP {}", resp.status)));
        }
        let info = card::parse_card(&resp.body, &url, forced)
            .map_err(|problem| Error::InvalidInput(format!("invalid agent card at {url}: {problem}")))?;
        return Ok((info, url));
    }
    Err(Error::NotFound(format!("no agent card found: {}", tried.join(", "))))
}

/// What the executor keeps in the definition's `protocol-data`.
pub fn protocol_data(info: &CardInfo, card_url: &str) -> String {
    json!({
        "endpoint": info.endpoint,
        "protocol_version": info.version.as_str(),
        "streaming": info.streaming,
        "card_url": card_url,
    })
    .to_string()
}

// ---------------------------------------------------------------- execute

/// Where and how to talk to the agent (from `protocol-data` and reference metadata).
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub endpoint: String,
    pub version: Version,
    pub streaming: bool,
    /// Secret name for the host to inject as `Authorization: Bearer`.
    pub auth_secret: Option<String>,
}

impl Plan {
    pub fn from_definition(protocol_data: &str, meta: &[(String, String)]) -> Result<Plan, Error> {
        let bad = |m: &str| Error::InvalidInput(format!("A2A definition protocol-data: {m}"));
        let v: Value = serde_json::from_str(protocol_data).map_err(|e| bad(&e.to_string()))?;
        let endpoint = v.get("endpoint").and_then(Value::as_str).ok_or_else(|| bad("missing `endpoint`"))?;
        let version = v
            .get("protocol_version")
            .and_then(Value::as_str)
            .and_then(Version::parse)
            .ok_or_else(|| bad("missing or unknown `protocol_version`"))?;
        let meta = Metadata::new(meta);
        let streaming = match meta.get("streaming") {
            Some(s) => s == "true",
            None => v.get("streaming").and_then(Value::as_bool).unwrap_or(false),
        };
        let auth_secret = meta.get("auth_secret").or_else(|| meta.get("auth_env")).map(str::to_string);
        Ok(Plan { endpoint: endpoint.to_string(), version, streaming, auth_secret })
    }
}

pub struct Call<'a> {
    pub task_id: &'a str,
    pub prompt: &'a str,
    pub resume: Option<&'a str>,
    pub deadline_ms: u64,
}

/// What is saved under `a2a/<warden task id>` when the remote agent asks for input.
#[derive(Debug, Clone, PartialEq)]
pub struct Saved {
    pub task_id: String,
    pub context_id: Option<String>,
    pub version: Version,
}

pub fn state_key(task: &str) -> String {
    format!("a2a/{task}")
}

impl Saved {
    fn encode(&self) -> Vec<u8> {
        json!({ "task_id": self.task_id, "context_id": self.context_id, "protocol_version": self.version.as_str() })
            .to_string()
            .into_bytes()
    }

    fn decode(bytes: &[u8]) -> Option<Saved> {
        let v: Value = serde_json::from_slice(bytes).ok()?;
        Some(Saved {
            task_id: v.get("task_id")?.as_str()?.to_string(),
            context_id: v.get("context_id").and_then(Value::as_str).map(str::to_string),
            version: Version::parse(v.get("protocol_version")?.as_str()?)?,
        })
    }
}

/// Backoff between polls: 200 ms growing by half up to 2 s.
pub fn backoff_ms(attempt: u32) -> u64 {
    let mut d = 200f64;
    for _ in 0..attempt {
        d *= 1.5;
    }
    (d as u64).min(2_000)
}

/// Send attempts when the transport fails before the server answered.
const SEND_ATTEMPTS: u32 = 3;

struct Session<'h, H: Host> {
    host: &'h mut H,
    plan: Plan,
    deadline: u64,
    reserve: u64,
    rpc_id: u64,
    tracker: Tracker,
}

enum SendError {
    /// The server was not reached or answered with a retryable status.
    Transient(Error),
    Final(Error),
}

impl<H: Host> Session<'_, H> {
    fn remaining(&mut self) -> u64 {
        self.deadline.saturating_sub(self.host.now_ms())
    }

    /// Time a request may take, keeping the reserve for a cancel.
    fn budget(&mut self) -> Result<u32, Error> {
        let left = self.remaining().saturating_sub(self.reserve);
        if left < 50 {
            return Err(self.out_of_time());
        }
        Ok(left.min(u32::MAX as u64) as u32)
    }

    fn request(&mut self, op: Op, params: Value, timeout_ms: u32) -> Request {
        self.rpc_id += 1;
        Request {
            method: "POST".into(),
            url: self.plan.endpoint.clone(),
            headers: proto::headers(self.plan.version, op == Op::Stream),
            body: Some(proto::request(self.rpc_id, proto::method(self.plan.version, op), params)),
            timeout_ms: Some(timeout_ms),
            auth_secret: self.plan.auth_secret.clone(),
        }
    }

    fn call(&mut self, op: Op, params: Value) -> Result<Value, SendError> {
        let budget = self.budget().map_err(SendError::Final)?;
        let req = self.request(op, params, budget);
        let resp = self.host.send(req).map_err(|e| match e {
            Error::Remote(_) => SendError::Transient(e),
            other => SendError::Final(other),
        })?;
        if matches!(resp.status, 408 | 429 | 502 | 503 | 504) {
            return Err(SendError::Transient(Error::Remote(format!(
                "A2A endpoint {} returned HTTP {}",
                self.plan.endpoint, resp.status
            ))));
        }
        proto::parse_response(&resp.body).map_err(|e| {
            SendError::Final(match (&e, resp.status) {
                (RpcError::Malformed(_), s) if !(200..300).contains(&s) => {
                    Error::Remote(format!("A2A endpoint {} returned HTTP {s}", self.plan.endpoint))
                }
                _ => Error::Remote(e.to_string()),
            })
        })
    }

    fn apply(&mut self, result: &Value) -> Result<(), Error> {
        let event = proto::parse_result(result).map_err(Error::Remote)?;
        if let Some((state, text)) = self.tracker.apply(event) {
            self.progress(state, text);
        }
        Ok(())
    }

    fn progress(&mut self, state: State, text: Option<String>) {
        let mut data = json!({ "state": state.as_str(), "protocol": self.plan.version.as_str() });
        if let Some(t) = text {
            data["message"] = json!(truncate(&t, 4_000));
        }
        if let Some(id) = &self.tracker.task_id {
            data["remote_task_id"] = json!(id);
        }
        self.host.emit("progress", &data);
    }

    /// Blocking send, retried with the same message on transport failures.
    fn send(&mut self, message: Value) -> Result<(), Error> {
        let params = proto::send_params(self.plan.version, message);
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.call(Op::Send, params.clone()) {
                Ok(result) => return self.apply(&result),
                Err(SendError::Final(e)) => return Err(e),
                Err(SendError::Transient(e)) => {
                    let pause = 250 * attempt as u64;
                    if attempt >= SEND_ATTEMPTS || self.remaining() < self.reserve + pause + 100 {
                        return Err(e);
                    }
                    self.host.log(&format!("send failed ({}), retrying with the same messageId", e.message()));
                    self.host.sleep_ms(pause)?;
                }
            }
        }
    }

    /// Streams the send; returns false when the stream ended before the task settled.
    fn stream(&mut self, message: Value) -> Result<(), Error> {
        let params = proto::send_params(self.plan.version, message);
        let budget = self.budget()?;
        let req = self.request(Op::Stream, params, budget);
        let (head, mut body) = self.host.send_streaming(req)?;
        let status = head.status;
        let is_sse = header(&head.headers, "content-type").is_some_and(|c| c.contains("text/event-stream"));
        if !is_sse {
            // An error (or a server answering a stream with one JSON body).
            let mut bytes = Vec::new();
            while let Some(chunk) = body.next_chunk()? {
                bytes.extend_from_slice(&chunk);
            }
            let result = proto::parse_response(&bytes).map_err(|e| match (e, status) {
                (RpcError::Malformed(_), s) if !(200..300).contains(&s) => {
                    Error::Remote(format!("A2A endpoint {} returned HTTP {s}", self.plan.endpoint))
                }
                (e, _) => Error::Remote(e.to_string()),
            })?;
            return self.apply(&result);
        }
        let mut parser = SseParser::new();
        loop {
            let chunk = match body.next_chunk() {
                Ok(c) => c,
                Err(e @ Error::Canceled(_)) => return Err(e),
                Err(e) => {
                    // A broken or timed-out stream: poll if there is a task to poll.
                    self.host.log(&format!("A2A stream ended early: {}", e.message()));
                    if self.tracker.task_id.is_some() && !matches!(e, Error::Denied(_)) {
                        return Ok(());
                    }
                    if self.remaining() <= self.reserve {
                        return Err(self.out_of_time());
                    }
                    return Err(e);
                }
            };
            let events = match &chunk {
                Some(c) => parser.feed(c),
                None => parser.finish().map(Vec::from_iter),
            }
            .map_err(|e| Error::Remote(format!("A2A endpoint {}: {e}", self.plan.endpoint)))?;
            for event in events {
                let result = proto::parse_response(event.data.as_bytes()).map_err(|e| Error::Remote(e.to_string()))?;
                self.apply(&result)?;
            }
            if chunk.is_none() || self.tracker.state.is_some_and(State::is_settled) {
                return Ok(());
            }
            self.check_canceled()?;
        }
    }

    fn poll(&mut self) -> Result<(), Error> {
        let mut attempt = 0;
        while !self.tracker.state.is_some_and(State::is_settled) {
            self.check_canceled()?;
            let Some(id) = self.tracker.task_id.clone() else {
                return Err(Error::Remote("the remote agent answered with neither a task nor a message".into()));
            };
            let pause = backoff_ms(attempt);
            if self.remaining() < self.reserve + pause + 50 {
                return Err(self.out_of_time());
            }
            self.host.sleep_ms(pause)?;
            attempt += 1;
            match self.call(Op::Get, proto::task_params(&id)) {
                Ok(result) => self.apply(&result)?,
                Err(SendError::Transient(e)) => self.host.log(&format!("polling task {id} failed: {}", e.message())),
                Err(SendError::Final(e)) => return Err(e),
            }
        }
        Ok(())
    }

    /// `Err(Canceled)` once the warden task is canceled.
    fn check_canceled(&mut self) -> Result<(), Error> {
        match self.host.canceled() {
            true => Err(Error::Canceled("the warden task was canceled".into())),
            false => Ok(()),
        }
    }

    /// Cancels the remote task, if there is one: its id and whether the agent accepted.
    /// (The host bounds the request by the time left, after a cancellation its grace period.)
    fn cancel_remote(&mut self) -> Option<(String, bool)> {
        let id = self.tracker.task_id.clone()?;
        let timeout = self.remaining().clamp(1, 5_000) as u32;
        let req = self.request(Op::Cancel, proto::task_params(&id), timeout);
        let canceled = match self.host.send(req) {
            Ok(r) => proto::parse_response(&r.body).is_ok(),
            Err(_) => false,
        };
        Some((id, canceled))
    }

    /// The warden task was canceled: cancel the remote task too and say so.
    fn on_canceled(&mut self) -> Error {
        Error::Canceled(match self.cancel_remote() {
            None => "the warden task was canceled before the remote agent created a task".into(),
            Some((id, true)) => format!("the warden task was canceled; remote task {id} was canceled"),
            Some((id, false)) => format!("the warden task was canceled; canceling remote task {id} failed"),
        })
    }

    /// Sends (streaming or not), then polls until the remote task settles.
    fn run(&mut self, message: Value, streaming: bool) -> Result<(), Error> {
        if streaming {
            self.stream(message)?;
        } else {
            self.send(message)?;
        }
        self.poll()
    }

    /// The deadline is (nearly) reached: cancel the remote task, report a timeout.
    fn out_of_time(&mut self) -> Error {
        let Some((id, canceled)) = self.cancel_remote() else {
            return Error::Timeout("the call's deadline passed before the remote agent answered".into());
        };
        Error::Timeout(format!(
            "the call's deadline passed while remote task {id} was {}; {}",
            self.tracker.state.unwrap_or(State::Unknown).as_str(),
            if canceled { "the remote task was canceled" } else { "canceling the remote task failed" }
        ))
    }
}

/// Runs one TaskCall against the agent described by `plan`.
pub fn execute(host: &mut impl Host, plan: Plan, call: &Call) -> Result<String, Error> {
    let start = host.now_ms();
    let deadline = start + call.deadline_ms;
    let reserve = (call.deadline_ms / 10).clamp(200, 2_000);
    let mut plan = plan;
    let mut tracker = Tracker::default();
    if let Some(resume) = call.resume {
        let saved = host
            .state_get(&state_key(resume))?
            .and_then(|b| Saved::decode(&b))
            .ok_or_else(|| Error::NotFound(format!("no interrupted A2A task to resume under {resume:?}")))?;
        plan.version = saved.version;
        tracker.task_id = Some(saved.task_id);
        tracker.context_id = saved.context_id;
    }
    let message_id = format!("warden-{}", call.task_id);
    let message = proto::user_message(
        plan.version,
        &message_id,
        call.prompt,
        tracker.context_id.as_deref(),
        tracker.task_id.as_deref(),
    );
    let streaming = plan.streaming;
    let mut s = Session { host, plan, deadline, reserve, rpc_id: 0, tracker };
    match s.run(message, streaming) {
        Ok(()) => {}
        Err(Error::Canceled(_)) => return Err(s.on_canceled()),
        Err(e) => return Err(e),
    }

    let Session { host, tracker, plan, .. } = s;
    let state = tracker.state.unwrap_or(State::Unknown);
    if let Some(resume) = call.resume {
        host.state_delete(&state_key(resume));
    }
    match state {
        State::Completed => Ok(tracker.result_text()),
        State::Failed | State::Rejected => {
            let reason = tracker.status_text.clone().unwrap_or_else(|| "no reason given".into());
            Err(Error::Remote(format!("the remote agent's task {}: {reason}", state.as_str())))
        }
        State::Canceled => Err(Error::Remote("the remote task was canceled".into())),
        State::InputRequired | State::AuthRequired => {
            let task_id =
                tracker.task_id.clone().ok_or_else(|| Error::Remote("input requested without a task id".into()))?;
            let saved = Saved { task_id, context_id: tracker.context_id.clone(), version: plan.version };
            host.state_set(&state_key(call.task_id), &saved.encode())?;
            let question = tracker.status_text.clone().unwrap_or_else(|| match state {
                State::AuthRequired => "the remote agent requires authentication".into(),
                _ => "the remote agent needs more input".into(),
            });
            Err(Error::InputRequired(question))
        }
        other => Err(Error::Remote(format!("the remote task ended in unexpected state {}", other.as_str()))),
    }
}
