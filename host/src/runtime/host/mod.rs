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

impl types::Host for HostState {}

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
