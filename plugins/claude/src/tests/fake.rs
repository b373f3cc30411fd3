//! A scripted [`Host`] for the agent-loop tests.

use std::collections::{HashMap, VecDeque};

use warden_guest::log::Level;
use warden_guest::{Completion, CompletionRequest, Error, Message, ToolCall, ToolResult, ToolSpec};

use crate::runner::Host;

pub struct FakeHost {
    /// Model replies, in order; running out is a `remote` error.
    pub script: VecDeque<Result<Completion, Error>>,
    pub requests: Vec<CompletionRequest>,
    pub tools: Result<Vec<ToolSpec>, Error>,
    pub list_calls: usize,
    pub batches: Vec<Vec<ToolCall>>,
    /// Answers one tool call; the default echoes `<name> ok`.
    pub tool_fn: Box<dyn FnMut(&ToolCall) -> ToolResult>,
    /// When set, every tool batch fails with it (a task that dies during its calls).
    pub tools_fail: Option<Error>,
    pub state: HashMap<String, Vec<u8>>,
    pub state_fails: bool,
    pub events: Vec<(String, String)>,
    pub logs: Vec<(Level, String)>,
    pub resources: HashMap<String, Vec<u8>>,
    pub resource_reads: Vec<String>,
}

pub fn spec(name: &str) -> ToolSpec {
    ToolSpec { name: name.into(), description: format!("the {name} tool"), input_schema: r#"{"type":"object"}"#.into() }
}

pub fn session_tools() -> Vec<ToolSpec> {
    ["Read", "Write", "Edit", "Glob", "Grep", "Bash", "Task"].into_iter().map(spec).collect()
}

pub fn text(content: &str) -> Result<Completion, Error> {
    Ok(Completion { message: Message::new("assistant", content), finish_reason: "stop".into(), reasoning: None })
}

pub fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
    ToolCall { id: id.into(), name: name.into(), arguments: arguments.into() }
}

pub fn tool_calls(content: &str, calls: Vec<ToolCall>) -> Result<Completion, Error> {
    let mut message = Message::new("assistant", content);
    message.tool_calls = calls;
    Ok(Completion { message, finish_reason: "tool_calls".into(), reasoning: None })
}

/// The host's bound on one tool call's arguments (warden's `MAX_TOOL_ARGUMENT_BYTES`).
pub const HOST_MAX_TOOL_ARGUMENT_BYTES: usize = 1024 * 1024;

impl FakeHost {
    pub fn new(script: Vec<Result<Completion, Error>>) -> Self {
        Self {
            script: script.into(),
            requests: Vec::new(),
            tools: Ok(session_tools()),
            list_calls: 0,
            batches: Vec::new(),
            tool_fn: Box::new(|c| ToolResult { id: c.id.clone(), content: format!("{} ok", c.name), is_error: false }),
            tools_fail: None,
            state: HashMap::new(),
            state_fails: false,
            events: Vec::new(),
            logs: Vec::new(),
            resources: HashMap::new(),
            resource_reads: Vec::new(),
        }
    }

    pub fn warnings(&self) -> Vec<&str> {
        self.logs.iter().filter(|(l, _)| *l == Level::Warn).map(|(_, m)| m.as_str()).collect()
    }

    pub fn tool_names_offered(&self, request: usize) -> Vec<&str> {
        self.requests[request].tools.iter().map(|t| t.name.as_str()).collect()
    }
}

impl Host for FakeHost {
    fn complete(&mut self, request: &CompletionRequest) -> Result<Completion, Error> {
        self.requests.push(request.clone());
        self.script.pop_front().unwrap_or_else(|| Err(Error::Remote("script exhausted".into())))
    }

    fn list_tools(&mut self) -> Result<Vec<ToolSpec>, Error> {
        self.list_calls += 1;
        self.tools.clone()
    }

    fn call_tools(&mut self, calls: &[ToolCall]) -> Result<Vec<ToolResult>, Error> {
        self.batches.push(calls.to_vec());
        if let Some(e) = &self.tools_fail {
            return Err(e.clone());
        }
        // The host refuses the whole batch when one call's arguments are over its bound.
        if let Some(c) = calls.iter().find(|c| c.arguments.len() > HOST_MAX_TOOL_ARGUMENT_BYTES) {
            return Err(Error::InvalidInput(format!(
                "a tool call's arguments (bytes) is {}; the limit is {HOST_MAX_TOOL_ARGUMENT_BYTES}",
                c.arguments.len()
            )));
        }
        Ok(calls.iter().map(|c| (self.tool_fn)(c)).collect())
    }

    fn state_get(&mut self, key: &str) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.state.get(key).cloned())
    }

    fn state_set(&mut self, key: &str, value: &[u8]) -> Result<(), Error> {
        if self.state_fails {
            return Err(Error::Denied("state is not granted".into()));
        }
        self.state.insert(key.into(), value.to_vec());
        Ok(())
    }

    fn emit(&mut self, kind: &str, data: &str) {
        self.events.push((kind.into(), data.into()));
    }

    fn log(&mut self, level: Level, message: &str) {
        self.logs.push((level, message.into()));
    }

    fn read_resource(&mut self, uri: &str) -> Result<Vec<u8>, Error> {
        self.resource_reads.push(uri.into());
        self.resources.get(uri).cloned().ok_or_else(|| Error::NotFound(format!("{uri}: no such file")))
    }
}
