//! Chat messages, tool specs and calls, completion requests and results, tool results as
//! plain values — the Rust twins of the WIT `model` and `tools` records (the bindings use
//! them as they are). `ToolCall` and `Message` serialise as a stored transcript expects
//! (`tool_calls` and `tool_call_id` left out when empty). No host calls here:
//! [`crate::model`] adds them.

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
