//! The task engine: validates TaskCalls, runs them synchronously or in the background
//! under a concurrency limit with a queue and a per-task deadline, records every task
//! and its events in the [`crate::store`], cancels, and answers TaskOutput.
//!
//! Admission holds each user to a share of the host (`server.max_tasks_per_user`: tasks
//! queued or running, nested subagents not counted), checked where a task joins this
//! process's tasks and, for the replicas' shared queue, by the store in the transaction
//! that queues it ([`crate::store::QueueLimits`]).
//!
//! Run slots (`server.max_concurrent_tasks`) go to the users with the fewest running tasks
//! first, each user running at most `server.max_running_per_user` ([`schedule`]); a queued
//! task's place and why it waits are [`Engine::queue_place`].
//!
//! Each task has one driver (a spawned future). The plugin call runs inside it; cancel,
//! the deadline and the tool-call limit stop the driver's `select!`, which drops the
//! plugin call (the wasm instance is interrupted at its next await or epoch tick) and
//! declines the task's pending approvals. A running task lives in memory ([`LiveTask`],
//! its events in order) and in the store; a finished one only in the store.
//!
//! `tool_context` secrets go where each entry says ([`crate::tool_context`]: named by the
//! operator's MCP server `env`, exported into the sandbox when the caller chose so and the
//! operator allows the name, or added by the egress proxy): the task's session remembers them ([`crate::redact::registry`]) and every
//! event, output, error and record is scrubbed with the session's redactor before it
//! is kept; streamed `token` / `reasoning` text through a [`StreamScrubber`] per
//! stream, so a secret split over chunks is caught.
//! This module never speaks HTTP; [`crate::server`] presents it.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};

use crate::config::{
    DEFAULT_MAX_CONCURRENT_TASKS, DEFAULT_MAX_QUEUED_TASKS, DEFAULT_MAX_TASKS_PER_USER, DEFAULT_TASK_TIMEOUT,
};
use crate::event::{GateChange, TaskEvent};
use crate::plugin::TaskCall;
use crate::redact::SecretError;
use crate::registry::Registry;
use crate::store::{Store, TaskRecord, Write, now_ms};
use crate::task::{self, TaskError, TaskScope};
use crate::task_state::{FinishReason, TaskState};

mod children;
mod isolated;
mod live;
mod metrics;
mod replica;
mod resume;
mod running;
mod schedule;
mod takeover;
mod tool_schema;

use live::Inner;
pub use live::{APPROVALS_PAST_BUDGET, EventBudget, LiveTask, MAX_APPROVAL_EVENT_INPUT};
pub use metrics::{DURATION_BUCKETS, Metrics};
pub use replica::{CLAIM_POLL, CONTROL_POLL, REMOTE_POLL, ReplicaOptions};
use replica::{QueuedSubmission, RemoteDecision, Replica};
use running::LiveTasks;
pub use schedule::{QueuePlace, WaitReason};
use schedule::{Scheduler, SlotPermit};
pub use tool_schema::{isolation_property, tool_schema};

/// Default TaskOutput wait when `block` is true.
pub const DEFAULT_OUTPUT_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest TaskOutput wait a caller may ask for.
pub const MAX_OUTPUT_TIMEOUT: Duration = Duration::from_secs(600);
/// Capacity of a task's plugin event channel (back-pressure on a flooding plugin).
const EVENT_CHANNEL_CAPACITY: usize = 1024;
/// Time a cancel request waits for the task to wind down before answering.
const CANCEL_WAIT: Duration = Duration::from_secs(10);
/// Time allowed for in-flight events to drain after the plugin call ended.
const DRAIN_WAIT: Duration = Duration::from_secs(2);
/// What a scrubbed secret reads as.
pub use crate::redact::REDACTED;
/// How often finished tasks and plugin state past their retention are purged.
const PURGE_INTERVAL: Duration = Duration::from_secs(3600);

/// Engine settings (from `server:` and `store:`).
#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub max_concurrent_tasks: usize,
    pub max_queued_tasks: usize,
    /// `server.max_tasks_per_user`: a user's tasks queued or running at once (nested
    /// subagents run inside their root's and are not counted).
    pub max_tasks_per_user: usize,
    /// `server.max_running_per_user`: a user's tasks running at once here (nested
    /// subagents not counted).
    pub max_running_per_user: usize,
    pub task_timeout: Duration,
    /// Most tool calls one task may make; `None` = unlimited. A request may lower it.
    pub max_tool_iterations: Option<u32>,
    pub retention: Duration,
    /// Who this server is among replicas on a shared store (PostgreSQL); ignored on the
    /// embedded one. `None` on a shared store: [`ReplicaOptions::default`].
    pub replica: Option<ReplicaOptions>,
    /// `subagents.max_depth`: a task below this depth may start subagents (the `Agent`
    /// tool); 1 = no nesting.
    pub max_subagent_depth: usize,
    /// What one task may store and stream (`server.max_events_per_task`,
    /// `server.max_event_bytes_per_task`).
    pub event_budget: live::EventBudget,
    /// `server.durable_tasks`: tasks are journaled and taken over after their process dies.
    pub durable_tasks: bool,
    /// `server.journal_max_bytes`.
    pub journal_max_bytes: u64,
    /// `plugins.durable`: plugin id → durable.
    pub durable_plugins: BTreeMap<String, bool>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            max_concurrent_tasks: DEFAULT_MAX_CONCURRENT_TASKS,
            max_queued_tasks: DEFAULT_MAX_QUEUED_TASKS,
            max_tasks_per_user: DEFAULT_MAX_TASKS_PER_USER,
            max_running_per_user: crate::config::default_max_running_per_user(DEFAULT_MAX_CONCURRENT_TASKS),
            task_timeout: DEFAULT_TASK_TIMEOUT,
            max_tool_iterations: None,
            retention: crate::store::DEFAULT_RETENTION,
            replica: None,
            max_subagent_depth: crate::config::DEFAULT_SUBAGENT_MAX_DEPTH as usize,
            event_budget: live::EventBudget::default(),
            durable_tasks: true,
            journal_max_bytes: crate::config::DEFAULT_JOURNAL_MAX_BYTES,
            durable_plugins: BTreeMap::new(),
        }
    }
}

impl EngineOptions {
    pub fn from_config(c: &crate::config::Config) -> Self {
        let max_concurrent_tasks = c.server.max_concurrent_tasks.max(1);
        EngineOptions {
            max_concurrent_tasks,
            max_queued_tasks: c.server.max_queued_tasks,
            max_tasks_per_user: c.server.max_tasks_per_user.max(1),
            max_running_per_user: c
                .server
                .max_running_per_user
                .unwrap_or_else(|| crate::config::default_max_running_per_user(max_concurrent_tasks))
                .clamp(1, max_concurrent_tasks),
            task_timeout: c.server.task_timeout,
            max_tool_iterations: c.server.max_tool_iterations,
            retention: c.store.retention,
            replica: Some(ReplicaOptions {
                id: c.server.replica_id.clone().unwrap_or_else(crate::config::default_replica_id),
                lease: c.server.task_lease,
            }),
            max_subagent_depth: c.subagents.max_depth as usize,
            event_budget: live::EventBudget {
                max_events: c.server.max_events_per_task,
                max_bytes: c.server.max_event_bytes_per_task,
            },
            durable_tasks: c.server.durable_tasks,
            journal_max_bytes: c.server.journal_max_bytes,
            durable_plugins: c.plugins.durable.clone(),
        }
    }
}

/// One task to start.
#[derive(Debug, Clone, Default)]
pub struct Submission {
    pub call: TaskCall,
    pub session_id: Option<String>,
    pub user_id: Option<String>,
    /// Who submitted it (the API principal), recorded on the task.
    pub principal: Option<String>,
    /// The task's secrets, each with its delivery ([`crate::tool_context`]).
    pub tool_context: BTreeMap<String, crate::tool_context::Entry>,
    pub max_tool_iterations: Option<u32>,
    /// Another way to ask the person behind this task about its gated calls (e.g. an
    /// MCP client's elicitation), besides the approvals API; first answer wins.
    pub asker: Option<Asker>,
    /// The task's own egress list: its tool calls reach at most these hosts (within the
    /// operator's `sandbox.egress` and the subagent's list; it can only take away).
    pub egress: Option<Vec<String>>,
    /// Run it in a fork of its session (`isolation: "fork"`), whatever its definition says
    /// ([`crate::isolation`]); `None`: as its definition says.
    pub isolation: Option<crate::plugin::Isolation>,
}

/// A per-task [`warden_approval::Decider`] (see [`Submission::asker`]).
#[derive(Clone)]
pub struct Asker(pub Arc<dyn warden_approval::Decider>);

impl std::fmt::Debug for Asker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Asker")
    }
}

/// The user id of API tasks that name none.
pub const DEFAULT_USER: &str = crate::actor::DEFAULT_USER;

/// Why a submission was refused.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum SubmitError {
    #[error(transparent)]
    Invalid(#[from] TaskError),
    #[error("invalid {field}: {message}")]
    InvalidField { field: &'static str, message: String },
    #[error("too many tasks waiting ({0} queued); try again later")]
    QueueFull(usize),
    /// The user has `server.max_tasks_per_user` tasks queued or running already: one user
    /// cannot take every slot and the whole queue from the others.
    #[error(
        "too many tasks of user `{user}`: one user may have {max} queued or running at once \
         (server.max_tasks_per_user); wait for some to finish, or raise the limit"
    )]
    UserTasksFull { user: String, max: usize },
    /// The server is shutting down: it finishes its tasks and takes no new ones.
    #[error("this server is shutting down and takes no new tasks; send it to another replica or retry later")]
    Draining,
    /// `resume` names no task of this user (another user's task reads the same as a
    /// missing one: no oracle, and never another user's transcript).
    #[error("invalid resume: no task {0:?} of this user to continue")]
    UnknownResume(String),
    #[error("invalid tool_context: {0}")]
    Secrets(#[from] SecretError),
    /// A `tool_context` entry cannot be delivered as it asks.
    #[error(transparent)]
    ToolContext(#[from] crate::tool_context::ToolContextError),
    /// The shared queue could not take the task (the database failed).
    #[error("the task could not be queued: {0}")]
    Unavailable(String),
}

/// Session and user ids name sandbox containers and volumes: keep them plain.
pub(crate) fn valid_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// An accepted task.
#[derive(Clone)]
pub struct Submitted {
    /// Its first record (`submitted`).
    pub record: TaskRecord,
    /// Its in-memory side when it runs (or waits for a slot) here; `None` when it went
    /// to the shared queue of the replicas. Always `Some` for a task with `tool_context`
    /// or an asker, and on a server that is alone.
    pub live: Option<Arc<LiveTask>>,
}

/// What a task's driver needs besides its live side.
struct TaskStart {
    call: TaskCall,
    /// `tool_context` secrets by delivery.
    secrets: crate::tool_context::TaskSecrets,
    asker: Option<Arc<dyn warden_approval::Decider>>,
    /// Egress lists narrowing the operator's (the task's; a nested subagent's parent's).
    egress: Vec<Arc<warden_sandbox::EgressNarrowing>>,
    slot: Slot,
    lineage: Lineage,
    /// Its journal when it is durable: a new one, or one to replay (a task taken over).
    journal: Option<crate::journal::JournalStart>,
}

/// How a task gets its run slot (`server.max_concurrent_tasks`).
enum Slot {
    /// Taken already (a slot was free at submission or claim).
    Taken(SlotPermit),
    /// Wait for one: the task is queued.
    Wait,
    /// None: a nested subagent runs within its root task's slot (taking one of its own
    /// could deadlock a full server on the parents waiting for their children).
    Parent,
}

/// Where a task stands in a chain of nested subagents; empty for a task the parent agent
/// submitted.
#[derive(Default)]
struct Lineage {
    chain: Vec<warden_approval::ChainLink>,
    inherited_tools: Vec<Vec<String>>,
    /// The deny rules of the definitions above (their `disallowedTools` patterns).
    inherited_denied_tools: Vec<String>,
}

/// What a cancel request found.
#[derive(Debug)]
pub enum CancelOutcome {
    /// The task was stopped; its final record.
    Canceled(TaskRecord),
    /// It had already finished.
    AlreadyFinished(TaskRecord),
    NotFound,
}

/// The engine. Share it as `Arc<Engine>`.
pub struct Engine {
    registry: Arc<Registry>,
    tools: Arc<crate::tools::ToolHost>,
    store: Store,
    options: EngineOptions,
    /// The run slots, shared fairly among users.
    slots: Arc<Scheduler>,
    live: Mutex<LiveTasks>,
    /// Every task record as it changes (submitted, status, plugin build, finished).
    task_changes: broadcast::Sender<Arc<TaskRecord>>,
    /// Set by [`Engine::drain`]: new submissions are refused.
    draining: std::sync::atomic::AtomicBool,
    /// Notified whenever a task leaves `live` (drain waits on it).
    task_left: tokio::sync::Notify,
    /// Set when the store is shared: this server is one replica of several.
    replica: Option<Arc<Replica>>,
    pub metrics: Metrics,
}

/// How many task record changes a slow follower of [`Engine::task_changes`] may fall
/// behind before it is told to read the list again (`Lagged`, one cheap list read). The
/// channel keeps its last this-many records alive for a follower that stopped reading,
/// and a finished record carries its output (up to the plugin's `max_output`): 256 bounds
/// that while a burst of submissions costs a stalled console one resync.
pub const TASK_CHANGES_BUFFER: usize = 256;

/// The retention sweep, at start and every [`PURGE_INTERVAL`]: finished tasks that ended
/// more than `retention` ago, and plugin state not written within `retention`
/// ([`crate::plugin_state::StateStore::expire`]). A failure is logged; the next sweep
/// tries again.
async fn sweep(store: &Store, state: &crate::services::StateStore, retention: Duration) {
    match store.purge(retention).await {
        Ok(n) if n > 0 => tracing::info!(purged = n, "finished tasks past retention removed"),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "retention purge failed"),
    }
    match state.expire(retention).await {
        Ok(n) if n > 0 => tracing::info!(expired = n, "plugin state not written within retention removed"),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "plugin state expiry failed"),
    }
}

impl Engine {
    /// Opens the engine over `store`: tasks the previous host left running are marked
    /// failed ("host restarted"), finished tasks past retention are purged, and gate
    /// events are routed into task streams. On a shared store the engine joins the other
    /// replicas ([`Engine::join_cluster`]). Needs a Tokio runtime.
    pub async fn start(host: &crate::app::Host, store: Store, options: EngineOptions) -> anyhow::Result<Arc<Engine>> {
        let replica = store.is_shared().then(|| Arc::new(Replica::new(options.replica.clone().unwrap_or_default())));
        // Alone on its store: what the previous run left running is taken over (durable
        // tasks) or ended, once the engine exists.
        let interrupted = match replica {
            None => store.unfinished().await?,
            Some(_) => vec![],
        };
        sweep(&store, &host.services.state, options.retention).await;
        let engine = Arc::new(Engine {
            slots: Scheduler::new(options.max_concurrent_tasks, options.max_running_per_user),
            registry: host.registry.clone(),
            tools: host.tools.clone(),
            store,
            options,
            live: Mutex::new(LiveTasks::default()),
            task_changes: broadcast::channel(TASK_CHANGES_BUFFER).0,
            draining: std::sync::atomic::AtomicBool::new(false),
            task_left: tokio::sync::Notify::new(),
            replica,
            metrics: Metrics::default(),
        });
        {
            let gate = engine.gate();
            // Synchronously: a decision reaches the task's stream before the call's
            // result does (a broadcast subscriber saw a quick decline after the task
            // had ended, and the `approval_resolved` event was lost).
            let weak = Arc::downgrade(&engine);
            gate.observe(Arc::new(move |ev: &warden_approval::GateEvent| {
                if let Some(engine) = weak.upgrade() {
                    engine.on_gate_event(ev.clone());
                }
            }));
        }
        // A replica ends what it ran before a restart and what nobody holds, then claims
        // (after the gate observer: a claimed task's first approval reaches its stream).
        engine.join_cluster().await?;
        if !interrupted.is_empty() {
            let mut ended = vec![];
            for rec in interrupted {
                let id = rec.task_id.clone();
                let message = crate::store::HOST_RESTARTED;
                if !engine
                    .take_over_or_end(rec, "this server's previous run", FinishReason::HostRestarted, message)
                    .await?
                {
                    ended.push(id);
                }
            }
            engine.store.flush().await?;
            if !ended.is_empty() {
                tracing::warn!(count = ended.len(), tasks = ?ended, "tasks interrupted by a restart marked failed");
            }
        }
        {
            let weak = Arc::downgrade(&engine);
            let services = Arc::downgrade(&host.services);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(PURGE_INTERVAL).await;
                    let (Some(engine), Some(services)) = (weak.upgrade(), services.upgrade()) else { return };
                    let store = engine.store.clone();
                    let retention = engine.options.retention;
                    drop(engine);
                    sweep(&store, &services.state, retention).await;
                }
            });
        }
        Ok(engine)
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// This server's replica id when it is one of several on a shared store.
    pub fn replica_id(&self) -> Option<&str> {
        self.replica.as_deref().map(Replica::id)
    }

    /// Every task record change from now on (submitted, status, plugin build, finished),
    /// for live task lists. A receiver that falls [`TASK_CHANGES_BUFFER`] behind gets
    /// `Lagged` and should read the list again.
    pub fn task_changes(&self) -> broadcast::Receiver<Arc<TaskRecord>> {
        self.task_changes.subscribe()
    }

    /// Whether a task of `subagent_type` runs in the background when its caller does not
    /// say (`run_in_background` absent): the definition's default (`background: true` in
    /// an agent file), otherwise no. An unknown subagent is refused later, by `submit`.
    pub fn background_by_default(&self, subagent_type: &str) -> bool {
        self.registry.snapshot().definitions.get(subagent_type).is_some_and(|r| r.background)
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// The approval gate every tool call passes.
    pub fn gate(&self) -> &warden_approval::ApprovalGate {
        self.tools.gate()
    }

    /// The tool host (sandbox and MCP tools) the engine's tasks call.
    pub fn tools(&self) -> &Arc<crate::tools::ToolHost> {
        &self.tools
    }

    /// Tasks running now (not queued).
    /// Stops taking new tasks (they are refused with [`SubmitError::Draining`]) and waits
    /// up to `timeout` for the queued and running ones to finish; returns how many were
    /// still unfinished then. Everything else (events, approvals, cancel) keeps working,
    /// so a task waiting for an approval can still get it.
    pub async fn drain(&self, timeout: Duration) -> usize {
        self.draining.store(true, Ordering::SeqCst);
        // With replicas, durable tasks move to another replica now instead of holding
        // this one until they finish (or fail at the timeout).
        self.hand_over().await;
        let until = tokio::time::Instant::now() + timeout;
        loop {
            let left = self.task_left.notified();
            tokio::pin!(left);
            left.as_mut().enable();
            let unfinished = self.live.lock().unwrap().len();
            if unfinished == 0 {
                return 0;
            }
            if tokio::time::timeout_at(until, left).await.is_err() {
                return self.live.lock().unwrap().len();
            }
        }
    }

    /// Whether [`Engine::drain`] has begun.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Tasks queued or running here.
    pub fn unfinished(&self) -> usize {
        self.live.lock().unwrap().len()
    }

    pub fn running(&self) -> usize {
        self.metrics.running.load(Ordering::Relaxed) as usize
    }

    fn on_gate_event(self: &Arc<Self>, ev: warden_approval::GateEvent) {
        use warden_approval::GateEvent;
        let (task_id, change) = match &ev {
            GateEvent::Requested(p) => (p.task_id.clone(), GateChange::Requested),
            GateEvent::Resolved { task_id, .. } => (task_id.clone(), GateChange::Resolved),
            GateEvent::Heartbeat { .. } => return,
        };
        if let Some(replica) = &self.replica {
            // Every replica lists and decides the requests waiting here: published scrubbed
            // of the task's session secrets, which only this replica knows.
            match &ev {
                GateEvent::Requested(p) => {
                    let live = p.task_id.as_deref().and_then(|id| self.live_task(id));
                    let mut pending = serde_json::to_value(p).unwrap_or(Value::Null);
                    match live {
                        Some(live) => live.redactor().scrub_value(&mut pending),
                        None => crate::redact::registry().host().scrub_value(&mut pending),
                    }
                    self.store.write(Write::ApprovalPublished {
                        request_id: p.id.clone(),
                        task_id: p.task_id.clone(),
                        owner: replica.id().to_owned(),
                        pending,
                    })
                }
                GateEvent::Resolved { request_id, .. } => {
                    self.store.write(Write::ApprovalWithdrawn { request_id: request_id.clone() })
                }
                GateEvent::Heartbeat { .. } => {}
            }
        }
        if let GateEvent::Requested(p) = &ev {
            // Counted for the asking task and every task above it in its chain.
            let chain = p.task_id.iter().map(String::as_str).chain(p.chain.iter().map(|l| l.task_id.as_str()));
            for id in chain {
                if let Some(t) = self.live_task(id) {
                    t.questions.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        if let GateEvent::Requested(p) = &ev {
            self.pause_if_all_wait(p);
        }
        let Some(live) = task_id.and_then(|id| self.live_task(&id)) else { return };
        let Ok(mut value) = serde_json::to_value(&ev) else { return };
        if change == GateChange::Requested {
            // The request names whose task asks: its user and the principal that started it.
            let rec = live.record();
            value["user_id"] = Value::String(rec.user_id);
            if let Some(p) = rec.principal {
                value["principal"] = Value::String(p);
            }
        }
        let sink = live.inner.lock().unwrap().sink.clone();
        match sink {
            Some(sink) => {
                if let Err(e) = sink.try_send(TaskEvent::Gate { change, data: value }) {
                    // Channel full or closed: record it directly rather than lose it.
                    if let TaskEvent::Gate { data, .. } = e.into_inner() {
                        live.gate_event(data, change);
                    }
                }
            }
            None => live.gate_event(value, change),
        }
    }

    /// `sandbox.pause_when_waiting`: when the request `p` leaves every task of its task's
    /// session waiting for a person, the session's container is paused once they all still
    /// wait `pause_when_waiting` later, rather than after `pause_after` — an approval may
    /// take hours. The approved call starts it again. Not with replicas (the sandbox
    /// refuses pauses there) nor when the sandbox does not pause idle sessions.
    fn pause_if_all_wait(self: &Arc<Self>, p: &warden_approval::PendingApproval) {
        let (Some(task_id), None, Ok(sandbox)) = (p.task_id.as_deref(), &self.replica, self.tools.sandbox()) else {
            return;
        };
        let config = sandbox.config();
        if !config.pauses_idle_sessions() || config.pause_when_waiting >= config.pause_after {
            return;
        }
        let Some(session) = self.live_task(task_id).map(|t| t.session.clone()) else { return };
        let asking: Vec<&str> = std::iter::once(task_id).chain(p.chain.iter().map(|l| l.task_id.as_str())).collect();
        if !self.live.lock().unwrap().all_wait_for_people(&session, &asking) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (engine, sandbox, grace) = (Arc::downgrade(self), sandbox.clone(), config.pause_when_waiting);
        runtime.spawn(async move {
            tokio::time::sleep(grace).await;
            // Still all waiting (the requests' counts have caught up by now)?
            let Some(engine) = engine.upgrade() else { return };
            if !engine.live.lock().unwrap().all_wait_for_people(&session, &[]) {
                return;
            }
            drop(engine);
            let paused = sandbox.pause_idle_session(&session.0, &session.1).await;
            if paused > 0 {
                tracing::info!(user = %session.0, session = %session.1, "session paused: every task of it waits for a person");
            }
        });
    }

    fn live_task(&self, id: &str) -> Option<Arc<LiveTask>> {
        self.live.lock().unwrap().get(id).cloned()
    }

    /// Checks a submission without starting it; the task's egress list comes back
    /// validated. A task that resumes another gets that task's session
    /// ([`Engine::resumed_session`]).
    pub async fn validate(
        &self,
        sub: &mut Submission,
    ) -> Result<Option<Arc<warden_sandbox::EgressNarrowing>>, SubmitError> {
        let call = &sub.call;
        for (field, value) in
            [("subagent_type", &call.subagent_type), ("description", &call.description), ("prompt", &call.prompt)]
        {
            if value.trim().is_empty() {
                return Err(TaskError::MissingField(field).into());
            }
        }
        let snapshot = self.registry.snapshot();
        task::resolve(&snapshot, call)?;
        for (field, v) in [("session_id", &sub.session_id), ("user_id", &sub.user_id)] {
            if let Some(v) = v
                && !valid_id(v)
            {
                return Err(SubmitError::InvalidField {
                    field,
                    message: "expected 1-128 characters of [A-Za-z0-9_.-]".into(),
                });
            }
        }
        if let Some(session) = self.resumed_session(sub).await? {
            sub.session_id = Some(session);
        }
        if sub.isolation.is_some()
            && let Err(e) = self.tools.sandbox()
        {
            return Err(SubmitError::InvalidField {
                field: "isolation",
                message: format!("a task runs in a fork of its session only on a host with a sandbox: {e}"),
            });
        }
        self.task_secrets(sub)?;
        crate::redact::SecretRegistry::check(sub.tool_context.values().map(|e| e.value.as_str()))?;
        sub.egress
            .as_deref()
            .map(|list| warden_sandbox::EgressNarrowing::parse(list, "the task (egress)").map(Arc::new))
            .transpose()
            .map_err(|message| SubmitError::InvalidField { field: "egress", message })
    }

    /// Validates and starts a task; it runs in the background whatever the caller does
    /// next (a sync caller waits with [`Engine::wait_finished`]). Returns its first record.
    ///
    /// Where it runs: here, at once, when a slot is free; here, later, when it is bound
    /// to this process (its `tool_context` secrets and its asker live only in this
    /// process's memory) or when this server is alone; otherwise (a replica with no free
    /// slot) in the shared queue, for whichever replica frees a slot first.
    pub async fn submit(self: &Arc<Self>, mut sub: Submission) -> Result<Submitted, SubmitError> {
        let egress = match self.validate(&mut sub).await {
            Ok(egress) => egress,
            Err(e) => {
                self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        };
        // Checked by `validate`; made here, before anything of the task exists.
        let task_secrets = match self.task_secrets(&sub) {
            Ok(secrets) => secrets,
            Err(e) => {
                self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        };
        if self.is_draining() {
            self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(SubmitError::Draining);
        }
        // Before anything of the task is kept (its secrets, its claim); checked again where
        // it joins the tasks of this process, and by the store for the shared queue.
        let user = sub.user_id.clone().unwrap_or_else(|| DEFAULT_USER.into());
        if let Err(e) = self.user_share(&self.live.lock().unwrap(), &user) {
            self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(e);
        }
        let permit = match &self.replica {
            Some(_) => self.slots.try_acquire(&user),
            None => None,
        };
        // Secrets live only in this process: a task that carries some, or whose session
        // was given some, runs here (another replica could not scrub them), as does one
        // whose caller answers its approvals on this connection.
        let session_has_secrets = match (&sub.user_id, &sub.session_id) {
            (user, Some(session)) => {
                crate::redact::registry().has_session_secrets(user.as_deref().unwrap_or(DEFAULT_USER), session)
            }
            _ => false,
        };
        // So is a task that runs in a fork: the fork is made of a session this process holds.
        let isolation = self.isolation_of(&sub.call, sub.isolation);
        if isolation.is_some() && self.replica.is_some() {
            // Refused before anything is made of it (no fork id, no shared redactor).
            return Err(SubmitError::InvalidField {
                field: "isolation",
                message: format!(
                    "subagent `{}` runs in a fork of its session, which is not available with replicas \
                     (`--replica-id`): sessions cannot be forked there",
                    crate::text::escape_control(&sub.call.subagent_type)
                ),
            });
        }
        let bound_here =
            !sub.tool_context.is_empty() || sub.asker.is_some() || session_has_secrets || isolation.is_some();
        let to_shared_queue = self.replica.is_some() && permit.is_none() && !bound_here;
        if !to_shared_queue
            && permit.is_none()
            && self.metrics.queued.load(Ordering::Relaxed) as usize >= self.options.max_queued_tasks
            && !self.slots.has_room_for(&user)
        {
            self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(SubmitError::QueueFull(self.options.max_queued_tasks));
        }
        let task_id = task::new_task_id();
        let now = now_ms();
        let session = sub.session_id.clone().unwrap_or_else(|| format!("sess_{}", uuid::Uuid::new_v4()));
        // An isolated task's session is its fork, named now (and made when it starts).
        let isolated = isolation.map(|_| Engine::admit_isolated(&user, session.clone()));
        let mut record = TaskRecord::submitted(
            task_id.clone(),
            &sub.call,
            isolated.as_ref().map_or(session, |i| i.session_id.clone()),
            sub.user_id.clone().unwrap_or_else(|| DEFAULT_USER.into()),
            sub.principal.clone(),
            now,
        );
        record.isolation = isolated;
        // The session remembers the task's secrets before anything of the task is kept.
        let values: Vec<&str> = sub.tool_context.values().map(|e| e.value.as_str()).collect();
        if let Err(e) = crate::redact::registry().remember(&record.user_id, &record.session_id, &values) {
            self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(e.into());
        }
        let redactor = crate::redact::registry().session(&record.user_id, &record.session_id);
        record.description = redactor.scrub(&record.description).into_owned();
        if to_shared_queue {
            return self.enqueue(record, sub).await;
        }
        // Held before the record exists: no moment where it is unfinished and unheld.
        self.hold_here(&mut record);
        let live = self.new_live(record.clone(), self.tool_budget(sub.max_tool_iterations), vec![]);
        {
            // Checked again under the lock `drain` counts under: a submission racing the
            // start of a drain is either counted by it or refused, never left unwaited.
            // So is the user's share: concurrent submissions of one user cannot all pass.
            let mut running = self.live.lock().unwrap();
            let refused =
                if self.is_draining() { Err(SubmitError::Draining) } else { self.user_share(&running, &user) };
            if let Err(e) = refused {
                self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
                if self.replica.is_some() {
                    self.store.write(Write::Release { task_id: task_id.clone() });
                }
                return Err(e);
            }
            running.insert(task_id.clone(), live.clone());
        }
        live.save_record(record.clone());
        live.push(json!({ "type": "status", "status": TaskState::Submitted, "task_id": task_id }));
        self.metrics.submitted.fetch_add(1, Ordering::Relaxed);
        tracing::info!(task_id = %task_id, subagent = %sub.call.subagent_type, background = sub.call.run_in_background, "task submitted");
        // A task bound to this process cannot be run anywhere else, nor after a restart.
        let journal = (self.options.durable_tasks && !bound_here).then(|| crate::journal::JournalStart::Fresh {
            max_tool_iterations: sub.max_tool_iterations,
            egress: sub.egress.clone(),
        });
        let start = TaskStart {
            call: sub.call,
            secrets: task_secrets,
            asker: sub.asker.map(|a| a.0),
            egress: egress.into_iter().collect(),
            slot: permit.map_or(Slot::Wait, Slot::Taken),
            lineage: Lineage::default(),
            journal,
        };
        self.launch(live.clone(), start);
        Ok(Submitted { record, live: Some(live) })
    }

    /// The deliveries of `sub`'s `tool_context` ([`crate::tool_context::TaskSecrets::of`]):
    /// against the operator's `sandbox.task_env` and `sandbox.egress`.
    fn task_secrets(&self, sub: &Submission) -> Result<crate::tool_context::TaskSecrets, SubmitError> {
        let sandbox = self.tools.sandbox().ok();
        let task_env = sandbox.map(|s| s.config().task_env.as_slice()).unwrap_or_default();
        let egress = sandbox.and_then(|s| s.egress_policy());
        Ok(crate::tool_context::TaskSecrets::of(&sub.tool_context, task_env, egress)?)
    }

    /// Whether `user` may have one more task here (`server.max_tasks_per_user`), given
    /// `tasks`, the tasks this process runs or queues.
    fn user_share(&self, tasks: &LiveTasks, user: &str) -> Result<(), SubmitError> {
        let max = self.options.max_tasks_per_user;
        if tasks.of_user(user) >= max {
            tracing::debug!(user, max, "task refused: the user has server.max_tasks_per_user tasks queued or running");
            return Err(SubmitError::UserTasksFull { user: user.to_owned(), max });
        }
        Ok(())
    }

    /// A task's tool-call budget: the submission's cap lowered to the server's
    /// (`max_tool_iterations`); `None` = unlimited.
    fn tool_budget(&self, max_tool_iterations: Option<u32>) -> Option<Arc<crate::tools::ToolBudget>> {
        let max_tool_calls = match (max_tool_iterations, self.options.max_tool_iterations) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        max_tool_calls.map(|n| Arc::new(crate::tools::ToolBudget::new(n)))
    }

    /// The in-memory side of a task that starts running here: `events` are the ones it
    /// already has (a task claimed from the shared queue), `tool_budget` what its tool
    /// calls count against ([`Engine::tool_budget`], or the root's for a nested subagent).
    fn new_live(
        &self,
        record: TaskRecord,
        tool_budget: Option<Arc<crate::tools::ToolBudget>>,
        events: Vec<Value>,
    ) -> Arc<LiveTask> {
        let stored = live::EventsStored::of(&events);
        Arc::new(LiveTask {
            session: (record.user_id.clone(), record.session_id.clone()),
            counts_for_user: record.parent_task_id.is_none(),
            inner: Mutex::new(Inner { record, events, stored, pending_approvals: 0, sink: None, closed: false }),
            event_budget: self.options.event_budget,
            version: watch::channel(0).0,
            canceled: watch::channel(false).0,
            streams: Mutex::new(BTreeMap::new()),
            tool_budget,
            store: self.store.clone(),
            changes: self.task_changes.clone(),
            finishing: std::sync::atomic::AtomicBool::new(false),
            questions: std::sync::atomic::AtomicU64::new(0),
            driver: Mutex::new(None),
            relinquished: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Starts `live`'s driver and its supervisor.
    /// Everything the task runs is in its [`crate::logging::task_span`], so its log lines
    /// are scrubbed with its session's secrets and no other tenant's.
    fn launch(self: &Arc<Self>, live: Arc<LiveTask>, start: TaskStart) {
        use tracing::Instrument;
        self.metrics.queued.fetch_add(1, Ordering::Relaxed);
        let engine = self.clone();
        let driver_live = live.clone();
        let span = crate::logging::task_span(&live.session.0, &live.session.1, &live.id());
        let driver = tokio::spawn(async move { engine.drive(driver_live, start).await }.instrument(span.clone()));
        self.supervise(live, driver, span);
    }

    /// Puts a task in the shared queue (a replica with no free slot).
    async fn enqueue(&self, record: TaskRecord, sub: Submission) -> Result<Submitted, SubmitError> {
        let first = json!({ "type": "status", "status": TaskState::Submitted, "task_id": record.task_id });
        let queued =
            QueuedSubmission { call: sub.call, max_tool_iterations: sub.max_tool_iterations, egress: sub.egress };
        let submission = serde_json::to_value(&queued).expect("a submission always serialises");
        let limits = crate::store::QueueLimits {
            max_queued: self.options.max_queued_tasks,
            max_per_user: self.options.max_tasks_per_user,
        };
        match self.store.enqueue(&record, &first, &submission, limits).await {
            Ok(crate::store::Enqueued::Queued) => {
                self.metrics.submitted.fetch_add(1, Ordering::Relaxed);
                tracing::info!(task_id = %record.task_id, subagent = %record.subagent_type, "task queued for the replicas");
                if let Some(change) = live::shared_if_followed(&self.task_changes, &record) {
                    let _ = self.task_changes.send(change);
                }
                Ok(Submitted { record, live: None })
            }
            Ok(crate::store::Enqueued::QueueFull) => {
                self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
                Err(SubmitError::QueueFull(self.options.max_queued_tasks))
            }
            Ok(crate::store::Enqueued::UserFull) => {
                self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
                Err(SubmitError::UserTasksFull { user: record.user_id, max: self.options.max_tasks_per_user })
            }
            Err(e) => {
                self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, "queueing a task failed");
                Err(SubmitError::Unavailable(e.to_string()))
            }
        }
    }

    /// Runs a task this replica took from the shared queue (with `permit` when a slot was
    /// free at once). A claim that cannot run (its submission no longer valid here) ends
    /// `failed` with the reason.
    async fn start_claimed(self: &Arc<Self>, claimed: crate::store::Claimed, permit: Option<SlotPermit>) {
        let Some(replica) = &self.replica else { return };
        let mut record = claimed.record;
        let task_id = record.task_id.clone();
        let queued = serde_json::from_value::<QueuedSubmission>(claimed.submission).map_err(|e| e.to_string());
        let egress = queued.as_ref().map_err(Clone::clone).and_then(|q| {
            q.egress
                .as_deref()
                .map(|list| warden_sandbox::EgressNarrowing::parse(list, "the task (egress)").map(Arc::new))
                .transpose()
        });
        let events = self.store.events_after(&task_id, 0).await;
        let (queued, egress, events) = match (queued, egress, events) {
            (Ok(q), Ok(e), Ok(ev)) => (q, e, ev),
            (q, e, ev) => {
                let why = [q.err(), e.err(), ev.err().map(|e| e.to_string())].into_iter().flatten().collect::<Vec<_>>();
                let message = format!("the queued task cannot run: {}", why.join("; "));
                tracing::error!(task_id = %task_id, %message);
                let _ = self.store.end_unrun(record, TaskState::Failed, FinishReason::Error, &message).await;
                return;
            }
        };
        record.replica = Some(replica.id().to_owned());
        record.updated_at_ms = now_ms();
        let events = events.into_iter().map(|(_, e)| e).collect();
        let live = self.new_live(record.clone(), self.tool_budget(queued.max_tool_iterations), events);
        {
            let mut running = self.live.lock().unwrap();
            if self.is_draining() {
                // Claimed as the drain began: back to the queue for another replica.
                drop(running);
                if let Err(e) = self.store.requeue(replica.id(), &task_id).await {
                    tracing::warn!(task_id = %task_id, error = %e, "could not hand a claimed task back; its lease lapses");
                }
                return;
            }
            running.insert(task_id.clone(), live.clone());
        }
        live.save_record(record);
        tracing::info!(task_id = %task_id, replica = %replica.id(), "claimed a queued task");
        let journal = self.options.durable_tasks.then(|| crate::journal::JournalStart::Fresh {
            max_tool_iterations: queued.max_tool_iterations,
            egress: queued.egress.clone(),
        });
        let start = TaskStart {
            call: queued.call,
            secrets: Default::default(),
            asker: None,
            egress: egress.into_iter().collect(),
            slot: permit.map_or(Slot::Wait, Slot::Taken),
            lineage: Lineage::default(),
            journal,
        };
        self.launch(live, start);
    }

    /// Watches a task's driver: if it dies before finishing the task (a panic anywhere
    /// in it, or an abort by [`Engine::cancel`]), the task still ends — `failed` with the
    /// reason, or `canceled` — instead of staying `working` forever.
    fn supervise(self: &Arc<Self>, live: Arc<LiveTask>, driver: tokio::task::JoinHandle<()>, span: tracing::Span) {
        use tracing::Instrument;
        *live.driver.lock().unwrap() = Some(driver.abort_handle());
        let engine = self.clone();
        tokio::spawn(
            async move {
                let Err(e) = driver.await else { return };
                // Ended, or run by another process now ([`Engine::relinquish`]).
                if live.record().is_finished() || live.relinquished.load(Ordering::SeqCst) {
                    return;
                }
                let finish = if e.is_panic() {
                    let message = crate::runtime::panic_message(&*e.into_panic());
                    tracing::error!(task_id = %live.id(), %message, "task driver panicked");
                    Finish::failed(FinishReason::Error, format!("host fault: {message}"))
                } else {
                    Finish::canceled()
                };
                {
                    let mut inner = live.inner.lock().unwrap();
                    inner.sink = None;
                    inner.closed = true;
                }
                engine.gate().cancel_task(&live.id());
                // The dead driver may have begun finishing; nobody else will complete it.
                live.finishing.store(false, Ordering::SeqCst);
                engine.finish(&live, finish, Duration::ZERO).await;
            }
            .instrument(span),
        );
    }

    async fn drive(self: Arc<Self>, live: Arc<LiveTask>, start: TaskStart) {
        let TaskStart { call, secrets, asker, egress, slot, lineage, journal } = start;
        // A task taken over keeps the deadline it started with.
        let spent = match &journal {
            Some(crate::journal::JournalStart::Replay(r)) => Duration::from_millis(
                now_ms().saturating_sub(r.header.as_ref().map_or_else(now_ms, |h| h.started_at_ms)),
            ),
            _ => Duration::ZERO,
        };
        let journal = journal.map(|start| crate::journal::JournalPlan {
            store: self.store.clone(),
            max_bytes: self.options.journal_max_bytes,
            plugins: self.options.durable_plugins.clone(),
            start,
        });
        let record = live.record();
        let task_id = record.task_id.clone();
        let permit = match slot {
            Slot::Taken(p) => Some(Some(p)),
            Slot::Parent => Some(None),
            Slot::Wait => tokio::select! {
                p = self.slots.acquire(&record.user_id, &task_id) => p.map(Some),
                _ = live.canceled() => None,
            },
        };
        self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
        let Some(permit) = permit else {
            self.finish(&live, Finish::canceled(), Duration::ZERO).await;
            return;
        };
        self.metrics.running.fetch_add(1, Ordering::Relaxed);
        live.set_status(TaskState::Working);
        let started = Instant::now();
        let fork = match self.make_fork(&live, &call).await {
            Ok(fork) => fork,
            Err(e) => {
                self.metrics.running.fetch_sub(1, Ordering::Relaxed);
                drop(permit);
                let finish =
                    if *live.canceled.borrow() { Finish::canceled() } else { Finish::failed(FinishReason::Error, e) };
                self.finish(&live, finish, started.elapsed()).await;
                return;
            }
        };

        let cancel = crate::plugin::CancelSignal::new();
        let (tx, mut rx) = tokio::sync::mpsc::channel::<TaskEvent>(EVENT_CHANNEL_CAPACITY);
        let pump_live = live.clone();
        let pump = tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                pump_live.task_event(ev);
            }
        });
        live.inner.lock().unwrap().sink = Some(tx.clone());
        let budget = live.tool_budget.clone();
        let scope = TaskScope {
            session_id: record.session_id.clone(),
            user_id: record.user_id.clone(),
            events: Some(tx),
            tool_env: secrets.env,
            tool_secrets: secrets.named,
            egress_credentials: secrets.inject,
            decider: asker,
            tool_budget: budget.clone(),
            egress,
            cancel: Some(cancel.clone()),
            subagents: children::starter(&self, lineage.chain.len() + 1),
            chain: lineage.chain,
            inherited_tools: lineage.inherited_tools,
            inherited_denied_tools: lineage.inherited_denied_tools,
            ..TaskScope::default()
        };
        let registry = self.registry.clone();
        // Boxed so it can be dropped right after the `select!`: a call that did not finish
        // (deadline, tool limit, cancel past its grace) must not keep its instance, its
        // sockets and its event sender until the task is recorded.
        let mut run = Box::pin(task::run_durable(&registry, task_id.clone(), &call, scope, journal));
        let tool_limit = async {
            match &budget {
                Some(b) => b.exhausted().await,
                None => std::future::pending().await,
            }
        };
        let finish = tokio::select! {
            r = &mut run => match r {
                // The tools path refused a call over the budget: however the plugin
                // ended after that, the task ends on its tool limit.
                Ok(_) if budget.as_ref().is_some_and(|b| b.exceeded()) => Finish::tool_limit(budget.as_deref()),
                Ok(o) => match o.status {
                    TaskState::InputRequired => Finish { status: TaskState::InputRequired, reason: FinishReason::InputRequired, output: o.output, error: None },
                    TaskState::Canceled => Finish::canceled(),
                    TaskState::Failed => Finish { status: TaskState::Failed, reason: FinishReason::Error, output: None, error: o.error },
                    _ => Finish { status: TaskState::Completed, reason: FinishReason::Stop, output: o.output, error: None },
                },
                Err(e) => Finish::failed(FinishReason::Error, e.to_string()),
            },
            _ = tokio::time::sleep(self.options.task_timeout.saturating_sub(spent)) => Finish::failed(
                FinishReason::Deadline,
                format!("task deadline of {} exceeded", humantime::format_duration(self.options.task_timeout)),
            ),
            _ = live.canceled() => {
                // The plugin sees the cancellation and may clean up (cancel a remote
                // task) within the runtime's grace period, which ends the call.
                cancel.cancel();
                let _ = tokio::time::timeout(crate::runtime::CANCEL_GRACE + DRAIN_WAIT, &mut run).await;
                Finish::canceled()
            }
            // The tool host refused a call over the budget: the task ends now, not when
            // the plugin next returns.
            _ = tool_limit => Finish::tool_limit(budget.as_deref()),
        };
        drop(run);
        // The plugin call is gone (dropped if it did not finish); nothing may wait on a person for it.
        self.gate().cancel_task(&task_id);
        {
            let mut inner = live.inner.lock().unwrap();
            inner.sink = None;
            inner.closed = true;
        }
        if tokio::time::timeout(DRAIN_WAIT, pump).await.is_err() {
            tracing::warn!(task_id = %task_id, "task events still in flight after the call ended; dropped");
        }
        let finish = self.finish_isolated(&live, fork, finish).await;
        self.metrics.running.fetch_sub(1, Ordering::Relaxed);
        drop(permit);
        self.finish(&live, finish, started.elapsed()).await;
    }

    async fn finish(&self, live: &Arc<LiveTask>, f: Finish, took: Duration) {
        if live.finishing.swap(true, Ordering::SeqCst) {
            return;
        }
        live.inner.lock().unwrap().closed = true;
        live.flush_streams();
        let output = f.output.map(|o| live.scrub(&o));
        let error = f.error.map(|e| live.scrub(&e));
        if let Some(e) = &error {
            live.push(json!({ "type": "error", "message": e }));
        }
        let mut fin = json!({ "type": "finish", "status": f.status, "reason": f.reason });
        if let Some(o) = &output {
            fin["output"] = Value::String(o.clone());
        }
        if let Some(e) = &error {
            fin["error"] = Value::String(e.clone());
        }
        if let Some(isolated) = &live.record().isolation {
            fin["isolation"] = serde_json::to_value(isolated).unwrap_or(Value::Null);
        }
        live.push(fin);
        // The record changes in memory only once it is durable: whoever sees a finished
        // task can rely on the store having it.
        let now = now_ms();
        let mut rec = live.record();
        rec.status = f.status;
        rec.output = output;
        rec.error = error;
        rec.finish_reason = Some(f.reason);
        rec.updated_at_ms = now;
        rec.finished_at_ms = Some(now);
        self.store.write(Write::Task(rec.clone()));
        if self.replica.is_some() {
            self.store.write(Write::Release { task_id: rec.task_id.clone() });
        }
        if let Err(e) = self.store.flush().await {
            tracing::error!(task_id = %rec.task_id, error = %e, "task result not persisted");
        }
        if self.replica.is_some() {
            // A finished record is final: if another replica ended the task first (this
            // one stalled past its lease), that end is the task's, not this one.
            if let Ok(Some(stored)) = self.store.task(&rec.task_id).await
                && stored.is_finished()
                && stored != rec
            {
                tracing::warn!(task_id = %rec.task_id, status = %stored.status, "task was ended by another replica meanwhile");
                rec = stored;
            }
        }
        if let Some(change) = live::shared_if_followed(&self.task_changes, &rec) {
            let _ = self.task_changes.send(change);
        }
        let counter = match f.status {
            TaskState::Completed => &self.metrics.completed,
            TaskState::Canceled => &self.metrics.canceled,
            TaskState::InputRequired => &self.metrics.input_required,
            _ => &self.metrics.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if !took.is_zero() {
            self.metrics.observe(took);
        }
        tracing::info!(task_id = %rec.task_id, status = %rec.status, reason = ?rec.finish_reason, "task finished");
        live.inner.lock().unwrap().record = rec.clone();
        self.live.lock().unwrap().remove(&rec.task_id);
        self.task_left.notify_waiters();
        live.bump();
        if let Some(replica) = &self.replica {
            // A slot is free: take a queued task now rather than at the next poll.
            replica.wake.notify_one();
        }
    }

    /// The task's live handle if it is running or queued.
    pub fn live(&self, id: &str) -> Option<Arc<LiveTask>> {
        self.live_task(id)
    }

    /// Where a queued (`submitted`) task stands and why it waits: in this process's queue
    /// ([`schedule`]), or in the replicas' shared queue. `None` once it runs or ended (or
    /// when its place cannot be read).
    pub async fn queue_place(&self, rec: &TaskRecord) -> Option<QueuePlace> {
        if rec.status != TaskState::Submitted {
            return None;
        }
        if self.live_task(&rec.task_id).is_some() {
            return self.slots.place(&rec.user_id, &rec.task_id);
        }
        self.replica.as_ref()?;
        let max_running = self.options.max_running_per_user;
        match self.store.queue_position(&rec.task_id).await {
            Ok(position) => position.map(|position| QueuePlace {
                position,
                reason: WaitReason::SharedQueue,
                message: format!(
                    "in the replicas' shared queue: the first replica with a free slot takes it (slots go to the \
                     users with the fewest running tasks first; a replica runs at most {max_running} of one user's \
                     tasks: server.max_running_per_user)"
                ),
            }),
            Err(e) => {
                tracing::warn!(task_id = %rec.task_id, error = %e, "reading a task's place in the shared queue failed");
                None
            }
        }
    }

    /// The task's record, live or stored.
    pub async fn get(&self, id: &str) -> Result<Option<TaskRecord>, crate::store::StoreError> {
        if let Some(l) = self.live_task(id) {
            return Ok(Some(l.record()));
        }
        self.store.task(id).await
    }

    /// TaskOutput: the record, after waiting up to `timeout` for the task to finish
    /// when `block` (the timeout is capped at [`MAX_OUTPUT_TIMEOUT`]).
    pub async fn output(
        &self,
        id: &str,
        block: bool,
        timeout: Duration,
    ) -> Result<Option<TaskRecord>, crate::store::StoreError> {
        if block {
            return self.wait_finished(id, timeout.min(MAX_OUTPUT_TIMEOUT)).await;
        }
        self.get(id).await
    }

    /// The task's record once it finished, or as it is when `timeout` passes; wherever it
    /// runs (a task on another replica is re-read every [`REMOTE_POLL`]).
    pub async fn wait_finished(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<Option<TaskRecord>, crate::store::StoreError> {
        let until = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(l) = self.live_task(id) {
                return Ok(Some(l.wait_finished(until.saturating_duration_since(tokio::time::Instant::now())).await));
            }
            let rec = self.store.task(id).await?;
            match rec {
                Some(r) if !r.is_finished() && self.replica.is_some() && tokio::time::Instant::now() < until => {
                    tokio::time::sleep_until(until.min(tokio::time::Instant::now() + REMOTE_POLL)).await;
                }
                other => return Ok(other),
            }
        }
    }

    /// Cancels a task: its plugin call is dropped (interrupted), its pending approvals
    /// are declined, and it ends `canceled`.
    pub async fn cancel(&self, id: &str) -> Result<CancelOutcome, crate::store::StoreError> {
        let Some(live) = self.live_task(id) else {
            if self.replica.is_some() {
                return self.cancel_elsewhere(id).await;
            }
            return Ok(match self.store.task(id).await? {
                Some(r) => CancelOutcome::AlreadyFinished(r),
                None => CancelOutcome::NotFound,
            });
        };
        live.request_cancel();
        self.gate().cancel_task(id);
        let mut rec = live.wait_finished(CANCEL_WAIT).await;
        if !rec.is_finished() {
            // The driver did not wind down (stuck outside an await point the stop reaches):
            // abort it; its supervisor ends the task `canceled`.
            tracing::warn!(task_id = %id, "task did not stop within the cancel wait; aborting its driver");
            if let Some(driver) = live.driver.lock().unwrap().as_ref() {
                driver.abort();
            }
            rec = live.wait_finished(CANCEL_WAIT).await;
        }
        Ok(if rec.status == TaskState::Canceled {
            CancelOutcome::Canceled(rec)
        } else {
            CancelOutcome::AlreadyFinished(rec)
        })
    }
}

impl Engine {
    /// Cancels a task this replica does not run: one still in the shared queue ends here
    /// without running; one another replica runs is canceled by that replica (through
    /// the store), and this waits for its end like a local cancel does.
    async fn cancel_elsewhere(&self, id: &str) -> Result<CancelOutcome, crate::store::StoreError> {
        let Some(replica) = &self.replica else { return Ok(CancelOutcome::NotFound) };
        if let Some(rec) = self.store.take_unclaimed(replica.id(), id, replica.lease_until()).await? {
            let rec = self.store.end_unrun(rec, TaskState::Canceled, FinishReason::Canceled, "canceled").await?;
            self.store.flush().await?;
            self.metrics.canceled.fetch_add(1, Ordering::Relaxed);
            return Ok(if rec.status == TaskState::Canceled {
                CancelOutcome::Canceled(rec)
            } else {
                CancelOutcome::AlreadyFinished(rec)
            });
        }
        if self.store.request_cancel(id).await? {
            // The holding replica sees it within CONTROL_POLL, then winds the task down
            // as a local cancel does (up to two CANCEL_WAITs).
            let rec = self.wait_finished(id, CANCEL_WAIT * 2 + CONTROL_POLL).await?;
            return Ok(match rec {
                Some(r) if r.status == TaskState::Canceled => CancelOutcome::Canceled(r),
                Some(r) => CancelOutcome::AlreadyFinished(r),
                None => CancelOutcome::NotFound,
            });
        }
        Ok(match self.store.task(id).await? {
            Some(r) => CancelOutcome::AlreadyFinished(r),
            None => CancelOutcome::NotFound,
        })
    }

    /// Approval requests waiting on other replicas (none when this server is alone).
    pub async fn remote_approvals(&self) -> Vec<warden_approval::PendingApproval> {
        let Some(replica) = &self.replica else { return vec![] };
        match self.store.remote_approvals(replica.id()).await {
            Ok(list) => list.into_iter().map(|r| r.pending).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "listing other replicas' approval requests failed");
                vec![]
            }
        }
    }

    /// Decides a request waiting on another replica: `false` when it is gone or decided.
    pub async fn decide_elsewhere(
        &self,
        request_id: &str,
        answer: warden_approval::UserDecision,
        scope: warden_approval::Scope,
    ) -> Result<bool, crate::store::StoreError> {
        if self.replica.is_none() {
            return Ok(false);
        }
        let d =
            RemoteDecision { decision: answer.resolution, scope, decided_by: answer.who, authority: answer.authority };
        let d = serde_json::to_value(d).expect("a decision serialises");
        self.store.decide_remote(request_id, &d).await
    }
}

/// How a task ends: what its record and its `finish` event say.
struct Finish {
    status: TaskState,
    reason: FinishReason,
    output: Option<String>,
    error: Option<String>,
}

impl Finish {
    fn canceled() -> Self {
        Finish {
            status: TaskState::Canceled,
            reason: FinishReason::Canceled,
            output: None,
            error: Some("canceled".into()),
        }
    }

    fn failed(reason: FinishReason, error: String) -> Self {
        Finish { status: TaskState::Failed, reason, output: None, error: Some(error) }
    }

    /// The task reached `max_tool_iterations`: it completes, saying so.
    fn tool_limit(budget: Option<&crate::tools::ToolBudget>) -> Self {
        let max = budget.map(|b| b.max_calls()).unwrap_or_default();
        Finish {
            status: TaskState::Completed,
            reason: FinishReason::ToolLimit,
            output: Some(format!("Stopped: the task reached its limit of {max} tool calls (max_tool_iterations).")),
            error: None,
        }
    }
}
