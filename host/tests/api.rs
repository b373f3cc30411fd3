//! The HTTP API against the real router ([`warden::server::app`]) on port 0, with real
//! test plugins (`echo`, `hostile`) and, where Docker is present, the bundled `claude`
//! plugin with a scripted model and a real sandbox. Grouped by area.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};
use warden::config::Config;
use warden::engine::{Engine, EngineOptions};
use warden::server::ServerState;
use warden::store::Store;

#[path = "support/postgres.rs"]
mod postgres;
#[path = "support/records.rs"]
mod records;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

fn test_plugin(name: &str) -> PathBuf {
    let dir = std::env::var_os("WARDEN_TEST_PLUGINS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/test-plugins"));
    let p = dir.join(format!("{name}.wasm"));
    assert!(p.is_file(), "{} missing — run `cargo xtask build` first", p.display());
    p
}

fn bundled_plugin(name: &str) -> PathBuf {
    let dir = std::env::var_os("WARDEN_PLUGINS").map(PathBuf::from).unwrap_or_else(|| repo().join("target/plugins"));
    let p = dir.join(format!("{name}.wasm"));
    assert!(p.is_file(), "{} missing — run `cargo xtask build` first", p.display());
    p
}

/// Log lines of every test in this binary (the secret tests search them), written
/// through warden's own log writer as `warden` sets it up (`cli::init_tracing`).
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        warden::logging::init(
            tracing_subscriber::EnvFilter::new(
                "warden=debug,warden_sandbox=debug,warden_approval=debug,warden_models=debug",
            ),
            move || LogWriter(sink.clone()),
        );
        buf
    })
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const ECHO_AND_HOSTILE: &str = r#"
  grants:
    echo: { log: true, events: true, state: true }
  limit_overrides:
    hostile: { timeout: 60s }
subagents:
  agent_dirs: []
  references:
    - { uri: "echo://greeter", kind: ECHO, metadata: { description: Greets people } }
    - { uri: "hostile://hostile", kind: HOSTILE }
"#;

/// A running API over a scratch deployment.
struct Api {
    base: String,
    http: reqwest::Client,
    engine: Arc<Engine>,
    dir: tempfile::TempDir,
    server: tokio::task::JoinHandle<()>,
}

impl Api {
    /// The deployment's audit log (`./audit.jsonl`), once its writer has caught up.
    fn audit_text(&self) -> String {
        self.engine.gate().audit_log().expect("an audit log").sync().unwrap();
        std::fs::read_to_string(self.dir.path().join("audit.jsonl")).unwrap()
    }
}

impl Drop for Api {
    /// Stops the server and removes the deployment's sandbox sessions.
    fn drop(&mut self) {
        self.server.abort();
        if let Ok(sandbox) = self.engine.tools().sandbox().cloned()
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            tokio::task::block_in_place(|| handle.block_on(async { sandbox.shutdown().await.ok() }));
        }
    }
}

/// `plugins` are (file, id) pairs; `yaml` is appended under `plugins:` (grants etc.)
/// and may continue with other sections.
async fn api_with(plugins: &[(PathBuf, &str)], yaml: &str, tokens: Vec<String>) -> Api {
    api_with_files(plugins, yaml, tokens, &[]).await
}

/// Like [`api_with`], with extra files (relative path, content) laid out before start.
async fn api_with_files(plugins: &[(PathBuf, &str)], yaml: &str, tokens: Vec<String>, files: &[(&str, &str)]) -> Api {
    api_on(plugins, yaml, tokens, files, None).await
}

/// Like [`api_with_files`], on `store` (default: the deployment's redb file `./state.db`).
async fn api_on(
    plugins: &[(PathBuf, &str)],
    yaml: &str,
    tokens: Vec<String>,
    files: &[(&str, &str)],
    store: Option<Store>,
) -> Api {
    logs();
    let dir = tempfile::tempdir().unwrap();
    for (rel, content) in files {
        let p = dir.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
    std::fs::create_dir_all(dir.path().join("plugins")).unwrap();
    for (file, id) in plugins {
        std::fs::copy(file, dir.path().join("plugins").join(format!("{id}.wasm"))).unwrap();
    }
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("api-compile-cache");
    let text = format!(
        "plugins:\n  dir: ./plugins\n  watch: false\n  cache_dir: {}\n{yaml}\nstore:\n  path: ./state.db\n",
        cache.display()
    );
    let text = if text.contains("\nserver:") { text } else { format!("{text}server:\n  heartbeat: 200ms\n") };
    // Hosts of one sandbox scope adopt (and sweep) each other's containers: tests run at
    // once, so every deployment without its own `sandbox:` section gets a scope of its own.
    let text = if text.contains("\nsandbox:") {
        text
    } else {
        format!("{text}sandbox:\n  scope: apitest{}\n", &uuid::Uuid::new_v4().simple().to_string()[..12])
    };
    std::fs::write(dir.path().join("warden.yaml"), &text).unwrap();
    let config = Config::from_file(&dir.path().join("warden.yaml")).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let store = match store {
        Some(store) => store,
        None => Store::open(&dir.path().join("state.db")).unwrap(),
    };
    let options = EngineOptions::from_config(&config);
    let server_config = config.server.clone();
    let host = warden::Host::start(config).await.unwrap();
    // As `warden serve` does: plugin state persists with the tasks.
    host.services.state.attach(store.clone()).await.unwrap();
    let engine = Engine::start(&host, store, options).await.unwrap();
    let state = if server_config.principals.is_empty() {
        Arc::new(ServerState::new(engine.clone(), tokens))
    } else {
        // Principals' tokens as `principals::token` names them (no process environment).
        let creds = warden::server::credentials_from(&server_config, |var| Some(format!("tok-{var}"))).unwrap();
        Arc::new(ServerState::with_credentials(engine.clone(), creds))
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // As `warden serve` serves: its accept loop, with the connection limits.
    let server = tokio::spawn(warden::server::serve_on(listener, state, std::future::pending()));
    Api { base: format!("http://{addr}"), http: reqwest::Client::new(), engine, dir, server }
}

/// Sections for the bundled `claude` plugin with the scripted model (`./script.yaml`) and
/// agents in `./agents`; `rest` adds more sections (approval, sandbox, server).
fn claude_scripted(rest: &str) -> String {
    format!(
        "  grants:\n    claude: {{ log: true, events: true, state: true, resources: true, model: true, tools: true }}\n\
         subagents:\n  agent_dirs: [./agents]\n\
         models:\n  default: demo/scripted\n  providers:\n    demo: {{ type: scripted, script: ./script.yaml }}\n{rest}"
    )
}

async fn api() -> Api {
    api_with(&[(test_plugin("echo"), "echo"), (test_plugin("hostile"), "hostile")], ECHO_AND_HOSTILE, vec![]).await
}

struct Reply {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
    text: String,
}

impl Api {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Reply {
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Reply { status, headers, body, text }
    }

    async fn get(&self, path: &str) -> Reply {
        self.send(self.http.get(self.url(path))).await
    }

    /// The status of `GET path` sent byte for byte, without a token: an HTTP client would
    /// normalise dot segments and escapes before sending.
    async fn raw_get_status(&self, path: &str) -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = self.base.trim_start_matches("http://");
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        tcp.write_all(request.as_bytes()).await.unwrap();
        let mut head = Vec::new();
        tcp.read_to_end(&mut head).await.unwrap();
        let head = String::from_utf8_lossy(&head);
        let status = head.strip_prefix("HTTP/1.1 ").and_then(|h| h.get(..3)).and_then(|c| c.parse().ok());
        status.unwrap_or_else(|| panic!("no HTTP status for {path:?}: {head}"))
    }

    async fn post_raw(&self, path: &str, body: impl Into<reqwest::Body>) -> Reply {
        self.send(self.http.post(self.url(path)).header("content-type", "application/json").body(body)).await
    }

    async fn post(&self, path: &str, body: Value) -> Reply {
        self.post_raw(path, body.to_string()).await
    }

    /// Starts a background hostile `loop` task and waits until it holds a slot.
    async fn spinner(&self) -> String {
        let id = self.task("hostile", "loop", true).await.body["task_id"].as_str().unwrap().to_owned();
        let t = Instant::now();
        while self.get(&format!("/v1/tasks/{id}?block=false")).await.body["status"] != "working" {
            assert!(t.elapsed() < Duration::from_secs(10), "the spinner never started");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        id
    }

    async fn task(&self, subagent: &str, prompt: &str, background: bool) -> Reply {
        self.post(
            "/v1/tasks",
            json!({ "description": "test task", "prompt": prompt, "subagent_type": subagent, "run_in_background": background }),
        )
        .await
    }

    /// Opens an SSE stream (GET when `body` is None, else POST /v1/tasks).
    async fn stream(&self, path: &str, body: Option<Value>, last_event_id: Option<u64>) -> Sse {
        let mut req = match body {
            None => self.http.get(self.url(path)),
            Some(b) => self.http.post(self.url(path)).header("content-type", "application/json").body(b.to_string()),
        };
        req = req.header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id.to_string());
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 200, "stream refused");
        assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
        let task_id = resp.headers().get("x-task-id").map(|v| v.to_str().unwrap().to_owned());
        Sse { inner: Box::pin(resp.bytes_stream()), buf: String::new(), task_id }
    }
}

/// A minimal SSE reader: (id, data) per event.
struct Sse {
    inner: std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<axum::body::Bytes>> + Send>>,
    buf: String,
    task_id: Option<String>,
}

#[derive(Debug, Clone)]
struct SseEvent {
    id: Option<u64>,
    data: Value,
}

impl Sse {
    /// The next event, or None at the end of the stream (or after 30 s of silence).
    async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut id = None;
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = Some(v.trim().parse().unwrap());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if data.is_empty() {
                    continue;
                }
                return Some(SseEvent { id, data: serde_json::from_str(&data).unwrap() });
            }
            match tokio::time::timeout(Duration::from_secs(30), self.inner.next()).await {
                Ok(Some(Ok(chunk))) => self.buf.push_str(&String::from_utf8_lossy(&chunk)),
                _ => return None,
            }
        }
    }

    /// Next non-heartbeat event.
    async fn next_event(&mut self) -> Option<SseEvent> {
        loop {
            let e = self.next().await?;
            if e.data["type"] != "heartbeat" {
                return Some(e);
            }
        }
    }

    /// Events up to the first `approval_request` (kept in `events`); its data.
    async fn until_approval(&mut self, events: &mut Vec<SseEvent>) -> Value {
        loop {
            let e = self
                .next_event()
                .await
                .unwrap_or_else(|| panic!("stream ended before an approval_request: {events:?}"));
            events.push(e.clone());
            if e.data["type"] == "approval_request" {
                return e.data;
            }
        }
    }

    /// Every remaining non-heartbeat event until the stream ends.
    async fn rest(&mut self) -> Vec<SseEvent> {
        let mut out = vec![];
        while let Some(e) = self.next_event().await {
            out.push(e);
        }
        out
    }
}

fn types(events: &[SseEvent]) -> Vec<String> {
    events.iter().map(|e| e.data["type"].as_str().unwrap_or("?").to_owned()).collect()
}

mod health {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn healthz_metrics_and_unknown_routes() {
        let api = api().await;
        let r = api.get("/healthz").await;
        assert_eq!(r.status, 200);
        assert_eq!(r.body["status"], "ok");
        assert_eq!(r.body["plugins"], 2);
        assert_eq!(api.task("greeter", "count me", false).await.status, 200);
        let m = api.get("/metrics").await;
        assert_eq!(m.status, 200);
        assert!(m.headers["content-type"].to_str().unwrap().starts_with("text/plain"));
        for line in [
            "warden_tasks_submitted_total 1",
            "warden_tasks_finished_total{status=\"completed\"} 1",
            "warden_tasks_running 0",
            "warden_task_duration_seconds_count 1",
            "warden_plugins_loaded 2",
            "# TYPE warden_task_duration_seconds histogram",
        ] {
            assert!(m.text.lines().any(|l| l == line), "missing {line:?} in\n{}", m.text);
        }
        let r = api.get("/v1/nope").await;
        assert_eq!((r.status, r.body["error"]["code"].as_str()), (404, Some("not_found")));
        let r = api.send(api.http.delete(api.url("/v1/tasks"))).await;
        assert_eq!((r.status, r.body["error"]["code"].as_str()), (405, Some("method_not_allowed")));
    }
}

/// `plugins.ready_instances` through the whole server: tasks run on instances made ahead.
mod ready_instances {
    use super::*;

    fn taken(metrics: &str) -> u64 {
        let line = metrics.lines().find(|l| l.starts_with("warden_plugin_ready_instances_total{outcome=\"taken\"}"));
        line.and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{metrics}"))
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn tasks_run_on_ready_instances_when_they_are_on() {
        let plugins = [(test_plugin("echo"), "echo"), (test_plugin("hostile"), "hostile")];
        let api = api_with(&plugins, &format!("  ready_instances: 4{ECHO_AND_HOSTILE}"), vec![]).await;
        let until = std::time::Instant::now() + Duration::from_secs(30);
        let mut i = 0;
        while taken(&api.get("/metrics").await.text) == 0 {
            assert!(std::time::Instant::now() < until, "no task found a ready instance");
            i += 1;
            let r = api.task("greeter", &format!("ready {i}"), false).await;
            assert_eq!((r.status, r.body["status"].as_str()), (200, Some("completed")), "{:?}", r.body);
            assert_eq!(r.body["output"], format!("ready {i}"), "each task answers its own prompt");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

mod memory_growth {
    use super::*;

    fn sample(metrics: &str, name: &str, plugin: &str) -> u64 {
        let prefix = format!("{name}{{plugin=\"{plugin}\"}} ");
        let line = metrics.lines().find(|l| l.starts_with(&prefix));
        line.and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{metrics}"))
    }

    /// `/metrics` says which plugins grow memory: the echo test plugin (Rust's default
    /// allocator) grows at every call, the hostile one (the SDK's arena) at none.
    #[tokio::test(flavor = "multi_thread")]
    async fn metrics_count_each_plugins_growing_calls() {
        let api = api().await;
        for (agent, prompt) in [("greeter", "grow?"), ("hostile", "ping")] {
            let r = api.task(agent, prompt, false).await;
            assert_eq!((r.status, r.body["status"].as_str()), (200, Some("completed")), "{:?}", r.body);
        }
        let m = api.get("/metrics").await.text;
        assert!(sample(&m, "warden_plugin_grown_calls_total", "echo") >= 1, "{m}");
        assert_eq!(sample(&m, "warden_plugin_grown_calls_total", "hostile"), 0, "{m}");
        assert_eq!(sample(&m, "warden_plugin_paced_growths_total", "echo"), 0, "{m}");
    }
}

mod catalog {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn subagents_plugins_and_tool_schema() {
        let api = api().await;
        let r = api.get("/v1/subagents").await;
        assert_eq!(r.status, 200);
        let names: Vec<&str> =
            r.body["subagents"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
        assert_eq!(names, vec!["greeter", "hostile"]);
        assert!(r.body["registrations"].as_str().unwrap().contains("-greeter: Greets people"));
        let r = api.get("/v1/plugins").await;
        let ids: Vec<&str> = r.body["plugins"].as_array().unwrap().iter().map(|p| p["id"].as_str().unwrap()).collect();
        assert_eq!(ids, vec!["echo", "hostile"]);
        assert_eq!(r.body["plugins"][0]["state"], "loaded");
        let r = api.get("/v1/tools").await;
        let tools = r.body["tools"].as_array().unwrap();
        assert_eq!(tools[0]["name"], "Task");
        assert_eq!(tools[1]["name"], "TaskOutput");
        assert!(tools[0]["description"].as_str().unwrap().contains("-greeter: Greets people"));
        assert_eq!(tools[0]["input_schema"]["properties"]["subagent_type"]["enum"], json!(["greeter", "hostile"]));
        assert_eq!(tools[0]["input_schema"]["required"], json!(["description", "prompt", "subagent_type"]));
    }
}

mod tasks {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn sync_and_background_tasks() {
        let api = api().await;
        let r = api.task("greeter", "hello api", false).await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(r.body["status"], "completed");
        assert_eq!(r.body["output"], "hello api");
        assert_eq!(r.body["finish_reason"], "stop");
        assert!(r.body["task_id"].as_str().unwrap().starts_with("task_"));

        let r = api.task("greeter", "in the background", true).await;
        assert_eq!(r.status, 202, "{}", r.text);
        let id = r.body["task_id"].as_str().unwrap().to_owned();
        assert_eq!(r.headers["location"], format!("/v1/tasks/{id}").as_str());
        let out = api.get(&format!("/v1/tasks/{id}?block=true&timeout_ms=5000")).await;
        assert_eq!(out.status, 200);
        assert_eq!(
            (out.body["status"].as_str(), out.body["output"].as_str()),
            (Some("completed"), Some("in the background"))
        );
        // TaskOutput's tool parameter name works as an alias.
        assert_eq!(api.get(&format!("/v1/tasks/{id}?timeout=10")).await.body["status"], "completed");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_failing_plugin_is_a_failed_task_not_an_http_error() {
        let api = api().await;
        let r = api.task("hostile", "panic", false).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.body["status"], "failed");
        assert_eq!(r.body["finish_reason"], "error");
        assert!(r.body["error"].as_str().unwrap().contains("panicked"), "{}", r.text);
    }

    /// Regression: only a plugin's result was held to `max_output`; its error value's
    /// message and the question of a task that needs input were stored and streamed
    /// whole (the `finish` event, the record, every follower).
    #[tokio::test(flavor = "multi_thread")]
    async fn regression_a_plugin_s_error_and_question_are_bounded_before_they_are_stored() {
        let api = api().await;
        let r = api.task("hostile", "fail:internal:1000000", false).await;
        assert_eq!(
            (r.status, r.body["status"].as_str()),
            (200, Some("failed")),
            "{}",
            r.text.chars().take(300).collect::<String>()
        );
        let error = r.body["error"].as_str().unwrap();
        let max = warden::task::MAX_ERROR_BYTES;
        assert!(
            error.len() <= max + 100 && error.contains(&format!("errors are kept to {max} bytes")),
            "{}",
            error.len()
        );
        let id = r.body["task_id"].as_str().unwrap();
        let events = api.stream(&format!("/v1/tasks/{id}/events"), None, None).await.rest().await;
        let finish = events.last().unwrap();
        assert_eq!(finish.data["type"], "finish");
        assert!(finish.data["error"].as_str().unwrap().len() <= max + 100);
        // A question longer than the plugin's `max_output` (1 MiB) is refused like an output.
        let r = api.task("hostile", &format!("fail:input-required:{}", 2 << 20), false).await;
        assert_eq!(
            (r.status, r.body["status"].as_str()),
            (200, Some("failed")),
            "{}",
            r.text.chars().take(300).collect::<String>()
        );
        assert!(r.body["error"].as_str().unwrap().contains("more than the output limit"), "{}", r.text);
        assert!(r.body["output"].is_null());
    }

    /// Regression: a task stored and streamed every event sent to it; only the plugin's
    /// own calls were budgeted. Past `server.max_events_per_task` (or the bytes) events are
    /// dropped with one marker naming the key; the `finish` is kept.
    #[tokio::test(flavor = "multi_thread")]
    async fn regression_a_task_stores_at_most_its_event_budget() {
        let yaml = format!(
            "{}server:\n  heartbeat: 200ms\n  max_events_per_task: 30\n  max_event_bytes_per_task: 64KiB\n",
            ECHO_AND_HOSTILE.replace("  limit_overrides:", "    hostile: { events: true }\n  limit_overrides:")
        );
        let api = api_with(&[(test_plugin("echo"), "echo"), (test_plugin("hostile"), "hostile")], &yaml, vec![]).await;
        let run = |script: Value| {
            let api = &api;
            async move {
                let r = api.task("hostile", &format!("script:{script}"), false).await;
                assert_eq!(r.body["status"], "completed", "{}", r.text);
                let id = r.body["task_id"].as_str().unwrap().to_owned();
                api.stream(&format!("/v1/tasks/{id}/events"), None, None).await.rest().await
            }
        };
        let many = run(json!([{ "op": "emit", "kind": "progress", "data": "{\"n\":1}", "repeat": 500 }])).await;
        assert!(many.len() <= 32, "{} events kept", many.len());
        let marker: Vec<&SseEvent> = many.iter().filter(|e| e.data["type"] == "events_dropped").collect();
        assert_eq!(marker.len(), 1, "{many:?}");
        assert_eq!(marker[0].data["limit"], "server.max_events_per_task");
        assert_eq!(many.last().unwrap().data["type"], "finish");
        let big = format!("{{\"m\":\"{}\"}}", "x".repeat(8000));
        let large = run(json!([{ "op": "emit", "kind": "progress", "data": big, "repeat": 20 }])).await;
        let marker = large.iter().find(|e| e.data["type"] == "events_dropped").expect("a marker");
        assert_eq!(marker.data["limit"], "server.max_event_bytes_per_task");
        let kept: usize = large
            .iter()
            .filter(|e| e.data["type"] != "finish" && e.data["type"] != "events_dropped")
            .map(|e| e.data.to_string().len())
            .sum();
        assert!(kept <= 64 * 1024 && large.len() < 20, "{kept} bytes in {} events kept", large.len());
        assert_eq!(large.last().unwrap().data["type"], "finish");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn task_output_without_blocking_and_with_a_short_timeout() {
        let api = api().await;
        let id = api.task("hostile", "loop", true).await.body["task_id"].as_str().unwrap().to_owned();
        let r = api.get(&format!("/v1/tasks/{id}?block=false")).await;
        assert!(["submitted", "working"].contains(&r.body["status"].as_str().unwrap()), "{}", r.text);
        let t = Instant::now();
        let r = api.get(&format!("/v1/tasks/{id}?timeout_ms=300")).await;
        assert_eq!(r.body["status"], "working");
        assert!(t.elapsed() >= Duration::from_millis(300) && t.elapsed() < Duration::from_secs(5));
        assert_eq!(api.post(&format!("/v1/tasks/{id}/cancel"), json!({})).await.status, 200);
    }

    /// Regression: a task's `description` was unbounded (a caller could make every task
    /// list, the store and the task feed carry megabytes per task).
    #[tokio::test(flavor = "multi_thread")]
    async fn regression_a_task_description_is_bounded_at_4_kib() {
        let api = api().await;
        let max = warden::task::MAX_DESCRIPTION_BYTES;
        let body = |d: String| json!({ "description": d, "prompt": "hi", "subagent_type": "greeter" });
        let r = api.post("/v1/tasks", body("é".repeat(max / 2 + 1))).await;
        assert_eq!((r.status, r.body["error"]["code"].as_str()), (400, Some("invalid_field")), "{}", r.text);
        let message = r.body["error"]["message"].as_str().unwrap();
        assert!(message.contains("`description`") && message.contains(&max.to_string()), "{message}");
        let r = api.post("/v1/tasks", body("d".repeat(max))).await;
        assert_eq!((r.status, r.body["status"].as_str()), (200, Some("completed")), "{}", r.text);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn client_mistakes_are_4xx_json_errors() {
        let api = api().await;
        let code = |r: &Reply| r.body["error"]["code"].as_str().map(str::to_owned);
        let r = api.post("/v1/tasks", json!({ "description": "d", "subagent_type": "greeter" })).await;
        assert_eq!((r.status, code(&r).as_deref()), (400, Some("missing_field")));
        assert!(r.body["error"]["message"].as_str().unwrap().contains("`prompt`"));
        let r = api.post("/v1/tasks", json!({ "prompt": "p", "subagent_type": "greeter" })).await;
        assert!(r.status == 400 && r.body["error"]["message"].as_str().unwrap().contains("`description`"));
        let r = api.post("/v1/tasks", json!({ "description": "d", "prompt": "p" })).await;
        assert!(r.status == 400 && r.body["error"]["message"].as_str().unwrap().contains("`subagent_type`"));
        let r = api.post("/v1/tasks", json!({ "description": "d", "prompt": "p", "subagent_type": "nobody" })).await;
        assert_eq!((r.status, code(&r).as_deref()), (400, Some("unknown_subagent")));
        assert!(r.body["error"]["message"].as_str().unwrap().contains("available: greeter, hostile"), "{}", r.text);
        let r = api.post_raw("/v1/tasks", "{\"description\": ").await;
        assert_eq!((r.status, code(&r).as_deref()), (400, Some("malformed_json")));
        let r = api.post_raw("/v1/tasks", "").await;
        assert_eq!((r.status, code(&r).as_deref()), (400, Some("malformed_json")));
        let r = api.post("/v1/tasks", json!({ "description": "d", "prompt": 5, "subagent_type": "greeter" })).await;
        assert_eq!((r.status, code(&r).as_deref()), (400, Some("invalid_field")));
        assert!(r.body["error"]["message"].as_str().unwrap().starts_with("prompt:"), "{}", r.text);
        let r = api
            .post(
                "/v1/tasks",
                json!({ "description": "d", "prompt": "p", "subagent_type": "greeter", "run_in_background": "yes" }),
            )
            .await;
        assert_eq!(r.status, 400);
        let r = api
            .post(
                "/v1/tasks",
                json!({ "description": "d", "prompt": "p", "subagent_type": "greeter", "tool_context": { "k": 1 } }),
            )
            .await;
        assert!(r.status == 400 && r.body["error"]["message"].as_str().unwrap().contains("tool_context"), "{}", r.text);
        let r = api
            .post(
                "/v1/tasks",
                json!({ "description": "d", "prompt": "p", "subagent_type": "greeter", "run_in_backgound": true }),
            )
            .await;
        assert_eq!((r.status, code(&r).as_deref()), (400, Some("invalid_field")));
        let r = api
            .post(
                "/v1/tasks",
                json!({ "description": "d", "prompt": "p", "subagent_type": "greeter", "session_id": "../etc" }),
            )
            .await;
        assert_eq!((r.status, code(&r).as_deref()), (400, Some("invalid_field")));
        let r = api.post("/v1/tasks", json!([1, 2])).await;
        assert_eq!(r.status, 400);
        // A task's egress list is checked whole before the task exists (issue 21).
        for (egress, names) in
            [(json!(["pypi.org", "*"]), "egress[1]"), (json!(["a b"]), "egress[0]"), (json!("pypi.org"), "egress")]
        {
            let r = api
                .post(
                    "/v1/tasks",
                    json!({ "description": "d", "prompt": "p", "subagent_type": "greeter", "egress": egress }),
                )
                .await;
            assert_eq!((r.status, code(&r).as_deref()), (400, Some("invalid_field")), "{}", r.text);
            assert!(r.body["error"]["message"].as_str().unwrap().contains(names), "{names}: {}", r.text);
        }
        // `isolation` takes `fork` only: another value names the field and the accepted ones.
        for isolation in ["worktree", "Fork", ""] {
            let r = api
                .post(
                    "/v1/tasks",
                    json!({ "description": "d", "prompt": "p", "subagent_type": "greeter", "isolation": isolation }),
                )
                .await;
            assert_eq!((r.status, code(&r).as_deref()), (400, Some("invalid_field")), "{}", r.text);
            let message = r.body["error"]["message"].as_str().unwrap();
            assert!(
                message.starts_with(&format!("invalid isolation: unknown isolation {isolation:?} (accepted: fork)")),
                "{message}"
            );
        }
        let big = json!({ "description": "d", "prompt": "x".repeat(2 << 20), "subagent_type": "greeter" });
        // Its own connection: the server answers 413 without reading the body and closes it.
        let r = api
            .send(
                reqwest::Client::new()
                    .post(api.url("/v1/tasks"))
                    .header("content-type", "application/json")
                    .body(big.to_string()),
            )
            .await;
        assert_eq!((r.status, code(&r).as_deref()), (413, Some("body_too_large")));
        for path in ["/v1/tasks/task_nope", "/v1/tasks/task_nope/events"] {
            let r = api.get(path).await;
            assert_eq!((r.status, code(&r).as_deref()), (404, Some("task_not_found")), "{path}");
        }
        let r = api.post("/v1/tasks/task_nope/cancel", json!({})).await;
        assert_eq!((r.status, code(&r).as_deref()), (404, Some("task_not_found")));
        let r = api.get("/v1/tasks/task_nope?block=perhaps").await;
        assert_eq!((r.status, code(&r).as_deref()), (400, Some("invalid_query")));
        let r = api.send(api.http.get(api.url("/v1/tasks/task_nope/events")).header("last-event-id", "abc")).await;
        assert_eq!(r.status, 400);
        // None of these reached the engine as a task.
        assert_eq!(api.engine.metrics.submitted.load(std::sync::atomic::Ordering::Relaxed), 0);
    }
}

mod cancel {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn cancel_interrupts_a_spinning_plugin() {
        let api = api().await;
        let id = api.spinner().await;
        let t = Instant::now();
        let r = api.post(&format!("/v1/tasks/{id}/cancel"), json!({})).await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!((r.body["status"].as_str(), r.body["finish_reason"].as_str()), (Some("canceled"), Some("canceled")));
        // The spinner (WIT 0.2.0) ignores the cancellation: its call is dropped when its
        // grace period for cleaning up ends.
        let bound = warden::runtime::CANCEL_GRACE + Duration::from_secs(2);
        assert!(t.elapsed() < bound, "cancel took {:?}", t.elapsed());
        assert_eq!(api.engine.running(), 0, "the slot is free again");
        let r = api.post(&format!("/v1/tasks/{id}/cancel"), json!({})).await;
        assert_eq!((r.status, r.body["error"]["code"].as_str()), (409, Some("task_finished")));
        assert_eq!(api.get(&format!("/v1/tasks/{id}")).await.body["status"], "canceled");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_task_deadline_stops_a_task() {
        let yaml = format!("{ECHO_AND_HOSTILE}server:\n  task_timeout: 500ms\n  heartbeat: 200ms\n");
        let api = api_with(
            &[(test_plugin("hostile"), "hostile")],
            &yaml.replace(
                "    - { uri: \"echo://greeter\", kind: ECHO, metadata: { description: Greets people } }\n",
                "",
            ),
            vec![],
        )
        .await;
        let t = Instant::now();
        let r = api.task("hostile", "loop", false).await;
        assert_eq!(
            (r.body["status"].as_str(), r.body["finish_reason"].as_str()),
            (Some("failed"), Some("deadline")),
            "{}",
            r.text
        );
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn queued_tasks_wait_for_a_slot_and_can_be_canceled_while_queued() {
        let yaml = format!("{ECHO_AND_HOSTILE}server:\n  max_concurrent_tasks: 1\n  heartbeat: 200ms\n");
        let api = api_with(&[(test_plugin("echo"), "echo"), (test_plugin("hostile"), "hostile")], &yaml, vec![]).await;
        let spinner = api.spinner().await;
        let queued = api.task("greeter", "after you", true).await.body["task_id"].as_str().unwrap().to_owned();
        let doomed = api.task("greeter", "never", true).await.body["task_id"].as_str().unwrap().to_owned();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(api.get(&format!("/v1/tasks/{queued}?block=false")).await.body["status"], "submitted");
        assert!(api.get("/metrics").await.text.contains("warden_tasks_queued 2"));
        assert_eq!(api.post(&format!("/v1/tasks/{doomed}/cancel"), json!({})).await.body["status"], "canceled");
        api.post(&format!("/v1/tasks/{spinner}/cancel"), json!({})).await;
        let r = api.get(&format!("/v1/tasks/{queued}?timeout_ms=5000")).await;
        assert_eq!((r.body["status"].as_str(), r.body["output"].as_str()), (Some("completed"), Some("after you")));
    }
}

/// Per-user shares of the host's pools.
mod quotas {
    use super::*;

    /// A background task of `user` that sleeps 40 s (under the hostile plugin's 60 s limit).
    async fn sleeper_of(api: &Api, user: &str) -> Reply {
        let body = json!({ "description": "sleep", "prompt": r#"script:[{"op":"sleep","ms":40000}]"#,
            "subagent_type": "hostile", "run_in_background": true, "user_id": user });
        api.post("/v1/tasks", body).await
    }

    /// Regression: `server.max_concurrent_tasks` and `server.max_queued_tasks` were the
    /// only bounds on tasks: one user submitting a burst took the slot and the whole queue,
    /// and every other user got `503 queue_full`. Now a user's tasks past
    /// `server.max_tasks_per_user` are refused (429 naming the key) and another user's
    /// task is still taken.
    #[tokio::test(flavor = "multi_thread")]
    async fn regression_one_user_cannot_fill_the_task_queue() {
        let yaml = format!(
            "{ECHO_AND_HOSTILE}server:\n  heartbeat: 200ms\n  max_concurrent_tasks: 1\n  max_queued_tasks: 4\n  max_tasks_per_user: 2\n"
        );
        let api = api_with(&[(test_plugin("echo"), "echo"), (test_plugin("hostile"), "hostile")], &yaml, vec![]).await;
        // As many tasks as the host takes (its slot and its queue), all of one user.
        let mut accepted = vec![];
        let mut refused = vec![];
        for _ in 0..5 {
            let r = sleeper_of(&api, "mallory").await;
            match r.status {
                202 => accepted.push(r.body["task_id"].as_str().unwrap().to_owned()),
                _ => refused.push(r),
            }
        }
        assert_eq!(accepted.len(), 2, "one user holds its share of the host, no more");
        for r in &refused {
            assert_eq!((r.status, r.body["error"]["code"].as_str()), (429, Some("too_many_user_tasks")), "{}", r.text);
            let message = r.body["error"]["message"].as_str().unwrap();
            assert!(message.contains("server.max_tasks_per_user") && message.contains("mallory"), "{message}");
        }
        // Another user's task is taken (it waits for the slot).
        let other = sleeper_of(&api, "alice").await;
        assert_eq!(other.status, 202, "{}", other.text);
        let other = other.body["task_id"].as_str().unwrap().to_owned();
        // A finished task makes room for its user again.
        let r = api.post(&format!("/v1/tasks/{}/cancel", accepted[0]), json!({})).await;
        assert_eq!(r.status, 200, "{}", r.text);
        let again = sleeper_of(&api, "mallory").await;
        assert_eq!(again.status, 202, "{}", again.text);
        accepted[0] = again.body["task_id"].as_str().unwrap().to_owned();
        for id in accepted.iter().chain([&other]) {
            api.post(&format!("/v1/tasks/{id}/cancel"), json!({})).await;
        }
    }

    /// The task's status, and its `queue` place while it waits.
    async fn status_of(api: &Api, id: &str) -> (String, Value) {
        let r = api.get(&format!("/v1/tasks/{id}?block=false")).await;
        assert_eq!(r.status, 200, "{}", r.text);
        (r.body["status"].as_str().unwrap().to_owned(), r.body["queue"].clone())
    }

    /// Regression (issue 41): slots went first come first served across users, so one
    /// user's backlog of waiting tasks held every other user's task `submitted` until the
    /// whole backlog had run (or was canceled). Now the next free slot goes to the user
    /// with the fewest running tasks: with user A's 100 tasks waiting, user B's one task
    /// starts at the first slot that frees, and shows meanwhile where it stands and why.
    #[tokio::test(flavor = "multi_thread")]
    async fn regression_a_users_backlog_does_not_starve_another_users_task() {
        let yaml = format!("{ECHO_AND_HOSTILE}server:\n  heartbeat: 200ms\n  max_concurrent_tasks: 2\n");
        let api = api_with(&[(test_plugin("echo"), "echo"), (test_plugin("hostile"), "hostile")], &yaml, vec![]).await;
        let mut backlog = vec![];
        for _ in 0..100 {
            let r = sleeper_of(&api, "anna").await;
            assert_eq!(r.status, 202, "{}", r.text);
            backlog.push(r.body["task_id"].as_str().unwrap().to_owned());
        }
        let wait_for = |id: String, status: &'static str| {
            let api = &api;
            async move {
                let t = Instant::now();
                loop {
                    let (now, _) = status_of(api, &id).await;
                    if now == status {
                        return;
                    }
                    assert!(t.elapsed() < Duration::from_secs(30), "{id} is still {now}, not {status}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        wait_for(backlog[0].clone(), "working").await;
        wait_for(backlog[1].clone(), "working").await;
        let r = sleeper_of(&api, "ben").await;
        assert_eq!(r.status, 202, "{}", r.text);
        let ben = r.body["task_id"].as_str().unwrap().to_owned();
        let (status, queue) = status_of(&api, &ben).await;
        assert_eq!(status, "submitted");
        assert_eq!((&queue["position"], &queue["reason"]), (&json!(1), &json!("slots_busy")), "{queue}");
        assert!(queue["message"].as_str().unwrap().contains("server.max_concurrent_tasks"), "{queue}");
        let (_, queue) = status_of(&api, &backlog[2]).await;
        assert_eq!(queue["position"], 2, "anna's next task comes after ben's: {queue}");
        // One slot frees: ben's task takes it, not anna's next one.
        api.post(&format!("/v1/tasks/{}/cancel", backlog[0]), json!({})).await;
        wait_for(ben.clone(), "working").await;
        let (status, queue) = status_of(&api, &backlog[2]).await;
        assert_eq!((status.as_str(), &queue["position"]), ("submitted", &json!(1)), "{queue}");
        let (_, running) = status_of(&api, &ben).await;
        assert!(running.is_null(), "a running task has no queue place: {running}");
        for id in backlog.iter().rev().chain([&ben]) {
            api.post(&format!("/v1/tasks/{id}/cancel"), json!({})).await;
        }
    }

    /// `server.max_running_per_user` keeps slots for other users: a user at it waits with
    /// that reason while another user's task starts at once.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_user_runs_at_most_max_running_per_user_tasks() {
        let yaml = format!(
            "{ECHO_AND_HOSTILE}server:\n  heartbeat: 200ms\n  max_concurrent_tasks: 3\n  max_running_per_user: 1\n"
        );
        let api = api_with(&[(test_plugin("echo"), "echo"), (test_plugin("hostile"), "hostile")], &yaml, vec![]).await;
        let first = sleeper_of(&api, "anna").await.body["task_id"].as_str().unwrap().to_owned();
        let second = sleeper_of(&api, "anna").await.body["task_id"].as_str().unwrap().to_owned();
        let other = sleeper_of(&api, "ben").await.body["task_id"].as_str().unwrap().to_owned();
        let t = Instant::now();
        while status_of(&api, &other).await.0 != "working" || status_of(&api, &first).await.0 != "working" {
            assert!(t.elapsed() < Duration::from_secs(30), "the first tasks of anna and ben did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (status, queue) = status_of(&api, &second).await;
        assert_eq!(status, "submitted", "a slot is free, but anna runs her share");
        assert_eq!((&queue["position"], &queue["reason"]), (&json!(1), &json!("user_running_limit")), "{queue}");
        assert!(queue["message"].as_str().unwrap().contains("server.max_running_per_user"), "{queue}");
        for id in [&second, &first, &other] {
            api.post(&format!("/v1/tasks/{id}/cancel"), json!({})).await;
        }
    }

    #[test]
    fn max_running_per_user_is_validated_and_defaults_to_a_share_of_the_slots() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("w.yaml");
        std::fs::write(&file, "server:\n  max_running_per_user: 0\n").unwrap();
        let e = Config::from_file(&file).unwrap_err().to_string();
        assert!(e.contains("server.max_running_per_user") && e.contains("at least 1"), "{e}");
        std::fs::write(&file, "server:\n  max_concurrent_tasks: 32\n").unwrap();
        let options = EngineOptions::from_config(&Config::from_file(&file).unwrap());
        assert_eq!(options.max_running_per_user, 24, "a quarter of the slots is kept for other users");
        std::fs::write(&file, "server:\n  max_concurrent_tasks: 4\n  max_running_per_user: 9\n").unwrap();
        let options = EngineOptions::from_config(&Config::from_file(&file).unwrap());
        assert_eq!(options.max_running_per_user, 4, "at most every slot");
    }

    #[test]
    fn max_tasks_per_user_is_validated() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("w.yaml");
        std::fs::write(&file, "server:\n  max_tasks_per_user: 0\n").unwrap();
        let e = Config::from_file(&file).unwrap_err().to_string();
        assert!(e.contains("server.max_tasks_per_user") && e.contains("at least 1"), "{e}");
        assert_eq!(Config::default().server.max_tasks_per_user, warden::config::DEFAULT_MAX_TASKS_PER_USER);
    }
}

/// What a client may hold open: connections before authentication (`server.max_connections`,
/// `server.header_read_timeout`) and, per principal, streams and long polls
/// (`server.max_streams_per_principal`).
mod holds {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A connection that sends part of a request head and never the rest.
    async fn stalled(api: &Api) -> tokio::net::TcpStream {
        let addr = api.base.trim_start_matches("http://");
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ").await.unwrap();
        tcp
    }

    /// Regression: `axum::serve` set no timer and no connection limit, so a client that
    /// never finished its request head (no token needed: authentication runs on a whole
    /// head) held its connection forever, and a few thousand took every file descriptor.
    /// Now such a connection is closed after `server.first_request_timeout`, and past
    /// `server.max_connections` a new connection closes the oldest one that never sent a
    /// request instead of waiting behind it.
    #[tokio::test(flavor = "multi_thread")]
    async fn regression_a_client_that_never_finishes_its_request_head_holds_no_connection() {
        let yaml = format!("{ECHO_AND_HOSTILE}server:\n  heartbeat: 200ms\n  first_request_timeout: 300ms\n");
        let api = api_with(&[(test_plugin("echo"), "echo"), (test_plugin("hostile"), "hostile")], &yaml, vec![]).await;
        let mut tcp = stalled(&api).await;
        let mut buf = [0u8; 1024];
        let read = tokio::time::timeout(Duration::from_secs(20), tcp.read(&mut buf)).await;
        let n = read.expect("the server still holds a connection whose head never came").unwrap_or(0);
        // Closed, with at most hyper's `408`-free close (no response to a request never made).
        assert!(n == 0 || !String::from_utf8_lossy(&buf[..n]).contains("200 OK"), "{:?}", &buf[..n]);
        assert_eq!(api.get("/healthz").await.status, 200);

        let yaml = format!("{ECHO_AND_HOSTILE}server:\n  heartbeat: 200ms\n  max_connections: 2\n");
        let api = api_with(&[(test_plugin("echo"), "echo"), (test_plugin("hostile"), "hostile")], &yaml, vec![]).await;
        let mut first = stalled(&api).await;
        let mut second = stalled(&api).await;
        // A third connection is served (a hang guard far below the 5 s first-request timeout,
        // which would otherwise free a place) ...
        let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().unwrap();
        let health =
            http.get(api.url("/healthz")).send().await.expect("served while two stalled connections held the cap");
        assert_eq!(health.status(), 200);
        // ... by closing the oldest stalled one; the second still waits for its head.
        let closed = tokio::time::timeout(Duration::from_secs(2), first.read(&mut buf)).await;
        assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "the oldest stalled connection is closed: {closed:?}");
        let open = tokio::time::timeout(Duration::from_millis(300), second.read(&mut buf)).await;
        assert!(open.is_err(), "the newer stalled connection is kept: {open:?}");
    }

    /// Raises this process's open-file limit to at least `n` (up to the hard limit): the
    /// flood holds both ends of its sockets.
    fn raise_fd_limit(n: u64) -> u64 {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit/setrlimit with a valid pointer to an rlimit.
        unsafe {
            assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
            if lim.rlim_cur < n {
                lim.rlim_cur = n.min(lim.rlim_max);
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            }
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        }
        lim.rlim_cur
    }

    /// Opens `n` connections to `api` that send nothing.
    pub(crate) async fn idle_sockets(api: &Api, n: usize) -> Vec<tokio::net::TcpStream> {
        let addr = api.base.trim_start_matches("http://").to_owned();
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
        }
        out
    }

    /// Regression (issue 41): 520 TCP connections that sent nothing held the 512 places of
    /// `server.max_connections` until the 30 s header timeout, renewable for ever: `/healthz`
    /// answered after 28 s and an authenticated request waited as long. Now the flood only
    /// closes its own sockets: both are served (a 3 s hang guard, under the 5 s first-request
    /// timeout that would otherwise free places), and the flood provably filled the cap.
    #[tokio::test(flavor = "multi_thread")]
    async fn regression_idle_sockets_do_not_stall_healthz_or_an_authenticated_request() {
        const FLOOD: usize = 1_000;
        let limit = raise_fd_limit(4 * FLOOD as u64);
        assert!(limit >= 3 * FLOOD as u64, "ulimit -n is {limit}: the flood needs both ends of {FLOOD} sockets");
        let tokens = vec!["tok-flood".to_owned()];
        let api =
            api_with(&[(test_plugin("echo"), "echo"), (test_plugin("hostile"), "hostile")], ECHO_AND_HOSTILE, tokens)
                .await;
        let flood = idle_sockets(&api, FLOOD).await;
        let http = reqwest::Client::builder().timeout(Duration::from_secs(3)).build().unwrap();
        let health = http.get(api.url("/healthz")).send().await.expect("/healthz behind idle sockets");
        assert_eq!(health.status(), 200);
        let tasks = http
            .get(api.url("/v1/tasks"))
            .bearer_auth("tok-flood")
            .send()
            .await
            .expect("an authenticated request behind idle sockets");
        assert_eq!(tasks.status(), 200);
        // Positive control: the flood went past the cap — the server closed the excess.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut buf = [0u8; 1];
        let closed = flood
            .iter()
            .filter(|s| !matches!(s.try_read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock))
            .count();
        let cap = warden::config::DEFAULT_MAX_CONNECTIONS;
        assert!(closed >= FLOOD - cap, "{closed} of {FLOOD} idle sockets closed; the cap is {cap}");
    }

    /// Regression: nothing bounded the streams and long polls of one principal: its stalled
    /// event streams took every connection (and, with whole-log replays, gigabytes) of
    /// every tenant. Now past `server.max_streams_per_principal` they are refused with 429
    /// naming the key, whichever kind; another principal still gets its own, and a closed
    /// stream makes room again.
    #[tokio::test(flavor = "multi_thread")]
    async fn regression_one_principal_cannot_hold_every_stream() {
        let yaml = format!("{ECHO_AND_HOSTILE}server:\n  heartbeat: 200ms\n  max_streams_per_principal: 2\n");
        let tokens = vec!["tok-one".to_owned(), "tok-two".to_owned()];
        let api = api_with(&[(test_plugin("echo"), "echo"), (test_plugin("hostile"), "hostile")], &yaml, tokens).await;
        let as_one = |req: reqwest::RequestBuilder| req.bearer_auth("tok-one");
        let body =
            json!({ "description": "d", "prompt": "loop", "subagent_type": "hostile", "run_in_background": true });
        let r = api.send(as_one(api.http.post(api.url("/v1/tasks")).json(&body))).await;
        assert_eq!(r.status, 202, "{}", r.text);
        let id = r.body["task_id"].as_str().unwrap().to_owned();
        let events = format!("/v1/tasks/{id}/events");
        let open = |token: &'static str| {
            let req = api.http.get(api.url(&events)).header("accept", "text/event-stream").bearer_auth(token);
            async move { req.send().await.unwrap() }
        };
        let first = open("tok-one").await;
        let second = open("tok-one").await;
        assert_eq!((first.status().as_u16(), second.status().as_u16()), (200, 200));
        // Every kind of hold is refused past the share: a stream, a long poll, the task list
        // feed, a task started with a stream.
        let refused = [
            api.send(as_one(api.http.get(api.url(&events)))).await,
            api.send(as_one(api.http.get(api.url(&format!("/v1/tasks/{id}?block=true&timeout_ms=100"))))).await,
            api.send(as_one(api.http.get(api.url("/v1/tasks/changes")))).await,
            api.send(as_one(api.http.post(api.url("/v1/tasks")).header("accept", "text/event-stream").json(&body)))
                .await,
        ];
        for r in &refused {
            assert_eq!((r.status, r.body["error"]["code"].as_str()), (429, Some("too_many_streams")), "{}", r.text);
            assert!(r.text.contains("server.max_streams_per_principal"), "{}", r.text);
        }
        let listed = api.send(as_one(api.http.get(api.url("/v1/tasks?limit=50")))).await;
        let tasks = listed.body["tasks"].as_array().map(Vec::len);
        assert_eq!(tasks, Some(1), "a refused streamed submission started no task: {}", listed.text);
        // Not a long poll: answered.
        let r = api.send(as_one(api.http.get(api.url(&format!("/v1/tasks/{id}?block=false"))))).await;
        assert_eq!(r.status, 200, "{}", r.text);
        // Another principal has its own share.
        assert_eq!(open("tok-two").await.status().as_u16(), 200);
        // A closed stream makes room (once its follower sees the reader gone).
        drop(first);
        let t = Instant::now();
        loop {
            let r = open("tok-one").await;
            if r.status().as_u16() == 200 {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "a closed stream never gave its place back");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        drop(second);
        let r = api.send(as_one(api.http.post(api.url(&format!("/v1/tasks/{id}/cancel"))))).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
}

mod streams {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn post_with_event_stream_accept_streams_the_task() {
        let api = api().await;
        let mut s = api
            .stream(
                "/v1/tasks",
                Some(json!({ "description": "d", "prompt": "streamed", "subagent_type": "greeter" })),
                None,
            )
            .await;
        let events = s.rest().await;
        assert_eq!(types(&events), vec!["status", "status", "plugin", "progress", "finish"], "{events:?}");
        assert_eq!(events[0].data["status"], "submitted");
        assert_eq!(events[0].data["task_id"].as_str(), s.task_id.as_deref());
        assert_eq!(events[1].data["status"], "working");
        // The plugin's own event, relayed with the subagent's name.
        // The host names the plugin build that runs the task.
        assert_eq!((events[2].data["id"].as_str(), events[2].data["version"].as_str()), (Some("echo"), Some("0.1.0")));
        assert_eq!(events[2].data["sha256"].as_str().map(str::len), Some(64));
        assert_eq!(events[2].data.get("source"), None, "a host event");
        // The plugin's own event, relayed with the subagent's name and marked as the plugin's.
        let own = &events[3].data;
        assert_eq!(
            (own["message"].as_str(), own["name"].as_str(), own["source"].as_str()),
            (Some("echoing"), Some("greeter"), Some("plugin"))
        );
        assert_eq!(
            (events[4].data["status"].as_str(), events[4].data["output"].as_str()),
            (Some("completed"), Some("streamed"))
        );
        let ids: Vec<u64> = events.iter().map(|e| e.id.unwrap()).collect();
        assert_eq!(ids, vec![1, 2, 3, 4, 5]);
        // Replay of a finished task, whole and from an id.
        let id = s.task_id.unwrap();
        let all = api.stream(&format!("/v1/tasks/{id}/events"), None, None).await.rest().await;
        assert_eq!(types(&all), types(&events));
        let tail = api.stream(&format!("/v1/tasks/{id}/events"), None, Some(2)).await.rest().await;
        assert_eq!(tail.iter().map(|e| e.id.unwrap()).collect::<Vec<_>>(), vec![3, 4, 5]);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn reconnecting_with_last_event_id_gets_every_event_exactly_once() {
        let api = api().await;
        let id = api.task("hostile", "loop", true).await.body["task_id"].as_str().unwrap().to_owned();
        let mut seen = vec![];
        {
            let mut s = api.stream(&format!("/v1/tasks/{id}/events"), None, None).await;
            // Live stream: submitted, working, plugin, then heartbeats while the plugin spins.
            while seen.len() < 3 {
                seen.push(s.next_event().await.unwrap());
            }
            let hb = s.next().await.unwrap();
            assert_eq!(hb.data["type"], "heartbeat");
            assert_eq!(hb.id, None, "heartbeats carry no id, so they never move Last-Event-ID");
        } // disconnect
        api.post(&format!("/v1/tasks/{id}/cancel"), json!({})).await;
        let last = seen.last().unwrap().id.unwrap();
        let mut s = api.stream(&format!("/v1/tasks/{id}/events"), None, Some(last)).await;
        seen.extend(s.rest().await);
        let ids: Vec<u64> = seen.iter().map(|e| e.id.unwrap()).collect();
        let expected: Vec<u64> = (1..=ids.len() as u64).collect();
        assert_eq!(ids, expected, "every id once, in order");
        assert_eq!(types(&seen), vec!["status", "status", "plugin", "error", "finish"]);
        assert_eq!(seen.last().unwrap().data["status"], "canceled");
        // And while the task is live: reconnect mid-stream of a running task.
        let id = api.task("hostile", "loop", true).await.body["task_id"].as_str().unwrap().to_owned();
        let mut s = api.stream(&format!("/v1/tasks/{id}/events"), None, None).await;
        let first = s.next_event().await.unwrap();
        drop(s);
        let mut s = api.stream(&format!("/v1/tasks/{id}/events"), None, first.id).await;
        let canceler = {
            let http = api.http.clone();
            let url = api.url(&format!("/v1/tasks/{id}/cancel"));
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                http.post(url).send().await.unwrap();
            })
        };
        let rest = s.rest().await;
        canceler.await.unwrap();
        let ids: Vec<u64> = std::iter::once(first.id.unwrap()).chain(rest.iter().map(|e| e.id.unwrap())).collect();
        assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>());
        assert_eq!(rest.last().unwrap().data["type"], "finish");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_task_finishes_after_its_http_client_disconnects() {
        let yaml = format!("{ECHO_AND_HOSTILE}server:\n  max_concurrent_tasks: 1\n  heartbeat: 200ms\n");
        let api = api_with(&[(test_plugin("echo"), "echo"), (test_plugin("hostile"), "hostile")], &yaml, vec![]).await;
        // Hold the only slot so the task is still pending when its client goes away.
        let spinner = api.spinner().await;
        let id = {
            let mut s = api
                .stream(
                    "/v1/tasks",
                    Some(json!({ "description": "d", "prompt": "still here", "subagent_type": "greeter" })),
                    None,
                )
                .await;
            let first = s.next_event().await.unwrap();
            assert_eq!(first.data["status"], "submitted");
            s.task_id.clone().unwrap()
        }; // the client disconnects here
        // A synchronous client that gives up does not stop its task either.
        let sync = api
            .http
            .post(api.url("/v1/tasks"))
            .header("content-type", "application/json")
            .body(json!({ "description": "d", "prompt": "sync too", "subagent_type": "greeter" }).to_string())
            .timeout(Duration::from_millis(200))
            .send()
            .await;
        assert!(sync.is_err(), "the sync request should time out on the client side");
        tokio::time::sleep(Duration::from_millis(200)).await;
        api.post(&format!("/v1/tasks/{spinner}/cancel"), json!({})).await;
        let r = api.get(&format!("/v1/tasks/{id}?timeout_ms=10000")).await;
        assert_eq!((r.body["status"].as_str(), r.body["output"].as_str()), (Some("completed"), Some("still here")));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let completed = api.engine.metrics.completed.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(completed, 2, "both the streamed and the abandoned sync task completed");
    }
}

mod auth {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn bearer_tokens_are_required_when_configured() {
        let api = api_with(
            &[(test_plugin("echo"), "echo")],
            ECHO_AND_HOSTILE,
            vec!["s3cret-one".into(), "s3cret-two".into()],
        )
        .await;
        assert_eq!(api.get("/healthz").await.status, 200, "health stays open for probes");
        let r = api.get("/v1/subagents").await;
        assert_eq!((r.status, r.body["error"]["code"].as_str()), (401, Some("unauthorized")));
        assert_eq!(r.headers["www-authenticate"], "Bearer");
        let r = api.send(api.http.get(api.url("/v1/subagents")).bearer_auth("s3cret-on")).await;
        assert_eq!(r.status, 401);
        let r = api.send(api.http.get(api.url("/v1/subagents")).bearer_auth("s3cret-two")).await;
        assert_eq!(r.status, 200);
        let r = api.send(api.http.get(api.url("/metrics")).bearer_auth("s3cret-one")).await;
        assert_eq!(r.status, 200);
    }

    /// Regression: every path under `/ui/` skipped the token, so a spelling of an API path
    /// through the console's prefix (`/ui/../v1/tasks` sent as is, escaped dot segments,
    /// backslashes) reached the router unauthenticated. Exactly the console's own paths and
    /// the probes are exempt now; everything else, however spelled, needs a token.
    #[tokio::test(flavor = "multi_thread")]
    async fn regression_only_the_consoles_own_paths_and_the_probes_skip_the_token() {
        let api = api_with(&[(test_plugin("echo"), "echo")], ECHO_AND_HOSTILE, vec!["s3cret".into()]).await;
        for path in ["/ui", "/ui/", "/ui/app.js", "/ui/app.css", "/ui/favicon.svg", "/healthz", "/readyz"] {
            let status = api.raw_get_status(path).await;
            assert!(status == 200 || (path == "/readyz" && status == 503), "{path}: {status}");
        }
        for path in [
            "/ui/../v1/tasks",
            "/ui/../v1/subagents",
            "/ui/%2e%2e/v1/tasks",
            "/ui/%2E%2E/v1/tasks",
            "/ui/..%2fv1/tasks",
            "/ui//../v1/tasks",
            "/ui//..",
            "/ui/./app.js",
            "/ui//app.js",
            "/ui/app.js/../../v1/tasks",
            "/ui/nothing-here",
            "/UI/app.js",
            "/healthz/../v1/tasks",
            "/healthz/",
            "/readyz/..",
            "//healthz",
            "/metrics",
            "/metrics/../healthz",
            "/a2a/greeter/.well-known/agent-card.json",
            "/a2a/greeter/.well-known/agent.json",
            "/v1/tasks",
        ] {
            assert_eq!(api.raw_get_status(path).await, 401, "{path} without a token");
        }
        // Not even a valid request target: refused before routing, never served.
        for path in ["/ui/..\\v1\\tasks", "/ui/\\..\\v1/tasks"] {
            let status = api.raw_get_status(path).await;
            assert!(status == 400 || status == 401, "{path}: {status}");
        }
    }

    #[test]
    fn an_open_api_binds_only_to_loopback() {
        let any: std::net::SocketAddr = "0.0.0.0:7878".parse().unwrap();
        let lo: std::net::SocketAddr = "127.0.0.1:7878".parse().unwrap();
        let lo6: std::net::SocketAddr = "[::1]:7878".parse().unwrap();
        let err = warden::server::check_bind(&any, &[], "WARDEN_TOKENS").unwrap_err().to_string();
        assert!(err.contains("WARDEN_TOKENS"), "{err}");
        assert!(warden::server::check_bind(&lo, &[], "WARDEN_TOKENS").is_ok());
        assert!(warden::server::check_bind(&lo6, &[], "WARDEN_TOKENS").is_ok());
        assert!(warden::server::check_bind(&any, &["t".into()], "WARDEN_TOKENS").is_ok());
        assert_eq!(warden::server::match_token(&["a".into(), "bb".into()], "bb"), Some(1));
        assert_eq!(warden::server::match_token(&["a".into(), "bb".into()], "b"), None);
        assert_eq!(warden::server::match_token(&["a".into()], ""), None);
    }
}

mod approvals {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn approval_endpoints_validate_their_input() {
        let api = api().await;
        let r = api.get("/v1/approvals").await;
        assert_eq!((r.status, r.body["approvals"].clone()), (200, json!([])));
        let r = api.post("/v1/approvals/apr_nope", json!({ "decision": "approve" })).await;
        assert_eq!((r.status, r.body["error"]["code"].as_str()), (404, Some("approval_not_found")));
        let r = api.post("/v1/approvals/apr_nope", json!({ "decision": "maybe" })).await;
        assert_eq!((r.status, r.body["error"]["code"].as_str()), (400, Some("invalid_field")));
        let r = api.post_raw("/v1/approvals/apr_nope", "{").await;
        assert_eq!(r.status, 400);
    }
}

/// Secrets never leave redacted form (issue 13). The Docker-backed end-to-end search of
/// every byte warden wrote is `sandboxed::every_byte_warden_writes_is_scrubbed_of_a_tool_context_secret`.
mod secrets {
    use super::*;

    /// A secret as real ones look and worse: a space (providers split text at spaces),
    /// unicode, regex metacharacters.
    pub const SECRET: &str = "Mk7c 1f-é日 [x]*?+(a|b)";

    pub fn assert_absent(what: &str, bytes: &[u8], secret: &str) {
        let forms = [
            secret.to_owned(),
            serde_json::to_string(secret).unwrap().trim_matches('"').to_owned(),
            format!("{secret:?}").trim_matches('"').to_owned(),
        ];
        for f in forms {
            assert!(!bytes.windows(f.len()).any(|w| w == f.as_bytes()), "secret ({f:?}) found in {what}");
        }
        // Neither half of a split secret escapes either.
        let (a, b) = secret.split_once(' ').unwrap();
        let whole = String::from_utf8_lossy(bytes);
        assert!(!(whole.contains(&format!("{a} ")) && whole.contains(b)), "both halves of the secret in {what}");
    }

    pub const STREAMER: &str = "---\nname: streamer\ndescription: Streams text\nmodel: sonnet\n---\nTalk.\n";

    #[tokio::test(flavor = "multi_thread")]
    async fn a_secret_split_over_token_events_and_a_pending_write_are_redacted() {
        // Word by word, the scripted provider streams the secret as two `token` events;
        // the Write waits at the gate with the secret in its input.
        let script = serde_json::to_string(&json!([
            { "reasoning": format!("thinking of {SECRET} now"), "text": format!("the key is {SECRET} ok"),
              "tool_calls": [
                  { "name": "Write", "arguments": { "file_path": "/workspace/out.txt", "content": format!("key={SECRET}") } },
                  // A tool the subagent lacks: the plugin logs its name through `log.write`.
                  { "name": format!("Tool{SECRET}"), "arguments": {} }
              ] },
            { "text": format!("done with {SECRET}") }
        ]))
        .unwrap();
        let yaml = claude_scripted("approval:\n  default: ask\n");
        let files = [("script.yaml", script.as_str()), ("agents/streamer.md", STREAMER)];
        let api = api_with_files(&[(bundled_plugin("claude"), "claude")], &yaml, vec![], &files).await;
        let body = json!({
            "description": format!("uses {SECRET}"), "prompt": format!("use {SECRET}"), "subagent_type": "streamer",
            "session_id": "sess-split", "tool_context": { "api-token": SECRET }
        });
        let mut s = api.stream("/v1/tasks", Some(body), None).await;
        let task_id = s.task_id.clone().unwrap();
        let mut events = vec![];
        let request_id = s.until_approval(&mut events).await["id"].as_str().unwrap().to_owned();
        let pending = api.get("/v1/approvals").await;
        assert_eq!(pending.body["approvals"][0]["id"], request_id.as_str(), "{}", pending.text);
        assert_eq!(pending.body["approvals"][0]["input"]["content"], "key=[redacted]", "{}", pending.text);
        assert_absent("GET /v1/approvals", pending.text.as_bytes(), SECRET);
        let r = api.post(&format!("/v1/approvals/{request_id}"), json!({ "decision": "decline" })).await;
        assert_eq!(r.status, 200, "{}", r.text);
        events.extend(s.rest().await);
        let tokens: String =
            events.iter().filter(|e| e.data["type"] == "token").map(|e| e.data["text"].as_str().unwrap()).collect();
        assert!(tokens.contains("the key is [redacted] ok"), "{tokens:?}");
        let reasoning: String =
            events.iter().filter(|e| e.data["type"] == "reasoning").map(|e| e.data["text"].as_str().unwrap()).collect();
        assert!(reasoning.contains("thinking of [redacted] now"), "{reasoning:?}");
        let all: String = events.iter().map(|e| e.data.to_string()).collect();
        assert_absent("the live event stream", all.as_bytes(), SECRET);
        let task = api.get(&format!("/v1/tasks/{task_id}")).await;
        assert_eq!(task.body["description"], "uses [redacted]", "{}", task.text);
        assert_absent("GET /v1/tasks/{id}", task.text.as_bytes(), SECRET);
        api.engine.store().flush().await.unwrap();
        assert_absent("the task store", &std::fs::read(api.dir.path().join("state.db")).unwrap(), SECRET);
        // Plugin state (the plugin's transcript quotes the prompt) is scrubbed at the
        // `state` import, with the task's session secrets, before any store sees it.
        let kept = api.engine.store().state_get("claude/default", &format!("transcript/{task_id}")).await.unwrap();
        let kept = String::from_utf8(kept.expect("the plugin's transcript")).unwrap();
        assert!(kept.contains("use [redacted]") && !kept.contains(SECRET), "{kept}");
        // A refused request does not echo the secret it carried either.
        let r = api
            .post(
                "/v1/tasks",
                json!({ "description": "d", "prompt": "p", "subagent_type": SECRET, "tool_context": { "k": SECRET } }),
            )
            .await;
        assert_eq!(r.status, 400, "{}", r.text);
        assert_absent("an error response", r.text.as_bytes(), SECRET);
        let logs = logs().lock().unwrap().clone();
        assert!(
            String::from_utf8_lossy(&logs).contains("which this subagent does not have"),
            "the plugin logged the unknown tool"
        );
        assert_absent("the logs", &logs, SECRET);
    }

    /// A task that fails with the secret in its error: the `error` and `finish` events, the
    /// record and the store hold it redacted.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_failed_task_s_error_is_redacted() {
        let script = serde_json::to_string(&json!([{ "error": format!("provider refused {SECRET} today") }])).unwrap();
        let yaml = claude_scripted("approval:\n  default: ask\n");
        let files = [("script.yaml", script.as_str()), ("agents/streamer.md", STREAMER)];
        let api = api_with_files(&[(bundled_plugin("claude"), "claude")], &yaml, vec![], &files).await;
        let body = json!({ "description": "d", "prompt": "p", "subagent_type": "streamer", "session_id": "sess-fail", "tool_context": { "k": SECRET } });
        let events = api.stream("/v1/tasks", Some(body), None).await.rest().await;
        let fin = &events.last().unwrap().data;
        assert_eq!(fin["status"], "failed", "{events:?}");
        assert!(fin["error"].as_str().unwrap().contains("provider refused [redacted] today"), "{fin}");
        let all: String = events.iter().map(|e| e.data.to_string()).collect();
        assert_absent("a failed task's events", all.as_bytes(), SECRET);
        api.engine.store().flush().await.unwrap();
        assert_absent("the task store", &std::fs::read(api.dir.path().join("state.db")).unwrap(), SECRET);
    }
}

/// What a model provider returns, as the bundled `claude` plugin gets it.
mod model_replies {
    use super::*;

    /// One reply of 70 tool calls, one with a 2 KiB id, one with 1.5 MiB of arguments
    /// and two sharing an id, failed the task: the plugin got them as they were and
    /// `tools.call` refused the whole batch (and the saved transcript made every resumed
    /// completion fail). The host now holds the reply to the bounds it holds requests to,
    /// so the task goes on and finishes.
    #[tokio::test(flavor = "multi_thread")]
    async fn regression_a_reply_with_too_many_or_too_large_tool_calls_failed_the_task() {
        let mut calls: Vec<Value> = (0..70)
            .map(|i| json!({ "name": "Bash", "id": format!("c{i}"), "arguments": { "command": "true" } }))
            .collect();
        calls[0]["id"] = json!("x".repeat(2048));
        calls[1]["arguments"] = json!({ "command": "a".repeat(1536 * 1024) });
        calls[3]["id"] = json!("c4");
        let script = serde_json::to_string(&json!([{ "tool_calls": calls }, { "text": "done" }])).unwrap();
        let yaml = claude_scripted("approval:\n  default: deny\n");
        let files = [("script.yaml", script.as_str()), ("agents/streamer.md", super::secrets::STREAMER)];
        let api = api_with_files(&[(bundled_plugin("claude"), "claude")], &yaml, vec![], &files).await;
        let body =
            json!({ "description": "d", "prompt": "p", "subagent_type": "streamer", "session_id": "sess-calls" });
        let events = api.stream("/v1/tasks", Some(body), None).await.rest().await;
        let fin = &events.last().unwrap().data;
        assert_eq!(fin["status"], "completed", "{fin}");
        assert_eq!(fin["output"], "done", "{fin}");
    }
}

/// Principals and roles (issue 13): every endpoint × role × owner, one table.
mod principals {
    use super::*;

    const YAML: &str = r#"  grants:
    echo: { log: true, events: true, state: true }
    claude: { log: true, events: true, state: true, resources: true, model: true, tools: true }
subagents:
  agent_dirs: [./agents]
  references:
    - { uri: "echo://greeter", kind: ECHO }
models:
  default: demo/scripted
  providers:
    demo: { type: scripted, script: ./script.yaml }
approval:
  default: ask
  audit_log: ./audit.jsonl
server:
  heartbeat: 200ms
  principals:
    - { name: alice, token_env: ALICE_TOKEN, role: user }
    - { name: bob, token_env: BOB_TOKEN, role: user }
    - { name: ops, token_env: OPS_TOKEN, role: approver, approves: [alice] }
    - { name: root, token_env: ROOT_TOKEN, role: admin }
"#;
    const SCRIPT: &str = r#"
- tool_calls:
    - { name: Write, arguments: { file_path: /workspace/a.txt, content: "x" } }
- text: "done"
"#;

    /// `token1` is the one token of `server.tokens_env` (an admin).
    const PRINCIPALS: [&str; 5] = ["alice", "bob", "ops", "root", "token1"];

    fn token(principal: &str) -> String {
        match principal {
            "token1" => "tok-WARDEN_TOKENS".into(),
            p => format!("tok-{}_TOKEN", p.to_uppercase()),
        }
    }

    impl Api {
        async fn get_as(&self, who: &str, path: &str) -> Reply {
            self.send(self.http.get(self.url(path)).bearer_auth(token(who))).await
        }

        async fn post_as(&self, who: &str, path: &str, body: Value) -> Reply {
            let req = self.http.post(self.url(path)).bearer_auth(token(who)).header("content-type", "application/json");
            self.send(req.body(body.to_string())).await
        }

        /// A background task of `owner` whose Write waits at the gate: (task id, request id).
        async fn pending_of(&self, owner: &str) -> (String, String) {
            let body = json!({ "description": "write", "prompt": "write a file", "subagent_type": "streamer", "run_in_background": true });
            let r = self.post_as(owner, "/v1/tasks", body).await;
            assert_eq!(r.status, 202, "{}", r.text);
            let task = r.body["task_id"].as_str().unwrap().to_owned();
            let t = Instant::now();
            loop {
                let list = self.get_as("root", "/v1/approvals").await;
                if let Some(a) =
                    list.body["approvals"].as_array().unwrap().iter().find(|a| a["task_id"] == task.as_str())
                {
                    return (task, a["id"].as_str().unwrap().to_owned());
                }
                assert!(t.elapsed() < Duration::from_secs(30), "no approval for {task}: {}", list.text);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// Regression (issue 41): `/metrics` answered any token, and its figures are every
    /// tenant's (tasks queued and running, pending approvals, plugins). Now it is an
    /// admin's: a user's or an approver's token gets 403 in the standard error shape.
    #[tokio::test(flavor = "multi_thread")]
    async fn regression_metrics_are_for_admins_only() {
        let api = principals_api().await;
        for who in ["alice", "bob", "ops"] {
            let r = api.get_as(who, "/metrics").await;
            assert_eq!(
                (r.status, r.body["error"]["code"].as_str()),
                (403, Some("admin_required")),
                "{who}: {}",
                r.text
            );
            assert!(r.body["error"]["message"].as_str().unwrap().contains(who), "{}", r.text);
            assert!(!r.text.contains("warden_tasks"), "{who} got figures: {}", r.text);
        }
        for who in ["root", "token1"] {
            let r = api.get_as(who, "/metrics").await;
            assert_eq!(r.status, 200, "{who}: {}", r.text);
            assert!(r.text.contains("warden_tasks_submitted_total"), "{}", r.text);
        }
        let r = api.send(api.http.get(api.url("/metrics"))).await;
        assert_eq!(r.status, 401, "no token: {}", r.text);
    }

    /// The live task list (`GET /v1/tasks/changes`) pushes each principal the changes of
    /// the tasks it may see, and nothing of another user's.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_task_feed_pushes_each_principal_only_the_tasks_it_may_see() {
        let api = principals_api().await;
        let open = |who: &'static str| {
            let req = api.http.get(api.url("/v1/tasks/changes")).bearer_auth(token(who));
            async move {
                let resp = req.header("accept", "text/event-stream").send().await.unwrap();
                assert_eq!(resp.status().as_u16(), 200, "{who}: feed refused");
                Sse { inner: Box::pin(resp.bytes_stream()), buf: String::new(), task_id: None }
            }
        };
        let (mut alice_feed, mut root_feed) = (open("alice").await, open("root").await);
        assert_eq!(api.get("/v1/tasks/changes").await.status, 401, "no token, no feed");
        let submit = |who: &'static str| {
            let body = json!({ "description": format!("{who}'s"), "prompt": "hi", "subagent_type": "greeter" });
            let api = &api;
            async move {
                let r = api.post_as(who, "/v1/tasks", body).await;
                assert_eq!(r.body["status"], "completed", "{}", r.text);
                r.body["task_id"].as_str().unwrap().to_owned()
            }
        };
        // Bob's task has finished (and been pushed) before Alice's starts.
        let bobs = submit("bob").await;
        let alices = submit("alice").await;
        // (task id, status) of every change a feed pushed until `task` completed.
        async fn until_completed(feed: &mut Sse, task: &str) -> Vec<(String, String)> {
            let mut seen = vec![];
            loop {
                let e =
                    feed.next_event().await.unwrap_or_else(|| panic!("feed ended before {task} completed: {seen:?}"));
                assert_eq!(e.data["type"], "task", "{e:?}");
                let rec = &e.data["task"];
                seen.push((rec["task_id"].as_str().unwrap().to_owned(), rec["status"].as_str().unwrap().to_owned()));
                if rec["task_id"] == task && rec["status"] == "completed" {
                    assert_eq!(rec["output"].as_str().map(|o| o.contains("hi")), Some(true), "{rec}");
                    return seen;
                }
            }
        }
        let alice_saw = until_completed(&mut alice_feed, &alices).await;
        assert!(alice_saw.iter().all(|(id, _)| *id == alices), "alice was pushed another user's task: {alice_saw:?}");
        assert!(alice_saw.iter().any(|(_, st)| st == "submitted"), "the submission is pushed too: {alice_saw:?}");
        let root_saw = until_completed(&mut root_feed, &alices).await;
        assert!(root_saw.contains(&(bobs.clone(), "completed".into())), "an admin sees every task: {root_saw:?}");
    }

    /// Regression: A2A `ListTasks` read every user's tasks and paged by offset (each page
    /// scanned them all again). A tenant's listing now pages through its own tasks by
    /// keyset: following `nextPageToken` yields exactly its tasks, newest first, each once.
    #[tokio::test(flavor = "multi_thread")]
    async fn regression_a2a_list_tasks_pages_through_the_callers_own_tasks_by_cursor() {
        let api = principals_api().await;
        let rpc =
            |method: &str, params: Value| json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
        let mut alices = vec![];
        for n in 0..5 {
            for who in ["alice", "bob"] {
                let message =
                    json!({ "messageId": format!("m-{who}-{n}"), "role": "ROLE_USER", "parts": [{ "text": "hi" }] });
                let r = api.post_as(who, "/a2a/greeter", rpc("SendMessage", json!({ "message": message }))).await;
                let id = r.body["result"]["task"]["id"].as_str().unwrap_or_else(|| panic!("{}", r.text)).to_owned();
                if who == "alice" {
                    alices.push(id);
                }
            }
        }
        let (mut listed, mut token, mut pages) = (vec![], String::new(), 0);
        loop {
            let params = json!({ "pageSize": 2, "pageToken": token });
            let r = api.post_as("alice", "/a2a/greeter", rpc("ListTasks", params)).await;
            let page = r.body["result"]["tasks"].as_array().unwrap_or_else(|| panic!("{}", r.text)).clone();
            assert!(page.len() <= 2, "{}", r.text);
            listed.extend(page.iter().map(|t| t["id"].as_str().unwrap().to_owned()));
            assert_eq!(r.body["result"]["totalSize"], listed.len(), "{}", r.text);
            token = r.body["result"]["nextPageToken"].as_str().unwrap().to_owned();
            pages += 1;
            if token.is_empty() {
                break;
            }
            assert!(pages < 10, "the listing never ends: {listed:?}");
        }
        alices.reverse();
        assert_eq!(listed, alices, "exactly alice's tasks, newest first, each once");
        let r = api.post_as("alice", "/a2a/greeter", rpc("ListTasks", json!({ "pageToken": "7" }))).await;
        assert_eq!(r.body["error"]["code"], -32602, "a made-up token: {}", r.text);
        assert!(r.text.contains("pageToken"), "{}", r.text);
    }

    /// Snapshots over the API (issue 50 item 3): another user's session or snapshot answers
    /// 404 whichever way it is named, names and fields are checked with a 400 naming the
    /// field and the expected form, and a task's new session starts from its user's
    /// snapshot with the snapshot's files. Real Docker.
    #[tokio::test(flavor = "multi_thread")]
    async fn snapshots_are_their_users_only_and_their_names_are_checked() {
        let docker =
            std::process::Command::new("docker").args(["image", "inspect", "warden-sandbox:bookworm"]).output();
        assert!(
            docker.is_ok_and(|o| o.status.success()),
            "Docker or the sandbox image is missing: run `cargo xtask test`"
        );
        let api = principals_api().await;
        let sandbox = api.engine.tools().sandbox().unwrap().clone();
        let alices = warden_sandbox::SessionKey::new("alice", "snap-a");
        let made = sandbox.call_tool(&alices, "Bash", json!({"command": "echo alice-file > f"}), &[]).await.unwrap();
        assert!(!made.is_error, "{}", made.content);
        let r = api.post_as("alice", "/v1/sessions/snap-a/snapshots", json!({ "name": "v1" })).await;
        assert_eq!(
            (r.status, r.body["name"].as_str(), r.body["session_id"].as_str()),
            (201, Some("v1"), Some("snap-a")),
            "{}",
            r.text
        );
        // Another user: 404 for the session and its snapshots, by its own user or naming alice.
        for (method, path) in [
            ("POST", "/v1/sessions/snap-a/snapshots?user_id=alice"),
            ("POST", "/v1/sessions/snap-a/snapshots"),
            ("GET", "/v1/sessions/snap-a/snapshots?user_id=alice"),
            ("DELETE", "/v1/sessions/snap-a/snapshots/v1?user_id=alice"),
        ] {
            let req = match method {
                "POST" => api
                    .http
                    .post(api.url(path))
                    .header("content-type", "application/json")
                    .body(json!({ "name": "stolen" }).to_string()),
                "GET" => api.http.get(api.url(path)),
                _ => api.http.delete(api.url(path)),
            };
            let r = api.send(req.bearer_auth(token("bob"))).await;
            assert_eq!(
                (r.status, r.body["error"]["code"].as_str()),
                (404, Some("session_not_found")),
                "bob {method} {path}: {}",
                r.text
            );
        }
        let r = api.send(api.http.delete(api.url("/v1/sessions/snap-a/snapshots/v1")).bearer_auth(token("bob"))).await;
        assert_eq!((r.status, r.body["error"]["code"].as_str()), (404, Some("snapshot_not_found")), "{}", r.text);
        let r = api.get_as("bob", "/v1/sessions/snap-a/snapshots").await;
        assert_eq!(
            (r.status, r.body["snapshots"].as_array().map(Vec::len)),
            (200, Some(0)),
            "bob's own (empty) view: {}",
            r.text
        );
        // Bob's task cannot start from alice's snapshot, and no session of his is made.
        let task = |snapshot: Value, session: Value| json!({ "description": "d", "prompt": "hi", "subagent_type": "greeter", "session_id": session, "snapshot": snapshot });
        let r = api.post_as("bob", "/v1/tasks", task(json!("v1"), json!("bobs"))).await;
        assert_eq!((r.status, r.body["error"]["code"].as_str()), (404, Some("snapshot_not_found")), "{}", r.text);
        assert!(!sandbox.list_sessions().await.unwrap().iter().any(|i| i.key.user_id == "bob"));
        // Names and fields: a clear 400 naming the field and the expected form.
        for (body, field) in [
            (json!({ "name": "../x" }), "name: invalid snapshot name"),
            (json!({ "name": "" }), "name: invalid snapshot name"),
            (json!({ "name": "-rf" }), "name: invalid snapshot name"),
            (json!({ "name": "a".repeat(65) }), "name: invalid snapshot name"),
            (json!({ "nam": "x" }), "unknown field `nam`"),
            (json!({ "name": 7 }), "name: invalid type"),
        ] {
            let r = api.post_as("alice", "/v1/sessions/snap-a/snapshots", body.clone()).await;
            assert_eq!(
                (r.status, r.body["error"]["code"].as_str()),
                (400, Some("invalid_field")),
                "{body}: {}",
                r.text
            );
            assert!(r.body["error"]["message"].as_str().unwrap().contains(field), "{body}: {}", r.text);
        }
        let r = api.post_as("alice", "/v1/sessions/snap-a/snapshots", json!({ "name": "../x" })).await;
        assert!(r.text.contains("letters, digits"), "the expected form is named: {}", r.text);
        let r = api.post_as("alice", "/v1/tasks", task(json!("bad name"), json!("snap-b"))).await;
        assert_eq!(r.status, 400, "{}", r.text);
        assert!(
            r.body["error"]["message"].as_str().unwrap().starts_with("snapshot: invalid snapshot name"),
            "{}",
            r.text
        );
        let r = api
            .post_as(
                "alice",
                "/v1/tasks",
                json!({ "description": "d", "prompt": "hi", "subagent_type": "greeter", "snapshot": "v1" }),
            )
            .await;
        assert!(r.status == 400 && r.text.contains("snapshot: needs `session_id`"), "{}", r.text);
        let r = api.post_as("alice", "/v1/tasks", task(json!("v1"), json!("bad id!"))).await;
        assert!(r.status == 400 && r.text.contains("session_id"), "{}", r.text);
        let r = api.post_as("alice", "/v1/sessions/snap-a/snapshots", json!({ "name": "v1" })).await;
        assert_eq!((r.status, r.body["error"]["code"].as_str()), (409, Some("snapshot_exists")), "{}", r.text);
        // Alice's task starts a new session from her snapshot: the same files.
        let r = api.post_as("alice", "/v1/tasks", task(json!("v1"), json!("snap-b"))).await;
        assert_eq!((r.status, r.body["session_id"].as_str()), (200, Some("snap-b")), "{}", r.text);
        let f = api.get_as("alice", "/v1/sessions/snap-b/files/f").await;
        assert_eq!((f.status, f.text.as_str()), (200, "alice-file\n"));
        let r = api.post_as("alice", "/v1/tasks", task(json!("v1"), json!("snap-b"))).await;
        assert_eq!((r.status, r.body["error"]["code"].as_str()), (409, Some("session_exists")), "{}", r.text);
        // Listed, then deleted.
        let r = api.get_as("alice", "/v1/sessions/snap-a/snapshots").await;
        let names: Vec<&str> =
            r.body["snapshots"].as_array().unwrap().iter().filter_map(|i| i["name"].as_str()).collect();
        assert_eq!(names, ["v1"], "{}", r.text);
        let r =
            api.send(api.http.delete(api.url("/v1/sessions/snap-a/snapshots/v1")).bearer_auth(token("alice"))).await;
        assert_eq!((r.status, r.body["deleted"].as_bool()), (200, Some(true)), "{}", r.text);
        assert!(sandbox.list_snapshots(None).await.unwrap().is_empty());
        sandbox.shutdown().await.unwrap();
    }

    /// `sandbox.snapshot_on_end`: a task resumed after its session ended gets the session
    /// back with its files (its end snapshot), and only its own user's. Real Docker.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_resumed_task_gets_its_ended_sessions_files_back() {
        let scope = format!("apitest{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let yaml = format!("{YAML}sandbox:\n  scope: {scope}\n  warm_pool: 0\n  snapshot_on_end: true\n");
        let files = [("script.yaml", SCRIPT), ("agents/streamer.md", super::secrets::STREAMER)];
        let api = api_with_files(
            &[(test_plugin("echo"), "echo"), (bundled_plugin("claude"), "claude")],
            &yaml,
            vec![],
            &files,
        )
        .await;
        let sandbox = api.engine.tools().sandbox().unwrap().clone();
        let first = json!({ "description": "d", "prompt": "hi", "subagent_type": "greeter", "session_id": "res-1" });
        let r = api.post_as("alice", "/v1/tasks", first).await;
        assert_eq!(r.status, 200, "{}", r.text);
        let task = r.body["task_id"].as_str().unwrap().to_owned();
        let key = warden_sandbox::SessionKey::new("alice", "res-1");
        let made = sandbox.call_tool(&key, "Bash", json!({"command": "echo kept > f"}), &[]).await.unwrap();
        assert!(!made.is_error, "{}", made.content);
        assert!(sandbox.end_session(&key).await.unwrap());
        let f = api.get_as("alice", "/v1/sessions/res-1/files/f").await;
        assert_eq!(f.status, 404, "ended: {}", f.text);
        // Another user's resume of it restores nothing.
        let theirs = json!({ "description": "d", "prompt": "again", "subagent_type": "greeter", "resume": task });
        let _ = api.post_as("bob", "/v1/tasks", theirs.clone()).await;
        assert!(
            !sandbox.list_sessions().await.unwrap().iter().any(|i| i.key == key),
            "bob's resume made alice's session"
        );
        // Alice's resume does, before the task runs.
        let _ = api.post_as("alice", "/v1/tasks", theirs).await;
        let f = api.get_as("alice", "/v1/sessions/res-1/files/f").await;
        assert_eq!((f.status, f.text.as_str()), (200, "kept\n"), "the resumed task's session has its files again");
        sandbox.end_session(&key).await.unwrap();
        // That end left an end snapshot again: this test's to remove (the setting is on).
        sandbox.shutdown().await.unwrap();
        let out = std::process::Command::new("docker")
            .args([
                "volume",
                "ls",
                "-q",
                "--filter",
                &format!("label=warden.scope={scope}"),
                "--filter",
                "label=warden.snapshot_end=true",
            ])
            .output()
            .unwrap();
        let ends: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect();
        assert_eq!(ends.len(), 1, "{ends:?}");
        let rm = std::process::Command::new("docker").args(["volume", "rm"]).args(&ends).output().unwrap();
        assert!(rm.status.success(), "{rm:?}");
    }

    /// The principals deployment: echo and the claude streamer with its script.
    async fn principals_api() -> Api {
        let files = [("script.yaml", SCRIPT), ("agents/streamer.md", super::secrets::STREAMER)];
        api_with_files(&[(test_plugin("echo"), "echo"), (bundled_plugin("claude"), "claude")], YAML, vec![], &files)
            .await
    }

    /// Regression: a user (or an approver) could approve `always`, appending an allow rule
    /// to the overlay that holds for every tenant. Only an admin may; the refused answer
    /// leaves the call waiting.
    #[tokio::test(flavor = "multi_thread")]
    async fn regression_only_an_admin_principal_may_approve_always() {
        let yaml =
            YAML.replace("  audit_log: ./audit.jsonl\n", "  audit_log: ./audit.jsonl\n  overlay: ./overlay.rules\n");
        let files = [("script.yaml", SCRIPT), ("agents/streamer.md", super::secrets::STREAMER)];
        let plugins = [(test_plugin("echo"), "echo"), (bundled_plugin("claude"), "claude")];
        let api = api_with_files(&plugins, &yaml, vec![], &files).await;
        let overlay = || std::fs::read_to_string(api.dir.path().join("overlay.rules")).unwrap_or_default();
        let (task, id) = api.pending_of("alice").await;
        let always = json!({ "decision": "approve", "scope": "always" });
        for who in ["alice", "ops"] {
            let r = api.post_as(who, &format!("/v1/approvals/{id}"), always.clone()).await;
            assert_eq!(
                (r.status, r.body["error"]["code"].as_str()),
                (403, Some("admin_required")),
                "{who}: {}",
                r.text
            );
            assert!(r.body["error"]["message"].as_str().unwrap().contains("only an admin"), "{}", r.text);
        }
        assert_eq!(overlay(), "");
        let list = api.get_as("alice", "/v1/approvals").await;
        assert_eq!(list.body["approvals"][0]["id"], id.as_str(), "still waiting: {}", list.text);
        let r = api.post_as("root", &format!("/v1/approvals/{id}"), always).await;
        assert_eq!(r.status, 200, "{}", r.text);
        let done = api.get_as("alice", &format!("/v1/tasks/{task}?block=true&timeout_ms=30000")).await;
        assert_eq!(done.body["status"], "completed", "{}", done.text);
        assert!(overlay().contains("Write(//workspace/a.txt)"), "kept once the call went on: {}", overlay());
    }

    /// Regression: the approval listing (and so the console's scope menu), the task's
    /// event stream and A2A's input-required question offered `always` to every principal
    /// who could decide the approval, though only an admin's `always` is accepted (403
    /// `admin_required`). Each now offers the scopes the reader's own answer may hold.
    #[tokio::test(flavor = "multi_thread")]
    async fn regression_always_is_offered_to_admin_principals_only() {
        let yaml =
            YAML.replace("  audit_log: ./audit.jsonl\n", "  audit_log: ./audit.jsonl\n  overlay: ./overlay.rules\n");
        let files = [("script.yaml", SCRIPT), ("agents/streamer.md", super::secrets::STREAMER)];
        let plugins = [(test_plugin("echo"), "echo"), (bundled_plugin("claude"), "claude")];
        let api = api_with_files(&plugins, &yaml, vec![], &files).await;
        let (task, id) = api.pending_of("alice").await;
        let strs = |v: &Value| -> Vec<String> {
            v.as_array()
                .unwrap_or_else(|| panic!("no scopes: {v}"))
                .iter()
                .map(|s| s.as_str().unwrap().into())
                .collect()
        };
        let rpc = json!({ "jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": { "id": task } });
        for (who, admin) in [("alice", false), ("ops", false), ("root", true), ("token1", true)] {
            // The approvals listing, as the console reads it.
            let list = api.get_as(who, "/v1/approvals").await;
            let listed = list.body["approvals"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["id"] == id.as_str())
                .unwrap_or_else(|| panic!("{who} does not see {id}: {}", list.text));
            let scopes = strs(&listed["scopes"]);
            assert!(scopes.contains(&"once".into()) && scopes.contains(&"session".into()), "{who}: {scopes:?}");
            assert_eq!(scopes.contains(&"always".into()), admin, "{who}: listed {scopes:?}");

            if who == "ops" {
                continue; // an approver decides alice's approvals but does not read her tasks
            }
            // The task's event stream (the console's task page, MCP elicitation: one follower).
            {
                let resp = api
                    .http
                    .get(api.url(&format!("/v1/tasks/{task}/events")))
                    .bearer_auth(token(who))
                    .header("accept", "text/event-stream")
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status().as_u16(), 200, "{who}: stream refused");
                let mut sse = Sse { inner: Box::pin(resp.bytes_stream()), buf: String::new(), task_id: None };
                let asked = sse.until_approval(&mut vec![]).await;
                assert_eq!(asked["id"], id.as_str());
                assert_eq!(strs(&asked["scopes"]).contains(&"always".into()), admin, "{who}: streamed {asked}");
            }

            // A2A's input-required question.
            let r = api.post_as(who, "/a2a/streamer", rpc.clone()).await;
            let parts = r.body["result"]["status"]["message"]["parts"]
                .as_array()
                .unwrap_or_else(|| panic!("{who}: no question: {}", r.text));
            let data = parts
                .iter()
                .find(|p| p["data"]["type"] == "approval_request")
                .unwrap_or_else(|| panic!("{who}: no approval data part: {}", r.text));
            assert_eq!(strs(&data["data"]["scopes"]).contains(&"always".into()), admin, "{who}: A2A {data}");
        }
        let r = api.post_as("root", &format!("/v1/approvals/{id}"), json!({ "decision": "approve" })).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn every_endpoint_answers_each_role_for_each_owner() {
        let api = principals_api().await;
        // A user's requests act as that user; the record names the principal.
        let mut tasks = std::collections::BTreeMap::new();
        for owner in ["alice", "bob"] {
            let r = api.post_as(owner, "/v1/tasks", json!({ "description": "d", "prompt": "hi", "subagent_type": "greeter", "session_id": format!("s-{owner}") })).await;
            assert_eq!(
                (r.status, r.body["user_id"].as_str(), r.body["principal"].as_str()),
                (200, Some(owner), Some(owner)),
                "{}",
                r.text
            );
            tasks.insert(owner, r.body["task_id"].as_str().unwrap().to_owned());
        }
        let r = api
            .post_as("token1", "/v1/tasks", json!({ "description": "d", "prompt": "hi", "subagent_type": "greeter" }))
            .await;
        assert_eq!(
            (r.body["user_id"].as_str(), r.body["principal"].as_str()),
            (Some("default"), Some("token1")),
            "tokens_env admins keep the default user"
        );
        assert_eq!(api.get("/v1/tasks").await.status, 401, "no token, no entry");
        let standing: std::collections::BTreeMap<&str, (String, String)> =
            [("alice", api.pending_of("alice").await), ("bob", api.pending_of("bob").await)].into_iter().collect();

        for who in PRINCIPALS {
            for owner in ["alice", "bob"] {
                let sees = who == owner || who == "root" || who == "token1";
                let decides = sees || (who == "ops" && owner == "alice");
                let cell = format!("{who} × {owner}");
                let task = &tasks[owner];
                let r = api.get_as(who, &format!("/v1/tasks/{task}?block=false")).await;
                assert_eq!(r.status, if sees { 200 } else { 404 }, "{cell}: GET task: {}", r.text);
                let r = api.get_as(who, &format!("/v1/tasks/{task}/events")).await;
                assert_eq!(r.status, if sees { 200 } else { 404 }, "{cell}: events: {}", r.text);
                let r = api.post_as(who, &format!("/v1/tasks/{task}/cancel"), json!({})).await;
                assert_eq!(r.status, if sees { 409 } else { 404 }, "{cell}: cancel: {}", r.text);
                let r = api.get_as(who, &format!("/v1/sessions/s-{owner}/files/a.txt?user_id={owner}")).await;
                if !sees {
                    assert_eq!(
                        (r.status, r.body["error"]["code"].as_str()),
                        (404, Some("session_not_found")),
                        "{cell}: files"
                    );
                }
                let body = json!({ "description": "d", "prompt": "as", "subagent_type": "greeter", "user_id": owner });
                let r = api.post_as(who, "/v1/tasks", body).await;
                assert_eq!(r.status, if sees { 200 } else { 403 }, "{cell}: create as {owner}: {}", r.text);
                if sees {
                    assert_eq!(
                        (r.body["user_id"].as_str(), r.body["principal"].as_str()),
                        (Some(owner), Some(who)),
                        "{cell}"
                    );
                } else {
                    assert_eq!(r.body["error"]["code"], "user_not_allowed", "{cell}");
                }
                let list = api.get_as(who, "/v1/approvals").await;
                let listed =
                    list.body["approvals"].as_array().unwrap().iter().any(|a| a["id"] == standing[owner].1.as_str());
                assert_eq!(listed, decides, "{cell}: approvals list: {}", list.text);
                if decides {
                    let (task, id) = api.pending_of(owner).await;
                    let r = api.post_as(who, &format!("/v1/approvals/{id}"), json!({ "decision": "decline" })).await;
                    assert_eq!(
                        (r.status, r.body["decided_by"].as_str()),
                        (200, Some(who)),
                        "{cell}: decide: {}",
                        r.text
                    );
                    let rec = api.get_as("root", &format!("/v1/tasks/{task}?timeout=30000")).await;
                    assert_eq!(rec.body["status"], "completed", "{cell}: {}", rec.text);
                } else {
                    let r = api
                        .post_as(who, &format!("/v1/approvals/{}", standing[owner].1), json!({ "decision": "approve" }))
                        .await;
                    assert_eq!(
                        (r.status, r.body["error"]["code"].as_str()),
                        (404, Some("approval_not_found")),
                        "{cell}: decide"
                    );
                }
            }
        }
        // Nobody without the right decided the standing requests; the audit names who did decide.
        let list = api.get_as("root", "/v1/approvals").await;
        for owner in ["alice", "bob"] {
            assert!(
                list.body["approvals"].as_array().unwrap().iter().any(|a| a["id"] == standing[owner].1.as_str()),
                "{owner}'s request was decided"
            );
        }
        let audit = api.audit_text();
        for who in ["alice", "ops", "root", "token1", "bob"] {
            assert!(audit.contains(&format!("\"decided_by\":\"user:{who}\"")), "{who} not in the audit log:\n{audit}");
        }
    }

    /// The console's page and assets answer without a token, with a strict CSP; nothing
    /// else under a similar name does.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_console_is_public_with_a_strict_csp_and_the_api_behind_it_is_not() {
        let api = api_with_files(&[(test_plugin("echo"), "echo")], YAML, vec![], &[("script.yaml", SCRIPT)]).await;
        for (path, kind) in [
            ("/ui", "text/html"),
            ("/ui/", "text/html"),
            ("/ui/app.js", "text/javascript"),
            ("/ui/app.css", "text/css"),
        ] {
            let r = api.get(path).await;
            assert_eq!(r.status, 200, "{path}");
            assert!(r.headers["content-type"].to_str().unwrap().starts_with(kind), "{path}");
            let csp = r.headers["content-security-policy"].to_str().unwrap();
            assert!(
                csp.contains("default-src 'self'") && csp.contains("script-src 'self'") && !csp.contains("unsafe"),
                "{csp}"
            );
            assert_eq!(r.headers["x-content-type-options"], "nosniff");
            assert!(r.headers.get("set-cookie").is_none(), "{path} sets a cookie");
        }
        for path in ["/uix", "/ui/nothing-here", "/v1/me", "/v1/tasks"] {
            assert_eq!(api.get(path).await.status, 401, "{path} without a token");
        }
        let r = api.get_as("bob", "/v1/me").await;
        assert_eq!((r.body["name"].as_str(), r.body["role"].as_str()), (Some("bob"), Some("user")), "{}", r.text);
    }

    /// The operator endpoints: `GET /v1/tasks` lists what a principal may see; sessions
    /// (list, end) and the audit log are for admins only.
    #[tokio::test(flavor = "multi_thread")]
    async fn operator_endpoints_list_tasks_by_owner_and_keep_sessions_and_audit_to_admins() {
        let api = principals_api().await;
        let (task, id) = api.pending_of("alice").await;
        let listed = |r: &Reply| r.body["tasks"].as_array().unwrap().iter().any(|t| t["task_id"] == task.as_str());
        for (who, sees) in [("alice", true), ("bob", false), ("ops", false), ("root", true), ("token1", true)] {
            let r = api.get_as(who, "/v1/tasks").await;
            assert_eq!((r.status, listed(&r)), (200, sees), "{who}: {}", r.text);
        }
        let r = api.get_as("root", "/v1/tasks?limit=1").await;
        assert_eq!(r.body["tasks"].as_array().unwrap().len(), 1, "{}", r.text);
        // Pages go on after the previous page's last task; a made-up cursor is refused.
        if let Some(next) = r.body["next_cursor"].as_str() {
            let more = api.get_as("root", &format!("/v1/tasks?limit=1&cursor={next}")).await;
            assert_ne!(more.body["tasks"][0]["task_id"], r.body["tasks"][0]["task_id"], "{}", more.text);
        }
        let r = api.get_as("alice", "/v1/tasks?cursor=nope").await;
        assert_eq!((r.status, r.body["error"]["code"].as_str()), (400, Some("invalid_cursor")), "{}", r.text);
        let r = api.post_as("alice", &format!("/v1/approvals/{id}"), json!({ "decision": "approve" })).await;
        assert_eq!(r.status, 200, "{}", r.text);
        let rec = api.get_as("alice", &format!("/v1/tasks/{task}?timeout=30000")).await;
        assert_eq!(rec.body["status"], "completed", "{}", rec.text);
        let session = rec.body["session_id"].as_str().unwrap().to_owned();
        let end = format!("/v1/sessions/{session}/end?user_id=alice");
        for who in ["alice", "bob", "ops"] {
            for r in [api.get_as(who, "/v1/sessions").await, api.get_as(who, "/v1/audit").await] {
                assert_eq!((r.status, r.body["error"]["code"].as_str()), (403, Some("admin_required")), "{who}");
            }
            let r = api.post_as(who, &end, json!({})).await;
            assert_eq!(r.status, 403, "{who} ended a session: {}", r.text);
        }
        let r = api.get_as("root", "/v1/sessions").await;
        let row = r.body["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["session_id"] == session.as_str())
            .unwrap_or_else(|| panic!("{session} not listed: {}", r.text))
            .clone();
        assert_eq!((row["user_id"].as_str(), row["owned_here"].as_bool()), (Some("alice"), Some(true)), "{row}");
        assert!(row["idle_secs"].is_u64() && row["age_secs"].is_u64(), "{row}");
        let r = api.get_as("root", "/v1/audit").await;
        assert_eq!(r.body["configured"], true, "{}", r.text);
        assert_eq!(r.body["records"][0]["decided_by"], "user:alice", "newest first: {}", r.text);
        let r = api.post_as("root", &end, json!({})).await;
        assert_eq!((r.status, r.body["ended"].as_bool()), (200, Some(true)), "{}", r.text);
        let r = api.get_as("root", "/v1/sessions").await;
        assert!(!r.text.contains(&session), "still listed: {}", r.text);
        let r = api.post_as("root", &end, json!({})).await;
        assert_eq!((r.status, r.body["error"]["code"].as_str()), (404, Some("session_not_found")), "{}", r.text);
    }

    #[test]
    fn principals_are_validated() {
        let bad = [
            ("server:\n  principals: [{ name: a, token_env: A, role: user, approves: [b] }]\n", "approves"),
            (
                "server:\n  principals: [{ name: a, token_env: A, role: user }, { name: a, token_env: B, role: admin }]\n",
                "twice",
            ),
            ("server:\n  principals: [{ name: 'a b', token_env: A, role: user }]\n", "name"),
            ("server:\n  principals: [{ name: a, token_env: A, role: owner }]\n", "role"),
        ];
        for (yaml, why) in bad {
            let e = Config::from_yaml(yaml, Path::new("w.yaml")).unwrap_err().to_string();
            assert!(e.contains(why), "{yaml}: {e}");
        }
        // Regression: a tenant could take a name the host acts or records under (`api`,
        // `token1`, `tty`, `default`…) and be audited as the host, or own its tasks.
        for name in [
            "api",
            "token1",
            "TOKEN2",
            "mcp-stdio",
            "default",
            "local",
            "tty",
            "admin",
            "system",
            "host",
            "warden",
            "Policy",
        ] {
            let yaml = format!("server:\n  principals: [{{ name: {name}, token_env: A, role: user }}]\n");
            let e = Config::from_yaml(&yaml, Path::new("w.yaml")).unwrap_err().to_string();
            assert!(
                e.starts_with("w.yaml: server.principals[0].name: ") && e.contains("expected a name of your own"),
                "{name}: {e}"
            );
        }
        let c = Config::from_yaml(
            "server:\n  principals: [{ name: a, token_env: A, role: user }, { name: b, token_env: B, role: user }]\n",
            Path::new("w.yaml"),
        )
        .unwrap();
        let same = warden::server::credentials_from(&c.server, |_| Some("one-token".into()));
        assert!(same.unwrap_err().to_string().contains("same token"));
        let creds = warden::server::credentials_from(&c.server, |v| (v == "A").then(|| "ta, ta2".into())).unwrap();
        let names: Vec<(&str, &str)> = creds.iter().map(|(t, p)| (t.as_str(), p.name.as_str())).collect();
        assert_eq!(names, vec![("ta", "a"), ("ta2", "a")], "b has no token and cannot sign in");
    }
}

/// Approvals that hold for a session or always (issue 13 c).
mod scopes {
    use super::*;

    const SCRIPT: &str = r#"
- tool_calls:
    - { name: Write, arguments: { file_path: /workspace/a.txt, content: "one" } }
- tool_calls:
    - { name: Write, arguments: { file_path: /workspace/a.txt, content: "two" } }
- text: "done"
"#;

    /// Runs one streamer task in `session`; answers each approval_request with `answer`
    /// (None = leave it waiting and cancel the task). Returns the task's events.
    async fn run(api: &Api, session: &str, answer: Option<Value>) -> Vec<SseEvent> {
        let body =
            json!({ "description": "write", "prompt": "write", "subagent_type": "streamer", "session_id": session });
        let mut s = api.stream("/v1/tasks", Some(body), None).await;
        let task = s.task_id.clone().unwrap();
        let mut events = vec![];
        while let Some(e) = s.next_event().await {
            events.push(e.clone());
            if e.data["type"] == "approval_request" {
                let id = e.data["id"].as_str().unwrap();
                match &answer {
                    Some(a) => {
                        let r = api.post(&format!("/v1/approvals/{id}"), a.clone()).await;
                        assert_eq!(r.status, 200, "{}", r.text);
                    }
                    None => {
                        let r = api.post(&format!("/v1/tasks/{task}/cancel"), json!({})).await;
                        assert_eq!(r.status, 200, "{}", r.text);
                    }
                }
            }
        }
        events
    }

    fn asked(events: &[SseEvent]) -> usize {
        events.iter().filter(|e| e.data["type"] == "approval_request").count()
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn session_and_always_approvals_hold_and_pending_ones_end_with_their_task() {
        let yaml = &claude_scripted(
            "approval:\n  default: ask\n  deny: [\"Bash(rm:*)\"]\n  audit_log: ./audit.jsonl\n  overlay: ./overlay.rules\n",
        );
        let files = [("script.yaml", SCRIPT), ("agents/streamer.md", super::secrets::STREAMER)];
        let api = api_with_files(&[(bundled_plugin("claude"), "claude")], yaml, vec![], &files).await;

        // The request says who asks and which scopes it offers; a decline holds once only.
        let body =
            json!({ "description": "write", "prompt": "write", "subagent_type": "streamer", "session_id": "s1" });
        let mut s = api.stream("/v1/tasks", Some(body), None).await;
        let req = s.until_approval(&mut vec![]).await;
        assert_eq!(
            (req["subagent"].as_str(), req["session_id"].as_str(), req["user_id"].as_str(), req["principal"].as_str()),
            (Some("streamer"), Some("s1"), Some("default"), Some("api")),
            "{req}"
        );
        assert_eq!(req["scopes"], json!(["once", "session", "always"]), "{req}");
        assert!(req["task_id"].as_str().unwrap().starts_with("task_"));
        let id = req["id"].as_str().unwrap();
        let r = api.post(&format!("/v1/approvals/{id}"), json!({ "decision": "decline", "scope": "session" })).await;
        assert_eq!((r.status, r.body["error"]["code"].as_str()), (400, Some("scope_not_allowed")), "{}", r.text);
        let r = api.post(&format!("/v1/approvals/{id}"), json!({ "decision": "approve", "scope": "session" })).await;
        assert_eq!((r.status, r.body["scope"].as_str()), (200, Some("session")), "{}", r.text);
        let rest = s.rest().await;
        assert_eq!(asked(&rest), 0, "the same call again in the session is not asked: {rest:?}");

        // The whole session holds it; another session asks again until `always`.
        assert_eq!(asked(&run(&api, "s1", None).await), 0);
        assert_eq!(asked(&run(&api, "s2", Some(json!({ "decision": "approve", "scope": "always" }))).await), 1);
        let overlay = std::fs::read_to_string(api.dir.path().join("overlay.rules")).unwrap();
        assert!(overlay.lines().any(|l| l == "Write(//workspace/a.txt)"), "an exact absolute-path rule: {overlay}");
        assert!(overlay.contains("# approved always by user:api"), "{overlay}");
        assert_eq!(asked(&run(&api, "s3", None).await), 0, "always holds in every session");
        let audit = api.audit_text();
        assert!(audit.contains("\"decided_by\":\"grant:session\""), "{audit}");
        assert!(audit.contains("\"decided_by\":\"grant:always\""), "{audit}");

        // A pending approval is cleared with a decline when its task ends.
        std::fs::write(api.dir.path().join("overlay.rules"), "").unwrap();
        let api2 = api_with_files(&[(bundled_plugin("claude"), "claude")], yaml, vec![], &files).await;
        let events = run(&api2, "s4", None).await;
        assert_eq!(asked(&events), 1);
        assert_eq!(api2.get("/v1/approvals").await.body["approvals"], json!([]));
        let audit = api2.audit_text();
        // Declined as the task ended: by the cancel, or by the dropped call, whichever came first.
        let declined = audit.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).any(|r| {
            r["session_id"] == "s4"
                && r["decision"] == "decline"
                && (r["decided_by"] == "cancel" || r["decided_by"] == "disconnect")
        });
        assert!(declined, "{audit}");
    }
}

mod persistence {
    use super::*;
    use warden::store::{TaskState, Write};

    #[tokio::test(flavor = "multi_thread")]
    async fn restart_fails_interrupted_tasks_and_keeps_finished_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let rec = crate::records::record;
        {
            let store = Store::open(&path).unwrap();
            store.write(Write::Task(rec("task_done", TaskState::Completed, Some(warden::store::now_ms()))));
            store.write(Write::Task(rec("task_running", TaskState::Working, None)));
            store.write(Write::Event {
                task_id: "task_running".into(),
                seq: 1,
                event: json!({ "type": "status", "status": "working" }),
            });
            store.write(Write::Task(rec("task_ancient", TaskState::Completed, Some(1))));
            store.flush().await.unwrap();
        }
        // The first store's writer thread lets go of the file once it sees the store dropped.
        let t = Instant::now();
        let store = loop {
            match Store::open(&path) {
                Ok(s) => break s,
                Err(e) if t.elapsed() < Duration::from_secs(5) => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Err(e) => panic!("{e}"),
            }
        };
        let recovered = store.recover_interrupted().await.unwrap();
        assert_eq!(recovered, vec!["task_running".to_string()]);
        let r = store.task("task_running").await.unwrap().unwrap();
        assert_eq!((r.status.as_str(), r.error.as_deref()), ("failed", Some("host restarted")));
        let ev = store.events_after("task_running", 0).await.unwrap();
        assert_eq!(ev.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!(ev[2].1["reason"], "host_restarted");
        assert_eq!(store.task("task_done").await.unwrap().unwrap().output.as_deref(), Some("kept"));
        assert_eq!(store.purge(Duration::from_secs(3600)).await.unwrap(), 1, "only the ancient task is past retention");
        assert!(store.task("task_ancient").await.unwrap().is_none());
        assert!(store.task("task_done").await.unwrap().is_some());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn finished_tasks_are_served_from_the_store() {
        let api = api().await;
        let id = api.task("greeter", "persisted", false).await.body["task_id"].as_str().unwrap().to_owned();
        let stored = api.engine.store().task(&id).await.unwrap().unwrap();
        assert_eq!((stored.status.as_str(), stored.output.as_deref()), ("completed", Some("persisted")));
        assert_eq!(api.engine.store().events_after(&id, 0).await.unwrap().len(), 5);
        assert!(api.engine.live(&id).is_none());
        assert_eq!(api.get(&format!("/v1/tasks/{id}")).await.body["output"], "persisted");
        assert!(api.dir.path().join("state.db").is_file());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_task_on_the_postgres_store_is_served_from_the_database() {
        let db = super::postgres::TestDatabase::create().await;
        let store = Store::connect(&db.url).await.unwrap();
        let plugins = [(test_plugin("echo"), "echo"), (test_plugin("hostile"), "hostile")];
        let api = api_on(&plugins, ECHO_AND_HOSTILE, vec![], &[], Some(store)).await;
        let id = api.task("greeter", "kept in postgres", false).await.body["task_id"].as_str().unwrap().to_owned();
        assert!(api.engine.live(&id).is_none(), "finished: served from the store, not from memory");
        let got = api.get(&format!("/v1/tasks/{id}")).await;
        assert_eq!((got.status, got.body["status"].as_str()), (200, Some("completed")), "{}", got.text);
        assert_eq!(got.body["output"], "kept in postgres");
        let events = api.stream(&format!("/v1/tasks/{id}/events"), None, None).await.rest().await;
        assert_eq!(types(&events), vec!["status", "status", "plugin", "progress", "finish"], "{events:?}");
        assert_eq!(events.iter().map(|e| e.id.unwrap()).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
        let tail = api.stream(&format!("/v1/tasks/{id}/events"), None, Some(3)).await.rest().await;
        assert_eq!(tail.iter().map(|e| e.id.unwrap()).collect::<Vec<_>>(), vec![4, 5]);
        // The rows are in the database: a second store on it (a restarted host) reads them.
        let other = Store::connect(&db.url).await.unwrap();
        let rec = other.task(&id).await.unwrap().unwrap();
        assert_eq!((rec.status.as_str(), rec.output.as_deref()), ("completed", Some("kept in postgres")));
        assert_eq!(other.events_after(&id, 0).await.unwrap().len(), 5);
        assert!(other.location().starts_with("postgres://"), "{}", other.location());
        drop((api, other));
        db.drop_database().await;
    }
}

/// Several servers on one PostgreSQL store, as replicas (`server.replica_id`): the shared
/// queue, leases, and control across replicas.
mod replicas {
    use super::*;

    /// Two replicas, `ra` and `rb`, one slot each, on `db`; `extra` adds `server:` keys.
    async fn pair(db: &super::postgres::TestDatabase, extra: &str) -> (Api, Api) {
        let plugins = [(test_plugin("echo"), "echo"), (test_plugin("hostile"), "hostile")];
        pair_of(db, &plugins, ECHO_AND_HOSTILE, extra).await
    }

    /// [`pair`] of `plugins` under the configuration `base` (before its `server:` keys).
    pub(super) async fn pair_of(
        db: &super::postgres::TestDatabase,
        plugins: &[(std::path::PathBuf, &str)],
        base: &str,
        extra: &str,
    ) -> (Api, Api) {
        let yaml = |id: &str| {
            format!(
                "{base}server:\n  heartbeat: 200ms\n  replica_id: {id}\n  max_concurrent_tasks: 1\n  task_lease: 2s\n{extra}"
            )
        };
        let a = api_on(plugins, &yaml("ra"), vec![], &[], Some(Store::connect(&db.url).await.unwrap())).await;
        let b = api_on(plugins, &yaml("rb"), vec![], &[], Some(Store::connect(&db.url).await.unwrap())).await;
        (a, b)
    }

    /// A background task that sleeps 40 s, under the plugin's 60 s limit (no CPU: a spinning task on two cores
    /// would starve the lease renewals of a 2 s lease), once it holds a slot.
    pub(super) async fn sleeper(api: &Api) -> String {
        let id = api.task("hostile", SLEEP_40_S, true).await.body["task_id"].as_str().unwrap().to_owned();
        let t = Instant::now();
        while api.get(&format!("/v1/tasks/{id}?block=false")).await.body["status"] != "working" {
            assert!(t.elapsed() < Duration::from_secs(10), "the sleeper never started");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        id
    }

    const SLEEP_40_S: &str = r#"script:[{"op":"sleep","ms":40000}]"#;

    /// The task's record once it is finished (read through `api`), within 30 s.
    pub(super) async fn finished(api: &Api, id: &str) -> Value {
        let t = Instant::now();
        loop {
            let r = api.get(&format!("/v1/tasks/{id}?timeout_ms=2000")).await;
            if r.body["finished_at_ms"].is_u64() {
                return r.body;
            }
            assert!(t.elapsed() < Duration::from_secs(30), "task {id} never finished: {}", r.text);
        }
    }

    /// Regression (review): a task of a subagent whose definition asks for isolation (the
    /// operator's reference metadata `isolation: fork`) was admitted on a replica — its fork
    /// named, the source session's secrets shared with it — and failed only when it
    /// started: refused at submission, naming `isolation`, while its plain sibling runs.
    #[tokio::test(flavor = "multi_thread")]
    async fn regression_an_isolated_task_was_admitted_on_a_replica() {
        let db = super::postgres::TestDatabase::create().await;
        let plugins = [(test_plugin("echo"), "echo"), (test_plugin("hostile"), "hostile")];
        let base = ECHO_AND_HOSTILE.replacen(
            "    - { uri: \"hostile://hostile\", kind: HOSTILE }\n",
            "    - { uri: \"hostile://hostile\", kind: HOSTILE }\n    - { uri: \"echo://apart\", kind: ECHO, metadata: { isolation: fork } }\n",
            1,
        );
        let (a, _b) = pair_of(&db, &plugins, &base, "").await;
        let refused = a.task("apart", "hi", false).await;
        assert_eq!(
            (refused.status, refused.body["error"]["code"].as_str()),
            (400, Some("invalid_field")),
            "{}",
            refused.text
        );
        let message = refused.body["error"]["message"].as_str().unwrap();
        assert!(message.contains("isolation") && message.contains("replicas"), "{message}");
        let listed = a.get("/v1/tasks").await;
        assert!(!listed.text.contains("apart"), "nothing was admitted: {}", listed.text);
        // Positive control: the same plugin's plain subagent is admitted and runs.
        let ran = a.task("greeter", "hi", false).await;
        assert_eq!((ran.status, ran.body["status"].as_str()), (200, Some("completed")), "{}", ran.text);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn tasks_queued_on_a_busy_replica_run_on_the_one_with_a_free_slot() {
        let db = super::postgres::TestDatabase::create().await;
        let (a, b) = pair(&db, "").await;
        let script = r#"script:[{"op":"sleep","ms":400}]"#;
        let mut ids = vec![];
        for _ in 0..6 {
            let r = a.task("hostile", script, true).await;
            assert_eq!(r.status, 202, "{}", r.text);
            ids.push(r.body["task_id"].as_str().unwrap().to_owned());
        }
        let mut ran_on = std::collections::BTreeMap::<String, usize>::new();
        for id in &ids {
            let rec = finished(&b, id).await;
            assert_eq!(rec["status"], "completed", "{rec}");
            *ran_on.entry(rec["replica"].as_str().unwrap_or("none").to_owned()).or_default() += 1;
        }
        // One slot each: `ra` could not have run all six while `rb` idled.
        assert_eq!(ran_on.keys().cloned().collect::<Vec<_>>(), vec!["ra", "rb"], "{ran_on:?}");
        // Every task, wherever it ran, streams in full through `rb`: numbered from 1, one `finish`.
        for id in &ids {
            let events = b.stream(&format!("/v1/tasks/{id}/events"), None, None).await.rest().await;
            let seqs: Vec<u64> = events.iter().map(|e| e.id.unwrap()).collect();
            assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "{events:?}");
            assert_eq!(types(&events).iter().filter(|t| *t == "finish").count(), 1, "{events:?}");
            assert_eq!(types(&events).first().map(String::as_str), Some("status"), "{events:?}");
        }
        drop((a, b));
        db.drop_database().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_queue_limit_holds_across_replicas_and_cancel_works_from_any_replica() {
        let db = super::postgres::TestDatabase::create().await;
        let (a, b) = pair(&db, "  max_queued_tasks: 2\n").await;
        let on_a = sleeper(&a).await;
        let on_b = sleeper(&b).await;
        // Both slots taken: two more wait in the shared queue, whichever replica took them.
        let q1 = a.task("hostile", SLEEP_40_S, true).await;
        let q2 = b.task("hostile", SLEEP_40_S, true).await;
        assert_eq!((q1.status, q2.status), (202, 202), "{} {}", q1.text, q2.text);
        let full = a.task("hostile", SLEEP_40_S, true).await;
        let logs = || {
            let logs = String::from_utf8_lossy(&logs().lock().unwrap()).into_owned();
            logs.lines().filter(|l| l.contains("replica") || l.contains("task")).collect::<Vec<_>>().join("\n")
        };
        assert_eq!(
            (full.status, full.body["error"]["code"].as_str()),
            (503, Some("queue_full")),
            "{}\n{}",
            full.text,
            logs()
        );
        // A queued task canceled through either replica ends without running.
        let q1 = q1.body["task_id"].as_str().unwrap().to_owned();
        let r = b.post(&format!("/v1/tasks/{q1}/cancel"), json!({})).await;
        assert_eq!((r.status, r.body["status"].as_str()), (200, Some("canceled")), "{}", r.text);
        // A running task canceled through the replica that does not run it.
        let r = b.post(&format!("/v1/tasks/{on_a}/cancel"), json!({})).await;
        assert_eq!((r.status, r.body["status"].as_str()), (200, Some("canceled")), "{}\n{}", r.text, logs());
        assert!(a.engine.live(&on_a).is_none(), "the task stopped on the replica that ran it");
        // Its slot freed: `ra` takes the other queued task.
        let q2 = q2.body["task_id"].as_str().unwrap().to_owned();
        let t = Instant::now();
        while a.engine.live(&q2).is_none() {
            assert!(t.elapsed() < Duration::from_secs(10), "the queued task was never claimed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for (api, id) in [(&a, &q2), (&b, &on_b)] {
            let r = api.post(&format!("/v1/tasks/{id}/cancel"), json!({})).await;
            assert_eq!(r.status, 200, "{}", r.text);
        }
        drop((a, b));
        db.drop_database().await;
    }

    /// The user share across replicas: a task that goes to the shared queue is counted with
    /// every task of its user queued or held by any replica, in the enqueue transaction.
    #[tokio::test(flavor = "multi_thread")]
    async fn regression_one_user_cannot_fill_the_shared_queue() {
        let db = super::postgres::TestDatabase::create().await;
        let (a, b) = pair(&db, "  max_queued_tasks: 10\n  max_tasks_per_user: 2\n").await;
        async fn submit(api: &Api, user: &str) -> Reply {
            let body = json!({ "description": "sleep", "prompt": SLEEP_40_S, "subagent_type": "hostile",
                "run_in_background": true, "user_id": user });
            api.post("/v1/tasks", body).await
        }
        // One task of mallory runs on each replica (each has one slot).
        let mut ids = vec![];
        for api in [&a, &b] {
            let r = submit(api, "mallory").await;
            assert_eq!(r.status, 202, "{}", r.text);
            ids.push(r.body["task_id"].as_str().unwrap().to_owned());
            api.engine.store().flush().await.unwrap();
        }
        // Both slots are hers: a third task would go to the shared queue, where her two
        // held tasks count.
        let r = submit(&a, "mallory").await;
        assert_eq!((r.status, r.body["error"]["code"].as_str()), (429, Some("too_many_user_tasks")), "{}", r.text);
        assert!(r.text.contains("server.max_tasks_per_user"), "{}", r.text);
        let r = submit(&b, "alice").await;
        assert_eq!(r.status, 202, "another user's task is queued: {}", r.text);
        ids.push(r.body["task_id"].as_str().unwrap().to_owned());
        for id in &ids {
            a.post(&format!("/v1/tasks/{id}/cancel"), json!({})).await;
        }
        drop((a, b));
        db.drop_database().await;
    }

    /// Regression guard for the lease: a task whose replica stopped renewing (simulated by
    /// handing its lease to a replica that does not exist and letting it lapse) ends
    /// `failed` "replica lost", once, and the replica still running it stops it — with
    /// durable tasks off (`server.durable_tasks: false`; on, it is taken over: below).
    #[tokio::test(flavor = "multi_thread")]
    async fn a_task_whose_lease_lapsed_ends_replica_lost_once_and_stops_where_it_ran() {
        let db = super::postgres::TestDatabase::create().await;
        let (a, b) = pair(&db, "  durable_tasks: false\n").await;
        let id = sleeper(&a).await;
        let client = super::postgres::admin_client(&db.url).await;
        client
            .execute("UPDATE task_queue SET owner = 'ghost', lease_until_ms = 0 WHERE task_id = $1", &[&id])
            .await
            .unwrap();
        let rec = finished(&b, &id).await;
        assert_eq!(
            (rec["status"].as_str(), rec["finish_reason"].as_str()),
            (Some("failed"), Some("replica_lost")),
            "{rec}"
        );
        assert!(rec["error"].as_str().unwrap().contains("replica lost: replica ghost"), "{rec}");
        let t = Instant::now();
        while a.engine.live(&id).is_some() {
            if t.elapsed() > Duration::from_secs(10) {
                let logs = String::from_utf8_lossy(&logs().lock().unwrap()).into_owned();
                let about: Vec<&str> = logs.lines().filter(|l| l.contains(&id) || l.contains("lease")).collect();
                panic!("the replica that lost the lease kept running the task:\n{}", about.join("\n"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Its own end did not overwrite the verdict, nor add a second `finish`.
        let stored = a.engine.store().task(&id).await.unwrap().unwrap();
        assert_eq!(stored.finish_reason, Some(warden::store::FinishReason::ReplicaLost), "{stored:?}");
        let events = a.engine.store().events_after(&id, 0).await.unwrap();
        assert_eq!(events.iter().filter(|(_, e)| e["type"] == "finish").count(), 1, "{events:?}");
        assert_eq!(events.last().unwrap().1["reason"], "replica_lost", "{events:?}");
        let left: i64 = client.query_one("SELECT count(*) FROM task_queue", &[]).await.unwrap().get(0);
        assert_eq!(left, 0, "the lost task left the queue");
        drop((a, b, client));
        db.drop_database().await;
    }
}

mod durable {
    use super::replicas::finished;
    use super::*;

    /// The script of the durable task: a clock reading, an event, a state write, a sleep
    /// (under way when its replica is lost), a second reading and event.
    const SCRIPT: &str = r#"script:[{"op":"now"},{"op":"emit","kind":"progress","data":"{\"step\":1}"},{"op":"state_set","key":"k","value":"v1"},{"op":"sleep","ms":3000},{"op":"now"},{"op":"emit","kind":"progress","data":"{\"step\":2}"}]"#;

    /// Two replicas whose `hostile` plugin may emit events and keep state.
    async fn durable_pair(db: &super::postgres::TestDatabase) -> (Api, Api) {
        let plugins = [
            (test_plugin("echo"), "echo"),
            (test_plugin("hostile"), "hostile"),
            (test_plugin("wasi-probe"), "wasi-probe"),
        ];
        let base = ECHO_AND_HOSTILE
            .replace(
                "    echo: { log: true, events: true, state: true }\n",
                "    echo: { log: true, events: true, state: true }\n    hostile: { log: true, events: true, state: true }\n",
            )
            .replace(
                "    - { uri: \"hostile://hostile\", kind: HOSTILE }\n",
                "    - { uri: \"hostile://hostile\", kind: HOSTILE }\n    - { uri: \"wasi-probe://probe\", kind: WASI-PROBE }\n",
            );
        assert!(base.contains("hostile: { log") && base.contains("WASI-PROBE"), "{base}");
        super::replicas::pair_of(db, &plugins, &base, "").await
    }

    /// Regression (chaos test): a replica killed after claiming a queued task and before
    /// committing its journal's header left a task with no journal, which the replica that
    /// took its lease over ended `host restarted` / `replica lost` although nothing of it
    /// had run. Such a task goes back to the queue and runs from the start. The claim that
    /// died is made by hand: the task waits in the queue (both replicas' one slot busy),
    /// then a replica that does not exist holds it with a lapsed lease.
    #[tokio::test(flavor = "multi_thread")]
    async fn regression_a_task_claimed_by_a_replica_that_died_before_its_journal_began_ended_failed() {
        let db = super::postgres::TestDatabase::create().await;
        let (a, b) = durable_pair(&db).await;
        let busy = [super::replicas::sleeper(&a).await, super::replicas::sleeper(&b).await];
        let script = r#"script:[{"op":"emit","kind":"progress","data":"{\"step\":1}"},{"op":"now"}]"#;
        let id = a.task("hostile", script, true).await.body["task_id"].as_str().unwrap().to_owned();
        let client = super::postgres::admin_client(&db.url).await;
        // The positive control: it waited unclaimed, and the ghost's claim took it.
        let claimed = client
            .execute(
                "UPDATE task_queue SET owner = 'ghost', lease_until_ms = 0 WHERE task_id = $1 AND owner IS NULL",
                &[&id],
            )
            .await
            .unwrap();
        assert_eq!(claimed, 1, "the task waited in the queue");
        assert!(warden::journal::Recorded::read(a.engine.store(), &id).await.unwrap().header.is_none());
        for sleeper in &busy {
            assert_eq!(a.post(&format!("/v1/tasks/{sleeper}/cancel"), json!({})).await.status, 200);
        }
        let rec = finished(&b, &id).await;
        assert_eq!(
            (rec["status"].as_str(), rec["output"].as_str().map(|o| o.starts_with(r#"["ok","ok:"#))),
            (Some("completed"), Some(true)),
            "{rec}"
        );
        let events = a.engine.store().events_after(&id, 0).await.unwrap();
        assert_eq!(events.iter().filter(|(_, e)| e["type"] == "progress").count(), 1, "{events:?}");
        assert!(!events.iter().any(|(_, e)| e["type"] == "takeover"), "it ran from the start: {events:?}");
        let ids: Vec<u64> = events.iter().map(|(i, _)| *i).collect();
        assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>(), "{events:?}");
        drop((a, b, client));
        db.drop_database().await;
    }

    /// Done when (issue 42), at the host's level: a durable task whose replica stopped
    /// renewing its lease is taken over by another replica, which runs the same plugin
    /// again against the task's journal: the clock reading the plugin saw is the one it
    /// sees again, the event already streamed is not emitted again, the sleep that was
    /// under way is slept again, and the task completes once, its stream going on with the
    /// next event id. The replica that lost it stops its copy without writing anything
    /// more (in this test it is alive, so its own reaper may be the one to take it over).
    #[tokio::test(flavor = "multi_thread")]
    async fn a_durable_task_whose_lease_lapsed_is_taken_over_and_replays_its_journal() {
        let db = super::postgres::TestDatabase::create().await;
        let (a, b) = durable_pair(&db).await;
        let id = a.task("hostile", SCRIPT, true).await.body["task_id"].as_str().unwrap().to_owned();
        // Its first event is streamed: the sleep is under way.
        let t = Instant::now();
        loop {
            let events = a.engine.store().events_after(&id, 0).await.unwrap();
            if events.iter().any(|(_, e)| e["type"] == "progress") {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(20), "the task never emitted: {events:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let journal = warden::journal::Recorded::read(a.engine.store(), &id).await.unwrap();
        let header = journal.header.as_ref().expect("a durable task's journal has a header");
        assert_eq!((header.plugin.id.as_str(), header.call.prompt.as_str()), ("hostile", SCRIPT));
        let (_, first) = journal
            .calls
            .iter()
            .find(|(_, c)| c.import == warden::journal::Import::ClockNowMs)
            .expect("the first reading is in the journal");
        let first_now = match &first.state {
            warden::journal::CallState::Done { result } => result["Ok"].as_u64().expect("a reading"),
            other => panic!("the first reading was not recorded: {other:?}"),
        };
        let client = super::postgres::admin_client(&db.url).await;
        client
            .execute("UPDATE task_queue SET owner = 'ghost', lease_until_ms = 0 WHERE task_id = $1", &[&id])
            .await
            .unwrap();
        let rec = finished(&b, &id).await;
        let log = || {
            let logs = String::from_utf8_lossy(&logs().lock().unwrap()).into_owned();
            logs.lines().filter(|l| l.contains(&id) || l.contains("lease")).collect::<Vec<_>>().join("\n")
        };
        // Either replica may take it over: `ra`, still alive, stopped its copy when it saw
        // the lease taken from it, and its reaper is as quick as `rb`'s.
        assert_eq!(rec["status"].as_str(), Some("completed"), "{rec}\n{}", log());
        let taker = rec["replica"].as_str().unwrap().to_owned();
        let out: Vec<String> = serde_json::from_str(rec["output"].as_str().unwrap()).unwrap();
        // The replay answered the first reading from the journal (the new replica's clock
        // has another origin), and the live one after it does not go backwards.
        assert_eq!(out[0], format!("ok:{first_now}"), "{out:?}");
        let second: u64 = out[4].strip_prefix("ok:").unwrap().parse().unwrap();
        assert!(second >= first_now + 3000, "{out:?}");
        let slept: u64 = out[3].strip_prefix("ok:").unwrap().parse().unwrap();
        assert!(slept >= 3000, "the sleep under way was slept again: {out:?}");
        let events = b.engine.store().events_after(&id, 0).await.unwrap();
        let seqs: Vec<u64> = events.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "one event per id, in order: {events:?}");
        let of = |t: &str| events.iter().filter(|(_, e)| e["type"] == t).map(|(_, e)| e.clone()).collect::<Vec<_>>();
        let steps: Vec<u64> = of("progress").iter().map(|e| e["step"].as_u64().unwrap()).collect();
        assert_eq!(steps, [1, 2], "the first event was not emitted again: {events:?}");
        let takeover = of("takeover");
        assert_eq!(takeover.len(), 1, "{events:?}");
        assert_eq!((takeover[0]["from"].as_str(), takeover[0]["to"].as_str()), (Some("ghost"), Some(taker.as_str())));
        assert!(takeover[0]["journal_entries"].as_u64().unwrap() >= 3, "{takeover:?}");
        assert_eq!(of("finish").len(), 1, "{events:?}");
        // The copy that lost the lease stopped where it ran, and wrote nothing after: one
        // run of the task's steps (checked above), one end.
        // (Seen at its lease renewal, or by its own reaper taking the task over first.)
        let log = log();
        assert!(
            log.contains("task taken over by another replica (lease lost); stopping it here")
                || log.contains("a copy of the task taken over still ran here; stopping it"),
            "{log}"
        );
        drop((a, b, client));
        db.drop_database().await;
    }

    /// Takeover benchmark (figures in BENCHMARKS.md, "Durable tasks"): `WARDEN_TAKEOVERS`
    /// (default 20) durable tasks, each handed from replica `ra` to a lapsed lease once its
    /// first event is out; measured per task from the lease lapsing to the `takeover`
    /// event (on whichever replica took it), and to its first live event there (the
    /// replay done). The lease is 2 s, so the reapers look every second: that bounds the
    /// first figure.
    #[tokio::test(flavor = "multi_thread")]
    #[ignore = "benchmark: run by hand, figures in BENCHMARKS.md"]
    async fn bench_takeover() {
        let n: usize = std::env::var("WARDEN_TAKEOVERS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
        let db = super::postgres::TestDatabase::create().await;
        let (a, b) = durable_pair(&db).await;
        let client = super::postgres::admin_client(&db.url).await;
        let script = r#"script:[{"op":"emit","kind":"progress","data":"{\"step\":1}"},{"op":"now","repeat":50},{"op":"sleep","ms":2500},{"op":"emit","kind":"progress","data":"{\"step\":2}"}]"#;
        let (mut to_takeover, mut to_live, mut entries) = (vec![], vec![], vec![]);
        for _ in 0..n {
            let id = a.task("hostile", script, true).await.body["task_id"].as_str().unwrap().to_owned();
            loop {
                let events = a.engine.store().events_after(&id, 0).await.unwrap();
                if events.iter().any(|(_, e)| e["type"] == "progress") {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            client
                .execute("UPDATE task_queue SET owner = 'ghost', lease_until_ms = 0 WHERE task_id = $1", &[&id])
                .await
                .unwrap();
            let lapsed = Instant::now();
            let (mut took_over, mut live) = (None, None);
            while live.is_none() {
                let events = b.engine.store().events_after(&id, 0).await.unwrap();
                if let Some((_, t)) = events.iter().find(|(_, e)| e["type"] == "takeover") {
                    took_over.get_or_insert(lapsed.elapsed());
                    entries.push(t["journal_entries"].as_u64().unwrap());
                }
                if events.iter().any(|(_, e)| e["type"] == "progress" && e["step"] == 2) {
                    live = Some(lapsed.elapsed());
                }
                if lapsed.elapsed() > Duration::from_secs(30) {
                    let tail: Vec<_> = events.iter().rev().take(4).collect();
                    let logs = String::from_utf8_lossy(&logs().lock().unwrap()).into_owned();
                    let about: Vec<&str> = logs.lines().filter(|l| l.contains(&id)).collect();
                    panic!("{id} was not taken over: {tail:?}\n{}", about.join("\n"));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            to_takeover.push(took_over.unwrap());
            // The sleep under way is slept again, whole: taken out.
            to_live.push(live.unwrap().saturating_sub(Duration::from_millis(2500)));
            finished(&b, &id).await;
        }
        let pct = |v: &mut Vec<Duration>, p: f64| {
            v.sort();
            v[((v.len() as f64 * p).ceil() as usize).saturating_sub(1)]
        };
        println!(
            "BENCH takeover ({} profile, {n} tasks, lease 2s, {} journal entries each): lease lapsed → takeover event p50 {:?} p99 {:?}; → first live event (the 2.5 s sleep under way taken out) p50 {:?} p99 {:?}",
            if cfg!(debug_assertions) { "dev" } else { "release" },
            entries.first().copied().unwrap_or(0),
            pct(&mut to_takeover, 0.5),
            pct(&mut to_takeover, 0.99),
            pct(&mut to_live, 0.5),
            pct(&mut to_live, 0.99),
        );
        drop((a, b, client));
        db.drop_database().await;
    }

    /// Done when (issue 42): a plugin that does not run the same way twice (it logs bytes
    /// drawn from WASI's random source) is not handed answers meant for other calls when
    /// its task is taken over: the task fails naming the first import call that differs
    /// from its journal.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_plugin_that_is_not_deterministic_fails_its_takeover_naming_the_first_difference() {
        let db = super::postgres::TestDatabase::create().await;
        let (a, b) = durable_pair(&db).await;
        let id = a.task("probe", "nondeterministic", true).await.body["task_id"].as_str().unwrap().to_owned();
        // The random line is journaled and the sleep under way.
        let t = Instant::now();
        loop {
            let journal = warden::journal::Recorded::read(a.engine.store(), &id).await.unwrap();
            if journal.calls.iter().any(|(_, c)| c.import == warden::journal::Import::LogWrite) {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(30), "the random line was never journaled: {journal:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let client = super::postgres::admin_client(&db.url).await;
        client
            .execute("UPDATE task_queue SET owner = 'ghost', lease_until_ms = 0 WHERE task_id = $1", &[&id])
            .await
            .unwrap();
        let rec = finished(&b, &id).await;
        assert_eq!(rec["status"], "failed", "{rec}");
        let error = rec["error"].as_str().unwrap();
        assert!(
            error.contains("the plugin is not deterministic: its import call #")
                && error.contains("was log.write with arguments")
                && error.contains("the journal recorded log.write"),
            "{error}"
        );
        // The takeover ran (a positive control): its event says so.
        let events = b.engine.store().events_after(&id, 0).await.unwrap();
        assert_eq!(events.iter().filter(|(_, e)| e["type"] == "takeover").count(), 1, "{events:?}");
        drop((a, b, client));
        db.drop_database().await;
    }
}

mod load {
    use super::*;

    /// 200 concurrent synchronous ECHO tasks over HTTP: none lost, each gets its own output.
    /// Prints p50/p99 latency (recorded in BENCHMARKS.md). `WARDEN_LOAD_TASKS` sets another
    /// count (the queue takes up to `server.max_queued_tasks`).
    #[tokio::test(flavor = "multi_thread")]
    async fn two_hundred_concurrent_echo_tasks() {
        let n: usize = std::env::var("WARDEN_LOAD_TASKS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
        // One principal sends every task: its share (`server.max_tasks_per_user`, a bound
        // for hosts of several tenants, default 128) is raised to the whole load, which
        // measures the engine, not the share; so are the connections it opens at once
        // (`server.max_connections`, default 512: past it, a new connection closes the
        // pool's longest-idle keep-alive one, or waits while all are busy).
        // `WARDEN_LOAD_DURABLE=0`: durable tasks off, to measure what the journal costs.
        let durable = std::env::var("WARDEN_LOAD_DURABLE").map_or(true, |v| v != "0");
        // `WARDEN_LOAD_CALLS=N`: each task is the `hostile` plugin making N import calls
        // (`cancel.is-canceled`, each journaled when durable), to measure the journal per call.
        let calls: u32 = std::env::var("WARDEN_LOAD_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
        let yaml = format!(
            "{ECHO_AND_HOSTILE}server:\n  heartbeat: 200ms\n  max_tasks_per_user: {0}\n  max_connections: {0}\n  durable_tasks: {durable}\n",
            n.max(1)
        );
        let api = api_with(&[(test_plugin("echo"), "echo"), (test_plugin("hostile"), "hostile")], &yaml, vec![]).await;
        api.task("greeter", "warm-up", false).await;
        let started = Instant::now();
        let mut handles = vec![];
        for i in 0..n {
            let http = api.http.clone();
            let url = api.url("/v1/tasks");
            handles.push(tokio::spawn(async move {
                let t = Instant::now();
                let body = match calls {
                    0 => json!({ "description": "load", "prompt": format!("message {i}"), "subagent_type": "greeter" }),
                    n => json!({ "description": "load", "subagent_type": "hostile",
                        "prompt": format!(r#"script:[{{"op":"canceled","repeat":{n}}}]"#) }),
                };
                let resp = http
                    .post(url)
                    .header("content-type", "application/json")
                    .body(body.to_string())
                    .send()
                    .await
                    .unwrap();
                let status = resp.status().as_u16();
                let v: Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
                (i, status, v, t.elapsed())
            }));
        }
        let mut latencies = vec![];
        let mut ids = std::collections::HashSet::new();
        for h in handles {
            let (i, status, v, took) = h.await.unwrap();
            assert_eq!(status, 200, "{v}");
            assert_eq!(v["status"], "completed", "{v}");
            match calls {
                0 => assert_eq!(v["output"], format!("message {i}")),
                _ => assert_eq!(v["output"], r#"["ok:false"]"#, "{v}"),
            }
            assert!(ids.insert(v["task_id"].as_str().unwrap().to_owned()));
            latencies.push(took);
        }
        let wall = started.elapsed();
        latencies.sort();
        let pct = |p: f64| latencies[((latencies.len() as f64 * p).ceil() as usize).saturating_sub(1)];
        println!(
            "BENCH task_engine ({} profile, durable_tasks {durable}, {calls} import calls per task): {n} concurrent tasks over HTTP, max_concurrent_tasks={}: wall {:?} ({:.0} tasks/s), p50 {:?}, p99 {:?}, max {:?}",
            if cfg!(debug_assertions) { "dev" } else { "release" },
            api.engine.options().max_concurrent_tasks,
            wall,
            n as f64 / wall.as_secs_f64(),
            pct(0.50),
            pct(0.99),
            latencies.last().unwrap()
        );
        assert_eq!(ids.len(), n);
        for id in &ids {
            assert_eq!(
                api.engine.store().task(id).await.unwrap().unwrap().status,
                warden::store::TaskState::Completed,
                "persisted"
            );
        }
    }
}

/// Connection-flood benchmark (not a pass/fail timing test; figures in BENCHMARKS.md):
/// `WARDEN_FLOOD_IDLE` (default 10,000) connections that send nothing are opened, then
/// `/healthz` and an authenticated `GET /v1/tasks` are timed, each on a new connection.
/// Run: `cargo test -p warden --release --test api -- --ignored --nocapture connection_flood`.
mod flood_bench {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    #[ignore = "benchmark: run by hand, figures in BENCHMARKS.md"]
    async fn connection_flood_latency() {
        let n: usize = std::env::var("WARDEN_FLOOD_IDLE").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit/setrlimit with a valid pointer to an rlimit.
        unsafe {
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
        assert!(lim.rlim_cur as usize > n + 2_000, "raise `ulimit -n` above {} (it is {})", n + 2_000, lim.rlim_cur);
        let tokens = vec!["tok-bench".to_owned()];
        let api =
            api_with(&[(test_plugin("echo"), "echo"), (test_plugin("hostile"), "hostile")], ECHO_AND_HOSTILE, tokens)
                .await;
        let opened = Instant::now();
        let flood = holds::idle_sockets(&api, n).await;
        let opened = opened.elapsed();
        // A new connection per request: the worst case (a pooled one is proven already).
        let http =
            reqwest::Client::builder().pool_max_idle_per_host(0).timeout(Duration::from_secs(60)).build().unwrap();
        const SAMPLES: usize = 200;
        let mut report = vec![];
        for (name, path, token) in
            [("/healthz", "/healthz", None), ("GET /v1/tasks (authenticated)", "/v1/tasks", Some("tok-bench"))]
        {
            let mut took = vec![];
            for _ in 0..SAMPLES {
                let mut req = http.get(api.url(path));
                if let Some(t) = token {
                    req = req.bearer_auth(t);
                }
                let t = Instant::now();
                let r = req.send().await.unwrap();
                assert_eq!(r.status(), 200);
                r.bytes().await.unwrap();
                took.push(t.elapsed());
            }
            took.sort();
            let pct = |p: f64| took[((took.len() as f64 * p).ceil() as usize).saturating_sub(1)];
            report.push(format!("{name}: p50 {:?}, p99 {:?}, max {:?}", pct(0.5), pct(0.99), took.last().unwrap()));
        }
        println!(
            "BENCH connection_flood ({} profile): {n} idle connections opened in {opened:?} (server.max_connections {}), {SAMPLES} requests each on a new connection: {}",
            if cfg!(debug_assertions) { "dev" } else { "release" },
            warden::config::DEFAULT_MAX_CONNECTIONS,
            report.join("; ")
        );
        drop(flood);
    }
}

/// The Docker-backed scenarios: the bundled `claude` plugin with a scripted model and a
/// real sandbox session. Skipped (with a note) when Docker is not reachable.
mod sandboxed {
    use super::*;
    use sha2::Digest;

    /// These tests need the real Docker engine and the sandbox image (`cargo xtask test`
    /// provides both); without them they fail loudly rather than skip.
    fn docker_ok() -> bool {
        let ok = std::process::Command::new("docker")
            .args(["image", "inspect", "warden-sandbox:bookworm"])
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(ok, "Docker or the warden-sandbox:bookworm image is not available — run `cargo xtask test`");
        ok
    }

    const WORKER: &str = "---\nname: worker\ndescription: Runs shell commands in the workspace\ntools: Bash, Read\nmodel: sonnet\n---\nDo the work.\n";

    async fn deployment(script: &str, approval: &str) -> Api {
        deployment_with(script, approval, WORKER).await
    }

    /// A sandboxed deployment whose `worker` agent file is `agent`.
    async fn deployment_with(script: &str, approval: &str, agent: &str) -> Api {
        // Hosts of one scope reap each other's containers on start: one scope per test.
        let scope = format!("apitest{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let yaml = claude_scripted(&format!(
            "sandbox:\n  image: warden-sandbox:bookworm\n  scope: {scope}\n  task_env: [API_TOKEN]\napproval:\n{approval}\n"
        ));
        let files = [("script.yaml", script), ("agents/worker.md", agent)];
        api_with_files(&[(bundled_plugin("claude"), "claude")], &yaml, vec![], &files).await
    }

    async fn end_sessions(api: &Api) {
        if let Ok(s) = api.engine.tools().sandbox() {
            let _ = s.shutdown().await;
        }
    }

    /// A sandboxed deployment of the `hostile` test plugin (its `script:` calls tools and
    /// sends HTTP), every Bash call allowed; `sandbox` adds keys under `sandbox:`.
    async fn hostile_sandboxed(sandbox: &str) -> Api {
        let scope = format!("apitest{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let yaml = format!(
            "  grants:\n    hostile: {{ tools: true, log: true, events: true, http: [\"http://127.0.0.1:*\"] }}\n\
             \x20 limit_overrides:\n    hostile: {{ timeout: 300s }}\n\
             subagents:\n  agent_dirs: []\n  references:\n    - {{ uri: \"hostile://hostile\", kind: HOSTILE }}\n\
             approval:\n  default: allow\n  allow: [\"Bash\"]\n\
             sandbox:\n  image: warden-sandbox:bookworm\n  scope: {scope}\n{sandbox}"
        );
        api_with(&[(test_plugin("hostile"), "hostile")], &yaml, vec![]).await
    }

    /// Runs one Bash command through the hostile plugin's `tools.call` as a task of
    /// `session` with `tool_context`; the command's output.
    async fn bash_through_plugin(api: &Api, session: &str, tool_context: Value, command: &str) -> String {
        let args = json!({ "command": command }).to_string();
        let ops = json!([{ "op": "tools_call", "name": "Bash", "arguments": args }]);
        let r = api
            .post(
                "/v1/tasks",
                json!({ "description": "d", "prompt": format!("script:{ops}"), "subagent_type": "hostile",
                        "session_id": session, "tool_context": tool_context }),
            )
            .await;
        assert_eq!((r.status, r.body["status"].as_str()), (200, Some("completed")), "{}", r.text);
        let results: Vec<String> = serde_json::from_str(r.body["output"].as_str().unwrap()).unwrap();
        let calls: Value =
            serde_json::from_str(results[0].strip_prefix("ok:").unwrap_or_else(|| panic!("{results:?}"))).unwrap();
        assert_eq!(calls[0]["is_error"], false, "{calls}");
        calls[0]["content"].as_str().unwrap().to_owned()
    }

    /// Standard base64 (what the sandbox's `base64` writes), decoded.
    fn unbase64(text: &str) -> Vec<u8> {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let (mut out, mut acc, mut bits) = (Vec::new(), 0u32, 0);
        for c in text.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=') {
            let v = ALPHABET.iter().position(|a| *a == c).unwrap_or_else(|| panic!("not base64: {text:?}"));
            acc = (acc << 6) | v as u32;
            bits += 6;
            if bits >= 8 {
                bits -= 8;
                out.push((acc >> bits) as u8);
            }
        }
        out
    }

    /// A sandboxed deployment of the `hostile` test plugin with the approval policy
    /// `approval` (keys under `approval:`).
    async fn hostile_with_policy(approval: &str) -> Api {
        let scope = format!("apitest{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let yaml = format!(
            "  grants:\n    hostile: {{ tools: true }}\n\
             \x20 limit_overrides:\n    hostile: {{ timeout: 300s }}\n\
             subagents:\n  agent_dirs: []\n  references:\n    - {{ uri: \"hostile://hostile\", kind: HOSTILE }}\n\
             approval:\n{approval}\n\
             sandbox:\n  image: warden-sandbox:bookworm\n  scope: {scope}\n"
        );
        api_with(&[(test_plugin("hostile"), "hostile")], &yaml, vec![]).await
    }

    /// Runs `calls` (tool name, input) one after the other through the hostile plugin as
    /// one task of `session`; each call's (is_error, content).
    async fn calls_through_plugin(api: &Api, session: &str, calls: &[(&str, Value)]) -> Vec<(bool, String)> {
        let ops: Vec<Value> = calls
            .iter()
            .map(|(name, input)| json!({ "op": "tools_call", "name": name, "arguments": input.to_string() }))
            .collect();
        let r = api
            .post(
                "/v1/tasks",
                json!({ "description": "d", "prompt": format!("script:{}", Value::Array(ops)), "subagent_type": "hostile",
                        "session_id": session }),
            )
            .await;
        assert_eq!((r.status, r.body["status"].as_str()), (200, Some("completed")), "{}", r.text);
        let results: Vec<String> = serde_json::from_str(r.body["output"].as_str().unwrap()).unwrap();
        results
            .iter()
            .map(|one| {
                let calls: Value =
                    serde_json::from_str(one.strip_prefix("ok:").unwrap_or_else(|| panic!("{results:?}"))).unwrap();
                (calls[0]["is_error"] == true, calls[0]["content"].as_str().unwrap().to_owned())
            })
            .collect()
    }

    /// Regression (issue 40, item 9): with `Read(./.env)` denied and `Bash(cat:*)`
    /// allowed, `cat .env`, `cat < .env`, `cat docs/../.env` and `cat docs/link-to-env`
    /// printed the secret without asking. The gate judges a command's files from the
    /// shell's working directory, as the sandbox resolves them (links, then `..`).
    #[tokio::test(flavor = "multi_thread")]
    async fn regression_a_read_deny_reaches_the_shell_through_links_dotdot_and_the_working_directory() {
        docker_ok();
        const SETUP: &[(&str, &str)] = &[("Write", ".env"), ("Write", "docs/a.md")];
        let setup: Vec<(&str, Value)> = SETUP
            .iter()
            .map(|(tool, path)| (*tool, json!({"file_path": path, "content": format!("DOTENV-SECRET=1 in {path}\n")})))
            // (`ln -s ../.env …` names `.env` as the link's source, which the rule denies.)
            .chain([(
                "Bash",
                json!({"command": "mkdir -p docs/sub && python3 -c \"import os; os.symlink('../.env', 'docs/link-to-env')\""}),
            )])
            .collect();
        let attacks = [
            "cat .env",
            "cat < .env",
            "cat docs/../.env",
            "cat docs/link-to-env",
            "cat docs/sub/../link-to-env",
            "cd docs && cat ../.env",
        ];
        // Positive control: without the deny rule every attack prints the secret.
        let open = hostile_with_policy("  default: allow\n").await;
        calls_through_plugin(&open, "s", &setup).await;
        let runs: Vec<(&str, Value)> = attacks.iter().map(|c| ("Bash", json!({"command": c}))).collect();
        for ((_, out), attack) in calls_through_plugin(&open, "s", &runs).await.iter().zip(attacks) {
            assert!(out.contains("DOTENV-SECRET=1 in .env"), "`{attack}` reads the secret without the rule: {out}");
        }
        end_sessions(&open).await;
        let api = hostile_with_policy(
            "  default: ask\n  timeout: 1s\n  allow: [\"Write\", \"Bash(cat:*)\", \"Bash(cd:*)\", \"Bash(python3:*)\", \"Bash(mkdir:*)\"]\n  deny: [\"Read(./.env)\"]",
        )
        .await;
        let done = calls_through_plugin(&api, "s", &setup).await;
        assert!(done.iter().all(|(e, _)| !e), "{done:?}");
        for ((is_error, out), attack) in calls_through_plugin(&api, "s", &runs).await.iter().zip(attacks) {
            assert!(*is_error && !out.contains("DOTENV-SECRET"), "`{attack}` got through: {out}");
            assert!(out.contains("Read(./.env)"), "`{attack}` is denied by the rule: {out}");
        }
        // The working directory a command left is the one the next is judged from.
        let after_cd = calls_through_plugin(
            &api,
            "s",
            &[
                ("Bash", json!({"command": "cd docs"})),
                ("Bash", json!({"command": "cat ../.env"})),
                ("Bash", json!({"command": "cat a.md"})),
            ],
        )
        .await;
        assert!(after_cd[1].0 && !after_cd[1].1.contains("DOTENV-SECRET"), "{after_cd:?}");
        assert!(!after_cd[2].0 && after_cd[2].1.contains("in docs/a.md"), "an allowed read runs: {after_cd:?}");
        end_sessions(&api).await;
    }

    /// Regression (issue 41, item 1): a task's `tool_context` string was exported into
    /// its sandbox commands' environment, so its plugin ran `printf %s "$RT_SECRET" |
    /// base64` through `tools.call`, decoded the answer (the scrubber does not know
    /// base64) and had the secret. A string entry is no longer in the sandbox; exporting
    /// is the caller's explicit choice (`"env": true`) of a name the operator lists in
    /// `sandbox.task_env`, and then the same attack works — which is what that choice
    /// documents (the positive control that the attack runs).
    #[tokio::test(flavor = "multi_thread")]
    async fn regression_a_plugin_recovered_a_string_secret_through_the_sandbox_in_base64() {
        if !docker_ok() {
            return;
        }
        const RT_SECRET: &str = "rt-secret-9c1e7b2d4c68";
        const ATTACK: &str = "printf %s \"$RT_SECRET\" | base64";
        let api = hostile_sandboxed("  task_env: [RT_SECRET]\n").await;
        let plain = bash_through_plugin(&api, "sess-b64", json!({ "rt_secret": RT_SECRET }), ATTACK).await;
        assert_eq!(unbase64(&plain), b"", "a string entry is not in the sandbox: {plain:?}");
        let exported =
            bash_through_plugin(&api, "sess-b64", json!({ "rt_secret": { "value": RT_SECRET, "env": true } }), ATTACK)
                .await;
        assert_eq!(unbase64(&exported), RT_SECRET.as_bytes(), "an exported entry is, as documented");
        end_sessions(&api).await;
    }

    /// An entry is exported only under a name the operator lists in `sandbox.task_env`
    /// (empty by default), and `inject` needs `sandbox.egress`: otherwise the task is
    /// refused, naming `tool_context.<key>` and why.
    #[tokio::test(flavor = "multi_thread")]
    async fn an_entry_is_exported_only_under_a_name_the_operator_lists() {
        if !docker_ok() {
            return;
        }
        let api = hostile_sandboxed("").await;
        for (tool_context, why) in [
            (json!({ "rt_secret": { "value": "v4lue-1", "env": true } }), "sandbox.task_env"),
            (json!({ "bash-env": { "value": "v4lue-1", "env": true } }), "changes how the shell"),
            (
                json!({ "svc": { "value": "v4lue-1", "inject": { "host": "api.example.com", "header": "Authorization" } } }),
                "sandbox.egress",
            ),
        ] {
            let key = tool_context.as_object().unwrap().keys().next().unwrap().clone();
            let r = api
                .post(
                    "/v1/tasks",
                    json!({ "description": "d", "prompt": "script:[]", "subagent_type": "hostile", "tool_context": tool_context }),
                )
                .await;
            assert_eq!((r.status, r.body["error"]["code"].as_str()), (400, Some("invalid_field")), "{}", r.text);
            let message = r.body["error"]["message"].as_str().unwrap();
            assert!(message.contains(&format!("tool_context.{key}")) && message.contains(why), "{message}");
            assert!(!message.contains("v4lue-1"), "{message}");
        }
        end_sessions(&api).await;
    }

    /// Issue 41, item 1: an `inject` entry reaches the server it names through the
    /// session's egress proxy — the header arrives — while the sandbox never holds it (not
    /// in the command's environment, nor any process's), and only while a call of its task
    /// runs: the same request from a later task of the session, without it, goes bare.
    #[tokio::test(flavor = "multi_thread")]
    async fn an_injected_secret_reaches_its_host_through_the_proxy_and_never_the_sandbox() {
        if !docker_ok() {
            return;
        }
        const TOKEN: &str = "inj3cted-5f3a9c1e7b2d";
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let log = seen.clone();
        let app = axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
            let log = log.clone();
            async move {
                let token = headers.get("x-task-token").and_then(|v| v.to_str().ok()).unwrap_or("none").to_owned();
                log.lock().unwrap().push(token);
                "reached"
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let api = hostile_sandboxed(&format!("  egress:\n    allow: [\"127.0.0.1:{port}\"]\n")).await;
        let entry = json!({ "svc": { "value": TOKEN,
            "inject": { "host": format!("127.0.0.1:{port}"), "header": "X-Task-Token", "format": "Token {}" } } });
        // `--noproxy ''`: inside the sandbox 127.0.0.1 is the sandbox; the proxy reaches the host's.
        let command = format!(
            "curl -sS --max-time 20 --noproxy '' http://127.0.0.1:{port}/hello; echo; \
             cat /proc/[0-9]*/environ 2>/dev/null | base64 -w0"
        );
        let out = bash_through_plugin(&api, "sess-inject", entry, &command).await;
        let (reply, environ) = out.split_once('\n').unwrap_or_else(|| panic!("{out:?}"));
        assert_eq!(reply, "reached", "{out}");
        assert_eq!(*seen.lock().unwrap(), [format!("Token {TOKEN}")], "the header arrived");
        let environ = unbase64(environ.trim());
        assert!(environ.windows(8).any(|w| w == b"HOME=/wo"), "the environments were read: {environ:?}");
        assert!(!environ.windows(TOKEN.len()).any(|w| w == TOKEN.as_bytes()), "the sandbox never holds it");
        // Tied to the task's calls: the next task of the session has no such entry.
        let out = bash_through_plugin(&api, "sess-inject", json!({}), &command).await;
        assert!(out.starts_with("reached"), "{out}");
        assert_eq!(seen.lock().unwrap()[1], "none", "no call of the owning task runs");
        end_sessions(&api).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn approval_over_http_and_a_tool_context_secret_that_is_never_kept() {
        if !docker_ok() {
            return;
        }
        const SECRET: &str = "sk-test-5f3a9c1e7b2d4c68";
        let script = r#"
- tool_calls:
    - name: Bash
      arguments:
        command: "printf %s \"$API_TOKEN\" | sha256sum | cut -d' ' -f1 > token.sha && echo stored; echo leak:$API_TOKEN"
- text: "Stored the token digest."
"#;
        let api = deployment(script, "  default: ask\n  ask: [\"Bash\"]\n  allow: [\"Read\"]\n").await;
        let body = json!({
            "description": "store digest", "prompt": "store the token digest", "subagent_type": "worker",
            "session_id": "sess-approval", "user_id": "alice",
            "tool_context": { "api-token": { "value": SECRET, "env": true } }
        });
        let mut s = api.stream("/v1/tasks", Some(body), None).await;
        let task_id = s.task_id.clone().unwrap();
        let mut events = vec![];
        let request_id = s.until_approval(&mut events).await["id"].as_str().unwrap().to_owned();
        let pending = api.get("/v1/approvals").await;
        assert_eq!(pending.body["approvals"][0]["id"], request_id.as_str());
        assert_eq!(pending.body["approvals"][0]["tool"], "Bash");
        assert_eq!(api.get(&format!("/v1/tasks/{task_id}?block=false")).await.body["status"], "input_required");
        let r = api.post(&format!("/v1/approvals/{request_id}"), json!({ "decision": "approve" })).await;
        assert_eq!(r.status, 200, "{}", r.text);
        events.extend(s.rest().await);
        let t = types(&events);
        let pos = |ty: &str| t.iter().position(|x| x == ty).unwrap_or_else(|| panic!("no {ty} in {t:?}"));
        assert!(pos("tool_call") < pos("approval_request"));
        assert!(pos("approval_request") < pos("approval_resolved"));
        assert!(pos("approval_resolved") < pos("tool_result"));
        assert!(pos("tool_result") < pos("finish"));
        let result = &events[pos("tool_result")].data;
        assert_eq!(result["is_error"], false, "{result}");
        assert!(result["content"].as_str().unwrap().contains("stored"), "{result}");
        assert!(result["content"].as_str().unwrap().contains("leak:[redacted]"), "{result}");
        let fin = &events.last().unwrap().data;
        assert_eq!(
            (fin["status"].as_str(), fin["output"].as_str()),
            (Some("completed"), Some("Stored the token digest."))
        );

        // The secret reached the exec: its digest is in the workspace (downloaded over HTTP).
        let f = api.get("/v1/sessions/sess-approval/files/token.sha?user_id=alice").await;
        assert_eq!(f.status, 200, "{}", f.text);
        assert_eq!(f.text.trim(), hex::encode(sha2::Sha256::digest(SECRET.as_bytes())));
        assert!(f.headers["content-disposition"].to_str().unwrap().starts_with("attachment"));
        let r = api.get("/v1/sessions/sess-approval/files/../../etc/passwd?user_id=alice").await;
        assert!(r.status == 403 || r.status == 404 || r.status == 400, "{} {}", r.status, r.text);
        let r = api.get("/v1/sessions/sess-approval/files/missing.txt?user_id=alice").await;
        assert_eq!((r.status, r.body["error"]["code"].as_str()), (404, Some("file_not_found")));
        let r = api.get("/v1/sessions/sess-approval/files/token.sha?user_id=mallory").await;
        assert_eq!((r.status, r.body["error"]["code"].as_str()), (404, Some("session_not_found")));

        // ...and is nowhere else: not in the events, the store file or the logs.
        let replay = api.stream(&format!("/v1/tasks/{task_id}/events"), None, None).await.rest().await;
        let all: String = replay.iter().map(|e| e.data.to_string()).collect();
        assert!(!all.contains(SECRET), "secret in the event stream");
        api.engine.store().flush().await.unwrap();
        let db = std::fs::read(api.dir.path().join("state.db")).unwrap();
        assert!(!db.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()), "secret in the task store");
        let logs = String::from_utf8_lossy(&logs().lock().unwrap()).into_owned();
        assert!(logs.contains(&task_id), "the logs do record the task");
        assert!(!logs.contains(SECRET), "secret in the logs");
        end_sessions(&api).await;
    }

    /// Issue 13: a marker secret given in `tool_context` is written into every field and
    /// stream a task can reach — description, prompt, streamed tokens and reasoning, tool
    /// inputs (a pending approval), tool output, a file, a plugin log line (a tool the
    /// subagent lacks), the final output — and a later task of the same session, with no
    /// secrets of its own, reads it back from the workspace. Then every byte warden wrote
    /// is searched: HTTP responses, SSE, the store file, the logs and the audit log.
    #[tokio::test(flavor = "multi_thread")]
    async fn every_byte_warden_writes_is_scrubbed_of_a_tool_context_secret() {
        use super::secrets::{SECRET, assert_absent};
        if !docker_ok() {
            return;
        }
        // Each task of the session replays this script: the first stores the secret in
        // the workspace, the second (without it in its environment) prints it back.
        let script = serde_json::to_string(&json!([
            { "reasoning": format!("thinking of {SECRET} now"), "text": format!("the key is {SECRET} ok"),
              "tool_calls": [
                  { "name": "Bash", "arguments": { "command": "if [ -n \"$API_TOKEN\" ]; then printf %s \"$API_TOKEN\" > kept.txt; fi; echo leak:$(cat kept.txt)" } },
                  { "name": "Write", "arguments": { "file_path": "/workspace/copy.txt", "content": format!("key={SECRET}") } },
                  { "name": format!("Tool{SECRET}"), "arguments": {} }
              ] },
            { "text": format!("done with {SECRET}") }
        ]))
        .unwrap();
        let agent = "---\nname: worker\ndescription: Works\ntools: Bash, Read, Write\nmodel: sonnet\n---\nWork.\n";
        let approval = "  default: ask\n  allow: [\"Bash\", \"Read\"]\n  audit_log: ./audit.jsonl";
        let api = deployment_with(&script, approval, agent).await;
        let mut wrote = Vec::<u8>::new();
        for (n, tool_context) in
            [json!({ "api-token": { "value": SECRET, "env": true } }), json!({})].into_iter().enumerate()
        {
            let body = json!({
                "description": format!("uses {SECRET}"), "prompt": format!("use {SECRET}"), "subagent_type": "worker",
                "session_id": "sess-secret", "user_id": "alice", "tool_context": tool_context
            });
            let mut s = api.stream("/v1/tasks", Some(body), None).await;
            let task_id = s.task_id.clone().unwrap();
            // Every asked call is approved; the pending list is read while each waits.
            let mut events = vec![];
            let mut saw_write = false;
            while let Some(e) = s.next_event().await {
                events.push(e.clone());
                if e.data["type"] == "approval_request" {
                    let pending = api.get("/v1/approvals").await;
                    wrote.extend(pending.text.as_bytes());
                    let list = pending.body["approvals"].as_array().unwrap();
                    saw_write |= list.iter().any(|a| a["tool"] == "Write" && a["input"]["content"] == "key=[redacted]");
                    let r = api
                        .post(
                            &format!("/v1/approvals/{}", e.data["id"].as_str().unwrap()),
                            json!({ "decision": "approve" }),
                        )
                        .await;
                    assert_eq!(r.status, 200, "{}", r.text);
                    wrote.extend(r.text.as_bytes());
                }
            }
            assert!(saw_write, "task {n}: the Write waited with its input scrubbed: {events:?}");
            let result = events
                .iter()
                .find(|e| e.data["type"] == "tool_result" && e.data["name"] == "Bash")
                .unwrap_or_else(|| panic!("task {n}: no Bash result in {events:?}"));
            assert!(result.data["content"].as_str().unwrap().contains("leak:[redacted]"), "task {n}: {}", result.data);
            let fin = &events.last().unwrap().data;
            assert_eq!(fin["output"], "done with [redacted]", "task {n}: {events:?}");
            for e in &events {
                wrote.extend(e.data.to_string().as_bytes());
            }
            let replay = api.stream(&format!("/v1/tasks/{task_id}/events"), None, None).await.rest().await;
            for e in &replay {
                wrote.extend(e.data.to_string().as_bytes());
            }
            wrote.extend(api.get(&format!("/v1/tasks/{task_id}")).await.text.as_bytes());
        }
        // The file the subagent wrote comes back over HTTP scrubbed.
        let f = api.get("/v1/sessions/sess-secret/files/copy.txt?user_id=alice").await;
        assert_eq!((f.status, f.text.as_str()), (200, "key=[redacted]"));
        let f = api.get("/v1/sessions/sess-secret/files/kept.txt?user_id=alice").await;
        assert_eq!((f.status, f.text.as_str()), (200, "[redacted]"));
        assert_absent("HTTP responses and SSE", &wrote, SECRET);
        api.engine.store().flush().await.unwrap();
        assert_absent("the task store", &std::fs::read(api.dir.path().join("state.db")).unwrap(), SECRET);
        let audit = api.audit_text().into_bytes();
        assert!(!audit.is_empty(), "the audit log records the decisions");
        assert_absent("the audit log", &audit, SECRET);
        let logs = logs().lock().unwrap().clone();
        assert!(
            String::from_utf8_lossy(&logs).contains("which this subagent does not have"),
            "the plugin logged the unknown tool"
        );
        assert_absent("the logs", &logs, SECRET);
        end_sessions(&api).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_task_over_its_tool_call_limit_finishes_with_tool_limit() {
        if !docker_ok() {
            return;
        }
        let script = r#"
- tool_calls:
    - { name: Bash, arguments: { command: "echo one" } }
- tool_calls:
    - { name: Bash, arguments: { command: "echo two" } }
- tool_calls:
    - { name: Bash, arguments: { command: "echo three" } }
- text: "done"
"#;
        let api = deployment(script, "  default: allow\n  allow: [\"Bash\", \"Read\"]\n").await;
        let body = json!({ "description": "many tools", "prompt": "go", "subagent_type": "worker",
                           "session_id": "sess-limit", "max_tool_iterations": 1 });
        let mut s = api.stream("/v1/tasks", Some(body), None).await;
        let events = s.rest().await;
        let fin = &events.last().unwrap().data;
        assert_eq!(
            (fin["type"].as_str(), fin["status"].as_str(), fin["reason"].as_str()),
            (Some("finish"), Some("completed"), Some("tool_limit")),
            "{events:?}"
        );
        assert!(!types(&events).contains(&"error".to_string()), "a tool limit is not an error");
        let calls = events.iter().filter(|e| e.data["type"] == "tool_call").count();
        assert_eq!(calls, 2, "the call over the limit is seen, and the task stops there");
        end_sessions(&api).await;
    }
}

mod a2a_framing {
    use super::*;

    /// Regression: an A2A request body over the limit was answered 200 (a JSON-RPC error
    /// with HTTP success), a request without `id` (a notification) was answered and run,
    /// and a member given twice was read as its last copy.
    #[tokio::test(flavor = "multi_thread")]
    async fn oversize_is_413_notifications_get_no_reply_and_duplicate_members_are_refused() {
        let api = api().await;
        let send = json!({ "jsonrpc": "2.0", "method": "SendMessage", "params": {
            "message": { "messageId": "m1", "role": "ROLE_USER", "parts": [{ "text": "x".repeat(2 << 20) }] } } });
        let big = json!({ "id": 1 })
            .as_object()
            .unwrap()
            .clone()
            .into_iter()
            .chain(send.as_object().unwrap().clone())
            .collect::<serde_json::Map<_, _>>();
        // Its own connection: the server may answer before reading the whole body.
        let r = api
            .send(
                reqwest::Client::new()
                    .post(api.url("/a2a/greeter"))
                    .header("content-type", "application/json")
                    .body(Value::Object(big).to_string()),
            )
            .await;
        assert_eq!(r.status, 413, "{}", r.text);
        assert_eq!(r.body["error"]["code"], -32600, "{}", r.text);

        let mut small = send.clone();
        small["params"]["message"]["parts"][0]["text"] = json!("hello");
        let r = api.post("/a2a/greeter", small.clone()).await;
        assert_eq!((r.status, r.text.as_str()), (204, ""), "a notification is never answered");

        let dup = small.to_string().replacen('{', r#"{"id":1,"id":2,"#, 1);
        let r = api.post_raw("/a2a/greeter", dup).await;
        assert_eq!((r.status, r.body["error"]["code"].clone()), (200, json!(-32600)), "{}", r.text);
        assert!(r.text.contains("duplicate"), "{}", r.text);

        // None of these reached the engine as a task.
        assert_eq!(api.engine.metrics.submitted.load(std::sync::atomic::Ordering::Relaxed), 0);
        // An ordinary request still runs.
        small["id"] = json!(7);
        let r = api.post("/a2a/greeter", small).await;
        assert_eq!((r.status, r.body["id"].clone()), (200, json!(7)), "{}", r.text);
        assert_eq!(api.engine.metrics.submitted.load(std::sync::atomic::Ordering::Relaxed), 1);
    }
}

/// A hostile plugin calling the host's `tools.call` import with `Agent` itself — no model
/// in between, whatever its tool list says — against the nesting cap and its tool lists.
mod nesting {
    use super::*;

    fn yaml(max_depth: u32) -> String {
        format!(
            r#"
  grants:
    hostile: {{ tools: true, events: true }}
  limit_overrides:
    hostile: {{ timeout: 60s }}
subagents:
  agent_dirs: []
  max_depth: {max_depth}
  references:
    - {{ uri: "hostile://hostile", kind: HOSTILE, metadata: {{ tools: "Agent" }} }}
approval:
  default: ask
  allow: ["Agent"]
"#
        )
    }

    /// A script op calling `name` once with `input`.
    fn call(name: &str, input: Value) -> Value {
        json!({ "op": "tools_call", "name": name, "arguments": input.to_string() })
    }

    fn agent(prompt: &str) -> Value {
        call("Agent", json!({ "subagent_type": "hostile", "description": "nested", "prompt": prompt }))
    }

    /// (is_error, content) of each op's one call, from a hostile script's output.
    fn results(output: &str) -> Vec<(bool, String)> {
        let ops: Vec<String> = serde_json::from_str(output).unwrap_or_else(|e| panic!("{e}: {output}"));
        ops.iter()
            .map(|op| {
                let list = op.strip_prefix("ok:").unwrap_or_else(|| panic!("the call itself failed: {op}"));
                let list: Vec<Value> = serde_json::from_str(list).unwrap();
                (list[0]["is_error"].as_bool().unwrap(), list[0]["content"].as_str().unwrap().to_owned())
            })
            .collect()
    }

    async fn task_count(api: &Api) -> usize {
        api.get("/v1/tasks").await.body["tasks"].as_array().unwrap().len()
    }

    fn refused(content: &str) -> bool {
        content.contains("subagents.max_depth") || content.contains("is not among this subagent's tools")
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_plugin_calling_agent_directly_starts_nothing_past_the_cap_or_its_tools() {
        let (bash, read) =
            (call("Bash", json!({ "command": "id" })), call("Read", json!({ "file_path": "/etc/passwd" })));
        let grandchild = format!("script:{}", json!([bash]));
        let child = format!("script:{}", json!([agent(&grandchild), bash, read]));
        let root = format!("script:{}", json!([agent(&child), bash, read]));

        // No nesting (the default cap, 1): the Agent call is refused and nothing starts;
        // the tools the definition does not list are refused too.
        let api = api_with(&[(test_plugin("hostile"), "hostile")], &yaml(1), vec![]).await;
        let r = api.task("hostile", &root, false).await;
        assert_eq!(r.body["status"], "completed", "{}", r.text);
        let got = results(r.body["output"].as_str().unwrap());
        assert!(got[0].0 && got[0].1.contains("subagents.max_depth"), "{got:?}");
        assert!(got[1..].iter().all(|(is_error, c)| *is_error && refused(c)), "{got:?}");
        assert_eq!(task_count(&api).await, 1, "no child task");

        // One level allowed (cap 2): the child runs, but its own Agent call starts nothing
        // and it reaches no tool its parent was not given.
        let api = api_with(&[(test_plugin("hostile"), "hostile")], &yaml(2), vec![]).await;
        let r = api.task("hostile", &root, false).await;
        assert_eq!(r.body["status"], "completed", "{}", r.text);
        let got = results(r.body["output"].as_str().unwrap());
        assert!(!got[0].0, "the child ran: {got:?}");
        assert!(got[1..].iter().all(|(is_error, c)| *is_error && refused(c)), "{got:?}");
        let child_got = results(&got[0].1);
        assert_eq!(child_got.len(), 3, "{child_got:?}");
        assert!(child_got.iter().all(|(is_error, c)| *is_error && refused(c)), "{child_got:?}");
        assert_eq!(task_count(&api).await, 2, "the root and its one child, no grandchild");
    }
}
