//! Per-session hardened Docker sandboxes and the file/shell tools that run in them.
//!
//! The host builds one [`Sandbox`] from the operator's `sandbox:` settings
//! ([`SandboxConfig`]) and calls [`Sandbox::call_tool`] for every Read, Write, Edit, Glob,
//! Grep or Bash call of a subagent, keyed by [`SessionKey`] (user id, session id). The first
//! call of a session takes a pre-warmed container from the pool (`sandbox.warm_pool`) or
//! creates one; later calls reuse it; idle sessions are reaped;
//! [`Sandbox::shutdown`] removes everything. Operators get [`Sandbox::list_sessions`],
//! [`Sandbox::prune`] and [`Sandbox::metrics`].
//!
//! Several host processes (replicas, [`SandboxConfig::replica_id`]) may share one scope: a
//! session keeps one container whichever of them serves it (see `session`).
//!
//! Long-running session processes (stdio MCP servers, [`Sandbox::spawn_process`]) run in
//! the same container and live no longer than it (an owned one,
//! [`Sandbox::spawn_owned_process`], ends sooner when the host ends it); once settled
//! ([`Settler`]), whatever they start later is killed when the call that started it ends
//! ([`Sandbox::contain`], which their owner calls after each of their calls) and before the
//! session's next command starts. A session's Bash commands run at the same time only when
//! they carry the same secrets (`lanes`): they run as one user and could read each other's
//! environment.
//!
//! The modules are layered, each using only those below it (no import cycle; `cargo xtask
//! test` checks): errors, counters and plain data at the bottom (`error`, `metrics`,
//! `session_key`, `egress_policy`, `config`); what the engine's runtimes can serve
//! (`runtime`); the agent protocol and running requests on it
//! (`agent`, `exec`) and the environment every call starts with (`environment`) and workspace disks (`disk`); the egress proxy (`egress`); making,
//! finding and removing containers (`container`); named snapshots of workspaces
//! (`snapshot`); a session's working directory (`shell_state`)
//! and the warm pool (`pool`); which commands of a session may run at once (`lanes`);
//! sessions (`session`); and on top the tools (`workspace`,
//! `tools`) and session processes (`process`).
//!
//! This crate must never give sandboxed code a way out: no Docker socket, no host paths,
//! no capabilities, no root, no file access outside /workspace, no command that outlives
//! its timeout — and it must never log the per-task environment it passes to Bash.

mod agent;
pub mod config;
pub mod container;
mod disk;
pub mod egress;
pub mod egress_policy;
pub mod environment;
pub mod error;
mod exec;
mod inspect;
mod lanes;
pub mod metrics;
mod pool;
pub mod process;
pub mod runtime;
pub mod session;
mod session_key;
mod shell_state;
pub mod snapshot;
pub mod tools;
mod workspace;

pub use agent::FileIdentity;
pub use config::{ByteSize, DockerHost, DockerTls, SandboxConfig};
pub use egress::{
    BoardFuture, EgressBoard, EgressConfig, EgressEvent, EgressHold, EgressNarrowing, EgressObserver, EgressPolicy,
    EgressReport, EgressSuppressed, SharedNarrowing,
};
pub use error::{DockerObject, SandboxError};
pub use exec::cap_text;
pub use inspect::HostCommandOutput;
/// The one fingerprint of a set of secrets: the lanes', the shell state's, and the host's
/// key for stdio MCP server processes.
pub use lanes::{NO_SECRETS, Writer};
pub use metrics::MetricsSnapshot;
pub use process::{ProcessId, SessionProcess, Settler};
pub use session::{HostStatus, MAX_CONCURRENT_DOWNLOADS, PruneReport, Sandbox, SessionInfo, SessionKey};
pub use shell_state::writer_of;
pub use snapshot::SnapshotInfo;
pub use tools::{ResolvedPath, TOOL_NAMES, ToolOutput, ToolSpec, tool_path, tool_specs};
