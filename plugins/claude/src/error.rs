//! The plugin's error type: mirrors the WIT `error` variant so the pure code does not
//! depend on the generated bindings.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginError {
    NotFound(String),
    InvalidInput(String),
    Denied(String),
    Timeout(String),
    Remote(String),
    Unavailable(String),
    InputRequired(String),
    Internal(String),
}

impl PluginError {
    /// The message, whatever the variant.
    pub fn message(&self) -> &str {
        match self {
            Self::NotFound(m)
            | Self::InvalidInput(m)
            | Self::Denied(m)
            | Self::Timeout(m)
            | Self::Remote(m)
            | Self::Unavailable(m)
            | Self::InputRequired(m)
            | Self::Internal(m) => m,
        }
    }

    /// The variant's name, as in WIT.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "not-found",
            Self::InvalidInput(_) => "invalid-input",
            Self::Denied(_) => "denied",
            Self::Timeout(_) => "timeout",
            Self::Remote(_) => "remote",
            Self::Unavailable(_) => "unavailable",
            Self::InputRequired(_) => "input-required",
            Self::Internal(_) => "internal",
        }
    }

    /// The same variant with `context: ` put before the message (unless it is already there).
    pub fn context(self, context: &str) -> Self {
        let wrap = |m: String| {
            if m.contains(context) { m } else { format!("{context}: {m}") }
        };
        match self {
            Self::NotFound(m) => Self::NotFound(wrap(m)),
            Self::InvalidInput(m) => Self::InvalidInput(wrap(m)),
            Self::Denied(m) => Self::Denied(wrap(m)),
            Self::Timeout(m) => Self::Timeout(wrap(m)),
            Self::Remote(m) => Self::Remote(wrap(m)),
            Self::Unavailable(m) => Self::Unavailable(wrap(m)),
            Self::InputRequired(m) => Self::InputRequired(wrap(m)),
            Self::Internal(m) => Self::Internal(wrap(m)),
        }
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind(), self.message())
    }
}

impl std::error::Error for PluginError {}
