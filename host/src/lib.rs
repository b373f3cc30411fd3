//! warden: a WebAssembly plugin host for sandboxed subagent executors.
//!
//! Layout: [`config`] (warden.yaml) → [`runtime`] (engine, limits, host imports) with
//! [`capability`] (the one grant checker) and [`services`] (what imports use) →
//! [`registry`] (plugins, kinds, definitions) fed by [`plugin_dir`] (hot reload) →
//! [`task`] (running a TaskCall) → [`cli`] (the `warden` binary's commands).

pub mod capability;
pub mod cli;
pub mod config;
pub mod plugin;
pub mod plugin_dir;
pub mod registry;
pub mod runtime;
pub mod services;
pub mod task;

pub use config::Config;
pub use plugin::{GuestError, SubagentDefinition, SubagentReference, TaskCall, TaskContext};
pub use registry::Registry;
pub use runtime::{CallError, LoadedPlugin, Runtime, RuntimeOptions};

use std::sync::Arc;

/// Builds the runtime and registry for `config` and loads the plugin directory.
/// The composition root shared by every command.
pub async fn start(config: Config) -> anyhow::Result<Arc<Registry>> {
    let config = Arc::new(config);
    let roots = config.subagents.agent_dirs.iter().map(|d| config.path(d)).collect();
    let services = Arc::new(services::HostServices::new(roots));
    let fuel = config.plugins.limits.fuel.is_some() || config.plugins.limit_overrides.values().any(|o| o.fuel.is_some());
    let runtime = Runtime::new(
        RuntimeOptions { cache_dir: Some(config.path(&config.plugins.cache_dir)), fuel },
        services,
    )?;
    let registry = Arc::new(Registry::new(Arc::new(runtime), config));
    registry.load_all().await;
    Ok(registry)
}
