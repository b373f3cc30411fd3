//! The warm pool (`sandbox.warm_pool`): hardened, never-used containers kept ready so that a
//! new session's first command skips container creation.
//!
//! **What it owns.** The pool's state (containers ready to hand out, fills in flight,
//! sessions waiting for one), the background refill task, preparing a pool container, and
//! handing one to a session. A pool container is made by the same code and with the same
//! body as a cold session container (`container::create_and_start`: every limit, the
//! read-only root, no capabilities but the agents' two, its own workspace volume and, with
//! `sandbox.disk`, its own disk), then an agent is started in it and kept idle. Only its
//! labels and names differ: `warden.pool=true` and no session key, because it has none yet;
//! the container is `warden-pool.<scope>.<nonce>` and its volumes follow from that name.
//! The pool reaches the sandbox it serves only through [`PoolHost`] (the settings, the
//! egress, the counters, the session count and a session's object lock), which the
//! sessions (`session.rs`, above this module) implement.
//!
//! **Handing out.** Docker cannot change a container's labels after creation, so a pool
//! container becomes a session's in two steps, under the session's object lock:
//! 1. a *binding* volume `warden-bind-<session stem>` is created, labelled with the scope and
//!    the session key (never mounted; only the host creates one, so nothing inside a sandbox
//!    can forge a binding, and one is only believed under the name its own key gives);
//! 2. the container is renamed to the session's deterministic name (`container::names`).
//!
//! From then on everything that finds a session's container works as for a cold one: its
//! name (end, prune, the adoption check), its key (the binding, for `list_sessions` and
//! adoption), its workspace (the volume it mounts at /workspace, read from the container,
//! for removal and for recreating a vanished container on the same workspace). A crash
//! between the steps leaves a pool-named container, or a renamed one without a binding:
//! neither is anyone's session, and the next start of the scope removes both.
//!
//! **Health.** A container is checked before it is handed out: one that stopped or vanished
//! while idle is removed (with its workspace) instead, the pool refills, and the session
//! tries the next one (or creates its own). The refill task also checks the ready ones every
//! `HEALTH_CHECK_INTERVAL`, so a dead one is replaced without waiting for a session.
//!
//! **Counting.** Pool containers count against `sandbox.max_sessions`: a fill starts only
//! while sessions + ready + unclaimed fills < `max_sessions`, and a new session with nothing
//! ready waits for a fill in flight rather than creating a container of its own while every
//! fill is spoken for. So the containers one host keeps never exceed `max_sessions`.
//!
//! **Adapting.** The pool's target starts at `warm_pool` (its floor). A new session that
//! finds nothing ready (it waits for a fill, or goes cold) raises the target by one, up to
//! `warm_pool_max` (clamped to `max_sessions` by the counting above), and while above the
//! floor the pool prepares [`MAX_PARALLEL_FILLS_GROWN`] containers at once instead of
//! [`MAX_PARALLEL_FILLS`]. After `warm_pool_decay` without such a session the growth above
//! the floor halves, and ready containers above the new target are removed (never-used,
//! so nothing is lost), until the pool is back at its floor. While new sessions create
//! containers of their own (a burst past the pool) the pool fills only up to its floor:
//! its growth would compete with them for the engine, and it catches up once they run.
//! Until the pool delivered its first container, a session finding nothing ready is the
//! pool starting (the first session starts it), not demand.
//!
//! **Hosts.** Each Docker host (`sandbox.hosts`) has its own pool of `warm_pool`
//! containers, made on that host and labelled with it; a session placed on a host takes
//! from that host's pool only. `max_sessions` stays one limit: a pool reserves room only
//! while sessions + every host's pooled and unclaimed containers stay below it.
//!
//! **Starting.** The pool fills from the first session of a `Sandbox` (or
//! `Sandbox::connect`); listing and pruning never start it. The refill task holds no strong
//! reference to its host, so a dropped `Sandbox` stops refilling.
//!
//! **Restart.** On connect (before the pool starts) the host removes every container of its
//! scope labelled `warden.pool` that no binding names — un-handed-out containers of a
//! previous run — with their volumes, and adopts handed-out ones like any session. They are
//! removed rather than taken into the new pool: one may be half-prepared (its workspace
//! setup or agent start cut off by the crash), which cannot be told from outside, and a new
//! pool is a few seconds of background work. Other scopes are never looked at.
//!
//! **Replicas.** With `sandbox.replica_id` each replica has its own pool (labelled
//! `warden.replica=<id>`, counted against its own `max_sessions`) and removes only its own
//! leftover pool containers on connect. A hand-out whose rename finds the session's name
//! held by another replica's running container (both started the session at once) does not
//! remove that container: the pool container goes instead, and the session uses the other
//! replica's.
//!
//! This module must never hand one container to two sessions (a container leaves `ready`
//! exactly once, under the lock, and a failed hand-out removes it), never put a container
//! back once it was handed out (nothing is reused across sessions), never run anything in a
//! pool container but the workspace setup and the agent, never let the pool and the
//! sessions exceed `max_sessions`, and never leave a container it made behind: a fill that
//! finishes after shutdown, or after its host was dropped, removes what it made.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bollard::Docker;
use tokio::sync::{Notify, oneshot};
use tokio::task::{JoinHandle, JoinSet};

use crate::config::SandboxConfig;
use crate::container;
use crate::egress::Egress;
use crate::error::SandboxError;
use crate::exec::{AgentPool, AgentTag};
use crate::metrics::Metrics;
use crate::session_key::SessionKey;

/// Pool containers prepared at once while the pool is at its floor (`warm_pool`): each is
/// mostly waiting on the engine, but two cores also serve live sessions, and a burst past
/// the pool is better served by waiting for these than by more creations competing for the
/// same engine.
const MAX_PARALLEL_FILLS: usize = 2;
/// Pool containers prepared at once while the pool has grown above its floor (new sessions
/// found it empty, see `warm_pool_max`): demand is there, so the pool refills at about the
/// rate a burst arrives, while still leaving the engine to the sessions' own work. Four
/// keeps a two-core engine busy without queueing more than it can start.
const MAX_PARALLEL_FILLS_GROWN: usize = 4;
/// First pause after a failed fill (missing image, engine trouble), doubled per failure in
/// a row: a broken setup must not turn the pool into a tight create/remove loop.
const FILL_RETRY_MIN: Duration = Duration::from_secs(1);
/// Longest pause between fills that keep failing.
const FILL_RETRY_MAX: Duration = Duration::from_secs(60);
/// How often the refill task checks that the ready containers still run: one that stopped
/// or vanished while idle is replaced within this time rather than at the next hand-out
/// (which checks too). A check is one inspect per ready container (`warm_pool`, default 2).
const HEALTH_CHECK_INTERVAL: Duration = Duration::from_secs(10);
/// Decay checks per `warm_pool_decay` (the refill task looks that often whether the
/// target may shrink): the pool shrinks at most a quarter interval late.
const DECAY_CHECKS_PER_INTERVAL: u32 = 4;
/// Shortest pause between decay checks, whatever `warm_pool_decay` says: a check takes the
/// pool lock, and a tiny decay must not make the refill task spin.
const MIN_DECAY_CHECK: Duration = Duration::from_millis(100);
/// Pool containers one new session tries before it creates its own (each failed hand-out
/// removes the container; a pool emptied by someone else must not keep a session waiting).
const MAX_HANDOUT_ATTEMPTS: usize = 3;

/// What the pool needs of the sandbox it serves. Implemented by the sessions' shared state
/// (`session.rs`, above this module): the pool reads the settings, the egress and the
/// counters, counts the sessions and takes a session's object lock, and never sees a
/// session itself.
pub(crate) trait PoolHost: Send + Sync + 'static {
    /// The pool of Docker host `at` (its index in `sandbox.hosts`).
    fn pool(&self, at: usize) -> &WarmPool;
    /// The endpoint of Docker host `at` (the value of its containers' host label).
    fn endpoint(&self, at: usize) -> &str;
    /// The configuration in effect.
    fn config(&self) -> &SandboxConfig;
    /// Egress through the proxy (`None`: containers have no way out).
    fn egress(&self) -> Option<&Arc<Egress>>;
    /// The disk attaches of Docker host `at`, gathered into shared helpers.
    fn disks(&self, at: usize) -> &Arc<crate::disk::Attacher>;
    /// The sandbox's counters.
    fn metrics(&self) -> &Metrics;
    /// Runs `f` with the number of sessions plus the containers the pools of the other
    /// Docker hosts than `at` hold or prepare, holding the sessions lock (so the pool can
    /// reserve room under `max_sessions` without a session slipping in meanwhile). Lock
    /// order: the sessions lock before the pools' (never the other way round).
    fn with_session_count<R>(&self, at: usize, f: impl FnOnce(usize) -> R) -> R;
    /// The lock over `key`'s Docker objects: a hand-out binds under it, so it never
    /// overlaps a removal of the same session's objects.
    fn object_lock(&self, key: &SessionKey) -> &tokio::sync::Mutex<()>;
    /// The tag of this sandbox's agents (`None`: no replicas).
    fn agent_tag(&self) -> Option<Arc<AgentTag>>;
}

/// A prepared, never-used pool container.
pub(crate) struct Warm {
    pub id: String,
    pub name: String,
    /// Its workspace volume (`container::volume_of(name)`).
    pub volume: String,
    /// Its idle agent(s), started before it was handed out.
    pub agents: AgentPool,
}

/// A new session creating its own container ([`WarmPool::cold_start`]); dropping it (the
/// container made, or the creation failed or was dropped) lets the pool grow again.
pub(crate) struct ColdStart<'a> {
    pool: &'a WarmPool,
}

impl Drop for ColdStart<'_> {
    fn drop(&mut self) {
        let mut st = self.pool.lock();
        st.cold = st.cold.saturating_sub(1);
        let resume = st.cold == 0;
        drop(st);
        if resume {
            self.pool.kick();
        }
    }
}

/// What a new session gets from the pool.
enum Acquired {
    Ready(Warm),
    /// A fill in flight is this session's; it arrives on the channel (or the fill failed).
    Claimed(oneshot::Receiver<Warm>),
    /// Nothing ready and every fill spoken for: create a container of your own.
    Cold,
    Closed,
}

struct State {
    /// Containers the pool aims to hold: between `floor` and `ceiling` (see "Adapting").
    target: usize,
    /// When a new session last found nothing ready, or the target last decayed.
    last_demand: Instant,
    /// A fill was delivered: the pool is running. Before that a session finding nothing
    /// ready is the pool starting (the first session starts it), not demand past it.
    primed: bool,
    /// New sessions creating their own containers now (went cold): while any does, the
    /// pool fills only up to its floor, leaving the engine to them (see "Adapting").
    cold: usize,
    ready: VecDeque<Warm>,
    /// Names of the pool containers being prepared.
    filling: Vec<String>,
    /// New sessions waiting for a fill in flight (never more than `filling`).
    waiters: VecDeque<oneshot::Sender<Warm>>,
    closed: bool,
}

/// The pool of one Docker host of one `Sandbox`.
pub(crate) struct WarmPool {
    /// `warm_pool`: the target never goes below it.
    floor: usize,
    /// `max(warm_pool, warm_pool_max)`: the target never goes above it.
    ceiling: usize,
    /// Time without demand after which the growth above the floor halves.
    decay: Duration,
    state: Mutex<State>,
    /// Wakes the refill task (a container was taken, a session removed, shutdown, or the
    /// host dropped); shared with the task, which holds no strong reference to the host.
    wake: Arc<Notify>,
    started: AtomicBool,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl WarmPool {
    pub(crate) fn new(floor: usize, ceiling: usize, decay: Duration) -> Self {
        let state = State {
            target: floor,
            last_demand: Instant::now(),
            primed: false,
            cold: 0,
            ready: VecDeque::new(),
            filling: Vec::new(),
            waiters: VecDeque::new(),
            closed: false,
        };
        Self {
            floor,
            ceiling: ceiling.max(floor),
            decay,
            state: Mutex::new(state),
            wake: Arc::new(Notify::new()),
            started: AtomicBool::new(false),
            task: Mutex::new(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("warm pool lock")
    }

    /// Whether new sessions take containers from the pool.
    pub(crate) fn enabled(&self) -> bool {
        self.floor > 0
    }

    /// The number of containers the pool aims to hold now (see "Adapting").
    pub(crate) fn target(&self) -> usize {
        self.lock().target
    }

    /// After `decay` without demand, halves the target's growth above the floor and takes
    /// out the ready containers above the new target (for the caller to remove). `None`:
    /// the target stayed.
    fn decay(&self) -> Option<Vec<Warm>> {
        let mut st = self.lock();
        if st.target <= self.floor || st.last_demand.elapsed() < self.decay {
            return None;
        }
        st.target = self.floor + (st.target - self.floor) / 2;
        st.last_demand = Instant::now();
        let unclaimed = st.filling.len().saturating_sub(st.waiters.len());
        let excess = (st.ready.len() + unclaimed).saturating_sub(st.target).min(st.ready.len());
        let keep = st.ready.len() - excess;
        Some(st.ready.split_off(keep).into())
    }

    /// Containers ready to hand out now.
    pub(crate) fn ready_len(&self) -> usize {
        self.lock().ready.len()
    }

    /// Names of the containers the pool holds or is preparing (prune must spare them).
    pub(crate) fn container_names(&self) -> Vec<String> {
        let st = self.lock();
        st.ready.iter().map(|w| w.name.clone()).chain(st.filling.iter().cloned()).collect()
    }

    /// Containers held or being prepared for no one yet (they count against `max_sessions`).
    pub(crate) fn reserved(&self) -> usize {
        let st = self.lock();
        st.ready.len() + st.filling.len().saturating_sub(st.waiters.len())
    }

    /// Ids of the ready containers.
    fn ready_ids(&self) -> Vec<String> {
        self.lock().ready.iter().map(|w| w.id.clone()).collect()
    }

    /// Takes the ready containers among `ids` out of the pool (those still there).
    fn take_ready(&self, ids: &[String]) -> Vec<Warm> {
        let mut st = self.lock();
        let (gone, kept): (Vec<Warm>, Vec<Warm>) = st.ready.drain(..).partition(|w| ids.contains(&w.id));
        st.ready = kept.into();
        gone
    }

    /// Asks the refill task to look at the pool again.
    pub(crate) fn kick(&self) {
        self.wake.notify_one();
    }

    /// Reserves one fill when the pool is short and `max_sessions` leaves room; returns the
    /// new container's name. The caller holds the sessions lock (`sessions` is its count),
    /// so no session can appear between the check and the reservation.
    fn reserve(&self, sessions: usize, max_sessions: usize, scope: &str) -> Option<String> {
        let mut st = self.lock();
        let unclaimed = st.filling.len().saturating_sub(st.waiters.len());
        let reserved = st.ready.len() + unclaimed;
        // Growth waits for the sessions creating their own containers: the engine is theirs
        // first, and the pool catches up once they run.
        let (aim, parallel) = if st.target > self.floor && st.cold == 0 {
            (st.target, MAX_PARALLEL_FILLS_GROWN)
        } else {
            (self.floor, MAX_PARALLEL_FILLS)
        };
        if st.closed || st.filling.len() >= parallel || reserved >= aim || sessions + reserved >= max_sessions {
            return None;
        }
        let name = container::pool_name(scope);
        st.filling.push(name.clone());
        Some(name)
    }

    /// Takes a ready container, or a fill in flight. Nothing ready is demand: the target
    /// grows by one (up to the ceiling); the second value says whether it did.
    fn acquire(&self) -> (Acquired, bool) {
        let mut st = self.lock();
        if st.closed {
            return (Acquired::Closed, false);
        }
        if let Some(w) = st.ready.pop_front() {
            return (Acquired::Ready(w), false);
        }
        if st.primed {
            st.last_demand = Instant::now();
        }
        let grew = st.primed && st.target < self.ceiling;
        if grew {
            st.target += 1;
        }
        (Self::claim(&mut st), grew)
    }

    /// Counts a new session creating its own container (it found nothing ready or coming)
    /// until the returned guard drops; the pool's growth waits for it.
    pub(crate) fn cold_start(&self) -> ColdStart<'_> {
        self.lock().cold += 1;
        ColdStart { pool: self }
    }

    /// A fill in flight for a session that found nothing ready, or none.
    fn claim(st: &mut State) -> Acquired {
        if st.filling.len() > st.waiters.len() {
            let (tx, rx) = oneshot::channel();
            st.waiters.push_back(tx);
            return Acquired::Claimed(rx);
        }
        Acquired::Cold
    }

    /// A fill finished: to a waiting session, else ready. Returned when the pool is closed
    /// (the caller removes it).
    fn deliver(&self, mut warm: Warm) -> Option<Warm> {
        let mut st = self.lock();
        st.filling.retain(|n| *n != warm.name);
        st.primed = true;
        if st.closed {
            return Some(warm);
        }
        while let Some(tx) = st.waiters.pop_front() {
            match tx.send(warm) {
                Ok(()) => return None,
                // That session gave up (its call was dropped): the next one, or ready.
                Err(w) => warm = w,
            }
        }
        st.ready.push_back(warm);
        None
    }

    /// A fill failed: one waiting session too many is told to go cold.
    fn fill_failed(&self, name: &str) {
        let mut st = self.lock();
        st.filling.retain(|n| n != name);
        if st.waiters.len() > st.filling.len() {
            st.waiters.pop_front();
        }
    }

    /// Closes the pool: no more fills or hand-outs; returns the ready containers for removal.
    fn close(&self) -> Vec<Warm> {
        let mut st = self.lock();
        st.closed = true;
        st.waiters.clear();
        st.ready.drain(..).collect()
    }
}

/// Starts the pool of `inner` (once; no-op when the pool is off): reserves the first fills
/// now, so that the session that triggered the start can wait for one, and spawns the
/// refill task.
pub(crate) fn start<H: PoolHost>(inner: &Arc<H>, at: usize, docker: &Docker) {
    let pool = inner.pool(at);
    if !pool.enabled() || pool.started.load(Ordering::Acquire) || pool.started.swap(true, Ordering::AcqRel) {
        return;
    }
    let mut fills = JoinSet::new();
    top_up(inner, at, docker, &mut fills);
    let task = tokio::spawn(refill_loop(Arc::downgrade(inner), at, pool.wake.clone(), docker.clone(), fills));
    *pool.task.lock().expect("pool task lock") = Some(task);
}

/// Spawns fills until the pool is full (or `max_sessions`, or the parallel limit, stops it).
fn top_up<H: PoolHost>(inner: &Arc<H>, at: usize, docker: &Docker, fills: &mut JoinSet<Result<(), SandboxError>>) {
    let cfg = inner.config();
    while let Some(name) = inner.with_session_count(at, |n| inner.pool(at).reserve(n, cfg.max_sessions, &cfg.scope)) {
        let labels = container::pool_labels(&cfg.scope, inner.endpoint(at), cfg.replica_id.as_deref());
        fills.spawn(fill(
            Arc::downgrade(inner),
            at,
            (docker.clone(), inner.disks(at).clone()),
            cfg.clone(),
            (inner.egress().cloned(), inner.agent_tag()),
            name,
            labels,
        ));
    }
}

/// The refill task: tops the pool up whenever it is woken or a fill ends, with a growing
/// pause after failures; on close (or when its host is gone) waits for the fills in flight,
/// which remove what they made.
async fn refill_loop<H: PoolHost>(
    host: Weak<H>,
    at: usize,
    wake: Arc<Notify>,
    docker: Docker,
    mut fills: JoinSet<Result<(), SandboxError>>,
) {
    let mut failures: u32 = 0;
    let mut retry_at: Option<Instant> = None;
    let mut health =
        tokio::time::interval_at(tokio::time::Instant::now() + HEALTH_CHECK_INTERVAL, HEALTH_CHECK_INTERVAL);
    health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Looks at the target's decay a few times per `warm_pool_decay`, so an idle pool shrinks
    // within about 1.25 decays of its last demand.
    let decay_every = match host.upgrade() {
        Some(inner) => (inner.pool(at).decay / DECAY_CHECKS_PER_INTERVAL).max(MIN_DECAY_CHECK),
        None => return,
    };
    let mut decay = tokio::time::interval_at(tokio::time::Instant::now() + decay_every, decay_every);
    decay.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let Some(inner) = host.upgrade() else { break };
            if inner.pool(at).lock().closed {
                break;
            }
            if retry_at.is_none_or(|t| Instant::now() >= t) {
                retry_at = None;
                top_up(&inner, at, &docker, &mut fills);
            }
        }
        let pause = retry_at.map(|t| t.saturating_duration_since(Instant::now()));
        tokio::select! {
            _ = &mut notified => {}
            Some(done) = fills.join_next() => match done {
                Ok(Ok(())) => failures = 0,
                Ok(Err(e)) => {
                    failures = failures.saturating_add(1);
                    let pause = FILL_RETRY_MIN
                        .saturating_mul(1u32 << failures.saturating_sub(1).min(16))
                        .min(FILL_RETRY_MAX);
                    tracing::warn!(error = %e, retry_in_ms = pause.as_millis() as u64, "warm pool: preparing a container failed");
                    retry_at = Some(Instant::now() + pause);
                }
                Err(e) => tracing::warn!(error = %e, "warm pool: a fill task ended abnormally"),
            },
            _ = tokio::time::sleep(pause.unwrap_or_default()), if pause.is_some() => {}
            _ = health.tick() => discard_stopped(&host, at, &docker).await,
            _ = decay.tick() => shrink(&host, at, &docker).await,
        }
    }
    while fills.join_next().await.is_some() {}
}

/// Lets the pool's target decay when no new session found it empty for `warm_pool_decay`,
/// and removes the ready containers above the new target (with their workspaces).
async fn shrink<H: PoolHost>(host: &Weak<H>, at: usize, docker: &Docker) {
    let Some(inner) = host.upgrade() else { return };
    let Some(excess) = inner.pool(at).decay() else { return };
    let target = inner.pool(at).target();
    tracing::debug!(target, removed = excess.len(), "warm pool: no demand; the target decays");
    for warm in excess {
        inner.metrics().warm_trimmed.fetch_add(1, Ordering::Relaxed);
        let name = warm.name.clone();
        if let Err(e) = remove_ready(&*inner, docker, warm).await {
            tracing::warn!(container = %name, error = %e, "warm pool: removing a container above the target failed");
        }
    }
}

/// Removes a ready container the pool gives up (never handed out): its agents, the
/// container and its workspace.
async fn remove_ready<H: PoolHost>(inner: &H, docker: &Docker, warm: Warm) -> Result<(), SandboxError> {
    drop(warm.agents);
    container::remove_pooled(docker, inner.config(), &warm.name).await
}

/// Removes the ready containers that stopped or vanished while idle (with their
/// workspaces); the loop then refills. The host is only held for the removal.
async fn discard_stopped<H: PoolHost>(host: &Weak<H>, at: usize, docker: &Docker) {
    let Some(ids) = host.upgrade().map(|inner| inner.pool(at).ready_ids()) else { return };
    let mut stopped = Vec::new();
    for id in ids {
        if matches!(container::is_running(docker, &id).await, Ok(false)) {
            stopped.push(id);
        }
    }
    if stopped.is_empty() {
        return;
    }
    let Some(inner) = host.upgrade() else { return };
    for warm in inner.pool(at).take_ready(&stopped) {
        inner.metrics().warm_failures.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(container = %warm.name, "warm pool: an idle pool container stopped; replacing it");
        drop(warm.agents);
        let _ = container::remove_container(docker, &warm.id).await;
        let _ = container::remove_workspace(docker, inner.config(), &warm.volume).await;
    }
}

/// Prepares one pool container named `name` and delivers it; removes it instead when the
/// pool closed or the host was dropped meanwhile (and everything it made, when it failed).
async fn fill<H: PoolHost>(
    host: Weak<H>,
    at: usize,
    (docker, disks): (Docker, Arc<crate::disk::Attacher>),
    cfg: SandboxConfig,
    (egress, tag): (Option<Arc<Egress>>, Option<Arc<AgentTag>>),
    name: String,
    labels: std::collections::HashMap<String, String>,
) -> Result<(), SandboxError> {
    let volume = container::volume_of(&name);
    let made = async {
        // A pool name is unique: whatever holds it is a leftover of this pool.
        let replace = container::NameTaken::Replace;
        let owner = container::Owner::Pool { scope: &cfg.scope };
        // The container's first agent (which prepares it) waits in `agents` for the
        // session it is handed to.
        let agents = AgentPool::new(tag);
        let id = match container::create_and_start(
            (&docker, &disks),
            &cfg,
            (&name, &volume),
            (labels, owner),
            (egress.as_deref(), &agents),
            replace,
            None,
        )
        .await?
        {
            container::Made::Created(id) | container::Made::Found { id, .. } => id,
        };
        Ok::<_, SandboxError>(Warm { id, name: name.clone(), volume: volume.clone(), agents })
    }
    .await;
    // The host is only looked at briefly: a fill must not keep a dropped host alive.
    let inner = host.upgrade();
    match made {
        Ok(warm) => {
            let leftover = match inner {
                Some(inner) => {
                    inner.metrics().warm_created.fetch_add(1, Ordering::Relaxed);
                    inner.pool(at).deliver(warm)
                }
                None => Some(warm),
            };
            if let Some(warm) = leftover {
                drop(warm.agents);
                container::remove_pooled(&docker, &cfg, &warm.name).await?;
            }
            Ok(())
        }
        Err(e) => {
            if let Some(inner) = inner {
                inner.metrics().warm_failures.fetch_add(1, Ordering::Relaxed);
                inner.pool(at).fill_failed(&name);
            }
            if let Err(cleanup) = container::remove_pooled(&docker, &cfg, &name).await {
                tracing::warn!(container = %name, error = %cleanup, "warm pool: removing a failed pool container failed");
            }
            Err(e)
        }
    }
}

/// Hands a pool container to the new session `key` (see the module doc), trying the next
/// one when a hand-out fails. `None`: nothing ready or coming, create one cold.
pub(crate) async fn take<H: PoolHost>(
    inner: &H,
    at: usize,
    docker: &Docker,
    key: &SessionKey,
) -> Result<Option<Warm>, SandboxError> {
    let names = container::names(&inner.config().scope, key);
    for _ in 0..MAX_HANDOUT_ATTEMPTS {
        let (warm, waited) = loop {
            let (acquired, grew) = inner.pool(at).acquire();
            if grew {
                inner.metrics().warm_grown.fetch_add(1, Ordering::Relaxed);
            }
            match acquired {
                Acquired::Ready(w) => break (w, false),
                Acquired::Claimed(rx) => {
                    inner.pool(at).kick();
                    match rx.await {
                        Ok(w) => break (w, true),
                        // The fill failed: look again (another may be ready, or go cold).
                        Err(_) => continue,
                    }
                }
                Acquired::Cold => return Ok(None),
                Acquired::Closed => return Err(SandboxError::ShutDown),
            }
        };
        // The pool is one short now.
        inner.pool(at).kick();
        // A container that stopped or vanished while idle (killed, OOM, removed by hand) is
        // discarded, never handed out: its agents are dead and its state unknown.
        match container::is_running(docker, &warm.id).await {
            Ok(true) => {}
            healthy => {
                inner.metrics().warm_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(container = %warm.name, check = ?healthy.map(|_| "not running"), "warm pool: discarding a pool container that is not running");
                drop(warm.agents);
                let _ = container::remove_container(docker, &warm.id).await;
                let _ = container::remove_workspace(docker, inner.config(), &warm.volume).await;
                continue;
            }
        }
        let bound = {
            let _objects = inner.object_lock(key).lock().await;
            bind(docker, inner.config(), inner.endpoint(at), &names, key, &warm).await
        };
        match bound {
            Ok(()) => {
                let counter = if waited { &inner.metrics().warm_waits } else { &inner.metrics().warm_hits };
                counter.fetch_add(1, Ordering::Relaxed);
                return Ok(Some(warm));
            }
            Err(e) => {
                inner.metrics().warm_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(container = %warm.name, error = %e, "warm pool: handing out a container failed; removing it");
                drop(warm.agents);
                // Renamed or not, the container goes (by id), with its workspace.
                let _ = container::remove_container(docker, &warm.id).await;
                let _ = container::remove_workspace(docker, inner.config(), &warm.volume).await;
                // Another replica made the session's container meanwhile: that one serves it.
                if inner.config().replica_id.is_some()
                    && container::is_running(docker, &names.container).await.unwrap_or(false)
                {
                    return Ok(None);
                }
            }
        }
    }
    Ok(None)
}

/// Binds `warm` to the session: the binding volume first, then the rename (see the module
/// doc); undoes the binding when the rename fails.
async fn bind(
    docker: &Docker,
    cfg: &SandboxConfig,
    host: &str,
    names: &container::Names,
    key: &SessionKey,
    warm: &Warm,
) -> Result<(), SandboxError> {
    container::create_binding(docker, cfg, host, names, key).await?;
    if let Err(e) = container::rename(docker, &warm.id, (&cfg.scope, key), container::NameTaken::of(cfg)).await {
        // The binding is the running holder's when another replica bound it first.
        if cfg.replica_id.is_none() || !container::is_running(docker, &names.container).await.unwrap_or(true) {
            let _ = container::remove_volume(docker, cfg, &names.binding).await;
        }
        return Err(e);
    }
    Ok(())
}

/// Closes the pool: no more fills or hand-outs from now on; returns its ready containers,
/// which [`shutdown`] removes.
pub(crate) fn close<H: PoolHost>(inner: &H, at: usize) -> Vec<Warm> {
    let ready = inner.pool(at).close();
    inner.pool(at).kick();
    ready
}

/// Shuts a closed pool down: the refill task and every fill in flight finished (each
/// removes what it made), and `ready` (from [`close`]) removed.
pub(crate) async fn shutdown<H: PoolHost>(
    inner: &H,
    at: usize,
    docker: &Docker,
    ready: Vec<Warm>,
) -> Result<(), SandboxError> {
    let task = inner.pool(at).task.lock().expect("pool task lock").take();
    if let Some(task) = task {
        let _ = task.await;
    }
    let removals = ready.into_iter().map(|w| remove_ready(inner, docker, w));
    futures_util::future::join_all(removals).await.into_iter().collect::<Result<Vec<()>, _>>().map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warm(name: &str) -> Warm {
        Warm {
            id: format!("id-{name}"),
            name: name.to_string(),
            volume: container::volume_of(name),
            agents: AgentPool::default(),
        }
    }

    fn ready_name(a: Acquired) -> Option<String> {
        match a {
            Acquired::Ready(w) => Some(w.name),
            _ => None,
        }
    }

    #[test]
    fn reservations_respect_the_target_the_parallel_limit_and_max_sessions() {
        let pool = WarmPool::new(3, 3, Duration::from_secs(60));
        let a = pool.reserve(0, 32, "s").unwrap();
        let b = pool.reserve(0, 32, "s").unwrap();
        assert_eq!(pool.reserve(0, 32, "s"), None, "at most {MAX_PARALLEL_FILLS} fills at once");
        assert!(pool.deliver(warm(&a)).is_none());
        assert!(pool.deliver(warm(&b)).is_none());
        assert_eq!(pool.ready_len(), 2);
        // 2 ready + 1 session = 3 = max_sessions: no room.
        assert_eq!(pool.reserve(1, 3, "s"), None);
        let c = pool.reserve(0, 3, "s").unwrap();
        assert!(pool.deliver(warm(&c)).is_none());
        assert_eq!(pool.reserve(0, 32, "s"), None, "the target is reached");
    }

    #[test]
    fn a_container_is_handed_out_once_and_waiters_get_fills_in_order() {
        let pool = WarmPool::new(2, 2, Duration::from_secs(60));
        let a = pool.reserve(0, 32, "s").unwrap();
        let b = pool.reserve(0, 32, "s").unwrap();
        // Two fills in flight: two sessions can wait for them, a third goes cold.
        let Acquired::Claimed(mut first) = pool.acquire().0 else { panic!("claim") };
        let Acquired::Claimed(second) = pool.acquire().0 else { panic!("claim") };
        assert!(matches!(pool.acquire().0, Acquired::Cold));
        // A fill that fails tells one waiter to go cold; the other fill goes to the other.
        pool.fill_failed(&a);
        assert!(first.try_recv().is_err());
        drop(second); // that session's call was dropped meanwhile
        assert!(pool.deliver(warm(&b)).is_none(), "kept, as ready");
        assert_eq!(ready_name(pool.acquire().0).as_deref(), Some(b.as_str()));
        assert!(matches!(pool.acquire().0, Acquired::Cold), "handed out once");
        assert_eq!(pool.ready_len(), 0);
    }

    #[test]
    fn demand_grows_the_target_to_the_ceiling_and_idleness_halves_it_back_to_the_floor() {
        // No decay wait: every call of `decay` finds the pool idle long enough.
        let pool = WarmPool::new(1, 3, Duration::ZERO);
        assert_eq!(pool.target(), 1);
        assert!(!pool.acquire().1, "the session that starts the pool is no demand past it");
        let first = pool.reserve(0, 32, "s").unwrap();
        assert!(pool.deliver(warm(&first)).is_none());
        assert!(matches!(pool.acquire().0, Acquired::Ready(_)));
        let grew: Vec<bool> = (0..3).map(|_| pool.acquire().1).collect();
        assert_eq!(grew, [true, true, false], "one per session that found nothing ready, up to the ceiling");
        assert_eq!(pool.target(), 3);
        // While a session creates its own container the pool fills to its floor only.
        let cold = pool.cold_start();
        let during: Vec<String> = std::iter::from_fn(|| pool.reserve(0, 32, "s")).collect();
        assert_eq!(during.len(), 1, "{during:?}");
        drop(cold);
        // Then it grows: more fills at once than at the floor, and as many as the target.
        let names: Vec<String> = during.into_iter().chain(std::iter::from_fn(|| pool.reserve(0, 32, "s"))).collect();
        assert_eq!(names.len(), 3);
        for n in &names {
            assert!(pool.deliver(warm(n)).is_none());
        }
        let (acquired, grew) = pool.acquire();
        assert!(matches!(acquired, Acquired::Ready(_)) && !grew, "a hit is no demand");
        // 3 → 2: two ready, none above the target.
        assert_eq!(pool.decay().map(|w| w.len()), Some(0));
        assert_eq!(pool.target(), 2);
        // 2 → 1: one ready container above the target is taken out for removal.
        assert_eq!(pool.decay().map(|w| w.len()), Some(1));
        assert_eq!((pool.target(), pool.ready_len()), (1, 1));
        assert!(pool.decay().is_none(), "never below the floor");
        let fixed = WarmPool::new(2, 0, Duration::ZERO);
        assert!(!fixed.acquire().1, "a ceiling at or below the floor keeps the size fixed");
        assert_eq!(fixed.target(), 2);
    }

    #[test]
    fn closing_returns_the_ready_ones_and_refuses_the_rest() {
        let pool = WarmPool::new(2, 2, Duration::from_secs(60));
        let a = pool.reserve(0, 32, "s").unwrap();
        let b = pool.reserve(0, 32, "s").unwrap();
        assert!(pool.deliver(warm(&a)).is_none());
        let closed: Vec<String> = pool.close().into_iter().map(|w| w.name).collect();
        assert_eq!(closed, vec![a]);
        assert!(matches!(pool.acquire().0, Acquired::Closed));
        assert_eq!(pool.reserve(0, 32, "s"), None);
        assert!(pool.deliver(warm(&b)).is_some(), "a fill after close is the filler's to remove");
    }
}
