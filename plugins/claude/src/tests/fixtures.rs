//! Every real-world agent file under `tests/fixtures/claude-agents` must resolve with the
//! name, description, tools and model its frontmatter states.
//!
//! The fixtures are found through `WARDEN_FIXTURES` (the `fixtures` directory, or its
//! `claude-agents` subdirectory), else in the repository's `tests/fixtures`.
//!
//! The expected values come from a deliberately naive line reader (independent of the
//! parser under test): these files keep `name`, `model` and `tools` on one line each.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use super::fake::session_tools;
use crate::agent::{Agent, parse_agent};
use crate::toolset;

const EXPECTED_FILES: usize = 202;

fn agents_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("WARDEN_FIXTURES").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        let nested = dir.join("claude-agents");
        return if nested.is_dir() { nested } else { dir };
    }
    let in_repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/claude-agents");
    assert!(
        in_repo.is_dir(),
        "fixtures not found at {}: set WARDEN_FIXTURES to a fixtures directory",
        in_repo.display()
    );
    in_repo
}

fn md_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            md_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

fn all_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    md_files(&agents_dir(), &mut files);
    files
}

fn resolve(path: &Path) -> Agent {
    let bytes = fs::read(path).unwrap();
    parse_agent(&path.display().to_string(), &bytes, &[]).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn fixture(relative: &str) -> (PathBuf, Agent) {
    let path = agents_dir().join(relative);
    let agent = resolve(&path);
    (path, agent)
}

/// The naive oracle: `key: value` lines of the frontmatter, values as written.
fn frontmatter_lines(path: &Path) -> BTreeMap<String, String> {
    let text = fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next().map(str::trim_end), Some("---"), "{}", path.display());
    let mut out = BTreeMap::new();
    for line in lines.take_while(|l| l.trim_end() != "---") {
        if let Some((key, value)) = line.split_once(':')
            && !key.starts_with(' ')
            && !key.is_empty()
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            out.insert(key.to_string(), value.trim().to_string());
        }
    }
    out
}

#[test]
fn every_fixture_agent_resolves_with_its_name_description_tools_and_model() {
    let files = all_files();
    assert_eq!(files.len(), EXPECTED_FILES, "agent files under {}", agents_dir().display());
    let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut by_stem: BTreeMap<String, usize> = BTreeMap::new();
    let mut tolerant = 0;
    for path in &files {
        let agent = resolve(path);
        let lines = frontmatter_lines(path);
        let shown = path.display();

        let name = &lines["name"];
        assert!(!agent.name.is_empty(), "{shown}");
        assert_eq!(&agent.name, name, "{shown}: name");

        assert!(!agent.description.trim().is_empty(), "{shown}: description");
        let written = &lines["description"];
        if written.starts_with('"') {
            assert_eq!(format!("\"{}\"", agent.description), *written, "{shown}: quoted description");
        } else if !written.starts_with(['>', '|']) {
            assert_eq!(&agent.description, written, "{shown}: plain description");
        } else {
            assert!(!agent.description.contains('\n') || written.starts_with('|'), "{shown}: folded");
        }

        match lines.get("tools") {
            None => assert_eq!(agent.protocol.tools, None, "{shown}: no tools key means all tools"),
            Some(t) if t == "[]" => assert_eq!(agent.protocol.tools, Some(vec![]), "{shown}: tools: []"),
            Some(t) => {
                let expected: Vec<String> = t.split(',').map(|s| s.trim().to_string()).collect();
                assert_eq!(agent.protocol.tools.as_ref(), Some(&expected), "{shown}: tools");
            }
        }
        assert_eq!(agent.protocol.model.as_deref(), lines.get("model").map(String::as_str), "{shown}: model");
        if let Some(color) = lines.get("color") {
            assert_eq!(agent.protocol.color.as_deref(), Some(color.as_str()), "{shown}: color is kept");
        }
        assert!(!agent.protocol.system_prompt.is_empty(), "{shown}: body");

        if agent.mode == crate::frontmatter::ParseMode::Tolerant {
            tolerant += 1;
        }
        by_name.entry(agent.name.clone()).or_default().push(shown.to_string());
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        *by_stem.entry(stem).or_default() += 1;
    }

    let duplicate_names: Vec<_> = by_name.iter().filter(|(_, files)| files.len() > 1).collect();
    let repeated_stems: Vec<_> = by_stem.iter().filter(|(_, n)| **n > 1).collect();
    println!(
        "{} files, {} distinct names, {} duplicate names, {} file names used in more than one folder, {} read tolerantly",
        files.len(),
        by_name.len(),
        duplicate_names.len(),
        repeated_stems.len(),
        tolerant
    );
    for (name, files) in &duplicate_names {
        println!("duplicate name {name}: {files:?}");
    }
    for (stem, n) in &repeated_stems {
        println!("file name {stem}.md in {n} folders");
    }
}

#[test]
fn folded_description_and_empty_tools_list() {
    let (_, a) = fixture("wshobson-agents/arm-cortex-microcontrollers/arm-cortex-expert.md");
    assert_eq!(a.name, "arm-cortex-expert");
    assert!(a.description.starts_with("Senior embedded software engineer specializing in firmware"));
    assert!(a.description.ends_with("interrupt-driven I/O, and peripheral drivers."));
    assert!(!a.description.contains('\n'), "`>` folds lines");
    assert_eq!(a.protocol.tools, Some(vec![]), "tools: [] is no tools, not all tools");
    assert_eq!(a.protocol.model.as_deref(), Some("inherit"));
    assert!(a.protocol.system_prompt.starts_with("# @arm-cortex-expert"));
}

#[test]
fn strip_folded_description_and_mcp_tool_names() {
    let (_, a) = fixture("wshobson-agents/meigen-ai-design/gallery-researcher.md");
    assert!(a.description.starts_with("Gallery search and inspiration agent. Delegates here"));
    assert!(!a.description.ends_with('\n'));
    assert_eq!(
        a.protocol.tools,
        Some(vec!["mcp__meigen__search_gallery".to_string(), "mcp__meigen__get_inspiration".into()])
    );
    assert_eq!(a.protocol.model.as_deref(), Some("haiku"));
}

#[test]
fn quoted_description() {
    let (_, a) = fixture("wshobson-agents/plugin-eval/eval-judge.md");
    assert!(a.description.starts_with("LLM judge for plugin quality assessment."));
    assert!(!a.description.contains('"'));
    assert_eq!(a.protocol.tools, Some(vec!["Read".to_string(), "Grep".into(), "Glob".into()]));
}

#[test]
fn name_differs_from_file_name() {
    let (path, a) = fixture("wshobson-agents/framework-migration/legacy-modernizer.md");
    assert_eq!(path.file_stem().unwrap(), "legacy-modernizer");
    assert_eq!(a.name, "framework-migration-legacy-modernizer");
    assert_eq!(a.protocol.model.as_deref(), Some("fable"), "unknown model names pass through");
    assert_eq!(a.protocol.tools, None);
}

#[test]
fn fence_lines_inside_the_body_stay_in_the_system_prompt() {
    let (path, a) = fixture("wshobson-agents/c4-architecture/c4-code.md");
    let text = fs::read_to_string(&path).unwrap();
    let fences = text.lines().filter(|l| l.trim_end() == "---").count();
    assert!(fences > 2, "the fixture has `---` lines in its body");
    assert_eq!(a.protocol.system_prompt.lines().filter(|l| l.trim_end() == "---").count(), fences - 2);
    assert!(text.trim_end().ends_with(a.protocol.system_prompt.lines().last().unwrap()));
}

#[test]
fn color_and_nesting_tools_in_a_team_lead() {
    let (_, a) = fixture("wshobson-agents/agent-teams/team-lead.md");
    assert_eq!(a.protocol.color.as_deref(), Some("blue"));
    assert!(!a.warnings.iter().any(|w| w.contains("`Agent`")), "nesting is the host's to allow: {:?}", a.warnings);
    let tools = a.protocol.tools.clone().unwrap();
    assert!(tools.contains(&"Agent".to_string()) && tools.contains(&"TeamCreate".to_string()));
    let selection = toolset::select(session_tools(), Some(&tools), &a.protocol.disallowed_tools);
    let names: Vec<_> = selection.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["Read", "Glob", "Grep", "Bash"]);
    assert!(selection.warnings.iter().any(|w| w.contains("`Agent`") && w.contains("subagents.max_depth")));
    assert!(selection.warnings.iter().any(|w| w.contains("TeamCreate")));
}

/// The synthetic copies of the real files issue 44 quotes (each refused or misread before):
/// a name Claude Code takes (the host derives a safe id), a frontmatter closed by a longer
/// run of dashes, a `context: fork` after a `tools:` list, `Stop` and `PostToolUseFailure`
/// hooks, `bypassPermissions`, and `disallowedTools` with an argument pattern.
const ISSUE_44_CASES: &[(&str, &str)] = &[
    (
        "fpa-analyst.md",
        "---\nname: \"FP&A Analyst\"\ndescription: Builds budgets and forecasts\ntools: Read, Write\n---\nYou analyse.\n",
    ),
    ("sre.md", "---\nname: SRE (Site Reliability Engineer)\ndescription: Keeps services up\n---\nYou run services.\n"),
    (
        "devops.md",
        "---\nname: Python DevOps/CI-CD Expert\ndescription: CI for Python\nmodel: sonnet\n---\nYou build pipelines.\n",
    ),
    (
        "long-closer.md",
        "---\nname: long-closer\ndescription: Closed by many dashes\n------------------------------------\nBody.\n",
    ),
    (
        "forked.md",
        "---\nname: forked\ndescription: Runs in a fork\ntools:\n  - Read\n  - Grep\ncontext: fork\n---\nBody.\n",
    ),
    (
        "stopper.md",
        "---\nname: stopper\ndescription: Checks before stopping\nhooks:\n  Stop:\n    - hooks:\n        - type: command\n          command: ./check-done.sh\n  PostToolUseFailure:\n    - matcher: Bash\n      hooks:\n        - type: command\n          command: ./explain.sh\n---\nBody.\n",
    ),
    (
        "bypass.md",
        "---\nname: bypass\ndescription: Wants no questions\npermissionMode: bypassPermissions\n---\nBody.\n",
    ),
    (
        "careful.md",
        "---\nname: careful\ndescription: Never deletes\ntools: Bash, Read\ndisallowedTools: Bash(rm -rf*), Bash(git push:*)\n---\nBody.\n",
    ),
];

/// Done-when of issue 44: no valid Claude Code file (the bundled real ones and the quoted
/// cases) is refused for a field Claude Code accepts, and a file whose frontmatter is
/// valid YAML reads exactly as the YAML parser reads it.
#[test]
fn no_valid_claude_code_file_is_refused_and_valid_yaml_reads_as_the_yaml_parser_reads_it() {
    let mut texts: Vec<(String, String)> =
        all_files().iter().map(|p| (p.display().to_string(), fs::read_to_string(p).unwrap())).collect();
    texts.extend(ISSUE_44_CASES.iter().map(|(n, t)| (format!("agents/{n}"), t.to_string())));
    let mut yaml_files = 0;
    for (uri, text) in &texts {
        let agent = parse_agent(uri, text.as_bytes(), &[]).unwrap_or_else(|e| panic!("{uri}: {e}"));
        assert!(agent.refusals.is_empty(), "{uri}: {:?}", agent.refusals);
        let (frontmatter, _) = crate::frontmatter::split(text).unwrap();
        if let Ok(serde_yaml::Value::Mapping(mapping)) = serde_yaml::from_str::<serde_yaml::Value>(&frontmatter) {
            yaml_files += 1;
            let fields = crate::frontmatter::parse_fields(&frontmatter);
            assert_eq!(fields.mode, crate::frontmatter::ParseMode::Yaml, "{uri}");
            let expected: serde_json::Map<String, serde_json::Value> = mapping
                .into_iter()
                .map(|(k, v)| (k.as_str().unwrap().to_string(), crate::frontmatter::yaml_to_json(v)))
                .collect();
            assert_eq!(fields.map, expected, "{uri}");
        }
    }
    assert!(yaml_files > EXPECTED_FILES / 2, "most files are valid YAML: {yaml_files}");
    let parsed = |name: &str| {
        let (n, t) = ISSUE_44_CASES.iter().find(|(n, _)| *n == name).unwrap();
        parse_agent(&format!("agents/{n}"), t.as_bytes(), &[]).unwrap()
    };
    assert_eq!(parsed("fpa-analyst.md").name, "FP&A Analyst", "the plugin keeps the name; the host derives the id");
    assert_eq!(parsed("long-closer.md").protocol.system_prompt, "Body.");
    let forked = parsed("forked.md");
    assert_eq!(forked.protocol.tools, Some(vec!["Read".into(), "Grep".into()]), "`context: fork` is not a tool");
    assert!(forked.warnings.iter().any(|w| w.contains("unknown frontmatter field `context`")), "{:?}", forked.warnings);
    let stopper = parsed("stopper.md");
    assert_eq!(stopper.protocol.hooks.stop[0].commands[0].command, "./check-done.sh");
    assert_eq!(stopper.protocol.hooks.post_tool_use_failure[0].matcher, ["Bash"]);
    assert_eq!(
        parsed("bypass.md").protocol.permission_mode(),
        (Some(crate::agent::PermissionMode::BypassPermissions), None)
    );
    assert_eq!(parsed("careful.md").protocol.disallowed_tools, ["Bash(rm -rf*)", "Bash(git push:*)"]);
}
