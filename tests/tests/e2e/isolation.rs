//! Tasks that run in a fork of their parent's session (issues 44 and 50): a Claude agent
//! file with `isolation: worktree` started by another subagent, and any subagent submitted
//! with `isolation: "fork"`, through `warden serve`, the real claude plugin, scripted models
//! and real Docker sandboxes. Each checks the result names the fork and what changed, that
//! the parent's workspace is as it was (and, as a positive control, that the fork's is not),
//! and who may reach the fork.

use serde_json::{Value, json};

use crate::common::*;

/// The admin's token (its tasks and sessions are the `default` user's).
const ADMIN: &str = "tok-isolation-admin";
/// Another user's token.
const MALLORY: &str = "tok-isolation-mallory";
/// A `tool_context` secret of the parent task, exported into its commands.
const PARENT_SECRET: &str = "parent-secret-value-4242";
/// A `tool_context` secret of an isolated task itself, which it writes into a file.
const EDIT_SECRET: &str = "edit-secret-value-77";

/// A deployment with the claude plugin, the agents `(file name, text)` and one scripted
/// provider per `(name, script)`; `sonnet` is the provider `worker` when there is one.
fn deployment(tail: &str, agents: &[(&str, String)], scripts: &[(&str, &str)]) -> Deployment {
    let mut providers = String::new();
    for (name, _) in scripts {
        providers.push_str(&format!("    {name}: {{ type: scripted, script: ./{name}.yaml }}\n"));
    }
    let aliases =
        if scripts.iter().any(|(name, _)| *name == "worker") { "  aliases: { sonnet: worker/scripted }\n" } else { "" };
    let d = Deployment::new(&format!(
        "  grants:\n    claude: {{ resources: true, log: true, model: true, state: true, events: true, tools: true }}\n\
         subagents:\n  agent_dirs: [./agents]\n  max_depth: 2\n\
         models:\n  default: {}/scripted\n{aliases}  providers:\n{providers}\
         sandbox:\n  scope: e2e{}\n  task_env: [PARENT_TOKEN, EDIT_TOKEN]\n\
         server:\n  principals:\n    - {{ name: mallory, token_env: ISOLATION_E2E_MALLORY, role: user }}\n\
         store:\n  path: ./state/tasks.db\n\
         approval:\n  default: deny\n  allow: [Read, Write, Edit, Bash, Glob, Grep, Agent]\n{tail}",
        scripts[0].0,
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    ));
    std::fs::copy(bundled_plugin("claude"), d.dir.path().join("plugins/claude.wasm")).unwrap();
    std::fs::create_dir_all(d.dir.path().join("agents")).unwrap();
    for (file, text) in agents {
        std::fs::write(d.dir.path().join("agents").join(file), text).unwrap();
    }
    for (name, script) in scripts {
        std::fs::write(d.dir.path().join(format!("{name}.yaml")), script).unwrap();
    }
    d
}

fn start(d: &Deployment) -> Server {
    Server::start_with_env(d, &[("WARDEN_TOKENS", ADMIN), ("ISOLATION_E2E_MALLORY", MALLORY)])
}

/// One request with `token`; the status and the body as JSON (`Null` when it is not JSON).
fn call(port: u16, token: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let (status, text) = http_with(port, method, path, &format!("Authorization: Bearer {token}\r\n"), body);
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// A workspace file of the admin's `session`: status and text.
fn file(port: u16, token: &str, session: &str, path: &str) -> (u16, String) {
    let path = format!("/v1/sessions/{session}/files/{path}?user_id=default");
    http_with(port, "GET", &path, &format!("Authorization: Bearer {token}\r\n"), None)
}

/// Every task of the default user, by subagent type (one each in these tests).
fn tasks_by_type(port: u16) -> std::collections::HashMap<String, Value> {
    let (status, list) = call(port, ADMIN, "GET", "/v1/tasks", None);
    assert_eq!(status, 200, "{list}");
    list["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["subagent_type"].as_str().unwrap().to_owned(), t.clone()))
        .collect()
}

/// The issue's "done when": a real-looking agent file with `isolation: worktree`, started
/// by a parent subagent, runs in a fork of the parent's session; its result carries the
/// fork's id and what changed, the parent reads that; the parent's workspace is unchanged
/// while the fork has the file; the parent's secret does not reach the fork (positive
/// control: the parent's own command has it); another user cannot reach the fork.
#[test]
fn a_worktree_agent_started_by_a_subagent_runs_in_a_fork_and_names_it_and_its_changes() {
    let refactorer = std::fs::read_to_string(fixtures().join("synthetic-agents/code-refactorer.md")).unwrap();
    assert!(refactorer.contains("\nisolation: worktree\n") && refactorer.contains("\nmodel: sonnet\n"));
    let lead_agent = "---\nname: lead\ndescription: Leads\nmodel: lead/scripted\ntools: Read, Write, Bash, Agent(code-refactorer)\n---\nYou lead.\n";
    let lead = r#"
- tool_calls: [{ name: Write, arguments: { file_path: "notes.txt", content: "parent's notes\n" } }]
- tool_calls: [{ name: Bash, arguments: { command: "test -n \"${PARENT_TOKEN:-}\" && echo has-token || echo no-token" } }]
- expect: { last_tool_result_contains: "has-token" }
  tool_calls: [{ name: Agent, arguments: { description: "refactor", prompt: "Refactor the notes", subagent_type: code-refactorer } }]
- expect: { last_tool_result_contains: "worker: done" }
  tool_calls: [{ name: Bash, arguments: { command: "ls; cat notes.txt" } }]
- expect: { last_tool_result_contains: "notes.txt\nparent's notes\n" }
  text: "lead: done"
"#;
    let worker = r#"
- expect: { last_user_contains: "Refactor the notes" }
  tool_calls: [{ name: Bash, arguments: { command: "test -n \"${PARENT_TOKEN:-}\" && echo has-token || echo no-token; cat notes.txt" } }]
- expect: { last_tool_result_contains: "no-token\nparent's notes" }
  tool_calls: [{ name: Write, arguments: { file_path: "refactored.py", content: "print('x')\n" } }]
- tool_calls: [{ name: Bash, arguments: { command: "echo refactored >> notes.txt" } }]
- text: "worker: done"
"#;
    let d = deployment(
        "",
        &[("lead.md", lead_agent.to_owned()), ("code-refactorer.md", refactorer)],
        &[("lead", lead), ("worker", worker)],
    );
    let server = start(&d);
    let port = server.port;

    let body = json!({
        "description": "lead", "prompt": "go", "subagent_type": "lead", "session_id": "iso-nest",
        "tool_context": { "PARENT_TOKEN": { "value": PARENT_SECRET, "env": true } }
    });
    let (status, done) = call(port, ADMIN, "POST", "/v1/tasks", Some(&body));
    assert_eq!(
        (status, done["status"].as_str(), done["output"].as_str()),
        (200, Some("completed"), Some("lead: done")),
        "{done}"
    );
    assert_eq!(done["session_id"], "iso-nest", "the parent works in its own session: {done}");
    assert!(done.get("isolation").is_none(), "{done}");

    let tasks = tasks_by_type(port);
    let child = &tasks["code-refactorer"];
    assert_eq!(child["status"], "completed", "{child}");
    let fork = child["session_id"].as_str().unwrap().to_owned();
    assert!(fork.starts_with("iso-nest-fork-"), "{child}");
    let iso = &child["isolation"];
    assert_eq!(
        (iso["mode"].as_str(), iso["forked_from"].as_str(), iso["session_id"].as_str()),
        (Some("fork"), Some("iso-nest"), Some(fork.as_str())),
        "{child}"
    );
    // Not a git repository: the files added and changed, with sizes.
    assert_eq!(iso["changes"]["kind"], "files", "{child}");
    let files = iso["changes"]["files"].as_array().unwrap();
    assert!(files.contains(&json!({ "path": "refactored.py", "change": "added", "size": 11 })), "{child}");
    assert!(
        files.contains(&json!({ "path": "notes.txt", "change": "changed", "size": 26, "old_size": 15 })),
        "{child}"
    );
    assert_eq!(files.len(), 2, "{child}");
    // The text the parent read names the fork and the change (its script checked the answer
    // started with the worker's; the child's output ends with the note).
    let output = child["output"].as_str().unwrap();
    assert!(output.starts_with("worker: done\n\n[isolation: this task ran in session `"), "{output}");
    assert!(
        output.contains(&format!("`{fork}`, a fork of session `iso-nest`"))
            && output.contains("added refactored.py (11 bytes)"),
        "{output}"
    );
    let events = format!("/v1/tasks/{}/events", done["task_id"].as_str().unwrap());
    let (_, text) = http_with(port, "GET", &events, &format!("Authorization: Bearer {ADMIN}\r\n"), None);
    assert!(text.contains("added refactored.py"), "the parent's tool result carries the note: {text}");

    // The parent's workspace is as the parent left it; the fork has the changes.
    assert_eq!(file(port, ADMIN, "iso-nest", "notes.txt"), (200, "parent's notes\n".into()));
    assert_eq!(file(port, ADMIN, "iso-nest", "refactored.py").0, 404, "nothing flows back");
    assert_eq!(file(port, ADMIN, &fork, "refactored.py"), (200, "print('x')\n".into()), "positive control");
    assert_eq!(file(port, ADMIN, &fork, "notes.txt"), (200, "parent's notes\nrefactored\n".into()));
    // The fork is a session of the parent's user; another user cannot reach it.
    let (status, _) = file(port, MALLORY, &fork, "refactored.py");
    assert_eq!(status, 404);
    let (status, r) = call(
        port,
        MALLORY,
        "POST",
        &format!("/v1/sessions/{fork}/fork?user_id=default"),
        Some(&json!({ "session_id": "stolen" })),
    );
    assert_eq!(status, 404, "{r}");
    let (status, r) = call(port, MALLORY, "GET", &format!("/v1/tasks/{}", child["task_id"].as_str().unwrap()), None);
    assert_eq!(status, 404, "{r}");
    // The parent's secret never reached the fork's commands nor any record.
    let log = std::fs::read_to_string(d.dir.path().join("serve.log")).unwrap();
    assert!(!log.contains(PARENT_SECRET) && !text.contains(PARENT_SECRET));
    assert!(log.contains("task runs in a fork of its session"), "{log}");
}

/// `isolation: "fork"` on `POST /v1/tasks` for a subagent whose file says nothing of it, in
/// a git repository: the result is a unified diff of what the task changed (not what was
/// uncommitted before), the repository's own index and the parent's workspace untouched;
/// an unknown value is a 400 naming the field and the accepted values; the Task tool offers
/// the field.
#[test]
fn a_task_with_isolation_fork_in_a_git_repository_reports_a_unified_diff() {
    let agent = |name: &str, model: &str| {
        format!(
            "---\nname: {name}\ndescription: The {name}\nmodel: {model}/scripted\ntools: Read, Write, Edit, Bash\n---\nYou are the {name}.\n"
        )
    };
    // /workspace itself is root-owned (sticky, as /tmp): git works in a repository there
    // when told the directory is safe.
    let setup = r#"
- tool_calls: [{ name: Bash, arguments: { command: "git init -q . && git -c safe.directory=/workspace config user.email e2e@example.com && git -c safe.directory=/workspace config user.name e2e && printf 'one\n' > README.md && git -c safe.directory=/workspace add README.md && git -c safe.directory=/workspace commit -qm init && printf 'draft\n' > draft.txt && echo set-up" } }]
- expect: { last_tool_result_contains: "set-up" }
  text: "ready"
"#;
    let editor = r#"
- tool_calls: [{ name: Edit, arguments: { file_path: "README.md", old_string: "one\n", new_string: "one\ntwo\n" } }]
- tool_calls: [{ name: Write, arguments: { file_path: "src/new.txt", content: "fresh\n" } }]
- tool_calls: [{ name: Bash, arguments: { command: "printf '[filter \"x\"]\\n\\tclean = touch /workspace/filter-ran.txt; cat\\n' >> .git/warden-fork/config && printf '*.md filter=x\\n' > .gitattributes && git --git-dir=.git/warden-fork --work-tree=/workspace -c safe.directory='*' hash-object --path README.md README.md > /dev/null && ls filter-ran.txt && rm filter-ran.txt" } }]
- expect: { last_tool_result_contains: "filter-ran.txt" }
  tool_calls: [{ name: Bash, arguments: { command: "echo \"$EDIT_TOKEN\" > token.txt && rm draft.txt && git -c safe.directory=/workspace status --porcelain" } }]
- expect: { last_tool_result_contains: " M README.md" }
  text: "edited"
"#;
    let d = deployment(
        "",
        &[("setup.md", agent("setup", "setup")), ("editor.md", agent("editor", "editor"))],
        &[("setup", setup), ("editor", editor)],
    );
    let server = start(&d);
    let port = server.port;
    let task = |subagent: &str, extra: Value| {
        let mut body =
            json!({ "description": subagent, "prompt": "go", "subagent_type": subagent, "session_id": "iso-git" });
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        call(port, ADMIN, "POST", "/v1/tasks", Some(&body))
    };

    // Unknown values are refused before anything runs, naming the field and the values.
    for bad in [json!("worktree"), json!("none"), json!(true)] {
        let (status, r) = task("editor", json!({ "isolation": bad }));
        assert_eq!(status, 400, "{bad}: {r}");
        if bad.is_string() {
            assert_eq!(r["error"]["code"], "invalid_field", "{r}");
            let message = r["error"]["message"].as_str().unwrap();
            assert!(message.contains("isolation") && message.contains("accepted: fork"), "{message}");
        }
    }
    let (status, tools) = call(port, ADMIN, "GET", "/v1/tools", None);
    assert_eq!(status, 200);
    assert_eq!(tools["tools"][0]["input_schema"]["properties"]["isolation"]["enum"], json!(["fork"]), "{tools}");

    let (status, ready) = task("setup", json!({}));
    assert_eq!((status, ready["output"].as_str()), (200, Some("ready")), "{ready}");
    let own_secret = json!({ "EDIT_TOKEN": { "value": EDIT_SECRET, "env": true } });
    let (status, done) = task("editor", json!({ "isolation": "fork", "tool_context": own_secret }));
    assert_eq!((status, done["status"].as_str()), (200, Some("completed")), "{done}");
    let fork = done["session_id"].as_str().unwrap().to_owned();
    assert!(fork.starts_with("iso-git-fork-"), "{done}");
    let iso = &done["isolation"];
    assert_eq!(
        (iso["forked_from"].as_str(), iso["session_id"].as_str()),
        (Some("iso-git"), Some(fork.as_str())),
        "{done}"
    );
    assert_eq!(
        (iso["changes"]["kind"].as_str(), iso["changes"]["truncated"].as_bool()),
        (Some("diff"), Some(false)),
        "{done}"
    );
    let diff = iso["changes"]["diff"].as_str().unwrap();
    for part in [
        "diff --git a/README.md b/README.md",
        " one\n+two\n",
        "diff --git a/src/new.txt b/src/new.txt\nnew file mode 100644",
        "+fresh\n",
        "diff --git a/draft.txt b/draft.txt\ndeleted file mode 100644",
        "-draft\n",
        // The task's own secret reached its command (positive control) and is kept scrubbed.
        "diff --git a/token.txt b/token.txt\nnew file mode 100644",
        "+[redacted]\n",
    ] {
        assert!(diff.contains(part), "{part:?} in {diff}");
    }
    assert!(!diff.contains(".git/"), "the repository itself is not in the diff: {diff}");
    // The task planted a filter in the host's repository, live there (its own `git
    // hash-object` ran it: positive control); the host's comparison never ran it.
    assert!(diff.contains("diff --git a/.gitattributes b/.gitattributes"), "{diff}");
    assert!(!diff.contains("filter-ran"), "{diff}");
    let output = done["output"].as_str().unwrap();
    assert!(output.starts_with("edited\n\n[isolation: ") && output.contains("+two"), "{output}");

    // The parent's workspace and repository are unchanged; the fork has the edits.
    assert_eq!(file(port, ADMIN, "iso-git", "README.md"), (200, "one\n".into()));
    assert_eq!(file(port, ADMIN, "iso-git", "draft.txt"), (200, "draft\n".into()));
    assert_eq!(file(port, ADMIN, "iso-git", "src/new.txt").0, 404);
    assert_eq!(file(port, ADMIN, &fork, "README.md"), (200, "one\ntwo\n".into()), "positive control");
    assert_eq!(file(port, ADMIN, &fork, "src/new.txt"), (200, "fresh\n".into()));
    assert_eq!(file(port, ADMIN, &fork, "filter-ran.txt").0, 404, "the planted filter ran in the host's comparison");
    // The host's comparison never touched the repository's own index: the editor's `git
    // status` in the fork (its script) saw its edit unstaged (` M README.md`).
    let (status, r) = call(port, MALLORY, "GET", &format!("/v1/tasks/{}", done["task_id"].as_str().unwrap()), None);
    assert_eq!(status, 404, "{r}");
    // Stored scrubbed, not only shown so: the task store's file never holds the secret.
    drop(server);
    let store = std::fs::read(d.dir.path().join("state/tasks.db")).unwrap();
    assert!(!store.windows(EDIT_SECRET.len()).any(|w| w == EDIT_SECRET.as_bytes()), "the secret is in the store");
    assert!(store.windows(10).any(|w| w == b"[redacted]"), "positive control: the scrubbed diff is stored");
}
