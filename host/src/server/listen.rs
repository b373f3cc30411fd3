//! The API's accept loop: every TCP connection passes one admission point before a byte
//! of it is read. At most `server.max_connections` are open at once (more wait in the
//! kernel's backlog until one closes), and a request head must arrive in full within
//! `server.header_read_timeout` (hyper's HTTP/1 timer; it also closes a keep-alive
//! connection idle that long). It serves the router it is given and never looks at a
//! request: authentication and everything after it are the router's.
//!
//! Regression: `axum::serve` installs no timer, so hyper's header-read timeout never ran
//! and nothing capped connections: a client that never finished its request head (no
//! token needed, authentication runs on a complete head) held its connection forever, and
//! a few thousand of them took every file descriptor of the process — the task store, the
//! Docker client and the egress proxies with them.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// How long the loop waits after a failed `accept` (out of file descriptors, say) before
/// trying again, instead of spinning on the error.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// What one connection may hold (`server.max_connections`, `server.header_read_timeout`).
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
}

/// Serves `app` on `listener` within `limits` until `shutdown` resolves; then stops
/// accepting, lets each connection finish the request it is serving, and returns once all
/// have closed (long-lived streams end through the server's shutdown token).
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = open.clone().acquire_owned() => permit.expect("the connection semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a connection; retrying");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Event streams and MCP/SSE replies are written in small pieces: without NODELAY,
        // Nagle's algorithm held each behind the peer's delayed ACK (~40 ms per MCP call).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let conn = graceful.watch(http.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(app.clone())));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
