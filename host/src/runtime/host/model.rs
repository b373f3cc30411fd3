//! `model`: chat completion through the host's model router; keys never reach the plugin.

use std::time::Duration;

use super::super::bindings::latest::model;
use super::journal::{Durability, Interrupted};
use super::{Error, HostState, ImportError, bounded, check_tool_call, interruptible, parse_arguments};
use crate::capability::Capability;
use crate::event::{ModelStream, TaskEvent};
use crate::journal::Import;
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
        if let Some(broken) = message_call_problems(&m.tool_calls).into_iter().flatten().next() {
            return Err(broken);
        }
        total = total.saturating_add(m.content.len());
        for c in &m.tool_calls {
            total = total.saturating_add(c.arguments.len());
        }
    }
    for t in &req.tools {
        bounded("a tool name (bytes)", t.name.len(), MAX_NAME_BYTES)?;
        total = total.saturating_add(t.description.len()).saturating_add(t.input_schema.len());
    }
    bounded("the request's text (bytes)", total, MAX_MODEL_REQUEST_BYTES)
}

/// The bounds every message's tool calls are held to, in both directions of
/// `model.complete` (a request's messages, [`check_model_request`]; a provider's reply,
/// [`bound_reply`]) and by `tools.call`: at most [`MAX_TOOL_CALLS_PER_BATCH`] calls, each
/// within [`check_tool_call`]'s bounds, and no id twice (a conversation answering one id
/// twice is refused by the providers). One entry per call, in order: the bound it breaks,
/// if any. A call is counted against the number of calls only if it meets the other
/// bounds; an empty id is no id (the plugin names such a call) and never a duplicate.
fn message_call_problems(calls: &[model::ToolCall]) -> Vec<Option<Error>> {
    let mut seen = std::collections::HashSet::new();
    let mut kept = 0usize;
    calls
        .iter()
        .map(|c| {
            check_tool_call(&c.id, &c.name, &c.arguments).err().or_else(|| {
                if !c.id.is_empty() && !seen.insert(c.id.as_str()) {
                    let id = crate::text::escape_control(&c.id);
                    return Some(Error::InvalidInput(format!(
                        "the tool-call id {id:?} is given to two calls of one message"
                    )));
                }
                kept += 1;
                bounded("the tool calls of one message", kept, MAX_TOOL_CALLS_PER_BATCH).err()
            })
        })
        .collect()
}

/// Most reasons quoted in the note [`bound_reply`] adds to a reply whose calls it dropped:
/// the note stays short however many calls broke a bound.
const MAX_DROP_REASONS_QUOTED: usize = 3;

/// A provider's reply held to the bounds of [`message_call_problems`] before the plugin
/// sees it, so that the plugin is never handed a call that `tools.call` (or the echo of
/// this message in the next `model.complete`) refuses, failing the task and every resume
/// of it: a second call with an id already used gets the id `<id>_<n>` (unique in the
/// message), and a call that still breaks a bound (an id, name or arguments too long,
/// one call too many) is dropped, said in a note appended to the reply's text so that the
/// model, reading its own message back, knows those calls were not run.
fn bound_reply(mut m: model::Message) -> model::Message {
    let mut ids: std::collections::HashSet<String> = m.tool_calls.iter().map(|c| c.id.clone()).collect();
    let mut seen = std::collections::HashSet::new();
    let mut renamed = 0usize;
    for c in &mut m.tool_calls {
        if c.id.is_empty() || c.id.len() > MAX_NAME_BYTES || seen.insert(c.id.clone()) {
            continue;
        }
        let fresh = (1usize..)
            .map(|n| {
                let suffix = format!("_{n}");
                let mut base = MAX_NAME_BYTES.saturating_sub(suffix.len()).min(c.id.len());
                while !c.id.is_char_boundary(base) {
                    base -= 1;
                }
                format!("{}{suffix}", &c.id[..base])
            })
            .find(|candidate| !ids.contains(candidate))
            .expect("an unused suffix exists");
        ids.insert(fresh.clone());
        seen.insert(fresh.clone());
        c.id = fresh;
        renamed += 1;
    }
    let problems = message_call_problems(&m.tool_calls);
    let total = m.tool_calls.len();
    let mut reasons = Vec::new();
    let mut calls = Vec::with_capacity(total);
    for (c, problem) in m.tool_calls.into_iter().zip(problems) {
        match problem {
            None => calls.push(c),
            Some(e) => reasons.push(error_text(e)),
        }
    }
    m.tool_calls = calls;
    if renamed > 0 {
        tracing::warn!(renamed, "a model reply gave one tool-call id to several calls; the later ones were renamed");
    }
    if !reasons.is_empty() {
        tracing::warn!(dropped = reasons.len(), total, "a model reply's tool calls broke the host's bounds; dropped");
        let mut quoted: Vec<&str> = Vec::new();
        for r in &reasons {
            if quoted.len() < MAX_DROP_REASONS_QUOTED && !quoted.contains(&r.as_str()) {
                quoted.push(r);
            }
        }
        if !m.content.is_empty() {
            m.content.push_str("\n\n");
        }
        m.content.push_str(&format!(
            "[warden: {} of the {total} tool calls of this message were not run and are not shown: {}]",
            reasons.len(),
            quoted.join("; ")
        ));
    }
    m
}

/// The text of a bound's error, without its variant.
fn error_text(e: Error) -> String {
    match e {
        Error::InvalidInput(t) => t,
        other => format!("{other:?}"),
    }
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
            // Held to the bounds the plugin's next request and `tools.call` hold it to.
            message: bound_reply(from_model_message(response.message)),
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
        // Noted before the journal answers: a replayed task's subagents get the same tools.
        if let Some(scope) = &self.scope.task_scope {
            scope.note_offered_tools(req.tools.iter().map(|t| t.name.as_str()));
        }
        let args = serde_json::to_value(&req).expect("a request serialises");
        // No effect outside warden: a call under way when the host died is asked again.
        self.journaled(Import::ModelComplete, args, Durability::Committed, Interrupted::Rerun, move |s| {
            Box::pin(s.model_complete(req))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::MAX_TOOL_ARGUMENT_BYTES;
    use proptest::prelude::*;

    fn call(id: &str, name: &str, arguments: &str) -> model::ToolCall {
        model::ToolCall { id: id.into(), name: name.into(), arguments: arguments.into() }
    }

    fn reply(calls: Vec<model::ToolCall>) -> model::Message {
        model::Message { role: "assistant".into(), content: "Working.".into(), tool_calls: calls, tool_call_id: None }
    }

    fn request(m: model::Message) -> model::CompletionRequest {
        model::CompletionRequest { model: String::new(), messages: vec![m], tools: vec![], max_tokens: None }
    }

    /// A provider's reply with 65 calls, a 2 KiB id, 1.5 MiB of arguments or one id given
    /// twice reached the plugin as it was: `tools.call` then refused the whole batch and
    /// the echo of the reply made every later `model.complete` of the task (and of its
    /// resume) fail. Held to the request's bounds, the reply passes them.
    #[test]
    fn regression_a_model_reply_the_host_then_refused_reached_the_plugin() {
        let mut calls: Vec<_> = (0..70).map(|i| call(&format!("c{i}"), "Bash", "{}")).collect();
        calls[0].id = "x".repeat(2048);
        calls[1].arguments = format!("\"{}\"", "a".repeat(MAX_TOOL_ARGUMENT_BYTES + 512 * 1024));
        calls[2].name = "N".repeat(MAX_NAME_BYTES + 1);
        calls[3].id = "c4".into();
        let raw = reply(calls);
        assert!(check_model_request(&request(raw.clone())).is_err(), "the reply as the provider sent it");
        let bounded = bound_reply(raw);
        check_model_request(&request(bounded.clone())).expect("the reply as the plugin gets it");
        assert_eq!(bounded.tool_calls.len(), MAX_TOOL_CALLS_PER_BATCH);
        // The duplicate got a fresh id, the over-long ones and the calls past 64 are gone.
        let ids: Vec<&str> = bounded.tool_calls.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(&ids[..3], ["c4", "c4_1", "c5"], "{ids:?}");
        assert_eq!(ids.last(), Some(&"c66"));
        assert!(bounded.content.starts_with("Working.\n\n[warden: 6 of the 70 tool calls"), "{}", bounded.content);
        for bound in ["a tool-call id (bytes) is 2048", "a tool call's arguments (bytes)", "a tool name (bytes)"] {
            assert!(bounded.content.contains(bound), "{bound}: {}", bounded.content);
        }
    }

    /// The content and the calls of a message, comparable.
    fn shown(m: &model::Message) -> (String, Vec<(String, String, String)>) {
        let calls = m.tool_calls.iter().map(|c| (c.id.clone(), c.name.clone(), c.arguments.clone())).collect();
        (m.content.clone(), calls)
    }

    #[test]
    fn a_reply_within_the_bounds_is_unchanged() {
        let m = reply((0..MAX_TOOL_CALLS_PER_BATCH).map(|i| call(&format!("c{i}"), "Read", "{}")).collect());
        assert_eq!(shown(&bound_reply(m.clone())), shown(&m));
        // Empty ids are the plugin's to fill in and never duplicates.
        let m = reply(vec![call("", "Read", "{}"), call("", "Read", "{}")]);
        assert_eq!(shown(&bound_reply(m.clone())), shown(&m));
    }

    #[test]
    fn a_request_echoing_one_id_twice_is_refused() {
        let m = reply(vec![call("a", "Read", "{}"), call("a", "Read", "{}")]);
        let e = check_model_request(&request(m)).unwrap_err();
        assert!(error_text(e).contains("given to two calls"));
    }

    fn id() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(String::new()),
            "[a-c]{1,2}(_[1-3])?",
            (0usize..3).prop_map(|extra| "é".repeat((MAX_NAME_BYTES + extra) / 2)),
            (0usize..3).prop_map(|extra| "i".repeat(MAX_NAME_BYTES + extra - 1)),
        ]
    }

    proptest! {
        /// Whatever tool calls a provider returns, the plugin gets a message whose echo the
        /// next request accepts, holding the first calls that meet the bounds in order.
        #[test]
        fn every_bounded_reply_passes_the_request_check(
            calls in prop::collection::vec(
                (id(), prop::sample::select(vec![1usize, MAX_NAME_BYTES + 1]), prop::bool::weighted(0.05)),
                0..80,
            ),
        ) {
            let calls: Vec<_> = calls
                .into_iter()
                .map(|(id, name_len, big)| {
                    let arguments = if big { "x".repeat(MAX_TOOL_ARGUMENT_BYTES + 1) } else { "{}".into() };
                    call(&id, &"n".repeat(name_len), &arguments)
                })
                .collect();
            let n = calls.len();
            let bounded = bound_reply(reply(calls));
            prop_assert!(check_model_request(&request(bounded.clone())).is_ok());
            prop_assert!(bounded.tool_calls.len() <= n.min(MAX_TOOL_CALLS_PER_BATCH));
            prop_assert_eq!(bounded.content.contains("[warden:"), bounded.tool_calls.len() < n);
        }
    }
}
