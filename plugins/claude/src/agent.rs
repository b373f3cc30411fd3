//! A Claude agent definition, from a Markdown file with YAML frontmatter.
//!
//! The executor gets everything it needs back from the definition's `protocol-data`, a JSON
//! object of shape [`ProtocolData`]:
//!
//! ```json
//! {
//!   "system_prompt": "…the Markdown body…",
//!   "tools": null,                 // null: every session tool; []: none; ["Read", …]: these
//!   "disallowed_tools": [],        // removed after `tools`
//!   "model": null,                 // or "sonnet", "inherit", "provider/model", …
//!   "skills": [],                  // skill names preloaded into the system prompt
//!   "permission_mode": null,       // e.g. "plan", "acceptEdits" (the host caps it)
//!   "max_turns": null,             // positive integer; the executor defaults to 10
//!   "mcp_servers": null,           // as written in the file
//!   "egress": null,                // ["pypi.org", …]: hosts its tool calls may reach at
//!                                  // most (the host narrows `sandbox.egress` by it)
//!   "initial_prompt": null,        // `initialPrompt`: put before every fresh task's prompt
//!   "background": false,           // `background`: the host runs tasks in the background by default
//!   "effort": null,                // `effort`: low, medium, high, xhigh or max (lower case)
//!   "memory": null,                // `memory`: user, project or local (see [`memory_dir`])
//!   "hooks": {},                   // `hooks`: the command hooks warden runs, by event (crate::hooks)
//!   "isolation": null,             // `isolation`: "worktree" (the host runs the tasks in a fork)
//!   "color": null,                 // `color`, cosmetic
//!   "extra": {}                    // every unknown frontmatter key, as JSON
//! }
//! ```
//!
//! The host never reads `protocol-data`: what it acts on — `tools`, the permission mode,
//! the MCP server names, the inline (agent-defined) MCP servers and `egress` — is also
//! handed over as the definition's typed fields (WIT 0.3.0), and `background: true`,
//! `effort` and `isolation: worktree` as the reference metadata entries `background=true`,
//! `effort=<level>` and `isolation=fork` (every task of the agent runs in a fork of the
//! session its parent works in, and its result names the fork and what changed; the
//! WIT has no typed fields for them; the host
//! reads those keys of any definition, the operator's reference metadata winning). The host
//! hands the effort to every model call of the agent's tasks, as the provider's reasoning
//! setting where it has one (`reasoning_effort` of OpenAI-compatible servers).
//!
//! Every field Claude Code documents has a meaning here ([`FIELDS`]): applied, or refused
//! with a warning (the field is ignored) or an error (the file is not registered, when
//! running without the field would do what its author forbade: an `isolation` other than
//! [`ISOLATION_VALUES`], and `hooks` warden cannot run exactly).
//! Unknown fields are warnings, with a "did you mean" for near misses of known names; the
//! plugin logs every warning while resolving and `warden agents` lists them as problems.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::frontmatter::{self, ParseMode};
use crate::hooks::{self, Hooks};
use warden_guest::{Error, Metadata};

/// The executor's view of an agent (the definition's `protocol-data`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProtocolData {
    #[serde(default)]
    pub system_prompt: String,
    /// `None`: all session tools; `Some([])`: no tools.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    #[serde(default)]
    pub disallowed_tools: Vec<String>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub skills: Vec<String>,
    #[serde(default)]
    pub permission_mode: Option<String>,
    #[serde(default)]
    pub max_turns: Option<u32>,
    #[serde(default)]
    pub mcp_servers: Option<Value>,
    /// `egress` (warden's): the hosts the agent's tool calls may reach at most; handed to the
    /// host as the definition's typed `egress`, which can only narrow the operator's list.
    #[serde(default)]
    pub egress: Option<Vec<String>>,
    /// `initialPrompt`: text put before the prompt of every fresh (not resumed) task.
    #[serde(default)]
    pub initial_prompt: Option<String>,
    /// `background: true`: tasks run in the background unless the caller says otherwise
    /// (the host acts on the reference metadata entry `background=true`, see the module docs).
    #[serde(default)]
    pub background: bool,
    /// `effort`: one of [`EFFORT_LEVELS`] (handed to the host as the reference metadata
    /// entry [`EFFORT_METADATA`]); another value is a warning and is dropped.
    #[serde(default)]
    pub effort: Option<String>,
    /// `memory`: one of [`MEMORY_SCOPES`]; the agent keeps notes in [`memory_dir`], whose
    /// `MEMORY.md` starts every fresh task's system prompt. Another value is a warning.
    #[serde(default)]
    pub memory: Option<String>,
    /// `hooks`: the command hooks warden runs, by event ([`crate::hooks`]); a file with
    /// hooks that could forbid and that warden cannot run exactly is not registered.
    #[serde(default)]
    pub hooks: Hooks,
    /// `isolation: worktree`: the host runs every task of the agent in a fork of its
    /// parent's session (reference metadata [`ISOLATION_METADATA`]); another value keeps the file
    /// from being registered.
    #[serde(default)]
    pub isolation: Option<Isolation>,
    /// `color`: how Claude Code shows the agent; cosmetic, no effect in warden.
    #[serde(default)]
    pub color: Option<String>,
    /// Frontmatter keys that are not fields of a Claude agent file (each one is a warning).
    #[serde(default)]
    pub extra: Map<String, Value>,
}

/// The fields of a Claude agent file, as Claude Code documents them (plus warden's own
/// `egress`): the canonical spelling first; these are the names unknown keys are compared
/// with for a "did you mean".
pub const FIELDS: &[&str] = &[
    "name",
    "description",
    "tools",
    "disallowedTools",
    "model",
    "permissionMode",
    "maxTurns",
    "skills",
    "mcpServers",
    "hooks",
    "memory",
    "background",
    "effort",
    "isolation",
    "initialPrompt",
    "color",
    "egress",
];

/// A Claude agent file's `isolation`: where its tasks run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// `worktree`: in a temporary copy of the parent's workspace (Claude Code: a git
    /// worktree; warden: a fork of the parent's sandbox session, `isolation=fork`).
    Worktree,
}

impl Isolation {
    /// The host's name for it, the value of [`ISOLATION_METADATA`].
    pub fn host_name(self) -> &'static str {
        match self {
            Isolation::Worktree => "fork",
        }
    }
}

/// The reference metadata key by which a definition asks the host to run every task of
/// it in a fork of its parent's session (`isolation=fork`); the host reads it (the WIT
/// has no typed field for it).
pub const ISOLATION_METADATA: &str = "isolation";

/// The `isolation` values an agent file may give ([`Isolation`]); another is refused.
pub const ISOLATION_VALUES: &[&str] = &["worktree"];

/// The file's `isolation`, or the refusal naming the value and the accepted ones (running
/// it in the calling session would change files its author wanted kept apart).
fn isolation(value: Option<Value>) -> Result<Option<Isolation>, String> {
    let value = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(value) => value,
    };
    let text = match &value {
        Value::String(s) => s.trim().to_string(),
        other => other.to_string(),
    };
    if text.eq_ignore_ascii_case("worktree") {
        return Ok(Some(Isolation::Worktree));
    }
    let shown: String = text.chars().take(64).collect();
    Err(format!(
        "`isolation: {shown}` is not supported (accepted: {}); the agent is not registered, since running it in the calling session would change files its author wanted kept apart",
        ISOLATION_VALUES.join(", ")
    ))
}

/// The reference metadata key by which a definition asks the host to run its tasks in the
/// background when the caller does not say (`background: true`); the host reads it.
pub const BACKGROUND_METADATA: &str = "background";

/// The reference metadata key by which a definition asks the host for a reasoning effort
/// (`effort`); the host reads it.
pub const EFFORT_METADATA: &str = "effort";

/// The reference metadata key by which a definition hands the host its `disallowedTools`
/// entries with an argument pattern (`Bash(rm -rf*)`), as a JSON list: the host enforces
/// them as deny rules for the agent's calls (whole-tool entries the plugin simply does not
/// offer). The host reads this key of any definition, adding the operator's.
pub const DISALLOWED_TOOLS_METADATA: &str = "disallowed_tools";

/// The `disallowedTools` entries the host enforces as deny rules: those with an argument
/// pattern (`Tool(…)`).
pub fn disallowed_patterns(protocol: &ProtocolData) -> Vec<String> {
    protocol.disallowed_tools.iter().filter(|t| crate::toolset::base_name(t).1).cloned().collect()
}

/// The values of `effort`, as Claude Code accepts them (the Claude API's effort levels).
pub const EFFORT_LEVELS: &[&str] = &["low", "medium", "high", "xhigh", "max"];

/// The values of `memory`, as Claude Code names them.
pub const MEMORY_SCOPES: &[&str] = &[USER_SCOPE, "project", "local"];

/// The `memory` scope whose notes outlive the session ([`crate::memory`]).
pub const USER_SCOPE: &str = "user";

/// The tools an agent with `memory` gets besides its `tools` list, so it can read and keep
/// its notes (Claude Code enables the same three); the approval policy still judges each call.
pub const MEMORY_TOOLS: &[&str] = &["Read", "Write", "Edit"];

/// The tool the host must let an agent with `memory: user` use besides those, to list its
/// memory directory when a task ends (the model is not offered it for that).
pub const MEMORY_LIST_TOOL: &str = "Glob";

/// Where an agent's memory lives: a directory of the session's workspace, one per scope and
/// agent, named as Claude Code names them under a project (`user` gets its own name since
/// the sandbox has no home directory). A sandbox session belongs to one principal, so each
/// directory is per (principal, session, agent) and lasts as long as the session's
/// workspace; `user` memory is also saved per (principal, agent) and put back in the
/// principal's new sessions (`memory.rs`). The last part is [`memory_dir_name`].
pub fn memory_dir(scope: &str, agent: &str) -> String {
    let dir = match scope {
        USER_SCOPE => "agent-memory-user",
        "local" => "agent-memory-local",
        _ => "agent-memory",
    };
    format!("/workspace/.claude/{dir}/{}", memory_dir_name(agent))
}

/// What [`memory_dir_name`] puts for every byte it does not keep: `%` and two upper-case hex
/// digits, as in a URL.
const NAME_ESCAPE: char = '%';

/// The name of an agent's memory directory (and of its `user` memory's state key): the
/// agent's exact name, readable and **injective**, so two agents never share notes (a
/// hostile file named `code reviewer` must not get the trusted `code-reviewer`'s). Letters,
/// digits, `_`, `-` and a `.` that is not first are kept; every other byte of the UTF-8 name
/// (`%` itself, `/`, spaces, control and invisible characters, a leading `.`) becomes
/// `%XX`. Percent-decoding gives the name back, so distinct names get distinct directories;
/// the result is one plain path part (never empty, `.` or `..`, no `/` or control
/// character). The empty name (the resolver refuses it) is `%`, which no other name gives:
/// every other `%` is followed by two hex digits.
pub fn memory_dir_name(agent: &str) -> String {
    if agent.is_empty() {
        return NAME_ESCAPE.to_string();
    }
    let mut name = String::with_capacity(agent.len());
    for (i, b) in agent.bytes().enumerate() {
        let kept = b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || (b == b'.' && i > 0);
        match kept {
            true => name.push(char::from(b)),
            false => name.push_str(&format!("{NAME_ESCAPE}{b:02X}")),
        }
    }
    name
}

/// The tools the host lets the agent's tasks call (the definition's typed `tools`): its
/// `tools` list, plus `Bash` when it has hooks, which run as Bash commands, and `Glob` with
/// `memory: user`, which lists the memory directory to save it (`memory.rs`). The
/// plugin still offers the model only the `tools` list ([`crate::toolset`]), so neither is
/// the model's.
pub fn host_tools(protocol: &ProtocolData) -> Option<Vec<String>> {
    let mut tools = protocol.tools.clone()?;
    let has =
        |tools: &[String], name: &str| tools.iter().any(|t| t == "*" || crate::toolset::base_name(t) == (name, false));
    if !protocol.hooks.is_empty() && !has(&tools, "Bash") {
        tools.push("Bash".into());
    }
    if protocol.memory.as_deref() == Some(USER_SCOPE) && !has(&tools, MEMORY_LIST_TOOL) {
        tools.push(MEMORY_LIST_TOOL.into());
    }
    Some(tools)
}

/// Keys community agent files carry for their own bookkeeping; accepted without a warning
/// and without effect.
pub const INFORMATIONAL_KEYS: &[&str] = &["version", "author", "tags"];

/// How far (edits, case ignored) an unknown key may be from a field to be suggested: two
/// catches the usual typos (`maxTurn`, `permisionMode`, `tool`) without suggesting `name`
/// for every four-letter word.
pub const SUGGESTION_DISTANCE: usize = 2;

/// An inline `mcpServers` entry as the host's `agent-mcp-server` (WIT 0.3.0): a stdio
/// program, its arguments and its literal environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InlineMcpServer {
    pub name: String,
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// The keys an inline entry may have (`.mcp.json`'s stdio shape); anything else would be a
/// setting warden does not apply, so the entry is refused rather than run differently.
const INLINE_SERVER_KEYS: &[&str] = &["name", "type", "command", "args", "env"];

impl InlineMcpServer {
    fn from_entry(name: String, body: &Value) -> Result<Self, String> {
        let Value::Object(o) = body else {
            return Err("expected a map with `command` (and `args`, `env`)".into());
        };
        if o.contains_key("url") || !matches!(o.get("type").and_then(Value::as_str), None | Some("stdio")) {
            return Err("only a stdio server (`command`) can be agent-defined: warden never reaches an address an \
                        agent file names, so configure an HTTP server under the operator's `mcp_servers` and name it here"
                .into());
        }
        if let Some(key) = o.keys().find(|k| !INLINE_SERVER_KEYS.contains(&k.as_str())) {
            return Err(format!("unknown key `{key}` (expected {})", INLINE_SERVER_KEYS.join(", ")));
        }
        let command = o.get("command").and_then(Value::as_str).ok_or("it has no `command` text")?.to_owned();
        let args = match o.get("args") {
            None | Some(Value::Null) => vec![],
            Some(Value::Array(items)) => items
                .iter()
                .map(|a| a.as_str().map(str::to_owned).ok_or("`args` must be a list of text"))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err("`args` must be a list of text".into()),
        };
        let env = match o.get("env") {
            None | Some(Value::Null) => vec![],
            Some(Value::Object(env)) => env
                .iter()
                .map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())).ok_or("`env` values must be text"))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err("`env` must be a map of text".into()),
        };
        Ok(InlineMcpServer { name, command, args, env })
    }
}

/// A Claude agent file's `permissionMode` (the host's typed `permission-mode`, WIT 0.2.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermissionMode {
    Default,
    AcceptEdits,
    Plan,
    DontAsk,
    BypassPermissions,
}

impl PermissionMode {
    /// The mode named as in agent files (`acceptEdits`, ...), or `None` for another name.
    /// `auto` (Claude Code's reviewer-approved mode) is `default`: warden has no automatic
    /// reviewer, so what would be reviewed is asked as the policy says.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name.trim() {
            "default" | "auto" => Self::Default,
            "acceptEdits" => Self::AcceptEdits,
            "plan" => Self::Plan,
            "dontAsk" => Self::DontAsk,
            "bypassPermissions" => Self::BypassPermissions,
            _ => return None,
        })
    }
}

impl ProtocolData {
    /// The permission mode the agent asks for; an unknown name is a warning (the host then
    /// applies the operator's policy unchanged), and so is `auto` (applied as `default`).
    pub fn permission_mode(&self) -> (Option<PermissionMode>, Option<String>) {
        match self.permission_mode.as_deref() {
            None => (None, None),
            Some(name) => match PermissionMode::parse(name) {
                Some(m) if name.trim() == "auto" => (
                    Some(m),
                    Some("permissionMode `auto` is applied as `default`: warden has no automatic reviewer, so calls the policy marks `ask` are asked".into()),
                ),
                Some(m) => (Some(m), None),
                None => (
                    None,
                    Some(format!(
                        "unknown permissionMode {name:?} ignored (expected default, acceptEdits, plan, dontAsk, bypassPermissions or auto)"
                    )),
                ),
            },
        }
    }

    /// The names of operator-configured MCP servers in `mcpServers`: a list of names or
    /// comma-separated text. Inline definitions (`{server: {command: …}}`, a map keyed by
    /// name) are the agent's own servers: see [`Self::inline_mcp_servers`].
    pub fn mcp_server_names(&self) -> Vec<String> {
        match &self.mcp_servers {
            Some(Value::Array(items)) => items.iter().filter_map(|i| i.as_str().map(str::to_owned)).collect(),
            Some(Value::String(s)) => s.split(',').map(|x| x.trim().to_owned()).filter(|x| !x.is_empty()).collect(),
            _ => vec![],
        }
    }

    /// The inline MCP server definitions in `mcpServers` (`{server: {command: …}}` list
    /// items, a map keyed by name, `{name: …, command: …}`), as the host's typed
    /// `agent-mcp-servers` (WIT 0.3.0), and a warning for each entry that cannot be one.
    /// The host runs them only when the operator allows agent-defined servers
    /// (`subagents.allow_agent_mcp_servers`, its problem otherwise). Only stdio servers:
    /// an entry with a `url` (or another `type`) is refused here, since the host never
    /// reaches an address an agent file names.
    pub fn inline_mcp_servers(&self) -> (Vec<InlineMcpServer>, Vec<String>) {
        let entries: Vec<(Option<String>, &Value)> = match &self.mcp_servers {
            Some(Value::Array(items)) => items
                .iter()
                .filter(|i| !i.is_string())
                .map(|i| match i {
                    Value::Object(o) if o.len() == 1 && o.values().all(Value::is_object) => {
                        let (name, body) = o.iter().next().expect("one entry");
                        (Some(name.clone()), body)
                    }
                    Value::Object(o) => (o.get("name").and_then(Value::as_str).map(str::to_owned), i),
                    other => (None, other),
                })
                .collect(),
            Some(Value::Object(map)) => map.iter().map(|(k, v)| (Some(k.clone()), v)).collect(),
            Some(Value::String(_)) | None | Some(Value::Null) => vec![],
            Some(other) => vec![(None, other)],
        };
        let (mut servers, mut warnings) = (vec![], vec![]);
        for (name, body) in entries {
            let shown = name.clone().unwrap_or_else(|| "?".into());
            match name.ok_or_else(|| "it has no name".to_owned()).and_then(|n| InlineMcpServer::from_entry(n, body)) {
                Ok(server) => servers.push(server),
                Err(why) => warnings.push(format!("inline MCP server `{shown}` in `mcpServers` refused: {why}")),
            }
        }
        (servers, warnings)
    }

    /// Reads a definition's `protocol-data` (`{}` and missing fields give the defaults).
    pub fn from_json(json: &str) -> Result<Self, Error> {
        let json = if json.trim().is_empty() { "{}" } else { json };
        serde_json::from_str(json)
            .map_err(|e| Error::InvalidInput(format!("protocol-data of a CLAUDE definition: {e}")))
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("protocol data serialises")
    }
}

/// A resolved agent file.
#[derive(Debug, Clone)]
pub struct Agent {
    pub name: String,
    pub description: String,
    pub protocol: ProtocolData,
    /// How the frontmatter was read.
    pub mode: ParseMode,
    /// For the log: fallbacks taken, values ignored.
    pub warnings: Vec<String>,
    /// Why the file must not be registered: fields it uses whose absence could allow what
    /// they forbid (`hooks`, an `isolation` warden cannot honour). Empty when it may be.
    /// See [`Agent::registrable`].
    pub refusals: Vec<String>,
}

impl Agent {
    /// The agent, or `invalid-input` naming the file and every refusal. The warnings are
    /// the caller's to report first, so a refused file still hears about its typos.
    pub fn registrable(self, uri: &str) -> Result<Agent, Error> {
        match self.refusals.is_empty() {
            true => Ok(self),
            false => Err(Error::InvalidInput(format!("{uri}: {}", self.refusals.join("; ")))),
        }
    }
}

/// The reference metadata keys by which the host hands over a Claude Code plugin's own
/// hooks file (`hooks/hooks.json`, or the one its `plugin.json` names) and MCP servers
/// file (`.mcp.json`, or its `plugin.json`'s `mcpServers`), as JSON text, for each agent of
/// the plugin (`subagents.plugin_dirs`): see [`apply_plugin_files`].
pub const PLUGIN_HOOKS_METADATA: &str = "claude_plugin_hooks";
/// See [`PLUGIN_HOOKS_METADATA`].
pub const PLUGIN_MCP_METADATA: &str = "claude_plugin_mcp";

/// The variable Claude Code sets to a plugin's folder in its hooks and MCP servers. The
/// folder is on the host, not in the session's sandbox, so a command naming it cannot run
/// there (a hook would fail as a non-blocking error, passing every call).
pub const PLUGIN_ROOT_VARIABLE: &str = "CLAUDE_PLUGIN_ROOT";

/// A Claude Code plugin's files an agent of it also gets, as Claude Code applies them:
/// the hooks of its hooks file (`{"hooks": {event: [...]}}`), added to the agent's own and
/// read by the same rules ([`crate::hooks`]), and the MCP servers of its MCP file
/// (`{"mcpServers": {...}}` or the servers map itself), added to its inline `mcpServers`
/// (so the host runs them only under `subagents.allow_agent_mcp_servers`). A file that is
/// not a JSON object refuses the agent: its hooks could forbid what the agent would then
/// do. A hook or server whose command names [`PLUGIN_ROOT_VARIABLE`] is not run (a refusal
/// for a hook of an event that can forbid, a warning otherwise).
pub fn apply_plugin_files(agent: &mut Agent, hooks_file: Option<&str>, mcp_file: Option<&str>) {
    let json_file = |name: &str, text: Option<&str>, refusals: &mut Vec<String>| -> Option<Map<String, Value>> {
        match serde_json::from_str::<Value>(text?) {
            Ok(Value::Object(o)) => Some(o),
            Ok(_) => {
                refusals.push(format!("the plugin's {name} is not a JSON object"));
                None
            }
            Err(e) => {
                refusals.push(format!("the plugin's {name} is not valid JSON ({e})"));
                None
            }
        }
    };
    if let Some(file) = json_file("hooks file", hooks_file, &mut agent.refusals) {
        let parsed = hooks::parse(file.get("hooks").unwrap_or(&Value::Object(Map::new())));
        let said = |what: &String| format!("the plugin's hooks: {what}");
        agent.warnings.extend(parsed.warnings.iter().map(said));
        agent.refusals.extend(parsed.refusals.iter().map(said));
        let mut plugin_hooks = parsed.hooks;
        for (event, groups) in plugin_hooks.by_event_mut() {
            for group in groups.iter_mut() {
                group.commands.retain(|c| {
                    if !c.command.contains(PLUGIN_ROOT_VARIABLE) {
                        return true;
                    }
                    let what = format!(
                        "the plugin's hooks: the `{event}` hook `{}` runs a file of the plugin's folder (${PLUGIN_ROOT_VARIABLE}), which is not in the session's sandbox",
                        c.command
                    );
                    match hooks::event_named(event).is_some_and(|e| e.narrows) {
                        true => agent.refusals.push(format!("{what}; the agent is not registered, since running it without that hook could allow what it forbids")),
                        false => agent.warnings.push(format!("{what}; ignored")),
                    }
                    false
                });
            }
            groups.retain(|g| !g.commands.is_empty());
        }
        agent.protocol.hooks.extend(plugin_hooks);
    }
    if let Some(file) = json_file("MCP servers file", mcp_file, &mut agent.refusals) {
        let servers = match file.get("mcpServers") {
            Some(Value::Object(servers)) => servers.clone(),
            _ => file,
        };
        let mut entries: Vec<Value> = match agent.protocol.mcp_servers.take() {
            None | Some(Value::Null) => vec![],
            Some(Value::Array(items)) => items,
            Some(Value::String(names)) => {
                names.split(',').map(str::trim).filter(|n| !n.is_empty()).map(Value::from).collect()
            }
            Some(Value::Object(map)) => map.into_iter().map(|(k, v)| Value::Object(Map::from_iter([(k, v)]))).collect(),
            Some(other) => vec![other],
        };
        for (name, body) in servers {
            if body.to_string().contains(PLUGIN_ROOT_VARIABLE) {
                agent.warnings.push(format!(
                    "the plugin's MCP servers: server `{name}` runs a file of the plugin's folder (${PLUGIN_ROOT_VARIABLE}), which is not in the session's sandbox; ignored"
                ));
                continue;
            }
            entries.push(Value::Object(Map::from_iter([(name, body)])));
        }
        if !entries.is_empty() {
            agent.protocol.mcp_servers = Some(Value::Array(entries));
        }
    }
}

/// Builds an agent from a file's bytes. `uri` names the file in errors and gives the
/// fallback name (its stem); `metadata` `name` / `description` override the file's.
pub fn parse_agent(uri: &str, bytes: &[u8], metadata: &[(String, String)]) -> Result<Agent, Error> {
    let invalid = |what: &str| Error::InvalidInput(format!("{uri}: {what}"));
    let text = std::str::from_utf8(bytes).map_err(|e| invalid(&format!("not UTF-8 text ({e})")))?;
    let (frontmatter, body) = frontmatter::split(text).map_err(|e| invalid(e.describe()))?;
    if frontmatter.len() > frontmatter::MAX_FRONTMATTER_BYTES {
        return Err(invalid(&format!(
            "the YAML frontmatter is {} bytes; at most {} bytes",
            frontmatter.len(),
            frontmatter::MAX_FRONTMATTER_BYTES
        )));
    }
    let fields = frontmatter::parse_fields(&frontmatter);
    let mut warnings = fields.warnings;
    let mut map = fields.map;
    let meta = |key: &str| Metadata::new(metadata).get(key).map(str::to_string);

    let name = match take(&mut map, &["name"]).and_then(scalar_text) {
        Some(name) => name,
        None => file_stem(uri).to_string(),
    };
    let name = meta("name").unwrap_or(name);
    if name.is_empty() {
        return Err(invalid("no `name` in the frontmatter and no file name to fall back on"));
    }
    let description = take(&mut map, &["description"]).and_then(scalar_text);
    let description = meta("description").or(description).ok_or_else(|| {
        invalid("the frontmatter has no `description` (the parent agent needs one to pick this subagent)")
    })?;

    let tools = match take(&mut map, &["tools"]) {
        None | Some(Value::Null) => None,
        Some(value) => Some(name_list(&value)),
    };
    let disallowed_tools = take(&mut map, &["disallowedTools", "disallowed_tools", "disallowed-tools"])
        .map(|v| name_list(&v))
        .unwrap_or_default();
    let model = take(&mut map, &["model"]).and_then(scalar_text);
    let skills = take(&mut map, &["skills"]).map(|v| name_list(&v)).unwrap_or_default();
    let permission_mode =
        take(&mut map, &["permissionMode", "permission_mode", "permission-mode"]).and_then(scalar_text);
    let max_turns = match take(&mut map, &["maxTurns", "max_turns", "max-turns"]) {
        None | Some(Value::Null) => None,
        Some(value) => {
            let turns = match &value {
                Value::Number(n) => n.as_u64(),
                Value::String(s) => s.trim().parse::<u64>().ok(),
                _ => None,
            };
            match turns.filter(|&t| t > 0).and_then(|t| u32::try_from(t).ok()) {
                Some(t) => Some(t),
                None => {
                    warnings.push(format!("ignored `maxTurns: {value}` (expected a positive integer)"));
                    None
                }
            }
        }
    };
    let mcp_servers = take(&mut map, &["mcpServers", "mcp_servers", "mcp-servers"]).filter(|v| !v.is_null());
    let egress = take(&mut map, &["egress"]).filter(|v| !v.is_null()).map(|v| name_list(&v));
    let initial_prompt = take(&mut map, &["initialPrompt", "initial_prompt", "initial-prompt"]).and_then(scalar_text);
    let background = match take(&mut map, &["background"]) {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => b,
        Some(Value::String(s)) if s.trim() == "true" => true,
        Some(Value::String(s)) if s.trim() == "false" => false,
        Some(other) => {
            warnings.push(format!("ignored `background: {other}` (expected true or false)"));
            false
        }
    };
    let effort = one_of(take(&mut map, &["effort"]), "effort", EFFORT_LEVELS, "the model's default effort applies")
        .unwrap_or_else(|w| {
            warnings.push(w);
            None
        });
    let color = take(&mut map, &["color"]).and_then(scalar_text);
    let memory =
        one_of(take(&mut map, &["memory"]), "memory", MEMORY_SCOPES, "the agent runs without persistent memory")
            .unwrap_or_else(|w| {
                warnings.push(w);
                None
            });
    // An agent with memory can always reach its notes, as in Claude Code.
    let tools = match (tools, &memory) {
        (Some(mut list), Some(_)) => {
            for tool in MEMORY_TOOLS {
                if !list.iter().any(|t| crate::toolset::base_name(t).0 == *tool || t == "*") {
                    list.push(tool.to_string());
                }
            }
            Some(list)
        }
        (tools, _) => tools,
    };
    let mut refusals = Vec::new();
    let hooks = match take(&mut map, &["hooks"]).filter(|v| !v.is_null()) {
        None => Hooks::default(),
        Some(value) => {
            let parsed = hooks::parse(&value);
            warnings.extend(parsed.warnings);
            refusals.extend(parsed.refusals);
            parsed.hooks
        }
    };
    let isolation = isolation(take(&mut map, &["isolation"])).unwrap_or_else(|refusal| {
        refusals.push(refusal);
        None
    });
    for key in INFORMATIONAL_KEYS {
        map.remove(*key);
    }
    for key in map.keys() {
        warnings.push(unknown_field_warning(key));
    }

    let protocol = ProtocolData {
        system_prompt: body.trim().to_string(),
        tools,
        disallowed_tools,
        model,
        skills,
        permission_mode,
        max_turns,
        mcp_servers,
        egress,
        initial_prompt,
        background,
        effort,
        memory,
        hooks,
        isolation,
        color,
        extra: map,
    };
    if protocol.system_prompt.is_empty() {
        warnings.push("the body (the system prompt) is empty".into());
    }
    // Valid entries go to the host, which runs them only when the operator allows it.
    warnings.extend(protocol.inline_mcp_servers().1);
    if let (_, Some(warning)) = protocol.permission_mode() {
        warnings.push(warning);
    }
    Ok(Agent { name, description, protocol, mode: fields.mode, warnings, refusals })
}

/// The warning for a frontmatter key that is not a field: with the nearest field name when
/// it is at most [`SUGGESTION_DISTANCE`] edits away (case ignored).
pub fn unknown_field_warning(key: &str) -> String {
    let suggestion = FIELDS
        .iter()
        .map(|field| (edit_distance(&key.to_lowercase(), &field.to_lowercase()), *field))
        .filter(|(d, _)| *d <= SUGGESTION_DISTANCE)
        .min_by_key(|(d, _)| *d);
    match suggestion {
        Some((_, field)) => format!("unknown frontmatter field `{key}` ignored (did you mean `{field}`?)"),
        None => format!("unknown frontmatter field `{key}` ignored"),
    }
}

/// Levenshtein distance over characters.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1).min(row[j] + 1).min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// Removes the first of `keys` present (and the others, so no alias lands in `extra`).
fn take(map: &mut Map<String, Value>, keys: &[&str]) -> Option<Value> {
    let mut found = None;
    for key in keys {
        if let Some(value) = map.remove(*key)
            && found.is_none()
        {
            found = Some(value);
        }
    }
    found
}

/// A field that takes one of `values` (case ignored): the value as `values` spells it,
/// `None` when absent, or the warning for another value (`otherwise` says what then happens).
fn one_of(value: Option<Value>, field: &str, values: &[&str], otherwise: &str) -> Result<Option<String>, String> {
    let Some(text) = value.and_then(scalar_text) else { return Ok(None) };
    match values.iter().find(|v| v.eq_ignore_ascii_case(&text)) {
        Some(v) => Ok(Some(v.to_string())),
        None => Err(format!("ignored `{field}: {text}` (expected {}); {otherwise}", values.join(", "))),
    }
}

/// A scalar as trimmed text; `None` for null, empty text and non-scalars.
fn scalar_text(value: Value) -> Option<String> {
    let text = match value {
        Value::String(s) => s,
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        _ => return None,
    };
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

/// `tools`, `disallowedTools`, `skills`: a YAML list or a comma-separated string
/// (`Read, Grep`, `[Read, Grep]`, one `- name` per line); commas inside `(...)` do not split.
pub fn name_list(value: &Value) -> Vec<String> {
    match value {
        Value::Null => Vec::new(),
        Value::Array(items) => items
            .iter()
            .flat_map(|item| match item {
                Value::String(s) => split_names(s),
                Value::Object(_) | Value::Array(_) => vec![item.to_string()],
                other => scalar_text(other.clone()).into_iter().collect(),
            })
            .collect(),
        Value::String(s) => split_names(s),
        other => scalar_text(other.clone()).into_iter().collect(),
    }
}

fn split_names(text: &str) -> Vec<String> {
    let text = text.trim();
    let text = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')).unwrap_or(text);
    let mut names = Vec::new();
    let mut depth = 0usize;
    let mut current = String::new();
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if depth == 0 && (c == ',' || c == '\n') {
            names.push(std::mem::take(&mut current));
        } else {
            current.push(c);
        }
    }
    names.push(current);
    names
        .into_iter()
        .map(|n| {
            let n = n.trim();
            let n = n.strip_prefix("- ").unwrap_or(n).trim();
            n.trim_matches(|c| c == '"' || c == '\'').trim().to_string()
        })
        .filter(|n| !n.is_empty())
        .collect()
}

/// The file name without directories, query, fragment and `.md`: `a/b/x.md?v=1` → `x`.
pub fn file_stem(uri: &str) -> &str {
    let path = uri.split(['?', '#']).next().unwrap_or(uri);
    let path = path.trim_end_matches(['/', '\\']);
    let file = path.rsplit(['/', '\\']).next().unwrap_or(path);
    match file.rfind('.') {
        Some(dot) if dot > 0 => &file[..dot],
        _ => file,
    }
}

/// Where a preloaded skill lives: `<agent dir>/../skills/<name>/SKILL.md`, normalised
/// lexically (`.`/`..` resolved) and in the same URI form as the agent's.
pub fn skill_uri(agent_uri: &str, skill: &str) -> String {
    // Keep a scheme and authority (`file://`, `https://host`) out of the path arithmetic.
    let (prefix, path) = match agent_uri.find("://") {
        Some(i) => {
            let after = &agent_uri[i + 3..];
            let path_start = after.find('/').map(|p| i + 3 + p).unwrap_or(agent_uri.len());
            (&agent_uri[..path_start], &agent_uri[path_start..])
        }
        None => ("", agent_uri),
    };
    let path = path.split(['?', '#']).next().unwrap_or(path);
    let absolute = path.starts_with('/');
    let mut parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    parts.pop(); // the agent file
    for piece in ["..", "skills", skill, "SKILL.md"] {
        for part in piece.split('/') {
            match part {
                "" | "." => {}
                ".." => {
                    if parts.last().is_some_and(|p| *p != "..") {
                        parts.pop();
                    } else if !absolute {
                        parts.push("..");
                    }
                }
                other => parts.push(other),
            }
        }
    }
    let joined = parts.join("/");
    if absolute || !prefix.is_empty() { format!("{prefix}/{joined}") } else { joined }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn agent(text: &str) -> Agent {
        parse_agent("agents/sample-agent.md", text.as_bytes(), &[]).unwrap()
    }

    /// A frontmatter of a few MiB was handed whole to the YAML reader (with aliases, an
    /// amplification; without, still a 64 MiB guest's memory): it is bounded.
    #[test]
    fn regression_an_agent_file_s_frontmatter_had_no_size_bound() {
        let pad = "x".repeat(crate::frontmatter::MAX_FRONTMATTER_BYTES);
        let text = format!("---\nname: a\ndescription: d\nnote: {pad}\n---\nBody.\n");
        let e = parse_agent("agents/a.md", text.as_bytes(), &[]).unwrap_err();
        assert!(e.to_string().contains("the YAML frontmatter is"), "{e}");
        let text = format!("---\nname: a\ndescription: d\nnote: {}\n---\nBody.\n", &pad[..1000]);
        assert!(parse_agent("agents/a.md", text.as_bytes(), &[]).is_ok());
    }

    #[test]
    fn builds_protocol_data_from_frontmatter_and_body() {
        let a = agent(
            "---\nname: reviewer\ndescription: Reviews code\ntools: Read, Grep, Glob\ndisallowedTools: [Bash]\nmodel: sonnet\nskills: lint, style\npermissionMode: plan\nmaxTurns: 4\nmcpServers: [github]\negress: pypi.org, \"*.pythonhosted.org\"\ncolor: red\n---\n\nYou review code.\n",
        );
        assert_eq!(a.name, "reviewer");
        assert_eq!(a.description, "Reviews code");
        let p = &a.protocol;
        assert_eq!(p.system_prompt, "You review code.");
        assert_eq!(p.tools, Some(vec!["Read".into(), "Grep".into(), "Glob".into()]));
        assert_eq!(p.disallowed_tools, vec!["Bash".to_string()]);
        assert_eq!(p.model.as_deref(), Some("sonnet"));
        assert_eq!(p.skills, vec!["lint".to_string(), "style".into()]);
        assert_eq!(p.permission_mode.as_deref(), Some("plan"));
        assert_eq!(p.permission_mode(), (Some(PermissionMode::Plan), None));
        assert_eq!(p.mcp_server_names(), ["github"]);
        assert_eq!(p.max_turns, Some(4));
        assert_eq!(p.mcp_servers, Some(json!(["github"])));
        assert_eq!(p.egress, Some(vec!["pypi.org".to_string(), "*.pythonhosted.org".into()]));
        assert_eq!(p.color.as_deref(), Some("red"));
        assert!(p.extra.is_empty());
        assert!(a.warnings.is_empty(), "{:?}", a.warnings);
        let round = ProtocolData::from_json(&p.to_json()).unwrap();
        assert_eq!(&round, p);
    }

    #[test]
    fn protocol_data_json_has_the_documented_shape() {
        let a = agent("---\ndescription: d\n---\nbody");
        let v: Value = serde_json::from_str(&a.protocol.to_json()).unwrap();
        assert_eq!(
            v,
            json!({"system_prompt": "body", "tools": null, "disallowed_tools": [], "model": null,
                   "skills": [], "permission_mode": null, "max_turns": null, "mcp_servers": null, "egress": null,
                   "initial_prompt": null, "background": false, "effort": null, "memory": null, "hooks": {},
                   "isolation": null, "color": null, "extra": {}})
        );
        assert_eq!(ProtocolData::from_json("{}").unwrap(), ProtocolData::default());
        assert_eq!(ProtocolData::from_json("").unwrap(), ProtocolData::default());
        assert!(matches!(ProtocolData::from_json("[1]"), Err(Error::InvalidInput(_))));
    }

    #[test]
    fn empty_tools_list_differs_from_no_tools_key() {
        assert_eq!(agent("---\ndescription: d\ntools: []\n---\n").protocol.tools, Some(vec![]));
        assert_eq!(agent("---\ndescription: d\n---\n").protocol.tools, None);
        assert_eq!(agent("---\ndescription: d\ntools:\n---\n").protocol.tools, None);
        assert_eq!(agent("---\ndescription: d\ntools: \"\"\n---\n").protocol.tools, Some(vec![]));
    }

    #[test]
    fn name_falls_back_to_the_file_stem_and_metadata_overrides() {
        assert_eq!(agent("---\ndescription: d\n---\n").name, "sample-agent");
        let a = parse_agent(
            "x/y.md",
            b"---\nname: n\ndescription: d\n---\n",
            &[("name".into(), "over".into()), ("description".into(), "desc".into())],
        )
        .unwrap();
        assert_eq!((a.name.as_str(), a.description.as_str()), ("over", "desc"));
    }

    #[test]
    fn errors_name_the_file() {
        let err = parse_agent("agents/plain.md", b"# Just markdown\n", &[]).unwrap_err();
        assert!(matches!(&err, Error::InvalidInput(m) if m.contains("agents/plain.md") && m.contains("frontmatter")));
        let err = parse_agent("agents/nodesc.md", b"---\nname: x\n---\nbody", &[]).unwrap_err();
        assert!(matches!(&err, Error::InvalidInput(m) if m.contains("agents/nodesc.md") && m.contains("description")));
        let err = parse_agent("agents/bin.md", &[0xff, 0xfe, 0x00], &[]).unwrap_err();
        assert!(matches!(&err, Error::InvalidInput(m) if m.contains("agents/bin.md")));
    }

    #[test]
    fn bad_max_turns_is_ignored_with_a_warning() {
        let a = agent("---\ndescription: d\nmaxTurns: lots\n---\n");
        assert_eq!(a.protocol.max_turns, None);
        assert!(a.warnings.iter().any(|w| w.contains("maxTurns")));
        assert_eq!(agent("---\ndescription: d\nmaxTurns: \"7\"\n---\n").protocol.max_turns, Some(7));
        assert_eq!(agent("---\ndescription: d\nmaxTurns: 0\n---\n").protocol.max_turns, None);
    }

    #[test]
    fn name_lists_accept_every_common_spelling() {
        assert_eq!(name_list(&json!("Read, Grep")), ["Read", "Grep"]);
        assert_eq!(name_list(&json!("[Read, 'Grep']")), ["Read", "Grep"]);
        assert_eq!(
            name_list(&json!(["Read", "Bash(git add:*, git commit:*)"])),
            ["Read", "Bash(git add:*, git commit:*)"]
        );
        assert_eq!(name_list(&json!("- Read\n- Grep")), ["Read", "Grep"]);
        assert_eq!(name_list(&json!("")), Vec::<String>::new());
        assert_eq!(name_list(&json!([])), Vec::<String>::new());
    }

    #[test]
    fn file_stems() {
        assert_eq!(file_stem("/a/b/code-reviewer.md"), "code-reviewer");
        assert_eq!(file_stem("file:///a/b/x.md"), "x");
        assert_eq!(file_stem("https://h/agents/y.md?ref=main#top"), "y");
        assert_eq!(file_stem("plain"), "plain");
        assert_eq!(file_stem("C:\\agents\\w.md"), "w");
    }

    #[test]
    fn skill_uris_sit_next_to_the_agents_dir() {
        assert_eq!(skill_uri("/p/.claude/agents/a.md", "lint"), "/p/.claude/skills/lint/SKILL.md");
        assert_eq!(skill_uri("agents/a.md", "lint"), "skills/lint/SKILL.md");
        assert_eq!(skill_uri("a.md", "lint"), "../skills/lint/SKILL.md");
        assert_eq!(skill_uri("file:///p/agents/a.md", "x"), "file:///p/skills/x/SKILL.md");
        assert_eq!(skill_uri("https://h.example/r/agents/a.md?x=1", "x"), "https://h.example/r/skills/x/SKILL.md");
    }
}

#[cfg(test)]
mod typed_fields {
    use super::*;
    use serde_json::json;

    #[test]
    fn mcp_servers_give_names_and_inline_stdio_definitions() {
        let data = |v: Value| ProtocolData { mcp_servers: Some(v), ..ProtocolData::default() };
        let mixed = data(json!([
            {"github": {"command": "gh-mcp", "args": ["--ro"], "env": {"A": "1"}}},
            {"name": "docs", "url": "u"},
            "fs",
            {},
            {"local": {"type": "http", "command": "x"}},
            {"odd": {"command": "x", "cwd": "/"}},
            {"bad-args": {"command": "x", "args": "y"}},
            {"name": "named", "command": "srv"},
        ]));
        assert_eq!(mixed.mcp_server_names(), ["fs"]);
        let (servers, warnings) = mixed.inline_mcp_servers();
        let github = InlineMcpServer {
            name: "github".into(),
            command: "gh-mcp".into(),
            args: vec!["--ro".into()],
            env: vec![("A".into(), "1".into())],
        };
        let named = InlineMcpServer { name: "named".into(), command: "srv".into(), args: vec![], env: vec![] };
        assert_eq!(servers, [github, named]);
        assert_eq!(warnings.len(), 5, "{warnings:?}");
        assert!(warnings[0].starts_with("inline MCP server `docs` in `mcpServers` refused: only a stdio server"));
        assert!(warnings[1].starts_with("inline MCP server `?` in `mcpServers` refused: it has no name"));
        assert!(warnings[2].contains("`local`") && warnings[2].contains("only a stdio server"));
        assert!(warnings[3].contains("`odd`") && warnings[3].contains("unknown key `cwd`"));
        assert!(warnings[4].contains("`bad-args`") && warnings[4].contains("`args` must be a list of text"));
        let (servers, warnings) = data(json!({"a": {"command": "x"}, "b": {"command": 1}})).inline_mcp_servers();
        assert_eq!((servers.len(), warnings.len()), (1, 1));
        assert!(data(json!({"a": {}, "b": {}})).mcp_server_names().is_empty());
        assert_eq!(data(json!("a, b,")).mcp_server_names(), ["a", "b"]);
        assert!(data(json!("a, b,")).inline_mcp_servers().0.is_empty());
        assert!(ProtocolData::default().mcp_server_names().is_empty());
        assert_eq!(ProtocolData::default().inline_mcp_servers(), (vec![], vec![]));
    }

    #[test]
    fn an_unknown_permission_mode_is_a_warning() {
        let p = ProtocolData { permission_mode: Some("sideways".into()), ..ProtocolData::default() };
        let (mode, warning) = p.permission_mode();
        assert_eq!(mode, None);
        assert!(warning.unwrap().contains("sideways"));
        let p = ProtocolData { permission_mode: Some("acceptEdits".into()), ..ProtocolData::default() };
        assert_eq!(p.permission_mode(), (Some(PermissionMode::AcceptEdits), None));
    }
}

/// Every documented field has a meaning: applied, a warning, or a refusal; unknown keys warn.
#[cfg(test)]
mod field_meanings {
    use super::*;

    fn parse(frontmatter: &str) -> Result<Agent, Error> {
        parse_agent("agents/a.md", format!("---\ndescription: d\n{frontmatter}---\nBody.\n").as_bytes(), &[])
    }

    fn warnings(frontmatter: &str) -> Vec<String> {
        parse(frontmatter).unwrap().warnings
    }

    #[test]
    fn every_field_in_a_clean_file_warns_about_nothing() {
        let a = parse(
            "name: n\ntools: Read\ndisallowedTools: Bash\nmodel: inherit\npermissionMode: plan\nmaxTurns: 2\nskills: []\nmcpServers: [github]\nbackground: true\neffort: low\ninitialPrompt: Start here.\ncolor: blue\negress: [pypi.org]\nversion: 1\nauthor: me\ntags: [x]\n",
        )
        .unwrap();
        assert!(a.warnings.is_empty(), "{:?}", a.warnings);
        assert!(a.protocol.extra.is_empty(), "{:?}", a.protocol.extra);
        assert_eq!(a.protocol.initial_prompt.as_deref(), Some("Start here."));
        assert!(a.protocol.background);
        assert_eq!(a.protocol.model.as_deref(), Some("inherit"));
    }

    #[test]
    fn unknown_fields_warn_with_a_suggestion_for_near_misses_and_the_file_still_resolves() {
        let a = parse("maxTurn: 3\nPermissionMode: plan\nfavouriteFood: soup\ntool: Read\n").unwrap();
        assert_eq!(a.protocol.max_turns, None, "a misspelled field is not applied");
        let w = a.warnings.join("\n");
        assert!(w.contains("unknown frontmatter field `maxTurn` ignored (did you mean `maxTurns`?)"), "{w}");
        assert!(w.contains("`PermissionMode` ignored (did you mean `permissionMode`?)"), "{w}");
        assert!(w.contains("`tool` ignored (did you mean `tools`?)"), "{w}");
        assert!(
            w.contains("unknown frontmatter field `favouriteFood` ignored\n") || w.ends_with("`favouriteFood` ignored"),
            "{w}"
        );
        assert!(!w.contains("`favouriteFood` ignored (did you mean"), "{w}");
        assert_eq!(a.protocol.extra.len(), 4);
    }

    /// Property: a key one or two edits away from a field (deleted, transposed or replaced
    /// characters, any case) is never silently dropped and is answered with a suggestion;
    /// a field spelled right never warns.
    #[test]
    fn every_near_miss_of_every_field_gets_a_suggestion() {
        for field in FIELDS {
            let w = warnings(&format!("{field}: x\n"));
            assert!(!w.iter().any(|w| w.contains("unknown frontmatter field")), "{field}: {w:?}");
            let chars: Vec<char> = field.chars().collect();
            let mut misses = Vec::new();
            for i in 0..chars.len() {
                let mut deleted = chars.clone();
                deleted.remove(i);
                misses.push(deleted);
                let mut replaced = chars.clone();
                replaced[i] = if chars[i] == 'q' { 'z' } else { 'q' };
                misses.push(replaced.clone());
                if i + 1 < chars.len() {
                    let mut swapped = chars.clone();
                    swapped.swap(i, i + 1);
                    misses.push(swapped);
                    replaced[i + 1] = if chars[i + 1] == 'q' { 'z' } else { 'q' };
                    misses.push(replaced);
                }
            }
            misses.push(field.to_uppercase().chars().collect());
            for miss in misses {
                let key: String = miss.into_iter().collect();
                if key.is_empty() || FIELDS.contains(&key.as_str()) {
                    continue;
                }
                let w = unknown_field_warning(&key);
                assert!(w.contains("did you mean"), "{key}: {w}");
                let file = format!("{key}: x\n");
                assert!(warnings(&file).iter().any(|w| w.contains(&format!("`{key}` ignored (did you mean"))), "{key}");
            }
        }
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }

    #[test]
    fn auto_is_default_with_a_warning() {
        let a = parse("permissionMode: auto\n").unwrap();
        assert_eq!(a.protocol.permission_mode().0, Some(PermissionMode::Default));
        assert!(a.warnings.iter().any(|w| w.contains("`auto` is applied as `default`")), "{:?}", a.warnings);
        for (name, mode) in [
            ("default", PermissionMode::Default),
            ("acceptEdits", PermissionMode::AcceptEdits),
            ("plan", PermissionMode::Plan),
            ("dontAsk", PermissionMode::DontAsk),
            ("bypassPermissions", PermissionMode::BypassPermissions),
        ] {
            let a = parse(&format!("permissionMode: {name}\n")).unwrap();
            assert_eq!(a.protocol.permission_mode(), (Some(mode), None));
            assert!(a.warnings.is_empty(), "{name}: {:?}", a.warnings);
        }
        assert!(warnings("permissionMode: sideways\n").iter().any(|w| w.contains("sideways")));
    }

    #[test]
    fn effort_is_one_of_claude_code_s_levels() {
        for level in EFFORT_LEVELS {
            let a = parse(&format!("effort: {level}\n")).unwrap();
            assert_eq!(a.protocol.effort.as_deref(), Some(*level));
            assert!(a.warnings.is_empty(), "{level}: {:?}", a.warnings);
        }
        assert_eq!(parse("effort: High\n").unwrap().protocol.effort.as_deref(), Some("high"));
        for bad in ["extreme", "3", "minimal"] {
            let a = parse(&format!("effort: {bad}\n")).unwrap();
            assert_eq!(a.protocol.effort, None, "{bad}");
            let w = a.warnings.join("\n");
            assert!(w.contains(&format!("ignored `effort: {bad}` (expected low, medium, high, xhigh, max)")), "{w}");
        }
    }

    #[test]
    fn memory_is_a_scope_and_gives_the_agent_its_memory_tools() {
        for scope in MEMORY_SCOPES {
            let a = parse(&format!("memory: {scope}\ntools: Glob\n")).unwrap();
            assert_eq!(a.protocol.memory.as_deref(), Some(*scope));
            assert!(a.warnings.is_empty(), "{scope}: {:?}", a.warnings);
            assert_eq!(a.protocol.tools, Some(vec!["Glob".into(), "Read".into(), "Write".into(), "Edit".into()]));
        }
        let a = parse("memory: Project\ntools: [Read, \"Write(notes/*)\"]\n").unwrap();
        assert_eq!(a.protocol.memory.as_deref(), Some("project"));
        assert_eq!(a.protocol.tools, Some(vec!["Read".into(), "Write(notes/*)".into(), "Edit".into()]));
        assert_eq!(parse("memory: user\n").unwrap().protocol.tools, None, "no list: every tool already");
        assert_eq!(parse("tools: Glob\n").unwrap().protocol.tools, Some(vec!["Glob".into()]), "no memory, no extra");
        let a = parse("memory: team\ntools: Glob\n").unwrap();
        assert_eq!((a.protocol.memory.as_deref(), a.protocol.tools.clone()), (None, Some(vec!["Glob".into()])));
        assert!(
            a.warnings.iter().any(|w| w.contains("ignored `memory: team` (expected user, project, local)")),
            "{:?}",
            a.warnings
        );
    }

    #[test]
    fn hooks_add_bash_to_the_host_s_tools_only() {
        let hooked = "hooks:\n  PostToolUse:\n    - hooks: [{ command: ./lint.sh }]\n";
        let a = parse(&format!("tools: Read\n{hooked}")).unwrap();
        assert_eq!(a.protocol.tools, Some(vec!["Read".into()]), "the model's list is as written");
        assert_eq!(host_tools(&a.protocol), Some(vec!["Read".into(), "Bash".into()]));
        assert_eq!(host_tools(&parse(&format!("tools: \"*\"\n{hooked}")).unwrap().protocol), Some(vec!["*".into()]));
        assert_eq!(host_tools(&parse(hooked).unwrap().protocol), None, "every tool already");
        assert_eq!(host_tools(&parse("tools: Read\n").unwrap().protocol), Some(vec!["Read".into()]), "no hooks");
    }

    #[test]
    fn memory_dirs_are_per_scope_and_agent_inside_the_workspace() {
        assert_eq!(memory_dir("project", "code-reviewer"), "/workspace/.claude/agent-memory/code-reviewer");
        assert_eq!(memory_dir("local", "a"), "/workspace/.claude/agent-memory-local/a");
        assert_eq!(memory_dir("user", "a"), "/workspace/.claude/agent-memory-user/a");
        assert_eq!(memory_dir("project", "../../etc x"), "/workspace/.claude/agent-memory/%2E.%2F..%2Fetc%20x");
        assert_eq!(memory_dir("project", ".."), "/workspace/.claude/agent-memory/%2E.");
        assert_eq!(memory_dir("project", ""), "/workspace/.claude/agent-memory/%");
        assert_eq!(memory_dir("user", "v1.2_x-Y"), "/workspace/.claude/agent-memory-user/v1.2_x-Y");
        assert_eq!(memory_dir_name("100%"), "100%25");
        assert_eq!(memory_dir_name("r\u{e9}sum\u{e9}\u{202e}"), "r%C3%A9sum%C3%A9%E2%80%AE");
    }

    /// Property (exhaustive over names of up to four characters from an alphabet of the
    /// characters that matter: kept ones, ones that used to become `-`, the escape itself and
    /// hex digits that could fake one): distinct names get distinct directory names, each a
    /// plain path part that percent-decodes back to the name. The names that collided before
    /// (`code reviewer`, `code/reviewer`, `code-reviewer`) are told apart.
    #[test]
    fn memory_dir_names_are_injective_and_plain() {
        let alphabet = ['a', '-', '.', '_', ' ', '/', '%', '2', '0', 'F', '\u{e9}', '\n'];
        let mut names = vec![String::new()];
        let mut frontier = names.clone();
        for _ in 0..4 {
            frontier = frontier.iter().flat_map(|p| alphabet.iter().map(move |c| format!("{p}{c}"))).collect();
            names.extend(frontier.iter().cloned());
        }
        let mut seen = std::collections::HashMap::new();
        for name in &names {
            let dir = memory_dir_name(name);
            if let Some(other) = seen.insert(dir.clone(), name.clone()) {
                panic!("{other:?} and {name:?} share the directory {dir:?}");
            }
            assert!(!matches!(dir.as_str(), "" | "." | "..") && !dir.contains('/'), "{name:?} -> {dir:?}");
            assert!(dir.chars().all(|c| c.is_ascii_graphic()), "{name:?} -> {dir:?}");
            if !name.is_empty() {
                assert_eq!(percent_decode(&dir), *name, "{dir:?} decodes back");
            }
        }
        assert_eq!(seen.len(), names.len());
        let dirs: Vec<String> = ["code reviewer", "code/reviewer", "code-reviewer"].map(memory_dir_name).into();
        assert_eq!(dirs, ["code%20reviewer", "code%2Freviewer", "code-reviewer"]);
    }

    fn percent_decode(s: &str) -> String {
        let mut bytes = Vec::new();
        let mut rest = s.as_bytes();
        while let Some((&b, tail)) = rest.split_first() {
            match b {
                b'%' => {
                    let hex = std::str::from_utf8(&tail[..2]).unwrap();
                    bytes.push(u8::from_str_radix(hex, 16).unwrap());
                    rest = &tail[2..];
                }
                _ => {
                    bytes.push(b);
                    rest = tail;
                }
            }
        }
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn inline_stdio_mcp_servers_go_to_the_host_and_others_are_warned_about() {
        let a =
            parse("mcpServers:\n  - github\n  - local:\n      command: ./server\n  - remote:\n      url: https://x\n")
                .unwrap();
        assert_eq!(a.protocol.mcp_server_names(), ["github"]);
        assert_eq!(a.protocol.inline_mcp_servers().0.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["local"]);
        assert!(
            a.warnings.iter().any(|w| w.contains("inline MCP server `remote`") && w.contains("only a stdio server")),
            "{:?}",
            a.warnings
        );
        assert!(!a.warnings.iter().any(|w| w.contains("`local`")), "{:?}", a.warnings);
    }

    #[test]
    fn background_takes_booleans_only() {
        assert!(parse("background: \"true\"\n").unwrap().protocol.background);
        assert!(!parse("background: false\n").unwrap().protocol.background);
        let a = parse("background: soon\n").unwrap();
        assert!(!a.protocol.background);
        assert!(a.warnings.iter().any(|w| w.contains("background")), "{:?}", a.warnings);
    }

    #[test]
    fn hooks_warden_cannot_run_keep_the_agent_from_registering() {
        let hooked =
            parse("hooks:\n  PermissionRequest:\n    - hooks: [{ type: command, command: ./x }]\ncolour: red\n")
                .unwrap();
        assert!(hooked.warnings.iter().any(|w| w.contains("did you mean `color`")), "{:?}", hooked.warnings);
        let err = hooked.registrable("agents/a.md").unwrap_err();
        assert!(
            matches!(&err, Error::InvalidInput(m) if m.contains("`hooks` event `PermissionRequest` is not supported")),
            "{err:?}"
        );
        let stop = parse("hooks:\n  Stop:\n    - hooks: [{ type: command, command: ./x }]\n  PreCompact:\n    - hooks: [{ type: command, command: ./y }]\n").unwrap();
        assert!(stop.warnings.iter().any(|w| w.contains("`PreCompact` is not run by warden")), "{:?}", stop.warnings);
        assert_eq!(stop.registrable("a.md").unwrap().protocol.hooks.stop[0].commands[0].command, "./x");
        assert!(parse("hooks: {}\n").unwrap().registrable("a.md").is_ok(), "no hooks is no refusal");
        let a = parse(
            "hooks:\n  PreToolUse:\n    - matcher: Bash\n      hooks: [{ type: command, command: ./check.sh }]\n",
        )
        .unwrap()
        .registrable("a.md")
        .unwrap();
        assert_eq!(a.protocol.hooks.pre_tool_use[0].commands[0].command, "./check.sh");
    }

    /// Issue 44: `isolation: worktree` refused the whole file (13 real files); it is the
    /// definition's typed isolation now. What warden cannot honour still refuses the file,
    /// naming the value and the accepted ones: running it unisolated would change files its
    /// author wanted kept apart.
    #[test]
    fn isolation_worktree_is_accepted_and_another_value_refuses_the_file() {
        let a = parse("isolation: worktree\n").unwrap().registrable("agents/a.md").unwrap();
        assert_eq!(a.protocol.isolation, Some(Isolation::Worktree));
        assert!(a.warnings.is_empty(), "{:?}", a.warnings);
        let round = ProtocolData::from_json(&a.protocol.to_json()).unwrap();
        assert_eq!(round.isolation, Some(Isolation::Worktree));
        assert!(serde_json::from_str::<Value>(&a.protocol.to_json()).unwrap()["isolation"] == "worktree");
        assert_eq!(parse("isolation: \" Worktree \"\n").unwrap().protocol.isolation, Some(Isolation::Worktree));
        assert_eq!(parse("isolation:\n").unwrap().protocol.isolation, None, "null: no isolation");
        assert_eq!(parse("color: red\n").unwrap().protocol.isolation, None);
        for (value, shown) in [("container", "container"), ("[worktree]", "[\"worktree\"]"), ("true", "true")] {
            let err = parse(&format!("isolation: {value}\n")).unwrap().registrable("agents/a.md").unwrap_err();
            assert!(
                matches!(&err, Error::InvalidInput(m) if m.contains(&format!("`isolation: {shown}` is not supported (accepted: worktree)"))
                    && m.starts_with("agents/a.md: ")),
                "{value}: {err:?}"
            );
        }
    }

    /// Nesting is the host's to allow (`subagents.max_depth`): `Agent` entries reach the
    /// definition's tools unchanged, without a warning at resolve time.
    #[test]
    fn nesting_entries_in_tools_go_to_the_host() {
        assert!(warnings("tools: Read, Agent(reviewer), Task\n").is_empty());
        let a = parse("tools: Read, Agent(reviewer, coder)\n").unwrap();
        assert_eq!(host_tools(&a.protocol).unwrap(), ["Read", "Agent(reviewer, coder)"]);
    }
}

/// Issue 44: a Claude Code plugin's own hooks and MCP servers apply to its agents.
#[cfg(test)]
mod plugin_files {
    use super::*;

    fn agent(frontmatter: &str) -> Agent {
        parse_agent("p/agents/a.md", format!("---\ndescription: d\n{frontmatter}---\nBody.\n").as_bytes(), &[]).unwrap()
    }

    #[test]
    fn the_plugin_s_hooks_and_servers_are_added_to_the_agent_s_own() {
        let mut a = agent(
            "hooks:\n  PreToolUse:\n    - matcher: Bash\n      hooks: [{ command: ./own.sh }]\nmcpServers: [github]\n",
        );
        let hooks = r#"{"hooks": {"PreToolUse": [{"matcher": "Write", "hooks": [{"type": "command", "command": "./plugin-guard.sh"}]}],
                       "Stop": [{"hooks": [{"type": "command", "command": "${CLAUDE_PLUGIN_ROOT}/done.sh"}]}]}}"#;
        let mcp = r#"{"mcpServers": {"db": {"command": "db-mcp", "args": ["--ro"]}, "local": {"command": "${CLAUDE_PLUGIN_ROOT}/srv"}}}"#;
        apply_plugin_files(&mut a, Some(hooks), Some(mcp));
        assert!(a.refusals.is_empty(), "{:?}", a.refusals);
        let pre: Vec<&str> = a.protocol.hooks.pre_tool_use.iter().map(|g| g.commands[0].command.as_str()).collect();
        assert_eq!(pre, ["./own.sh", "./plugin-guard.sh"]);
        assert!(a.protocol.hooks.stop.is_empty(), "a Stop hook in the plugin's folder is not run");
        let w = a.warnings.join("\n");
        assert!(w.contains("`Stop` hook `${CLAUDE_PLUGIN_ROOT}/done.sh` runs a file of the plugin's folder"), "{w}");
        assert!(w.contains("server `local` runs a file of the plugin's folder"), "{w}");
        assert_eq!(a.protocol.mcp_server_names(), ["github"]);
        let servers: Vec<String> = a.protocol.inline_mcp_servers().0.into_iter().map(|s| s.name).collect();
        assert_eq!(servers, ["db"]);
    }

    #[test]
    fn a_forbidding_plugin_hook_warden_cannot_run_or_a_broken_file_refuses_the_agent() {
        let mut a = agent("");
        let hooks = r#"{"hooks": {"PreToolUse": [{"hooks": [{"type": "command", "command": "${CLAUDE_PLUGIN_ROOT}/guard.sh"}]}]}}"#;
        apply_plugin_files(&mut a, Some(hooks), None);
        assert!(
            a.refusals.iter().any(|r| r.contains("`PreToolUse` hook") && r.contains("not registered")),
            "{:?}",
            a.refusals
        );
        let mut a = agent("");
        apply_plugin_files(&mut a, Some("[1]"), None);
        assert!(a.refusals.iter().any(|r| r.contains("hooks file is not a JSON object")), "{:?}", a.refusals);
        let mut a = agent("");
        apply_plugin_files(&mut a, None, None);
        assert!(a.refusals.is_empty() && a.warnings.is_empty() && a.protocol.hooks.is_empty());
    }
}
