//! warden: a WebAssembly plugin host for sandboxed subagent executors.
//!
//! Layout: [`config`] (warden.yaml) → [`runtime`] (engine, limits, host imports) with
//! [`capability`] (the one grant checker) and [`services`] (what imports use) →
//! [`registry`] (plugins, kinds, definitions) fed by [`plugin_dir`] (hot reload) →
//! [`task`] (running a TaskCall) → [`engine`] (background tasks, queue, cancel, persisted in
//! [`store`]) → [`server`] (the HTTP API) and [`cli`] (the `warden` binary's commands).

pub mod bounded_read;
pub mod capability;
pub mod cli;
pub mod config;
pub mod engine;
pub mod mcp_tools;
pub mod oci;
pub mod plugin;
pub mod plugin_dir;
pub mod provenance;
pub mod redact;
pub mod registry;
pub mod runtime;
pub mod server;
pub mod services;
pub mod store;
pub mod task;
pub mod text;
pub mod tools;

pub use config::Config;
pub use plugin::{GuestError, SubagentDefinition, SubagentReference, TaskCall, TaskContext};
pub use registry::Registry;
pub use runtime::{CallError, LoadedPlugin, Runtime, RuntimeOptions};

use std::sync::Arc;

/// Built-in Claude-format agents (general-purpose, Explore, Plan, Bash), registered
/// as `builtin://<name>` references when `subagents.builtin: true`.
pub const BUILTIN_AGENTS: [(&str, &str); 4] = [
    ("general-purpose", include_str!("../../plugins/claude/builtin/general-purpose.md")),
    ("Explore", include_str!("../../plugins/claude/builtin/Explore.md")),
    ("Plan", include_str!("../../plugins/claude/builtin/Plan.md")),
    ("Bash", include_str!("../../plugins/claude/builtin/Bash.md")),
];

/// The workspace root as sandbox tools see it; approval path rules resolve against it.
pub const SANDBOX_WORKSPACE: &str = "/workspace";

/// Builds the runtime and registry for `config` and loads the plugin directory.
/// The composition root shared by every command.
pub async fn start(config: Config) -> anyhow::Result<Arc<Registry>> {
    use anyhow::Context;
    let config = Arc::new(config);
    let roots = config.subagents.agent_dirs.iter().map(|d| config.path(d)).collect();

    let policy = warden_approval::Policy::from_config(config.approval.clone())
        .with_context(|| format!("{}: approval", config.source_name()))?;
    let audit = match &config.approval.audit_log {
        Some(p) => {
            let path = config.path(p);
            Some(Arc::new(
                warden_approval::AuditLog::open(&path)
                    .with_context(|| format!("cannot open audit log {}", path.display()))?
                    .with_filter(Arc::new(|line: &str| redact::registry().all().scrub(line).into_owned())),
            ))
        }
        None => None,
    };
    let eval =
        warden_approval::EvalContext { workspace_root: SANDBOX_WORKSPACE.into(), home: SANDBOX_WORKSPACE.into() };
    let mut gate = warden_approval::ApprovalGate::new(Arc::new(policy), eval, audit);
    if let Some(p) = &config.approval.overlay {
        let path = config.path(p);
        gate =
            gate.with_overlay(path.clone()).map_err(|e| anyhow::anyhow!("approval.overlay {}: {e}", path.display()))?;
    }
    // A credential's environment variable missing is a start failure, not a tool error.
    if let Some(egress) = &config.sandbox.egress {
        egress
            .resolve(|name| std::env::var(name).ok())
            .with_context(|| format!("{}: sandbox.egress", config.source_name()))?;
    }
    let sandbox = warden_sandbox::Sandbox::new(config.sandbox.clone()).map(Arc::new).map_err(|e| e.to_string());
    let tools = Arc::new(tools::ToolHost::new(sandbox, gate).with_mcp(mcp_tools::McpTools::new(&config.mcp_servers)));
    let models = warden_models::ModelRouter::from_config(&config.models, &config.base_dir)
        .map(Arc::new)
        .map_err(|e| e.to_string());
    let services =
        services::HostServices::new(roots).with_tools(tools).with_models(models).with_budgets(config.plugins.budgets);

    let fuel =
        config.plugins.limits.fuel.is_some() || config.plugins.limit_overrides.values().any(|o| o.fuel.is_some());
    let pool = config
        .plugins
        .pooled_instances
        .then(|| runtime::pool::PoolOptions::for_tasks(config.server.max_concurrent_tasks, config.max_plugin_memory()));
    let runtime = Runtime::new(
        RuntimeOptions {
            cache_dir: Some(config.path(&config.plugins.cache_dir)),
            fuel,
            pool,
            compiler: runtime::compiler::Compiler::default_for_start(config.plugins.compile_memory),
            tiered: config.plugins.tiered_compilation,
            tier_up_min_size: runtime::tier::TIER_UP_MIN_SIZE,
        },
        Arc::new(services),
    )?;
    let registry = Arc::new(Registry::new(Arc::new(runtime), config));
    registry.load_all().await;
    Ok(registry)
}
