//! MCP servers as tool sources for subagents: the operator's `mcp_servers` appear in a
//! subagent's tool list as `mcp__<server>__<tool>` (Claude Code's names) when the
//! definition names them (an agent file's `mcpServers`) or the server is configured for all
//! agents — and, either way, only when the operator granted the subagent's plugin that
//! server (`plugins.grants.<id>.mcp_servers`, [`McpTools::visible`]: the one gate of listing
//! and calling, since the plugin writes the definition).
//!
//! Two transports, one protocol implementation (the shared I/O-free `warden-mcp-protocol`
//! crate: revision negotiation, results); this module only moves its messages:
//! - **streamable HTTP** (`url`) over reqwest: one connection per server, shared by every
//!   session.
//! - **stdio** (`command`, `args`, `env`: the `.mcp.json` shape). Such a server is
//!   third-party code with file and network access, so it runs **inside the calling
//!   session's sandbox** ([`warden_sandbox::Sandbox::spawn_process`]), one process per
//!   session, server and secret fingerprint ([`StdioKey`]: tasks whose secrets differ never
//!   share a process, so none acts with another's token), started on the first use,
//!   restarted on the next use after it died, gone with the session's container; one
//!   JSON-RPC message per line.
//!   Once it answered its handshake and first listing it is settled
//!   ([`warden_sandbox::Settler`]): anything it starts after that (for a tool
//!   call) is killed before the session's next command starts.
//!   Its tool list is the session's own: what that process answered, never remembered
//!   for another session (the program runs in the session's sandbox, where the session's
//!   own files and tool calls may change what it offers).
//!
//! Servers a subagent defines itself (WIT 0.3.0 `agent-mcp-servers`, admitted by the
//! registry only when the operator allows them) are stdio servers like the operator's,
//! but one process per task, under a process slot named by a hash of their whole
//! definition and the task (`agent_slot`: two subagents' different definitions under one
//! name never share a process), ended with every process it started when the task ends
//! ([`McpTools::end_task`]) and held to the task's egress narrowing for its whole life. Starting one
//! is a command the approval gate judges first: [`crate::tools::ToolHost`] asks it with
//! [`agent_server_command`] before the process starts (see [`McpTools::agent_server_running`]).
//!
//! Every reply is held to one set of bounds before it is parsed or kept
//! ([`warden_mcp_protocol::limits`]: bytes and estimated parsed size of a reply, a server's
//! whole listing in bytes, tools and pages, each tool's description, schema and
//! annotations, duplicate names dropped), all MCP tools together to [`MAX_MCP_TOOLS`], and
//! a result's text to the output bound every tool has (`sandbox.max_output`). An HTTP
//! server's whole listing (negotiation and every page) has [`MCP_LIST_DEADLINE`]; one that
//! failed is not asked again until its backoff ([`MCP_RETRY_BACKOFF`]) passes, so a stalled
//! server costs one deadline per backoff, not one per task. A session the server forgot
//! (`SessionExpired`) is negotiated again once and the call retried.
//!
//! It never decides whether a call may run — [`crate::tools::ToolHost`] asks the approval
//! gate first — and MCP annotations such as `destructiveHint` are passed on as hints, never
//! as policy. It never logs a stdio server's environment (it may hold the task's secrets).

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio::sync::Mutex;
use warden_mcp_protocol::{
    ClientInfo, HttpRequest, ListLimits, Listing, McpError, Pending, Session, Tool, ToolResult, Update,
};
use warden_sandbox::{Sandbox, SessionKey};

use crate::capability::Grants;
use crate::config::mcp::{McpServerConfig, McpTransport};
use crate::plugin::AgentMcpServer;

/// Time allowed for one MCP exchange (connect, list or call) when the task gives none.
pub const MCP_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest HTTP response body read, notifications included. The reply itself is held to
/// the smaller bound of its request ([`warden_mcp_protocol::limits`]: a listing page, a
/// result); this bounds what a chatty event stream may send beside it.
pub const MAX_MCP_RESPONSE: usize = 16 * 1024 * 1024;
/// Longest wait for a stdio server to start and answer its negotiation (an interpreter
/// starting in a fresh container on a busy machine). It covers the whole listing too.
pub const STDIO_START_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest wait for an HTTP server's whole listing: negotiation and every page together.
/// Each exchange has its own [`MCP_REQUEST_TIMEOUT`], but a server answering each of
/// [`warden_mcp_protocol::MAX_TOOL_PAGES`] pages just in time would otherwise hold every
/// task that lists its tools for most of an hour. A real server lists in well under a second.
pub const MCP_LIST_DEADLINE: Duration = Duration::from_secs(15);
/// How long an HTTP server whose connection or listing failed is left alone before it is
/// tried again (doubling per consecutive failure up to [`MCP_RETRY_BACKOFF_MAX`]):
/// meanwhile listings skip it with a warning and calls fail at once, instead of every task
/// waiting [`MCP_LIST_DEADLINE`] on it again.
pub const MCP_RETRY_BACKOFF: Duration = Duration::from_secs(10);
/// Longest backoff of a server that keeps failing: one that comes back is used again
/// within five minutes.
pub const MCP_RETRY_BACKOFF_MAX: Duration = Duration::from_secs(300);
/// Most MCP tools offered to one subagent, all servers together (each server is held to
/// [`warden_mcp_protocol::limits::MAX_LIST_TOOLS`] on its own). Half of
/// [`crate::services::MAX_MODEL_TOOLS`], the most tools one model request may carry: the
/// rest is room for the sandbox tools, the Agent tool and a plugin's own tools, so MCP
/// servers can never make every model request of a subagent too large to send (checked at
/// compile time beside `MAX_MODEL_TOOLS`).
pub const MAX_MCP_TOOLS: usize = 256;

/// A stdio server's `env` with every `${NAME}` filled from the task's secrets (`secrets`,
/// names as [`crate::redact::env_name`] gives them), and the fingerprint of exactly the
/// secrets it took ([`warden_sandbox::writer_of`], the lanes' one;
/// [`warden_sandbox::NO_SECRETS`] when it takes none): what a process started with this
/// environment holds, so the part of its [`StdioKey`] that keeps tasks with other secrets
/// off it.
fn expand_env(
    server: &str,
    env: &BTreeMap<String, String>,
    secrets: &[(String, String)],
) -> Result<(Vec<(String, String)>, warden_sandbox::Writer), String> {
    let mut out = vec![];
    let mut taken: Vec<(String, String)> = vec![];
    for (name, template) in env {
        let mut value = String::new();
        let mut rest = template.as_str();
        while let Some(start) = rest.find("${") {
            value.push_str(&rest[..start]);
            let Some(len) = rest[start..].find('}') else {
                return Err(format!("mcp_servers.{server}.env.{name}: unclosed `${{`"));
            };
            let secret = &rest[start + 2..start + len];
            let key = crate::redact::env_name(secret);
            let Some(pair) = secrets.iter().find(|(k, _)| *k == key) else {
                return Err(format!(
                    "mcp_servers.{server}.env.{name} names the secret {secret:?}, which this task's tool_context does not give"
                ));
            };
            value.push_str(&pair.1);
            if !taken.contains(pair) {
                taken.push(pair.clone());
            }
            rest = &rest[start + len + 1..];
        }
        value.push_str(rest);
        out.push((name.clone(), value));
    }
    Ok((out, warden_sandbox::writer_of(&taken)))
}

/// One configured server. No lock here is held across an await: a call that waits on a
/// slow server keeps nobody else from listing its tools or calling it.
struct Server {
    name: String,
    config: McpServerConfig,
    /// HTTP: the negotiated session and the tool list, discovered on first use (one
    /// server outside every sandbox, the same for every session; taken briefly to read the
    /// tools or number a request, the exchange runs without it). A stdio server keeps
    /// nothing here: its tools are its session's process's ([`StdioConn::tools`]).
    state: std::sync::Mutex<Option<Connected>>,
    /// HTTP: the last failures to connect, while they are backed off.
    failed: std::sync::Mutex<Option<Failure>>,
}

/// An HTTP server's negotiated session and its (bounded) tool list.
struct Connected {
    session: Session,
    /// Shared with every listing: never copied per task.
    tools: Arc<[Tool]>,
    /// Which connection this is: a call that finds its session expired clears only the
    /// session it used, never a newer one another call has negotiated since.
    epoch: u64,
}

/// Consecutive failures to connect to an HTTP server, and until when it is left alone.
struct Failure {
    count: u32,
    until: Instant,
    error: String,
}

/// Numbers HTTP connections ([`Connected::epoch`]).
static EPOCH: AtomicU64 = AtomicU64::new(0);

impl Server {
    /// The connected session's tools, if connected.
    fn known_tools(&self) -> Option<Arc<[Tool]>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|c| c.tools.clone())
    }

    /// Why the server is not tried now, while a failure is backed off.
    fn backed_off(&self) -> Option<String> {
        let failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        let f = failed.as_ref()?;
        let left = f.until.checked_duration_since(Instant::now())?;
        Some(format!("{} (not retried for another {}s)", f.error, left.as_secs() + 1))
    }

    /// Remembers a failure to connect: the server is left alone for a backoff that doubles
    /// with each consecutive failure.
    fn record_failure(&self, error: &str) {
        let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        let count = failed.as_ref().map_or(1, |f| f.count.saturating_add(1));
        let backoff = MCP_RETRY_BACKOFF.saturating_mul(1 << (count - 1).min(16)).min(MCP_RETRY_BACKOFF_MAX);
        *failed = Some(Failure { count, until: Instant::now() + backoff, error: error.to_owned() });
    }
}

/// One stdio server process of one session and the MCP session over its streams.
struct StdioConn {
    session: Session,
    tools: Arc<[Tool]>,
    stdin: Pin<Box<dyn AsyncWrite + Send>>,
    stdout: BufReader<Pin<Box<dyn AsyncRead + Send>>>,
    stderr: warden_sandbox::process::StderrTail,
    /// Its stream ended or broke: the next use starts a new process.
    dead: bool,
    /// An agent-defined server's process: who it is (ended with its task, see
    /// [`McpTools::end_task`]) and the task's egress narrowing, held for its whole life
    /// (between calls too), so it reaches no more than the task that started it.
    owned: Option<(warden_sandbox::ProcessId, warden_sandbox::EgressHold)>,
}

/// One session's process of one server for one set of secrets. Its environment was
/// expanded from the secrets of the task that started it, so a task may use it only when
/// the secrets its own expansion takes are the same ones (an equal fingerprint): a task
/// without the secret, or with another token, starts a process of its own (or fails to,
/// naming the missing secret) instead of acting with another task's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct StdioKey {
    user: String,
    session: String,
    /// An operator server's name, or [`agent_slot`] for an agent-defined one.
    slot: String,
    /// The fingerprint of the secrets the server's `env` took ([`expand_env`]).
    secrets: warden_sandbox::Writer,
}

/// How every agent-defined server's slot begins ([`agent_slot`]).
const AGENT_SLOT_PREFIX: &str = "agent:";

/// The process slot of an agent-defined server in one task: its name, a SHA-256 of its
/// whole definition (a slot's process always runs exactly the definition that was
/// approved) and the task (its process lives only as long as the task that started it).
/// (Operator server names never contain `:`.)
fn agent_slot(s: &AgentMcpServer, task_id: &str) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for word in std::iter::once(&s.command).chain(&s.args) {
        h.update((word.len() as u64).to_le_bytes());
        h.update(word.as_bytes());
    }
    for (k, v) in &s.env {
        h.update((k.len() as u64).to_le_bytes());
        h.update(k.as_bytes());
        h.update((v.len() as u64).to_le_bytes());
        h.update(v.as_bytes());
    }
    format!("{AGENT_SLOT_PREFIX}{}:{}:{task_id}", s.name, hex::encode(h.finalize()))
}

/// The [`StdioKey`] of agent-defined server `s` in `site`'s session and task (as
/// [`StdioUse::key`] gives it), or why its entry cannot run.
fn agent_key(s: &AgentMcpServer, site: &SessionSite<'_>) -> Result<StdioKey, String> {
    let config = crate::config::mcp::agent_server_config(s)?;
    Ok(StdioUse::agent(s, &config, AgentStart::IfRunning, site).key(site)?.0)
}

/// One use of a stdio server: the server (its name in tool names and its entry), the
/// session's process slot that runs it, whether this use may start it, and whether it is
/// agent-defined (then started owned and ended with its task, see [`McpTools::end_task`]).
struct StdioUse<'a> {
    name: &'a str,
    config: &'a McpServerConfig,
    slot: String,
    start: AgentStart,
    agent_defined: bool,
}

impl<'a> StdioUse<'a> {
    /// An operator's server: its slot is its name, and any use may start it.
    fn operator(name: &'a str, config: &'a McpServerConfig) -> Self {
        StdioUse { name, config, slot: name.to_owned(), start: AgentStart::MayStart, agent_defined: false }
    }

    /// The subagent's own server `s` (as the entry `config`) in `site`'s task.
    fn agent(s: &'a AgentMcpServer, config: &'a McpServerConfig, start: AgentStart, site: &SessionSite<'_>) -> Self {
        StdioUse { name: &s.name, config, slot: agent_slot(s, site.task_id), start, agent_defined: true }
    }

    /// The process this use may use at `site` ([`StdioKey`]: its slot and the fingerprint
    /// of the task's secrets its `env` takes), and the environment a new one starts with;
    /// `Err` when the task lacks a secret the `env` names.
    fn key(&self, site: &SessionSite<'_>) -> Result<(StdioKey, Vec<(String, String)>), String> {
        let Ok(McpTransport::Stdio { env, .. }) = self.config.transport() else {
            return Err(format!("MCP server {:?} is not a stdio server", self.name));
        };
        // An operator's server may name any of the task's secrets; the subagent's own only
        // those the task exports into the sandbox anyway (`tool_context` with `env`).
        let taken = if self.agent_defined { site.exported } else { site.secrets };
        let (env, secrets) = expand_env(self.name, env, taken)?;
        let key = StdioKey {
            user: site.key.user_id.clone(),
            session: site.key.session_id.clone(),
            slot: self.slot.clone(),
            secrets,
        };
        Ok((key, env))
    }
}

/// The command line that starting an agent-defined server amounts to, as the approval gate
/// judges it (`Bash`): its environment as `NAME=value` assignments, then the program and
/// its arguments, each word shell-quoted so the gate's parser reads back exactly the argv
/// that runs. `None` when a word cannot be quoted (a NUL byte; the registry refuses those).
pub fn agent_server_command(s: &AgentMcpServer) -> Option<String> {
    let mut words = Vec::with_capacity(s.env.len() + 1 + s.args.len());
    for (k, v) in &s.env {
        words.push(format!("{k}={}", shlex::try_quote(v).ok()?));
    }
    for word in std::iter::once(&s.command).chain(&s.args) {
        words.push(shlex::try_quote(word).ok()?.into_owned());
    }
    Some(words.join(" "))
}

/// The configured MCP servers, connected lazily.
pub struct McpTools {
    servers: BTreeMap<String, Server>,
    http: reqwest::Client,
    /// Stdio processes by session; a dead one is replaced on its next use, and entries
    /// of dead processes are dropped whenever a session starts one.
    stdio: std::sync::Mutex<HashMap<StdioKey, Arc<Mutex<Option<StdioConn>>>>>,
    /// Agent-defined servers whose start the gate declined, per task (cleared when the
    /// task ends): a plugin listing its tools again is not a new question.
    declined: std::sync::Mutex<std::collections::HashSet<StdioKey>>,
    /// Bound on a result's text: `sandbox.max_output`, as for every other tool's output.
    max_output: usize,
    /// [`MCP_LIST_DEADLINE`] (shorter in tests).
    list_deadline: Duration,
}

/// A tool offered to a subagent.
pub struct McpToolSpec {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

/// Whether a stdio server that does not run in the session may be started by this use.
/// The operator's servers always may (configuring one is the operator's approval); a
/// subagent's own server only when the approval gate allowed its command for this use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentStart {
    /// Start it if it does not run.
    MayStart,
    /// Use it only if it already runs in the session (no start was approved for this use,
    /// or none was needed: it runs).
    IfRunning,
}

/// Where a stdio server of a call runs: the session's sandbox, with the task's secrets;
/// the task (its id and egress narrowing) an agent-defined server belongs to.
pub struct SessionSite<'a> {
    pub sandbox: &'a Arc<Sandbox>,
    pub key: &'a SessionKey,
    /// Every `tool_context` entry by variable name (an operator's server's `${NAME}`).
    pub secrets: &'a [(String, String)],
    /// The entries the task exports into the sandbox (an agent-defined server's `${NAME}`).
    pub exported: &'a [(String, String)],
    pub task_id: &'a str,
    pub egress: &'a [Arc<warden_sandbox::EgressNarrowing>],
}

impl McpTools {
    pub fn new(config: &BTreeMap<String, McpServerConfig>) -> Self {
        let servers = config
            .iter()
            .map(|(name, c)| {
                let server = Server {
                    name: name.clone(),
                    config: c.clone(),
                    state: Default::default(),
                    failed: Default::default(),
                };
                (name.clone(), server)
            })
            .collect();
        // No redirects (a server could send the bearer token's request elsewhere), no
        // environment proxy: the shared hardening of every outbound client.
        let http = crate::http_client::builder().build().expect("an HTTP client without a resolver always builds");
        McpTools {
            servers,
            http,
            stdio: Default::default(),
            declined: Default::default(),
            max_output: warden_sandbox::config::DEFAULT_MAX_OUTPUT.0 as usize,
            list_deadline: MCP_LIST_DEADLINE,
        }
    }

    /// Cuts every result's text to `max_output` bytes (the operator's `sandbox.max_output`).
    pub fn with_max_output(mut self, max_output: u64) -> Self {
        self.max_output = usize::try_from(max_output).unwrap_or(usize::MAX);
        self
    }

    /// A result as a subagent gets it: its text cut to the output bound of every tool.
    fn bounded(&self, mut result: ToolResult) -> ToolResult {
        result.text = warden_sandbox::cap_text(std::mem::take(&mut result.text), self.max_output);
        result
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Servers visible to a subagent whose definition names `requested` (an agent file's
    /// `mcpServers`) and whose plugin has `grants`: those it names or that are configured
    /// for all agents, and of them only those the plugin is granted
    /// ([`Grants::check_mcp_server`]). The one gate of both listing and calling: the plugin
    /// writes `requested`, so the name alone never reaches a server.
    pub fn visible<'a>(&'a self, requested: &'a [String], grants: &'a Grants) -> impl Iterator<Item = &'a str> + 'a {
        self.servers
            .iter()
            .filter(move |(name, s)| s.config.all_agents || requested.iter().any(|r| r == *name))
            .filter(move |(name, _)| grants.check_mcp_server(name).is_ok())
            .map(|(n, _)| n.as_str())
    }

    /// Tools of the servers [`Self::visible`] to a definition naming `requested` of a plugin
    /// with `grants`, and of `agent` (the subagent's own servers, each with
    /// whether it may be started: see [`AgentStart`]), named `mcp__<server>__<tool>`. A
    /// server that cannot be reached is skipped with a warning: the subagent still gets its
    /// other tools. `site` is the session whose stdio servers are listed (each started there
    /// if it does not run yet and may start); without one a stdio server is skipped.
    pub async fn list(
        &self,
        requested: &[String],
        grants: &Grants,
        agent: &[(&AgentMcpServer, AgentStart)],
        site: Option<&SessionSite<'_>>,
    ) -> Vec<McpToolSpec> {
        let mut out: Vec<McpToolSpec> = vec![];
        // Asked together: a slow server delays nobody's listing beyond its own deadline
        // (MCP_LIST_DEADLINE for an HTTP server, STDIO_START_TIMEOUT for a stdio one).
        let names: Vec<&str> = self.visible(requested, grants).collect();
        let operator = futures_util::future::join_all(names.iter().map(|name| self.tools_of(name, site)));
        let own = futures_util::future::join_all(agent.iter().map(|(s, start)| self.agent_tools_of(s, *start, site)));
        let (operator, own) = tokio::join!(operator, own);
        let listed = names.into_iter().zip(operator).chain(agent.iter().map(|(s, _)| s.name.as_str()).zip(own));
        for (name, listed) in listed {
            match listed {
                Ok(tools) if out.len() + tools.len() > MAX_MCP_TOOLS => {
                    tracing::warn!(
                        server = name,
                        tools = tools.len(),
                        offered = out.len(),
                        "MCP server's tools not offered: with them a subagent would get more than {MAX_MCP_TOOLS} MCP tools"
                    );
                }
                Ok(tools) => out.extend(tools.iter().filter_map(|t| {
                    // The name the gate and the operator's rules see is exactly the server
                    // and tool a call reaches: a tool whose name would have to be rewritten
                    // (or would read as another server's) is not offered.
                    let full = match warden_mcp_protocol::checked_tool_name(name, &t.name) {
                        Ok(full) => full,
                        Err(e) => {
                            let tool = crate::text::escape_control(&t.name.chars().take(100).collect::<String>())
                                .into_owned();
                            tracing::warn!(server = name, tool, error = %e, "MCP tool not offered: its name cannot be mcp__<server>__<tool>");
                            return None;
                        }
                    };
                    // Annotations are bounded by the listing (MAX_TOOL_ANNOTATIONS).
                    let hints = t.annotations.as_ref().map(|a| format!(" [server hints: {a}]")).unwrap_or_default();
                    Some(McpToolSpec {
                        name: full,
                        description: format!("{}{hints}", t.description.as_deref().unwrap_or_default()),
                        input_schema: t.input_schema.clone(),
                    })
                })),
                Err(e) => {
                    tracing::warn!(server = name, error = %e, "MCP server unavailable; its tools are not offered")
                }
            }
        }
        out
    }

    /// Calls `mcp__<server>__<tool>` with `arguments` for a definition naming `requested`
    /// of a plugin with `grants`: only a server [`Self::visible`] to it. The caller has
    /// already passed the gate. A stdio server runs at `site` (started, or restarted after
    /// it died, as needed).
    pub async fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: Value,
        requested: &[String],
        grants: &Grants,
        site: Option<&SessionSite<'_>>,
    ) -> Result<ToolResult, String> {
        let s = self.servers.get(server).ok_or_else(|| format!("no MCP server named {server:?} is configured"))?;
        if !self.visible(requested, grants).any(|v| v == server) {
            let why = match grants.check_mcp_server(server) {
                Err(denied) => denied.to_string(),
                Ok(()) => "the subagent's definition does not name it".into(),
            };
            return Err(format!("MCP server {server:?} is not available to this subagent: {why}"));
        }
        // Only names the gate could have judged as this server's tool (see `list`).
        warden_mcp_protocol::checked_tool_name(server, tool).map_err(|e| format!("tool {tool:?}: {e}"))?;
        if let Ok(McpTransport::Stdio { .. }) = s.config.transport() {
            let site =
                site.ok_or_else(|| format!("MCP server {server:?} runs in a sandbox session, and this call has none"))?;
            return self.call_stdio(&StdioUse::operator(server, &s.config), tool, arguments, site).await;
        }
        self.ensure_connected(s).await?;
        let result = match self.call_http(s, tool, arguments.clone()).await {
            // The server forgot the session (it restarted): negotiate again, once, and retry.
            Err((McpError::SessionExpired, epoch)) => {
                {
                    let mut state = s.state.lock().unwrap_or_else(|e| e.into_inner());
                    if state.as_ref().is_some_and(|c| Some(c.epoch) == epoch) {
                        *state = None;
                    }
                }
                tracing::info!(server, "MCP session expired; negotiating a new one");
                self.ensure_connected(s).await?;
                self.call_http(s, tool, arguments).await.map_err(|(e, _)| e)
            }
            other => other.map_err(|(e, _)| e),
        };
        Ok(self.bounded(result.map_err(|e| e.to_string())?))
    }

    /// One `tools/call` on the connected HTTP session; an error comes with the epoch of
    /// the session it used.
    async fn call_http(&self, s: &Server, tool: &str, arguments: Value) -> Result<ToolResult, (McpError, Option<u64>)> {
        let (req, pending, epoch) = {
            let mut guard = s.state.lock().unwrap_or_else(|e| e.into_inner());
            let c = guard.as_mut().ok_or((McpError::Transport("the MCP server is not connected".into()), None))?;
            let (req, pending) = c.session.call_tool(tool, arguments, None).map_err(|e| (e, Some(c.epoch)))?;
            (req, pending, c.epoch)
        };
        let with_epoch = |e| (e, Some(epoch));
        let mut p = self.exchange(&s.config, req, pending).await.map_err(with_epoch)?;
        ToolResult::from_result(p.result().map_err(with_epoch)?).map_err(with_epoch)
    }

    /// Calls `tool` of the subagent's own server `s` at `site`, starting it only when
    /// `start` allows (the caller has already passed the gate for the call).
    pub async fn call_agent_server(
        &self,
        s: &AgentMcpServer,
        start: AgentStart,
        tool: &str,
        arguments: Value,
        site: Option<&SessionSite<'_>>,
    ) -> Result<ToolResult, String> {
        warden_mcp_protocol::checked_tool_name(&s.name, tool).map_err(|e| format!("tool {tool:?}: {e}"))?;
        let config = crate::config::mcp::agent_server_config(s)?;
        let site =
            site.ok_or_else(|| format!("MCP server {:?} runs in a sandbox session, and this call has none", s.name))?;
        self.call_stdio(&StdioUse::agent(s, &config, start, site), tool, arguments, site).await
    }

    /// Ends the agent-defined servers `task_id` started in `key`'s session, each with every
    /// process it started, and forgets its declined starts: nothing a task's own servers
    /// do outlives the task (they would otherwise run beside later tasks' commands).
    pub async fn end_task(&self, sandbox: &Sandbox, key: &SessionKey, task_id: &str) {
        let suffix = format!(":{task_id}");
        let ended: Vec<Arc<Mutex<Option<StdioConn>>>> = {
            let mut map = self.stdio.lock().unwrap_or_else(|e| e.into_inner());
            let keys: Vec<StdioKey> = map
                .keys()
                .filter(|k| {
                    k.user == key.user_id
                        && k.session == key.session_id
                        && k.slot.starts_with(AGENT_SLOT_PREFIX)
                        && k.slot.ends_with(&suffix)
                })
                .cloned()
                .collect();
            keys.iter().filter_map(|k| map.remove(k)).collect()
        };
        self.declined
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k| !(k.user == key.user_id && k.session == key.session_id && k.slot.ends_with(&suffix)));
        for slot in ended {
            let Some(conn) = slot.lock().await.take() else { continue };
            let Some((id, _hold)) = conn.owned else { continue };
            match sandbox.end_process(key, &id).await {
                Ok(true) => {
                    tracing::debug!(task_id, session = %key.session_id, "agent-defined MCP server ended with its task")
                }
                other => tracing::warn!(task_id, session = %key.session_id, result = ?other.map_err(|e| e.to_string()),
                    "agent-defined MCP server could not be ended with its task; it ends with the session"),
            }
        }
    }

    /// Whether starting the subagent's own server `s` was declined earlier in this task
    /// (it is not asked about again until the task ends).
    pub fn agent_server_declined(&self, s: &AgentMcpServer, site: &SessionSite<'_>) -> bool {
        let Ok(key) = agent_key(s, site) else { return false };
        self.declined.lock().unwrap_or_else(|e| e.into_inner()).contains(&key)
    }

    /// Remembers that starting `s` was declined for this task.
    pub fn decline_agent_server(&self, s: &AgentMcpServer, site: &SessionSite<'_>) {
        // An entry without a key cannot start either (its start fails with the reason).
        if let Ok(key) = agent_key(s, site) {
            self.declined.lock().unwrap_or_else(|e| e.into_inner()).insert(key);
        }
    }

    /// Whether the subagent's own server `s` runs in `site`'s session now (started there
    /// before, not seen to have ended): using it then needs no start.
    pub fn agent_server_running(&self, s: &AgentMcpServer, site: &SessionSite<'_>) -> bool {
        let Ok(key) = agent_key(s, site) else { return false };
        let map = self.stdio.lock().unwrap_or_else(|e| e.into_inner());
        // A slot in use (locked) is starting or serving a call: it was allowed to start.
        map.get(&key).is_some_and(|slot| slot.try_lock().map(|c| c.as_ref().is_some_and(|c| !c.dead)).unwrap_or(true))
    }

    async fn agent_tools_of(
        &self,
        s: &AgentMcpServer,
        start: AgentStart,
        site: Option<&SessionSite<'_>>,
    ) -> Result<Arc<[Tool]>, String> {
        let config = crate::config::mcp::agent_server_config(s)?;
        let site =
            site.ok_or_else(|| format!("MCP server {:?} runs in a sandbox session, and there is none", s.name))?;
        let slot = self.stdio_conn(&StdioUse::agent(s, &config, start, site), site).await?;
        let guard = slot.lock().await;
        Ok(guard.as_ref().ok_or("the MCP server is not running")?.tools.clone())
    }

    async fn tools_of(&self, name: &str, site: Option<&SessionSite<'_>>) -> Result<Arc<[Tool]>, String> {
        let s = &self.servers[name];
        if let Ok(McpTransport::Stdio { .. }) = s.config.transport() {
            // The list of the process in this session (started now if need be), never
            // one another session's process gave.
            let site =
                site.ok_or_else(|| format!("MCP server {name:?} runs in a sandbox session, and there is none"))?;
            let slot = self.stdio_conn(&StdioUse::operator(name, &s.config), site).await?;
            let guard = slot.lock().await;
            return Ok(guard.as_ref().ok_or("the MCP server is not running")?.tools.clone());
        }
        self.ensure_connected(s).await?;
        s.known_tools().ok_or_else(|| "the MCP server is not connected".into())
    }

    /// Connects `s` unless it is connected: negotiation and the whole listing within
    /// [`MCP_LIST_DEADLINE`]. A failure is remembered and backed off: until it passes, this
    /// fails at once with the last error. Concurrent first uses may each negotiate (the
    /// last one is kept): no caller waits on another's exchange.
    async fn ensure_connected(&self, s: &Server) -> Result<(), String> {
        if s.known_tools().is_some() {
            return Ok(());
        }
        if let Some(why) = s.backed_off() {
            return Err(why);
        }
        let connected = match tokio::time::timeout(self.list_deadline, self.connect(s)).await {
            Ok(Ok(connected)) => connected,
            Ok(Err(e)) => {
                let e = e.to_string();
                s.record_failure(&e);
                return Err(e);
            }
            Err(_) => {
                let e = format!("the server did not negotiate and list its tools within {:?}", self.list_deadline);
                s.record_failure(&e);
                return Err(e);
            }
        };
        *s.failed.lock().unwrap_or_else(|e| e.into_inner()) = None;
        *s.state.lock().unwrap_or_else(|e| e.into_inner()) = Some(connected);
        Ok(())
    }

    /// The live process of `server` (in its process slot, for the task's secrets: see
    /// [`StdioKey`]) in `site`'s session, started if there is none or the last one died and
    /// the use allows it.
    async fn stdio_conn(
        &self,
        server: &StdioUse<'_>,
        site: &SessionSite<'_>,
    ) -> Result<Arc<Mutex<Option<StdioConn>>>, String> {
        let (key, env) = server.key(site)?;
        let slot = {
            let mut map = self.stdio.lock().unwrap_or_else(|e| e.into_inner());
            // Dead processes (their session ended, or they died) leave the table; a slot
            // in use (locked) stays.
            map.retain(|_, conn| {
                conn.try_lock()
                    .map(|mut c| match c.as_mut() {
                        Some(c) => {
                            c.notice_exit();
                            !c.dead
                        }
                        None => false,
                    })
                    .unwrap_or(true)
            });
            map.entry(key).or_default().clone()
        };
        let mut guard = slot.lock().await;
        if let Some(conn) = guard.as_mut() {
            conn.notice_exit();
        }
        if let Some(conn) = guard.as_ref()
            && conn.dead
        {
            tracing::info!(server = server.name, session = %site.key.session_id, stderr = %last_line(&conn.stderr.text()), "MCP stdio server ended; starting it again");
            *guard = None;
        }
        if guard.is_none() {
            if server.start == AgentStart::IfRunning {
                return Err(format!(
                    "MCP server {:?} does not run in this session (it ended or never started), and starting it \
                     was not approved for this use; it is asked about again when the subagent next lists its tools",
                    server.name
                ));
            }
            *guard = Some(self.start_stdio(server, &env, site).await?);
        }
        drop(guard);
        Ok(slot)
    }

    /// Starts `server`'s process with the environment `env` (its `env` expanded for the
    /// task: [`StdioUse::key`]); an agent-defined one owned: ended with its task.
    async fn start_stdio(
        &self,
        server: &StdioUse<'_>,
        env: &[(String, String)],
        site: &SessionSite<'_>,
    ) -> Result<StdioConn, String> {
        let (agent_defined, config, server) = (server.agent_defined, server.config, server.name);
        let Ok(McpTransport::Stdio { command, args, .. }) = config.transport() else {
            return Err(format!("MCP server {server:?} is not a stdio server"));
        };
        let argv: Vec<String> = std::iter::once(command.to_owned()).chain(args.iter().cloned()).collect();
        let (process, owned) = if agent_defined {
            // Held before it starts: it never runs wider than its task, not even at start.
            let hold = site.sandbox.hold_egress(site.key, site.egress).await.map_err(|e| e.to_string())?;
            let (process, id) =
                site.sandbox.spawn_owned_process(site.key, &argv, env).await.map_err(|e| e.to_string())?;
            (process, Some((id, hold)))
        } else {
            (site.sandbox.spawn_process(site.key, &argv, env).await.map_err(|e| e.to_string())?, None)
        };
        let settler = process.settler();
        let mut conn = StdioConn {
            owned,
            session: Session::new(ClientInfo { name: "warden".into(), version: env!("CARGO_PKG_VERSION").into() }),
            tools: Arc::new([]),
            stderr: process.stderr_handle(),
            stdin: process.stdin,
            stdout: BufReader::new(process.stdout),
            dead: false,
        };
        match tokio::time::timeout(STDIO_START_TIMEOUT, conn.start(server)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                return Err(format!(
                    "MCP server {server:?} did not start ({e}); its stderr: {}",
                    last_line(&conn.stderr.text())
                ));
            }
            Err(_) => return Err(format!("MCP server {server:?} did not answer within {STDIO_START_TIMEOUT:?}")),
        }
        // Its steady state, before any tool call: what it starts from now on is killed before
        // every command of the session starts. Not contained, it is not used (dropped: its
        // stdin closes).
        settler
            .settle()
            .await
            .map_err(|e| format!("MCP server {server:?} could not be settled in the sandbox: {e}"))?;
        tracing::info!(server, session = %site.key.session_id, tools = conn.tools.len(), "MCP stdio server started in the session's sandbox");
        Ok(conn)
    }

    async fn call_stdio(
        &self,
        server: &StdioUse<'_>,
        tool: &str,
        arguments: Value,
        site: &SessionSite<'_>,
    ) -> Result<ToolResult, String> {
        let slot = self.stdio_conn(server, site).await?;
        let server = server.name;
        let mut guard = slot.lock().await;
        let conn = guard.as_mut().ok_or("the MCP server is not running")?;
        let (req, pending) = conn.session.call_tool(tool, arguments, None).map_err(|e| e.to_string())?;
        let answered = tokio::time::timeout(MCP_REQUEST_TIMEOUT, conn.exchange(req, pending)).await;
        // Nothing a call starts outlives it: what the server started for this call (and
        // left running) is killed now, not at the session's next command.
        if let Err(e) = site.sandbox.contain(site.key).await {
            tracing::warn!(server, error = %e, "could not end what the MCP call started");
        }
        let result = match answered {
            Ok(Ok(mut p)) => p.result(),
            Ok(Err(e)) => Err(e),
            Err(_) => {
                // Its late reply would be read as the next call's: start over instead.
                conn.dead = true;
                return Err(format!("MCP server {server:?} did not answer within {MCP_REQUEST_TIMEOUT:?}"));
            }
        };
        let result =
            result.map_err(|e| format!("MCP server {server:?}: {e} (stderr: {})", last_line(&conn.stderr.text())))?;
        Ok(self.bounded(ToolResult::from_result(result).map_err(|e| e.to_string())?))
    }

    async fn connect(&self, s: &Server) -> Result<Connected, McpError> {
        let mut session = Session::new(ClientInfo { name: "warden".into(), version: env!("CARGO_PKG_VERSION").into() });
        let mut next = Some(session.connect());
        while let Some((req, pending)) = next {
            let p = self.exchange(&s.config, req, pending).await?;
            next = session.advance(p)?;
        }
        let mut listing = Listing::new(ListLimits::default());
        let mut cursor: Option<String> = None;
        loop {
            let (req, mut pending) = session.list_tools(cursor.as_deref())?;
            pending.limit_bytes(listing.remaining_bytes());
            let mut p = self.exchange(&s.config, req, pending).await?;
            cursor = listing.add(p.body_bytes(), p.result()?)?;
            if cursor.is_none() {
                break;
            }
        }
        let tools = listed(&s.name, listing);
        Ok(Connected { session, tools, epoch: EPOCH.fetch_add(1, Ordering::Relaxed) })
    }

    /// Sends one request and feeds the response into `pending` until it is complete.
    async fn exchange(
        &self,
        config: &McpServerConfig,
        req: HttpRequest,
        mut pending: Pending,
    ) -> Result<Pending, McpError> {
        let method = reqwest::Method::from_bytes(req.method.as_bytes()).unwrap_or(reqwest::Method::POST);
        let url = config.url.as_deref().ok_or_else(|| McpError::Transport("not an HTTP server".into()))?;
        let mut rb = self.http.request(method, url).timeout(MCP_REQUEST_TIMEOUT);
        for (k, v) in &req.headers {
            rb = rb.header(k, v);
        }
        if let Some(env) = &config.auth_env {
            let token = std::env::var(env).map_err(|_| {
                McpError::Transport(format!("environment variable {env} (mcp_servers auth_env) is not set"))
            })?;
            rb = rb.bearer_auth(token);
        }
        if let Some(body) = req.body {
            rb = rb.body(body);
        }
        let mut resp = rb.send().await.map_err(|e| McpError::Transport(e.to_string()))?;
        let headers: Vec<(String, String)> =
            resp.headers().iter().filter_map(|(k, v)| v.to_str().ok().map(|v| (k.to_string(), v.to_owned()))).collect();
        pending.begin(resp.status().as_u16(), &headers);
        let mut read = 0usize;
        while !pending.is_done() {
            match resp.chunk().await.map_err(|e| McpError::Transport(e.to_string()))? {
                Some(chunk) => {
                    read += chunk.len();
                    if read > MAX_MCP_RESPONSE {
                        return Err(McpError::Transport(format!("response exceeds {MAX_MCP_RESPONSE} bytes")));
                    }
                    pending.feed(&chunk);
                }
                None => break,
            }
        }
        pending.finish();
        Ok(pending)
    }
}

impl StdioConn {
    /// Marks the process dead if its stdout already ended (it exited or was killed since
    /// the last call), without waiting: the call then goes to a new process instead of
    /// failing on the old one.
    fn notice_exit(&mut self) {
        use futures_util::FutureExt;
        use tokio::io::AsyncBufReadExt;
        match self.stdout.fill_buf().now_or_never() {
            Some(Ok([])) | Some(Err(_)) => self.dead = true,
            _ => {}
        }
    }

    /// Negotiates the revision (2026-07-28 `server/discover`, else the handshake) and
    /// lists the tools.
    async fn start(&mut self, server: &str) -> Result<(), McpError> {
        let mut next = Some(self.session.connect());
        while let Some((req, pending)) = next {
            let p = self.exchange(req, pending).await?;
            next = self.session.advance(p)?;
        }
        let mut listing = Listing::new(ListLimits::default());
        let mut cursor: Option<String> = None;
        loop {
            let (req, mut pending) = self.session.list_tools(cursor.as_deref())?;
            pending.limit_bytes(listing.remaining_bytes());
            let mut p = self.exchange(req, pending).await?;
            cursor = listing.add(p.body_bytes(), p.result()?)?;
            if cursor.is_none() {
                break;
            }
        }
        self.tools = listed(server, listing);
        Ok(())
    }

    /// Writes one message and reads lines until its reply (a notification needs none).
    /// The server's own requests are answered (`ping`) or refused, so it never waits on
    /// us; a broken or ended stream marks the process dead.
    async fn exchange(&mut self, req: HttpRequest, mut pending: Pending) -> Result<Pending, McpError> {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt};
        let Some(mut body) = req.body else { return Ok(pending) };
        body.push(b'\n');
        if let Err(e) = self.send(&body).await {
            return Err(McpError::Transport(format!("cannot write to the server: {e}")));
        }
        pending.begin_messages();
        // One message (a line) is held to the request's reply bound (a listing page, a result).
        let max = pending.max_bytes();
        let mut line = Vec::new();
        while !pending.is_done() {
            line.clear();
            match (&mut self.stdout).take(max as u64 + 2).read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => {
                    self.dead = true;
                    pending.finish();
                    break;
                }
                Ok(_) if line.strip_suffix(b"\n").unwrap_or(&line).len() > max => {
                    // The rest of the line is still unread: the stream cannot be used again.
                    self.dead = true;
                    return Err(McpError::TooLarge { what: "message".into(), limit: max });
                }
                Ok(_) => {}
            }
            for update in pending.feed(line.strip_suffix(b"\n").unwrap_or(&line)) {
                if let Update::ServerRequest { id, method } = update {
                    let reply = if method == "ping" {
                        serde_json::json!({"jsonrpc": "2.0", "id": id, "result": {}})
                    } else {
                        serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "warden does not serve this request"}})
                    };
                    let mut reply = reply.to_string().into_bytes();
                    reply.push(b'\n');
                    // A failure marks the process dead; the reply we wait for decides the call.
                    let _ = self.send(&reply).await;
                }
            }
        }
        Ok(pending)
    }

    async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        let sent = async {
            self.stdin.write_all(bytes).await?;
            self.stdin.flush().await
        };
        let r = sent.await;
        if r.is_err() {
            self.dead = true;
        }
        r
    }
}

/// A finished listing's tools; what it left out is logged (names escaped by the listing).
fn listed(server: &str, listing: Listing) -> Arc<[Tool]> {
    let (tools, warnings) = listing.finish();
    for warning in warnings {
        tracing::warn!(server, "MCP listing: {warning}");
    }
    tools.into()
}

/// The last non-empty line of a process's stderr (its usual last words), bounded and escaped.
fn last_line(stderr: &str) -> String {
    let line = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("(nothing)");
    crate::text::escape_control(&line.chars().take(300).collect::<String>()).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every configured server granted: what the tests of the client itself use (the grant
    /// has its own tests below).
    fn every_server(mcp: &McpTools) -> Grants {
        let grant =
            crate::capability::GrantConfig { mcp_servers: mcp.servers.keys().cloned().collect(), ..Default::default() };
        Grants::new("test", &[], Some(&grant)).unwrap()
    }

    impl McpTools {
        /// [`McpTools::list`] of every server (`all_agents`, all granted), outside any session.
        async fn list_all(&self) -> Vec<McpToolSpec> {
            self.list(&[], &every_server(self), &[], None).await
        }

        /// [`McpTools::call`] with every server granted, outside any session.
        async fn call_any(&self, server: &str, tool: &str, arguments: Value) -> Result<ToolResult, String> {
            let grants = every_server(self);
            self.call(server, tool, arguments, &[], &grants, None).await
        }
    }

    /// A streamable-HTTP MCP server (handshake era) with one tool, `slow`, that answers
    /// after `delay`; `/moved` redirects to `/mcp` of `target`. Counts the requests it got.
    async fn mcp_server(
        delay: Duration,
        target: Option<std::net::SocketAddr>,
    ) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        use axum::http::{StatusCode, header};
        use axum::response::IntoResponse;
        let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = hits.clone();
        let handler = move |axum::Json(m): axum::Json<Value>| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                let id = m.get("id").cloned();
                let result = match m["method"].as_str().unwrap_or("") {
                    "initialize" => serde_json::json!({"protocolVersion": "2025-06-18",
                        "capabilities": {"tools": {}}, "serverInfo": {"name": "t", "version": "1"}}),
                    "tools/list" => serde_json::json!({"tools": [{"name": "slow", "inputSchema": {"type": "object"}}]}),
                    "tools/call" => {
                        tokio::time::sleep(delay).await;
                        serde_json::json!({"content": [{"type": "text", "text": "done"}]})
                    }
                    _ if id.is_none() => return StatusCode::ACCEPTED.into_response(),
                    _ => {
                        let e = serde_json::json!({"code": -32601, "message": "no such method"});
                        return axum::Json(serde_json::json!({"jsonrpc": "2.0", "id": id, "error": e})).into_response();
                    }
                };
                axum::Json(serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result})).into_response()
            }
        };
        let moved = move || async move {
            let to = format!("http://{}/mcp", target.expect("a redirect target"));
            (StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, to)]).into_response()
        };
        let app =
            axum::Router::new().route("/mcp", axum::routing::post(handler)).route("/moved", axum::routing::post(moved));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (addr, hits)
    }

    /// A streamable-HTTP MCP server (handshake era) whose `tools/list` and `tools/call`
    /// results are the JSON text `answer` gives for (method, params), sent as is (a hostile
    /// body need not be built as a `Value` first); each page of `tools/list` after
    /// `list_delay`. Counts the requests it got.
    async fn scripted(
        list_delay: Duration,
        answer: impl Fn(&str, &Value) -> String + Clone + Send + Sync + 'static,
    ) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        use axum::http::{StatusCode, header};
        use axum::response::IntoResponse;
        let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = hits.clone();
        let handler = move |axum::Json(m): axum::Json<Value>| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let answer = answer.clone();
            async move {
                let Some(id) = m.get("id").cloned() else { return StatusCode::ACCEPTED.into_response() };
                let method = m["method"].as_str().unwrap_or("").to_owned();
                let result = match method.as_str() {
                    "initialize" => serde_json::json!({"protocolVersion": "2025-06-18",
                        "capabilities": {"tools": {}}, "serverInfo": {"name": "t", "version": "1"}})
                    .to_string(),
                    "tools/list" => {
                        tokio::time::sleep(list_delay).await;
                        answer(&method, &m["params"])
                    }
                    "tools/call" => answer(&method, &m["params"]),
                    _ => {
                        let e = serde_json::json!({"code": -32601, "message": "no such method"});
                        return axum::Json(serde_json::json!({"jsonrpc": "2.0", "id": id, "error": e})).into_response();
                    }
                };
                let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#);
                ([(header::CONTENT_TYPE, "application/json")], body).into_response()
            }
        };
        let app = axum::Router::new().route("/mcp", axum::routing::post(handler));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (addr, hits)
    }

    fn names(specs: &[McpToolSpec]) -> Vec<&str> {
        specs.iter().map(|t| t.name.as_str()).collect()
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn regression_an_mcp_tools_page_of_small_objects_exhausted_host_memory() {
        // 2 MiB of `{"":0}` objects: within every byte bound, but ~200 MiB once parsed into
        // a `Value` (then cloned twice). Refused unparsed; the other server is unaffected.
        let objects = vec![r#"{"":0}"#; 300_000].join(",");
        let bomb = format!(r#"{{"tools":[{{"name":"t","inputSchema":{{"type":"object","x":[{objects}]}}}}]}}"#);
        let result = format!(r#"{{"content":[{{"type":"text","text":"x"}}],"structuredContent":{{"x":[{objects}]}}}}"#);
        let (hostile, _) = scripted(Duration::ZERO, move |method, _| match method {
            "tools/list" => bomb.clone(),
            _ => result.clone(),
        })
        .await;
        let (fine, _) = mcp_server(Duration::ZERO, None).await;
        let mcp = http_servers(&[("hostile", format!("http://{hostile}/mcp")), ("fine", format!("http://{fine}/mcp"))]);
        assert_eq!(names(&mcp.list_all().await), ["mcp__fine__slow"]);
        // The same page in a tool result is refused too (the listing of this server failed,
        // so a second one that lists fine answers the call with the bomb).
        let (caller, _) = scripted(Duration::ZERO, {
            let result = format!(r#"{{"content":[],"structuredContent":{{"x":[{objects}]}}}}"#);
            move |method, _| match method {
                "tools/list" => r#"{"tools":[{"name":"t"}]}"#.to_owned(),
                _ => result.clone(),
            }
        })
        .await;
        let mcp = http_servers(&[("caller", format!("http://{caller}/mcp"))]);
        let e = mcp.call_any("caller", "t", serde_json::json!({})).await.unwrap_err();
        assert!(e.contains("memory parsed"), "{e}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn regression_mcp_tool_listings_were_unbounded_in_count_size_and_names() {
        // Server `a`: 200 tools, `t0` twice, a 10 KiB description, a 100 KiB schema, 1 KiB
        // of annotations; `b`: 200 plain tools; `c`: 5 tools. Before: all 405 offered (over
        // the 512 a model request takes once two more such servers were added; Anthropic
        // refuses a duplicate name).
        let tool = |name: &str| serde_json::json!({"name": name, "inputSchema": {"type": "object"}});
        let mut a: Vec<Value> = vec![tool("t0"), tool("t0")];
        a.push(serde_json::json!({"name": "t1", "description": "d".repeat(10 * 1024)}));
        a.push(
            serde_json::json!({"name": "t2", "inputSchema": {"type": "object", "description": "s".repeat(100 * 1024)}}),
        );
        a.push(serde_json::json!({"name": "t3", "annotations": {"readOnlyHint": true, "x": "a".repeat(1024)}}));
        a.extend((4..200).map(|i| tool(&format!("t{i}"))));
        let b: Vec<Value> = (0..200).map(|i| tool(&format!("b{i}"))).collect();
        let c: Vec<Value> = (0..5).map(|i| tool(&format!("c{i}"))).collect();
        let mut servers = vec![];
        for (name, tools) in [("a", a), ("b", b), ("c", c)] {
            let page = serde_json::json!({ "tools": tools }).to_string();
            let (addr, _) = scripted(Duration::ZERO, move |_, _| page.clone()).await;
            servers.push((name, format!("http://{addr}/mcp")));
        }
        let mcp = http_servers(&servers);
        let listed = mcp.list_all().await;
        let of = |server: &str| listed.iter().filter(|t| t.name.starts_with(&format!("mcp__{server}__"))).count();
        let per_server = warden_mcp_protocol::limits::MAX_LIST_TOOLS;
        assert_eq!((of("a"), of("b"), of("c")), (per_server, per_server, 0), "c would pass MAX_MCP_TOOLS");
        assert_eq!(listed.len(), MAX_MCP_TOOLS);
        let unique: std::collections::HashSet<&str> = names(&listed).into_iter().collect();
        assert_eq!(unique.len(), listed.len(), "no name offered twice");
        let find = |name: &str| listed.iter().find(|t| t.name == name);
        assert!(find("mcp__a__t2").is_none(), "a schema over the bound is not offered");
        let t1 = find("mcp__a__t1").expect("a long description is cut, the tool kept");
        assert!(t1.description.len() <= warden_mcp_protocol::limits::MAX_TOOL_DESCRIPTION, "{}", t1.description.len());
        let t3 = find("mcp__a__t3").expect("oversized annotations are dropped, the tool kept");
        assert!(!t3.description.contains("server hints"), "{}", t3.description);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn regression_an_mcp_result_bypassed_the_output_bound() {
        let text = "y".repeat(1024 * 1024);
        let (addr, _) = scripted(Duration::ZERO, move |method, _| match method {
            "tools/list" => r#"{"tools":[{"name":"big"}]}"#.to_owned(),
            _ => serde_json::json!({"content": [{"type": "text", "text": text}]}).to_string(),
        })
        .await;
        let mcp = http_servers(&[("s", format!("http://{addr}/mcp"))]).with_max_output(4096);
        let r = mcp.call_any("s", "big", serde_json::json!({})).await.unwrap();
        assert!(r.text.len() <= 4096, "{}", r.text.len());
        assert!(r.text.contains("bytes truncated"), "the cut is stated");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn regression_one_stalled_mcp_server_failed_every_task() {
        // Every page comes just in time with a fresh cursor: each exchange is within its own
        // timeout, the listing as a whole never ends (50 pages × the delay).
        let page = std::sync::atomic::AtomicUsize::new(0);
        let page = Arc::new(page);
        let (stalled, hits) = scripted(Duration::from_millis(400), move |_, _| {
            let n = page.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            format!(r#"{{"tools":[{{"name":"t{n}"}}],"nextCursor":"c{n}"}}"#)
        })
        .await;
        let (fine, _) = mcp_server(Duration::ZERO, None).await;
        let mut mcp =
            http_servers(&[("stalled", format!("http://{stalled}/mcp")), ("fine", format!("http://{fine}/mcp"))]);
        mcp.list_deadline = Duration::from_secs(2);
        let first = tokio::time::timeout(Duration::from_secs(10), mcp.list_all())
            .await
            .expect("the listing ends at the server's deadline, not after all its pages");
        assert_eq!(names(&first), ["mcp__fine__slow"]);
        // The failure is remembered: the next task's listing does not ask the server again.
        let asked = hits.load(std::sync::atomic::Ordering::SeqCst);
        let second = tokio::time::timeout(Duration::from_secs(1), mcp.list_all())
            .await
            .expect("a backed-off server costs a listing nothing");
        assert_eq!(names(&second), ["mcp__fine__slow"]);
        let e = mcp.call_any("stalled", "t0", serde_json::json!({})).await.unwrap_err();
        assert!(e.contains("not retried"), "{e}");
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), asked, "nothing sent while backed off");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn regression_an_expired_mcp_session_failed_every_later_call() {
        // A handshake-era server that forgets its sessions when it restarts (`generation`
        // moves on): a request with an old `Mcp-Session-Id` gets 404.
        use axum::http::{HeaderMap, StatusCode};
        use axum::response::IntoResponse;
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        let generation = Arc::new(AtomicUsize::new(0));
        let initialized = Arc::new(AtomicUsize::new(0));
        let (g, inits) = (generation.clone(), initialized.clone());
        let handler = move |headers: HeaderMap, axum::Json(m): axum::Json<Value>| {
            let (g, inits) = (g.clone(), inits.clone());
            async move {
                let current = format!("s{}", g.load(SeqCst));
                let method = m["method"].as_str().unwrap_or("").to_owned();
                if method == "initialize" {
                    inits.fetch_add(1, SeqCst);
                    let result = serde_json::json!({"protocolVersion": "2025-06-18",
                        "capabilities": {"tools": {}}, "serverInfo": {"name": "t", "version": "1"}});
                    let body = serde_json::json!({"jsonrpc": "2.0", "id": m["id"], "result": result});
                    return ([("mcp-session-id", current)], axum::Json(body)).into_response();
                }
                if method == "server/discover" {
                    let e = serde_json::json!({"code": -32601, "message": "no such method"});
                    return axum::Json(serde_json::json!({"jsonrpc": "2.0", "id": m["id"], "error": e}))
                        .into_response();
                }
                if headers.get("mcp-session-id").and_then(|v| v.to_str().ok()) != Some(current.as_str()) {
                    return StatusCode::NOT_FOUND.into_response();
                }
                let result = match method.as_str() {
                    "tools/list" => serde_json::json!({"tools": [{"name": "echo"}]}),
                    "tools/call" => serde_json::json!({"content": [{"type": "text", "text": current}]}),
                    _ => return StatusCode::ACCEPTED.into_response(),
                };
                axum::Json(serde_json::json!({"jsonrpc": "2.0", "id": m["id"], "result": result})).into_response()
            }
        };
        let app = axum::Router::new().route("/mcp", axum::routing::post(handler));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let mcp = http_servers(&[("s", format!("http://{addr}/mcp"))]);
        let call = || mcp.call_any("s", "echo", serde_json::json!({}));
        assert_eq!(call().await.unwrap().text, "s0");
        generation.store(1, SeqCst); // the server restarted
        assert_eq!(call().await.expect("a new session is negotiated and the call retried").text, "s1");
        assert_eq!(call().await.unwrap().text, "s1");
        assert_eq!(initialized.load(SeqCst), 2, "one negotiation per session");
    }

    fn http_servers(servers: &[(&str, String)]) -> McpTools {
        let config = servers
            .iter()
            .map(|(name, url)| {
                let c = McpServerConfig { url: Some(url.clone()), all_agents: true, ..Default::default() };
                (name.to_string(), c)
            })
            .collect();
        McpTools::new(&config)
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn regression_a_slow_call_held_the_servers_lock_and_wedged_every_listing() {
        let (slow, _) = mcp_server(Duration::from_secs(20), None).await;
        let (fast, _) = mcp_server(Duration::ZERO, None).await;
        let mcp =
            Arc::new(http_servers(&[("slow", format!("http://{slow}/mcp")), ("fast", format!("http://{fast}/mcp"))]));
        assert_eq!(mcp.list_all().await.len(), 2, "both servers listed");
        let call = tokio::spawn({
            let mcp = mcp.clone();
            async move { mcp.call_any("slow", "slow", serde_json::json!({})).await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        // While the call waits on the slow server, its tools (and the other server's) list
        // at once, and the other server answers calls.
        let listed = tokio::time::timeout(Duration::from_secs(5), mcp.list_all()).await;
        assert_eq!(listed.expect("listing does not wait for the slow call").len(), 2);
        let other = tokio::time::timeout(Duration::from_secs(5), mcp.call_any("fast", "slow", serde_json::json!({})));
        assert_eq!(other.await.expect("the other server answers").unwrap().text, "done");
        call.abort();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn regression_tool_names_were_rewritten_into_other_names() {
        // `a.b` became `a_b` (another tool's name), `x__y` read as server `srv` tool `x__y`
        // of a server `srv__x`; such tools are not offered nor called.
        use axum::response::IntoResponse;
        let tools: Vec<Value> = ["ok", "a.b", "x__y", "_lead", "../etc", &"n".repeat(64)]
            .iter()
            .map(|n| serde_json::json!({"name": n, "inputSchema": {"type": "object"}}))
            .collect();
        let app = axum::Router::new().route(
            "/mcp",
            axum::routing::post(move |axum::Json(m): axum::Json<Value>| {
                let tools = tools.clone();
                async move {
                    let id = m.get("id").cloned();
                    let result = match m["method"].as_str().unwrap_or("") {
                        "initialize" => serde_json::json!({"protocolVersion": "2025-06-18",
                            "capabilities": {"tools": {}}, "serverInfo": {"name": "t", "version": "1"}}),
                        "tools/list" => serde_json::json!({ "tools": tools }),
                        _ if id.is_none() => return axum::http::StatusCode::ACCEPTED.into_response(),
                        _ => serde_json::json!({"content": [{"type": "text", "text": "ran"}]}),
                    };
                    axum::Json(serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result})).into_response()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let mcp = http_servers(&[("srv", format!("http://{addr}/mcp"))]);
        let names: Vec<String> = mcp.list_all().await.into_iter().map(|t| t.name).collect();
        assert_eq!(names, ["mcp__srv__ok"]);
        assert_eq!(mcp.call_any("srv", "ok", serde_json::json!({})).await.unwrap().text, "ran");
        for bad in ["a.b", "x__y", "a_b_"] {
            assert!(mcp.call_any("srv", bad, serde_json::json!({})).await.is_err(), "{bad}");
        }
    }

    /// Names as a server could choose them: the alphabet's edge cases and separators.
    fn name_part() -> impl proptest::strategy::Strategy<Value = String> {
        proptest::string::string_regex("[a-c_.-]{0,6}|mcp__[a-c_]{0,4}").unwrap()
    }

    #[test]
    fn an_ordinary_agent_server_command_is_one_the_gate_understands() {
        let s = AgentMcpServer {
            name: "x".into(),
            command: "/opt/venv/bin/python".into(),
            args: vec!["/workspace/server.py".into(), "--name".into(), "it's $HOME; rm -rf /".into()],
            env: vec![("TICK".into(), "tock tock".into())],
        };
        let line = agent_server_command(&s).unwrap();
        let warden_approval::shell::Recognition::Understood(cmds) = warden_approval::shell::recognize(&line) else {
            panic!("{line:?} not understood");
        };
        assert_eq!(cmds.len(), 1, "{line}");
        assert_eq!(cmds[0].argv, ["/opt/venv/bin/python", "/workspace/server.py", "--name", "it's $HOME; rm -rf /"]);
        assert_eq!(cmds[0].words[0], "TICK=tock tock", "the environment is part of what an allow rule must name");
    }

    /// Words an agent file could write: shell syntax, quotes, blanks, newlines, non-ASCII.
    fn word() -> impl proptest::strategy::Strategy<Value = String> {
        proptest::string::string_regex("[a-z0-9 $'\"`;|&<>()*?~#=%!{}\\\\\n\t\\[\\]é-]{0,8}").unwrap()
    }

    proptest::proptest! {
        /// The command line the gate judges for an agent-defined server's start is read back
        /// by the gate's own shell parser as exactly the argv that runs (the program is
        /// started with that argv, no shell): never another program or other arguments. A
        /// line the parser does not understand (a blank in the program's name, say) is one
        /// no allow rule matches: the gate asks, or declines.
        #[test]
        fn the_gate_reads_back_exactly_the_argv_an_agent_server_runs(
            program in "[a-z/._-]{1,6}",
            first in word(),
            args in proptest::collection::vec(word(), 0..4),
            env in proptest::collection::vec(("[A-Z_][A-Z0-9_]{0,4}", word()), 0..3),
        ) {
            use proptest::prelude::*;
            let command = format!("{program}{first}");
            let s = AgentMcpServer { name: "x".into(), command: command.clone(), args: args.clone(), env };
            let line = agent_server_command(&s).unwrap();
            let argv: Vec<String> = std::iter::once(command).chain(args).collect();
            match warden_approval::shell::recognize(&line) {
                warden_approval::shell::Recognition::Understood(cmds) => {
                    prop_assert_eq!(cmds.len(), 1, "{}", line);
                    prop_assert_eq!(&cmds[0].argv, &argv, "{}", line);
                    prop_assert_eq!(cmds[0].dynamic_at, None, "{}", line);
                }
                warden_approval::shell::Recognition::NotUnderstood { .. } => {}
            }
        }

        /// Every name offered maps back to exactly its server and tool, never falls under
        /// another server's `mcp__<server>` rules and never is a built-in tool's name.
        #[test]
        fn offered_names_read_back_as_their_server_and_tool(
            server in name_part(), other in name_part(), tool in name_part(),
        ) {
            if let Ok(full) = warden_mcp_protocol::checked_tool_name(&server, &tool) {
                proptest::prop_assert_eq!(
                    warden_mcp_protocol::parse_claude_tool_name(&full),
                    Some((server.as_str(), tool.as_str()))
                );
                proptest::prop_assert!(full.len() <= warden_mcp_protocol::MAX_TOOL_NAME);
                if other != server && crate::config::mcp::check_server_name(&other).is_ok() {
                    let rule = warden_approval::Rule::parse(&format!("mcp__{other}__*")).unwrap();
                    proptest::prop_assert!(!rule.covers_tool(&full), "{} covers {}", other, full);
                }
            }
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn regression_the_mcp_client_followed_redirects_with_the_bearer_token() {
        let (elsewhere, hits) = mcp_server(Duration::ZERO, None).await;
        let (origin, _) = mcp_server(Duration::ZERO, Some(elsewhere)).await;
        let mcp = http_servers(&[("moved", format!("http://{origin}/moved"))]);
        assert!(mcp.list_all().await.is_empty(), "a redirect is an error, not followed");
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 0, "the other server was never reached");
    }

    #[test]
    fn env_values_name_the_tasks_secrets() {
        let env: BTreeMap<String, String> = [
            ("TOKEN".into(), "${gh_token}".into()),
            ("AUTH".into(), "Bearer ${GH_TOKEN}!".into()),
            ("PLAIN".into(), "x".into()),
        ]
        .into();
        let secrets = vec![("GH_TOKEN".to_string(), "s3cret".to_string())];
        let (got, fingerprint) = expand_env("git", &env, &secrets).unwrap();
        assert_eq!(fingerprint, warden_sandbox::writer_of(&secrets), "the secret taken, once");
        let want: Vec<(String, String)> = vec![
            ("AUTH".into(), "Bearer s3cret!".into()),
            ("PLAIN".into(), "x".into()),
            ("TOKEN".into(), "s3cret".into()),
        ];
        assert_eq!(got, want);
        let missing: BTreeMap<String, String> = [("T".into(), "${NOPE}".into())].into();
        assert!(expand_env("git", &missing, &secrets).unwrap_err().contains("NOPE"));
        let unclosed: BTreeMap<String, String> = [("T".into(), "${NOPE".into())].into();
        assert!(expand_env("git", &unclosed, &secrets).is_err());
    }

    /// A session site without Docker (the sandbox contacts it at first use only).
    fn site_of<'a>(sandbox: &'a Arc<Sandbox>, key: &'a SessionKey, secrets: &'a [(String, String)]) -> SessionSite<'a> {
        SessionSite { sandbox, key, secrets, exported: secrets, task_id: "t", egress: &[] }
    }

    /// Finding 3 of the supply-chain review: a stdio server's process was keyed by user,
    /// session and server only, so a task without the secret (or with another token) used
    /// the process another task had started with its token. Now the key carries the
    /// fingerprint of exactly the secrets the server's `env` takes.
    #[test]
    fn a_stdio_process_is_shared_only_by_tasks_with_the_same_secrets() {
        let sandbox = Arc::new(Sandbox::new(Default::default()).unwrap());
        let session = SessionKey::new("u", "s");
        let config = McpServerConfig {
            command: Some("github-mcp-server".into()),
            env: [("GITHUB_TOKEN".to_string(), "${GITHUB_TOKEN}".to_string())].into(),
            ..Default::default()
        };
        let use_ = StdioUse::operator("github", &config);
        let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
        let a = [pair("GITHUB_TOKEN", "token-a")];
        let a_and_more = [pair("OTHER", "x"), pair("GITHUB_TOKEN", "token-a")];
        let b = [pair("GITHUB_TOKEN", "token-b")];
        let key = |secrets: &[(String, String)]| use_.key(&site_of(&sandbox, &session, secrets)).map(|(k, _)| k);
        let (ka, env_a) = use_.key(&site_of(&sandbox, &session, &a)).unwrap();
        assert_eq!(env_a, [pair("GITHUB_TOKEN", "token-a")]);
        assert_ne!(key(&b).unwrap(), ka, "another token: another process");
        let e = key(&[]).unwrap_err();
        assert!(e.contains("GITHUB_TOKEN") && e.contains("does not give"), "without the secret, no process: {e}");
        assert_eq!(key(&a_and_more).unwrap(), ka, "secrets the server does not take do not matter");
        // A server whose env takes no secret is one process for every task of the session.
        let plain = McpServerConfig { command: Some("mcp-server-time".into()), ..Default::default() };
        let plain = StdioUse::operator("time", &plain);
        let pk = |secrets: &[(String, String)]| plain.key(&site_of(&sandbox, &session, secrets)).unwrap().0;
        assert_eq!(pk(&a), pk(&b));
        assert_eq!(pk(&[]).secrets, warden_sandbox::NO_SECRETS);
    }

    proptest::proptest! {
        /// Two tasks of a session use one process of a stdio server exactly when every
        /// secret its `env` names has the same value in both (a task lacking one gets none);
        /// the secrets it does not name never matter.
        #[test]
        fn tasks_share_a_stdio_process_exactly_when_the_secrets_it_takes_are_equal(
            named in proptest::collection::btree_set("[A-C]", 0..3),
            first in proptest::collection::btree_map("[A-D]", "[xy]", 0..4),
            second in proptest::collection::btree_map("[A-D]", "[xy]", 0..4),
        ) {
            let sandbox = Arc::new(Sandbox::new(Default::default()).unwrap());
            let session = SessionKey::new("u", "s");
            let env: BTreeMap<String, String> = named.iter().map(|n| (format!("V{n}"), format!("${{{n}}}"))).collect();
            let config = McpServerConfig { command: Some("server".into()), env, ..Default::default() };
            let use_ = StdioUse::operator("srv", &config);
            let secrets = |m: &BTreeMap<String, String>| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect::<Vec<_>>();
            let (s1, s2) = (secrets(&first), secrets(&second));
            let k1 = use_.key(&site_of(&sandbox, &session, &s1)).map(|(k, _)| k);
            let k2 = use_.key(&site_of(&sandbox, &session, &s2)).map(|(k, _)| k);
            proptest::prop_assert_eq!(k1.is_ok(), named.iter().all(|n| first.contains_key(n)));
            proptest::prop_assert_eq!(k2.is_ok(), named.iter().all(|n| second.contains_key(n)));
            if let (Ok(k1), Ok(k2)) = (k1, k2) {
                let same = named.iter().all(|n| first.get(n) == second.get(n));
                proptest::prop_assert_eq!(k1 == k2, same);
            }
        }
    }

    /// Finding 1 of the supply-chain review: the servers a subagent reached were whatever
    /// its plugin's definition named (and every `all_agents` one). Now only those the
    /// plugin is granted are listed or called, and an ungranted one is never contacted.
    #[tokio::test(flavor = "multi_thread")]
    async fn only_servers_granted_to_the_plugin_are_listed_or_called() {
        let (granted, _) = mcp_server(Duration::ZERO, None).await;
        let (named, named_hits) = mcp_server(Duration::ZERO, None).await;
        let (everyone, everyone_hits) = mcp_server(Duration::ZERO, None).await;
        let http = |addr: std::net::SocketAddr, all_agents| McpServerConfig {
            url: Some(format!("http://{addr}/mcp")),
            all_agents,
            ..Default::default()
        };
        let config: BTreeMap<String, McpServerConfig> = [
            ("granted".to_string(), http(granted, false)),
            ("named".to_string(), http(named, false)),
            ("everyone".to_string(), http(everyone, true)),
        ]
        .into();
        let mcp = McpTools::new(&config);
        let grant =
            crate::capability::GrantConfig { tools: true, mcp_servers: vec!["granted".into()], ..Default::default() };
        let grants = Grants::new("plug", &[crate::capability::Capability::Tools], Some(&grant)).unwrap();
        let requested = vec!["granted".to_string(), "named".to_string()];
        assert_eq!(mcp.visible(&requested, &grants).collect::<Vec<_>>(), ["granted"]);
        assert_eq!(names(&mcp.list(&requested, &grants, &[], None).await), ["mcp__granted__slow"]);
        for server in ["named", "everyone"] {
            let e = mcp.call(server, "slow", serde_json::json!({}), &requested, &grants, None).await.unwrap_err();
            assert!(e.contains("plugins.grants.plug.mcp_servers") && e.contains(server), "{e}");
        }
        let r = mcp.call("granted", "slow", serde_json::json!({}), &requested, &grants, None).await.unwrap();
        assert_eq!(r.text, "done");
        let e = mcp.call("granted", "slow", serde_json::json!({}), &[], &grants, None).await.unwrap_err();
        assert!(e.contains("does not name it"), "granted but not named: {e}");
        let untouched = named_hits.load(std::sync::atomic::Ordering::SeqCst)
            + everyone_hits.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(untouched, 0, "an ungranted server is never contacted");
        // Granted, an `all_agents` server is offered without being named.
        let grant = crate::capability::GrantConfig { mcp_servers: vec!["everyone".into()], ..grant };
        let grants = Grants::new("plug", &[], Some(&grant)).unwrap();
        assert_eq!(mcp.visible(&[], &grants).collect::<Vec<_>>(), ["everyone"]);
    }
}
