//! warden as an A2A server: the real `warden serve` driven by the official A2A client
//! (`a2a-sdk` 1.3.0, both its 1.0 and its 0.3 transport) through
//! `tests/peers/a2a_parent_client.py`. The subagents are Claude agent files run by the real
//! `claude` plugin with the scripted model (the only stand-in: the LLM) and the real Docker
//! sandbox; approvals go through the real gate.

use std::process::Command;

use serde_json::Value;

use crate::common::*;

const GREETER: &str = "---\nname: greeter\ndescription: Greets whoever writes\nmodel: greet\n---\nGreet.\n";
const GATED: &str = "---\nname: gated\ndescription: Runs a command a person must approve\ntools: Write, Bash\nmodel: gate\n---\nRun it.\n";
const WRITER: &str = "---\nname: writer\ndescription: Writes and reads notes in its workspace\ntools: Read, Write\nmodel: write\n---\nTake notes.\n";
const SLEEPER: &str = "---\nname: sleeper\ndescription: Takes its time\ntools: Bash\nmodel: sleep\n---\nSleep.\n";

const GREET_SCRIPT: &str = "- text: \"Hello from warden.\"\n";
const GATE_SCRIPT: &str = r#"
- tool_calls: [{ name: Write, arguments: { file_path: "before.txt", content: "written before the gated command" } }]
- tool_calls: [{ name: Bash, arguments: { command: "echo approved-run > gate.txt && cat gate.txt" } }]
- text: "Finished."
"#;
const WRITE_SCRIPT: &str = r#"
- tool_calls: [{ name: Write, arguments: { file_path: "note.txt", content: "from-the-first-message" } }]
- text: "Saved the note."
- tool_calls: [{ name: Read, arguments: { file_path: "note.txt" } }]
  expect: { last_user_contains: "what does the note say" }
- text: "The note says from-the-first-message."
  expect: { last_tool_result_contains: "from-the-first-message" }
"#;
const SLEEP_SCRIPT: &str = r#"
- tool_calls: [{ name: Bash, arguments: { command: "sleep 60" } }]
- text: "Slept."
"#;

/// A `warden serve` deployment with the four agents; Bash asks unless it only sleeps.
/// `server` adds lines to the `server:` section.
fn deployment(server: &str) -> Deployment {
    let scope = format!("e2ea2a{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let d = Deployment::new(&format!(
        "  grants:\n    claude: {{ log: true, events: true, state: true, resources: true, model: true, tools: true }}\n\
         subagents:\n  agent_dirs: [./agents]\n\
         models:\n  default: greet/scripted\n  aliases: {{ greet: greet/scripted, gate: gate/scripted, write: write/scripted, sleep: sleep/scripted }}\n\
         \x20 providers:\n\
         \x20   greet: {{ type: scripted, script: ./greet.yaml }}\n\
         \x20   gate: {{ type: scripted, script: ./gate.yaml }}\n\
         \x20   write: {{ type: scripted, script: ./write.yaml }}\n\
         \x20   sleep: {{ type: scripted, script: ./sleep.yaml }}\n\
         sandbox:\n  scope: {scope}\n\
         approval:\n  default: ask\n  allow: [Read, Write, \"Bash(sleep *)\"]\n  timeout: 120s\n\
         store:\n  path: ./state/tasks.db\n\
         server:\n  heartbeat: 1s\n{server}"
    ));
    let root = d.dir.path();
    std::fs::copy(bundled_plugin("claude"), root.join("plugins/claude.wasm")).unwrap();
    std::fs::create_dir_all(root.join("agents")).unwrap();
    for (file, text) in [
        ("agents/greeter.md", GREETER),
        ("agents/gated.md", GATED),
        ("agents/writer.md", WRITER),
        ("agents/sleeper.md", SLEEPER),
        ("greet.yaml", GREET_SCRIPT),
        ("gate.yaml", GATE_SCRIPT),
        ("write.yaml", WRITE_SCRIPT),
        ("sleep.yaml", SLEEP_SCRIPT),
    ] {
        std::fs::write(root.join(file), text).unwrap();
    }
    d
}

/// Runs the parent-agent script against the server (with `args`); its JSON report.
fn drive(port: u16, args: &[&str]) -> Value {
    let out = Command::new(python())
        .arg(repo().join("tests/peers/a2a_parent_client.py"))
        .args(["--base", &format!("http://127.0.0.1:{port}")])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "client script failed: {}\n{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("report is not JSON ({e}): {}", stdout(&out)))
}

fn scenario<'a>(report: &'a Value, name: &str) -> &'a Value {
    let s = &report[name];
    assert!(s.get("error").is_none(), "scenario {name} raised: {}\n{}", s["error"], s["trace"].as_str().unwrap_or(""));
    s
}

fn states(events: &Value) -> Vec<String> {
    events.as_array().unwrap().iter().filter_map(|e| e["state"].as_str().map(str::to_owned)).collect()
}

fn last(events: &Value) -> &Value {
    events.as_array().unwrap().last().expect("at least one event")
}

#[test]
fn the_official_a2a_client_drives_warden_subagents() {
    let d = deployment("");
    let server = Server::start(&d);
    let report = drive(server.port, &[]);
    let serve_log = || std::fs::read_to_string(d.dir.path().join("serve.log")).unwrap_or_default();
    let check = |name: &str| {
        let s = &report[name];
        assert!(
            s.get("error").is_none(),
            "scenario {name} raised: {}\n{}\nserve.log:\n{}",
            s["error"],
            s["trace"].as_str().unwrap_or(""),
            serve_log()
        );
    };
    for name in [
        "discovery",
        "send_get_list_v1",
        "send_get_v03",
        "stream_v1",
        "stream_v03",
        "approve_v1",
        "decline_stream_v03",
        "follow_up",
        "cancel",
        "hostile",
    ] {
        check(name);
    }
    let base = format!("http://127.0.0.1:{}", server.port);

    // Card discovery: the 1.0 client picks the 1.0 interface, the 0.3 card fields lead the
    // same factory to its 0.3 transport.
    let s = scenario(&report, "discovery");
    assert_eq!(s["directory"], serde_json::json!(["gated", "greeter", "sleeper", "writer"]));
    let v1 = &s["v1"];
    assert_eq!((v1["name"].as_str(), v1["description"].as_str()), (Some("greeter"), Some("Greets whoever writes")));
    assert_eq!(v1["streaming"], true);
    assert_eq!(v1["skills"], serde_json::json!(["greeter"]));
    assert_eq!(v1["interfaces"][0], serde_json::json!([format!("{base}/a2a/greeter"), "JSONRPC", "1.0"]));
    assert_eq!(
        (v1["transport"].as_str(), v1["transport_url"].as_str()),
        (Some("JsonRpcTransport"), Some(format!("{base}/a2a/greeter").as_str()))
    );
    let v03 = &s["v03"];
    assert_eq!(
        (v03["url"].as_str(), v03["preferred_transport"].as_str(), v03["protocol_version"].as_str()),
        (Some(format!("{base}/a2a/greeter").as_str()), Some("JSONRPC"), Some("0.3.0"))
    );
    assert_eq!(v03["transport"], "CompatJsonRpcTransport");

    // Send (blocking), get, list — 1.0.
    let s = scenario(&report, "send_get_list_v1");
    let sent = last(&s["sent"]);
    assert_eq!((sent["kind"].as_str(), sent["state"].as_str()), (Some("task"), Some("TASK_STATE_COMPLETED")), "{s}");
    assert_eq!(sent["artifacts"], serde_json::json!(["Hello from warden."]));
    let task_id = sent["id"].as_str().unwrap();
    assert!(task_id.starts_with("task_") && !sent["context_id"].as_str().unwrap().is_empty(), "{sent}");
    assert_eq!(s["got"]["id"], task_id);
    assert_eq!(s["got"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(s["got"]["artifacts"], sent["artifacts"]);
    assert!(s["listed"].as_array().unwrap().iter().any(|t| t == task_id), "{s}");
    assert_eq!(s["by_context"], serde_json::json!([task_id]));
    assert_eq!(s["missing"]["error_type"], "TaskNotFoundError");
    // The A2A task is the warden task: the HTTP API knows it by the same id.
    let (status, body) = http_json(server.port, &format!("/v1/tasks/{task_id}"));
    assert_eq!(
        (status, body["status"].as_str(), body["output"].as_str()),
        (200, Some("completed"), Some("Hello from warden."))
    );
    assert_eq!(body["session_id"], sent["context_id"]);

    // Send and get — 0.3.
    let s = scenario(&report, "send_get_v03");
    assert_eq!(last(&s["sent"])["state"], "TASK_STATE_COMPLETED", "{s}");
    assert_eq!(last(&s["sent"])["artifacts"], serde_json::json!(["Hello from warden."]));
    assert_eq!(s["got"]["state"], "TASK_STATE_COMPLETED");

    // Streams, both generations: the task first, then updates, the artifact, completion.
    for name in ["stream_v1", "stream_v03"] {
        let s = scenario(&report, name);
        let events = s["events"].as_array().unwrap();
        assert_eq!(events[0]["kind"], "task", "{name}: {s}");
        let st = states(&s["events"]);
        assert_eq!(st.last().map(String::as_str), Some("TASK_STATE_COMPLETED"), "{name}: {st:?}");
        assert!(st.iter().any(|x| x == "TASK_STATE_WORKING"), "{name}: no working update: {st:?}");
        let artifact =
            events.iter().find(|e| e["kind"] == "artifact").unwrap_or_else(|| panic!("{name}: no artifact: {s}"));
        assert_eq!(artifact["text"], "Hello from warden.");
    }

    // input-required answered: the question names the tool and its arguments; an unclear
    // answer is refused and approves nothing; `approve` continues the same task.
    let s = scenario(&report, "approve_v1");
    let asked = last(&s["asked"]);
    assert_eq!(asked["state"], "TASK_STATE_INPUT_REQUIRED", "{s}");
    let q = asked["status_text"].as_str().unwrap();
    assert!(q.contains("`Bash`") && q.contains("approved-run") && q.contains("approve"), "{q}");
    let data = &asked["status_data"][0];
    assert_eq!((data["type"].as_str(), data["tool"].as_str()), (Some("approval_request"), Some("Bash")));
    assert!(
        data["request_id"].as_str().unwrap().starts_with("apr_") && q.contains(data["request_id"].as_str().unwrap())
    );
    assert_eq!(data["input"]["command"], "echo approved-run > gate.txt && cat gate.txt");
    assert_eq!(s["unclear"]["error_type"], "InvalidParamsError", "{s}");
    assert_eq!(
        (s["still"]["id"].as_str(), s["still"]["state"].as_str()),
        (asked["id"].as_str(), Some("TASK_STATE_INPUT_REQUIRED"))
    );
    let answered = last(&s["answered"]);
    assert_eq!(
        (answered["id"].as_str(), answered["state"].as_str()),
        (asked["id"].as_str(), Some("TASK_STATE_COMPLETED")),
        "{s}"
    );
    assert_eq!(answered["artifacts"], serde_json::json!(["Finished."]));
    assert_eq!(
        (s["file"]["status"].as_u64(), s["file"]["text"].as_str().map(str::trim)),
        (Some(200), Some("approved-run"))
    );

    // The same over 0.3 streams, declined with a data part: the command never ran.
    let s = scenario(&report, "decline_stream_v03");
    let asked_states = states(&s["asked"]);
    assert_eq!(asked_states.last().map(String::as_str), Some("TASK_STATE_INPUT_REQUIRED"), "{s}");
    assert!(s["request_id"].as_str().is_some_and(|r| r.starts_with("apr_")), "{s}");
    let answered_states = states(&s["answered"]);
    assert_eq!(answered_states.last().map(String::as_str), Some("TASK_STATE_COMPLETED"), "{s}");
    assert!(!answered_states.iter().any(|x| x == "TASK_STATE_INPUT_REQUIRED"), "{answered_states:?}");
    // The session exists (the subagent wrote a file before asking); the command never ran.
    assert_eq!(s["before"]["status"], 200, "{s}");
    assert_eq!(s["file"]["status"], 404, "a declined command must not run: {s}");
    assert!(s["file"]["text"].as_str().unwrap().contains("file_not_found"), "{s}");

    // A follow-up in the same context runs in the same sandbox and resumes the subagent
    // (the scripted model's later turns only answer a resumed transcript, and the Read
    // turn expects the file the first message wrote).
    let s = scenario(&report, "follow_up");
    let (first, second) = (last(&s["first"]), last(&s["second"]));
    assert_eq!(
        (first["state"].as_str(), second["state"].as_str()),
        (Some("TASK_STATE_COMPLETED"), Some("TASK_STATE_COMPLETED")),
        "{s}\n{}",
        serve_log()
    );
    assert_eq!(first["context_id"], second["context_id"]);
    assert_ne!(first["id"], second["id"]);
    assert_eq!(second["artifacts"], serde_json::json!(["The note says from-the-first-message."]));
    assert_eq!(s["file"]["text"], "from-the-first-message");

    // Cancel a long task; a subscriber sees it end canceled.
    let s = scenario(&report, "cancel");
    assert_eq!(s["state_before"], "TASK_STATE_WORKING", "{s}");
    assert_eq!(s["canceled"]["state"], "TASK_STATE_CANCELED", "{s}");
    assert_eq!(s["after"]["state"], "TASK_STATE_CANCELED");
    assert_eq!(s["watched"][0]["kind"], "task");
    assert_eq!(states(&s["watched"]).last().map(String::as_str), Some("TASK_STATE_CANCELED"), "{s}");
    assert_eq!(s["cancel_again"]["error_type"], "TaskNotCancelableError");

    // Hostile requests get JSON-RPC errors (HTTP 200), never a task.
    let s = scenario(&report, "hostile");
    let code = |k: &str| s[k]["body"]["error"]["code"].as_i64().unwrap_or_else(|| panic!("{k}: {}", s[k]));
    assert_eq!(code("unknown_method"), -32601);
    assert_eq!(code("not_json"), -32700);
    assert_eq!(code("batch"), -32600);
    assert_eq!(code("no_message"), -32602);
    assert_eq!(code("bad_context"), -32602);
    assert!(s["bad_context"]["body"]["error"]["message"].as_str().unwrap().contains("contextId"));
    assert_eq!(code("agent_role"), -32602);
    assert_eq!(code("file_part"), -32005);
    assert_eq!(code("missing_task"), -32001);
    assert_eq!(code("answer_to_finished"), -32001);
    assert_eq!(code("bad_version"), -32009);
    for k in ["unknown_method", "not_json", "batch", "no_message", "missing_task"] {
        assert_eq!(s[k]["status"], 200, "{k}");
    }
    assert_eq!(s["unknown_agent"]["status"], 404);
    // The open API answers only loopback hosts (its own guard); see the tokens test for
    // the card's own Host check.
    assert_eq!(s["bad_host"]["status"], 403);
}

/// `GET` on the server's HTTP API: status and JSON body (0 when nobody answered).
fn http_json(port: u16, path: &str) -> (u16, Value) {
    http_get(port, path, None)
}

fn http_json_as(port: u16, path: &str, token: &str) -> (u16, Value) {
    http_get(port, path, Some(token))
}

fn http_get(port: u16, path: &str, token: Option<&str>) -> (u16, Value) {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return (0, Value::Null) };
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let _ = write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n{auth}\r\n");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// Over A2A a principal is who its token says, as on the rest of the API: bob's client
/// cannot read, list, cancel or answer alice's task (all "not found"), alice can.
#[test]
fn a2a_callers_are_the_principals_behind_their_tokens() {
    let d = deployment(
        "  principals:\n    - { name: alice, token_env: A2A_E2E_ALICE, role: user }\n    - { name: bob, token_env: A2A_E2E_BOB, role: user }\n",
    );
    let server = Server::start_with_env(&d, &[("A2A_E2E_ALICE", "tok-alice-7c1e"), ("A2A_E2E_BOB", "tok-bob-94d2")]);
    let report = drive(server.port, &["--token-a", "tok-alice-7c1e", "--token-b", "tok-bob-94d2"]);
    let s = scenario(&report, "principals");
    assert_eq!(s["anonymous_card"], 401, "{s}");
    assert_eq!(s["bad_host"], 400, "a Host that is no host name is not put into card URLs: {s}");
    assert_eq!(s["security"], serde_json::json!([["bearer"]]), "the card declares the bearer token: {s}");
    let asked = &s["asked"];
    assert_eq!(asked["state"], "TASK_STATE_INPUT_REQUIRED", "{s}");
    for what in ["get", "cancel", "answer"] {
        assert_eq!(s["bob"][what]["error_type"], "TaskNotFoundError", "bob's {what}: {s}");
    }
    assert_eq!(s["bob"]["list"], serde_json::json!([]));
    assert_eq!(s["bob"]["file"], 404);
    assert_eq!(s["alice_list"], serde_json::json!([asked["id"]]));
    assert_eq!(s["still"]["state"], "TASK_STATE_INPUT_REQUIRED", "bob's answer must not decide: {s}");
    assert_eq!(s["answered"]["state"], "TASK_STATE_COMPLETED", "{s}");
    assert_eq!(s["file"]["text"].as_str().map(str::trim), Some("approved-run"));
    // The task is alice's, submitted by alice.
    let (status, body) =
        http_json_as(server.port, &format!("/v1/tasks/{}", asked["id"].as_str().unwrap()), "tok-alice-7c1e");
    assert_eq!((status, body["user_id"].as_str(), body["principal"].as_str()), (200, Some("alice"), Some("alice")));
}

/// A remote A2A agent behind warden (the `a2a` plugin and an official-SDK peer) asks a
/// question: the warden task ends `input_required`, the parent sees `input-required` with
/// the question, and its answer on the same task resumes the remote conversation (a new
/// warden task in the same context, `resume` = the first).
#[test]
fn a_remote_agent_s_question_reaches_the_parent_and_its_answer_resumes_the_conversation() {
    let peer = Peer::start("a2a_agents.py", &["--agent", "ask-input", "--protocol", "1.0"]);
    let scope = format!("e2ea2a{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let d = Deployment::new(&format!(
        "  grants:\n    a2a: {{ http: [\"http://127.0.0.1:*\"], events: true, state: true, log: true }}\n\
         subagents:\n  references:\n    - {{ uri: \"{}\", kind: A2A, metadata: {{ name: asker }} }}\n\
         sandbox:\n  scope: {scope}\nstore:\n  path: ./state/tasks.db\n",
        peer.url()
    ));
    std::fs::copy(bundled_plugin("a2a"), d.dir.path().join("plugins/a2a.wasm")).unwrap();
    let server = Server::start(&d);
    let report = drive(server.port, &["--only", "relay"]);
    let s = scenario(&report, "relay");
    let (asked, answered) = (&s["asked"], &s["answered"]);
    assert_eq!(asked["state"], "TASK_STATE_INPUT_REQUIRED", "{s}");
    assert_eq!(asked["status_text"], "What is your name?");
    assert_eq!(answered["state"], "TASK_STATE_COMPLETED", "{s}");
    assert_eq!(answered["artifacts"], serde_json::json!(["Hello, Ada!"]));
    assert_eq!(answered["context_id"], asked["context_id"]);
    assert_ne!(answered["id"], asked["id"], "the answer runs as a new task resuming the first");
}
