//! What an operator needs beyond the parent-agent API, for the console (`/ui`) and the
//! CLI (`warden sandbox end`, `warden approvals`): the list of tasks a principal may see
//! (and its live feed of changes),
//! who the caller is, this deployment's sandbox sessions (admin only) with an end button, and the tail of
//! the audit log (admin only). Same principals, same [`ApiError`]s as every endpoint.

use std::io::{Read, Seek, SeekFrom};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::Router;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, AppState, Principal, task_json};

/// Most tasks one page of `GET /v1/tasks` lists (the newest first).
pub const MAX_LISTED_TASKS: usize = crate::store::MAX_TASK_PAGE;
/// Most bytes of the audit log's tail `GET /v1/audit` reads (a long log is never read whole).
pub const MAX_AUDIT_TAIL_BYTES: u64 = 4 * 1024 * 1024;
/// Most audit lines `GET /v1/audit` returns (the newest first).
pub const MAX_AUDIT_LINES: usize = 2000;

/// The operator endpoints, merged into [`super::app`].
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/sessions", get(sessions))
        .route("/v1/sessions/{id}/end", post(end_session))
        .route("/v1/audit", get(audit))
        .route("/v1/me", get(me))
        .route("/v1/tasks/changes", get(task_changes))
}

/// `GET /v1/tasks/changes`: Server-Sent Events of every change to a task `who` may see,
/// so a list read from `GET /v1/tasks` stays current (see [`super::sse::task_changes`]).
async fn task_changes(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let permit = s.streams.admit(&who)?;
    Ok(super::sse::task_changes(permit, &s.engine, move |rec| who.owns(&rec.user_id), s.heartbeat, s.shutdown.clone())
        .into_response())
}

/// `GET /v1/me`: who the token is (the console shows what the role may use).
async fn me(Extension(who): Extension<Principal>) -> Json<Value> {
    Json(json!({ "name": who.name, "role": who.role, "user_id": who.default_user, "approves": who.approves }))
}

/// 403 unless `who` is an admin: sessions, the audit log and `/metrics` span every user.
pub(super) fn require_admin(who: &Principal) -> Result<(), ApiError> {
    if who.is_admin() {
        Ok(())
    } else {
        Err(ApiError::new(StatusCode::FORBIDDEN, "admin_required", format!("principal `{}` is not an admin", who.name)))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    limit: Option<usize>,
    /// The previous page's `next_cursor`.
    cursor: Option<String>,
}

/// `GET /v1/tasks`: the tasks `who` may see, newest first, live ones as they are now, a
/// page at a time (`next_cursor` continues after the page's last task). A user's listing
/// asks the store for that user's tasks alone; only an admin's spans every user.
pub(super) async fn list_tasks(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = q?;
    let limit = q.limit.unwrap_or(MAX_LISTED_TASKS).min(MAX_LISTED_TASKS);
    let before = match q.cursor.as_deref() {
        None => crate::store::TaskCursor::START,
        Some(token) => crate::store::TaskCursor::from_token(token).ok_or_else(|| {
            ApiError::new(StatusCode::BAD_REQUEST, "invalid_cursor", "`cursor` is not a next_cursor of this listing")
        })?,
    };
    let user_id = who.listing_user();
    let store = s.engine.store();
    if let Err(e) = store.flush().await {
        tracing::warn!(error = %e, "store flush before a task listing failed");
    }
    let page = store.list_tasks(&crate::store::TaskQuery { user_id, before, limit }).await?;
    let tasks: Vec<Value> = page
        .tasks
        .into_iter()
        .filter(|r| who.owns(&r.user_id))
        .map(|r| match s.engine.live(&r.task_id) {
            Some(live) => task_json(&live.record()),
            None => task_json(&r),
        })
        .collect();
    Ok(Json(json!({ "tasks": tasks, "next_cursor": page.next.map(|c| c.token()) })))
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The sandbox of this server, or 503.
fn sandbox(s: &AppState) -> Result<std::sync::Arc<warden_sandbox::Sandbox>, ApiError> {
    s.engine.tools().sandbox().cloned().map_err(|e| {
        ApiError::host(StatusCode::SERVICE_UNAVAILABLE, "sandbox_unavailable", super::error::SANDBOX_UNAVAILABLE, e)
    })
}

fn unavailable(e: warden_sandbox::SandboxError) -> ApiError {
    ApiError::host(
        StatusCode::SERVICE_UNAVAILABLE,
        "sandbox_unavailable",
        super::error::SANDBOX_UNAVAILABLE,
        e.to_string(),
    )
}

/// `GET /v1/sessions` (admin): the session containers of this deployment (its
/// `sandbox.scope`), with age and — for those this server uses — idle time.
async fn sessions(State(s): State<AppState>, Extension(who): Extension<Principal>) -> Result<Json<Value>, ApiError> {
    require_admin(&who)?;
    let sandbox = sandbox(&s)?;
    let scope = sandbox.config().scope.clone();
    let now = SystemTime::now();
    let rows: Vec<Value> = sandbox
        .list_sessions()
        .await
        .map_err(unavailable)?
        .into_iter()
        .filter(|i| i.scope == scope)
        .map(|i| {
            let age = now.duration_since(i.created).unwrap_or_default();
            let idle = i.last_used.map(|t| now.duration_since(t).unwrap_or_default());
            json!({
                "user_id": i.key.user_id,
                "session_id": i.key.session_id,
                "scope": i.scope,
                "container": i.container_name,
                "state": i.state,
                "created_at_ms": ms(i.created),
                "age_secs": age.as_secs(),
                "last_used_at_ms": i.last_used.map(ms),
                "idle_secs": idle.map(|d| d.as_secs()),
                "owned_here": i.owned_here,
                "docker_host": i.docker_host,
            })
        })
        .collect();
    Ok(Json(json!({ "scope": scope, "sessions": rows })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EndQuery {
    user_id: Option<String>,
}

/// `POST /v1/sessions/{id}/end?user_id=U` (admin): removes the session's container and
/// workspace now (a task still using it fails its next tool call). 404 when this
/// deployment has no such session.
async fn end_session(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    id: Result<Path<String>, PathRejection>,
    q: Result<Query<EndQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    require_admin(&who)?;
    let Path(id) = id?;
    let Query(q) = q?;
    let user = q.user_id.unwrap_or_else(|| who.default_user.clone());
    let key = warden_sandbox::SessionKey::new(user.clone(), id.clone());
    let sandbox = sandbox(&s)?;
    let scope = sandbox.config().scope.clone();
    let listed = sandbox.list_sessions().await.map_err(unavailable)?;
    if !listed.iter().any(|i| i.key == key && i.scope == scope) {
        // Client text, quoted back cut and escaped (as a refused `resume` id is).
        let shown = |t: &str| crate::text::escape_control(&t.chars().take(128).collect::<String>()).into_owned();
        return Err(ApiError::not_found(
            "session_not_found",
            format!("no sandbox session `{}` of user `{}` in this deployment", shown(&id), shown(&user)),
        ));
    }
    sandbox.end_session(&key).await.map_err(|e| match e {
        e @ (warden_sandbox::SandboxError::DockerUnavailable(_) | warden_sandbox::SandboxError::ShutDown) => {
            unavailable(e)
        }
        e => ApiError::host(StatusCode::BAD_GATEWAY, "sandbox_error", super::error::SANDBOX_FAULT, e.to_string()),
    })?;
    tracing::info!(user = %user, session = %id, by = %who.name, "session ended over the API");
    Ok(Json(json!({ "session_id": id, "user_id": user, "ended": true })))
}

/// `GET /v1/audit` (admin): the newest lines of the audit log (`approval.audit_log`),
/// newest first, as JSON objects; `{"configured": false}` without one.
async fn audit(State(s): State<AppState>, Extension(who): Extension<Principal>) -> Result<Json<Value>, ApiError> {
    require_admin(&who)?;
    let Some(log) = s.engine.gate().audit_log().cloned() else {
        return Ok(Json(json!({ "configured": false, "records": [] })));
    };
    let records = tokio::task::spawn_blocking(move || {
        // What was decided before this request is in the answer (the log's own thread
        // writes it); a writer that does not catch up in time leaves the tail as it is.
        if let Err(e) = log.sync() {
            tracing::warn!(error = %e, "the audit view may miss the newest records");
        }
        read_tail(log.path())
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
    .map_err(|e| ApiError::internal(format!("cannot read the audit log: {e}")))?;
    Ok(Json(json!({ "configured": true, "records": records })))
}

/// The last [`MAX_AUDIT_LINES`] JSON lines within the last [`MAX_AUDIT_TAIL_BYTES`] of
/// `path`, newest first (a first line cut by the window is dropped).
fn read_tail(path: &std::path::Path) -> std::io::Result<Vec<Value>> {
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    let start = len.saturating_sub(MAX_AUDIT_TAIL_BYTES);
    file.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::with_capacity((len - start) as usize);
    file.take(MAX_AUDIT_TAIL_BYTES).read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    let mut lines: Vec<&str> = text.lines().collect();
    if start > 0 && !lines.is_empty() {
        lines.remove(0);
    }
    Ok(lines.iter().rev().filter_map(|l| serde_json::from_str::<Value>(l).ok()).take(MAX_AUDIT_LINES).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_audit_tail_is_newest_first_and_drops_a_cut_first_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let mut text = String::new();
        for i in 0..3 {
            text.push_str(&format!("{{\"n\":{i}}}\n"));
        }
        text.push_str("not json\n");
        std::fs::write(&path, &text).unwrap();
        let got = read_tail(&path).unwrap();
        assert_eq!(got, vec![json!({"n": 2}), json!({"n": 1}), json!({"n": 0})]);
        // Longer than the window: the first (cut) line is not parsed, the newest come first.
        let line = format!("{{\"pad\":\"{}\"}}\n", "x".repeat(1000));
        let big = line.repeat((MAX_AUDIT_TAIL_BYTES as usize / line.len()) + 10) + "{\"n\":\"last\"}\n";
        std::fs::write(&path, big).unwrap();
        let got = read_tail(&path).unwrap();
        assert_eq!(got[0], json!({"n": "last"}));
        assert!(
            got.len() <= MAX_AUDIT_LINES && got[1..].iter().all(|v| v["pad"].as_str().is_some_and(|p| p.len() == 1000))
        );
    }
}
