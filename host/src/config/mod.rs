//! Operator configuration: the `warden.yaml` file.
//!
//! Every field is optional and has a safe default (documented on the field). Unknown
//! keys and bad values are errors that name the file, the key path and what was
//! expected. This module only parses and validates; it must never act on the
//! configuration (no files created, no network).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

pub use crate::capability::{GrantConfig, SecretGrant};

pub mod mcp;

/// File looked up in the working directory when `--config` is not given.
pub const DEFAULT_CONFIG_FILE: &str = "warden.yaml";

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: cannot read: {source}")]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: {key}: {message}")]
    Invalid {
        file: PathBuf,
        /// Dotted key path, e.g. `plugins.limits.timeout`.
        key: String,
        message: String,
    },
}

/// The whole `warden.yaml`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub plugins: PluginsConfig,
    pub subagents: SubagentsConfig,
    /// Model providers (see the `warden-models` crate for every key).
    pub models: warden_models::ModelsConfig,
    /// Per-session Docker sandboxes (see the `warden-sandbox` crate for every key).
    pub sandbox: warden_sandbox::SandboxConfig,
    /// The approval policy (see the `warden-approval` crate for every key).
    pub approval: warden_approval::PolicyConfig,
    pub server: ServerConfig,
    pub store: StoreConfig,
    /// MCP servers whose tools subagents may use (as `mcp__<name>__<tool>`, every call
    /// through the approval gate). An agent file's `mcpServers` selects among these by
    /// name; agent files cannot add servers of their own.
    pub mcp_servers: BTreeMap<String, mcp::McpServerConfig>,
    /// An `.mcp.json` file (`{"mcpServers": {...}}`, as Claude Code and desktop agents
    /// write it) whose servers are added to `mcp_servers`; relative to this file. A name
    /// in both is an error.
    pub mcp_servers_file: Option<PathBuf>,
    /// warden itself as an MCP server for parent agents (`warden mcp`, `/mcp`).
    pub mcp: McpConfig,
    /// Directory the config file lives in; relative paths resolve against it.
    #[serde(skip)]
    pub base_dir: PathBuf,
    /// Where this configuration came from (`<built-in defaults>` when no file).
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

/// `plugins:` — where plugins come from, what they may do, how far they may go.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PluginsConfig {
    /// Directory scanned for `.wasm` components. Default `./plugins`: next to the config.
    pub dir: PathBuf,
    /// Watch `dir` and apply adds, replacements and removals without a restart.
    /// Default true: operators expect a dropped-in plugin to appear.
    pub watch: bool,
    /// Where compiled components are cached. Default `./.warden/cache`: outside the
    /// plugin directory, so nothing an operator drops in is ever deserialized as
    /// native code.
    pub cache_dir: PathBuf,
    /// Per-call limits for every plugin.
    pub limits: Limits,
    /// Per-plugin overrides of `limits`, keyed by plugin id (the file stem).
    pub limit_overrides: BTreeMap<String, LimitsOverride>,
    /// Capabilities granted per plugin id (the `.wasm` file stem, which the operator
    /// chooses — never the name a plugin claims for itself). Nothing granted = nothing allowed.
    pub grants: BTreeMap<String, GrantConfig>,
    /// Plugin ids in priority order for kinds claimed by more than one plugin.
    /// Unlisted plugins come after the listed ones, in file-name order.
    pub priority: Vec<String>,
    /// Per-call and per-plugin budgets of the host imports (events, state, log, HTTP).
    pub budgets: Budgets,
    /// Largest plugin file loaded (`64MiB`, or bytes); larger files are reported invalid
    /// without being read whole.
    #[serde(with = "size_text")]
    pub max_plugin_size: u64,
    /// Time one plugin load (compile or cache load, and `meta.info`) may take; loads run
    /// in parallel, so one slow plugin never holds up the others.
    #[serde(with = "duration_text")]
    pub load_timeout: Duration,
    /// Allocate plugin instances from a reserved pool with copy-on-write memory images
    /// (sized from `server.max_concurrent_tasks` and the largest memory limit). Default
    /// true: a fresh instance per call costs a few µs instead of fresh mappings; false
    /// allocates on demand (for machines that restrict address space, e.g. `ulimit -v`).
    pub pooled_instances: bool,
    /// Instances made ahead of calls, across all plugins: after a plugin's call ends, its
    /// next instance is instantiated in the background and the ended call's store is torn
    /// down there, so a call that finds one skips both (still a fresh instance no call ran
    /// in; one no call takes within 30 s is dropped). Each holds one pool slot beside the
    /// call slots and its plugin's initial memory. Default 0 (off): see
    /// [`DEFAULT_READY_INSTANCES`].
    pub ready_instances: u32,
    /// Address space the compiler process may use for one plugin (`2GiB`, or bytes):
    /// a compile bomb fails with an error naming this key instead of exhausting the host.
    #[serde(with = "size_text")]
    pub compile_memory: u64,
    /// Compile large plugins (4 MiB and more) first with wasmtime's baseline compiler
    /// (Winch: a second to load an 18 MB Python component instead of many), then swap in
    /// the optimised Cranelift build when it is ready. Default true.
    pub tiered_compilation: bool,
    /// Ed25519 public keys (64 hex digits, from `warden plugin keygen`) whose signatures
    /// (`x.wasm.sig` beside `x.wasm`) are trusted: a bare key for every plugin id, or
    /// `{ key: <hex>, ids: [github] }` for the listed ids only. A signature by any other key,
    /// by a key not trusted for the file's id, or one that does not state this file's
    /// content and id, makes the plugin invalid.
    pub trust: Vec<crate::provenance::TrustedKey>,
    /// Refuse plugin files without a trusted signature. Default false (unsigned files load;
    /// signed ones must still verify).
    pub require_signature: bool,
    /// Plugin id → the SHA-256 (hex) its file must have; any other content is invalid.
    pub pins: BTreeMap<String, String>,
    /// Plugin id → whether its tasks are durable (journaled and taken over after a
    /// restart; see `server.durable_tasks`). Unlisted ids follow `server.durable_tasks`;
    /// `false` turns it off for a plugin whose journal would be too large or that is not
    /// deterministic.
    pub durable: BTreeMap<String, bool>,
}

/// Default memory for compiling one plugin: an 18 MB Python component needs ~400 MB
/// resident and about twice that in address space; a bomb stops at this bound.
pub const DEFAULT_COMPILE_MEMORY: u64 = 2 * 1024 * 1024 * 1024;

/// Default largest plugin file: the bundled Python components are about 20 MB; far
/// larger files are more likely compile bombs than plugins.
pub const DEFAULT_MAX_PLUGIN_SIZE: u64 = 64 * 1024 * 1024;
/// Default time one plugin load may take: a cold compile of a large Python component
/// takes seconds on two cores; a minute means something is wrong.
pub const DEFAULT_LOAD_TIMEOUT: Duration = Duration::from_secs(60);

/// Default events one call (one task's execute) may emit: a long token stream fits.
pub const DEFAULT_MAX_EVENTS_PER_CALL: u32 = 20_000;
/// Default event bytes (JSON) one call may emit; every event is stored with its task
/// for `store.retention`, so this bounds the store growth per task too.
pub const DEFAULT_MAX_EVENT_BYTES_PER_CALL: u64 = 16 * 1024 * 1024;
/// Default longest state key: names, not data.
pub const DEFAULT_MAX_STATE_KEY: usize = 1024;
/// Default largest state value: a long transcript fits, a memory bomb does not.
pub const DEFAULT_MAX_STATE_VALUE: u64 = 4 * 1024 * 1024;
/// Default bytes (keys + values) one plugin may hold in the state store for one user at
/// once: room for many long transcripts, while one tenant cannot fill the store.
pub const DEFAULT_MAX_STATE_BYTES_PER_PLUGIN: u64 = 64 * 1024 * 1024;
/// Default log lines one call may write; later ones are refused with an error value.
pub const DEFAULT_MAX_LOG_LINES_PER_CALL: u32 = 1000;
/// Default log bytes one call may write.
pub const DEFAULT_MAX_LOG_BYTES_PER_CALL: u64 = 1024 * 1024;
/// Default streamed HTTP responses one call may hold open at once: each holds a
/// connection and a file descriptor of the host.
pub const DEFAULT_MAX_HTTP_STREAMS_PER_CALL: u32 = 16;
/// Default `plugins.budgets.memory_growth_per_second`: 256 MiB/s per plugin, about 120
/// growing calls a second — far above what a plugin built with the SDK does (its calls
/// grow memory only past a 640 KiB arena); at 1 GiB/s a plugin growing memory on every
/// call still made its neighbour's p99 3× slower (BENCHMARKS.md, "Isolation").
pub const DEFAULT_MEMORY_GROWTH_PER_SECOND: u64 = 256 * 1024 * 1024;

/// `plugins.budgets:` — what one plugin call (or one plugin, for state) may consume
/// through the host imports. Over a budget the import returns an error value naming
/// the budget's key; the host never buffers, stores or prints past it.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Budgets {
    /// Events (`events.emit`, streamed model tokens excluded) one call may emit.
    pub max_events_per_call: u32,
    /// Event bytes (JSON data) one call may emit (`16MiB`, or bytes).
    #[serde(with = "size_text")]
    pub max_event_bytes_per_call: u64,
    /// Longest `state` key in bytes.
    pub max_state_key: usize,
    /// Largest `state` value (`4MiB`, or bytes).
    #[serde(with = "size_text")]
    pub max_state_value: u64,
    /// Bytes (keys + values) one plugin may hold in the state store for one user (state
    /// is per plugin per user, so is this budget).
    #[serde(with = "size_text")]
    pub max_state_bytes_per_plugin: u64,
    /// `log.write` calls one call may make.
    pub max_log_lines_per_call: u32,
    /// `log.write` bytes one call may write.
    #[serde(with = "size_text")]
    pub max_log_bytes_per_call: u64,
    /// Streamed HTTP responses (`http.send-streaming`) one call may hold open at once.
    pub max_http_streams_per_call: u32,
    /// Linear-memory growth one plugin's calls may do per second, together (`256MiB`, or
    /// bytes; 0 = unpaced). Past it a growing call waits (a growth that could not happen
    /// before the call's deadline fails it at once, naming this key): the
    /// pool's taking a call's growth back interrupts every core running the host, so a
    /// plugin growing memory on every call slowed every other plugin (BENCHMARKS.md,
    /// "Isolation"). A call that grows at all is charged 2 MiB on top of its bytes.
    #[serde(with = "size_text")]
    pub memory_growth_per_second: u64,
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            max_events_per_call: DEFAULT_MAX_EVENTS_PER_CALL,
            max_event_bytes_per_call: DEFAULT_MAX_EVENT_BYTES_PER_CALL,
            max_state_key: DEFAULT_MAX_STATE_KEY,
            max_state_value: DEFAULT_MAX_STATE_VALUE,
            max_state_bytes_per_plugin: DEFAULT_MAX_STATE_BYTES_PER_PLUGIN,
            max_log_lines_per_call: DEFAULT_MAX_LOG_LINES_PER_CALL,
            max_log_bytes_per_call: DEFAULT_MAX_LOG_BYTES_PER_CALL,
            max_http_streams_per_call: DEFAULT_MAX_HTTP_STREAMS_PER_CALL,
            memory_growth_per_second: DEFAULT_MEMORY_GROWTH_PER_SECOND,
        }
    }
}

impl Default for PluginsConfig {
    fn default() -> Self {
        Self {
            dir: PathBuf::from("./plugins"),
            watch: true,
            cache_dir: PathBuf::from("./.warden/cache"),
            limits: Limits::default(),
            limit_overrides: BTreeMap::new(),
            grants: BTreeMap::new(),
            priority: Vec::new(),
            budgets: Budgets::default(),
            max_plugin_size: DEFAULT_MAX_PLUGIN_SIZE,
            load_timeout: DEFAULT_LOAD_TIMEOUT,
            pooled_instances: true,
            ready_instances: DEFAULT_READY_INSTANCES,
            compile_memory: DEFAULT_COMPILE_MEMORY,
            tiered_compilation: true,
            trust: Vec::new(),
            require_signature: false,
            pins: BTreeMap::new(),
            durable: BTreeMap::new(),
        }
    }
}

/// Default wall-clock limit of one plugin call: long enough for an LLM agent loop
/// with a few tool calls, short enough that a stuck plugin frees its slot.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Default linear-memory cap of one plugin instance: ample for JSON handling and
/// a Python component's interpreter, small enough that 100 concurrent calls fit.
pub const DEFAULT_MEMORY_LIMIT: u64 = 64 * 1024 * 1024;
/// Default cap on the size of a plugin's returned text: larger outputs would flood
/// the parent agent's context anyway.
pub const DEFAULT_MAX_OUTPUT: u64 = 1024 * 1024;

/// Limits of one plugin call.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Wall-clock deadline of one call, including host I/O done on its behalf.
    #[serde(with = "duration_text")]
    pub timeout: Duration,
    /// Linear-memory cap per instance (`64MiB`, `1GiB`, or bytes).
    #[serde(with = "size_text")]
    pub memory: u64,
    /// Optional fuel (instruction budget) per call; `null` = unlimited (deadline only).
    pub fuel: Option<u64>,
    /// Largest text a call may return.
    #[serde(with = "size_text")]
    pub max_output: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self { timeout: DEFAULT_CALL_TIMEOUT, memory: DEFAULT_MEMORY_LIMIT, fuel: None, max_output: DEFAULT_MAX_OUTPUT }
    }
}

/// Per-plugin override: any field given replaces the global limit.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsOverride {
    #[serde(with = "opt_duration_text")]
    pub timeout: Option<Duration>,
    #[serde(with = "opt_size_text")]
    pub memory: Option<u64>,
    pub fuel: Option<u64>,
    #[serde(with = "opt_size_text")]
    pub max_output: Option<u64>,
}

impl Limits {
    pub fn with_override(mut self, o: Option<&LimitsOverride>) -> Self {
        if let Some(o) = o {
            self.timeout = o.timeout.unwrap_or(self.timeout);
            self.memory = o.memory.unwrap_or(self.memory);
            self.fuel = o.fuel.or(self.fuel);
            self.max_output = o.max_output.unwrap_or(self.max_output);
        }
        self
    }
}

/// Default number of tasks running at once. Each running task holds one plugin
/// instance of up to `plugins.limits.memory` (64 MiB by default): 32 of them bound the
/// worst case near 2 GiB, while tasks that mostly wait on models or peers still overlap.
pub const DEFAULT_MAX_CONCURRENT_TASKS: usize = 32;
/// Default number of tasks waiting for a slot before new ones are refused (503): a
/// queue deeper than this would only time out its callers.
pub const DEFAULT_MAX_QUEUED_TASKS: usize = 1000;
/// Default `server.max_tasks_per_user`: tasks one user may have queued or running at once.
/// The slots and the queue are the host's; without a share one tenant submitting a burst
/// took every slot and the whole queue, and every other tenant got `503 queue_full`. 128
/// is an eighth of the default queue with its slots (eight users must be busy to fill the
/// host), still four times the default slots for one user's fan-out; a single-tenant host
/// submitting bigger bursts raises it.
pub const DEFAULT_MAX_TASKS_PER_USER: usize = 128;
/// `server.max_running_per_user` when unset: `max_concurrent_tasks` less a quarter (at least
/// one). Slots go to the users with the fewest running tasks first, but a slot is only
/// handed out when one frees, and a task may hold its slot for `task_timeout` (30 min):
/// a user who took every slot while the host was idle kept the others waiting that long.
/// A quarter of the slots (8 of the default 32) is kept for the others; a lone user still
/// runs three quarters of the host, and a single-tenant host sets it to
/// `max_concurrent_tasks`.
pub fn default_max_running_per_user(max_concurrent_tasks: usize) -> usize {
    (max_concurrent_tasks - max_concurrent_tasks / 4).max(1)
}
/// Default wall-clock deadline of one task once it runs: longer than any single plugin
/// call limit an operator is likely to set, so it only stops tasks that are stuck.
pub const DEFAULT_TASK_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// `subagents:` — where definitions come from.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SubagentsConfig {
    /// Directories searched recursively for Claude-format `.md` agent files.
    pub agent_dirs: Vec<PathBuf>,
    /// Claude Code plugin folders (`.claude-plugin/plugin.json`, `agents/`, `skills/`,
    /// `hooks/`, `.mcp.json`) and marketplace folders (`.claude-plugin/marketplace.json`
    /// listing plugin folders inside it): each plugin's agents are registered as
    /// `plugin-name:agent-name` (see [`crate::claude_plugins`]). Default: none.
    pub plugin_dirs: Vec<PathBuf>,
    /// References of any kind, resolved by the first plugin whose `can-resolve` accepts.
    pub references: Vec<ReferenceConfig>,
    /// Register the built-in general-purpose / Explore / Plan / Bash agents.
    /// Default false: operators opt in to what runs on their machines.
    pub builtin: bool,
    /// Let agent files define their own MCP servers (inline `mcpServers` entries, which
    /// plugins built against WIT 0.3.0 pass as `agent-mcp-servers`). Default `false`: such
    /// an entry is refused with a problem naming this setting, and only the operator's
    /// `mcp_servers` run. With `true`, a valid stdio entry runs inside the calling session's
    /// sandbox like an operator's stdio server, each start judged first by the approval
    /// gate as the `Bash` command it amounts to (so `Bash` rules, the permission mode and a
    /// person decide); HTTP entries are always refused (the host would reach an address
    /// an agent file chose).
    pub allow_agent_mcp_servers: bool,
    /// How deep subagents may nest: a task the parent agent submits is at depth 1, a
    /// subagent it starts with the `Agent` tool at depth 2, and so on. A task at this depth
    /// is not offered the `Agent` tool. Default [`DEFAULT_SUBAGENT_MAX_DEPTH`] (no nesting);
    /// at most [`MAX_SUBAGENT_DEPTH`].
    pub max_depth: u32,
}

/// Default `subagents.max_depth`: 1, no nesting. Starting subagents from subagents is
/// opt-in (the operator raises this, and an agent file lists `Agent` in its `tools`).
pub const DEFAULT_SUBAGENT_MAX_DEPTH: u32 = 1;

/// Highest `subagents.max_depth` accepted: every level of a chain holds its task (and
/// its instance, its model conversation) while its child runs, so a chain is bounded
/// well below anything that could exhaust a host through recursion.
pub const MAX_SUBAGENT_DEPTH: u32 = 5;

/// The default agent directory (next to the config). Unlike a directory the operator
/// lists, it may be absent.
pub const DEFAULT_AGENT_DIR: &str = "./agents";

impl Default for SubagentsConfig {
    fn default() -> Self {
        Self {
            agent_dirs: vec![PathBuf::from(DEFAULT_AGENT_DIR)],
            plugin_dirs: Vec::new(),
            references: Vec::new(),
            builtin: false,
            allow_agent_mcp_servers: false,
            max_depth: DEFAULT_SUBAGENT_MAX_DEPTH,
        }
    }
}

/// One `subagents.references` entry.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReferenceConfig {
    pub uri: String,
    pub kind: String,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// Default HTTP listen address: loopback only, so an unauthenticated default is safe.
pub const DEFAULT_SERVER_ADDR: &str = "127.0.0.1:7878";

/// `server:` — the HTTP API.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    pub addr: String,
    /// Environment variable with comma-separated bearer tokens; unset = no auth, loopback only.
    /// Each of its tokens is an `admin` principal (named `token<N>`).
    pub tokens_env: String,
    /// Named principals: whose bearer token acts as whom, with which role.
    pub principals: Vec<PrincipalConfig>,
    /// Tasks running at once; more wait in a queue (see [`DEFAULT_MAX_CONCURRENT_TASKS`]).
    pub max_concurrent_tasks: usize,
    /// Tasks waiting for a slot before new ones are refused with 503.
    pub max_queued_tasks: usize,
    /// Tasks one `user_id` may have queued or running at once (nested subagents, which
    /// run inside their root's, not counted); more are refused with 429 naming this key,
    /// so one tenant cannot take every slot and the whole queue (see
    /// [`DEFAULT_MAX_TASKS_PER_USER`]). With replicas: each replica's own tasks, and the
    /// user's tasks across the cluster when a task goes to the shared queue.
    pub max_tasks_per_user: usize,
    /// Tasks one `user_id` may run at once (nested subagents not counted); its other
    /// tasks wait queued while the other users' take the free slots. Unset:
    /// [`default_max_running_per_user`]; above `max_concurrent_tasks` it is that. With
    /// replicas: on each replica, which claims no more of a user from the shared queue.
    pub max_running_per_user: Option<usize>,
    /// Wall-clock deadline of one task once it runs (all its plugin calls and tools).
    #[serde(with = "duration_text")]
    pub task_timeout: Duration,
    /// Most tool calls one task may make (a request may ask for fewer); `null` = no limit.
    /// Over it the task ends `completed` with finish reason `tool_limit`.
    pub max_tool_iterations: Option<u32>,
    /// Largest request body the API accepts (`1MiB`, or bytes).
    #[serde(with = "size_text")]
    pub max_body: u64,
    /// Interval of `heartbeat` events on idle event streams, so proxies flush.
    #[serde(with = "duration_text")]
    pub heartbeat: Duration,
    /// Connections the API holds open at once, whoever holds them (authentication runs
    /// only on a complete request). A new connection past it closes the longest-idle one
    /// (one that never sent a request first); only when every one is serving a request
    /// does it wait in the kernel's backlog (see [`DEFAULT_MAX_CONNECTIONS`]).
    pub max_connections: usize,
    /// Connections one client address (an IPv6 /64) may hold open at once; past it the
    /// address's own longest-idle connection is closed, or the new one refused when all of
    /// them are serving requests. Loopback clients are not counted (see
    /// [`DEFAULT_MAX_CONNECTIONS_PER_ADDRESS`]).
    pub max_connections_per_address: usize,
    /// How long a new connection has to send its first request head in full before the
    /// API closes it (see [`DEFAULT_FIRST_REQUEST_TIMEOUT`]).
    #[serde(with = "duration_text")]
    pub first_request_timeout: Duration,
    /// How long a client has to send a later request head in full, and how long a
    /// keep-alive connection may sit idle, before the API closes it (see
    /// [`DEFAULT_HEADER_READ_TIMEOUT`]).
    #[serde(with = "duration_text")]
    pub header_read_timeout: Duration,
    /// Event streams, task-list feeds and long polls (`block=true`, TaskOutput, A2A
    /// blocking sends) one principal may hold open at once; more are refused with 429
    /// `too_many_streams` naming this key (see [`DEFAULT_MAX_STREAMS_PER_PRINCIPAL`]).
    pub max_streams_per_principal: usize,
    /// On SIGTERM or Ctrl-C: how long `warden serve` keeps running (refusing new tasks
    /// with 503 `draining`, `/readyz` answering 503) for its queued and running tasks to
    /// finish before it exits. Tasks still running then end `failed` ("host restarted")
    /// at the next start.
    #[serde(with = "duration_text")]
    pub drain_timeout: Duration,
    /// This server's name among the replicas on one PostgreSQL store (`store.url`);
    /// `warden serve --replica-id` overrides it. Unique per running process, stable across
    /// its restarts (a restarted replica ends what it was running at once, as "host
    /// restarted"). Default: the machine's host name (a Kubernetes pod's name). 1-64
    /// characters of `[A-Za-z0-9_.-]`. Unused on the embedded store.
    pub replica_id: Option<String>,
    /// With replicas: how long a replica holds a task without renewing its lease (it renews
    /// every third of it). A replica that dies (kill -9, lost machine) has its running tasks
    /// ended `failed` ("replica lost") by another replica within about this time; too short,
    /// and a replica stalled that long (a database failover) loses its running tasks.
    #[serde(with = "duration_text")]
    pub task_lease: Duration,
    /// Most events one task stores and streams, whoever emits them (its plugin, the tool
    /// host, the approval gate, the host). Past it the task's events are dropped, with one
    /// `events_dropped` event naming this key; its `finish` and `approval_*` events are always kept.
    pub max_events_per_task: u64,
    /// Most bytes (JSON) of events one task stores and streams (`32MiB`, or bytes); as
    /// [`ServerConfig::max_events_per_task`].
    #[serde(with = "size_text")]
    pub max_event_bytes_per_task: u64,
    /// Tasks survive the death of the process running them (kill -9, a lost machine, a
    /// deploy): each import call of a task's plugin is journaled in the task store, and
    /// the restarted server (or, with replicas, another replica) runs the plugin again,
    /// answering from the journal, then goes on live (docs/operators.md, "Durable tasks").
    /// Default true; false: such tasks end `failed` ("host restarted", "replica lost").
    pub durable_tasks: bool,
    /// Most journal one task may write (`64MiB`, or bytes); past it the task goes on but
    /// is no longer durable. See [`DEFAULT_JOURNAL_MAX_BYTES`].
    #[serde(with = "size_text")]
    pub journal_max_bytes: u64,
}

/// Default [`ServerConfig::journal_max_bytes`]: the most journal one task may write. A
/// Claude subagent's turn is a few KiB to a few hundred KiB (the model's reply, a tool's
/// output); 64 MiB holds hundreds of long turns, and keeps one runaway task from filling
/// the store. Past it the task goes on but is no longer durable.
pub const DEFAULT_JOURNAL_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// Default [`ServerConfig::max_events_per_task`]: a long agent run streaming its tokens
/// (the plugin's `max_events_per_call` of 20,000 plus as many tool, approval and status
/// events) fits several times over; a task that floods is stopped from growing its live
/// copy in memory and the store without bound.
pub const DEFAULT_MAX_EVENTS_PER_TASK: u64 = 100_000;
/// Default [`ServerConfig::max_event_bytes_per_task`]: twice a call's event bytes
/// (`max_event_bytes_per_call`) for the tool results and host events besides; a running
/// task holds its events in memory, so `max_concurrent_tasks` × this bounds them all.
pub const DEFAULT_MAX_EVENT_BYTES_PER_TASK: u64 = 32 * 1024 * 1024;

/// Default [`ServerConfig::task_lease`]: a dead replica's tasks are known lost in half a
/// minute, while a database failover of a few seconds costs no running task.
pub const DEFAULT_TASK_LEASE: Duration = Duration::from_secs(30);
/// Shortest [`ServerConfig::task_lease`]: renewals every third of it must fit a database
/// round trip under load many times over.
pub const MIN_TASK_LEASE: Duration = Duration::from_secs(1);

/// Whether `id` can name a replica: 1-64 characters of `[A-Za-z0-9_.-]` (it is written
/// into records, metrics labels and container labels).
pub fn valid_replica_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The default replica id: the machine's host name made a valid id, or `warden`.
pub fn default_replica_id() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let id: String = name
        .trim()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '-' })
        .take(64)
        .collect();
    if id.is_empty() { "warden".into() } else { id }
}

/// What a principal may do (`server.principals[].role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Runs tasks as itself and sees only its own tasks, events, files and approvals.
    User,
    /// A user that may also see and decide the approvals of the users in `approves`.
    Approver,
    /// Sees and decides everything, and may run tasks as any `user_id`.
    Admin,
}

/// An environment variable holding a credential of the host ([`Config::credential_envs`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialEnv {
    /// The configuration key naming the variable, for messages (never the value).
    pub key: String,
    /// The variable's name.
    pub var: String,
    /// How the variable holds its value(s).
    pub format: CredentialFormat,
}

/// How a credential variable holds its value(s): what the host uses, and so what must be
/// scrubbed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialFormat {
    /// One value, used whole or trimmed.
    Single,
    /// Comma-separated values, each trimmed, blanks ignored ([`split_list`]): bearer tokens,
    /// several at once for rotation.
    List,
}

impl CredentialFormat {
    /// The texts of `raw` the host may use, so the texts to scrub.
    pub fn values(self, raw: &str) -> Vec<&str> {
        let mut out = vec![raw, raw.trim()];
        if self == CredentialFormat::List {
            out.extend(split_list(raw));
        }
        out
    }
}

/// The items of a comma-separated variable ([`CredentialFormat::List`]): trimmed, blanks ignored.
pub fn split_list(raw: &str) -> impl Iterator<Item = &str> {
    raw.split(',').map(str::trim).filter(|t| !t.is_empty())
}

/// `server.principals[]`: who the holder of a bearer token is.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PrincipalConfig {
    /// The principal's name: the `user_id` its tasks run as, and who its decisions and
    /// tasks are recorded as. 1-128 characters of `[A-Za-z0-9_.-]`, and none of the host's
    /// own names ([`crate::actor::reserved`]).
    pub name: String,
    /// Environment variable holding its bearer token (comma-separated for rotation).
    pub token_env: String,
    pub role: Role,
    /// Users whose approvals this `approver` may see and decide.
    #[serde(default)]
    pub approves: Vec<String>,
}

/// Default largest API request body: a long prompt with context fits, a memory bomb does not.
pub const DEFAULT_MAX_BODY: u64 = 1024 * 1024;
/// Default `server.max_connections`: half of the usual 1,024 file descriptors a process
/// starts with, so open connections alone can never take the ones the task store, the
/// Docker client and the egress proxies need. A host with a raised `ulimit -n` and many
/// parent agents raises it.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// Default `server.max_connections_per_address`: a quarter of
/// [`DEFAULT_MAX_CONNECTIONS`], so four addresses cannot hold every connection serving
/// requests, while a remote parent agent's pool of 100 concurrent requests fits. Loopback
/// is not counted: a reverse proxy or parent agent on this machine brings every client
/// through one address, and a local user has easier ways to load the host.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 128;
/// Default `server.first_request_timeout`: a client sends its first request head as soon
/// as it has connected (milliseconds, even over a slow link); 5 s leaves room for a TLS
/// terminator or a congested network, while a peer that connects and sends nothing holds
/// its connection 5 s, not [`DEFAULT_HEADER_READ_TIMEOUT`].
pub const DEFAULT_FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Default `server.header_read_timeout`: hyper's own default, which `axum::serve` never
/// enforced; a client that has not sent a whole request head in 30 s is not a client.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Default `server.max_streams_per_principal`: a parent agent follows a few tasks at once
/// (a console, a CLI `--follow`, an MCP client's tool calls); 32 leaves room for fan-out,
/// while sixteen principals together still stay within [`DEFAULT_MAX_CONNECTIONS`].
pub const DEFAULT_MAX_STREAMS_PER_PRINCIPAL: usize = 32;
/// Default heartbeat interval on event streams: under the 30-60 s idle timeouts of
/// common proxies and load balancers.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(15);
/// Default drain on shutdown: under the 30 s a container orchestrator waits between
/// SIGTERM and SIGKILL by default (Kubernetes' `terminationGracePeriodSeconds`, Docker's
/// `stop` is 10 s: set `docker stop -t` above this), while most tasks finish.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(25);

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            addr: DEFAULT_SERVER_ADDR.into(),
            tokens_env: "WARDEN_TOKENS".into(),
            principals: vec![],
            max_concurrent_tasks: DEFAULT_MAX_CONCURRENT_TASKS,
            max_queued_tasks: DEFAULT_MAX_QUEUED_TASKS,
            max_tasks_per_user: DEFAULT_MAX_TASKS_PER_USER,
            max_running_per_user: None,
            task_timeout: DEFAULT_TASK_TIMEOUT,
            max_tool_iterations: None,
            max_body: DEFAULT_MAX_BODY,
            heartbeat: DEFAULT_HEARTBEAT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            first_request_timeout: DEFAULT_FIRST_REQUEST_TIMEOUT,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            max_streams_per_principal: DEFAULT_MAX_STREAMS_PER_PRINCIPAL,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            replica_id: None,
            task_lease: DEFAULT_TASK_LEASE,
            max_events_per_task: DEFAULT_MAX_EVENTS_PER_TASK,
            max_event_bytes_per_task: DEFAULT_MAX_EVENT_BYTES_PER_TASK,
            durable_tasks: true,
            journal_max_bytes: DEFAULT_JOURNAL_MAX_BYTES,
        }
    }
}

/// `mcp:` — how warden presents itself to parent agents over MCP (`warden mcp` on
/// stdio, `/mcp` on `warden serve`).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpConfig {
    /// Which tools the MCP server lists. Default `subagents`: one tool per subagent,
    /// so a parent agent picks a subagent by picking a tool.
    pub mode: McpMode,
}

/// `mcp.mode`: the tools warden's MCP server lists.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum McpMode {
    /// One tool per subagent (named after it; input: prompt and optional description,
    /// model, resume, session).
    #[default]
    Subagents,
    /// The `Task` / `TaskOutput` pair of `warden tool-schema`.
    Task,
}

/// Where the task store is when `store:` names neither `path` nor `url`: a file beside
/// the configuration, so a first `warden serve` needs no setup.
pub const DEFAULT_STORE_PATH: &str = "./.warden/state.db";

/// `store:` — where task records, their events and plugin state persist: an embedded
/// file (`path`, the default) or a PostgreSQL database (`url`), never both.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// The embedded store's file, relative to the configuration file (default
    /// `./.warden/state.db`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// A PostgreSQL database, `postgres://user:password@host:port/database` (or
    /// `postgresql://`; the password percent-encoded). warden never prints the password:
    /// errors, logs and `warden config check` show the URL with `***` in its place.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// How long finished tasks (record, output, events) are kept, and plugin state that
    /// is not written again (default 7d).
    #[serde(with = "duration_text")]
    pub retention: Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self { path: None, url: None, retention: crate::store::DEFAULT_RETENTION }
    }
}

/// Which backend `store:` selects (see [`StoreConfig::location`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// The embedded file (not yet resolved against the configuration's directory).
    File(PathBuf),
    /// The PostgreSQL URL, password included: never print it (`crate::store::redact_url`).
    Postgres(String),
}

impl StoreConfig {
    /// The backend to open: `url` if set, else `path`, else [`DEFAULT_STORE_PATH`].
    pub fn location(&self) -> StoreLocation {
        match (&self.url, &self.path) {
            (Some(url), _) => StoreLocation::Postgres(url.clone()),
            (None, Some(path)) => StoreLocation::File(path.clone()),
            (None, None) => StoreLocation::File(PathBuf::from(DEFAULT_STORE_PATH)),
        }
    }

    /// The location as `warden config check` and logs show it: the URL without its password.
    pub fn describe(&self) -> String {
        match self.location() {
            StoreLocation::File(p) => format!("file {}", p.display()),
            StoreLocation::Postgres(url) => format!("PostgreSQL {}", crate::store::redact_url(&url)),
        }
    }

    fn validate(&self) -> Result<(), (String, String)> {
        if self.path.is_some() && self.url.is_some() {
            return Err((
                "store".into(),
                "set either store.path (an embedded file) or store.url (PostgreSQL), not both".into(),
            ));
        }
        if let Some(url) = &self.url {
            let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
            if !matches!(scheme.as_deref(), Some("postgres" | "postgresql")) {
                return Err((
                    "store.url".into(),
                    format!(
                        "expected a PostgreSQL URL, postgres://user:password@host:port/database; got {:?}",
                        crate::store::redact_url(url)
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl Config {
    /// Loads `path`, or `./warden.yaml` if present, or the built-in defaults.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        match path {
            Some(p) => Self::from_file(p),
            None if Path::new(DEFAULT_CONFIG_FILE).is_file() => Self::from_file(Path::new(DEFAULT_CONFIG_FILE)),
            None => Ok(Config { base_dir: PathBuf::from("."), ..Config::default() }),
        }
    }

    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { file: path.to_owned(), source })?;
        let mut config = Self::from_yaml(&text, path)?;
        config.base_dir = path.parent().map(Path::to_owned).unwrap_or_default();
        if config.base_dir.as_os_str().is_empty() {
            config.base_dir = PathBuf::from(".");
        }
        config.source = Some(path.to_owned());
        // sandbox.hosts[].tls files are relative to this file, like every configured path.
        let base = config.base_dir.clone();
        config.sandbox.resolve_paths(&base);
        if let Some(file) = config.mcp_servers_file.clone() {
            let invalid = |message: String| ConfigError::Invalid {
                file: path.to_owned(),
                key: "mcp_servers_file".into(),
                message,
            };
            let servers = mcp::read_mcp_json(&config.path(&file)).map_err(invalid)?;
            for (name, server) in servers {
                if config.mcp_servers.contains_key(&name) {
                    return Err(invalid(format!("server {name:?} is also defined in mcp_servers")));
                }
                config.mcp_servers.insert(name, server);
            }
            config.check_granted_mcp_servers().map_err(|(key, message)| ConfigError::Invalid {
                file: path.to_owned(),
                key,
                message,
            })?;
        }
        Ok(config)
    }

    /// Every MCP server a grant names (`plugins.grants.<id>.mcp_servers`) is one of
    /// `mcp_servers` (with those of `mcp_servers_file`, so checked once that file is read):
    /// a name that is not grants nothing and is most likely a typo.
    fn check_granted_mcp_servers(&self) -> Result<(), (String, String)> {
        for (id, grant) in &self.plugins.grants {
            for (i, name) in grant.mcp_servers.iter().enumerate() {
                if !self.mcp_servers.contains_key(name) {
                    let known = self.mcp_servers.keys().map(String::as_str).collect::<Vec<_>>().join(", ");
                    return Err((
                        format!("plugins.grants.{id}.mcp_servers[{i}]"),
                        format!("no MCP server named {name:?} in mcp_servers (configured: {known})"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Parses YAML text; `file` is only used in error messages.
    pub fn from_yaml(text: &str, file: &Path) -> Result<Config, ConfigError> {
        if text.trim().is_empty() {
            return Ok(Config::default());
        }
        let de = serde_yaml::Deserializer::from_str(text);
        let config: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            let inner = e.into_inner();
            let location =
                inner.location().map(|l| format!(" (line {}, column {})", l.line(), l.column())).unwrap_or_default();
            ConfigError::Invalid {
                file: file.to_owned(),
                key: if key == "." { "(top level)".into() } else { key },
                message: format!("{}{location}", bare_message(&inner.to_string())),
            }
        })?;
        config.validate(file)?;
        Ok(config)
    }

    fn validate(&self, file: &Path) -> Result<(), ConfigError> {
        let invalid = |key: String, message: String| ConfigError::Invalid { file: file.to_owned(), key, message };
        if let Some(id) = &self.server.replica_id
            && !valid_replica_id(id)
        {
            return Err(invalid(
                "server.replica_id".into(),
                format!("expected 1-64 characters of [A-Za-z0-9_.-], got {:?}", crate::text::escape_control(id)),
            ));
        }
        for (key, value) in [
            ("server.max_connections", self.server.max_connections),
            ("server.max_connections_per_address", self.server.max_connections_per_address),
            ("server.max_streams_per_principal", self.server.max_streams_per_principal),
        ] {
            if value == 0 {
                return Err(invalid(key.into(), "expected at least 1 (the API could serve nothing)".into()));
            }
        }
        for (key, value) in [
            ("server.header_read_timeout", self.server.header_read_timeout),
            ("server.first_request_timeout", self.server.first_request_timeout),
        ] {
            if value.is_zero() {
                return Err(invalid(key.into(), "expected a duration above 0 (e.g. 5s)".into()));
            }
        }
        if self.server.max_tasks_per_user == 0 {
            return Err(invalid(
                "server.max_tasks_per_user".into(),
                "expected at least 1 (a user with no share could run nothing)".into(),
            ));
        }
        if self.server.max_running_per_user == Some(0) {
            return Err(invalid(
                "server.max_running_per_user".into(),
                "expected at least 1 (a user who may run nothing would wait for ever), or leave it unset".into(),
            ));
        }
        if self.server.task_lease < MIN_TASK_LEASE {
            return Err(invalid(
                "server.task_lease".into(),
                format!("expected at least {}", humantime::format_duration(MIN_TASK_LEASE)),
            ));
        }
        if !(1..=MAX_SUBAGENT_DEPTH).contains(&self.subagents.max_depth) {
            return Err(invalid(
                "subagents.max_depth".into(),
                format!("expected 1 (no nesting) to {MAX_SUBAGENT_DEPTH}, got {}", self.subagents.max_depth),
            ));
        }
        // Egress is judged at load, strictly: a policy that cannot be read never starts a
        // host (the rest of `sandbox:` fails its tool calls, so text-only work continues).
        if let Some(egress) = &self.sandbox.egress {
            egress.validate().map_err(|e| invalid("sandbox.egress".into(), e.to_string()))?;
            if self.sandbox.network != warden_sandbox::config::DEFAULT_NETWORK {
                return Err(invalid(
                    "sandbox.network".into(),
                    "expected `none` when sandbox.egress is set (the proxy is the only way out)".into(),
                ));
            }
        }
        for (id, grant) in &self.plugins.grants {
            for (i, pattern) in grant.http.iter().enumerate() {
                crate::capability::http::AllowedUrl::parse(pattern)
                    .map_err(|e| invalid(format!("plugins.grants.{id}.http[{i}]"), e.to_string()))?;
            }
            for (name, secret) in &grant.secrets {
                let key = format!("plugins.grants.{id}.secrets.{name}");
                if secret.origins.is_empty() {
                    return Err(invalid(
                        format!("{key}.origins"),
                        "a secret needs the origins it may be sent to, e.g. origins: [\"https://api.example.com\"]"
                            .into(),
                    ));
                }
                for (i, pattern) in secret.origins.iter().enumerate() {
                    crate::capability::http::AllowedUrl::parse(pattern)
                        .map_err(|e| invalid(format!("{key}.origins[{i}]"), e.to_string()))?;
                }
                if secret.env.trim().is_empty() {
                    return Err(invalid(
                        format!("{key}.env"),
                        "expected the environment variable holding the value".into(),
                    ));
                }
                let header = secret.header.to_ascii_lowercase();
                if reqwest::header::HeaderName::from_bytes(header.as_bytes()).is_err()
                    || matches!(header.as_str(), "host" | "content-length" | "transfer-encoding" | "connection")
                {
                    return Err(invalid(format!("{key}.header"), format!("{:?} cannot carry a secret", secret.header)));
                }
            }
        }
        let limits = std::iter::once(("plugins.limits".to_string(), self.plugins.limits)).chain(
            self.plugins
                .limit_overrides
                .iter()
                .map(|(id, o)| (format!("plugins.limit_overrides.{id}"), self.plugins.limits.with_override(Some(o)))),
        );
        let hex64 = |v: &str| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit());
        for (i, entry) in self.plugins.trust.iter().enumerate() {
            let at = match entry.ids() {
                None => format!("plugins.trust[{i}]"),
                Some(_) => format!("plugins.trust[{i}].key"),
            };
            if !hex64(entry.key().trim()) {
                return Err(invalid(at, "expected an Ed25519 public key: 64 hex digits (warden plugin keygen)".into()));
            }
            let ids = entry.ids().unwrap_or_default();
            if entry.ids().is_some() && ids.is_empty() {
                return Err(invalid(
                    format!("plugins.trust[{i}].ids"),
                    "expected the plugin ids this key is trusted for (a bare key is trusted for every id)".into(),
                ));
            }
            if let Some((j, id)) = ids.iter().enumerate().find(|(_, id)| !crate::provenance::valid_id(id.trim())) {
                return Err(invalid(
                    format!("plugins.trust[{i}].ids[{j}]"),
                    format!(
                        "{:?} is not a plugin id (a file name without .wasm: letters, digits, `.`, `_`, `-`)",
                        crate::text::escape_control(
                            &id.chars().take(crate::provenance::MAX_ID_LEN).collect::<String>()
                        )
                    ),
                ));
            }
        }
        for (id, pin) in &self.plugins.pins {
            if !hex64(pin.trim()) {
                return Err(invalid(
                    format!("plugins.pins.{id}"),
                    "expected a SHA-256: 64 hex digits (sha256sum)".into(),
                ));
            }
        }
        if self.plugins.ready_instances > MAX_READY_INSTANCES {
            return Err(invalid(
                "plugins.ready_instances".into(),
                format!("expected at most {MAX_READY_INSTANCES} (0 turns ready instances off)"),
            ));
        }
        let growth = self.plugins.budgets.memory_growth_per_second;
        if growth != 0 && growth < MIN_MEMORY_GROWTH_PER_SECOND {
            return Err(invalid(
                "plugins.budgets.memory_growth_per_second".into(),
                format!(
                    "expected 0 (unpaced) or at least {MIN_MEMORY_GROWTH_PER_SECOND} bytes (1MiB) a second, got {growth}; below it a call that grows its memory once waits longer than any call may run"
                ),
            ));
        }
        if self.plugins.compile_memory < MIN_COMPILE_MEMORY {
            return Err(invalid(
                "plugins.compile_memory".into(),
                format!(
                    "expected at least {MIN_COMPILE_MEMORY} bytes (128MiB); the compiler process cannot start with less"
                ),
            ));
        }
        for (key, l) in limits {
            if l.timeout.is_zero() {
                return Err(invalid(format!("{key}.timeout"), "expected a duration above zero, like 30s".into()));
            }
            if l.memory < MIN_MEMORY_LIMIT {
                return Err(invalid(
                    format!("{key}.memory"),
                    format!("expected at least {MIN_MEMORY_LIMIT} bytes (1MiB); a component cannot start with less"),
                ));
            }
        }
        warden_approval::Policy::from_config(self.approval.clone())
            .map_err(|e| invalid("approval".into(), e.to_string()))?;
        for (name, server) in &self.mcp_servers {
            mcp::check_server_name(name).map_err(|e| invalid("mcp_servers".into(), e))?;
            server.transport().map_err(|e| invalid(format!("mcp_servers.{name}"), e))?;
        }
        // With an `mcp_servers_file`, granted names are checked once its servers are read.
        if self.mcp_servers_file.is_none() {
            self.check_granted_mcp_servers().map_err(|(key, message)| invalid(key, message))?;
        }
        let base = file.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        warden_models::ModelRouter::from_config(&self.models, base)
            .map_err(|e| invalid("models".into(), e.to_string()))?;
        let mut names = std::collections::BTreeSet::new();
        for (i, p) in self.server.principals.iter().enumerate() {
            let key = format!("server.principals[{i}]");
            let plain = |s: &str| {
                !s.is_empty()
                    && s.len() <= 128
                    && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            };
            if !plain(&p.name) {
                return Err(invalid(format!("{key}.name"), "expected 1-128 characters of [A-Za-z0-9_.-]".into()));
            }
            if crate::actor::reserved(&p.name) {
                return Err(invalid(
                    format!("{key}.name"),
                    format!(
                        "{:?} is a name the host acts or records under (its decisions would be audited as the \
                         host's); expected a name of your own, not {} or token<N> (in any case)",
                        p.name,
                        crate::actor::RESERVED.join(", ")
                    ),
                ));
            }
            if !names.insert(p.name.as_str()) {
                return Err(invalid(format!("{key}.name"), format!("principal {:?} is defined twice", p.name)));
            }
            if p.token_env.trim().is_empty() {
                return Err(invalid(
                    format!("{key}.token_env"),
                    "expected the environment variable holding its token".into(),
                ));
            }
            if !p.approves.is_empty() && p.role != Role::Approver {
                return Err(invalid(format!("{key}.approves"), "only an approver approves for other users".into()));
            }
            if let Some(u) = p.approves.iter().find(|u| !plain(u)) {
                return Err(invalid(format!("{key}.approves"), format!("{u:?} is not a user id")));
            }
        }
        self.store.validate().map_err(|(key, message)| invalid(key, message))?;
        for (i, r) in self.subagents.references.iter().enumerate() {
            if r.kind.trim().is_empty() {
                return Err(invalid(format!("subagents.references[{i}].kind"), "expected a kind like A2A".into()));
            }
        }
        Ok(())
    }

    /// Every environment variable holding a credential the host itself uses, with the
    /// configuration key that names it: MCP servers' `auth_env`, plugin-granted secrets'
    /// `env`, model providers' API keys ([`warden_models::ProviderConfig::key_env`]), and the
    /// API's bearer tokens (`server.principals[].token_env`, `server.tokens_env`). Their
    /// values are registered with the scrubber at start ([`crate::app`]), so they never
    /// appear in events, outputs or logs. (`sandbox.egress` credentials are registered by
    /// the tool host, with the header values they are sent as.)
    pub fn credential_envs(&self) -> Vec<CredentialEnv> {
        let one = |key: String, var: &str| CredentialEnv { key, var: var.to_owned(), format: CredentialFormat::Single };
        let list = |key: String, var: &str| CredentialEnv { key, var: var.to_owned(), format: CredentialFormat::List };
        let mcp = self
            .mcp_servers
            .iter()
            .filter_map(|(name, s)| s.auth_env.as_ref().map(|v| one(format!("mcp_servers.{name}.auth_env"), v)));
        let grants = self.plugins.grants.iter().flat_map(|(id, g)| {
            g.secrets.iter().map(move |(name, s)| one(format!("plugins.grants.{id}.secrets.{name}.env"), &s.env))
        });
        let models = self
            .models
            .providers
            .iter()
            .filter_map(|(key, p)| p.key_env().map(|v| one(format!("models.providers.{key}.api_key_env"), v)));
        let principals = self
            .server
            .principals
            .iter()
            .enumerate()
            .map(|(i, p)| list(format!("server.principals[{i}].token_env"), &p.token_env));
        let admins = std::iter::once(list("server.tokens_env".into(), &self.server.tokens_env));
        mcp.chain(grants).chain(models).chain(principals).chain(admins).collect()
    }

    /// Resolves a configured path against the config file's directory.
    pub fn path(&self, p: &Path) -> PathBuf {
        if p.is_absolute() { p.to_owned() } else { self.base_dir.join(p) }
    }

    /// The largest memory budget any plugin has (default limits or an override): the
    /// size of one memory slot of the instance pool.
    pub fn max_plugin_memory(&self) -> u64 {
        self.plugins
            .limit_overrides
            .keys()
            .map(|id| self.limits_for(id).memory)
            .fold(self.plugins.limits.memory, u64::max)
    }

    /// Limits for one plugin id.
    pub fn limits_for(&self, plugin_id: &str) -> Limits {
        self.plugins.limits.with_override(self.plugins.limit_overrides.get(plugin_id))
    }

    /// What the configuration came from, for messages.
    pub fn source_name(&self) -> String {
        self.source.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "<built-in defaults>".into())
    }
}

/// serde_yaml's message without its own path prefix and location suffix (both are
/// reported separately and more precisely).
fn bare_message(text: &str) -> &str {
    let mut t = text;
    if let Some((prefix, rest)) = t.split_once(": ")
        && !prefix.contains(' ')
        && !prefix.is_empty()
    {
        t = rest;
    }
    match t.rfind(" at line ") {
        Some(i) => &t[..i],
        None => t,
    }
}

/// Smallest memory limit accepted: one 64 KiB wasm page is not enough for any real guest.
pub const MIN_MEMORY_LIMIT: u64 = 1024 * 1024;
/// Default `plugins.ready_instances`: off. Measured (BENCHMARKS.md, "Plugin runtime"), a
/// call that finds a ready instance took 12–20 µs instead of 32 µs on one VM, and nothing
/// less than a pooled call (12.1 vs 11.4 µs) on another once SDK-built plugins stopped
/// growing memory per call; calls of one plugin back to back took 0.92–2.24× as long (on
/// 2 vCPUs the background instantiation and teardown compete with the calls), so it is
/// for hosts whose plugin calls are latency-bound and sparse, chosen and measured by the
/// operator (16 is a good first value).
pub const DEFAULT_READY_INSTANCES: u32 = 0;
/// Largest `plugins.ready_instances`: past this the slots cost address space and memory
/// for no call that could use them (a host runs far fewer plugins).
pub const MAX_READY_INSTANCES: u32 = 1024;

/// Smallest `plugins.memory_growth_per_second` but 0: a call that grows at all is charged
/// 2 MiB, so below 1 MiB/s the first growth of a busy plugin's calls would wait seconds.
pub const MIN_MEMORY_GROWTH_PER_SECOND: u64 = 1024 * 1024;

/// Smallest `plugins.compile_memory`: the compiler process maps the `warden` binary and
/// its threads' stacks before it compiles anything.
pub const MIN_COMPILE_MEMORY: u64 = 128 * 1024 * 1024;

/// Parses `30s`, `2m`, `1h 30m` (humantime) — the only duration syntax in the config.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("invalid duration {text:?} ({e}); expected like 30s, 2m or 1h"))
}

/// Parses `64MiB`, `512 MB`, `1GiB` or a plain byte count.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("invalid size {text:?}; expected like 64MiB or 1048576"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "kib" | "ki" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" | "mi" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" | "gi" => 1 << 30,
        other => {
            return Err(format!("invalid size unit {other:?} in {text:?}; expected B, KiB, MiB, GiB, KB, MB or GB"));
        }
    };
    Ok((n * mult as f64) as u64)
}

/// A YAML scalar that is either a string or a number, for sizes and durations.
#[derive(Deserialize)]
#[serde(untagged)]
enum Scalar {
    Int(u64),
    Text(String),
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Int(n) => write!(f, "{n}"),
            Scalar::Text(s) => f.write_str(s),
        }
    }
}

mod duration_text {
    use super::*;
    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        match Scalar::deserialize(d)? {
            Scalar::Int(secs) => Ok(Duration::from_secs(secs)),
            Scalar::Text(t) => parse_duration(&t).map_err(serde::de::Error::custom),
        }
    }
}

mod opt_duration_text {
    use super::*;
    pub fn serialize<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::duration_text::serialize(d, s),
            None => s.serialize_none(),
        }
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        super::duration_text::deserialize(d).map(Some)
    }
}

mod size_text {
    use super::*;
    pub fn serialize<S: serde::Serializer>(n: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(*n)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        match Scalar::deserialize(d)? {
            Scalar::Int(n) => Ok(n),
            Scalar::Text(t) => parse_size(&t).map_err(serde::de::Error::custom),
        }
    }
}

mod opt_size_text {
    use super::*;
    pub fn serialize<S: serde::Serializer>(n: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match n {
            Some(n) => s.serialize_u64(*n),
            None => s.serialize_none(),
        }
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        super::size_text::deserialize(d).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<Config, ConfigError> {
        Config::from_yaml(yaml, Path::new("w.yaml"))
    }

    #[test]
    fn empty_file_gives_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.plugins.limits, Limits::default());
        assert!(c.plugins.grants.is_empty());
    }

    #[test]
    fn store_is_a_file_or_a_postgres_url_never_both() {
        assert_eq!(parse("").unwrap().store.location(), StoreLocation::File(DEFAULT_STORE_PATH.into()));
        assert_eq!(parse("store:\n  path: ./s.db\n").unwrap().store.location(), StoreLocation::File("./s.db".into()));
        let c = parse("store:\n  url: postgres://warden:s3cr3t@db:5432/warden\n").unwrap();
        assert_eq!(c.store.location(), StoreLocation::Postgres("postgres://warden:s3cr3t@db:5432/warden".into()));
        assert_eq!(c.store.describe(), "PostgreSQL postgres://warden:***@db:5432/warden");
        let e = parse("store:\n  path: ./s.db\n  url: postgres://h/d\n").unwrap_err().to_string();
        assert!(e.starts_with("w.yaml: store: set either store.path"), "{e}");
        let e = parse("store:\n  url: mysql://u:s3cr3t@h/d\n").unwrap_err().to_string();
        assert!(e.starts_with("w.yaml: store.url: expected a PostgreSQL URL"), "{e}");
        assert!(!e.contains("s3cr3t"), "the password stays out of the error: {e}");
    }

    /// Issue 20: nesting is off by default and bounded; 0 and values past the cap are
    /// errors naming the key.
    #[test]
    fn subagent_depth_defaults_to_no_nesting_and_is_bounded() {
        assert_eq!(parse("").unwrap().subagents.max_depth, 1);
        assert_eq!(parse("subagents:\n  max_depth: 3\n").unwrap().subagents.max_depth, 3);
        for bad in [0, MAX_SUBAGENT_DEPTH + 1] {
            let e = parse(&format!("subagents:\n  max_depth: {bad}\n")).unwrap_err().to_string();
            assert!(e.starts_with("w.yaml: subagents.max_depth: expected 1 (no nesting) to 5"), "{e}");
        }
    }

    /// The growth budget is 0 (off) or a sane rate, in size text, with an error naming the key.
    #[test]
    fn memory_growth_budget_is_off_or_at_least_a_mebibyte_a_second() {
        assert_eq!(parse("").unwrap().plugins.budgets.memory_growth_per_second, DEFAULT_MEMORY_GROWTH_PER_SECOND);
        let budget = |v: &str| parse(&format!("plugins:\n  budgets:\n    memory_growth_per_second: {v}\n"));
        assert_eq!(budget("0").unwrap().plugins.budgets.memory_growth_per_second, 0);
        assert_eq!(budget("64MiB").unwrap().plugins.budgets.memory_growth_per_second, 64 << 20);
        let e = budget("1000").unwrap_err().to_string();
        assert!(
            e.starts_with("w.yaml: plugins.budgets.memory_growth_per_second: expected 0 (unpaced) or at least"),
            "{e}"
        );
    }

    /// Issue 20: agent-defined MCP servers are off by default and on only when the operator
    /// says `true` (what the registry then admits: `registry.rs`).
    #[test]
    fn agent_defined_mcp_servers_are_off_unless_allowed() {
        assert!(!parse("").unwrap().subagents.allow_agent_mcp_servers);
        assert!(!parse("subagents:\n  allow_agent_mcp_servers: false\n").unwrap().subagents.allow_agent_mcp_servers);
        assert!(parse("subagents:\n  allow_agent_mcp_servers: true\n").unwrap().subagents.allow_agent_mcp_servers);
    }

    /// A grant names configured MCP servers only (from `mcp_servers` or, once read, the
    /// `mcp_servers_file`): a typo is an error naming the key, not a grant of nothing.
    #[test]
    fn granted_mcp_servers_must_be_configured() {
        let servers = "mcp_servers:\n  github: { url: \"https://mcp.example.com/mcp\" }\n";
        let ok =
            parse(&format!("plugins:\n  grants:\n    claude: {{ tools: true, mcp_servers: [github] }}\n{servers}"));
        assert_eq!(ok.unwrap().plugins.grants["claude"].mcp_servers, ["github"]);
        assert!(!parse("").unwrap().plugins.grants.contains_key("claude"), "nothing granted by default");
        let e = parse(&format!("plugins:\n  grants:\n    claude: {{ mcp_servers: [github, gihub] }}\n{servers}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("plugins.grants.claude.mcp_servers[1]") && e.contains("\"gihub\""), "{e}");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(".mcp.json"), r#"{"mcpServers": {"fs": {"url": "http://127.0.0.1:9/mcp"}}}"#)
            .unwrap();
        let file = dir.path().join("warden.yaml");
        let grant = |name: &str| {
            format!("mcp_servers_file: ./.mcp.json\nplugins:\n  grants:\n    claude: {{ mcp_servers: [{name}] }}\n")
        };
        std::fs::write(&file, grant("fs")).unwrap();
        assert!(Config::from_file(&file).is_ok(), "a server of the mcp_servers_file may be granted");
        std::fs::write(&file, grant("gh")).unwrap();
        let e = Config::from_file(&file).unwrap_err().to_string();
        assert!(e.contains("plugins.grants.claude.mcp_servers[0]") && e.contains("\"gh\""), "{e}");
    }

    #[test]
    fn unknown_key_names_file_and_path() {
        let e = parse("plugins:\n  limits:\n    timeot: 3s\n").unwrap_err().to_string();
        assert!(e.starts_with("w.yaml: plugins.limits.timeot: unknown field `timeot`, expected one of"), "{e}");
        assert!(e.ends_with("(line 3, column 5)"), "{e}");
    }

    #[test]
    fn sandbox_egress_is_judged_at_load() {
        let c =
            parse("sandbox:\n  egress:\n    allow: [pypi.org, \"*.pythonhosted.org\", \"127.0.0.1:8080\"]\n").unwrap();
        assert_eq!(c.sandbox.egress.unwrap().allow.len(), 3);
        for (yaml, says) in [
            (
                "sandbox:\n  egress:\n    allow: [pypi.org, \"https://x.org\"]\n",
                "sandbox.egress.allow[1]: expected a host pattern",
            ),
            ("sandbox:\n  egress:\n    deny: [\"*\"]\n", "sandbox.egress.deny[0]"),
            ("sandbox:\n  egress:\n    alow: [pypi.org]\n", "unknown field `alow`"),
            ("sandbox:\n  network: bridge\n  egress:\n    allow: [pypi.org]\n", "sandbox.network"),
            (
                "sandbox:\n  egress:\n    allow: [a.example]\n    credentials: [{ host: b.example, header: Authorization, value_env: T }]\n",
                "sandbox.egress.credentials[0].host",
            ),
        ] {
            let e = parse(yaml).unwrap_err().to_string();
            assert!(e.contains(says), "{yaml}: {e}");
        }
    }

    #[test]
    fn bad_duration_names_key_and_expectation() {
        let e = parse("plugins:\n  limits:\n    timeout: soon\n").unwrap_err().to_string();
        assert!(e.contains("plugins.limits.timeout") && e.contains("expected like 30s"), "{e}");
    }

    #[test]
    fn sizes_and_durations_parse() {
        let c = parse("plugins:\n  limits: { timeout: 2s, memory: 16MiB, fuel: 1000 }\n").unwrap();
        assert_eq!(c.plugins.limits.timeout, Duration::from_secs(2));
        assert_eq!(c.plugins.limits.memory, 16 << 20);
        assert_eq!(c.plugins.limits.fuel, Some(1000));
    }

    #[test]
    fn bad_http_grant_is_reported_with_its_index() {
        let e = parse("plugins:\n  grants:\n    a2a: { http: [\"example.com\"] }\n").unwrap_err().to_string();
        assert!(e.contains("plugins.grants.a2a.http[0]") && e.contains("scheme"), "{e}");
    }

    #[test]
    fn override_replaces_only_given_fields() {
        let c = parse("plugins:\n  limit_overrides:\n    slow: { timeout: 90s }\n").unwrap();
        let l = c.limits_for("slow");
        assert_eq!(l.timeout, Duration::from_secs(90));
        assert_eq!(l.memory, DEFAULT_MEMORY_LIMIT);
        assert_eq!(c.limits_for("other"), Limits::default());
    }
}
