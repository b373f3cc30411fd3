//! Nested subagents' tasks: the engine side of the `Agent` tool ([`crate::nesting`]).
//!
//! A child task is an ordinary task of the engine (its own record, stream, events,
//! approvals and cancel) with a few differences, all decided here:
//! - it belongs to its parent: same user, session (sandbox) and principal, the parent's
//!   `tool_context` secrets and asker, the parent's egress lists, and the root task's
//!   tool-call budget (a chain cannot exceed what its root was given);
//! - it runs at once, inside its root's slot ([`super::Slot::Parent`]), in this process
//!   (never the shared queue: its parent waits here);
//! - its record names its parent (`parent_task_id`), its approvals the whole chain;
//! - it ends when its parent is canceled or stops waiting for it;
//! - when its definition asks for isolation (a Claude agent file's `isolation: worktree`)
//!   it runs in a fork of its parent's session ([`crate::isolation`]) instead, and gets
//!   none of its parent's `tool_context` secrets (they stay with the source session).
//!
//! The depth cap is applied by giving a task a [`SubagentStarter`] only below
//! `subagents.max_depth`; this module never starts a child without one.

use std::sync::{Arc, Weak};

use serde_json::json;

use super::{Engine, Lineage, LiveTask, Slot, TaskStart};
use crate::event::{TaskEvent, ToolEvent};
use crate::plugin::TaskCall;
use crate::scope::{StartableSubagent, SubagentStarter, TaskScope};
use crate::store::{TaskRecord, now_ms};
use crate::task_state::TaskState;

/// The starter a task at `depth` gets: `None` at `subagents.max_depth` (no Agent tool).
pub(super) fn starter(engine: &Arc<Engine>, depth: usize) -> Option<Arc<dyn SubagentStarter>> {
    (depth < engine.options.max_subagent_depth)
        .then(|| Arc::new(ChildStarter { engine: Arc::downgrade(engine) }) as Arc<dyn SubagentStarter>)
}

struct ChildStarter {
    /// Weak: a running task's scope must not keep the engine alive.
    engine: Weak<Engine>,
}

impl SubagentStarter for ChildStarter {
    fn available(&self) -> Vec<StartableSubagent> {
        let Some(engine) = self.engine.upgrade() else { return Vec::new() };
        let snapshot = engine.registry.snapshot();
        snapshot
            .definitions
            .iter()
            .map(|(name, registered)| StartableSubagent {
                name: name.clone(),
                description: registered.definition.description.clone(),
                plugin: registered.plugin.clone(),
            })
            .collect()
    }

    fn run_child<'a>(
        &'a self,
        parent: &'a TaskScope,
        call: TaskCall,
    ) -> futures_util::future::BoxFuture<'a, Result<TaskRecord, String>> {
        Box::pin(async move {
            let engine = self.engine.upgrade().ok_or("the server is shutting down")?;
            engine.run_child(parent, call).await
        })
    }
}

/// Cancels a child task whose parent stopped waiting for it (the parent ended: deadline,
/// cancel, a fault), unless it finished.
struct CancelOnDrop(Arc<LiveTask>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.0.record().is_finished() {
            self.0.request_cancel();
        }
    }
}

impl Engine {
    async fn run_child(self: &Arc<Self>, parent: &TaskScope, call: TaskCall) -> Result<TaskRecord, String> {
        let parent_live = self.live_task(&parent.task_id).ok_or("its parent task is not running on this server")?;
        {
            let snapshot = self.registry.snapshot();
            crate::task::resolve(&snapshot, &call).map_err(|e| e.to_string())?;
        }
        for (field, value) in [("description", &call.description), ("prompt", &call.prompt)] {
            if value.trim().is_empty() {
                return Err(format!("`{field}` is empty"));
            }
        }
        let now = now_ms();
        let redactor = crate::redact::registry().session(&parent.user_id, &parent.session_id);
        let isolated =
            self.isolation_of(&call, None).map(|_| Engine::admit_isolated(&parent.user_id, parent.session_id.clone()));
        let mut record = TaskRecord {
            description: redactor.scrub(&call.description).into_owned(),
            parent_task_id: Some(parent.task_id.clone()),
            ..TaskRecord::submitted(
                crate::task::new_task_id(),
                &call,
                isolated.as_ref().map_or_else(|| parent.session_id.clone(), |i| i.session_id.clone()),
                parent.user_id.clone(),
                parent_live.record().principal,
                now,
            )
        };
        let secrets = match isolated {
            // A fork never carries a secret of its source session's tasks.
            Some(_) => crate::tool_context::TaskSecrets::default(),
            None => crate::tool_context::TaskSecrets {
                named: parent.tool_secrets.clone(),
                env: parent.tool_env.clone(),
                inject: parent.egress_credentials.clone(),
            },
        };
        record.isolation = isolated;
        let task_id = record.task_id.clone();
        self.hold_here(&mut record);
        let record_isolated = record.isolation.is_some();
        let live = self.new_live(record.clone(), parent.tool_budget.clone(), vec![]);
        self.live.lock().unwrap().insert(task_id.clone(), live.clone());
        live.save_record(record);
        live.push(json!({ "type": "status", "status": TaskState::Submitted, "task_id": task_id }));
        self.metrics.submitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(
            task_id = %task_id, parent_task_id = %parent.task_id, session = %parent.session_id, isolated = record_isolated,
            subagent = %call.subagent_type, depth = parent.depth() + 1, "subagent started by a subagent"
        );
        let mut lineage = Lineage {
            chain: parent.chain.clone(),
            inherited_tools: parent.inherited_tools.clone(),
            // What a parent's file forbids, its children may not do either.
            inherited_denied_tools: parent.denied_tools(),
        };
        lineage.chain.push(warden_approval::ChainLink {
            task_id: parent.task_id.clone(),
            subagent: parent.subagent.clone(),
            mode: parent.permission_mode,
        });
        // At most what the parent's definition allows and what its model was offered.
        lineage.inherited_tools.extend(parent.allowed_tools.clone());
        lineage.inherited_tools.push(parent.offered_tools());
        let event = json!({
            "task_id": task_id, "subagent_type": call.subagent_type, "depth": parent.depth() + 1,
            "subagent": parent.subagent,
        });
        let start = TaskStart {
            call,
            secrets,
            asker: parent.decider.clone(),
            egress: parent.egress.clone(),
            slot: Slot::Parent,
            lineage,
            // A nested subagent lives inside its parent's tool call: not durable on its own.
            journal: None,
        };
        // Launched and guarded before anything else is awaited: a parent that stops
        // waiting from here on cancels it.
        let guard = CancelOnDrop(live.clone());
        self.launch(live.clone(), start);
        if let Some(events) = &parent.events {
            let _ =
                events.send(TaskEvent::Tool { plugin: parent.plugin.clone(), event: ToolEvent::Subagent(event) }).await;
        }
        let parent_canceled = async {
            match &parent.cancel {
                Some(cancel) => cancel.canceled().await,
                None => std::future::pending().await,
            }
        };
        let record = tokio::select! {
            rec = live.finished() => rec,
            () = parent_canceled => {
                // The cascade: each level cancels its child the same way.
                live.request_cancel();
                live.finished().await
            }
        };
        drop(guard);
        Ok(record)
    }
}
