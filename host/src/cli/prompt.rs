//! Asking a person on the terminal: the `Decider`s the CLI hands to the approval gate.
//!
//! With a TTY the operator answers `y` (approve) or anything else (decline). Without
//! one, every ask is declined at once — unless the demo explicitly opts into
//! auto-approval, which it announces. These deciders only answer; the gate audits.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;

use warden_approval::{BoxFuture, Decider, PendingApproval, Resolution, UserDecision};

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
    format!("{} wants to run {} {input}{rule}", r.subagent, r.tool)
}

struct TtyDecider;

impl Decider for TtyDecider {
    fn decide(&self, r: PendingApproval) -> BoxFuture<'static, Result<UserDecision, String>> {
        Box::pin(async move {
            let question = format!("\n? {} — approve? [y/N] ", describe(&r));
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
            let resolution = if matches!(answer.trim(), "y" | "Y" | "yes") { Resolution::Approve } else { Resolution::Decline };
            Ok(UserDecision { resolution, who: "tty".into() })
        })
    }
}

struct NoTty;

impl Decider for NoTty {
    fn decide(&self, r: PendingApproval) -> BoxFuture<'static, Result<UserDecision, String>> {
        eprintln!("declined (no terminal to ask on): {}", describe(&r));
        Box::pin(async { Ok(UserDecision { resolution: Resolution::Decline, who: "no-tty".into() }) })
    }
}

struct AutoApprove;

impl Decider for AutoApprove {
    fn decide(&self, r: PendingApproval) -> BoxFuture<'static, Result<UserDecision, String>> {
        eprintln!("\n! demo: no terminal to ask on, auto-approving: {}", describe(&r));
        Box::pin(async { Ok(UserDecision { resolution: Resolution::Approve, who: "demo-auto".into() }) })
    }
}
