//! Which of the session's tools an agent gets.
//!
//! Start from the host's list (already without policy-denied tools), keep only the names
//! in `tools` when the agent lists them, then remove `disallowedTools`.
//!
//! Entries may carry Claude Code argument patterns (`Bash(git status:*)`): in `tools` the
//! pattern's tool is allowed (the argument rule is the approval policy's business); in
//! `disallowedTools` a pattern does not remove the whole tool: the host enforces it as a
//! deny rule for this agent (handed over as the reference metadata
//! [`crate::agent::DISALLOWED_TOOLS_METADATA`]). Names the session does not have are
//! reported as warnings and otherwise ignored.
//!
//! The nesting tool (`Agent`, or its older name `Task`) is the host's: it offers it only
//! to a subagent whose `tools` name it (`Agent` or `Agent(type, …)`, never through `*`)
//! while the operator's `subagents.max_depth` allows another level, and it checks the
//! types. The plugin passes it on only when the agent listed it.

use warden_guest::ToolSpec;

/// The tool that starts subagents, under its current and its older name.
pub const NESTING_TOOLS: &[&str] = &["Task", "Agent"];

/// The name the host offers the nesting tool under (a session tool called `Task` is
/// never passed on).
pub const HOST_NESTING_TOOL: &str = "Agent";

/// Whether `name` is the nesting tool under either name.
pub fn is_nesting_tool(name: &str) -> bool {
    NESTING_TOOLS.contains(&name)
}

/// The filtered tool list and what the log should hear about it.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub tools: Vec<ToolSpec>,
    pub warnings: Vec<String>,
}

/// `Bash(git status:*)` → (`Bash`, true); `Read` → (`Read`, false).
pub fn base_name(entry: &str) -> (&str, bool) {
    match entry.find('(') {
        Some(i) if entry.ends_with(')') => (entry[..i].trim(), true),
        _ => (entry.trim(), false),
    }
}

/// Why an agent with hooks is not offered the nesting tool: its hooks run only for its own
/// calls (they are its agent file's, run by this plugin), so a subagent it started would
/// make the calls its hooks forbid, unchecked (regression: delegating a call to a child
/// bypassed the parent's `PreToolUse` hooks).
pub const HOOKS_STOP_NESTING: &str =
    "tool `Agent` not offered: this agent has hooks, which would not apply to the calls of the subagents it starts";

/// Removes the host's nesting tool from `tools`; whether it was there.
pub fn drop_nesting_tool(tools: &mut Vec<ToolSpec>) -> bool {
    let before = tools.len();
    tools.retain(|t| t.name != HOST_NESTING_TOOL);
    tools.len() != before
}

pub fn select(available: Vec<ToolSpec>, allow: Option<&[String]>, deny: &[String]) -> Selection {
    let mut warnings = Vec::new();
    let known = |name: &str| available.iter().any(|t| t.name == name);

    let allowed: Option<Vec<&str>> = allow.map(|entries| {
        let mut names = Vec::new();
        for entry in entries {
            let (name, _) = base_name(entry);
            if name == "*" {
                names.push("*");
            } else if is_nesting_tool(name) {
                match available.iter().find(|t| t.name == HOST_NESTING_TOOL) {
                    Some(tool) => names.push(tool.name.as_str()),
                    None => warnings.push(format!(
                        "tool `{entry}` ignored: the host does not let this task start subagents (the operator's `subagents.max_depth` is reached)"
                    )),
                }
            } else if !known(name) {
                warnings.push(format!("tool `{entry}` is not a tool of this session; ignored"));
            } else {
                names.push(name);
            }
        }
        names
    });
    let mut denied: Vec<&str> = Vec::new();
    for entry in deny {
        let (name, pattern) = base_name(entry);
        if pattern {
            // The host's deny rule for this agent (see the module docs).
            continue;
        } else if !known(name) && !is_nesting_tool(name) {
            warnings.push(format!("disallowedTools entry `{entry}` is not a tool of this session; ignored"));
        } else {
            denied.push(name);
        }
    }

    // The nesting tool only by name (never through `*` or an absent list), as the host.
    let allowed: Option<Vec<String>> = allowed.map(|names| names.into_iter().map(str::to_owned).collect());
    let tools = available
        .into_iter()
        .filter(|t| match &allowed {
            None => !is_nesting_tool(&t.name),
            Some(names) if is_nesting_tool(&t.name) => t.name == HOST_NESTING_TOOL && names.contains(&t.name),
            Some(names) => names.iter().any(|n| n == "*" || *n == t.name),
        })
        .filter(|t| !denied.iter().any(|d| *d == t.name || (is_nesting_tool(d) && is_nesting_tool(&t.name))))
        .collect();
    Selection { tools, warnings }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str) -> ToolSpec {
        ToolSpec { name: name.into(), description: format!("{name} tool"), input_schema: "{}".into() }
    }

    fn session() -> Vec<ToolSpec> {
        ["Read", "Write", "Edit", "Glob", "Grep", "Bash", "Task"].into_iter().map(spec).collect()
    }

    fn names(s: &Selection) -> Vec<&str> {
        s.tools.iter().map(|t| t.name.as_str()).collect()
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn no_tools_key_means_every_tool_but_the_nesting_one() {
        let s = select(session(), None, &[]);
        assert_eq!(names(&s), ["Read", "Write", "Edit", "Glob", "Grep", "Bash"]);
        assert!(s.warnings.is_empty());
    }

    #[test]
    fn empty_tools_means_none() {
        assert!(select(session(), Some(&[]), &[]).tools.is_empty());
    }

    #[test]
    fn tools_then_disallowed_tools() {
        let allow = strings(&["Read", "Grep", "Bash(git status:*)", "Write"]);
        let s = select(session(), Some(&allow), &strings(&["Write"]));
        assert_eq!(names(&s), ["Read", "Grep", "Bash"]);
        let s = select(session(), None, &strings(&["Bash", "Edit", "Write"]));
        assert_eq!(names(&s), ["Read", "Glob", "Grep"]);
    }

    #[test]
    fn unknown_names_warn_and_agent_passes_only_when_offered_and_named() {
        let allow = strings(&["Read", "WebFetch", "Task", "Agent(reviewer)"]);
        let s = select(session(), Some(&allow), &strings(&["NotebookEdit", "Bash(rm:*)"]));
        assert_eq!(names(&s), ["Read"], "the session offers no Agent tool");
        assert_eq!(s.warnings.len(), 4, "{:?}", s.warnings);
        assert!(s.warnings.iter().any(|w| w.contains("WebFetch")));
        assert!(s.warnings.iter().any(|w| w.contains("`Task` ignored") && w.contains("subagents.max_depth")));
        assert!(s.warnings.iter().any(|w| w.contains("NotebookEdit")));
        assert!(!s.warnings.iter().any(|w| w.contains("Bash(rm:*)")), "a pattern is the host's deny rule");

        let mut nesting = session();
        nesting.push(spec("Agent"));
        let s = select(nesting.clone(), Some(&strings(&["Read", "Agent(reviewer)"])), &[]);
        assert_eq!(names(&s), ["Read", "Agent"]);
        assert!(s.warnings.is_empty(), "{:?}", s.warnings);
        assert_eq!(names(&select(nesting.clone(), Some(&strings(&["Task"])), &[])), ["Agent"], "the older name");
        for never in [None, Some(strings(&["*"]))] {
            assert!(!names(&select(nesting.clone(), never.as_deref(), &[])).contains(&"Agent"), "{never:?}");
        }
        assert!(select(nesting, Some(&strings(&["Agent"])), &strings(&["Task"])).tools.is_empty());
    }

    #[test]
    fn star_allows_everything() {
        let s = select(session(), Some(&strings(&["*"])), &strings(&["Bash"]));
        assert_eq!(names(&s), ["Read", "Write", "Edit", "Glob", "Grep"]);
    }
}
