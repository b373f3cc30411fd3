//! `mcp_servers:` and `mcp_servers_file`: the operator's MCP servers as plain data, in the
//! `.mcp.json` shape (Claude Code's), validated when warden.yaml loads. Connecting to them
//! is [`crate::mcp_tools`]'s business; this module never starts or reaches a server.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// One operator-configured MCP server (`mcp_servers.<name>`): either `url` (streamable
/// HTTP) or `command` (a stdio program run in the session's sandbox) — the `.mcp.json`
/// shape, so an existing file can be pasted, imported or named in `mcp_servers_file`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// Streamable-HTTP endpoint, e.g. `http://127.0.0.1:9000/mcp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Environment variable holding a bearer token for an HTTP server (never shown to plugins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_env: Option<String>,
    /// A stdio server's program, run inside the session's sandbox (e.g. `mcp-server-git`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Its environment. `${NAME}` in a value is the calling task's `tool_context` secret
    /// `NAME` (scrubbed from every output like any secret); other text is literal.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// `.mcp.json`'s transport name (`stdio`, `http`, `streamable-http`): checked against
    /// `command` / `url`, otherwise unused.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
    /// Offer this server's tools to every subagent, not only those naming it in `mcpServers`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all_agents: bool,
}

/// How a configured server is reached.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum McpTransport<'a> {
    Http { url: &'a str, auth_env: Option<&'a str> },
    Stdio { command: &'a str, args: &'a [String], env: &'a BTreeMap<String, String> },
}

fn shell_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl McpServerConfig {
    /// The transport, or why the entry names none, both, or fields of the other one.
    pub fn transport(&self) -> Result<McpTransport<'_>, String> {
        let kind = self.transport.as_deref();
        match (&self.url, &self.command) {
            (Some(url), None) => {
                if !self.args.is_empty() || !self.env.is_empty() {
                    return Err("`args` and `env` belong to a stdio server (`command`), not to a `url`".into());
                }
                if !matches!(kind, None | Some("http" | "streamable-http")) {
                    return Err(format!(
                        "type {:?} does not go with `url`: expected http or streamable-http",
                        kind.unwrap_or_default()
                    ));
                }
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(format!("url {url:?} must start with http:// or https://"));
                }
                Ok(McpTransport::Http { url, auth_env: self.auth_env.as_deref() })
            }
            (None, Some(command)) => {
                if self.auth_env.is_some() {
                    return Err("`auth_env` belongs to an HTTP server (`url`); a stdio server takes `env`".into());
                }
                if !matches!(kind, None | Some("stdio")) {
                    return Err(format!(
                        "type {:?} does not go with `command`: expected stdio",
                        kind.unwrap_or_default()
                    ));
                }
                if command.trim().is_empty() || command.contains('\0') || self.args.iter().any(|a| a.contains('\0')) {
                    return Err("`command` must name a program, without NUL bytes in it or its args".into());
                }
                if let Some(name) = self.env.keys().find(|n| !shell_identifier(n)) {
                    return Err(format!("env name {name:?} is not a shell identifier"));
                }
                Ok(McpTransport::Stdio { command, args: &self.args, env: &self.env })
            }
            (Some(_), Some(_)) => Err("give either `url` (streamable HTTP) or `command` (stdio), not both".into()),
            (None, None) => {
                Err("expected `url` (streamable HTTP) or `command` (a stdio server run in the sandbox)".into())
            }
        }
    }
}

/// Checks a server's name (`mcp_servers.<name>`, an `.mcp.json` key): it becomes the
/// `<server>` of `mcp__<server>__<tool>`, which approval rules match, so it must read
/// back as itself — letters, digits, `_`, `-`, no `__` and no `_` at either end (a server
/// named `github__x` would otherwise fall under `mcp__github__*` and take the calls of
/// `github`'s tools) — and leave room for a tool name within
/// [`warden_mcp_protocol::MAX_TOOL_NAME`].
pub fn check_server_name(name: &str) -> Result<(), String> {
    warden_mcp_protocol::check_name_part(name)
        .and_then(|()| warden_mcp_protocol::checked_tool_name(name, "t").map(drop))
        .map_err(|e| format!("server name {:?}: {e}", crate::text::escape_control(name)))
}

/// An agent-defined server (a Claude agent file's inline `mcpServers` entry) as a stdio
/// server entry, or why it cannot be one: its name as [`check_server_name`] requires, a
/// `command` as an operator's entry requires, each env name once, and literal env values —
/// `${NAME}` in an operator's entry names the task's secret, which an agent file (plugin
/// data) never reads, so such a value is refused rather than passed on as text.
pub fn agent_server_config(s: &crate::plugin::AgentMcpServer) -> Result<McpServerConfig, String> {
    check_server_name(&s.name)?;
    let mut env = BTreeMap::new();
    for (name, value) in &s.env {
        if value.contains("${") {
            return Err(format!(
                "env {:?}: `${{…}}` is not expanded in an agent-defined server (it would name a secret); give a literal value",
                crate::text::escape_control(name)
            ));
        }
        if value.contains('\0') {
            return Err(format!("env {:?}: the value holds a NUL byte", crate::text::escape_control(name)));
        }
        if env.insert(name.clone(), value.clone()).is_some() {
            return Err(format!("env {:?} is given twice", crate::text::escape_control(name)));
        }
    }
    let config = McpServerConfig { command: Some(s.command.clone()), args: s.args.clone(), env, ..Default::default() };
    config.transport().map_err(|e| crate::text::escape_control(&e).into_owned())?;
    Ok(config)
}

/// The servers of an `.mcp.json` file (`{"mcpServers": {name: {command, args, env} | {url}}}`),
/// each checked; errors name the file, the server and the field.
pub fn read_mcp_json(path: &Path) -> Result<BTreeMap<String, McpServerConfig>, String> {
    #[derive(Deserialize)]
    struct File {
        #[serde(rename = "mcpServers")]
        mcp_servers: BTreeMap<String, McpServerConfig>,
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let de = &mut serde_json::Deserializer::from_str(&text);
    let file: File =
        serde_path_to_error::deserialize(de).map_err(|e| format!("{}: {}: {}", path.display(), e.path(), e.inner()))?;
    for (name, server) in &file.mcp_servers {
        check_server_name(name).map_err(|e| format!("{}: mcpServers: {e}", path.display()))?;
        server.transport().map_err(|e| format!("{}: mcpServers.{name}: {e}", path.display()))?;
    }
    Ok(file.mcp_servers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stdio(command: &str) -> McpServerConfig {
        McpServerConfig { command: Some(command.into()), ..Default::default() }
    }

    #[test]
    fn an_entry_is_either_http_or_stdio() {
        assert!(matches!(stdio("mcp-server-git").transport(), Ok(McpTransport::Stdio { .. })));
        let http = McpServerConfig { url: Some("http://127.0.0.1:9/mcp".into()), ..Default::default() };
        assert!(matches!(http.transport(), Ok(McpTransport::Http { .. })));
        let both = McpServerConfig { url: Some("http://x/mcp".into()), ..stdio("x") };
        assert!(both.transport().unwrap_err().contains("not both"));
        assert!(McpServerConfig::default().transport().is_err());
        assert!(McpServerConfig { transport: Some("http".into()), ..stdio("x") }.transport().is_err());
        assert!(McpServerConfig { env: [("A-B".into(), "x".into())].into(), ..stdio("x") }.transport().is_err());
        assert!(McpServerConfig { auth_env: Some("T".into()), ..stdio("x") }.transport().is_err());
        assert!(McpServerConfig { args: vec!["a\0".into()], ..stdio("x") }.transport().is_err());
        assert!(McpServerConfig { url: Some("file:///x".into()), ..Default::default() }.transport().is_err());
    }

    #[test]
    fn regression_a_server_name_could_read_as_another_servers() {
        for good in ["github", "git-hub", "a", "fs_local", "A9"] {
            assert_eq!(check_server_name(good), Ok(()), "{good}");
        }
        for bad in ["", "github__x", "gh_", "_gh", "my server", "a.b", "a/b", "é", &"x".repeat(60)] {
            assert!(check_server_name(bad).is_err(), "{bad:?}");
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m.json");
        std::fs::write(&file, r#"{"mcpServers": {"github__x": {"url": "https://x.example/mcp"}}}"#).unwrap();
        assert!(read_mcp_json(&file).unwrap_err().contains("github__x"));
    }

    #[test]
    fn mcp_json_files_are_read_with_errors_naming_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let ok = dir.path().join("ok.json");
        std::fs::write(
            &ok,
            r#"{"mcpServers": {"git": {"command": "mcp-server-git", "args": ["--repository", "."]},
                "remote": {"type": "http", "url": "https://mcp.example.com/mcp"}}}"#,
        )
        .unwrap();
        let servers = read_mcp_json(&ok).unwrap();
        assert_eq!(servers["git"].args, ["--repository", "."]);
        assert!(matches!(servers["remote"].transport(), Ok(McpTransport::Http { .. })));
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, r#"{"mcpServers": {"x": {"command": "a", "headers": {"A": "b"}}}}"#).unwrap();
        let e = read_mcp_json(&bad).unwrap_err();
        assert!(e.contains("mcpServers.x") && e.contains("headers"), "{e}");
        let neither = dir.path().join("neither.json");
        std::fs::write(&neither, r#"{"mcpServers": {"y": {"args": ["a"]}}}"#).unwrap();
        assert!(read_mcp_json(&neither).unwrap_err().contains("mcpServers.y"));
    }
}
