//! The agent loop against a scripted host.

use serde_json::json;

use super::fake::{FakeHost, call, spec, text, tool_calls};
use crate::agent::parse_agent;
use warden_guest::{Error, Message, ToolResult};

use crate::runner::{AgentInput, INTERRUPTED_CALL, TaskInput, Transcript, run, transcript_key};

const AGENT_URI: &str = "/agents/.claude/agents/helper.md";

fn agent_from(frontmatter: &str, body: &str) -> AgentInput {
    let file = format!("---\nname: helper\ndescription: Helps\n{frontmatter}---\n{body}\n");
    let parsed = parse_agent(AGENT_URI, file.as_bytes(), &[]).unwrap();
    AgentInput { name: parsed.name, uri: AGENT_URI.into(), protocol_data: parsed.protocol.to_json() }
}

fn helper() -> AgentInput {
    agent_from("", "You are a helpful subagent.")
}

fn task(id: &str, prompt: &str) -> TaskInput {
    TaskInput { task_id: id.into(), prompt: prompt.into(), model: None, resume: None, session_id: "s1".into() }
}

fn transcript(host: &FakeHost, id: &str) -> Transcript {
    serde_json::from_slice(&host.state[&transcript_key(id)]).unwrap()
}

#[test]
fn text_only_answer_applies_the_system_prompt_and_prompt() {
    let mut host = FakeHost::new(vec![text("The answer is 42.")]);
    let out = run(&mut host, &task("t1", "What is the answer?"), &helper()).unwrap();
    assert_eq!(out, "The answer is 42.");
    assert_eq!(host.requests.len(), 1);
    let request = &host.requests[0];
    assert_eq!(
        request.messages,
        vec![Message::new("system", "You are a helpful subagent."), Message::new("user", "What is the answer?")]
    );
    assert_eq!(request.model, "");
    assert_eq!(host.events, vec![("progress".to_string(), json!({"message": "turn 1"}).to_string())]);
    let t = transcript(&host, "t1");
    assert_eq!((t.status.as_str(), t.turns, t.messages.len(), t.agent.as_str()), ("completed", 1, 3, "helper"));
}

#[test]
fn one_tool_use_round_trips_results_to_the_model() {
    let mut host = FakeHost::new(vec![
        tool_calls("Reading.", vec![call("c1", "Read", r#"{"file_path":"a.txt"}"#)]),
        text("a.txt says hello"),
    ]);
    host.tool_fn = Box::new(|c| ToolResult { id: c.id.clone(), content: "hello".into(), is_error: false });
    let out = run(&mut host, &task("t1", "read a.txt"), &helper()).unwrap();
    assert_eq!(out, "a.txt says hello");
    assert_eq!(host.batches, vec![vec![call("c1", "Read", r#"{"file_path":"a.txt"}"#)]]);
    let second = &host.requests[1].messages;
    assert_eq!(second.len(), 4);
    assert_eq!(second[2].role, "assistant");
    assert_eq!(second[2].tool_calls, vec![call("c1", "Read", r#"{"file_path":"a.txt"}"#)]);
    assert_eq!(second[3].role, "tool");
    assert_eq!(second[3].tool_call_id.as_deref(), Some("c1"));
    assert_eq!(second[3].content, "hello");
    assert_eq!(host.events.len(), 2);
    assert!(host.events[1].1.contains("turn 2"));
}

#[test]
fn several_steps_and_batches_keep_call_order_and_isolate_history() {
    let mut host = FakeHost::new(vec![
        tool_calls("", vec![call("a", "Glob", "{}"), call("b", "Grep", "{}")]),
        tool_calls("", vec![call("c", "Bash", r#"{"command":"ls"}"#)]),
        tool_calls("", vec![call("d", "Write", "{}")]),
        text("done: wrote the file"),
    ]);
    let out = run(&mut host, &task("t1", "do it"), &helper()).unwrap();
    assert_eq!(out, "done: wrote the file", "the parent sees only the final text");
    assert_eq!(host.batches.len(), 3);
    assert_eq!(host.batches[0].iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    let last = &host.requests[3].messages;
    let ids: Vec<_> = last.iter().filter_map(|m| m.tool_call_id.as_deref()).collect();
    assert_eq!(ids, ["a", "b", "c", "d"]);
    let t = transcript(&host, "t1");
    assert_eq!((t.turns, t.messages.len()), (4, 2 + 3 * 2 + 1 + 1));
}

#[test]
fn max_turns_exceeded_returns_an_error_text() {
    let looping = || tool_calls("again", vec![call("x", "Read", "{}")]);
    let mut host = FakeHost::new(vec![looping(), looping(), looping(), looping()]);
    let out = run(&mut host, &task("t1", "loop"), &agent_from("maxTurns: 3\n", "body")).unwrap();
    assert_eq!(out, "error: subagent stopped after 3 turns without a final answer");
    assert_eq!(host.requests.len(), 3);
    assert_eq!(host.batches.len(), 2, "tool calls of the last turn are not run");
    let t = transcript(&host, "t1");
    assert_eq!((t.status.as_str(), t.turns), ("max_turns", 3));
    let last = t.messages.last().unwrap();
    assert_eq!(last.role, "tool");
    assert!(last.content.contains("turn limit"));
}

#[test]
fn default_max_turns_is_ten() {
    let script = (0..20).map(|_| tool_calls("", vec![call("x", "Read", "{}")])).collect();
    let mut host = FakeHost::new(script);
    let out = run(&mut host, &task("t1", "loop"), &helper()).unwrap();
    assert_eq!(out, "error: subagent stopped after 10 turns without a final answer");
    assert_eq!(host.requests.len(), 10);
}

#[test]
fn missing_prompt_is_invalid_input() {
    let mut host = FakeHost::new(vec![text("never")]);
    for prompt in ["", "  \n"] {
        let err = run(&mut host, &task("t1", prompt), &helper()).unwrap_err();
        assert!(matches!(&err, Error::InvalidInput(m) if m.contains("prompt")), "{err}");
    }
    assert!(host.requests.is_empty());
}

#[test]
fn provider_error_fails_the_task() {
    let mut host = FakeHost::new(vec![
        tool_calls("", vec![call("a", "Read", "{}")]),
        Err(Error::Remote("HTTP 500 from provider".into())),
    ]);
    let err = run(&mut host, &task("t1", "go"), &helper()).unwrap_err();
    match err {
        Error::Remote(m) => {
            assert!(m.contains("HTTP 500 from provider") && m.contains("turn 2"), "{m}");
        }
        other => panic!("expected remote, got {other}"),
    }
    let mut host = FakeHost::new(vec![Err(Error::Timeout("deadline".into()))]);
    assert!(matches!(run(&mut host, &task("t1", "go"), &helper()), Err(Error::Timeout(_))));
}

#[test]
fn unknown_and_filtered_tools_get_error_results_without_reaching_the_host() {
    let mut host = FakeHost::new(vec![
        tool_calls(
            "",
            vec![
                call("a", "WebFetch", "{}"),
                call("b", "Read", "{}"),
                call("c", "Bash", "{}"),
                call("d", "Task", "{}"),
            ],
        ),
        text("ok"),
    ]);
    let agent = agent_from("disallowedTools: Bash\n", "body");
    assert_eq!(run(&mut host, &task("t1", "go"), &agent).unwrap(), "ok");
    assert_eq!(host.batches, vec![vec![call("b", "Read", "{}")]]);
    let messages = &host.requests[1].messages;
    let results: Vec<_> = messages.iter().filter(|m| m.role == "tool").collect();
    assert_eq!(results.len(), 4);
    assert_eq!(results.iter().map(|m| m.tool_call_id.as_deref().unwrap()).collect::<Vec<_>>(), ["a", "b", "c", "d"]);
    for (i, name) in [(0, "WebFetch"), (2, "Bash"), (3, "Task")] {
        assert!(results[i].content.starts_with("error:") && results[i].content.contains(name), "{:?}", results[i]);
    }
    assert_eq!(results[1].content, "Read ok");
    assert!(host.warnings().iter().any(|w| w.contains("WebFetch")));
}

#[test]
fn declined_calls_reach_the_model_as_error_results() {
    let mut host = FakeHost::new(vec![tool_calls("", vec![call("a", "Bash", "{}")]), text("it was declined")]);
    host.tool_fn =
        Box::new(|c| ToolResult { id: c.id.clone(), content: "declined by the operator".into(), is_error: true });
    assert_eq!(run(&mut host, &task("t1", "go"), &helper()).unwrap(), "it was declined");
    let result = host.requests[1].messages.last().unwrap();
    assert_eq!(result.content, "error: declined by the operator");
}

#[test]
fn tools_and_disallowed_tools_filter_what_the_model_sees() {
    let mut host = FakeHost::new(vec![text("a")]);
    run(&mut host, &task("t1", "go"), &helper()).unwrap();
    assert_eq!(host.tool_names_offered(0), ["Read", "Write", "Edit", "Glob", "Grep", "Bash"]);

    let mut host = FakeHost::new(vec![text("a")]);
    let agent = agent_from("tools: Read, Grep, Bash, Task, WebSearch\ndisallowedTools: [Bash]\n", "body");
    run(&mut host, &task("t1", "go"), &agent).unwrap();
    assert_eq!(host.tool_names_offered(0), ["Read", "Grep"]);
    let warnings = host.warnings();
    assert!(warnings.iter().any(|w| w.contains("WebSearch")), "{warnings:?}");
    assert!(warnings.iter().any(|w| w.contains("`Task` ignored") && w.contains("subagents.max_depth")), "{warnings:?}");

    let mut host = FakeHost::new(vec![text("a")]);
    run(&mut host, &task("t1", "go"), &agent_from("tools: []\n", "body")).unwrap();
    assert!(host.requests[0].tools.is_empty());
    assert_eq!(host.list_calls, 0, "no tools: the session's list is not even asked for");
}

#[test]
fn tools_capability_denied_means_no_tools_not_failure() {
    let mut host = FakeHost::new(vec![text("text only")]);
    host.tools = Err(Error::Denied("tools not granted".into()));
    assert_eq!(run(&mut host, &task("t1", "go"), &helper()).unwrap(), "text only");
    assert!(host.requests[0].tools.is_empty());
    assert!(host.warnings().iter().any(|w| w.contains("tools not granted")));

    let mut host = FakeHost::new(vec![text("never")]);
    host.tools = Err(Error::Internal("sandbox exploded".into()));
    assert!(matches!(run(&mut host, &task("t1", "go"), &helper()), Err(Error::Internal(_))));
}

#[test]
fn model_override_then_frontmatter_then_default() {
    let with_model = agent_from("model: haiku\n", "body");
    let mut host = FakeHost::new(vec![text("a"), text("b"), text("c")]);
    let mut t = task("t1", "go");
    t.model = Some("opus".into());
    run(&mut host, &t, &with_model).unwrap();
    run(&mut host, &task("t2", "go"), &with_model).unwrap();
    run(&mut host, &task("t3", "go"), &helper()).unwrap();
    let models: Vec<_> = host.requests.iter().map(|r| r.model.as_str()).collect();
    assert_eq!(models, ["opus", "haiku", ""]);

    let mut host = FakeHost::new(vec![text("a")]);
    let mut t = task("t4", "go");
    t.model = Some("  ".into());
    run(&mut host, &t, &agent_from("model: inherit\n", "body")).unwrap();
    assert_eq!(host.requests[0].model, "inherit", "aliases go to the host unresolved");
}

#[test]
fn resume_continues_a_stored_transcript() {
    let mut host =
        FakeHost::new(vec![tool_calls("", vec![call("a", "Read", "{}")]), text("first answer"), text("second answer")]);
    assert_eq!(run(&mut host, &task("t1", "first question"), &helper()).unwrap(), "first answer");
    let mut again = task("t2", "follow-up question");
    again.resume = Some("t1".into());
    assert_eq!(run(&mut host, &again, &helper()).unwrap(), "second answer");

    let messages = &host.requests[2].messages;
    let contents: Vec<_> = messages.iter().map(|m| (m.role.as_str(), m.content.as_str())).collect();
    assert_eq!(
        contents,
        [
            ("system", "You are a helpful subagent."),
            ("user", "first question"),
            ("assistant", ""),
            ("tool", "Read ok"),
            ("assistant", "first answer"),
            ("user", "follow-up question"),
        ]
    );
    let t2 = transcript(&host, "t2");
    assert_eq!(t2.resumed_from.as_deref(), Some("t1"));
    assert_eq!(t2.messages.len(), 7);
    assert_eq!(transcript(&host, "t1").messages.len(), 5, "the earlier transcript is left as it was");

    let mut missing = task("t3", "more");
    missing.resume = Some("nope".into());
    assert!(matches!(run(&mut host, &missing, &helper()), Err(Error::NotFound(m)) if m.contains("nope")));

    let mut other = task("t4", "more");
    other.resume = Some("t1".into());
    let other_agent = AgentInput { name: "someone-else".into(), ..helper() };
    assert!(matches!(run(&mut host, &other, &other_agent), Err(Error::InvalidInput(_))));
}

/// A task that dies while its tool calls run (here the batch fails; in life the host is
/// killed or the task canceled) has its transcript stored with the calls it asked for; a
/// resumed task gets them answered as interrupted and goes on from there.
#[test]
fn a_task_that_died_during_its_tool_calls_resumes_with_them_answered() {
    let mut host = FakeHost::new(vec![
        tool_calls("Sleeping.", vec![call("c1", "Bash", r#"{"command":"sleep 600"}"#), call("c2", "Glob", "{}")]),
        text("picked up again"),
    ]);
    host.tools_fail = Some(Error::Unavailable("the host went away".into()));
    assert!(run(&mut host, &task("t1", "wait for it"), &helper()).is_err());
    let stored = transcript(&host, "t1");
    assert_eq!((stored.status.as_str(), stored.turns), ("running", 1));
    assert_eq!(stored.messages.last().unwrap().tool_calls.len(), 2, "the calls of the interrupted turn are kept");

    host.tools_fail = None;
    let resumed = TaskInput { resume: Some("t1".into()), ..task("t2", "carry on") };
    assert_eq!(run(&mut host, &resumed, &helper()).unwrap(), "picked up again");
    let messages = &host.requests[1].messages;
    let tail: Vec<_> = messages[2..].iter().map(|m| (m.role.as_str(), m.tool_call_id.as_deref())).collect();
    assert_eq!(tail, [("assistant", None), ("tool", Some("c1")), ("tool", Some("c2")), ("user", None)]);
    assert_eq!(messages[3].content, INTERRUPTED_CALL);
    assert_eq!(messages[5].content, "carry on");
    assert_eq!(host.batches.len(), 1, "the interrupted calls are not run again by themselves");
}

#[test]
fn state_failures_do_not_fail_the_task() {
    let mut host = FakeHost::new(vec![text("fine")]);
    host.state_fails = true;
    assert_eq!(run(&mut host, &task("t1", "go"), &helper()).unwrap(), "fine");
    assert!(host.warnings().iter().any(|w| w.contains("transcript not stored")));
}

#[test]
fn skills_are_preloaded_and_missing_ones_warn() {
    let mut host = FakeHost::new(vec![text("ok")]);
    host.resources.insert(
        "/agents/.claude/skills/style/SKILL.md".into(),
        b"---\nname: style\ndescription: House style\n---\nUse tabs.\n".to_vec(),
    );
    let agent = agent_from("skills: style, missing, ../escape\n", "Body.");
    run(&mut host, &task("t1", "go"), &agent).unwrap();
    assert_eq!(host.requests[0].messages[0].content, "Body.\n\n# Skill: style\n\nUse tabs.");
    assert_eq!(
        host.resource_reads,
        ["/agents/.claude/skills/style/SKILL.md", "/agents/.claude/skills/missing/SKILL.md"]
    );
    let warnings = host.warnings();
    assert!(warnings.iter().any(|w| w.contains("skill `missing`")), "{warnings:?}");
    assert!(warnings.iter().any(|w| w.contains("../escape")), "{warnings:?}");
}

#[test]
fn bad_protocol_data_is_invalid_input_and_empty_ids_are_filled() {
    let mut host = FakeHost::new(vec![text("x")]);
    let bad = AgentInput { protocol_data: "not json".into(), ..helper() };
    assert!(matches!(run(&mut host, &task("t1", "go"), &bad), Err(Error::InvalidInput(_))));

    // `{}` protocol data (a definition made by someone else) still runs.
    let mut host = FakeHost::new(vec![tool_calls("", vec![call("", "Read", "{}")]), text("y")]);
    let bare = AgentInput { name: "bare".into(), uri: String::new(), protocol_data: "{}".into() };
    assert_eq!(run(&mut host, &task("t1", "go"), &bare).unwrap(), "y");
    assert_eq!(host.requests[0].messages.len(), 1, "no system message without a body");
    assert_eq!(host.batches[0][0].id, "call_1_0");
    assert_eq!(host.requests[1].messages[2].tool_call_id.as_deref(), Some("call_1_0"));
}

#[test]
fn an_agent_without_session_tools_of_its_list_is_told_so() {
    let mut host = FakeHost::new(vec![tool_calls("", vec![call("a", "Read", "{}")]), text("z")]);
    host.tools = Ok(vec![spec("Grep")]);
    run(&mut host, &task("t1", "go"), &agent_from("tools: Read\n", "b")).unwrap();
    assert!(host.batches.is_empty());
    let result = host.requests[1].messages.last().unwrap();
    assert!(result.content.contains("available tools: none"), "{}", result.content);
}

#[test]
fn initial_prompt_goes_before_a_fresh_prompt_but_not_a_resumed_one() {
    let agent = agent_from("initialPrompt: Read CONTRIBUTING.md first.\n", "You help.");
    let mut host = FakeHost::new(vec![text("first"), text("second")]);
    run(&mut host, &task("t1", "fix the bug"), &agent).unwrap();
    assert_eq!(host.requests[0].messages[1], Message::new("user", "Read CONTRIBUTING.md first.\n\nfix the bug"));
    let resumed = TaskInput { resume: Some("t1".into()), ..task("t2", "and the test") };
    run(&mut host, &resumed, &agent).unwrap();
    let users: Vec<&str> =
        host.requests[1].messages.iter().filter(|m| m.role == "user").map(|m| m.content.as_str()).collect();
    assert_eq!(users, ["Read CONTRIBUTING.md first.\n\nfix the bug", "and the test"]);
}

#[test]
fn memory_md_starts_a_fresh_task_s_system_prompt_read_through_the_read_tool() {
    let agent = agent_from("memory: project\ntools: Glob\n", "You review.");
    let mut host = FakeHost::new(vec![text("done"), text("again")]);
    host.tool_fn = Box::new(|c| ToolResult {
        id: c.id.clone(),
        content: "     1\t# Notes\n     2\t- tabs\tstay inside lines\n".into(),
        is_error: false,
    });
    run(&mut host, &task("t1", "review"), &agent).unwrap();
    // One Read of MEMORY.md, the first 200 lines, before the first model call.
    assert_eq!(host.batches.len(), 1);
    let read = &host.batches[0][0];
    assert_eq!((read.id.as_str(), read.name.as_str()), ("memory_read", "Read"));
    let args: serde_json::Value = serde_json::from_str(&read.arguments).unwrap();
    assert_eq!(args, json!({"file_path": "/workspace/.claude/agent-memory/helper/MEMORY.md", "limit": 200}));
    let system = &host.requests[0].messages[0];
    assert_eq!(system.role, "system");
    assert!(system.content.starts_with("You review.\n\n# Persistent agent memory\n\n"), "{}", system.content);
    assert!(system.content.contains("`/workspace/.claude/agent-memory/helper/` (project scope)"), "{}", system.content);
    assert!(system.content.ends_with("## MEMORY.md\n\n# Notes\n- tabs\tstay inside lines"), "{}", system.content);
    // The memory tools were added to the agent's list, so it can keep its notes.
    assert_eq!(host.tool_names_offered(0), ["Read", "Write", "Edit", "Glob"]);
    // A resumed task keeps its transcript's system prompt: no second read.
    let resumed = TaskInput { resume: Some("t1".into()), ..task("t2", "more") };
    run(&mut host, &resumed, &agent).unwrap();
    assert_eq!(host.batches.len(), 1);
}

#[test]
fn missing_or_unreadable_memory_is_said_in_the_prompt() {
    let agent = agent_from("memory: user\n", "You help.");
    let mut host = FakeHost::new(vec![text("ok")]);
    host.tool_fn = Box::new(|c| ToolResult {
        id: c.id.clone(),
        content: "File does not exist: /workspace/.claude/agent-memory-user/helper/MEMORY.md".into(),
        is_error: true,
    });
    run(&mut host, &task("t1", "go"), &agent).unwrap();
    assert!(
        host.requests[0].messages[0]
            .content
            .ends_with("(empty: MEMORY.md does not exist yet; create it when you learn something worth keeping)")
    );
    // Without a Read tool in the session nothing is called and the agent is told why.
    let mut host = FakeHost::new(vec![text("ok")]);
    host.tools = Ok(vec![spec("Glob")]);
    run(&mut host, &task("t1", "go"), &agent).unwrap();
    assert!(host.batches.is_empty());
    assert!(host.requests[0].messages[0].content.contains("this subagent has no Read tool"));
}

/// Issue 20: PreToolUse hooks run (as Bash calls through the host) before the batch and can
/// only take calls out of it; PostToolUse hooks add their reason to a result.
#[test]
fn hooks_run_as_bash_calls_and_only_narrow() {
    let agent = agent_from(
        "tools: Read, Write\nhooks:\n  PreToolUse:\n    - matcher: Write\n      hooks: [{ type: command, command: ./guard.sh }]\n  PostToolUse:\n    - matcher: Read\n      hooks: [{ command: ./note.sh }]\n",
        "You help.",
    );
    let mut host = FakeHost::new(vec![
        tool_calls(
            "",
            vec![
                call("w1", "Write", r#"{"file_path":"/etc/x","content":"y"}"#),
                call("r1", "Read", r#"{"file_path":"a"}"#),
            ],
        ),
        text("done"),
    ]);
    host.tool_fn = Box::new(|c| {
        let content = match c.name.as_str() {
            "Bash" if c.arguments.contains("guard.sh") => {
                assert!(c.arguments.contains(r#"\"tool_name\":\"Write\""#), "{}", c.arguments);
                "[stderr]\nwrites outside the workspace are not allowed\n[exit code: 2]".to_string()
            }
            "Bash" => r#"{"decision": "block", "reason": "a is stale"}"#.to_string(),
            other => format!("{other} ok"),
        };
        ToolResult { id: c.id.clone(), is_error: content.contains("[exit code"), content }
    });
    assert_eq!(run(&mut host, &task("t1", "go"), &agent).unwrap(), "done");
    let batches: Vec<Vec<&str>> = host.batches.iter().map(|b| b.iter().map(|c| c.name.as_str()).collect()).collect();
    // The guard for Write, then the batch without the blocked Write, then Read's PostToolUse hook.
    assert_eq!(batches, [vec!["Bash"], vec!["Read"], vec!["Bash"]]);
    let results: Vec<&str> =
        host.requests[1].messages.iter().filter(|m| m.role == "tool").map(|m| m.content.as_str()).collect();
    assert_eq!(
        results,
        [
            "error: blocked by a PreToolUse hook: writes outside the workspace are not allowed",
            "Read ok\n[PostToolUse hook: a is stale]"
        ]
    );
    // The model is never offered the hooks' Bash.
    assert_eq!(host.tool_names_offered(0), ["Read", "Write"]);
}

/// Regression: a parent's `PreToolUse` hooks did not apply to the subagents it started, so
/// delegating a forbidden call to a child (`Agent`) ran it unchecked. An agent with hooks is
/// not offered the nesting tool; the same agent without hooks is.
#[test]
fn regression_an_agent_with_hooks_could_delegate_past_them() {
    let hooked = agent_from(
        "tools: Bash, Agent(helper)\nhooks:\n  PreToolUse:\n    - matcher: Bash\n      hooks: [{ command: ./guard.sh }]\n",
        "You help.",
    );
    let plain = agent_from("tools: Bash, Agent(helper)\n", "You help.");
    for (agent, offered) in [(&hooked, vec!["Bash"]), (&plain, vec!["Bash", "Agent"])] {
        let mut host = FakeHost::new(vec![text("done")]);
        host.tools = Ok(vec![spec("Bash"), spec("Agent"), spec("Read")]);
        assert_eq!(run(&mut host, &task("t1", "go"), agent).unwrap(), "done");
        assert_eq!(host.tool_names_offered(0), offered);
    }
}

/// A `PostToolUse` hook got the whole result in its Bash command: a result over ~1 MiB (or
/// less, once escaped) made the command too long for the host, the hook never ran and the
/// model read the result unchecked, with no word of it. The hook now gets the result cut
/// and is told so; a hook that still gives no verdict is said in the result.
#[test]
fn regression_a_post_tool_use_hook_did_not_run_on_a_large_result() {
    let agent = agent_from(
        "tools: Read\nhooks:\n  PostToolUse:\n    - matcher: Read\n      hooks: [{ command: ./scan.sh }]\n",
        "You help.",
    );
    // Quotes and backslashes take the most room once escaped for JSON and the shell.
    let big = "'\"\\é".repeat(400 * 1024);
    let mut host = FakeHost::new(vec![tool_calls("", vec![call("r1", "Read", r#"{"file_path":"a"}"#)]), text("done")]);
    let result = big.clone();
    host.tool_fn = Box::new(move |c| match c.name.as_str() {
        "Bash" => {
            assert!(c.arguments.contains("tool_response_truncated"), "the hook is told its input was cut");
            ToolResult {
                id: c.id.clone(),
                content: r#"{"decision": "block", "reason": "secret found"}"#.into(),
                is_error: false,
            }
        }
        _ => ToolResult { id: c.id.clone(), content: result.clone(), is_error: false },
    });
    assert_eq!(run(&mut host, &task("t1", "go"), &agent).unwrap(), "done");
    let names: Vec<Vec<&str>> = host.batches.iter().map(|b| b.iter().map(|c| c.name.as_str()).collect()).collect();
    assert_eq!(names, [vec!["Read"], vec!["Bash"]]);
    assert!(host.batches[1][0].arguments.len() <= super::fake::HOST_MAX_TOOL_ARGUMENT_BYTES);
    let read = host.requests[1].messages.iter().rfind(|m| m.role == "tool").unwrap();
    assert!(read.content.starts_with(&big) && read.content.ends_with("\n[PostToolUse hook: secret found]"));

    // A hook that gives no verdict after the call has run is said in the result.
    let mut host = FakeHost::new(vec![tool_calls("", vec![call("r1", "Read", r#"{"file_path":"a"}"#)]), text("done")]);
    host.tool_fn = Box::new(|c| match c.name.as_str() {
        "Bash" => {
            ToolResult { id: c.id.clone(), content: "declined: Bash is denied by the policy".into(), is_error: true }
        }
        _ => ToolResult { id: c.id.clone(), content: "file text".into(), is_error: false },
    });
    run(&mut host, &task("t1", "go"), &agent).unwrap();
    let read = host.requests[1].messages.iter().rfind(|m| m.role == "tool").unwrap();
    assert_eq!(
        read.content,
        "file text\n[PostToolUse hook `./scan.sh` gave no verdict, so this result was not checked by it: declined: Bash is denied by the policy]"
    );
}

#[test]
fn a_hook_that_asks_or_cannot_run_declines_the_call() {
    let agent =
        agent_from("tools: Write\nhooks:\n  PreToolUse:\n    - hooks: [{ command: ./guard.sh }]\n", "You help.");
    for (answer, is_error, says) in [
        (
            r#"{"hookSpecificOutput": {"permissionDecision": "ask", "permissionDecisionReason": "big file"}}"#,
            false,
            "big file (the hook asks for a person's confirmation",
        ),
        ("declined: Bash is denied by the policy", true, "the hook `./guard.sh` gave no verdict"),
        (r#"{"hookSpecificOutput": {"permissionDecision": "allow"}}"#, false, "Write ok"),
    ] {
        let mut host = FakeHost::new(vec![tool_calls("", vec![call("w1", "Write", "{}")]), text("done")]);
        host.tool_fn = Box::new(move |c| match c.name.as_str() {
            "Bash" => ToolResult { id: c.id.clone(), content: answer.into(), is_error },
            other => ToolResult { id: c.id.clone(), content: format!("{other} ok"), is_error: false },
        });
        run(&mut host, &task("t1", "go"), &agent).unwrap();
        let result = host.requests[1].messages.iter().rfind(|m| m.role == "tool").unwrap();
        assert!(result.content.contains(says), "{says}: {}", result.content);
    }
}

/// Issue 44: a `Stop` hook that blocks sends the agent back to work with its reason as
/// the next instruction (and `stop_hook_active: true` the next time); one that passes
/// lets it finish.
#[test]
fn a_stop_hook_that_blocks_sends_the_agent_back_to_work() {
    let agent = agent_from("tools: Read\nhooks:\n  Stop:\n    - hooks: [{ command: ./tests-pass.sh }]\n", "You help.");
    let mut host = FakeHost::new(vec![text("finished early"), text("finished for real")]);
    host.tool_fn = Box::new(|c| {
        assert_eq!(c.name, "Bash");
        let again = c.arguments.contains(r#"\"stop_hook_active\":true"#);
        let content = match again {
            false => {
                assert!(c.arguments.contains("finished early"), "the hook reads the answer: {}", c.arguments);
                "[stderr]\ntests still fail: run them again\n[exit code: 2]".to_string()
            }
            true => String::new(),
        };
        ToolResult { id: c.id.clone(), is_error: content.contains("[exit code"), content }
    });
    assert_eq!(run(&mut host, &task("t1", "go"), &agent).unwrap(), "finished for real");
    assert_eq!(host.batches.len(), 2, "the Stop hook ran at each final answer");
    let last = host.requests[1].messages.last().unwrap();
    assert_eq!((last.role.as_str(), last.content.as_str()), ("user", "[Stop hook] tests still fail: run them again"));
}

/// Issue 44: `SessionStart` and `UserPromptSubmit` hooks run before the first model call;
/// what they print goes before the prompt, and a `UserPromptSubmit` block ends the task
/// without a model call.
#[test]
fn session_start_and_user_prompt_submit_hooks_add_context_or_end_the_task() {
    let agent = agent_from(
        "tools: Read\nhooks:\n  SessionStart:\n    - matcher: startup\n      hooks: [{ command: ./branch.sh }]\n    - matcher: resume\n      hooks: [{ command: ./never.sh }]\n  UserPromptSubmit:\n    - hooks: [{ command: ./guard.sh }]\n",
        "You help.",
    );
    let mut host = FakeHost::new(vec![text("done")]);
    host.tool_fn = Box::new(|c| {
        assert!(!c.arguments.contains("never.sh"), "a `resume` matcher does not run on a fresh task");
        let content = match c.arguments.contains("branch.sh") {
            true => {
                r#"{"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": "On branch main."}}"#
            }
            false => "Ticket ABC-1 is open.",
        };
        ToolResult { id: c.id.clone(), content: content.into(), is_error: false }
    });
    assert_eq!(run(&mut host, &task("t1", "fix the bug"), &agent).unwrap(), "done");
    let prompt = host.requests[0].messages.iter().rfind(|m| m.role == "user").unwrap();
    assert_eq!(prompt.content, "On branch main.\n\nTicket ABC-1 is open.\n\nfix the bug");

    let mut host = FakeHost::new(vec![text("never asked")]);
    host.tool_fn = Box::new(|c| {
        let content = match c.arguments.contains("guard.sh") {
            true => {
                assert!(c.arguments.contains(r#"\"prompt\":\"rm everything\""#), "{}", c.arguments);
                r#"{"decision": "block", "reason": "destructive request"}"#
            }
            false => "",
        };
        ToolResult { id: c.id.clone(), content: content.into(), is_error: false }
    });
    let err = run(&mut host, &task("t1", "rm everything"), &agent).unwrap_err();
    assert!(
        matches!(&err, Error::Denied(m) if m.contains("blocked by a UserPromptSubmit hook: destructive request")),
        "{err:?}"
    );
    assert!(host.requests.is_empty(), "no model call after a blocked prompt");
}

/// Issue 44: `PostToolUseFailure` hooks run after a call that failed (with the failure as
/// `error`), `PostToolUse` hooks after one that succeeded.
#[test]
fn post_tool_use_failure_hooks_run_after_failed_calls_only() {
    let agent = agent_from(
        "tools: Read\nhooks:\n  PostToolUse:\n    - hooks: [{ command: ./ok.sh }]\n  PostToolUseFailure:\n    - matcher: Read\n      hooks: [{ command: ./why.sh }]\n",
        "You help.",
    );
    let mut host = FakeHost::new(vec![
        tool_calls(
            "",
            vec![call("r1", "Read", r#"{"file_path":"missing"}"#), call("r2", "Read", r#"{"file_path":"a"}"#)],
        ),
        text("done"),
    ]);
    host.tool_fn = Box::new(|c| match (c.name.as_str(), c.arguments.as_str()) {
        ("Bash", args) if args.contains("why.sh") => {
            assert!(args.contains(r#"\"error\":\"error: no such file\""#), "{args}");
            assert!(args.contains("PostToolUseFailure"), "{args}");
            ToolResult {
                id: c.id.clone(),
                content: r#"{"decision": "block", "reason": "check the path"}"#.into(),
                is_error: false,
            }
        }
        ("Bash", _) => ToolResult { id: c.id.clone(), content: String::new(), is_error: false },
        (_, args) if args.contains("missing") => {
            ToolResult { id: c.id.clone(), content: "error: no such file".into(), is_error: true }
        }
        _ => ToolResult { id: c.id.clone(), content: "text".into(), is_error: false },
    });
    run(&mut host, &task("t1", "go"), &agent).unwrap();
    let hooks: Vec<bool> = host.batches[1..].iter().map(|b| b[0].arguments.contains("why.sh")).collect();
    assert_eq!(hooks, [true, false], "why.sh after the failure, ok.sh after the success");
    let results: Vec<&str> =
        host.requests[1].messages.iter().filter(|m| m.role == "tool").map(|m| m.content.as_str()).collect();
    assert_eq!(results, ["error: no such file\n[PostToolUseFailure hook: check the path]", "text"]);
}
