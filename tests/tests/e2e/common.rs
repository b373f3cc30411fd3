//! Shared fixtures: the binary, the plugins, scratch deployments.
#![allow(dead_code)] // shared by every area; not every area uses every helper

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

pub fn bin() -> PathBuf {
    let p = std::env::var_os("WARDEN_BIN").map(PathBuf::from).unwrap_or_else(|| repo().join("target/debug/warden"));
    assert!(p.is_file(), "warden binary missing at {} — run `cargo xtask test`", p.display());
    p
}

/// A bundled plugin from `target/plugins` (`WARDEN_PLUGINS`).
pub fn bundled_plugin(name: &str) -> PathBuf {
    let dir = std::env::var_os("WARDEN_PLUGINS").map(PathBuf::from).unwrap_or_else(|| repo().join("target/plugins"));
    let p = dir.join(format!("{name}.wasm"));
    assert!(p.is_file(), "{} missing — run `cargo xtask test`", p.display());
    p
}

/// A test plugin from `target/test-plugins` (`WARDEN_TEST_PLUGINS`).
pub fn test_plugin(name: &str) -> PathBuf {
    let dir = std::env::var_os("WARDEN_TEST_PLUGINS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/test-plugins"));
    let p = dir.join(format!("{name}.wasm"));
    assert!(p.is_file(), "{} missing — run `cargo xtask test`", p.display());
    p
}

/// A scratch deployment: a config file and a plugin directory.
pub struct Deployment {
    pub dir: tempfile::TempDir,
}

impl Deployment {
    pub fn new(yaml_extra: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("plugins")).unwrap();
        std::fs::write(
            dir.path().join("warden.yaml"),
            format!("plugins:\n  dir: ./plugins\n  cache_dir: ./cache\n{yaml_extra}"),
        )
        .unwrap();
        Deployment { dir }
    }

    pub fn add(&self, plugin: &str, as_id: &str) {
        std::fs::copy(test_plugin(plugin), self.dir.path().join("plugins").join(format!("{as_id}.wasm"))).unwrap();
    }

    pub fn warden(&self, args: &[&str]) -> Output {
        Command::new(bin())
            .current_dir(self.dir.path())
            .arg("--config")
            .arg(self.dir.path().join("warden.yaml"))
            .args(args)
            .output()
            .unwrap()
    }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", stdout(o), String::from_utf8_lossy(&o.stderr)))
}

pub const GRANTS: &str = "  grants:\n    echo: { log: true, events: true, state: true }\nsubagents:\n  references:\n    - { uri: \"echo://greeter\", kind: ECHO, metadata: { description: Greets people } }\n";

/// The Python interpreter of the test virtualenv (`WARDEN_PYTHON`), which has the
/// official `a2a-sdk` and `mcp` packages.
pub fn python() -> PathBuf {
    let p = std::env::var_os("WARDEN_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/py-venv/bin/python"));
    assert!(p.is_file(), "test Python missing at {} — run `cargo xtask test`", p.display());
    p
}

/// A real protocol peer: a Python script from `tests/peers/` serving on 127.0.0.1.
/// Started on a free port; killed when dropped.
pub struct Peer {
    child: std::process::Child,
    pub port: u16,
}

impl Peer {
    /// Runs `tests/peers/<script> --port <free port> <args>` and waits until the port
    /// accepts connections (at most 30 s).
    pub fn start(script: &str, args: &[&str]) -> Peer {
        let port = free_port();
        let child = Command::new(python())
            .arg(repo().join("tests/peers").join(script))
            .arg("--port")
            .arg(port.to_string())
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start peer {script}: {e}"));
        let mut peer = Peer { child, port };
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = peer.child.try_wait() {
                panic!("peer {script} exited before listening: {status}");
            }
            assert!(std::time::Instant::now() < until, "peer {script} did not listen on {port} within 30 s");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        peer
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port that was free a moment ago, and that no other test of this run was given.
///
/// Regression (CI of 2026-12-07, `a2a::echo_agent_over_1_0_and_0_3` read the card of
/// another test's peer): the system hands a port out again once its probe closes, and a
/// peer takes a second to bind it, so two concurrent tests got the same port and the
/// second one's readiness check connected to the first one's peer.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if GIVEN.lock().unwrap().insert(port) {
            return port;
        }
    }
}

/// The shared real-world fixtures (Claude agent files, A2A cards): `WARDEN_FIXTURES`
/// (set by `cargo xtask test`), else the copy in the repository at `tests/fixtures`.
pub fn fixtures() -> PathBuf {
    let p = std::env::var_os("WARDEN_FIXTURES")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("tests/fixtures"));
    assert!(p.is_dir(), "fixtures missing at {} — set WARDEN_FIXTURES or run `cargo xtask test`", p.display());
    p
}

/// The real `warden serve` of a deployment on a free port, its log in `serve.log`. Dropping
/// it stops the server with SIGTERM (so it removes its sandboxes), then SIGKILL after 60 s;
/// a test that wants a crash calls `child.kill()` itself.
pub struct Server {
    pub child: std::process::Child,
    pub port: u16,
}

impl Server {
    /// Starts the server and waits (up to 60 s) until `/healthz` answers 200.
    pub fn start(d: &Deployment) -> Server {
        Self::start_with_env(d, &[])
    }

    /// [`Server::start`] with extra environment variables (principals' tokens).
    pub fn start_with_env(d: &Deployment, env: &[(&str, &str)]) -> Server {
        Self::start_as(d, &[], env, "serve.log")
    }

    /// One replica of a cluster (`--replica-id id`) on the deployment's shared store, its
    /// log in `serve-<id>.log`.
    pub fn start_replica(d: &Deployment, id: &str) -> Server {
        Self::start_as(d, &["--replica-id", id], &[], &format!("serve-{id}.log"))
    }

    /// `warden serve` with extra arguments and environment variables, its stderr appended
    /// to `log` in the deployment's directory.
    fn start_as(d: &Deployment, args: &[&str], env: &[(&str, &str)], log_name: &str) -> Server {
        use std::io::{Read, Write};
        let port = free_port();
        let log = std::fs::OpenOptions::new().create(true).append(true).open(d.dir.path().join(log_name)).unwrap();
        let child = Command::new(bin())
            .current_dir(d.dir.path())
            .arg("--config")
            .arg(d.dir.path().join("warden.yaml"))
            .args(["serve", "--addr", &format!("127.0.0.1:{port}")])
            .args(args)
            .env("WARDEN_LOG", "info")
            .env_remove("WARDEN_TOKENS")
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut server = Server { child, port };
        let healthy = || -> bool {
            let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
            let _ = write!(s, "GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
            let mut text = String::new();
            let _ = s.read_to_string(&mut text);
            text.starts_with("HTTP/1.1 200") || text.starts_with("HTTP/1.0 200")
        };
        let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!(
                    "warden serve exited: {status}\n{}",
                    std::fs::read_to_string(d.dir.path().join(log_name)).unwrap_or_default()
                );
            }
            if healthy() {
                return server;
            }
            assert!(std::time::Instant::now() < until, "warden serve did not answer /healthz within 60 s");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SIGTERM starts the drain; the next one (sent until it exits) skips waiting for
            // tasks a test left running, and the sandboxes are still removed.
            let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
            let mut last_signal: Option<std::time::Instant> = None;
            while std::time::Instant::now() < until {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                if last_signal.is_none_or(|t| t.elapsed() >= std::time::Duration::from_millis(500)) {
                    let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
                    last_signal = Some(std::time::Instant::now());
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The body of the HTTP/1.1 request `reader` starts with (its head read and dropped, the
/// body by `Content-Length`), for the small servers tests stand up; `None` when the
/// connection ends first.
pub fn read_request_body(reader: &mut impl std::io::BufRead) -> Option<Vec<u8>> {
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(body)
}

/// One answer of [`FakeOpenAi`].
#[derive(Debug, Clone)]
pub enum FakeTurn {
    /// A text answer; `{last_tool_result}` in it is replaced by the content of the
    /// request's last `tool` message (so the final answer shows what the tools did).
    Text(String),
    /// A `Bash` tool call with this command.
    Bash(String),
}

/// A stand-in for an OpenAI-compatible model server on 127.0.0.1 — the LLM is the one
/// part tests may fake. Every `POST …/chat/completions` is answered with the turn of its
/// conversation: the number of assistant messages in the request picks the answer (past
/// the last, the last), so a conversation asked again from anywhere gets the same
/// answers. It keeps every request's JSON body, and can hold the first request of one
/// turn (a slow model) before answering it; connections are served concurrently.
pub struct FakeOpenAi {
    pub port: u16,
    bodies: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
}

impl FakeOpenAi {
    /// Answers every request with the text `answer`.
    pub fn start(answer: &str) -> FakeOpenAi {
        FakeOpenAi::scripted(vec![FakeTurn::Text(answer.to_owned())], None)
    }

    /// Answers with `turns`; with `hold` `(turn, for)`, the first request of that turn is
    /// answered only after `for`.
    pub fn scripted(turns: Vec<FakeTurn>, hold: Option<(usize, std::time::Duration)>) -> FakeOpenAi {
        use std::io::Write;
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let recorded = bodies.clone();
        let turns = std::sync::Arc::new(turns);
        let held = std::sync::Arc::new(AtomicBool::new(false));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (recorded, turns, held) = (recorded.clone(), turns.clone(), held.clone());
                std::thread::spawn(move || {
                    let mut reader = std::io::BufReader::new(stream);
                    let Some(body) = read_request_body(&mut reader) else { return };
                    let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                    recorded.lock().unwrap().push(request.clone());
                    let turn = FakeOpenAi::turn_of(&request);
                    if let Some((at, wait)) = hold
                        && at == turn
                        && !held.swap(true, Ordering::SeqCst)
                    {
                        std::thread::sleep(wait);
                    }
                    let reply = FakeOpenAi::answer(&turns[turn.min(turns.len() - 1)], turn, &request).to_string();
                    let mut stream = reader.into_inner();
                    let _ = write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
                        reply.len()
                    );
                });
            }
        });
        FakeOpenAi { port, bodies }
    }

    /// The turn a request asks for: how many answers its conversation already holds.
    pub fn turn_of(request: &serde_json::Value) -> usize {
        let messages = request["messages"].as_array().map(Vec::as_slice).unwrap_or_default();
        messages.iter().filter(|m| m["role"] == "assistant").count()
    }

    fn answer(turn: &FakeTurn, index: usize, request: &serde_json::Value) -> serde_json::Value {
        let message = match turn {
            FakeTurn::Text(text) => {
                let messages = request["messages"].as_array().map(Vec::as_slice).unwrap_or_default();
                let last = messages.iter().rev().find(|m| m["role"] == "tool");
                let result = last.and_then(|m| m["content"].as_str()).unwrap_or_default();
                serde_json::json!({ "role": "assistant", "content": text.replace("{last_tool_result}", result) })
            }
            FakeTurn::Bash(command) => serde_json::json!({
                "role": "assistant", "content": null,
                "tool_calls": [{ "id": format!("call_{index}"), "type": "function",
                    "function": { "name": "Bash", "arguments": serde_json::json!({ "command": command }).to_string() } }],
            }),
        };
        let finish = if matches!(turn, FakeTurn::Bash(_)) { "tool_calls" } else { "stop" };
        serde_json::json!({ "id": format!("chatcmpl-{index}"), "object": "chat.completion",
            "choices": [{ "index": 0, "finish_reason": finish, "message": message }] })
    }

    /// A `providers:` entry named `name` for this server.
    pub fn provider(&self, name: &str) -> String {
        format!("    {name}: {{ type: openai, base_url: \"http://127.0.0.1:{}/v1\" }}\n", self.port)
    }

    /// Every request body so far, in arrival order.
    pub fn bodies(&self) -> Vec<serde_json::Value> {
        self.bodies.lock().unwrap().clone()
    }

    /// How many requests each turn got, for the conversations whose first user message
    /// contains `prompt`.
    pub fn requests_per_turn(&self, prompt: &str) -> Vec<usize> {
        let mut counts = vec![];
        for body in self.bodies() {
            let messages = body["messages"].as_array().cloned().unwrap_or_default();
            let first_user = messages.iter().find(|m| m["role"] == "user");
            if !first_user.and_then(|m| m["content"].as_str()).is_some_and(|c| c.contains(prompt)) {
                continue;
            }
            let turn = FakeOpenAi::turn_of(&body);
            if counts.len() <= turn {
                counts.resize(turn + 1, 0);
            }
            counts[turn] += 1;
        }
        counts
    }
}

/// One HTTP/1.1 exchange (`Connection: close`): status and body text.
pub fn http(port: u16, method: &str, path: &str, body: Option<&serde_json::Value>) -> (u16, String) {
    http_with(port, method, path, "", body)
}

/// [`http`] with extra header lines (`"Accept: ...\r\n"`).
pub fn http_with(
    port: u16,
    method: &str,
    path: &str,
    headers: &str,
    body: Option<&serde_json::Value>,
) -> (u16, String) {
    try_http_with(port, method, path, headers, body).unwrap_or_else(|e| panic!("{method} {path} on port {port}: {e}"))
}

/// [`http_with`], or the error when the server is not there (a test that kills servers).
pub fn try_http_with(
    port: u16,
    method: &str,
    path: &str,
    headers: &str,
    body: Option<&serde_json::Value>,
) -> std::io::Result<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(60)))?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    std::io::Write::write_fmt(
        &mut s,
        format_args!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )?;
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut s, &mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not an HTTP response: {text:?}"));
    let (head, rest) = text.split_once("\r\n\r\n").ok_or_else(bad)?;
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    let body =
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(rest) } else { rest.to_owned() };
    Ok((status, body))
}

/// A chunked body, as far as it was read (a stream cut by a killed server ends mid-chunk).
pub fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else { break };
        if n == 0 {
            break;
        }
        let mut n = n.min(rest.len());
        while !rest.is_char_boundary(n) {
            n -= 1;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].strip_prefix("\r\n").unwrap_or("");
    }
    out
}

/// The `id` and `data` of every frame of an SSE body, heartbeats left out.
pub fn sse_frames(body: &str) -> Vec<(Option<u64>, serde_json::Value)> {
    let mut out = vec![];
    let mut id = None;
    for line in body.lines() {
        if let Some(v) = line.strip_prefix("id:") {
            id = v.trim().parse().ok();
        } else if let Some(data) = line.strip_prefix("data:") {
            let v: serde_json::Value =
                serde_json::from_str(data.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {data}"));
            if v["type"] != "heartbeat" {
                out.push((id.take(), v));
            }
        }
    }
    out
}

pub fn json_of(port: u16, method: &str, path: &str, body: Option<&serde_json::Value>) -> (u16, serde_json::Value) {
    let (status, text) = http(port, method, path, body);
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}")))
}

/// [`json_of`], or `None` when the server is not there or did not answer with JSON (it
/// was killed meanwhile).
pub fn try_json_of(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Option<(u16, serde_json::Value)> {
    let (status, text) = try_http_with(port, method, path, "", body).ok()?;
    Some((status, serde_json::from_str(&text).ok()?))
}

/// A PostgreSQL database of its own for one test, on the server `WARDEN_TEST_POSTGRES_URL`
/// names (`cargo xtask test` starts one in a private data directory); dropped with it.
/// Without the variable the test fails, saying how to run it: never skipped.
pub struct TestDatabase {
    admin: String,
    name: String,
    /// `postgres://...` naming this test's database.
    pub url: String,
}

impl TestDatabase {
    pub fn create() -> TestDatabase {
        let admin = std::env::var("WARDEN_TEST_POSTGRES_URL").unwrap_or_else(|_| {
            panic!(
                "WARDEN_TEST_POSTGRES_URL is not set: this test needs a PostgreSQL server. Run it with \
                 `cargo xtask test` (it starts Debian's PostgreSQL in a private data directory and sets the variable)"
            )
        });
        let name = format!("warden_e2e_{}", uuid::Uuid::new_v4().simple());
        on_postgres(&admin, &format!("CREATE DATABASE {name}"));
        let (scheme, rest) = admin.split_once("://").expect("WARDEN_TEST_POSTGRES_URL is a postgres:// URL");
        let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
        let url = format!("{scheme}://{authority}/{name}");
        TestDatabase { admin, name, url }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        on_postgres(&self.admin, &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name));
    }
}

/// Runs `sql` on the server at `url`.
fn on_postgres(url: &str, sql: &str) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to WARDEN_TEST_POSTGRES_URL: {e:?}"));
        tokio::spawn(conn);
        client.batch_execute(sql).await.unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    });
}

/// Removes a sandbox scope's containers and volumes when dropped.
pub struct ScopeCleanup(pub String);

impl Drop for ScopeCleanup {
    fn drop(&mut self) {
        let filter = format!("label=warden.scope={}", self.0);
        let docker = |args: &[&str]| {
            let out = std::process::Command::new("docker").args(args).output();
            out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
        };
        let ids = docker(&["ps", "-aq", "--filter", &filter]);
        let ids: Vec<&str> = ids.split_whitespace().collect();
        if !ids.is_empty() {
            docker(&[&["rm", "-f"][..], &ids].concat());
        }
        let vols = docker(&["volume", "ls", "-q", "--filter", &filter]);
        let vols: Vec<String> = vols.split_whitespace().map(str::to_string).collect();
        if vols.is_empty() {
            return;
        }
        // Through warden, which detaches a disk volume's loop device first: a plain
        // `docker volume rm` leaves the device attached to the deleted image (a leak of a
        // device and the image's space per session of a server killed by a test), on a
        // thread of its own as this may be dropped inside a runtime.
        let scope = self.0.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            let cfg = warden_sandbox::SandboxConfig { scope, ..Default::default() };
            let sb = warden_sandbox::Sandbox::new(cfg).expect("sandbox for the clean-up");
            rt.block_on(async {
                for v in &vols {
                    let _ = sb.remove_volume(v).await;
                }
            });
        })
        .join();
        // Whatever warden could not remove still goes.
        let still = docker(&["volume", "ls", "-q", "--filter", &filter]);
        let still: Vec<&str> = still.split_whitespace().collect();
        if !still.is_empty() {
            docker(&[&["volume", "rm", "-f"][..], &still].concat());
        }
    }
}
