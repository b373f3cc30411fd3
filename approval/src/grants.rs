//! Approvals that hold beyond one call.
//!
//! A person approving an asked call chooses its [`Scope`]: `once` (this call only),
//! `session` (the same call again in the same session: same tool and the same command or
//! path, for the rest of the session) or `always` (the same, in every session, from now
//! on: the rule is appended to the operator-owned policy overlay file,
//! `approval.overlay`, which is read again at start). `always` changes the policy of every
//! user, so only an administrator's answer keeps it ([`crate::Authority::may_grant`]).
//!
//! A grant is a permission rule derived from the call ([`rule_for`]): `Bash(<command>)`
//! (exact), `<Tool>(//<absolute normalised path>)` for file tools or the bare name of an
//! MCP tool. A file grant covers that one path and nothing else — never a descendant, never
//! the same name elsewhere — and a call only when it covers the path as given *and* as the
//! sandbox resolved it (a grant for `notes.txt` does not follow a link `notes.txt` →
//! `secrets/key` made later), and never a file with other hard links. It only ever turns an
//! `ask` into an allow: deny rules, `default: deny` and read-only modes are decided before
//! grants are consulted, and `always` is refused for a tool any deny rule names. A call
//! that no exact rule can describe (a command with a wildcard or a line break, a path with
//! glob characters, a compound command the recognizer splits) or that edits executable
//! configuration ([`crate::policy::EXECUTABLE_CONFIG`]) can only be approved `once`.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::policy::{Decision, EvalContext, Policy, PolicyConfig, is_executable_config, resolve_path};
use crate::rule::{self, Rule};

/// Most grants one session may hold: each is checked on every asked call of the session.
pub const MAX_SESSION_GRANTS: usize = 256;
/// Most sessions holding grants at once; beyond it, `session` approvals are refused
/// (approve `once`) rather than memory growing without bound.
pub const MAX_GRANT_SESSIONS: usize = 10_000;
/// Most of those sessions one user's may be: an eighth, as for the host's other pools
/// shared by tenants (pending approvals, secrets). Without a share one tenant approving
/// `session` scope in 10,000 sessions made every other tenant's `session` approvals hold
/// `once` until a restart.
pub const MAX_GRANT_SESSIONS_PER_USER: usize = MAX_GRANT_SESSIONS / 8;

/// The user a grant-session key (`user/session`, see the gate) belongs to.
fn user_of(session: &str) -> &str {
    session.split_once('/').map_or(session, |(user, _)| user)
}

/// How long a person's approval holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// This call only.
    #[default]
    Once,
    /// The same call again in the same session.
    Session,
    /// The same call in every session, from now on (the overlay file); an administrator's
    /// answer only.
    Always,
}

impl Scope {
    /// `once`, `session` or `always`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Once => "once",
            Scope::Session => "session",
            Scope::Always => "always",
        }
    }
}

/// Whether `rules` (as an allow list, nothing else) allow the call.
fn allows(rules: &[String], tool: &str, input: &Value, ctx: &EvalContext) -> bool {
    let config = PolicyConfig { default: Decision::Deny, allow: rules.to_vec(), ..PolicyConfig::default() };
    Policy::from_config(config).is_ok_and(|p| p.evaluate(tool, input, ctx).decision == Decision::Allow)
}

/// The exact rule that covers this call, or why there is none.
pub fn rule_for(tool: &str, input: &Value, ctx: &EvalContext) -> Result<String, String> {
    let candidates: Vec<String> = if tool.starts_with("mcp__") {
        vec![tool.to_owned()]
    } else if tool == "Bash" {
        let cmd = input.get("command").and_then(Value::as_str).unwrap_or_default().trim();
        if cmd.is_empty() || cmd.contains(['\n', '\r', '*']) || cmd.ends_with(":*") {
            return Err("a command with a wildcard or a line break can only be approved once".into());
        }
        vec![format!("Bash({cmd})")]
    } else if let Some(path) = grant_path(tool, input, ctx) {
        let path = path?;
        if is_executable_config(&path) {
            return Err(format!(
                "{} is executable configuration (other programs run what it holds): it can only be approved once",
                path.display()
            ));
        }
        vec![exact_rule(tool, &path)?]
    } else {
        return Err(format!("{tool} calls can only be approved once"));
    };
    candidates
        .into_iter()
        .find(|c| Rule::parse(c).is_ok() && allows(std::slice::from_ref(c), tool, input, ctx))
        .ok_or_else(|| "no exact rule describes this call; it can only be approved once".into())
}

/// The normalised absolute path a file tool's call names (`None`: not a file tool), or why
/// no grant can name it.
fn grant_path(tool: &str, input: &Value, ctx: &EvalContext) -> Option<Result<PathBuf, String>> {
    if !rule::READ_TOOLS.contains(&tool) && !rule::EDIT_TOOLS.contains(&tool) {
        return None;
    }
    let path = rule::tool_path(tool, input)?;
    Some(normalised(&path, ctx))
}

fn normalised(path: &Path, ctx: &EvalContext) -> Result<PathBuf, String> {
    let (path, escaped) = resolve_path(&ctx.workspace_root, path);
    if escaped {
        return Err("a path that leaves the workspace with `..` can only be approved once".into());
    }
    Ok(path)
}

/// The one rule a file grant is kept as: `Tool(//abs/path)`, which names exactly this path
/// ([`Grants::matching`] compares it as text, so it never covers a descendant).
fn exact_rule(tool: &str, path: &Path) -> Result<String, String> {
    let p = path.to_str().ok_or("a path that is not UTF-8 can only be approved once")?;
    if p.contains(['*', '?', '[', ']', '{', '}', '\\', '\n', '\r', '(', ')']) {
        return Err("a path with glob characters can only be approved once".into());
    }
    Ok(format!("{tool}(//{})", p.trim_start_matches('/')))
}

/// Whether `rule` has the exact form [`exact_rule`] makes for some file tool and path: such
/// a rule covers that tool at that path only (`Edit(//w/a)` is neither a `Write` of `/w/a`
/// nor an edit of `/w/a/b`).
fn is_exact_file_rule(rule: &str) -> bool {
    let Some((name, rest)) = rule.split_once("(//") else { return false };
    (rule::READ_TOOLS.contains(&name) || rule::EDIT_TOOLS.contains(&name))
        && rest.strip_suffix(')').is_some_and(|p| !p.contains(['*', '?', '[', ']', '{', '}', '\\', '(', ')']))
}

/// The grants a gate holds.
#[derive(Debug, Default)]
pub(crate) struct Grants {
    session: Mutex<HashMap<String, Vec<String>>>,
    always: RwLock<Vec<String>>,
    overlay: Option<PathBuf>,
}

impl Grants {
    /// Grants with `overlay` as the `always` file (its rules are loaded; a missing file
    /// is an empty overlay).
    pub(crate) fn load(overlay: Option<PathBuf>) -> Result<Grants, String> {
        let mut always = vec![];
        if let Some(path) = &overlay {
            match std::fs::read_to_string(path) {
                Ok(text) => {
                    for (n, line) in text.lines().enumerate() {
                        let line = line.trim();
                        if line.is_empty() || line.starts_with('#') {
                            continue;
                        }
                        Rule::parse(line).map_err(|e| format!("{}:{}: {e}", path.display(), n + 1))?;
                        always.push(line.to_owned());
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("{}: {e}", path.display())),
            }
        }
        Ok(Grants { session: Mutex::default(), always: RwLock::new(always), overlay })
    }

    /// The grant that covers this call, if any: (scope, rule). For a file tool, the path as
    /// given and `resolved` (the sandbox's resolution, if it differs) must each be covered
    /// — by the exact rule of that path, or by an operator's allow rule in the overlay —
    /// and no grant covers a `hard_linked` file (its other names were never checked) or
    /// executable configuration ([`is_executable_config`]).
    pub(crate) fn matching(
        &self,
        tool: &str,
        input: &Value,
        resolved: Option<&str>,
        hard_linked: bool,
        session: Option<&str>,
        ctx: &EvalContext,
    ) -> Option<(Scope, String)> {
        let find = |rules: &[String]| -> Option<String> {
            let Some(given) = grant_path(tool, input, ctx) else {
                return rules.iter().find(|r| allows(std::slice::from_ref(*r), tool, input, ctx)).cloned();
            };
            // (the call's input naming the path, the path): as given, then as resolved.
            let mut named = vec![(input.clone(), given.ok()?)];
            if let Some(r) = resolved {
                let mut other = input.clone();
                let field = if rule::DIRECTORY_TOOLS.contains(&tool) { "path" } else { "file_path" };
                if let Some(map) = other.as_object_mut() {
                    map.insert(field.to_owned(), Value::String(r.to_owned()));
                }
                named.push((other, normalised(Path::new(r), ctx).ok()?));
            }
            if hard_linked || named.iter().any(|(_, p)| is_executable_config(p)) {
                return None;
            }
            let covers = |rule: &String, (input, path): &(Value, PathBuf)| {
                if is_exact_file_rule(rule) {
                    exact_rule(tool, path).is_ok_and(|exact| &exact == rule)
                } else {
                    // Another rule the operator wrote in the overlay: an allow rule.
                    allows(std::slice::from_ref(rule), tool, input, ctx)
                }
            };
            let rule = rules.iter().find(|r| covers(r, &named[0]))?;
            named.iter().all(|n| rules.iter().any(|r| covers(r, n))).then(|| rule.clone())
        };
        if let Some(s) = session {
            let map = self.session.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(r) = map.get(s).and_then(|rules| find(rules)) {
                return Some((Scope::Session, r));
            }
        }
        let always = self.always.read().unwrap_or_else(|p| p.into_inner());
        find(&always).map(|r| (Scope::Always, r))
    }

    /// Whether `always` approvals can be kept (an overlay file is configured).
    pub(crate) fn has_overlay(&self) -> bool {
        self.overlay.is_some()
    }

    /// Keeps `rule` for `scope`. `Always` appends it to the overlay file, with a comment
    /// line naming who approved it and when.
    pub(crate) fn add(
        &self,
        scope: Scope,
        session: Option<&str>,
        rule: &str,
        who: &str,
        request_id: &str,
    ) -> Result<(), String> {
        match scope {
            Scope::Once => Ok(()),
            Scope::Session => {
                let session = session.ok_or("the call belongs to no session")?;
                let mut map = self.session.lock().unwrap_or_else(|p| p.into_inner());
                if !map.contains_key(session) {
                    if map.len() >= MAX_GRANT_SESSIONS {
                        return Err(format!("more than {MAX_GRANT_SESSIONS} sessions hold approvals"));
                    }
                    let user = user_of(session);
                    if map.keys().filter(|k| user_of(k) == user).count() >= MAX_GRANT_SESSIONS_PER_USER {
                        return Err(format!(
                            "the user's sessions already hold approvals in {MAX_GRANT_SESSIONS_PER_USER} sessions"
                        ));
                    }
                }
                let rules = map.entry(session.to_owned()).or_default();
                if rules.len() >= MAX_SESSION_GRANTS {
                    return Err(format!("the session holds the maximum of {MAX_SESSION_GRANTS} approvals"));
                }
                if !rules.iter().any(|r| r == rule) {
                    rules.push(rule.to_owned());
                }
                Ok(())
            }
            Scope::Always => {
                let path = self.overlay.as_ref().ok_or("no approval.overlay file is configured")?;
                let mut always = self.always.write().unwrap_or_else(|p| p.into_inner());
                if !always.iter().any(|r| r == rule) {
                    let ts = humantime::format_rfc3339_millis(std::time::SystemTime::now());
                    let who = who.replace(['\n', '\r'], " ");
                    let text = format!("# approved always by user:{who} at {ts} (request {request_id})\n{rule}\n");
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)
                        .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|()| f.flush()))
                        .map_err(|e| format!("{}: {e}", path.display()))?;
                    always.push(rule.to_owned());
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ctx() -> EvalContext {
        EvalContext { workspace_root: "/workspace".into(), home: "/workspace".into() }
    }

    /// Regression: the host's 10,000 sessions holding `session` approvals had no per-user
    /// share: one tenant approving in that many sessions made every other tenant's
    /// `session` approvals hold `once`. Now one user's sessions stop at their share while
    /// another user's are still kept, and a session already holding grants takes more.
    #[test]
    fn regression_one_user_cannot_fill_the_session_grants() {
        let g = Grants::load(None).unwrap();
        for n in 0..MAX_GRANT_SESSIONS_PER_USER {
            g.add(Scope::Session, Some(&format!("mallory/s{n}")), "Bash(ls)", "mallory", "apr").unwrap();
        }
        let e = g.add(Scope::Session, Some("mallory/one-more"), "Bash(ls)", "mallory", "apr").unwrap_err();
        assert!(e.contains(&MAX_GRANT_SESSIONS_PER_USER.to_string()), "{e}");
        g.add(Scope::Session, Some("mallory/s0"), "Bash(pwd)", "mallory", "apr").unwrap();
        g.add(Scope::Session, Some("alice/s0"), "Bash(ls)", "alice", "apr").unwrap();
        // A user id that is a prefix of another's is a user of its own.
        g.add(Scope::Session, Some("mal/s0"), "Bash(ls)", "mal", "apr").unwrap();
    }

    #[test]
    fn a_grant_covers_the_same_call_and_nothing_broader() {
        let c = ctx();
        let rule = rule_for("Bash", &json!({ "command": "git status" }), &c).unwrap();
        assert_eq!(rule, "Bash(git status)");
        let g = Grants::load(None).unwrap();
        g.add(Scope::Session, Some("s1"), &rule, "alice", "apr_1").unwrap();
        let m = |cmd: &str, s: &str| g.matching("Bash", &json!({ "command": cmd }), None, false, Some(s), &c);
        assert_eq!(m("git status", "s1"), Some((Scope::Session, rule.clone())));
        assert_eq!(m("git status", "s2"), None, "another session");
        assert_eq!(m("git status --porcelain", "s1"), None, "another command");
        assert_eq!(m("git status && rm -rf /", "s1"), None, "a compound command");
        for bad in ["rm -rf *", "echo a\nrm x", "git:*"] {
            assert!(rule_for("Bash", &json!({ "command": bad }), &c).is_err(), "{bad:?}");
        }
        let w = rule_for("Write", &json!({ "file_path": "/workspace/a.txt", "content": "x" }), &c).unwrap();
        g.add(Scope::Session, Some("s1"), &w, "alice", "apr_2").unwrap();
        assert!(
            g.matching(
                "Write",
                &json!({ "file_path": "/workspace/a.txt", "content": "y" }),
                None,
                false,
                Some("s1"),
                &c
            )
            .is_some()
        );
        assert!(
            g.matching(
                "Write",
                &json!({ "file_path": "/workspace/b.txt", "content": "y" }),
                None,
                false,
                Some("s1"),
                &c
            )
            .is_none()
        );
        assert!(rule_for("Write", &json!({ "file_path": "/workspace/*.txt" }), &c).is_err());
    }

    #[test]
    fn always_grants_are_appended_to_the_overlay_and_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("overlay.rules");
        let c = ctx();
        let g = Grants::load(Some(path.clone())).unwrap();
        assert!(g.add(Scope::Always, None, "Bash(make test)", "ops\nrm", "apr_9").is_ok());
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("# approved always by user:ops rm at "), "{text}");
        assert!(text.ends_with("Bash(make test)\n"), "{text}");
        let again = Grants::load(Some(path.clone())).unwrap();
        let hit = again.matching("Bash", &json!({ "command": "make test" }), None, false, None, &c);
        assert_eq!(hit, Some((Scope::Always, "Bash(make test)".to_string())));
        std::fs::write(&path, "Bash(\n").unwrap();
        assert!(Grants::load(Some(path)).unwrap_err().contains(":1:"));
        assert!(Grants::load(None).unwrap().add(Scope::Always, None, "Bash(x)", "a", "b").is_err(), "no overlay");
    }

    fn write(path: &str) -> Value {
        json!({ "file_path": path, "content": "x" })
    }

    /// Regression (review item 5a): a grant for a slash-less relative path was kept as
    /// `Write(pre-commit)`, which reads as `**/pre-commit` (and everything below it), so
    /// approving `Write pre-commit` for the session also allowed writing
    /// `.git/hooks/pre-commit`. A file grant is one exact absolute rule of the normalised
    /// path and covers nothing else.
    #[test]
    fn regression_a_grant_of_a_relative_path_covered_the_name_at_any_depth() {
        let c = ctx();
        let g = Grants::load(None).unwrap();
        for (given, kept) in [
            ("pre-commit", "Write(//workspace/pre-commit)"),
            ("./docs/../notes.md", "Write(//workspace/notes.md)"),
            ("/workspace/src/a.rs", "Write(//workspace/src/a.rs)"),
        ] {
            let rule = rule_for("Write", &write(given), &c).unwrap();
            assert_eq!(rule, kept);
            g.add(Scope::Session, Some("s"), &rule, "alice", "apr_1").unwrap();
        }
        let m = |path: &str| g.matching("Write", &write(path), None, false, Some("s"), &c);
        assert!(m("pre-commit").is_some());
        assert!(m("/workspace/pre-commit").is_some());
        assert!(m("/workspace/notes.md").is_some());
        for other in ["hooks/pre-commit", "/workspace/src/pre-commit", "pre-commit/x", "src/a.rs/b", "src"] {
            assert!(m(other).is_none(), "{other}");
        }
        assert!(g.matching("Edit", &write("pre-commit"), None, false, Some("s"), &c).is_none(), "another tool");
        assert!(rule_for("Read", &json!({ "file_path": "../etc/passwd" }), &c).is_err());
        assert!(rule_for("Read", &json!({ "file_path": "a\\b" }), &c).is_err());
    }

    /// Regression (review item 5b): a grant was checked against the path as given only,
    /// so `Read notes.txt` approved for the session went on reading after `notes.txt`
    /// became a link to `secrets/key`, or a hard link of it.
    #[test]
    fn regression_a_grant_skipped_the_symlink_and_hard_link_checks() {
        let c = ctx();
        let g = Grants::load(None).unwrap();
        let read = json!({ "file_path": "/workspace/notes.txt" });
        let rule = rule_for("Read", &read, &c).unwrap();
        g.add(Scope::Session, Some("s"), &rule, "alice", "apr_1").unwrap();
        let m = |resolved: Option<&str>, linked: bool| g.matching("Read", &read, resolved, linked, Some("s"), &c);
        assert!(m(None, false).is_some());
        assert!(m(Some("/workspace/notes.txt"), false).is_some());
        assert!(m(Some("/workspace/secrets/key"), false).is_none(), "the resolved path has no grant");
        assert!(m(None, true).is_none(), "hard-linked");
        // Both paths granted: covered.
        let key = rule_for("Read", &json!({ "file_path": "secrets/key" }), &c).unwrap();
        g.add(Scope::Session, Some("s"), &key, "alice", "apr_2").unwrap();
        assert!(m(Some("/workspace/secrets/key"), false).is_some());
    }

    /// Review item 7: executable configuration is never granted, nor covered by a grant
    /// (an older overlay line included), given or resolved.
    #[test]
    fn executable_configuration_is_never_granted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("overlay.rules");
        std::fs::write(&path, "Write(//workspace/.git/config)\nWrite(hook)\nWrite(//workspace/notes)\n").unwrap();
        let c = ctx();
        let g = Grants::load(Some(path)).unwrap();
        for p in [".git/config", ".git/hooks/pre-commit", "sub/.git", ".envrc", "web/.npmrc", ".cargo/config.toml"] {
            assert!(rule_for("Write", &write(p), &c).is_err(), "{p}");
        }
        assert!(g.matching("Write", &write(".git/config"), None, false, None, &c).is_none());
        assert!(g.matching("Write", &write(".git/hooks/hook"), None, false, None, &c).is_none());
        assert!(g.matching("Write", &write("src/hook"), None, false, None, &c).is_some(), "an operator's rule");
        let notes = write("notes");
        assert!(g.matching("Write", &notes, None, false, None, &c).is_some());
        assert!(g.matching("Write", &notes, Some("/workspace/.git/config"), false, None, &c).is_none());
    }
}
