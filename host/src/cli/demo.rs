//! `warden demo`: what warden is, in a minute, offline.
//!
//! A Claude-format subagent (the bundled `claude` plugin) is driven by the scripted
//! model provider — the offline stand-in for an LLM — and calls tools that run in a real,
//! hardened Docker sandbox. Bash and Write calls wait for approval: asked on the
//! terminal, or, only here and only without a terminal, auto-approved with a notice.
//! Everything the demo needs is embedded; nothing outside a temporary directory changes.

use crate::text::escape_control as esc;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use super::EXIT_TASK_FAILED;
use crate::config::Config;
use crate::plugin::TaskCall;
use crate::task_state::TaskState;

const DEMO_AGENT: &str = include_str!("../../../demo/agents/release-notes.md");
const DEMO_SCRIPT: &str = include_str!("../../../demo/script.yaml");
const DEMO_CONFIG: &str = include_str!("../../../demo/warden.yaml");
const DEMO_PROMPT: &str = "Write release notes for the changes in this workspace.";

pub async fn run(plugins: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let plugins = match plugins {
        Some(p) => p,
        None => std::env::current_exe()?
            .parent()
            .and_then(|p| p.parent())
            .map(|t| t.join("plugins"))
            .context("cannot locate the bundled plugins; pass --plugins DIR")?,
    };
    anyhow::ensure!(
        plugins.join("claude.wasm").is_file(),
        "{} has no claude.wasm; build the bundled plugins with `cargo xtask build` or pass --plugins DIR",
        plugins.display()
    );
    let plugins = plugins.canonicalize().with_context(|| format!("{}", plugins.display()))?;
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("agents"))?;
    std::fs::write(dir.path().join("agents/release-notes.md"), DEMO_AGENT)?;
    std::fs::write(dir.path().join("script.yaml"), DEMO_SCRIPT)?;
    let yaml = DEMO_CONFIG
        .replace("../target/plugins", &plugins.display().to_string())
        .replace("../target/warden-cache", &dir.path().join("cache").display().to_string());
    let config_path = dir.path().join("warden.yaml");
    std::fs::write(&config_path, yaml)?;
    let mut config = Config::from_file(&config_path)?;
    // One session, then exit: a warm pool would only be left behind.
    config.sandbox.warm_pool = 0;
    let audit = config.approval.audit_log.as_ref().map(|p| config.path(p));

    out!("warden demo — a Claude-format subagent in a WebAssembly plugin, a scripted model,");
    out!("tools in a hardened Docker sandbox, and an approval gate in front of Bash and Write.\n");
    let host = crate::app::Host::start(config).await?;
    let registry = host.registry.clone();
    let snap = registry.snapshot();
    for p in snap.status() {
        let caps: Vec<_> = p.granted_capabilities.iter().map(|c| c.name()).collect();
        let line =
            format!("plugin {} {} serves {} — granted [{}]", p.id, p.version, p.kinds.join(","), caps.join(", "));
        out!("{}", esc(&line));
    }
    out!("subagents:\n{}", crate::text::escape_multiline(&snap.registrations()));
    out!("$ Task(subagent_type: \"release-notes\", prompt: {DEMO_PROMPT:?})\n");

    let session_id = format!("demo_{}", uuid::Uuid::new_v4());
    let call = TaskCall {
        description: "release notes".into(),
        prompt: DEMO_PROMPT.into(),
        subagent_type: "release-notes".into(),
        ..TaskCall::default()
    };
    let outcome = super::run_on_terminal(&host, call, &session_id, true, true, None).await;
    super::sandbox::end_session(&host, &session_id).await;
    let outcome = outcome??;
    match (&outcome.status, &outcome.output, &outcome.error) {
        (TaskState::Completed, Some(o), _) => out!("\nfinal answer: {}", crate::text::escape_multiline(o)),
        (_, _, Some(e)) => out!("\ntask failed: {}", esc(e)),
        _ => out!("\ntask ended: {:?}", outcome.status),
    }
    if let Some(audit) = audit
        && let Ok(text) = std::fs::read_to_string(&audit)
    {
        out!("\naudit log ({} decisions, arguments only as digests):", text.lines().count());
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
            out!(
                "  {:<6} {:<8} by {}",
                v["tool"].as_str().unwrap_or(""),
                v["decision"].as_str().unwrap_or(""),
                v["decided_by"].as_str().unwrap_or("")
            );
        }
    }
    Ok(if outcome.status == TaskState::Completed { ExitCode::SUCCESS } else { ExitCode::from(EXIT_TASK_FAILED) })
}
