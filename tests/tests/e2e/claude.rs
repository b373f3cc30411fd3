//! Claude-format subagents through the real `claude` WASM plugin, the scripted model
//! provider (the offline stand-in for an LLM) and the real Docker sandbox.
//! In-process (the `warden` library) where several tasks must share one host.

use std::path::Path;
use std::sync::Arc;

use warden::plugin::TaskCall;
use warden::task::{self, TaskOutcome, TaskScope};
use warden::task_state::TaskState;

use crate::common::*;

/// A deployment with the bundled claude plugin, one agent file and a script per
/// scripted provider. Policy: the file and shell tools are allowed (no prompts).
struct ClaudeHost {
    _dir: tempfile::TempDir,
    registry: Arc<warden::Registry>,
    host: warden::Host,
}

const ALLOW_ALL: &str = "approval:\n  default: deny\n  allow: [Read, Write, Edit, Glob, Grep, Bash]\n";

async fn claude_host(agent: &str, scripts: &[(&str, &str)], extra_models: &str) -> ClaudeHost {
    claude_host_with(agent, scripts, extra_models, ALLOW_ALL).await
}

/// Like [`claude_host`] with the tail of the config (`approval:`, `mcp_servers:` ...) given.
async fn claude_host_with(agent: &str, scripts: &[(&str, &str)], extra_models: &str, tail: &str) -> ClaudeHost {
    claude_host_providers(agent, scripts, extra_models, "", "", tail).await
}

/// Like [`claude_host_with`] with more `models.providers` entries (indented lines) besides
/// the scripted ones, and more `subagents` settings (indented lines).
async fn claude_host_providers(
    agent: &str,
    scripts: &[(&str, &str)],
    extra_models: &str,
    extra_providers: &str,
    extra_subagents: &str,
    tail: &str,
) -> ClaudeHost {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("plugins")).unwrap();
    std::fs::create_dir_all(root.join("agents")).unwrap();
    std::fs::copy(bundled_plugin("claude"), root.join("plugins/claude.wasm")).unwrap();
    std::fs::write(root.join("agents/agent.md"), agent).unwrap();
    let mut providers = String::new();
    for (name, script) in scripts {
        std::fs::write(root.join(format!("{name}.yaml")), script).unwrap();
        providers.push_str(&format!("    {name}: {{ type: scripted, script: ./{name}.yaml }}\n"));
    }
    providers.push_str(extra_providers);
    let yaml = format!(
        "plugins:\n  dir: ./plugins\n  cache_dir: ./cache\n  grants:\n    claude: {{ log: true, events: true, state: true, resources: true, model: true, tools: true }}\n\
         subagents:\n  agent_dirs: [./agents]\n{extra_subagents}models:\n  default: {}/scripted\n{extra_models}  providers:\n{providers}\
         sandbox:\n  scope: e2e{}\n{tail}",
        scripts[0].0,
        // Hosts of one scope adopt (and sweep) each other's containers on start: tests
        // run at once, so each host gets a scope of its own.
        &uuid::Uuid::new_v4().simple().to_string()[..12],
    );
    std::fs::write(root.join("warden.yaml"), yaml).unwrap();
    let mut config = warden::Config::from_file(&root.join("warden.yaml")).unwrap();
    // The claude plugin is granted every MCP server the tail configures
    // (`plugins.grants.claude.mcp_servers`), as an operator deploying them for it would.
    let servers = config.mcp_servers.keys().cloned().collect();
    config.plugins.grants.get_mut("claude").expect("the claude grant").mcp_servers = servers;
    let host = warden::Host::start(config).await.unwrap();
    ClaudeHost { _dir: dir, registry: host.registry.clone(), host }
}

impl Drop for ClaudeHost {
    /// Removes the host's sandbox sessions (their containers, volumes and disks).
    fn drop(&mut self) {
        let Ok(sandbox) = self.host.sandbox().cloned() else { return };
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            tokio::task::block_in_place(|| handle.block_on(async { sandbox.shutdown().await.ok() }));
        }
    }
}

impl ClaudeHost {
    async fn run(
        &self,
        agent: &str,
        prompt: &str,
        session: &str,
        model: Option<&str>,
        resume: Option<&str>,
    ) -> TaskOutcome {
        self.run_as("tester", agent, prompt, session, model, resume).await
    }

    /// [`ClaudeHost::run`] as `user` (a tenant of its own).
    async fn run_as(
        &self,
        user: &str,
        agent: &str,
        prompt: &str,
        session: &str,
        model: Option<&str>,
        resume: Option<&str>,
    ) -> TaskOutcome {
        let call = TaskCall {
            description: "test".into(),
            prompt: prompt.into(),
            subagent_type: agent.into(),
            model: model.map(str::to_owned),
            resume: resume.map(str::to_owned),
            run_in_background: false,
        };
        let scope = TaskScope { session_id: session.into(), user_id: user.into(), ..TaskScope::default() };
        task::run(&self.registry, task::new_task_id(), &call, scope).await.expect("task starts")
    }

    async fn run_with_events(&self, agent: &str, prompt: &str, session: &str) -> (TaskOutcome, Vec<serde_json::Value>) {
        let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
        let call = TaskCall {
            description: "t".into(),
            prompt: prompt.into(),
            subagent_type: agent.into(),
            ..TaskCall::default()
        };
        let scope = TaskScope {
            session_id: session.into(),
            user_id: "tester".into(),
            events: Some(tx),
            ..TaskScope::default()
        };
        let outcome = task::run(&self.registry, task::new_task_id(), &call, scope).await.expect("task starts");
        let mut events = vec![];
        while let Ok(e) = rx.try_recv() {
            events.push(warden::event::TaskEvent::into_json(e, agent));
        }
        (outcome, events)
    }

    /// A tool call in `session` as the parent agent (or the operator) would make it.
    async fn parent_tool(&self, session: &str, tool: &str, input: serde_json::Value) -> warden::tools::ToolResult {
        self.parent_tool_as("tester", session, tool, input).await
    }

    /// [`ClaudeHost::parent_tool`] in `user`'s session.
    async fn parent_tool_as(
        &self,
        user: &str,
        session: &str,
        tool: &str,
        input: serde_json::Value,
    ) -> warden::tools::ToolResult {
        let tools = self.host.tools.clone();
        let scope = warden::scope::TaskScope {
            task_id: "parent".into(),
            session_id: session.into(),
            user_id: user.into(),
            subagent: "parent".into(),
            plugin: "test".into(),
            ..Default::default()
        };
        let call = warden::tools::ToolCall { id: "p1".into(), name: tool.into(), input };
        tools.call_batch(&scope, vec![call]).await.pop().unwrap()
    }

    /// The Docker container id of `session` (the test user's).
    async fn container_of(&self, session: &str) -> String {
        let tools = self.host.tools.clone();
        let sessions = tools.sandbox().unwrap().list_sessions().await.unwrap();
        sessions
            .into_iter()
            .find(|i| i.key == warden_sandbox_key(session))
            .expect("the session has a container")
            .container_id
    }

    async fn end(&self, session: &str) {
        let tools = self.host.tools.clone();
        let sandbox = tools.sandbox().unwrap();
        sandbox.end_session(&warden_sandbox_key(session)).await.unwrap();
    }
}

fn warden_sandbox_key(session: &str) -> warden_sandbox::SessionKey {
    warden_sandbox::SessionKey::new("tester", session)
}

fn session() -> String {
    format!("e2e_{}", uuid::Uuid::new_v4().simple())
}

const AGENT: &str = "---\nname: helper\ndescription: Helps with files\ntools: Read, Write, Bash, Glob\nmodel: sonnet\n---\nYou are the helper. Always answer briefly.\n";

fn completed(o: &TaskOutcome) -> &str {
    assert_eq!(o.status, TaskState::Completed, "{o:?}");
    o.output.as_deref().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn text_only_answer() {
    let h = claude_host(
        AGENT,
        &[("main", "- text: \"All good.\"\n  expect: { last_user_contains: \"how are things\" }\n")],
        "",
    )
    .await;
    assert_eq!(completed(&h.run("helper", "how are things?", &session(), None, None).await), "All good.");
}

#[tokio::test(flavor = "multi_thread")]
async fn several_steps_in_the_sandbox_and_the_parent_sees_the_file_but_not_the_history() {
    let script = r##"
- tool_calls: [{ name: Bash, arguments: { command: "echo step-one-output > one.txt && cat one.txt" } }]
- tool_calls: [{ name: Read, arguments: { file_path: "one.txt" } }]
  expect: { last_tool_result_contains: "step-one-output" }
- tool_calls: [{ name: Write, arguments: { file_path: "report.md", content: "# Report\nwritten by the subagent\n" } }]
  expect: { last_tool_result_contains: "step-one-output" }
- text: "Report written."
"##;
    let h = claude_host(AGENT, &[("main", script)], "").await;
    let s = session();
    let (outcome, events) = h.run_with_events("helper", "make a report", &s).await;
    // history isolation: the parent gets the final text only
    assert_eq!(completed(&outcome), "Report written.");
    let calls: Vec<_> =
        events.iter().filter(|e| e["type"] == "tool_call").map(|e| e["name"].as_str().unwrap().to_owned()).collect();
    assert_eq!(calls, ["Bash", "Read", "Write"]);
    // the parent session sees what the subagent wrote, and carries on in it
    let read = h.parent_tool(&s, "Read", serde_json::json!({ "file_path": "report.md" })).await;
    assert!(!read.is_error && read.content.contains("written by the subagent"), "{read:?}");
    let more = h.parent_tool(&s, "Bash", serde_json::json!({ "command": "ls" })).await;
    assert!(more.content.contains("one.txt") && more.content.contains("report.md"), "{more:?}");
    h.end(&s).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn max_turns_exceeded_is_an_answer_not_a_crash() {
    let agent = "---\nname: looper\ndescription: Loops\ntools: Glob\nmaxTurns: 2\n---\nLoop.\n";
    let turn = "- tool_calls: [{ name: Glob, arguments: { pattern: \"*\" } }]\n";
    let h = claude_host(agent, &[("main", &turn.repeat(3))], "").await;
    let s = session();
    let out = h.run("looper", "go", &s, None, None).await;
    assert!(completed(&out).contains("stopped after 2 turns"), "{out:?}");
    h.end(&s).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_prompt_is_refused_before_running() {
    let h = claude_host(AGENT, &[("main", "- text: never\n")], "").await;
    let call = TaskCall { subagent_type: "helper".into(), ..TaskCall::default() };
    let err = task::run(&h.registry, "t".into(), &call, TaskScope::default()).await.unwrap_err();
    assert_eq!(err.to_string(), "missing required field `prompt`");
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_error_fails_the_task() {
    let h = claude_host(AGENT, &[("main", "- error: \"simulated provider outage\"\n")], "").await;
    let out = h.run("helper", "hi", &session(), None, None).await;
    assert_eq!(out.status, TaskState::Failed);
    assert!(out.error.as_deref().unwrap().contains("simulated provider outage"), "{out:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_and_filtered_tools_get_error_results_and_never_reach_the_host() {
    let agent = "---\nname: picky\ndescription: Picky\ntools: Read, Bash\ndisallowedTools: Bash\n---\nBe picky.\n";
    let script = r#"
- tool_calls: [{ name: Frobnicate, arguments: {} }]
- tool_calls: [{ name: Bash, arguments: { command: "touch /workspace/should-not-exist" } }]
  expect: { last_tool_result_contains: "tool `Frobnicate` is not available" }
- text: "done"
  expect: { last_tool_result_contains: "tool `Bash` is not available" }
"#;
    let h = claude_host(agent, &[("main", script)], "").await;
    let (out, events) = h.run_with_events("picky", "try things", &session()).await;
    assert_eq!(completed(&out), "done");
    assert!(events.iter().all(|e| e["type"] != "tool_call"), "filtered calls reached the host: {events:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn resume_continues_the_transcript() {
    let script = r#"
- text: "first answer"
- text: "second answer, continuing"
  expect: { last_user_contains: "follow-up question" }
"#;
    let h = claude_host(AGENT, &[("main", script)], "").await;
    let first = h.run("helper", "opening question", &session(), None, None).await;
    assert_eq!(completed(&first), "first answer");
    let second = h.run("helper", "follow-up question", &session(), None, Some(&first.task_id)).await;
    // The scripted model picks its turn by the number of assistant messages in the
    // request: turn 2 proves the earlier exchange was sent along.
    assert_eq!(completed(&second), "second answer, continuing");
    let missing = h.run("helper", "again", &session(), None, Some("task_nope")).await;
    assert_eq!(missing.status, TaskState::Failed);
    assert!(missing.error.as_deref().unwrap().contains("no transcript"), "{missing:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn model_override_and_aliases_pick_the_provider() {
    let h = claude_host(
        AGENT,
        &[("main", "- text: from-main\n"), ("other", "- text: from-other\n")],
        "  aliases: { sonnet: other/scripted }\n",
    )
    .await;
    // the agent file says `model: sonnet` → alias → provider `other`
    assert_eq!(completed(&h.run("helper", "q", &session(), None, None).await), "from-other");
    // the task's model wins over the agent file
    assert_eq!(completed(&h.run("helper", "q", &session(), Some("main/scripted"), None).await), "from-main");
    // `inherit` is the operator's default
    assert_eq!(completed(&h.run("helper", "q", &session(), Some("inherit"), None).await), "from-main");
    let bad = h.run("helper", "q", &session(), Some("nowhere/x"), None).await;
    assert_eq!(bad.status, TaskState::Failed);
}

#[test]
fn every_fixture_agent_resolves_through_the_wasm_plugin() {
    let fixtures = fixtures().join("claude-agents");
    assert!(fixtures.is_dir(), "fixtures missing at {}", fixtures.display());
    let d = Deployment::new(&format!(
        "  grants:\n    claude: {{ resources: true, log: true }}\nsubagents:\n  agent_dirs: [{}]\n",
        fixtures.display()
    ));
    std::fs::copy(bundled_plugin("claude"), d.dir.path().join("plugins/claude.wasm")).unwrap();
    let v = json(&d.warden(&["agents", "--json"]));
    let agents = v["agents"].as_array().unwrap();
    let files = count_md(&fixtures);
    assert_eq!(files, 202);
    assert_eq!(agents.len(), files, "problems: {}", v["problems"]);
    for a in agents {
        assert!(!a["name"].as_str().unwrap().is_empty() && !a["description"].as_str().unwrap().is_empty(), "{a}");
        assert_eq!(a["kind"], "CLAUDE");
        let data: serde_json::Value = serde_json::from_str(a["protocol_data"].as_str().unwrap()).unwrap();
        assert!(data["system_prompt"].is_string(), "{a}");
    }
}

fn count_md(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            let p = e.path();
            if p.is_dir() { count_md(&p) } else { usize::from(p.extension().is_some_and(|x| x == "md")) }
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_mcp_tool_waits_at_the_gate_and_runs_after_approval() {
    let peer = Peer::start("mcp_server.py", &[]);
    let agent = "---\nname: mcp-user\ndescription: Uses MCP\ntools: Read, mcp__calc__add, mcp__calc__agent\nmcpServers: [calc]\n---\nUse the calculator.\n";
    let script = r#"
- tool_calls: [{ name: mcp__calc__add, arguments: { a: 20, b: 22 } }]
- tool_calls: [{ name: mcp__calc__agent, arguments: { prompt: "hello" } }]
  expect: { last_tool_result_contains: "42" }
- text: "sum is 42"
  expect: { last_tool_result_contains: "not run" }
"#;
    let tail = format!(
        "approval:\n  default: deny\n  ask: [\"mcp__calc__*\"]\n  timeout: 30s\nmcp_servers:\n  calc: {{ url: \"{}/mcp\" }}\n",
        peer.url()
    );
    let h = claude_host_with(agent, &[("main", script)], "", &tail).await;
    let gate = h.host.tools.gate().clone();
    // A person approves the first ask (the add) and declines the second (the agent call).
    let decider = tokio::spawn(async move {
        let mut seen = vec![];
        while seen.len() < 2 {
            for p in gate.pending() {
                if !seen.contains(&p.id) {
                    let answer = if seen.is_empty() {
                        assert_eq!(p.tool, "mcp__calc__add");
                        assert_eq!(p.input, serde_json::json!({ "a": 20, "b": 22 }));
                        warden_approval::Resolution::Approve
                    } else {
                        assert_eq!(p.tool, "mcp__calc__agent");
                        warden_approval::Resolution::Decline
                    };
                    gate.resolve(&p.id, answer, "tester").unwrap();
                    seen.push(p.id);
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    });
    let (out, events) = h.run_with_events("mcp-user", "add numbers", &session()).await;
    decider.await.unwrap();
    assert_eq!(completed(&out), "sum is 42");
    let results = tool_results(&events);
    assert_eq!(
        results,
        [
            (serde_json::json!("mcp__calc__add"), serde_json::json!(false)),
            (serde_json::json!("mcp__calc__agent"), serde_json::json!(true))
        ]
    );
}

/// Regression (issue 11): `Read docs/link-to-env` (a link made in the sandbox) returned the
/// `.env` that `deny: Read(./.env)` protects. The gate now judges the resolved path too.
#[tokio::test(flavor = "multi_thread")]
async fn a_link_to_a_denied_file_is_denied_through_the_gate() {
    let policy = "approval:\n  default: deny\n  timeout: 1s\n  allow: [\"Bash\", \"Read(./docs/**)\"]\n  deny: [\"Read(./.env)\"]\n";
    let h = claude_host_with(AGENT, &[("main", "- text: \"unused\"\n")], "", policy).await;
    let s = session();
    // Since issue 40 the shell's `ln .env …` reads `.env` as far as the rule is concerned
    // (denied); the links are made by a program whose file use the gate does not model.
    let ln = h.parent_tool(&s, "Bash", serde_json::json!({"command": "touch .env && ln .env docs-h"})).await;
    assert!(ln.is_error && ln.content.contains("Read(./.env)"), "{ln:?}");
    let setup = h
        .parent_tool(&s, "Bash", serde_json::json!({"command": "printf TOPSECRET > .env && mkdir -p docs && echo hi > docs/a.md && python3 -c \"import os; os.symlink('../.env', 'docs/link-to-env'); os.link('.env', 'docs/notes.txt')\""}))
        .await;
    assert!(!setup.is_error, "{setup:?}");
    let ok = h.parent_tool(&s, "Read", serde_json::json!({"file_path": "docs/a.md"})).await;
    assert!(!ok.is_error && ok.content.contains("hi"), "an allowed read still works: {ok:?}");
    // A hard link is another name for `.env`: the allow becomes an ask, which nobody
    // answers here, so it is declined.
    for path in ["docs/link-to-env", "/workspace/docs/link-to-env", "docs/../docs/link-to-env", "docs/notes.txt"] {
        let r = h.parent_tool(&s, "Read", serde_json::json!({"file_path": path})).await;
        assert!(r.is_error && !r.content.contains("TOPSECRET"), "{path}: {r:?}");
        assert!(r.content.contains("denied") || r.content.contains("not run"), "{path}: {r:?}");
    }
    h.end(&s).await;
}

/// Review of issue 40: the calls of a batch were judged together and run one after the
/// other, so an allowed first call (here a program that turns `docs/a.md` into a link to
/// `.env`; in the review a `git checkout` of a branch holding such a link) changed what the
/// allowed `cat docs/a.md` after it read. A Bash call runs only if its files are still the
/// ones that were judged.
#[tokio::test(flavor = "multi_thread")]
async fn regression_an_earlier_call_of_a_batch_swapped_a_judged_file_for_a_link() {
    let policy = "approval:\n  default: deny\n  timeout: 1s\n  allow: [\"Bash(python3:*)\", \"Bash(cat:*)\"]\n  deny: [\"Read(./.env)\"]\n";
    let h = claude_host_with(AGENT, &[("main", "- text: \"unused\"\n")], "", policy).await;
    let s = session();
    let setup = "python3 -c \"import os; open('.env', 'w').write('TOPSECRET'); os.makedirs('docs'); open('docs/a.md', 'w').write('just docs')\"";
    let r = h.parent_tool(&s, "Bash", serde_json::json!({ "command": setup })).await;
    assert!(!r.is_error, "{r:?}");
    let r = h.parent_tool(&s, "Bash", serde_json::json!({ "command": "cat docs/a.md" })).await;
    assert!(!r.is_error && r.content.contains("just docs"), "an allowed cat runs: {r:?}");
    let swap = "python3 -c \"import os; os.remove('docs/a.md'); os.symlink('../.env', 'docs/a.md')\"";
    let batch = |id: &str, command: &str| warden::tools::ToolCall {
        id: id.into(),
        name: "Bash".into(),
        input: serde_json::json!({ "command": command }),
    };
    let scope = warden::scope::TaskScope {
        task_id: "batch".into(),
        session_id: s.clone(),
        user_id: "tester".into(),
        subagent: "parent".into(),
        plugin: "test".into(),
        ..Default::default()
    };
    let results = h.host.tools.clone().call_batch(&scope, vec![batch("a", swap), batch("b", "cat docs/a.md")]).await;
    assert!(!results[0].is_error, "the swap ran: {results:?}");
    assert!(results[1].is_error && !results[1].content.contains("TOPSECRET"), "{results:?}");
    assert!(results[1].content.contains("changed after it was judged"), "{results:?}");
    // Judged now, the link is what the rule denies.
    let r = h.parent_tool(&s, "Bash", serde_json::json!({ "command": "cat docs/a.md" })).await;
    assert!(r.is_error && r.content.contains("Read(./.env)") && !r.content.contains("TOPSECRET"), "{r:?}");
    h.end(&s).await;
}

/// Issue 22: the official stdio MCP reference servers (`mcp-server-git`, `mcp-server-time`
/// from PyPI, baked into the sandbox image) run inside the session's sandbox; their tools
/// reach a Claude subagent through the gate; a declined `git_commit` leaves the repository
/// unchanged; a killed server is started again on the next call; the session's end leaves
/// no process.
#[tokio::test(flavor = "multi_thread")]
async fn stdio_mcp_servers_run_in_the_session_sandbox_behind_the_gate() {
    let agent =
        "---\nname: gitter\ndescription: Works with git and the clock\nmcpServers: [git, time]\n---\nUse git.\n";
    let script = r#"
- tool_calls: [{ name: Bash, arguments: { command: "git init -q repo && cd repo && git config user.email t@example.com && git config user.name t && echo one > a.txt && git add a.txt && git commit -qm first && echo made" } }]
- tool_calls: [{ name: mcp__git__git_status, arguments: { repo_path: "/workspace/repo" } }]
  expect: { last_tool_result_contains: "made" }
- tool_calls: [{ name: mcp__git__git_log, arguments: { repo_path: "/workspace/repo" } }]
  expect: { last_tool_result_contains: "working tree clean" }
- tool_calls: [{ name: mcp__time__get_current_time, arguments: { timezone: "UTC" } }]
  expect: { last_tool_result_contains: "first" }
- tool_calls: [{ name: Bash, arguments: { command: "echo two >> /workspace/repo/a.txt && git -C /workspace/repo add a.txt && pgrep -f 'mcp-server-tim[e]'" } }]
  expect: { last_tool_result_contains: "UTC" }
- tool_calls: [{ name: mcp__git__git_commit, arguments: { repo_path: "/workspace/repo", message: "second" } }]
- tool_calls: [{ name: Bash, arguments: { command: "echo commits=$(git -C /workspace/repo rev-list --count HEAD); pkill -f 'mcp-server-tim[e]'; sleep 1; pgrep -f 'mcp-server-tim[e]' || echo time-server-gone" } }]
  expect: { last_tool_result_contains: "not run" }
- tool_calls: [{ name: mcp__time__get_current_time, arguments: { timezone: "Europe/Paris" } }]
  expect: { last_tool_result_contains: "time-server-gone" }
- tool_calls: [{ name: Bash, arguments: { command: "pgrep -f 'mcp-server-tim[e]'" } }]
  expect: { last_tool_result_contains: "Europe/Paris" }
- text: "done"
"#;
    let tail = "approval:\n  default: deny\n  allow: [Bash, \"mcp__git__git_status\", \"mcp__git__git_log\", \"mcp__time__*\"]\n  ask: [\"mcp__git__git_commit\"]\n  timeout: 60s\n\
                mcp_servers:\n  git: { command: mcp-server-git }\n  time: { type: stdio, command: mcp-server-time, args: [\"--local-timezone\", \"UTC\"] }\n";
    let h = claude_host_with(agent, &[("main", script)], "", tail).await;
    let gate = h.host.tools.gate().clone();
    // A person declines the commit.
    let decider = tokio::spawn(async move {
        loop {
            if let Some(p) = gate.pending().into_iter().next() {
                assert_eq!(p.tool, "mcp__git__git_commit");
                gate.resolve(&p.id, warden_approval::Resolution::Decline, "tester").unwrap();
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    });
    let s = session();
    let (outcome, events) = h.run_with_events("gitter", "work with git", &s).await;
    decider.await.unwrap();
    assert_eq!(completed(&outcome), "done");
    let results: Vec<(String, String, bool)> = events
        .iter()
        .filter(|e| e["type"] == "tool_result")
        .map(|e| {
            (e["name"].as_str().unwrap().to_owned(), e["content"].as_str().unwrap().to_owned(), e["is_error"] == true)
        })
        .collect();
    let find = |i: usize| &results[i];
    assert_eq!(find(1).0, "mcp__git__git_status");
    assert!(find(1).1.contains("working tree clean") && !find(1).2, "{:?}", find(1));
    assert!(find(2).1.contains("first") && !find(2).2, "{:?}", find(2));
    assert!(find(3).1.contains("UTC") && !find(3).2, "{:?}", find(3));
    // The declined commit did not run: still one commit.
    assert!(find(5).2 && find(5).1.contains("not run"), "{:?}", find(5));
    assert!(find(6).1.contains("commits=1") && find(6).1.contains("time-server-gone"), "{:?}", find(6));
    // The killed time server was started again for the next call, as a new process.
    assert!(find(7).1.contains("Europe/Paris") && !find(7).2, "{:?}", find(7));
    let old_pid = find(4).1.split_whitespace().last().unwrap().to_owned();
    let new_pid = find(8).1.split_whitespace().next().unwrap_or_default().to_owned();
    assert!(!new_pid.is_empty() && new_pid != old_pid, "old {old_pid}, new {new_pid}");
    // The servers ran in the session's container: ending the session leaves no process.
    let container = h.container_of(&s).await;
    let top = std::process::Command::new("docker").args(["top", &container]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&top.stdout).contains("mcp-server-git"),
        "{}",
        String::from_utf8_lossy(&top.stdout)
    );
    h.end(&s).await;
    let gone = std::process::Command::new("docker").args(["inspect", &container]).output().unwrap();
    assert!(!gone.status.success(), "the session's container (and its servers) is gone");
}

/// Regression (second-tenant attack on main): a stdio MCP server's tool list was cached
/// across sessions — the list the first session's process answered was offered in every
/// other session. That process runs in its session's sandbox, where the session's files
/// decide what it offers, so one tenant decided the tools another tenant's model saw. The
/// probe server names its one tool after `/workspace/probe-name` (`plain` without it):
/// alice's session has the file, bob's does not, and each model is offered its own
/// session's list (the scripted provider checks the request's tools).
#[tokio::test(flavor = "multi_thread")]
async fn regression_a_stdio_mcp_servers_tool_list_was_shared_across_sessions() {
    let agent = "---\nname: prober\ndescription: Uses the probe server\nmcpServers: [probe]\n---\nProbe.\n";
    let alice = r#"
- expect: { tools_offered: [mcp__probe__tool_evil], tools_not_offered: [mcp__probe__tool_plain] }
  tool_calls: [{ name: mcp__probe__tool_evil }]
- expect: { last_tool_result_contains: "served evil" }
  text: "alice done"
"#;
    let bob = r#"
- expect: { tools_offered: [mcp__probe__tool_plain], tools_not_offered: [mcp__probe__tool_evil] }
  tool_calls: [{ name: mcp__probe__tool_plain }]
- expect: { last_tool_result_contains: "served plain" }
  text: "bob done"
"#;
    let server = "import os\n\
                  from mcp.server.mcpserver import MCPServer\n\
                  p = '/workspace/probe-name'\n\
                  n = open(p).read().strip() if os.path.exists(p) else 'plain'\n\
                  s = MCPServer('probe')\n\
                  def probe() -> str:\n    return 'served ' + n\n\
                  s.add_tool(probe, name='tool_' + n)\n\
                  s.run()\n";
    let tail = format!(
        "approval:\n  default: deny\n  allow: [Write, \"mcp__probe__*\"]\n\
         mcp_servers:\n  probe: {{ command: /opt/warden/venv/bin/python, args: [\"-c\", {}] }}\n",
        serde_json::to_string(server).unwrap()
    );
    let h = claude_host_with(agent, &[("alice", alice), ("bob", bob)], "", &tail).await;
    let (session_a, session_b) = (session(), session());
    let named = h
        .parent_tool_as("alice", &session_a, "Write", serde_json::json!({"file_path": "probe-name", "content": "evil"}))
        .await;
    assert!(!named.is_error, "{named:?}");
    let a = h.run_as("alice", "prober", "probe", &session_a, Some("alice/scripted"), None).await;
    assert_eq!(completed(&a), "alice done");
    // Another tenant's session, after alice's process answered its list.
    let b = h.run_as("bob", "prober", "probe", &session_b, Some("bob/scripted"), None).await;
    assert_eq!(completed(&b), "bob done", "bob's model was offered alice's session's tools");
    // And alice's session still gets its own list (nothing cached from bob's either).
    let again = h.run_as("alice", "prober", "probe", &session_a, Some("alice/scripted"), None).await;
    assert_eq!(completed(&again), "alice done");
}

/// Supply-chain review finding 3: a stdio MCP server's process was shared by every task of
/// its session, whatever secrets each task carried: a task without the token (or with
/// another one) called the server another task had started with its token. The server here
/// answers with the length of the token its environment holds (`env: { TOKEN: "${TOKEN}" }`;
/// the value itself would be scrubbed) and its pid: each token gets a process of its own, a
/// task without the secret gets none, and a task with the same token (and other secrets the
/// server does not take) uses the running one.
#[tokio::test(flavor = "multi_thread")]
async fn regression_a_stdio_mcp_server_started_with_one_tasks_token_served_another_task() {
    let server = "import os\n\
                  from mcp.server.mcpserver import MCPServer\n\
                  s = MCPServer('tok')\n\
                  def token() -> str:\n    return 'len=%d pid=%d' % (len(os.environ.get('TOKEN', '')), os.getpid())\n\
                  s.add_tool(token, name='token')\n\
                  s.run()\n";
    let tail = format!(
        "approval:\n  default: deny\n  allow: [\"mcp__tok__*\"]\n\
         mcp_servers:\n  tok: {{ command: /opt/warden/venv/bin/python, args: [\"-c\", {}], env: {{ TOKEN: \"${{TOKEN}}\" }} }}\n",
        serde_json::to_string(server).unwrap()
    );
    let h = claude_host_with(AGENT, &[("main", "- text: unused\n")], "", &tail).await;
    let s = session();
    let grant = warden::config::GrantConfig { tools: true, mcp_servers: vec!["tok".into()], ..Default::default() };
    let grants = Arc::new(
        warden::capability::Grants::new("claude", &[warden::capability::Capability::Tools], Some(&grant)).unwrap(),
    );
    let call = |task: &str, secrets: &[(&str, &str)]| {
        let scope = warden::scope::TaskScope {
            task_id: task.into(),
            session_id: s.clone(),
            user_id: "tester".into(),
            subagent: "helper".into(),
            plugin: "claude".into(),
            mcp_servers: vec!["tok".into()],
            plugin_grants: grants.clone(),
            // Named (a `tool_context` string): usable as `${TOKEN}` by the operator's
            // server, never exported into the sandbox.
            tool_secrets: secrets.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Default::default()
        };
        let tools = h.host.tools.clone();
        async move {
            let call = warden::tools::ToolCall {
                id: "c".into(),
                name: "mcp__tok__token".into(),
                input: serde_json::json!({}),
            };
            tools.call_batch(&scope, vec![call]).await.pop().unwrap()
        }
    };
    let pid = |r: &warden::tools::ToolResult| r.content.split("pid=").nth(1).unwrap_or_default().trim().to_owned();
    let a = call("task-a", &[("TOKEN", "alpha-token-1")]).await;
    assert!(!a.is_error && a.content.contains("len=13"), "{a:?}");
    let b = call("task-b", &[("TOKEN", "b-tok")]).await;
    assert!(!b.is_error && b.content.contains("len=5"), "task B acted with task A's token: {b:?}");
    assert_ne!(pid(&a), pid(&b), "another token, another process");
    let none = call("task-c", &[]).await;
    assert!(none.is_error && !none.content.contains("len="), "a task without the token used a server: {none:?}");
    assert!(none.content.contains("TOKEN") && none.content.contains("does not give"), "{none:?}");
    let again = call("task-d", &[("OTHER", "unrelated"), ("TOKEN", "alpha-token-1")]).await;
    assert!(!again.is_error && again.content.contains("len=13"), "{again:?}");
    assert_eq!(pid(&again), pid(&a), "the same token (other secrets aside) uses the running process");
    h.end(&s).await;
}

/// The command lines of the processes in `session`'s container.
async fn processes(h: &ClaudeHost, session: &str) -> String {
    h.parent_tool(session, "Bash", serde_json::json!({"command": "ps -eo args"})).await.content
}

/// Issue 20: an agent file's own (inline) MCP servers run only when the operator allows
/// them, and each start is judged by the gate as the command it is: the server whose command
/// line an allow rule names starts and serves, the other one (same program, another
/// argument) is declined by the default and never offered, nor started by a direct call.
#[tokio::test(flavor = "multi_thread")]
async fn agent_defined_mcp_servers_start_only_when_the_gate_allows_their_command() {
    let python = "/opt/warden/venv/bin/python";
    let agent = format!(
        "---\nname: timer\ndescription: Uses its own servers\nmcpServers:\n  - clock:\n      command: {python}\n      \
         args: [/workspace/clock.py]\n      env: {{ TICK: tock }}\n  - stray:\n      command: {python}\n      \
         args: [/workspace/clock.py, --stray]\n---\nTell the time.\n"
    );
    let script = r#"
- expect: { tools_offered: [mcp__clock__now], tools_not_offered: [mcp__stray__now] }
  tool_calls: [{ name: mcp__clock__now }, { name: mcp__stray__now }]
- expect: { last_tool_result_contains: "not available to this subagent" }
  text: "timed"
"#;
    let server = "import os, sys\n\
                  from mcp.server.mcpserver import MCPServer\n\
                  s = MCPServer('clock')\n\
                  def now() -> str:\n    return 'tick ' + os.environ.get('TICK', '?') + ' ' + ' '.join(sys.argv[1:])\n\
                  s.add_tool(now, name='now')\n\
                  s.run()\n";
    let tail = format!(
        // An allow rule names the whole command line, the server's environment included.
        "approval:\n  default: deny\n  allow: [Write, \"mcp__clock__*\", \"mcp__stray__*\", \"Bash(TICK=tock {python} /workspace/clock.py)\", \"Bash(ps -eo args)\"]\n"
    );
    let h =
        claude_host_providers(&agent, &[("main", script)], "", "", "  allow_agent_mcp_servers: true\n", &tail).await;
    let problems = h.registry.snapshot().problems.iter().map(|p| p.message.clone()).collect::<Vec<_>>();
    assert!(problems.is_empty(), "both inline servers are valid: {problems:?}");
    let s = session();
    let written = h.parent_tool(&s, "Write", serde_json::json!({"file_path": "clock.py", "content": server})).await;
    assert!(!written.is_error, "{written:?}");
    let (outcome, events) = h.run_with_events("timer", "what time is it", &s).await;
    assert_eq!(completed(&outcome), "timed");
    let results: Vec<(String, String)> = events
        .iter()
        .filter(|e| e["type"] == "tool_result")
        .map(|e| (e["name"].as_str().unwrap_or("").to_owned(), e["content"].as_str().unwrap_or("").to_owned()))
        .collect();
    let of = |name: &str| results.iter().find(|(n, _)| n == name).map(|(_, c)| c.clone()).unwrap_or_default();
    assert_eq!(of("mcp__clock__now").trim(), "tick tock", "{results:?}");
    assert!(!results.iter().any(|(_, c)| c.contains("--stray")), "the declined server ran: {results:?}");
    // The task is over, and so is the server it started (it would run beside later tasks'
    // commands, able to read their environment).
    let after = processes(&h, &s).await;
    assert!(after.contains("ps -eo args") && !after.contains("clock.py"), "the task's server outlived it: {after}");
    // A plugin calling the declined server's tool itself, past its model: the call passes
    // the gate (`mcp__stray__*`), the start does not, so nothing runs; the started one still serves.
    let definition = h.registry.snapshot().definitions["timer"].definition.clone();
    let scope = warden::scope::TaskScope {
        task_id: "direct".into(),
        session_id: s.clone(),
        user_id: "tester".into(),
        subagent: "timer".into(),
        plugin: "claude".into(),
        agent_mcp_servers: definition.agent_mcp_servers,
        ..Default::default()
    };
    let call =
        |name: &str| warden::tools::ToolCall { id: name.into(), name: name.into(), input: serde_json::json!({}) };
    let results = h.host.tools.call_batch(&scope, vec![call("mcp__stray__now"), call("mcp__clock__now")]).await;
    assert!(results[0].is_error && results[0].content.contains("MCP server \"stray\" was not started"), "{results:?}");
    assert_eq!(results[1].content.trim(), "tick tock", "{results:?}");
    // Declined once in a task is declined for the task: no second question.
    let again = h.host.tools.call_batch(&scope, vec![call("mcp__stray__now")]).await;
    assert!(again[0].content.contains("declined earlier in this task"), "{again:?}");
    assert!(processes(&h, &s).await.contains("clock.py"), "the direct task's server runs while it does");
    h.host.tools.end_task(&scope).await;
    let after = processes(&h, &s).await;
    assert!(!after.contains("clock.py"), "ending the task ended its server: {after}");

    // Off (the default): the same file's servers are problems naming the setting, and the
    // subagent is offered neither.
    let off = r#"
- expect: { tools_not_offered: [mcp__clock__now, mcp__stray__now] }
  text: "no servers"
"#;
    let h = claude_host_providers(&agent, &[("main", off)], "", "", "", &tail).await;
    let problems = h.registry.snapshot().problems.iter().map(|p| p.message.clone()).collect::<Vec<_>>();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems.iter().all(|p| p.contains("subagents.allow_agent_mcp_servers")), "{problems:?}");
    let s = session();
    let written = h.parent_tool(&s, "Write", serde_json::json!({"file_path": "clock.py", "content": server})).await;
    assert!(!written.is_error, "{written:?}");
    let (outcome, _) = h.run_with_events("timer", "what time is it", &s).await;
    assert_eq!(completed(&outcome), "no servers");
}

/// An HTTP server on 127.0.0.1 (a free port, returned) answering every request with a
/// four-byte `body`: the test machine's host the sandbox reaches through its egress proxy.
fn four_byte_server(body: &'static [u8; 4]) -> u16 {
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut s in server.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(
                &[b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\n".as_slice(), body].concat(),
            );
        }
    });
    port
}

/// Issue 21: an agent file's and a task's `egress` lists only narrow the operator's.
#[tokio::test(flavor = "multi_thread")]
async fn an_agent_file_and_a_task_can_only_narrow_egress() {
    // Issue 21: the operator allows two local servers; the agent file's `egress` names one
    // of them (and a host the operator never allowed), the task's list narrows further.
    let (a, b) = (four_byte_server(b"pong"), four_byte_server(b"ping"));
    let curl = |p: u16| format!("curl -sS --max-time 20 --noproxy '' http://127.0.0.1:{p}/");
    let script = format!(
        "- tool_calls: [{{ name: Bash, arguments: {{ command: \"{}; echo; {}; echo; curl -sS --max-time 20 http://evil.example/\" }} }}]\n\
         - text: \"done\"\n  expect: {{ last_tool_result_contains: \"evil.example\" }}\n",
        curl(a),
        curl(b)
    );
    let agent = format!(
        "---\nname: fetcher\ndescription: Fetches\ntools: Bash\negress: [\"127.0.0.1:{a}\", \"evil.example\"]\n---\nFetch.\n"
    );
    let tail = format!(
        "  egress:\n    allow: [\"127.0.0.1:{a}\", \"127.0.0.1:{b}\"]\napproval:\n  default: deny\n  allow: [Bash]\n"
    );
    let h = claude_host_with(&agent, &[("main", &script)], "", &tail).await;
    let s = session();
    let (outcome, events) = h.run_with_events("fetcher", "fetch", &s).await;
    assert_eq!(completed(&outcome), "done");
    let content = events.iter().find(|e| e["type"] == "tool_result").unwrap()["content"].as_str().unwrap().to_owned();
    assert!(content.contains("pong"), "the agent's own list allows {a}: {content}");
    assert!(!content.contains("ping"), "{b} is outside the agent's list: {content}");
    assert!(
        content.contains(&format!("127.0.0.1:{b} is outside the egress list of subagent \"fetcher\" (egress)")),
        "{content}"
    );
    assert!(content.contains("no allow entry names evil.example:80"), "an agent file cannot add a host: {content}");
    let denied: Vec<_> =
        events.iter().filter(|e| e["type"] == "egress" && e["allowed"] == false).map(|e| e["rule"].clone()).collect();
    assert!(denied.iter().any(|r| r.as_str().unwrap().contains("subagent \"fetcher\"")), "{denied:?}");
    // The task narrows further: to nothing the agent may reach.
    let task_list = std::sync::Arc::new(
        warden_sandbox::EgressNarrowing::parse(&[format!("127.0.0.1:{b}")], "the task (egress)").unwrap(),
    );
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    let call = TaskCall {
        description: "t".into(),
        prompt: "fetch".into(),
        subagent_type: "fetcher".into(),
        ..TaskCall::default()
    };
    let scope = TaskScope {
        session_id: s.clone(),
        user_id: "tester".into(),
        events: Some(tx),
        egress: vec![task_list],
        ..TaskScope::default()
    };
    let outcome = task::run(&h.registry, task::new_task_id(), &call, scope).await.unwrap();
    assert_eq!(outcome.status, TaskState::Completed, "{outcome:?}");
    let mut content = String::new();
    while let Ok(e) = rx.try_recv() {
        let e = e.into_json("fetcher");
        if e["type"] == "tool_result" {
            content = e["content"].as_str().unwrap().to_owned();
        }
    }
    assert!(!content.contains("pong") && !content.contains("ping"), "{content}");
    assert!(content.contains(&format!("127.0.0.1:{a} is outside the egress list of the task (egress)")), "{content}");
    h.end(&s).await;
    // An agent file whose list cannot be read is left out, with the reason (never run wider).
    let bad = "---\nname: sloppy\ndescription: d\ntools: Bash\negress: [\"pypi.org\", \"*\"]\n---\nx\n";
    let h = claude_host_with(bad, &[("main", "- text: x\n")], "", "").await;
    let snap = h.registry.snapshot();
    assert!(!snap.definitions.contains_key("sloppy"));
    assert!(
        snap.problems.iter().any(|p| p.message.contains("\"sloppy\" not registered: egress[1]")),
        "{:?}",
        snap.problems
    );
}

/// Issue 21: a subagent's Bash reaches an allowed host on the test machine through the
/// session's egress proxy and is refused another; both decisions are audit-log lines and
/// `egress` events in the task's stream.
#[tokio::test(flavor = "multi_thread")]
async fn egress_decisions_are_audited_and_streamed() {
    let port = four_byte_server(b"pong");
    let script = format!(
        "- tool_calls: [{{ name: Bash, arguments: {{ command: \"curl -sS --max-time 20 --noproxy '' http://127.0.0.1:{port}/x; echo; curl -sS --max-time 20 http://1.1.1.1/\" }} }}]\n\
         - text: \"done\"\n  expect: {{ last_tool_result_contains: \"pong\" }}\n"
    );
    let tail = format!(
        "  egress:\n    allow: [\"127.0.0.1:{port}\"]\napproval:\n  default: deny\n  allow: [Bash]\n  audit_log: ./audit.jsonl\n"
    );
    let h = claude_host_with(AGENT, &[("main", &script)], "", &tail).await;
    let s = session();
    let (outcome, events) = h.run_with_events("helper", "fetch it", &s).await;
    assert_eq!(completed(&outcome), "done");
    let result = events.iter().find(|e| e["type"] == "tool_result").expect("a tool result");
    let content = result["content"].as_str().unwrap();
    assert!(content.contains("pong") && content.contains("refused: no allow entry names 1.1.1.1:80"), "{content}");
    let egress: Vec<_> = events.iter().filter(|e| e["type"] == "egress").collect();
    assert!(
        egress.iter().any(|d| d["allowed"] == true && d["port"] == port && d["bytes_received"].as_u64() > Some(0)),
        "{egress:?}"
    );
    assert!(egress.iter().any(|d| d["allowed"] == false && d["host"] == "1.1.1.1"), "{egress:?}");
    // The log's own thread writes its lines: wait until it has caught up.
    h.host.tools.gate().audit_log().expect("an audit log").sync().unwrap();
    let audit = std::fs::read_to_string(h._dir.path().join("audit.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v["event"] == "egress")
        .collect();
    assert!(
        lines.iter().any(|l| l["decision"] == "allow" && l["port"] == port && l["session_id"] == s.as_str()),
        "{audit}"
    );
    assert!(
        lines.iter().any(|l| l["decision"] == "deny" && l["rule"].as_str().unwrap().contains("no allow entry")),
        "{audit}"
    );
    h.end(&s).await;
}

/// Issue 20: agent files using every documented frontmatter field, through `warden agents`:
/// the fields warden applies register quietly, bad values and the ones it accepts without
/// effect are warnings, unknown fields are warnings with a "did you mean", `isolation:
/// worktree` is the definition's isolation (reference metadata `isolation=fork`, issue 44), and an `isolation` warden cannot
/// honour and hooks warden cannot run keep the file from registering — nothing is dropped
/// without a word.
#[test]
fn warden_agents_gives_every_frontmatter_field_a_meaning() {
    let d = Deployment::new(
        "  grants:\n    claude: { resources: true, log: true, mcp_servers: [github] }\nsubagents:\n  agent_dirs: [./agents]\n\
         models:\n  default: main/scripted\n  providers:\n    main: { type: scripted, script: ./main.yaml }\n\
         \x20   local: { type: openai, base_url: \"http://127.0.0.1:9/v1\" }\n\
         mcp_servers:\n  github: { url: \"http://127.0.0.1:9/mcp\" }\n",
    );
    std::fs::write(d.dir.path().join("main.yaml"), "- text: unused\n").unwrap();
    std::fs::copy(bundled_plugin("claude"), d.dir.path().join("plugins/claude.wasm")).unwrap();
    let agents = d.dir.path().join("agents");
    std::fs::create_dir_all(&agents).unwrap();
    let files = [
        (
            "clean",
            "name: clean\ndescription: Uses every applied field\ntools: Read, Grep\ndisallowedTools: [Grep]\nmodel: inherit\npermissionMode: plan\nmaxTurns: 3\nskills: []\nmcpServers: [github]\nbackground: true\neffort: high\nmemory: local\ninitialPrompt: Look around first.\ncolor: green\negress: [pypi.org]\nhooks:\n  PostToolUse:\n    - matcher: Read\n      hooks: [{ type: command, command: ./lint.sh }]\n",
        ),
        (
            "noisy",
            "name: noisy\ndescription: Uses the fields without effect\ntools: Read, Agent(reviewer)\npermissionMode: auto\neffort: extreme\nmemory: team\nmcpServers:\n  - github\n  - local: { command: ./server }\n",
        ),
        ("typo", "name: typo\ndescription: Misspells\nmaxTurn: 3\nPermissionMode: plan\nfavouriteFood: soup\n"),
        (
            "hooked",
            "name: hooked\ndescription: Has hooks\ncolour: red\nhooks:\n  PreToolUse:\n    - matcher: Bash\n      hooks: [{ type: command, command: ./check.sh }]\n  PermissionRequest:\n    - hooks: [{ type: command, command: ./done.sh }]\n",
        ),
        ("isolated", "name: isolated\ndescription: Wants a container\nisolation: container\n"),
        ("worktree", "name: worktree\ndescription: Wants a worktree\nisolation: worktree\n"),
    ];
    for (name, frontmatter) in files {
        std::fs::write(agents.join(format!("{name}.md")), format!("---\n{frontmatter}---\nBody of {name}.\n")).unwrap();
    }
    let out = d.warden(&["agents", "--json"]);
    // Refused files fail the listing, as they fail `warden config check` (issue 44).
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let v = json(&out);
    let names: Vec<&str> = v["agents"].as_array().unwrap().iter().map(|a| a["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["clean", "noisy", "typo", "worktree"], "{v}");
    let problems: Vec<(String, String)> = v["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let file = Path::new(p["source"].as_str().unwrap()).file_stem().unwrap().to_string_lossy().into_owned();
            (file, p["message"].as_str().unwrap().to_owned())
        })
        .collect();
    let of = |file: &str| problems.iter().filter(|(f, _)| f == file).map(|(_, m)| m.as_str()).collect::<Vec<_>>();
    assert!(of("clean").is_empty(), "{problems:?}");
    let noisy = of("noisy").join("\n");
    // Nesting is the host's to allow (`subagents.max_depth`): an `Agent` entry is not a problem.
    assert!(!noisy.contains("Agent(reviewer)"), "{noisy}");
    for expected in [
        "permissionMode `auto` is applied as `default`",
        "ignored `effort: extreme` (expected low, medium, high, xhigh, max)",
        "ignored `memory: team` (expected user, project, local)",
        "inline MCP server `local` in `mcpServers` refused: agent-defined servers are off (`subagents.allow_agent_mcp_servers`",
    ] {
        assert!(noisy.contains(expected), "{expected}: {noisy}");
    }
    assert_eq!(
        of("typo"),
        [
            "unknown frontmatter field `PermissionMode` ignored (did you mean `permissionMode`?)",
            "unknown frontmatter field `favouriteFood` ignored",
            "unknown frontmatter field `maxTurn` ignored (did you mean `maxTurns`?)",
        ]
    );
    assert!(
        of("hooked").iter().any(|m| m.contains("`hooks` event `PermissionRequest` is not supported")),
        "{problems:?}"
    );
    // A refused file still hears about its other fields.
    assert!(
        of("hooked").contains(&"unknown frontmatter field `colour` ignored (did you mean `color`?)"),
        "{problems:?}"
    );
    assert!(
        of("isolated").iter().any(|m| m.contains("`isolation: container` is not supported (accepted: worktree)")),
        "{problems:?}"
    );
    assert!(of("worktree").is_empty(), "{problems:?}");
    let by_name = |n: &str| v["agents"].as_array().unwrap().iter().find(|a| a["name"] == n).unwrap().clone();
    let clean = by_name("clean");
    assert_eq!(
        (clean["background"].as_bool(), clean["permission_mode"].as_str()),
        (Some(true), Some("plan")),
        "{clean}"
    );
    assert_eq!(clean["mcp_servers"], serde_json::json!(["github"]));
    assert_eq!(clean["effort"], "high", "{clean}");
    // `memory` brings Read, Write, Edit; hooks run through Bash, which the host lets the
    // plugin call (the model is not offered it).
    assert_eq!(clean["tools"], serde_json::json!(["Read", "Grep", "Write", "Edit", "Bash"]), "{clean}");
    assert!(by_name("noisy").get("effort").is_none(), "a bad effort is dropped");
    // Which providers send the effort and which ignore it: a note, not a problem.
    let notes: Vec<&str> = v["notes"].as_array().unwrap().iter().map(|n| n["message"].as_str().unwrap()).collect();
    assert_eq!(
        notes,
        [
            "subagent \"clean\": effort `high` is sent by local (as `reasoning_effort`); ignored by main (no reasoning setting)"
        ]
    );
    assert_eq!(by_name("noisy")["mcp_servers"], serde_json::json!(["github"]), "the inline server is not a name");
    assert_eq!(by_name("noisy")["permission_mode"], "default");
    assert_eq!(by_name("worktree")["isolation"], "fork", "the typed field the host acts on");
    assert!(clean.get("isolation").is_none(), "{clean}");
    // The text listing says the same on stderr — `warning:` for what is ignored, `error:`
    // for a refused file — and `warden config check` prints the same lines, both exiting 2.
    let out = d.warden(&["agents"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = |level: &str, file: &str, text: &str| {
        stderr
            .lines()
            .find(|l| l.starts_with(&format!("{level}: ")) && l.contains(file) && l.contains(text))
            .map(str::to_owned)
    };
    let typo = line("warning", "typo.md", "unknown frontmatter field `maxTurn` ignored (did you mean `maxTurns`?)");
    let refused = line("error", "isolated.md", "`isolation: container` is not supported");
    assert!(typo.is_some() && refused.is_some(), "{stderr}");
    let check = d.warden(&["config", "check"]);
    assert_eq!(check.status.code(), Some(2), "{check:?}");
    let check_err = String::from_utf8_lossy(&check.stderr);
    for same in [typo.unwrap(), refused.unwrap()] {
        assert!(check_err.lines().any(|l| l == same), "{same} in {check_err}");
    }
}

/// Issue 44: two Claude Code plugins (one in a marketplace folder) with an agent of the
/// same name load side by side as `a:reviewer` and `b:reviewer`, where one flat folder made
/// them refuse each other; a name Claude Code takes that cannot be a tool name is
/// registered under a derived id; `bypassPermissions` is noted; `disallowedTools`
/// patterns reach the host as the agent's deny rules.
#[test]
fn claude_code_plugins_load_side_by_side_namespaced() {
    let d = Deployment::new(
        "  grants:\n    claude: { resources: true, log: true }\nsubagents:\n  agent_dirs: []\n  plugin_dirs: [./a, ./market]\n",
    );
    std::fs::copy(bundled_plugin("claude"), d.dir.path().join("plugins/claude.wasm")).unwrap();
    let write = |path: &str, text: &str| {
        let p = d.dir.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    let reviewer = |who: &str| format!("---\nname: reviewer\ndescription: Reviews for {who}\n---\nYou review.\n");
    write("a/.claude-plugin/plugin.json", r#"{"name": "a", "version": "1.0.0"}"#);
    write("a/agents/reviewer.md", &reviewer("a"));
    write(
        "a/agents/analyst.md",
        "---\nname: \"FP&A Analyst\"\ndescription: Budgets\npermissionMode: bypassPermissions\ndisallowedTools: Bash(rm -rf*)\n---\nYou analyse.\n",
    );
    write("a/hooks/hooks.json", r#"{"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "./done.sh"}]}]}}"#);
    write(
        "market/.claude-plugin/marketplace.json",
        r#"{"name": "m", "owner": {"name": "x"}, "plugins": [{"name": "b", "source": "./plugins/b"}, {"name": "far", "source": {"source": "github", "repo": "o/r"}}]}"#,
    );
    write("market/plugins/b/agents/reviewer.md", &reviewer("b"));
    let out = d.warden(&["agents", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let v = json(&out);
    let agents = v["agents"].as_array().unwrap();
    let names: Vec<&str> = agents.iter().map(|a| a["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["a:fp-a-analyst", "a:reviewer", "b:reviewer"], "{v}");
    let by_name = |n: &str| agents.iter().find(|a| a["name"] == n).unwrap();
    assert_eq!(by_name("a:reviewer")["description"], "Reviews for a");
    assert_eq!(by_name("b:reviewer")["description"], "Reviews for b");
    let analyst = by_name("a:fp-a-analyst");
    assert_eq!(analyst["declared_name"], "a:FP&A Analyst", "{analyst}");
    assert_eq!(analyst["reference"]["metadata"]["disallowed_tools"], r#"["Bash(rm -rf*)"]"#, "{analyst}");
    // The plugin's Stop hook reached its agents (hooks run through Bash, which the host allows them).
    assert!(by_name("a:reviewer")["protocol_data"].as_str().unwrap().contains("./done.sh"));
    let messages = |key: &str| -> Vec<String> {
        v[key].as_array().unwrap().iter().map(|p| p["message"].as_str().unwrap().to_owned()).collect()
    };
    let problems = messages("problems").join("\n");
    assert!(problems.contains("registered as `a:fp-a-analyst`"), "{problems}");
    assert!(problems.contains("plugin `far`: source `github` is not fetched"), "{problems}");
    let notes = messages("notes").join("\n");
    assert!(notes.contains("permissionMode `bypassPermissions` needs `approval.allow_bypass: true`"), "{notes}");
}

#[tokio::test(flavor = "multi_thread")]
async fn initial_prompt_reaches_the_model_before_the_task_prompt() {
    let agent = "---\nname: starter\ndescription: Starts with a note\ntools: []\ninitialPrompt: Read the style guide first.\n---\nYou start.\n";
    let script =
        "- text: \"ok\"\n  expect: { last_user_contains: \"Read the style guide first.\\n\\nreview the change\" }\n";
    let h = claude_host(agent, &[("main", script)], "").await;
    assert_eq!(completed(&h.run("starter", "review the change", &session(), None, None).await), "ok");
}

#[tokio::test(flavor = "multi_thread")]
async fn plan_mode_refuses_a_write_tool_and_allows_reading() {
    let agent = "---\nname: planner\ndescription: Plans\ntools: Read, Write, Glob\npermissionMode: plan\n---\nPlan.\n";
    let script = r#"
- tool_calls: [{ name: Write, arguments: { file_path: "plan.md", content: "should not exist" } }]
- tool_calls: [{ name: Glob, arguments: { pattern: "*" } }]
  expect: { last_tool_result_contains: "plan mode is read-only: Write is not available" }
- text: "planned"
"#;
    let h = claude_host(agent, &[("main", script)], "").await;
    let s = session();
    let (out, events) = h.run_with_events("planner", "make a plan", &s).await;
    assert_eq!(completed(&out), "planned");
    let results = tool_results(&events);
    assert_eq!(
        results,
        [(serde_json::json!("Write"), serde_json::json!(true)), (serde_json::json!("Glob"), serde_json::json!(false))]
    );
    let read = h.parent_tool(&s, "Read", serde_json::json!({ "file_path": "plan.md" })).await;
    assert!(read.is_error, "plan mode wrote a file: {read:?}");
    h.end(&s).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn dont_ask_declines_what_the_policy_would_ask() {
    let agent =
        "---\nname: quiet\ndescription: Never asks\ntools: Read, Write\npermissionMode: dontAsk\n---\nWork quietly.\n";
    let script = r#"
- tool_calls: [{ name: Write, arguments: { file_path: "note.md", content: "x" } }]
- text: "could not write"
  expect: { last_tool_result_contains: "dontAsk mode declines instead of asking" }
"#;
    // Nobody answers asks here: without dontAsk the call would wait the full timeout.
    let policy = "approval:\n  default: deny\n  allow: [Read]\n  ask: [Write]\n  timeout: 2m\n";
    let h = claude_host_with(agent, &[("main", script)], "", policy).await;
    let started = std::time::Instant::now();
    let s = session();
    assert_eq!(completed(&h.run("quiet", "write a note", &s, None, None).await), "could not write");
    assert!(started.elapsed() < std::time::Duration::from_secs(60), "the ask was waited for");
    assert!(h.host.tools.gate().pending().is_empty());
    h.end(&s).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn auto_mode_and_cosmetic_fields_still_run_as_default() {
    let agent =
        "---\nname: eager\ndescription: Auto mode\ntools: Read, Write\npermissionMode: auto\ncolor: red\n---\nWrite.\n";
    let script = r#"
- tool_calls: [{ name: Write, arguments: { file_path: "auto.md", content: "written under auto" } }]
- text: "written"
  expect: { last_tool_result_contains: "auto.md" }
"#;
    let h = claude_host(agent, &[("main", script)], "").await;
    let s = session();
    assert_eq!(completed(&h.run("eager", "write", &s, None, None).await), "written");
    let read = h.parent_tool(&s, "Read", serde_json::json!({ "file_path": "auto.md" })).await;
    assert!(!read.is_error && read.content.contains("written under auto"), "{read:?}");
    h.end(&s).await;
}

/// `background: true`: a task whose caller does not say runs in the background (the API
/// answers 202 with its id at once); a caller that says `false` still waits for the result.
#[test]
fn background_agents_run_in_the_background_unless_the_caller_says() {
    let d = Deployment::new(&format!(
        "  grants:\n    claude: {{ resources: true, log: true, model: true, state: true, events: true }}\n\
         subagents:\n  agent_dirs: [./agents]\nmodels:\n  default: main/scripted\n  providers:\n    main: {{ type: scripted, script: ./main.yaml }}\n\
         sandbox:\n  scope: e2e{}\nstore:\n  path: ./state/tasks.db\n",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    ));
    std::fs::copy(bundled_plugin("claude"), d.dir.path().join("plugins/claude.wasm")).unwrap();
    std::fs::create_dir_all(d.dir.path().join("agents")).unwrap();
    std::fs::write(
        d.dir.path().join("agents/later.md"),
        "---\nname: later\ndescription: Runs in the background\ntools: []\nbackground: true\n---\nAnswer.\n",
    )
    .unwrap();
    std::fs::write(d.dir.path().join("main.yaml"), "- text: \"done later\"\n").unwrap();
    let server = Server::start(&d);
    let port = server.port;
    let task = |bg: Option<bool>| {
        let mut body = serde_json::json!({ "description": "e2e", "prompt": "go", "subagent_type": "later" });
        if let Some(bg) = bg {
            body["run_in_background"] = bg.into();
        }
        body
    };
    let (status, started) = json_of(port, "POST", "/v1/tasks", Some(&task(None)));
    assert_eq!(status, 202, "{started}");
    let id = started["task_id"].as_str().unwrap();
    let (_, done) = json_of(port, "GET", &format!("/v1/tasks/{id}"), None);
    assert_eq!(
        (done["status"].as_str(), done["output"].as_str(), done["background"].as_bool()),
        (Some("completed"), Some("done later"), Some(true)),
        "{done}"
    );
    let (status, waited) = json_of(port, "POST", "/v1/tasks", Some(&task(Some(false))));
    assert_eq!(
        (status, waited["status"].as_str(), waited["output"].as_str()),
        (200, Some("completed"), Some("done later")),
        "{waited}"
    );
}

/// An agent file's `model`: `inherit` is the operator's default, a full `provider/model`
/// id picks that provider (aliases are covered by `model_override_and_aliases_pick_the_provider`).
#[tokio::test(flavor = "multi_thread")]
async fn an_agent_file_s_model_may_be_inherit_or_a_full_id() {
    let scripts: &[(&str, &str)] = &[("main", "- text: from-main\n"), ("other", "- text: from-other\n")];
    for (model, expected) in [("inherit", "from-main"), ("other/scripted", "from-other")] {
        let agent = format!("---\nname: picker\ndescription: Picks a model\ntools: []\nmodel: {model}\n---\nAnswer.\n");
        let h = claude_host(&agent, scripts, "").await;
        assert_eq!(completed(&h.run("picker", "q", &session(), None, None).await), expected, "model: {model}");
    }
}

/// (name, is_error) of every `tool_result` event, in order.
fn tool_results(events: &[serde_json::Value]) -> Vec<(serde_json::Value, serde_json::Value)> {
    events.iter().filter(|e| e["type"] == "tool_result").map(|e| (e["name"].clone(), e["is_error"].clone())).collect()
}

/// Issue 20: an agent file's `effort` reaches an OpenAI-compatible provider as
/// `reasoning_effort` on every model call of its tasks (`max` as the API's `xhigh`); an agent
/// without one sends none, and the scripted provider (no reasoning setting) ignores it.
#[tokio::test(flavor = "multi_thread")]
async fn effort_reaches_an_openai_provider_as_reasoning_effort() {
    let server = FakeOpenAi::start("thought hard");
    for (effort, sent) in [("effort: high\n", Some("high")), ("effort: max\n", Some("xhigh")), ("", None)] {
        let agent =
            format!("---\nname: thinker\ndescription: Thinks\ntools: []\nmodel: local/gpt-test\n{effort}---\nThink.\n");
        let h = claude_host_providers(&agent, &[("main", "- text: scripted\n")], "", &server.provider("local"), "", "")
            .await;
        let before = server.bodies().len();
        assert_eq!(completed(&h.run("thinker", "how hard?", &session(), None, None).await), "thought hard");
        let bodies = server.bodies();
        assert_eq!(bodies.len(), before + 1, "{bodies:?}");
        let body = &bodies[before];
        assert_eq!(body["model"], "gpt-test");
        assert_eq!(body["reasoning_effort"].as_str(), sent, "{effort}: {body}");
        // The same agent on the scripted provider still runs (the effort is ignored there).
        assert_eq!(
            completed(&h.run("thinker", "how hard?", &session(), Some("main/scripted"), None).await),
            "scripted"
        );
    }
}

/// Issue 20: `memory: project` gives the agent a memory directory in its session's
/// workspace: a fresh task's system prompt carries its `MEMORY.md` (read through the gate
/// with the Read tool the agent gets for it), the file it writes there is what the next task
/// of the same user, session and agent starts with, and another session starts empty.
#[tokio::test(flavor = "multi_thread")]
async fn memory_persists_across_tasks_of_a_session_and_reaches_the_system_prompt() {
    let agent = "---\nname: keeper\ndescription: Remembers\ntools: Glob\nmemory: project\n---\nYou keep notes.\n";
    let first = r#"
- expect: { system_contains: "MEMORY.md does not exist yet" }
  tool_calls: [{ name: Write, arguments: { file_path: "/workspace/.claude/agent-memory/keeper/MEMORY.md", content: "- the build uses make\n" } }]
- text: "saved"
  expect: { last_tool_result_contains: "agent-memory/keeper/MEMORY.md" }
"#;
    let second = r###"
- expect: { system_contains: "## MEMORY.md\n\n- the build uses make" }
  text: "remembered"
"###;
    let h = claude_host(agent, &[("first", first), ("second", second)], "").await;
    let s = session();
    let (out, events) = h.run_with_events("keeper", "learn", &s).await;
    assert_eq!(completed(&out), "saved");
    // The memory read is a Read like any other: through the gate, in the task's stream.
    assert_eq!(
        tool_results(&events),
        [(serde_json::json!("Read"), serde_json::json!(true)), (serde_json::json!("Write"), serde_json::json!(false))]
    );
    assert_eq!(completed(&h.run("keeper", "recall", &s, Some("second/scripted"), None).await), "remembered");
    let read =
        h.parent_tool(&s, "Read", serde_json::json!({ "file_path": ".claude/agent-memory/keeper/MEMORY.md" })).await;
    assert!(!read.is_error && read.content.contains("the build uses make"), "{read:?}");
    // Another session of the same user has its own workspace, so its own (empty) memory.
    let other = session();
    assert_eq!(completed(&h.run("keeper", "learn", &other, None, None).await), "saved");
    h.end(&s).await;
    h.end(&other).await;
}

/// Issue 20: `memory: user` follows its user into new sessions. What a task writes in its
/// memory directory in session A is saved in the plugin's state (per user) when the task
/// ends, through the gate (listed with Glob, which the plugin adds to the host's tools,
/// read with Read); a task in a NEW session B of the same user, after A's sandbox is gone,
/// starts with the files back in its directory and MEMORY.md in its system prompt; a session
/// of another user starts empty. (Before: every scope ended with its session.)
#[tokio::test(flavor = "multi_thread")]
async fn user_memory_follows_its_user_into_new_sessions() {
    let agent = "---\nname: keeper\ndescription: Remembers\ntools: Grep\nmemory: user\n---\nYou keep notes.\n";
    let first = r#"
- expect: { system_contains: "MEMORY.md does not exist yet" }
  tool_calls:
    - { name: Write, arguments: { file_path: "/workspace/.claude/agent-memory-user/keeper/MEMORY.md", content: "- the build uses make\n- details: notes/build.md\n" } }
    - { name: Write, arguments: { file_path: "/workspace/.claude/agent-memory-user/keeper/notes/build.md", content: "make -j4 all\n" } }
- text: "saved"
"#;
    let second = r###"
- expect: { system_contains: "## MEMORY.md\n\n- the build uses make\n- details: notes/build.md" }
  tool_calls: [{ name: Read, arguments: { file_path: "/workspace/.claude/agent-memory-user/keeper/notes/build.md" } }]
- expect: { system_contains: "put back in the directory from an earlier session (2 files)" }
  text: "remembered"
"###;
    let third = r#"
- expect: { system_contains: "MEMORY.md does not exist yet" }
  text: "fresh"
"#;
    let h = claude_host(agent, &[("first", first), ("second", second), ("third", third)], "").await;
    let (a, b, c) = (session(), session(), session());
    let (out, events) = h.run_with_events("keeper", "learn", &a).await;
    assert_eq!(completed(&out), "saved");
    let calls: Vec<_> = tool_results(&events).into_iter().map(|(name, _)| name).collect();
    assert_eq!(calls, ["Read", "Glob", "Write", "Write", "Glob", "Read", "Read"], "{events:?}");
    h.end(&a).await;

    assert_eq!(completed(&h.run("keeper", "recall", &b, Some("second/scripted"), None).await), "remembered");
    let read = h
        .parent_tool(&b, "Read", serde_json::json!({ "file_path": ".claude/agent-memory-user/keeper/notes/build.md" }))
        .await;
    assert!(!read.is_error && read.content.contains("make -j4 all"), "{read:?}");

    assert_eq!(completed(&h.run_as("other", "keeper", "learn", &c, Some("third/scripted"), None).await), "fresh");
    let read = h
        .parent_tool_as(
            "other",
            &c,
            "Read",
            serde_json::json!({ "file_path": ".claude/agent-memory-user/keeper/MEMORY.md" }),
        )
        .await;
    assert!(read.is_error, "{read:?}");
    h.end(&b).await;
}

/// `memory: user` notes whose restore the approval gate declines reach the agent neither in
/// its directory nor in its system prompt: the person or policy that said no to writing
/// them back said no to them (the plugin recognises the host's own decline answer). Here
/// the policy allows no Write: session A keeps its note with Bash, session B's restore is
/// denied, and its prompt says so and shows an empty MEMORY.md section. (Before: the
/// prompt showed the declined MEMORY.md anyway.)
#[tokio::test(flavor = "multi_thread")]
async fn user_memory_whose_restore_is_declined_is_not_shown() {
    let agent = "---\nname: keeper\ndescription: Remembers\ntools: Bash\nmemory: user\n---\nYou keep notes.\n";
    let first = r#"
- tool_calls:
    - { name: Bash, arguments: { command: "mkdir -p /workspace/.claude/agent-memory-user/keeper && echo '- planted note' > /workspace/.claude/agent-memory-user/keeper/MEMORY.md" } }
- text: "saved"
"#;
    let second = r###"
- expect: { system_contains: "shown here: MEMORY.md (The Write call was not run: denied by the approval policy" }
  tool_calls: [{ name: Bash, arguments: { command: "true" } }]
- expect: { system_contains: "## MEMORY.md\n\n(empty: MEMORY.md does not exist yet" }
  text: "declined"
"###;
    let policy = "approval:\n  default: deny\n  allow: [Read, Glob, Bash]\n";
    let h = claude_host_with(agent, &[("first", first), ("second", second)], "", policy).await;
    let (a, b) = (session(), session());
    assert_eq!(completed(&h.run("keeper", "learn", &a, None, None).await), "saved");
    h.end(&a).await;
    // The script's expectations check B's system prompt (the host's own decline answer).
    assert_eq!(completed(&h.run("keeper", "recall", &b, Some("second/scripted"), None).await), "declined");
    let read = h
        .parent_tool(&b, "Read", serde_json::json!({ "file_path": ".claude/agent-memory-user/keeper/MEMORY.md" }))
        .await;
    assert!(read.is_error, "{read:?}");
    h.end(&b).await;
}

/// Issue 20: an agent's hooks run in the session's sandbox as Bash calls through the gate.
/// A PreToolUse hook's exit code 2 keeps a Write from running and tells the model why, a
/// PostToolUse hook's `block` reaches the model with the result, and a hook's `allow` never
/// lets through what the policy denies.
#[tokio::test(flavor = "multi_thread")]
async fn hooks_run_in_the_sandbox_and_only_narrow_the_policy() {
    let agent = r#"---
name: guarded
description: Writes behind hooks
tools: Write
hooks:
  PreToolUse:
    - matcher: Write
      hooks:
        - type: command
          command: "grep -q secret && { echo 'secret files are off limits' >&2; exit 2; }; exit 0"
  PostToolUse:
    - matcher: Write
      hooks:
        - type: command
          command: echo '{"decision":"block","reason":"remember to lint"}'
---
Write.
"#;
    let script = r#"
- tool_calls: [{ name: Write, arguments: { file_path: "secret.txt", content: "x" } }]
- tool_calls: [{ name: Write, arguments: { file_path: "ok.txt", content: "fine" } }]
  expect: { last_tool_result_contains: "blocked by a PreToolUse hook: secret files are off limits" }
- text: "done"
  expect: { last_tool_result_contains: "[PostToolUse hook: remember to lint]" }
"#;
    let h = claude_host(agent, &[("main", script)], "").await;
    let s = session();
    let (out, events) = h.run_with_events("guarded", "write", &s).await;
    assert_eq!(completed(&out), "done");
    let names: Vec<&str> =
        events.iter().filter(|e| e["type"] == "tool_call").map(|e| e["name"].as_str().unwrap()).collect();
    // guard (blocks), guard (passes), the Write, the PostToolUse hook
    assert_eq!(names, ["Bash", "Bash", "Write", "Bash"], "{events:?}");
    let secret = h.parent_tool(&s, "Read", serde_json::json!({ "file_path": "secret.txt" })).await;
    assert!(secret.is_error, "the blocked Write ran: {secret:?}");
    let ok = h.parent_tool(&s, "Read", serde_json::json!({ "file_path": "ok.txt" })).await;
    assert!(!ok.is_error && ok.content.contains("fine"), "{ok:?}");
    h.end(&s).await;

    // A hook that says `allow` does not widen the policy: Write is still asked about.
    let agent = r#"---
name: pushy
description: Says allow to everything
tools: Write
hooks:
  PreToolUse:
    - hooks: [{ type: command, command: "echo '{\"hookSpecificOutput\": {\"permissionDecision\": \"allow\"}}'" }]
---
Write.
"#;
    let script = r#"
- tool_calls: [{ name: Write, arguments: { file_path: "pushed.txt", content: "x" } }]
- text: "denied anyway"
  expect: { last_tool_result_contains: "error" }
"#;
    // Nobody answers: the ask the policy makes of Write times out whatever the hook said.
    let policy = "approval:\n  default: deny\n  allow: [Read, Bash]\n  ask: [Write]\n  timeout: 3s\n";
    let h = claude_host_with(agent, &[("main", script)], "", policy).await;
    let s = session();
    let started = std::time::Instant::now();
    let (out, events) = h.run_with_events("pushy", "write", &s).await;
    assert_eq!(completed(&out), "denied anyway");
    assert!(started.elapsed() >= std::time::Duration::from_secs(3), "the ask was not waited for");
    assert_eq!(
        tool_results(&events),
        [(serde_json::json!("Bash"), serde_json::json!(false)), (serde_json::json!("Write"), serde_json::json!(true))]
    );
    let pushed = h.parent_tool(&s, "Read", serde_json::json!({ "file_path": "pushed.txt" })).await;
    assert!(pushed.is_error, "an allowing hook widened the policy: {pushed:?}");
    h.end(&s).await;
}

/// Issue 43: an agent file the operator puts under gVisor (`sandbox.runtime_overrides` by
/// agent directory) runs its Bash, a stdio MCP server and an egress-allowed `curl` under
/// gVisor, in a session of its own: the parent's calls in the same session id run under
/// runc in another container and see none of its files; the sessions listing names both
/// runtimes.
#[tokio::test(flavor = "multi_thread")]
async fn a_subagent_put_under_gvisor_runs_there_and_never_shares_a_runc_session() {
    let port = four_byte_server(b"pong");
    let agent = "---\nname: outsider\ndescription: A third-party agent\ntools: Bash, mcp__time__get_current_time\nmcpServers: [time]\n---\nWork.\n";
    let script = format!(
        "- tool_calls: [{{ name: Bash, arguments: {{ command: \"dmesg | head -n 1; echo made > g.txt; curl -sS --max-time 20 --noproxy '' http://127.0.0.1:{port}/\" }} }}]\n\
         - tool_calls: [{{ name: mcp__time__get_current_time, arguments: {{ timezone: \"UTC\" }} }}]\n  expect: {{ last_tool_result_contains: \"pong\" }}\n\
         - text: \"done\"\n  expect: {{ last_tool_result_contains: \"UTC\" }}\n"
    );
    let tail = format!(
        "  runtime_overrides:\n    - {{ agent_dir: ./agents, runtime: runsc }}\n  egress:\n    allow: [\"127.0.0.1:{port}\"]\n\
         approval:\n  default: deny\n  allow: [Bash, \"mcp__time__*\"]\n\
         mcp_servers:\n  time: {{ type: stdio, command: mcp-server-time, args: [\"--local-timezone\", \"UTC\"] }}\n"
    );
    let h = claude_host_with(agent, &[("main", &script)], "", &tail).await;
    assert_eq!(h.registry.snapshot().definitions["outsider"].runtime.as_deref(), Some("runsc"));
    let s = session();
    let (outcome, events) = h.run_with_events("outsider", "work", &s).await;
    assert_eq!(completed(&outcome), "done");
    let results: Vec<&str> =
        events.iter().filter(|e| e["type"] == "tool_result").map(|e| e["content"].as_str().unwrap()).collect();
    assert!(results[0].contains("Starting gVisor") && results[0].contains("pong"), "gVisor, the proxy: {results:?}");
    assert!(results[1].contains("UTC"), "the stdio MCP server answered under gVisor: {results:?}");
    // The parent's own call in the same session id: runc, another container, not its files.
    let parent = h.parent_tool(&s, "Bash", serde_json::json!({"command": "ls; dmesg 2>&1 | head -n 1"})).await;
    assert!(!parent.content.contains("g.txt") && !parent.content.contains("gVisor"), "{}", parent.content);
    let sandbox = h.host.tools.sandbox().unwrap().clone();
    let rows: Vec<_> = sandbox.list_sessions().await.unwrap().into_iter().filter(|i| i.key.session_id == s).collect();
    let mut runtimes: Vec<_> = rows.iter().map(|i| i.runtime.as_str()).collect();
    runtimes.sort();
    assert_eq!(runtimes, ["runc", "runsc"], "{rows:?}");
    assert_ne!(rows[0].container_id, rows[1].container_id);
    for row in rows {
        sandbox.end_session(&row.key).await.unwrap();
    }
}
