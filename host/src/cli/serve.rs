//! `warden serve` (the HTTP API) and `warden tool-schema` (the Task / TaskOutput tool
//! definitions for parent agents).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;

use crate::config::Config;
use crate::engine::{Engine, EngineOptions};
use crate::server::{self, ServerState};
use crate::store::Store;

pub async fn serve(config: Config, addr: Option<String>) -> anyhow::Result<ExitCode> {
    let text = addr.unwrap_or_else(|| config.server.addr.clone());
    let addr: SocketAddr = match text.parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: server.addr {text:?} is not an IP address and port ({e}), e.g. 127.0.0.1:7878");
            return Ok(ExitCode::from(super::EXIT_USAGE));
        }
    };
    let credentials = server::credentials(&config.server)?;
    let tokens: Vec<String> = credentials.iter().map(|(t, _)| t.clone()).collect();
    if let Err(e) = server::check_bind(&addr, &tokens, &config.server.tokens_env) {
        eprintln!("error: {e}");
        return Ok(ExitCode::from(super::EXIT_USAGE));
    }
    let store_path = config.path(&config.store.path);
    let store = Store::open(&store_path).with_context(|| "cannot open the task store (store.path)")?;
    let options = EngineOptions::from_config(&config);
    let watch = config.plugins.watch;
    let registry = crate::start(config).await?;
    // Plugin state persists with the tasks, so `resume` survives a restart.
    registry.runtime().services().state.attach(store.clone()).with_context(|| "cannot load plugin state from the task store")?;
    let _watch = if watch { Some(crate::plugin_dir::watch(registry.clone())?) } else { None };
    let engine = Engine::start(registry.clone(), store, options).await?;
    let state = Arc::new(ServerState::with_credentials(engine, credentials));
    server::serve(state, addr, shutdown_signal()).await?;
    if let Some(tools) = &registry.runtime().services().tools
        && let Ok(sandbox) = tools.sandbox()
        && let Err(e) = sandbox.shutdown().await
    {
        tracing::warn!(error = %e, "sandbox shutdown incomplete");
    }
    Ok(ExitCode::SUCCESS)
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    eprintln!("warden: shutting down");
}

pub async fn tool_schema(config: Config) -> anyhow::Result<ExitCode> {
    let registry = crate::start(config).await?;
    let schema = crate::engine::tool_schema(&registry.snapshot());
    println!("{}", serde_json::to_string_pretty(&schema)?);
    Ok(ExitCode::SUCCESS)
}
