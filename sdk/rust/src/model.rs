//! The `model` and `tools` capabilities as plain values: chat messages, tool specs and
//! calls, completion requests and results, tool results. These are the one copy of these
//! shapes for every plugin (an agent loop written against them is testable natively), and
//! the bindings use them as the WIT types (see [`crate::bindings`]); with the `bindings`
//! feature, [`complete`], [`list_tools`] and [`call_tools`] call the host.
//!
//! `ToolCall` and `Message` serialise as a stored transcript expects (`tool_calls` and
//! `tool_call_id` left out when empty), so plugins can keep conversations in `state`.

pub use crate::wire::model::*;

#[cfg(feature = "bindings")]
pub use imports::{call_tools, complete, list_tools};

#[cfg(feature = "bindings")]
mod imports {
    use super::{Completion, CompletionRequest, ToolCall, ToolResult, ToolSpec};
    use crate::bindings::warden::plugin::{model, tools};
    use crate::error::Result;

    /// One chat completion through the host's model providers.
    pub fn complete(request: &CompletionRequest) -> Result<Completion> {
        model::complete(request)
    }

    /// The session tools this task may use (policy-denied tools already removed).
    pub fn list_tools() -> Result<Vec<ToolSpec>> {
        tools::list()
    }

    /// Runs a batch of calls through the approval gate; results in call order, declined
    /// calls as error results.
    pub fn call_tools(calls: &[ToolCall]) -> Result<Vec<ToolResult>> {
        tools::call(calls)
    }
}
