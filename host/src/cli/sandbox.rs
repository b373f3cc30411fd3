//! `warden tool` and `warden sandbox ls|prune`: the operator's view of the sandbox and
//! the approval gate, one call at a time.

use std::process::ExitCode;

use anyhow::Context;
use serde::Serialize;

use super::{EXIT_TASK_FAILED, EXIT_USAGE, LOCAL_USER, prompt};
use crate::app::Host;
use crate::config::Config;
use crate::scope::TaskScope;
use crate::tools::ToolCall;

/// Ends a session this process created (its container and workspace volume go).
pub async fn end_session(host: &Host, session_id: &str) {
    if let Ok(sandbox) = host.sandbox() {
        let key = warden_sandbox::SessionKey::new(LOCAL_USER, session_id);
        if let Err(e) = sandbox.end_session_created_here(&key).await {
            tracing::warn!(session = session_id, error = %e, "could not remove the session's sandbox");
        }
    }
}

#[derive(Serialize)]
struct ToolOutcome<'a> {
    tool: &'a str,
    session_id: &'a str,
    is_error: bool,
    content: &'a str,
}

pub async fn tool(
    config: Config,
    tool: &str,
    args: &str,
    session: Option<String>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let input: serde_json::Value = match serde_json::from_str(args) {
        Ok(v @ serde_json::Value::Object(_)) => v,
        Ok(_) | Err(_) => {
            eprintln!("error: arguments must be a JSON object, e.g. '{{\"command\": \"ls\"}}'; got {args:?}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let host = Host::start(config).await?;
    let tools = host.tools.clone();
    let ephemeral = session.is_none();
    let session_id = session.unwrap_or_else(|| format!("sess_{}", uuid::Uuid::new_v4()));
    let scope = TaskScope {
        task_id: format!("tool_{}", uuid::Uuid::new_v4()),
        session_id: session_id.clone(),
        user_id: LOCAL_USER.into(),
        subagent: "warden-tool".into(),
        plugin: "cli".into(),
        decider: Some(prompt::terminal_decider(false)),
        ..TaskScope::default()
    };
    let call = ToolCall { id: "call_1".into(), name: tool.to_owned(), input };
    let result = tools.call_batch(&scope, vec![call]).await.pop().context("no result")?;
    if ephemeral {
        end_session(&host, &session_id).await;
    }
    if json {
        let out = ToolOutcome { tool, session_id: &session_id, is_error: result.is_error, content: &result.content };
        out!("{}", serde_json::to_string(&out)?);
    } else if result.is_error {
        eprintln!("{}", crate::text::escape_multiline(&result.content));
    } else {
        out!("{}", crate::text::escape_multiline(&result.content));
    }
    Ok(if result.is_error { ExitCode::from(EXIT_TASK_FAILED) } else { ExitCode::SUCCESS })
}

fn sandbox_of(config: Config) -> anyhow::Result<warden_sandbox::Sandbox> {
    warden_sandbox::Sandbox::new(config.sandbox).map_err(|e| anyhow::anyhow!("{e}"))
}

#[derive(Serialize)]
struct SessionRow {
    user_id: String,
    session_id: String,
    container: String,
    /// The OCI runtime its container runs under.
    runtime: String,
    state: String,
    created_secs_ago: u64,
}

pub async fn ls(config: Config, json: bool) -> anyhow::Result<ExitCode> {
    let sandbox = sandbox_of(config)?;
    let rows: Vec<SessionRow> = sandbox
        .list_sessions()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .into_iter()
        .map(|s| SessionRow {
            user_id: s.key.user_id.clone(),
            session_id: s.key.session_id.clone(),
            container: s.container_name,
            runtime: s.runtime,
            state: s.state,
            created_secs_ago: s.created.elapsed().map(|d| d.as_secs()).unwrap_or(0),
        })
        .collect();
    if json {
        out!("{}", serde_json::to_string_pretty(&rows)?);
    } else if rows.is_empty() {
        out!("no sandbox sessions");
    } else {
        for r in rows {
            out!(
                "{:<12} {:<40} {:<10} {:<6} {} ({}s old)",
                r.user_id,
                r.session_id,
                r.state,
                r.runtime,
                r.container,
                r.created_secs_ago
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn prune(config: Config) -> anyhow::Result<ExitCode> {
    let sandbox = sandbox_of(config)?;
    let report = sandbox.prune().await.map_err(|e| anyhow::anyhow!("{e}"))?;
    out!("removed {} containers, {} volumes", report.containers.len(), report.volumes.len());
    for c in report.containers {
        out!("  container {c}");
    }
    for v in report.volumes {
        out!("  volume {v}");
    }
    for h in &report.unreachable_hosts {
        eprintln!("warning: not pruned: {h}");
    }
    Ok(ExitCode::SUCCESS)
}
