//! Structured log lines (the `log` import), tagged by the host with plugin, task and
//! session. The level helpers are best effort: a plugin without the `log` grant keeps
//! working, its lines are dropped.

/// A log level (the WIT `log.level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

#[cfg(feature = "bindings")]
pub use imports::{debug, error, info, trace, warn, write};

#[cfg(feature = "bindings")]
mod imports {
    use super::Level;
    use crate::bindings::warden::plugin::log as wit;
    use crate::error::Result;

    /// Writes one line; `Err` when the host refused it (e.g. `log` not granted).
    pub fn write(level: Level, message: &str) -> Result<()> {
        let level = match level {
            Level::Trace => wit::Level::Trace,
            Level::Debug => wit::Level::Debug,
            Level::Info => wit::Level::Info,
            Level::Warn => wit::Level::Warn,
            Level::Error => wit::Level::Error,
        };
        wit::write(level, message)
    }

    pub fn trace(message: &str) {
        let _ = write(Level::Trace, message);
    }

    pub fn debug(message: &str) {
        let _ = write(Level::Debug, message);
    }

    pub fn info(message: &str) {
        let _ = write(Level::Info, message);
    }

    pub fn warn(message: &str) {
        let _ = write(Level::Warn, message);
    }

    pub fn error(message: &str) {
        let _ = write(Level::Error, message);
    }
}
