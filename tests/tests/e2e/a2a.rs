//! The A2A plugin (issue 7) against real A2A servers built with the official `a2a-sdk`
//! (tests/peers/a2a_agents.py), over protocol 1.0 and over 0.3. In-process (the
//! `warden` library) where one registry must outlive a task (resume, events); one run
//! through the real binary.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use warden::task::{TaskOutcome, TaskScope};
use warden::task_state::TaskState;
use warden::{Config, Registry, TaskCall};

use crate::common::*;

const PROTOCOLS: [&str; 2] = ["1.0", "0.3"];

/// A warden (library) with the bundled `a2a` plugin and the given grant and references.
struct Warden {
    _dir: tempfile::TempDir,
    registry: Arc<Registry>,
}

impl Warden {
    async fn start(grant: &str, references: &[(String, &str)], extra: &str) -> Warden {
        let dir = tempfile::tempdir().unwrap();
        let plugins = dir.path().join("plugins");
        std::fs::create_dir_all(&plugins).unwrap();
        std::fs::copy(bundled_plugin("a2a"), plugins.join("a2a.wasm")).unwrap();
        let mut yaml = format!(
            "plugins:\n  dir: {}\n  cache_dir: {}\n  watch: false\n{extra}  grants:\n    a2a: {grant}\nsubagents:\n  agent_dirs: []\n  references:\n",
            plugins.display(),
            dir.path().join("cache").display(),
        );
        for (uri, meta) in references {
            yaml.push_str(&format!("    - {{ uri: \"{uri}\", kind: A2A, metadata: {meta} }}\n"));
        }
        let path = dir.path().join("warden.yaml");
        std::fs::write(&path, yaml).unwrap();
        let registry = warden::Host::start(Config::from_file(&path).unwrap()).await.unwrap().registry;
        Warden { _dir: dir, registry }
    }

    async fn run(&self, agent: &str, prompt: &str, resume: Option<&str>) -> (TaskOutcome, Vec<Value>) {
        let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
        let call = TaskCall {
            description: "test".into(),
            prompt: prompt.into(),
            subagent_type: agent.into(),
            resume: resume.map(str::to_string),
            ..Default::default()
        };
        let scope = TaskScope { session_id: "s".into(), user_id: "u".into(), events: Some(tx), ..TaskScope::default() };
        let outcome = warden::task::run(&self.registry, warden::task::new_task_id(), &call, scope).await.unwrap();
        let mut events = Vec::new();
        while let Ok(e) = rx.try_recv() {
            events.push(warden::event::TaskEvent::into_json(e, agent));
        }
        (outcome, events)
    }
}

pub(crate) const GRANT: &str = "{ http: [\"http://127.0.0.1:*\"], events: true, state: true, log: true }";

pub(crate) fn start_peer(agent: &str, protocol: &str, extra: &[&str]) -> Peer {
    let mut args = vec!["--agent", agent, "--protocol", protocol];
    args.extend_from_slice(extra);
    Peer::start("a2a_agents.py", &args)
}

/// What the peer saw (`GET /debug/log`).
pub(crate) fn peer_log(peer: &Peer) -> Vec<Value> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", peer.port)).unwrap();
    write!(s, "GET /debug/log HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let body = text.split_once("\r\n\r\n").unwrap().1;
    serde_json::from_str::<Value>(body).unwrap().as_array().unwrap().clone()
}

pub(crate) fn methods(log: &[Value]) -> Vec<String> {
    log.iter().map(|e| e["method"].as_str().unwrap_or("").to_string()).collect()
}

fn expected(protocol: &str, v10: &str, v03: &str) -> String {
    if protocol == "1.0" { v10.into() } else { v03.into() }
}

#[tokio::test(flavor = "multi_thread")]
async fn echo_agent_over_1_0_and_0_3() {
    for protocol in PROTOCOLS {
        let peer = start_peer("echo", protocol, &[]);
        let w = Warden::start(GRANT, &[(peer.url(), "{ name: echo }")], "").await;
        let def = &w.registry.snapshot().definitions["echo"].definition;
        assert_eq!(def.description, "The echo test agent", "description comes from the card");
        assert!(def.protocol_data.contains(&format!("\"protocol_version\":\"{protocol}\"")), "{}", def.protocol_data);
        let (out, _) = w.run("echo", "hello there", None).await;
        assert_eq!(out.status, TaskState::Completed, "{protocol}: {out:?}");
        assert_eq!(out.output.as_deref(), Some("echo: hello there"));
        let log = peer_log(&peer);
        assert_eq!(methods(&log), vec![expected(protocol, "SendMessage", "message/send")]);
        let header = if protocol == "1.0" { Value::from("1.0") } else { Value::Null };
        assert_eq!(log[0]["a2a_version"], header, "{protocol}: A2A-Version header");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_streaming_agent_relays_progress_over_1_0_and_0_3() {
    for protocol in PROTOCOLS {
        let peer = start_peer("slow-stream", protocol, &["--steps", "3", "--step-delay", "0.3"]);
        let w = Warden::start(GRANT, &[(peer.url(), "{ name: slow }")], "").await;
        let (out, events) = w.run("slow", "go", None).await;
        assert_eq!(out.status, TaskState::Completed, "{protocol}: {out:?}");
        assert_eq!(out.output.as_deref(), Some("part1 part2 part3"));
        assert_eq!(methods(&peer_log(&peer)), vec![expected(protocol, "SendStreamingMessage", "message/stream")]);
        let steps: Vec<String> = events
            .iter()
            .filter(|e| e["type"] == "progress")
            .filter_map(|e| e["message"].as_str().map(str::to_string))
            .collect();
        for want in ["step 1/3", "step 2/3", "step 3/3"] {
            assert!(steps.iter().any(|s| s == want), "{protocol}: no progress event {want:?} in {steps:?}");
        }
        let last = events.iter().rev().find(|e| e["type"] == "progress").unwrap();
        assert_eq!(last["state"], "completed");
        assert_eq!(last["plugin"], "a2a");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn input_required_then_resume_continues_the_remote_task() {
    for protocol in PROTOCOLS {
        let peer = start_peer("ask-input", protocol, &[]);
        let w = Warden::start(GRANT, &[(peer.url(), "{ name: asker }")], "").await;
        let (first, _) = w.run("asker", "hi", None).await;
        assert_eq!(first.status, TaskState::InputRequired, "{protocol}: {first:?}");
        assert_eq!(first.output.as_deref(), Some("What is your name?"));
        let (second, _) = w.run("asker", "Ada", Some(&first.task_id)).await;
        assert_eq!(second.status, TaskState::Completed, "{protocol}: {second:?}");
        assert_eq!(second.output.as_deref(), Some("Hello, Ada!"));
        let log = peer_log(&peer);
        assert_eq!(log.len(), 2);
        assert!(log[0]["task_id"].is_null() && log[0]["context_id"].is_null());
        assert!(log[1]["task_id"].is_string() && log[1]["context_id"].is_string(), "{protocol}: {log:?}");
        assert_ne!(log[0]["message_id"], log[1]["message_id"], "every call sends a fresh messageId");
        // The saved conversation is used up: resuming the same task again is refused.
        let (again, _) = w.run("asker", "Bob", Some(&first.task_id)).await;
        assert_eq!(again.status, TaskState::Failed);
        assert!(again.error.as_deref().unwrap().contains("no interrupted A2A task"), "{again:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn failing_agent_fails_with_the_remote_reason() {
    for protocol in PROTOCOLS {
        let peer = start_peer("fail", protocol, &[]);
        let w = Warden::start(GRANT, &[(peer.url(), "{ name: failer }")], "").await;
        let (out, _) = w.run("failer", "anything", None).await;
        assert_eq!(out.status, TaskState::Failed, "{protocol}: {out:?}");
        let error = out.error.unwrap();
        assert!(
            error.contains("remote failure") && error.contains("the fail agent always fails"),
            "{protocol}: {error}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_deadline_cancels_the_remote_task() {
    for protocol in PROTOCOLS {
        let peer = start_peer("slow-stream", protocol, &["--steps", "40", "--step-delay", "0.25"]);
        let limits = "  limits: { timeout: 4s }\n";
        let w = Warden::start(GRANT, &[(peer.url(), "{ name: slow }")], limits).await;
        let started = std::time::Instant::now();
        let (out, _) = w.run("slow", "go", None).await;
        assert!(started.elapsed() < Duration::from_secs(5), "{protocol}: took {:?}", started.elapsed());
        assert_eq!(out.status, TaskState::Failed, "{protocol}: {out:?}");
        let error = out.error.unwrap();
        assert!(error.contains("timeout") && error.contains("the remote task was canceled"), "{protocol}: {error}");
        let log = peer_log(&peer);
        let m = methods(&log);
        assert!(m.contains(&expected(protocol, "CancelTask", "tasks/cancel")), "{protocol}: {m:?}");
        assert!(m.contains(&"cancel".to_string()), "{protocol}: the agent's cancel ran: {m:?}");
    }
}

/// Issue 18: canceling a warden task (`POST /v1/tasks/{id}/cancel` on the real `warden
/// serve`) that runs an A2A subagent cancels the remote task: the plugin sees the host's
/// cancellation (WIT 0.2.0) while it waits on the peer's stream or polls, and sends
/// `CancelTask` / `tasks/cancel` within the grace period; the peer's own cancel runs.
#[test]
fn canceling_the_warden_task_cancels_the_remote_task() {
    for protocol in PROTOCOLS {
        let peer = start_peer("slow-stream", protocol, &["--steps", "200", "--step-delay", "0.25"]);
        let d = Deployment::new(&format!(
            "  limits: {{ timeout: 2m }}\n  grants:\n    a2a: {GRANT}\nsubagents:\n  agent_dirs: []\n  references:\n    - {{ uri: \"{}\", kind: A2A, metadata: {{ name: slow }} }}\n",
            peer.url()
        ));
        std::fs::copy(bundled_plugin("a2a"), d.dir.path().join("plugins/a2a.wasm")).unwrap();
        let server = Server::start(&d);
        let port = server.port;
        let task = serde_json::json!({ "description": "e2e", "prompt": "go", "subagent_type": "slow", "run_in_background": true });
        let (status, created) = json_of(port, "POST", "/v1/tasks", Some(&task));
        assert_eq!(status, 202, "{protocol}: {created}");
        let id = created["task_id"].as_str().unwrap().to_owned();
        // Wait until the remote task runs (the peer logged the streaming send), then let a
        // few of its steps go by while the plugin waits on the stream.
        let send = expected(protocol, "SendStreamingMessage", "message/stream");
        let until = std::time::Instant::now() + Duration::from_secs(30);
        while !methods(&peer_log(&peer)).contains(&send) {
            assert!(std::time::Instant::now() < until, "{protocol}: the remote task never started");
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(800));
        let (_, record) = json_of(port, "GET", &format!("/v1/tasks/{id}?block=false"), None);
        assert_eq!(record["status"], "working", "{protocol}: {record}");
        let started = std::time::Instant::now();
        let (status, canceled) = json_of(port, "POST", &format!("/v1/tasks/{id}/cancel"), None);
        assert_eq!(status, 200, "{protocol}: {canceled}");
        assert_eq!(canceled["status"], "canceled", "{protocol}: {canceled}");
        assert!(started.elapsed() < Duration::from_secs(8), "{protocol}: the cancel took {:?}", started.elapsed());
        let log = peer_log(&peer);
        let m = methods(&log);
        assert!(m.contains(&expected(protocol, "CancelTask", "tasks/cancel")), "{protocol}: {m:?}");
        assert!(m.contains(&"cancel".to_string()), "{protocol}: the agent's cancel ran: {m:?}");
        drop(server);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_operator_secret_is_injected_by_reference() {
    let env = format!("WARDEN_A2A_TEST_TOKEN_{}", std::process::id());
    // SAFETY: a variable name unique to this process and test; set before the host reads it.
    unsafe { std::env::set_var(&env, "s3cret") };
    let peer = start_peer("echo", "1.0", &["--token", "s3cret"]);
    let grant = format!(
        "{{ http: [\"http://127.0.0.1:*\"], state: true, secrets: {{ partner: {{ env: {env}, origins: [\"http://127.0.0.1:*\"] }} }} }}"
    );
    let w = Warden::start(&grant, &[(peer.url(), "{ name: guarded, auth_env: partner }")], "").await;
    let (out, _) = w.run("guarded", "hi", None).await;
    assert_eq!(out.status, TaskState::Completed, "{out:?}");
    assert_eq!(peer_log(&peer)[0]["auth"], true);
    // Without the secret the peer refuses.
    let w = Warden::start(GRANT, &[(peer.url(), "{ name: open }")], "").await;
    let (out, _) = w.run("open", "hi", None).await;
    assert_eq!(out.status, TaskState::Failed);
    assert!(out.error.unwrap().contains("HTTP 401"));
}

/// Serves files under `root` over HTTP/1.0 on 127.0.0.1 (404 for anything else).
async fn serve_dir(root: PathBuf) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else { return };
            let root = root.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]);
                let path = req.split_whitespace().nth(1).unwrap_or("/").trim_start_matches('/').to_string();
                let file = root.join(&path);
                let resp = match (path.contains(".."), std::fs::read(&file)) {
                    (false, Ok(body)) => {
                        let mut r = format!(
                            "HTTP/1.0 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                            body.len()
                        )
                        .into_bytes();
                        r.extend(body);
                        r
                    }
                    _ => b"HTTP/1.0 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_vec(),
                };
                let _ = s.write_all(&resp).await;
            });
        }
    });
    port
}

fn card_fixtures() -> PathBuf {
    let p = fixtures().join("a2a-cards");
    assert!(p.is_dir(), "A2A card fixtures missing at {}", p.display());
    p.canonicalize().unwrap()
}

fn json_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            json_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "json") {
            out.push(p);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_fixture_card_resolves_except_the_invalid_ones() {
    let root = card_fixtures();
    // A legacy location too: only /.well-known/agent.json exists under /legacy.
    let scratch = tempfile::tempdir().unwrap();
    let served = scratch.path().join("site");
    std::fs::create_dir_all(served.join("legacy/.well-known")).unwrap();
    let mut files = Vec::new();
    json_files(&root, &mut files);
    files.sort();
    assert_eq!(files.len(), 13);
    for f in &files {
        let rel = f.strip_prefix(&root).unwrap();
        std::fs::create_dir_all(served.join("cards").join(rel.parent().unwrap())).unwrap();
        std::fs::copy(f, served.join("cards").join(rel)).unwrap();
    }
    std::fs::copy(
        root.join("a2a-samples/a2a_mcp__agent_cards__planner_agent.json"),
        served.join("legacy/.well-known/agent.json"),
    )
    .unwrap();
    let port = serve_dir(served).await;

    let mut refs = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let rel = f.strip_prefix(&root).unwrap().to_string_lossy().into_owned();
        refs.push((format!("http://127.0.0.1:{port}/cards/{rel}"), format!("{{ name: card{i} }}")));
    }
    refs.push((format!("http://127.0.0.1:{port}/legacy"), "{}".to_string()));
    let refs: Vec<(String, &str)> = refs.iter().map(|(u, m)| (u.clone(), m.as_str())).collect();
    let w = Warden::start(GRANT, &refs, "").await;
    let snap = w.registry.snapshot();
    for (i, f) in files.iter().enumerate() {
        let name = format!("card{i}");
        let invalid = f.to_string_lossy().contains("/invalid/");
        assert_eq!(snap.definitions.contains_key(&name), !invalid, "{}: {:?}", f.display(), snap.problems);
    }
    assert_eq!(snap.definitions.len(), 12, "11 fixture cards + the legacy agent.json");
    let legacy = &snap.definitions["Langraph Planner Agent"].definition;
    assert_eq!(legacy.description, "Helps breakdown a request in to actionable tasks");
    assert!(legacy.protocol_data.contains("\"protocol_version\":\"0.3\""), "{}", legacy.protocol_data);
    let problems: Vec<&str> = snap.problems.iter().map(|p| p.message.as_str()).collect();
    assert_eq!(problems.len(), 2, "{problems:?}");
    let missing = problems.iter().find(|p| p.contains("missing-required")).expect("missing-required reported");
    assert!(missing.contains("missing required field `capabilities`"), "{missing}");
    let format = problems.iter().find(|p| p.contains("invalid-format")).expect("invalid-format reported");
    assert!(format.contains("field `name` must be a string"), "{format}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ungranted_card_url_is_refused_without_network_traffic() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let grant = "{ http: [\"https://*.example.com\"], state: true, events: true }";
    let w = Warden::start(grant, &[(url.clone(), "{ name: outside }")], "").await;
    let snap = w.registry.snapshot();
    assert!(!snap.definitions.contains_key("outside"));
    let p = snap.problems.iter().find(|p| p.source == url).expect("the refusal is reported");
    assert!(p.message.contains("denied") && p.message.contains("allow-list"), "{}", p.message);
    let accepted = tokio::time::timeout(Duration::from_millis(300), listener.accept()).await;
    assert!(accepted.is_err(), "a refused card URL reached the network");
}

#[test]
fn the_binary_runs_an_a2a_task() {
    let peer = start_peer("echo", "0.3", &[]);
    let d = Deployment::new(&format!(
        "  grants:\n    a2a: {GRANT}\nsubagents:\n  references:\n    - {{ uri: \"{}\", kind: A2A, metadata: {{ name: remote-echo }} }}\n",
        peer.url()
    ));
    std::fs::copy(bundled_plugin("a2a"), d.dir.path().join("plugins/a2a.wasm")).unwrap();
    let o = d.warden(&["run", "remote-echo", "via the binary", "--json"]);
    assert!(o.status.success(), "{o:?}");
    let v = json(&o);
    assert_eq!((v["status"].as_str(), v["output"].as_str()), (Some("completed"), Some("echo: via the binary")));
}

/// BENCHMARKS.md `## A2A`: a trivial task's round trip through warden (library, bundled
/// plugin, fresh instance per call) vs the official Python client, same echo server.
/// `cargo test -p warden-e2e --test e2e a2a::bench -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread")]
#[ignore = "benchmark: run explicitly"]
async fn bench_round_trip_vs_python_client() {
    let n: usize = std::env::var("A2A_BENCH_N").ok().and_then(|v| v.parse().ok()).unwrap_or(300);
    let peer = start_peer("echo", "1.0", &[]);
    let w = Warden::start(GRANT, &[(peer.url(), "{ name: echo }")], "").await;
    for _ in 0..20 {
        assert_eq!(w.run("echo", "ping", None).await.0.output.as_deref(), Some("echo: ping"));
    }
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = std::time::Instant::now();
        let (out, _) = w.run("echo", "ping", None).await;
        samples.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(out.output.as_deref(), Some("echo: ping"));
    }
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let median = samples[n / 2];
    let mean = samples.iter().sum::<f64>() / n as f64;
    let p90 = samples[n * 9 / 10 - 1];
    let py = std::process::Command::new(python())
        .arg(repo().join("tests/peers/a2a_bench_client.py"))
        .args(["--url", &peer.url(), "--n", &n.to_string(), "--warmup", "20"])
        .output()
        .unwrap();
    assert!(py.status.success(), "{}", String::from_utf8_lossy(&py.stderr));
    let py: Value = serde_json::from_slice(&py.stdout).unwrap();
    assert_eq!(py["output"], "echo: ping");
    let py_median = py["median_ms"].as_f64().unwrap();
    println!(
        "A2A round trip, {n} calls: warden median {median:.2} ms (mean {mean:.2}, p90 {p90:.2}); \
         a2a-sdk client median {py_median:.2} ms (mean {:.2}, p90 {:.2}); ratio {:.2}x",
        py["mean_ms"].as_f64().unwrap(),
        py["p90_ms"].as_f64().unwrap(),
        median / py_median
    );
}
