//! MCP servers as tool sources for subagents: the operator's `mcp_servers` appear in a
//! subagent's tool list as `mcp__<server>__<tool>` (Claude Code's names) when the agent
//! file's `mcpServers` names them (or the server is configured for all agents).
//!
//! Two transports, one protocol implementation (the shared I/O-free `warden-mcp-protocol`
//! crate: revision negotiation, results); this module only moves its messages:
//! - **streamable HTTP** (`url`) over reqwest: one connection per server, shared by every
//!   session.
//! - **stdio** (`command`, `args`, `env`: the `.mcp.json` shape). Such a server is
//!   third-party code with file and network access, so it runs **inside the calling
//!   session's sandbox** ([`warden_sandbox::Sandbox::spawn_process`]), one process per
//!   session and server, started on the session's first use, restarted on the next use
//!   after it died, gone with the session's container; one JSON-RPC message per line.
//!   Its tool list is the session's own: what that process answered, never remembered
//!   for another session (the program runs in the session's sandbox, where the session's
//!   own files and tool calls may change what it offers).
//!
//! It never decides whether a call may run — [`crate::tools::ToolHost`] asks the approval
//! gate first — and MCP annotations such as `destructiveHint` are passed on as hints, never
//! as policy. It never logs a stdio server's environment (it may hold the task's secrets).

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio::sync::Mutex;
use warden_mcp_protocol::{ClientInfo, HttpRequest, McpError, Pending, Session, Tool, ToolResult, ToolsPage, Update};
use warden_sandbox::{Sandbox, SessionKey};

use crate::config::mcp::{McpServerConfig, McpTransport};

/// Time allowed for one MCP exchange (connect, list or call) when the task gives none.
pub const MCP_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest MCP response body read; a tool result bigger than this is a fault.
pub const MAX_MCP_RESPONSE: usize = 16 * 1024 * 1024;
/// Longest wait for a stdio server to start and answer its negotiation (an interpreter
/// starting in a fresh container on a busy machine).
pub const STDIO_START_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest line (one JSON-RPC message) read from a stdio server.
const MAX_STDIO_MESSAGE: usize = MAX_MCP_RESPONSE;

/// A stdio server's `env` with every `${NAME}` filled from the task's secrets (`secrets`,
/// names as [`crate::redact::env_name`] gives them).
fn expand_env(
    server: &str,
    env: &BTreeMap<String, String>,
    secrets: &[(String, String)],
) -> Result<Vec<(String, String)>, String> {
    let mut out = vec![];
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
            let Some((_, v)) = secrets.iter().find(|(k, _)| *k == key) else {
                return Err(format!(
                    "mcp_servers.{server}.env.{name} names the secret {secret:?}, which this task's tool_context does not give"
                ));
            };
            value.push_str(v);
            rest = &rest[start + len + 1..];
        }
        value.push_str(rest);
        out.push((name.clone(), value));
    }
    Ok(out)
}

struct Server {
    config: McpServerConfig,
    /// HTTP: the negotiated session and the tool list, discovered on first use (one
    /// server outside every sandbox, the same for every session). A stdio server keeps
    /// nothing here: its tools are its session's process's ([`StdioConn::tools`]).
    state: Mutex<Option<(Session, Vec<Tool>)>>,
}

/// One stdio server process of one session and the MCP session over its streams.
struct StdioConn {
    session: Session,
    tools: Vec<Tool>,
    stdin: Pin<Box<dyn AsyncWrite + Send>>,
    stdout: BufReader<Pin<Box<dyn AsyncRead + Send>>>,
    stderr: warden_sandbox::process::StderrTail,
    /// Its stream ended or broke: the next use starts a new process.
    dead: bool,
}

/// (user id, session id, server name): one session's process of one server.
type StdioKey = (String, String, String);

/// The configured MCP servers, connected lazily.
pub struct McpTools {
    servers: BTreeMap<String, Server>,
    http: reqwest::Client,
    /// Stdio processes by session; a dead one is replaced on its next use, and entries
    /// of dead processes are dropped whenever a session starts one.
    stdio: std::sync::Mutex<HashMap<StdioKey, Arc<Mutex<Option<StdioConn>>>>>,
}

/// A tool offered to a subagent.
pub struct McpToolSpec {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

/// Where a stdio server of a call runs: the session's sandbox, with the task's secrets.
pub struct SessionSite<'a> {
    pub sandbox: &'a Arc<Sandbox>,
    pub key: &'a SessionKey,
    pub secrets: &'a [(String, String)],
}

impl McpTools {
    pub fn new(config: &BTreeMap<String, McpServerConfig>) -> Self {
        let servers = config
            .iter()
            .map(|(name, c)| (name.clone(), Server { config: c.clone(), state: Mutex::new(None) }))
            .collect();
        McpTools { servers, http: reqwest::Client::new(), stdio: Default::default() }
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
    /// `site` is the session whose stdio servers are listed (each started there if it does
    /// not run yet); without one a stdio server is skipped.
    pub async fn list(&self, requested: &[String], site: Option<&SessionSite<'_>>) -> Vec<McpToolSpec> {
        let mut out = vec![];
        for name in self.visible(requested).collect::<Vec<_>>() {
            match self.tools_of(name, site).await {
                Ok(tools) => out.extend(tools.into_iter().map(|t| {
                    let hints = t.annotations.as_ref().map(|a| format!(" [server hints: {a}]")).unwrap_or_default();
                    McpToolSpec {
                        name: warden_mcp_protocol::claude_tool_name(name, &t.name),
                        description: format!("{}{hints}", t.description.clone().unwrap_or_default()),
                        input_schema: t.input_schema.clone(),
                    }
                })),
                Err(e) => {
                    tracing::warn!(server = name, error = %e, "MCP server unavailable; its tools are not offered")
                }
            }
        }
        out
    }

    /// Calls `mcp__<server>__<tool>` with `arguments`; the caller has already passed the
    /// gate. A stdio server runs at `site` (started, or restarted after it died, as needed).
    pub async fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: Value,
        site: Option<&SessionSite<'_>>,
    ) -> Result<ToolResult, String> {
        let s = self.servers.get(server).ok_or_else(|| format!("no MCP server named {server:?} is configured"))?;
        if let Ok(McpTransport::Stdio { .. }) = s.config.transport() {
            let site =
                site.ok_or_else(|| format!("MCP server {server:?} runs in a sandbox session, and this call has none"))?;
            return self.call_stdio(server, &s.config, tool, arguments, site).await;
        }
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

    async fn tools_of(&self, name: &str, site: Option<&SessionSite<'_>>) -> Result<Vec<Tool>, String> {
        let s = &self.servers[name];
        if let Ok(McpTransport::Stdio { .. }) = s.config.transport() {
            // The list of the process in this session (started now if need be), never
            // one another session's process gave.
            let site =
                site.ok_or_else(|| format!("MCP server {name:?} runs in a sandbox session, and there is none"))?;
            let slot = self.stdio_conn(name, &s.config, site).await?;
            let guard = slot.lock().await;
            return Ok(guard.as_ref().ok_or("the MCP server is not running")?.tools.clone());
        }
        let mut guard = s.state.lock().await;
        if guard.is_none() {
            *guard = Some(self.connect(s).await.map_err(|e| e.to_string())?);
        }
        Ok(guard.as_ref().expect("connected above").1.clone())
    }

    /// The live process of `server` in `site`'s session, started if there is none or the
    /// last one died.
    async fn stdio_conn(
        &self,
        server: &str,
        config: &McpServerConfig,
        site: &SessionSite<'_>,
    ) -> Result<Arc<Mutex<Option<StdioConn>>>, String> {
        let slot = {
            let mut map = self.stdio.lock().unwrap_or_else(|e| e.into_inner());
            // Dead processes (their session ended, or they died) leave the table; a slot
            // in use (locked) stays.
            map.retain(|_, conn| conn.try_lock().map(|c| c.as_ref().is_some_and(|c| !c.dead)).unwrap_or(true));
            let key = (site.key.user_id.clone(), site.key.session_id.clone(), server.to_owned());
            map.entry(key).or_default().clone()
        };
        let mut guard = slot.lock().await;
        if let Some(conn) = guard.as_mut() {
            conn.notice_exit();
        }
        if let Some(conn) = guard.as_ref()
            && conn.dead
        {
            tracing::info!(server, session = %site.key.session_id, stderr = %last_line(&conn.stderr.text()), "MCP stdio server ended; starting it again");
            *guard = None;
        }
        if guard.is_none() {
            *guard = Some(self.start_stdio(server, config, site).await?);
        }
        drop(guard);
        Ok(slot)
    }

    async fn start_stdio(
        &self,
        server: &str,
        config: &McpServerConfig,
        site: &SessionSite<'_>,
    ) -> Result<StdioConn, String> {
        let Ok(McpTransport::Stdio { command, args, env }) = config.transport() else {
            return Err(format!("MCP server {server:?} is not a stdio server"));
        };
        let env = expand_env(server, env, site.secrets)?;
        let argv: Vec<String> = std::iter::once(command.to_owned()).chain(args.iter().cloned()).collect();
        let process = site.sandbox.spawn_process(site.key, &argv, &env).await.map_err(|e| e.to_string())?;
        let mut conn = StdioConn {
            session: Session::new(ClientInfo { name: "warden".into(), version: env!("CARGO_PKG_VERSION").into() }),
            tools: vec![],
            stderr: process.stderr_handle(),
            stdin: process.stdin,
            stdout: BufReader::new(process.stdout),
            dead: false,
        };
        match tokio::time::timeout(STDIO_START_TIMEOUT, conn.start()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                return Err(format!(
                    "MCP server {server:?} did not start ({e}); its stderr: {}",
                    last_line(&conn.stderr.text())
                ));
            }
            Err(_) => return Err(format!("MCP server {server:?} did not answer within {STDIO_START_TIMEOUT:?}")),
        }
        tracing::info!(server, session = %site.key.session_id, tools = conn.tools.len(), "MCP stdio server started in the session's sandbox");
        Ok(conn)
    }

    async fn call_stdio(
        &self,
        server: &str,
        config: &McpServerConfig,
        tool: &str,
        arguments: Value,
        site: &SessionSite<'_>,
    ) -> Result<ToolResult, String> {
        let slot = self.stdio_conn(server, config, site).await?;
        let mut guard = slot.lock().await;
        let conn = guard.as_mut().ok_or("the MCP server is not running")?;
        let (req, pending) = conn.session.call_tool(tool, arguments, None).map_err(|e| e.to_string())?;
        let result = match tokio::time::timeout(MCP_REQUEST_TIMEOUT, conn.exchange(req, pending)).await {
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
        ToolResult::from_result(result).map_err(|e| e.to_string())
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
    async fn start(&mut self) -> Result<(), McpError> {
        let mut next = Some(self.session.connect());
        while let Some((req, pending)) = next {
            let p = self.exchange(req, pending).await?;
            next = self.session.advance(p)?;
        }
        let mut cursor: Option<String> = None;
        for _ in 0..warden_mcp_protocol::MAX_TOOL_PAGES {
            let (req, pending) = self.session.list_tools(cursor.as_deref())?;
            let mut p = self.exchange(req, pending).await?;
            let (page, _skipped) = ToolsPage::from_result(p.result()?)?;
            self.tools.extend(page.tools);
            cursor = page.next_cursor;
            if cursor.is_none() {
                break;
            }
        }
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
        let mut line = Vec::new();
        while !pending.is_done() {
            line.clear();
            match (&mut self.stdout).take(MAX_STDIO_MESSAGE as u64 + 1).read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => {
                    self.dead = true;
                    pending.finish();
                    break;
                }
                Ok(_) if line.len() > MAX_STDIO_MESSAGE => {
                    self.dead = true;
                    return Err(McpError::Transport(format!("a message exceeds {MAX_STDIO_MESSAGE} bytes")));
                }
                Ok(_) => {}
            }
            for update in pending.feed(&line) {
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

/// The last non-empty line of a process's stderr (its usual last words), bounded and escaped.
fn last_line(stderr: &str) -> String {
    let line = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("(nothing)");
    crate::text::escape_control(&line.chars().take(300).collect::<String>()).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_values_name_the_tasks_secrets() {
        let env: BTreeMap<String, String> = [
            ("TOKEN".into(), "${gh_token}".into()),
            ("AUTH".into(), "Bearer ${GH_TOKEN}!".into()),
            ("PLAIN".into(), "x".into()),
        ]
        .into();
        let secrets = vec![("GH_TOKEN".to_string(), "s3cret".to_string())];
        let got = expand_env("git", &env, &secrets).unwrap();
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
}
