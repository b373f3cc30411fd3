//! The one context of a running task ([`TaskScope`]): who runs it (task, session, user,
//! subagent, plugin), what its definition allows (permission mode, MCP servers, tools,
//! egress), where its events go, how to ask a person, what it may still spend and whether
//! it was canceled. Filled once, in order — the engine (ids, secrets, decider, budget, the
//! task's egress, cancellation), [`crate::task::run`] (the definition's egress and reasoning
//! effort), the runtime
//! (the definition's and plugin's fields) — then shared as `Arc<TaskScope>` by the plugin
//! call, its host imports and the tool host, and read by the approval requests it makes.
//! Data only: this module decides nothing. [`SubagentStarter`] is the one interface in it:
//! how the tool host asks the engine to run a nested subagent without depending on it.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use warden_approval::{ChainLink, Decider, PermissionMode};

use crate::event::EventSink;
use crate::plugin::CancelSignal;

/// A running task's context (see the module docs).
#[derive(Clone, Default)]
pub struct TaskScope {
    pub task_id: String,
    pub session_id: String,
    pub user_id: String,
    /// The subagent's name (its definition's).
    pub subagent: String,
    /// The id of the plugin that executes it.
    pub plugin: String,
    /// The definition's permission mode; capped by the operator's `max_mode` in the gate.
    pub permission_mode: Option<PermissionMode>,
    /// MCP servers the definition names (operator-configured ones only are offered, and
    /// only those `plugin_grants` grants).
    pub mcp_servers: Vec<String>,
    /// The effective grants of the plugin that executes the task: which of the operator's
    /// MCP servers its tools may reach is checked against them at every listing and call
    /// ([`crate::capability::Grants::check_mcp_server`]). The default grants nothing.
    pub plugin_grants: Arc<crate::capability::Grants>,
    /// MCP servers the definition defines itself, as the registry admitted them (none
    /// unless the operator allows agent-defined servers).
    pub agent_mcp_servers: Vec<crate::plugin::AgentMcpServer>,
    /// The definition's `tools` list (`None` = every tool): what the tools import offers.
    pub allowed_tools: Option<Vec<String>>,
    /// The definition's reasoning effort, handed to every model call of the task.
    pub reasoning_effort: Option<warden_models::ReasoningEffort>,
    /// The container runtime the task's sandbox session runs under when the operator put
    /// its subagent under another than `sandbox.runtime` (`sandbox.runtime_overrides`): its
    /// tools then use a session of their own under that runtime ([`TaskScope::session_key`]).
    pub sandbox_runtime: Option<String>,
    /// The task's `tool_context` entries exported into every sandboxed command's
    /// environment (`"env": true`, names the operator lists in `sandbox.task_env`); never
    /// logged or stored.
    pub tool_env: Vec<(String, String)>,
    /// Every `tool_context` entry by variable name: what `${NAME}` in an operator's MCP
    /// server `env` may take (not exported otherwise).
    pub tool_secrets: Vec<(String, String)>,
    /// The `tool_context` entries the egress proxy adds to the session's requests to their
    /// hosts while a call of this task runs (`inject`).
    pub egress_credentials: Vec<Arc<warden_sandbox::egress::Credential>>,
    /// Where the task's events go.
    pub events: Option<EventSink>,
    /// How to ask a person (TTY prompt, MCP elicitation); `None` = only the approvals API.
    pub decider: Option<Arc<dyn Decider>>,
    /// Tool calls the task may still run (`max_tool_iterations`); `None` = unlimited.
    /// Checked before each call is judged, so no call past the limit ever starts.
    pub tool_budget: Option<Arc<ToolBudget>>,
    /// Egress lists that narrow the operator's `sandbox.egress` while the task's tool calls
    /// run (the subagent's, the task's); empty = the operator's list.
    pub egress: Vec<Arc<warden_sandbox::EgressNarrowing>>,
    /// The task's cancellation: seen by the plugin (WIT `cancel`), and it ends the call.
    pub cancel: Option<CancelSignal>,
    /// The tasks above this one when a subagent started it with the `Agent` tool, root
    /// first; empty for a task the parent agent submitted (depth 1).
    pub chain: Vec<ChainLink>,
    /// The `tools` lists of the definitions above this one (those that have one): the
    /// task may use a tool only if each of them allows it too ([`crate::nesting`]).
    pub inherited_tools: Vec<Vec<String>>,
    /// The definition's deny rules (a Claude agent file's `disallowedTools` entries with an
    /// argument pattern, such as `Bash(rm -rf*)`, from the reference metadata
    /// [`crate::nesting::DISALLOWED_TOOLS_METADATA`]): a call one matches is refused
    /// before the gate ([`crate::nesting::denied_call_refusal`]). They only narrow.
    pub own_denied_tools: Vec<String>,
    /// The deny rules of the definitions above this one: they apply to it too.
    pub inherited_denied_tools: Vec<String>,
    /// How this task starts subagents with the `Agent` tool; `None` when it may not (its
    /// depth is `subagents.max_depth`, or it runs outside the engine).
    pub subagents: Option<Arc<dyn SubagentStarter>>,
    /// The tool names the task's plugin has offered its model (every `model.complete`
    /// request's tools, added up; at most [`MAX_OFFERED_TOOLS`]): what a subagent it
    /// starts may use at most, whatever the plugin filtered out (`disallowedTools`, a
    /// hook's `Bash`, MCP servers) that the definition's `tools` list does not say.
    pub offered_tools: Arc<Mutex<BTreeSet<String>>>,
    /// The task's import journal when it is durable ([`crate::journal`]): every import of
    /// its plugin call goes through it, and the tool host marks the calls that start.
    pub journal: Option<Arc<crate::journal::TaskJournal>>,
}

/// Most tool names remembered as offered to one task's model; names past it are not
/// remembered, which only takes tools away from the subagents it starts.
pub const MAX_OFFERED_TOOLS: usize = 512;

/// A subagent the `Agent` tool may start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartableSubagent {
    pub name: String,
    pub description: String,
    /// The plugin that executes it: a bare `Agent` entry reaches only the subagents of its
    /// own task's plugin; others (remote A2A, MCP, HTTP agents) must be named.
    pub plugin: String,
}

impl TaskScope {
    /// 1 for a task the parent agent submitted, 2 for a subagent it started, and so on.
    pub fn depth(&self) -> usize {
        self.chain.len() + 1
    }

    /// Every deny rule that applies to the task: its definition's and its ancestors'.
    pub fn denied_tools(&self) -> Vec<String> {
        self.own_denied_tools.iter().chain(&self.inherited_denied_tools).cloned().collect()
    }

    /// The sandbox session this task's tools use: its user's session id, under the runtime
    /// its subagent was put under (every path from a task to the sandbox takes it from here).
    pub fn session_key(&self) -> warden_sandbox::SessionKey {
        warden_sandbox::SessionKey::new(self.user_id.clone(), self.session_id.clone())
            .with_runtime(self.sandbox_runtime.clone())
    }

    /// Remembers tool names the task's plugin offered its model.
    pub fn note_offered_tools<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        let mut offered = self.offered_tools.lock().unwrap_or_else(|e| e.into_inner());
        for name in names {
            if offered.len() >= MAX_OFFERED_TOOLS {
                break;
            }
            if !offered.contains(name) {
                offered.insert(name.to_owned());
            }
        }
    }

    /// The tool names noted so far.
    pub fn offered_tools(&self) -> Vec<String> {
        self.offered_tools.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect()
    }
}

/// Runs nested subagents for the tool host (the engine implements it).
pub trait SubagentStarter: Send + Sync {
    /// The subagents registered now (the Agent tool lists those a task may start).
    fn available(&self) -> Vec<StartableSubagent>;

    /// Runs `call` as a child task of `parent` (same user and session, its tools narrowed
    /// by the parent's, its approvals naming the chain) and waits for it to end: its final
    /// record, or why it could not start. If `parent` is canceled, or the returned future
    /// is dropped, the child is canceled.
    fn run_child<'a>(
        &'a self,
        parent: &'a TaskScope,
        call: crate::plugin::TaskCall,
    ) -> futures_util::future::BoxFuture<'a, Result<crate::store::TaskRecord, String>>;
}

impl From<Option<EventSink>> for TaskScope {
    /// A scope that only collects events (a plugin call outside a task, e.g. in tests).
    fn from(events: Option<EventSink>) -> Self {
        TaskScope { events, ..TaskScope::default() }
    }
}

/// A task's tool-call budget (`max_tool_iterations`): the one place the limit is counted.
/// The tool host takes one call from it for every call a plugin asks for, before the gate;
/// the engine waits on [`ToolBudget::exhausted`] and ends the task when a call was refused.
#[derive(Debug)]
pub struct ToolBudget {
    max_calls: u32,
    remaining: AtomicU32,
    exceeded: tokio::sync::watch::Sender<bool>,
}

impl ToolBudget {
    pub fn new(max_calls: u32) -> Self {
        ToolBudget { max_calls, remaining: AtomicU32::new(max_calls), exceeded: tokio::sync::watch::channel(false).0 }
    }

    /// The limit this budget started with.
    pub fn max_calls(&self) -> u32 {
        self.max_calls
    }

    /// Takes one call; false (and remembered) when the budget is used up.
    pub fn take(&self) -> bool {
        let ok = self.remaining.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        if !ok {
            self.exceeded.send_replace(true);
        }
        ok
    }

    /// Whether a call was refused for lack of budget.
    pub fn exceeded(&self) -> bool {
        *self.exceeded.borrow()
    }

    /// Resolves once a call has been refused for lack of budget.
    pub async fn exhausted(&self) {
        let mut rx = self.exceeded.subscribe();
        // The sender lives as long as `self`: `wait_for` cannot fail while we are borrowed.
        let _ = rx.wait_for(|exceeded| *exceeded).await;
    }
}
