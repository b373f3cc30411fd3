//! warden as an MCP server (issue 15), driven by the official `mcp` Python SDK client:
//! `warden mcp` on stdio (the handshake revision, elicitation as a server-to-client
//! request) and `/mcp` on `warden serve` (2026-07-28, elicitation as `input_required`),
//! Claude subagents with a scripted model doing real tool calls in real sandboxes.

use std::process::Command;

use serde_json::Value;

use crate::common::*;

const FILER: &str = "---\nname: filer\ndescription: Writes a report into the workspace and checks it\ntools: Write, Bash\nmodel: main/scripted\n---\nWrite reports.\n";
const FILER_SCRIPT: &str = r##"
- tool_calls: [{ name: Write, arguments: { file_path: "report.md", content: "# Report\nwritten through MCP\n" } }]
- tool_calls: [{ name: Bash, arguments: { command: "cat report.md" } }]
  expect: { last_tool_result_contains: "report.md" }
- text: "Report written."
  expect: { last_tool_result_contains: "written through MCP" }
"##;
const TOUCHER: &str = "---\nname: toucher\ndescription: Touches a file, which a person must approve\ntools: Bash\nmodel: ask/scripted\n---\nTouch.\n";
const TOUCHER_SCRIPT: &str = r##"
- tool_calls: [{ name: Bash, arguments: { command: "touch approved.txt && echo touched" } }]
- text: "Finished."
"##;
const SLEEPER: &str =
    "---\nname: sleeper\ndescription: Sleeps for a long time\ntools: Bash\nmodel: slow/scripted\n---\nSleep.\n";
const SLEEPER_SCRIPT: &str = r##"
- tool_calls: [{ name: Bash, arguments: { command: "sleep 300" } }]
- text: "Woke up."
"##;

/// A deployment with the claude plugin, the three agents above, their scripts, an `ask`
/// rule on `touch` and a sandbox scope of its own.
fn deployment() -> Deployment {
    deployment_in(&format!("e2e{}", &uuid::Uuid::new_v4().simple().to_string()[..12]))
}

fn deployment_in(scope: &str) -> Deployment {
    let d = Deployment::new(&format!(
        "  grants:\n    claude: {{ log: true, events: true, state: true, resources: true, model: true, tools: true }}\n\
         subagents:\n  agent_dirs: [./agents]\n\
         models:\n  default: main/scripted\n  providers:\n    main: {{ type: scripted, script: ./main.yaml }}\n    \
         ask: {{ type: scripted, script: ./ask.yaml }}\n    slow: {{ type: scripted, script: ./slow.yaml }}\n\
         sandbox:\n  scope: {scope}\n\
         approval:\n  default: deny\n  allow: [Read, Write, Glob, Grep, \"Bash(cat *)\", \"Bash(sleep *)\", \"Bash(echo *)\"]\n  ask: [\"Bash(touch *)\"]\n  timeout: 5m\n\
         store:\n  path: ./state/tasks.db\n"
    ));
    let root = d.dir.path();
    std::fs::copy(bundled_plugin("claude"), root.join("plugins/claude.wasm")).unwrap();
    std::fs::create_dir_all(root.join("agents")).unwrap();
    for (name, agent, script, file) in [
        ("filer", FILER, FILER_SCRIPT, "main"),
        ("toucher", TOUCHER, TOUCHER_SCRIPT, "ask"),
        ("sleeper", SLEEPER, SLEEPER_SCRIPT, "slow"),
    ] {
        std::fs::write(root.join(format!("agents/{name}.md")), agent).unwrap();
        std::fs::write(root.join(format!("{file}.yaml")), script).unwrap();
    }
    d
}

/// The `.mcp.json` snippet of the README (between its `mcp-json` markers), pointing at
/// this build's binary and `d`'s configuration.
fn readme_mcp_json(d: &Deployment) -> Value {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let block = readme.split("<!-- mcp-json -->").nth(1).expect("README has an mcp-json example");
    let json = block.split("```json").nth(1).unwrap().split("```").next().unwrap();
    let mut parsed: Value = serde_json::from_str(json).expect("the README's .mcp.json parses");
    let server = &mut parsed["mcpServers"]["warden"];
    assert_eq!(server["command"], "warden", "{server}");
    server["command"] = Value::String(bin().display().to_string());
    let config = d.dir.path().join("warden.yaml").display().to_string();
    for arg in server["args"].as_array_mut().unwrap() {
        if arg == "./warden.yaml" {
            *arg = Value::String(config.clone());
        }
    }
    assert!(server["args"].as_array().unwrap().contains(&Value::String(config)), "{server}");
    parsed
}

/// Runs the official client against warden; one JSON value per scenario (after the
/// `connected` line, which is returned first).
fn client(args: &[String]) -> Vec<Value> {
    client_and_log(args).0
}

/// [`client`], and its stderr (where the `warden mcp` it launched logs).
fn client_and_log(args: &[String]) -> (Vec<Value>, String) {
    let out = Command::new(python())
        .arg(repo().join("tests/peers/mcp_parent_client.py"))
        .args(args)
        .env("WARDEN_LOG", "info")
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "the MCP client failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    let values = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}\n{stderr}")))
        .collect();
    (values, stderr)
}

fn texts(result: &Value) -> Vec<String> {
    result["content"].as_array().unwrap().iter().filter_map(|c| c["text"].as_str().map(str::to_owned)).collect()
}

/// The approval decision and whether the tool call then failed, from the task's events
/// as the HTTP API streams them (progress notifications may trail the result).
fn decision_and_result(call: &Value) -> (String, bool) {
    let events = call["events"].as_array().unwrap_or_else(|| panic!("no events in {call}"));
    let resolved =
        events.iter().find(|e| e["type"] == "approval_resolved").unwrap_or_else(|| panic!("no decision in {call}"));
    let result =
        events.iter().find(|e| e["type"] == "tool_result").unwrap_or_else(|| panic!("no tool result in {call}"));
    (resolved["decision"].as_str().unwrap().to_owned(), result["is_error"].as_bool().unwrap())
}

fn tool_names(list: &Value) -> Vec<String> {
    list["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_owned()).collect()
}

/// The report the filer wrote comes back as a resource link whose text reads back.
fn assert_filer_result(r: &Value) {
    assert_eq!(r["is_error"], false, "{r}");
    assert_eq!(texts(r)[1], "Report written.", "{r}");
    assert_eq!(r["structured"]["status"], "completed", "{r}");
    let progress: Vec<&str> = r["progress"].as_array().unwrap().iter().map(|m| m.as_str().unwrap()).collect();
    assert!(progress.iter().any(|m| m.starts_with("tool call: Write")), "{progress:?}");
    assert!(progress.iter().any(|m| m.starts_with("tool call: Bash")), "{progress:?}");
    let files = r["files"].as_object().unwrap();
    assert_eq!(files.len(), 1, "{r}");
    let (uri, text) = files.iter().next().unwrap();
    assert!(uri.starts_with("warden://sessions/") && uri.ends_with("/files/report.md"), "{uri}");
    assert_eq!(text[0], "# Report\nwritten through MCP\n");
}

#[test]
fn stdio_handshake_client_lists_subagents_runs_one_in_the_sandbox_and_answers_an_approval() {
    let scope = format!("e2e{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let d = deployment_in(&scope);
    // The README's snippet, as a user pastes it, with this build and deployment filled in.
    let mcp_json = d.dir.path().join(".mcp.json");
    let mut entry = readme_mcp_json(&d);
    // Plus the approvals API on a port of its own, where the test reads task records.
    let port = free_port();
    let args = entry["mcpServers"]["warden"]["args"].as_array_mut().unwrap();
    args.extend(["--api".into(), format!("127.0.0.1:{port}").into()]);
    // Its log on the client's stderr, where the test reads how the shutdown went (the SDK
    // passes a server only the environment its entry names).
    entry["mcpServers"]["warden"]["env"] = serde_json::json!({ "WARDEN_LOG": "info" });
    std::fs::write(&mcp_json, entry.to_string()).unwrap();
    let (out, log) = client_and_log(&[
        "--transport".into(),
        "stdio".into(),
        "--mcp-json".into(),
        mcp_json.display().to_string(),
        "--api".into(),
        format!("http://127.0.0.1:{port}"),
        "--mode".into(),
        "legacy".into(),
        // warden gets the time its teardown takes (the SDK's own wait is 2 s, then SIGTERM
        // and SIGKILL): what is checked is what it does, not how fast.
        "--server-exit-wait".into(),
        "120".into(),
        "list".into(),
        "call:filer:write the report".into(),
        "approve:toucher:touch it".into(),
        "decline:toucher:touch it again".into(),
        "cancel:sleeper:sleep".into(),
    ]);
    assert_eq!(out[0]["protocol_version"], "2025-11-25", "{:?}", out[0]);
    let mut names = tool_names(&out[1]);
    names.sort();
    assert_eq!(names, ["filer", "sleeper", "toucher"]);
    let filer = out[1]["tools"].as_array().unwrap().iter().find(|t| t["name"] == "filer").unwrap();
    assert_eq!(filer["description"], "Writes a report into the workspace and checks it");
    assert_eq!(filer["inputSchema"]["required"], serde_json::json!(["prompt"]));
    assert_filer_result(&out[2]);
    // An `ask` rule: the client is asked (elicitation), its approval runs the command.
    let approved = &out[3];
    assert_eq!(approved["asked"].as_array().unwrap().len(), 1, "{approved}");
    assert!(approved["asked"][0].as_str().unwrap().contains("touch approved.txt"), "{approved}");
    assert_eq!(decision_and_result(approved), ("approve".into(), false), "{approved}");
    // Its decline does not: the tool result is an error and the task still finishes.
    let declined = &out[4];
    assert_eq!(declined["asked"].as_array().unwrap().len(), 1, "{declined}");
    assert_eq!(decision_and_result(declined), ("decline".into(), true), "{declined}");
    assert_eq!(texts(declined)[1], "Finished.");
    // The client canceled its call (notifications/cancelled): the task was canceled.
    let canceled = &out[5];
    assert!(canceled["task_id"].is_string(), "{canceled}");
    assert_eq!(canceled["record"]["status"], "canceled", "{canceled}");
    // The client closed stdin: `warden mcp` ended its sandbox by itself (its log says so,
    // and how long it took) and left no container behind.
    let shut_down: Vec<&str> = log.lines().filter(|l| l.contains("sandbox shut down")).collect();
    println!("{shut_down:?}");
    let left =
        Command::new("docker").args(["ps", "-aq", "--filter", &format!("name=warden-{scope}-")]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&left.stdout).trim().is_empty(),
        "containers left: {}\nthe client's stderr (warden's log):\n{log}",
        String::from_utf8_lossy(&left.stdout)
    );
    assert_eq!(shut_down.len(), 1, "the sandbox was shut down once: {log}");
}

#[test]
fn http_2026_client_runs_subagents_answers_input_required_and_cancels() {
    let d = deployment();
    let server = Server::start(&d);
    let port = server.port;
    let out = client(&[
        "--transport".into(),
        "http".into(),
        "--url".into(),
        format!("http://127.0.0.1:{port}/mcp"),
        "--api".into(),
        format!("http://127.0.0.1:{port}"),
        "--mode".into(),
        "auto".into(),
        "list".into(),
        "call:filer:write the report".into(),
        "approve:toucher:touch it".into(),
        "cancel:sleeper:sleep".into(),
    ]);
    assert_eq!(out[0]["protocol_version"], "2026-07-28", "{:?}", out[0]);
    assert_eq!(tool_names(&out[1]).len(), 3);
    assert_filer_result(&out[2]);

    // 2026-07-28 has no server-to-client requests: the approval came as input_required,
    // the client's answer resumed the same task, and the approval ran the command.
    let approved = &out[3];
    assert_eq!(approved["asked"].as_array().unwrap().len(), 1, "{approved}");
    let evs = approved["events"].as_array().unwrap();
    let resolved: Vec<&Value> = evs.iter().filter(|e| e["type"] == "approval_resolved").collect();
    assert_eq!(resolved.len(), 1, "{evs:?}");
    assert_eq!(resolved[0]["decision"], "approve");
    // Decided by the principal of the MCP request (the open loopback API's `api`).
    assert_eq!(resolved[0]["decided_by"], "user:api", "{evs:?}");
    let result = evs.iter().find(|e| e["type"] == "tool_result").unwrap();
    assert_eq!(result["is_error"], false, "{result}");
    assert!(result["content"].as_str().unwrap().contains("touched"), "{result}");

    // Closing the call cancels the task (the sleep never finishes).
    let canceled = &out[4];
    assert!(canceled["task_id"].is_string(), "{canceled}");
    assert_eq!(canceled["record"]["status"], "canceled", "{canceled}");
    drop(server);
}

/// One raw MCP POST (handshake revision): status, `Mcp-Session-Id` of the answer, body.
async fn mcp_post(
    http: &reqwest::Client,
    port: u16,
    token: &str,
    session: Option<&str>,
    body: Value,
) -> (u16, Option<String>, String) {
    let mut req = http
        .post(format!("http://127.0.0.1:{port}/mcp"))
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .body(body.to_string());
    if let Some(s) = session {
        req = req.header("mcp-session-id", s);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let sid = resp.headers().get("mcp-session-id").map(|v| v.to_str().unwrap().to_owned());
    let text = if status == 202 { String::new() } else { resp.text().await.unwrap_or_default() };
    (status, sid, text)
}

fn initialize() -> Value {
    serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}}, "clientInfo": {"name": "t", "version": "1"}}})
}

#[tokio::test(flavor = "multi_thread")]
async fn regression_an_mcp_session_id_let_another_principal_act_in_the_session() {
    let d = Deployment::new(
        "  grants:\n    echo: { log: true, events: true, state: true }\n\
         subagents:\n  agent_dirs: []\n  references:\n    - { uri: \"echo://greeter\", kind: ECHO }\n\
         server:\n  principals:\n    - { name: alice, token_env: ALICE_T, role: user }\n    - { name: bob, token_env: BOB_T, role: user }\n",
    );
    d.add("echo", "echo");
    let server = Server::start_with_env(&d, &[("ALICE_T", "alice-token"), ("BOB_T", "bob-token")]);
    let http = reqwest::Client::new();
    let (status, sid, _) = mcp_post(&http, server.port, "alice-token", None, initialize()).await;
    assert_eq!(status, 200);
    let sid = sid.expect("a handshake session");
    let list = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let initialized = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(mcp_post(&http, server.port, "alice-token", Some(&sid), initialized).await.0, 202);
    // Bob holding alice's session id: an unknown session, whatever he sends.
    let (status, _, body) = mcp_post(&http, server.port, "bob-token", Some(&sid), list.clone()).await;
    assert_eq!(status, 404, "{body}");
    let answer = serde_json::json!({"jsonrpc": "2.0", "id": 0, "result": {"action": "accept", "content": {"decision": "approve"}}});
    assert_eq!(mcp_post(&http, server.port, "bob-token", Some(&sid), answer).await.0, 404);
    let cancel = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}});
    assert_eq!(mcp_post(&http, server.port, "bob-token", Some(&sid), cancel).await.0, 404);
    // Alice's session works for alice.
    let (status, _, body) = mcp_post(&http, server.port, "alice-token", Some(&sid), list).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("greeter"), "{body}");
    // A principal's open sessions are bounded.
    let mut refused = 0;
    for _ in 0..40 {
        let (status, _, _) = mcp_post(&http, server.port, "bob-token", None, initialize()).await;
        assert!(status == 200 || status == 503, "{status}");
        refused += usize::from(status == 503);
    }
    assert_eq!(refused, 40 - 32, "bob may open 32 sessions");
    // ... without touching alice's.
    assert_eq!(mcp_post(&http, server.port, "alice-token", None, initialize()).await.0, 200);
}

#[test]
fn regression_the_open_api_obeyed_other_hosts_and_origins() {
    // DNS rebinding (a foreign name in Host) and cross-site requests (a foreign Origin)
    // reached the token-less API as its admin: a web page could approve gated calls.
    let d = Deployment::new("");
    let server = Server::start(&d);
    let send = |host: &str, origin: Option<&str>| -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        let origin = origin.map(|o| format!("Origin: {o}\r\n")).unwrap_or_default();
        let body = r#"{"decision":"approve"}"#;
        write!(s, "POST /v1/approvals/apr_x HTTP/1.1\r\nHost: {host}\r\n{origin}Content-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    assert!(send("attacker.example:80", None).starts_with("HTTP/1.1 403"), "rebinding");
    assert!(send("127.0.0.1", Some("http://attacker.example")).starts_with("HTTP/1.1 403"), "cross-site");
    // The machine's own clients still get through (here: to a missing approval).
    assert!(send(&format!("127.0.0.1:{}", server.port), None).starts_with("HTTP/1.1 404"));
    assert!(send("localhost", Some("http://localhost:3000")).starts_with("HTTP/1.1 404"));
}
