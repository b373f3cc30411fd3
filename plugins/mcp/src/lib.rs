//! `mcp` plugin: a tool of an MCP server acting as a subagent.
//!
//! Reference: `uri` = the MCP endpoint (`http(s)://host/mcp`, streamable HTTP), or
//! `mcp-stdio:<name>` for an operator's stdio server (`mcp_servers.<name>` with a
//! `command`), which the host runs in the task's sandbox session and this plugin reaches
//! through the `tools` capability (`mcp__<name>__<tool>`, behind the approval gate like
//! every tool call; the plugin needs the `tools` grant). Kind `MCP`, metadata:
//! - `tool`: the tool that acts as the agent (default: the server's only tool that
//!   takes exactly one string argument);
//! - `argument`: the tool argument that receives the prompt (default: the tool's only
//!   string argument, else its only required one);
//! - `auth_env`: name of an operator secret (`plugins.grants.<id>.secrets`) that the
//!   host sends as `Authorization: Bearer …`; the plugin never sees the value;
//! - `protocol_version`: `auto` (default), `2026-07-28`/`modern`, or a handshake
//!   revision / `legacy` to skip the `server/discover` probe;
//! - `name`, `description`: override what the server says.

use serde::{Deserialize, Serialize};
use warden_guest::{Metadata, ToolSpec};
use warden_mcp_protocol::{Preference, ServerInfo, Tool};

pub const KIND: &str = "MCP";

#[cfg(target_arch = "wasm32")]
mod wasm;

/// A reference's metadata, validated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Target {
    pub endpoint: String,
    /// `mcp-stdio:<name>`: the operator's stdio server `name`, reached as tools.
    pub stdio: Option<String>,
    pub tool: Option<String>,
    pub argument: Option<String>,
    pub auth_secret: Option<String>,
    pub preference: Preference,
    pub name: Option<String>,
    pub description: Option<String>,
}

impl Target {
    pub fn from_reference(uri: &str, metadata: &[(String, String)]) -> Result<Target, String> {
        let meta = Metadata::new(metadata);
        let endpoint = uri.trim();
        let stdio = match endpoint.strip_prefix(STDIO_SCHEME) {
            Some(name) if valid_server_name(name) => Some(name.to_owned()),
            Some(name) => {
                return Err(format!(
                    "MCP reference uri {endpoint:?}: {name:?} is not a server name ([A-Za-z0-9_-], as in mcp_servers)"
                ));
            }
            None if endpoint.starts_with("http://") || endpoint.starts_with("https://") => None,
            None => {
                return Err(format!(
                    "MCP reference uri {endpoint:?} must be an http(s) URL of a streamable HTTP endpoint, or {STDIO_SCHEME}<name> of a stdio server in mcp_servers"
                ));
            }
        };
        let preference = match meta.get("protocol_version") {
            None => Preference::Auto,
            Some(v) => Preference::parse(v).ok_or_else(|| {
                format!("metadata `protocol_version` {v:?}: expected auto, 2026-07-28, or a handshake revision such as 2025-11-25")
            })?,
        };
        let owned = |k| meta.get(k).map(str::to_owned);
        Ok(Target {
            endpoint: endpoint.to_owned(),
            stdio,
            tool: owned("tool"),
            argument: owned("argument"),
            auth_secret: owned("auth_env"),
            preference,
            name: owned("name"),
            description: owned("description"),
        })
    }
}

/// The uri scheme of a reference to an operator's stdio server.
pub const STDIO_SCHEME: &str = "mcp-stdio:";

/// A `mcp_servers` name as it appears in `mcp__<name>__<tool>`.
fn valid_server_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The stdio server's tools among a task's tools (`mcp__<server>__<tool>`), as MCP tools
/// named without the prefix.
pub fn stdio_tools(server: &str, specs: &[ToolSpec]) -> Vec<Tool> {
    specs
        .iter()
        .filter_map(|spec| {
            let (s, tool) = warden_mcp_protocol::parse_claude_tool_name(&spec.name)?;
            if s != server {
                return None;
            }
            let input_schema =
                serde_json::from_str(&spec.input_schema).unwrap_or_else(|_| serde_json::json!({"type": "object"}));
            serde_json::from_value(
                serde_json::json!({"name": tool, "description": spec.description, "inputSchema": input_schema}),
            )
            .ok()
        })
        .collect()
}

/// What the resolver stores in the definition's `protocol-data` for the executor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProtocolData {
    pub endpoint: String,
    pub tool: String,
    pub argument: String,
    /// The revision negotiated at resolve time (informational; the executor negotiates again).
    pub protocol_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    pub input_schema: serde_json::Value,
    /// For `mcp-stdio:<name>`: `[name]`, the operator server whose tools the task may use
    /// (handed to the host as the definition's typed `mcp-servers`; kept here for the executor).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<String>,
}

/// The definition's name: metadata `name`; else the tool's name when `tool` was
/// configured (several references to one server stay distinct); else the server's name;
/// else the tool's.
pub fn definition_name(target: &Target, server: &ServerInfo, tool: &Tool) -> String {
    if let Some(n) = &target.name {
        return n.clone();
    }
    if target.tool.is_some() {
        return tool.name.clone();
    }
    server.name.clone().filter(|n| !n.trim().is_empty()).unwrap_or_else(|| tool.name.clone())
}

/// The definition's description: metadata `description`, else the tool's, else the
/// server's description or instructions, else a generic line.
pub fn definition_description(target: &Target, server: &ServerInfo, tool: &Tool) -> String {
    [&target.description, &tool.description, &server.description, &server.instructions]
        .into_iter()
        .flatten()
        .map(|s| s.trim())
        .find(|s| !s.is_empty())
        .map(str::to_owned)
        .unwrap_or_else(|| format!("MCP tool {} at {}", tool.name, target.endpoint))
}

/// The JSON object for a `status` event from a progress notification.
pub fn progress_event(p: &warden_mcp_protocol::Progress) -> serde_json::Value {
    let mut ev = serde_json::json!({ "progress": p.progress });
    if let Some(t) = p.total {
        ev["total"] = t.into();
    }
    ev["message"] = match (&p.message, p.total) {
        (Some(m), _) => m.clone().into(),
        (None, Some(t)) => format!("{}/{}", p.progress, t).into(),
        (None, None) => format!("{}", p.progress).into(),
    };
    ev
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use warden_guest::metadata::pairs as md;

    use super::*;

    #[test]
    fn metadata_is_read_and_checked() {
        let t = Target::from_reference(
            " http://127.0.0.1:9/mcp ",
            &md(&[("tool", "agent"), ("auth_env", "TOKEN"), ("protocol_version", "2025-06-18"), ("name", " ")]),
        )
        .unwrap();
        assert_eq!(t.endpoint, "http://127.0.0.1:9/mcp");
        assert_eq!(t.tool.as_deref(), Some("agent"));
        assert_eq!(t.auth_secret.as_deref(), Some("TOKEN"));
        assert_eq!(t.preference, Preference::Handshake);
        assert_eq!(t.name, None);
        assert!(Target::from_reference("stdio:server", &[]).unwrap_err().contains("http(s) URL"));
        let t = Target::from_reference("mcp-stdio:time", &md(&[("tool", "get_current_time")])).unwrap();
        assert_eq!(t.stdio.as_deref(), Some("time"));
        for bad in ["mcp-stdio:", "mcp-stdio:a/b", "mcp-stdio:a b", "mcp-stdio:../x"] {
            assert!(Target::from_reference(bad, &[]).unwrap_err().contains("server name"), "{bad}");
        }
        assert!(
            Target::from_reference("http://x", &md(&[("protocol_version", "1999")]))
                .unwrap_err()
                .contains("protocol_version")
        );
    }

    #[test]
    fn names_and_descriptions() {
        let tool: Tool = serde_json::from_value(json!({"name": "agent", "description": "Answers"})).unwrap();
        let server =
            ServerInfo { name: Some("test-agents".into()), instructions: Some("Use me".into()), ..Default::default() };
        let mut t = Target::from_reference("http://x/mcp", &[]).unwrap();
        assert_eq!(definition_name(&t, &server, &tool), "test-agents");
        assert_eq!(definition_description(&t, &server, &tool), "Answers");
        t.tool = Some("agent".into());
        assert_eq!(definition_name(&t, &server, &tool), "agent");
        t.name = Some("helper".into());
        t.description = Some("Helps".into());
        assert_eq!(definition_name(&t, &server, &tool), "helper");
        assert_eq!(definition_description(&t, &server, &tool), "Helps");
        let bare: Tool = serde_json::from_value(json!({"name": "agent"})).unwrap();
        let t = Target::from_reference("http://x/mcp", &[]).unwrap();
        assert_eq!(definition_description(&t, &server, &bare), "Use me");
        assert_eq!(definition_description(&t, &ServerInfo::default(), &bare), "MCP tool agent at http://x/mcp");
    }

    #[test]
    fn stdio_tools_are_the_named_servers_only() {
        let spec = |name: &str, description: &str, input_schema: &str| ToolSpec {
            name: name.into(),
            description: description.into(),
            input_schema: input_schema.into(),
        };
        let specs = vec![
            spec(
                "mcp__time__get_current_time",
                "Now",
                r#"{"type":"object","properties":{"timezone":{"type":"string"}},"required":["timezone"]}"#,
            ),
            spec("mcp__git__git_status", "Status", "{}"),
            spec("Bash", "Shell", "{}"),
        ];
        let tools = stdio_tools("time", &specs);
        assert_eq!(tools.len(), 1);
        assert_eq!(tools[0].name, "get_current_time");
        let (_, agent) = warden_mcp_protocol::select_agent_tool(&tools, None, None).unwrap();
        assert_eq!(agent.argument, "timezone");
    }

    #[test]
    fn progress_events() {
        let p = warden_mcp_protocol::Progress { token: json!("t"), progress: 1.0, total: Some(2.0), message: None };
        assert_eq!(progress_event(&p), json!({"progress": 1.0, "total": 2.0, "message": "1/2"}));
        let p = warden_mcp_protocol::Progress { message: Some("thinking".into()), ..p };
        assert_eq!(progress_event(&p)["message"], "thinking");
    }
}
