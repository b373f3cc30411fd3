//! Which session a call belongs to: the (user id, session id) key that every session
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

/// Identifies a session: every subagent of one (user, session) shares one sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SessionKey {
    /// The end user (or tenant) the session belongs to.
    pub user_id: String,
    /// The conversation / task session id.
    pub session_id: String,
}

impl SessionKey {
    /// A key from its parts.
    pub fn new(user_id: impl Into<String>, session_id: impl Into<String>) -> Self {
        Self { user_id: user_id.into(), session_id: session_id.into() }
    }

    pub(crate) fn validate(&self) -> Result<(), SandboxError> {
        for (what, v) in [("user_id", &self.user_id), ("session_id", &self.session_id)] {
            if v.is_empty() || v.len() > MAX_KEY_PART_LEN || v.chars().any(char::is_control) {
                return Err(SandboxError::InvalidSessionKey(format!(
                    "{what} must be 1-{MAX_KEY_PART_LEN} bytes without control characters"
                )));
            }
        }
        Ok(())
    }
}

impl fmt::Display for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.user_id, self.session_id)
    }
}
