//! The gate's corpus measurement (issue 44): how many everyday commands the policy allows,
//! asks about and denies when the operator allows exactly the programs each command uses.
//!
//! `cargo run -p warden-approval --example gate_corpus -- approval/benches/tldr-commands.txt`
//!
//! For each command (one a line; `#` lines are comments) the policy is built fresh:
//! `allow: [Bash(PROGRAM:*) for every program word the recognizer finds, Edit(/**)]` (the
//! programs it uses and a Write policy allowing the workspace), `default: ask`, no deny or
//! ask rules; the workspace is `/workspace`. Nothing runs. Prints the shares and every ask
//! and deny reason counted (reasons with the command's own text and paths replaced by `…`),
//! as Markdown.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::json;
use warden_approval::{Decision, EvalContext, Policy, PolicyConfig, shell};

/// How many reasons the table lists; the rest are summed in one line.
const TOP_REASONS: usize = 40;

fn main() {
    let path = std::env::args().nth(1).expect("usage: gate_corpus COMMANDS_FILE");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let ctx = EvalContext { workspace_root: PathBuf::from("/workspace"), home: PathBuf::from("/home/agent") };
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut reasons: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut total = 0usize;
    for cmd in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        total += 1;
        let mut allow: Vec<String> = vec!["Edit(/**)".into()];
        for part in shell::recognize(cmd).commands() {
            let Some(program) = part.argv.first() else { continue };
            let name = program.rsplit('/').next().unwrap_or_default();
            let rule = format!("Bash({name}:*)");
            if !name.is_empty() && !allow.contains(&rule) && warden_approval::Rule::parse(&rule).is_ok() {
                allow.push(rule);
            }
        }
        let policy = Policy::from_config(PolicyConfig { allow, ..PolicyConfig::default() }).expect("valid rules");
        let ev = policy.evaluate("Bash", &json!({ "command": cmd }), &ctx);
        *counts.entry(ev.decision.as_str()).or_default() += 1;
        if ev.decision != Decision::Allow {
            let reason = match ev.not_understood {
                Some(n) => format!("not understood: {}", n.reason),
                None => generic(&ev.reason),
            };
            *reasons.entry((ev.decision.as_str().to_owned(), reason)).or_default() += 1;
        }
    }
    let share = |d: &str| {
        let n = counts.get(d).copied().unwrap_or(0);
        format!("{n} ({:.2}%)", 100.0 * n as f64 / total.max(1) as f64)
    };
    println!("commands: {total}; allow {}; ask {}; deny {}", share("allow"), share("ask"), share("deny"));
    println!();
    println!("| decision | reason | commands |");
    println!("|---|---|---:|");
    let mut sorted: Vec<_> = reasons.into_iter().collect();
    sorted.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    for ((d, r), n) in sorted.iter().take(TOP_REASONS) {
        println!("| {d} | {} | {n} |", r.replace('|', "\\|"));
    }
    if sorted.len() > TOP_REASONS {
        let rest: usize = sorted[TOP_REASONS..].iter().map(|(_, n)| n).sum();
        println!("| | {} more reasons | {rest} |", sorted.len() - TOP_REASONS);
    }
}

/// A reason without the command's own text: backtick-quoted parts and absolute paths
/// become `…`, so reasons of the same kind count together.
fn generic(reason: &str) -> String {
    let mut out = String::new();
    for (i, piece) in reason.split('`').enumerate() {
        if i % 2 == 1 {
            out.push_str("`…`");
        } else {
            let words: Vec<&str> = piece.split(' ').map(|w| if w.starts_with('/') { "…" } else { w }).collect();
            out.push_str(&words.join(" "));
        }
    }
    out
}
