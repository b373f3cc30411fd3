//! `tools`: the session's sandbox (and MCP) tools through the approval gate, narrowed to
//! the definition's `tools` list and, for a nested subagent, its ancestors' lists.

use std::sync::Arc;

use super::super::bindings::latest::{model, tools};
use super::journal::Durability;
use super::{Error, HostState, ImportError, bounded, check_tool_call, interruptible, parse_arguments};
use crate::capability::Capability;
use crate::journal::{Import, Next};
use crate::services::MAX_TOOL_CALLS_PER_BATCH;

impl HostState {
    fn tool_host(&self) -> Result<(Arc<crate::tools::ToolHost>, Arc<crate::scope::TaskScope>), Error> {
        self.check(Capability::Tools)?;
        let host = self
            .scope
            .services
            .tools
            .clone()
            .ok_or_else(|| Error::Unavailable("sandbox tools are not configured in this host".into()))?;
        let scope = self
            .scope
            .task_scope
            .clone()
            .ok_or_else(|| Error::Unavailable("tools can only be used while executing a task".into()))?;
        Ok((host, scope))
    }
}

/// Whether the task may use `name`: its definition's `tools` list and those of the
/// subagents above it allow it ([`crate::nesting::tools_allow`]).
fn may_use(scope: &crate::scope::TaskScope, name: &str) -> bool {
    crate::nesting::tools_allow(scope.allowed_tools.as_deref(), &scope.inherited_tools, name)
}

impl HostState {
    /// `tools.list` (the WIT error is made of its error by [`super::to_plugin`]).
    async fn tools_list(&mut self) -> Result<Vec<model::ToolSpec>, Error> {
        let (host, scope) = self.tool_host()?;
        Ok(host
            .list(&scope)
            .await
            .into_iter()
            .filter(|t| may_use(&scope, &t.name))
            .map(|t| model::ToolSpec {
                name: t.name,
                description: t.description,
                input_schema: t.input_schema.to_string(),
            })
            .collect())
    }

    /// `tools.call` (the WIT error is made of its error by [`super::to_plugin`]).
    async fn tools_call(&mut self, calls: Vec<model::ToolCall>) -> Result<Vec<tools::ToolResult>, Error> {
        let (host, scope) = self.tool_host()?;
        bounded("the number of tool calls in one batch", calls.len(), MAX_TOOL_CALLS_PER_BATCH)?;
        for c in &calls {
            check_tool_call(&c.id, &c.name, &c.arguments)?;
        }
        let calls = calls
            .into_iter()
            .map(|c| {
                let input = parse_arguments(&c.name, &c.arguments)?;
                Ok(crate::tools::ToolCall { id: c.id, name: c.name, input })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        // Calls outside the definition's `tools` never reach the gate: they come back as
        // error results in their place, the others run as one batch.
        let (run, refused): (Vec<_>, Vec<_>) =
            calls.into_iter().enumerate().partition(|(_, c)| may_use(&scope, &c.name));
        let (order, run): (Vec<usize>, Vec<_>) = run.into_iter().unzip();
        let cancel = self.cancel_watch();
        let ran = interruptible(cancel, "its tool calls ran", async { Ok(host.call_batch(&scope, run).await) }).await?;
        if scope.tool_budget.as_ref().is_some_and(|b| b.exceeded()) {
            // The task is over: stop the plugin's loop here rather than let it carry on.
            return Err(Error::Denied("the task reached its tool-call limit (max_tool_iterations)".into()));
        }
        let mut results: Vec<Option<tools::ToolResult>> = (0..order.len() + refused.len()).map(|_| None).collect();
        for (i, r) in order.into_iter().zip(ran) {
            results[i] = Some(tools::ToolResult { id: r.id, content: r.content, is_error: r.is_error });
        }
        for (i, c) in refused {
            let content = format!("The {} call was refused: {} is not among this subagent's tools", c.name, c.name);
            results[i] = Some(tools::ToolResult { id: c.id, content, is_error: true });
        }
        Ok(results.into_iter().flatten().collect())
    }
}

impl tools::Host for HostState {
    async fn list(&mut self) -> Result<Vec<model::ToolSpec>, ImportError> {
        Ok(self.tools_list().await?)
    }

    async fn call(&mut self, calls: Vec<model::ToolCall>) -> Result<Vec<tools::ToolResult>, ImportError> {
        let Some(journal) = self.journal() else { return Ok(self.tools_call(calls).await?) };
        let import = Import::ToolsCall;
        let digest = crate::journal::digest(&serde_json::to_value(&calls).expect("tool calls serialise"));
        let seq = match super::journal::next(&journal, import, &digest)? {
            Next::Recorded(result) => {
                // The replayed calls count against the task's tool-call limit as they did.
                if let Some(budget) = self.scope.task_scope.as_ref().and_then(|s| s.tool_budget.as_ref()) {
                    for _ in &calls {
                        let _ = budget.take();
                    }
                }
                return super::journal::recorded(import, result);
            }
            Next::Interrupted { seq, running } => {
                let r = self.tools_call_interrupted(&journal, seq, &digest, calls, running).await;
                self.record(&journal, seq, import, &digest, &r, Durability::Committed).await?;
                return Ok(r?);
            }
            Next::Live { seq: None } => return Ok(self.tools_call(calls).await?),
            Next::Live { seq: Some(seq) } => seq,
        };
        // Under way before anything runs; each call that passes the gate is marked
        // running before it starts (the tool host, through the task's scope).
        journal.started(seq, import, &digest, vec![]);
        self.commit(&journal).await?;
        let r = self.tools_call(calls).await;
        self.record(&journal, seq, import, &digest, &r, Durability::Committed).await?;
        Ok(r?)
    }
}

/// The result of a tool call that was running when the host running its task died.
fn interrupted_result(call: &model::ToolCall) -> tools::ToolResult {
    tools::ToolResult {
        id: call.id.clone(),
        content: format!(
            "The {} call was interrupted: the host running this task restarted while the call ran, and it was not \
             run again. Its effects, if any, remain; check before making it again.",
            call.name
        ),
        is_error: true,
    }
}

impl HostState {
    /// A `tools.call` batch that was under way when the host died: calls that had started
    /// (`running`; a call without an id counts as started) end with
    /// [`interrupted_result`], the others are made now (an approval that was pending is
    /// asked again).
    async fn tools_call_interrupted(
        &mut self,
        journal: &crate::journal::TaskJournal,
        seq: u64,
        digest: &str,
        calls: Vec<model::ToolCall>,
        running: Vec<String>,
    ) -> Result<Vec<tools::ToolResult>, Error> {
        let started = |c: &model::ToolCall| c.id.is_empty() || running.contains(&c.id);
        let again: Vec<model::ToolCall> = calls.iter().filter(|c| !started(c)).cloned().collect();
        // The calls that ran count against the task's tool-call limit as they did.
        if let Some(budget) = self.scope.task_scope.as_ref().and_then(|s| s.tool_budget.as_ref()) {
            for _ in calls.iter().filter(|c| started(c)) {
                let _ = budget.take();
            }
        }
        journal.started(seq, Import::ToolsCall, digest, running.clone());
        let mut made = match again.is_empty() {
            true => vec![],
            false => self.tools_call(again).await?,
        }
        .into_iter();
        let mut results = Vec::with_capacity(calls.len());
        for c in &calls {
            if started(c) {
                let r = interrupted_result(c);
                // The call's end, in the task's stream as any call's.
                if let Some(scope) = &self.scope.task_scope {
                    let subagent = &scope.subagent;
                    let data = serde_json::json!({ "id": r.id, "name": c.name, "is_error": true, "content": r.content, "subagent": subagent });
                    crate::tools::emit_result(scope, data).await;
                }
                results.push(r);
            } else {
                results.push(made.next().unwrap_or_else(|| interrupted_result(c)));
            }
        }
        Ok(results)
    }
}
