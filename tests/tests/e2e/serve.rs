//! `warden serve`: the real binary serving the HTTP API over a real task store. The
//! host is killed with SIGKILL mid-task and restarted on the same store.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{Deployment, Server, bin, http, json_of};

const CONFIG: &str = "  limit_overrides:\n    hostile: { timeout: 10m }\n  grants:\n    echo: { log: true, events: true, state: true }\nsubagents:\n  agent_dirs: []\n  references:\n    - { uri: \"echo://greeter\", kind: ECHO }\n    - { uri: \"hostile://hostile\", kind: HOSTILE }\nstore:\n  path: ./state/tasks.db\n";

#[test]
fn kill_9_mid_task_then_restart_keeps_results_and_fails_the_interrupted_task() {
    let d = Deployment::new(CONFIG);
    d.add("echo", "echo");
    d.add("hostile", "hostile");
    let mut server = Server::start(&d);
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

    let server = Server::start(&d);
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
