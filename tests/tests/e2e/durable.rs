//! Durable tasks (issue 42): the real `warden serve`, killed with SIGKILL while a Claude
//! subagent's task is in its third tool turn — two turns done, a `Bash` call running —
//! and the task taken over: by the same server restarted on the embedded store, and by
//! another replica on PostgreSQL. Each time the task completes with the output of an
//! uninterrupted run; no command runs twice (the commands append to a tripwire file that
//! the last one prints, checked by the scripted model); the call that was running ends
//! with the documented interruption result; the event stream read across the kill has
//! every event once, in order, with one `takeover` event.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{
    Deployment, ScopeCleanup, Server, TestDatabase, bin, bundled_plugin, http_with, json, json_of, test_plugin,
};

const AGENT: &str = "---\nname: durable\ndescription: Runs four commands\ntools: Bash\nmodel: durable/scripted\n---\nYou run commands.\n";

/// Three turns before the kill (the third one's command runs for 20 s: the kill lands in
/// it), then the turn after the takeover. The scripted model checks what the plugin sends
/// it: the interruption result, and the tripwire file holding each command's line once.
const SCRIPT: &str = r#"
- tool_calls: [{ name: Bash, arguments: { command: "echo one >> trips.txt" } }]
- tool_calls: [{ name: Bash, arguments: { command: "echo two >> trips.txt" } }]
- tool_calls: [{ name: Bash, arguments: { command: "echo three >> trips.txt && sleep 20 && echo slept" } }]
- expect: { last_tool_result_contains: "was interrupted: the host running this task restarted" }
  tool_calls: [{ name: Bash, arguments: { command: "echo four >> trips.txt && cat trips.txt" } }]
- expect: { last_tool_result_contains: "one\ntwo\nthree\nfour\n" }
  text: "Finished."
"#;

/// The deployment: the Claude plugin, the agent above, Bash allowed, `store` (a `store:`
/// body) and `server` (a `server:` body).
fn deployment(store: &str, server: &str) -> (Deployment, ScopeCleanup) {
    let scope = format!("dur{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let d = Deployment::new(&format!(
        "  grants:\n    claude: {{ log: true, events: true, state: true, resources: true, model: true, tools: true }}\n\
         subagents:\n  agent_dirs: [./agents]\n\
         models:\n  default: durable/scripted\n  providers:\n    durable: {{ type: scripted, script: ./durable.yaml }}\n\
         sandbox:\n  scope: {scope}\n\
         approval:\n  default: deny\n  allow: [Bash]\n\
         server:\n{server}\
         store:\n{store}"
    ));
    let root = d.dir.path();
    std::fs::copy(bundled_plugin("claude"), root.join("plugins/claude.wasm")).unwrap();
    std::fs::create_dir_all(root.join("agents")).unwrap();
    std::fs::write(root.join("agents/durable.md"), AGENT).unwrap();
    std::fs::write(root.join("durable.yaml"), SCRIPT).unwrap();
    (d, ScopeCleanup(scope))
}

/// The `id` and `data` of every frame of an SSE body, heartbeats left out; every event
/// of a task's stream has an id.
fn frames(body: &str) -> Vec<(u64, Value)> {
    crate::common::sse_frames(body)
        .into_iter()
        .map(|(id, v)| (id.unwrap_or_else(|| panic!("an event without an id: {v}")), v))
        .collect()
}

/// Reads the task's event stream from `port` in the background from `after`, until the
/// stream ends (its `finish`, or the server dying); the frames read.
fn follow(port: u16, task: &str, after: u64) -> std::thread::JoinHandle<Vec<(u64, Value)>> {
    let path = format!("/v1/tasks/{task}/events");
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return vec![] };
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let header = if after > 0 { format!("Last-Event-ID: {after}\r\n") } else { String::new() };
        write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{header}\r\n").unwrap();
        let mut raw = Vec::new();
        let mut buf = [0u8; 8192];
        // A killed server resets the connection: what was read until then is the stream.
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            raw.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&raw).into_owned();
        let Some((head, body)) = text.split_once("\r\n\r\n") else { return vec![] };
        let body = match head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
            true => crate::common::dechunk(body),
            false => body.to_owned(),
        };
        // Only whole events: the last one may have been cut by the kill.
        let whole = body.rfind("\n\n").map_or("", |end| &body[..end + 2]);
        frames(whole)
    })
}

/// Submits the task on `port`; its id.
fn submit(port: u16) -> String {
    let body = json!({ "description": "durable", "prompt": "run the commands", "subagent_type": "durable", "run_in_background": true });
    let (status, r) = json_of(port, "POST", "/v1/tasks", Some(&body));
    assert_eq!(status, 202, "{r}");
    r["task_id"].as_str().unwrap().to_owned()
}

/// Waits until the task's journal (through the API on `port`) shows two tool turns done
/// and the third one's call running.
fn in_third_turn(port: u16, task: &str, log: impl Fn() -> String) {
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let (status, j) = json_of(port, "GET", &format!("/v1/tasks/{task}/journal"), None);
        assert_eq!(status, 200, "{j}");
        let calls: Vec<&Value> = j["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| &e["entry"])
            .filter(|e| e["kind"] == "call" && e["import"] == "tools.call")
            .collect();
        let done = calls.iter().filter(|c| c["state"] == "done").count();
        let running =
            calls.iter().any(|c| c["state"] == "started" && c["running"].as_array().is_some_and(|r| !r.is_empty()));
        if done == 2 && running {
            return;
        }
        assert!(Instant::now() < until, "the third turn never ran: {j}\n{}", log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What must hold of the finished task, read through the API on `port`, and of the
/// stream read across the kill (`before` from the first server, `after` the rest).
fn check_completed(port: u16, task: &str, seen: Vec<(u64, Value)>, log: impl Fn() -> String) {
    let (_, r) = json_of(port, "GET", &format!("/v1/tasks/{task}?timeout_ms=120000"), None);
    assert_eq!((r["status"].as_str(), r["output"].as_str()), (Some("completed"), Some("Finished.")), "{r}\n{}", log());
    // Every event once, in order, across the kill.
    let ids: Vec<u64> = seen.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>(), "the stream across the kill: {seen:?}");
    assert_eq!(seen.last().unwrap().1["type"], "finish", "{seen:?}");
    let of = |t: &str| seen.iter().filter(|(_, e)| e["type"] == t).map(|(_, e)| e.clone()).collect::<Vec<_>>();
    assert_eq!(of("takeover").len(), 1, "one takeover: {seen:?}");
    assert!(of("takeover")[0]["journal_entries"].as_u64().unwrap() > 0, "{seen:?}");
    // Each command was asked for once and answered once: no turn ran again.
    let commands: Vec<String> =
        of("tool_call").iter().map(|e| e["input"]["command"].as_str().unwrap_or_default().to_owned()).collect();
    assert_eq!(commands.len(), 4, "{commands:?}");
    for word in ["one", "two", "three", "four"] {
        assert_eq!(commands.iter().filter(|c| c.starts_with(&format!("echo {word} "))).count(), 1, "{commands:?}");
    }
    let results = of("tool_result");
    assert_eq!(results.len(), 4, "{results:?}");
    // The store's copy of the stream is the one that was read.
    let (status, body) = http_with(port, "GET", &format!("/v1/tasks/{task}/events"), "", None);
    assert_eq!(status, 200);
    let stored: Vec<u64> = frames(&body).into_iter().map(|(id, _)| id).collect();
    assert_eq!(stored, ids);
}

/// Done when (issue 42): a single `warden serve` on the embedded store, killed with
/// SIGKILL mid-task and restarted, finishes the task.
#[test]
fn a_task_survives_kill_9_of_its_server_on_the_embedded_store() {
    let (d, _cleanup) = deployment("  path: ./state/tasks.db\n", "  heartbeat: 1s\n");
    let log = || std::fs::read_to_string(d.dir.path().join("serve.log")).unwrap_or_default();
    let mut server = Server::start(&d);
    let task = submit(server.port);
    let before = follow(server.port, &task, 0);
    in_third_turn(server.port, &task, log);
    server.child.kill().unwrap(); // SIGKILL: no shutdown code runs
    server.child.wait().unwrap();
    let mut seen = before.join().unwrap();
    assert!(!seen.is_empty(), "the stream was read before the kill");

    let server = Server::start(&d);
    let last = seen.last().map_or(0, |(id, _)| *id);
    seen.extend(follow(server.port, &task, last).join().unwrap());
    check_completed(server.port, &task, seen, log);
    // `warden task journal` prints the journal the takeover replayed.
    let out = std::process::Command::new(crate::common::bin())
        .current_dir(d.dir.path())
        .args(["task", "journal", &task, "--url", &format!("http://127.0.0.1:{}", server.port)])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["entries"][0]["entry"]["kind"], "header", "{printed}");
    assert!(printed.to_string().contains("tools.call"), "{printed}");
    let entries = printed["entries"].as_array().unwrap();
    let bytes: usize = entries.iter().map(|e| e["entry"].to_string().len()).sum();
    let turns = entries.iter().filter(|e| e["entry"]["import"] == "model.complete").count();
    println!(
        "BENCH journal: {bytes} bytes in {} entries over {turns} model turns ({} bytes per turn)",
        entries.len(),
        bytes / turns.max(1)
    );
}

/// Done when (issue 42): three replicas on PostgreSQL; the one running the task is killed
/// with SIGKILL and another takes the task over within about a lease. The stream is read
/// from a replica that lives, across the kill.
#[test]
fn a_task_survives_kill_9_of_its_replica() {
    let db = TestDatabase::create();
    let (d, _cleanup) =
        deployment(&format!("  url: {}\n", db.url), "  heartbeat: 1s\n  task_lease: 3s\n  max_concurrent_tasks: 2\n");
    let ids = ["r1", "r2", "r3"];
    let logs = || {
        ids.iter()
            .map(|id| std::fs::read_to_string(d.dir.path().join(format!("serve-{id}.log"))).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n---\n")
    };
    let mut servers: Vec<Option<Server>> = ids.iter().map(|id| Some(Server::start_replica(&d, id))).collect();
    let ports: Vec<u16> = servers.iter().map(|s| s.as_ref().unwrap().port).collect();
    let task = submit(ports[0]);
    in_third_turn(ports[0], &task, logs);
    let (_, r) = json_of(ports[0], "GET", &format!("/v1/tasks/{task}?block=false"), None);
    let owner = ids.iter().position(|id| r["replica"] == *id).unwrap_or_else(|| panic!("no replica runs it: {r}"));
    let reader = ports[(owner + 1) % ids.len()];
    let stream = follow(reader, &task, 0);
    // The reader has the events so far before the owner dies.
    std::thread::sleep(Duration::from_millis(1500));
    let mut dead = servers[owner].take().unwrap();
    dead.child.kill().unwrap();
    dead.child.wait().unwrap();
    let seen = stream.join().unwrap();
    let (_, r) = json_of(reader, "GET", &format!("/v1/tasks/{task}?timeout_ms=120000"), None);
    assert_ne!(r["replica"], ids[owner], "it finished where it was killed: {r}");
    check_completed(reader, &task, seen, logs);
    drop(servers);
}

/// Done when (issue 42): `warden plugin test --replay` runs a recorded task again offline,
/// byte for byte. The task (the hostile test plugin) read the clock, slept, asked the
/// model and read the clock again on a real server; its journal, saved from the API and
/// replayed with no server, no model and no configuration, gives the same output, clock
/// readings included — which a live run cannot (the control).
#[test]
fn plugin_test_replays_a_recorded_task_byte_for_byte() {
    let d = Deployment::new(
        "  grants:\n    hostile: { model: true }\n\
         subagents:\n  agent_dirs: []\n  references:\n    - { uri: \"hostile://hostile\", kind: HOSTILE }\n\
         models:\n  default: main/scripted\n  providers:\n    main: { type: scripted, script: ./main.yaml }\n\
         store:\n  path: ./state/tasks.db\n",
    );
    d.add("hostile", "hostile");
    std::fs::write(d.dir.path().join("main.yaml"), "- text: \"the model's answer\"\n").unwrap();
    let server = Server::start(&d);
    let script = r#"script:[{"op":"now"},{"op":"sleep","ms":50},{"op":"model"},{"op":"now"}]"#;
    let body = json!({ "description": "replay", "prompt": script, "subagent_type": "hostile" });
    let (status, r) = json_of(server.port, "POST", "/v1/tasks", Some(&body));
    assert_eq!((status, r["status"].as_str()), (200, Some("completed")), "{r}");
    let output = r["output"].as_str().unwrap().to_owned();
    assert!(output.contains("the model's answer"), "{output}");
    let (status, journal) =
        json_of(server.port, "GET", &format!("/v1/tasks/{}/journal", r["task_id"].as_str().unwrap()), None);
    assert_eq!(status, 200, "{journal}");
    drop(server);
    let offline = tempfile::tempdir().unwrap();
    std::fs::write(offline.path().join("journal.json"), journal.to_string()).unwrap();
    let hostile = test_plugin("hostile");
    let test = |extra: &[&str]| {
        std::process::Command::new(bin())
            .current_dir(offline.path())
            .args(["plugin", "test", hostile.to_str().unwrap(), "--ref", "hostile://hostile", "--json"])
            .args(extra)
            .output()
            .unwrap()
    };
    // Live, the same script reads other times and has no model: another output.
    let live = json(&test(&["--prompt", script, "--grant", "model"]));
    assert_ne!(live["output"].as_str(), Some(output.as_str()), "{live}");
    let replayed = test(&["--replay", "journal.json"]);
    let v = json(&replayed);
    assert_eq!((v["status"].as_str(), v["output"].as_str()), (Some("completed"), Some(output.as_str())), "{v}");
}
