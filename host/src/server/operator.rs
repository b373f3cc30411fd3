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
use axum::routing::{delete, get, post};
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
        .route("/v1/sessions/{id}/pause", post(pause_session))
        .route("/v1/sessions/{id}/resume", post(resume_session))
        .route("/v1/sessions/{id}/fork", post(fork_session))
        .route("/v1/sessions/{id}/snapshots", get(list_snapshots).post(take_snapshot))
        .route("/v1/sessions/{id}/snapshots/{name}", delete(delete_snapshot))
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
                "paused": i.paused,
                "docker_host": i.docker_host,
                "runtime": i.runtime,
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
    let sandbox = sandbox(&s)?;
    let scope = sandbox.config().scope.clone();
    let listed = sandbox.list_sessions().await.map_err(unavailable)?;
    // The session under every runtime it has (`sandbox.runtime_overrides` gives a subagent
    // put under another runtime a container of its own under the same id).
    let keys: Vec<_> = listed
        .iter()
        .filter(|i| i.key.user_id == user && i.key.session_id == id && i.scope == scope)
        .map(|i| i.key.clone())
        .collect();
    if keys.is_empty() {
        // Client text, quoted back cut and escaped (as a refused `resume` id is).
        let shown = |t: &str| crate::text::escape_control(&t.chars().take(128).collect::<String>()).into_owned();
        return Err(ApiError::not_found(
            "session_not_found",
            format!("no sandbox session `{}` of user `{}` in this deployment", shown(&id), shown(&user)),
        ));
    }
    for key in &keys {
        sandbox.end_session(key).await.map_err(|e| match e {
            e @ (warden_sandbox::SandboxError::DockerUnavailable(_) | warden_sandbox::SandboxError::ShutDown) => {
                unavailable(e)
            }
            e => ApiError::host(StatusCode::BAD_GATEWAY, "sandbox_error", super::error::SANDBOX_FAULT, e.to_string()),
        })?;
    }
    tracing::info!(user = %user, session = %id, by = %who.name, "session ended over the API");
    Ok(Json(json!({ "session_id": id, "user_id": user, "ended": true })))
}

/// The session `id` of `user` (the principal's own by default) as `who` may act on it:
/// another user's reads as missing (404), before the sandbox is asked anything.
fn owned_session_key(who: &Principal, user: Option<String>, id: &str) -> Result<warden_sandbox::SessionKey, ApiError> {
    let user = user.unwrap_or_else(|| who.default_user.clone());
    let shown = |t: &str| crate::text::escape_control(&t.chars().take(128).collect::<String>()).into_owned();
    if !who.owns(&user) {
        return Err(ApiError::not_found(
            "session_not_found",
            format!("no sandbox session `{}` for this user", shown(id)),
        ));
    }
    // The sandbox checks the key's parts (a 400 naming them, `lifecycle_error`).
    Ok(warden_sandbox::SessionKey::new(user, id.to_owned()))
}

/// A sandbox refusal or failure of a session lifecycle call as an API error.
fn lifecycle_error(e: warden_sandbox::SandboxError) -> ApiError {
    use warden_sandbox::SandboxError as E;
    match e {
        E::SessionNotFound { .. } => ApiError::not_found("session_not_found", e.to_string()),
        E::SessionBusy { .. } => ApiError::new(StatusCode::CONFLICT, "session_busy", e.to_string()),
        E::LifecycleUnavailable(_) => ApiError::new(StatusCode::CONFLICT, "pause_unavailable", e.to_string()),
        E::TooManyPausedSessions { .. } => {
            ApiError::refusal(StatusCode::TOO_MANY_REQUESTS, "too_many_paused_sessions", e.to_string())
        }
        E::TooManyUserSessions { .. } => {
            ApiError::refusal(StatusCode::TOO_MANY_REQUESTS, "too_many_user_sessions", e.to_string())
        }
        E::TooManySessions { .. } | E::ShutDown => {
            ApiError::refusal(StatusCode::SERVICE_UNAVAILABLE, "sandbox_unavailable", e.to_string())
        }
        E::InvalidSessionKey(_) => ApiError::bad_request("invalid_session_id", e.to_string()),
        E::SessionExists { .. } => ApiError::new(StatusCode::CONFLICT, "session_exists", e.to_string()),
        E::InvalidInput { .. } => ApiError::bad_request("invalid_field", e.to_string()),
        E::InvalidSnapshotName { .. } => ApiError::bad_request("invalid_field", format!("name: {e}")),
        E::SnapshotNotFound { .. } => ApiError::not_found("snapshot_not_found", e.to_string()),
        E::SnapshotExists { .. } => ApiError::new(StatusCode::CONFLICT, "snapshot_exists", e.to_string()),
        E::TooManySnapshots { .. } => {
            ApiError::refusal(StatusCode::TOO_MANY_REQUESTS, "too_many_snapshots", e.to_string())
        }
        e @ (E::DockerUnavailable(_) | E::ImageMissing { .. }) => unavailable(e),
        e => ApiError::host(StatusCode::BAD_GATEWAY, "sandbox_error", super::error::SANDBOX_FAULT, e.to_string()),
    }
}

/// `POST /v1/sessions/{id}/pause?user_id=U`: stops the session's container now (every
/// process in it ends) and keeps its workspace; its next call starts it again. The
/// session's owner or an admin; another user's session answers 404; 409 while a call runs.
async fn pause_session(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    id: Result<Path<String>, PathRejection>,
    q: Result<Query<EndQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    pause_or_resume(&s, &who, id, q, Lifecycle::Pause).await
}

/// `POST /v1/sessions/{id}/resume?user_id=U`: starts a paused session's container again
/// now (a call would); files kept, processes not. Same principals and 404 as pause.
async fn resume_session(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    id: Result<Path<String>, PathRejection>,
    q: Result<Query<EndQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    pause_or_resume(&s, &who, id, q, Lifecycle::Resume).await
}

/// Which of pause and resume a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lifecycle {
    Pause,
    Resume,
}

/// Pauses or resumes the session `id` of the query's user as `who` may.
async fn pause_or_resume(
    s: &AppState,
    who: &Principal,
    id: Result<Path<String>, PathRejection>,
    q: Result<Query<EndQuery>, QueryRejection>,
    what: Lifecycle,
) -> Result<Json<Value>, ApiError> {
    let Path(id) = id?;
    let Query(q) = q?;
    let key = owned_session_key(who, q.user_id, &id)?;
    let sandbox = sandbox(s)?;
    let (changed, field) = match what {
        Lifecycle::Pause => (sandbox.pause_session(&key).await, "was_running"),
        Lifecycle::Resume => (sandbox.resume_session(&key).await, "was_paused"),
    };
    let changed = changed.map_err(lifecycle_error)?;
    let paused = what == Lifecycle::Pause;
    tracing::info!(user = %key.user_id, session = %key.session_id, by = %who.name, paused, "session {} over the API", if paused { "paused" } else { "resumed" });
    Ok(Json(json!({ "session_id": key.session_id, "user_id": key.user_id, "paused": paused, field: changed })))
}

/// The body of `POST /v1/sessions/{id}/fork`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ForkBody {
    /// The fork's session id (new; same user as the source).
    session_id: String,
}

/// `POST /v1/sessions/{id}/fork?user_id=U` `{"session_id": "new"}`: a new session of the
/// same user on a copy of the session's workspace, with a container of its own and
/// nothing else shared (no process, shell state or secret). Same principals and 404 as
/// pause; 409 `session_exists` when the new id is taken.
async fn fork_session(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    id: Result<Path<String>, PathRejection>,
    q: Result<Query<EndQuery>, QueryRejection>,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(id) = id?;
    let Query(q) = q?;
    let source = owned_session_key(&who, q.user_id, &id)?;
    let body: ForkBody = super::parse_json(&body?)?;
    let fork = warden_sandbox::SessionKey::new(source.user_id.clone(), body.session_id);
    // What the source's tasks wrote is in the copy: scrubbed as the source's is, from the
    // fork's first call on (before it exists; harmless if the fork fails).
    crate::redact::registry().inherit(&source.user_id, &source.session_id, &fork.session_id);
    sandbox(&s)?.fork_session(&source, &fork).await.map_err(lifecycle_error)?;
    tracing::info!(user = %source.user_id, session = %source.session_id, fork = %fork.session_id, by = %who.name, "session forked over the API");
    Ok(Json(json!({ "session_id": fork.session_id, "user_id": fork.user_id, "forked_from": source.session_id })))
}

/// The body of `POST /v1/sessions/{id}/snapshots`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SnapshotBody {
    /// The snapshot's name, unique for the user (`warden_sandbox::snapshot::SNAPSHOT_NAME_FORM`).
    name: String,
}

/// `POST /v1/sessions/{id}/snapshots?user_id=U` `{"name": "before-refactor"}`: stores a
/// copy of the session's workspace under that name (only the workspace: no process, shell
/// state or secret), for new sessions to start from (`snapshot` on `POST /v1/tasks`). 201
/// with the snapshot; same principals and 404 as pause; 400 `invalid_field` for a name not
/// of the form; 409 `snapshot_exists`; 429 `too_many_snapshots` past
/// `sandbox.max_snapshots_per_user` or `sandbox.snapshot_disk_budget`.
async fn take_snapshot(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    id: Result<Path<String>, PathRejection>,
    q: Result<Query<EndQuery>, QueryRejection>,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let Path(id) = id?;
    let Query(q) = q?;
    let source = owned_session_key(&who, q.user_id, &id)?;
    let body: SnapshotBody = super::parse_json(&body?)?;
    warden_sandbox::snapshot::validate_name(&body.name).map_err(lifecycle_error)?;
    let info = sandbox(&s)?.snapshot_session(&source, &body.name).await.map_err(lifecycle_error)?;
    tracing::info!(user = %source.user_id, session = %source.session_id, snapshot = %info.name, by = %who.name, "snapshot taken over the API");
    Ok((StatusCode::CREATED, Json(json!(info))))
}

/// `GET /v1/sessions/{id}/snapshots?user_id=U`: the snapshots taken of the session (also
/// after it ended), by name. Same principals and 404 as pause.
async fn list_snapshots(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    id: Result<Path<String>, PathRejection>,
    q: Result<Query<EndQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(id) = id?;
    let Query(q) = q?;
    let key = owned_session_key(&who, q.user_id, &id)?;
    let all = sandbox(&s)?.list_snapshots(Some(&key.user_id)).await.map_err(lifecycle_error)?;
    let of_session: Vec<_> = all.into_iter().filter(|i| i.session_id == key.session_id).collect();
    Ok(Json(json!({ "session_id": key.session_id, "user_id": key.user_id, "snapshots": of_session })))
}

/// `DELETE /v1/sessions/{id}/snapshots/{name}?user_id=U`: deletes a snapshot taken of the
/// session. Same principals as pause; 404 `snapshot_not_found` when the user has no
/// snapshot of that name taken of that session.
async fn delete_snapshot(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    path: Result<Path<(String, String)>, PathRejection>,
    q: Result<Query<EndQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path((id, name)) = path?;
    let Query(q) = q?;
    let key = owned_session_key(&who, q.user_id, &id)?;
    warden_sandbox::snapshot::validate_name(&name).map_err(lifecycle_error)?;
    let sandbox = sandbox(&s)?;
    let listed = sandbox.list_snapshots(Some(&key.user_id)).await.map_err(lifecycle_error)?;
    if !listed.iter().any(|i| i.name == name && i.session_id == key.session_id) {
        return Err(lifecycle_error(warden_sandbox::SandboxError::SnapshotNotFound { name }));
    }
    sandbox.delete_snapshot(&key.user_id, &name).await.map_err(lifecycle_error)?;
    tracing::info!(user = %key.user_id, session = %key.session_id, snapshot = %name, by = %who.name, "snapshot deleted over the API");
    Ok(Json(json!({ "session_id": key.session_id, "user_id": key.user_id, "name": name, "deleted": true })))
}

/// Makes the session `key` from its user's snapshot `name` for `POST /v1/tasks`
/// (`snapshot` next to `session_id`); errors name the `snapshot` field.
pub(super) async fn session_from_snapshot(
    s: &AppState,
    key: &warden_sandbox::SessionKey,
    name: &str,
) -> Result<(), ApiError> {
    use warden_sandbox::SandboxError as E;
    let field = |e: E| match e {
        e @ E::InvalidSnapshotName { .. } => ApiError::bad_request("invalid_field", format!("snapshot: {e}")),
        e => lifecycle_error(e),
    };
    warden_sandbox::snapshot::validate_name(name).map_err(field)?;
    let info = sandbox(s)?.session_from_snapshot(key, name).await.map_err(field)?;
    // What the source's tasks wrote is in the copy: scrubbed as the source's is.
    crate::redact::registry().inherit(&key.user_id, &info.session_id, &key.session_id);
    tracing::info!(user = %key.user_id, session = %key.session_id, snapshot = %name, "session made from a snapshot for a task");
    Ok(())
}

/// `sandbox.snapshot_on_end`: a task resuming `resumed` (a task of `user`) whose session
/// has ended gets that session back from its end snapshot before it is submitted. Nothing
/// to do without a sandbox, with the setting off, or for a task the engine will refuse.
pub(super) async fn restore_resumed_session(s: &AppState, user: &str, resumed: &str) -> Result<(), ApiError> {
    let Ok(sandbox) = s.engine.tools().sandbox().cloned() else { return Ok(()) };
    if !sandbox.config().snapshot_on_end {
        return Ok(());
    }
    let Some(rec) = s.engine.get(resumed).await? else { return Ok(()) };
    if rec.user_id != user {
        return Ok(());
    }
    let key = warden_sandbox::SessionKey::new(user.to_owned(), rec.session_id.clone());
    if sandbox.restore_ended_session(&key).await.map_err(lifecycle_error)? {
        tracing::info!(user, session = %rec.session_id, task = resumed, "session made again from its end snapshot for a resumed task");
    }
    Ok(())
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
