//! The one builder of the host's outbound HTTP clients: [`builder`] for servers it does
//! not control (plugin requests, remote MCP servers), [`operator_builder`] for an endpoint
//! the operator named (the CLI's `--url`). Every client is built here, so the hardening is
//! the same everywhere and cannot be forgotten at a new call site.
//!
//! - **No automatic redirects.** A redirect is a new request to a URL the server chose:
//!   followed blindly it reaches an address no check saw (SSRF) and carries the request's
//!   credentials to another origin. Callers that follow redirects do it by hand, checking
//!   each hop (the `http` capability); the others treat a redirect as the answer.
//! - **No proxy from the environment** (`HTTP_PROXY`, `ALL_PROXY`…) for servers the host
//!   does not control: a proxy would resolve names where the address check cannot see, and
//!   would receive the credentials. An operator-named endpoint has no address check and the
//!   operator may only reach it through their proxy, so [`operator_builder`] keeps them.
//! - **A connect timeout**, whatever the caller's deadline.
//!
//! This module only builds clients; it decides nothing about where they may go.

use std::time::Duration;

/// Connection timeout for outbound HTTP: a peer that does not accept within this
/// is down, whatever the call's deadline.
pub const HTTP_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A client builder with the host's hardening for servers it does not control (see the
/// module docs). Add a resolver or timeouts, then build.
pub fn builder() -> reqwest::ClientBuilder {
    operator_builder().no_proxy()
}

/// A client builder for an endpoint the operator named (a running `warden serve`): no
/// automatic redirects (the request's token must not follow one) and a connect timeout,
/// but the environment's proxy settings apply. Add timeouts, then build.
pub fn operator_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(HTTP_CONNECT_TIMEOUT)
        .user_agent(concat!("warden/", env!("CARGO_PKG_VERSION")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers `direct` at `/`, and redirects `/moved` to `/`.
    async fn server() -> std::net::SocketAddr {
        use axum::response::Redirect;
        let app = axum::Router::new()
            .route("/", axum::routing::get(|| async { "direct" }))
            .route("/moved", axum::routing::get(|| async { Redirect::temporary("/") }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    }

    #[tokio::test]
    async fn redirects_are_answers_and_environment_proxies_are_not_used() {
        let target = server().await;
        // A "proxy" that accepts and never answers: a request sent through it times out.
        let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
        const VARS: [&str; 4] = ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"];
        // SAFETY: set only while this one client is built, removed right after.
        unsafe { VARS.iter().for_each(|v| std::env::set_var(v, &proxy_url)) };
        let client = builder().timeout(Duration::from_secs(5)).build().unwrap();
        unsafe { VARS.iter().for_each(|v| std::env::remove_var(v)) };
        let direct = client.get(format!("http://{target}/")).send().await.expect("not sent through the proxy");
        assert_eq!(direct.text().await.unwrap(), "direct");
        let moved = client.get(format!("http://{target}/moved")).send().await.unwrap();
        assert_eq!(moved.status(), reqwest::StatusCode::TEMPORARY_REDIRECT, "the redirect is the answer");
    }
}
