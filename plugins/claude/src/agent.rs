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
//!   "extra": {}                    // every other frontmatter key, as JSON
//! }
//! ```
//!
//! The host never reads `protocol-data`: what it acts on — `tools`, the permission mode,
//! the MCP server names and `egress` — is also handed over as the definition's typed fields
//! (WIT 0.2.0).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::frontmatter::{self, ParseMode};
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
    #[serde(default)]
    pub extra: Map<String, Value>,
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
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name.trim() {
            "default" => Self::Default,
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
    /// applies the operator's policy unchanged).
    pub fn permission_mode(&self) -> (Option<PermissionMode>, Option<String>) {
        match self.permission_mode.as_deref() {
            None => (None, None),
            Some(name) => match PermissionMode::parse(name) {
                Some(m) => (Some(m), None),
                None => (
                    None,
                    Some(format!(
                        "unknown permissionMode {name:?} ignored (expected default, acceptEdits, plan, dontAsk or bypassPermissions)"
                    )),
                ),
            },
        }
    }

    /// The MCP server names in `mcpServers`: a list of names, a list of `{name: …}` (or
    /// one-key `{server: {…}}`) objects, a map keyed by name, or comma-separated text.
    pub fn mcp_server_names(&self) -> Vec<String> {
        match &self.mcp_servers {
            Some(Value::Array(items)) => items
                .iter()
                .filter_map(|i| match i {
                    Value::String(s) => Some(s.clone()),
                    Value::Object(o) if o.len() == 1 => o.keys().next().cloned(),
                    Value::Object(o) => o.get("name").and_then(Value::as_str).map(str::to_owned),
                    _ => None,
                })
                .collect(),
            Some(Value::Object(map)) => map.keys().cloned().collect(),
            Some(Value::String(s)) => s.split(',').map(|x| x.trim().to_owned()).filter(|x| !x.is_empty()).collect(),
            _ => vec![],
        }
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
}

/// Builds an agent from a file's bytes. `uri` names the file in errors and gives the
/// fallback name (its stem); `metadata` `name` / `description` override the file's.
pub fn parse_agent(uri: &str, bytes: &[u8], metadata: &[(String, String)]) -> Result<Agent, Error> {
    let invalid = |what: &str| Error::InvalidInput(format!("{uri}: {what}"));
    let text = std::str::from_utf8(bytes).map_err(|e| invalid(&format!("not UTF-8 text ({e})")))?;
    let (frontmatter, body) = frontmatter::split(text).map_err(|e| invalid(e.describe()))?;
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
                    warnings.push(format!("{uri}: ignored `maxTurns: {value}` (expected a positive integer)"));
                    None
                }
            }
        }
    };
    let mcp_servers = take(&mut map, &["mcpServers", "mcp_servers", "mcp-servers"]).filter(|v| !v.is_null());
    let egress = take(&mut map, &["egress"]).filter(|v| !v.is_null()).map(|v| name_list(&v));

    let system_prompt = body.trim().to_string();
    if system_prompt.is_empty() {
        warnings.push(format!("{uri}: the body (the system prompt) is empty"));
    }
    Ok(Agent {
        name,
        description,
        protocol: ProtocolData {
            system_prompt,
            tools,
            disallowed_tools,
            model,
            skills,
            permission_mode,
            max_turns,
            mcp_servers,
            egress,
            extra: map,
        },
        mode: fields.mode,
        warnings,
    })
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
        assert_eq!(p.extra, json!({"color": "red"}).as_object().unwrap().clone());
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
                   "skills": [], "permission_mode": null, "max_turns": null, "mcp_servers": null, "egress": null, "extra": {}})
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
    fn mcp_servers_in_every_shape_give_names() {
        let names = |v: Value| ProtocolData { mcp_servers: Some(v), ..ProtocolData::default() }.mcp_server_names();
        assert_eq!(names(json!([{"github": {"x": 1}}, {"name": "docs", "url": "u"}, "fs"])), ["github", "docs", "fs"]);
        assert_eq!(names(json!({"a": {}, "b": {}})), ["a", "b"]);
        assert_eq!(names(json!("a, b,")), ["a", "b"]);
        assert!(ProtocolData::default().mcp_server_names().is_empty());
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
