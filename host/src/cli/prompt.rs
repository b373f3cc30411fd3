//! Asking a person on the terminal: the `Decider`s the CLI hands to the approval gate.
//!
//! With a TTY the operator sees the call as a person reads it (the command for Bash, the
//! path and a diff for Write/Edit) and answers `y` (approve once), `s` (approve for the
//! session), `a` (approve always; both only when the request offers them) or anything
//! else (decline). Without
//! one, every ask is declined at once — unless the demo explicitly opts into
//! auto-approval, which it announces. These deciders only answer; the gate audits.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;

use warden_approval::{BoxFuture, Decider, PendingApproval, Resolution, Scope, UserDecision};

/// The decider for this process's terminal.
pub fn terminal_decider(auto_approve_without_tty: bool) -> Arc<dyn Decider> {
    if std::io::stdin().is_terminal() && std::io::stderr().is_terminal() {
        Arc::new(TtyDecider)
    } else if auto_approve_without_tty {
        Arc::new(AutoApprove)
    } else {
        Arc::new(NoTty)
    }
}

fn describe(r: &PendingApproval) -> String {
    let input = serde_json::to_string(&r.input).unwrap_or_default();
    let rule = r.matched_rule.as_deref().map(|m| format!(" (rule {m})")).unwrap_or_default();
    // Subagent, tool and input come from an agent file and a model: escaped for the terminal.
    let line = format!("{} wants to run {} {input}{rule}", r.subagent, r.tool);
    crate::text::escape_control(&line).into_owned()
}

struct TtyDecider;

impl Decider for TtyDecider {
    fn decide(&self, r: PendingApproval) -> BoxFuture<'static, Result<UserDecision, String>> {
        let answer = self.decide_scoped(r);
        Box::pin(async move { answer.await.map(|(d, _)| d) })
    }

    /// Shows the call as a person reads it (the command, the path and a diff) and offers
    /// the request's scopes: `y` once, `s` for the session, `a` always; anything else declines.
    fn decide_scoped(&self, r: PendingApproval) -> BoxFuture<'static, Result<(UserDecision, Scope), String>> {
        Box::pin(async move {
            let question = tty_question(&r);
            let answer = tokio::task::spawn_blocking(move || {
                let mut err = std::io::stderr();
                let _ = err.write_all(question.as_bytes());
                let _ = err.flush();
                let mut line = String::new();
                std::io::stdin().lock().read_line(&mut line).map(|_| line)
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
            let (resolution, scope) = tty_answer(&answer, &r.scopes);
            // The person at the terminal runs warden with its configuration: its operator.
            let authority = warden_approval::Authority::Admin;
            Ok((UserDecision { resolution, who: crate::actor::TTY.into(), authority }, scope))
        })
    }
}

/// The TTY question: who asks (subagent, task, session), why (the rule), the call as a
/// person reads it, and the scopes on offer.
fn tty_question(r: &PendingApproval) -> String {
    let call = warden_approval::display::describe_call(&r.tool, &r.input);
    let whose =
        [r.task_id.as_deref().map(|t| format!("task {t}")), r.session_id.as_deref().map(|s| format!("session {s}"))]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(", ");
    let reason = crate::text::escape_control(&r.reason);
    let mut options = vec!["[y]es once"];
    if r.scopes.contains(&Scope::Session) {
        options.push("[s]ession");
    }
    if r.scopes.contains(&Scope::Always) {
        options.push("[a]lways");
    }
    options.push("[N]o");
    // A nested subagent's call names the chain that started it: `planner › coder`.
    let subagent =
        r.chain.iter().map(|link| link.subagent.as_str()).chain([r.subagent.as_str()]).collect::<Vec<_>>().join(" › ");
    let subagent = crate::text::escape_control(&subagent);
    // The model's words about its call come after warden's, labelled as the model's.
    let note = warden_approval::display::model_note(&r.tool, &r.input).map(|n| format!("\n{n}")).unwrap_or_default();
    format!(
        "\n? {subagent} ({whose}) wants to run {}:\n{call}\n  because: {reason}{note}\n  approve? {} ",
        crate::text::escape_control(&r.tool),
        options.join(" / ")
    )
}

/// An answer typed on the TTY: `y` once, `s` session, `a` always (each only if offered),
/// anything else declines.
fn tty_answer(answer: &str, offered: &[Scope]) -> (Resolution, Scope) {
    let scope = match answer.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Scope::Once,
        "s" | "session" => Scope::Session,
        "a" | "always" => Scope::Always,
        _ => return (Resolution::Decline, Scope::Once),
    };
    if scope == Scope::Once || offered.contains(&scope) {
        (Resolution::Approve, scope)
    } else {
        (Resolution::Decline, Scope::Once)
    }
}

struct NoTty;

impl Decider for NoTty {
    fn decide(&self, r: PendingApproval) -> BoxFuture<'static, Result<UserDecision, String>> {
        eprintln!("declined (no terminal to ask on): {}", describe(&r));
        Box::pin(async {
            Ok(UserDecision {
                resolution: Resolution::Decline,
                who: crate::actor::NO_TTY.into(),
                authority: warden_approval::Authority::User,
            })
        })
    }
}

struct AutoApprove;

impl Decider for AutoApprove {
    fn decide(&self, r: PendingApproval) -> BoxFuture<'static, Result<UserDecision, String>> {
        eprintln!("\n! demo: no terminal to ask on, auto-approving: {}", describe(&r));
        Box::pin(async {
            Ok(UserDecision {
                resolution: Resolution::Approve,
                who: crate::actor::DEMO_AUTO.into(),
                authority: warden_approval::Authority::User,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tty_shows_the_call_and_offers_only_the_scopes_of_the_request() {
        let r = PendingApproval {
            id: "apr_1".into(),
            tool: "Bash".into(),
            input: serde_json::json!({ "command": "make test" }),
            subagent: "worker".into(),
            task_id: Some("task_1".into()),
            session_id: Some("s1".into()),
            plugin: None,
            chain: vec![],
            matched_rule: None,
            reason: "no rule matches; default is ask".into(),
            created_at: String::new(),
            expires_at: String::new(),
            scopes: vec![Scope::Once, Scope::Session],
        };
        let q = tty_question(&r);
        assert!(q.contains("worker (task task_1, session s1) wants to run Bash:\n  $ make test\n"), "{q}");
        assert!(q.contains("[y]es once / [s]ession / [N]o"), "{q}");
        let described = PendingApproval {
            input: serde_json::json!({ "command": "make test", "description": "read-only" }),
            ..r.clone()
        };
        let q = tty_question(&described);
        assert!(q.contains("  because: no rule matches; default is ask\n  model says: read-only\n"), "{q}");
        assert_eq!(tty_answer("s\n", &r.scopes), (Resolution::Approve, Scope::Session));
        assert_eq!(tty_answer("a", &r.scopes), (Resolution::Decline, Scope::Once), "always was not offered");
        assert_eq!(tty_answer("y", &r.scopes), (Resolution::Approve, Scope::Once));
        assert_eq!(tty_answer("", &r.scopes), (Resolution::Decline, Scope::Once));
        let nested = PendingApproval {
            chain: vec![warden_approval::ChainLink {
                task_id: "task_0".into(),
                subagent: "planner".into(),
                mode: None,
            }],
            ..r.clone()
        };
        assert!(tty_question(&nested).contains("planner › worker (task task_1, session s1) wants to run Bash"));
        // Regression: the reason (which quotes the command) kept bidirectional controls.
        let trojan = PendingApproval { reason: "`rm -rf /\u{202E}#`: no rule matches".into(), ..r.clone() };
        assert!(!tty_question(&trojan).contains('\u{202E}'), "{}", tty_question(&trojan));
    }
}
