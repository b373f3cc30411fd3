//! The built-in agents shipped in `plugins/claude/builtin/`.

use std::fs;
use std::path::Path;

use crate::agent::parse_agent;
use crate::frontmatter::ParseMode;

fn builtin(name: &str) -> crate::agent::Agent {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("builtin").join(format!("{name}.md"));
    let bytes = fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let agent = parse_agent(&path.display().to_string(), &bytes, &[]).unwrap();
    assert_eq!(agent.mode, ParseMode::Yaml, "{name}: built-ins are clean YAML");
    assert!(agent.warnings.is_empty(), "{name}: {:?}", agent.warnings);
    assert_eq!(agent.name, name);
    assert!(agent.description.len() > 40, "{name}: a description the parent can choose by");
    assert!(agent.protocol.system_prompt.len() > 200, "{name}: a real system prompt");
    agent
}

fn tools(agent: &crate::agent::Agent) -> Option<Vec<&str>> {
    agent.protocol.tools.as_ref().map(|t| t.iter().map(String::as_str).collect())
}

#[test]
fn general_purpose_gets_every_tool() {
    let a = builtin("general-purpose");
    assert_eq!(tools(&a), None);
}

#[test]
fn explore_and_plan_are_read_only() {
    for name in ["Explore", "Plan"] {
        let a = builtin(name);
        assert_eq!(tools(&a), Some(vec!["Read", "Glob", "Grep", "Bash"]), "{name}");
        assert_eq!(a.protocol.permission_mode.as_deref(), Some("plan"), "{name}");
        assert!(a.protocol.system_prompt.contains("read-only"), "{name}");
    }
}

#[test]
fn bash_agent_has_only_bash() {
    let a = builtin("Bash");
    assert_eq!(tools(&a), Some(vec!["Bash"]));
}

#[test]
fn only_the_four_builtins_ship() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("builtin");
    let mut names: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".md"))
        .collect();
    names.sort();
    assert_eq!(names, ["Bash.md", "Explore.md", "Plan.md", "general-purpose.md"]);
}
