//! The API's one error type: every failure leaves as `{"error": {"code", "message"}}`
//! with a 4xx status for anything the client can fix and 5xx only for the host's own
//! faults.

use axum::Json;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::engine::SubmitError;
use crate::task::TaskError;

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    /// Stable machine-readable code (`missing_field`, `task_not_found`, ...).
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into() }
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

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // Not scrubbed with every tenant's secrets here: messages quote the caller's own
        // request, and an all-tenant scrub made them an oracle (send a guess, see it
        // redacted). What an error may quote of a task or session is the caller's own,
        // already scrubbed where it is read (visibility is checked before any detail).
        let this = self;
        if this.status.is_server_error() {
            tracing::error!(code = this.code, message = %this.message, "API error");
        }
        let mut resp =
            (this.status, Json(json!({ "error": { "code": this.code, "message": this.message } }))).into_response();
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
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "no_plugin", message)
            }
            SubmitError::InvalidField { .. } => ApiError::bad_request("invalid_field", message),
            SubmitError::QueueFull(_) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "queue_full", message),
            SubmitError::UserTasksFull { .. } => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "too_many_user_tasks", message)
            }
            SubmitError::Draining => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "draining", message),
            SubmitError::UnknownResume(_) => ApiError::bad_request("invalid_resume", message),
            SubmitError::Secrets(crate::redact::SecretError::HostFull) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "secrets_full", message)
            }
            SubmitError::Secrets(crate::redact::SecretError::UserFull) => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "secrets_quota", message)
            }
            SubmitError::Secrets(_) => ApiError::bad_request("invalid_field", message),
            SubmitError::Unavailable(_) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", message),
        }
    }
}

impl From<crate::store::StoreError> for ApiError {
    fn from(e: crate::store::StoreError) -> Self {
        ApiError::internal(e.to_string())
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
}
