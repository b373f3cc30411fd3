//! `warden serve`: the real binary serving the HTTP API over a real task store. The
//! host is killed with SIGKILL mid-task and restarted on the same store, once on the
//! embedded file and once on PostgreSQL (`store.url`).

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{Deployment, Server, bin, http, json_of};

const CONFIG: &str = "  limit_overrides:\n    hostile: { timeout: 10m }\n  grants:\n    echo: { log: true, events: true, state: true }\nsubagents:\n  agent_dirs: []\n  references:\n    - { uri: \"echo://greeter\", kind: ECHO }\n    - { uri: \"hostile://hostile\", kind: HOSTILE }\nstore:\n  path: ./state/tasks.db\n";

#[test]
fn kill_9_mid_task_then_restart_keeps_results_and_fails_the_interrupted_task() {
    kill_9_then_restart(&Deployment::new(CONFIG));
}

#[test]
fn kill_9_then_restart_on_a_postgres_store() {
    let db = crate::common::TestDatabase::create();
    let config = CONFIG.replace("store:\n  path: ./state/tasks.db\n", &format!("store:\n  url: {}\n", db.url));
    let d = Deployment::new(&config);
    kill_9_then_restart(&d);
    assert!(!d.dir.path().join("state").exists(), "no file store was made");
    let checked = d.warden(&["config", "check"]);
    assert!(crate::common::stdout(&checked).contains(&format!("store: PostgreSQL {}", db.url)), "{checked:?}");
}

#[test]
fn the_password_of_a_store_url_is_never_printed() {
    let d = Deployment::new("store:\n  url: postgres://warden:s3cr3t-pw@127.0.0.1:1/nowhere\n");
    let redacted = "postgres://warden:***@127.0.0.1:1/nowhere";
    // `config check` names the store without connecting to it.
    let checked = d.warden(&["config", "check"]);
    assert!(checked.status.success(), "{checked:?}");
    assert!(crate::common::stdout(&checked).contains(&format!("store: PostgreSQL {redacted}")), "{checked:?}");
    // `warden serve` cannot reach it (nothing listens on port 1): it fails naming the key
    // and the database, still without the password.
    let served = Command::new(bin())
        .current_dir(d.dir.path())
        .arg("--config")
        .arg(d.dir.path().join("warden.yaml"))
        .args(["serve", "--addr", "127.0.0.1:0"])
        .env_remove("WARDEN_TOKENS")
        .output()
        .unwrap();
    assert!(!served.status.success(), "{served:?}");
    let err = String::from_utf8_lossy(&served.stderr);
    assert!(err.contains("store.url") && err.contains(redacted), "{err}");
    for out in [&checked.stdout, &checked.stderr, &served.stdout, &served.stderr] {
        assert!(!String::from_utf8_lossy(out).contains("s3cr3t-pw"), "{}", String::from_utf8_lossy(out));
    }
    // A file and a database at once is refused, naming `store`.
    let both = Deployment::new("store:\n  path: ./s.db\n  url: postgres://h/d\n");
    let o = both.warden(&["config", "check"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("warden.yaml: store: set either store.path"), "{o:?}");
}

/// A task finished before a SIGKILL is served after the restart; the one running then
/// reads `failed` / "host restarted"; the restarted host serves new tasks.
fn kill_9_then_restart(d: &Deployment) {
    d.add("echo", "echo");
    d.add("hostile", "hostile");
    let mut server = Server::start(d);
    let port = server.port;

    let task = |prompt: &str, sub: &str, bg: bool| json!({ "description": "e2e", "prompt": prompt, "subagent_type": sub, "run_in_background": bg });
    let (status, done) = json_of(port, "POST", "/v1/tasks", Some(&task("kept across a crash", "greeter", false)));
    assert_eq!((status, done["status"].as_str()), (200, Some("completed")), "{done}");
    let done_id = done["task_id"].as_str().unwrap().to_owned();
    let (status, bg) = json_of(port, "POST", "/v1/tasks", Some(&task("loop", "hostile", true)));
    assert_eq!(status, 202, "{bg}");
    let running_id = bg["task_id"].as_str().unwrap().to_owned();
    let until = Instant::now() + Duration::from_secs(20);
    while json_of(port, "GET", &format!("/v1/tasks/{running_id}?block=false"), None).1["status"] != "working" {
        assert!(Instant::now() < until, "the hostile task never started");
        std::thread::sleep(Duration::from_millis(50));
    }

    server.child.kill().unwrap(); // SIGKILL: no shutdown code runs
    server.child.wait().unwrap();

    let server = Server::start(d);
    let port = server.port;
    let (status, r) = json_of(port, "GET", &format!("/v1/tasks/{done_id}"), None);
    assert_eq!(status, 200);
    assert_eq!((r["status"].as_str(), r["output"].as_str()), (Some("completed"), Some("kept across a crash")));
    let (_, r) = json_of(port, "GET", &format!("/v1/tasks/{running_id}?timeout_ms=100"), None);
    assert_eq!(
        (r["status"].as_str(), r["error"].as_str(), r["finish_reason"].as_str()),
        (Some("failed"), Some("host restarted"), Some("host_restarted")),
        "{r}"
    );
    let (status, events) = http(port, "GET", &format!("/v1/tasks/{running_id}/events"), None);
    assert_eq!(status, 200);
    let data: Vec<Value> =
        events.lines().filter_map(|l| l.strip_prefix("data: ")).map(|l| serde_json::from_str(l).unwrap()).collect();
    let types: Vec<&str> = data.iter().map(|e| e["type"].as_str().unwrap()).collect();
    // Progress events are committed in batches, so a SIGKILL may lose the last ones
    // (regression: seen under CI load); the restart verdict always closes the stream.
    assert!(types.ends_with(&["error", "finish"]), "{events}");
    // Before it: the host's own progress (`status`, and the `plugin` event naming the build).
    assert!(types[..types.len() - 2].iter().all(|t| *t == "status" || *t == "plugin"), "{events}");
    assert_eq!(data[data.len() - 1]["reason"], "host_restarted");
    // The restarted host serves new tasks as usual.
    let (_, r) = json_of(port, "POST", "/v1/tasks", Some(&task("after the restart", "greeter", false)));
    assert_eq!(r["output"], "after the restart");
    let log = std::fs::read_to_string(d.dir.path().join("serve.log")).unwrap();
    assert!(log.contains("host restarted") || log.contains("marked failed"), "{log}");
}

#[test]
fn serve_refuses_a_public_address_without_tokens() {
    let d = Deployment::new("");
    let out = Command::new(bin())
        .current_dir(d.dir.path())
        .arg("--config")
        .arg(d.dir.path().join("warden.yaml"))
        .args(["serve", "--addr", "0.0.0.0:0"])
        .env_remove("WARDEN_TOKENS")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("WARDEN_TOKENS"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn tool_schema_lists_the_subagents() {
    let d = Deployment::new(CONFIG);
    d.add("echo", "echo");
    d.add("hostile", "hostile");
    let out = d.warden(&["tool-schema"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["name"], "Task");
    assert_eq!(v[1]["name"], "TaskOutput");
    assert!(v[0]["description"].as_str().unwrap().contains("-greeter: "));
    assert_eq!(v[0]["input_schema"]["properties"]["subagent_type"]["enum"], json!(["greeter", "hostile"]));
}
