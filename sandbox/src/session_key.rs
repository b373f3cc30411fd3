//! Which session a call belongs to: the (user id, session id, runtime) key that every session
//! container, volume, binding, egress proxy and hold is filed under.
//!
//! Plain data at the bottom of the crate (the containers, the egress proxy, the warm pool
//! and the sessions all name it). This module only holds, checks and prints a key; it must
//! never accept a part that could not be a Docker label value (empty, too long, control
//! characters).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::SandboxError;

/// Longest accepted user or session id, in bytes (they become Docker labels).
pub const MAX_KEY_PART_LEN: usize = 128;

/// Identifies a session: every subagent of one (user, session) that runs under the same
/// container runtime shares one sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SessionKey {
    /// The end user (or tenant) the session belongs to.
    pub user_id: String,
    /// The conversation / task session id.
    pub session_id: String,
    /// The OCI runtime the session's container must run under when it is not the sandbox's
    /// default (`sandbox.runtime`): a subagent the operator puts under another runtime
    /// (`sandbox.runtime_overrides`) gets a session of its own under that runtime, so no
    /// container ever runs code of two runtimes' subagents. `None`: the default runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
}

impl SessionKey {
    /// A key of the default runtime from its parts.
    pub fn new(user_id: impl Into<String>, session_id: impl Into<String>) -> Self {
        Self { user_id: user_id.into(), session_id: session_id.into(), runtime: None }
    }

    /// The same session id under `runtime` (`None`: the default runtime).
    pub fn with_runtime(mut self, runtime: Option<String>) -> Self {
        self.runtime = runtime;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), SandboxError> {
        for (what, v) in [("user_id", &self.user_id), ("session_id", &self.session_id)] {
            if v.is_empty() || v.len() > MAX_KEY_PART_LEN || v.chars().any(char::is_control) {
                return Err(SandboxError::InvalidSessionKey(format!(
                    "{what} must be 1-{MAX_KEY_PART_LEN} bytes without control characters"
                )));
            }
        }
        if let Some(runtime) = &self.runtime
            && !crate::config::is_runtime_name(runtime)
        {
            return Err(SandboxError::InvalidSessionKey(format!(
                "runtime {runtime:?} is not a runtime name ({})",
                crate::config::RUNTIME_NAME_RULE
            )));
        }
        Ok(())
    }
}

impl fmt::Display for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.user_id, self.session_id)?;
        match &self.runtime {
            Some(runtime) => write!(f, " ({runtime})"),
            None => Ok(()),
        }
    }
}
