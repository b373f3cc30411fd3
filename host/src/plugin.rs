//! The SPI as host-side Rust types: what callers of the runtime see.
//!
//! These mirror the WIT records of `warden:plugin` but are owned by warden, so
//! bindgen output never leaks out of [`crate::runtime`]. This module holds data only.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::capability::Capability;

/// `SubagentReference(uri, kind, metadata)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubagentReference {
    pub uri: String,
    pub kind: String,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// A resolved subagent. What the host acts on is typed (`tools`, `permission_mode`,
/// `mcp_servers`, `egress`); `protocol_data` belongs to the plugin and the host never
/// reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubagentDefinition {
    pub name: String,
    pub description: String,
    pub kind: String,
    pub reference: SubagentReference,
    /// Tools (by name; `*` = all, `Bash(git:*)` = its tool) the subagent may use;
    /// `None` = every tool of the session. The tools import enforces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// The permission mode the subagent asks for, capped by the operator's `max_mode`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission_mode: Option<warden_approval::PermissionMode>,
    /// Operator-configured MCP servers whose tools the subagent may use.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<String>,
    /// MCP servers the subagent defines itself (WIT 0.3.0). The registry keeps them only
    /// when the operator allows agent-defined servers, and validated
    /// ([`crate::registry`]); a task reaches them through [`crate::mcp_tools`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agent_mcp_servers: Vec<AgentMcpServer>,
    /// `sandbox.egress.allow` patterns narrowing where its tool calls may reach; `None` =
    /// no narrowing (validated when the definition is registered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<String>>,
    /// Where its tasks run: `None` = in the calling session's sandbox. Not a WIT field:
    /// the registry fills it from the reference metadata
    /// ([`crate::isolation::ISOLATION_METADATA`]); see [`crate::isolation`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<Isolation>,
    /// Protocol-specific data (JSON text; `{}` when none), opaque to the host.
    pub protocol_data: String,
}

/// Where a task runs when not in its session's sandbox as it is: a definition's
/// `isolation` (a Claude agent file's `isolation: worktree`) or a task's (`isolation` on
/// `POST /v1/tasks`). See [`crate::isolation`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// In a fork of the session its parent works in (a new session of the same user on a
    /// copy of that workspace); its result names the fork and what changed in it.
    Fork,
}

impl Isolation {
    /// Every value, as the API spells it.
    pub const ACCEPTED: &[&str] = &["fork"];

    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Fork => "fork",
        }
    }

    /// Parses the API's spelling; `Err` names the value and the accepted ones.
    pub fn parse(value: &str) -> Result<Isolation, String> {
        match value {
            "fork" => Ok(Isolation::Fork),
            other => Err(format!(
                "unknown isolation {:?} (accepted: {})",
                crate::text::escape_control(&other.chars().take(64).collect::<String>()),
                Isolation::ACCEPTED.join(", ")
            )),
        }
    }
}

/// An MCP server a subagent defines itself (a Claude agent file's inline `mcpServers`
/// entry): a stdio program run in the calling session's sandbox. Plugin data: validated
/// by the registry before any task sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AgentMcpServer {
    /// Its name in tool names (`mcp__<name>__<tool>`).
    pub name: String,
    /// The program.
    pub command: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Its environment, literal values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
}

/// Longest subagent name a plugin may define: names are tool-schema enum values, CLI
/// columns and log fields.
pub const MAX_DEFINITION_NAME_BYTES: usize = 256;
/// Longest description: Claude agent files carry examples in theirs (a few KiB); the parent
/// agent reads every description in the tool schema.
pub const MAX_DEFINITION_DESCRIPTION_BYTES: usize = 64 * 1024;
/// Longest protocol data (a system prompt, a card): kept in the registry for as long as
/// the plugin is loaded and copied into every task of the subagent.
pub const MAX_PROTOCOL_DATA_BYTES: usize = 4 * 1024 * 1024;
/// Most entries of `tools` and `mcp-servers`, and of `egress` (as many as
/// `sandbox.egress.allow` takes): each list is copied into every task and scanned per
/// tool call.
pub const MAX_DEFINITION_LIST: usize = 256;
/// Most MCP servers one subagent may define itself: each may become a process in every
/// session that runs the subagent.
pub const MAX_AGENT_MCP_SERVERS: usize = 16;
/// Longest entry of those lists (a tool name with its pattern, a server name, a host),
/// and of an agent-defined server's name, command, arguments and environment entries
/// (each of which has at most [`MAX_DEFINITION_LIST`] words).
pub const MAX_DEFINITION_ENTRY_BYTES: usize = 1024;

/// Whether `name` may name a subagent: what the registry admits, whichever plugin
/// defined it and whether the name came from an agent file, a remote peer (an A2A card, an
/// MCP server's `serverInfo`) or the operator's reference metadata. A name is shown to the
/// parent agent in the Agent tool's description and schema, printed by the CLI, written in
/// log fields and used in paths (memory directories), so it is one line of plain ASCII:
/// a letter or digit, then letters, digits, spaces, `.`, `_` and `-`, not ending in a space,
/// at most [`MAX_DEFINITION_NAME_BYTES`] — or two such names joined by one `:` with no
/// space beside it (`plugin-name:agent-name`, a Claude Code plugin's agent). No control
/// character (a forged log line, a line injected into a prompt), no look-alike Unicode
/// letter (a peer posing as a local agent). `Err` says why, with the name escaped and cut.
/// A name refused here is registered under [`safe_subagent_id`] when that is a name.
pub fn check_subagent_name(name: &str) -> Result<(), String> {
    let shown = || format!("\"{}\"", crate::text::escape_control(&crate::text::excerpt(name, 64)));
    let part_ok = |part: &str| {
        part.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && part.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '.' | '_' | '-'))
            && !part.ends_with(' ')
    };
    let parts: Vec<&str> = name.splitn(2, ':').collect();
    if name.len() > MAX_DEFINITION_NAME_BYTES {
        Err(format!("the subagent name {} is {} bytes; at most {MAX_DEFINITION_NAME_BYTES}", shown(), name.len()))
    } else if !parts.iter().all(|p| part_ok(p)) {
        Err(format!(
            "the subagent name {} is not a name: it must start with an ASCII letter or digit and hold only those, spaces, `.`, `_` and `-` (not ending in a space), or be two such names joined by one `:`",
            shown()
        ))
    } else {
        Ok(())
    }
}

/// Whether `name` may name a Claude Code plugin (the namespace of its agents): a
/// subagent name without `:` or spaces.
pub fn check_plugin_name(name: &str) -> Result<(), String> {
    match name.contains([':', ' ']) {
        true => Err(format!(
            "the plugin name \"{}\" may not hold `:` or spaces",
            crate::text::escape_control(&crate::text::excerpt(name, 64))
        )),
        false => check_subagent_name(name).map_err(|e| e.replace("subagent name", "plugin name")),
    }
}

/// The id a subagent whose name [`check_subagent_name`] refuses is registered under
/// (Claude Code takes names such as `FP&A Analyst` or `Python DevOps/CI-CD Expert`, which
/// cannot be tool-schema values or path parts here): lower-case ASCII letters and digits,
/// `.` and `_` kept, every run of other characters (spaces, `&`, `/`, `(`, non-ASCII,
/// control characters) one `-`, no `-` or `.` at either end; each side of a single `:`
/// (a plugin's namespace) on its own. `None` when nothing is left or the result is still
/// not a name (over [`MAX_DEFINITION_NAME_BYTES`]). Distinct names may give the same id:
/// the registry then registers neither, as for any duplicate name.
pub fn safe_subagent_id(name: &str) -> Option<String> {
    let part = |p: &str| {
        let mut out = String::with_capacity(p.len());
        for c in p.chars() {
            match c {
                c if c.is_ascii_alphanumeric() || c == '.' || c == '_' => out.push(c.to_ascii_lowercase()),
                _ if !out.ends_with('-') => out.push('-'),
                _ => {}
            }
        }
        out.trim_matches(['-', '.']).to_string()
    };
    let id = match name.split_once(':') {
        Some((namespace, rest)) => format!("{}:{}", part(namespace), part(rest)),
        None => part(name),
    };
    check_subagent_name(&id).ok().map(|()| id)
}

impl SubagentDefinition {
    /// Checks what a plugin returned from `resolve` against the bounds above (a hostile
    /// plugin's definition lives in the registry and in every task): the first field over
    /// its bound, with the bound, or `Ok`.
    pub fn check_bounds(&self) -> Result<(), String> {
        let text = [
            ("name", &self.name, MAX_DEFINITION_NAME_BYTES),
            ("description", &self.description, MAX_DEFINITION_DESCRIPTION_BYTES),
            ("kind", &self.kind, MAX_DEFINITION_NAME_BYTES),
            ("protocol-data", &self.protocol_data, MAX_PROTOCOL_DATA_BYTES),
        ];
        for (field, value, max) in text {
            if value.len() > max {
                return Err(format!("the definition's {field} is {} bytes; at most {max}", value.len()));
            }
        }
        if self.agent_mcp_servers.len() > MAX_AGENT_MCP_SERVERS {
            return Err(format!(
                "the definition's agent-mcp-servers has {} entries; at most {MAX_AGENT_MCP_SERVERS}",
                self.agent_mcp_servers.len()
            ));
        }
        let server_words: Vec<Vec<String>> = self
            .agent_mcp_servers
            .iter()
            .map(|s| {
                let env = s.env.iter().flat_map(|(k, v)| [k.clone(), v.clone()]);
                [s.name.clone(), s.command.clone()].into_iter().chain(s.args.iter().cloned()).chain(env).collect()
            })
            .collect();
        let lists = [
            ("tools", self.tools.as_deref().unwrap_or_default()),
            ("mcp-servers", self.mcp_servers.as_slice()),
            ("egress", self.egress.as_deref().unwrap_or_default()),
        ]
        .into_iter()
        .chain(server_words.iter().map(|words| ("agent-mcp-servers", words.as_slice())));
        for (field, list) in lists {
            if list.len() > MAX_DEFINITION_LIST {
                return Err(format!(
                    "the definition's {field} has {} entries; at most {MAX_DEFINITION_LIST}",
                    list.len()
                ));
            }
            if list.iter().any(|e| e.len() > MAX_DEFINITION_ENTRY_BYTES) {
                return Err(format!("an entry of the definition's {field} is over {MAX_DEFINITION_ENTRY_BYTES} bytes"));
            }
        }
        Ok(())
    }

    /// A definition with none of the typed host fields set.
    pub fn new(name: String, description: String, reference: SubagentReference, protocol_data: String) -> Self {
        SubagentDefinition {
            name,
            description,
            kind: reference.kind.clone(),
            reference,
            tools: None,
            permission_mode: None,
            mcp_servers: vec![],
            agent_mcp_servers: vec![],
            egress: None,
            isolation: None,
            protocol_data,
        }
    }
}

/// The parent agent's Task call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskCall {
    pub description: String,
    pub prompt: String,
    pub subagent_type: String,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub resume: Option<String>,
    #[serde(default)]
    pub run_in_background: bool,
}

/// Who and when, for one execute call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskContext {
    pub task_id: String,
    pub session_id: String,
    pub user_id: String,
}

/// What a plugin says about itself.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    pub kinds: Vec<String>,
    pub capabilities: Vec<Capability>,
}

/// An error value a plugin returned (WIT `error`), or that a host import returns.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize)]
#[serde(tag = "code", content = "message", rename_all = "snake_case")]
pub enum GuestError {
    #[error("not found: {0}")]
    NotFound(String),
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("denied: {0}")]
    Denied(String),
    #[error("timeout: {0}")]
    Timeout(String),
    #[error("remote failure: {0}")]
    Remote(String),
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("input required: {0}")]
    InputRequired(String),
    #[error("internal error: {0}")]
    Internal(String),
    /// The task was canceled while the plugin waited (WIT 0.2.0 and later).
    #[error("canceled: {0}")]
    Canceled(String),
}

/// Event types only the host produces: the task lifecycle (`status`, `error`, `finish`),
/// the tools path (`tool_call`, `tool_result`, which count toward `max_tool_iterations`)
/// the approval gate, the sandbox's egress proxy (`egress`) and nested subagents
/// (`subagent`: a child task started). `events.emit` refuses them, so an event of one of
/// these types in a task's stream always comes from the host; every other event is marked
/// `"source": "plugin"`.
pub const HOST_EVENT_KINDS: [&str; 13] = [
    "status",
    "error",
    "finish",
    "plugin",
    "tool_call",
    "tool_result",
    "approval_request",
    "approval_resolved",
    "heartbeat",
    "egress",
    "subagent",
    "events_dropped",
    "takeover",
];

/// Whether `kind` is reserved for the host (compared case-insensitively, so `Tool_Call`
/// cannot pass for a different type in a case-folding consumer).
pub fn is_host_event_kind(kind: &str) -> bool {
    HOST_EVENT_KINDS.iter().any(|k| k.eq_ignore_ascii_case(kind))
}

/// One progress event a plugin emitted (`events.emit`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PluginEvent {
    pub plugin: String,
    pub kind: String,
    pub data: serde_json::Value,
}

/// Which plugin build ran a task: id (file stem), the version it reports and the
/// SHA-256 of its file. Sent as the task's `plugin` event and kept in its outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PluginRef {
    pub id: String,
    pub version: String,
    pub sha256: String,
}

/// A task's cancellation, raised by whoever runs the task and seen by every plugin call
/// serving it (WIT `cancel`, and the blocking imports that end early on it). Cloning
/// shares the signal. Raised once; later raises keep the first time.
#[derive(Debug, Clone)]
pub struct CancelSignal(std::sync::Arc<tokio::sync::watch::Sender<Option<std::time::Instant>>>);

impl Default for CancelSignal {
    fn default() -> Self {
        CancelSignal(std::sync::Arc::new(tokio::sync::watch::Sender::new(None)))
    }
}

impl CancelSignal {
    pub fn new() -> Self {
        Self::default()
    }

    /// Raises the signal (at the first call; later calls change nothing).
    pub fn cancel(&self) {
        self.0.send_if_modified(|at| {
            if at.is_some() {
                return false;
            }
            *at = Some(std::time::Instant::now());
            true
        });
    }

    /// When the signal was raised, if it was.
    pub fn canceled_at(&self) -> Option<std::time::Instant> {
        *self.0.borrow()
    }

    pub fn is_canceled(&self) -> bool {
        self.canceled_at().is_some()
    }

    /// Resolves once the signal is raised (at once if it already was).
    pub async fn canceled(&self) {
        let mut rx = self.0.subscribe();
        // The sender lives as long as `self`: `wait_for` cannot fail while we hold it.
        let _ = rx.wait_for(Option::is_some).await;
    }
}

#[cfg(test)]
mod bounds_tests {
    use super::*;
    use proptest::prelude::*;

    fn definition() -> SubagentDefinition {
        let reference = SubagentReference { uri: "x://y".into(), kind: "X".into(), metadata: BTreeMap::new() };
        SubagentDefinition::new("n".into(), "d".into(), reference, "{}".into())
    }

    proptest! {
        /// Whatever sizes a hostile plugin picks, a definition is accepted exactly when every
        /// field and list is within its bound.
        #[test]
        fn a_definition_is_refused_exactly_when_a_field_is_over_its_bound(
            name in 0..MAX_DEFINITION_NAME_BYTES * 2,
            description in 0..MAX_DEFINITION_DESCRIPTION_BYTES * 2,
            tools in 0..MAX_DEFINITION_LIST * 2,
            servers in 0..MAX_DEFINITION_LIST * 2,
            egress in 0..MAX_DEFINITION_LIST * 2,
            entry in 1..MAX_DEFINITION_ENTRY_BYTES * 2,
            agent_servers in 0..MAX_AGENT_MCP_SERVERS * 2,
            agent_args in 0..MAX_DEFINITION_LIST * 2,
        ) {
            let mut d = definition();
            d.name = "n".repeat(name);
            d.description = "d".repeat(description);
            d.tools = Some(vec!["t".repeat(entry); tools]);
            d.mcp_servers = vec!["s".into(); servers];
            d.egress = Some(vec!["e".into(); egress]);
            let server = AgentMcpServer {
                name: "m".into(),
                command: "c".into(),
                args: vec!["a".repeat(entry); agent_args],
                env: vec![],
            };
            d.agent_mcp_servers = vec![server; agent_servers];
            // A server's words: its name, command and arguments.
            let server_words = agent_args + 2;
            let within = name <= MAX_DEFINITION_NAME_BYTES
                && description <= MAX_DEFINITION_DESCRIPTION_BYTES
                && tools <= MAX_DEFINITION_LIST
                && servers <= MAX_DEFINITION_LIST
                && egress <= MAX_DEFINITION_LIST
                && (tools == 0 || entry <= MAX_DEFINITION_ENTRY_BYTES)
                && agent_servers <= MAX_AGENT_MCP_SERVERS
                && (agent_servers == 0
                    || (server_words <= MAX_DEFINITION_LIST && (agent_args == 0 || entry <= MAX_DEFINITION_ENTRY_BYTES)));
            prop_assert_eq!(d.check_bounds().is_ok(), within, "{:?}", d.check_bounds());
        }
    }

    proptest! {
        /// Whatever a plugin or its peer calls a subagent, an admitted name is one line of
        /// plain ASCII within its bound; names made of the allowed characters pass.
        #[test]
        fn an_admitted_subagent_name_is_one_plain_line(name in prop_oneof![any::<String>(), ".{0,300}", "[A-Za-z0-9][A-Za-z0-9 ._-]{0,300}"]) {
            match check_subagent_name(&name) {
                Ok(()) => {
                    prop_assert!(!name.is_empty() && name.len() <= MAX_DEFINITION_NAME_BYTES);
                    prop_assert!(name.chars().all(|c| c.is_ascii_graphic() || c == ' '), "{:?}", name);
                    prop_assert!(!name.starts_with(' ') && !name.ends_with(' '));
                }
                Err(e) => {
                    prop_assert!(!e.chars().any(char::is_control), "{:?}", e);
                    prop_assert!(e.len() < 1024, "{}", e.len());
                }
            }
        }

        #[test]
        fn plain_names_are_admitted(name in "[A-Za-z0-9]([A-Za-z0-9 ._-]{0,200}[A-Za-z0-9._-])?") {
            prop_assert!(check_subagent_name(&name).is_ok(), "{:?}", name);
        }
    }

    #[test]
    fn subagent_names_of_the_bundled_kinds_are_admitted() {
        for name in ["general-purpose", "code-reviewer", "Explore", "Currency Agent", "mcp_tool.v2", "a"] {
            assert!(check_subagent_name(name).is_ok(), "{name}");
        }
        for name in ["", " a", "a ", "a\nb", "-x", "général", "a/b", "helper: x", "a\u{202e}b", "a:b:c", ":a", "a:"] {
            assert!(check_subagent_name(name).is_err(), "{name:?}");
        }
        assert!(check_subagent_name("code-review:reviewer").is_ok(), "a plugin's agent");
        assert!(check_plugin_name("code-review").is_ok());
        assert!(check_plugin_name("a:b").is_err() && check_plugin_name("a b").is_err());
    }

    /// Names Claude Code takes were refused (11 real files): they are registered under a
    /// derived id, which is a name; names already admitted keep theirs.
    #[test]
    fn regression_names_claude_code_takes_were_refused() {
        for (name, id) in [
            ("FP&A Analyst", "fp-a-analyst"),
            ("SRE (Site Reliability Engineer)", "sre-site-reliability-engineer"),
            ("Python DevOps/CI-CD Expert", "python-devops-ci-cd-expert"),
            ("plugin:Code Reviewer!", "plugin:code-reviewer"),
            ("r\u{e9}sum\u{e9} \u{202e}helper\n", "r-sum-helper"),
            ("-x", "x"),
        ] {
            assert!(check_subagent_name(name).is_err(), "{name:?}");
            assert_eq!(safe_subagent_id(name).as_deref(), Some(id), "{name:?}");
        }
        for hopeless in ["", "&&&", "\u{202e}", "a:"] {
            assert_eq!(safe_subagent_id(hopeless), None, "{hopeless:?}");
        }
    }

    proptest! {
        /// Whatever the name, a derived id is admitted.
        #[test]
        fn a_derived_id_is_always_a_name(name in prop_oneof![any::<String>(), ".{0,300}"]) {
            if let Some(id) = safe_subagent_id(&name) {
                prop_assert!(check_subagent_name(&id).is_ok(), "{:?} -> {:?}", name, id);
            }
        }
    }

    #[test]
    fn protocol_data_over_its_bound_is_refused() {
        let mut d = definition();
        d.protocol_data = " ".repeat(MAX_PROTOCOL_DATA_BYTES);
        assert!(d.check_bounds().is_ok());
        d.protocol_data.push(' ');
        assert!(d.check_bounds().unwrap_err().contains("protocol-data"));
    }
}
