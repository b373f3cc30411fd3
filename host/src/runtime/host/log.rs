//! `log`: one line per write, tagged with plugin, task and session; budgeted per call.

use super::super::bindings::latest::log;
use super::{Error, HostState, ImportError, floor_char_boundary, over_budget};
use crate::capability::Capability;
use crate::services::MAX_LOG_LINE;

/// Most warnings one `resolve` call reports as problems of its reference (`warden agents`,
/// `GET /v1/subagents`): a file's typos fit; the rest of a flood stays in the log only.
pub const MAX_RESOLVE_WARNINGS: usize = 20;
/// Longest warning kept as a problem, in bytes (after escaping); longer ones are cut.
pub const MAX_RESOLVE_WARNING_CHARS: usize = 512;

impl HostState {
    /// `log.write` (the WIT error is made of its error by [`super::to_plugin`]).
    async fn log_write(&mut self, level: log::Level, message: String) -> Result<(), Error> {
        self.check(Capability::Log)?;
        let budgets = self.scope.services.budgets;
        let usage = &mut self.usage;
        if usage.log_lines >= budgets.max_log_lines_per_call {
            return Err(over_budget("log lines", budgets.max_log_lines_per_call.into(), "max_log_lines_per_call"));
        }
        if usage.log_bytes + message.len() as u64 > budgets.max_log_bytes_per_call {
            return Err(over_budget("log bytes", budgets.max_log_bytes_per_call, "max_log_bytes_per_call"));
        }
        usage.log_lines += 1;
        usage.log_bytes += message.len() as u64;
        let mut message = message;
        if message.len() > MAX_LOG_LINE {
            message.truncate(floor_char_boundary(&message, MAX_LOG_LINE));
            message.push_str(" [truncated]");
        }
        // One write is one line: newlines and terminal controls are escaped.
        let message = crate::text::escape_control(&message);
        if matches!(level, log::Level::Warn | log::Level::Error)
            && let Some(sink) = &self.scope.warnings
        {
            let mut warnings = sink.lock().unwrap();
            if warnings.len() < MAX_RESOLVE_WARNINGS {
                let mut w = message.to_string();
                if w.len() > MAX_RESOLVE_WARNING_CHARS {
                    w.truncate(floor_char_boundary(&w, MAX_RESOLVE_WARNING_CHARS));
                    w.push_str(" [truncated]");
                }
                warnings.push(w);
            }
        }
        let (plugin, task, session) = (&*self.scope.plugin, self.task_id(), self.session_id());
        match level {
            log::Level::Trace => tracing::trace!(plugin, task_id = task, session, "{message}"),
            log::Level::Debug => tracing::debug!(plugin, task_id = task, session, "{message}"),
            log::Level::Info => tracing::info!(plugin, task_id = task, session, "{message}"),
            log::Level::Warn => tracing::warn!(plugin, task_id = task, session, "{message}"),
            log::Level::Error => tracing::error!(plugin, task_id = task, session, "{message}"),
        }
        Ok(())
    }
}

impl log::Host for HostState {
    async fn write(&mut self, level: log::Level, message: String) -> Result<(), ImportError> {
        Ok(self.log_write(level, message).await?)
    }
}
