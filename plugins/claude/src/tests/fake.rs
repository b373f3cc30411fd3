//! A scripted [`Host`] for the agent-loop tests.

use std::collections::{HashMap, VecDeque};

use crate::error::PluginError;
use crate::runner::{
    Completion, CompletionRequest, Host, LogLevel, Message, ToolCall, ToolResult, ToolSpec,
};

pub struct FakeHost {
    /// Model replies, in order; running out is a `remote` error.
    pub script: VecDeque<Result<Completion, PluginError>>,
    pub requests: Vec<CompletionRequest>,
    pub tools: Result<Vec<ToolSpec>, PluginError>,
    pub list_calls: usize,
    pub batches: Vec<Vec<ToolCall>>,
    /// Answers one tool call; the default echoes `<name> ok`.
    pub tool_fn: Box<dyn FnMut(&ToolCall) -> ToolResult>,
    pub state: HashMap<String, Vec<u8>>,
    pub state_fails: bool,
    pub events: Vec<(String, String)>,
    pub logs: Vec<(LogLevel, String)>,
    pub resources: HashMap<String, Vec<u8>>,
    pub resource_reads: Vec<String>,
}

pub fn spec(name: &str) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: format!("the {name} tool"),
        input_schema: r#"{"type":"object"}"#.into(),
    }
}

pub fn session_tools() -> Vec<ToolSpec> {
    ["Read", "Write", "Edit", "Glob", "Grep", "Bash", "Task"].into_iter().map(spec).collect()
}

pub fn text(content: &str) -> Result<Completion, PluginError> {
    Ok(Completion { message: Message::new("assistant", content), finish_reason: "stop".into(), reasoning: None })
}

pub fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
    ToolCall { id: id.into(), name: name.into(), arguments: arguments.into() }
}

pub fn tool_calls(content: &str, calls: Vec<ToolCall>) -> Result<Completion, PluginError> {
    let mut message = Message::new("assistant", content);
    message.tool_calls = calls;
    Ok(Completion { message, finish_reason: "tool_calls".into(), reasoning: None })
}

impl FakeHost {
    pub fn new(script: Vec<Result<Completion, PluginError>>) -> Self {
        Self {
            script: script.into(),
            requests: Vec::new(),
            tools: Ok(session_tools()),
            list_calls: 0,
            batches: Vec::new(),
            tool_fn: Box::new(|c| ToolResult { id: c.id.clone(), content: format!("{} ok", c.name), is_error: false }),
            state: HashMap::new(),
            state_fails: false,
            events: Vec::new(),
            logs: Vec::new(),
            resources: HashMap::new(),
            resource_reads: Vec::new(),
        }
    }

    pub fn warnings(&self) -> Vec<&str> {
        self.logs.iter().filter(|(l, _)| *l == LogLevel::Warn).map(|(_, m)| m.as_str()).collect()
    }

    pub fn tool_names_offered(&self, request: usize) -> Vec<&str> {
        self.requests[request].tools.iter().map(|t| t.name.as_str()).collect()
    }
}

impl Host for FakeHost {
    fn complete(&mut self, request: &CompletionRequest) -> Result<Completion, PluginError> {
        self.requests.push(request.clone());
        self.script.pop_front().unwrap_or_else(|| Err(PluginError::Remote("script exhausted".into())))
    }

    fn list_tools(&mut self) -> Result<Vec<ToolSpec>, PluginError> {
        self.list_calls += 1;
        self.tools.clone()
    }

    fn call_tools(&mut self, calls: &[ToolCall]) -> Result<Vec<ToolResult>, PluginError> {
        self.batches.push(calls.to_vec());
        Ok(calls.iter().map(|c| (self.tool_fn)(c)).collect())
    }

    fn state_get(&mut self, key: &str) -> Result<Option<Vec<u8>>, PluginError> {
        Ok(self.state.get(key).cloned())
    }

    fn state_set(&mut self, key: &str, value: &[u8]) -> Result<(), PluginError> {
        if self.state_fails {
            return Err(PluginError::Denied("state is not granted".into()));
        }
        self.state.insert(key.into(), value.to_vec());
        Ok(())
    }

    fn emit(&mut self, kind: &str, data: &str) {
        self.events.push((kind.into(), data.into()));
    }

    fn log(&mut self, level: LogLevel, message: &str) {
        self.logs.push((level, message.into()));
    }

    fn read_resource(&mut self, uri: &str) -> Result<Vec<u8>, PluginError> {
        self.resource_reads.push(uri.into());
        self.resources.get(uri).cloned().ok_or_else(|| PluginError::NotFound(format!("{uri}: no such file")))
    }
}
