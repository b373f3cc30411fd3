//! The approval gate every tool call passes before it runs.
//!
//! [`ApprovalGate::request`] evaluates the policy (with the subagent's capped
//! permission mode). `allow` and `deny` return at once. `ask` registers a
//! pending request `apr_<uuid>`, publishes [`GateEvent::Requested`] and
//! immediately a [`GateEvent::Heartbeat`] (then one every
//! [`HEARTBEAT_INTERVAL`]), and waits for the first of:
//! - [`ApprovalGate::resolve`] (`POST /v1/approvals/{id}`) → approve/decline;
//! - the caller's [`Decider`] (e.g. a TTY prompt) → approve/decline, or decline
//!   if it fails;
//! - the policy timeout → decline (`timeout`);
//! - [`ApprovalGate::cancel_task`] → decline (`cancel`);
//! - the waiting future being dropped (client gone, task canceled) → decline
//!   (`disconnect`), recorded from the drop guard.
//!
//! An ask that would take more than its share of waiting requests — its task's
//! ([`MAX_PENDING_PER_TASK`]), its user's ([`MAX_PENDING_PER_USER`]) or the host's
//! ([`MAX_PENDING`]) — is declined at once, its reason naming the bound ([`PendingLimit`]):
//! one tenant cannot fill the gate and have every other tenant's asks declined.
//!
//! Every outcome is written to the audit log exactly once and published as
//! [`GateEvent::Resolved`] (asks only). The log's own thread writes it: the gate
//! only queues the record, and waits (asynchronously, never blocking a runtime
//! worker) until an outcome that lets the call run is on disk.
//!
//! This module must never let a call run without an explicit `allow` or
//! approval: every path that is not one of those ends in a decline, including
//! an audit record that could not be queued or written.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{broadcast, oneshot};

use crate::audit::{AuditDecision, AuditLog, AuditRecord, Written, args_digest};
use crate::grants::{Grants, Scope};
use crate::mode::PermissionMode;
use crate::policy::{CallFacts, Decision, EvalContext, Policy, ResolvedFile};

/// Interval between heartbeats while a request waits, so SSE proxies flush
/// and clients see the wait is alive. 15 s is below common proxy idle
/// timeouts (30–60 s).
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(15);

/// Most requests waiting at once. Beyond this a new ask is declined at once
/// (`error`) instead of growing memory without bound.
pub const MAX_PENDING: usize = 1024;

/// Most requests of one user waiting at once: an eighth of [`MAX_PENDING`]. The host-wide
/// bound alone let one tenant (its tasks each waiting on a full batch of asking calls)
/// fill the gate for the approval timeout, again and again, so that every other tenant's
/// gated calls were declined at once; with this share eight users must be waiting to fill
/// it. 128 requests are still more than a person answers at a time. Requests naming no
/// user share one share.
pub const MAX_PENDING_PER_USER: usize = MAX_PENDING / 8;

/// Most requests of one task waiting at once. A task waits on one tool-call batch at a
/// time, and the host takes at most 64 calls per batch (its `MAX_TOOL_CALLS_PER_BATCH`,
/// checked against this at compile time there), so an honest task never reaches it; it
/// keeps one task from taking its user's whole share.
pub const MAX_PENDING_PER_TASK: usize = 64;

/// Which bound on waiting requests declined an ask at once (the verdict's reason names it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PendingLimit {
    /// [`MAX_PENDING_PER_TASK`]: the call's task has that many requests waiting.
    Task,
    /// [`MAX_PENDING_PER_USER`]: the call's user has that many requests waiting.
    User,
    /// [`MAX_PENDING`]: the host has that many requests waiting.
    Host,
}

impl PendingLimit {
    /// The bound's value.
    pub const fn max(self) -> usize {
        match self {
            PendingLimit::Task => MAX_PENDING_PER_TASK,
            PendingLimit::User => MAX_PENDING_PER_USER,
            PendingLimit::Host => MAX_PENDING,
        }
    }

    /// The bound's name, as the verdict's reason gives it.
    pub const fn name(self) -> &'static str {
        match self {
            PendingLimit::Task => "MAX_PENDING_PER_TASK",
            PendingLimit::User => "MAX_PENDING_PER_USER",
            PendingLimit::Host => "MAX_PENDING",
        }
    }

    /// Whose requests the bound counts.
    const fn whose(self) -> &'static str {
        match self {
            PendingLimit::Task => "this task",
            PendingLimit::User => "this user",
            PendingLimit::Host => "the host",
        }
    }

    /// Why an ask was declined at once: the bound it met, by name.
    pub fn reason(self) -> String {
        format!(
            "{} approval requests of {} are waiting already, the most allowed ({}); declined without asking",
            self.max(),
            self.whose(),
            self.name()
        )
    }

    /// The bound a new request of `user` and `task` would exceed among `waiting` (the
    /// requests waiting now, as (user, task) pairs), the narrowest first; `None` when it
    /// may wait.
    fn reached<'a>(
        user: Option<&str>,
        task: Option<&str>,
        waiting: impl ExactSizeIterator<Item = (Option<&'a str>, Option<&'a str>)>,
    ) -> Option<PendingLimit> {
        let total = waiting.len();
        let (mut of_user, mut of_task) = (0, 0);
        for (u, t) in waiting {
            of_user += usize::from(u == user);
            of_task += usize::from(task.is_some() && t == task);
        }
        [(PendingLimit::Task, of_task), (PendingLimit::User, of_user), (PendingLimit::Host, total)]
            .into_iter()
            .find(|(limit, n)| *n >= limit.max())
            .map(|(limit, _)| limit)
    }
}

/// Capacity of the event channel; a subscriber that lags by more than this
/// misses events (it sees `RecvError::Lagged`) rather than blocking the gate.
pub const EVENT_CAPACITY: usize = 1024;

/// Prefix of approval request ids.
pub const REQUEST_ID_PREFIX: &str = "apr_";

/// A tool call to be approved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    /// Tool name (`Bash`, `Read`, `mcp__server__tool`, ...).
    pub tool: String,
    /// Tool arguments.
    pub input: Value,
    /// Subagent making the call.
    pub subagent: String,
    /// Task the call belongs to.
    pub task_id: Option<String>,
    /// Session (sandbox) the call belongs to.
    pub session_id: Option<String>,
    /// The user the call acts for: session ids are chosen by clients, so a session's
    /// approvals (`scope: session`) belong to (user, session), never to the id alone.
    #[serde(default)]
    pub user_id: Option<String>,
    /// Plugin making the call.
    pub plugin: Option<String>,
    /// The OCI runtime the call's sandbox session runs under when the subagent was put under
    /// one (`sandbox.runtime_overrides`), recorded in the audit line; never part of a decision.
    #[serde(default)]
    pub sandbox_runtime: Option<String>,
    /// The subagent's requested `permissionMode` (capped by the operator).
    pub mode: Option<PermissionMode>,
    /// The call's path after symlink resolution in the sandbox, when it differs from the
    /// path as given: rules are checked against both and the stricter decision wins.
    pub resolved_path: Option<String>,
    /// The file has other hard links (names no rule was checked against): an allow
    /// becomes an ask.
    pub hard_linked: bool,
    /// Bash: the working directory the session's shell starts this call in (absolute);
    /// relative file operands and redirections are judged from it. `None`: the workspace
    /// root.
    #[serde(default)]
    pub shell_cwd: Option<String>,
    /// Bash: every file of [`crate::shell::shell_files`] (for [`Self::shell_cwd`]) as the
    /// sandbox resolved it; `None` when the host does not look them up ([`CallFacts`]).
    #[serde(default)]
    pub shell_files: Option<Vec<ResolvedFile>>,
    /// The subagents that started this one with the `Agent` tool, root first: a person
    /// asked about a nested subagent's call sees whose work it is. Empty for a task the
    /// parent agent submitted.
    #[serde(default)]
    pub chain: Vec<ChainLink>,
}

/// One task above a nested subagent's: its id, its subagent and the permission mode its
/// definition asks for. A nested subagent's calls are judged by the strictest of its own
/// mode and every ancestor's: a `plan` parent cannot hand edits to an `acceptEdits` child.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainLink {
    pub task_id: String,
    pub subagent: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<PermissionMode>,
}

impl ApprovalRequest {
    /// Whose `session`-scoped approvals apply to this call: its user's session (user ids
    /// and session ids are `[A-Za-z0-9_.-]`, so the `/` keeps pairs apart).
    fn grant_session(&self) -> Option<String> {
        self.session_id.as_ref().map(|s| format!("{}/{s}", self.user_id.as_deref().unwrap_or("")))
    }

    /// A request with only the required fields set.
    pub fn new(tool: impl Into<String>, input: Value, subagent: impl Into<String>) -> Self {
        ApprovalRequest {
            tool: tool.into(),
            input,
            subagent: subagent.into(),
            task_id: None,
            session_id: None,
            user_id: None,
            plugin: None,
            sandbox_runtime: None,
            mode: None,
            resolved_path: None,
            hard_linked: false,
            shell_cwd: None,
            shell_files: None,
            chain: Vec::new(),
        }
    }
}

/// A request waiting for a person (`GET /v1/approvals`, `approval_request`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingApproval {
    /// `apr_<uuid>`.
    pub id: String,
    /// Tool name.
    pub tool: String,
    /// Tool arguments (shown to the person deciding; never audited).
    pub input: Value,
    /// Subagent making the call.
    pub subagent: String,
    /// Task the call belongs to.
    pub task_id: Option<String>,
    /// Session the call belongs to.
    pub session_id: Option<String>,
    /// Plugin making the call.
    pub plugin: Option<String>,
    /// The subagents that started this one, root first ([`ApprovalRequest::chain`]);
    /// absent for a task the parent agent submitted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chain: Vec<ChainLink>,
    /// Rule that asked, if any.
    pub matched_rule: Option<String>,
    /// Why the call is asked.
    pub reason: String,
    /// RFC 3339 time the request was made.
    pub created_at: String,
    /// RFC 3339 time the request is declined if nobody decides.
    pub expires_at: String,
    /// How long an approval may hold ([`Scope`]): always `once`; `session` and `always`
    /// when an exact rule describes the call (and, for `always`, an overlay file is
    /// configured and no deny rule names the tool). The gate's list offers what the
    /// request allows; a front shows a reader [`PendingApproval::offered_to`] its
    /// authority (`always` to an admin only).
    pub scopes: Vec<Scope>,
}

/// A person's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Resolution {
    /// Run the call.
    Approve,
    /// Do not run it.
    Decline,
}

/// What an answer may change beyond the one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Authority {
    /// A user deciding for their own calls (or, as an approver, for the users named): an
    /// approval may hold `once` or for the call's `session` (that user's session only).
    #[default]
    User,
    /// An administrator of this host (an `admin` principal, the person at the terminal
    /// running warden): may also approve `always`.
    Admin,
}

impl Authority {
    /// Whether an approval by this authority may hold for `scope`. `always` appends a
    /// rule to the operator's policy overlay, which allows the call for every user and
    /// every session from then on: a change of policy, so an administrator's alone.
    pub fn may_grant(self, scope: Scope) -> bool {
        scope != Scope::Always || self == Authority::Admin
    }

    /// The scopes of `offered` (a request's [`PendingApproval::scopes`]) an answer by this
    /// authority may choose, in their order: the one rule every front that lists answer
    /// options applies for its reader, so none offers a scope the gate then refuses
    /// ([`check_scope`]). `once` is always choosable.
    pub fn choosable(self, offered: &[Scope]) -> Vec<Scope> {
        let mut scopes: Vec<Scope> = offered.iter().copied().filter(|s| self.may_grant(*s)).collect();
        if !scopes.contains(&Scope::Once) {
            scopes.insert(0, Scope::Once);
        }
        scopes
    }
}

impl PendingApproval {
    /// This request as a reader with `authority` is offered it: its
    /// [`PendingApproval::scopes`] cut to those [`Authority::choosable`].
    pub fn offered_to(mut self, authority: Authority) -> Self {
        self.scopes = authority.choosable(&self.scopes);
        self
    }
}

/// What a [`Decider`] answered, and who answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserDecision {
    /// Approve or decline.
    pub resolution: Resolution,
    /// Who decided, without the `user:` prefix (e.g. `tty`, `alice`).
    pub who: String,
    /// What their answer may change ([`Authority::may_grant`]).
    pub authority: Authority,
}

/// The one rule for how long an answer may hold, checked where the gate keeps a grant
/// (and, for a clear error first, by [`ApprovalGate::resolve_scoped`] and by a front that
/// forwards a decision to another replica): a scope other than `once` must be among the
/// request's `offered` scopes, the answer must be an approval, and its authority must
/// allow the scope.
pub fn check_scope(offered: &[Scope], decision: &UserDecision, scope: Scope) -> Result<(), GateError> {
    if scope == Scope::Once {
        return Ok(());
    }
    let approve = decision.resolution == Resolution::Approve;
    if !approve || !offered.contains(&scope) {
        let offered = if approve { offered } else { &[Scope::Once][..] };
        return Err(GateError::ScopeNotAllowed {
            scope: scope.as_str(),
            offered: offered.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
        });
    }
    if !decision.authority.may_grant(scope) {
        return Err(GateError::AdminRequired { scope: scope.as_str(), who: decision.who.clone() });
    }
    Ok(())
}

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A per-request way to get a decision besides [`ApprovalGate::resolve`],
/// such as a TTY prompt. The future is dropped if another path decides first.
pub trait Decider: Send + Sync {
    /// Ask about `request`. An `Err` declines the call (decided by `error`).
    fn decide(&self, request: PendingApproval) -> BoxFuture<'static, Result<UserDecision, String>>;

    /// Ask about `request`, offering its [`PendingApproval::scopes`]; the default asks
    /// [`Decider::decide`] and holds the answer once. A scope that was not offered, or
    /// with a decline, holds once.
    fn decide_scoped(&self, request: PendingApproval) -> BoxFuture<'static, Result<(UserDecision, Scope), String>> {
        let answer = self.decide(request);
        Box::pin(async move { answer.await.map(|d| (d, Scope::Once)) })
    }
}

/// Gate events, serialised with the SSE event names in `type`.
// Requests are the event that matters and are published once each; heartbeats being
// smaller than the enum costs a few hundred bytes per queued event, bounded by EVENT_CAPACITY.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type")]
pub enum GateEvent {
    /// A call waits for a decision.
    #[serde(rename = "approval_request")]
    Requested(PendingApproval),
    /// A call is still waiting.
    #[serde(rename = "heartbeat")]
    Heartbeat {
        /// The waiting request.
        request_id: String,
        /// Its task.
        task_id: Option<String>,
    },
    /// A waiting call was decided.
    #[serde(rename = "approval_resolved")]
    Resolved {
        /// The request.
        request_id: String,
        /// Its task.
        task_id: Option<String>,
        /// `approve`, `decline` or `timeout`.
        decision: AuditDecision,
        /// Who decided.
        decided_by: String,
    },
}

/// The final outcome of one call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// Request id when the call was asked.
    pub request_id: Option<String>,
    /// Outcome (as audited).
    pub decision: AuditDecision,
    /// `policy`, `user:<who>`, `timeout`, `disconnect`, `cancel`, `bypass`,
    /// `error`.
    pub decided_by: String,
    /// The rule that matched, if any.
    pub matched_rule: Option<String>,
    /// Explanation.
    pub reason: String,
    /// Time spent waiting for a decision.
    #[serde(skip)]
    pub waited: Duration,
}

impl Verdict {
    /// Whether the call may run.
    pub fn allowed(&self) -> bool {
        self.decision.allows()
    }

    /// For a call that may not run: the synthetic tool result the model reads.
    pub fn declined_message(&self, tool: &str) -> Option<String> {
        if self.allowed() {
            return None;
        }
        let why = match self.decision {
            AuditDecision::Deny => format!("denied by the approval policy ({})", self.reason),
            AuditDecision::Timeout => "declined: nobody approved it in time".to_owned(),
            _ => format!("declined ({})", self.decided_by),
        };
        Some(format!("The {tool} call was not run: {why}."))
    }
}

/// A gate error visible to callers of [`ApprovalGate::resolve`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    /// No such pending request (unknown id, already decided, or expired).
    #[error("no pending approval `{0}` (unknown, already decided or expired)")]
    UnknownRequest(String),
    /// The scope asked for is not offered for this request (see [`PendingApproval::scopes`]).
    #[error("scope `{scope}` is not available for this approval (offered: {offered})")]
    ScopeNotAllowed {
        /// The scope asked for.
        scope: &'static str,
        /// The scopes offered.
        offered: String,
    },
    /// The scope changes policy for every user; `who` is not an administrator.
    #[error(
        "`{who}` may not approve `{scope}`: it adds a rule to the policy overlay that holds for every user; \
         only an admin may (approve `once` or `session` instead)"
    )]
    AdminRequired {
        /// The scope asked for.
        scope: &'static str,
        /// Who asked for it.
        who: String,
    },
}

/// What reaches a waiting request through its channel.
enum Answer {
    Person(UserDecision),
    /// An approval for longer than this call.
    Scoped(UserDecision, Scope),
    Cancel,
}

struct Pending {
    info: PendingApproval,
    /// The user the call acts for ([`ApprovalRequest::user_id`]): whose share
    /// ([`MAX_PENDING_PER_USER`]) the request takes.
    user: Option<String>,
    tx: oneshot::Sender<Answer>,
}

struct Inner {
    policy: Arc<Policy>,
    ctx: EvalContext,
    audit: Option<Arc<AuditLog>>,
    events: broadcast::Sender<GateEvent>,
    /// Called synchronously with each event as it is published (see [`ApprovalGate::observe`]).
    observers: Mutex<Vec<Observer>>,
    pending: Mutex<HashMap<String, Pending>>,
    heartbeat: Duration,
    grants: Grants,
}

/// A synchronous watcher of gate events ([`ApprovalGate::observe`]).
pub type Observer = Arc<dyn Fn(&GateEvent) + Send + Sync>;

/// The approval gate. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct ApprovalGate {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ApprovalGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApprovalGate").field("pending", &self.pending().len()).finish()
    }
}

impl ApprovalGate {
    /// A gate for `policy`, resolving paths against `ctx`, auditing to `audit`.
    pub fn new(policy: Arc<Policy>, ctx: EvalContext, audit: Option<Arc<AuditLog>>) -> Self {
        Self::with_heartbeat(policy, ctx, audit, HEARTBEAT_INTERVAL)
    }

    /// What paths are resolved against (the workspace root and home of the sandbox).
    pub fn context(&self) -> &EvalContext {
        &self.inner.ctx
    }

    /// Like [`ApprovalGate::new`] with another heartbeat interval (tests).
    pub fn with_heartbeat(
        policy: Arc<Policy>,
        ctx: EvalContext,
        audit: Option<Arc<AuditLog>>,
        heartbeat: Duration,
    ) -> Self {
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        ApprovalGate {
            inner: Arc::new(Inner {
                policy,
                ctx,
                audit,
                events,
                observers: Mutex::new(vec![]),
                pending: Mutex::new(HashMap::new()),
                heartbeat: heartbeat.max(Duration::from_millis(1)),
                grants: Grants::default(),
            }),
        }
    }

    /// Keeps `always` approvals in `overlay` (appended; its rules apply from the start).
    /// Call on a new gate, before it is cloned.
    pub fn with_overlay(mut self, overlay: std::path::PathBuf) -> Result<Self, String> {
        let grants = Grants::load(Some(overlay))?;
        let inner = Arc::get_mut(&mut self.inner).ok_or("the overlay must be set before the gate is shared")?;
        inner.grants = grants;
        Ok(self)
    }

    /// The policy in force.
    /// The audit log decisions are written to, if one is configured (the host writes its
    /// sandboxes' egress decisions there too).
    pub fn audit_log(&self) -> Option<&Arc<AuditLog>> {
        self.inner.audit.as_ref()
    }

    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// Calls `observer` with every gate event from now on, synchronously as it is
    /// published: a `Requested` before the call starts waiting, a `Resolved` before
    /// the verdict returns to the caller. So whatever the caller reports next (the
    /// call's result) comes after the observer saw the decision — a broadcast
    /// subscriber ([`ApprovalGate::subscribe`]) may see it later, or not at all once
    /// it lags. The observer must not block and must not call back into the gate.
    pub fn observe(&self, observer: Observer) {
        self.inner.observers.lock().unwrap_or_else(|e| e.into_inner()).push(observer);
    }

    /// Receive gate events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<GateEvent> {
        self.inner.events.subscribe()
    }

    /// Requests waiting for a decision, oldest first.
    pub fn pending(&self) -> Vec<PendingApproval> {
        let mut list: Vec<PendingApproval> = self.inner.lock_pending().values().map(|p| p.info.clone()).collect();
        list.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        list
    }

    /// Deliver a person's decision for a pending request, for this call only. `who`
    /// identifies them (audited as `user:<who>`).
    pub fn resolve(&self, id: &str, resolution: Resolution, who: impl Into<String>) -> Result<(), GateError> {
        let who = who.into();
        self.inner.deliver(id, Answer::Person(UserDecision { resolution, who, authority: Authority::User }))
    }

    /// Like [`ApprovalGate::resolve`], with how long an approval holds ([`check_scope`]:
    /// a scope other than `once` must be offered, needs an approval, and `always` an
    /// [`Authority::Admin`]). A refused scope leaves the request waiting.
    pub fn resolve_scoped(&self, id: &str, decision: UserDecision, scope: Scope) -> Result<(), GateError> {
        if scope == Scope::Once {
            return self.inner.deliver(id, Answer::Person(decision));
        }
        let offered = match self.inner.lock_pending().get(id) {
            Some(p) => p.info.scopes.clone(),
            None => return Err(GateError::UnknownRequest(id.to_owned())),
        };
        check_scope(&offered, &decision, scope)?;
        self.inner.deliver(id, Answer::Scoped(decision, scope))
    }

    /// Decline every pending request of a task (task canceled). Returns how
    /// many were declined.
    pub fn cancel_task(&self, task_id: &str) -> usize {
        let taken: Vec<Pending> = {
            let mut map = self.inner.lock_pending();
            let ids: Vec<String> = map
                .iter()
                .filter(|(_, p)| p.info.task_id.as_deref() == Some(task_id))
                .map(|(id, _)| id.clone())
                .collect();
            ids.iter().filter_map(|id| map.remove(id)).collect()
        };
        let n = taken.len();
        for p in taken {
            let _ = p.tx.send(Answer::Cancel);
        }
        n
    }

    /// Decide one call (no per-request decider).
    pub async fn request(&self, req: ApprovalRequest) -> Verdict {
        self.request_with(req, None).await
    }

    /// Decide one call; `decider` (e.g. a TTY prompt) may answer an ask.
    pub async fn request_with(&self, req: ApprovalRequest, decider: Option<Arc<dyn Decider>>) -> Verdict {
        let started = Instant::now();
        let inner = &self.inner;
        let mode = req.chain.iter().fold(inner.policy.effective_mode(req.mode), |mode, link| {
            mode.stricter(inner.policy.effective_mode(link.mode))
        });
        let facts = CallFacts {
            resolved_path: req.resolved_path.as_deref(),
            shell_cwd: req.shell_cwd.as_deref(),
            shell_files: req.shell_files.as_deref(),
        };
        let mut ev = inner.policy.decide_call(&req.tool, &req.input, &facts, &inner.ctx, mode);
        if req.hard_linked && ev.decision == Decision::Allow {
            ev.decision = Decision::Ask;
            ev.reason =
                format!("{}; but the file has other hard links, whose names no rule was checked against", ev.reason);
        }
        let (decision, decided_by) = match ev.decision {
            // An approval a person gave for the session or for always covers this ask.
            Decision::Ask => {
                let session = req.grant_session();
                let (resolved, linked) = (req.resolved_path.as_deref(), req.hard_linked);
                match inner.grants.matching(&req.tool, &req.input, resolved, linked, session.as_deref(), &inner.ctx) {
                    Some((scope, rule)) => {
                        let verdict = Verdict {
                            request_id: None,
                            decision: AuditDecision::Approve,
                            decided_by: format!("grant:{}", scope.as_str()),
                            matched_rule: Some(rule),
                            reason: format!(
                                "approved earlier for {}",
                                if scope == Scope::Session { "this session" } else { "always" }
                            ),
                            waited: started.elapsed(),
                        };
                        return inner.record_confirmed(&req, verdict).await;
                    }
                    None => {
                        return self.ask(req, ev.matched_rule, ev.reason, decider, started).await;
                    }
                }
            }
            Decision::Allow if ev.bypass => (AuditDecision::Bypass, "bypass"),
            Decision::Allow => (AuditDecision::Allow, "policy"),
            Decision::Deny => (AuditDecision::Deny, "policy"),
        };
        let verdict = Verdict {
            request_id: None,
            decision,
            decided_by: decided_by.into(),
            matched_rule: ev.matched_rule,
            reason: ev.reason,
            waited: started.elapsed(),
        };
        inner.record_confirmed(&req, verdict).await
    }

    /// Decide several calls; asks wait concurrently. Verdicts come back in
    /// the order of `requests`. Dropping the returned future declines every
    /// call still waiting.
    pub async fn decide_batch(&self, requests: Vec<ApprovalRequest>) -> Vec<Verdict> {
        self.decide_batch_with(requests, None).await
    }

    /// [`ApprovalGate::decide_batch`] with a per-request decider.
    pub async fn decide_batch_with(
        &self,
        requests: Vec<ApprovalRequest>,
        decider: Option<Arc<dyn Decider>>,
    ) -> Vec<Verdict> {
        let mut set = tokio::task::JoinSet::new();
        let n = requests.len();
        for (i, req) in requests.into_iter().enumerate() {
            let gate = self.clone();
            let decider = decider.clone();
            // In the caller's span: the host's log knows whose task's lines these are.
            set.spawn(tracing::Instrument::in_current_span(async move { (i, gate.request_with(req, decider).await) }));
        }
        let mut out: Vec<Option<Verdict>> = vec![None; n];
        while let Some(joined) = set.join_next().await {
            match joined {
                Ok((i, v)) => out[i] = Some(v),
                Err(e) => tracing::error!(error = %e, "approval task failed; its call is declined"),
            }
        }
        out.into_iter()
            .map(|v| {
                v.unwrap_or_else(|| Verdict {
                    request_id: None,
                    decision: AuditDecision::Decline,
                    decided_by: "error".into(),
                    matched_rule: None,
                    reason: "the approval task failed".into(),
                    waited: Duration::ZERO,
                })
            })
            .collect()
    }

    async fn ask(
        &self,
        req: ApprovalRequest,
        matched_rule: Option<String>,
        reason: String,
        decider: Option<Arc<dyn Decider>>,
        started: Instant,
    ) -> Verdict {
        let inner = &self.inner;
        let timeout = inner.policy.timeout();
        let id = format!("{REQUEST_ID_PREFIX}{}", uuid::Uuid::new_v4().simple());
        let now = SystemTime::now();
        let grant_rule = crate::grants::rule_for(&req.tool, &req.input, &inner.ctx).ok();
        let mut scopes = vec![Scope::Once];
        if grant_rule.is_some() && req.session_id.is_some() {
            scopes.push(Scope::Session);
        }
        if grant_rule.is_some() && inner.grants.has_overlay() && !inner.policy.denies_tool(&req.tool) {
            scopes.push(Scope::Always);
        }
        let info = PendingApproval {
            id: id.clone(),
            tool: req.tool.clone(),
            input: req.input.clone(),
            subagent: req.subagent.clone(),
            task_id: req.task_id.clone(),
            session_id: req.session_id.clone(),
            plugin: req.plugin.clone(),
            chain: req.chain.clone(),
            matched_rule: matched_rule.clone(),
            reason: reason.clone(),
            created_at: humantime::format_rfc3339_millis(now).to_string(),
            expires_at: humantime::format_rfc3339_millis(now + timeout).to_string(),
            scopes,
        };
        let base = Verdict {
            request_id: Some(id.clone()),
            decision: AuditDecision::Decline,
            decided_by: "error".into(),
            matched_rule,
            reason,
            waited: Duration::ZERO,
        };
        let (tx, mut rx) = oneshot::channel();
        {
            let mut map = inner.lock_pending();
            let waiting = map.values().map(|p| (p.user.as_deref(), p.info.task_id.as_deref()));
            if let Some(limit) = PendingLimit::reached(req.user_id.as_deref(), req.task_id.as_deref(), waiting) {
                drop(map);
                tracing::warn!(
                    user = req.user_id.as_deref().unwrap_or_default(),
                    task_id = req.task_id.as_deref().unwrap_or_default(),
                    limit = limit.name(),
                    "approval request declined: too many waiting"
                );
                let v = Verdict { reason: limit.reason(), waited: started.elapsed(), ..base };
                return inner.record(&req, v).0;
            }
            map.insert(id.clone(), Pending { info: info.clone(), user: req.user_id.clone(), tx });
        }
        let req_session = req.grant_session();
        let mut guard = WaitGuard { inner: Arc::clone(inner), req, verdict: Some(base), recorded: None, started };
        inner.publish(GateEvent::Requested(info.clone()));
        inner.publish(GateEvent::Heartbeat { request_id: id.clone(), task_id: info.task_id.clone() });

        let mut decided: BoxFuture<'static, Result<(UserDecision, Scope), String>> = match decider {
            Some(d) => d.decide_scoped(info.clone()),
            None => Box::pin(std::future::pending()),
        };
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + inner.heartbeat, inner.heartbeat);
        let outcome: Result<Answer, &'static str> = loop {
            tokio::select! {
                r = &mut rx => break r.map_err(|_| "error"),
                r = &mut decided => {
                    if inner.lock_pending().remove(&id).is_none() {
                        // `resolve` won the race; its answer is in the channel.
                        break rx.try_recv().map_err(|_| "error");
                    }
                    break r.map(|(d, scope)| {
                        if scope != Scope::Once && d.resolution == Resolution::Approve {
                            Answer::Scoped(d, scope)
                        } else {
                            Answer::Person(d)
                        }
                    }).map_err(|e| {
                        tracing::warn!(request_id = %id, error = %e, "approval decider failed; declining");
                        "error"
                    });
                }
                () = &mut deadline => {
                    if inner.lock_pending().remove(&id).is_none() {
                        break rx.try_recv().map_err(|_| "error");
                    }
                    break Err("timeout");
                }
                _ = beat.tick() => inner.publish(GateEvent::Heartbeat {
                    request_id: id.clone(),
                    task_id: info.task_id.clone(),
                }),
            }
        };
        let (decision, decided_by) = match outcome {
            Ok(Answer::Cancel) => (AuditDecision::Decline, "cancel".to_owned()),
            Ok(Answer::Scoped(decision, scope)) => {
                // The person approved this call whatever happens to the grant; the grant
                // is kept only if the answer may hold that long (every front's answer, and
                // every decider's, passes here).
                let rule = grant_rule.clone().unwrap_or_default();
                let kept = check_scope(&info.scopes, &decision, scope)
                    .map_err(|e| e.to_string())
                    .and_then(|()| inner.grants.add(scope, req_session.as_deref(), &rule, &decision.who, &id));
                let who = decision.who;
                match kept {
                    Ok(()) => {
                        tracing::info!(request_id = %id, scope = scope.as_str(), rule = %rule, who = %who, "approval kept");
                        if let Some(v) = guard.verdict.as_mut() {
                            v.matched_rule = Some(rule);
                            v.reason = format!("approved for {}", scope.as_str());
                        }
                    }
                    Err(e) => {
                        tracing::error!(request_id = %id, scope = scope.as_str(), error = %e, "approval not kept beyond this call")
                    }
                }
                (AuditDecision::Approve, format!("user:{who}"))
            }
            Ok(Answer::Person(UserDecision { resolution: Resolution::Approve, who, .. })) => {
                (AuditDecision::Approve, format!("user:{who}"))
            }
            Ok(Answer::Person(UserDecision { resolution: Resolution::Decline, who, .. })) => {
                (AuditDecision::Decline, format!("user:{who}"))
            }
            Err("timeout") => (AuditDecision::Timeout, "timeout".to_owned()),
            Err(other) => (AuditDecision::Decline, other.to_owned()),
        };
        guard.finish(decision, decided_by).await
    }
}

impl Inner {
    fn lock_pending(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        // Poisoning only means a panic elsewhere while holding the lock; the
        // map itself is always left consistent.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn deliver(&self, id: &str, decision: Answer) -> Result<(), GateError> {
        let entry = self.lock_pending().remove(id);
        match entry {
            Some(p) => p.tx.send(decision).map_err(|_| GateError::UnknownRequest(id.to_owned())),
            None => Err(GateError::UnknownRequest(id.to_owned())),
        }
    }

    fn publish(&self, event: GateEvent) {
        let observers = self.observers.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for observe in observers {
            observe(&event);
        }
        // No subscriber is fine: the audit log is the record.
        let _ = self.events.send(event);
    }

    /// Queues `verdict`'s audit record; if it cannot be queued, the call is declined
    /// instead. An allowing verdict's record must then be confirmed on disk
    /// ([`confirmed`]) before the call runs.
    fn record(&self, req: &ApprovalRequest, mut verdict: Verdict) -> (Verdict, Option<Written>) {
        let Some(log) = &self.audit else { return (verdict, None) };
        let rec = AuditRecord {
            ts: AuditRecord::now(),
            request_id: verdict.request_id.clone(),
            task_id: req.task_id.clone(),
            session_id: req.session_id.clone(),
            user_id: req.user_id.clone(),
            subagent: req.subagent.clone(),
            plugin: req.plugin.clone(),
            sandbox_runtime: req.sandbox_runtime.clone(),
            tool: req.tool.clone(),
            args_sha256: args_digest(&req.input),
            rule: verdict.matched_rule.clone(),
            decision: verdict.decision,
            decided_by: verdict.decided_by.clone(),
            waited_ms: AuditRecord::millis(verdict.waited),
            reason: Some(crate::audit::audit_reason(&verdict.reason)),
        };
        match log.append(&rec) {
            Ok(written) => (verdict, Some(written)),
            Err(e) => {
                tracing::error!(error = %e, tool = %req.tool, "audit write failed; declining the call");
                decline_unaudited(&mut verdict, &e);
                (verdict, None)
            }
        }
    }

    /// Queues `verdict`'s record and, when it lets the call run, waits until the record is
    /// on disk (without blocking a thread): a call never runs unaudited.
    async fn record_confirmed(&self, req: &ApprovalRequest, verdict: Verdict) -> Verdict {
        let (verdict, written) = self.record(req, verdict);
        confirmed(verdict, written, &req.tool).await
    }
}

/// `verdict` once its record is on disk: an allowing verdict whose record could not be
/// written becomes a decline. A decline runs nothing, so it is not waited for.
async fn confirmed(mut verdict: Verdict, written: Option<Written>, tool: &str) -> Verdict {
    let Some(written) = written else { return verdict };
    if !verdict.allowed() {
        return verdict;
    }
    if let Err(e) = written.wait().await {
        tracing::error!(error = %e, tool, "audit write failed; declining the call");
        decline_unaudited(&mut verdict, &e);
    }
    verdict
}

/// Turns an allowing `verdict` whose record was not written into a decline.
fn decline_unaudited(verdict: &mut Verdict, e: &crate::audit::AuditError) {
    if verdict.allowed() {
        verdict.decision = AuditDecision::Decline;
        verdict.decided_by = "error".into();
        verdict.reason = format!("audit log write failed: {e}");
    }
}

/// Records a decline if the waiting future is dropped before a decision.
struct WaitGuard {
    inner: Arc<Inner>,
    req: ApprovalRequest,
    /// `Some` until the wait ends; holds the base verdict.
    verdict: Option<Verdict>,
    /// The outcome while its record is being confirmed on disk (published from the drop
    /// guard if the wait is dropped meanwhile).
    recorded: Option<Verdict>,
    started: Instant,
}

impl WaitGuard {
    /// Records the outcome (an approval only once its record is on disk) and publishes it.
    async fn finish(&mut self, decision: AuditDecision, decided_by: String) -> Verdict {
        let base = self.verdict.take().expect("finish is called once");
        let v = Verdict { decision, decided_by, waited: self.started.elapsed(), ..base };
        self.inner.lock_pending().remove(v.request_id.as_deref().unwrap_or_default());
        let (v, written) = self.inner.record(&self.req, v);
        self.recorded = Some(v.clone());
        let v = confirmed(v, written, &self.req.tool).await;
        self.recorded = None;
        self.publish(&v);
        v
    }

    /// Records a decline from the drop guard (nothing runs, so nothing waits) and publishes it.
    fn complete_declined(&self, v: Verdict) {
        self.inner.lock_pending().remove(v.request_id.as_deref().unwrap_or_default());
        let (v, _) = self.inner.record(&self.req, v);
        self.publish(&v);
    }

    fn publish(&self, v: &Verdict) {
        self.inner.publish(GateEvent::Resolved {
            request_id: v.request_id.clone().unwrap_or_default(),
            task_id: self.req.task_id.clone(),
            decision: v.decision,
            decided_by: v.decided_by.clone(),
        });
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        if let Some(base) = self.verdict.take() {
            let v = Verdict {
                decision: AuditDecision::Decline,
                decided_by: "disconnect".into(),
                waited: self.started.elapsed(),
                ..base
            };
            self.complete_declined(v);
        } else if let Some(v) = self.recorded.take() {
            // Dropped while its record was being confirmed: the call never ran, but the
            // request was resolved as recorded.
            self.publish(&v);
        }
    }
}
