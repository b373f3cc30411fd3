//! An agent file's `hooks`: `PreToolUse` / `PostToolUse` commands, as Claude Code writes them,
//! run in the session's sandbox through the `Bash` tool (so through the approval gate).
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
//! What this module never does: run a hook of another event (the resolver refuses files
//! with them), guess at a matcher it cannot read exactly (refused too), or let a hook's
//! answer allow a call.

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

/// Where hook commands run (and Claude Code's `CLAUDE_PROJECT_DIR` for them).
pub const HOOK_CWD: &str = "/workspace";

/// The hook events warden runs.
pub const EVENTS: &[&str] = &["PreToolUse", "PostToolUse"];

/// One `type: command` hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookCommand {
    pub command: String,
    pub timeout_secs: u64,
}

/// A matcher and the commands it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookGroup {
    /// The tool names it matches: `*` (every tool), exact names, or `prefix.*`.
    pub matcher: Vec<String>,
    pub commands: Vec<HookCommand>,
}

/// An agent's hooks, by event.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hooks {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pre_tool_use: Vec<HookGroup>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub post_tool_use: Vec<HookGroup>,
}

impl Hooks {
    pub fn is_empty(&self) -> bool {
        self.pre_tool_use.is_empty() && self.post_tool_use.is_empty()
    }
}

/// Reads the `hooks` field; the errors are refusals (the file is not registered), since
/// running the agent without a hook it declares could allow what the hook denies.
pub fn parse(value: &Value) -> Result<Hooks, Vec<String>> {
    let mut hooks = Hooks::default();
    let mut errors = Vec::new();
    let Value::Object(events) = value else {
        return Err(vec![format!("`hooks` must be a mapping of hook events, not {value}")]);
    };
    for (event, groups) in events {
        let target = match event.as_str() {
            "PreToolUse" => &mut hooks.pre_tool_use,
            "PostToolUse" => &mut hooks.post_tool_use,
            other => {
                errors.push(format!(
                    "`hooks` event `{other}` is not supported (warden runs {}); the agent is not registered, since running it without that hook could allow what it denies",
                    EVENTS.join(" and ")
                ));
                continue;
            }
        };
        let Value::Array(groups) = groups else {
            errors.push(format!("`hooks.{event}` must be a list of {{matcher, hooks}} entries"));
            continue;
        };
        for (i, group) in groups.iter().enumerate() {
            match parse_group(group) {
                Ok(g) => target.push(g),
                Err(e) => errors.push(format!("`hooks.{event}[{i}]`: {e}")),
            }
        }
    }
    if errors.is_empty() { Ok(hooks) } else { Err(errors) }
}

fn parse_group(group: &Value) -> Result<HookGroup, String> {
    let matcher = match group.get("matcher") {
        None | Some(Value::Null) => vec!["*".to_string()],
        Some(Value::String(m)) => parse_matcher(m)?,
        Some(other) => return Err(format!("`matcher` must be text, not {other}")),
    };
    let Some(Value::Array(entries)) = group.get("hooks") else {
        return Err("expected `hooks: [{type: command, command: …}]`".into());
    };
    let mut commands = Vec::new();
    for entry in entries {
        let kind = entry.get("type").and_then(Value::as_str).unwrap_or("command");
        if kind != "command" {
            return Err(format!("hook type `{kind}` is not supported (only `command`)"));
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
    Ok(HookGroup { matcher, commands })
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

/// Reads the Bash tool's result of a hook run: stdout, then `[stderr]` and its text, then
/// `[exit code: N]` when not 0 (the sandbox's Bash output).
pub fn verdict(result: &ToolResult) -> Verdict {
    let content = result.content.as_str();
    let (body, exit) = match content.trim_end().rsplit_once("[exit code: ") {
        Some((body, tail)) => (body, tail.split(|c: char| !c.is_ascii_digit()).next().and_then(|n| n.parse().ok())),
        None if !result.is_error => (content, Some(0)),
        None => (content, None),
    };
    let Some(exit) = exit else {
        return Verdict::NoVerdict(content.trim().to_string());
    };
    let (stdout, stderr) = match body.split_once("[stderr]\n") {
        Some((out, err)) => (out, err.trim()),
        None => (body, ""),
    };
    match exit {
        0 => decision(stdout.trim()),
        2 => Verdict::Block(if stderr.is_empty() { "(no reason given)".into() } else { stderr.to_string() }),
        _ => Verdict::Pass,
    }
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
        let h = parse(&v).unwrap();
        assert_eq!(h.pre_tool_use[0].matcher, ["Bash", "Write"]);
        assert_eq!(h.pre_tool_use[0].commands, [HookCommand { command: "./check.sh".into(), timeout_secs: 5 }]);
        assert_eq!(h.post_tool_use[0].matcher, ["*"]);
        assert_eq!(h.post_tool_use[0].commands[0].timeout_secs, DEFAULT_HOOK_TIMEOUT_SECS);
        for (bad, says) in [
            (json!({"Stop": [{"hooks": [{"command": "x"}]}]}), "event `Stop` is not supported"),
            (json!({"PreToolUse": [{"matcher": "Ba(sh)?", "hooks": [{"command": "x"}]}]}), "not read exactly"),
            (json!({"PreToolUse": [{"hooks": [{"type": "prompt", "prompt": "x"}]}]}), "hook type `prompt`"),
            (json!({"PreToolUse": [{"hooks": [{"command": " "}]}]}), "needs a `command`"),
            (json!({"PreToolUse": [{"hooks": [{"command": "x", "timeout": 0}]}]}), "`timeout` must be"),
            (json!({"PreToolUse": {"matcher": "x"}}), "must be a list"),
            (json!(["x"]), "must be a mapping"),
        ] {
            let errors = parse(&bad).unwrap_err().join("\n");
            assert!(errors.contains(says), "{says}: {errors}");
        }
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
