//! Permission rules in Claude Code's syntax, parsed once at load.
//!
//! Forms accepted:
//! - a bare tool name: `Read`, `Bash`, `WebFetch` — every use of that tool;
//! - `Bash(git status)` exact, `Bash(npm run test:*)` prefix, `Bash(npm run *)`
//!   / `Bash(git * main)` wildcard (see [`BashPattern`]);
//! - path rules for file tools (`Read`, `Edit`, `Write`, `Glob`, `Grep`, `LS`,
//!   `MultiEdit`, `NotebookEdit`, `NotebookRead`) with a gitignore-style glob:
//!   `//abs/path` (absolute), `~/path` (home directory), `/path` (relative to
//!   the workspace root — Claude Code reads it relative to the settings file's
//!   project; warden's project is the workspace), `./path` (relative to the
//!   workspace root), and `path` without `./` (a pattern with no `/` matches at
//!   any depth below the workspace root, as in gitignore). `Read(...)` applies
//!   to every tool that reads files (Read, Glob, Grep, LS, NotebookRead) and
//!   `Edit(...)` to every tool that changes files (Edit, Write, MultiEdit,
//!   NotebookEdit); other names apply to that tool only;
//! - `WebFetch(domain:example.com)` / `WebFetch(domain:*.example.com)`;
//! - `Task(name)` / `Agent(name)`: the subagent type;
//! - MCP tools: `mcp__server__tool`, `mcp__server__*` and `mcp__server` (every
//!   tool of that server).
//!
//! This module must never accept a rule it cannot evaluate exactly as written:
//! anything malformed is a [`RuleError`] naming the rule and the problem, so a
//! typo never silently turns into a rule that matches nothing (or everything).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::matcher::{self, BashPattern, PathGlob};
use crate::shell;

/// Tools whose input names one file or directory that a `Read(...)` rule covers.
pub const READ_TOOLS: &[&str] = &["Read", "Glob", "Grep", "LS", "NotebookRead"];
/// Tools whose input names one file that an `Edit(...)` rule covers.
pub const EDIT_TOOLS: &[&str] = &["Edit", "Write", "MultiEdit", "NotebookEdit"];
/// Tools that read a whole tree below the path they are given (the search root: ripgrep
/// for Grep, a walk for Glob and LS): a deny or ask path rule applies to them when it
/// could match the root *or anything below it* ([`PathGlob::may_match_below`]), since
/// `Grep {"glob": "secrets/**"}` over the workspace reads what `Read(./secrets/**)` denies.
pub const DIRECTORY_TOOLS: &[&str] = &["Glob", "Grep", "LS"];

/// A rule that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid permission rule `{rule}`: {reason}")]
pub struct RuleError {
    /// The rule text as written.
    pub rule: String,
    /// What is wrong and what was expected.
    pub reason: String,
}

/// Which tools a rule is about.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ToolSel {
    /// One tool name, exactly.
    Name(String),
    /// Every tool of an MCP server: `mcp__server__<anything>`.
    McpServer(String),
}

/// What a rule checks in the tool's input.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Spec {
    Any,
    Bash(BashPattern),
    Path { tools: &'static [&'static str], pattern: PathPattern },
    Domain(String),
    Subagent(String),
}

/// A path pattern before the workspace root and home are known.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PathPattern {
    Absolute(String),
    Home(String),
    Workspace(String),
}

/// A parsed permission rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    text: String,
    tool: ToolSel,
    spec: Spec,
}

/// What a rule is checked against.
pub(crate) struct Target<'a> {
    pub tool: &'a str,
    pub input: &'a Value,
    /// For Bash: the match key of one simple command ([`shell::SimpleCommand::match_key`]).
    pub bash_part: Option<&'a str>,
    /// For path tools: the normalised absolute path and whether a relative
    /// input escaped the workspace root.
    pub path: Option<(&'a Path, bool)>,
    pub workspace_root: &'a Path,
    pub home: &'a Path,
    /// The call reads or writes the whole tree below `path` (a Bash `grep -r`, `rm -r`):
    /// deny and ask rules apply when they could match anything below it, as for
    /// [`DIRECTORY_TOOLS`].
    pub tree: bool,
}

impl Rule {
    /// Parse one rule.
    pub fn parse(text: &str) -> Result<Rule, RuleError> {
        let err = |reason: &str| RuleError { rule: text.to_owned(), reason: reason.to_owned() };
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(err("empty rule"));
        }
        let (name, spec_text) = match trimmed.find('(') {
            Some(open) => {
                let Some(inner) = trimmed[open + 1..].strip_suffix(')') else {
                    return Err(err("a specifier must end with `)`, as in `Bash(git status)`"));
                };
                (trimmed[..open].trim_end(), Some(inner.trim()))
            }
            None => {
                if trimmed.contains(')') {
                    return Err(err("unbalanced `)`"));
                }
                (trimmed, None)
            }
        };
        let name_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '*';
        if name.is_empty() || !name.chars().all(name_char) {
            return Err(err("the tool name must be letters, digits, `_` or `-` (e.g. `Read`, `mcp__server__tool`)"));
        }
        if let Some(rest) = name.strip_prefix("mcp__") {
            if spec_text.is_some() {
                return Err(err("MCP rules take no specifier; use `mcp__server__tool` or `mcp__server__*`"));
            }
            return Ok(Rule { text: trimmed.to_owned(), tool: mcp_sel(rest).map_err(|r| err(&r))?, spec: Spec::Any });
        }
        if name.contains('*') {
            return Err(err("wildcards in tool names are only supported as `mcp__server__*`"));
        }
        let spec = match spec_text {
            None => Spec::Any,
            Some("") => {
                return Err(err("empty specifier `()`; write the bare tool name to match every use"));
            }
            Some("*") if name == "Bash" => Spec::Any,
            Some(s) => parse_spec(name, s).map_err(|r| err(&r))?,
        };
        Ok(Rule { text: trimmed.to_owned(), tool: ToolSel::Name(name.to_owned()), spec })
    }

    /// The rule text as written (trimmed).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// A rule with no specifier: it covers every use of its tool(s).
    pub fn is_whole_tool(&self) -> bool {
        self.spec == Spec::Any
    }

    /// Is this a rule with a path specifier (`Read(./secrets/**)`)?
    pub(crate) fn is_path_rule(&self) -> bool {
        matches!(self.spec, Spec::Path { .. })
    }

    /// Is this a Bash rule with a command specifier?
    pub(crate) fn is_bash_specific(&self) -> bool {
        matches!(self.spec, Spec::Bash(_))
    }

    /// Does the Bash pattern text itself mention an output redirection?
    pub(crate) fn bash_mentions_redirect(&self) -> bool {
        match &self.spec {
            Spec::Bash(BashPattern::Exact(p) | BashPattern::Prefix(p) | BashPattern::Glob(p)) => p.contains('>'),
            _ => false,
        }
    }

    /// Is this a Bash rule that names a whole command word for word (`Bash(rm -r build)`,
    /// no wildcard, no prefix)? Such a rule shows every file the command writes.
    pub(crate) fn bash_names_every_word(&self) -> bool {
        matches!(&self.spec, Spec::Bash(BashPattern::Exact(_)))
    }

    /// Could this Bash rule match a command whose match key starts with `fixed` and goes
    /// on with words known only at run time? (A rule for every Bash command always could.)
    pub(crate) fn could_match_bash_after(&self, fixed: &str) -> bool {
        self.covers_tool("Bash")
            && match &self.spec {
                Spec::Any => true,
                Spec::Bash(p) => p.could_match_after(fixed),
                _ => false,
            }
    }

    /// Does the rule name this tool (ignoring the specifier)?
    pub fn covers_tool(&self, tool: &str) -> bool {
        match (&self.tool, &self.spec) {
            (_, Spec::Path { tools, .. }) => tools.contains(&tool),
            // `Task` is the Agent tool's earlier name: a rule for either covers both.
            (ToolSel::Name(n), _) => n == tool || (is_agent_tool(n) && is_agent_tool(tool)),
            (ToolSel::McpServer(server), _) => tool
                .strip_prefix("mcp__")
                .and_then(|r| r.strip_prefix(server.as_str()))
                .is_some_and(|r| r.starts_with("__") && r.len() > 2),
        }
    }

    /// Does the rule match this call?
    pub(crate) fn matches(&self, t: &Target<'_>, for_allow: bool) -> bool {
        if !self.covers_tool(t.tool) {
            return false;
        }
        match &self.spec {
            Spec::Any => true,
            Spec::Bash(p) => t.bash_part.is_some_and(|part| p.matches(part)),
            Spec::Path { pattern, .. } => {
                let Some((path, escaped)) = t.path else {
                    return false;
                };
                if escaped && for_allow {
                    return false;
                }
                let glob = match pattern {
                    PathPattern::Absolute(p) => PathGlob::new(p),
                    PathPattern::Home(p) => PathGlob::new(&format!("{}/{p}", t.home.display())),
                    PathPattern::Workspace(p) => PathGlob::new(&format!("{}/{p}", t.workspace_root.display())),
                };
                // An allow rule must cover the whole search; a deny or ask rule applies to
                // a directory tool that could reach what it names.
                if !for_allow && (t.tree || DIRECTORY_TOOLS.contains(&t.tool)) {
                    glob.may_match_below(path)
                } else {
                    glob.matches(path)
                }
            }
            Spec::Domain(d) => t
                .input
                .get("url")
                .and_then(Value::as_str)
                .and_then(matcher::url_host)
                .is_some_and(|h| matcher::domain_matches(d, &h)),
            Spec::Subagent(name) => t.input.get("subagent_type").and_then(Value::as_str) == Some(name.as_str()),
        }
    }
}

/// The tool that starts subagents, under its current and its earlier name.
fn is_agent_tool(name: &str) -> bool {
    name == "Agent" || name == "Task"
}

fn mcp_sel(rest: &str) -> Result<ToolSel, String> {
    let (server, tool) = match rest.split_once("__") {
        Some((s, t)) => (s, Some(t)),
        None => (rest, None),
    };
    if server.is_empty() || server.contains('*') {
        return Err("expected `mcp__<server>`, `mcp__<server>__*` or `mcp__<server>__<tool>`".into());
    }
    match tool {
        None | Some("*") => Ok(ToolSel::McpServer(server.to_owned())),
        Some("") => Err("missing tool name after `mcp__<server>__`".into()),
        Some(t) if t.contains('*') => Err("only a whole `*` is supported after `mcp__<server>__`".into()),
        Some(t) => Ok(ToolSel::Name(format!("mcp__{server}__{t}"))),
    }
}

fn parse_spec(tool: &str, spec: &str) -> Result<Spec, String> {
    match tool {
        "Bash" => parse_bash(spec).map(Spec::Bash),
        "Read" | "Edit" | "Write" | "Glob" | "Grep" | "LS" | "MultiEdit" | "NotebookEdit" | "NotebookRead" => {
            let tools: &'static [&'static str] = match tool {
                "Read" => READ_TOOLS,
                "Edit" => EDIT_TOOLS,
                "Write" => &["Write"],
                "Glob" => &["Glob"],
                "Grep" => &["Grep"],
                "LS" => &["LS"],
                "MultiEdit" => &["MultiEdit"],
                "NotebookEdit" => &["NotebookEdit"],
                _ => &["NotebookRead"],
            };
            Ok(Spec::Path { tools, pattern: parse_path(spec)? })
        }
        "WebFetch" => {
            let Some(d) = spec.strip_prefix("domain:") else {
                return Err("WebFetch rules take `domain:<host>`, e.g. `WebFetch(domain:example.com)`".into());
            };
            let d = d.trim().trim_end_matches('.').to_ascii_lowercase();
            let body = d.strip_prefix("*.").unwrap_or(&d);
            if body.is_empty() || !body.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':')) {
                return Err("the domain must be a host name, optionally starting with `*.`".into());
            }
            Ok(Spec::Domain(d))
        }
        "Task" | "Agent" => Ok(Spec::Subagent(spec.to_owned())),
        _ => Err(format!(
            "`{tool}` takes no specifier (specifiers are supported for Bash, file tools, WebFetch, Task/Agent)"
        )),
    }
}

fn parse_bash(spec: &str) -> Result<BashPattern, String> {
    let canon = |s: &str| -> Result<String, String> {
        // `*` is rule syntax, so a pattern may be a shell glob; only text that
        // is not well-formed shell is refused.
        let recognition = shell::recognize(s);
        if let Some(why) = recognition.not_understood()
            && why.reason.is_malformed()
        {
            return Err(format!("the command pattern cannot be parsed: {why}"));
        }
        match recognition.commands() {
            [one] => Ok(one.match_key()),
            [] => Err("empty command pattern".into()),
            _ => Err("a command pattern must be one simple command (no `;`, `&&`, `|`, `$(...)`, ...)".into()),
        }
    };
    if let Some(prefix) = spec.strip_suffix(":*") {
        if prefix.contains('*') {
            return Err("`:*` cannot be combined with other `*` wildcards".into());
        }
        return Ok(BashPattern::Prefix(canon(prefix)?));
    }
    if spec.contains(":*") {
        return Err("`:*` is only allowed at the end of the pattern".into());
    }
    let c = canon(spec)?;
    if c.contains('*') { Ok(BashPattern::Glob(c)) } else { Ok(BashPattern::Exact(c)) }
}

fn parse_path(spec: &str) -> Result<PathPattern, String> {
    if spec.contains('\0') {
        return Err("NUL in path pattern".into());
    }
    let check = |p: &str| -> Result<String, String> {
        if p.split('/').any(|s| s == "..") {
            return Err("`..` is not allowed in a path pattern".into());
        }
        if p.trim_matches('/').is_empty() && !p.is_empty() {
            return Ok(String::new());
        }
        // A trailing `/` means the directory and everything in it; the glob
        // matcher already covers descendants of a matched directory.
        Ok(p.trim_end_matches('/').to_owned())
    };
    if let Some(abs) = spec.strip_prefix("//") {
        return Ok(PathPattern::Absolute(format!("/{}", check(abs)?)));
    }
    if spec == "~" {
        return Ok(PathPattern::Home(String::new()));
    }
    if let Some(home) = spec.strip_prefix("~/") {
        return Ok(PathPattern::Home(check(home)?));
    }
    if spec.starts_with('~') {
        return Err("`~user` paths are not supported; use `~/` or `//abs/path`".into());
    }
    if let Some(root_rel) = spec.strip_prefix('/') {
        return Ok(PathPattern::Workspace(check(root_rel)?));
    }
    if let Some(rel) = spec.strip_prefix("./") {
        return Ok(PathPattern::Workspace(check(rel)?));
    }
    let p = check(spec)?;
    if p.contains('/') {
        Ok(PathPattern::Workspace(p))
    } else {
        // gitignore: a pattern without a slash matches at any depth.
        Ok(PathPattern::Workspace(format!("**/{p}")))
    }
}

/// The path a file tool's input names, if any: `file_path` / `notebook_path`
/// for Read/Write/Edit/..., `path` (default: the workspace root) for
/// Glob/Grep/LS; for Glob the literal directory part of `pattern` is appended
/// (`src/**/*.rs` searches `src`).
pub(crate) fn tool_path(tool: &str, input: &Value) -> Option<PathBuf> {
    let s = |k: &str| input.get(k).and_then(Value::as_str);
    match tool {
        "Glob" | "Grep" | "LS" => {
            let mut base = PathBuf::from(s("path").filter(|p| !p.is_empty()).unwrap_or("."));
            if tool == "Glob"
                && let Some(pattern) = s("pattern")
            {
                let literal: Vec<&str> = pattern.split('/').take_while(|seg| !matcher::has_glob_meta(seg)).collect();
                let lit = literal.join("/");
                if pattern.starts_with('/') {
                    base = PathBuf::from(if lit.is_empty() { "/".to_owned() } else { lit });
                } else if !lit.is_empty() {
                    base.push(lit);
                }
            }
            Some(base)
        }
        _ if READ_TOOLS.contains(&tool) || EDIT_TOOLS.contains(&tool) => {
            s("file_path").or_else(|| s("notebook_path")).or_else(|| s("path")).map(PathBuf::from)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_name_the_rule() {
        for bad in [
            "",
            "Bash(",
            "Bash()",
            "Bash(a; b)",
            "Bash(a:* b)",
            "Foo(x)",
            "WebFetch(example.com)",
            "mcp__(x)",
            "mcp__s__a*",
            "Read(../x)",
            "B ash",
            "Bash(echo 'x)",
        ] {
            let e = Rule::parse(bad).unwrap_err();
            assert_eq!(e.rule, bad);
            assert!(e.to_string().contains("invalid permission rule"), "{e}");
        }
    }

    #[test]
    fn parse_forms() {
        assert!(Rule::parse("Read").unwrap().is_whole_tool());
        assert!(Rule::parse("Bash(*)").unwrap().is_whole_tool());
        assert!(Rule::parse("mcp__srv").unwrap().covers_tool("mcp__srv__x"));
        assert!(!Rule::parse("mcp__srv").unwrap().covers_tool("mcp__srvx__x"));
        assert!(Rule::parse("mcp__srv__*").unwrap().covers_tool("mcp__srv__x"));
        assert!(Rule::parse("Edit(src/**)").unwrap().covers_tool("Write"));
        assert!(!Rule::parse("Write(src/**)").unwrap().covers_tool("Edit"));
    }

    #[test]
    fn glob_tool_path() {
        let v = serde_json::json!({"pattern": "secrets/**/*.key"});
        assert_eq!(tool_path("Glob", &v), Some(PathBuf::from("./secrets")));
        let v = serde_json::json!({"pattern": "/etc/*", "path": "x"});
        assert_eq!(tool_path("Glob", &v), Some(PathBuf::from("/etc")));
    }
}
