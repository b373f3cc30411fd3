//! The `tools` capability's host side: the session's sandbox tools behind the one
//! approval gate.
//!
//! Every tool call of every plugin comes through [`ToolHost::call_batch`]: the gate
//! decides (policy, then a person when the policy says ask), allowed calls run in the
//! session's sandbox in call order, declined calls become a readable "not run" result,
//! and the host itself emits `tool_call` / `tool_result` events. No other path reaches
//! the sandbox. This module must never run a call the gate did not allow.
//!
//! The `Agent` tool (nested subagents, [`crate::nesting`]) is offered and gated here like
//! the others; an allowed call becomes a child task the engine runs
//! ([`crate::scope::SubagentStarter`]), and the child's answer is the call's result.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use warden_approval::{ApprovalGate, ApprovalRequest, Policy};
use warden_sandbox::{Sandbox, SessionKey};

use crate::event::{EventSink, TaskEvent, ToolEvent};
use crate::mcp_tools::{AgentStart, McpTools};
pub use crate::scope::{TaskScope, ToolBudget};

/// A tool as a model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

/// One call a plugin asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub input: Value,
}

/// Its result, in the order of the calls.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult {
    pub id: String,
    pub content: String,
    pub is_error: bool,
}

pub struct ToolHost {
    sandbox: Result<Arc<Sandbox>, String>,
    gate: ApprovalGate,
    mcp: McpTools,
    /// The calls running in each session's sandbox: where its egress decisions are
    /// streamed. `None` without `sandbox.egress` (nothing to stream, nothing to track).
    in_flight: Option<InFlight>,
}

/// One call running in a session's sandbox, as its egress events need it.
struct Flight {
    id: u64,
    plugin: String,
    subagent: String,
    task_id: String,
    events: EventSink,
}

type InFlight = Arc<Mutex<HashMap<SessionKey, Vec<Flight>>>>;

/// Registers a call as running in its session's sandbox until dropped.
struct FlightGuard<'a> {
    map: &'a InFlight,
    key: SessionKey,
    id: u64,
}

impl Drop for FlightGuard<'_> {
    fn drop(&mut self) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = map.get_mut(&self.key) {
            v.retain(|f| f.id != self.id);
            if v.is_empty() {
                map.remove(&self.key);
            }
        }
    }
}

/// What a session's egress recorder reports (each decision within the session's record
/// budget, a count of those past it): one audit line, and an `egress` event in the stream
/// of every task with a call running in that session's sandbox (the proxy sees
/// connections, not calls: concurrent calls of one session all get it). The audit line is
/// only queued ([`warden_approval::AuditLog`] writes on a thread of its own): the proxy
/// never waits for the disk.
fn egress_observed(
    report: &warden_sandbox::EgressReport,
    audit: Option<&warden_approval::AuditLog>,
    in_flight: &InFlight,
) {
    use warden_sandbox::EgressReport;
    let (session, data) = match report {
        EgressReport::Decision(ev) => {
            if let Some(log) = audit {
                // A full queue is counted by the log itself (an `audit_gap` line).
                let _ = log.append_egress(&egress_record(ev));
            }
            let data = json!({
                "host": ev.host, "port": ev.port, "kind": ev.kind, "allowed": ev.allowed, "rule": ev.rule,
                "bytes_sent": ev.bytes_sent, "bytes_received": ev.bytes_received, "credential": ev.credential,
            });
            (&ev.session, data)
        }
        EgressReport::Suppressed(c) => {
            if let Some(log) = audit {
                let _ = log.append_egress_suppressed(&warden_approval::EgressSuppressedRecord {
                    ts: warden_approval::AuditRecord::now(),
                    event: "egress_suppressed".into(),
                    session_id: c.session.session_id.clone(),
                    user_id: c.session.user_id.clone(),
                    refused: c.refused,
                    allowed: c.allowed,
                    connections_closed: c.connections_closed,
                    bytes_sent: c.bytes_sent,
                    bytes_received: c.bytes_received,
                    hosts: c.hosts.clone(),
                    seconds: c.seconds,
                });
            }
            let data = json!({
                "suppressed": true, "refused": c.refused, "allowed": c.allowed,
                "connections_closed": c.connections_closed, "bytes_sent": c.bytes_sent,
                "bytes_received": c.bytes_received, "hosts": c.hosts, "seconds": c.seconds,
            });
            (&c.session, data)
        }
    };
    let map = in_flight.lock().unwrap_or_else(|e| e.into_inner());
    for f in map.get(session).into_iter().flatten() {
        let mut data = data.clone();
        data["subagent"] = json!(f.subagent);
        data["task_id"] = json!(f.task_id);
        // Never blocks the proxy: a full stream loses this event (the audit line stays).
        let _ = f.events.try_send(TaskEvent::Tool { plugin: f.plugin.clone(), event: ToolEvent::Egress(data) });
    }
}

/// An egress decision as its audit line.
fn egress_record(ev: &warden_sandbox::EgressEvent) -> warden_approval::EgressRecord {
    warden_approval::EgressRecord {
        ts: warden_approval::AuditRecord::now(),
        event: "egress".into(),
        session_id: ev.session.session_id.clone(),
        user_id: ev.session.user_id.clone(),
        kind: ev.kind.clone(),
        host: ev.host.clone(),
        port: ev.port,
        decision: if ev.allowed { warden_approval::AuditDecision::Allow } else { warden_approval::AuditDecision::Deny },
        rule: ev.rule.clone(),
        bytes_sent: ev.bytes_sent,
        bytes_received: ev.bytes_received,
        credential: ev.credential.clone(),
    }
}

impl ToolHost {
    /// `sandbox` is an error text when the sandbox could not be configured; tool calls
    /// then fail with it while text-only subagents keep working.
    pub fn new(sandbox: Result<Arc<Sandbox>, String>, gate: ApprovalGate) -> Self {
        let mut in_flight = None;
        if let Ok(sb) = &sandbox
            && let Some(policy) = sb.egress_policy()
        {
            // A server that echoes a request's headers must not hand a credential to the
            // model: the host's secrets are scrubbed from every tool result (and log line).
            let values = policy.secret_values();
            if let Err(e) =
                crate::redact::registry().remember_host(&values.iter().map(String::as_str).collect::<Vec<_>>())
            {
                tracing::error!(error = %e, "egress credentials cannot be registered for scrubbing");
            }
            let audit = gate.audit_log().cloned();
            let flights = InFlight::default();
            in_flight = Some(flights.clone());
            sb.on_egress(Arc::new(move |report: &warden_sandbox::EgressReport| {
                egress_observed(report, audit.as_deref(), &flights)
            }));
        }
        ToolHost { sandbox, gate, mcp: McpTools::new(&Default::default()), in_flight }
    }

    /// Marks a call of `scope` as running in `key`'s sandbox until the guard drops.
    fn fly(&self, scope: &TaskScope, key: &SessionKey) -> Option<FlightGuard<'_>> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let in_flight = self.in_flight.as_ref()?;
        let events = scope.events.clone()?;
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let flight = Flight {
            id,
            plugin: scope.plugin.clone(),
            subagent: scope.subagent.clone(),
            task_id: scope.task_id.clone(),
            events,
        };
        in_flight.lock().unwrap_or_else(|e| e.into_inner()).entry(key.clone()).or_default().push(flight);
        Some(FlightGuard { map: in_flight, key: key.clone(), id })
    }

    /// Adds the operator's MCP servers as tool sources.
    pub fn with_mcp(mut self, mcp: McpTools) -> Self {
        self.mcp = mcp;
        self
    }

    pub fn gate(&self) -> &ApprovalGate {
        &self.gate
    }

    pub fn policy(&self) -> &Policy {
        self.gate.policy()
    }

    pub fn sandbox(&self) -> Result<&Arc<Sandbox>, &str> {
        self.sandbox.as_ref().map_err(String::as_str)
    }

    /// Tools a subagent may see: the sandbox tools and its MCP servers' tools (those its
    /// definition names that its plugin is granted), minus those a bare-name deny removes.
    pub async fn list(&self, scope: &TaskScope) -> Vec<ToolSpec> {
        let sandbox = warden_sandbox::tool_specs().into_iter().map(|t| ToolSpec {
            name: t.name.to_string(),
            description: t.description.to_string(),
            input_schema: t.input_schema,
        });
        let key = scope.session_key();
        let site = self.sandbox.as_ref().ok().map(|sandbox| crate::mcp_tools::SessionSite {
            sandbox,
            key: &key,
            secrets: &scope.tool_secrets,
            exported: &scope.tool_env,
            task_id: &scope.task_id,
            egress: &scope.egress,
        });
        let mut own = Vec::with_capacity(scope.agent_mcp_servers.len());
        // Only servers whose tools the task's `tools` lists (its own and its ancestors')
        // let it use are started at all.
        let usable = scope.agent_mcp_servers.iter().filter(|s| {
            crate::nesting::tools_allow_server(scope.allowed_tools.as_deref(), &scope.inherited_tools, &s.name)
        });
        for server in usable {
            match self.agent_server_start(scope, server, site.as_ref()).await {
                Ok(start) => own.push((server, start)),
                Err(declined) => {
                    tracing::warn!(task_id = %scope.task_id, session = %scope.session_id, plugin = %scope.plugin,
                        server = %server.name, "agent-defined MCP server not started: {declined}");
                }
            }
        }
        let mcp = self.mcp.list(&scope.mcp_servers, &scope.plugin_grants, &own, site.as_ref()).await;
        let mcp = mcp.into_iter().map(|t| ToolSpec {
            name: t.name,
            description: t.description,
            input_schema: t.input_schema,
        });
        sandbox.chain(mcp).chain(agent_tool(scope)).filter(|t| self.gate.policy().tool_visible(&t.name)).collect()
    }

    /// Runs one call the gate allowed: MCP tools on their server, the rest in the sandbox.
    async fn run_allowed(
        &self,
        scope: &TaskScope,
        key: &SessionKey,
        call: &ToolCall,
        approved_path: Option<&warden_sandbox::ResolvedPath>,
    ) -> (String, bool) {
        if let Some((server, tool)) = warden_mcp_protocol::parse_claude_tool_name(&call.name) {
            let site = self.sandbox.as_ref().ok().map(|sandbox| crate::mcp_tools::SessionSite {
                sandbox,
                key,
                secrets: &scope.tool_secrets,
                exported: &scope.tool_env,
                task_id: &scope.task_id,
                egress: &scope.egress,
            });
            if let Some(own) = scope.agent_mcp_servers.iter().find(|s| s.name == server) {
                let start = match self.agent_server_start(scope, own, site.as_ref()).await {
                    Ok(start) => start,
                    Err(declined) => {
                        return (
                            format!(
                                "The {} call was not run: MCP server {server:?} was not started: {declined}",
                                call.name
                            ),
                            true,
                        );
                    }
                };
                return match self.mcp.call_agent_server(own, start, tool, call.input.clone(), site.as_ref()).await {
                    Ok(r) => (r.text, r.is_error),
                    Err(e) => (format!("The {} call failed: {e}", call.name), true),
                };
            }
            // Only a server the definition names and the plugin is granted (McpTools::visible).
            let input = call.input.clone();
            return match self
                .mcp
                .call(server, tool, input, &scope.mcp_servers, &scope.plugin_grants, site.as_ref())
                .await
            {
                Ok(r) => (r.text, r.is_error),
                Err(e) => (format!("The {} call failed: {e}", call.name), true),
            };
        }
        match &self.sandbox {
            Err(e) => (format!("The {} call failed: {e}", call.name), true),
            Ok(sandbox) => {
                match sandbox
                    .call_tool_pinned(key, &call.name, call.input.clone(), &scope.tool_env, approved_path)
                    .await
                {
                    Ok(out) => (out.content, out.is_error),
                    Err(e) => (format!("The {} call failed: {e}", call.name), true),
                }
            }
        }
    }

    /// Whether the subagent's own MCP server `server` may be started for this use: not
    /// needed when it already runs in the session; otherwise its command line is put to the
    /// approval gate as the `Bash` call it amounts to (policy, mode, then a person), so the
    /// operator's Bash rules and the subagent's permission mode hold for what it starts.
    /// `Err` with the reason when the gate declines.
    async fn agent_server_start(
        &self,
        scope: &TaskScope,
        server: &crate::plugin::AgentMcpServer,
        site: Option<&crate::mcp_tools::SessionSite<'_>>,
    ) -> Result<AgentStart, String> {
        let Some(site) = site else { return Ok(AgentStart::IfRunning) };
        if self.mcp.agent_server_running(server, site) {
            return Ok(AgentStart::IfRunning);
        }
        if self.mcp.agent_server_declined(server, site) {
            return Err("starting it was declined earlier in this task".into());
        }
        // A start is a command run for the task: it counts against its tool-call limit.
        if scope.tool_budget.as_ref().is_some_and(|b| !b.take()) {
            return Err("the task reached its tool-call limit".into());
        }
        let command = crate::mcp_tools::agent_server_command(server)
            .ok_or_else(|| "its command line cannot be written as a shell command".to_owned())?;
        let description = format!(
            "start the MCP server `{}` that subagent `{}` defines (its tools: mcp__{}__*)",
            server.name, scope.subagent, server.name
        );
        let request = approval_request(scope, BASH_TOOL, json!({ "command": command, "description": description }));
        let verdict = self.gate.decide_batch_with(vec![request], scope.decider.clone()).await.pop();
        let declined = match verdict.map(|v| v.declined_message(BASH_TOOL)) {
            Some(None) => return Ok(AgentStart::MayStart),
            Some(Some(declined)) => declined,
            None => "the approval gate gave no verdict".into(),
        };
        self.mcp.decline_agent_server(server, site);
        Err(declined)
    }

    /// The task of `scope` is over: the MCP servers it defined and started end now, with
    /// every process they started.
    pub async fn end_task(&self, scope: &TaskScope) {
        if scope.agent_mcp_servers.is_empty() {
            return;
        }
        if let Ok(sandbox) = &self.sandbox {
            let key = scope.session_key();
            self.mcp.end_task(sandbox, &key, &scope.task_id).await;
        }
    }

    /// The sandbox path a file tool call would use, after symlink resolution; `Ok(None)` for
    /// calls without one (Bash, MCP tools) or when the sandbox is unavailable (the call then
    /// fails with that error when run); `Err` when the path cannot be used at all (it leads
    /// out of the workspace, holds control characters).
    async fn resolve_for_policy(
        &self,
        key: &SessionKey,
        call: &ToolCall,
    ) -> Result<Option<warden_sandbox::ResolvedPath>, String> {
        let (Ok(sandbox), Some(path)) = (&self.sandbox, warden_sandbox::tool_path(&call.name, &call.input)) else {
            return Ok(None);
        };
        sandbox.resolve_path(key, &path).await.map(Some).map_err(|e| e.to_string())
    }

    /// What the gate needs to judge a Bash call's files: the working directory it starts
    /// in (its task's, `secrets` being the variables the call gets), and every file its
    /// recognised commands and redirections name
    /// ([`warden_approval::shell_files`]) as the sandbox resolves it for the shell (links
    /// followed, `..` after links; a directory a command reads or writes whole says whether
    /// files with other hard links are beneath it). `None` for other calls, or when the
    /// sandbox is unavailable (the call then fails with that error when run). At most
    /// [`MAX_SHELL_FILES_RESOLVED`] are looked up; the gate asks about a call whose files
    /// are not all resolved.
    async fn shell_facts(&self, key: &SessionKey, call: &ToolCall, secrets: &[(String, String)]) -> Option<ShellFacts> {
        if call.name != BASH_TOOL {
            return None;
        }
        let (Ok(sandbox), Some(command)) = (&self.sandbox, call.input.get("command").and_then(Value::as_str)) else {
            return None;
        };
        let cwd = sandbox.shell_cwd(key, secrets).await.ok()?;
        let (mut files, mut identities) = (Vec::new(), Vec::new());
        for f in
            warden_approval::shell_files(command, std::path::Path::new(&cwd)).into_iter().take(MAX_SHELL_FILES_RESOLVED)
        {
            let found = sandbox.resolve_shell_path(key, &f.path, f.access.tree()).await.ok();
            identities.push(found.as_ref().and_then(|p| p.identity));
            files.push(warden_approval::ResolvedFile {
                resolved: found.as_ref().map(|p| p.path.clone()),
                other_names: found.is_some_and(|p| p.other_names),
                path: f.path,
            });
        }
        Some(ShellFacts { cwd, files, identities })
    }

    /// Runs a batch through the gate and the sandbox; results come back in call order.
    pub async fn call_batch(&self, scope: &TaskScope, calls: Vec<ToolCall>) -> Vec<ToolResult> {
        for c in &calls {
            emit(
                scope,
                ToolEvent::Call(json!({ "id": c.id, "name": c.name, "input": c.input, "subagent": scope.subagent })),
            )
            .await;
        }
        let key = scope.session_key();
        // Why a call cannot run at all, whatever a person would say: its task was canceled
        // (the plugin may still run during the cancel grace period, but starts nothing), or
        // it is past the task's tool-call limit, which counts every call asked for. Such a
        // call is not put to the gate: nobody is asked about a call that cannot run.
        // An Agent call this task may not make (no nesting here, a subagent it may not
        // start, invalid input) is refused the same way.
        let canceled = scope.cancel.as_ref().is_some_and(crate::plugin::CancelSignal::is_canceled);
        let refusals: Vec<Option<String>> = calls
            .iter()
            .map(|c| match () {
                _ if canceled => Some("the task was canceled".to_owned()),
                _ if scope.tool_budget.as_ref().is_some_and(|b| !b.take()) => {
                    Some("the task reached its tool-call limit".to_owned())
                }
                _ if crate::nesting::is_agent_tool(&c.name) => agent_call_refusal(scope, &c.input),
                _ => None,
            })
            .collect();
        // Path tools: the policy judges the path after symlink resolution too, and the call
        // is pinned to what was judged (a link swapped in between fails the call). A refused
        // call touches no sandbox (no container is made, no path looked up for it).
        let mut resolved: Vec<Result<Option<warden_sandbox::ResolvedPath>, String>> = Vec::with_capacity(calls.len());
        for (c, refused) in calls.iter().zip(&refusals) {
            resolved.push(if refused.is_some() { Ok(None) } else { self.resolve_for_policy(&key, c).await });
        }
        // A `Tool(pattern)` entry of the task's `tools` (or an ancestor's) narrows the tool
        // to the calls it matches: any other call of it is refused, never put to the gate;
        // so is a call a `disallowedTools` pattern (its own or an ancestor's) matches.
        let refusals: Vec<Option<String>> = refusals
            .into_iter()
            .zip(calls.iter().zip(&resolved))
            .map(|(refused, (c, path))| {
                refused.or_else(|| {
                    let resolved_path = path.as_ref().ok().and_then(|p| p.as_ref()).map(|p| p.path.as_str());
                    crate::nesting::call_refusal(
                        scope.allowed_tools.as_deref(),
                        &scope.inherited_tools,
                        &c.name,
                        &c.input,
                        resolved_path,
                        self.gate.context(),
                    )
                    .or_else(|| {
                        crate::nesting::denied_call_refusal(
                            &scope.denied_tools(),
                            &c.name,
                            &c.input,
                            resolved_path,
                            self.gate.context(),
                        )
                    })
                })
            })
            .collect();
        // Bash: the gate judges the files a command names from the directory it starts in,
        // and the command runs in that directory (pinned like a path tool's path).
        let mut shell: Vec<Option<ShellFacts>> = Vec::with_capacity(calls.len());
        for (c, refused) in calls.iter().zip(&refusals) {
            shell.push(if refused.is_some() { None } else { self.shell_facts(&key, c, &scope.tool_env).await });
        }
        let requests = calls
            .iter()
            .zip(&resolved)
            .zip(&shell)
            .zip(&refusals)
            .filter(|(_, refused)| refused.is_none())
            .map(|(((c, path), facts), _)| {
                let mut r = approval_request(scope, &c.name, c.input.clone());
                if let Ok(Some(p)) = path {
                    r.resolved_path = Some(p.path.clone());
                    r.hard_linked = p.other_names;
                }
                if let Some(facts) = facts {
                    r.shell_cwd = Some(facts.cwd.clone());
                    r.shell_files = Some(facts.files.clone());
                }
                r
            })
            .collect();
        let mut verdicts = self.gate.decide_batch_with(requests, scope.decider.clone()).await.into_iter();
        let mut results = Vec::with_capacity(calls.len());
        for (((call, refused), path), facts) in calls.into_iter().zip(refusals).zip(resolved).zip(shell) {
            // A Bash call runs only if its files are still the ones that were judged: a
            // batch is judged at once and its calls run one after the other, so an earlier
            // call (a `git checkout` that turns `docs/a.md` into a link to `.env`) must not
            // change what a later allowed one reads. Looked up again just before it runs.
            let judged_facts = facts.clone();
            // A Bash call runs in the directory its files were judged from.
            let path = match (path, facts) {
                (Ok(None), Some(facts)) => Ok(Some(warden_sandbox::ResolvedPath::directory(facts.cwd))),
                (path, _) => path,
            };
            let verdict = if refused.is_none() { verdicts.next() } else { None };
            let (content, is_error) = match verdict.as_ref().map(|v| v.declined_message(&call.name)) {
                None => (format!("The {} call was not run: {}.", call.name, refused.unwrap_or_default()), true),
                Some(Some(declined)) => (declined, true),
                // A child task: its own calls pass the gate and hold the session's egress.
                Some(None) if crate::nesting::is_agent_tool(&call.name) => {
                    mark_running(scope, &call.id).await;
                    run_subagent(scope, &call).await
                }
                Some(None) => match path {
                    Err(e) => (format!("The {} call failed: {e}", call.name), true),
                    Ok(_)
                        if judged_facts.is_some()
                            && self.shell_facts(&key, &call, &scope.tool_env).await != judged_facts =>
                    {
                        (
                            format!(
                                "The {} call was not run: the files it names (or its working directory) changed \
                             after it was judged; make the call again.",
                                call.name
                            ),
                            true,
                        )
                    }
                    Ok(path) => {
                        let _flight = self.fly(scope, &key);
                        // The session's proxy judges this call's connections by the
                        // operator's list narrowed by the subagent's and the task's, and
                        // adds the task's injected secrets while the call runs.
                        let held = match self.sandbox.as_ref() {
                            Ok(sb) => {
                                sb.hold_egress_with(&key, &scope.egress, &scope.egress_credentials).await.map(Some)
                            }
                            Err(_) => Ok(None),
                        };
                        match held {
                            Ok(_egress) => {
                                mark_running(scope, &call.id).await;
                                self.run_allowed(scope, &key, &call, path.as_ref()).await
                            }
                            Err(e) => (format!("The {} call was not run: {e}", call.name), true),
                        }
                    }
                },
            };
            // Neither the event (whose excerpt could cut a secret in two) nor the plugin
            // and its model read the session's secrets.
            let content =
                crate::redact::registry().session(&scope.user_id, &scope.session_id).scrub(&content).into_owned();
            let content = crate::redact::registry().host().scrub(&content).into_owned();
            tracing::info!(
                task_id = %scope.task_id, session = %scope.session_id, plugin = %scope.plugin,
                tool = %call.name, decision = ?verdict.map(|v| v.decision), is_error, "tool call"
            );
            let result = json!({ "id": call.id, "name": call.name, "is_error": is_error, "content": excerpt(&content), "subagent": scope.subagent });
            emit(scope, ToolEvent::Result(result)).await;
            results.push(ToolResult { id: call.id, content, is_error });
        }
        results
    }
}

/// The tool an agent-defined MCP server's start is judged as: the command it runs.
const BASH_TOOL: &str = "Bash";
/// Most files of one Bash command the gate has the sandbox resolve (one agent round trip
/// each): a command naming more asks about the rest rather than wait on lookups.
const MAX_SHELL_FILES_RESOLVED: usize = 32;

/// What the gate knows about a Bash call beyond its input ([`ToolHost::shell_facts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
struct ShellFacts {
    cwd: String,
    files: Vec<warden_approval::ResolvedFile>,
    /// Which file each of `files` was (none when missing): a call runs only if they are
    /// still the same files when it starts.
    identities: Vec<Option<warden_sandbox::FileIdentity>>,
}

/// A request to the gate for a call `name(input)` of `scope`'s task.
fn approval_request(scope: &TaskScope, name: &str, input: Value) -> ApprovalRequest {
    let mut r = ApprovalRequest::new(name.to_owned(), input, scope.subagent.clone());
    r.task_id = Some(scope.task_id.clone());
    r.session_id = Some(scope.session_id.clone());
    r.user_id = Some(scope.user_id.clone());
    r.plugin = Some(scope.plugin.clone());
    r.sandbox_runtime = scope.sandbox_runtime.clone();
    r.mode = scope.permission_mode;
    r.chain.clone_from(&scope.chain);
    r
}

/// The Agent tool, when the task may start subagents: the engine gave it a starter (its
/// depth is below `subagents.max_depth`) and its definition lists `Agent`.
fn agent_tool(scope: &TaskScope) -> Option<ToolSpec> {
    let starter = scope.subagents.as_ref()?;
    let types = crate::nesting::SubagentTypes::of_definition(scope.allowed_tools.as_deref())?;
    let available: Vec<(String, String)> = starter
        .available()
        .into_iter()
        .filter(|s| types.may_start(&s.name, &s.plugin, &scope.plugin))
        .map(|s| (s.name, s.description))
        .collect();
    let (description, input_schema) = crate::nesting::agent_tool_spec(&available);
    Some(ToolSpec { name: crate::nesting::AGENT_TOOL.to_owned(), description, input_schema })
}

/// Why an Agent call cannot run at all (before anyone is asked about it), if it cannot.
fn agent_call_refusal(scope: &TaskScope, input: &Value) -> Option<String> {
    let Some(starter) = &scope.subagents else {
        return Some(format!(
            "this subagent is at depth {} and may not start subagents (subagents.max_depth)",
            scope.depth()
        ));
    };
    let Some(types) = crate::nesting::SubagentTypes::of_definition(scope.allowed_tools.as_deref()) else {
        return Some("this subagent's `tools` do not list Agent, so it may not start subagents".to_owned());
    };
    let call = match crate::nesting::AgentCall::parse(input) {
        Err(e) => return Some(e),
        Ok(call) => call,
    };
    let name = crate::text::escape_control(&call.subagent_type.chars().take(128).collect::<String>()).into_owned();
    match starter.available().into_iter().find(|s| s.name == call.subagent_type) {
        None => Some(format!("there is no subagent {name:?}")),
        Some(s) if !types.may_start(&s.name, &s.plugin, &scope.plugin) => Some(format!(
            "subagent {name:?} is not among those this subagent may start (its `Agent(…)` entries; a bare `Agent` \
             reaches only the subagents of its own plugin)"
        )),
        Some(_) => None,
    }
}

/// Runs an allowed Agent call: a child task, waited for; its answer is the call's result.
async fn run_subagent(scope: &TaskScope, call: &ToolCall) -> (String, bool) {
    let (Some(starter), Ok(agent)) = (&scope.subagents, crate::nesting::AgentCall::parse(&call.input)) else {
        // Checked before the gate; a scope cannot lose its starter in between.
        return (format!("The {} call failed: this subagent may not start subagents", call.name), true);
    };
    let subagent = agent.subagent_type.clone();
    match starter.run_child(scope, agent.into_task_call()).await {
        Err(e) => (format!("The {} call failed: {e}", call.name), true),
        Ok(child) => match (child.status, child.output) {
            (crate::task_state::TaskState::Completed, Some(output)) => (output, false),
            (status, output) => {
                let why = child.error.or(output).unwrap_or_default();
                (format!("Subagent {subagent} (task {}) ended {status}: {why}", child.task_id), true)
            }
        },
    }
}

/// Longest tool output copied into a `tool_result` event; the model gets it whole.
pub const TOOL_RESULT_EVENT_EXCERPT: usize = 2048;

fn excerpt(s: &str) -> String {
    if s.len() <= TOOL_RESULT_EVENT_EXCERPT {
        return s.to_owned();
    }
    let mut cut = TOOL_RESULT_EVENT_EXCERPT;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… [{} bytes]", &s[..cut], s.len())
}

async fn emit(scope: &TaskScope, event: ToolEvent) {
    if let Some(sink) = &scope.events {
        let _ = sink.send(TaskEvent::Tool { plugin: scope.plugin.clone(), event }).await;
    }
}

/// A tool call's end that the tool host did not run (a durable task's call that was
/// running when its host died), as the `tool_result` event any call ends with.
pub async fn emit_result(scope: &TaskScope, data: serde_json::Value) {
    emit(scope, ToolEvent::Result(data)).await;
}

/// A durable task's call `id` passed the gate and starts: its journal says so (committed)
/// before anything runs, so a takeover never runs it a second time.
async fn mark_running(scope: &TaskScope, id: &str) {
    if let Some(journal) = &scope.journal {
        journal.running(id).await;
    }
}
