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
        // Before anything can log, emit or answer: the host's own credentials are secrets.
        register_host_credentials(&config, redact::registry(), |name| std::env::var(name).ok());
        // Agent files (and the skills, hooks and MCP files next to them) are read from
        // the agent directories and the Claude Code plugin folders only.
        let roots =
            config.subagents.agent_dirs.iter().chain(&config.subagents.plugin_dirs).map(|d| config.path(d)).collect();

        let policy = warden_approval::Policy::from_config(config.approval.clone())
            .with_context(|| format!("{}: approval", config.source_name()))?;
        let audit = match &config.approval.audit_log {
            Some(p) => {
                let path = config.path(p);
                Some(Arc::new(
                    warden_approval::AuditLog::open(&path)
                        .with_context(|| format!("cannot open audit log {}", path.display()))?
                        // Operator text: a record's free-text fields (tool, subagent, plugin,
                        // rule, host) are rewritten only by its own session's values that
                        // could be secrets, never by a tenant's words (`Bash`, a name).
                        .with_filter(Arc::new(|owner: warden_approval::RecordOwner<'_>, text: &str| {
                            redact::registry().operator(owner.user_id, owner.session_id).scrub(text).into_owned()
                        })),
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
        let tools = Arc::new(
            ToolHost::new(sandbox, gate)
                .with_mcp(mcp_tools::McpTools::new(&config.mcp_servers).with_max_output(config.sandbox.max_output.0)),
        );
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
                ready_instances: config.plugins.ready_instances,
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

/// Registers the values of the credentials the host holds ([`Config::credential_envs`],
/// read with `env`) with `registry`'s scrubber ([`redact::SecretRegistry::remember_host`]):
/// scrubbed from every session's events, outputs and tool results and from every log.
/// A variable that is unset is skipped (the component that needs it reports that); one
/// that cannot be registered is logged by its configuration key, never its value.
pub fn register_host_credentials(
    config: &Config,
    registry: &redact::SecretRegistry,
    env: impl Fn(&str) -> Option<String>,
) {
    for crate::config::CredentialEnv { key, var, format } in config.credential_envs() {
        let Some(value) = env(&var).filter(|v| !v.is_empty()) else { continue };
        // Every text the host uses: the value as read, trimmed, and each item of a list.
        if let Err(e) = registry.remember_host(&format.values(&value)) {
            tracing::error!(key, variable = %var, error = %e, "a host credential cannot be registered for scrubbing");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regression_host_credentials_were_not_scrubbed_from_events_and_logs() {
        let yaml = "
mcp_servers:
  remote: { url: \"https://mcp.example.com/mcp\", auth_env: MCP_TOKEN }
plugins:
  grants:
    p: { http: [\"https://api.example.com\"], secrets: { key: { env: PARTNER_KEY, origins: [\"https://api.example.com\"] } } }
";
        let mut config = Config::from_yaml(yaml, std::path::Path::new("w.yaml")).unwrap();
        // Set after loading: loading would read the keys (and fail where they are unset).
        let provider = |kind, api_key_env| warden_models::ProviderConfig {
            kind,
            base_url: None,
            api_key_env,
            script: None,
            timeout: None,
        };
        use warden_models::{ApiKeyEnv, ProviderKind};
        config.models.providers = [
            ("claude".to_string(), provider(ProviderKind::Anthropic, ApiKeyEnv::Unset)),
            ("keyless".to_string(), provider(ProviderKind::Openai, ApiKeyEnv::Unset)),
            ("local".to_string(), provider(ProviderKind::Openai, ApiKeyEnv::Var("LOCAL_KEY".into()))),
            ("off".to_string(), provider(ProviderKind::Anthropic, ApiKeyEnv::None)),
        ]
        .into();
        let keys: Vec<String> = config.credential_envs().into_iter().map(|c| c.key).collect();
        assert_eq!(
            keys,
            [
                "mcp_servers.remote.auth_env",
                "plugins.grants.p.secrets.key.env",
                "models.providers.claude.api_key_env",
                "models.providers.local.api_key_env",
                "server.tokens_env",
            ]
        );
        let vars = [
            ("MCP_TOKEN", "mcp-bearer-token-1"),
            ("PARTNER_KEY", "partner-secret-2"),
            ("ANTHROPIC_API_KEY", "sk-ant-default-3"),
            ("LOCAL_KEY", " local-key-4\n"),
        ];
        let line = "mcp-bearer-token-1 partner-secret-2 sk-ant-default-3 local-key-4";
        assert_scrubbed(&config, &vars, line, "[redacted] [redacted] [redacted] [redacted]");
    }

    /// Registers `config`'s credentials with `vars` as the environment; `line` must come out
    /// as `want` in logs, in events and outputs of any session, and in tool results.
    fn assert_scrubbed(config: &Config, vars: &[(&str, &str)], line: &str, want: &str) {
        let env = |name: &str| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string());
        let registry = redact::SecretRegistry::default();
        register_host_credentials(config, &registry, env);
        assert_eq!(registry.operator_union().scrub(line), want, "logs of no session");
        assert_eq!(registry.operator(Some("u"), Some("s")).scrub(line), want, "logs and audit lines of a session");
        assert_eq!(registry.session("u", "s").scrub(line), want, "events and outputs of any session");
        assert_eq!(registry.host().scrub(line), want, "tool results");
    }

    #[test]
    fn regression_api_bearer_tokens_were_not_scrubbed_from_events_and_logs() {
        let yaml = "
server:
  tokens_env: ADMIN_TOKENS
  principals:
    - { name: alice, token_env: ALICE_TOKEN, role: user }
    - { name: ops, token_env: OPS_TOKEN, role: approver, approves: [alice] }
";
        let config = Config::from_yaml(yaml, std::path::Path::new("w.yaml")).unwrap();
        let envs: Vec<(String, String)> = config.credential_envs().into_iter().map(|c| (c.key, c.var)).collect();
        let pair = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        assert_eq!(
            envs,
            [
                pair("server.principals[0].token_env", "ALICE_TOKEN"),
                pair("server.principals[1].token_env", "OPS_TOKEN"),
                pair("server.tokens_env", "ADMIN_TOKENS"),
            ]
        );
        let vars = [
            // Comma-separated (rotation): each token is used, so scrubbed, alone.
            ("ALICE_TOKEN", " alice-old-token-1 , alice-new-token-2"),
            ("OPS_TOKEN", "ops-token-3\n"),
            ("ADMIN_TOKENS", "admin-token-4,admin-token-5"),
        ];
        // A token pasted into a prompt, echoed by a tool, logged in an error.
        let line = "prompt: alice-new-token-2; echo alice-old-token-1 ops-token-3 admin-token-5 admin-token-4";
        assert_scrubbed(&config, &vars, line, "prompt: [redacted]; echo [redacted] [redacted] [redacted] [redacted]");
    }
}
