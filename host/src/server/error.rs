//! The API's one error type and its one edge mapper: every failure leaves as
//! `{"error": {"code", "message"}}` with a 4xx status for anything the client can fix and
//! 5xx only for the host's own faults and refusals.
//!
//! [`ApiError::client`] is the edge every front renders from (HTTP here, MCP's tool errors,
//! A2A's JSON-RPC errors), by [`Fault`]:
//! - the client's own mistakes (4xx): the message says what to fix; not logged here;
//! - admission refusals (a full queue, draining, a full secret budget, a per-user share;
//!   429/503): the message names the bound; logged at `warn`, at most one line per code per
//!   [`REFUSAL_LOG_INTERVAL`] (saying how many were not logged), since a client can cause
//!   them as fast as it can ask;
//! - the host's faults (every other 5xx): the client gets a fixed text and an error id
//!   (`err_…`); the detail — a store location, a driver's or Docker's text — is logged at
//!   `error` under that id, never sent.
//!
//! This module must never send a host fault's detail to a client, and never log a
//! refusal at `error`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::engine::SubmitError;
use crate::task::TaskError;

/// At most one `warn` line per refusal code per this interval: a client at its share
/// can be refused as fast as it asks, and each line would say the same.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// Whose a failure is, which decides what the client reads and how it is logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The client's (4xx): it reads the message.
    Client,
    /// The host refused to admit the work (429/503): it reads the message, which names
    /// the bound; logged at `warn`, rate-limited.
    Refusal,
    /// The host's own fault: the client reads this fixed text and an error id; the
    /// message is logged under the id.
    Host(&'static str),
}

/// The client text of a host fault that names nothing more specific.
const HOST_FAULT: &str = "the host could not complete the request";
/// The client text of a task store failure (its detail names the store's location).
pub const STORE_FAULT: &str = "the task store could not be read or written";
/// The client text of a sandbox failure (its detail may name Docker endpoints).
pub const SANDBOX_FAULT: &str = "the sandbox failed";
/// The client text of a sandbox that cannot be reached.
pub const SANDBOX_UNAVAILABLE: &str = "the sandbox is unavailable";

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    /// Stable machine-readable code (`missing_field`, `task_not_found`, ...).
    pub code: &'static str,
    /// What the client reads for a [`Fault::Client`] or [`Fault::Refusal`]; the logged
    /// detail of a [`Fault::Host`].
    pub message: String,
    pub fault: Fault,
}

/// A failure as a client may see it ([`ApiError::client`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ClientError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// The id the detail of a host fault is logged under.
    pub error_id: Option<String>,
    pub fault: Fault,
}

impl ApiError {
    /// A failure of `status`: the client's when 4xx, the host's when 5xx (its message then
    /// stays in the log).
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        let fault = if status.is_server_error() { Fault::Host(HOST_FAULT) } else { Fault::Client };
        ApiError { status, code, message: message.into(), fault }
    }

    /// An admission refusal (429/503 of a bound the client ran into): its message names
    /// the bound and is sent.
    pub fn refusal(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into(), fault: Fault::Refusal }
    }

    /// A host fault whose client reads `text`, with `detail` logged.
    pub fn host(status: StatusCode, code: &'static str, text: &'static str, detail: impl Into<String>) -> Self {
        ApiError { status, code, message: detail.into(), fault: Fault::Host(text) }
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    pub fn task_not_found(id: &str) -> Self {
        Self::not_found("task_not_found", format!("no task `{id}`"))
    }
}

impl ApiError {
    /// The edge: what the client may read of this failure, logged as its [`Fault`] says
    /// (see the module documentation). Every front renders from it.
    pub fn client(self) -> ClientError {
        let ApiError { status, code, message, fault } = self;
        match fault {
            Fault::Client => ClientError { status, code, message, error_id: None, fault },
            Fault::Refusal => {
                log_refusal(code, status, &message);
                ClientError { status, code, message, error_id: None, fault }
            }
            Fault::Host(text) => {
                let id = format!("err_{}", &uuid::Uuid::new_v4().simple().to_string()[..16]);
                tracing::error!(error_id = %id, code, status = status.as_u16(), detail = %message, "API error");
                ClientError {
                    status,
                    code,
                    message: format!("{text}; the operator's log has the details under error id {id}"),
                    error_id: Some(id),
                    fault,
                }
            }
        }
    }
}

/// Logs a refusal at `warn`, at most once per code per [`REFUSAL_LOG_INTERVAL`].
fn log_refusal(code: &'static str, status: StatusCode, message: &str) {
    static LAST: Mutex<Option<HashMap<&'static str, (Instant, u64)>>> = Mutex::new(None);
    let now = Instant::now();
    let not_logged = {
        let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
        let entry = last.get_or_insert_with(HashMap::new).entry(code).or_insert((now - REFUSAL_LOG_INTERVAL, 0));
        if now.duration_since(entry.0) < REFUSAL_LOG_INTERVAL {
            entry.1 += 1;
            return;
        }
        let quiet = entry.1;
        *entry = (now, 0);
        quiet
    };
    tracing::warn!(code, status = status.as_u16(), message, not_logged, "request refused");
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // Not scrubbed with every tenant's secrets here: messages quote the caller's own
        // request, and an all-tenant scrub made them an oracle (send a guess, see it
        // redacted). What an error may quote of a task or session is the caller's own,
        // already scrubbed where it is read (visibility is checked before any detail).
        let this = self.client();
        let mut error = json!({ "code": this.code, "message": this.message });
        if let Some(id) = &this.error_id {
            error["error_id"] = json!(id);
        }
        let mut resp = (this.status, Json(json!({ "error": error }))).into_response();
        if this.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(axum::http::header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

impl From<BytesRejection> for ApiError {
    fn from(r: BytesRejection) -> Self {
        let status = r.status();
        let code = if status == StatusCode::PAYLOAD_TOO_LARGE { "body_too_large" } else { "bad_body" };
        let status = if status.is_client_error() { status } else { StatusCode::BAD_REQUEST };
        ApiError::new(status, code, r.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        ApiError::bad_request("invalid_query", r.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        ApiError::bad_request("invalid_path", r.body_text())
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        let message = e.to_string();
        match e {
            SubmitError::Invalid(TaskError::MissingField(_)) => ApiError::bad_request("missing_field", message),
            SubmitError::Invalid(TaskError::DescriptionTooLong { .. }) => {
                ApiError::bad_request("invalid_field", message)
            }
            SubmitError::Invalid(TaskError::UnknownSubagent { .. }) => {
                ApiError::bad_request("unknown_subagent", message)
            }
            SubmitError::Invalid(TaskError::NoPlugin { .. }) => {
                ApiError::refusal(StatusCode::SERVICE_UNAVAILABLE, "no_plugin", message)
            }
            SubmitError::InvalidField { .. } | SubmitError::ToolContext(_) => {
                ApiError::bad_request("invalid_field", message)
            }
            SubmitError::QueueFull(_) => ApiError::refusal(StatusCode::SERVICE_UNAVAILABLE, "queue_full", message),
            SubmitError::UserTasksFull { .. } => {
                ApiError::refusal(StatusCode::TOO_MANY_REQUESTS, "too_many_user_tasks", message)
            }
            SubmitError::Draining => ApiError::refusal(StatusCode::SERVICE_UNAVAILABLE, "draining", message),
            SubmitError::UnknownResume(_) => ApiError::bad_request("invalid_resume", message),
            SubmitError::Secrets(crate::redact::SecretError::HostFull) => {
                ApiError::refusal(StatusCode::SERVICE_UNAVAILABLE, "secrets_full", message)
            }
            SubmitError::Secrets(crate::redact::SecretError::UserFull) => {
                ApiError::refusal(StatusCode::TOO_MANY_REQUESTS, "secrets_quota", message)
            }
            SubmitError::Secrets(_) => ApiError::bad_request("invalid_field", message),
            SubmitError::Unavailable(_) => {
                ApiError::host(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", STORE_FAULT, message)
            }
        }
    }
}

impl From<crate::store::StoreError> for ApiError {
    /// The detail names the store's location and the driver's text: logged, never sent.
    fn from(e: crate::store::StoreError) -> Self {
        ApiError::host(StatusCode::INTERNAL_SERVER_ERROR, "internal", STORE_FAULT, e.to_string())
    }
}

/// Parses a JSON request body; syntax errors are `malformed_json`, type and field
/// errors `invalid_field` naming the field's path.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("malformed_json", "the request body must be a JSON object"));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data => {
                let at = if path == "." { String::new() } else { format!("{path}: ") };
                ApiError::bad_request("invalid_field", format!("{at}{inner}"))
            }
            _ => ApiError::bad_request("malformed_json", format!("malformed JSON: {inner}")),
        }
    })?;
    de.end().map_err(|e| ApiError::bad_request("malformed_json", format!("malformed JSON: {e}")))?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (an oracle for other tenants' secrets): an error that quotes the
    /// caller's own input must read the same whether or not that input happens to be
    /// some other session's secret.
    #[tokio::test]
    async fn regression_errors_scrubbed_with_every_tenants_secrets_confirmed_guesses() {
        let guess = "alice-pin-491827";
        crate::redact::registry().remember("alice", "oracle-test", &[guess]).unwrap();
        let resp =
            ApiError::bad_request("unknown_subagent", format!("unknown subagent_type {guess:?}")).into_response();
        let body = axum::body::to_bytes(resp.into_body(), 1 << 16).await.unwrap();
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains(guess), "{text}");
    }

    /// Regression (attack review F9): a task store failure was sent back as the 500 body,
    /// naming the store file (or the database's location and the driver's text). Now the
    /// client reads fixed text and an error id; the detail stays in the log.
    #[tokio::test]
    async fn regression_a_store_failure_sent_its_location_to_the_client() {
        let detail = "task store /var/lib/warden/state.db: disk I/O error";
        let e = ApiError::host(StatusCode::INTERNAL_SERVER_ERROR, "internal", STORE_FAULT, detail);
        let c = e.clone().client();
        assert!(!c.message.contains("/var/lib") && c.message.starts_with(STORE_FAULT), "{}", c.message);
        let id = c.error_id.clone().expect("an error id");
        assert!(id.starts_with("err_") && c.message.contains(&id), "{}", c.message);
        let resp = e.into_response();
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body: serde_json::Value =
            serde_json::from_slice(&axum::body::to_bytes(resp.into_body(), 1 << 16).await.unwrap()).unwrap();
        assert_eq!(body["error"]["code"], "internal");
        assert!(body["error"]["error_id"].as_str().is_some_and(|i| i.starts_with("err_")), "{body}");
        assert!(!body.to_string().contains("/var/lib"), "{body}");
    }

    /// The host's faults hide their detail; the client's mistakes and admission refusals
    /// say what happened (a refusal names the bound), whatever the status.
    #[test]
    fn what_a_client_reads_of_each_fault() {
        let refusal = ApiError::from(SubmitError::QueueFull(7)).client();
        assert_eq!(
            (refusal.status, refusal.fault, refusal.error_id.as_deref()),
            (StatusCode::SERVICE_UNAVAILABLE, Fault::Refusal, None)
        );
        assert_eq!(refusal.message, SubmitError::QueueFull(7).to_string());
        let share = ApiError::from(SubmitError::UserTasksFull { user: "u".into(), max: 2 }).client();
        assert_eq!((share.status, share.fault), (StatusCode::TOO_MANY_REQUESTS, Fault::Refusal));
        for e in [SubmitError::Draining, SubmitError::Secrets(crate::redact::SecretError::HostFull)] {
            assert_eq!(ApiError::from(e).client().fault, Fault::Refusal);
        }
        let store = ApiError::from(SubmitError::Unavailable("postgres://db:5432/warden: refused".into())).client();
        assert!(!store.message.contains("postgres") && store.error_id.is_some(), "{}", store.message);
        let any_5xx = ApiError::new(StatusCode::BAD_GATEWAY, "sandbox_error", "tcp://10.0.0.7:2376: refused").client();
        assert!(!any_5xx.message.contains("10.0.0.7") && any_5xx.error_id.is_some(), "{}", any_5xx.message);
        let mistake = ApiError::bad_request("invalid_field", "prompt: expected a string").client();
        assert_eq!((mistake.message.as_str(), mistake.error_id), ("prompt: expected a string", None));
    }
}
