//! `warden serve` (the HTTP API) and `warden tool-schema` (the Task / TaskOutput tool
//! definitions for parent agents).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;

use crate::config::{Config, StoreLocation};
use crate::engine::{Engine, EngineOptions};
use crate::server::{self, ServerState};
use crate::store::Store;

pub async fn serve(mut config: Config, addr: Option<String>, replica_id: Option<String>) -> anyhow::Result<ExitCode> {
    if let Some(id) = replica_id {
        if !crate::config::valid_replica_id(&id) {
            eprintln!(
                "error: --replica-id {:?}: expected 1-64 characters of [A-Za-z0-9_.-]",
                crate::text::escape_control(&id)
            );
            return Ok(ExitCode::from(super::EXIT_USAGE));
        }
        config.server.replica_id = Some(id);
    }
    if matches!(config.store.location(), StoreLocation::Postgres(_)) {
        // A replica named explicitly shares its sandbox scope with the others: it labels
        // what it creates and leaves theirs alone. Without an explicit id the server is
        // taken for the database's only one, as before replicas.
        config.sandbox.replica_id = config.server.replica_id.clone();
    }
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
    let drain_timeout = config.server.drain_timeout;
    let (engine, _watch) = start_engine(config).await?;
    let state = Arc::new(ServerState::with_credentials(engine.clone(), credentials));
    let draining = engine.clone();
    let shutdown = async move {
        shutdown_signal().await;
        tokio::select! {
            _ = drain(&draining, drain_timeout) => {}
            // A second signal: stop now (the sandboxes are still ended).
            _ = shutdown_signal() => eprintln!("warden: second signal: not waiting for tasks"),
        }
    };
    server::serve(state, addr, shutdown).await?;
    end_sandboxes(&engine).await;
    Ok(ExitCode::SUCCESS)
}

/// The graceful part of a shutdown: no new tasks, `/readyz` says `draining`, and the
/// queued and running tasks get up to `server.drain_timeout` to finish while the API
/// keeps serving their events, approvals and cancels. A second SIGTERM or Ctrl-C cuts
/// it short.
async fn drain(engine: &Engine, timeout: std::time::Duration) {
    let unfinished = engine.unfinished();
    if unfinished > 0 {
        eprintln!(
            "warden: draining: waiting up to {} for {unfinished} task(s) (server.drain_timeout)",
            humantime::format_duration(timeout)
        );
    }
    let left = engine.drain(timeout).await;
    if left > 0 {
        match engine.replica_id() {
            Some(_) => tracing::warn!(
                unfinished = left,
                "drain timed out; another replica ends these tasks failed (replica lost) once their leases lapse, or this one (host restarted) when it starts again"
            ),
            None => tracing::warn!(
                unfinished = left,
                "drain timed out; these tasks end failed (host restarted) at the next start"
            ),
        }
        eprintln!("warden: {left} task(s) still running after server.drain_timeout; stopping anyway");
    }
}

/// `warden mcp`: the MCP server on stdin/stdout for a parent agent that launches warden
/// (stdout carries only MCP; everything else goes to stderr). Its tasks run as the local
/// user. With `api`, the HTTP API is served alongside, where approvals the client cannot
/// answer (no elicitation) wait for a person; without it they are declined at once.
pub async fn mcp_stdio(config: Config, api: Option<String>) -> anyhow::Result<ExitCode> {
    use rmcp::ServiceExt;
    let api_addr: Option<SocketAddr> = match api.as_deref().map(str::parse) {
        None => None,
        Some(Ok(a)) => Some(a),
        Some(Err(e)) => {
            eprintln!(
                "error: --api {:?} is not an IP address and port ({e}), e.g. 127.0.0.1:7878",
                api.unwrap_or_default()
            );
            return Ok(ExitCode::from(super::EXIT_USAGE));
        }
    };
    let credentials = server::credentials(&config.server)?;
    let (engine, _watch) = start_engine(config).await?;
    let state = Arc::new(ServerState::with_credentials(engine.clone(), credentials));
    let local = server::Principal {
        default_user: super::LOCAL_USER.into(),
        ..server::Principal::admin(crate::actor::MCP_STDIO)
    };
    let front = server::mcp::McpFront::for_stdio(state.clone(), local, api_addr.is_some());
    let stop = state.shutdown.clone();
    let api_task = api_addr.map(|addr| {
        let state = state.clone();
        let stop = stop.clone();
        tokio::spawn(async move { server::serve(state, addr, stop.cancelled_owned()).await })
    });
    // The client ends the session by closing stdin, and kills the process a few seconds
    // later (the official SDKs: 2 s, then SIGTERM, 2 s, SIGKILL): the sandboxes are ended
    // at once on EOF instead of after rmcp's drain of in-flight calls.
    let eof = tokio_util::sync::CancellationToken::new();
    let stdin = EofSignal { inner: tokio::io::stdin(), eof: eof.clone() };
    let running = front
        .serve_with_ct((stdin, tokio::io::stdout()), stop.child_token())
        .await
        .with_context(|| "the MCP client did not complete the start of the session on stdin")?;
    tracing::info!("warden MCP server on stdio");
    tokio::select! {
        r = running.waiting() => if let Err(e) = r { tracing::warn!(error = %e, "MCP session ended abnormally") },
        _ = eof.cancelled() => tracing::info!("the MCP client closed stdin"),
        _ = shutdown_signal() => {}
    }
    stop.cancel();
    // The client kills this process a few seconds after closing stdin: the sandboxes go
    // while the approvals API stops, not after.
    let api_stopped = async {
        if let Some(t) = api_task {
            match t.await {
                Ok(Err(e)) => eprintln!("error: approvals API: {e:#}"),
                Err(e) => eprintln!("error: approvals API: {e}"),
                Ok(Ok(())) => {}
            }
        }
    };
    tokio::join!(api_stopped, end_sandboxes(&engine));
    Ok(ExitCode::SUCCESS)
}

/// stdin that reports its end (a read of 0 bytes) on `eof`.
struct EofSignal {
    inner: tokio::io::Stdin,
    eof: tokio_util::sync::CancellationToken,
}

impl tokio::io::AsyncRead for EofSignal {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Ok(())) = &polled
            && buf.filled().len() == before
            && buf.remaining() > 0
        {
            self.eof.cancel();
        }
        polled
    }
}

/// The composition root of a long-running warden: store, plugins (watched when
/// configured), engine.
async fn start_engine(config: Config) -> anyhow::Result<(Arc<Engine>, Option<crate::plugin_dir::PluginDirWatch>)> {
    let store = match config.store.location() {
        StoreLocation::File(path) => {
            Store::open(&config.path(&path)).with_context(|| "cannot open the task store (store.path)")?
        }
        StoreLocation::Postgres(url) => {
            Store::connect(&url).await.with_context(|| "cannot open the task store (store.url)")?
        }
    };
    tracing::info!(store = %store.location(), "task store open");
    let options = EngineOptions::from_config(&config);
    let watch = config.plugins.watch;
    let host = crate::app::Host::start(config).await?;
    // Plugin state persists with the tasks, so `resume` survives a restart.
    host.services.state.attach(store.clone()).await.with_context(|| "cannot load plugin state from the task store")?;
    let watcher = if watch { Some(crate::plugin_dir::watch(host.registry.clone())?) } else { None };
    let engine = Engine::start(&host, store, options).await?;
    Ok((engine, watcher))
}

/// Stops this process's sandbox sessions on the way out.
async fn end_sandboxes(engine: &Engine) {
    if let Ok(sandbox) = engine.tools().sandbox()
        && let Err(e) = sandbox.shutdown().await
    {
        tracing::warn!(error = %e, "sandbox shutdown incomplete");
    }
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
    let host = crate::app::Host::start(config).await?;
    let schema = crate::engine::tool_schema(&host.registry.snapshot());
    out!("{}", serde_json::to_string_pretty(&schema)?);
    Ok(ExitCode::SUCCESS)
}
