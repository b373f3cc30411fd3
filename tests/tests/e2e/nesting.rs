//! Nested subagents (issue 20): a Claude subagent starts another with the `Agent` tool,
//! through `warden serve`, the real claude plugin and one scripted model per agent (the
//! offline stand-in for an LLM). Covers the depth cap, the tool intersection, the chain
//! named in approvals and records, and cancel reaching every level.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::*;

/// A deployment with the claude plugin, `agents` (name, frontmatter lines after `name`,
/// `description` and `model`, script) each on a scripted provider of its own, and the
/// given `subagents.max_depth` and approval policy.
fn nesting_deployment(max_depth: u32, approval: &str, agents: &[(&str, &str, &str)]) -> Deployment {
    let mut providers = String::new();
    for (name, _, _) in agents {
        providers.push_str(&format!("    {name}: {{ type: scripted, script: ./{name}.yaml }}\n"));
    }
    let d = Deployment::new(&format!(
        "  grants:\n    claude: {{ resources: true, log: true, model: true, state: true, events: true, tools: true }}\n\
         subagents:\n  agent_dirs: [./agents]\n  max_depth: {max_depth}\n\
         models:\n  default: {}/scripted\n  providers:\n{providers}\
         sandbox:\n  scope: e2e{}\nstore:\n  path: ./state/tasks.db\n{approval}",
        agents[0].0,
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    ));
    std::fs::copy(bundled_plugin("claude"), d.dir.path().join("plugins/claude.wasm")).unwrap();
    std::fs::create_dir_all(d.dir.path().join("agents")).unwrap();
    for (name, frontmatter, script) in agents {
        std::fs::write(
            d.dir.path().join(format!("agents/{name}.md")),
            format!("---\nname: {name}\ndescription: The {name}\nmodel: {name}/scripted\n{frontmatter}---\nYou are the {name}.\n"),
        )
        .unwrap();
        std::fs::write(d.dir.path().join(format!("{name}.yaml")), script).unwrap();
    }
    d
}

/// Starts the `boss` subagent in the background; its task id.
fn start_boss(port: u16) -> String {
    let (status, started) = json_of(
        port,
        "POST",
        "/v1/tasks",
        Some(&json!({ "description": "boss", "prompt": "go", "subagent_type": "boss", "run_in_background": true })),
    );
    assert_eq!(status, 202, "{started}");
    started["task_id"].as_str().unwrap().to_owned()
}

/// The first pending approval once it is one `wanted` accepts (within 60 s).
fn first_approval(port: u16, wanted: impl Fn(&Value) -> bool) -> Value {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, list) = json_of(port, "GET", "/v1/approvals", None);
        if let Some(p) = list["approvals"].as_array().and_then(|a| a.first())
            && wanted(p)
        {
            return p.clone();
        }
        assert!(Instant::now() < until, "no such approval request within 60 s: {list} {:?}", tasks_by_type(port));
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every task of the default user, by subagent type (one each in these tests).
fn tasks_by_type(port: u16) -> std::collections::HashMap<String, Value> {
    let (status, list) = json_of(port, "GET", "/v1/tasks", None);
    assert_eq!(status, 200, "{list}");
    list["tasks"]
        .as_array()
        .unwrap_or_else(|| panic!("no task list: {list}"))
        .iter()
        .map(|t| (t["subagent_type"].as_str().unwrap().to_owned(), t.clone()))
        .collect()
}

/// planner → coder → tester with `subagents.max_depth: 3`: the planner may start only the
/// coder (`Agent(coder)`: its call for the tester is refused by the host); each level gets only the tools
/// every level above it has (the tester lists Bash and Read, but the planner has no Bash;
/// the coder lists Write, which the planner lacks), the tester at the cap is not offered
/// `Agent`, each answer travels back up as the Agent call's result, and each child's record
/// names its parent.
#[test]
fn a_chain_of_three_respects_the_depth_cap_and_the_tool_intersection() {
    let planner = r#"
- tool_calls: [{ name: Agent, arguments: { description: "skip a level", prompt: "test it", subagent_type: tester } }]
- expect: { last_tool_result_contains: "\"tester\" is not among those this subagent may start" }
  tool_calls: [{ name: Agent, arguments: { description: "write the code", prompt: "please code", subagent_type: coder } }]
- expect: { last_tool_result_contains: "coder reports: tester reports: capped" }
  text: "planner: all done"
"#;
    let coder = r#"
- expect: { last_user_contains: "please code" }
  tool_calls: [{ name: Write, arguments: { file_path: "x.txt", content: "x" } }]
- expect: { last_tool_result_contains: "available tools: Read, Agent)" }
  tool_calls: [{ name: Agent, arguments: { description: "test it", prompt: "please test", subagent_type: tester } }]
- expect: { last_tool_result_contains: "tester reports: capped" }
  text: "coder reports: tester reports: capped"
"#;
    let tester = r#"
- expect: { last_user_contains: "please test" }
  tool_calls: [{ name: Agent, arguments: { description: "deeper", prompt: "go", subagent_type: planner } }]
- expect: { last_tool_result_contains: "available tools: Read)" }
  tool_calls: [{ name: Bash, arguments: { command: "id" } }]
- expect: { last_tool_result_contains: "available tools: Read)" }
  text: "tester reports: capped"
"#;
    let d = nesting_deployment(
        3,
        "approval:\n  default: deny\n  allow: [Read, Write, Bash, Agent]\n",
        &[
            ("planner", "tools: Read, Agent(coder)\n", planner),
            ("coder", "tools: Read, Write, Bash, Agent(tester)\n", coder),
            ("tester", "tools: Read, Bash, Agent(planner)\n", tester),
        ],
    );
    let server = Server::start(&d);
    let port = server.port;
    let (status, done) = json_of(
        port,
        "POST",
        "/v1/tasks",
        Some(&json!({ "description": "plan", "prompt": "make it", "subagent_type": "planner", "session_id": "nest1" })),
    );
    assert_eq!(
        (status, done["status"].as_str(), done["output"].as_str()),
        (200, Some("completed"), Some("planner: all done")),
        "{done}"
    );
    let tasks = tasks_by_type(port);
    assert_eq!(tasks.len(), 3, "one task per level, the refused call started none: {tasks:?}");
    let id = |t: &str| tasks[t]["task_id"].as_str().unwrap().to_owned();
    assert_eq!(tasks["planner"]["parent_task_id"], Value::Null, "{tasks:?}");
    assert_eq!(tasks["coder"]["parent_task_id"].as_str(), Some(id("planner").as_str()), "{tasks:?}");
    assert_eq!(tasks["tester"]["parent_task_id"].as_str(), Some(id("coder").as_str()), "{tasks:?}");
    for t in ["coder", "tester"] {
        assert_eq!(tasks[t]["status"], "completed", "{t}: {}", tasks[t]);
        assert_eq!(tasks[t]["session_id"], "nest1", "a child works in its parent's session: {}", tasks[t]);
    }
    // The parent's stream names the child it started.
    let (_, events) = http(port, "GET", &format!("/v1/tasks/{}/events", id("planner")), None);
    assert!(events.contains("\"type\":\"subagent\"") && events.contains(&id("coder")), "{events}");
}

/// With the default `subagents.max_depth` (1) nobody nests: a file listing `Agent` is not
/// offered the tool, so the planner's Agent call is answered as a tool it does not have,
/// and no child task exists.
#[test]
fn without_max_depth_an_agent_entry_starts_nothing() {
    let planner = r#"
- tool_calls: [{ name: Agent, arguments: { description: "d", prompt: "p", subagent_type: coder } }]
- expect: { last_tool_result_contains: "is not available to this subagent (available tools: Read)" }
  text: "alone"
"#;
    let d = nesting_deployment(
        1,
        "approval:\n  default: deny\n  allow: [Read, Agent]\n",
        &[("planner", "tools: Read, Agent\n", planner), ("coder", "tools: Read\n", "- text: never\n")],
    );
    let server = Server::start(&d);
    let (status, done) = json_of(
        server.port,
        "POST",
        "/v1/tasks",
        Some(&json!({ "description": "plan", "prompt": "go", "subagent_type": "planner" })),
    );
    assert_eq!((status, done["output"].as_str()), (200, Some("alone")), "{done}");
    assert!(!tasks_by_type(server.port).contains_key("coder"));
}

/// boss → mid → leaf; the leaf's Bash call asks a person: the pending approval names the
/// whole chain (root first, with task ids). Canceling the root ends all three `canceled`
/// and withdraws the request.
#[test]
fn approvals_name_the_chain_and_cancel_reaches_every_level() {
    let agent_call = |to: &str| {
        format!(
            "- tool_calls: [{{ name: Agent, arguments: {{ description: \"delegate\", prompt: \"go on\", subagent_type: {to} }} }}]\n- text: \"never\"\n"
        )
    };
    let leaf = "- tool_calls: [{ name: Bash, arguments: { command: \"make deploy\" } }]\n- text: \"never\"\n";
    let d = nesting_deployment(
        3,
        "approval:\n  default: deny\n  allow: [Agent]\n  ask: [Bash]\n  timeout: 10m\n",
        &[
            ("boss", "tools: Bash, Agent(mid)\n", &agent_call("mid")),
            ("mid", "tools: Bash, Agent(leaf)\n", &agent_call("leaf")),
            ("leaf", "tools: Bash\n", leaf),
        ],
    );
    let server = Server::start(&d);
    let port = server.port;
    let root = start_boss(port);
    let pending = first_approval(port, |_| true);
    let tasks = tasks_by_type(port);
    assert_eq!((pending["tool"].as_str(), pending["subagent"].as_str()), (Some("Bash"), Some("leaf")), "{pending}");
    assert_eq!(
        pending["chain"],
        json!([
            { "task_id": root, "subagent": "boss" },
            { "task_id": tasks["mid"]["task_id"], "subagent": "mid" },
        ]),
        "{pending}"
    );
    assert_eq!(pending["task_id"], tasks["leaf"]["task_id"]);

    let (status, canceled) = json_of(port, "POST", &format!("/v1/tasks/{root}/cancel"), None);
    assert_eq!(status, 200, "{canceled}");
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let tasks = tasks_by_type(port);
        let states: Vec<(&str, &str)> =
            ["boss", "mid", "leaf"].iter().map(|t| (*t, tasks[*t]["status"].as_str().unwrap_or("?"))).collect();
        if states.iter().all(|(_, s)| *s == "canceled") {
            break;
        }
        assert!(Instant::now() < until, "not every level ended canceled: {states:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, list) = json_of(port, "GET", "/v1/approvals", None);
    assert_eq!(list["approvals"], json!([]), "the leaf's request is withdrawn");
}

/// Regression: an A2A client's bare `approve` (no `request_id`) answers a task only when
/// the task has asked one question in all, so it never approves a question the client was
/// not shown — but only the root task's own questions were counted. A nested subagent's
/// first question was declined elsewhere (the HTTP API, or its timeout), it asked a second
/// one, and a late bare `approve` over A2A approved that second one unseen. Now questions
/// are counted over the whole chain, and the bare answer is refused.
#[test]
fn regression_a_bare_a2a_answer_never_approves_a_nested_question_it_was_not_shown() {
    let boss = "- tool_calls: [{ name: Agent, arguments: { description: \"delegate\", prompt: \"go on\", subagent_type: leaf } }]\n- text: \"done\"\n";
    let leaf = "- tool_calls: [{ name: Bash, arguments: { command: \"make first\" } }]\n\
                - tool_calls: [{ name: Bash, arguments: { command: \"make second\" } }]\n- text: \"never\"\n";
    let d = nesting_deployment(
        2,
        "approval:\n  default: deny\n  allow: [Agent]\n  ask: [Bash]\n  timeout: 10m\n",
        &[("boss", "tools: Bash, Agent(leaf)\n", boss), ("leaf", "tools: Bash\n", leaf)],
    );
    let server = Server::start(&d);
    let port = server.port;
    let root = start_boss(port);
    let pending_command =
        |command: &str| first_approval(port, |p| p["input"]["command"] == command)["id"].as_str().unwrap().to_owned();
    // The first question, declined over the HTTP API.
    let first = pending_command("make first");
    let (status, decided) =
        json_of(port, "POST", &format!("/v1/approvals/{first}"), Some(&json!({ "decision": "decline" })));
    assert_eq!(status, 200, "{decided}");
    let second = pending_command("make second");
    // A late bare answer over A2A, for the root task.
    let send = json!({ "jsonrpc": "2.0", "id": 1, "method": "message/send", "params": { "message": {
        "role": "user", "messageId": "m-late", "taskId": root, "parts": [{ "kind": "text", "text": "approve" }] } } });
    let (status, reply) = json_of(port, "POST", "/a2a/boss", Some(&send));
    assert_eq!(status, 200, "{reply}");
    let message = reply["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("more than one question"), "a bare answer was taken: {reply}");
    let (_, list) = json_of(port, "GET", "/v1/approvals", None);
    assert_eq!(list["approvals"][0]["id"], second.as_str(), "the unseen question is still pending: {list}");
    let (status, _) = json_of(port, "POST", &format!("/v1/tasks/{root}/cancel"), None);
    assert_eq!(status, 200);
}
