//! Which of the session's tools an agent gets.
//!
//! Start from the host's list (already without policy-denied tools), drop the nesting tools
//! (`Task`, and `Agent`, its newer name: subagents never start subagents), keep only the
//! names in `tools` when the agent lists them, then remove `disallowedTools`.
//!
//! Entries may carry Claude Code argument patterns (`Bash(git status:*)`): in `tools` the
//! pattern's tool is allowed (the argument rule is the approval policy's business); in
//! `disallowedTools` a pattern does not remove the whole tool. Names the session does not
//! have are reported as warnings and otherwise ignored.

use warden_guest::ToolSpec;

/// Tools that would let a subagent start subagents.
pub const NESTING_TOOLS: &[&str] = &["Task", "Agent"];

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

pub fn select(available: Vec<ToolSpec>, allow: Option<&[String]>, deny: &[String]) -> Selection {
    let mut warnings = Vec::new();
    let known = |name: &str| available.iter().any(|t| t.name == name);

    let allowed: Option<Vec<&str>> = allow.map(|entries| {
        let mut names = Vec::new();
        for entry in entries {
            let (name, _) = base_name(entry);
            if name == "*" {
                names.push("*");
            } else if NESTING_TOOLS.contains(&name) {
                warnings.push(format!("tool `{entry}` is not available to subagents (no nesting); ignored"));
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
            warnings.push(format!(
                "disallowedTools entry `{entry}` has an argument pattern; the plugin removes whole tools only, so it is left to the approval policy"
            ));
        } else if !known(name) && !NESTING_TOOLS.contains(&name) {
            warnings.push(format!("disallowedTools entry `{entry}` is not a tool of this session; ignored"));
        } else {
            denied.push(name);
        }
    }

    let tools = available
        .into_iter()
        .filter(|t| !NESTING_TOOLS.contains(&t.name.as_str()))
        .filter(|t| match &allowed {
            None => true,
            Some(names) => names.iter().any(|n| *n == "*" || *n == t.name),
        })
        .filter(|t| !denied.contains(&t.name.as_str()))
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
    fn no_tools_key_means_every_tool_but_task() {
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
    fn unknown_names_warn_and_task_never_passes() {
        let allow = strings(&["Read", "WebFetch", "Task", "Agent"]);
        let s = select(session(), Some(&allow), &strings(&["NotebookEdit", "Bash(rm:*)"]));
        assert_eq!(names(&s), ["Read"]);
        assert_eq!(s.warnings.len(), 5, "{:?}", s.warnings);
        assert!(s.warnings.iter().any(|w| w.contains("WebFetch")));
        assert!(s.warnings.iter().any(|w| w.contains("no nesting")));
        assert!(s.warnings.iter().any(|w| w.contains("NotebookEdit")));
        assert!(s.warnings.iter().any(|w| w.contains("approval policy")));
    }

    #[test]
    fn star_allows_everything() {
        let s = select(session(), Some(&strings(&["*"])), &strings(&["Bash"]));
        assert_eq!(names(&s), ["Read", "Write", "Edit", "Glob", "Grep"]);
    }
}
