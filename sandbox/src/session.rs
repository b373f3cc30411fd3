//! Session lifecycle: one container per (user_id, session_id), taken from the warm pool
//! (`pool.rs`) or created on first use, reused, recreated when it vanished (on the same
//! workspace), reaped when idle, removed on end and shutdown.
//!
//! The top of the lifecycle: it holds the sessions, the warm pool (to which it lends its
//! settings, egress, counters and locks as [`PoolHost`]) and the egress proxy, and makes
//! containers through `container.rs`; the tools and session processes sit above it.
//!
//! **Hosts.** Sessions are placed over the Docker hosts of `sandbox.hosts` (one, by
//! default): a new session on the reachable host with the fewest session containers of this
//! scope, a session whose container already exists (another replica's, found by name and
//! host label) on that host; each session stays on its host. Each host has its own lazy
//! connection, adoption and warm pool; a host that is down fails only its sessions' calls,
//! with an error naming it.
//!
//! **Replicas.** With `sandbox.replica_id` several processes (replicas) share the scope and
//! a session keeps one container across them. What a replica creates is labelled
//! `warden.replica=<id>`. At connect it adopts or removes only its own leftovers, and sweeps
//! in an adopted container only the agents (and their commands) of its own earlier lives,
//! which carry its id and another life on their command line (`exec::AgentTag`): another
//! replica may be running a call there. It reaches another replica's session when a call of
//! it arrives (by the container's name), sweeping nothing; a creation that finds the name
//! taken by a running container uses it (`container::NameTaken::Reuse`), so two replicas
//! starting a session at once make one container. The shared "last used" signal is the
//! container's *use mark* (`agent::USE_MARK`): a root-only file the in-container agent writes
//! around every request and holds a shared lock on while one runs. It lives where every
//! replica's calls pass anyway (no extra round trip per call, no clock but the Docker host's,
//! nothing sandboxed can touch it, and it dies with the container), and one root exec reads
//! it. A replica's reaper removes a session idle here only when the mark says no replica used
//! it within `idle_ttl` and none runs a call; otherwise it lets go of it, and the last
//! replica to use it removes it. Shutdown lets go of every session instead of removing it,
//! and once per `idle_ttl` the reaper removes the sessions some replica made that no one
//! holds here and no one used for `idle_ttl` (a replica shut down or gone for good). The
//! check keeps the mark locked until the removal is done (`exec::UseHold`), so no request
//! starts on any replica in between: one waiting for it finds its container gone before it
//! ran and is served by a new container on the same workspace volume name (fresh: the
//! session was idle everywhere). `warm_pool` and `max_sessions` count per replica. Egress is refused with
//! replicas (`config.rs`): a session's proxy is served by one process.
//!
//! Concurrent first use of a session creates exactly one container (a per-session async
//! mutex guards creation). The Docker connection is made lazily at the first tool use, so a
//! host without Docker still starts and its text-only subagents keep working.
//! This module must never remove a container or volume that lacks warden's labels, never
//! remove a session that has a call in flight (except on explicit end or shutdown), and never
//! let the number of sessions exceed `max_sessions`, nor one user's `max_sessions_per_user`. With replicas it must never sweep
//! another replica's agents or commands, and never reap a session another replica used
//! within `idle_ttl`.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use bollard::Docker;
use bollard::models::ContainerSummaryStateEnum;
use serde::Serialize;
use tokio::task::JoinHandle;

use crate::agent::Op;
use crate::config::{DockerHost, EndpointKind, SandboxConfig};
use crate::container::{self, Names};
use crate::egress::{self, Egress, EgressObserver, EgressPolicy};
use crate::error::SandboxError;
use crate::exec::{self, ExecFailure, ExecRequest, ExecResult};
use crate::lanes::{LanePass, LaneTimeout, Lanes};
use crate::metrics::{Metrics, MetricsSnapshot};
use crate::pool::{self, PoolHost, WarmPool};
use crate::runtime::EngineRuntimes;
/// The session key, at its former path (`session::SessionKey`).
pub use crate::session_key::{MAX_KEY_PART_LEN, SessionKey};
use crate::shell_state::{ShellState, writer_of};
use crate::snapshot::{self, SnapshotInfo};

/// Stripes of the per-session Docker object locks (a fixed number: no map to clean up).
const OBJECT_LOCK_STRIPES: usize = 64;
/// Longest pause between idle sweeps; shorter TTLs sweep at a quarter of the TTL.
const REAPER_MAX_INTERVAL: Duration = Duration::from_secs(30);
/// Shortest pause between idle sweeps.
const REAPER_MIN_INTERVAL: Duration = Duration::from_millis(250);
/// A dangling workspace volume younger than this may be mid-creation; `prune` leaves it.
const PRUNE_MIN_VOLUME_AGE: Duration = Duration::from_secs(120);
/// Per-request timeout of the Docker client, seconds (exec output streams are not bound by it).
const DOCKER_CLIENT_TIMEOUT_SECS: u64 = 120;
/// How long connecting to a Docker host (the version handshake) may take: a host that
/// drops packets must not hold a new session (or readiness) for the client's 120 s.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long placing a new session waits for one host's container list: a slow host is
/// passed over for this session rather than making it wait.
const PLACEMENT_LIST_TIMEOUT: Duration = Duration::from_secs(10);
/// File downloads (`Sandbox::download_file`) one sandbox runs at once; more wait. Each
/// holds the whole file in host memory (up to `tools::files::MAX_TRANSFER_BYTES`, 256 MiB),
/// so two bound what downloads can take to 512 MiB however many sessions or tenants ask at
/// once, while two users (or a console and an API client) are still served side by side.
pub const MAX_CONCURRENT_DOWNLOADS: usize = 2;

/// One Docker host sessions are placed on (`sandbox.hosts`, or the one `docker_host`
/// names): its connection, made lazily, and its warm pool.
pub(crate) struct Host {
    /// Where it is (and the value of its containers' `warden.docker_host` label).
    spec: DockerHost,
    /// Neither `hosts` nor `docker_host` is set: connect as Docker's own defaults say
    /// (`DOCKER_HOST`, `DOCKER_CERT_PATH`, ... else the local socket).
    defaults: bool,
    /// This host's connection, made at its first use, after adopting its leftovers.
    docker: tokio::sync::OnceCell<Docker>,
    /// A connection for listing and pruning only, made when this host has none of its own:
    /// it adopts nothing, so `warden sandbox ls|prune` run against the scope of a live host
    /// never takes that host's sessions or removes its pool. `docker` stays unset, so a
    /// session of this host still adopts on its first use.
    observer: tokio::sync::OnceCell<Docker>,
    /// Ready, never-used containers on this host for new sessions placed on it.
    pool: WarmPool,
    /// The disk attaches of cold starts and pool fills on this host, gathered into shared
    /// disk helpers.
    disks: Arc<crate::disk::Attacher>,
    /// The engine's runtimes, read (and checked against the configuration) when this
    /// host is first connected: the name of its default runtime for listings.
    runtimes: std::sync::OnceLock<EngineRuntimes>,
}

impl Host {
    fn endpoint(&self) -> &str {
        &self.spec.endpoint
    }

    /// Whether a container or volume with these labels is this host's: labelled with its
    /// endpoint, or with none this sandbox knows (made before placement labels, or under an
    /// endpoint since renamed), which the first host that sees it takes.
    fn owns(&self, labels: Option<&HashMap<String, String>>, hosts: &[Host]) -> bool {
        match container::host_label(labels) {
            Some(h) => h == self.endpoint() || !hosts.iter().any(|o| o.endpoint() == h),
            None => true,
        }
    }
}

/// Whether a Docker host answers (`Sandbox::ping_hosts`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostStatus {
    /// The endpoint, as configured.
    pub endpoint: String,
    /// Why it does not answer; `None`: it does.
    pub error: Option<String>,
}

/// Names the Docker host in an unavailability error (once).
fn on_host(endpoint: &str, e: SandboxError) -> SandboxError {
    match e {
        SandboxError::DockerUnavailable(m) if !m.contains(endpoint) => {
            SandboxError::DockerUnavailable(format!("Docker host {endpoint}: {m}"))
        }
        other => other,
    }
}

/// One session as the operator sees it (`warden sandbox ls`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionInfo {
    /// The session.
    pub key: SessionKey,
    /// The host scope that owns it.
    pub scope: String,
    /// Docker container id.
    pub container_id: String,
    /// Docker container name.
    pub container_name: String,
    /// The OCI runtime its container runs under (`runc`, `runsc`, …).
    pub runtime: String,
    /// Docker state (`running`, `exited`, ...).
    pub state: String,
    /// When the container was created.
    pub created: SystemTime,
    /// Last tool use, when this host owns the session.
    pub last_used: Option<SystemTime>,
    /// The Docker host (`sandbox.hosts[].endpoint`) its container runs on.
    pub docker_host: String,
    /// True when this host (this `Sandbox`) manages it.
    pub owned_here: bool,
    /// True when this host paused it (`sandbox.pause_after`, or asked): its container is
    /// stopped, its workspace kept; the next call starts it again.
    pub paused: bool,
}

/// What a prune removed.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PruneReport {
    /// Names of removed containers.
    pub containers: Vec<String>,
    /// Names of removed volumes.
    pub volumes: Vec<String>,
    /// Docker hosts that could not be pruned, with why (the others were).
    pub unreachable_hosts: Vec<String>,
}

/// The sandbox manager the host holds (cheap to clone; one per host).
///
/// Call [`Sandbox::shutdown`] before exit: dropping it without shutdown leaves the session
/// containers running, to be adopted by the next `Sandbox` of the same scope, and the warm
/// pool's containers, which that one removes.
#[derive(Clone)]
pub struct Sandbox {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: SandboxConfig,
    /// The Docker hosts, in configuration order (at least one).
    hosts: Vec<Host>,
    /// Lock order: `sessions` before the pools' locks (never the other way round).
    sessions: Mutex<HashMap<SessionKey, Arc<Slot>>>,
    pub(crate) metrics: Metrics,
    shut_down: AtomicBool,
    reaper: Mutex<Option<JoinHandle<()>>>,
    /// Striped locks over a session key's Docker objects: creating a session's container,
    /// volume and disk never overlaps removing them (a reaped session used again at once
    /// would otherwise attach a disk image that the removal then deletes).
    object_locks: Vec<tokio::sync::Mutex<()>>,
    /// Egress through the proxy (`sandbox.egress`); `None`: containers have no way out.
    pub(crate) egress: Option<Arc<Egress>>,
    /// With `replica_id`: the replica and this life of it, on every agent it starts.
    tag: Option<Arc<exec::AgentTag>>,
    /// With `replica_id`: when the reaper last looked for sessions no replica holds.
    last_stray_sweep: Mutex<Option<Instant>>,
    /// Permits for file downloads into host memory ([`MAX_CONCURRENT_DOWNLOADS`]).
    pub(crate) downloads: tokio::sync::Semaphore,
    /// Held while a snapshot is taken: the limits are checked against every snapshot there
    /// is, and two snapshots taken at once must not both fit the last room.
    snapshots: tokio::sync::Mutex<()>,
}

struct Slot {
    key: SessionKey,
    /// The Docker host (index in `Inner::hosts`) the session's container is on; fixed.
    host: usize,
    /// Deterministic names (the container's is the live container's name).
    names: Names,
    /// The live container id; the async mutex serialises creation.
    container: tokio::sync::Mutex<Option<String>>,
    /// The workspace volume the session's container mounts: a pool volume when the first
    /// container came from the pool, else `names.volume`; `None` before the first container.
    /// A recreated container mounts the same one.
    workspace: Mutex<Option<String>>,
    last_used: Mutex<(Instant, SystemTime)>,
    in_flight: AtomicUsize,
    /// Idle in-container agents of the live container.
    agents: exec::AgentPool,
    /// The session's Bash working directory (checked); in memory only.
    shell: Mutex<ShellState>,
    /// Which of the session's Bash commands may run at the same time (`lanes`).
    lanes: Arc<Lanes>,
    /// The session's egress channel into the live container (none without
    /// `sandbox.egress`, or before a call needed the container); opened by the first call
    /// that finds none serving the live container.
    egress: tokio::sync::Mutex<Option<egress::channel::Channel>>,
    /// Set while the session is paused: its stopped container. Taken (under the sessions
    /// lock, with room under `max_sessions`) by the call that resumes it, into `resuming`.
    paused: Mutex<Option<Paused>>,
    /// A paused container a call is starting again (`SessionCtx::container`).
    resuming: Mutex<Option<Paused>>,
}

/// The workspace disk a copy just made and attached for a new session (its volume
/// options), with the session's object lock held since before the copy: nothing can
/// have detached the disk (whose loop device another session's attach could take next)
/// before the session's first container mounts it.
struct CopiedDisk<'a> {
    options: crate::disk::VolumeOptions,
    _objects: tokio::sync::MutexGuard<'a, ()>,
}

/// A paused session's stopped container: what resuming it needs.
struct Paused {
    /// The stopped container's id.
    container: String,
    /// The container is stopped (until then the pause is only reserved under the limits).
    stopped: bool,
}

impl Slot {
    fn new(inner: &Inner, key: SessionKey, host: usize, container: Option<String>, workspace: Option<String>) -> Self {
        Self {
            names: container::names(&inner.config.scope, &key),
            key,
            host,
            container: tokio::sync::Mutex::new(container),
            workspace: Mutex::new(workspace),
            last_used: Mutex::new((Instant::now(), SystemTime::now())),
            in_flight: AtomicUsize::new(0),
            agents: exec::AgentPool::new(inner.tag.clone()),
            shell: Mutex::new(ShellState::default()),
            lanes: Arc::default(),
            egress: tokio::sync::Mutex::new(None),
            paused: Mutex::new(None),
            resuming: Mutex::new(None),
        }
    }

    /// Whether the session counts as paused: its container stopped or being stopped for a
    /// pause, nothing resuming it.
    fn is_paused(&self) -> bool {
        self.paused.lock().expect("paused lock").is_some()
    }

    /// Whether the session is paused and its container stopped (what callers are told).
    fn is_stopped(&self) -> bool {
        self.paused.lock().expect("paused lock").as_ref().is_some_and(|p| p.stopped)
    }

    /// Whether the live container is `id` (without waiting for a creation in progress), or
    /// the stopped container of the paused session is.
    fn container_id_is(&self, id: &str) -> bool {
        self.container.try_lock().is_ok_and(|c| c.as_deref() == Some(id))
            || self.paused.lock().expect("paused lock").as_ref().is_some_and(|p| p.container == id)
    }

    fn touch(&self) {
        *self.last_used.lock().expect("last_used lock") = (Instant::now(), SystemTime::now());
    }

    /// Sets the session's last use to `at` (in the past): its idle clock runs from then.
    fn used_at(&self, at: SystemTime) {
        let ago = SystemTime::now().duration_since(at).unwrap_or_default();
        let instant = Instant::now().checked_sub(ago).unwrap_or_else(Instant::now);
        *self.last_used.lock().expect("last_used lock") = (instant, at);
    }

    fn workspace(&self) -> Option<String> {
        self.workspace.lock().expect("workspace lock").clone()
    }

    /// Makes sure a channel of this process carries the egress of the live container `id`
    /// (opening one when none does), and, with replicas, claims it so that the calling
    /// call's connections come here. No-op without egress.
    async fn ensure_egress(&self, inner: &Inner, docker: &Docker, id: &str) -> Result<(), SandboxError> {
        let Some(egress) = &inner.egress else { return Ok(()) };
        let mut channel = self.egress.lock().await;
        if let Some(c) = channel.as_ref().filter(|c| c.serves(id)) {
            if inner.config.replica_id.is_none() {
                return Ok(());
            }
            if c.claim().await.is_ok() {
                return Ok(());
            }
        }
        // Opening claims.
        *channel = None;
        *channel = Some(egress.open_channel(docker, id, &self.key).await?);
        Ok(())
    }

    /// Ends the session's egress channel (the container is stopping or going).
    async fn stop_egress(&self) {
        self.egress.lock().await.take();
    }

    /// The workspace volume, or the one a cold container would get.
    fn workspace_or_default(&self) -> String {
        self.workspace().unwrap_or_else(|| self.names.volume.clone())
    }
}

/// Where a new session goes (`Sandbox::place`).
struct Placed {
    /// Index in `Inner::hosts`.
    host: usize,
    /// Its running container, when one exists there already.
    container: Option<String>,
    /// The workspace volume of its existing container (running or not).
    workspace: Option<String>,
}

/// A call's hold on a session: keeps the reaper away while the call runs.
pub(crate) struct Lease {
    slot: Arc<Slot>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.slot.touch();
        self.slot.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Everything a tool needs for one call in one session.
pub(crate) struct SessionCtx<'a> {
    pub(crate) inner: &'a Inner,
    pub(crate) docker: &'a Docker,
    lease: Lease,
    /// Per-task environment for Bash (secrets); never logged.
    pub(crate) env: &'a [(String, String)],
    /// The resolved path the call was approved for; resolving to anything else is refused.
    pub(crate) approved_path: Option<&'a crate::agent::ResolvedPath>,
}

impl fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sandbox").field("scope", &self.inner.config.scope).finish_non_exhaustive()
    }
}

impl Sandbox {
    /// A sandbox manager for `config`. Validates the configuration only: Docker is contacted
    /// at the first tool use, so this succeeds on hosts without Docker.
    pub fn new(config: SandboxConfig) -> Result<Self, SandboxError> {
        config.validate()?;
        let defaults = config.hosts.is_empty() && config.docker_host.is_none();
        let hosts = config
            .docker_hosts()
            .into_iter()
            .map(|spec| Host {
                spec,
                defaults,
                docker: tokio::sync::OnceCell::new(),
                observer: tokio::sync::OnceCell::new(),
                pool: WarmPool::new(config.warm_pool, config.warm_pool_max, config.warm_pool_decay),
                disks: crate::disk::Attacher::new(&config.image, container::helper_labels(&config.scope)),
                runtimes: std::sync::OnceLock::new(),
            })
            .collect();
        let tag = config.replica_id.clone().map(|replica| Arc::new(exec::AgentTag { replica, life: new_life() }));
        let egress = match &config.egress {
            Some(e) => {
                let policy = e.resolve(|name| std::env::var(name).ok())?;
                Some(Arc::new(Egress::new(policy)))
            }
            None => None,
        };
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                hosts,
                sessions: Mutex::new(HashMap::new()),
                metrics: Metrics::default(),
                shut_down: AtomicBool::new(false),
                reaper: Mutex::new(None),
                object_locks: (0..OBJECT_LOCK_STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
                egress,
                tag,
                last_stray_sweep: Mutex::new(None),
                downloads: tokio::sync::Semaphore::new(MAX_CONCURRENT_DOWNLOADS),
                snapshots: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// The configuration in effect.
    pub fn config(&self) -> &SandboxConfig {
        &self.inner.config
    }

    /// Connects to every Docker host now (instead of at first use), adopting this scope's
    /// leftovers on each, and starts filling their warm pools (which otherwise start with
    /// the first session placed on them). Fails only when no host is reachable; a host that
    /// is down is logged and connected at its next use.
    pub async fn connect(&self) -> Result<(), SandboxError> {
        let results = futures_util::future::join_all((0..self.inner.hosts.len()).map(|at| self.host_docker(at))).await;
        let mut errors = Vec::new();
        for (at, r) in results.into_iter().enumerate() {
            match r {
                Ok(docker) => pool::start(&self.inner, at, docker),
                Err(e) => {
                    tracing::warn!(docker_host = self.inner.hosts[at].endpoint(), error = %e, "Docker host unreachable");
                    errors.push(e.to_string());
                }
            }
        }
        if errors.len() == self.inner.hosts.len() {
            return Err(SandboxError::DockerUnavailable(errors.join("; ")));
        }
        Ok(())
    }

    /// Whether each Docker host answers now, in configuration order: connects first to
    /// those this sandbox has not reached yet (adopting this scope's leftovers there, as
    /// the first use would).
    pub async fn ping_hosts(&self) -> Vec<HostStatus> {
        // Over the observer connection: a probe (an unauthenticated `/readyz`) never starts
        // a host's adoption, which a probe's timeout could cut short (regression: review).
        let pings = self.inner.hosts.iter().enumerate().map(|(at, host)| async move {
            let answer = match self.observer_docker(at).await {
                Err(e) => Err(e.to_string()),
                Ok(docker) => docker
                    .ping()
                    .await
                    .map(drop)
                    .map_err(|e| format!("the Docker Engine at {} does not answer: {e}", host.endpoint())),
            };
            // An engine that answers but cannot run the configured runtimes is not ready.
            let answer = match answer {
                Ok(()) => match self.observer_docker(at).await {
                    Ok(docker) => self.checked_runtimes(at, docker).await.map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                },
                Err(e) => Err(e),
            };
            HostStatus { endpoint: host.endpoint().to_string(), error: answer.err() }
        });
        futures_util::future::join_all(pings).await
    }

    /// Readiness: `Ok` when at least one Docker host answers (new sessions go there; the
    /// sessions of a host that is down fail until it is back). Each failing host is logged;
    /// the error names them all when none answers.
    pub async fn ping(&self) -> Result<(), SandboxError> {
        let statuses = self.ping_hosts().await;
        let failing: Vec<String> = statuses.iter().filter_map(|s| s.error.clone()).collect();
        for (s, e) in statuses.iter().filter_map(|s| s.error.as_ref().map(|e| (s, e))) {
            tracing::warn!(docker_host = %s.endpoint, error = %e, "Docker host does not answer");
        }
        if failing.len() == statuses.len() {
            return Err(SandboxError::DockerUnavailable(failing.join("; ")));
        }
        Ok(())
    }

    /// The Docker hosts' endpoints, in configuration order.
    pub fn docker_hosts(&self) -> Vec<String> {
        self.inner.hosts.iter().map(|h| h.endpoint().to_string()).collect()
    }

    /// Adds a receiver of every session's egress reports — each decision within the
    /// session's record budget, and counts of those past it (the host's audit log and task
    /// streams); without `sandbox.egress` there are none to receive.
    pub fn on_egress(&self, observer: EgressObserver) {
        if let Some(e) = &self.inner.egress {
            e.observe(observer);
        }
    }

    /// Narrows the egress of `key`'s session by `narrowings` (an agent file's and a task's
    /// lists) while the returned hold lives: hold it for the length of a tool call. Every
    /// new connection and request of the session is judged by the operator's policy
    /// narrowed by every narrowing its running calls hold. No-op without `sandbox.egress`
    /// (there is no way out to narrow) or without narrowings. With replicas the narrowings
    /// are shared ([`Sandbox::share_egress_holds`]) before this returns, or it fails and
    /// the call must not run.
    pub async fn hold_egress(
        &self,
        key: &SessionKey,
        narrowings: &[Arc<egress::EgressNarrowing>],
    ) -> Result<egress::EgressHold, SandboxError> {
        self.hold_egress_with(key, narrowings, &[]).await
    }

    /// [`Sandbox::hold_egress`], and the session's proxy adds `credentials` (the calling
    /// task's, [`egress::Credential::task`]) to its plain-HTTP requests to their hosts while
    /// the hold lives: hold it for the length of one of that task's calls. Whatever process
    /// of the session sends such a request meanwhile gets the credential (a session's
    /// sandbox is one machine); running calls holding different values for one header of
    /// one host get none and their requests there are refused. No-op without
    /// `sandbox.egress`.
    pub async fn hold_egress_with(
        &self,
        key: &SessionKey,
        narrowings: &[Arc<egress::EgressNarrowing>],
        credentials: &[Arc<egress::Credential>],
    ) -> Result<egress::EgressHold, SandboxError> {
        match &self.inner.egress {
            Some(e) => e.hold(key, narrowings, credentials).await,
            None => Ok(egress::EgressHold::none(key)),
        }
    }

    /// With replicas (`replica_id`): shares the narrowings of this process's calls through
    /// `board` and judges every connection by those of the other replicas' calls too, so a
    /// session's connections are judged alike by whichever replica serves them. Set once,
    /// before the first call; no-op without `sandbox.egress`.
    pub fn share_egress_holds(&self, board: Arc<dyn egress::EgressBoard>) -> Result<(), SandboxError> {
        match &self.inner.egress {
            Some(e) => e.share_holds(board),
            None => Ok(()),
        }
    }

    /// The egress policy in effect (`None`: no egress). Its credential values are for the
    /// host's scrubbers only.
    pub fn egress_policy(&self) -> Option<&EgressPolicy> {
        self.inner.egress.as_ref().map(|e| &*e.policy)
    }

    /// Counters for `/metrics` and the CLI.
    pub fn metrics(&self) -> MetricsSnapshot {
        let mut m = self.inner.metrics.snapshot();
        m.warm_pool_ready = self.inner.hosts.iter().map(|h| h.pool.ready_len() as u64).sum();
        m.warm_pool_target = self.inner.hosts.iter().map(|h| h.pool.target() as u64).sum();
        (m.disk_helpers_total, m.disks_attached_total) =
            self.inner.hosts.iter().map(|h| h.disks.counts()).fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
        m
    }

    /// The connection to Docker host `at`, made at its first use: connects, adopts this
    /// scope's leftovers there and starts the reaper (once for all hosts). Errors name the
    /// host.
    pub(crate) async fn host_docker(&self, at: usize) -> Result<&Docker, SandboxError> {
        if self.inner.shut_down.load(Ordering::Acquire) {
            return Err(SandboxError::ShutDown);
        }
        let host = &self.inner.hosts[at];
        host.docker
            .get_or_try_init(|| async {
                let docker = connect(host).await?;
                // No session is made under a runtime the engine cannot serve it with.
                self.checked_runtimes(at, &docker).await?;
                adopt_leftovers(&self.inner, at, &docker).await?;
                let mut reaper = self.inner.reaper.lock().expect("reaper lock");
                if reaper.is_none() {
                    *reaper = Some(tokio::spawn(reap_loop(Arc::downgrade(&self.inner))));
                }
                Ok::<_, SandboxError>(docker)
            })
            .await
            .map_err(|e| on_host(host.endpoint(), e))
    }

    /// Docker host `at` for listing and pruning: this sandbox's connection when it has one,
    /// else one that adopts nothing (see `Host::observer`). Whatever uses it must leave
    /// other hosts' running containers alone.
    async fn observer_docker(&self, at: usize) -> Result<&Docker, SandboxError> {
        if self.inner.shut_down.load(Ordering::Acquire) {
            return Err(SandboxError::ShutDown);
        }
        let host = &self.inner.hosts[at];
        if let Some(docker) = host.docker.get() {
            return Ok(docker);
        }
        host.observer.get_or_try_init(|| connect(host)).await.map_err(|e| on_host(host.endpoint(), e))
    }

    /// Reads host `at`'s runtimes and checks the configuration against them
    /// ([`crate::runtime::check`]); kept for listings once read.
    async fn checked_runtimes(&self, at: usize, docker: &Docker) -> Result<(), SandboxError> {
        let host = &self.inner.hosts[at];
        let engine = EngineRuntimes::read(docker).await.map_err(|e| on_host(host.endpoint(), e))?;
        crate::runtime::check(&self.inner.config, &engine, host.endpoint())?;
        let _ = host.runtimes.set(engine);
        Ok(())
    }

    /// Whether each Docker host can run this sandbox's sessions under every runtime the
    /// configuration names (registered, and able to serve the egress and network settings),
    /// in configuration order: `Err(DockerUnavailable)` for a host that does not answer,
    /// `Err(Config)` naming the settings for one that cannot serve them. Adopts nothing.
    pub async fn check_runtimes(&self) -> Vec<(String, Result<(), SandboxError>)> {
        let checks = (0..self.inner.hosts.len()).map(|at| async move {
            let endpoint = self.inner.hosts[at].endpoint().to_string();
            let result = match self.observer_docker(at).await {
                Ok(docker) => self.checked_runtimes(at, docker).await,
                Err(e) => Err(e),
            };
            (endpoint, result)
        });
        futures_util::future::join_all(checks).await
    }

    /// Names the Docker host of `key`'s session in an unavailability error.
    pub(crate) fn name_host(&self, key: &SessionKey, e: SandboxError) -> SandboxError {
        let at = self.inner.sessions.lock().expect("sessions lock").get(key).map(|s| s.host);
        match at {
            Some(at) => on_host(self.inner.hosts[at].endpoint(), e),
            None => e,
        }
    }

    /// Where a session this sandbox does not hold goes: the host that already has its
    /// container (made by another replica, or before a restart), found by its name and
    /// host label on each reachable host; else the reachable host with the fewest session
    /// containers of this scope (ties: configuration order). Hosts that do not answer are
    /// passed over (logged); none answering is an error naming each.
    async fn place(&self, key: &SessionKey) -> Result<Placed, SandboxError> {
        let hosts = &self.inner.hosts;
        if hosts.len() == 1 {
            return Ok(Placed { host: 0, container: None, workspace: None });
        }
        let scope = self.inner.config.scope.as_str();
        let names = container::names(scope, key);
        let lists = futures_util::future::join_all(hosts.iter().enumerate().map(|(at, host)| async move {
            let docker = self.host_docker(at).await?;
            match tokio::time::timeout(PLACEMENT_LIST_TIMEOUT, container::list_managed(docker, Some(scope))).await {
                Ok(listed) => listed.map_err(|e| on_host(host.endpoint(), e)),
                Err(_) => Err(SandboxError::DockerUnavailable(format!(
                    "Docker host {} did not list its containers within {PLACEMENT_LIST_TIMEOUT:?}",
                    host.endpoint()
                ))),
            }
        }))
        .await;
        // This sandbox's own sessions per host: those whose containers are still being made
        // are not listed yet.
        let mut load: Vec<HashSet<String>> = vec![HashSet::new(); hosts.len()];
        for s in self.inner.sessions.lock().expect("sessions lock").values() {
            load[s.host].insert(s.names.container.clone());
        }
        let mut reachable = Vec::new();
        let mut errors = Vec::new();
        for (at, listed) in lists.into_iter().enumerate() {
            let listed = match listed {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(docker_host = hosts[at].endpoint(), error = %e, "Docker host unreachable; placing new sessions elsewhere");
                    errors.push(e.to_string());
                    continue;
                }
            };
            for c in listed.iter().filter(|c| hosts[at].owns(c.labels.as_ref(), hosts)) {
                let Some(name) = container::container_name(c) else { continue };
                if name == names.container {
                    // The name is predictable: only a container the labels prove the session's is it.
                    let docker = self.host_docker(at).await?;
                    container::check_session_container(docker, c, scope, key).await?;
                    let running = matches!(c.state, Some(ContainerSummaryStateEnum::RUNNING));
                    tracing::info!(user = %key.user_id, session = %key.session_id, docker_host = hosts[at].endpoint(), running, "session container found");
                    return Ok(Placed {
                        host: at,
                        container: running.then(|| c.id.clone()).flatten(),
                        workspace: container::workspace_mount(c.mounts.as_deref()),
                    });
                }
                // Session containers only: a pool container never handed out (still under
                // its pool name) and a disk helper (no key, no pool label) serve none.
                let labels = c.labels.as_ref();
                let session = container::key_from_labels(labels).is_some()
                    || (labels.is_some_and(|l| l.contains_key(container::LABEL_POOL))
                        && !name.starts_with(container::POOL_PREFIX));
                if session {
                    load[at].insert(name);
                }
            }
            reachable.push(at);
        }
        let Some(&host) = reachable.iter().min_by_key(|&&at| (load[at].len(), at)) else {
            return Err(SandboxError::DockerUnavailable(format!("no Docker host answers: {}", errors.join("; "))));
        };
        Ok(Placed { host, container: None, workspace: None })
    }

    /// Whether this sandbox holds `key`'s session now (has used or adopted it, and not
    /// ended, reaped or let go of it).
    pub(crate) fn holds_session(&self, key: &SessionKey) -> bool {
        self.inner.sessions.lock().expect("sessions lock").contains_key(key)
    }

    /// Takes a lease on the session (creating its slot, not yet its container).
    pub(crate) async fn session<'a>(
        &'a self,
        key: &SessionKey,
        env: &'a [(String, String)],
    ) -> Result<SessionCtx<'a>, SandboxError> {
        key.validate()?;
        if self.inner.shut_down.load(Ordering::Acquire) {
            return Err(SandboxError::ShutDown);
        }
        let known = self.inner.sessions.lock().expect("sessions lock").get(key).map(|s| s.host);
        let placed = match known {
            Some(host) => Placed { host, container: None, workspace: None },
            None => self.place(key).await?,
        };
        // The chosen host is connected now (placement listed it), unless it is the only one.
        self.host_docker(placed.host).await?;
        let (slot, reached) = {
            let mut map = self.inner.sessions.lock().expect("sessions lock");
            let (slot, reached) = match map.get(key) {
                Some(s) => {
                    // A paused session runs again only with room for it under the limits.
                    if s.is_paused() {
                        room_for_session(&map, key, &self.inner.config)?;
                        let paused = s.paused.lock().expect("paused lock").take();
                        *s.resuming.lock().expect("resuming lock") = paused;
                    }
                    (s.clone(), false)
                }
                None => {
                    room_for_session(&map, key, &self.inner.config)?;
                    let reached = placed.container.is_some();
                    let slot =
                        Arc::new(Slot::new(&self.inner, key.clone(), placed.host, placed.container, placed.workspace));
                    map.insert(key.clone(), slot.clone());
                    (slot, reached)
                }
            };
            slot.in_flight.fetch_add(1, Ordering::AcqRel);
            (slot, reached)
        };
        let lease = Lease { slot };
        let at = lease.slot.host;
        let docker = self.host_docker(at).await?;
        if reached {
            // A running container another replica made: serve it as it is (its commands
            // may be that replica's, so nothing is swept).
            self.inner.metrics.sessions_active.fetch_add(1, Ordering::Relaxed);
        }
        // A host's pool starts with the first session placed on it (listing or pruning
        // never starts it).
        pool::start(&self.inner, at, docker);
        let ctx = SessionCtx { inner: &self.inner, docker, lease, env, approved_path: None };
        // Create the container now so that creation errors surface before any tool work
        // (its egress channel is the work's own: `container` before each command claims it).
        if let Err(e) = ctx.live_container().await {
            self.inner.forget_if_empty(&ctx.lease.slot).await;
            return Err(on_host(self.inner.hosts[at].endpoint(), e));
        }
        Ok(ctx)
    }

    /// Pauses `key`'s session now (see `sandbox.pause_after`): its container is stopped —
    /// every process in it ends — and its workspace kept; the next call (or
    /// [`Sandbox::resume_session`]) starts it again. Returns whether it was running (a
    /// session already paused stays so). [`SandboxError::SessionNotFound`] when this
    /// sandbox does not hold the session; [`SandboxError::SessionBusy`] while a call runs.
    #[tracing::instrument(skip(self), fields(user = %key.user_id, session = %key.session_id))]
    pub async fn pause_session(&self, key: &SessionKey) -> Result<bool, SandboxError> {
        key.validate()?;
        if self.inner.config.replica_id.is_some() {
            return Err(SandboxError::LifecycleUnavailable(
                "sandbox sessions cannot be paused with replicas (`replica_id`): another replica may be running a call in the session's container".into(),
            ));
        }
        let slot = self.held(key)?;
        let docker = self.host_docker(slot.host).await?;
        self.inner.pause(docker, &slot).await.map_err(|e| on_host(self.inner.hosts[slot.host].endpoint(), e))
    }

    /// Pauses every session of `user_id` named `session_id` this sandbox holds (under any
    /// runtime) whose container runs no call, when idle sessions are paused at all
    /// ([`crate::SandboxConfig::pauses_idle_sessions`]): what the host does as soon as every task
    /// of the session waits for a person, rather than after `pause_after`. Returns how many
    /// it paused; a busy session, or one past the paused-session limits, is left running
    /// (logged at debug level).
    pub async fn pause_idle_session(&self, user_id: &str, session_id: &str) -> usize {
        if !self.inner.config.pauses_idle_sessions() {
            return 0;
        }
        let slots: Vec<Arc<Slot>> = {
            let map = self.inner.sessions.lock().expect("sessions lock");
            map.iter()
                .filter(|(k, s)| k.user_id == user_id && k.session_id == session_id && !s.is_paused())
                .map(|(_, s)| s.clone())
                .collect()
        };
        let mut paused = 0;
        for slot in slots {
            let Ok(docker) = self.host_docker(slot.host).await else { continue };
            match self.inner.pause(docker, &slot).await {
                Ok(true) => paused += 1,
                Ok(false) => {}
                Err(e) => tracing::debug!(user = %user_id, session = %session_id, error = %e, "session not paused"),
            }
        }
        paused
    }

    /// Starts a paused session's container again now rather than at its next call.
    /// Returns whether it was paused; [`SandboxError::SessionNotFound`] when this sandbox
    /// does not hold the session.
    #[tracing::instrument(skip(self), fields(user = %key.user_id, session = %key.session_id))]
    pub async fn resume_session(&self, key: &SessionKey) -> Result<bool, SandboxError> {
        key.validate()?;
        let was_paused = self.held(key)?.is_stopped();
        // Taking a lease starts the container (a paused one again).
        self.session(key, &[]).await?;
        Ok(was_paused)
    }

    /// Forks `source`'s session into a new session `fork` of the same user: its workspace
    /// is a copy of the source's at this moment (copy-on-write where the Docker host's file
    /// system supports it, a sparse copy otherwise; a running source's file system is
    /// frozen for the copy, so writes of its running calls wait), and it gets a container of
    /// its own. Nothing else is shared: no process, no shell state (the fork's Bash starts
    /// in /workspace), no lanes, no egress proxy, no secret. The source is left as it was
    /// (a paused source stays paused). [`SandboxError::SessionNotFound`] when this sandbox
    /// does not hold `source`; [`SandboxError::SessionExists`] when `fork` exists; the
    /// usual session limits apply to the fork.
    #[tracing::instrument(skip(self), fields(user = %source.user_id, session = %source.session_id, fork = %fork.session_id))]
    pub async fn fork_session(&self, source: &SessionKey, fork: &SessionKey) -> Result<(), SandboxError> {
        source.validate()?;
        fork.validate()?;
        if source.user_id != fork.user_id {
            return Err(SandboxError::InvalidInput {
                tool: "fork".into(),
                message: "a fork belongs to the source session's user".into(),
            });
        }
        if source == fork {
            return Err(SandboxError::SessionExists { session: fork.to_string() });
        }
        if self.inner.config.replica_id.is_some() {
            return Err(SandboxError::LifecycleUnavailable(
                "sandbox sessions cannot be forked with replicas (`replica_id`): the source's container may be another replica's".into(),
            ));
        }
        let src = self.held(source)?;
        self.new_session_from(fork, src.host, CopyFrom::Session(src)).await?;
        tracing::info!(user = %fork.user_id, session = %fork.session_id, source = %source.session_id, "session forked");
        Ok(())
    }

    /// Makes the new session `key` on host `at`, its workspace a copy of `from`, with a
    /// container of its own (never one from the warm pool): what a fork and a session from
    /// a snapshot share. The usual session limits apply; [`SandboxError::SessionExists`]
    /// when `key` is taken (here, or by a container of another process).
    async fn new_session_from(&self, key: &SessionKey, at: usize, from: CopyFrom) -> Result<(), SandboxError> {
        let docker = self.host_docker(at).await?;
        let endpoint = self.inner.hosts[at].endpoint();
        // The new session's slot holds its room under the limits from here.
        let slot = {
            let mut map = self.inner.sessions.lock().expect("sessions lock");
            if map.contains_key(key) {
                return Err(SandboxError::SessionExists { session: key.to_string() });
            }
            room_for_session(&map, key, &self.inner.config)?;
            let slot = Arc::new(Slot::new(&self.inner, key.clone(), at, None, None));
            slot.in_flight.fetch_add(1, Ordering::AcqRel);
            map.insert(key.clone(), slot.clone());
            slot
        };
        let lease = Lease { slot };
        let ctx = SessionCtx { inner: &self.inner, docker, lease, env: &[], approved_path: None };
        let made = async {
            // A session of that id this sandbox does not hold (another process's) is taken.
            let scope = self.inner.config.scope.as_str();
            if container::find(docker, scope, key).await?.is_some() {
                return Err(SandboxError::SessionExists { session: key.to_string() });
            }
            // Held until the first container runs on the copy: no call, pause or end of the
            // new session runs in between (an end would detach the copy's disk, whose
            // device the container is about to mount).
            let mut guard = ctx.lease.slot.container.lock().await;
            // And the key's object lock, from the copy until that container mounts the copy's
            // disk: an end of a session this sandbox did not hold yet removes by key under it.
            let objects = self.inner.object_lock(key).lock().await;
            let copied_disk = match self.inner.copy_into_session(docker, at, &from, key).await {
                Ok(disk) => disk.map(|options| CopiedDisk { options, _objects: objects }),
                Err(e) => {
                    if let Err(r) = container::remove_session(docker, &self.inner.config, key, None).await {
                        tracing::warn!(error = %r, "removing a failed copy of a workspace failed");
                    }
                    return Err(e);
                }
            };
            *ctx.lease.slot.workspace.lock().expect("workspace lock") = Some(ctx.lease.slot.names.volume.clone());
            ctx.live_container_locked(&mut guard, copied_disk).await?;
            drop(guard);
            ctx.container().await
        }
        .await;
        match made {
            Ok(id) => {
                tracing::debug!(container = %id, "session made from a copy");
                Ok(())
            }
            Err(e) => {
                let slot = ctx.lease.slot.clone();
                drop(ctx);
                let mut map = self.inner.sessions.lock().expect("sessions lock");
                if map.get(key).is_some_and(|s| Arc::ptr_eq(s, &slot))
                    && slot.container.try_lock().is_ok_and(|c| c.is_none())
                {
                    map.remove(key);
                }
                Err(on_host(endpoint, e))
            }
        }
    }

    /// Takes the snapshot `name` of `source`'s workspace: a copy of it at this moment
    /// (copy-on-write where the Docker host's file system can, sparse otherwise; a running
    /// source's file system is frozen for the copy) stored on the source's Docker host and
    /// attached to no container (`crate::snapshot`). Only the workspace: no process, shell
    /// state, environment or secret. The source is left as it was.
    /// [`SandboxError::SessionNotFound`] when this sandbox does not hold `source`;
    /// [`SandboxError::SnapshotExists`] when its user has a snapshot of that name;
    /// [`SandboxError::TooManySnapshots`] past `max_snapshots_per_user` or
    /// `snapshot_disk_budget`.
    #[tracing::instrument(skip(self), fields(user = %source.user_id, session = %source.session_id))]
    pub async fn snapshot_session(&self, source: &SessionKey, name: &str) -> Result<SnapshotInfo, SandboxError> {
        source.validate()?;
        snapshot::validate_name(name)?;
        let cfg = &self.inner.config;
        if cfg.replica_id.is_some() {
            return Err(SandboxError::LifecycleUnavailable(
                "snapshots are not available with replicas (`replica_id`): the source's container may be another replica's".into(),
            ));
        }
        let src = self.held(source)?;
        let at = src.host;
        let docker = self.host_docker(at).await?;
        let endpoint = self.inner.hosts[at].endpoint();
        let _one_at_a_time = self.inner.snapshots.lock().await;
        let existing = self.list_snapshots(None).await?;
        if existing.iter().any(|i| i.user_id == source.user_id && i.name == name) {
            return Err(SandboxError::SnapshotExists { name: name.to_string() });
        }
        room_for_snapshot(&existing, &source.user_id, name, cfg)?;
        // End snapshots (`snapshot_on_end`) give way to named ones.
        self.inner.room_among_end_snapshots(existing.len()).await?;
        let volume = snapshot::volume_name(&cfg.scope, &source.user_id, name);
        let labels = snapshot::labels(
            &cfg.scope,
            endpoint,
            cfg.replica_id.as_deref(),
            (source.user_id.as_str(), name, source.session_id.as_str()),
            snapshot::Format::of(cfg),
        );
        let copied = match self.inner.copy_workspace(docker, &src, &volume, labels).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(SandboxError::InvalidInput {
                tool: "snapshot".into(),
                message: format!("session `{}` has no workspace yet: run a call in it first", source.session_id),
            }),
            Err(e) => Err(e),
        };
        if let Err(e) = copied {
            if let Err(r) = container::remove_volume(docker, cfg, &volume).await {
                tracing::warn!(error = %r, "removing a failed snapshot's volume failed");
            }
            return Err(on_host(endpoint, e));
        }
        tracing::info!(name, "snapshot taken");
        let listed = snapshot::list(docker, &cfg.scope, Some(&source.user_id), endpoint).await?;
        listed.into_iter().find(|i| i.name == name).ok_or_else(|| SandboxError::SnapshotNotFound { name: name.into() })
    }

    /// The snapshots of this scope on every Docker host, of `user` only when given, sorted
    /// by name (then host). Hosts that do not answer are an error: a listing that leaves
    /// some out would let the limits pass.
    pub async fn list_snapshots(&self, user: Option<&str>) -> Result<Vec<SnapshotInfo>, SandboxError> {
        let scope = self.inner.config.scope.as_str();
        let mut out = Vec::new();
        for (at, host) in self.inner.hosts.iter().enumerate() {
            let docker = self.host_docker(at).await?;
            out.extend(
                snapshot::list(docker, scope, user, host.endpoint()).await.map_err(|e| on_host(host.endpoint(), e))?,
            );
        }
        out.sort_by(|a, b| (&a.name, &a.docker_host).cmp(&(&b.name, &b.docker_host)));
        Ok(out)
    }

    /// Deletes `user`'s snapshot `name` (on whichever Docker host stores it).
    /// [`SandboxError::SnapshotNotFound`] when the user has none of that name.
    #[tracing::instrument(skip(self))]
    pub async fn delete_snapshot(&self, user: &str, name: &str) -> Result<(), SandboxError> {
        snapshot::validate_name(name)?;
        let (at, _) = self.find_snapshot(user, name).await?;
        let docker = self.host_docker(at).await?;
        let volume = snapshot::volume_name(&self.inner.config.scope, user, name);
        container::remove_volume(docker, &self.inner.config, &volume)
            .await
            .map_err(|e| on_host(self.inner.hosts[at].endpoint(), e))?;
        tracing::info!(user, name, "snapshot deleted");
        Ok(())
    }

    /// Makes the new session `key` from its user's snapshot `name`: its workspace a copy of
    /// the snapshot (which stays as it was), on the Docker host that stores it, with a
    /// container of its own and nothing else of the session the snapshot was taken of.
    /// [`SandboxError::SnapshotNotFound`] when the user has none of that name;
    /// [`SandboxError::SessionExists`] when `key` is taken. Returns the snapshot.
    #[tracing::instrument(skip(self), fields(user = %key.user_id, session = %key.session_id))]
    pub async fn session_from_snapshot(&self, key: &SessionKey, name: &str) -> Result<SnapshotInfo, SandboxError> {
        key.validate()?;
        snapshot::validate_name(name)?;
        if self.inner.config.replica_id.is_some() {
            return Err(SandboxError::LifecycleUnavailable(
                "snapshots are not available with replicas (`replica_id`)".into(),
            ));
        }
        let (at, info) = self.find_snapshot(&key.user_id, name).await?;
        let volume = snapshot::volume_name(&self.inner.config.scope, &key.user_id, name);
        self.new_session_from(key, at, CopyFrom::Snapshot(volume)).await?;
        tracing::info!(name, "session made from a snapshot");
        Ok(info)
    }

    /// `sandbox.snapshot_on_end`: makes the ended session `key` again from its end snapshot
    /// (which is used up), for a task resumed after its session ended. Returns whether it
    /// did: false when snapshots on end are off, the session lives (here or elsewhere), or it
    /// has no end snapshot.
    #[tracing::instrument(skip(self), fields(user = %key.user_id, session = %key.session_id))]
    pub async fn restore_ended_session(&self, key: &SessionKey) -> Result<bool, SandboxError> {
        key.validate()?;
        let cfg = &self.inner.config;
        if !cfg.snapshot_on_end || cfg.replica_id.is_some() || self.held(key).is_ok() {
            return Ok(false);
        }
        let volume = snapshot::end_volume_name(&cfg.scope, &key.user_id, &key.session_id);
        for at in 0..self.inner.hosts.len() {
            let docker = self.host_docker(at).await?;
            if !snapshot::end_exists(docker, &volume).await? {
                continue;
            }
            match self.new_session_from(key, at, CopyFrom::Snapshot(volume.clone())).await {
                Ok(()) => {}
                Err(SandboxError::SessionExists { .. }) => return Ok(false),
                Err(e) => return Err(e),
            }
            container::remove_volume(docker, cfg, &volume).await?;
            tracing::info!("session made again from its end snapshot");
            return Ok(true);
        }
        Ok(false)
    }

    /// Where `user`'s snapshot `name` is: its host and what it is.
    async fn find_snapshot(&self, user: &str, name: &str) -> Result<(usize, SnapshotInfo), SandboxError> {
        let scope = self.inner.config.scope.as_str();
        for (at, host) in self.inner.hosts.iter().enumerate() {
            let docker = self.host_docker(at).await?;
            let listed = snapshot::list(docker, scope, Some(user), host.endpoint()).await?;
            if let Some(info) = listed.into_iter().find(|i| i.name == name) {
                return Ok((at, info));
            }
        }
        Err(SandboxError::SnapshotNotFound { name: name.to_string() })
    }

    /// Whether this sandbox holds `key`'s session paused now.
    pub fn is_paused(&self, key: &SessionKey) -> bool {
        self.inner.sessions.lock().expect("sessions lock").get(key).is_some_and(|s| s.is_stopped())
    }

    /// The slot of a session this sandbox holds, or [`SandboxError::SessionNotFound`].
    fn held(&self, key: &SessionKey) -> Result<Arc<Slot>, SandboxError> {
        self.inner
            .sessions
            .lock()
            .expect("sessions lock")
            .get(key)
            .cloned()
            .ok_or_else(|| SandboxError::SessionNotFound { session: key.to_string() })
    }

    /// Ends a session this host created, if it could have: a host that never talked to
    /// Docker (text-only work) cannot have made anything for a session it created, so Docker
    /// is not contacted at all (no connection, no adoption sweep of the scope).
    pub async fn end_session_created_here(&self, key: &SessionKey) -> Result<bool, SandboxError> {
        if self.inner.hosts.iter().all(|h| h.docker.get().is_none()) {
            return Ok(false);
        }
        self.end_session(key).await
    }

    /// Ends a session now: removes its container and workspace volume. Returns whether this
    /// host knew the session (its container/volume are removed either way).
    #[tracing::instrument(skip(self), fields(user = %key.user_id, session = %key.session_id))]
    pub async fn end_session(&self, key: &SessionKey) -> Result<bool, SandboxError> {
        key.validate()?;
        let known = self.inner.sessions.lock().expect("sessions lock").get(key).map(|s| s.host);
        if let Some(at) = known {
            let docker = self.host_docker(at).await?;
            let slot = self.inner.sessions.lock().expect("sessions lock").remove(key);
            if let Some(slot) = slot {
                self.inner.destroy(docker, &slot).await.map_err(|e| on_host(self.inner.hosts[at].endpoint(), e))?;
                return Ok(true);
            }
        }
        // Not this sandbox's: its container may be on any host (made by another replica).
        let mut errors = Vec::new();
        for at in 0..self.inner.hosts.len() {
            let docker = match self.host_docker(at).await {
                Ok(d) => d,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let _objects = self.inner.object_lock(key).lock().await;
            // A container that came from the pool mounts a pool volume: removal asks it.
            if let Err(e) = container::remove_session(docker, &self.inner.config, key, None).await {
                errors.push(on_host(self.inner.hosts[at].endpoint(), e));
            }
        }
        match errors.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(false),
        }
    }

    /// Removes every session of this host (containers and volumes) and stops the reaper.
    /// Further calls fail with [`SandboxError::ShutDown`]. With `replica_id` the sessions
    /// stay (the other replicas serve them on; see [`SandboxConfig::replica_id`]); only the
    /// warm pool goes.
    pub async fn shutdown(&self) -> Result<(), SandboxError> {
        let started = Instant::now();
        self.inner.shut_down.store(true, Ordering::Release);
        if let Some(h) = self.inner.reaper.lock().expect("reaper lock").take() {
            h.abort();
        }
        // The pools close first (nothing more is handed out or prepared, and no session
        // ended below makes room for a fill); then their fills in flight, their ready
        // containers and the sessions all go at once. A `warden mcp` ends when its client
        // closes stdin and is killed a few seconds later: the teardown takes the longest
        // removal, not the sum of them.
        // (`join_all` collects its futures here: every pool is closed before the sessions
        // are taken.)
        let pools = futures_util::future::join_all(self.inner.hosts.iter().enumerate().filter_map(|(at, host)| {
            let docker = host.docker.get()?;
            let ready = pool::close(&*self.inner, at);
            Some(async move {
                pool::shutdown(&*self.inner, at, docker, ready).await.map_err(|e| on_host(host.endpoint(), e))
            })
        }));
        let slots: Vec<Arc<Slot>> =
            self.inner.sessions.lock().expect("sessions lock").drain().map(|(_, s)| s).collect();
        let sessions = async {
            if self.inner.config.replica_id.is_some() {
                // The other replicas serve these sessions on: each stays until no replica used
                // it for the idle TTL (or this replica, back, adopts it).
                futures_util::future::join_all(slots.iter().map(|s| self.inner.release(s))).await;
                return Vec::new();
            }
            futures_util::future::join_all(slots.iter().filter_map(|s| {
                let host = &self.inner.hosts[s.host];
                let docker = host.docker.get()?;
                Some(async move { self.inner.destroy(docker, s).await.map_err(|e| on_host(host.endpoint(), e)) })
            }))
            .await
        };
        let (pool_results, results) = tokio::join!(pools, sessions);
        let elapsed_ms = started.elapsed().as_millis() as u64;
        tracing::info!(sessions = slots.len(), elapsed_ms, "sandbox shut down");
        results.into_iter().chain(pool_results).collect::<Result<Vec<()>, _>>().map(|_| ())
    }

    /// Every warden-managed session container on the engine (all scopes), with this host's
    /// last-use time for the sessions it owns. Read-only: a host that has not connected yet
    /// connects without adopting its scope's leftovers (they may be a live host's).
    /// With several Docker hosts: those that do not answer are left out (logged); an error
    /// only when none answers.
    pub async fn list_sessions(&self) -> Result<Vec<SessionInfo>, SandboxError> {
        let hosts = &self.inner.hosts;
        let mut errors = Vec::new();
        let mut out: Vec<SessionInfo> = Vec::new();
        for (at, host) in hosts.iter().enumerate() {
            match self.list_host_sessions(at).await {
                Ok(rows) => {
                    for row in rows {
                        // Two endpoints in front of one engine list the same container: the
                        // row of the host it was placed on wins.
                        match out.iter_mut().find(|r| r.container_id == row.container_id) {
                            Some(r) if row.docker_host == host.endpoint() => *r = row,
                            Some(_) => {}
                            None => out.push(row),
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(docker_host = host.endpoint(), error = %e, "Docker host unreachable; its sessions are not listed");
                    errors.push(e.to_string());
                }
            }
        }
        if errors.len() == hosts.len() {
            return Err(SandboxError::DockerUnavailable(errors.join("; ")));
        }
        out.sort_by(|a, b| (&a.scope, &a.key, &a.docker_host).cmp(&(&b.scope, &b.key, &b.docker_host)));
        Ok(out)
    }

    /// The sessions on Docker host `at` (see `list_sessions`).
    async fn list_host_sessions(&self, at: usize) -> Result<Vec<SessionInfo>, SandboxError> {
        let docker = self.observer_docker(at).await?;
        let endpoint = self.inner.hosts[at].endpoint();
        let listed = container::list_managed(docker, None).await.map_err(|e| on_host(endpoint, e))?;
        let bindings = container::list_bindings(docker, None).await.map_err(|e| on_host(endpoint, e))?;
        let owned: HashMap<String, (SystemTime, bool)> = self
            .inner
            .sessions
            .lock()
            .expect("sessions lock")
            .values()
            .map(|s| (s.names.container.clone(), (s.last_used.lock().expect("last_used lock").1, s.is_stopped())))
            .collect();
        let out: Vec<SessionInfo> = listed
            .into_iter()
            .filter_map(|c| {
                // Pool containers not handed out serve no session: not listed.
                let key = container::session_of(&c, &bindings)?;
                let name = container::container_name(&c)?;
                let scope = c.labels.as_ref()?.get(container::LABEL_SCOPE).cloned().unwrap_or_default();
                let (last_used, paused) = match owned.get(&name) {
                    Some(&(t, paused)) => (Some(t), paused),
                    None => (None, false),
                };
                let docker_host = container::host_label(c.labels.as_ref()).unwrap_or(endpoint).to_string();
                let runtime =
                    c.labels.as_ref().and_then(|l| l.get(container::LABEL_RUNTIME)).cloned().unwrap_or_else(|| {
                        self.inner.hosts[at]
                            .runtimes
                            .get()
                            .map_or(crate::runtime::ENGINE_DEFAULT_RUNTIME, |r| r.default.as_str())
                            .to_string()
                    });
                Some(SessionInfo {
                    runtime,
                    docker_host,
                    key,
                    owned_here: last_used.is_some() && scope == self.inner.config.scope,
                    scope,
                    container_id: c.id.clone().unwrap_or_default(),
                    container_name: name,
                    state: c.state.map(|s| s.to_string()).unwrap_or_default(),
                    created: SystemTime::UNIX_EPOCH + Duration::from_secs(c.created.unwrap_or(0).max(0) as u64),
                    last_used,
                    paused,
                })
            })
            .collect();
        Ok(out)
    }

    /// Removes warden-labelled containers that exited (or died) longer ago than this host's
    /// `idle_ttl` and warden-labelled volumes no container uses (theirs, or older than two minutes), in any scope; never this
    /// host's live sessions, never a snapshot (kept until deleted). Running or just-created containers of other hosts are left to
    /// their owners (or to adoption when their host restarts). Like listing, this never
    /// adopts: run against the scope of a live host, it leaves that host's sessions and warm
    /// pool alone.
    pub async fn prune(&self) -> Result<PruneReport, SandboxError> {
        self.prune_inner(false).await
    }

    /// Removes every warden-labelled container and volume (any scope, running or not,
    /// snapshots included) except this host's live sessions. For operators (`warden sandbox prune --all`) and test sweeps.
    pub async fn prune_all(&self) -> Result<PruneReport, SandboxError> {
        self.prune_inner(true).await
    }

    /// Removes one warden-labelled volume by name (absent is success), first detaching the
    /// loop device of a `sandbox.disk` image (`warden-disk-…`): removing that volume with
    /// `docker volume rm` leaves the loop device attached to the deleted image, holding its
    /// space and a device until the Docker host reboots. For clean-up tools and test
    /// harnesses; refuses a volume without warden's label. Never adopts anything.
    /// With several Docker hosts: removed on each (a host that does not answer fails it).
    pub async fn remove_volume(&self, name: &str) -> Result<(), SandboxError> {
        for at in 0..self.inner.hosts.len() {
            let docker = self.observer_docker(at).await?;
            self.remove_host_volume(docker, name).await.map_err(|e| on_host(self.inner.hosts[at].endpoint(), e))?;
        }
        Ok(())
    }

    async fn remove_host_volume(&self, docker: &Docker, name: &str) -> Result<(), SandboxError> {
        match docker.inspect_volume(name).await {
            Err(e) if crate::error::docker_status(&e) == Some(404) => Ok(()),
            Err(e) => Err(SandboxError::from_docker("inspect volume", e)),
            Ok(v) if v.labels.get(container::LABEL_MANAGED).map(String::as_str) != Some("true") => {
                Err(SandboxError::Docker {
                    action: "remove volume".into(),
                    message: format!("{name} has no {}=true label; warden leaves it alone", container::LABEL_MANAGED),
                })
            }
            Ok(_) => container::remove_volume(docker, &self.inner.config, name).await,
        }
    }

    async fn prune_inner(&self, all: bool) -> Result<PruneReport, SandboxError> {
        let mut report = PruneReport::default();
        for at in 0..self.inner.hosts.len() {
            let endpoint = self.inner.hosts[at].endpoint();
            let pruned = match self.observer_docker(at).await {
                Ok(docker) => self.prune_host(docker, all, &mut report).await,
                Err(e) => Err(e),
            };
            if let Err(e) = pruned {
                let e = on_host(endpoint, e);
                if !matches!(e, SandboxError::DockerUnavailable(_)) {
                    return Err(e);
                }
                tracing::warn!(docker_host = endpoint, error = %e, "Docker host unreachable; not pruned");
                report.unreachable_hosts.push(e.to_string());
            }
        }
        if report.unreachable_hosts.len() == self.inner.hosts.len() {
            return Err(SandboxError::DockerUnavailable(report.unreachable_hosts.join("; ")));
        }
        tracing::info!(
            containers = report.containers.len(),
            volumes = report.volumes.len(),
            all,
            "pruned sandbox leftovers"
        );
        Ok(report)
    }

    /// Prunes one Docker host into `report` (see `prune`).
    async fn prune_host(&self, docker: &Docker, all: bool, report: &mut PruneReport) -> Result<(), SandboxError> {
        let with_disk = |v: String| [v.clone()].into_iter().chain(crate::disk::disk_of(&v));
        // This host's sessions and pool containers, and every volume they use.
        let pooled: Vec<String> = self.inner.hosts.iter().flat_map(|h| h.pool.container_names()).collect();
        let mut live_containers: HashSet<String> = pooled.iter().cloned().collect();
        let mut live_volumes: HashSet<String> =
            pooled.iter().flat_map(|n| with_disk(container::volume_of(n))).collect();
        for s in self.inner.sessions.lock().expect("sessions lock").values() {
            live_containers.insert(s.names.container.clone());
            live_volumes.insert(s.names.binding.clone());
            live_volumes.extend(with_disk(s.names.volume.clone()).chain(with_disk(s.workspace_or_default())));
        }
        // The volumes a container uses: what it mounts at /workspace, that volume's disk (no
        // container mounts it) and its binding (never mounted either).
        let uses = |c: &bollard::models::ContainerSummary, name: &str| -> Vec<String> {
            container::workspace_mount(c.mounts.as_deref())
                .into_iter()
                .chain(Some(container::volume_of(name)))
                .flat_map(with_disk)
                .chain(container::binding_of(name))
                .collect()
        };
        let mut in_use: HashSet<String> = HashSet::new();
        let mut freed: HashSet<String> = HashSet::new();
        for c in container::list_managed(docker, None).await? {
            let Some(name) = container::container_name(&c) else { continue };
            // Only exited or dead containers are leftovers; `created` ones may be mid-creation
            // by another host, running ones belong to a live host.
            let finished = matches!(c.state, Some(ContainerSummaryStateEnum::EXITED | ContainerSummaryStateEnum::DEAD));
            if live_containers.contains(&name) || (!finished && !all) {
                in_use.extend(uses(&c, &name));
                continue;
            }
            // A session container of a live host (another process of this scope, or another
            // scope) whose main process just died is no leftover: that host recreates it on
            // the same workspace at its next call. Only containers that exited longer ago
            // than the idle TTL (when the host would have reaped the session anyway) go.
            if !all {
                let finished_at = finished_at(docker, c.id.as_deref().unwrap_or(&name)).await;
                let ttl = self.inner.config.idle_ttl;
                if exited_recently(finished_at, created_at(&c), SystemTime::now(), ttl) {
                    in_use.extend(uses(&c, &name));
                    continue;
                }
            }
            container::remove_container(docker, c.id.as_deref().unwrap_or(&name)).await?;
            freed.extend(uses(&c, &name));
            report.containers.push(name);
        }
        for v in container::list_volumes(docker, None, !all).await? {
            // Snapshots are kept until deleted (no container ever mounts one); `--all` too.
            if live_volumes.contains(&v.name) || in_use.contains(&v.name) || (!all && snapshot::is_snapshot(&v)) {
                continue;
            }
            // A dangling volume may belong to a session another host is creating right now:
            // only volumes of containers removed above, or old enough, are leftovers.
            let ours = freed.contains(&v.name);
            let old = serde_json::to_value(&v.created_at)
                .ok()
                .and_then(|t| t.as_str().and_then(|t| humantime::parse_rfc3339_weak(t).ok()))
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= PRUNE_MIN_VOLUME_AGE);
            if !all && !ours && !old {
                continue;
            }
            container::remove_volume(docker, &self.inner.config, &v.name).await?;
            report.volumes.push(v.name);
        }
        Ok(())
    }
}

/// When the container `c` was created (Docker's `Created`, in seconds).
fn created_at(c: &bollard::models::ContainerSummary) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(c.created.unwrap_or(0).max(0) as u64)
}

/// When the container `id` last exited, as Docker's inspect says; `None` when it did not
/// answer or gave no usable time (its zero time, `0001-01-01…`, never parses).
async fn finished_at(docker: &Docker, id: &str) -> Option<SystemTime> {
    let inspected =
        docker.inspect_container(id, None::<bollard::query_parameters::InspectContainerOptions>).await.ok()?;
    humantime::parse_rfc3339_weak(&inspected.state?.finished_at?).ok()
}

/// Whether a container that exited (at `finished_at`, or if Docker gave no usable time, not
/// before `created`) did so less than `ttl` before `now`: `prune` leaves such a container and
/// its volumes alone, as a live host may still use that session (it recreates the container on
/// the same workspace). A time in the future (clock skew) counts as recent.
fn exited_recently(finished_at: Option<SystemTime>, created: SystemTime, now: SystemTime, ttl: Duration) -> bool {
    let at = finished_at.unwrap_or(created).max(created);
    now.duration_since(at).map_or(true, |age| age < ttl)
}

impl Drop for Inner {
    /// Wakes the pool's refill task, which holds no strong reference: it sees the host gone,
    /// waits for its fills (which remove what they made) and ends.
    fn drop(&mut self) {
        for h in &self.hosts {
            h.pool.kick();
        }
    }
}

/// The warm pool's view of the sandbox (see [`PoolHost`]).
impl PoolHost for Inner {
    fn pool(&self, at: usize) -> &WarmPool {
        &self.hosts[at].pool
    }

    fn endpoint(&self, at: usize) -> &str {
        self.hosts[at].endpoint()
    }

    fn config(&self) -> &SandboxConfig {
        &self.config
    }

    fn egress(&self) -> Option<&Arc<Egress>> {
        self.egress.as_ref()
    }

    fn disks(&self, at: usize) -> &Arc<crate::disk::Attacher> {
        &self.hosts[at].disks
    }

    fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    fn with_session_count<R>(&self, at: usize, f: impl FnOnce(usize) -> R) -> R {
        let map = self.sessions.lock().expect("sessions lock");
        let other_pools: usize =
            self.hosts.iter().enumerate().filter(|(i, _)| *i != at).map(|(_, h)| h.pool.reserved()).sum();
        // Paused sessions hold no container: the pool may use their room.
        f(map.values().filter(|s| !s.is_paused()).count() + other_pools)
    }

    fn object_lock(&self, key: &SessionKey) -> &tokio::sync::Mutex<()> {
        Inner::object_lock(self, key)
    }

    fn agent_tag(&self) -> Option<Arc<exec::AgentTag>> {
        self.tag.clone()
    }
}

/// A name for this life of a replica, unique across its restarts and across the `Sandbox`es
/// of one process (tests run several replicas in one).
fn new_life() -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("{:x}-{now:x}-{n:x}", std::process::id())
}

/// Whether `sessions` has room for a new session of `key`: fewer than `max_sessions` in
/// all, and fewer than `max_sessions_per_user` of its user, so no user can take every
/// session of the host from the others. The one check every session this sandbox starts
/// holding (created, reached or adopted) passes, under the sessions lock.
fn room_for_session(
    sessions: &HashMap<SessionKey, Arc<Slot>>,
    key: &SessionKey,
    config: &SandboxConfig,
) -> Result<(), SandboxError> {
    // Paused sessions hold no container: they count against `max_paused_sessions` instead.
    let running = || sessions.values().filter(|s| !s.is_paused());
    if running().count() >= config.max_sessions {
        return Err(SandboxError::TooManySessions { max: config.max_sessions });
    }
    let of_user = running().filter(|s| s.key.user_id == key.user_id).count();
    if of_user >= config.max_sessions_per_user {
        return Err(SandboxError::TooManyUserSessions { user: key.user_id.clone(), max: config.max_sessions_per_user });
    }
    Ok(())
}

/// Whether one more snapshot, `user`'s `name`, fits the limits: fewer than
/// `max_snapshots_per_user` of that user, and every snapshot of the scope (each counted as
/// `disk`, what its image can hold) within `snapshot_disk_budget`.
fn room_for_snapshot(
    existing: &[SnapshotInfo],
    user: &str,
    name: &str,
    config: &SandboxConfig,
) -> Result<(), SandboxError> {
    let refuse = |reason: String| Err(SandboxError::TooManySnapshots { name: name.to_string(), reason });
    let of_user = existing.iter().filter(|i| i.user_id == user).count();
    if config.max_snapshots_per_user == 0 {
        return refuse("snapshots are off (sandbox.max_snapshots_per_user is 0)".into());
    }
    if of_user >= config.max_snapshots_per_user {
        return refuse(format!(
            "user `{user}` has {of_user} snapshots, the most sandbox.max_snapshots_per_user ({}) allows",
            config.max_snapshots_per_user
        ));
    }
    let reserved = (existing.len() as u64 + 1).saturating_mul(config.disk.0);
    if reserved > config.snapshot_disk_budget.0 {
        return refuse(format!(
            "{} snapshots of {} bytes (sandbox.disk) would pass sandbox.snapshot_disk_budget ({} bytes)",
            existing.len() + 1,
            config.disk.0,
            config.snapshot_disk_budget.0
        ));
    }
    Ok(())
}

/// What a new session's workspace is copied from.
enum CopyFrom {
    /// A live session of this sandbox (a fork).
    Session(Arc<Slot>),
    /// A snapshot volume (`crate::snapshot`).
    Snapshot(String),
}

/// Whether `sessions` has room for one more paused session, `key`'s: fewer than
/// `max_paused_sessions` paused, and their workspaces (each counted as `disk`, what it may
/// grow to) within `paused_disk_budget`. Checked under the sessions lock by every pause.
fn room_for_paused(
    sessions: &HashMap<SessionKey, Arc<Slot>>,
    key: &SessionKey,
    config: &SandboxConfig,
) -> Result<(), SandboxError> {
    let paused = sessions.values().filter(|s| s.is_paused()).count();
    let refuse = |reason: String| Err(SandboxError::TooManyPausedSessions { session: key.to_string(), reason });
    if paused >= config.max_paused_sessions {
        return refuse(format!("{paused} sessions are paused, the most sandbox.max_paused_sessions allows"));
    }
    let reserved = (paused as u64 + 1).saturating_mul(config.disk.0);
    if reserved > config.paused_disk_budget.0 {
        return refuse(format!(
            "{} paused workspaces of {} bytes (sandbox.disk) would pass sandbox.paused_disk_budget ({} bytes)",
            paused + 1,
            config.disk.0,
            config.paused_disk_budget.0
        ));
    }
    Ok(())
}

impl Inner {
    /// The lock over `key`'s Docker objects (see `object_locks`).
    fn object_lock(&self, key: &SessionKey) -> &tokio::sync::Mutex<()> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut h);
        &self.object_locks[h.finish() as usize % self.object_locks.len()]
    }

    /// Removes a slot that never got a container (creation failed) so it does not count
    /// against `max_sessions`.
    async fn forget_if_empty(&self, slot: &Arc<Slot>) {
        let empty = slot.container.lock().await.is_none();
        if !empty {
            return;
        }
        let mut map = self.sessions.lock().expect("sessions lock");
        // Our own lease still counts one.
        if slot.in_flight.load(Ordering::Acquire) <= 1 && map.get(&slot.key).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            map.remove(&slot.key);
        }
    }

    /// Removes a session's container and volume (waits for a creation in progress).
    async fn destroy(&self, docker: &Docker, slot: &Slot) -> Result<(), SandboxError> {
        self.keep_on_end(docker, slot).await;
        let mut guard = slot.container.lock().await;
        let had = guard.take();
        slot.agents.clear();
        slot.stop_egress().await;
        if had.is_some() {
            self.metrics.sessions_active.fetch_sub(1, Ordering::Relaxed);
            self.metrics.sessions_removed.fetch_add(1, Ordering::Relaxed);
        }
        // A paused session's stopped container goes by its name with the rest below.
        let paused = slot.paused.lock().expect("paused lock").take();
        if paused.is_some() {
            self.metrics.sessions_paused.fetch_sub(1, Ordering::Relaxed);
            self.metrics.sessions_removed.fetch_add(1, Ordering::Relaxed);
        }
        let removed = {
            let _objects = self.object_lock(&slot.key).lock().await;
            container::remove_session(docker, &self.config, &slot.key, slot.workspace().as_deref()).await
        };
        // Room under `max_sessions` for the pools again.
        for h in &self.hosts {
            h.pool.kick();
        }
        removed?;
        tracing::info!(user = %slot.key.user_id, session = %slot.key.session_id, "session removed");
        Ok(())
    }

    /// Pauses `slot`'s session: stops its container (every process in it ends) and keeps
    /// the container and its workspace for the next call, which starts it again. Refused
    /// while a call runs ([`SandboxError::SessionBusy`]) or past the paused-session limits;
    /// a session already paused, or with no container yet, stays as it is (`Ok(false)`).
    async fn pause(&self, docker: &Docker, slot: &Slot) -> Result<bool, SandboxError> {
        let mut guard = slot.container.lock().await;
        // Every call holds a lease from before it asks for the container (which waits for
        // this lock) until it is done: none runs in the container now, and a call arriving
        // meanwhile starts it again.
        if slot.in_flight.load(Ordering::Acquire) > 0 {
            return Err(SandboxError::SessionBusy { session: slot.key.to_string() });
        }
        let Some(id) = guard.clone() else { return Ok(false) };
        {
            let map = self.sessions.lock().expect("sessions lock");
            room_for_paused(&map, &slot.key, &self.config)?;
            // Counted as paused from here, so two pauses at once cannot pass the limits.
            *slot.paused.lock().expect("paused lock") = Some(Paused { container: id.clone(), stopped: false });
        }
        if let Err(e) = container::stop_for_pause(docker, &id).await {
            *slot.paused.lock().expect("paused lock") = None;
            return Err(e);
        }
        *guard = None;
        slot.agents.clear();
        // The channel ends with the container's processes; the resumed one gets a new one.
        slot.stop_egress().await;
        // (None: a call claimed it meanwhile; it waits for this lock to start it again.)
        if let Some(p) = slot.paused.lock().expect("paused lock").as_mut() {
            p.stopped = true;
        }
        self.metrics.sessions_active.fetch_sub(1, Ordering::Relaxed);
        self.metrics.sessions_paused.fetch_add(1, Ordering::Relaxed);
        self.metrics.pauses.fetch_add(1, Ordering::Relaxed);
        // Room under `max_sessions` for the pools again.
        for h in &self.hosts {
            h.pool.kick();
        }
        tracing::info!(user = %slot.key.user_id, session = %slot.key.session_id, container = %id, "session paused (container stopped, workspace kept)");
        Ok(true)
    }

    /// `sandbox.snapshot_on_end`: keeps the workspace of the ending session `slot` as its end
    /// snapshot (replacing an earlier one), making room within `snapshot_disk_budget` by
    /// removing the oldest end snapshots of the Docker hosts this sandbox is connected to.
    /// Never fails the end: what cannot be kept is logged.
    async fn keep_on_end(&self, docker: &Docker, slot: &Slot) {
        let cfg = &self.config;
        // A session under another runtime shares its id with the default one's: only the
        // default one's workspace is kept.
        if !cfg.snapshot_on_end || cfg.replica_id.is_some() || slot.key.runtime.is_some() {
            return;
        }
        let _one_at_a_time = self.snapshots.lock().await;
        let volume = snapshot::end_volume_name(&cfg.scope, &slot.key.user_id, &slot.key.session_id);
        let kept = async {
            container::remove_volume(docker, cfg, &volume).await?;
            let mut named = 0usize;
            for host in &self.hosts {
                if let Some(d) = host.docker.get() {
                    named += snapshot::list(d, &cfg.scope, None, host.endpoint()).await?.len();
                }
            }
            if !self.room_among_end_snapshots(named).await? {
                return Err(SandboxError::TooManySnapshots {
                    name: format!("end of session {}", slot.key),
                    reason: "named snapshots fill sandbox.snapshot_disk_budget".into(),
                });
            }
            let labels = snapshot::end_labels(
                &cfg.scope,
                self.hosts[slot.host].endpoint(),
                (slot.key.user_id.as_str(), slot.key.session_id.as_str()),
                snapshot::Format::of(cfg),
            );
            self.copy_workspace(docker, slot, &volume, labels).await
        }
        .await;
        match kept {
            Ok(true) => {
                tracing::info!(user = %slot.key.user_id, session = %slot.key.session_id, "workspace kept as the session's end snapshot")
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(user = %slot.key.user_id, session = %slot.key.session_id, error = %e, "the ended session's workspace is not kept");
                if let Err(r) = container::remove_volume(docker, cfg, &volume).await {
                    tracing::warn!(error = %r, "removing a failed end snapshot failed");
                }
            }
        }
    }

    /// Makes room for one more snapshot besides `named` named ones within
    /// `snapshot_disk_budget` (each counted as `disk`) by removing the oldest end snapshots
    /// (`snapshot_on_end`) of the Docker hosts this sandbox is connected to. Returns whether
    /// one more fits now. Called with `snapshots` held.
    async fn room_among_end_snapshots(&self, named: usize) -> Result<bool, SandboxError> {
        let cfg = &self.config;
        let mut ends: Vec<(String, String, usize)> = Vec::new();
        for (at, host) in self.hosts.iter().enumerate() {
            if let Some(d) = host.docker.get() {
                ends.extend(snapshot::list_end(d, &cfg.scope).await?.into_iter().map(|(v, t)| (t, v, at)));
            }
        }
        ends.sort();
        let fits = |n: usize| (n as u64 + 1).saturating_mul(cfg.disk.0) <= cfg.snapshot_disk_budget.0;
        let mut oldest = ends.iter();
        while !fits(named + oldest.len()) {
            let Some((_, old, at)) = oldest.next() else { return Ok(false) };
            if let Some(d) = self.hosts[*at].docker.get() {
                tracing::info!(volume = %old, "removing the oldest end snapshot to make room");
                container::remove_volume(d, cfg, old).await?;
            }
        }
        Ok(true)
    }

    /// Copies `src`'s workspace into the volume `target` (new, made with `labels`): with
    /// `sandbox.disk`, its image into `target` as the disk volume of a workspace; without,
    /// its files. Holds `src`'s container lock meanwhile, so the source is not paused,
    /// resumed or recreated during the copy; its running calls go on (their writes wait
    /// while its file system is frozen). Returns false, copying nothing, when the source has
    /// no workspace yet.
    async fn copy_workspace(
        &self,
        docker: &Docker,
        src: &Slot,
        target: &str,
        labels: HashMap<String, String>,
    ) -> Result<bool, SandboxError> {
        self.copy_workspace_attaching(docker, src, target, labels, false).await.map(|c| c.is_some())
    }

    /// [`Inner::copy_workspace`]; with `attach` (the copy is a new session's workspace disk),
    /// the copy's helper also attaches it, and its volume options come back inside the
    /// `Some` (none for plain workspaces). `None`: the source has no workspace yet.
    async fn copy_workspace_attaching(
        &self,
        docker: &Docker,
        src: &Slot,
        target: &str,
        labels: HashMap<String, String>,
        attach: bool,
    ) -> Result<Option<Option<crate::disk::VolumeOptions>>, SandboxError> {
        let cfg = &self.config;
        let guard = src.container.lock().await;
        let Some(source_ws) = src.workspace() else { return Ok(None) };
        let running = guard.is_some();
        match (cfg.disk.0, crate::disk::disk_of(&source_ws)) {
            (0, _) => crate::disk::copy_tree(docker, &cfg.image, &source_ws, target, labels).await.map(|()| Some(None)),
            (size, Some(source_disk)) => {
                let frozen = running.then_some(source_ws.as_str());
                let attach = attach.then_some((size, container::DISK_OWNER));
                crate::disk::copy(docker, &cfg.image, (&source_disk, frozen), target, labels, attach).await.map(Some)
            }
            _ => Err(SandboxError::Docker {
                action: "copy workspace".into(),
                message: format!("the workspace volume {source_ws} has no disk volume"),
            }),
        }
    }

    /// Makes `key`'s workspace (its deterministic volume names, on host `at`) a copy of
    /// `from`: a session's (a source with no workspace yet leaves it a fresh one) or a
    /// snapshot's, which must have been taken with the workspaces' current kind (an ext4
    /// image with `sandbox.disk`, files without). With `sandbox.disk`, the copy's helper
    /// attaches it too: its volume options are returned for the session's first container.
    async fn copy_into_session(
        &self,
        docker: &Docker,
        at: usize,
        from: &CopyFrom,
        key: &SessionKey,
    ) -> Result<Option<crate::disk::VolumeOptions>, SandboxError> {
        let cfg = &self.config;
        let names = container::names(&cfg.scope, key);
        let labels = container::labels(&cfg.scope, self.hosts[at].endpoint(), cfg.replica_id.as_deref(), key);
        let target = match (cfg.disk.0, crate::disk::disk_of(&names.volume)) {
            (0, _) => names.volume.clone(),
            (_, Some(disk)) => disk,
            (_, None) => {
                return Err(SandboxError::Docker {
                    action: "copy workspace".into(),
                    message: format!("the workspace volume {} has no disk volume name", names.volume),
                });
            }
        };
        match from {
            CopyFrom::Session(src) => {
                self.copy_workspace_attaching(docker, src, &target, labels, true).await.map(Option::flatten)
            }
            CopyFrom::Snapshot(volume) => {
                snapshot::check_format(docker, volume, snapshot::Format::of(cfg)).await?;
                match cfg.disk.0 {
                    0 => crate::disk::copy_tree(docker, &cfg.image, volume, &target, labels).await.map(|()| None),
                    size => {
                        let attach = Some((size, container::DISK_OWNER));
                        crate::disk::copy(docker, &cfg.image, (volume, None), &target, labels, attach).await
                    }
                }
            }
        }
    }

    /// Pauses the sessions with no call in flight idle for `pause_after` (each on its host);
    /// one that cannot be paused now (limits, a call starting) stays running.
    async fn pause_idle(&self) {
        if !self.config.pauses_idle_sessions() {
            return;
        }
        let after = self.config.pause_after;
        let idle: Vec<Arc<Slot>> = self
            .sessions
            .lock()
            .expect("sessions lock")
            .values()
            .filter(|s| {
                !s.is_paused()
                    && s.in_flight.load(Ordering::Acquire) == 0
                    && s.last_used.lock().expect("last_used lock").0.elapsed() >= after
            })
            .cloned()
            .collect();
        for slot in idle {
            let Some(docker) = self.hosts[slot.host].docker.get() else { continue };
            match self.pause(docker, &slot).await {
                Ok(_) | Err(SandboxError::SessionBusy { .. }) => {}
                Err(e) => {
                    tracing::debug!(user = %slot.key.user_id, session = %slot.key.session_id, error = %e, "idle session not paused")
                }
            }
        }
    }

    /// Removes sessions idle longer than the TTL with no call in flight, each on its host.
    async fn reap_idle(&self) {
        let ttl = self.config.idle_ttl;
        let expired: Vec<Arc<Slot>> = {
            let mut map = self.sessions.lock().expect("sessions lock");
            let keys: Vec<SessionKey> = map
                .values()
                .filter(|s| {
                    s.in_flight.load(Ordering::Acquire) == 0
                        && s.last_used.lock().expect("last_used lock").0.elapsed() >= ttl
                })
                .map(|s| s.key.clone())
                .collect();
            keys.iter().filter_map(|k| map.remove(k)).collect()
        };
        for slot in expired {
            let host = &self.hosts[slot.host];
            let Some(docker) = host.docker.get() else { continue };
            // With replicas, by the use mark (`agent::USE_MARK`): removed only when no replica
            // used it within the TTL, and held idle (no call starts on any replica) until it
            // is; a container without a mark (older warden) or no longer running is removed as
            // without replicas; one whose check failed is let go, not removed.
            let mut _hold = None;
            if self.config.replica_id.is_some() {
                let id = slot.container.lock().await.clone();
                let checked = match &id {
                    Some(id) => exec::use_check(docker, id, self.config.idle_ttl).await,
                    None => exec::UseCheck::NoMark,
                };
                let gone = matches!(checked, exec::UseCheck::Failed)
                    && !container::is_running(docker, id.as_deref().unwrap_or_default()).await.unwrap_or(true);
                match checked {
                    exec::UseCheck::Idle(hold) => _hold = Some(hold),
                    // Made by an older warden: removed as without replicas.
                    exec::UseCheck::NoMark => {}
                    exec::UseCheck::Failed if gone => {}
                    exec::UseCheck::InUse | exec::UseCheck::Failed => {
                        tracing::info!(user = %slot.key.user_id, session = %slot.key.session_id, "session idle here but used by another replica within the ttl (or its use is unknown); leaving it to the replicas");
                        self.release(&slot).await;
                        continue;
                    }
                }
            }
            tracing::info!(user = %slot.key.user_id, session = %slot.key.session_id, "session idle past ttl; removing");
            if let Err(e) = self.destroy(docker, &slot).await.map_err(|e| on_host(host.endpoint(), e)) {
                tracing::warn!(user = %slot.key.user_id, session = %slot.key.session_id, error = %e, "idle session removal failed");
            }
        }
        if self.config.replica_id.is_some() {
            self.reap_strays().await;
        }
    }

    /// Lets go of a session without removing anything: its container and workspace stay for
    /// the other replicas (the last one to use it removes it when idle).
    async fn release(&self, slot: &Slot) {
        let mut guard = slot.container.lock().await;
        if guard.take().is_some() {
            self.metrics.sessions_active.fetch_sub(1, Ordering::Relaxed);
        }
        slot.agents.clear();
        slot.stop_egress().await;
        // Room under `max_sessions` for the pools again.
        for h in &self.hosts {
            h.pool.kick();
        }
    }

    /// With replicas, at most once per idle TTL: removes the running session containers of
    /// this scope that some replica made, that this one does not hold, and that no replica
    /// used within the TTL (by their use marks): those of a
    /// replica that shut down (it leaves its sessions to the others) or died and never came
    /// back. A container without a use mark is left alone.
    async fn reap_strays(&self) {
        {
            let mut last = self.last_stray_sweep.lock().expect("stray sweep lock");
            if last.is_some_and(|t| t.elapsed() < self.config.idle_ttl) {
                return;
            }
            *last = Some(Instant::now());
        }
        let scope = self.config.scope.as_str();
        for host in &self.hosts {
            let Some(docker) = host.docker.get() else { continue };
            let (Ok(listed), Ok(bindings)) = (
                container::list_managed(docker, Some(scope)).await,
                container::list_bindings(docker, Some(scope)).await,
            ) else {
                continue;
            };
            for c in listed {
                let running = matches!(c.state, Some(ContainerSummaryStateEnum::RUNNING));
                let (Some(key), Some(name), Some(id)) =
                    (container::session_of(&c, &bindings), container::container_name(&c), c.id.as_deref())
                else {
                    continue;
                };
                let held = self.sessions.lock().expect("sessions lock").contains_key(&key);
                if !running
                    || held
                    || !host.owns(c.labels.as_ref(), &self.hosts)
                    || container::replica_label(c.labels.as_ref()).is_none()
                    || name != container::names(scope, &key).container
                {
                    continue;
                }
                let _objects = self.object_lock(&key).lock().await;
                if self.sessions.lock().expect("sessions lock").contains_key(&key) {
                    continue;
                }
                let exec::UseCheck::Idle(_hold) = exec::use_check(docker, id, self.config.idle_ttl).await else {
                    continue;
                };
                tracing::info!(user = %key.user_id, session = %key.session_id, container = %id, "session no replica used within the ttl; removing");
                let workspace = container::workspace_mount(c.mounts.as_deref());
                if let Err(e) = container::remove_session(docker, &self.config, &key, workspace.as_deref()).await {
                    tracing::warn!(user = %key.user_id, session = %key.session_id, error = %e, "removing an idle session of another replica failed");
                }
            }
        }
    }
}

impl<'a> SessionCtx<'a> {
    /// The session key.
    pub(crate) fn key(&self) -> &SessionKey {
        &self.lease.slot.key
    }

    /// The live container id: for a new session one from the warm pool if there is one,
    /// else (and to replace a vanished container, on the same workspace) a new one; with
    /// egress, served by a channel of this process (claimed, with replicas).
    pub(crate) async fn container(&self) -> Result<String, SandboxError> {
        let id = self.live_container().await?;
        let slot = &self.lease.slot;
        match slot.ensure_egress(self.inner, self.docker, &id).await {
            Ok(()) => Ok(id),
            // Its forwarder does not answer (it died, or the container predates channels):
            // a new container on the same workspace gets one.
            Err(e) => {
                tracing::warn!(user = %slot.key.user_id, session = %slot.key.session_id, container = %id, error = %e, "the session container's egress forwarder does not answer; replacing the container (its workspace stays)");
                self.replace_container(&id, "egress forwarder").await;
                let id = self.live_container().await?;
                slot.ensure_egress(self.inner, self.docker, &id).await?;
                Ok(id)
            }
        }
    }

    /// The live container, made, taken from the pool, resumed or reached first if needed.
    async fn live_container(&self) -> Result<String, SandboxError> {
        let mut guard = self.lease.slot.container.lock().await;
        self.live_container_locked(&mut guard, None).await
    }

    /// [`Self::live_container`] with the slot's container lock held by the caller.
    /// `copied_disk`: the workspace disk a copy just made and attached for this session
    /// (a fork's, a session's from a snapshot), which its first container mounts instead of
    /// attaching it again.
    async fn live_container_locked(
        &self,
        guard: &mut Option<String>,
        copied_disk: Option<CopiedDisk<'_>>,
    ) -> Result<String, SandboxError> {
        let slot = &self.lease.slot;
        if let Some(id) = &*guard {
            return Ok(id.clone());
        }
        let started = Instant::now();
        let resuming = slot.resuming.lock().expect("resuming lock").take();
        if let Some(paused) = resuming {
            self.inner.metrics.sessions_paused.fetch_sub(1, Ordering::Relaxed);
            match self.resume(paused).await {
                Ok(id) => {
                    self.inner.metrics.resumes.fetch_add(1, Ordering::Relaxed);
                    self.inner.metrics.sessions_active.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        user = %slot.key.user_id, session = %slot.key.session_id, container = %id,
                        took_ms = started.elapsed().as_millis() as u64, how = "resumed", "session container ready"
                    );
                    *guard = Some(id.clone());
                    return Ok(id);
                }
                // The workspace is what a pause keeps: a new container on it serves as well.
                Err(e) => {
                    tracing::warn!(user = %slot.key.user_id, session = %slot.key.session_id, error = %e, "a paused container could not be started again; making a new one on its workspace")
                }
            }
        }
        let mut workspace = slot.workspace();
        if self.inner.config.replica_id.is_some() {
            // Another replica may have made (or remade) the session's container: use it, or
            // at least its workspace. (Creation checks again, for a race with that replica.)
            let found = {
                // Never overlaps this sandbox's removal of the same session's objects.
                let _objects = self.inner.object_lock(&slot.key).lock().await;
                container::find(self.docker, &self.inner.config.scope, &slot.key).await?
            };
            match found {
                Some((id, true, found)) => {
                    *slot.workspace.lock().expect("workspace lock") = found.or(workspace);
                    return Ok(self.reached(guard, id, started));
                }
                Some((_, false, found)) if workspace.is_none() => workspace = found,
                _ => {}
            }
        }
        let new_session = workspace.is_none();
        // The pool's containers run under the sandbox's runtime: a key naming another is
        // always made cold, under its own.
        let poolable = new_session && slot.key.runtime.is_none() && self.inner.hosts[slot.host].pool.enabled();
        let warm = if poolable { pool::take(self.inner, slot.host, self.docker, &slot.key).await? } else { None };
        let (id, how) = match warm {
            Some(warm) => {
                slot.agents.absorb(warm.agents);
                *slot.workspace.lock().expect("workspace lock") = Some(warm.volume);
                (warm.id, "taken from the warm pool")
            }
            None => {
                if poolable {
                    self.inner.metrics.warm_misses.fetch_add(1, Ordering::Relaxed);
                }
                let volume = workspace.unwrap_or_else(|| slot.names.volume.clone());
                let cfg = &self.inner.config;
                let labels = container::labels(
                    &cfg.scope,
                    self.inner.hosts[slot.host].endpoint(),
                    cfg.replica_id.as_deref(),
                    &slot.key,
                );
                // The pool's growth waits while new sessions create their own containers.
                let _cold = poolable.then(|| self.inner.hosts[slot.host].pool.cold_start());
                let (copied_disk, held) = match copied_disk {
                    Some(CopiedDisk { options, _objects }) => (Some(options), Some(_objects)),
                    None => (None, None),
                };
                let made = {
                    // The copy's object lock, held since the copy, or the key's now.
                    let _objects = match held {
                        Some(held) => held,
                        None => self.inner.object_lock(&slot.key).lock().await,
                    };
                    container::create_and_start(
                        (self.docker, &self.inner.hosts[slot.host].disks),
                        cfg,
                        (&slot.names.container, &volume),
                        (labels, container::Owner::Session { scope: &cfg.scope, key: &slot.key }),
                        (self.inner.egress.as_deref(), &slot.agents),
                        container::NameTaken::of(cfg),
                        copied_disk,
                    )
                    .await?
                };
                let id = match made {
                    container::Made::Created(id) => id,
                    container::Made::Found { id, workspace } => {
                        *slot.workspace.lock().expect("workspace lock") = workspace.or(Some(volume));
                        return Ok(self.reached(guard, id, started));
                    }
                };
                *slot.workspace.lock().expect("workspace lock") = Some(volume);
                (id, "created")
            }
        };
        self.inner.metrics.sessions_created.fetch_add(1, Ordering::Relaxed);
        self.inner.metrics.sessions_active.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            user = %slot.key.user_id, session = %slot.key.session_id, container = %id,
            took_ms = started.elapsed().as_millis() as u64, how, "session container ready"
        );
        *guard = Some(id.clone());
        Ok(id)
    }

    /// Starts a paused session's stopped container again (with its egress forwarder; the
    /// channel opens with the call); on failure removes it (the workspace stays for a new
    /// container).
    async fn resume(&self, paused: Paused) -> Result<String, SandboxError> {
        let slot = &self.lease.slot;
        let id = paused.container;
        if let Err(e) =
            container::start_paused(self.docker, &self.inner.config, &id, (self.inner.egress.as_deref(), &slot.agents))
                .await
        {
            let _objects = self.inner.object_lock(&slot.key).lock().await;
            let _ = container::remove_container(self.docker, &id).await;
            return Err(e);
        }
        Ok(id)
    }

    /// Serves the running container `id` another replica made for the session (found by
    /// name when this one was about to make it): nothing in it is swept, it is that
    /// replica's as much as this one's.
    fn reached(&self, guard: &mut Option<String>, id: String, started: Instant) -> String {
        let slot = &self.lease.slot;
        self.inner.metrics.sessions_active.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            user = %slot.key.user_id, session = %slot.key.session_id, container = %id,
            took_ms = started.elapsed().as_millis() as u64, how = "reached (another replica's)", "session container ready"
        );
        *guard = Some(id.clone());
        id
    }

    /// Forgets a container that turned out to be gone, so the next use recreates it.
    pub(crate) async fn container_gone(&self, id: &str, why: &str) {
        let slot = &self.lease.slot;
        let mut guard = slot.container.lock().await;
        if guard.as_deref() == Some(id) {
            *guard = None;
            slot.agents.clear();
            slot.stop_egress().await;
            self.inner.metrics.sessions_active.fetch_sub(1, Ordering::Relaxed);
            self.inner.metrics.containers_recreated.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(user = %slot.key.user_id, session = %slot.key.session_id, container = %id, why, "session container gone; recreating");
        }
    }

    /// Removes a container that stopped cooperating; the next use creates a fresh one on
    /// the same workspace volume.
    pub(crate) async fn replace_container(&self, id: &str, why: &str) {
        self.container_gone(id, why).await;
        if let Err(e) = container::remove_container(self.docker, id).await {
            tracing::warn!(user = %self.key().user_id, session = %self.key().session_id, error = %e, "removing a wedged container failed");
        }
    }

    /// The user the tools run as.
    pub(crate) fn user(&self) -> &str {
        &self.inner.config.user
    }

    /// The working directory the next Bash call with this context's secrets starts in
    /// (`shell_state`: one per fingerprint of secrets).
    pub(crate) fn shell_cwd(&self) -> String {
        self.lease.slot.shell.lock().expect("shell state lock").cwd(writer_of(self.env))
    }

    /// Sends the next Bash call with this context's secrets back to /workspace.
    pub(crate) fn shell_reset(&self) {
        self.lease.slot.shell.lock().expect("shell state lock").reset(writer_of(self.env));
    }

    /// Records the working directory a Bash call with this context's secrets ended in (the
    /// agent's report).
    pub(crate) fn shell_update(&self, raw: &[u8]) {
        self.lease.slot.shell.lock().expect("shell state lock").update(writer_of(self.env), raw);
    }

    /// Pins the call to the resolved path it was approved for.
    pub(crate) fn pinned(mut self, approved: Option<&'a crate::agent::ResolvedPath>) -> Self {
        self.approved_path = approved;
        self
    }

    /// Waits, at most `within`, until a Bash command with `secrets` may run beside the
    /// session's running ones (`lanes`: only commands with the same secrets run at once).
    pub(crate) async fn secret_lane(
        &self,
        secrets: &[(String, String)],
        within: Duration,
    ) -> Result<LanePass, LaneTimeout> {
        self.lease.slot.lanes.enter(writer_of(secrets), within).await
    }

    /// Runs one agent request (a command under its timeout, or a file operation); recreates
    /// the container once if it vanished (the request had not started then, so the retry is
    /// safe).
    pub(crate) async fn call(&self, op: Op<'_>, timeout: Duration) -> Result<ExecResult, SandboxError> {
        self.call_in_lane(op, timeout, &mut None).await
    }

    /// [`SessionCtx::call`] for a command that runs in a lane: `lane` is kept until the
    /// command's processes are gone, also when this call is dropped midway (it then goes
    /// with the kill that `exec::run` starts).
    pub(crate) async fn call_in_lane(
        &self,
        op: Op<'_>,
        timeout: Duration,
        lane: &mut Option<LanePass>,
    ) -> Result<ExecResult, SandboxError> {
        let mut last = String::new();
        for _ in 0..2 {
            let id = self.container().await?;
            let req = ExecRequest { op, timeout, capture_limit: self.inner.config.max_output.0 as usize };
            let started = Instant::now();
            match exec::run(self.docker, &self.lease.slot.agents, &id, self.user(), req, lane).await {
                Ok(r) => {
                    self.inner.metrics.exec_done(started.elapsed(), r.timed_out);
                    self.inner.metrics.commands_started.fetch_add(r.new_commands, Ordering::Relaxed);
                    // The command changed the limits every process of the container runs
                    // with (gVisor): its result stands, the container goes (workspace kept).
                    if r.outcome.get("poisoned") == "1" {
                        self.replace_container(&id, exec::POISONED).await;
                    }
                    return Ok(r);
                }
                Err(ExecFailure::ContainerGone(why)) => {
                    self.container_gone(&id, &why).await;
                    last = why;
                }
                Err(ExecFailure::ContainerWedged(why)) => {
                    self.replace_container(&id, &why).await;
                    last = why;
                }
                Err(ExecFailure::Broken(why)) => {
                    self.replace_container(&id, &why).await;
                    return Err(SandboxError::Exec {
                        session: self.key().to_string(),
                        message: format!("{why}; the container was replaced (workspace kept) — retry the call"),
                    });
                }
                Err(ExecFailure::Failed(e)) => return Err(e),
            }
        }
        Err(SandboxError::Exec {
            session: self.key().to_string(),
            message: format!("container vanished twice: {last}"),
        })
    }
}

async fn connect(host: &Host) -> Result<Docker, SandboxError> {
    let endpoint = host.endpoint();
    let unavailable =
        |e: bollard::errors::Error| SandboxError::DockerUnavailable(format!("Docker host {endpoint}: {e}"));
    let (timeout, version) = (DOCKER_CLIENT_TIMEOUT_SECS, bollard::API_DEFAULT_VERSION);
    let kind = crate::config::endpoint_kind(endpoint).map_err(SandboxError::Config)?;
    let docker = match (host.defaults, kind, &host.spec.tls) {
        (true, _, _) => Docker::connect_with_defaults().map_err(unavailable)?,
        (false, EndpointKind::Unix, _) => Docker::connect_with_unix(endpoint, timeout, version).map_err(unavailable)?,
        (false, EndpointKind::Tcp { .. }, Some(tls)) => {
            Docker::connect_with_ssl(endpoint, &tls.key, &tls.cert, &tls.ca, timeout, version).map_err(unavailable)?
        }
        (false, EndpointKind::Tcp { .. }, None) => {
            Docker::connect_with_http(endpoint, timeout, version).map_err(unavailable)?
        }
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, docker.negotiate_version()).await {
        Ok(Ok(docker)) => Ok(docker),
        Ok(Err(e)) => {
            Err(SandboxError::DockerUnavailable(format!("cannot reach the Docker Engine at {endpoint}: {e}")))
        }
        Err(_) => Err(SandboxError::DockerUnavailable(format!(
            "the Docker Engine at {endpoint} did not answer within {CONNECT_TIMEOUT:?}"
        ))),
    }
}

/// What [`adopt_leftovers`] does with a leftover session container.
enum Adoption {
    /// Served again as the running session `key` (after its old commands are swept).
    Running(SessionKey),
    /// Kept as a paused session, its container stopped until the next call.
    Paused,
    /// Removed.
    None,
}

/// On connect: adopt this scope's running session containers (their workspace continues)
/// and its paused ones (stopped within the idle TTL, while pauses are on and there is room
/// under `max_paused_sessions` and `paused_disk_budget`), remove its other stopped ones,
/// its pool containers that were never handed out (the warm pool starts afresh), and volumes that belong to no adopted session. Other scopes are never
/// listed; containers and volumes labelled with another Docker host of this sandbox are
/// that host's (two endpoints may reach one engine) and left alone. With `replica_id`, so
/// are those of other replicas (and unlabelled ones): only this replica's own are adopted or
/// removed, and an adopted container loses only the agents (with their commands) of this
/// replica's earlier lives.
async fn adopt_leftovers(inner: &Inner, at: usize, docker: &Docker) -> Result<(), SandboxError> {
    let scope = inner.config.scope.as_str();
    let host = &inner.hosts[at];
    let replica = inner.config.replica_id.as_deref();
    // With replicas, only what this replica made is its to adopt or remove.
    let mine =
        |labels: Option<&HashMap<String, String>>| replica.is_none() || container::replica_label(labels) == replica;
    let mut adopted = 0usize;
    let mut others: HashSet<String> = HashSet::new();
    let bindings = container::list_bindings(docker, Some(scope)).await?;
    for c in container::list_managed(docker, Some(scope)).await? {
        let id = c.id.clone().unwrap_or_default();
        let known = inner.sessions.lock().expect("sessions lock").values().any(|s| s.container_id_is(&id));
        if !host.owns(c.labels.as_ref(), &inner.hosts) || known || !mine(c.labels.as_ref()) {
            // Another host's (or already adopted through another endpoint of this engine),
            // or another replica's: its volumes are in use.
            let name = container::container_name(&c).unwrap_or_default();
            others.extend(container::workspace_mount(c.mounts.as_deref()).into_iter().flat_map(|w| {
                [w.clone()].into_iter().chain(crate::disk::disk_of(&w)).chain(container::binding_of(&name))
            }));
            continue;
        }
        let running = matches!(c.state, Some(ContainerSummaryStateEnum::RUNNING));
        // A pool container serves the session its binding names; one never handed out
        // (still under its pool name, or renamed but never bound) serves none.
        let key = container::session_of(&c, &bindings);
        let name = container::container_name(&c);
        let workspace = container::workspace_mount(c.mounts.as_deref());
        // The container this host would make for the session `key`.
        let its_session = |key: &SessionKey| name.as_deref() == Some(container::names(scope, key).container.as_str());
        // A stopped one is a paused session's (or one whose container's main process ended):
        // kept paused when it exited within the idle TTL and pauses are on; its idle clock
        // runs from its exit.
        let exited = matches!(c.state, Some(ContainerSummaryStateEnum::EXITED));
        let stopped_at = match (&key, &workspace) {
            (Some(key), Some(_)) if exited && inner.config.pauses_idle_sessions() && its_session(key) => {
                let (finished, created) = (finished_at(docker, &id).await, created_at(&c));
                exited_recently(finished, created, SystemTime::now(), inner.config.idle_ttl)
                    .then(|| finished.unwrap_or(created).max(created))
            }
            _ => None,
        };
        let adopt = {
            let mut map = inner.sessions.lock().expect("sessions lock");
            match (key, workspace, stopped_at) {
                (Some(key), Some(workspace), _)
                    if running
                        && room_for_session(&map, &key, &inner.config).is_ok()
                        && its_session(&key)
                        && !map.contains_key(&key) =>
                {
                    tracing::info!(user = %key.user_id, session = %key.session_id, container = %id, "adopted session container from a previous host");
                    let slot = Arc::new(Slot::new(inner, key.clone(), at, Some(id.clone()), Some(workspace)));
                    map.insert(key.clone(), slot);
                    inner.metrics.sessions_active.fetch_add(1, Ordering::Relaxed);
                    Adoption::Running(key)
                }
                (Some(key), Some(workspace), Some(stopped_at)) if !map.contains_key(&key) => {
                    match room_for_paused(&map, &key, &inner.config) {
                        Ok(()) => {
                            tracing::info!(user = %key.user_id, session = %key.session_id, container = %id, "adopted paused session from a previous host");
                            let slot = Slot::new(inner, key.clone(), at, None, Some(workspace));
                            slot.used_at(stopped_at);
                            *slot.paused.lock().expect("paused lock") =
                                Some(Paused { container: id.clone(), stopped: true });
                            map.insert(key, Arc::new(slot));
                            inner.metrics.sessions_paused.fetch_add(1, Ordering::Relaxed);
                            Adoption::Paused
                        }
                        Err(e) => {
                            tracing::warn!(user = %key.user_id, session = %key.session_id, container = %id, error = %e, "removing a paused session of a previous host: no room for it");
                            Adoption::None
                        }
                    }
                }
                _ => Adoption::None,
            }
        };
        if let Adoption::Paused = adopt {
            // Nothing runs in a stopped container: the next call starts it again (and serves
            // its egress proxy), as after a pause by this host.
            adopted += 1;
            continue;
        }
        if let Adoption::Running(key) = adopt {
            // Commands of tasks the previous host was running when it died end here, before
            // anything of the container is served (its egress proxy included): a container
            // that cannot be swept is not adopted. A replica sweeps only the agents of its
            // own earlier lives (and their commands): another replica may be running a call
            // in the same container right now.
            let swept = match &inner.tag {
                Some(tag) => exec::sweep_earlier_lives(docker, &id, &inner.config.user, tag).await,
                None => exec::sweep_all(docker, &id, &inner.config.user).await,
            };
            if !swept {
                tracing::warn!(container = %id, "could not sweep the processes of a leftover session container; not adopting it");
                if inner.sessions.lock().expect("sessions lock").remove(&key).is_some() {
                    inner.metrics.sessions_active.fetch_sub(1, Ordering::Relaxed);
                }
                // Another replica may be using it: it stays, reached at its next call here.
                if inner.tag.is_none() {
                    container::remove_container(docker, &id).await?;
                }
                continue;
            }
            // Its egress channel opens with the next call, as for every container.
            adopted += 1;
        } else {
            tracing::info!(container = %id, "removing leftover session or pool container");
            container::remove_container(docker, &id).await?;
        }
    }
    let keep: HashSet<String> = inner
        .sessions
        .lock()
        .expect("sessions lock")
        .values()
        .flat_map(|s| {
            let w = s.workspace_or_default();
            [s.names.binding.clone()].into_iter().chain(crate::disk::disk_of(&w)).chain([w])
        })
        .collect();
    for v in container::list_volumes(docker, Some(scope), false).await? {
        if !keep.contains(&v.name)
            && !others.contains(&v.name)
            && !snapshot::is_snapshot(&v)
            && host.owns(Some(&v.labels), &inner.hosts)
            && mine(Some(&v.labels))
        {
            container::remove_volume(docker, &inner.config, &v.name).await?;
        }
    }
    if adopted > 0 {
        tracing::info!(adopted, scope, docker_host = host.endpoint(), "adopted sandbox sessions");
    }
    Ok(())
}

async fn reap_loop(inner: Weak<Inner>) {
    let interval = match inner.upgrade() {
        Some(i) => (i.config.idle_ttl.min(i.config.pause_after) / 4).clamp(REAPER_MIN_INTERVAL, REAPER_MAX_INTERVAL),
        None => return,
    };
    loop {
        tokio::time::sleep(interval).await;
        let Some(inner) = inner.upgrade() else { return };
        inner.reap_idle().await;
        inner.pause_idle().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prune_keeps_containers_that_exited_within_the_idle_ttl() {
        let ttl = Duration::from_secs(900);
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let created = now - Duration::from_secs(10_000);
        let ago = |s: u64| Some(now - Duration::from_secs(s));
        assert!(exited_recently(ago(0), created, now, ttl), "just exited");
        assert!(exited_recently(ago(899), created, now, ttl));
        assert!(!exited_recently(ago(900), created, now, ttl), "exited a whole TTL ago");
        assert!(!exited_recently(ago(5_000), created, now, ttl));
        assert!(exited_recently(Some(now + Duration::from_secs(5)), created, now, ttl), "clock skew");
        // No usable finish time: the creation time bounds it.
        assert!(!exited_recently(None, created, now, ttl));
        assert!(exited_recently(None, now - Duration::from_secs(60), now, ttl));
        // Docker's zero time ("0001-01-01") never parses, so it falls back to `created` too;
        // a finish time before the creation is impossible and counts as the creation.
        assert!(exited_recently(Some(SystemTime::UNIX_EPOCH), now - Duration::from_secs(60), now, ttl));
    }
}
