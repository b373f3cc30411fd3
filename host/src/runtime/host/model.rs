//! `model`: chat completion through the host's model router; keys never reach the plugin.

use std::time::Duration;

use super::super::bindings::latest::model;
use super::{Error, HostState, ImportError, bounded, check_tool_call, interruptible, parse_arguments};
use crate::capability::Capability;
use crate::event::{ModelStream, TaskEvent};
use crate::services::{
    MAX_MODEL_MESSAGES, MAX_MODEL_REQUEST_BYTES, MAX_MODEL_TOOLS, MAX_NAME_BYTES, MAX_TOOL_CALLS_PER_BATCH,
};

/// Checks the sizes of a `model.complete` request before anything is converted.
fn check_model_request(req: &model::CompletionRequest) -> Result<(), Error> {
    bounded("the number of messages", req.messages.len(), MAX_MODEL_MESSAGES)?;
    bounded("the number of tools", req.tools.len(), MAX_MODEL_TOOLS)?;
    bounded("the model name (bytes)", req.model.len(), MAX_NAME_BYTES)?;
    let mut total = 0usize;
    for m in &req.messages {
        bounded("a message role (bytes)", m.role.len(), MAX_NAME_BYTES)?;
        bounded("a tool-call id (bytes)", m.tool_call_id.as_ref().map_or(0, String::len), MAX_NAME_BYTES)?;
        bounded("the tool calls of one message", m.tool_calls.len(), MAX_TOOL_CALLS_PER_BATCH)?;
        total = total.saturating_add(m.content.len());
        for c in &m.tool_calls {
            check_tool_call(&c.id, &c.name, &c.arguments)?;
            total = total.saturating_add(c.arguments.len());
        }
    }
    for t in &req.tools {
        bounded("a tool name (bytes)", t.name.len(), MAX_NAME_BYTES)?;
        total = total.saturating_add(t.description.len()).saturating_add(t.input_schema.len());
    }
    bounded("the request's text (bytes)", total, MAX_MODEL_REQUEST_BYTES)
}

/// Smallest timeout handed to a model request: below this the call is already lost.
const MIN_MODEL_TIMEOUT: Duration = Duration::from_millis(1);

fn to_model_message(m: model::Message) -> Result<warden_models::Message, Error> {
    use warden_models::Role;
    let role = match m.role.as_str() {
        "system" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        other => {
            return Err(Error::InvalidInput(format!(
                "message role {other:?}; expected system, user, assistant or tool"
            )));
        }
    };
    let tool_calls = m
        .tool_calls
        .into_iter()
        .map(|c| {
            let arguments = parse_arguments(&c.name, &c.arguments)?;
            Ok(warden_models::ToolCall { id: c.id, name: c.name, arguments })
        })
        .collect::<Result<_, Error>>()?;
    Ok(warden_models::Message { role, content: m.content, tool_calls, tool_call_id: m.tool_call_id })
}

fn from_model_message(m: warden_models::Message) -> model::Message {
    use warden_models::Role;
    model::Message {
        role: match m.role {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
        .into(),
        content: m.content,
        tool_calls: m
            .tool_calls
            .into_iter()
            .map(|c| model::ToolCall { id: c.id, name: c.name, arguments: c.arguments.to_string() })
            .collect(),
        tool_call_id: m.tool_call_id,
    }
}

impl HostState {
    /// `model.complete` (the WIT error is made of its error by [`super::to_plugin`]).
    async fn model_complete(&mut self, req: model::CompletionRequest) -> Result<model::Completion, Error> {
        self.check(Capability::Model)?;
        check_model_request(&req)?;
        let router = self.scope.services.models.clone().map_err(Error::Unavailable)?;
        let name = if req.model.trim().is_empty() { None } else { Some(req.model.as_str()) };
        let (provider, model_name) = router.resolve(name).map_err(|e| Error::InvalidInput(e.to_string()))?;
        let timeout = self.io_timeout(None)?.max(MIN_MODEL_TIMEOUT);
        let messages = req.messages.into_iter().map(to_model_message).collect::<Result<Vec<_>, _>>()?;
        let tools = req
            .tools
            .into_iter()
            .map(|t| {
                let input_schema = serde_json::from_str(&t.input_schema)
                    .map_err(|e| Error::InvalidInput(format!("input schema of tool {:?} is not JSON: {e}", t.name)))?;
                Ok(warden_models::ToolSpec { name: t.name, description: t.description, input_schema })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        if let Some(scope) = &self.scope.task_scope {
            // What the model was offered bounds the subagents this task starts.
            scope.note_offered_tools(tools.iter().map(|t| t.name.as_str()));
        }
        let mut request = warden_models::ChatRequest::new(model_name, messages);
        request.tools = tools;
        request.max_tokens = req.max_tokens;
        request.reasoning_effort = self.scope.task_scope.as_ref().and_then(|s| s.reasoning_effort);
        request.timeout = Some(timeout);
        // Streamed tokens and reasoning become task events; a full sink drops them
        // rather than stalling the provider.
        let sink = self.scope.events().cloned().filter(|_| self.scope.grants.check(Capability::Events).is_ok()).map(
            |events| {
                let plugin = self.scope.plugin.to_string();
                warden_models::StreamSink::new(move |ev| {
                    let (stream, text) = match ev {
                        warden_models::ModelEvent::Token(t) => (ModelStream::Token, t),
                        warden_models::ModelEvent::Reasoning(t) => (ModelStream::Reasoning, t),
                        _ => return,
                    };
                    let _ = events.try_send(TaskEvent::Model { plugin: plugin.clone(), stream, text });
                })
            },
        );
        let cancel = self.cancel_watch();
        let response = provider.complete(request, sink);
        let response = interruptible(cancel, "a model call was under way", async { Ok(response.await) }).await?;
        let response = response.map_err(|e| match e {
            warden_models::ModelError::Timeout { .. } => Error::Timeout(e.to_string()),
            warden_models::ModelError::Config(_) | warden_models::ModelError::UnknownModel { .. } => {
                Error::Unavailable(e.to_string())
            }
            _ => Error::Remote(e.to_string()),
        })?;
        tracing::debug!(plugin = %self.scope.plugin, task_id = self.task_id(), provider = provider.name(), "model call done");
        Ok(model::Completion {
            message: from_model_message(response.message),
            finish_reason: match response.finish_reason {
                warden_models::FinishReason::Stop => "stop".into(),
                warden_models::FinishReason::ToolCalls => "tool_calls".into(),
                warden_models::FinishReason::Length => "length".into(),
                warden_models::FinishReason::Other(o) => o,
            },
            reasoning: response.reasoning,
        })
    }
}

impl model::Host for HostState {
    async fn complete(&mut self, req: model::CompletionRequest) -> Result<model::Completion, ImportError> {
        Ok(self.model_complete(req).await?)
    }
}
