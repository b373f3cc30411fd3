//! Running one TaskCall: validate it, find the definition and the plugin serving its
//! kind, execute under the plugin's limits, and report an outcome. This module never
//! talks to a terminal or a socket; the CLI and the HTTP API present its results.

use std::sync::Arc;

use serde::Serialize;

use crate::event::{HostEvent, TaskEvent};
use crate::plugin::{GuestError, TaskCall, TaskContext};
use crate::registry::{Registered, Registry, Snapshot};
use crate::runtime::CallError;
use crate::runtime::LoadedPlugin;
use crate::store::TaskRecord;
use crate::task_state::TaskState;

#[derive(Debug, Clone, Serialize)]
pub struct TaskOutcome {
    pub task_id: String,
    pub status: TaskState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The plugin that ran the task.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugin: Option<crate::plugin::PluginRef>,
}

impl From<TaskRecord> for TaskOutcome {
    /// The outcome of a finished task as its record holds it.
    fn from(rec: TaskRecord) -> Self {
        TaskOutcome {
            task_id: rec.task_id,
            status: rec.status,
            output: rec.output,
            error: rec.error,
            plugin: rec.plugin,
        }
    }
}

/// A TaskCall that cannot start.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum TaskError {
    #[error("missing required field `{0}`")]
    MissingField(&'static str),
    #[error("unknown subagent_type {name:?}; available: {}", if available.is_empty() { "(none)".to_string() } else { available.join(", ") })]
    UnknownSubagent { name: String, available: Vec<String> },
    #[error("subagent {name:?} is of kind {kind}, which no loaded plugin serves")]
    NoPlugin { name: String, kind: String },
    #[error(
        "`description` is {len} bytes; at most {MAX_DESCRIPTION_BYTES} (a short summary shown in task lists; \
         the task itself goes in `prompt`)"
    )]
    DescriptionTooLong { len: usize },
}

/// Longest `description` of a task, in bytes. It is a 3-5 word summary (the Task tool's
/// schema says so) that every task list, the console, the store and each follower of the
/// task feed repeat: 4 KiB holds any summary, and keeps a caller — or a prompt-injected
/// parent agent — from making a task list megabytes long. Nested subagents' descriptions
/// are bounded tighter still ([`crate::nesting::MAX_CHILD_DESCRIPTION_BYTES`]).
pub const MAX_DESCRIPTION_BYTES: usize = 4 * 1024;

/// Longest error text a task keeps (its record's `error`, its `error` and `finish` events),
/// in bytes. A failed task's error quotes what its plugin returned (an error value's
/// message, a trap's backtrace with the module's own function names): a message of
/// sentences fits many times over, while a plugin cannot make the record, the stream and
/// every follower carry megabytes. Its output (and the question of a task that needs
/// input) is bounded by the plugin's `plugins.limits.max_output` instead.
pub const MAX_ERROR_BYTES: usize = 16 * 1024;

/// `error` cut to [`MAX_ERROR_BYTES`] (on a character boundary), saying how much was cut.
pub fn bounded_error(mut error: String) -> String {
    if error.len() > MAX_ERROR_BYTES {
        let cut = error.len();
        error.truncate(error.floor_char_boundary(MAX_ERROR_BYTES));
        let dropped = cut - error.len();
        error.push_str(&format!(" … ({dropped} more bytes not kept: errors are kept to {MAX_ERROR_BYTES} bytes)"));
    }
    error
}

pub use crate::scope::TaskScope;

/// A fresh task id, `task_<uuid>`.
pub fn new_task_id() -> String {
    format!("task_{}", uuid::Uuid::new_v4())
}

/// The one check of a call against the registry, used when the engine accepts a task (from
/// the HTTP API, MCP, A2A or the CLI), when a subagent starts a child, and again when a
/// task starts (plugins may have changed in between): its subagent and prompt are given,
/// its description is at most [`MAX_DESCRIPTION_BYTES`], the subagent is registered, and
/// a loaded plugin serves its kind.
pub fn resolve<'s>(snapshot: &'s Snapshot, call: &TaskCall) -> Result<(&'s Registered, Arc<LoadedPlugin>), TaskError> {
    for (field, value) in [("subagent_type", &call.subagent_type), ("prompt", &call.prompt)] {
        if value.trim().is_empty() {
            return Err(TaskError::MissingField(field));
        }
    }
    if call.description.len() > MAX_DESCRIPTION_BYTES {
        return Err(TaskError::DescriptionTooLong { len: call.description.len() });
    }
    let Some(registered) = snapshot.definitions.get(&call.subagent_type) else {
        return Err(TaskError::UnknownSubagent {
            name: call.subagent_type.clone(),
            available: snapshot.definitions.keys().cloned().collect(),
        });
    };
    let Some(plugin) = snapshot.plugin_for_kind(&registered.definition.kind) else {
        return Err(TaskError::NoPlugin { name: call.subagent_type.clone(), kind: registered.definition.kind.clone() });
    };
    Ok((registered, plugin))
}

/// Runs `call` to completion. The engine is its one caller in warden (the API, MCP, A2A
/// and `warden run` all submit tasks to it); tests drive it directly. What the plugin
/// returns is bounded before anyone stores or streams it: its output and question by
/// `max_output` (the runtime refuses more), its error by [`MAX_ERROR_BYTES`].
pub async fn run(
    registry: &Registry,
    task_id: String,
    call: &TaskCall,
    scope: TaskScope,
) -> Result<TaskOutcome, TaskError> {
    run_durable(registry, task_id, call, scope, None).await
}

/// [`run`], durable with `journal` ([`crate::journal`]): the plugin's imports are
/// journaled, or — a task taken over — answered from its journal first.
pub async fn run_durable(
    registry: &Registry,
    task_id: String,
    call: &TaskCall,
    mut scope: TaskScope,
    journal: Option<crate::journal::JournalPlan>,
) -> Result<TaskOutcome, TaskError> {
    let snapshot = registry.snapshot();
    let (registered, plugin) = resolve(&snapshot, call)?;
    let definition = registered.definition.clone();
    // The definition's own egress list narrows the task's tool calls too.
    scope.egress.splice(0..0, registered.egress.iter().cloned());
    scope.reasoning_effort = registered.effort;
    scope.sandbox_runtime.clone_from(&registered.runtime);
    drop(snapshot);
    let ctx =
        TaskContext { task_id: task_id.clone(), session_id: scope.session_id.clone(), user_id: scope.user_id.clone() };
    let plugin_ref = crate::plugin::PluginRef {
        id: plugin.id.clone(),
        version: plugin.info.version.clone(),
        sha256: plugin.content_hash.clone(),
    };
    tracing::info!(
        task_id = %task_id, plugin = %plugin.id, version = %plugin_ref.version, sha256 = %plugin_ref.sha256,
        subagent = %definition.name, "task started"
    );
    let replaying = journal.as_ref().is_some_and(|j| matches!(j.start, crate::journal::JournalStart::Replay(_)));
    if let Some(plan) = journal {
        match plan.open(&ctx, call, &plugin_ref).await {
            Ok(journal) => scope.journal = journal,
            Err(why) => {
                let error = Some(format!("the task could not be resumed: {why}"));
                return Ok(TaskOutcome {
                    task_id,
                    status: TaskState::Failed,
                    output: None,
                    error,
                    plugin: Some(plugin_ref),
                });
            }
        }
    }
    if let Some(events) = &scope.events
        && !replaying
    {
        // Which build runs this task (a task taken over has said so already).
        let _ = events.send(TaskEvent::Host(HostEvent::PluginBuild(plugin_ref.clone()))).await;
    }
    let result = registry.runtime().execute(&plugin, ctx, call, &definition, scope).await;
    let plugin = Some(plugin_ref);
    let outcome = match result {
        Ok(output) => TaskOutcome { task_id, status: TaskState::Completed, output: Some(output), error: None, plugin },
        Err(CallError::Guest(GuestError::InputRequired(q))) => {
            TaskOutcome { task_id, status: TaskState::InputRequired, output: Some(q), error: None, plugin }
        }
        Err(e) => {
            let error = Some(bounded_error(e.to_string()));
            TaskOutcome { task_id, status: TaskState::Failed, output: None, error, plugin }
        }
    };
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_is_cut_on_a_character_boundary_saying_so() {
        assert_eq!(bounded_error("short".into()), "short");
        let long = "é".repeat(MAX_ERROR_BYTES);
        let cut = bounded_error(long.clone());
        assert!(cut.len() < MAX_ERROR_BYTES + 100, "{}", cut.len());
        assert!(cut.ends_with(&format!("errors are kept to {MAX_ERROR_BYTES} bytes)")), "{}", cut.len());
        assert!(long.starts_with(cut.split(" … (").next().unwrap()));
    }
}
