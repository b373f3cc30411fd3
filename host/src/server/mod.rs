//! The HTTP API (axum): tasks, their event streams, approvals, subagents, plugins,
//! session files, health and metrics; the operator's sessions and audit log (`operator`); the console at `/ui` (`ui`). [`app`] builds the router over shared state and
//! knows nothing about sockets; [`serve`] binds and runs it. Handlers only translate
//! between HTTP and the [`crate::engine`]; every error is an [`ApiError`].

pub mod a2a;
mod auth;
mod error;
pub mod follow;
mod listen;
pub mod mcp;
mod metrics;
mod operator;
mod sse;
mod streams;
mod ui;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Extension, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

pub use auth::{Principal, check_bind, credentials, credentials_from, match_token, tokens_from_env};
pub use error::{ApiError, ClientError, Fault, parse_json};

use crate::engine::{CancelOutcome, DEFAULT_OUTPUT_TIMEOUT, Engine, Submission, SubmitError};
use crate::plugin::TaskCall;
use crate::store::TaskRecord;

/// What every handler shares.
pub struct ServerState {
    pub engine: Arc<Engine>,
    /// Accepted bearer tokens; empty = no authentication (loopback only).
    pub tokens: Vec<String>,
    /// Who each token of `tokens` is (same order).
    pub credentials: Vec<(String, Principal)>,
    /// Interval of `heartbeat` events on idle streams.
    pub heartbeat: Duration,
    /// Largest request body.
    pub max_body: usize,
    /// Event streams and long polls open per principal (`server.max_streams_per_principal`):
    /// every path that holds a connection open takes a permit here first.
    pub streams: Arc<streams::Streams>,
    /// Cancelled when the server shuts down: ends open MCP and SSE streams, which would
    /// otherwise hold graceful shutdown open.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// The last `/readyz` checks (store, docker) and when they ran: probes within
    /// [`READY_CACHE_TTL`] share them, and concurrent probes wait for one run.
    readiness: tokio::sync::Mutex<Option<(std::time::Instant, [&'static str; 2])>>,
}

pub type AppState = Arc<ServerState>;

impl ServerState {
    /// A server whose tokens are all admins (`token<N>`), as `server.tokens_env` gives them.
    pub fn new(engine: Arc<Engine>, tokens: Vec<String>) -> Self {
        let credentials = tokens
            .into_iter()
            .enumerate()
            .map(|(i, t)| (t, Principal::admin(&format!("{}{}", crate::actor::TOKEN_PREFIX, i + 1))))
            .collect();
        Self::with_credentials(engine, credentials)
    }

    /// A server accepting `credentials` (see [`credentials`]).
    pub fn with_credentials(engine: Arc<Engine>, credentials: Vec<(String, Principal)>) -> Self {
        let server = &engine.registry().config().server;
        let tokens = credentials.iter().map(|(t, _)| t.clone()).collect();
        ServerState {
            heartbeat: server.heartbeat,
            max_body: server.max_body as usize,
            streams: streams::Streams::new(server.max_streams_per_principal),
            engine,
            tokens,
            credentials,
            shutdown: tokio_util::sync::CancellationToken::new(),
            readiness: tokio::sync::Mutex::new(None),
        }
    }
}

/// The router with every endpoint of the API.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .route("/v1/subagents", get(subagents))
        .route("/v1/plugins", get(plugins))
        .route("/v1/tools", get(tools))
        .route("/v1/tasks", post(create_task).get(operator::list_tasks))
        .route("/v1/tasks/{id}", get(task_output))
        .route("/v1/tasks/{id}/events", get(task_events))
        .route("/v1/tasks/{id}/journal", get(task_journal))
        .route("/v1/tasks/{id}/cancel", post(cancel_task))
        .route("/v1/approvals", get(approvals))
        .route("/v1/approvals/{request_id}", post(decide))
        .route("/v1/sessions/{id}/files/{*path}", get(download))
        .nest_service("/mcp", mcp::http_service(state.clone()))
        .merge(a2a::routes())
        .merge(operator::routes())
        .merge(ui::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.max_body))
        .layer(axum::middleware::from_fn_with_state(state.clone(), auth::require_token))
        .layer(axum::middleware::from_fn_with_state(state.clone(), metrics::count_requests))
        .with_state(state)
}

/// Binds `addr` and serves until `shutdown` resolves. Refuses a non-loopback address
/// when no tokens are configured.
pub async fn serve(
    state: AppState,
    addr: SocketAddr,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let tokens_env = state.engine.registry().config().server.tokens_env.clone();
    check_bind(&addr, &state.tokens, &tokens_env)?;
    let listener =
        tokio::net::TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr()?;
    tracing::info!(addr = %local, auth = !state.tokens.is_empty(), "warden API listening");
    eprintln!("warden API listening on http://{local}");
    serve_on(listener, state, shutdown).await;
    Ok(())
}

/// Serves the API on `listener` (bound already) until `shutdown` resolves, every
/// connection within the `server.` connection limits ([`listen`]: caps in total and per
/// address, idle connections shed first, request-head timeouts); then ends open streams and returns once every connection closed.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let token = state.shutdown.clone();
    let shutdown = async move {
        shutdown.await;
        token.cancel();
    };
    let server = &state.engine.registry().config().server;
    let limits = listen::ConnectionLimits {
        max_connections: server.max_connections,
        max_connections_per_address: server.max_connections_per_address,
        first_request_timeout: server.first_request_timeout,
        header_read_timeout: server.header_read_timeout,
    };
    listen::serve(listener, app(state), limits, shutdown).await;
}

async fn not_found() -> ApiError {
    ApiError::not_found("not_found", "no such endpoint")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "method not allowed on this endpoint")
}

async fn healthz(State(s): State<AppState>) -> Json<Value> {
    let snap = s.engine.registry().snapshot();
    Json(json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
        "plugins": snap.plugins.len(),
        "subagents": snap.definitions.len(),
        "running_tasks": s.engine.running(),
    }))
}

/// How long `/readyz` waits for each dependency (the store's commit, Docker's ping)
/// before calling it failing: well under a load balancer's usual 5 s probe timeout.
pub const READY_CHECK_TIMEOUT: Duration = Duration::from_secs(2);
/// How long `/readyz` answers from its last checks: a probe flood (the path needs no
/// token) costs one store commit and one Docker ping per second, not one per request.
pub const READY_CACHE_TTL: Duration = Duration::from_secs(1);

/// `/readyz`: 200 `ready` when this server should get traffic — it is not draining, its
/// task store commits, and its Docker Engine answers (when it has a sandbox) — else 503
/// with `draining` or `not_ready`. The body says which check failed, never why (that
/// goes to the log: this path is public).
async fn readyz(State(s): State<AppState>) -> Response {
    let [store, docker] = {
        let mut cached = s.readiness.lock().await;
        match *cached {
            Some((at, checks)) if at.elapsed() < READY_CACHE_TTL => checks,
            _ => {
                let store = ready_check("the task store", s.engine.store().flush()).await;
                let docker = match s.engine.tools().sandbox() {
                    Err(_) => "not_configured",
                    Ok(sandbox) => ready_check("Docker", sandbox.ping()).await,
                };
                *cached = Some((std::time::Instant::now(), [store, docker]));
                [store, docker]
            }
        }
    };
    let status = if s.engine.is_draining() {
        "draining"
    } else if store == "failing" || docker == "failing" {
        "not_ready"
    } else {
        "ready"
    };
    let code = if status == "ready" { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let body = json!({ "status": status, "checks": { "store": store, "docker": docker }, "unfinished_tasks": s.engine.unfinished() });
    (code, Json(body)).into_response()
}

/// One `/readyz` check: `ok`, or `failing` with the reason logged (never answered).
async fn ready_check<E: std::fmt::Display>(what: &str, check: impl Future<Output = Result<(), E>>) -> &'static str {
    match tokio::time::timeout(READY_CHECK_TIMEOUT, check).await {
        Ok(Ok(())) => "ok",
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "readiness: {what} fails");
            "failing"
        }
        Err(_) => {
            tracing::warn!("readiness: {what} did not answer within {READY_CHECK_TIMEOUT:?}");
            "failing"
        }
    }
}

/// `GET /metrics`: admins only — its figures span every user (another tenant's pending
/// approvals, tasks and plugins); a user's token gets 403 `admin_required`.
async fn metrics_text(State(s): State<AppState>, Extension(who): Extension<Principal>) -> Result<Response, ApiError> {
    operator::require_admin(&who)?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], metrics::render(&s)).into_response())
}

async fn subagents(State(s): State<AppState>) -> Json<Value> {
    let snap = s.engine.registry().snapshot();
    Json(json!({
        "subagents": snap.definitions.values().collect::<Vec<_>>(),
        "registrations": snap.registrations(),
        "problems": snap.problems,
    }))
}

async fn plugins(State(s): State<AppState>) -> Json<Value> {
    Json(json!({ "plugins": s.engine.registry().snapshot().status() }))
}

async fn tools(State(s): State<AppState>) -> Json<Value> {
    Json(json!({ "tools": crate::engine::tool_schema(&s.engine.registry().snapshot()) }))
}

/// `POST /v1/tasks` body: the TaskCall fields plus where and how to run it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskRequest {
    description: Option<String>,
    prompt: Option<String>,
    subagent_type: Option<String>,
    model: Option<String>,
    resume: Option<String>,
    /// Absent: the subagent's default ([`crate::engine::Engine::background_by_default`]).
    run_in_background: Option<bool>,
    session_id: Option<String>,
    /// A snapshot of the user's (`POST /v1/sessions/{id}/snapshots`) the new session
    /// `session_id` starts from: its workspace is a copy of the snapshot.
    snapshot: Option<String>,
    user_id: Option<String>,
    /// The task's secrets, each with its delivery ([`crate::tool_context::Entry`]); never
    /// stored or logged.
    #[serde(default)]
    tool_context: BTreeMap<String, crate::tool_context::Entry>,
    max_tool_iterations: Option<u32>,
    /// Host patterns the task's tool calls may reach at most (narrows `sandbox.egress`).
    egress: Option<Vec<String>>,
    /// `"fork"`: run in a fork of the session ([`crate::isolation`]); absent: as the
    /// subagent's definition says.
    isolation: Option<String>,
}

/// A request's `isolation`, parsed; an unknown value is a 400 naming the field and the
/// accepted values.
pub(crate) fn requested_isolation(value: Option<&str>) -> Result<Option<crate::plugin::Isolation>, SubmitError> {
    value
        .map(crate::plugin::Isolation::parse)
        .transpose()
        .map_err(|message| SubmitError::InvalidField { field: "isolation", message })
}

/// How a task reads in API answers (the stored record), scrubbed with its session's
/// secrets as they are now.
pub(crate) fn task_json(r: &TaskRecord) -> Value {
    let v = serde_json::to_value(r).unwrap_or(Value::Null);
    crate::redact::registry().session(&r.user_id, &r.session_id).scrubbed(&v)
}

fn wants_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|m| m.trim().starts_with("text/event-stream")))
}

/// Longest a synchronous `POST /v1/tasks` waits: the task's own deadline bounds it first.
const SYNC_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

async fn create_task(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body?;
    let req: TaskRequest = parse_json(&body)?;
    let isolation = requested_isolation(req.isolation.as_deref())?;
    let user_id = who.user_for(req.user_id)?;
    if let Some(name) = &req.snapshot {
        let Some(session_id) = &req.session_id else {
            return Err(ApiError::bad_request(
                "invalid_field",
                "snapshot: needs `session_id`, the id of the new session to start from the snapshot",
            ));
        };
        // The session is made before the task is accepted: its id is checked here first.
        if !crate::engine::valid_id(session_id) {
            return Err(ApiError::bad_request(
                "invalid_field",
                "session_id: expected 1-128 characters of [A-Za-z0-9_.-]",
            ));
        }
        let key = warden_sandbox::SessionKey::new(user_id.clone(), session_id.clone());
        operator::session_from_snapshot(&s, &key, name).await?;
    } else if let Some(resumed) = &req.resume {
        operator::restore_resumed_session(&s, &user_id, resumed).await?;
    }
    let subagent_type = req.subagent_type.unwrap_or_default();
    let run_in_background = req.run_in_background.unwrap_or_else(|| s.engine.background_by_default(&subagent_type));
    let sub = Submission {
        call: TaskCall {
            description: req.description.unwrap_or_default(),
            prompt: req.prompt.unwrap_or_default(),
            subagent_type,
            model: req.model,
            resume: req.resume,
            run_in_background,
        },
        session_id: req.session_id,
        user_id: Some(user_id),
        principal: Some(who.name.clone()),
        tool_context: req.tool_context,
        max_tool_iterations: req.max_tool_iterations,
        asker: None,
        egress: req.egress,
        isolation,
    };
    let background = sub.call.run_in_background;
    // Admitted before the task starts: a refused stream must not leave a task running.
    let stream = if wants_event_stream(&headers) { Some(s.streams.admit(&who)?) } else { None };
    // A refusal may quote the request: scrubbed of the secrets it carried.
    let own_secrets = crate::redact::Redactor::with_secrets(sub.tool_context.values().map(|e| e.value.as_str()));
    let submitted = s.engine.submit(sub).await.map_err(|e| {
        let e = ApiError::from(e);
        ApiError { message: own_secrets.scrub(&e.message).into_owned(), ..e }
    })?;
    let submitted = submitted.record;
    let task_id = submitted.task_id.clone();
    if let Some(stream) = stream {
        let rec = submitted;
        let session = (rec.user_id, rec.session_id);
        let mut resp = sse::task_events(stream, &s, task_id.clone(), session, 0, who.authority()).into_response();
        if let Ok(v) = HeaderValue::from_str(&task_id) {
            resp.headers_mut().insert("x-task-id", v);
        }
        return Ok(resp);
    }
    if background {
        // An accepted task survives a crash: its record is committed before the answer
        // (the store batches writes; a SIGKILL right after a 202 lost the task).
        if let Err(e) = s.engine.store().flush().await {
            tracing::warn!(task_id = %task_id, error = %e, "could not commit the accepted task");
        }
        let rec = s.engine.get(&task_id).await?.unwrap_or(submitted);
        return Ok((
            StatusCode::ACCEPTED,
            [(header::LOCATION, format!("/v1/tasks/{task_id}"))],
            Json(json!({ "task_id": task_id, "status": rec.status, "session_id": rec.session_id })),
        )
            .into_response());
    }
    let rec = s.engine.wait_finished(&task_id, SYNC_WAIT).await?.unwrap_or(submitted);
    Ok(Json(task_json(&rec)).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OutputQuery {
    block: Option<bool>,
    #[serde(alias = "timeout")]
    timeout_ms: Option<u64>,
}

/// The task's record if `who` may see it; otherwise (and when there is none) 404, so a
/// task of another user cannot even be told apart from a missing one.
pub(crate) async fn visible_task(s: &ServerState, who: &Principal, id: &str) -> Result<TaskRecord, ApiError> {
    match s.engine.get(id).await? {
        Some(r) if who.owns(&r.user_id) => Ok(r),
        _ => Err(ApiError::task_not_found(id)),
    }
}

async fn task_output(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    id: Result<Path<String>, PathRejection>,
    q: Result<Query<OutputQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(id) = id?;
    let Query(q) = q?;
    visible_task(&s, &who, &id).await?;
    let timeout = q.timeout_ms.map(Duration::from_millis).unwrap_or(DEFAULT_OUTPUT_TIMEOUT);
    let block = q.block.unwrap_or(true);
    let _long_poll = if block { Some(s.streams.admit(&who)?) } else { None };
    let Some(rec) = s.engine.output(&id, block, timeout).await? else { return Err(ApiError::task_not_found(&id)) };
    let mut out = task_json(&rec);
    // While it waits: where it stands in the queue and why.
    if let Some(place) = s.engine.queue_place(&rec).await {
        out["queue"] = json!(place);
    }
    Ok(Json(out))
}

async fn task_events(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Path(id) = id?;
    let after = match headers.get("last-event-id") {
        None => 0,
        Some(v) => v.to_str().ok().and_then(|t| t.trim().parse::<u64>().ok()).ok_or_else(|| {
            ApiError::bad_request("invalid_last_event_id", "Last-Event-ID must be an event sequence number")
        })?,
    };
    let rec = visible_task(&s, &who, &id).await?;
    let permit = s.streams.admit(&who)?;
    Ok(sse::task_events(permit, &s, id, (rec.user_id, rec.session_id), after, who.authority()).into_response())
}

/// A durable task's import journal (`warden task journal`): its header, then one entry
/// per import call of its plugin, scrubbed with the task's session's secrets like its
/// events. Empty for a task that is not durable.
async fn task_journal(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(id) = id?;
    let rec = visible_task(&s, &who, &id).await?;
    let rows = s.engine.store().journal(&id).await.map_err(|e| ApiError::internal(e.to_string()))?;
    let redactor = crate::redact::registry().owner(Some(&rec.user_id), Some(&rec.session_id));
    let entries: Vec<Value> = rows
        .into_iter()
        .map(|(seq, mut entry)| {
            redactor.scrub_value(&mut entry);
            json!({ "seq": seq, "entry": entry })
        })
        .collect();
    Ok(Json(json!({ "task_id": id, "entries": entries })))
}

async fn cancel_task(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = id?;
    visible_task(&s, &who, &id).await?;
    match s.engine.cancel(&id).await? {
        CancelOutcome::Canceled(rec) => Ok(Json(task_json(&rec)).into_response()),
        CancelOutcome::AlreadyFinished(rec) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "task_finished",
            format!("task `{id}` already finished with status {}", rec.status),
        )),
        CancelOutcome::NotFound => Err(ApiError::task_not_found(&id)),
    }
}

/// The pending approvals `who` may see and decide, each with the record of its task
/// (`None` for a call no task of this server made: only admins see those).
pub(crate) async fn visible_approvals(
    s: &ServerState,
    who: &Principal,
) -> Vec<(warden_approval::PendingApproval, Option<TaskRecord>)> {
    let mut visible = vec![];
    // This server's requests, then those waiting on other replicas.
    for p in s.engine.gate().pending().into_iter().chain(s.engine.remote_approvals().await) {
        let rec = match p.task_id.as_deref() {
            Some(t) => s.engine.get(t).await.ok().flatten(),
            None => None,
        };
        let may = match &rec {
            Some(r) => who.may_decide_for(&r.user_id),
            None => who.is_admin(),
        };
        if may {
            visible.push((p, rec));
        }
    }
    visible
}

async fn approvals(State(s): State<AppState>, Extension(who): Extension<Principal>) -> Json<Value> {
    // A pending call's input is the model's text: scrubbed with its task's session's
    // secrets (with every secret when the task is not known here). Each offers the scopes
    // this principal may choose: `always` to an admin only.
    let authority = who.authority();
    let pending: Vec<Value> = visible_approvals(&s, &who)
        .await
        .into_iter()
        .map(|(p, rec)| {
            let mut v = serde_json::to_value(p.offered_to(authority)).unwrap_or(Value::Null);
            if let Some(r) = &rec {
                v["user_id"] = Value::String(r.user_id.clone());
                if let Some(by) = &r.principal {
                    v["principal"] = Value::String(by.clone());
                }
            }
            match rec {
                Some(r) => crate::redact::registry().session(&r.user_id, &r.session_id).scrubbed(&v),
                None => crate::redact::registry().host().scrubbed(&v),
            }
        })
        .collect();
    Json(json!({ "approvals": pending }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionBody {
    decision: warden_approval::Resolution,
    /// How long an approval holds: `once` (default), `session` or `always`.
    #[serde(default)]
    scope: warden_approval::Scope,
}

async fn decide(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    id: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(id) = id?;
    let body: DecisionBody = parse_json(&body?)?;
    resolve_approval(&s, &who, &id, body.decision, body.scope).await?;
    Ok(Json(json!({ "request_id": id, "decision": body.decision, "scope": body.scope, "decided_by": who.name })))
}

/// Longest rendering of a gated call's arguments in an approval question (MCP
/// elicitation, A2A input-required): a long script still fits a scrollable dialog.
pub(crate) const MAX_QUESTION_ARGUMENTS: usize = 16 * 1024;
// An `approval_request` event carries whole every input a question can show whole (it cuts
// only longer ones, marked `input_cut`): a question built from an event is never built from
// a cut input.
const _: () = assert!(MAX_QUESTION_ARGUMENTS <= crate::engine::MAX_APPROVAL_EVENT_INPUT);

/// A gated call's arguments for an approval question: one escaped line (text the
/// subagent chose cannot add lines that look like warden's), whole — or `Err(length)`
/// when longer than [`MAX_QUESTION_ARGUMENTS`]: never cut silently, since a tail the
/// person did not see could run.
pub(crate) fn question_arguments(input: &Value) -> Result<String, usize> {
    let text = crate::text::escape_control(&input.to_string()).into_owned();
    let n = text.chars().count();
    if n > MAX_QUESTION_ARGUMENTS { Err(n) } else { Ok(text) }
}

/// Decides the pending approval `id` as `who`: the one path every front (HTTP API, MCP
/// elicitation, A2A input) takes, so the same visibility rule holds everywhere. Another
/// user's approval reads as unknown: no oracle for ids of other users.
pub(crate) async fn resolve_approval(
    s: &ServerState,
    who: &Principal,
    id: &str,
    decision: warden_approval::Resolution,
    scope: warden_approval::Scope,
) -> Result<(), ApiError> {
    use warden_approval::GateError;
    let not_found = || ApiError::not_found("approval_not_found", format!("no pending approval `{id}`"));
    let gate = s.engine.gate();
    let visible = visible_approvals(s, who).await;
    let Some((pending, _)) = visible.iter().find(|(p, _)| p.id == id) else {
        return Err(not_found());
    };
    let answer =
        warden_approval::UserDecision { resolution: decision, who: who.name.clone(), authority: who.authority() };
    let refused = |e: GateError| match e {
        GateError::UnknownRequest(_) => ApiError::not_found("approval_not_found", e.to_string()),
        GateError::ScopeNotAllowed { .. } => ApiError::bad_request("scope_not_allowed", e.to_string()),
        GateError::AdminRequired { .. } => ApiError::new(StatusCode::FORBIDDEN, "admin_required", e.to_string()),
    };
    if !gate.pending().iter().any(|p| p.id == id) {
        // Waiting on another replica: it applies the decision (within CONTROL_POLL), with
        // the same rule as the gate's own, checked here first for a clear answer.
        warden_approval::check_scope(&pending.scopes, &answer, scope).map_err(refused)?;
        return match s.engine.decide_elsewhere(id, answer, scope).await? {
            true => Ok(()),
            false => Err(not_found()),
        };
    }
    gate.resolve_scoped(id, answer, scope).map_err(refused)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileQuery {
    user_id: Option<String>,
}

/// MIME type by file extension, and whether browsers may show it inline.
pub(crate) fn mime_for(path: &str) -> (&'static str, bool) {
    let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    match ext.as_str() {
        "txt" | "log" | "md" | "rs" | "py" | "sh" | "toml" | "yaml" | "yml" | "ts" | "js" | "go" | "c" | "h" => {
            ("text/plain; charset=utf-8", true)
        }
        "csv" => ("text/csv; charset=utf-8", true),
        "json" => ("application/json", true),
        "html" | "htm" => ("text/html; charset=utf-8", true),
        "css" => ("text/css; charset=utf-8", true),
        "png" => ("image/png", true),
        "jpg" | "jpeg" => ("image/jpeg", true),
        "gif" => ("image/gif", true),
        "webp" => ("image/webp", true),
        "svg" => ("image/svg+xml", true),
        "pdf" => ("application/pdf", false),
        "zip" => ("application/zip", false),
        "gz" | "tgz" => ("application/gzip", false),
        "tar" => ("application/x-tar", false),
        _ => ("application/octet-stream", false),
    }
}

async fn download(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    params: Result<Path<(String, String)>, PathRejection>,
    q: Result<Query<FileQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Path((session, path)) = params?;
    let Query(q) = q?;
    let bytes = session_file(&s, &who, q.user_id, &session, &path).await?;
    let (mime, inline) = mime_for(&path);
    let name = path.rsplit('/').next().unwrap_or("file").replace(['"', '\\', '\r', '\n'], "_");
    let disposition = format!("{}; filename=\"{name}\"", if inline { "inline" } else { "attachment" });
    let mut resp = bytes.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(mime));
    if let Ok(v) = HeaderValue::from_str(&disposition) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    // Inline HTML/SVG from a sandbox must not run script against this origin.
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static("sandbox"));
    Ok(resp)
}

/// A file of a sandbox session's workspace, as `who` may read it (`user` defaults to
/// the principal's own), scrubbed of the session's secrets: the one path by which
/// session files leave warden (the download API, MCP resources).
pub(crate) async fn session_file(
    s: &ServerState,
    who: &Principal,
    user: Option<String>,
    session: &str,
    path: &str,
) -> Result<Vec<u8>, ApiError> {
    use warden_sandbox::SandboxError as E;
    let user = user.unwrap_or_else(|| who.default_user.clone());
    if !who.owns(&user) {
        // Another user's session reads as missing, before the sandbox is asked anything.
        return Err(ApiError::not_found("session_not_found", format!("no sandbox session `{session}` for this user")));
    }
    let tools = s.engine.tools().clone();
    let unavailable = |m: String| {
        ApiError::host(StatusCode::SERVICE_UNAVAILABLE, "sandbox_unavailable", error::SANDBOX_UNAVAILABLE, m)
    };
    let sandbox = tools.sandbox().map_err(|e| unavailable(e.to_string()))?;
    let redactor = crate::redact::registry().session(&user, session);
    // Never create a container just to answer a download. The session's container under
    // the default runtime, else the one under another (`sandbox.runtime_overrides`).
    let sessions = sandbox.list_sessions().await.map_err(|e| unavailable(e.to_string()))?;
    let mut held: Vec<_> = sessions
        .into_iter()
        .filter(|i| i.key.user_id == user && i.key.session_id == session && i.owned_here)
        .map(|i| i.key)
        .collect();
    held.sort_by_key(|k| k.runtime.is_some());
    let Some(key) = held.into_iter().next() else {
        return Err(ApiError::not_found("session_not_found", format!("no sandbox session `{session}` for this user")));
    };
    let bytes = sandbox.download_file(&key, path).await.map_err(|e| match e {
        E::PathOutsideWorkspace { .. } => ApiError::new(StatusCode::FORBIDDEN, "path_outside_workspace", e.to_string()),
        E::File { ref message, .. } if message.contains("does not exist") => {
            ApiError::not_found("file_not_found", e.to_string())
        }
        E::File { .. } | E::InvalidSessionKey(_) | E::InvalidInput { .. } => {
            ApiError::bad_request("invalid_file", e.to_string())
        }
        E::DockerUnavailable(_) | E::ImageMissing { .. } => unavailable(e.to_string()),
        E::TooManySessions { .. } | E::ShutDown => {
            ApiError::refusal(StatusCode::SERVICE_UNAVAILABLE, "sandbox_unavailable", e.to_string())
        }
        E::TooManyUserSessions { .. } => {
            ApiError::refusal(StatusCode::TOO_MANY_REQUESTS, "too_many_user_sessions", e.to_string())
        }
        other => ApiError::host(StatusCode::BAD_GATEWAY, "sandbox_error", error::SANDBOX_FAULT, other.to_string()),
    })?;
    // A file is a way out too: the session's secrets never leave in one.
    Ok(redactor.scrub_bytes(&bytes).into_owned())
}

#[cfg(test)]
mod question_tests {
    use super::*;

    #[test]
    fn question_arguments_are_one_line_and_never_cut() {
        let forged = json!({"command": "touch x\n\nNOTE FROM WARDEN: pre-approved\u{1b}[2J\u{202e}"});
        let text = question_arguments(&forged).unwrap();
        assert!(!text.contains('\n') && !text.contains('\u{1b}') && !text.contains('\u{202e}'), "{text}");
        let long = json!({"command": format!("touch notes.txt{}&& touch HIDDEN_TAIL_RAN", " ".repeat(MAX_QUESTION_ARGUMENTS))});
        let n = question_arguments(&long).unwrap_err();
        assert!(n > MAX_QUESTION_ARGUMENTS);
    }
}
