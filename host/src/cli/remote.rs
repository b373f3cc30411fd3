//! Operations on a running `warden serve` through its HTTP API, for people without a
//! browser: `warden approvals` (list, approve, decline), `warden sandbox end` (one
//! session, or every session idle longer than a duration) and `warden task journal`. The server is `--url`
//! (or `WARDEN_URL`, default `http://` + `server.addr`); the bearer token comes from
//! `WARDEN_TOKEN` only — never from the command line, where `ps` would show it.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};

use super::{EXIT_TASK_FAILED, EXIT_USAGE};
use crate::config::Config;
use crate::text::escape_control as esc;

/// The environment variable holding the bearer token for the API.
pub const TOKEN_ENV: &str = "WARDEN_TOKEN";
/// Longest one API request of these commands may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// `--url` for the commands that talk to a running server.
#[derive(clap::Args, Debug, Clone)]
pub struct ApiArgs {
    /// The running `warden serve` (default: http:// + server.addr of the configuration).
    /// The bearer token is read from $WARDEN_TOKEN.
    #[arg(long, env = "WARDEN_URL", value_name = "URL", global = true)]
    pub url: Option<String>,
}

/// What went wrong talking to the server: the exit code says whose fault.
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn exit(self) -> ExitCode {
        eprintln!("error: {}", esc(&self.message));
        ExitCode::from(self.code)
    }
}

/// A client of one server's API.
struct Api {
    base: String,
    token: Option<String>,
    client: reqwest::Client,
}

impl Api {
    fn new(config: &Config, args: &ApiArgs) -> anyhow::Result<Api> {
        let base = match &args.url {
            Some(u) => u.trim_end_matches('/').to_owned(),
            None => format!("http://{}", local_authority(&config.server.addr)),
        };
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            anyhow::bail!("--url must start with http:// or https://, got {base:?}");
        }
        let token = std::env::var(TOKEN_ENV).ok().map(|t| t.trim().to_owned()).filter(|t| !t.is_empty());
        // No redirects: the bearer token must never travel to a location the server chose.
        let client = crate::http_client::operator_builder().timeout(REQUEST_TIMEOUT).build().context("HTTP client")?;
        Ok(Api { base, token, client })
    }

    /// One request; a JSON answer on 2xx, else the server's `{error: {code, message}}`.
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value, Failure> {
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.header(reqwest::header::CONTENT_TYPE, "application/json").body(b.to_string());
        }
        let resp = req.send().await.map_err(|e| Failure {
            code: EXIT_USAGE,
            message: format!("no answer from warden serve at {} (--url, WARDEN_URL): {e}", self.base),
        })?;
        let status = resp.status();
        if status.is_redirection() {
            let location = resp.headers().get(reqwest::header::LOCATION);
            let location = location.map_or("(no Location header)".into(), |l| String::from_utf8_lossy(l.as_bytes()));
            return Err(Failure {
                code: EXIT_USAGE,
                message: format!(
                    "warden serve at {} answered HTTP {status} redirecting to {location}; redirects are not \
                     followed (the token would go with it): pass the final address as --url (or WARDEN_URL)",
                    self.base
                ),
            });
        }
        let text = resp.text().await.unwrap_or_default();
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(value);
        }
        let code = value["error"]["code"].as_str().unwrap_or("http_error");
        let message = value["error"]["message"].as_str().map(str::to_owned).unwrap_or_else(|| status.to_string());
        let hint = if status == reqwest::StatusCode::UNAUTHORIZED {
            format!(" (set ${TOKEN_ENV} to a token of the server)")
        } else {
            String::new()
        };
        // Unreachable or unauthorised: the invocation is wrong; anything else: the operation failed.
        let exit = if status == reqwest::StatusCode::UNAUTHORIZED { EXIT_USAGE } else { EXIT_TASK_FAILED };
        Err(Failure { code: exit, message: format!("{code}: {message}{hint}") })
    }
}

/// `server.addr` as a place to connect to: an unspecified address (`0.0.0.0`, `[::]`)
/// means this machine's loopback.
fn local_authority(addr: &str) -> String {
    match addr.parse::<std::net::SocketAddr>() {
        Ok(a) if a.ip().is_unspecified() => format!("127.0.0.1:{}", a.port()),
        _ => addr.to_owned(),
    }
}

/// A path segment for an id typed by the operator.
fn segment(id: &str) -> String {
    percent_encoding::utf8_percent_encode(id, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// `warden approvals [list]`: the pending approvals the token's principal may decide.
pub async fn approvals_list(config: Config, args: ApiArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    let api = Api::new(&config, &args)?;
    let v = match api.call(reqwest::Method::GET, "/v1/approvals", None).await {
        Ok(v) => v,
        Err(f) => return Ok(f.exit()),
    };
    let list = v["approvals"].as_array().cloned().unwrap_or_default();
    if json_out {
        out!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(ExitCode::SUCCESS);
    }
    if list.is_empty() {
        out!("no pending approvals");
    }
    let s = |a: &Value, k: &str| esc(a[k].as_str().unwrap_or("-")).into_owned();
    for a in &list {
        let scopes: Vec<&str> = a["scopes"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        out!("{}  {} {}", s(a, "id"), s(a, "tool"), esc(&a["input"].to_string()));
        out!(
            "    task {}  subagent {}  user {}  principal {}  rule {}  scopes {}  expires {}",
            s(a, "task_id"),
            s(a, "subagent"),
            s(a, "user_id"),
            s(a, "principal"),
            s(a, "matched_rule"),
            scopes.join(","),
            s(a, "expires_at"),
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `warden approvals approve|decline ID [--scope ...]`.
pub async fn approvals_decide(
    config: Config,
    args: ApiArgs,
    id: &str,
    decision: &str,
    scope: &str,
) -> anyhow::Result<ExitCode> {
    let api = Api::new(&config, &args)?;
    let body = json!({ "decision": decision, "scope": scope });
    match api.call(reqwest::Method::POST, &format!("/v1/approvals/{}", segment(id)), Some(body)).await {
        Ok(v) => {
            out!(
                "{} {} (scope {}, by {})",
                esc(v["request_id"].as_str().unwrap_or(id)),
                if decision == "approve" { "approved" } else { "declined" },
                esc(v["scope"].as_str().unwrap_or(scope)),
                esc(v["decided_by"].as_str().unwrap_or("-")),
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(f) => Ok(f.exit()),
    }
}

/// `warden task journal ID`: the task's import journal as the API gives it.
pub async fn task_journal(config: Config, args: ApiArgs, id: &str) -> anyhow::Result<ExitCode> {
    let api = Api::new(&config, &args)?;
    match api.call(reqwest::Method::GET, &format!("/v1/tasks/{}/journal", segment(id)), None).await {
        Ok(v) => {
            out!("{}", serde_json::to_string_pretty(&v)?);
            Ok(ExitCode::SUCCESS)
        }
        Err(f) => Ok(f.exit()),
    }
}

/// `warden sandbox end SESSION [--user U]` or `warden sandbox end --idle-over D`: ends
/// sessions of the running server's deployment (their containers and workspaces).
pub async fn sandbox_end(
    config: Config,
    args: ApiArgs,
    session: Option<String>,
    user: Option<String>,
    idle_over: Option<String>,
) -> anyhow::Result<ExitCode> {
    let idle_over = match idle_over.as_deref().map(humantime::parse_duration) {
        None => None,
        Some(Ok(d)) => Some(d),
        Some(Err(e)) => {
            eprintln!("error: --idle-over {:?}: {e} (e.g. 30m, 2h)", idle_over.unwrap_or_default());
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    if session.is_some() == idle_over.is_some() {
        eprintln!("error: name one SESSION or give --idle-over DURATION");
        return Ok(ExitCode::from(EXIT_USAGE));
    }
    let api = Api::new(&config, &args)?;
    let listed = match api.call(reqwest::Method::GET, "/v1/sessions", None).await {
        Ok(v) => v["sessions"].as_array().cloned().unwrap_or_default(),
        Err(f) => return Ok(f.exit()),
    };
    let str_of = |v: &Value, k: &str| v[k].as_str().unwrap_or_default().to_owned();
    let targets: Vec<(String, String)> = match (&session, idle_over) {
        (Some(id), _) => {
            let mut matching: Vec<(String, String)> = listed
                .iter()
                .filter(|v| v["session_id"] == id.as_str())
                .map(|v| (str_of(v, "user_id"), str_of(v, "session_id")))
                .filter(|(u, _)| user.as_ref().is_none_or(|want| want == u))
                .collect();
            match matching.len() {
                0 => {
                    let of = user.as_ref().map(|u| format!(" of user {u}")).unwrap_or_default();
                    eprintln!("error: no sandbox session {}{} in this deployment", esc(id), esc(&of));
                    return Ok(ExitCode::from(EXIT_TASK_FAILED));
                }
                1 => matching.pop().into_iter().collect(),
                _ => {
                    let users: Vec<String> = matching.iter().map(|(u, _)| u.clone()).collect();
                    eprintln!(
                        "error: session {} exists for several users ({}); name one with --user",
                        esc(id),
                        esc(&users.join(", "))
                    );
                    return Ok(ExitCode::from(EXIT_USAGE));
                }
            }
        }
        (None, Some(limit)) => listed
            .iter()
            // Idle since the server's last use of it; a session it has not used since it
            // started (a leftover not adopted yet) counts as idle since its creation.
            .filter(|v| v["idle_secs"].as_u64().or(v["age_secs"].as_u64()).unwrap_or(0) >= limit.as_secs())
            .map(|v| (str_of(v, "user_id"), str_of(v, "session_id")))
            .collect(),
        (None, None) => unreachable!("checked above"),
    };
    if targets.is_empty() {
        out!("no session idle for {}", humantime::format_duration(idle_over.unwrap_or_default()));
        return Ok(ExitCode::SUCCESS);
    }
    let mut failed = false;
    for (u, sid) in targets {
        let path = format!("/v1/sessions/{}/end?user_id={}", segment(&sid), segment(&u));
        match api.call(reqwest::Method::POST, &path, None).await {
            Ok(_) => out!("ended session {} (user {})", esc(&sid), esc(&u)),
            Err(f) => {
                eprintln!("error: session {} (user {}): {}", esc(&sid), esc(&u), esc(&f.message));
                failed = true;
            }
        }
    }
    Ok(if failed { ExitCode::from(EXIT_TASK_FAILED) } else { ExitCode::SUCCESS })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A server that records the `Authorization` header of every request it gets.
    async fn recording_server() -> (String, Arc<Mutex<Vec<Option<String>>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let app = axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
            let record = record.clone();
            async move {
                let auth = headers.get("authorization").map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
                record.lock().unwrap().push(auth);
                axum::Json(json!({"approvals": []}))
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (url, seen)
    }

    /// A server answering every request with `status` and `Location: location`.
    async fn redirecting_server(status: u16, location: String) -> String {
        let app = axum::Router::new().fallback(move || {
            let location = location.clone();
            async move {
                let status = axum::http::StatusCode::from_u16(status).unwrap();
                (status, [(axum::http::header::LOCATION, location)])
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        url
    }

    fn api(base: &str) -> Api {
        let args = ApiArgs { url: Some(base.to_owned()) };
        let mut api = Api::new(&Config::default(), &args).unwrap();
        api.token = Some("operator-token-SECRET".into());
        api
    }

    #[tokio::test]
    async fn regression_the_token_never_follows_a_redirect() {
        let (target, seen) = recording_server().await;
        // The recorder does see the token when it is the server asked.
        api(&target).call(reqwest::Method::GET, "/v1/approvals", None).await.map_err(|f| f.message).unwrap();
        assert_eq!(seen.lock().unwrap().as_slice(), [Some("Bearer operator-token-SECRET".to_owned())]);
        seen.lock().unwrap().clear();
        for status in [301, 302, 303, 307, 308] {
            let location = format!("{target}/v1/approvals");
            let origin = redirecting_server(status, location.clone()).await;
            let failure = match api(&origin).call(reqwest::Method::GET, "/v1/approvals", None).await {
                Ok(v) => panic!("HTTP {status}: the redirect was followed: {v}"),
                Err(f) => f,
            };
            assert_eq!(failure.code, EXIT_USAGE);
            assert!(
                failure.message.contains(&status.to_string()) && failure.message.contains(&location),
                "{}",
                failure.message
            );
            assert!(!failure.message.contains("SECRET"), "{}", failure.message);
            assert!(seen.lock().unwrap().is_empty(), "HTTP {status}: the target was asked: {:?}", seen.lock().unwrap());
        }
    }
}

/// What `warden sandbox pause|resume` asks of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    Pause,
    Resume,
}

impl Lifecycle {
    /// The endpoint's last path segment.
    fn action(self) -> &'static str {
        match self {
            Lifecycle::Pause => "pause",
            Lifecycle::Resume => "resume",
        }
    }
}

/// `warden sandbox pause|resume SESSION [--user U]`: `POST /v1/sessions/{id}/pause|resume`.
pub async fn sandbox_lifecycle(
    config: Config,
    args: ApiArgs,
    session: &str,
    user: Option<String>,
    what: Lifecycle,
) -> anyhow::Result<ExitCode> {
    let api = Api::new(&config, &args)?;
    let path = session_path(session, what.action(), user.as_deref());
    match api.call(reqwest::Method::POST, &path, None).await {
        Ok(v) => {
            let (changed, done, unchanged) = match what {
                Lifecycle::Pause => (v["was_running"].as_bool() == Some(true), "paused", " (it already was)"),
                Lifecycle::Resume => (v["was_paused"].as_bool() == Some(true), "resumed", " (it was not paused)"),
            };
            let note = if changed { "" } else { unchanged };
            out!("{done} session {}{note}", esc(session));
            Ok(ExitCode::SUCCESS)
        }
        Err(f) => Ok(f.exit()),
    }
}

/// `warden sandbox fork SESSION NEW [--user U]`: `POST /v1/sessions/{id}/fork`.
pub async fn sandbox_fork(
    config: Config,
    args: ApiArgs,
    session: &str,
    new: &str,
    user: Option<String>,
) -> anyhow::Result<ExitCode> {
    let api = Api::new(&config, &args)?;
    let path = session_path(session, "fork", user.as_deref());
    match api.call(reqwest::Method::POST, &path, Some(json!({ "session_id": new }))).await {
        Ok(_) => {
            out!("forked session {} into {}", esc(session), esc(new));
            Ok(ExitCode::SUCCESS)
        }
        Err(f) => Ok(f.exit()),
    }
}

/// `/v1/sessions/{session}/{tail}`, with `?user_id=` when a user is named (each part
/// percent-encoded as one path segment).
fn session_path(session: &str, tail: &str, user: Option<&str>) -> String {
    let mut path = format!("/v1/sessions/{}/{tail}", segment(session));
    if let Some(u) = user {
        path.push_str(&format!("?user_id={}", segment(u)));
    }
    path
}

/// What `warden sandbox snapshot …` asks of a session's snapshots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotAction {
    /// `take NAME`: `POST /v1/sessions/{id}/snapshots`.
    Take(String),
    /// `ls`: `GET /v1/sessions/{id}/snapshots`.
    List { json: bool },
    /// `rm NAME`: `DELETE /v1/sessions/{id}/snapshots/{name}`.
    Delete(String),
}

/// `warden sandbox snapshot take|ls|rm SESSION … [--user U]`.
pub async fn sandbox_snapshot(
    config: Config,
    args: ApiArgs,
    session: &str,
    user: Option<String>,
    action: SnapshotAction,
) -> anyhow::Result<ExitCode> {
    let api = Api::new(&config, &args)?;
    let user = user.as_deref();
    let answer = match &action {
        SnapshotAction::Take(name) => {
            api.call(reqwest::Method::POST, &session_path(session, "snapshots", user), Some(json!({ "name": name })))
                .await
        }
        SnapshotAction::List { .. } => {
            api.call(reqwest::Method::GET, &session_path(session, "snapshots", user), None).await
        }
        SnapshotAction::Delete(name) => {
            let tail = format!("snapshots/{}", segment(name));
            api.call(reqwest::Method::DELETE, &session_path(session, &tail, user), None).await
        }
    };
    let v = match answer {
        Ok(v) => v,
        Err(f) => return Ok(f.exit()),
    };
    match action {
        SnapshotAction::Take(name) => out!("took snapshot {} of session {}", esc(&name), esc(session)),
        SnapshotAction::Delete(name) => out!("deleted snapshot {} of session {}", esc(&name), esc(session)),
        SnapshotAction::List { json: true } => out!("{}", serde_json::to_string_pretty(&v["snapshots"])?),
        SnapshotAction::List { json: false } => {
            let list = v["snapshots"].as_array().cloned().unwrap_or_default();
            if list.is_empty() {
                out!("no snapshots of session {}", esc(session));
            }
            for i in &list {
                let s = |k: &str| esc(i[k].as_str().unwrap_or("-")).into_owned();
                out!("{}  taken {}  on {}", s("name"), s("created_at"), s("docker_host"));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
