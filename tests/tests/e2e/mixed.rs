//! The whole host under mixed load (BENCHMARKS.md `## Mixed load`): the real `warden serve`
//! with the `echo` test plugin, a Claude subagent (bundled `claude` plugin, the scripted
//! model, two sandbox calls per task in real Docker containers) and an A2A peer (the
//! a2a-sdk echo agent), all tasks fired at once over HTTP.
//!
//! `cargo test -p warden-e2e --test e2e mixed -- --ignored --nocapture`; `WARDEN_BIN` picks
//! the binary (a release build for absolute figures), `WARDEN_MIXED_TASKS` the count
//! (default 1000: 60% echo, 30% A2A, 10% Claude).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::*;

const AGENT: &str =
    "---\nname: helper\ndescription: Runs two sandbox commands\ntools: Read, Bash\n---\nYou are the helper.\n";
const SCRIPT: &str = "\
- tool_calls: [{ name: Bash, arguments: { command: \"echo mixed > mixed.txt\" } }]
- tool_calls: [{ name: Read, arguments: { file_path: \"mixed.txt\" } }]
- text: \"done\"
";
/// Sandbox sessions the Claude tasks are spread over (one container each).
const SESSIONS: usize = 4;

/// Peak and current resident memory of a process, from /proc (Linux).
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap()
    };
    (kb("VmHWM:") * 1024, kb("VmRSS:") * 1024)
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "benchmark: run explicitly"]
async fn bench_mixed_load() {
    let n: usize = std::env::var("WARDEN_MIXED_TASKS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let peer = Peer::start("a2a_agents.py", &["--agent", "echo", "--protocol", "1.0"]);
    let scope = format!("mix{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let d = Deployment::new(&format!(
        "  grants:\n    echo: {{ log: true, events: true, state: true }}\n    \
         claude: {{ log: true, events: true, state: true, resources: true, model: true, tools: true }}\n    \
         a2a: {{ http: [\"http://127.0.0.1:*\"], events: true, state: true, log: true }}\n\
         subagents:\n  agent_dirs: [./agents]\n  references:\n    - {{ uri: \"echo://greeter\", kind: ECHO }}\n    \
         - {{ uri: \"{}\", kind: A2A, metadata: {{ name: remote }} }}\n\
         models:\n  default: main/scripted\n  providers:\n    main: {{ type: scripted, script: ./main.yaml }}\n\
         sandbox:\n  scope: {scope}\n\
         approval:\n  default: deny\n  allow: [Read, Bash]\n\
         store:\n  path: ./state/tasks.db\n",
        peer.url()
    ));
    d.add("echo", "echo");
    std::fs::copy(bundled_plugin("claude"), d.dir.path().join("plugins/claude.wasm")).unwrap();
    std::fs::copy(bundled_plugin("a2a"), d.dir.path().join("plugins/a2a.wasm")).unwrap();
    std::fs::create_dir_all(d.dir.path().join("agents")).unwrap();
    std::fs::write(d.dir.path().join("agents/helper.md"), AGENT).unwrap();
    std::fs::write(d.dir.path().join("main.yaml"), SCRIPT).unwrap();
    let serve = Server::start(&d);
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{}", serve.port);
    let until = Instant::now() + Duration::from_secs(120);
    while http.get(format!("{base}/healthz")).send().await.map(|r| r.status().as_u16()).ok() != Some(200) {
        assert!(Instant::now() < until, "warden serve did not come up:\n{}", log(&d));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let kind = |i: usize| match i % 10 {
        0 => "claude",
        1..=3 => "a2a",
        _ => "echo",
    };
    let body = |i: usize| match kind(i) {
        "claude" => {
            json!({ "description": "mix", "prompt": format!("task {i}"), "subagent_type": "helper", "session_id": format!("mix-{}", i % SESSIONS) })
        }
        "a2a" => json!({ "description": "mix", "prompt": format!("task {i}"), "subagent_type": "remote" }),
        _ => json!({ "description": "mix", "prompt": format!("task {i}"), "subagent_type": "greeter" }),
    };
    // Warm-up: one of each kind (first container per session, first peer connection).
    for i in 0..SESSIONS * 10 {
        if i % 10 <= 1 || i == 4 {
            let r = post(&http, &format!("{base}/v1/tasks"), &body(i)).await.1;
            assert_eq!(r["status"], "completed", "warm-up {i}: {r}\n{}", log(&d));
        }
    }
    let started = Instant::now();
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let (http, url, body) = (http.clone(), format!("{base}/v1/tasks"), body(i));
        handles.push(tokio::spawn(async move {
            let t = Instant::now();
            let (status, v) = post(&http, &url, &body).await;
            (i, status, v, t.elapsed())
        }));
    }
    let mut latencies: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
    for h in handles {
        let (i, status, v, took) = h.await.unwrap();
        assert_eq!((status, v["status"].as_str()), (200, Some("completed")), "task {i} ({}): {v}", kind(i));
        let expected = match kind(i) {
            "claude" => "done".to_owned(),
            "a2a" => format!("echo: task {i}"),
            _ => format!("task {i}"),
        };
        assert_eq!(v["output"].as_str(), Some(expected.as_str()), "task {i}: {v}");
        latencies.entry(kind(i)).or_default().push(took);
    }
    let wall = started.elapsed();
    let (peak, now) = memory(serve.child.id());
    println!(
        "BENCH mixed: {n} tasks over HTTP in {wall:?} ({:.0} tasks/s), 0 lost; warden serve RSS peak {} MiB, after {} MiB",
        n as f64 / wall.as_secs_f64(),
        peak >> 20,
        now >> 20
    );
    for (kind, v) in &mut latencies {
        v.sort();
        let pct = |p: f64| v[((v.len() as f64 * p).ceil() as usize).saturating_sub(1)];
        println!(
            "BENCH mixed {kind}: {} tasks, p50 {:?}, p99 {:?}, max {:?}",
            v.len(),
            pct(0.5),
            pct(0.99),
            v[v.len() - 1]
        );
    }
}

/// One JSON `POST`: status and parsed answer.
async fn post(http: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let resp = http.post(url).header("content-type", "application/json").body(body.to_string()).send().await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes))),
    )
}

fn log(d: &Deployment) -> String {
    std::fs::read_to_string(d.dir.path().join("serve.log")).unwrap_or_default()
}
