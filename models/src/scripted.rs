//! `scripted` — an offline stand-in for an LLM, for demos and tests.
//!
//! It is **not a model**: it replays turns from a YAML file, in order, whatever the
//! conversation says (optionally checking it with `expect:`). It never touches the network.
//!
//! ## Script format
//!
//! The file is a YAML list; item *n* is the answer to the completion whose request already
//! holds *n* assistant messages. Counting assistant messages (instead of keeping a cursor)
//! makes the provider stateless: concurrent tasks and resumed transcripts each get the
//! right turn.
//!
//! ```yaml
//! # every field is optional; unknown fields are errors
//! - reasoning: "The user wants the files listed."     # → ModelEvent::Reasoning + ChatResponse.reasoning
//!   text: "Let me look."                              # → content (streamed word by word as Token events)
//!   tool_calls:                                       # → finish_reason tool_calls
//!     - name: Bash
//!       arguments: { command: "ls /workspace" }       # any YAML mapping; default {}
//!       id: call_ls                                   # optional; default `call_<turn>_<i>`
//! - expect:                                           # checked against the request, else ScriptMismatch
//!     last_tool_result_contains: "README"             # content of the last `tool` message
//!     last_user_contains: "list"                      # content of the last `user` message
//!     system_contains: "You list files"               # content of the (last) `system` message
//!     tools_offered: [Read, mcp__git__git_log]        # tool names the request must offer
//!     tools_not_offered: [Bash]                       # tool names it must not offer
//!   text: "There is a README."                        # no tool calls → finish_reason stop
//! - error: "simulated 503 from the provider"          # this turn fails with ScriptedFailure
//! ```
//!
//! A turn with `error:` may carry nothing else but `expect:`. A request beyond the last
//! turn fails with [`ModelError::ScriptExhausted`]. The model part of `provider/model` is
//! ignored. Relative `script:` paths resolve against the configuration file's directory.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::{
    BoxFuture, ChatRequest, ChatResponse, FinishReason, Message, ModelError, Provider, Role, StreamSink, ToolCall,
};

/// One scripted tool call.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedToolCall {
    pub name: String,
    #[serde(default = "empty_object")]
    pub arguments: serde_json::Value,
    #[serde(default)]
    pub id: Option<String>,
}

fn empty_object() -> serde_json::Value {
    serde_json::json!({})
}

/// Checks a turn makes on the request before answering.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    #[serde(default)]
    pub last_user_contains: Option<String>,
    #[serde(default)]
    pub last_tool_result_contains: Option<String>,
    /// Text the system prompt (the last `system` message) must contain.
    #[serde(default)]
    pub system_contains: Option<String>,
    /// Tool names the request must offer (its `tools`), each exactly.
    #[serde(default)]
    pub tools_offered: Vec<String>,
    /// Tool names the request must not offer.
    #[serde(default)]
    pub tools_not_offered: Vec<String>,
}

/// One turn of a script.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub reasoning: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ScriptedToolCall>,
    #[serde(default)]
    pub expect: Option<Expect>,
    /// Simulate a provider failure with this message.
    #[serde(default)]
    pub error: Option<String>,
}

/// The scripted provider.
#[derive(Debug)]
pub struct ScriptedProvider {
    name: String,
    script: PathBuf,
    turns: Vec<Turn>,
}

impl ScriptedProvider {
    /// Load the script at `path` (errors name the provider and the file).
    pub fn load(name: impl Into<String>, path: &Path) -> Result<Self, ModelError> {
        let name = name.into();
        let text = std::fs::read_to_string(path).map_err(|e| {
            ModelError::Config(format!("models.providers.{name}: cannot read script {}: {e}", path.display()))
        })?;
        Self::from_yaml_str(name, path, &text)
    }

    /// Parse a script from text; `path` is only used in messages.
    pub fn from_yaml_str(name: impl Into<String>, path: &Path, text: &str) -> Result<Self, ModelError> {
        let name = name.into();
        let bad =
            |what: String| ModelError::Config(format!("models.providers.{name}: script {}: {what}", path.display()));
        let turns: Vec<Turn> = if text.trim().is_empty() {
            Vec::new()
        } else {
            serde_yaml::from_str(text).map_err(|e| bad(format!("{e} (expected a list of turns)")))?
        };
        for (i, t) in turns.iter().enumerate() {
            if t.error.is_some() && (t.text.is_some() || t.reasoning.is_some() || !t.tool_calls.is_empty()) {
                return Err(bad(format!("turn {i}: `error` cannot be combined with text, reasoning or tool_calls")));
            }
            if let Some(c) = t.tool_calls.iter().find(|c| c.name.trim().is_empty()) {
                return Err(bad(format!("turn {i}: a tool call has an empty name ({c:?})")));
            }
        }
        Ok(Self { name, script: path.to_owned(), turns })
    }

    /// The turns, in order.
    pub fn turns(&self) -> &[Turn] {
        &self.turns
    }

    fn answer(&self, req: &ChatRequest, sink: Option<&StreamSink>) -> Result<ChatResponse, ModelError> {
        let index = req.messages.iter().filter(|m| m.role == Role::Assistant).count();
        let turn = self.turns.get(index).ok_or_else(|| ModelError::ScriptExhausted {
            provider: self.name.clone(),
            script: self.script.display().to_string(),
            turns: self.turns.len(),
        })?;
        tracing::debug!(provider = %self.name, turn = index, "scripted model turn");
        if let Some(expect) = &turn.expect {
            self.check(index, expect, req)?;
        }
        if let Some(message) = &turn.error {
            return Err(ModelError::ScriptedFailure {
                provider: self.name.clone(),
                turn: index,
                message: message.clone(),
            });
        }
        let text = turn.text.clone().unwrap_or_default();
        let reasoning = turn.reasoning.clone().filter(|r| !r.is_empty());
        if let Some(sink) = sink {
            if let Some(r) = &reasoning {
                r.split_inclusive(char::is_whitespace).for_each(|w| sink.reasoning(w));
            }
            text.split_inclusive(char::is_whitespace).for_each(|w| sink.token(w));
        }
        let calls: Vec<ToolCall> = turn
            .tool_calls
            .iter()
            .enumerate()
            .map(|(i, c)| ToolCall {
                id: c.id.clone().unwrap_or_else(|| format!("call_{index}_{i}")),
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            })
            .collect();
        let finish_reason = if calls.is_empty() { FinishReason::Stop } else { FinishReason::ToolCalls };
        Ok(ChatResponse { message: Message::assistant_tool_calls(text, calls), finish_reason, reasoning, usage: None })
    }

    fn check(&self, turn: usize, expect: &Expect, req: &ChatRequest) -> Result<(), ModelError> {
        let last = |role: Role| req.messages.iter().rev().find(|m| m.role == role).map(|m| m.content.as_str());
        let checks = [
            ("last user message", Role::User, &expect.last_user_contains),
            ("last tool result", Role::Tool, &expect.last_tool_result_contains),
            ("system prompt", Role::System, &expect.system_contains),
        ];
        for (what, role, needle) in checks {
            let Some(needle) = needle else { continue };
            match last(role) {
                Some(text) if text.contains(needle.as_str()) => {}
                found => {
                    let found = match found {
                        Some(t) => format!("it is {:?}", crate::http::excerpt(t.as_bytes())),
                        None => "there is none".to_owned(),
                    };
                    return Err(self.mismatch(turn, format!("expected the {what} to contain {needle:?}, but {found}")));
                }
            }
        }
        let offered = |name: &String| req.tools.iter().any(|t| t.name == *name);
        let listed = || req.tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ");
        if let Some(name) = expect.tools_offered.iter().find(|n| !offered(n)) {
            return Err(
                self.mismatch(turn, format!("expected the tool {name:?} to be offered; offered: [{}]", listed()))
            );
        }
        if let Some(name) = expect.tools_not_offered.iter().find(|n| offered(n)) {
            return Err(
                self.mismatch(turn, format!("expected the tool {name:?} not to be offered; offered: [{}]", listed()))
            );
        }
        Ok(())
    }

    fn mismatch(&self, turn: usize, detail: String) -> ModelError {
        ModelError::ScriptMismatch { provider: self.name.clone(), turn, detail }
    }
}

impl Provider for ScriptedProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn complete<'a>(
        &'a self,
        req: ChatRequest,
        sink: Option<StreamSink>,
    ) -> BoxFuture<'a, Result<ChatResponse, ModelError>> {
        Box::pin(async move { self.answer(&req, sink.as_ref()) })
    }
}
