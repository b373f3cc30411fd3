//! One HTTP exchange: the request to send and the reader for its reply.

use serde_json::Value;

use warden_sse::SseParser;

use crate::error::{McpError, codes};
use crate::headers;
use crate::limits::{MAX_ERROR_BODY_BYTES, MAX_REPLY_BYTES, parse_bounded};

/// An HTTP request for the MCP endpoint (the caller knows the URL).
#[derive(Debug, Clone, PartialEq)]
pub struct HttpRequest {
    /// `POST` (messages) or `DELETE` (ending a handshake-era session).
    pub method: &'static str,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
}

/// A `notifications/progress` for a request of ours.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    pub token: Value,
    pub progress: f64,
    pub total: Option<f64>,
    pub message: Option<String>,
}

/// Something the server sent while we wait for the response.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    Progress(Progress),
    /// `notifications/message` (server log): level and data.
    Log {
        level: String,
        data: Value,
    },
    /// Any other notification (method, params).
    Notification {
        method: String,
        params: Value,
    },
    /// A server-to-client request (handshake revisions: `ping`, `sampling/...`,
    /// `elicitation/...`). This client does not answer them.
    ServerRequest {
        id: Value,
        method: String,
    },
}

/// What the request was for; [`crate::Session::advance`] uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Discover,
    Initialize,
    Initialized,
    Call,
}

enum Body {
    Unknown,
    Json(Vec<u8>),
    Sse(SseParser),
    /// One JSON-RPC message per feed (stdio).
    Messages,
    /// Non-2xx: kept for the error.
    Error(Vec<u8>),
}

/// Reads the reply to one request. Drive it with [`Pending::begin`] (status and
/// headers), [`Pending::feed`] (each body chunk; may stop early once
/// [`Pending::is_done`]) and [`Pending::finish`] (end of body); then take the
/// outcome with [`Pending::result`].
pub struct Pending {
    pub(crate) purpose: Purpose,
    /// `None` for notifications (a 202 is the whole answer).
    id: Option<Value>,
    progress_token: Option<Value>,
    status: u16,
    session_id: Option<String>,
    body: Body,
    outcome: Option<Result<Value, McpError>>,
    expect_session: bool,
    /// Bound on the reply: the whole body over HTTP, each message over stdio.
    max_bytes: usize,
    /// Body bytes fed so far.
    bytes: usize,
}

impl Pending {
    pub(crate) fn new(
        purpose: Purpose,
        id: Option<Value>,
        progress_token: Option<Value>,
        expect_session: bool,
    ) -> Self {
        Pending {
            purpose,
            id,
            progress_token,
            status: 0,
            session_id: None,
            body: Body::Unknown,
            outcome: None,
            expect_session,
            max_bytes: MAX_REPLY_BYTES,
            bytes: 0,
        }
    }

    /// Bounds the reply to `max_bytes` (lowering the bound the request was made with:
    /// [`crate::limits`]): the whole body over HTTP, each message over stdio. A reply over
    /// it ends the exchange with [`McpError::TooLarge`], unparsed. Call before
    /// [`Pending::begin`].
    pub fn limit_bytes(&mut self, max_bytes: usize) {
        self.max_bytes = self.max_bytes.min(max_bytes);
    }

    /// The bound on the reply ([`Pending::limit_bytes`]); a stdio reader reads no longer
    /// message than this.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Body bytes fed so far (every message, over stdio).
    pub fn body_bytes(&self) -> usize {
        self.bytes
    }

    fn too_large(&mut self) {
        self.body = Body::Unknown;
        self.outcome.get_or_insert(Err(McpError::TooLarge { what: "reply".into(), limit: self.max_bytes }));
    }

    pub fn purpose(&self) -> Purpose {
        self.purpose
    }

    /// The HTTP status given to [`Pending::begin`].
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The `Mcp-Session-Id` the reply carried, if any.
    pub fn session_id(&self) -> Option<&str> {
        self.session_id.as_deref()
    }

    /// Whether the request is answered (a request with an id); a notification is not.
    pub fn expects_reply(&self) -> bool {
        self.id.is_some()
    }

    /// Reads the reply from a stream of messages instead of an HTTP body (the stdio
    /// transport: one JSON-RPC message per line): each [`Pending::feed`] is then one
    /// whole message (a line without its newline); [`Pending::finish`] is end of stream.
    /// A notification needs no reply: it is done at once.
    pub fn begin_messages(&mut self) {
        self.status = 200;
        self.body = Body::Messages;
        if self.id.is_none() {
            self.outcome.get_or_insert(Ok(Value::Null));
        }
    }

    /// The reply's status line and headers.
    pub fn begin(&mut self, status: u16, headers: &[(String, String)]) {
        self.status = status;
        self.session_id = headers::get(headers, headers::SESSION_ID).map(str::to_owned);
        let content_type = headers::get(headers, "content-type").unwrap_or("").to_ascii_lowercase();
        self.body = if !(200..300).contains(&status) {
            Body::Error(Vec::new())
        } else if content_type.starts_with("text/event-stream") {
            Body::Sse(SseParser::with_limits(self.max_bytes, self.max_bytes))
        } else {
            Body::Json(Vec::new())
        };
    }

    /// A body chunk; returns the notifications it completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<Update> {
        self.bytes = self.bytes.saturating_add(chunk.len());
        let over = match self.body {
            Body::Messages => chunk.len() > self.max_bytes,
            Body::Error(_) | Body::Unknown => false,
            Body::Json(_) | Body::Sse(_) => self.bytes > self.max_bytes,
        };
        if over {
            self.too_large();
            return Vec::new();
        }
        let events = match &mut self.body {
            Body::Json(buf) => {
                buf.extend_from_slice(chunk);
                return Vec::new();
            }
            Body::Error(buf) => {
                let room = MAX_ERROR_BODY_BYTES.saturating_sub(buf.len());
                buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
                return Vec::new();
            }
            Body::Sse(parser) => match parser.feed(chunk) {
                Ok(events) => events,
                Err(e) => {
                    self.body = Body::Unknown;
                    self.outcome.get_or_insert(Err(McpError::Protocol(e.to_string())));
                    return Vec::new();
                }
            },
            Body::Messages => {
                let mut updates = Vec::new();
                if chunk.iter().all(u8::is_ascii_whitespace) {
                    return updates;
                }
                self.parsed(parse_bounded(chunk, "a message"), &mut updates);
                return updates;
            }
            Body::Unknown => return Vec::new(),
        };
        let mut updates = Vec::new();
        for ev in events {
            if ev.kind() != "message" || ev.data.trim().is_empty() {
                continue;
            }
            self.parsed(parse_bounded(ev.data.as_bytes(), "an SSE event"), &mut updates);
        }
        updates
    }

    /// A parsed message, or why it could not be: the first failure is the outcome.
    fn parsed(&mut self, v: Result<Value, McpError>, updates: &mut Vec<Update>) {
        match v {
            Ok(v) => self.message(v, updates),
            Err(e) => {
                self.outcome.get_or_insert(Err(e));
            }
        }
    }

    /// True once the response to our request has been read: the rest of the body
    /// may be dropped.
    pub fn is_done(&self) -> bool {
        self.outcome.is_some()
    }

    /// End of body. Returns the notifications still pending (SSE without a final blank line).
    pub fn finish(&mut self) -> Vec<Update> {
        let mut updates = Vec::new();
        match std::mem::replace(&mut self.body, Body::Unknown) {
            Body::Unknown => {}
            Body::Messages => {
                if self.outcome.is_none() {
                    self.outcome =
                        Some(Err(McpError::Transport("the server's stream ended without a response".into())));
                }
            }
            Body::Sse(mut parser) => {
                match parser.finish() {
                    Ok(Some(ev)) if ev.kind() == "message" && !ev.data.trim().is_empty() => {
                        self.parsed(parse_bounded(ev.data.as_bytes(), "an SSE event"), &mut updates)
                    }
                    Ok(_) => {}
                    Err(e) => {
                        self.outcome.get_or_insert(Err(McpError::Protocol(e.to_string())));
                    }
                }
                if self.outcome.is_none() && self.id.is_some() {
                    self.outcome = Some(Err(McpError::Protocol(
                        "the event stream ended without a response to the request".into(),
                    )));
                }
            }
            Body::Json(buf) => {
                if self.id.is_none() {
                    // A notification: 202 (or any 2xx) with no body is the answer.
                    self.outcome.get_or_insert(Ok(Value::Null));
                } else if buf.iter().all(u8::is_ascii_whitespace) {
                    self.outcome = Some(Err(McpError::Protocol(format!("HTTP {} with an empty body", self.status))));
                } else {
                    match parse_bounded(&buf, "the response") {
                        Ok(Value::Array(batch)) => {
                            for v in batch {
                                self.message(v, &mut updates);
                            }
                        }
                        Ok(v) => self.message(v, &mut updates),
                        Err(e) => self.outcome = Some(Err(e)),
                    }
                    if self.outcome.is_none() {
                        self.outcome = Some(Err(McpError::Protocol("the response does not answer the request".into())));
                    }
                }
            }
            Body::Error(buf) => {
                let rpc = parse_bounded(&buf, "the error body").ok().and_then(|v| rpc_error(&v, self.status));
                self.outcome = Some(Err(match rpc {
                    Some(e) => e,
                    None if self.status == 404 && self.expect_session => McpError::SessionExpired,
                    None => McpError::http(self.status, &buf),
                }));
            }
        }
        updates
    }

    /// The outcome: the JSON-RPC `result`, or why there is none.
    pub fn result(&mut self) -> Result<Value, McpError> {
        self.outcome.take().unwrap_or_else(|| Err(McpError::Protocol("the reply was not read to the end".into())))
    }

    /// Feeds a whole reply at once and returns its updates (non-streaming transports).
    pub fn complete(&mut self, status: u16, headers: &[(String, String)], body: &[u8]) -> Vec<Update> {
        self.begin(status, headers);
        let mut updates = self.feed(body);
        updates.extend(self.finish());
        updates
    }

    /// One JSON-RPC message, taken apart by value (a result is moved out, never copied).
    fn message(&mut self, mut v: Value, updates: &mut Vec<Update>) {
        let method = v.get("method").and_then(Value::as_str).map(str::to_owned);
        match (method, v.get_mut("id").map(Value::take)) {
            (Some(method), Some(id)) => updates.push(Update::ServerRequest { id, method }),
            (Some(method), None) => {
                let params = v.get_mut("params").map(Value::take).unwrap_or(Value::Null);
                updates.push(match method.as_str() {
                    "notifications/progress" => match progress(&params) {
                        Some(p) if self.progress_token.as_ref().is_none_or(|t| *t == p.token) => Update::Progress(p),
                        _ => Update::Notification { method, params },
                    },
                    "notifications/message" => {
                        let mut params = params;
                        Update::Log {
                            level: params.get("level").and_then(Value::as_str).unwrap_or("info").to_owned(),
                            data: params.get_mut("data").map(Value::take).unwrap_or(Value::Null),
                        }
                    }
                    _ => Update::Notification { method, params },
                });
            }
            (None, Some(id)) => {
                if self.id.as_ref() != Some(&id) || self.outcome.is_some() {
                    return; // a response to something else
                }
                self.outcome = Some(match rpc_error(&v, self.status) {
                    Some(e) => Err(e),
                    None => match v.get_mut("result").map(Value::take) {
                        Some(r) => Ok(r),
                        None => Err(McpError::Protocol("a response without `result` or `error`".into())),
                    },
                });
            }
            (None, None) => {
                // `{"error": ...}` with `id: null` counts as an answer to us.
                if let Some(e) = rpc_error(&v, self.status) {
                    self.outcome.get_or_insert(Err(e));
                }
            }
        }
    }
}

fn progress(params: &Value) -> Option<Progress> {
    Some(Progress {
        token: params.get("progressToken")?.clone(),
        progress: params.get("progress")?.as_f64()?,
        total: params.get("total").and_then(Value::as_f64),
        message: params.get("message").and_then(Value::as_str).map(str::to_owned),
    })
}

fn rpc_error(v: &Value, status: u16) -> Option<McpError> {
    let e = v.get("error")?;
    Some(McpError::Rpc {
        status,
        code: e.get("code").and_then(Value::as_i64).unwrap_or(codes::INTERNAL_ERROR),
        message: e.get("message").and_then(Value::as_str).unwrap_or("").to_owned(),
        data: e.get("data").cloned(),
    })
}
