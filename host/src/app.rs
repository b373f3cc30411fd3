//! The composition root: [`Host::start`] turns a validated [`Config`] into the running
//! parts, in one place and one order — approval gate (policy, audit log, overlay) →
//! sandbox → tool host (sandbox tools, MCP servers) → model router → host services →
//! WebAssembly runtime → registry (plugin directory loaded). The CLI and the HTTP server
//! receive a [`Host`] and reach every part through its fields, never through chains into
//! the runtime. This module wires; it holds no business rules.

use std::sync::Arc;

use anyhow::Context;

use crate::config::Config;
use crate::registry::Registry;
use crate::runtime::{Runtime, RuntimeOptions};
use crate::services::HostServices;
use crate::tools::ToolHost;
use crate::{mcp_tools, redact, runtime};

/// The workspace root as sandbox tools see it; approval path rules resolve against it.
pub const SANDBOX_WORKSPACE: &str = "/workspace";

/// Everything a command or the server needs, built once by [`Host::start`].
#[derive(Clone)]
pub struct Host {
    /// The configuration everything was built from.
    pub config: Arc<Config>,
    /// Plugins, kinds and definitions (the plugin directory is loaded).
    pub registry: Arc<Registry>,
    /// The tools subagents call: sandbox file and shell tools, MCP tools, the approval gate.
    pub tools: Arc<ToolHost>,
    /// What plugin imports use (tools, models, plugin state, budgets), shared by every call.
    pub services: Arc<HostServices>,
}

impl Host {
    /// Builds the gate, sandbox, tools, models, runtime and registry for `config` and
    /// loads the plugin directory. A missing credential or an unreadable policy file is
    /// a start failure naming the config field; a Docker engine that cannot be reached
    /// is not (sandbox tools then fail with that reason).
    pub async fn start(config: Config) -> anyhow::Result<Host> {
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
            gate = gate
                .with_overlay(path.clone())
                .map_err(|e| anyhow::anyhow!("approval.overlay {}: {e}", path.display()))?;
        }
        // A credential's environment variable missing is a start failure, not a tool error.
        if let Some(egress) = &config.sandbox.egress {
            egress
                .resolve(|name| std::env::var(name).ok())
                .with_context(|| format!("{}: sandbox.egress", config.source_name()))?;
        }
        let sandbox = warden_sandbox::Sandbox::new(config.sandbox.clone()).map(Arc::new).map_err(|e| e.to_string());
        let tools = Arc::new(ToolHost::new(sandbox, gate).with_mcp(mcp_tools::McpTools::new(&config.mcp_servers)));
        let models = warden_models::ModelRouter::from_config(&config.models, &config.base_dir)
            .map(Arc::new)
            .map_err(|e| e.to_string());
        let services = Arc::new(
            HostServices::new(roots).with_tools(tools.clone()).with_models(models).with_budgets(config.plugins.budgets),
        );

        let fuel =
            config.plugins.limits.fuel.is_some() || config.plugins.limit_overrides.values().any(|o| o.fuel.is_some());
        let pool = config.plugins.pooled_instances.then(|| {
            runtime::pool::PoolOptions::for_chains(
                config.server.max_concurrent_tasks,
                config.subagents.max_depth as usize,
                config.max_plugin_memory(),
            )
        });
        let runtime = Runtime::new(
            RuntimeOptions {
                cache_dir: Some(config.path(&config.plugins.cache_dir)),
                fuel,
                pool,
                compiler: runtime::compiler::Compiler::default_for_start(config.plugins.compile_memory),
                tiered: config.plugins.tiered_compilation,
                tier_up_min_size: runtime::tier::TIER_UP_MIN_SIZE,
            },
            services.clone(),
        )?;
        let registry = Arc::new(Registry::new(Arc::new(runtime), config.clone()));
        registry.load_all().await;
        Ok(Host { config, registry, tools, services })
    }

    /// The sandbox, or why it is unavailable (no Docker engine reachable, bad settings).
    pub fn sandbox(&self) -> Result<&Arc<warden_sandbox::Sandbox>, &str> {
        self.tools.sandbox()
    }
}
