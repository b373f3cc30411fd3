//! Bearer-token authentication. Tokens come from the environment variable named by
//! `server.tokens_env` (comma-separated). Without tokens the API is open, so
//! [`check_bind`] refuses every address but loopback.

use std::net::SocketAddr;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{AppState, ApiError};

/// Paths served without a token (liveness probes).
const PUBLIC_PATHS: [&str; 1] = ["/healthz"];

/// Tokens from `var`: comma-separated, blanks ignored.
pub fn tokens_from_env(var: &str) -> Vec<String> {
    std::env::var(var)
        .map(|v| v.split(',').map(str::trim).filter(|t| !t.is_empty()).map(str::to_owned).collect())
        .unwrap_or_default()
}

/// An open API (no tokens) may only listen on loopback.
pub fn check_bind(addr: &SocketAddr, tokens: &[String], tokens_env: &str) -> anyhow::Result<()> {
    if tokens.is_empty() && !addr.ip().is_loopback() {
        anyhow::bail!(
            "refusing to listen on {addr} without authentication: set bearer tokens in ${tokens_env} \
             (comma-separated) or listen on a loopback address such as 127.0.0.1"
        );
    }
    Ok(())
}

/// Equality whose time depends only on the lengths, not on where the bytes differ.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        diff |= (a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0)) as usize;
    }
    diff == 0
}

/// The index of the token `given` matches, checking every token (no early exit).
pub fn match_token(tokens: &[String], given: &str) -> Option<usize> {
    let mut found = None;
    for (i, t) in tokens.iter().enumerate() {
        if ct_eq(t.as_bytes(), given.as_bytes()) && found.is_none() {
            found = Some(i);
        }
    }
    found
}

/// Who made a request (approval decisions are audited with it).
#[derive(Debug, Clone)]
pub struct Caller(pub String);

pub async fn require_token(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    if state.tokens.is_empty() {
        req.extensions_mut().insert(Caller("api".into()));
        return next.run(req).await;
    }
    if PUBLIC_PATHS.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    match given.and_then(|g| match_token(&state.tokens, g)) {
        Some(i) => {
            req.extensions_mut().insert(Caller(format!("token{}", i + 1)));
            next.run(req).await
        }
        None => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            if given.is_some() { "invalid bearer token" } else { "missing bearer token (Authorization: Bearer <token>)" },
        )
        .into_response(),
    }
}
