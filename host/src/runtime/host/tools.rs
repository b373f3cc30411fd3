//! `tools`: the session's sandbox (and MCP) tools through the approval gate, narrowed to
//! the definition's `tools` list.

use std::sync::Arc;

use super::super::bindings::latest::{model, tools};
use super::{Error, HostState, bounded, check_tool_call, interruptible, parse_arguments};
use crate::capability::Capability;
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

/// Whether the definition's `tools` list (`None` = every tool) lets the subagent use
/// `name`: an entry names a tool, `*` all of them, and `Bash(git:*)` its tool (the argument
/// pattern is the approval policy's business).
pub(crate) fn tool_allowed(allowed: Option<&[String]>, name: &str) -> bool {
    let Some(allowed) = allowed else { return true };
    allowed.iter().any(|entry| {
        let entry = entry.trim();
        let base = match entry.find('(') {
            Some(i) if entry.ends_with(')') => entry[..i].trim(),
            _ => entry,
        };
        base == "*" || base == name
    })
}

impl tools::Host for HostState {
    async fn list(&mut self) -> Result<Vec<model::ToolSpec>, Error> {
        let (host, scope) = self.tool_host()?;
        let allowed = scope.allowed_tools.as_deref();
        Ok(host
            .list(&scope)
            .await
            .into_iter()
            .filter(|t| tool_allowed(allowed, &t.name))
            .map(|t| model::ToolSpec {
                name: t.name,
                description: t.description,
                input_schema: t.input_schema.to_string(),
            })
            .collect())
    }

    async fn call(&mut self, calls: Vec<model::ToolCall>) -> Result<Vec<tools::ToolResult>, Error> {
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
        let allowed = scope.allowed_tools.as_deref();
        let (run, refused): (Vec<_>, Vec<_>) =
            calls.into_iter().enumerate().partition(|(_, c)| tool_allowed(allowed, &c.name));
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

#[cfg(test)]
mod tests {
    use super::tool_allowed;

    #[test]
    fn the_definition_s_tools_list_narrows_by_base_name() {
        let list = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(tool_allowed(None, "Bash"));
        assert!(tool_allowed(Some(&list(&["Read", "Bash(git status:*)"])), "Bash"));
        assert!(!tool_allowed(Some(&list(&["Read"])), "Bash"));
        assert!(!tool_allowed(Some(&[]), "Read"));
        assert!(tool_allowed(Some(&list(&["*"])), "mcp__github__search"));
        assert!(!tool_allowed(Some(&list(&["Bash("])), "Bash"), "not a pattern: the whole entry is the name");
    }
}
