//! An agent file's `hooks`, as Claude Code writes them, run in the session's sandbox through
//! the `Bash` tool (so through the approval gate).
//!
//! ```yaml
//! hooks:
//!   PreToolUse:
//!     - matcher: "Bash|Write"        # optional; `*` or none = every tool
//!       hooks:
//!         - type: command
//!           command: ./scripts/check.sh
//!           timeout: 30              # seconds, optional
//! ```
//!
//! Every hook event and hook type Claude Code defines is accepted ([`EVENTS`] says what
//! warden does with each). The events warden runs (`command` hooks):
//! - `PreToolUse` before a call, `PostToolUse` after a call that succeeded,
//!   `PostToolUseFailure` after one that failed (matched against the tool name);
//! - `UserPromptSubmit` before a task's first model call (its prompt as `prompt`): a block
//!   ends the task with the reason; exit 0 output is added to the prompt as context;
//! - `SessionStart` before a task's first model call (matched against `startup` for a
//!   fresh task, `resume` for a resumed one): exit 0 output is added as context;
//! - `Stop` (and `SubagentStop`, the name Claude Code gives a subagent's `Stop`) when the
//!   model gives its final answer: a block hands the reason to the model as its next
//!   instruction and the loop goes on (within `maxTurns`), with `stop_hook_active: true`.
//!
//! An event warden cannot serve (or a hook type other than `command`: `prompt`, `agent`,
//! `http`, `mcp_tool`) is a warning and is ignored — unless ignoring it could widen what
//! the agent may do: a hook of `PreToolUse`, `UserPromptSubmit` or `PermissionRequest`
//! can forbid, so one warden cannot run refuses the file ([`Event::narrows`]).
//!
//! A hook reads Claude Code's JSON on stdin (`hook_event_name`, `tool_name`, `tool_input`,
//! `tool_response` after the call, `session_id`, `cwd`) and answers as in Claude Code:
//! exit code 2 (its stderr is the reason) or, with exit code 0, a JSON object on stdout
//! (`hookSpecificOutput.permissionDecision` `allow` / `deny` / `ask` with
//! `permissionDecisionReason`, or the older `decision: block` with `reason`).
//!
//! A hook can only narrow what the approval policy decides, never widen it:
//! - `PreToolUse` `deny` keeps the call from running (the model gets the reason as an error
//!   result); `ask` does too — the plugin cannot make the gate ask a person about a call
//!   the policy allows, so asking is declining; `allow` changes nothing (the call still
//!   passes the gate). A hook that cannot give a verdict (its `Bash` call declined by the
//!   policy, timed out, not available) declines the call: its author wanted it checked.
//!   Any other exit code is, as in Claude Code, a non-blocking error: the call goes on.
//!   The input rides in the Bash command, so a call whose arguments are near the host's
//!   1 MiB argument limit leaves its hook without a verdict, and is declined.
//! - `PostToolUse` runs after the call; `decision: block` or exit code 2 add the reason to
//!   the result the model reads. The result rides in the Bash command too, so the hook
//!   gets at most [`MAX_HOOK_TOOL_RESPONSE_BYTES`] of it, and its input says so
//!   (`tool_response_truncated`, with the result's whole size): a large result never keeps
//!   the hook from running. A hook that still gives no verdict has that said in the result
//!   the model reads: the call has run, but its check did not.
//!
//! What this module never does: guess at a tool matcher it cannot read exactly (refused
//! for `PreToolUse`, a warning elsewhere), or let a hook's answer allow a call.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use warden_guest::{ToolCall, ToolResult};

/// Seconds a hook command may run when its entry sets no `timeout` (Claude Code's default).
pub const DEFAULT_HOOK_TIMEOUT_SECS: u64 = 60;

/// Longest `timeout` a hook may ask for: the Bash tool's own ceiling (10 minutes).
pub const MAX_HOOK_TIMEOUT_SECS: u64 = 600;

/// Most bytes of a tool's result a `PostToolUse` hook gets in `tool_response`. The hook's
/// input rides in its Bash command, whose arguments the host bounds at 1 MiB; escaped for
/// JSON, for the shell and for JSON again, a byte of the result may take up to 7, so the
/// result is cut well below that (the input says it was: see [`input`]).
pub const MAX_HOOK_TOOL_RESPONSE_BYTES: usize = 96 * 1024;

/// Most bytes of context a `SessionStart` / `UserPromptSubmit` hook adds to the prompt
/// (Claude Code caps a hook's added context at 10,000 characters too); the rest is cut.
pub const MAX_HOOK_CONTEXT_BYTES: usize = 10_000;

/// Where hook commands run (and Claude Code's `CLAUDE_PROJECT_DIR` for them).
pub const HOOK_CWD: &str = "/workspace";

/// The hook type warden runs; the others Claude Code defines are [`UNSERVED_HOOK_TYPES`].
pub const COMMAND_HOOK_TYPE: &str = "command";

/// Claude Code's other hook types: a model, an agent, an HTTP endpoint or an MCP tool
/// decides. warden runs none of them (a warning, or a refusal where ignoring could widen).
pub const UNSERVED_HOOK_TYPES: &[&str] = &["prompt", "agent", "http", "mcp_tool"];

/// What warden does with a hook event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// Run (its `command` hooks).
    Runs,
    /// Not run; a warning. Ignoring it cannot widen what the agent may do.
    Ignored,
    /// Not run, and a hook of it could forbid what the agent would then do: the file is
    /// refused.
    Refused,
}

/// A hook event Claude Code defines, and what warden does with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub name: &'static str,
    pub support: Support,
    /// Whether a hook of this event can forbid (so one warden cannot run — another hook
    /// type, a matcher it cannot read — refuses the file rather than be ignored).
    pub narrows: bool,
    /// Why, for the warning or the refusal (and the operators' docs table).
    pub why: &'static str,
}

const fn event(name: &'static str, support: Support, narrows: bool, why: &'static str) -> Event {
    Event { name, support, narrows, why }
}

/// Every hook event of Claude Code's hooks reference, with what warden does (the table in
/// docs/operators.md is this one).
pub const EVENTS: &[Event] = &[
    event("PreToolUse", Support::Runs, true, "runs before each matching call; can block it"),
    event("PostToolUse", Support::Runs, false, "runs after each matching call that succeeded"),
    event("PostToolUseFailure", Support::Runs, false, "runs after each matching call that failed"),
    event("UserPromptSubmit", Support::Runs, true, "runs before a task's first model call; can end the task"),
    event("SessionStart", Support::Runs, false, "runs before a task's first model call; adds context"),
    event("Stop", Support::Runs, false, "runs at the final answer; can send the agent back to work"),
    event("SubagentStop", Support::Runs, false, "as `Stop` (Claude Code's name for a subagent's `Stop`)"),
    event(
        "PermissionRequest",
        Support::Refused,
        true,
        "the approval gate, not the plugin, asks a person, so warden cannot run it; it could deny what a person would then approve",
    ),
    event(
        "PermissionDenied",
        Support::Ignored,
        false,
        "warden has no automatic-mode reviewer whose denials it follows",
    ),
    event(
        "Notification",
        Support::Ignored,
        false,
        "warden sends no notifications; events and the approvals API say the same",
    ),
    event("SubagentStart", Support::Ignored, false, "fires in the parent's context; it cannot block"),
    event("SessionEnd", Support::Ignored, false, "the sandbox session outlives the task; it cannot block"),
    event("Setup", Support::Ignored, false, "warden sets the session's environment itself; it cannot block"),
    event("InstructionsLoaded", Support::Ignored, false, "warden loads no CLAUDE.md files; it cannot block"),
    event("PreCompact", Support::Ignored, false, "warden never compacts a transcript"),
    event("PostCompact", Support::Ignored, false, "warden never compacts a transcript"),
    event("StopFailure", Support::Ignored, false, "the task's error is its result; it cannot block"),
    event("TaskCreated", Support::Ignored, false, "warden has no TaskCreate tool"),
    event("TaskCompleted", Support::Ignored, false, "warden has no TaskCreate tool"),
    event("TeammateIdle", Support::Ignored, false, "warden has no agent teams"),
    event("Elicitation", Support::Ignored, false, "MCP servers never ask the agent for input in warden"),
    event("ElicitationResult", Support::Ignored, false, "MCP servers never ask the agent for input in warden"),
    event("WorktreeCreate", Support::Ignored, false, "warden makes no worktrees through hooks"),
    event("WorktreeRemove", Support::Ignored, false, "warden makes no worktrees through hooks"),
    event("ConfigChange", Support::Ignored, false, "an agent cannot change warden's configuration"),
    event("CwdChanged", Support::Ignored, false, "it cannot block"),
    event("FileChanged", Support::Ignored, false, "warden does not watch files for agents; it cannot block"),
];

/// The entry of [`EVENTS`] named `name`.
pub fn event_named(name: &str) -> Option<&'static Event> {
    EVENTS.iter().find(|e| e.name == name)
}

/// One `type: command` hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookCommand {
    pub command: String,
    pub timeout_secs: u64,
}

/// A matcher and the commands it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookGroup {
    /// The names it matches (tool names, or `startup`/`resume` for `SessionStart`): `*`
    /// (everything), exact names, or `prefix.*`.
    pub matcher: Vec<String>,
    pub commands: Vec<HookCommand>,
}

/// An agent's hooks, by event (the events warden runs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hooks {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pre_tool_use: Vec<HookGroup>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub post_tool_use: Vec<HookGroup>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub post_tool_use_failure: Vec<HookGroup>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_prompt_submit: Vec<HookGroup>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub session_start: Vec<HookGroup>,
    /// `Stop` and `SubagentStop`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<HookGroup>,
}

impl Hooks {
    pub fn is_empty(&self) -> bool {
        self.pre_tool_use.is_empty()
            && self.post_tool_use.is_empty()
            && self.post_tool_use_failure.is_empty()
            && self.user_prompt_submit.is_empty()
            && self.session_start.is_empty()
            && self.stop.is_empty()
    }

    /// Each event's groups, by the event's name.
    pub fn by_event_mut(&mut self) -> [(&'static str, &mut Vec<HookGroup>); 6] {
        [
            ("PreToolUse", &mut self.pre_tool_use),
            ("PostToolUse", &mut self.post_tool_use),
            ("PostToolUseFailure", &mut self.post_tool_use_failure),
            ("UserPromptSubmit", &mut self.user_prompt_submit),
            ("SessionStart", &mut self.session_start),
            ("Stop", &mut self.stop),
        ]
    }

    /// Adds `other`'s groups after this one's, event by event.
    pub fn extend(&mut self, mut other: Hooks) {
        for ((_, mine), (_, theirs)) in self.by_event_mut().into_iter().zip(other.by_event_mut()) {
            mine.append(theirs);
        }
    }

    fn groups_mut(&mut self, event: &str) -> Option<&mut Vec<HookGroup>> {
        Some(match event {
            "PreToolUse" => &mut self.pre_tool_use,
            "PostToolUse" => &mut self.post_tool_use,
            "PostToolUseFailure" => &mut self.post_tool_use_failure,
            "UserPromptSubmit" => &mut self.user_prompt_submit,
            "SessionStart" => &mut self.session_start,
            "Stop" | "SubagentStop" => &mut self.stop,
            _ => return None,
        })
    }
}

/// What the `hooks` field says: the hooks to run, warnings (what is ignored) and refusals
/// (the file must not be registered: running without them could allow what they forbid).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    pub hooks: Hooks,
    pub warnings: Vec<String>,
    pub refusals: Vec<String>,
}

/// Whether an event's groups are matched against a name (tools, or the start source);
/// Claude Code ignores the matcher of the others.
fn has_matcher(event: &str) -> bool {
    matches!(event, "PreToolUse" | "PostToolUse" | "PostToolUseFailure" | "SessionStart")
}

/// Reads the `hooks` field (see the module docs for what is run, ignored or refused).
pub fn parse(value: &Value) -> Parsed {
    let mut out = Parsed::default();
    let Value::Object(events) = value else {
        out.refusals.push(format!("`hooks` must be a mapping of hook events, not {value}"));
        return out;
    };
    for (name, groups) in events {
        let Some(event) = event_named(name) else {
            out.warnings.push(format!(
                "`hooks` event `{name}` is not a Claude Code hook event; ignored (warden knows {})",
                EVENTS.iter().map(|e| e.name).collect::<Vec<_>>().join(", ")
            ));
            continue;
        };
        // A problem with a hook of this event: a refusal when ignoring it could widen.
        let problem = |out: &mut Parsed, what: String| match event.narrows {
            true => out.refusals.push(format!(
                "{what}; the agent is not registered, since running it without that hook could allow what it forbids"
            )),
            false => out.warnings.push(format!("{what}; ignored")),
        };
        match event.support {
            Support::Runs => {}
            Support::Ignored => {
                out.warnings.push(format!("`hooks` event `{name}` is not run by warden ({}); ignored", event.why));
                continue;
            }
            Support::Refused => {
                problem(&mut out, format!("`hooks` event `{name}` is not supported ({})", event.why));
                continue;
            }
        }
        let Value::Array(groups) = groups else {
            problem(&mut out, format!("`hooks.{name}` must be a list of {{matcher, hooks}} entries"));
            continue;
        };
        for (i, group) in groups.iter().enumerate() {
            match parse_group(name, group) {
                Ok((g, skipped)) => {
                    for why in skipped {
                        problem(&mut out, format!("`hooks.{name}[{i}]`: {why}"));
                    }
                    if !g.commands.is_empty() {
                        out.hooks.groups_mut(name).expect("a run event has groups").push(g);
                    }
                }
                Err(e) => problem(&mut out, format!("`hooks.{name}[{i}]`: {e}")),
            }
        }
    }
    out
}

/// One `{matcher, hooks}` entry: its group of `command` hooks, and why each other hook
/// of it is not run; `Err` when the entry as a whole cannot be read.
fn parse_group(event: &str, group: &Value) -> Result<(HookGroup, Vec<String>), String> {
    let matcher = match group.get("matcher") {
        _ if !has_matcher(event) => vec!["*".to_string()],
        None | Some(Value::Null) => vec!["*".to_string()],
        Some(Value::String(m)) => parse_matcher(m)?,
        Some(other) => return Err(format!("`matcher` must be text, not {other}")),
    };
    let Some(Value::Array(entries)) = group.get("hooks") else {
        return Err("expected `hooks: [{type: command, command: …}]`".into());
    };
    let mut commands = Vec::new();
    let mut skipped = Vec::new();
    for entry in entries {
        let kind = entry.get("type").and_then(Value::as_str).unwrap_or(COMMAND_HOOK_TYPE);
        if kind != COMMAND_HOOK_TYPE {
            let known = if UNSERVED_HOOK_TYPES.contains(&kind) { "is not run by warden" } else { "is unknown" };
            skipped.push(format!("hook type `{kind}` {known} (warden runs `command` hooks)"));
            continue;
        }
        let command = entry.get("command").and_then(Value::as_str).map(str::trim).unwrap_or_default();
        if command.is_empty() {
            return Err("a `command` hook needs a `command`".into());
        }
        let timeout_secs = match entry.get("timeout") {
            None | Some(Value::Null) => DEFAULT_HOOK_TIMEOUT_SECS,
            Some(t) => t
                .as_u64()
                .filter(|t| (1..=MAX_HOOK_TIMEOUT_SECS).contains(t))
                .ok_or_else(|| format!("`timeout` must be 1 to {MAX_HOOK_TIMEOUT_SECS} seconds, not {t}"))?,
        };
        commands.push(HookCommand { command: command.to_string(), timeout_secs });
    }
    Ok((HookGroup { matcher, commands }, skipped))
}

/// A matcher as Claude Code writes them, in the forms read exactly: empty or `*` (every
/// tool), `Name`, `A|B`, `prefix.*` (e.g. `mcp__github__.*`). Other regular-expression
/// syntax is an error: a matcher read wrongly would skip the hook.
fn parse_matcher(matcher: &str) -> Result<Vec<String>, String> {
    let matcher = matcher.trim();
    if matcher.is_empty() || matcher == "*" || matcher == ".*" {
        return Ok(vec!["*".into()]);
    }
    let mut out = Vec::new();
    for alternative in matcher.split('|') {
        let alternative = alternative.trim();
        let plain = alternative.strip_suffix(".*").unwrap_or(alternative);
        let ok = !plain.is_empty() && plain.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !ok {
            return Err(format!("matcher `{matcher}` is not read exactly by warden (names, `A|B`, `prefix.*` or `*`)"));
        }
        out.push(alternative.to_string());
    }
    Ok(out)
}

impl HookGroup {
    pub fn matches(&self, tool: &str) -> bool {
        self.matcher.iter().any(|m| match m.strip_suffix(".*") {
            _ if m == "*" => true,
            Some(prefix) => tool.starts_with(prefix),
            None => m == tool,
        })
    }
}

/// The commands of `groups` that apply to `tool`, in order.
pub fn commands_for<'a>(groups: &'a [HookGroup], tool: &str) -> Vec<&'a HookCommand> {
    groups.iter().filter(|g| g.matches(tool)).flat_map(|g| g.commands.iter()).collect()
}

/// The Bash call that runs `hook` with `input` on its stdin, in a subshell (so it cannot
/// change the session shell's directory or variables) in [`HOOK_CWD`].
pub fn bash_call(id: String, hook: &HookCommand, input: &Value) -> ToolCall {
    let stdin = input.to_string().replace('\'', r"'\''");
    let command = format!(
        "( cd {HOOK_CWD} && export CLAUDE_PROJECT_DIR={HOOK_CWD} && printf '%s' '{stdin}' | {{ {}\n}} )",
        hook.command
    );
    ToolCall {
        id,
        name: "Bash".into(),
        arguments: json!({ "command": command, "timeout": hook.timeout_secs * 1000 }).to_string(),
    }
}

/// The stdin of a hook for `call` (with `response` after it ran). A response longer than
/// [`MAX_HOOK_TOOL_RESPONSE_BYTES`] is cut there (at a character boundary), and
/// `tool_response_truncated` gives `{ "bytes": <whole size>, "kept_bytes": <kept> }`.
pub fn input(event: &str, session_id: &str, call: &ToolCall, response: Option<&str>) -> Value {
    let tool_input: Value = serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!({}));
    let mut v = json!({
        "session_id": session_id,
        "cwd": HOOK_CWD,
        "hook_event_name": event,
        "tool_name": call.name,
        "tool_input": tool_input,
    });
    if let Some(response) = response {
        let mut kept = response.len().min(MAX_HOOK_TOOL_RESPONSE_BYTES);
        while !response.is_char_boundary(kept) {
            kept -= 1;
        }
        v["tool_response"] = json!(&response[..kept]);
        if kept < response.len() {
            v["tool_response_truncated"] = json!({ "bytes": response.len(), "kept_bytes": kept });
        }
    }
    v
}

/// What a hook's run says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to change (exit 0 without a decision, `allow`, a non-blocking error).
    Pass,
    /// Keep the call from running (PreToolUse) / tell the model (PostToolUse).
    Block(String),
    /// The hook wants a person asked.
    Ask(String),
    /// The hook did not run to an exit code (declined by the gate, timed out, …).
    NoVerdict(String),
}

/// The parts of the Bash tool's result of a hook run: stdout, then `[stderr]` and its
/// text, then `[exit code: N]` when not 0 (the sandbox's Bash output). The exit code is
/// `None` when the command did not run to one (declined, timed out, …).
fn parts(result: &ToolResult) -> (Option<u32>, &str, &str) {
    let content = result.content.as_str();
    let (body, exit) = match content.trim_end().rsplit_once("[exit code: ") {
        Some((body, tail)) => (body, tail.split(|c: char| !c.is_ascii_digit()).next().and_then(|n| n.parse().ok())),
        None if !result.is_error => (content, Some(0)),
        None => (content, None),
    };
    let (stdout, stderr) = match body.split_once("[stderr]\n") {
        Some((out, err)) => (out, err.trim()),
        None => (body, ""),
    };
    (exit, stdout, stderr)
}

/// Reads the Bash tool's result of a hook run (see [`parts`]) as Claude Code reads a
/// hook's exit code and output.
pub fn verdict(result: &ToolResult) -> Verdict {
    match parts(result) {
        (None, _, _) => Verdict::NoVerdict(result.content.trim().to_string()),
        (Some(0), stdout, _) => decision(stdout.trim()),
        (Some(2), _, stderr) => {
            Verdict::Block(if stderr.is_empty() { "(no reason given)".into() } else { stderr.to_string() })
        }
        _ => Verdict::Pass,
    }
}

/// The context a `SessionStart` / `UserPromptSubmit` hook adds (exit code 0): its JSON's
/// `hookSpecificOutput.additionalContext`, or its stdout when that is not JSON; at most
/// [`MAX_HOOK_CONTEXT_BYTES`] (cut at a character boundary).
pub fn added_context(result: &ToolResult) -> Option<String> {
    let (Some(0), stdout, _) = parts(result) else { return None };
    let stdout = stdout.trim();
    let text = match serde_json::from_str::<Value>(stdout) {
        Ok(Value::Object(out)) => out
            .get("hookSpecificOutput")
            .and_then(|s| s.get("additionalContext"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .trim()
            .to_string(),
        _ => stdout.to_string(),
    };
    let mut kept = text.len().min(MAX_HOOK_CONTEXT_BYTES);
    while !text.is_char_boundary(kept) {
        kept -= 1;
    }
    (!text.is_empty()).then(|| text[..kept].to_string())
}

/// The stdin of a hook of an event without a tool call: the common fields and `fields`
/// (`prompt` for `UserPromptSubmit`, `source` for `SessionStart`, `stop_hook_active` and
/// `last_assistant_message` for `Stop`).
pub fn event_input(event: &str, session_id: &str, fields: Value) -> Value {
    let mut v = json!({ "session_id": session_id, "cwd": HOOK_CWD, "hook_event_name": event });
    if let (Value::Object(v), Value::Object(fields)) = (&mut v, fields) {
        v.extend(fields);
    }
    v
}

/// A decision in a hook's JSON output (exit code 0); anything else is no decision.
fn decision(stdout: &str) -> Verdict {
    let Ok(Value::Object(out)) = serde_json::from_str::<Value>(stdout) else { return Verdict::Pass };
    let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("(no reason given)").to_string();
    let specific = out.get("hookSpecificOutput");
    match specific.and_then(|s| s.get("permissionDecision")).and_then(Value::as_str) {
        Some("deny") => return Verdict::Block(text(specific.and_then(|s| s.get("permissionDecisionReason")))),
        Some("ask") => return Verdict::Ask(text(specific.and_then(|s| s.get("permissionDecisionReason")))),
        _ => {}
    }
    if out.get("decision").and_then(Value::as_str) == Some("block") {
        return Verdict::Block(text(out.get("reason")));
    }
    if out.get("continue").and_then(Value::as_bool) == Some(false) {
        return Verdict::Block(text(out.get("stopReason")));
    }
    Verdict::Pass
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(content: &str, is_error: bool) -> ToolResult {
        ToolResult { id: "h".into(), content: content.into(), is_error }
    }

    #[test]
    fn parses_claude_code_hooks_and_refuses_what_it_cannot_run_exactly() {
        let v = json!({
            "PreToolUse": [{"matcher": "Bash|Write", "hooks": [{"type": "command", "command": "./check.sh", "timeout": 5}]}],
            "PostToolUse": [{"hooks": [{"command": "./lint.sh"}]}]
        });
        let parsed = parse(&v);
        assert!(parsed.refusals.is_empty() && parsed.warnings.is_empty(), "{parsed:?}");
        let h = parsed.hooks;
        assert_eq!(h.pre_tool_use[0].matcher, ["Bash", "Write"]);
        assert_eq!(h.pre_tool_use[0].commands, [HookCommand { command: "./check.sh".into(), timeout_secs: 5 }]);
        assert_eq!(h.post_tool_use[0].matcher, ["*"]);
        assert_eq!(h.post_tool_use[0].commands[0].timeout_secs, DEFAULT_HOOK_TIMEOUT_SECS);
        for (bad, says) in [
            (json!({"PreToolUse": [{"matcher": "Ba(sh)?", "hooks": [{"command": "x"}]}]}), "not read exactly"),
            (json!({"PreToolUse": [{"hooks": [{"type": "prompt", "prompt": "x"}]}]}), "hook type `prompt`"),
            (json!({"UserPromptSubmit": [{"hooks": [{"type": "http", "url": "x"}]}]}), "hook type `http`"),
            (
                json!({"PermissionRequest": [{"hooks": [{"command": "x"}]}]}),
                "event `PermissionRequest` is not supported",
            ),
            (json!({"PreToolUse": [{"hooks": [{"command": " "}]}]}), "needs a `command`"),
            (json!({"PreToolUse": [{"hooks": [{"command": "x", "timeout": 0}]}]}), "`timeout` must be"),
            (json!({"PreToolUse": {"matcher": "x"}}), "must be a list"),
            (json!(["x"]), "must be a mapping"),
        ] {
            let refusals = parse(&bad).refusals.join("\n");
            assert!(refusals.contains(says), "{says}: {refusals}");
        }
    }

    /// Every hook event of Claude Code's reference was refused but `PreToolUse` and
    /// `PostToolUse` (`Stop` in 10 real files, `PostToolUseFailure`, …): each is accepted;
    /// the ones warden runs are kept, the others are warnings, and only an event whose
    /// hooks could forbid (and that warden cannot run) refuses the file.
    #[test]
    fn regression_hook_events_other_than_pre_and_post_tool_use_refused_the_file() {
        for event in EVENTS {
            let parsed = parse(&json!({ event.name: [{"hooks": [{"type": "command", "command": "./h.sh"}]}] }));
            match event.support {
                Support::Runs => {
                    assert!(parsed.refusals.is_empty() && parsed.warnings.is_empty(), "{}: {parsed:?}", event.name);
                    assert!(!parsed.hooks.is_empty(), "{}", event.name);
                }
                Support::Ignored => {
                    assert!(parsed.refusals.is_empty(), "{}: {parsed:?}", event.name);
                    assert!(parsed.warnings[0].contains(&format!("`{}` is not run by warden", event.name)));
                    assert!(parsed.hooks.is_empty());
                }
                Support::Refused => assert!(event.narrows && !parsed.refusals.is_empty(), "{}", event.name),
            }
            // Another hook type: a warning, or a refusal where the event can forbid.
            let parsed = parse(&json!({ event.name: [{"hooks": [{"type": "agent", "prompt": "check"}]}] }));
            assert_eq!(!parsed.refusals.is_empty(), event.narrows, "{}: {parsed:?}", event.name);
        }
        let h = parse(&json!({
            "Stop": [{"hooks": [{"command": "./tests-pass.sh"}]}],
            "SubagentStop": [{"matcher": "ignored", "hooks": [{"command": "./done.sh"}]}],
            "PostToolUseFailure": [{"matcher": "Bash", "hooks": [{"command": "./why.sh"}]}],
            "SessionStart": [{"matcher": "startup", "hooks": [{"command": "git status"}]}],
            "UserPromptSubmit": [{"hooks": [{"command": "./prompt-guard.sh"}]}],
        }))
        .hooks;
        assert_eq!(h.stop.len(), 2);
        assert_eq!(h.stop[1].matcher, ["*"], "Stop has no matcher in Claude Code");
        assert_eq!(h.post_tool_use_failure[0].matcher, ["Bash"]);
        assert_eq!(h.session_start[0].matcher, ["startup"]);
        assert_eq!(h.user_prompt_submit[0].commands[0].command, "./prompt-guard.sh");
        let unknown = parse(&json!({"AfterLunch": [{"hooks": [{"command": "x"}]}]}));
        assert!(unknown.refusals.is_empty() && unknown.warnings[0].contains("not a Claude Code hook event"));
        // A matcher warden cannot read: refused for PreToolUse, a warning for PostToolUse.
        let post = parse(&json!({"PostToolUse": [{"matcher": "Ba(sh)?", "hooks": [{"command": "x"}]}]}));
        assert!(post.refusals.is_empty() && post.warnings[0].contains("not read exactly"), "{post:?}");
    }

    #[test]
    fn added_context_is_json_additional_context_or_plain_stdout_and_bounded() {
        let json_out =
            r#"{"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": "branch main"}}"#;
        assert_eq!(added_context(&result(json_out, false)).as_deref(), Some("branch main"));
        assert_eq!(added_context(&result("on branch main\n", false)).as_deref(), Some("on branch main"));
        assert_eq!(added_context(&result("x\n[exit code: 1]", true)), None);
        assert_eq!(added_context(&result("", false)), None);
        let long = "\u{e9}".repeat(MAX_HOOK_CONTEXT_BYTES);
        assert!(added_context(&result(&long, false)).unwrap().len() <= MAX_HOOK_CONTEXT_BYTES);
        let stdin = event_input("Stop", "s1", json!({"stop_hook_active": false}));
        assert_eq!(
            (stdin["hook_event_name"].as_str(), stdin["stop_hook_active"].as_bool()),
            (Some("Stop"), Some(false))
        );
    }

    #[test]
    fn matchers_match_names_alternatives_prefixes_and_everything() {
        let group = |m: &str| HookGroup { matcher: parse_matcher(m).unwrap(), commands: vec![] };
        assert!(group("").matches("Read") && group("*").matches("Bash") && group(".*").matches("x"));
        assert!(group("Bash").matches("Bash") && !group("Bash").matches("BashOutput"));
        assert!(group("Edit|Write").matches("Write") && !group("Edit|Write").matches("Read"));
        assert!(group("mcp__github__.*").matches("mcp__github__issue") && !group("mcp__github__.*").matches("Read"));
    }

    #[test]
    fn verdicts_follow_claude_code_s_exit_codes_and_json() {
        assert_eq!(verdict(&result("", false)), Verdict::Pass);
        assert_eq!(verdict(&result("all fine\n", false)), Verdict::Pass);
        assert_eq!(
            verdict(&result("[stderr]\nrm is not allowed\n[exit code: 2]", true)),
            Verdict::Block("rm is not allowed".into())
        );
        assert_eq!(verdict(&result("oops\n[exit code: 1]", true)), Verdict::Pass, "non-blocking error");
        let deny = r#"{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny", "permissionDecisionReason": "no writes to /etc"}}"#;
        assert_eq!(verdict(&result(deny, false)), Verdict::Block("no writes to /etc".into()));
        let ask = r#"{"hookSpecificOutput": {"permissionDecision": "ask", "permissionDecisionReason": "check with a person"}}"#;
        assert_eq!(verdict(&result(ask, false)), Verdict::Ask("check with a person".into()));
        let allow = r#"{"hookSpecificOutput": {"permissionDecision": "allow"}}"#;
        assert_eq!(verdict(&result(allow, false)), Verdict::Pass, "allow never widens: the gate still decides");
        assert_eq!(
            verdict(&result(r#"{"decision": "block", "reason": "lint failed"}"#, false)),
            Verdict::Block("lint failed".into())
        );
        assert_eq!(
            verdict(&result("error: declined: Bash is not allowed by policy", true)),
            Verdict::NoVerdict("error: declined: Bash is not allowed by policy".into())
        );
        assert!(matches!(verdict(&result("[timed out after 5000 ms: killed]", true)), Verdict::NoVerdict(_)));
    }

    #[test]
    fn the_bash_call_feeds_the_input_on_stdin_in_a_subshell() {
        let hook = HookCommand { command: "./check.sh --strict".into(), timeout_secs: 7 };
        let call = ToolCall { id: "c1".into(), name: "Bash".into(), arguments: r#"{"command":"echo 'hi'"}"#.into() };
        let stdin = input("PreToolUse", "s1", &call, None);
        assert_eq!(stdin["tool_input"]["command"], "echo 'hi'");
        assert_eq!(stdin["hook_event_name"], "PreToolUse");
        assert!(stdin.get("tool_response").is_none());
        let bash = bash_call("hook_1".into(), &hook, &stdin);
        let args: Value = serde_json::from_str(&bash.arguments).unwrap();
        assert_eq!(args["timeout"], 7000);
        let command = args["command"].as_str().unwrap();
        assert!(
            command.starts_with("( cd /workspace && export CLAUDE_PROJECT_DIR=/workspace && printf '%s' '{"),
            "{command}"
        );
        assert!(command.contains(r#"echo '\''hi'\''"#), "quotes are escaped for the shell: {command}");
        assert!(command.ends_with("| { ./check.sh --strict\n} )"), "{command}");
        assert_eq!(input("PostToolUse", "s1", &call, Some("out"))["tool_response"], "out");
    }
}
