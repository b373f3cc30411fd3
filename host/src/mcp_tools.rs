//! MCP servers as tool sources for subagents: the operator's `mcp_servers` appear in a
//! subagent's tool list as `mcp__<server>__<tool>` (Claude Code's names) when the agent
//! file's `mcpServers` names them (or the server is configured for all agents).
//!
//! The protocol (revision negotiation, sessions, SSE, results) is the shared I/O-free
//! `warden-mcp-protocol` crate; this module only moves its requests over reqwest. It never
//! decides whether a call may run — [`crate::tools::ToolHost`] asks the approval gate first —
//! and MCP annotations such as `destructiveHint` are passed on as hints, never as policy.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::Mutex;
use warden_mcp_protocol::{ClientInfo, HttpRequest, McpError, Pending, Session, Tool, ToolResult, ToolsPage};

/// Time allowed for one MCP exchange (connect, list or call) when the task gives none.
pub const MCP_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest MCP response body read; a tool result bigger than this is a fault.
pub const MAX_MCP_RESPONSE: usize = 16 * 1024 * 1024;

/// One operator-configured MCP server (`mcp_servers.<name>`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// Streamable-HTTP endpoint, e.g. `http://127.0.0.1:9000/mcp`.
    pub url: String,
    /// Environment variable holding a bearer token for the server (never shown to plugins).
    #[serde(default)]
    pub auth_env: Option<String>,
    /// Offer this server's tools to every subagent, not only those naming it in `mcpServers`.
    #[serde(default)]
    pub all_agents: bool,
}

struct Server {
    config: McpServerConfig,
    /// The negotiated session and the tool list, discovered on first use.
    state: Mutex<Option<(Session, Vec<Tool>)>>,
}

/// The configured MCP servers, connected lazily.
pub struct McpTools {
    servers: BTreeMap<String, Server>,
    http: reqwest::Client,
}

/// A tool offered to a subagent.
pub struct McpToolSpec {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

impl McpTools {
    pub fn new(config: &BTreeMap<String, McpServerConfig>) -> Self {
        let servers = config
            .iter()
            .map(|(name, c)| (name.clone(), Server { config: c.clone(), state: Mutex::new(None) }))
            .collect();
        McpTools { servers, http: reqwest::Client::new() }
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Servers visible to an agent that names `requested` in its `mcpServers`.
    pub fn visible<'a>(&'a self, requested: &'a [String]) -> impl Iterator<Item = &'a str> + 'a {
        self.servers
            .iter()
            .filter(move |(name, s)| s.config.all_agents || requested.iter().any(|r| r == *name))
            .map(|(n, _)| n.as_str())
    }

    /// Tools of the visible servers, named `mcp__<server>__<tool>`. A server that cannot
    /// be reached is skipped with a warning: the subagent still gets its other tools.
    pub async fn list(&self, requested: &[String]) -> Vec<McpToolSpec> {
        let mut out = vec![];
        for name in self.visible(requested).collect::<Vec<_>>() {
            match self.tools_of(name).await {
                Ok(tools) => out.extend(tools.into_iter().map(|t| {
                    let hints = t.annotations.as_ref().map(|a| format!(" [server hints: {a}]")).unwrap_or_default();
                    McpToolSpec {
                        name: warden_mcp_protocol::claude_tool_name(name, &t.name),
                        description: format!("{}{hints}", t.description.clone().unwrap_or_default()),
                        input_schema: t.input_schema.clone(),
                    }
                })),
                Err(e) => tracing::warn!(server = name, error = %e, "MCP server unavailable; its tools are not offered"),
            }
        }
        out
    }

    /// Calls `mcp__<server>__<tool>` with `arguments`; the caller has already passed the gate.
    pub async fn call(&self, server: &str, tool: &str, arguments: Value) -> Result<ToolResult, String> {
        let s = self.servers.get(server).ok_or_else(|| format!("no MCP server named {server:?} is configured"))?;
        let mut guard = s.state.lock().await;
        if guard.is_none() {
            *guard = Some(self.connect(s).await.map_err(|e| e.to_string())?);
        }
        let (session, _) = guard.as_mut().expect("connected above");
        let (req, pending) = session.call_tool(tool, arguments, None).map_err(|e| e.to_string())?;
        let mut p = self.exchange(&s.config, req, pending).await.map_err(|e| e.to_string())?;
        let result = p.result().map_err(|e| e.to_string())?;
        ToolResult::from_result(result).map_err(|e| e.to_string())
    }

    async fn tools_of(&self, name: &str) -> Result<Vec<Tool>, McpError> {
        let s = &self.servers[name];
        let mut guard = s.state.lock().await;
        if guard.is_none() {
            *guard = Some(self.connect(s).await?);
        }
        Ok(guard.as_ref().expect("connected above").1.clone())
    }

    async fn connect(&self, s: &Server) -> Result<(Session, Vec<Tool>), McpError> {
        let mut session = Session::new(ClientInfo { name: "warden".into(), version: env!("CARGO_PKG_VERSION").into() });
        let mut next = Some(session.connect());
        while let Some((req, pending)) = next {
            let p = self.exchange(&s.config, req, pending).await?;
            next = session.advance(p)?;
        }
        let mut tools = vec![];
        let mut cursor: Option<String> = None;
        for _ in 0..warden_mcp_protocol::MAX_TOOL_PAGES {
            let (req, pending) = session.list_tools(cursor.as_deref())?;
            let mut p = self.exchange(&s.config, req, pending).await?;
            let (page, _skipped) = ToolsPage::from_result(p.result()?)?;
            tools.extend(page.tools);
            cursor = page.next_cursor;
            if cursor.is_none() {
                break;
            }
        }
        Ok((session, tools))
    }

    /// Sends one request and feeds the response into `pending` until it is complete.
    async fn exchange(&self, config: &McpServerConfig, req: HttpRequest, mut pending: Pending) -> Result<Pending, McpError> {
        let method = reqwest::Method::from_bytes(req.method.as_bytes()).unwrap_or(reqwest::Method::POST);
        let mut rb = self.http.request(method, &config.url).timeout(MCP_REQUEST_TIMEOUT);
        for (k, v) in &req.headers {
            rb = rb.header(k, v);
        }
        if let Some(env) = &config.auth_env {
            let token = std::env::var(env)
                .map_err(|_| McpError::Transport(format!("environment variable {env} (mcp_servers auth_env) is not set")))?;
            rb = rb.bearer_auth(token);
        }
        if let Some(body) = req.body {
            rb = rb.body(body);
        }
        let mut resp = rb.send().await.map_err(|e| McpError::Transport(e.to_string()))?;
        let headers: Vec<(String, String)> = resp
            .headers()
            .iter()
            .filter_map(|(k, v)| v.to_str().ok().map(|v| (k.to_string(), v.to_owned())))
            .collect();
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
