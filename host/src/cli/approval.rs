//! `warden approval check TOOL JSON`: what the operator's approval policy decides for one
//! tool call — the decision, the rule and the reason — without running anything, so a
//! policy can be tried before it is deployed (as Codex's `execpolicy check`).
//!
//! It judges the call as the gate does in the sandbox's workspace (`/workspace`, relative
//! paths from there), with the rules, `default` and the permission mode (capped by
//! `max_mode` as for an agent that claims it). It never starts a sandbox, so links in the
//! sandbox are not followed (paths are judged as written), and grants (`session`,
//! `always` from the overlay) are not consulted: it shows what the policy itself decides.
//! It must never run the call, open the audit log or contact anything.

use std::process::ExitCode;

use anyhow::Context;
use serde_json::{Value, json};
use warden_approval::{EvalContext, PermissionMode, Policy};

use super::{EXIT_USAGE, esc};
use crate::app::SANDBOX_WORKSPACE;
use crate::config::Config;

/// Longest JSON argument accepted: a tool call's input is bounded by the gate's own limits
/// long before this; one megabyte keeps a mistaken file paste from being parsed at length.
pub const MAX_CHECK_ARGS: usize = 1024 * 1024;

/// Prints the decision for `tool` with input `args` (a JSON object); exit 0 whatever the
/// decision, 2 for bad input.
pub fn check(config: &Config, tool: &str, args: &str, mode: Option<&str>, json_out: bool) -> anyhow::Result<ExitCode> {
    if args.len() > MAX_CHECK_ARGS {
        eprintln!("error: ARGS: longer than {MAX_CHECK_ARGS} bytes");
        return Ok(ExitCode::from(EXIT_USAGE));
    }
    let input: Value = match serde_json::from_str(args) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => {
            eprintln!("error: ARGS: expected a JSON object, e.g. '{{\"command\": \"ls\"}}'");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
        Err(e) => {
            eprintln!("error: ARGS: not JSON ({e}); expected an object, e.g. '{{\"command\": \"ls\"}}'");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let requested = match mode {
        None => None,
        Some(m) => match serde_json::from_value::<PermissionMode>(Value::String(m.to_owned())) {
            Ok(m) => Some(m),
            Err(_) => {
                eprintln!(
                    "error: --mode: `{}` is not a permission mode (expected default, acceptEdits, plan, dontAsk or \
                     bypassPermissions)",
                    esc(m)
                );
                return Ok(ExitCode::from(EXIT_USAGE));
            }
        },
    };
    let policy =
        Policy::from_config(config.approval.clone()).with_context(|| format!("{}: approval", config.source_name()))?;
    let ctx = EvalContext { workspace_root: SANDBOX_WORKSPACE.into(), home: SANDBOX_WORKSPACE.into() };
    let mode = policy.effective_mode(requested);
    let ev = policy.decide(tool, &input, &ctx, mode);
    if json_out {
        let v = json!({
            "decision": ev.decision.as_str(),
            "rule": ev.matched_rule,
            "reason": ev.reason,
            "bypass": ev.bypass,
            "not_understood": ev.not_understood,
        });
        out!("{v}");
    } else {
        out!("decision: {}", ev.decision.as_str());
        out!("rule: {}", ev.matched_rule.as_deref().map_or_else(|| "none".to_owned(), |r| esc(r).into_owned()));
        out!("reason: {}", esc(&ev.reason));
    }
    Ok(ExitCode::SUCCESS)
}
