//! Host side of the WIT imports, one file per interface of the latest `warden:plugin`
//! (wasmtime `crates/wasi` style): [`log`], [`events`], [`state`], [`model`], [`tools`],
//! [`resources`], [`http`], [`clock`], [`cancel`]. Older WIT versions reach these through
//! the adapters in [`super::bindings`].
//!
//! Each function first asks the capability checker ([`crate::capability::Grants`]), then
//! does the work bounded by the call's deadline and the limits in [`crate::services`].
//! Expected failures are WIT `error` values; nothing here may trap on plugin input, and
//! nothing here may hand a secret to a plugin. A wait that is under way when the task is
//! canceled ends with `canceled` ([`interruptible`]).

mod cancel;
mod clock;
mod events;
mod http;
mod journal;
mod log;
mod model;
mod resources;
mod state;
mod tools;

use std::time::Duration;

use super::bindings::latest::types::{self, Error};
use super::host_state::HostState;
use crate::capability::{Capability, Denied};
use crate::plugin::CancelSignal;
use crate::services::{MAX_NAME_BYTES, MAX_TOOL_ARGUMENT_BYTES};

/// Refuses an input above a fixed bound: `what` names it, the text names the limit.
fn bounded(what: &str, got: usize, max: usize) -> Result<(), Error> {
    if got > max {
        return Err(Error::InvalidInput(format!("{what} is {got}; the limit is {max}")));
    }
    Ok(())
}

/// A per-call budget from `plugins.budgets` ran out: the text names it and its key.
fn over_budget(what: &str, limit: u64, key: &str) -> Error {
    Error::Denied(format!("{what}: this call's budget of {limit} is used up (plugins.budgets.{key})"))
}

impl From<Denied> for Error {
    fn from(d: Denied) -> Self {
        Error::Denied(d.to_string())
    }
}

impl HostState {
    fn check(&self, c: Capability) -> Result<(), Error> {
        self.scope.grants.check(c).map_err(|d| {
            tracing::warn!(plugin = %self.scope.plugin, capability = %c, "capability denied");
            Error::from(d)
        })
    }

    fn task_id(&self) -> &str {
        self.scope.task.as_ref().map(|t| t.task_id.as_str()).unwrap_or("")
    }

    fn session_id(&self) -> &str {
        self.scope.task.as_ref().map(|t| t.session_id.as_str()).unwrap_or("")
    }

    /// The deadline-bounded timeout for host I/O; errors once the deadline has passed.
    fn io_timeout(&self, requested_ms: Option<u32>) -> Result<Duration, Error> {
        let remaining = self.scope.remaining();
        if remaining.is_zero() {
            return Err(Error::Timeout("the call's deadline has passed".into()));
        }
        Ok(match requested_ms {
            Some(ms) => remaining.min(Duration::from_millis(ms as u64)),
            None => remaining,
        })
    }

    /// The task's cancellation signal for a wait starting now: `None` when there is none,
    /// or when the task is already canceled (a wait begun after the cancellation is the
    /// plugin's clean-up and runs normally within the grace period).
    fn cancel_watch(&self) -> Option<CancelSignal> {
        self.scope.cancel().cloned().filter(|c| !c.is_canceled())
    }
}

/// Runs a blocking import's wait; if the task is canceled meanwhile (`cancel`, from
/// [`HostState::cancel_watch`]), the wait is dropped and ends with `canceled`.
async fn interruptible<T>(
    cancel: Option<CancelSignal>,
    what: &str,
    work: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    let Some(cancel) = cancel else { return work.await };
    tokio::select! {
        r = work => r,
        () = cancel.canceled() => Err(Error::Canceled(format!("the task was canceled while {what}"))),
    }
}

/// A host import's failure on its way to the plugin. Every fallible import returns it
/// and bindgen turns it into the WIT `error` at one place ([`types::Host::convert_error`],
/// `trappable_error_type` in [`super::bindings`]), which scrubs every secret this process
/// holds from its text ([`to_plugin`]): an error that quotes a model provider's or a
/// server's answer (which may echo the key it rejected) never hands the plugin a credential.
///
/// A durable task's replay that meets a call its journal does not hold
/// ([`ImportError::Journal`]) ends the call instead: the plugin is not deterministic, and
/// going on would hand it answers meant for other calls.
#[derive(Debug)]
pub enum ImportError {
    /// The import failed: the plugin gets the error.
    Plugin(Error),
    /// The task's journal cannot serve this call: the call traps with this text.
    Journal(String),
}

impl From<Error> for ImportError {
    fn from(e: Error) -> Self {
        ImportError::Plugin(e)
    }
}

impl std::fmt::Display for ImportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImportError::Plugin(e) => write!(f, "{e:?}"),
            ImportError::Journal(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for ImportError {}

/// The WIT error an import's failure reaches the plugin as: its text scrubbed with the
/// call's redactor ([`super::host_state::CallScope::redactor`]: the host's credentials —
/// model API keys, egress and MCP credentials, API tokens — and the task's session's
/// secrets), never with other sessions' (where their secrets read [`REDACTED`] would
/// tell this task's tenant what they are).
///
/// [`REDACTED`]: crate::redact::REDACTED
pub(crate) fn to_plugin(e: Error, redactor: &crate::redact::Redactor) -> Error {
    let scrub = |m: String| redactor.scrub(&m).into_owned();
    match e {
        Error::NotFound(m) => Error::NotFound(scrub(m)),
        Error::InvalidInput(m) => Error::InvalidInput(scrub(m)),
        Error::Denied(m) => Error::Denied(scrub(m)),
        Error::Timeout(m) => Error::Timeout(scrub(m)),
        Error::Remote(m) => Error::Remote(scrub(m)),
        Error::Unavailable(m) => Error::Unavailable(scrub(m)),
        Error::InputRequired(m) => Error::InputRequired(scrub(m)),
        Error::Internal(m) => Error::Internal(scrub(m)),
        Error::Canceled(m) => Error::Canceled(scrub(m)),
    }
}

impl types::Host for HostState {
    fn convert_error(&mut self, e: ImportError) -> wasmtime::Result<Error> {
        match e {
            ImportError::Plugin(e) => Ok(to_plugin(e, &self.scope.redactor())),
            ImportError::Journal(m) => Err(wasmtime::format_err!("{m}")),
        }
    }
}

/// An infallible import's failure: only a durable task's journal can end one (it traps).
fn trap(e: ImportError) -> wasmtime::Error {
    wasmtime::format_err!("{e}")
}

/// The largest index `<= at` on a char boundary of `s`.
fn floor_char_boundary(s: &str, at: usize) -> usize {
    let mut cut = at.min(s.len());
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    cut
}

fn check_tool_call(id: &str, name: &str, arguments: &str) -> Result<(), Error> {
    bounded("a tool-call id (bytes)", id.len(), MAX_NAME_BYTES)?;
    bounded("a tool name (bytes)", name.len(), MAX_NAME_BYTES)?;
    bounded("a tool call's arguments (bytes)", arguments.len(), MAX_TOOL_ARGUMENT_BYTES)
}

fn parse_arguments(tool: &str, text: &str) -> Result<serde_json::Value, Error> {
    if text.trim().is_empty() {
        return Ok(serde_json::json!({}));
    }
    serde_json::from_str(text)
        .map_err(|e| Error::InvalidInput(format!("arguments of tool call {tool:?} are not JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant's text is scrubbed of a registered credential on its way out.
    #[test]
    fn regression_every_import_error_variant_is_scrubbed_for_the_plugin() {
        const KEY: &str = "sk-unit-import-error-fedcba9876543210";
        crate::redact::registry().remember_host(&[KEY]).unwrap();
        let text = || format!("HTTP 401: {{\"error\": \"invalid api key {KEY}\"}}");
        let all = [
            Error::NotFound(text()),
            Error::InvalidInput(text()),
            Error::Denied(text()),
            Error::Timeout(text()),
            Error::Remote(text()),
            Error::Unavailable(text()),
            Error::InputRequired(text()),
            Error::Internal(text()),
            Error::Canceled(text()),
        ];
        for e in all {
            let out = format!("{:?}", to_plugin(e, &crate::redact::registry().host()));
            assert!(!out.contains(KEY) && out.contains(crate::redact::REDACTED), "{out}");
        }
    }
}
