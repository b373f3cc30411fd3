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
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    std::io::Write::write_fmt(
        &mut s,
        format_args!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
    .unwrap();
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut s, &mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body =
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(rest) } else { rest.to_owned() };
    (status, body)
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
        let vols: Vec<&str> = vols.split_whitespace().collect();
        if !vols.is_empty() {
            docker(&[&["volume", "rm", "-f"][..], &vols].concat());
        }
    }
}
