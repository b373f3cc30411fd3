//! `warden serve`: the real binary serving the HTTP API over a real task store. The
//! host is killed with SIGKILL mid-task and restarted on the same store, once on the
//! embedded file and once on PostgreSQL (`store.url`). A Claude subagent killed that way
//! mid-conversation is resumed after the restart (and, on PostgreSQL, on another replica):
//! its conversation goes on in its session, with the files written before.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{Deployment, ScopeCleanup, Server, TestDatabase, bin, bundled_plugin, http, json_of};

/// Durable tasks off (`server.durable_tasks: false`): what a task interrupted by a kill
/// becomes then. (On, it is taken over: `durable.rs`.)
const CONFIG: &str = "  limit_overrides:\n    hostile: { timeout: 10m }\n  grants:\n    echo: { log: true, events: true, state: true }\nsubagents:\n  agent_dirs: []\n  references:\n    - { uri: \"echo://greeter\", kind: ECHO }\n    - { uri: \"hostile://hostile\", kind: HOSTILE }\nserver:\n  durable_tasks: false\nstore:\n  path: ./state/tasks.db\n";

#[test]
fn kill_9_mid_task_then_restart_keeps_results_and_fails_the_interrupted_task() {
    kill_9_then_restart(&Deployment::new(CONFIG));
}

#[test]
fn kill_9_then_restart_on_a_postgres_store() {
    let db = TestDatabase::create();
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

/// Writes the notes the resumed conversation reads back; resumed itself after the restart.
const WRITER: &str =
    "---\nname: writer\ndescription: Writes notes\ntools: Read, Write\nmodel: writer/scripted\n---\nYou write notes.\n";
const WRITER_SCRIPT: &str = r#"
- tool_calls: [{ name: Write, arguments: { file_path: "notes.txt", content: "kept-in-the-sandbox\n" } }]
- expect: { last_user_contains: "write the notes" }
  text: "notes written"
- expect: { last_user_contains: "one more thing", system_contains: "You write notes." }
  text: "still on the notes"
"#;
/// Asks for a Bash call a person must approve and is killed while it waits; resumed, it
/// learns the call was interrupted (the user prompt and the system prompt of the first
/// task are in the request: turn 2 of the script needs its first turn in the request too)
/// and reads the writer's file from the session.
const WAITER: &str = "---\nname: waiter\ndescription: Waits for the build\ntools: Read, Bash\nmodel: waiter/scripted\n---\nYou wait for builds.\n";
const WAITER_SCRIPT: &str = r#"
- tool_calls: [{ name: Bash, arguments: { command: "make build" } }]
  expect: { last_user_contains: "wait for the build" }
- expect: { last_user_contains: "carry on", last_tool_result_contains: "the task ended while this call ran", system_contains: "You wait for builds." }
  tool_calls: [{ name: Read, arguments: { file_path: "notes.txt" } }]
- expect: { last_tool_result_contains: "kept-in-the-sandbox" }
  text: "resumed: found the notes"
"#;

/// A deployment of the two Claude agents above on `store` (a `store:` body), sandbox
/// scope `scope`: Read and Write are allowed, Bash waits for a person. Durable tasks are
/// off: these tests resume, with `resume`, a conversation whose task the kill ended.
fn resume_deployment(store: &str, scope: &str) -> Deployment {
    let d = Deployment::new(&format!(
        "  grants:\n    claude: {{ log: true, events: true, state: true, resources: true, model: true, tools: true }}\n\
         subagents:\n  agent_dirs: [./agents]\n\
         models:\n  default: writer/scripted\n  providers:\n    writer: {{ type: scripted, script: ./writer.yaml }}\n    \
         waiter: {{ type: scripted, script: ./waiter.yaml }}\n\
         sandbox:\n  scope: {scope}\n\
         approval:\n  default: deny\n  allow: [Read, Write]\n  ask: [Bash]\n  timeout: 10m\n\
         server:\n  durable_tasks: false\n\
         store:\n{store}"
    ));
    let root = d.dir.path();
    std::fs::copy(bundled_plugin("claude"), root.join("plugins/claude.wasm")).unwrap();
    std::fs::create_dir_all(root.join("agents")).unwrap();
    for (name, agent, script) in [("writer", WRITER, WRITER_SCRIPT), ("waiter", WAITER, WAITER_SCRIPT)] {
        std::fs::write(root.join(format!("agents/{name}.md")), agent).unwrap();
        std::fs::write(root.join(format!("{name}.yaml")), script).unwrap();
    }
    d
}

/// A sandbox scope of the test's own (hosts of one scope adopt each other's containers).
fn scope() -> String {
    format!("e2e{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// The conversations before the kill, on the server at `port`: the writer's task
/// completed (its file in the session), the waiter's task in the same session waiting
/// for the approval of its Bash call. Returns (session, writer task, waiter task).
fn start_conversations(port: u16) -> (String, String, String) {
    let task = |sub: &str, prompt: &str| json!({ "description": "resume", "prompt": prompt, "subagent_type": sub });
    let (status, writer) = json_of(port, "POST", "/v1/tasks", Some(&task("writer", "write the notes")));
    assert_eq!(
        (status, writer["status"].as_str(), writer["output"].as_str()),
        (200, Some("completed"), Some("notes written")),
        "{writer}"
    );
    let session = writer["session_id"].as_str().unwrap().to_owned();
    let mut waiting = task("waiter", "wait for the build");
    waiting["session_id"] = session.clone().into();
    waiting["run_in_background"] = true.into();
    let (status, waiter) = json_of(port, "POST", "/v1/tasks", Some(&waiting));
    assert_eq!(status, 202, "{waiter}");
    let waiter = waiter["task_id"].as_str().unwrap().to_owned();
    // Waiting at the gate: the turn that asked is in the task store (kept before its calls run).
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, pending) = json_of(port, "GET", "/v1/approvals", None);
        if pending["approvals"].as_array().unwrap().iter().any(|a| a["task_id"] == waiter.as_str()) {
            break;
        }
        assert!(Instant::now() < until, "the waiter never asked: {pending}");
        std::thread::sleep(Duration::from_millis(50));
    }
    (session, writer["task_id"].as_str().unwrap().to_owned(), waiter)
}

/// After the kill, on the server at `port`: the waiter resumed without a session goes on
/// in the session of the task it continues (the writer's file is there); another session
/// is refused; the completed writer task resumes too.
fn continue_conversations(port: u16, session: &str, writer: &str, waiter: &str) {
    let resume = |sub: &str, id: &str, prompt: &str| json!({ "description": "resume", "prompt": prompt, "subagent_type": sub, "resume": id });
    let mut elsewhere = resume("waiter", waiter, "carry on");
    elsewhere["session_id"] = "sess-elsewhere".into();
    let (status, refused) = json_of(port, "POST", "/v1/tasks", Some(&elsewhere));
    assert_eq!((status, refused["error"]["code"].as_str()), (400, Some("invalid_field")), "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("invalid session_id") && message.contains(session), "{message}");

    let (status, r) = json_of(port, "POST", "/v1/tasks", Some(&resume("waiter", waiter, "carry on")));
    assert_eq!(
        (status, r["status"].as_str(), r["output"].as_str(), r["session_id"].as_str()),
        (200, Some("completed"), Some("resumed: found the notes"), Some(session)),
        "{r}"
    );
    let (status, r) = json_of(port, "POST", "/v1/tasks", Some(&resume("writer", writer, "one more thing")));
    assert_eq!(
        (status, r["status"].as_str(), r["output"].as_str(), r["session_id"].as_str()),
        (200, Some("completed"), Some("still on the notes"), Some(session)),
        "{r}"
    );
}

/// Done when (issue 20): a subagent resumed after `kill -9` of `warden serve` continues
/// its conversation, in its session, on the embedded store.
#[test]
fn a_subagent_resumed_after_kill_9_continues_its_conversation_in_its_session() {
    let scope = scope();
    let _cleanup = ScopeCleanup(scope.clone());
    let d = resume_deployment("  path: ./state/tasks.db\n", &scope);
    let mut server = Server::start(&d);
    let (session, writer, waiter) = start_conversations(server.port);
    server.child.kill().unwrap(); // SIGKILL while the waiter waits for its approval
    server.child.wait().unwrap();

    let server = Server::start(&d);
    let (_, r) = json_of(server.port, "GET", &format!("/v1/tasks/{waiter}?block=false"), None);
    assert_eq!((r["status"].as_str(), r["error"].as_str()), (Some("failed"), Some("host restarted")), "{r}");
    continue_conversations(server.port, &session, &writer, &waiter);
}

/// Replicas on PostgreSQL: the replica that ran the conversations is killed; another one
/// resumes them from the transcripts in the database, in the same session.
#[test]
fn a_subagent_killed_on_one_replica_is_resumed_on_another() {
    let db = TestDatabase::create();
    let scope = scope();
    let _cleanup = ScopeCleanup(scope.clone());
    let d = resume_deployment(&format!("  url: {}\n", db.url), &scope);
    let mut first = Server::start_replica(&d, "r1");
    let second = Server::start_replica(&d, "r2");
    let (session, writer, waiter) = start_conversations(first.port);
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    continue_conversations(second.port, &session, &writer, &waiter);
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
