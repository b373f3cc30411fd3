//! The operator's `sandbox:` settings: every field optional, every default the safe one.
//!
//! This module only parses and validates; it must never weaken a default silently — a value
//! it cannot understand is a deserialisation or validation error, never "use something else".
//!
//! It sits at the bottom of the crate with the `sandbox.egress` section, whose types and
//! policy are `egress_policy.rs`'s: it names no container, session or Docker call.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::egress_policy::EgressConfig;
use crate::error::SandboxError;

/// Image used when the operator names none; built locally by `cargo xtask build`.
pub const DEFAULT_IMAGE: &str = "warden-sandbox:bookworm";
/// Network mode by default: no network at all, so untrusted code cannot exfiltrate or attack.
pub const DEFAULT_NETWORK: &str = "none";
/// Memory limit by default (512 MiB): enough for interpreters and builds of small projects,
/// small enough that a runaway process cannot starve the host.
pub const DEFAULT_MEMORY: ByteSize = ByteSize(512 * 1024 * 1024);
/// CPU limit by default: one core, so one session cannot monopolise a machine.
pub const DEFAULT_CPUS: f64 = 1.0;
/// Process limit by default: stops fork bombs while leaving room for shells and builds.
pub const DEFAULT_PIDS: i64 = 256;
/// Idle time after which a session's container and workspace are removed.
pub const DEFAULT_IDLE_TTL: Duration = Duration::from_secs(15 * 60);
/// Hard wall-clock limit per exec when the tool call names none (Claude Code's Bash default).
pub const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(120);
/// Concurrent sessions per host by default: bounds containers (and memory) one host can create.
pub const DEFAULT_MAX_SESSIONS: usize = 32;
/// Concurrent sessions of one user by default: room for a parent agent fanning out to a
/// dozen parallel subagents (each in a session of its own), while one user can take at most
/// half of the default `max_sessions` and the other users keep the rest.
pub const DEFAULT_MAX_SESSIONS_PER_USER: usize = 16;
/// Tool output cap by default (256 KiB): a model cannot use more, and the host must not buffer more.
pub const DEFAULT_MAX_OUTPUT: ByteSize = ByteSize(256 * 1024);
/// Container user by default: an unprivileged numeric uid:gid that needs no /etc/passwd entry.
pub const DEFAULT_USER: &str = "1000:1000";
/// Size of the tmpfs at /tmp by default: room for temp files and the shell state, bounded
/// because tmpfs pages count against the container's memory.
pub const DEFAULT_TMP_SIZE: ByteSize = ByteSize(64 * 1024 * 1024);
/// Workspace size limit by default (1 GiB): room for a checkout and its build, while one
/// session can never fill the Docker host's disk. `0` turns the limit off.
pub const DEFAULT_DISK: ByteSize = ByteSize(1024 * 1024 * 1024);
/// Smallest workspace limit accepted (ext4 needs room for its own metadata).
pub const MIN_DISK: u64 = 16 * 1024 * 1024;
/// Scope label by default; hosts sharing one Docker engine must use different scopes.
pub const DEFAULT_SCOPE: &str = "default";
/// The `uid:gid` the egress forwarder runs as in every container with `sandbox.egress`
/// (`egress/forwarder.py`): not the sandbox user's, so the agents' sweeps of that user never
/// end it and sandboxed code cannot signal it. Reserved: `user` may not have its uid.
pub const FORWARDER_USER: &str = "65533:65533";
/// Pre-warmed containers by default: two absorb a burst of two new sessions (a refill takes
/// about one cold start, ~0.8 s) while an idle host holds only two idle containers and two
/// sparse workspace images; they count against `max_sessions`.
pub const DEFAULT_WARM_POOL: usize = 2;
/// Largest size the warm pool grows to by default after a burst of new sessions found it
/// empty: half the default `max_sessions`, the fan-out of one user at
/// `max_sessions_per_user` (a parent agent starting a dozen subagents at once), while an
/// idle pool can never take more than half of the host's session room. Clamped to
/// `max_sessions` (sessions + pool never exceed it).
pub const DEFAULT_WARM_POOL_MAX: usize = 16;
/// How long the warm pool waits without a new session finding it empty before it halves
/// its growth above `warm_pool` by default: a minute keeps the containers a burst made for
/// the burst's next wave (subagents of one task arrive seconds apart), and an idle host
/// is back at `warm_pool` within a few minutes (16 → 2 in four halvings).
pub const DEFAULT_WARM_POOL_DECAY: Duration = Duration::from_secs(60);
/// Idle time after which a session's container is stopped (paused) by default: a few minutes,
/// long enough for a model's turn between tool calls, short enough that a session waiting
/// on a person holds no CPU or memory for the rest of `idle_ttl`.
pub const DEFAULT_PAUSE_AFTER: Duration = Duration::from_secs(5 * 60);
/// How long every task of a session must have waited for a person before the session is
/// paused by default (instead of after `pause_after`): half a minute lets a person who is
/// watching answer without the session losing its processes (a stdio MCP server's state,
/// a background build), while an approval left for hours frees its container soon.
pub const DEFAULT_PAUSE_WHEN_WAITING: Duration = Duration::from_secs(30);
/// Paused sessions one host keeps by default: each holds only its workspace (no memory, no
/// CPU), so twice the default `max_sessions`.
pub const DEFAULT_MAX_PAUSED_SESSIONS: usize = 64;
/// Disk the workspaces of paused sessions may reserve by default (each counts as its
/// `disk` limit, what it can grow to): 64 GiB, 64 default-sized workspaces.
pub const DEFAULT_PAUSED_DISK_BUDGET: ByteSize = ByteSize(64 * 1024 * 1024 * 1024);
/// Snapshots one user may keep by default: a handful of named states per user (before a
/// refactor, a known-good build) without one user filling the disk budget alone.
pub const DEFAULT_MAX_SNAPSHOTS_PER_USER: usize = 8;
/// Disk the snapshots of one scope may reserve together by default (each counts as its
/// `disk` limit, what its image can hold): 32 GiB, 32 default-sized workspaces.
pub const DEFAULT_SNAPSHOT_DISK_BUDGET: ByteSize = ByteSize(32 * 1024 * 1024 * 1024);

/// The `sandbox:` section of `warden.yaml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxConfig {
    /// Local image for session containers. Default `warden-sandbox:bookworm`: built locally
    /// (no registry is assumed); any image with bash and coreutils works (ripgrep for Glob/Grep).
    pub image: String,
    /// Docker network mode. Default `none`: sandboxed code gets no network unless the
    /// operator opens it (`bridge` or a named network); `host` and `container:<name>`
    /// (another container's network stack) are refused.
    pub network: String,
    /// Memory limit (`512MiB`, `1GiB`, or bytes). Default 512 MiB; swap is disabled so the
    /// limit is real. A process exceeding it is OOM-killed inside the container only.
    pub memory: ByteSize,
    /// CPU limit in cores. Default 1.0, so one session cannot starve the host; at least
    /// [`MIN_CPUS`] (less would round to no limit).
    pub cpus: f64,
    /// Maximum number of processes in the container. Default 256: contains fork bombs.
    pub pids: i64,
    /// Idle time (`15m`, `90s`) after which a session's container and volume are removed.
    /// Default 15 minutes: long enough for a conversation pause, short enough not to hoard.
    #[serde(with = "humantime_serde_compat")]
    pub idle_ttl: Duration,
    /// Idle time (`5m`) after which a session with no call running is paused: its container
    /// is stopped (no process survives, no memory or CPU is held) and its workspace kept;
    /// the next call starts it again. `idle_ttl` still ends it. Default 5 minutes; a value
    /// at or above `idle_ttl` never pauses. Off with `replica_id` (another replica may be
    /// running a call in the container).
    #[serde(with = "humantime_serde_compat")]
    pub pause_after: Duration,
    /// Time (`30s`) after which a session whose every task waits for a person (an approval
    /// of its own, or a subagent below it that waits for one) is paused, sooner than
    /// `pause_after`: the host checks again when it is up, and pauses only if all of them
    /// still wait. Default 30 seconds; at or above `pause_after` it changes nothing.
    #[serde(with = "humantime_serde_compat")]
    pub pause_when_waiting: Duration,
    /// Most paused sessions this host keeps. Paused sessions do not count against
    /// `max_sessions`; past this limit an idle session stays running (and a pause asked for
    /// fails with a clear error). Default 64.
    pub max_paused_sessions: usize,
    /// Disk the workspaces of paused sessions may reserve (each counts as `disk`, the size
    /// it can grow to; nothing with `disk: 0`). Default 64 GiB.
    pub paused_disk_budget: ByteSize,
    /// Most named snapshots of session workspaces one user keeps (`POST
    /// /v1/sessions/{id}/snapshots`, across this scope's Docker hosts); past it a new one is
    /// refused with a clear error until one is deleted. Default 8; `0` turns snapshots off.
    pub max_snapshots_per_user: usize,
    /// Disk the snapshots of this scope may reserve together (each counts as `disk`, what its
    /// image can hold; nothing with `disk: 0`). Snapshots are kept until deleted, so this is
    /// what they can take of the Docker hosts' disks. Default 32 GiB.
    pub snapshot_disk_budget: ByteSize,
    /// Keep a session's workspace when the session ends (`idle_ttl`, an end, the host
    /// stopping) as its *end snapshot*, so a task resumed with `resume` after its session
    /// ended gets the session back with its files. End snapshots count against
    /// `snapshot_disk_budget`, not `max_snapshots_per_user`; to make room the oldest go
    /// first, and one that still does not fit is not kept (logged). A resume uses its
    /// session's end snapshot up. Default `false`: an ended session's workspace is removed.
    pub snapshot_on_end: bool,
    /// Hard time limit for one exec when the tool call gives none. Default 120 s; on expiry
    /// the whole process group is killed.
    #[serde(with = "humantime_serde_compat")]
    pub exec_timeout: Duration,
    /// The OCI runtime session containers run under (e.g. `runsc` for gVisor, registered with
    /// every Docker host by `cargo xtask runsc`). Default none: the engine's default runtime
    /// (runc). Checked against each engine's registered runtimes by `/readyz` and
    /// `warden config check` ([`crate::runtime`]).
    pub runtime: Option<String>,
    /// Runtimes chosen by what runs, over `runtime`: the sessions of a plugin's tasks, or of
    /// the agent files of one `subagents.agent_dirs` directory, run under another runtime
    /// (e.g. third-party agents always under `runsc`). Such a task's tools get a session of
    /// their own under that runtime (same session id, separate container and workspace):
    /// a session never mixes runtimes, so no subagent put under a stronger runtime ever runs
    /// in a weaker one's container. Applied by the host; at most [`MAX_RUNTIME_OVERRIDES`].
    pub runtime_overrides: Vec<RuntimeOverride>,
    /// Maximum concurrent sessions for this host. Default 32; past it, a new session fails
    /// with a clear error instead of exhausting the machine.
    pub max_sessions: usize,
    /// Maximum concurrent sessions of one user (`user_id`). Default 16; past it, that user's
    /// new session fails (`TooManyUserSessions`) while other users still get theirs, so one
    /// tenant cannot take every session of `max_sessions`.
    pub max_sessions_per_user: usize,
    /// Maximum bytes of one tool result (head and tail kept, truncation stated). Default 256 KiB.
    pub max_output: ByteSize,
    /// Numeric `uid:gid` the tools run as. Default `1000:1000`: never root, and numeric so it
    /// works on imported images without an /etc/passwd entry and so uploaded files get a
    /// known owner.
    pub user: String,
    /// Size of the tmpfs mounted at /tmp (the root filesystem is read-only). Default 64 MiB.
    pub tmp_size: ByteSize,
    /// Size limit of the session's /workspace (`1GiB`), enforced by the kernel: the workspace
    /// is an ext4 file system of that size, so a write past it fails with ENOSPC and the
    /// Docker host's disk grows by at most this much per session. Default 1 GiB; `0` turns
    /// it off (a plain volume). Needs an engine that lets a helper container with
    /// CAP_SYS_ADMIN use loop devices, and e2fsprogs + losetup in `image` (the default image has them).
    pub disk: ByteSize,
    /// Label value that separates warden hosts sharing one Docker engine. On start a host
    /// adopts or removes only leftovers of its own scope. Default `default`.
    pub scope: String,
    /// Docker endpoint (`unix:///var/run/docker.sock`, `tcp://...`): the one-host shorthand
    /// of `hosts`. Default: `DOCKER_HOST` if set, else the local socket. A `tcp://` endpoint
    /// must be loopback (it has no TLS; use `hosts` with `tls` for another machine).
    pub docker_host: Option<String>,
    /// Docker endpoints sessions are placed on (`unix://…`, or `tcp://…` with `tls` client
    /// certificates). A new session goes to the reachable host with the fewest session
    /// containers of this scope and stays there; a session's existing container is found on
    /// whichever host holds it. Default empty: the one host `docker_host` names. Setting
    /// both is an error.
    pub hosts: Vec<DockerHost>,
    /// Hardened, never-used session containers (workspace and agent ready) kept for new
    /// sessions, so a new session's first command skips container creation. Default 2: a
    /// burst of two new sessions is served warm while the pool refills in the background
    /// (each refill costs about one cold start), and an idle host holds only two idle
    /// containers and their sparse workspace images. Pooled containers count against
    /// `max_sessions` (sessions + pool never exceed it). `0` turns the pool off.
    pub warm_pool: usize,
    /// Largest size the warm pool adapts to (`warm_pool` is its floor). Every new session
    /// that finds nothing ready raises the pool's target by one, up to this, and the pool
    /// prepares more containers at once while above its floor; after `warm_pool_decay`
    /// without such a session the growth halves, and idle containers above the target are
    /// removed, until the pool is back at `warm_pool`. Default 16 (half the default
    /// `max_sessions`); at or below `warm_pool` the pool keeps a fixed size. Clamped to
    /// `max_sessions` like the pool itself.
    pub warm_pool_max: usize,
    /// Time without a new session finding the pool empty after which the pool's growth
    /// above `warm_pool` halves (see `warm_pool_max`). Default 1 minute.
    #[serde(with = "humantime_serde_compat")]
    pub warm_pool_decay: Duration,
    /// Egress through warden's proxy (`allow`, `deny`, `credentials`; see
    /// [`crate::egress_policy`] and [`crate::egress`]). Default none: the container has no
    /// way out at all. With it the container still has no network; its only way out is the
    /// proxy in the warden process, which enforces the lists and adds the credentials; the
    /// container reaches it over a Docker exec (so remote `hosts` and replicas work alike).
    /// Needs python3 in `image` (the in-container forwarder).
    pub egress: Option<EgressConfig>,
    /// Names a task may export into its sandbox's environment (a `tool_context` entry with
    /// `"env": true`, under its key's variable name). Default empty: no task variable is
    /// exported at all. Deny by default because whatever is in the environment of the code
    /// a subagent runs can be read by that code, and so by the model and the plugin that
    /// steer it (printed, encoded, sent out): a secret exported here is handed to the
    /// subagent, not kept from it. List only names whose values the subagent is meant to
    /// hold. Each must pass [`crate::environment::check_name`]; at most [`MAX_TASK_ENV`].
    pub task_env: Vec<String>,
    /// This process's replica id when several `warden serve` processes share the scope
    /// (the same Docker hosts and store); set by the host from `warden serve --replica-id`,
    /// never read from the configuration file (every replica reads the same file). `None`:
    /// this process is the scope's only user, as before replicas. With an id, everything
    /// this process creates carries the label `warden.replica=<id>`; on connect it adopts
    /// or removes only its own leftovers (and sweeps only the commands of its own previous
    /// life); a session another replica made is reached, never swept; an idle session is
    /// removed only when no replica used it within `idle_ttl` (the in-container use mark,
    /// see `session.rs`); and shutdown leaves the sessions to the other replicas. 1-64
    /// characters of `[A-Za-z0-9_.-]`. With `egress`, each replica serves the session's
    /// connections through a channel of its own, judged by every replica's running calls
    /// (see `egress/channel.rs`).
    #[serde(skip)]
    pub replica_id: Option<String>,
}

/// One entry of `sandbox.runtime_overrides`: exactly one of `plugin` and `agent_dir`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeOverride {
    /// Every task this plugin (by id) executes.
    #[serde(default)]
    pub plugin: Option<String>,
    /// Every agent file read from this directory (as written in `subagents.agent_dirs`,
    /// relative to the configuration file) or beneath it. The deepest matching directory
    /// wins over a shallower one, and an `agent_dir` entry over a `plugin` entry.
    #[serde(default)]
    pub agent_dir: Option<PathBuf>,
    /// The runtime (registered with the engine, [`RUNTIME_NAME_RULE`]).
    pub runtime: String,
}

/// Most `sandbox.runtime_overrides` entries: each names a plugin or a directory, so a
/// deployment needs a handful; the bound keeps a session lookup's scan trivial.
pub const MAX_RUNTIME_OVERRIDES: usize = 64;

/// What a runtime name may be (it becomes a Docker label value and a key part).
pub const RUNTIME_NAME_RULE: &str = "1-64 characters of [A-Za-z0-9_.-]";

/// Whether `name` passes [`RUNTIME_NAME_RULE`].
pub fn is_runtime_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
}

/// One Docker endpoint of `sandbox.hosts`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DockerHost {
    /// `unix:///var/run/docker.sock` (or a socket path), or `tcp://HOST:PORT`. Also the
    /// value of the `warden.docker_host` label of the containers placed on it, so keep it
    /// stable: containers labelled with another endpoint are not this host's.
    pub endpoint: String,
    /// Client certificate, its key and the CA that signed the engine's certificate: required
    /// for a `tcp://` endpoint that is not loopback (an unauthenticated Docker API is root
    /// on that machine). Relative paths are relative to the configuration file.
    #[serde(default)]
    pub tls: Option<DockerTls>,
}

/// TLS client settings of a `tcp://` Docker host (`dockerd --tlsverify` on the other side).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DockerTls {
    /// PEM CA certificate(s) the engine's server certificate must chain to.
    pub ca: PathBuf,
    /// PEM client certificate warden presents.
    pub cert: PathBuf,
    /// PEM private key of `cert`. Never logged.
    pub key: PathBuf,
}

impl SandboxConfig {
    /// The Docker endpoint of the one-host shorthand, as operators name it: `docker_host`,
    /// else `DOCKER_HOST`, else Docker's default socket (what `Docker::connect_with_defaults`
    /// uses). With `hosts` set: the endpoints of all hosts, comma-separated.
    pub fn docker_endpoint(&self) -> String {
        if !self.hosts.is_empty() {
            return self.hosts.iter().map(|h| h.endpoint.as_str()).collect::<Vec<_>>().join(", ");
        }
        self.docker_host
            .clone()
            .or_else(|| std::env::var("DOCKER_HOST").ok())
            .unwrap_or_else(|| DEFAULT_DOCKER_ENDPOINT.into())
    }

    /// The Docker hosts sessions are placed on, in configuration order: `hosts`, or the one
    /// host `docker_host` (or `DOCKER_HOST`, or the local socket) names.
    pub fn docker_hosts(&self) -> Vec<DockerHost> {
        if self.hosts.is_empty() {
            vec![DockerHost { endpoint: self.docker_endpoint(), tls: None }]
        } else {
            self.hosts.clone()
        }
    }

    /// Resolves the relative TLS file paths of `hosts` against `base` (the configuration
    /// file's directory).
    pub fn resolve_paths(&mut self, base: &Path) {
        for tls in self.hosts.iter_mut().filter_map(|h| h.tls.as_mut()) {
            for p in [&mut tls.ca, &mut tls.cert, &mut tls.key] {
                if p.is_relative() {
                    *p = base.join(&*p);
                }
            }
        }
    }
}

/// The kind of a Docker endpoint, from its scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointKind {
    /// A unix socket (`unix://…` or a path).
    Unix,
    /// TCP (`tcp://HOST:PORT`); `loopback` when HOST is this machine.
    Tcp {
        /// HOST is `localhost` or a loopback address.
        loopback: bool,
    },
}

/// The kind of `endpoint`, or why it is not one warden connects to.
pub fn endpoint_kind(endpoint: &str) -> Result<EndpointKind, String> {
    if endpoint.starts_with("unix://") || endpoint.starts_with('/') {
        return Ok(EndpointKind::Unix);
    }
    let Some(addr) = endpoint.strip_prefix("tcp://") else {
        return Err(format!("`{endpoint}` is not `unix://PATH` or `tcp://HOST:PORT`"));
    };
    let authority = addr.split('/').next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    if host.is_empty() {
        return Err(format!("`{endpoint}` names no host"));
    }
    let loopback = host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    Ok(EndpointKind::Tcp { loopback })
}

/// Docker's own default endpoint when neither `sandbox.docker_host` nor `DOCKER_HOST` says.
pub const DEFAULT_DOCKER_ENDPOINT: &str = "unix:///var/run/docker.sock";

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            image: DEFAULT_IMAGE.to_string(),
            network: DEFAULT_NETWORK.to_string(),
            memory: DEFAULT_MEMORY,
            cpus: DEFAULT_CPUS,
            pids: DEFAULT_PIDS,
            idle_ttl: DEFAULT_IDLE_TTL,
            pause_after: DEFAULT_PAUSE_AFTER,
            pause_when_waiting: DEFAULT_PAUSE_WHEN_WAITING,
            max_paused_sessions: DEFAULT_MAX_PAUSED_SESSIONS,
            paused_disk_budget: DEFAULT_PAUSED_DISK_BUDGET,
            max_snapshots_per_user: DEFAULT_MAX_SNAPSHOTS_PER_USER,
            snapshot_disk_budget: DEFAULT_SNAPSHOT_DISK_BUDGET,
            snapshot_on_end: false,
            exec_timeout: DEFAULT_EXEC_TIMEOUT,
            runtime: None,
            runtime_overrides: Vec::new(),
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_sessions_per_user: DEFAULT_MAX_SESSIONS_PER_USER,
            max_output: DEFAULT_MAX_OUTPUT,
            user: DEFAULT_USER.to_string(),
            tmp_size: DEFAULT_TMP_SIZE,
            disk: DEFAULT_DISK,
            scope: DEFAULT_SCOPE.to_string(),
            docker_host: None,
            hosts: Vec::new(),
            warm_pool: DEFAULT_WARM_POOL,
            warm_pool_max: DEFAULT_WARM_POOL_MAX,
            warm_pool_decay: DEFAULT_WARM_POOL_DECAY,
            egress: None,
            task_env: Vec::new(),
            replica_id: None,
        }
    }
}

/// Smallest memory limit accepted: below this even bash fails to start reliably.
pub const MIN_MEMORY: u64 = 16 * 1024 * 1024;
/// Largest memory limit accepted: Docker takes it as a signed 64-bit byte count, and a
/// larger value would wrap to a negative one.
pub const MAX_MEMORY: u64 = i64::MAX as u64;
/// Smallest CPU limit accepted (Docker's own minimum): below it the limit rounds to zero
/// nano-CPUs, which Docker reads as no limit at all.
pub const MIN_CPUS: f64 = 0.01;
/// Largest CPU limit accepted: its nano-CPU count must fit Docker's signed 64-bit field
/// (rounding past it would saturate silently); far above any machine's core count.
pub const MAX_CPUS: f64 = 1e6;
/// Prefix of Docker's network mode that joins another container's network namespace.
pub const CONTAINER_NETWORK_PREFIX: &str = "container:";
/// Smallest output cap accepted: room for a useful head, tail and the truncation notice.
pub const MIN_MAX_OUTPUT: u64 = 1024;
/// Most names `sandbox.task_env` lists: a deployment exports a handful of variables.
pub const MAX_TASK_ENV: usize = 64;

impl SandboxConfig {
    /// Checks values serde cannot: ranges, the numeric user, label-safe scope.
    pub fn validate(&self) -> Result<(), SandboxError> {
        let bad = |key: &str, expected: &str| Err(SandboxError::Config(format!("sandbox.{key}: expected {expected}")));
        if self.image.trim().is_empty() {
            return bad("image", "a non-empty image reference");
        }
        if self.network.trim().is_empty() {
            return bad("network", "`none`, `bridge` or a network name");
        }
        if self.network == "host" {
            return bad("network", "anything but `host` (it would expose the host's network stack)");
        }
        if self.network.starts_with(CONTAINER_NETWORK_PREFIX) {
            return bad(
                "network",
                "`none`, `bridge` or a network name, not `container:…` (it would share another container's network stack, and whatever it can reach)",
            );
        }
        if !(MIN_MEMORY..=MAX_MEMORY).contains(&self.memory.0) {
            return bad("memory", "at least 16MiB and below 8EiB");
        }
        if !(self.cpus >= MIN_CPUS && self.cpus <= MAX_CPUS) {
            return bad("cpus", "a number of cores from 0.01 (Docker's smallest limit; less would mean none)");
        }
        if self.pids < 16 {
            return bad("pids", "at least 16 processes");
        }
        if self.task_env.len() > MAX_TASK_ENV {
            return bad("task_env", &format!("at most {MAX_TASK_ENV} names"));
        }
        for (i, name) in self.task_env.iter().enumerate() {
            crate::environment::check_name(name)
                .map_err(|e| SandboxError::Config(format!("sandbox.task_env[{i}]: {e}")))?;
        }
        if self.idle_ttl.is_zero() {
            return bad("idle_ttl", "a positive duration such as `15m`");
        }
        if self.pause_after.is_zero() {
            return bad("pause_after", "a positive duration such as `5m` (at or above `idle_ttl` never pauses)");
        }
        if self.exec_timeout < Duration::from_secs(1) {
            return bad("exec_timeout", "at least 1s");
        }
        if self.warm_pool_decay.is_zero() {
            return bad("warm_pool_decay", "a positive duration such as `1m`");
        }
        if self.max_sessions == 0 {
            return bad("max_sessions", "at least 1");
        }
        if self.max_sessions_per_user == 0 {
            return bad("max_sessions_per_user", "at least 1");
        }
        if self.max_output.0 < MIN_MAX_OUTPUT {
            return bad("max_output", "at least 1KiB");
        }
        if self.tmp_size.0 < 1024 * 1024 {
            return bad("tmp_size", "at least 1MiB");
        }
        if self.disk.0 != 0 && self.disk.0 < MIN_DISK {
            return bad("disk", "0 (no limit) or at least 16MiB");
        }
        if self.uid_gid().is_none() {
            return bad("user", "a numeric `uid:gid` other than root, e.g. `1000:1000`");
        }
        if self.scope.is_empty()
            || self.scope.len() > 32
            || !self.scope.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return bad("scope", "1-32 characters of [A-Za-z0-9_-]");
        }
        if let Some(egress) = &self.egress {
            egress.validate()?;
            if self.network != DEFAULT_NETWORK {
                return bad(
                    "network",
                    "`none` when sandbox.egress is set (the proxy is the only way out; a network would bypass it)",
                );
            }
            let forwarder = FORWARDER_USER.split(':').next().and_then(|u| u.parse::<u64>().ok());
            if self.uid_gid().map(|(u, _)| u) == forwarder {
                return bad("user", "a uid other than the egress forwarder's (65533)");
            }
        }
        self.validate_hosts()?;
        if let Some(id) = &self.replica_id
            && !replica_id_ok(id)
        {
            return bad("replica_id", "1-64 characters of [A-Za-z0-9_.-] (warden serve --replica-id)");
        }
        if let Some(rt) = &self.runtime
            && !is_runtime_name(rt)
        {
            return bad(
                "runtime",
                "a registered runtime name such as `runsc` (1-64 characters of [A-Za-z0-9_.-]), or null",
            );
        }
        self.validate_runtime_overrides()
    }

    /// `runtime_overrides`: bounded, each entry names exactly one plugin or directory and a
    /// runtime, and no plugin or directory twice (which entry would win could not be said).
    fn validate_runtime_overrides(&self) -> Result<(), SandboxError> {
        let list = &self.runtime_overrides;
        if list.len() > MAX_RUNTIME_OVERRIDES {
            return Err(SandboxError::Config(format!(
                "sandbox.runtime_overrides: {} entries; at most {MAX_RUNTIME_OVERRIDES}",
                list.len()
            )));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, o) in list.iter().enumerate() {
            let at = format!("sandbox.runtime_overrides[{i}]");
            let what = match (&o.plugin, &o.agent_dir) {
                (Some(p), None) if !p.trim().is_empty() => format!("plugin {p}"),
                (None, Some(d)) if !d.as_os_str().is_empty() => format!("agent_dir {}", d.display()),
                _ => {
                    return Err(SandboxError::Config(format!(
                        "{at}: name exactly one of `plugin` (a plugin id) and `agent_dir` (a subagents.agent_dirs directory)"
                    )));
                }
            };
            if !is_runtime_name(&o.runtime) {
                return Err(SandboxError::Config(format!(
                    "{at}.runtime: {:?} is not a runtime name ({RUNTIME_NAME_RULE}), e.g. `runsc`",
                    o.runtime
                )));
            }
            if !seen.insert(what.clone()) {
                return Err(SandboxError::Config(format!("{at}: {what} is listed twice")));
            }
        }
        Ok(())
    }

    /// Every runtime a session may run under: `runtime` (`None`: the engine's default) and
    /// each override's.
    pub fn runtimes(&self) -> Vec<Option<String>> {
        let mut all = vec![self.runtime.clone()];
        for o in &self.runtime_overrides {
            if !all.contains(&Some(o.runtime.clone())) {
                all.push(Some(o.runtime.clone()));
            }
        }
        all
    }

    /// `docker_host` and `hosts`: one of them, known schemes, TLS where the network is.
    fn validate_hosts(&self) -> Result<(), SandboxError> {
        let err = |m: String| Err(SandboxError::Config(m));
        if let Some(h) = &self.docker_host {
            if !self.hosts.is_empty() {
                return err(
                    "sandbox.docker_host and sandbox.hosts are both set: set one (docker_host is the one-host shorthand of hosts)"
                        .into(),
                );
            }
            match endpoint_kind(h) {
                Err(m) => return err(format!("sandbox.docker_host: {m}")),
                Ok(EndpointKind::Tcp { loopback: false }) => {
                    return err(format!(
                        "sandbox.docker_host: `{h}` is a TCP endpoint of another machine without TLS (an unauthenticated Docker API is root on that machine); use sandbox.hosts with `tls` client certificates"
                    ));
                }
                Ok(_) => {}
            }
        }
        let mut seen = std::collections::HashSet::new();
        for (i, h) in self.hosts.iter().enumerate() {
            let field = format!("sandbox.hosts[{i}]");
            match (endpoint_kind(&h.endpoint), &h.tls) {
                (Err(m), _) => return err(format!("{field}.endpoint: {m}")),
                (Ok(EndpointKind::Unix), Some(_)) => {
                    return err(format!("{field}.tls: a unix socket endpoint takes no TLS (only tcp:// does)"));
                }
                (Ok(EndpointKind::Tcp { loopback: false }), None) => {
                    return err(format!(
                        "{field}.tls: required for `{}`, a TCP endpoint of another machine (an unauthenticated Docker API is root on that machine): give `ca`, `cert` and `key`",
                        h.endpoint
                    ));
                }
                _ => {}
            }
            if !seen.insert(h.endpoint.trim_end_matches('/')) {
                return err(format!("{field}.endpoint: `{}` is listed twice", h.endpoint));
            }
        }
        Ok(())
    }

    /// Whether idle sessions are paused at all (see `pause_after`): before `idle_ttl` ends
    /// them, without replicas, with room for paused sessions.
    pub fn pauses_idle_sessions(&self) -> bool {
        self.pause_after < self.idle_ttl && self.replica_id.is_none() && self.max_paused_sessions > 0
    }

    /// The numeric (uid, gid) of `user`; `None` when it is not numeric or is root.
    pub fn uid_gid(&self) -> Option<(u64, u64)> {
        let (u, g) = match self.user.split_once(':') {
            Some((u, g)) => (u, g),
            None => (self.user.as_str(), self.user.as_str()),
        };
        let (u, g) = (u.parse::<u64>().ok()?, g.parse::<u64>().ok()?);
        (u != 0 && g != 0).then_some((u, g))
    }
}

/// Whether `id` is a usable replica id: it becomes a Docker label value and an argument of
/// the in-container agent, so only characters that need no quoting anywhere.
fn replica_id_ok(id: &str) -> bool {
    (1..=MAX_REPLICA_ID_LEN).contains(&id.len())
        && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Longest replica id: a label value, and readable in `docker ps`.
pub const MAX_REPLICA_ID_LEN: usize = 64;

/// A byte count that reads `512MiB`, `1GiB`, `64m`, `256KiB` or a plain integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// Parses a size with an optional binary (KiB/MiB/GiB) or short (k/m/g) unit.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num.parse().map_err(|_| format!("`{text}` is not a size like 512MiB"))?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            "g" | "gb" | "gib" => 1 << 30,
            other => {
                return Err(format!("unknown size unit `{other}` in `{text}` (use KiB, MiB, GiB)"));
            }
        };
        n.checked_mul(mult).map(ByteSize).ok_or_else(|| format!("`{text}` is too large"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        if b != 0 && b.is_multiple_of(1 << 30) {
            write!(f, "{}GiB", b >> 30)
        } else if b != 0 && b.is_multiple_of(1 << 20) {
            write!(f, "{}MiB", b >> 20)
        } else if b != 0 && b.is_multiple_of(1 << 10) {
            write!(f, "{}KiB", b >> 10)
        } else {
            write!(f, "{b}")
        }
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Text(t) => ByteSize::parse(&t).map_err(serde::de::Error::custom),
        }
    }
}

/// Durations as humantime strings (`15m`, `120s`), or integer seconds.
mod humantime_serde_compat {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Secs(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Secs(n) => Ok(Duration::from_secs(n)),
            Raw::Text(t) => humantime::parse_duration(&t)
                .map_err(|e| serde::de::Error::custom(format!("`{t}` is not a duration like 15m or 120s: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(ByteSize::parse("512MiB").unwrap().0, 512 << 20);
        assert_eq!(ByteSize::parse("1g").unwrap().0, 1 << 30);
        assert_eq!(ByteSize::parse("4096").unwrap().0, 4096);
        assert!(ByteSize::parse("12 parsecs").is_err());
    }

    #[test]
    fn defaults_are_valid_and_users_checked() {
        let c = SandboxConfig::default();
        c.validate().unwrap();
        assert_eq!(c.uid_gid(), Some((1000, 1000)));
        let root = SandboxConfig { user: "0:0".into(), ..SandboxConfig::default() };
        assert!(root.validate().is_err());
    }

    #[test]
    fn hosts_need_tls_off_loopback_and_exclude_docker_host() {
        let parse = |y: &str| serde_json::from_str::<SandboxConfig>(y).unwrap();
        let tls = r#"{"ca": "ca.pem", "cert": "cert.pem", "key": "key.pem"}"#;
        let ok = parse(&format!(
            r#"{{"hosts": [{{"endpoint": "unix:///var/run/docker.sock"}}, {{"endpoint": "tcp://10.0.0.5:2376", "tls": {tls}}}, {{"endpoint": "tcp://127.0.0.1:2375"}}]}}"#
        ));
        ok.validate().unwrap();
        assert_eq!(ok.docker_hosts().len(), 3);
        let mut resolved = ok.clone();
        resolved.resolve_paths(Path::new("/etc/warden"));
        assert_eq!(resolved.hosts[1].tls.as_ref().unwrap().ca, Path::new("/etc/warden/ca.pem"));
        let plain = parse(r#"{"hosts": [{"endpoint": "tcp://10.0.0.5:2375"}]}"#).validate().unwrap_err().to_string();
        assert!(plain.contains("sandbox.hosts[0].tls") && plain.contains("root on that machine"), "{plain}");
        let both = parse(r#"{"docker_host": "unix:///x.sock", "hosts": [{"endpoint": "unix:///y.sock"}]}"#);
        let both = both.validate().unwrap_err().to_string();
        assert!(both.contains("sandbox.docker_host") && both.contains("sandbox.hosts"), "{both}");
        let twice = parse(r#"{"hosts": [{"endpoint": "unix:///y.sock"}, {"endpoint": "unix:///y.sock"}]}"#);
        assert!(twice.validate().unwrap_err().to_string().contains("listed twice"));
        let remote = parse(r#"{"docker_host": "tcp://docker.example:2375"}"#).validate().unwrap_err().to_string();
        assert!(remote.contains("sandbox.docker_host") && remote.contains("sandbox.hosts"), "{remote}");
        assert!(parse(r#"{"hosts": [{"endpoint": "http://x:1"}]}"#).validate().is_err());
        for (e, loopback) in
            [("tcp://localhost:1", true), ("tcp://[::1]:1", true), ("tcp://127.0.0.2:1", true), ("tcp://h:1", false)]
        {
            assert_eq!(endpoint_kind(e), Ok(EndpointKind::Tcp { loopback }), "{e}");
        }
        assert_eq!(SandboxConfig::default().docker_hosts().len(), 1);
    }

    #[test]
    fn a_replica_id_is_label_safe_never_read_from_the_file_and_serves_egress() {
        let ok = SandboxConfig { replica_id: Some("r1.eu-west_2".into()), ..SandboxConfig::default() };
        ok.validate().unwrap();
        for bad in ["", "r 1", "r1/x", "r1\n", &"r".repeat(MAX_REPLICA_ID_LEN + 1)] {
            let c = SandboxConfig { replica_id: Some(bad.into()), ..SandboxConfig::default() };
            assert!(c.validate().unwrap_err().to_string().contains("sandbox.replica_id"), "{bad:?}");
        }
        // Every replica reads the same file: the id is the process's, never the file's.
        assert!(serde_json::from_str::<SandboxConfig>(r#"{"replica_id": "r1"}"#).is_err());
        let mut egress: SandboxConfig =
            serde_json::from_str(r#"{"egress": {"allow": ["example.com"]}}"#).expect("egress config");
        egress.validate().unwrap();
        egress.replica_id = Some("r1".into());
        egress.validate().unwrap();
    }

    #[test]
    fn pausing_is_on_by_default_and_off_past_the_idle_ttl_or_with_replicas() {
        let d = SandboxConfig::default();
        assert!(d.pause_after < d.idle_ttl && d.pauses_idle_sessions());
        let late: SandboxConfig = serde_json::from_str(r#"{"pause_after": "20m", "idle_ttl": "15m"}"#).unwrap();
        assert!(late.validate().is_ok() && !late.pauses_idle_sessions());
        let none: SandboxConfig = serde_json::from_str(r#"{"max_paused_sessions": 0}"#).unwrap();
        assert!(!none.pauses_idle_sessions());
        let replica = SandboxConfig { replica_id: Some("r1".into()), ..SandboxConfig::default() };
        assert!(!replica.pauses_idle_sessions());
        let zero = SandboxConfig { pause_after: Duration::ZERO, ..SandboxConfig::default() };
        let err = zero.validate().unwrap_err().to_string();
        assert!(err.contains("sandbox.pause_after"), "{err}");
    }

    #[test]
    fn the_warm_pool_is_on_by_default_and_zero_turns_it_off() {
        assert_eq!(SandboxConfig::default().warm_pool, DEFAULT_WARM_POOL);
        let off: SandboxConfig = serde_json::from_str(r#"{"warm_pool": 0}"#).unwrap();
        assert_eq!(off.warm_pool, 0);
        off.validate().unwrap();
    }

    #[test]
    fn the_warm_pool_adapts_by_default_and_its_decay_must_be_positive() {
        let d = SandboxConfig::default();
        assert_eq!((d.warm_pool_max, d.warm_pool_decay), (DEFAULT_WARM_POOL_MAX, DEFAULT_WARM_POOL_DECAY));
        assert!(d.warm_pool_max > d.warm_pool && d.warm_pool_max <= d.max_sessions);
        let set: SandboxConfig = serde_json::from_str(r#"{"warm_pool_max": 4, "warm_pool_decay": "30s"}"#).unwrap();
        assert_eq!((set.warm_pool_max, set.warm_pool_decay), (4, Duration::from_secs(30)));
        set.validate().unwrap();
        let zero: SandboxConfig = serde_json::from_str(r#"{"warm_pool_decay": "0s"}"#).unwrap();
        assert!(zero.validate().unwrap_err().to_string().contains("warm_pool_decay"));
    }
}
