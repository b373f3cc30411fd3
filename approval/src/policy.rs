//! The operator's approval policy (`approval:` in `warden.yaml`) and its
//! evaluation for one tool call.
//!
//! Order of operations in [`Policy::decide`]:
//! 1. **Rules** ([`Policy::evaluate`]): deny → ask → allow, first match wins,
//!    else `default`. A Bash command is split into its simple commands
//!    ([`crate::shell`]); each part is evaluated on its own and the strictest
//!    part decides (deny > ask > allow). A command the recognizer does not
//!    fully understand (deny rules still apply to every part it found) and
//!    (when specific Bash deny/ask rules exist) a part whose command word is
//!    computed at run time are at least `ask`. Every file a part reads or
//!    writes that the recognizer can name (redirections, file operands of
//!    [`crate::operands`]' commands) is judged by one mechanism
//!    (`Policy::judge_part_files`) like a Read or Write tool's path, from the
//!    shell's working directory and where the host resolved it ([`CallFacts`]):
//!    a deny path rule denies the whole command, an ask rule asks; a path
//!    computed at run time, one the host did not resolve, or a hard-linked file
//!    asks when some deny or ask path rule could apply. A file an allowed part
//!    writes is decided as a Write call of it would be (an `Edit`/`Write` allow
//!    rule, else `default`, then the mode), and executable configuration asks.
//! 2. **Deny is final**: an explicit deny rule or a `default: deny` is never
//!    relaxed by any mode, bypass included.
//! 3. **Read-only** (`plan`): any tool but the read tools of [`mode::READ_ONLY_TOOLS`] → deny.
//! 4. **Ask handling**: `dontAsk` → deny; `acceptEdits` → allow for file edit
//!    tools whose path is inside the workspace and not executable configuration
//!    ([`EXECUTABLE_CONFIG`]); `bypassPermissions` → allow,
//!    flagged as a bypass; otherwise the call is asked.
//!
//! This module must never do I/O or block; it must never produce `allow` for a
//! call it could not fully analyse.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::matcher::normalize_path;
use crate::mode::{self, AskHandling, EffectiveMode, PermissionMode};
use crate::operands::{Access, FileArg};
use crate::rule::{self, EDIT_TOOLS, Rule, RuleError, Target};
use crate::shell;

/// How long an `ask` waits for a person when the operator sets no `timeout`:
/// two minutes is long enough to read a command and short enough that an
/// unattended task does not hang (the call is declined at the end).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Files and directories whose contents other programs run as commands: editing one turns
/// the next allowed command into an arbitrary one (`git status` runs `core.fsmonitor`, a
/// commit runs `.git/hooks/pre-commit`). Neither `acceptEdits` nor a `session`/`always`
/// grant ever allows an edit of these without asking ([`is_executable_config`], checked
/// on the path as given and as resolved); only an explicit allow rule of the operator does.
/// Absolute globs (a matched directory covers everything in it), so they hold at any depth:
/// - `.git` (a directory, or a `gitdir:` file): `config` (`core.fsmonitor`,
///   `core.hooksPath`, `core.sshCommand`, aliases, filter and diff drivers) and `hooks/*`,
///   run by ordinary git commands;
/// - `.gitconfig`: the same keys, when a home directory is inside the workspace;
/// - `.gitmodules`: the repositories and URLs (`ext::` transports) submodule commands use;
/// - `.husky`: hook scripts git runs once `core.hooksPath` points there;
/// - `.pre-commit-config.yaml`: the commands pre-commit's git hooks run;
/// - `.envrc`: a shell script direnv runs on entering the directory;
/// - `.npmrc`: npm's `script-shell`, `node-options` (`--require`), `git`, run by every npm
///   command; `.yarnrc`, `.yarnrc.yml` (`yarnPath`: a script every yarn command runs);
///   `.pnpmfile.cjs` (hooks pnpm runs on install);
/// - `.cargo/config.toml`, `.cargo/config`: `target.*.runner`, `build.rustc-wrapper`,
///   aliases, run by cargo;
/// - shell startup files (`.bashrc`, `.bash_profile`, `.bash_login`, `.bash_logout`,
///   `.profile`, `.zshrc`, `.zshenv`, `.zprofile`, `.zlogin`): run by every login or
///   interactive shell of whoever uses the directory as a home;
/// - `.ssh`: `config` (`ProxyCommand`, `LocalCommand`), `authorized_keys` (`command=`),
///   `rc`;
/// - a home directory's tool configuration: `.local` (Python's user site: `.pth` files and
///   `usercustomize` run at every interpreter's start), `.config` (every XDG tool's
///   settings), `.curlrc` (options that copy a request's headers to a file or fetch a
///   planted script), `.pip` (pip's index and find-links), `.netrc` (credentials sent to
///   hosts), `.jq` (definitions jq loads into every program), `.cache` (packages a later
///   install takes from a cache), `.pdbrc` (commands pdb runs). The sandbox also points its
///   tools away from these (`warden_sandbox::environment::TOOL_CONFIG`); the gate asks in
///   case a tool it does not know reads them.
///
/// Project files that define what a command is for (`package.json` scripts, `Makefile`,
/// tests) are not here: an operator who allows `npm run test` with `acceptEdits` accepts
/// that edited tests run.
pub const EXECUTABLE_CONFIG: &[&str] = &[
    "/**/.git",
    "/**/.gitconfig",
    "/**/.gitmodules",
    "/**/.husky",
    "/**/.pre-commit-config.yaml",
    "/**/.envrc",
    "/**/.npmrc",
    "/**/.yarnrc",
    "/**/.yarnrc.yml",
    "/**/.pnpmfile.cjs",
    "/**/.cargo/config.toml",
    "/**/.cargo/config",
    "/**/.bashrc",
    "/**/.bash_profile",
    "/**/.bash_login",
    "/**/.bash_logout",
    "/**/.profile",
    "/**/.zshrc",
    "/**/.zshenv",
    "/**/.zprofile",
    "/**/.zlogin",
    "/**/.ssh",
    "/**/.local",
    "/**/.config",
    "/**/.curlrc",
    "/**/.pip",
    "/**/.netrc",
    "/**/.jq",
    "/**/.cache",
    "/**/.pdbrc",
];

/// Is `path` (absolute, normalised) one of the [`EXECUTABLE_CONFIG`] paths or inside one?
pub fn is_executable_config(path: &Path) -> bool {
    EXECUTABLE_CONFIG.iter().any(|p| crate::matcher::PathGlob::new(p).matches(path))
}

/// Could a tree written at `path` (absolute, normalised) hold [`EXECUTABLE_CONFIG`]: is
/// `path` such a file or inside one, or could one be below it? (`cp -r planted .` writes
/// whatever `planted` holds, `.git/hooks` included.)
pub fn may_hold_executable_config(path: &Path) -> bool {
    EXECUTABLE_CONFIG.iter().any(|p| crate::matcher::PathGlob::new(p).may_match_below(path))
}

/// Longest `timeout` accepted: a day. Anything longer is almost certainly a
/// unit mistake and would keep tasks and their sandboxes alive indefinitely.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// A policy decision, ordered by strictness (`Allow < Ask < Deny`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    /// Run without asking.
    Allow,
    /// Ask a person; anything but an explicit approval declines.
    Ask,
    /// Never run.
    Deny,
}

/// Deny over ask over allow.
fn strictness(d: Decision) -> u8 {
    match d {
        Decision::Allow => 0,
        Decision::Ask => 1,
        Decision::Deny => 2,
    }
}

impl Decision {
    /// `allow`, `ask` or `deny`.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allow => "allow",
            Decision::Ask => "ask",
            Decision::Deny => "deny",
        }
    }
}

/// The `approval:` section of `warden.yaml`. Every field is optional.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// Decision for calls no rule matches. Default `ask`: an unknown tool or
    /// command is neither silently run nor silently refused — a person sees it.
    pub default: Decision,
    /// Rules whose calls run without asking. Default empty: nothing is
    /// pre-approved unless the operator says so.
    pub allow: Vec<String>,
    /// Rules whose calls are always asked, even if an allow rule matches.
    /// Default empty.
    pub ask: Vec<String>,
    /// Rules whose calls never run. Default empty.
    pub deny: Vec<String>,
    /// How long an ask waits before it is declined (humantime: `120s`, `5m`).
    /// Default [`DEFAULT_TIMEOUT`].
    #[serde(with = "humantime_duration")]
    pub timeout: Duration,
    /// The most permissive mode an agent's `permissionMode` may claim.
    /// Default `default`: agent files cannot relax the operator's policy unless
    /// the operator opts in; stricter modes (`plan`, `dontAsk`) are always
    /// honoured because they only take permissions away.
    pub max_mode: PermissionMode,
    /// Whether `bypassPermissions` may take effect at all. Default `false`:
    /// bypass skips every prompt, so it must be an explicit operator decision;
    /// `max_mode: bypassPermissions` without it is a configuration error.
    pub allow_bypass: bool,
    /// JSONL audit log of every decision. Default none (no file written; the
    /// host may still log decisions). The host resolves relative paths.
    pub audit_log: Option<PathBuf>,
    /// Operator-owned policy overlay: one allow rule per line, appended when a person
    /// approves a call `always` (with a comment naming who and when), read at start.
    /// Default none: `always` is not offered. The host resolves relative paths.
    pub overlay: Option<PathBuf>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            default: Decision::Ask,
            allow: Vec::new(),
            ask: Vec::new(),
            deny: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            max_mode: PermissionMode::Default,
            allow_bypass: false,
            audit_log: None,
            overlay: None,
        }
    }
}

mod humantime_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(text.trim()).map_err(|e| {
            serde::de::Error::custom(format!("invalid duration `{text}`: {e} (expected e.g. `120s`, `5m`)"))
        })
    }
}

/// A policy that could not be built from its configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A rule in one of the lists is malformed.
    #[error("approval.{list}[{index}]: {source}")]
    Rule {
        /// `allow`, `ask` or `deny`.
        list: &'static str,
        /// Position in that list.
        index: usize,
        /// The rule and what is wrong with it.
        #[source]
        source: RuleError,
    },
    /// `timeout` out of range.
    #[error("approval.timeout: {0} (expected more than 0s and at most 24h)")]
    Timeout(String),
    /// `max_mode: bypassPermissions` without `allow_bypass: true`.
    #[error("approval.max_mode: bypassPermissions requires `allow_bypass: true` (bypass skips every prompt)")]
    BypassNotAllowed,
}

/// Where a call is evaluated: paths in rules and inputs resolve against these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvalContext {
    /// The workspace root as the tools see it (e.g. `/workspace`); relative
    /// tool paths and `./`, `/` and bare rule paths resolve against it.
    pub workspace_root: PathBuf,
    /// The home directory `~/` rules resolve against.
    pub home: PathBuf,
}

/// A file a Bash command reads or writes ([`shell::shell_files`]), as the host found it in
/// the sandbox: the policy judges the path it resolves to as well, with the same rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolvedFile {
    /// The path exactly as [`shell::shell_files`] gave it.
    pub path: String,
    /// Where it leads once every link is followed (for a file that does not exist yet, its
    /// deepest existing ancestor resolved and the rest appended); `None` when the host
    /// could not tell (the call is then asked, never allowed).
    pub resolved: Option<String>,
    /// The file has other hard links, whose names no rule was checked against.
    pub other_names: bool,
}

/// What the host knows about a call beyond its input ([`Policy::decide_call`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct CallFacts<'a> {
    /// A path tool's path after symlink resolution in the sandbox, when it differs from
    /// the path as given ([`Policy::decide_resolved`]).
    pub resolved_path: Option<&'a str>,
    /// Bash: the working directory the shell starts in (absolute); `None` (or a relative
    /// path) is the workspace root.
    pub shell_cwd: Option<&'a str>,
    /// Bash: every file of [`shell::shell_files`] (for [`CallFacts::shell_cwd`]) as the
    /// host found it. `None`: the host does not look files up, and paths are judged as
    /// written only; `Some`: a file missing from the list makes the call ask.
    pub shell_files: Option<&'a [ResolvedFile]>,
}

/// The outcome of evaluating one call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Evaluation {
    /// What to do.
    pub decision: Decision,
    /// The rule that decided, if one did (`None`: the default or a mode).
    pub matched_rule: Option<String>,
    /// A short human-readable explanation.
    pub reason: String,
    /// The call is allowed only because of `bypassPermissions`.
    pub bypass: bool,
    /// For Bash: what the recognizer did not understand (such a command is
    /// never allowed by rules; see [`crate::shell`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_understood: Option<shell::NotUnderstood>,
    /// For Bash: the call asks only because it writes files inside the workspace that no
    /// rule covers (through redirections or file operands); `acceptEdits` allows it, as it allows a Write call of
    /// such a file.
    #[serde(skip)]
    pub workspace_writes_only: bool,
}

/// A loaded, validated policy.
#[derive(Debug, Clone)]
pub struct Policy {
    config: PolicyConfig,
    deny: Vec<Rule>,
    ask: Vec<Rule>,
    allow: Vec<Rule>,
    /// Specific Bash deny/ask rules exist (that a computed command word could
    /// evade).
    bash_restrictions: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy::from_config(PolicyConfig::default()).expect("the default policy is valid")
    }
}

impl Policy {
    /// Validate a configuration and parse its rules.
    pub fn from_config(config: PolicyConfig) -> Result<Policy, PolicyError> {
        let parse = |list: &'static str, rules: &[String]| -> Result<Vec<Rule>, PolicyError> {
            rules
                .iter()
                .enumerate()
                .map(|(index, r)| Rule::parse(r).map_err(|source| PolicyError::Rule { list, index, source }))
                .collect()
        };
        let deny = parse("deny", &config.deny)?;
        let ask = parse("ask", &config.ask)?;
        let allow = parse("allow", &config.allow)?;
        if config.timeout.is_zero() || config.timeout > MAX_TIMEOUT {
            return Err(PolicyError::Timeout(humantime::format_duration(config.timeout).to_string()));
        }
        if config.max_mode == PermissionMode::BypassPermissions && !config.allow_bypass {
            return Err(PolicyError::BypassNotAllowed);
        }
        let bash_restrictions = deny.iter().chain(&ask).any(Rule::is_bash_specific);
        Ok(Policy { config, deny, ask, allow, bash_restrictions })
    }

    /// The configuration this policy was built from.
    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    /// How long an ask waits before it is declined.
    pub fn timeout(&self) -> Duration {
        self.config.timeout
    }

    /// The mode applied to a subagent that requests `requested`, capped by
    /// `max_mode` and `allow_bypass`.
    pub fn effective_mode(&self, requested: Option<PermissionMode>) -> EffectiveMode {
        mode::effective_mode(requested, self.config.max_mode, self.config.allow_bypass)
    }

    /// Whether a subagent's tool list should include `tool`: false when a
    /// deny rule covers the whole tool (a bare name, `Bash(*)`, `mcp__server`).
    pub fn tool_visible(&self, tool: &str) -> bool {
        !self.deny.iter().any(|r| r.is_whole_tool() && r.covers_tool(tool))
    }

    /// Whether any deny rule names `tool` (with or without a specifier): such a tool is
    /// never approved `always`.
    pub fn denies_tool(&self, tool: &str) -> bool {
        self.deny.iter().any(|r| r.covers_tool(tool))
    }

    /// Rules only (step 1 of the module docs), for the `default` mode.
    pub fn evaluate(&self, tool: &str, input: &Value, ctx: &EvalContext) -> Evaluation {
        self.evaluate_in(tool, input, &CallFacts::default(), ctx)
    }

    /// [`Policy::evaluate`] with what the host knows about the call.
    fn evaluate_in(&self, tool: &str, input: &Value, facts: &CallFacts<'_>, ctx: &EvalContext) -> Evaluation {
        if tool == "Bash" {
            return self.evaluate_bash(input, facts, ctx);
        }
        let resolved = rule::tool_path(tool, input).map(|p| resolve_path(&ctx.workspace_root, &p));
        let target = Target {
            tool,
            input,
            bash_part: None,
            path: resolved.as_ref().map(|(p, esc)| (p.as_path(), *esc)),
            workspace_root: &ctx.workspace_root,
            home: &ctx.home,
            tree: false,
        };
        let (decision, rule) = self.first_match(&target);
        let reason = match rule {
            Some(r) if decision != Decision::Allow && r.is_path_rule() && rule::DIRECTORY_TOOLS.contains(&tool) => {
                let root = resolved.as_ref().map(|(p, _)| p.display().to_string()).unwrap_or_default();
                format!(
                    "{} rule `{}`: a search from {root} could read what it names (search a directory it does \
                     not cover)",
                    decision.as_str(),
                    r.text()
                )
            }
            Some(r) => format!("{} rule `{}`", decision.as_str(), r.text()),
            None => format!("no rule matches; default is {}", decision.as_str()),
        };
        Evaluation {
            decision,
            matched_rule: rule.map(|r| r.text().to_owned()),
            reason,
            bypass: false,
            not_understood: None,
            workspace_writes_only: false,
        }
    }

    /// [`Policy::decide`] for the path as given and, when the sandbox resolved it to
    /// another path (a symlink), for that path too: the stricter decision wins (deny over
    /// ask over allow), so a rule about `.env` also covers `docs/link-to-env`.
    pub fn decide_resolved(
        &self,
        tool: &str,
        input: &Value,
        resolved_path: Option<&str>,
        ctx: &EvalContext,
        mode: EffectiveMode,
    ) -> Evaluation {
        self.decide_call(tool, input, &CallFacts { resolved_path, ..CallFacts::default() }, ctx, mode)
    }

    /// [`Policy::decide`] with everything the host knows about the call ([`CallFacts`]):
    /// for a path tool as [`Policy::decide_resolved`]; for Bash, file operands and
    /// redirections are judged from the shell's working directory, and as the host
    /// resolved them.
    pub fn decide_call(
        &self,
        tool: &str,
        input: &Value,
        facts: &CallFacts<'_>,
        ctx: &EvalContext,
        mode: EffectiveMode,
    ) -> Evaluation {
        if tool == "Bash" {
            return self.decide_in(tool, input, facts, ctx, mode);
        }
        let resolved_path = facts.resolved_path;
        let given = self.decide(tool, input, ctx, mode);
        let field = match tool {
            "Read" | "Write" | "Edit" | "NotebookEdit" => "file_path",
            "Glob" | "Grep" | "LS" => "path",
            _ => return given,
        };
        let Some(resolved) = resolved_path else { return given };
        if input.get(field).and_then(Value::as_str) == Some(resolved) {
            return given;
        }
        let mut other = input.clone();
        if let Some(map) = other.as_object_mut() {
            map.insert(field.to_string(), Value::String(resolved.to_string()));
        }
        let mut real = self.decide(tool, &other, ctx, mode);
        if strictness(real.decision) > strictness(given.decision) {
            real.reason = format!("{} (the path resolves to {resolved})", real.reason);
            real
        } else {
            given
        }
    }

    /// Rules, then the mode (all steps of the module docs).
    pub fn decide(&self, tool: &str, input: &Value, ctx: &EvalContext, mode: EffectiveMode) -> Evaluation {
        self.decide_in(tool, input, &CallFacts::default(), ctx, mode)
    }

    fn decide_in(
        &self,
        tool: &str,
        input: &Value,
        facts: &CallFacts<'_>,
        ctx: &EvalContext,
        mode: EffectiveMode,
    ) -> Evaluation {
        let mut ev = self.evaluate_in(tool, input, facts, ctx);
        if ev.decision == Decision::Deny {
            return ev;
        }
        if mode.read_only && !mode::allowed_when_read_only(tool) {
            ev.decision = Decision::Deny;
            ev.reason = format!("plan mode is read-only: {tool} is not available");
            return ev;
        }
        if ev.decision != Decision::Ask {
            return ev;
        }
        match mode.on_ask {
            AskHandling::Prompt => {}
            AskHandling::Deny => {
                ev.decision = Decision::Deny;
                ev.reason = format!("{}; dontAsk mode declines instead of asking", ev.reason);
            }
            AskHandling::AcceptEdits if tool == "Bash" && ev.workspace_writes_only => {
                ev.decision = Decision::Allow;
                ev.reason = format!("{}; acceptEdits mode allows edits in the workspace", ev.reason);
            }
            AskHandling::AcceptEdits => {
                let path = rule::tool_path(tool, input).map(|p| resolve_path(&ctx.workspace_root, &p));
                let inside = path.as_ref().is_some_and(|(p, escaped)| !escaped && p.starts_with(&ctx.workspace_root));
                if EDIT_TOOLS.contains(&tool) && inside {
                    match path.as_ref().map(|(p, _)| p).filter(|p| is_executable_config(p)) {
                        Some(p) => {
                            ev.reason = format!(
                                "{}; acceptEdits mode does not allow editing {}: other programs run what it holds",
                                ev.reason,
                                p.display()
                            );
                        }
                        None => {
                            ev.decision = Decision::Allow;
                            ev.reason = format!("{}; acceptEdits mode allows edits in the workspace", ev.reason);
                        }
                    }
                }
            }
            AskHandling::Bypass => {
                ev.decision = Decision::Allow;
                ev.bypass = true;
                ev.reason = format!("{}; bypassPermissions mode allows without asking", ev.reason);
            }
        }
        ev
    }

    fn first_match<'a>(&'a self, t: &Target<'_>) -> (Decision, Option<&'a Rule>) {
        for (list, decision) in
            [(&self.deny, Decision::Deny), (&self.ask, Decision::Ask), (&self.allow, Decision::Allow)]
        {
            if let Some(r) = list.iter().find(|r| r.matches(t, decision == Decision::Allow)) {
                return (decision, Some(r));
            }
        }
        (self.config.default, None)
    }

    /// The first deny, then ask, path rule of the file tools that matches a shell command's
    /// `access` of `path` (absolute; normalised here): `Read(...)` rules for reads,
    /// `Edit(...)`/`Write(...)` rules for writes, the whole tree below `path` for a tree
    /// access. The same matching as the Read, Write and Grep tools. The host may call it for
    /// a path it resolved itself; [`Policy::decide_call`] calls it for every file a command
    /// names.
    pub fn judge_file(&self, access: Access, path: &Path, ctx: &EvalContext) -> Option<(Decision, &Rule)> {
        let path = normalize_path(Path::new("/"), path);
        let input = Value::Null;
        let tools = [("Read", access.reads()), ("Write", access.writes())];
        let targets: Vec<Target<'_>> = tools
            .into_iter()
            .filter(|(_, applies)| *applies)
            .map(|(tool, _)| Target {
                tool,
                input: &input,
                bash_part: None,
                path: Some((&path, false)),
                workspace_root: &ctx.workspace_root,
                home: &ctx.home,
                tree: access.tree(),
            })
            .collect();
        // Deny over ask, whichever of a read-and-write's two uses a rule names.
        [(&self.deny, Decision::Deny), (&self.ask, Decision::Ask)].into_iter().find_map(|(list, d)| {
            list.iter().find(|r| r.is_path_rule() && targets.iter().any(|t| r.matches(t, false))).map(|r| (d, r))
        })
    }

    /// A deny or ask path rule that could apply to some `access` of a file (one whose
    /// path is not known from the text).
    fn file_restriction(&self, access: Access) -> Option<&Rule> {
        let tools = [("Read", access.reads()), ("Write", access.writes())];
        self.deny
            .iter()
            .chain(&self.ask)
            .find(|r| r.is_path_rule() && tools.iter().any(|(tool, applies)| *applies && r.covers_tool(tool)))
    }

    /// A command's file reads and writes, judged by the file rules (module docs, step 1):
    /// the one mechanism for redirections (`< f`, `> f`) and for the file operands of the
    /// commands of [`crate::operands`] (`cat f`, `cp a b`, `rm f`). Each file is judged on
    /// every path it may name (from each directory the shell may be in,
    /// [`shell::WorkingDirs`]) and where the host resolved it:
    /// - every access: the deny and ask path rules, as a Read call (a read) or a Write call
    ///   (a write) of that path would meet them ([`Policy::judge_file`]); a path the
    ///   policy cannot see (computed at run time, not resolved, hard-linked) asks when such
    ///   a rule could apply ([`Policy::file_restriction`]);
    /// - a write, when the rules allowed the command (`bash_allowed`): as a Write call of
    ///   the path would be decided — an `Edit(...)`/`Write(...)` allow rule covering it
    ///   allows it, else `default`, and (through [`Worst::workspace_write`]) the permission
    ///   mode — unless a bare `Bash` is allowed or an allow rule of the command shows the
    ///   write itself ([`Policy::bash_shows_write`]). Whatever the rules, a write into
    ///   [`EXECUTABLE_CONFIG`] asks (for a tree written from another tree, `cp -r`, one that
    ///   could hold it), and so does a write to a path known only at run time or that the
    ///   host did not resolve.
    ///
    /// Which rule of a list comes first never changes the decision, only which is named.
    fn judge_part_files(
        &self,
        part: &shell::SimpleCommand,
        bash_allowed: bool,
        input: &Value,
        facts: &CallFacts<'_>,
        ctx: &EvalContext,
        worst: &mut Worst,
    ) {
        let start = shell_start(facts, ctx);
        let root = normalize_path(Path::new("/"), &ctx.workspace_root);
        let text = part.text();
        let judge_writes = bash_allowed && !self.allow.iter().any(|r| r.is_whole_tool() && r.covers_tool("Bash"));
        for f in &part.files {
            let (verb, how) = (f.access.verb(), f.how());
            let restriction = self.file_restriction(f.access);
            let write = judge_writes && f.access.writes();
            let shown = write.then(|| self.bash_shows_write(part, f, input, ctx)).flatten();
            let Some(paths) = f.paths(&part.dirs, &start) else {
                if let Some(r) = restriction {
                    worst.consider(
                        Decision::Ask,
                        Some(r),
                        format!(
                            "`{text}` {verb}{how} a file whose path is known only at run time (`{}`), which the rule `{}` \
                             could name",
                            f.path,
                            r.text()
                        ),
                    );
                } else if write && shown.is_none() {
                    worst.consider(
                        Decision::Ask,
                        None,
                        format!("`{text}` {verb} a path known only at run time (`{}`){how}", f.path),
                    );
                }
                continue;
            };
            for p in paths {
                let key = p.to_string_lossy();
                let given = normalize_path(Path::new("/"), &p);
                let found = facts.shell_files.map(|list| list.iter().find(|r| r.path == key));
                let resolved =
                    found.flatten().and_then(|r| r.resolved.as_deref()).filter(|r| Path::new(r).is_absolute());
                let mut judged = vec![(given.clone(), None)];
                if let Some(real) = resolved {
                    judged.push((normalize_path(Path::new("/"), Path::new(real)), Some(real)));
                }
                for (path, via) in &judged {
                    if let Some((d, r)) = self.judge_file(f.access, path, ctx) {
                        let via = via.map_or_else(String::new, |_| format!(" (`{}` resolves to it)", f.path));
                        worst.consider(
                            d,
                            Some(r),
                            format!("`{text}` {verb} {}{how}{via}: {} rule `{}`", path.display(), d.as_str(), r.text()),
                        );
                    }
                }
                // The host looked files up, and not this one (or found no absolute path).
                let unresolved = facts.shell_files.is_some() && resolved.is_none();
                let other_names = found.flatten().is_some_and(|r| r.other_names);
                if let Some(r) = restriction {
                    if unresolved {
                        worst.consider(
                            Decision::Ask,
                            Some(r),
                            format!("`{text}` names {key}, which the sandbox did not resolve"),
                        );
                    } else if other_names {
                        worst.consider(
                            Decision::Ask,
                            Some(r),
                            format!(
                                "`{text}` names {key}, which has other hard links, whose names no rule was checked \
                                 against"
                            ),
                        );
                    }
                }
                if !write {
                    continue;
                }
                if unresolved {
                    worst.consider(
                        Decision::Ask,
                        None,
                        format!("`{text}` {verb} {}{how}, which the sandbox did not resolve", given.display()),
                    );
                    continue;
                }
                let config = |q: &Path| {
                    if f.access == Access::WriteTree { may_hold_executable_config(q) } else { is_executable_config(q) }
                };
                if let Some((config, _)) = judged.iter().find(|(q, _)| config(q)) {
                    worst.consider(
                        Decision::Ask,
                        None,
                        format!(
                            "`{text}` {verb} {}{how}: executable configuration (other programs run what it holds) is \
                             always asked",
                            config.display()
                        ),
                    );
                }
                if shown.is_some() {
                    continue;
                }
                // As a Write call of each path: a deny or ask path rule decided it above;
                // else an allow rule allows it; else `default`.
                let written = if f.access.tree() { Access::WriteTree } else { Access::Write };
                let Some((real, _)) = judged
                    .iter()
                    .rev()
                    .find(|(q, _)| self.judge_file(written, q, ctx).is_none() && self.write_allowed(q, ctx).is_none())
                else {
                    continue;
                };
                let d = self.config.default;
                let why = format!(
                    "`{text}` {verb} {}{how}: no Edit/Write allow rule covers it; default is {}",
                    real.display(),
                    d.as_str()
                );
                if d == Decision::Ask && judged.iter().all(|(q, _)| q.starts_with(&root)) {
                    worst.workspace_write(why);
                } else {
                    worst.consider(d, None, why);
                }
            }
        }
    }

    /// Is a write of `path` (absolute) allowed by an `Edit(...)`/`Write(...)` allow rule, or
    /// a bare `Write` (which allows a Write call of any path)? (For a tree, a rule that
    /// covers the path covers everything below it.)
    fn write_allowed(&self, path: &Path, ctx: &EvalContext) -> Option<&Rule> {
        let path = normalize_path(Path::new("/"), path);
        let input = Value::Null;
        let t = Target {
            tool: "Write",
            input: &input,
            bash_part: None,
            path: Some((&path, false)),
            workspace_root: &ctx.workspace_root,
            home: &ctx.home,
            tree: false,
        };
        self.allow.iter().find(|r| (r.is_path_rule() || r.is_whole_tool()) && r.matches(&t, true))
    }

    /// A Bash allow rule that matches `part` and shows the write `f` itself, so allowing the
    /// command allows the write: for a redirection, a rule whose pattern has the
    /// redirection and matches the command with it (`Bash(sort * > *)`); for an operand, a
    /// rule that names the whole command, word for word (`Bash(rm -r build)`). A rule with
    /// a wildcard or a prefix (`Bash(rm:*)`) says which program runs, not which files it
    /// writes.
    fn bash_shows_write(
        &self,
        part: &shell::SimpleCommand,
        f: &FileArg,
        input: &Value,
        ctx: &EvalContext,
    ) -> Option<&Rule> {
        let keys = if f.redirect { vec![part.match_key()] } else { part.allow_keys() };
        let matches = |r: &Rule| {
            keys.iter().any(|k| {
                r.matches(
                    &Target {
                        tool: "Bash",
                        input,
                        bash_part: Some(k),
                        path: None,
                        workspace_root: &ctx.workspace_root,
                        home: &ctx.home,
                        tree: false,
                    },
                    true,
                )
            })
        };
        self.allow
            .iter()
            .find(|r| (if f.redirect { r.bash_mentions_redirect() } else { r.bash_names_every_word() }) && matches(r))
    }

    /// The decision of the rules for one simple command, from every key it has: deny if any
    /// deny rule matches any key, else ask if any ask rule does, else allow if any allow rule
    /// matches one of `allow_keys`, else `default`. Which rule comes first in a list never
    /// changes the decision (only which rule is named).
    fn decide_keys<'a>(
        &'a self,
        input: &Value,
        allow_keys: &[String],
        restrict_keys: &[String],
        ctx: &EvalContext,
    ) -> (Decision, Option<&'a Rule>) {
        let matches = |r: &Rule, key: &str, for_allow: bool| {
            r.matches(
                &Target {
                    tool: "Bash",
                    input,
                    bash_part: Some(key),
                    path: None,
                    workspace_root: &ctx.workspace_root,
                    home: &ctx.home,
                    tree: false,
                },
                for_allow,
            )
        };
        for (list, decision) in [(&self.deny, Decision::Deny), (&self.ask, Decision::Ask)] {
            if let Some(r) = list.iter().find(|r| restrict_keys.iter().any(|k| matches(r, k, false))) {
                return (decision, Some(r));
            }
        }
        match self.allow.iter().find(|r| allow_keys.iter().any(|k| matches(r, k, true))) {
            Some(r) => (Decision::Allow, Some(r)),
            None => (self.config.default, None),
        }
    }

    fn evaluate_bash(&self, input: &Value, facts: &CallFacts<'_>, ctx: &EvalContext) -> Evaluation {
        let command = input.get("command").and_then(Value::as_str);
        let recognition = shell::recognize(command.unwrap_or(""));
        let mut worst = Worst::default();
        if recognition.commands().is_empty() {
            let (d, r) = self.first_match(&Target {
                tool: "Bash",
                input,
                bash_part: None,
                path: None,
                workspace_root: &ctx.workspace_root,
                home: &ctx.home,
                tree: false,
            });
            worst.consider(d, r, describe(d, r, None));
        }
        for part in recognition.commands() {
            let text = part.text();
            let allow_keys = part.allow_keys();
            // Deny and ask rules also see the words that run, without the assignments and
            // redirections in front (`A= rm -rf /`, `<in rm -rf /`), and the program by
            // its file name (`/bin/rm`).
            let argv_keys = part.argv_keys();
            let restrict_keys: Vec<String> =
                allow_keys.iter().cloned().chain(argv_keys.iter().map(|(k, _)| k.clone())).collect();
            let (mut d, mut r) = self.decide_keys(input, &allow_keys, &restrict_keys, ctx);
            let mut why = describe(d, r, Some(&text));
            if d == Decision::Allow && part.dynamic_command && self.bash_restrictions {
                d = Decision::Ask;
                why = format!("the command word of `{text}` is computed at run time");
            }
            // Words computed at run time (`$x`, `$(...)`, an undecoded `$'\x65'`) could be
            // whatever a deny or ask rule names: such a rule that the rest of the command
            // could still match is not decided by the policy but by a person.
            if d < Decision::Ask
                && let Some(rule) = self.deny.iter().chain(&self.ask).find(|rule| {
                    argv_keys.iter().any(|(key, at)| {
                        at.is_some_and(|at| rule.could_match_bash_after(key.get(..at).unwrap_or_default()))
                    })
                })
            {
                (d, r) = (Decision::Ask, Some(rule));
                why = format!(
                    "`{text}` has words computed at run time that could make it match the rule `{}`",
                    rule.text()
                );
            }
            worst.consider(d, r, why);
            self.judge_part_files(part, d == Decision::Allow, input, facts, ctx, &mut worst);
        }
        let Worst { worst, explicit_deny, other_asks, workspace_write } = worst;
        let (mut decision, matched_rule, mut reason) = worst
            .or_else(|| workspace_write.map(|w| (Decision::Ask, None, w)))
            .unwrap_or((self.config.default, None, String::new()));
        let mut workspace_writes_only = decision == Decision::Ask && !other_asks;
        if command.is_none() {
            decision = decision.max(Decision::Ask);
            reason = "Bash input has no `command` string".into();
            workspace_writes_only = false;
        } else if let Some(why) = recognition.not_understood() {
            // A construct the recognizer does not model asks under every `default`: only an
            // explicit deny rule (or a deny path rule) denies such a command.
            if decision < Decision::Ask || (decision == Decision::Deny && !explicit_deny) {
                decision = Decision::Ask;
                reason = format!("the command was not fully understood: {why}");
            }
            workspace_writes_only = false;
        }
        Evaluation {
            decision,
            matched_rule,
            reason,
            bypass: false,
            not_understood: recognition.not_understood(),
            workspace_writes_only,
        }
    }
}

/// The strictest decision of the parts of a Bash command so far (deny > ask > allow; the
/// first of equals is kept), with what the permission mode needs to know.
#[derive(Default)]
struct Worst {
    /// (decision, rule, reason).
    worst: Option<(Decision, Option<String>, String)>,
    /// A deny came from a rule (not only from `default: deny`).
    explicit_deny: bool,
    /// An ask came from something else than a redirection writing a workspace file.
    other_asks: bool,
    /// The first redirection writing a workspace file that only the mode could allow.
    workspace_write: Option<String>,
}

impl Worst {
    fn consider(&mut self, d: Decision, rule: Option<&Rule>, why: String) {
        self.explicit_deny |= d == Decision::Deny && rule.is_some();
        self.other_asks |= d == Decision::Ask;
        if self.worst.as_ref().is_none_or(|(w, _, _)| d > *w) {
            self.worst = Some((d, rule.map(|r| r.text().to_owned()), why));
        }
    }

    /// A redirection writes a file inside the workspace that no rule allows (and `default`
    /// is ask): asked, or allowed by `acceptEdits` like a Write call of that file.
    fn workspace_write(&mut self, why: String) {
        if self.worst.as_ref().is_none_or(|(w, _, _)| Decision::Ask > *w) {
            self.worst = Some((Decision::Ask, None, why.clone()));
        }
        self.workspace_write.get_or_insert(why);
    }
}

/// The absolute directory a Bash call starts in.
fn shell_start(facts: &CallFacts<'_>, ctx: &EvalContext) -> PathBuf {
    facts
        .shell_cwd
        .map(Path::new)
        .filter(|p| p.is_absolute())
        .map_or_else(|| normalize_path(Path::new("/"), &ctx.workspace_root), |p| normalize_path(Path::new("/"), p))
}

fn describe(d: Decision, rule: Option<&Rule>, part: Option<&str>) -> String {
    let subject = part.map_or_else(|| "the command".to_owned(), |p| format!("`{p}`"));
    match rule {
        Some(r) => format!("{subject}: {} rule `{}`", d.as_str(), r.text()),
        None => format!("{subject}: no rule matches; default is {}", d.as_str()),
    }
}

/// Normalise a tool path against the workspace root. The flag is true when
/// the path uses `..` and ends up outside the workspace (such a path never
/// matches an allow rule).
pub(crate) fn resolve_path(root: &Path, path: &Path) -> (PathBuf, bool) {
    let normalised = normalize_path(root, path);
    let root_norm = normalize_path(Path::new("/"), root);
    let uses_parent = path.components().any(|c| c == Component::ParentDir);
    let escaped = uses_parent && !normalised.starts_with(&root_norm);
    (normalised, escaped)
}
