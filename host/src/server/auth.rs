//! Bearer-token authentication and who a request acts as.
//!
//! Every token belongs to a [`Principal`]: the named principals of `server.principals`
//! (token in the variable each names, with a role), and each token of the variable named
//! by `server.tokens_env` (comma-separated) as an `admin` principal `token<N>`. Without
//! any token the API is open — every request is the admin `api` — so [`check_bind`]
//! refuses every address but loopback. What a principal may see and do is decided here
//! ([`Principal::owns`], [`Principal::may_decide_for`], [`Principal::user_for`]); the
//! handlers ask.

use std::net::SocketAddr;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{ApiError, AppState};
use crate::config::{Role, ServerConfig};

/// Paths served without a token (liveness and readiness probes; neither names a path,
/// an error text or anything of a task).
const PUBLIC_PATHS: [&str; 2] = ["/healthz", "/readyz"];

/// Tokens from `var`: comma-separated, blanks ignored.
pub fn tokens_from_env(var: &str) -> Vec<String> {
    split_tokens(std::env::var(var).ok())
}

fn split_tokens(value: Option<String>) -> Vec<String> {
    value.map(|v| crate::config::split_list(&v).map(str::to_owned).collect()).unwrap_or_default()
}

/// An open API (no tokens) may only listen on loopback.
pub fn check_bind(addr: &SocketAddr, tokens: &[String], tokens_env: &str) -> anyhow::Result<()> {
    if tokens.is_empty() && !addr.ip().is_loopback() {
        anyhow::bail!(
            "refusing to listen on {addr} without authentication: set bearer tokens in ${tokens_env} \
             (comma-separated) or server.principals, or listen on a loopback address such as 127.0.0.1"
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

/// Who a request acts as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Recorded on its tasks and decisions (decisions are audited as `user:<name>`).
    pub name: String,
    pub role: Role,
    /// Users whose approvals an approver may decide.
    pub approves: Vec<String>,
    /// The `user_id` its tasks and files default to: its name, or `default` for the
    /// `tokens_env` admins and the open API (as before principals existed).
    pub default_user: String,
}

impl Principal {
    /// A named principal of `server.principals`.
    pub fn named(name: &str, role: Role, approves: Vec<String>) -> Self {
        Principal { name: name.to_owned(), role, approves, default_user: name.to_owned() }
    }

    /// An admin without a user of its own (`tokens_env` tokens, the open API).
    pub fn admin(name: &str) -> Self {
        Principal {
            name: name.to_owned(),
            role: Role::Admin,
            approves: vec![],
            default_user: crate::engine::DEFAULT_USER.into(),
        }
    }

    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// What this principal's approvals may change: only an admin's may hold `always` (a
    /// rule for every user, [`warden_approval::Authority::may_grant`]).
    pub fn authority(&self) -> warden_approval::Authority {
        if self.is_admin() { warden_approval::Authority::Admin } else { warden_approval::Authority::User }
    }

    /// The user whose tasks a listing of this principal asks the store for: its own
    /// user's alone, or every user's (`None`) for an admin.
    pub fn listing_user(&self) -> Option<String> {
        if self.is_admin() { None } else { Some(self.default_user.clone()) }
    }

    /// Whether the tasks, events, files and sessions of `user_id` are this principal's to see.
    pub fn owns(&self, user_id: &str) -> bool {
        self.is_admin() || user_id == self.default_user
    }

    /// Whether this principal may see and decide the approvals of `user_id`'s tasks.
    pub fn may_decide_for(&self, user_id: &str) -> bool {
        self.owns(user_id) || (self.role == Role::Approver && self.approves.iter().any(|u| u == user_id))
    }

    /// The user a request acts as: `requested`, or the principal's own by default. Only an
    /// admin may name another user.
    pub fn user_for(&self, requested: Option<String>) -> Result<String, ApiError> {
        match requested {
            None => Ok(self.default_user.clone()),
            Some(u) if self.owns(&u) => Ok(u),
            Some(u) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "user_not_allowed",
                format!("principal `{}` may not act as user `{u}`", self.name),
            )),
        }
    }
}

/// Every (token, principal) the server accepts: `server.principals` (tokens from the
/// variable each names) then `tokens_env`'s tokens as admins `token<N>`. A principal whose
/// variable is unset cannot sign in (warned). One token for two principals is an error.
pub fn credentials(server: &ServerConfig) -> anyhow::Result<Vec<(String, Principal)>> {
    credentials_from(server, |var| std::env::var(var).ok())
}

/// [`credentials`] with the environment read through `env` (tests).
pub fn credentials_from(
    server: &ServerConfig,
    env: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<Vec<(String, Principal)>> {
    let mut out: Vec<(String, Principal)> = vec![];
    for p in &server.principals {
        let tokens = split_tokens(env(&p.token_env));
        if tokens.is_empty() {
            tracing::warn!(principal = %p.name, token_env = %p.token_env, "no token in the variable; this principal cannot sign in");
        }
        for t in tokens {
            out.push((t, Principal::named(&p.name, p.role, p.approves.clone())));
        }
    }
    for (i, t) in split_tokens(env(&server.tokens_env)).into_iter().enumerate() {
        out.push((t, Principal::admin(&format!("{}{}", crate::actor::TOKEN_PREFIX, i + 1))));
    }
    for (i, (t, p)) in out.iter().enumerate() {
        if let Some((_, q)) = out[..i].iter().find(|(u, _)| u == t) {
            anyhow::bail!(
                "principals `{}` and `{}` have the same token; each token must name one principal",
                q.name,
                p.name
            );
        }
    }
    Ok(out)
}

/// Whether `host` (a `Host` header value, or an `Origin`'s authority) names this machine's
/// loopback interface: `localhost`, `127.0.0.1` or `[::1]`, with any port.
fn is_loopback_authority(authority: &str) -> bool {
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some(split) => split,
            None => return false,
        },
        None => match authority.rsplit_once(':') {
            Some((h, _)) => (h, &authority[h.len()..]),
            None => (authority, ""),
        },
    };
    let port_ok = port.is_empty()
        || port
            .strip_prefix(':')
            .is_some_and(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    port_ok && matches!(host.to_ascii_lowercase().as_str(), "localhost" | "127.0.0.1" | "::1")
}

/// Why an unauthenticated request may not reach the open API: the open API is an admin
/// to whoever reaches it, so only this machine's own clients may. A page the user's
/// browser shows can still send requests to 127.0.0.1: through DNS rebinding (its own
/// name, resolving to 127.0.0.1, in `Host`) or cross-site (a foreign `Origin`). Both are
/// refused here, for every route (`/mcp` included).
fn open_api_refusal(req: &Request) -> Option<&'static str> {
    let header = |name: &str| req.headers().get(name).map(|v| v.to_str().unwrap_or("\u{fffd}"));
    match header("host").or(req.uri().authority().map(|a| a.as_str())) {
        Some(host) if is_loopback_authority(host) => {}
        _ => return Some("without tokens the API answers only requests for localhost, 127.0.0.1 or [::1] (Host)"),
    }
    if let Some(origin) = header("origin") {
        let authority = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://"));
        if !authority.is_some_and(is_loopback_authority) {
            return Some("without tokens the API refuses requests from web pages of other origins (Origin)");
        }
    }
    None
}

pub async fn require_token(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    if state.credentials.is_empty() {
        if let Some(why) = open_api_refusal(&req) {
            return ApiError::new(StatusCode::FORBIDDEN, "forbidden_origin", why).into_response();
        }
        req.extensions_mut().insert(Principal::admin(crate::actor::OPEN_API));
        return next.run(req).await;
    }
    // The console's static page and assets; every API call it makes carries the token.
    if PUBLIC_PATHS.contains(&req.uri().path()) || super::ui::is_ui_path(req.uri().path()) {
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
            req.extensions_mut().insert(state.credentials[i].1.clone());
            next.run(req).await
        }
        None => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            if given.is_some() {
                "invalid bearer token"
            } else {
                "missing bearer token (Authorization: Bearer <token>)"
            },
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(host: Option<&str>, origin: Option<&str>) -> Request {
        let mut b = axum::http::Request::builder().method("POST").uri("/v1/tasks");
        if let Some(h) = host {
            b = b.header("host", h);
        }
        if let Some(o) = origin {
            b = b.header("origin", o);
        }
        b.body(axum::body::Body::empty()).unwrap()
    }

    #[test]
    fn the_open_api_answers_only_loopback_hosts_and_origins() {
        for host in ["127.0.0.1", "127.0.0.1:7878", "localhost:1", "LOCALHOST", "[::1]:7878", "[::1]"] {
            assert_eq!(open_api_refusal(&request(Some(host), None)), None, "{host}");
            assert_eq!(open_api_refusal(&request(Some(host), Some("http://localhost:3000"))), None, "{host}");
        }
        for host in [
            "attacker.example",
            "attacker.example:7878",
            "127.0.0.1.attacker.example",
            "localhost.attacker.example:7878",
            "[::1].attacker.example",
            "127.0.0.2",
            "0.0.0.0:7878",
            "127.0.0.1:80:80x",
            "",
        ] {
            assert!(open_api_refusal(&request(Some(host), None)).is_some(), "{host:?}");
        }
        assert!(open_api_refusal(&request(None, None)).is_some(), "no Host");
        for origin in [
            "http://attacker.example",
            "null",
            "http://127.0.0.1.attacker.example",
            "file://",
            "https://localhost.evil:1",
        ] {
            assert!(open_api_refusal(&request(Some("127.0.0.1:7878"), Some(origin))).is_some(), "{origin}");
        }
    }
}
