//! Nested subagents: the rules of the `Agent` tool, with which a subagent starts another.
//!
//! Opt-in twice: the operator raises `subagents.max_depth` (default 1, no nesting), and an
//! agent file lists `Agent` — or `Agent(type, …)` to name the subagents it may start —
//! in its `tools` (Claude Code's older name `Task` is accepted too). `*` does not include
//! it: no agent starts subagents without saying so.
//!
//! - **Which subagents**: [`SubagentTypes::of_definition`] reads the definition's `tools`.
//! - **Which tools**: a nested subagent may use a tool only if its own `tools` list and the
//!   list of every definition above it allow it ([`tools_allow`]): a child never gets a tool
//!   its parent did not have. The `Agent` entries' type lists are each level's own (a
//!   parent that may start `child` does not decide what `child` may start).
//! - **The call**: [`AgentCall::parse`] validates the model's input.
//!
//! This module decides; it runs nothing. The tool host ([`crate::tools`]) offers and gates
//! the tool, and the engine runs the child task (`TaskScope::subagents`).

use serde::Deserialize;
use serde_json::{Value, json};

use crate::plugin::TaskCall;

/// The tool's name, as the model sees it.
pub const AGENT_TOOL: &str = "Agent";

/// Claude Code's earlier name for [`AGENT_TOOL`], accepted in `tools` lists.
pub const AGENT_TOOL_OLD_NAME: &str = "Task";

/// Longest `prompt` a subagent may hand its child: the same order as a parent agent's
/// prompt, and a bound on what one model reply can make the host store and forward.
pub const MAX_CHILD_PROMPT_BYTES: usize = 256 * 1024;

/// Longest `description` of a child task (it is shown in task lists).
pub const MAX_CHILD_DESCRIPTION_BYTES: usize = 1024;

/// `Read`, `Bash(git:*)` → (`Read`, `Bash`): the tool an entry of a `tools` list names.
fn base_name(entry: &str) -> (&str, Option<&str>) {
    let entry = entry.trim();
    match entry.find('(') {
        Some(i) if entry.ends_with(')') => (entry[..i].trim(), Some(&entry[i + 1..entry.len() - 1])),
        _ => (entry, None),
    }
}

/// Whether `name` is the Agent tool under either of its names.
pub fn is_agent_tool(name: &str) -> bool {
    name == AGENT_TOOL || name == AGENT_TOOL_OLD_NAME
}

/// Whether one definition's `tools` list (`None` = every tool) lets its subagent use
/// `name`: an entry names a tool, `*` all of them, and `Bash(git:*)` its tool (which calls
/// of it: [`call_refusal`]). `Task` entries name the Agent tool.
pub fn tool_allowed(allowed: Option<&[String]>, name: &str) -> bool {
    let Some(allowed) = allowed else { return true };
    allowed.iter().any(|entry| {
        let (base, _) = base_name(entry);
        base == "*" || base == name || (is_agent_tool(base) && is_agent_tool(name))
    })
}

/// The entries of one definition's `tools` list that narrow `name` to the calls they
/// match (`Bash(git status:*)`, `Read(./src/**)`); `None` when the list leaves the tool
/// whole (no list, `*`, the bare name) or does not name it (then [`tool_allowed`] refuses
/// it). The Agent tool's arguments name subagents ([`SubagentTypes`]), not calls.
fn narrowing_patterns(allowed: Option<&[String]>, name: &str) -> Option<Vec<String>> {
    if is_agent_tool(name) {
        return None;
    }
    let mut patterns = Vec::new();
    for entry in allowed? {
        match base_name(entry) {
            ("*", _) => return None,
            (base, None) if base == name => return None,
            (base, Some(_)) if base == name => patterns.push(entry.trim().to_owned()),
            _ => {}
        }
    }
    (!patterns.is_empty()).then_some(patterns)
}

/// Why a call is refused before the gate by the `Tool(pattern)` entries of the task's
/// `tools` list or an ancestor's, `None` when each list that narrows the tool has an
/// entry matching the call. An entry is read as an allow rule of the approval policy
/// (the same recognizer: a Bash command must be understood and every part match; a path
/// is judged as given and with symlinks resolved); an entry that is not a valid rule
/// matches nothing. Without this, `tools: [Bash(git status:*)]` gave its subagent all
/// of Bash whenever the operator's policy allowed more.
pub fn call_refusal(
    own: Option<&[String]>,
    inherited: &[Vec<String>],
    name: &str,
    input: &Value,
    resolved_path: Option<&str>,
    ctx: &warden_approval::EvalContext,
) -> Option<String> {
    use warden_approval::{Decision, EffectiveMode, Policy, PolicyConfig};
    let lists = std::iter::once(own).chain(inherited.iter().map(|l| Some(l.as_slice())));
    for patterns in lists.filter_map(|list| narrowing_patterns(list, name)) {
        let config = PolicyConfig { default: Decision::Deny, allow: patterns.clone(), ..PolicyConfig::default() };
        let allowed = Policy::from_config(config).is_ok_and(|policy| {
            let ev = policy.decide_resolved(name, input, resolved_path, ctx, EffectiveMode::default());
            ev.decision == Decision::Allow
        });
        if !allowed {
            return Some(format!("this subagent's `tools` allow {name} only as {}", patterns.join(", ")));
        }
    }
    None
}

/// The reference metadata key by which a definition hands the host its deny rules: a
/// JSON list of tool patterns (`["Bash(rm -rf*)", "Read(./.env)"]`), a Claude agent file's
/// `disallowedTools` entries with an argument pattern (whole tools the plugin does not
/// offer at all). The operator's reference may add to them; nobody can remove one.
pub const DISALLOWED_TOOLS_METADATA: &str = "disallowed_tools";

/// Most deny rules one definition may hand over (as many as a `tools` list may hold).
pub const MAX_DISALLOWED_TOOLS: usize = crate::plugin::MAX_DEFINITION_LIST;

/// A definition's deny rules (see [`DISALLOWED_TOOLS_METADATA`]): the operator's value,
/// then the plugin's; `Err` names what cannot be read (the registry reports it, and a
/// definition whose rules cannot be read is not registered: running it would allow what
/// they forbid).
pub fn disallowed_tools(
    operator: &std::collections::BTreeMap<String, String>,
    def: &crate::plugin::SubagentDefinition,
) -> Result<Vec<String>, String> {
    let mut rules = Vec::new();
    for value in [operator.get(DISALLOWED_TOOLS_METADATA), def.reference.metadata.get(DISALLOWED_TOOLS_METADATA)]
        .into_iter()
        .flatten()
    {
        let list: Vec<String> = serde_json::from_str(value)
            .map_err(|e| format!("metadata `{DISALLOWED_TOOLS_METADATA}` is not a JSON list of tool patterns ({e})"))?;
        for rule in list {
            if !rules.contains(&rule) {
                rules.push(rule);
            }
        }
    }
    if rules.len() > MAX_DISALLOWED_TOOLS {
        return Err(format!("{} disallowedTools patterns; at most {MAX_DISALLOWED_TOOLS}", rules.len()));
    }
    let config = warden_approval::PolicyConfig {
        default: warden_approval::Decision::Allow,
        deny: rules.clone(),
        ..warden_approval::PolicyConfig::default()
    };
    warden_approval::Policy::from_config(config)
        .map_err(|e| format!("disallowedTools pattern cannot be read as a deny rule: {e}"))?;
    Ok(rules)
}

/// Why a call is refused by the task's deny rules (`disallowedTools` patterns, its own
/// and its ancestors'), or `None`. The rules are judged as the deny rules of a policy
/// whose default allows, with the gate's recognizer: a call one matches is refused, and
/// so is a call the recognizer cannot read fully (a Bash command it would ask about
/// could hide a denied one). Only narrows: a call that passes still goes to the gate.
pub fn denied_call_refusal(
    rules: &[String],
    name: &str,
    input: &Value,
    resolved_path: Option<&str>,
    ctx: &warden_approval::EvalContext,
) -> Option<String> {
    use warden_approval::{Decision, EffectiveMode, Policy, PolicyConfig};
    if rules.is_empty() {
        return None;
    }
    let config = PolicyConfig { default: Decision::Allow, deny: rules.to_vec(), ..PolicyConfig::default() };
    let evaluation = Policy::from_config(config)
        .map(|policy| policy.decide_resolved(name, input, resolved_path, ctx, EffectiveMode::default()));
    match evaluation {
        Ok(ev) if ev.decision == Decision::Allow => None,
        Ok(ev) if ev.decision == Decision::Deny => Some(format!(
            "this subagent's `disallowedTools` forbid it ({})",
            ev.matched_rule.as_deref().unwrap_or(&rules.join(", "))
        )),
        Ok(_) => Some(format!(
            "this subagent's `disallowedTools` ({}) cannot be checked against this call, which the gate cannot read fully",
            rules.join(", ")
        )),
        Err(e) => Some(format!("this subagent's `disallowedTools` cannot be read: {e}")),
    }
}

/// Whether one definition's `tools` list could let its subagent use a tool of MCP server
/// `server` (`None`, `*`, or an entry `mcp__<server>__…`).
fn server_allowed(allowed: Option<&[String]>, server: &str) -> bool {
    let Some(allowed) = allowed else { return true };
    allowed.iter().any(|entry| {
        let (base, _) = base_name(entry);
        base == "*"
            || base
                .strip_prefix("mcp__")
                .and_then(|rest| rest.strip_prefix(server))
                .is_some_and(|rest| rest.starts_with("__"))
    })
}

/// Whether a task's list and every ancestor's could let it use some tool of MCP server
/// `server`: when none can, the server is not even started for it.
pub fn tools_allow_server(own: Option<&[String]>, inherited: &[Vec<String>], server: &str) -> bool {
    server_allowed(own, server) && inherited.iter().all(|list| server_allowed(Some(list), server))
}

/// Whether a task may use `name`: its definition's list and every ancestor's allow it.
pub fn tools_allow(own: Option<&[String]>, inherited: &[Vec<String>], name: &str) -> bool {
    tool_allowed(own, name) && inherited.iter().all(|list| tool_allowed(Some(list), name))
}

/// The subagents a definition may start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubagentTypes {
    /// `Agent` without a list: any registered subagent.
    Any,
    /// `Agent(a, b)`: these (several entries add up).
    Only(Vec<String>),
}

impl SubagentTypes {
    /// What the definition's `tools` list says; `None` when it has no `Agent` entry (no
    /// list at all, or `*` alone, never enables nesting).
    pub fn of_definition(tools: Option<&[String]>) -> Option<Self> {
        let mut found: Option<SubagentTypes> = None;
        for entry in tools? {
            let (base, args) = base_name(entry);
            if !is_agent_tool(base) {
                continue;
            }
            let names: Vec<String> = match args {
                None => {
                    found = Some(SubagentTypes::Any);
                    continue;
                }
                Some(args) => args.split(',').map(str::trim).filter(|n| !n.is_empty()).map(str::to_owned).collect(),
            };
            match &mut found {
                Some(SubagentTypes::Any) => {}
                Some(SubagentTypes::Only(list)) => list.extend(names),
                None => found = Some(SubagentTypes::Only(names)),
            }
        }
        if let Some(SubagentTypes::Only(list)) = &mut found {
            list.sort();
            list.dedup();
        }
        found
    }

    /// Whether a task executed by `parent_plugin` may start subagent `name`, executed by
    /// `plugin`: a named type always; with a bare `Agent`, only the subagents of its own
    /// plugin (a remote A2A, MCP or HTTP agent receives the prompt over the network, past
    /// the sandbox's egress rules, so it must be named).
    pub fn may_start(&self, name: &str, plugin: &str, parent_plugin: &str) -> bool {
        match self {
            SubagentTypes::Any => plugin == parent_plugin,
            SubagentTypes::Only(list) => list.iter().any(|t| t == name),
        }
    }
}

/// The Agent tool's description and input schema, listing `available`: the subagents the
/// task may start, each with its description.
pub fn agent_tool_spec(available: &[(String, String)]) -> (String, Value) {
    let mut description = String::from(
        "Start a subagent to carry out a task on its own and wait for its answer. It works in the same \
         sandbox session; it does not see this conversation, so give it everything it needs in `prompt`. \
         Available subagents:\n",
    );
    for (name, about) in available {
        // Names are checked at admission ([`crate::plugin::check_subagent_name`]); escaped
        // here too, so that no name or description adds a line to this list.
        let (name, about) = (crate::text::escape_control(name), crate::text::escape_control(about));
        description.push_str(&format!("- {name}: {about}\n"));
    }
    let names: Vec<&str> = available.iter().map(|(n, _)| n.as_str()).collect();
    let schema = json!({
        "type": "object",
        "properties": {
            "description": { "type": "string", "description": "A short (3-5 word) description of the task" },
            "prompt": { "type": "string", "description": "The task for the subagent to perform" },
            "subagent_type": { "type": "string", "enum": names, "description": "Which subagent to start" },
        },
        "required": ["description", "prompt", "subagent_type"],
        "additionalProperties": false,
    });
    (description, schema)
}

/// An Agent call's input, as the model sent it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentCall {
    pub description: String,
    pub prompt: String,
    pub subagent_type: String,
}

impl AgentCall {
    /// The input checked against the tool's schema and bounds; `Err` is the text the
    /// model gets back.
    pub fn parse(input: &Value) -> Result<AgentCall, String> {
        let call: AgentCall = serde_json::from_value(input.clone())
            .map_err(|e| format!("invalid input ({e}); expected {{description, prompt, subagent_type}}"))?;
        for (field, value, limit) in [
            ("description", &call.description, MAX_CHILD_DESCRIPTION_BYTES),
            ("prompt", &call.prompt, MAX_CHILD_PROMPT_BYTES),
        ] {
            if value.len() > limit {
                return Err(format!("`{field}` is {} bytes; at most {limit} are accepted", value.len()));
            }
        }
        Ok(call)
    }

    /// The child's task call (in the foreground of its parent, never resumed).
    pub fn into_task_call(self) -> TaskCall {
        TaskCall {
            description: self.description,
            prompt: self.prompt,
            subagent_type: self.subagent_type,
            model: None,
            resume: None,
            run_in_background: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Issue 44: `disallowedTools: Bash(rm -rf*)` was kept but never enforced (the docs
    /// promised a warning nobody saw). It is a deny rule for that agent: a call it matches
    /// is refused — alone, inside a compound command, or hidden where the recognizer cannot
    /// read — while other calls go on to the gate.
    #[test]
    fn regression_disallowed_tools_patterns_were_not_enforced() {
        let ctx = warden_approval::EvalContext { workspace_root: "/workspace".into(), home: "/workspace".into() };
        let rules = vec!["Bash(rm -rf*)".to_string(), "Read(./.env)".to_string()];
        let bash = |cmd: &str| denied_call_refusal(&rules, "Bash", &json!({ "command": cmd }), None, &ctx);
        for refused in ["rm -rf /tmp/x", "ls && rm -rf build", "echo $(rm -rf .)"] {
            let why = bash(refused).unwrap_or_else(|| panic!("{refused} was not refused"));
            assert!(why.contains("disallowedTools"), "{why}");
        }
        for allowed in ["ls -la", "rm notes.txt", "git status"] {
            assert_eq!(bash(allowed), None, "{allowed}");
        }
        let read = |path: &str| denied_call_refusal(&rules, "Read", &json!({ "file_path": path }), Some(path), &ctx);
        assert!(read("/workspace/.env").is_some());
        assert_eq!(read("/workspace/src/main.rs"), None);
        assert_eq!(denied_call_refusal(&[], "Bash", &json!({ "command": "rm -rf /" }), None, &ctx), None);

        // The rules reach the host as reference metadata, validated at registration.
        let reference = crate::plugin::SubagentReference {
            uri: "agents/careful.md".into(),
            kind: "CLAUDE".into(),
            metadata: [(DISALLOWED_TOOLS_METADATA.to_string(), r#"["Bash(rm -rf*)"]"#.to_string())].into(),
        };
        let def = crate::plugin::SubagentDefinition::new("careful".into(), "d".into(), reference, "{}".into());
        let operator = [(DISALLOWED_TOOLS_METADATA.to_string(), r#"["Bash(git push:*)"]"#.to_string())].into();
        assert_eq!(disallowed_tools(&operator, &def).unwrap(), ["Bash(git push:*)", "Bash(rm -rf*)"]);
        let bad = [(DISALLOWED_TOOLS_METADATA.to_string(), "Bash(rm".to_string())].into();
        assert!(disallowed_tools(&bad, &def).unwrap_err().contains("not a JSON list"));
    }

    /// Regression (attacker review): `tools: [Bash(git status:*)]` gave its subagent all
    /// of Bash whenever the operator's policy allowed more (the pattern was dropped).
    #[test]
    fn regression_a_tools_pattern_gave_its_subagent_the_whole_tool() {
        let ctx = warden_approval::EvalContext { workspace_root: "/workspace".into(), home: "/workspace".into() };
        let list = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let own = list(&["Read", "Bash(git status:*)"]);
        let bash = |own: &[String], inherited: &[Vec<String>], cmd: &str| {
            call_refusal(Some(own), inherited, "Bash", &json!({ "command": cmd }), None, &ctx)
        };
        assert_eq!(bash(&own, &[], "git status"), None);
        assert_eq!(bash(&own, &[], "git status --short"), None);
        for refused in ["git push", "git status; rm -rf /workspace", "git status && curl x", "$(git status)"] {
            let why = bash(&own, &[], refused).unwrap_or_else(|| panic!("{refused} ran"));
            assert!(why.contains("Bash(git status:*)"), "{why}");
        }
        // A bare entry, `*` or no list leaves the tool whole; other tools are not narrowed.
        assert_eq!(bash(&list(&["Bash(git status:*)", "Bash"]), &[], "git push"), None);
        assert_eq!(bash(&list(&["*"]), &[], "git push"), None);
        assert_eq!(call_refusal(None, &[], "Bash", &json!({ "command": "git push" }), None, &ctx), None);
        assert_eq!(call_refusal(Some(&own), &[], "Read", &json!({ "file_path": "a" }), None, &ctx), None);
        // An ancestor's narrowing holds for a child whose own list names Bash bare.
        assert!(bash(&list(&["Bash"]), std::slice::from_ref(&own), "git push").is_some());
        // Paths are judged as given and as they resolve.
        let reads = list(&["Read(./src/**)"]);
        let read = |path: &str, resolved: Option<&str>| {
            call_refusal(Some(&reads), &[], "Read", &json!({ "file_path": path }), resolved, &ctx)
        };
        assert_eq!(read("src/a.rs", Some("/workspace/src/a.rs")), None);
        assert!(read("secrets/key", None).is_some());
        assert!(read("src/link", Some("/workspace/secrets/key")).is_some());
        // An Agent entry's arguments name subagents, never calls.
        assert_eq!(call_refusal(Some(&list(&["Agent(a)"])), &[], "Agent", &json!({}), None, &ctx), None);
    }

    proptest! {
        /// Whatever the subagents' names and descriptions hold, the Agent tool's
        /// description has one line per subagent: none can add a line of its own.
        #[test]
        fn regression_a_subagent_name_added_lines_to_the_agent_tool_description(
            available in prop::collection::vec((any::<String>(), any::<String>()), 0..5),
        ) {
            let (description, _) = agent_tool_spec(&available);
            prop_assert_eq!(description.lines().count(), 1 + available.len(), "{}", description);
            for line in description.lines().skip(1) {
                prop_assert!(line.starts_with("- ") && !line.chars().any(char::is_control), "{:?}", line);
            }
        }
    }

    #[test]
    fn a_server_is_usable_only_when_every_list_could_let_a_tool_of_it_through() {
        let list = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(tools_allow_server(None, &[], "clock"));
        assert!(tools_allow_server(Some(&list(&["*"])), &[], "clock"));
        assert!(tools_allow_server(Some(&list(&["Read", "mcp__clock__now"])), &[], "clock"));
        assert!(!tools_allow_server(Some(&list(&["Read"])), &[], "clock"));
        assert!(!tools_allow_server(Some(&list(&["mcp__clockwork__now"])), &[], "clock"), "a prefix of another server");
        assert!(!tools_allow_server(Some(&list(&["mcp__clock"])), &[], "clock"));
        assert!(!tools_allow_server(None, &[list(&["Read"])], "clock"), "an ancestor's list holds too");
        assert!(tools_allow_server(None, &[list(&["mcp__clock__now"]), list(&["*"])], "clock"));
    }

    fn list(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_definition_s_tools_list_narrows_by_base_name() {
        assert!(tool_allowed(None, "Bash"));
        assert!(tool_allowed(Some(&list(&["Read", "Bash(git status:*)"])), "Bash"));
        assert!(!tool_allowed(Some(&list(&["Read"])), "Bash"));
        assert!(!tool_allowed(Some(&[]), "Read"));
        assert!(tool_allowed(Some(&list(&["*"])), "mcp__github__search"));
        assert!(!tool_allowed(Some(&list(&["Bash("])), "Bash"), "not a pattern: the whole entry is the name");
        assert!(tool_allowed(Some(&list(&["Task(x)"])), AGENT_TOOL), "Task is the Agent tool's old name");
    }

    #[test]
    fn nesting_needs_an_explicit_agent_entry() {
        assert_eq!(SubagentTypes::of_definition(None), None);
        assert_eq!(SubagentTypes::of_definition(Some(&list(&["*", "Read"]))), None);
        assert_eq!(SubagentTypes::of_definition(Some(&list(&["Read", "Agent"]))), Some(SubagentTypes::Any));
        assert_eq!(
            SubagentTypes::of_definition(Some(&list(&["Agent(b, a)", "Task(c)", "Agent( a )"]))),
            Some(SubagentTypes::Only(list(&["a", "b", "c"])))
        );
        assert_eq!(SubagentTypes::of_definition(Some(&list(&["Agent(a)", "Agent"]))), Some(SubagentTypes::Any));
        let only = SubagentTypes::of_definition(Some(&list(&["Agent(reviewer)"]))).unwrap();
        assert!(only.may_start("reviewer", "a2a", "claude"), "a named subagent, whatever its plugin");
        assert!(!only.may_start("Reviewer", "claude", "claude") && !only.may_start("coder", "claude", "claude"));
        let any = SubagentTypes::Any;
        assert!(any.may_start("coder", "claude", "claude"));
        assert!(!any.may_start("travel", "a2a", "claude"), "a remote agent must be named");
    }

    #[test]
    fn agent_calls_are_validated_and_bounded() {
        let ok = json!({"description": "d", "prompt": "p", "subagent_type": "child"});
        assert_eq!(AgentCall::parse(&ok).unwrap().subagent_type, "child");
        for bad in [
            json!({"description": "d", "prompt": "p"}),
            json!({"description": "d", "prompt": "p", "subagent_type": "c", "model": "opus"}),
            json!({"description": "d", "prompt": 3, "subagent_type": "c"}),
            json!("text"),
            json!({"description": "d", "prompt": "p".repeat(MAX_CHILD_PROMPT_BYTES + 1), "subagent_type": "c"}),
        ] {
            assert!(AgentCall::parse(&bad).is_err(), "{bad}");
        }
    }

    proptest! {
        /// Intersection: whatever the lists, a tool a task may use is allowed by its own list
        /// and by every ancestor's; adding an ancestor never adds a tool.
        #[test]
        fn a_child_never_gets_a_tool_an_ancestor_lacks(
            own in proptest::option::of(proptest::collection::vec("(Read|Write|Bash|Agent|\\*|Bash\\(git:\\*\\)|Agent\\(x\\))", 0..4)),
            ancestors in proptest::collection::vec(proptest::collection::vec("(Read|Write|Bash|Agent|\\*|Task\\(y\\))", 0..4), 0..3),
            tool in "(Read|Write|Bash|Agent|Grep)",
        ) {
            let allowed = tools_allow(own.as_deref(), &ancestors, &tool);
            for ancestor in &ancestors {
                if !tool_allowed(Some(ancestor), &tool) {
                    prop_assert!(!allowed, "{} allowed although {:?} lacks it", tool, ancestor);
                }
            }
            if !tool_allowed(own.as_deref(), &tool) {
                prop_assert!(!allowed);
            }
            if allowed && !ancestors.is_empty() {
                prop_assert!(tools_allow(own.as_deref(), &ancestors[..ancestors.len() - 1], &tool));
            }
        }
    }
}
