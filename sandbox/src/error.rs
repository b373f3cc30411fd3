//! Errors of the sandbox crate: infrastructure failures and refused requests.
//!
//! A tool's ordinary failure (file not found, non-zero exit, ambiguous edit) is a
//! `ToolOutput { is_error: true }`, not one of these. Messages here are shown to operators
//! and models: they must name what failed and what to do, and must never contain secrets
//! (per-task environment values are never formatted into an error).

use thiserror::Error;

/// Everything that can go wrong in the sandbox crate.
#[derive(Debug, Error)]
pub enum SandboxError {
    /// The Docker engine cannot be reached (socket missing, daemon down, API error on connect).
    #[error(
        "Docker is unavailable: {0}. Sandbox tools (Read, Write, Edit, Glob, Grep, Bash) need a running Docker Engine; text-only subagents keep working"
    )]
    DockerUnavailable(String),

    /// The configured image is not present locally (there is no registry to pull from).
    #[error(
        "sandbox image `{image}` is not present in the local Docker engine; build it with `cargo xtask build` (or: debootstrap --variant=minbase --include=python3-minimal,ripgrep,ca-certificates bookworm ROOTFS && tar -C ROOTFS -c . | docker import - {image})"
    )]
    ImageMissing {
        /// The image reference that was not found.
        image: String,
    },

    /// The per-host session limit (`sandbox.max_sessions`) is reached.
    #[error(
        "too many sandbox sessions: the limit is {max} (sandbox.max_sessions); end idle sessions or raise the limit"
    )]
    TooManySessions {
        /// The configured maximum.
        max: usize,
    },

    /// One user already has the most sessions one user may have
    /// (`sandbox.max_sessions_per_user`), so other users still get sessions.
    #[error(
        "too many sandbox sessions for user `{user}`: one user may have {max} at once (sandbox.max_sessions_per_user); end one of them or raise the limit"
    )]
    TooManyUserSessions {
        /// The user whose sessions are at the limit.
        user: String,
        /// The configured maximum.
        max: usize,
    },

    /// No session of this key is held here (never used, ended, or reaped): nothing to pause,
    /// resume or copy. The host answers 404.
    #[error("no sandbox session `{session}` here")]
    SessionNotFound {
        /// The session (user/session).
        session: String,
    },

    /// The session has a call running: it cannot be paused (that would kill the call).
    #[error("sandbox session `{session}` has a call running; pause it when its calls are done")]
    SessionBusy {
        /// The session (user/session).
        session: String,
    },

    /// Pausing one more session would pass `sandbox.max_paused_sessions` or
    /// `sandbox.paused_disk_budget`.
    #[error("cannot pause sandbox session `{session}`: {reason}; end or resume a paused session, or raise the limit")]
    TooManyPausedSessions {
        /// The session (user/session).
        session: String,
        /// Which limit, with its value.
        reason: String,
    },

    /// Pausing or forking is not available with these settings (`sandbox.replica_id`:
    /// another replica may be running a call in the container).
    #[error("{0}")]
    LifecycleUnavailable(String),

    /// A fork (or a session from a snapshot) was asked for under a session id that is
    /// taken already.
    #[error("sandbox session `{session}` exists already; name a new session id")]
    SessionExists {
        /// The session (user/session).
        session: String,
    },

    /// A snapshot name is not of the form snapshots take. The host answers 400 naming the
    /// field.
    #[error("invalid snapshot name `{name}`: expected {expected}")]
    InvalidSnapshotName {
        /// The name as given (shortened, control characters escaped).
        name: String,
        /// The form a name must have.
        expected: &'static str,
    },

    /// The user has no snapshot of that name (never taken, deleted, or another user's:
    /// the host answers 404 either way).
    #[error("no snapshot `{name}` for this user")]
    SnapshotNotFound {
        /// The name asked for.
        name: String,
    },

    /// The user has a snapshot of that name already.
    #[error("snapshot `{name}` exists already; delete it first or choose another name")]
    SnapshotExists {
        /// The name asked for.
        name: String,
    },

    /// One more snapshot would pass `sandbox.max_snapshots_per_user` or
    /// `sandbox.snapshot_disk_budget`.
    #[error("cannot take snapshot `{name}`: {reason}; delete a snapshot or raise the limit")]
    TooManySnapshots {
        /// The name asked for.
        name: String,
        /// Which limit, with its value.
        reason: String,
    },

    /// A path names something outside /workspace (lexically, or after resolving symlinks).
    #[error("path `{path}` resolves to `{resolved}`, which is outside the workspace /workspace; refused")]
    PathOutsideWorkspace {
        /// The path as the caller gave it.
        path: String,
        /// Where it points.
        resolved: String,
    },

    /// A file operation on a confined path failed (missing, not a file, too large, ...).
    #[error("{path}: {message}")]
    File {
        /// The path as the caller gave it.
        path: String,
        /// What is wrong.
        message: String,
    },

    /// The tool name is not one the sandbox provides.
    #[error("unknown sandbox tool `{0}`; available: Read, Write, Edit, Glob, Grep, Bash")]
    UnknownTool(String),

    /// The tool input does not match the tool's schema.
    #[error("invalid input for {tool}: {message}")]
    InvalidInput {
        /// The tool called.
        tool: String,
        /// What is wrong with the input.
        message: String,
    },

    /// A session key is unusable (empty or too long).
    #[error("invalid session key: {0}")]
    InvalidSessionKey(String),

    /// The `sandbox:` configuration is invalid.
    #[error("invalid sandbox configuration: {0}")]
    Config(String),

    /// The sandbox was shut down; no new calls are accepted.
    #[error("the sandbox is shut down")]
    ShutDown,

    /// An exec could not be completed (the host-side deadline passed even after the kill).
    #[error("exec in session {session} failed: {message}")]
    Exec {
        /// `user/session` of the call.
        session: String,
        /// What happened.
        message: String,
    },

    /// A container or volume holds a name warden derives (a session's, or a pool
    /// container's) but its labels do not prove it is that session's or pool's: made by
    /// another warden on the engine, by hand, or planted. It is never reused, attached to or
    /// removed.
    #[error(
        "Docker {object} `{name}` already exists but its labels do not make it this sandbox's (scope and session); refusing to reuse or remove it. Remove it yourself if it is stale (docker {object} rm {name})"
    )]
    NotOwned {
        /// Container or volume.
        object: DockerObject,
        /// Its name.
        name: String,
    },

    /// A call's egress narrowing could not be shared with the other replicas (the call is
    /// not run: another replica would serve its connections more widely).
    #[error("egress: {0}")]
    Egress(String),

    /// Any other Docker API error.
    #[error("Docker API error during {action}: {message}")]
    Docker {
        /// What warden was doing.
        action: String,
        /// The engine's message.
        message: String,
    },
}

/// The kinds of Docker object warden makes for a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DockerObject {
    /// A container.
    Container,
    /// A volume.
    Volume,
}

impl std::fmt::Display for DockerObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DockerObject::Container => "container",
            DockerObject::Volume => "volume",
        })
    }
}

impl SandboxError {
    /// Classifies a bollard error: transport failures become `DockerUnavailable`.
    pub(crate) fn from_docker(action: &str, e: bollard::errors::Error) -> Self {
        use bollard::errors::Error as E;
        match e {
            E::DockerResponseServerError { status_code, message } => {
                SandboxError::Docker { action: action.to_string(), message: format!("{status_code}: {message}") }
            }
            E::IOError { .. }
            | E::HyperResponseError { .. }
            | E::SocketNotFoundError(_)
            | E::RequestTimeoutError
            | E::HttpClientError { .. }
            // hyper's client: the connection could not be made (a `tcp://` host down)
            | E::HyperLegacyError { .. }
            | E::UnsupportedURISchemeError { .. } => SandboxError::DockerUnavailable(format!("{action}: {e}")),
            other => SandboxError::Docker { action: action.to_string(), message: other.to_string() },
        }
    }
}

/// The HTTP status of a Docker API error response, if it was one.
pub(crate) fn docker_status(e: &bollard::errors::Error) -> Option<u16> {
    match e {
        bollard::errors::Error::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}
