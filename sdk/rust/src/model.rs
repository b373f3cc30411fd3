//! The `model` and `tools` capabilities as plain values: chat messages, tool specs and
//! calls, completion requests and results, tool results. These are the one copy of these
//! shapes for every plugin (an agent loop written against them is testable natively), and
//! the bindings use them as the WIT types (see [`crate::bindings`]); with the `bindings`
//! feature, [`complete`], [`list_tools`] and [`call_tools`] call the host.
//!
//! `ToolCall` and `Message` serialise as a stored transcript expects (`tool_calls` and
//! `tool_call_id` left out when empty), so plugins can keep conversations in `state`.

use serde::{Deserialize, Serialize};

/// A tool the model may call (the WIT `model.tool-spec`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON schema of the arguments.
    pub input_schema: String,
}

/// A call the model asked for (the WIT `model.tool-call`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// JSON object.
    pub arguments: String,
}

/// One chat message (the WIT `model.message`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For role `tool`: the id of the call this answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into(), tool_calls: Vec::new(), tool_call_id: None }
    }

    /// A `tool` message answering the call `id`.
    pub fn tool_result(id: &str, content: impl Into<String>) -> Self {
        Self { tool_call_id: Some(id.to_string()), ..Self::new("tool", content) }
    }
}

/// A chat completion request (the WIT `model.completion-request`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompletionRequest {
    /// `provider/model`, an alias, or empty for the operator's default.
    pub model: String,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    pub max_tokens: Option<u32>,
}

/// The model's answer (the WIT `model.completion`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub message: Message,
    /// `stop`, `tool_calls`, `length`, ...
    pub finish_reason: String,
    pub reasoning: Option<String>,
}

/// The result of one tool call (the WIT `tools.tool-result`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolResult {
    pub id: String,
    pub content: String,
    pub is_error: bool,
}

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

#[cfg(test)]
mod tests {
    use super::{Message, ToolCall};

    #[test]
    fn messages_serialise_without_empty_tool_fields() {
        let m = Message::new("user", "hi");
        assert_eq!(serde_json::to_string(&m).unwrap(), r#"{"role":"user","content":"hi"}"#);
        let t = Message::tool_result("c1", "ok");
        assert_eq!(serde_json::to_string(&t).unwrap(), r#"{"role":"tool","content":"ok","tool_call_id":"c1"}"#);
        let a = Message {
            tool_calls: vec![ToolCall { id: "c1".into(), name: "Read".into(), arguments: "{}".into() }],
            ..Message::new("assistant", "")
        };
        let back: Message = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
        assert_eq!(back, a);
    }
}
