//! `log`: one line per write, tagged with plugin, task and session; budgeted per call;
//! scrubbed of every secret of the call's task (its session's `tool_context` values, whatever
//! their shape, and the host's) before it becomes a record.
//! Also the one way any other plugin text reaches the operator log: what a call wrote to
//! its WASI stdout and stderr goes through the same grant, budgets, cut and escaping
//! ([`HostState::log_captured_stdio`]), so it is no side door around `log`.

use super::super::bindings::latest::log;
use super::journal::{Durability, Interrupted};
use super::{Error, HostState, ImportError, floor_char_boundary, over_budget};
use crate::capability::Capability;
use crate::journal::Import;
use crate::services::MAX_LOG_LINE;

/// Most warnings one `resolve` call reports as problems of its reference (`warden agents`,
/// `GET /v1/subagents`): a file's typos fit; the rest of a flood stays in the log only.
pub const MAX_RESOLVE_WARNINGS: usize = 20;
/// Longest warning kept as a problem, in bytes (after escaping); longer ones are cut.
pub const MAX_RESOLVE_WARNING_CHARS: usize = 512;

/// Where a line of plugin text came from: its log record's `stream` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PluginText {
    /// `log.write`.
    Log,
    /// The call's WASI stdout (wasm32-wasip2 guests: Python's `print`).
    Stdout,
    /// The call's WASI stderr (a guest's panic message, Python's tracebacks).
    Stderr,
}

impl PluginText {
    fn name(self) -> &'static str {
        match self {
            PluginText::Log => "log",
            PluginText::Stdout => "stdout",
            PluginText::Stderr => "stderr",
        }
    }
}

impl HostState {
    /// `log.write` (the WIT error is made of its error by [`super::to_plugin`]).
    async fn log_write(&mut self, level: log::Level, message: String) -> Result<(), Error> {
        self.check(Capability::Log)?;
        self.plugin_log_line(level, PluginText::Log, message)
    }

    /// The one place plugin text becomes an operator log record (the `log` grant is the
    /// caller's check): counted against the call's budgets
    /// (`plugins.budgets.max_log_lines_per_call`, `max_log_bytes_per_call`), cut at
    /// [`MAX_LOG_LINE`], and made one line (newlines and terminal controls escaped), so a
    /// plugin can never forge a record of the host's. Scrubbed first with the call's
    /// redactor — every secret of its task's session, words and short values included —
    /// not only with the operator log's (which skips values unfit to rewrite operator text,
    /// `crate::redact::fit_for_operator_text`): a plugin's line is the task's text.
    fn plugin_log_line(&mut self, level: log::Level, source: PluginText, message: String) -> Result<(), Error> {
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
        // Before the cut (which could leave half a secret) and the escaping (which could
        // change a secret's form).
        let mut message = self.scope.redactor().scrub(&message).into_owned();
        if message.len() > MAX_LOG_LINE {
            message.truncate(floor_char_boundary(&message, MAX_LOG_LINE));
            message.push_str(" [truncated]");
        }
        // One write is one line: newlines and terminal controls are escaped.
        let message = crate::text::escape_control(&message);
        if source == PluginText::Log
            && matches!(level, log::Level::Warn | log::Level::Error)
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
        let (plugin, task, session, stream) = (&*self.scope.plugin, self.task_id(), self.session_id(), source.name());
        match level {
            log::Level::Trace => tracing::trace!(plugin, task_id = task, session, stream, "{message}"),
            log::Level::Debug => tracing::debug!(plugin, task_id = task, session, stream, "{message}"),
            log::Level::Info => tracing::info!(plugin, task_id = task, session, stream, "{message}"),
            log::Level::Warn => tracing::warn!(plugin, task_id = task, session, stream, "{message}"),
            log::Level::Error => tracing::error!(plugin, task_id = task, session, stream, "{message}"),
        }
        Ok(())
    }

    /// At the end of a call: what the plugin wrote to its WASI stdout (at info) and stderr
    /// (at warn), each line one record through [`Self::plugin_log_line`], as `log.write`
    /// calls of this call would be. Without the `log` grant it is dropped (only its size is
    /// noted, at debug); past the call's log budget the rest is dropped with one note.
    pub(crate) fn log_captured_stdio(&mut self) {
        let granted = self.scope.grants.check(Capability::Log).is_ok();
        for (source, level) in [(PluginText::Stdout, log::Level::Info), (PluginText::Stderr, log::Level::Warn)] {
            let captured = match source {
                PluginText::Stderr => self.stderr.contents(),
                _ => self.stdout.contents(),
            };
            if captured.is_empty() {
                continue;
            }
            let (plugin, stream) = (self.scope.plugin.clone(), source.name());
            if !granted {
                tracing::debug!(%plugin, stream, bytes = captured.len(), "plugin output dropped: `log` is not granted");
                continue;
            }
            let text = String::from_utf8_lossy(&captured);
            for line in text.lines().filter(|l| !l.is_empty()) {
                if let Err(e) = self.plugin_log_line(level, source, line.to_owned()) {
                    tracing::warn!(%plugin, stream, error = ?e, "the rest of the plugin's output dropped");
                    return;
                }
            }
        }
    }
}

impl log::Host for HostState {
    async fn write(&mut self, level: log::Level, message: String) -> Result<(), ImportError> {
        let args = serde_json::json!({ "level": level, "message": &message });
        self.journaled(Import::LogWrite, args, Durability::Queued, Interrupted::Rerun, move |s| {
            Box::pin(s.log_write(level, message))
        })
        .await
    }
}
