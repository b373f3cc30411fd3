//! The WIT exports over the real host imports (wasm32 only). No logic lives here: it
//! converts between the generated bindings and the crate's own types.

wit_bindgen::generate!({
    path: "../../wit",
    world: "plugin",
});

use exports::warden::plugin::{executor, meta, resolver};
use warden::plugin::types::{
    Capability, Error, PluginInfo, SubagentDefinition, SubagentReference, TaskCall, TaskContext,
};
use warden::plugin::{events, log, model, resources, state, tools};

use crate::error::PluginError;
use crate::runner::{self, LogLevel};
use crate::{KIND, agent};

struct Claude;

impl meta::Guest for Claude {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "claude".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            kinds: vec![KIND.into()],
            capabilities: vec![
                Capability::Log,
                Capability::Model,
                Capability::Tools,
                Capability::Events,
                Capability::State,
                Capability::Resources,
            ],
        }
    }
}

impl resolver::Guest for Claude {
    fn can_resolve(reference: SubagentReference) -> bool {
        reference.kind.eq_ignore_ascii_case(KIND) && !reference.uri.trim().is_empty()
    }

    fn resolve(reference: SubagentReference) -> Result<SubagentDefinition, Error> {
        let bytes = resources::read(&reference.uri)
            .map_err(|e| to_wit(from_wit(e).context(&reference.uri)))?;
        let parsed = agent::parse_agent(&reference.uri, &bytes, &reference.metadata).map_err(to_wit)?;
        for warning in &parsed.warnings {
            write_log(LogLevel::Warn, &format!("{}: {warning}", reference.uri));
        }
        Ok(SubagentDefinition {
            name: parsed.name,
            description: parsed.description,
            kind: KIND.into(),
            protocol_data: parsed.protocol.to_json(),
            reference,
        })
    }
}

impl executor::Guest for Claude {
    fn execute(ctx: TaskContext, call: TaskCall, definition: SubagentDefinition) -> Result<String, Error> {
        let task = runner::TaskInput {
            task_id: ctx.task_id,
            prompt: call.prompt,
            model: call.model,
            resume: call.resume,
        };
        let agent = runner::AgentInput {
            name: definition.name,
            uri: definition.reference.uri,
            protocol_data: definition.protocol_data,
        };
        runner::run(&mut WitHost, &task, &agent).map_err(to_wit)
    }
}

/// [`runner::Host`] over the imports.
struct WitHost;

impl runner::Host for WitHost {
    fn complete(&mut self, request: &runner::CompletionRequest) -> Result<runner::Completion, PluginError> {
        let request = model::CompletionRequest {
            model: request.model.clone(),
            messages: request.messages.iter().map(message_to_wit).collect(),
            tools: request.tools.iter().map(spec_to_wit).collect(),
            max_tokens: request.max_tokens,
        };
        let completion = model::complete(&request).map_err(from_wit)?;
        Ok(runner::Completion {
            message: message_from_wit(completion.message),
            finish_reason: completion.finish_reason,
            reasoning: completion.reasoning,
        })
    }

    fn list_tools(&mut self) -> Result<Vec<runner::ToolSpec>, PluginError> {
        Ok(tools::list()
            .map_err(from_wit)?
            .into_iter()
            .map(|t| runner::ToolSpec { name: t.name, description: t.description, input_schema: t.input_schema })
            .collect())
    }

    fn call_tools(&mut self, calls: &[runner::ToolCall]) -> Result<Vec<runner::ToolResult>, PluginError> {
        let calls: Vec<model::ToolCall> = calls.iter().map(call_to_wit).collect();
        Ok(tools::call(&calls)
            .map_err(from_wit)?
            .into_iter()
            .map(|r| runner::ToolResult { id: r.id, content: r.content, is_error: r.is_error })
            .collect())
    }

    fn state_get(&mut self, key: &str) -> Result<Option<Vec<u8>>, PluginError> {
        state::get(key).map_err(from_wit)
    }

    fn state_set(&mut self, key: &str, value: &[u8]) -> Result<(), PluginError> {
        state::set(key, value).map_err(from_wit)
    }

    fn emit(&mut self, kind: &str, data: &str) {
        let _ = events::emit(kind, data);
    }

    fn log(&mut self, level: LogLevel, message: &str) {
        write_log(level, message);
    }

    fn read_resource(&mut self, uri: &str) -> Result<Vec<u8>, PluginError> {
        resources::read(uri).map_err(from_wit)
    }
}

fn write_log(level: LogLevel, message: &str) {
    let level = match level {
        LogLevel::Debug => log::Level::Debug,
        LogLevel::Info => log::Level::Info,
        LogLevel::Warn => log::Level::Warn,
        LogLevel::Error => log::Level::Error,
    };
    let _ = log::write(level, message);
}

fn call_to_wit(call: &runner::ToolCall) -> model::ToolCall {
    model::ToolCall { id: call.id.clone(), name: call.name.clone(), arguments: call.arguments.clone() }
}

fn spec_to_wit(spec: &runner::ToolSpec) -> model::ToolSpec {
    model::ToolSpec {
        name: spec.name.clone(),
        description: spec.description.clone(),
        input_schema: spec.input_schema.clone(),
    }
}

fn message_to_wit(message: &runner::Message) -> model::Message {
    model::Message {
        role: message.role.clone(),
        content: message.content.clone(),
        tool_calls: message.tool_calls.iter().map(call_to_wit).collect(),
        tool_call_id: message.tool_call_id.clone(),
    }
}

fn message_from_wit(message: model::Message) -> runner::Message {
    runner::Message {
        role: message.role,
        content: message.content,
        tool_calls: message
            .tool_calls
            .into_iter()
            .map(|c| runner::ToolCall { id: c.id, name: c.name, arguments: c.arguments })
            .collect(),
        tool_call_id: message.tool_call_id,
    }
}

fn from_wit(error: Error) -> PluginError {
    match error {
        Error::NotFound(m) => PluginError::NotFound(m),
        Error::InvalidInput(m) => PluginError::InvalidInput(m),
        Error::Denied(m) => PluginError::Denied(m),
        Error::Timeout(m) => PluginError::Timeout(m),
        Error::Remote(m) => PluginError::Remote(m),
        Error::Unavailable(m) => PluginError::Unavailable(m),
        Error::InputRequired(m) => PluginError::InputRequired(m),
        Error::Internal(m) => PluginError::Internal(m),
    }
}

fn to_wit(error: PluginError) -> Error {
    match error {
        PluginError::NotFound(m) => Error::NotFound(m),
        PluginError::InvalidInput(m) => Error::InvalidInput(m),
        PluginError::Denied(m) => Error::Denied(m),
        PluginError::Timeout(m) => Error::Timeout(m),
        PluginError::Remote(m) => Error::Remote(m),
        PluginError::Unavailable(m) => Error::Unavailable(m),
        PluginError::InputRequired(m) => Error::InputRequired(m),
        PluginError::Internal(m) => Error::Internal(m),
    }
}

export!(Claude);
