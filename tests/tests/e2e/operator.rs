//! The operator's commands for people without a browser, against a real `warden serve`,
//! a Claude subagent with a scripted model and the real Docker sandbox:
//! `warden approvals` (list, approve, decline) and `warden sandbox end` (one session, or
//! every session idle for longer than a duration).

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::*;

/// The admin token of the deployment's server (`WARDEN_TOKENS`).
const ADMIN_TOKEN: &str = "tok-operator-e2e";

const TOUCHER: &str = "---\nname: toucher\ndescription: Writes notes, then touches a file, which a person must approve\ntools: Write, Bash\nmodel: main/scripted\n---\nTouch.\n";
/// A Write (allowed: the session's sandbox starts), then a Bash call that waits for a person.
const TOUCHER_SCRIPT: &str = r##"
- tool_calls: [{ name: Write, arguments: { file_path: "notes.txt", content: "notes of the toucher\n" } }]
- tool_calls: [{ name: Bash, arguments: { command: "touch approved.txt && echo touched" } }]
- text: "Finished."
"##;

/// The claude plugin, the toucher agent (its `touch` waits for a person) and a scope of
/// its own.
fn toucher_deployment() -> Deployment {
    toucher_deployment_with("")
}

/// [`toucher_deployment`] with more sections at the end (`server:` with principals).
pub fn toucher_deployment_with(tail: &str) -> Deployment {
    let d = Deployment::new(&format!(
        "  grants:\n    claude: {{ log: true, events: true, state: true, resources: true, model: true, tools: true }}\n\
         subagents:\n  agent_dirs: [./agents]\n\
         models:\n  default: main/scripted\n  providers:\n    main: {{ type: scripted, script: ./main.yaml }}\n\
         sandbox:\n  scope: e2e{}\n\
         approval:\n  default: deny\n  allow: [Read, Write, Glob, Grep, \"Bash(echo *)\"]\n  ask: [\"Bash(touch *)\"]\n  timeout: 5m\n  audit_log: ./audit.jsonl\n\
         store:\n  path: ./state/tasks.db\n{tail}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    ));
    let root = d.dir.path();
    std::fs::copy(bundled_plugin("claude"), root.join("plugins/claude.wasm")).unwrap();
    std::fs::create_dir_all(root.join("agents")).unwrap();
    std::fs::write(root.join("agents/toucher.md"), TOUCHER).unwrap();
    std::fs::write(root.join("main.yaml"), TOUCHER_SCRIPT).unwrap();
    d
}

/// `warden ARGS` against the server on `port`, with `token` in `WARDEN_TOKEN`.
fn cli(d: &Deployment, port: u16, token: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(bin());
    cmd.current_dir(d.dir.path())
        .arg("--config")
        .arg(d.dir.path().join("warden.yaml"))
        .args(args)
        .env("WARDEN_URL", format!("http://127.0.0.1:{port}"))
        .env_remove("WARDEN_TOKEN");
    if let Some(t) = token {
        cmd.env("WARDEN_TOKEN", t);
    }
    cmd.output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// One API request as the admin.
fn admin(port: u16, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let (status, text) = http_with(port, method, path, &format!("Authorization: Bearer {ADMIN_TOKEN}\r\n"), body);
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Starts a background toucher task in `session`; returns its id once its Bash call
/// waits at the gate, and that approval as `warden approvals --json` lists it.
fn pending_toucher(d: &Deployment, port: u16, session: &str) -> (String, Value) {
    let body = json!({ "description": "touch", "prompt": "touch it", "subagent_type": "toucher", "session_id": session, "run_in_background": true });
    let (status, r) = admin(port, "POST", "/v1/tasks", Some(&body));
    assert_eq!(status, 202, "{r}");
    let task = r["task_id"].as_str().unwrap().to_owned();
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let out = cli(d, port, Some(ADMIN_TOKEN), &["approvals", "--json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let list = json(&out);
        if let Some(a) = list.as_array().unwrap().iter().find(|a| a["task_id"] == task.as_str()) {
            return (task, a.clone());
        }
        let (_, rec) = admin(port, "GET", &format!("/v1/tasks/{task}?block=false"), None);
        assert!(rec["finished_at_ms"].is_null(), "{task} ended without asking: {rec}");
        assert!(Instant::now() < until, "no approval for {task}: {list}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn finished(port: u16, task: &str) -> Value {
    let (status, r) = admin(port, "GET", &format!("/v1/tasks/{task}?timeout_ms=60000"), None);
    assert_eq!(status, 200, "{r}");
    r
}

fn session_listed(port: u16, session: &str) -> bool {
    let (status, r) = admin(port, "GET", "/v1/sessions", None);
    assert_eq!(status, 200, "{r}");
    let rows = r["sessions"].as_array().unwrap();
    // Each row names the Docker endpoint its container runs on.
    assert!(rows.iter().all(|s| s["docker_host"].as_str().is_some_and(|h| !h.is_empty())), "{r}");
    rows.iter().any(|s| s["session_id"] == session)
}

#[test]
fn approvals_and_sandbox_end_on_the_command_line_against_a_running_server() {
    let d = toucher_deployment();
    let server = Server::start_with_env(&d, &[("WARDEN_TOKENS", ADMIN_TOKEN)]);
    let port = server.port;

    // Without the token: refused, and the message says where the token goes.
    let out = cli(&d, port, None, &["approvals"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("unauthorized") && stderr(&out).contains("WARDEN_TOKEN"), "{}", stderr(&out));

    // Approve: the listed request names who asks; the task goes on and completes.
    let (task, approval) = pending_toucher(&d, port, "ops-approve");
    assert_eq!(
        (approval["tool"].as_str(), approval["subagent"].as_str()),
        (Some("Bash"), Some("toucher")),
        "{approval}"
    );
    assert_eq!(approval["input"]["command"], "touch approved.txt && echo touched", "{approval}");
    let text = cli(&d, port, Some(ADMIN_TOKEN), &["approvals"]);
    let id = approval["id"].as_str().unwrap();
    assert!(stdout(&text).contains(id) && stdout(&text).contains("subagent toucher"), "{}", stdout(&text));
    let out = cli(&d, port, Some(ADMIN_TOKEN), &["approvals", "approve", id, "--scope", "once"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("approved (scope once, by token1)"), "{}", stdout(&out));
    let rec = finished(port, &task);
    assert_eq!((rec["status"].as_str(), rec["output"].as_str()), (Some("completed"), Some("Finished.")), "{rec}");
    // Decided already: an unknown request, exit 1.
    let out = cli(&d, port, Some(ADMIN_TOKEN), &["approvals", "approve", id]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("approval_not_found"), "{}", stderr(&out));

    // Decline: the call does not run; the model reads the refusal and finishes.
    let (task2, approval) = pending_toucher(&d, port, "ops-decline");
    let out = cli(&d, port, Some(ADMIN_TOKEN), &["approvals", "decline", approval["id"].as_str().unwrap()]);
    assert!(out.status.success() && stdout(&out).contains("declined"), "{}", stderr(&out));
    finished(port, &task2);
    let (_, events) = admin(port, "GET", "/v1/approvals", None);
    assert_eq!(events["approvals"], json!([]), "{events}");

    // End one session by id: its container and workspace go.
    assert!(session_listed(port, "ops-approve"));
    let out = cli(&d, port, Some(ADMIN_TOKEN), &["sandbox", "end", "ops-approve"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("ended session ops-approve (user default)"), "{}", stdout(&out));
    assert!(!session_listed(port, "ops-approve"));
    let out = cli(&d, port, Some(ADMIN_TOKEN), &["sandbox", "end", "ops-approve"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));

    // Idle longer than an hour: none; longer than a second: the declined task's session.
    let out = cli(&d, port, Some(ADMIN_TOKEN), &["sandbox", "end", "--idle-over", "1h"]);
    assert!(out.status.success() && stdout(&out).contains("no session idle"), "{}", stdout(&out));
    assert!(session_listed(port, "ops-decline"));
    std::thread::sleep(Duration::from_millis(1100));
    let out = cli(&d, port, Some(ADMIN_TOKEN), &["sandbox", "end", "--idle-over", "1s"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("ended session ops-decline (user default)"), "{}", stdout(&out));
    assert!(!session_listed(port, "ops-decline"));
    // Usage: a session or --idle-over, not neither.
    let out = cli(&d, port, Some(ADMIN_TOKEN), &["sandbox", "end"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let log = std::fs::read_to_string(d.dir.path().join("serve.log")).unwrap();
    assert!(!log.contains(ADMIN_TOKEN), "a token reached the log");
}

/// SIGTERM drains: `/readyz` turns 503 `draining` at once, new tasks are refused with 503
/// `draining`, while the running task still gets its approval through the API, finishes,
/// and only then does the server exit (0) by itself; after a restart the task reads
/// `completed`, not "host restarted".
#[test]
fn sigterm_drains_a_task_waiting_for_approval_then_exits() {
    let d = toucher_deployment();
    let mut server = Server::start_with_env(&d, &[("WARDEN_TOKENS", ADMIN_TOKEN)]);
    let port = server.port;
    let (status, ready) = json_of(port, "GET", "/readyz", None);
    assert_eq!(
        (status, ready["status"].as_str(), ready["checks"]["store"].as_str()),
        (200, Some("ready"), Some("ok")),
        "/readyz needs no token and says ready: {ready}"
    );
    let (task, approval) = pending_toucher(&d, port, "drain-1");
    assert_eq!(json_of(port, "GET", "/readyz", None).1["checks"]["docker"], "ok", "the sandbox is in use");

    let _ = Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status();
    let until = Instant::now() + Duration::from_secs(30);
    let draining = loop {
        let (status, r) = json_of(port, "GET", "/readyz", None);
        if status == 503 {
            break r;
        }
        assert!(Instant::now() < until, "/readyz never turned 503 after SIGTERM: {r}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        (draining["status"].as_str(), draining["unfinished_tasks"].as_u64()),
        (Some("draining"), Some(1)),
        "{draining}"
    );
    let body = json!({ "description": "late", "prompt": "touch it", "subagent_type": "toucher" });
    let (status, refused) = admin(port, "POST", "/v1/tasks", Some(&body));
    assert_eq!((status, refused["error"]["code"].as_str()), (503, Some("draining")), "{refused}");

    // Still serving what the running task needs: its approval.
    let id = approval["id"].as_str().unwrap();
    let (status, r) = admin(port, "POST", &format!("/v1/approvals/{id}"), Some(&json!({ "decision": "approve" })));
    assert_eq!(status, 200, "{r}");
    let until = Instant::now() + Duration::from_secs(120);
    let exit = loop {
        if let Some(s) = server.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < until, "the server did not exit after its last task finished");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(exit.success(), "{exit:?}");
    let log = std::fs::read_to_string(d.dir.path().join("serve.log")).unwrap();
    assert!(log.contains("draining: waiting up to"), "{log}");

    let server = Server::start_with_env(&d, &[("WARDEN_TOKENS", ADMIN_TOKEN)]);
    let (status, rec) = admin(server.port, "GET", &format!("/v1/tasks/{task}"), None);
    assert_eq!(status, 200, "{rec}");
    assert_eq!((rec["status"].as_str(), rec["output"].as_str()), (Some("completed"), Some("Finished.")), "{rec}");
}

/// Issue 50, pause and resume: a session whose every task waits for a person is paused
/// after `pause_when_waiting` (a second here), long before `pause_after` (ten minutes) — no container of it runs, its files
/// are kept — and its task still completes once approved (its call starts the container
/// again). `warden sandbox pause|resume`
/// and the API act on the caller's own sessions; another user's answer 404.
#[test]
fn a_session_waiting_for_approval_is_paused_and_completes_once_approved() {
    let d = toucher_deployment_with(
        "server:\n  principals:\n    - { name: mallory, token_env: PAUSE_E2E_MALLORY, role: user }\n",
    );
    // Idle sessions are paused after ten minutes, ended after thirty: within the test, only
    // the wait for a person (a second of it) pauses it. No warm pool: every running container of the scope
    // is a session's.
    let config = d.dir.path().join("warden.yaml");
    let yaml = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        yaml.replacen(
            "sandbox:\n",
            "sandbox:\n  pause_after: 10m\n  pause_when_waiting: 1s\n  idle_ttl: 30m\n  warm_pool: 0\n",
            1,
        ),
    )
    .unwrap();
    let mallory = "tok-pause-mallory";
    let server = Server::start_with_env(&d, &[("WARDEN_TOKENS", ADMIN_TOKEN), ("PAUSE_E2E_MALLORY", mallory)]);
    let port = server.port;
    let scope = yaml.split("scope: ").nth(1).unwrap().lines().next().unwrap().to_owned();
    let running = || {
        let out = Command::new("docker")
            .args([
                "ps",
                "-q",
                "--filter",
                &format!("label=warden.scope={scope}"),
                "--filter",
                "label=warden.managed=true",
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    let row = |session: &str| {
        let (status, r) = admin(port, "GET", "/v1/sessions", None);
        assert_eq!(status, 200, "{r}");
        r["sessions"].as_array().unwrap().iter().find(|s| s["session_id"] == session).cloned()
    };

    let (task, approval) = pending_toucher(&d, port, "pz-1");
    // The session ran (its Write), then waits for a person: paused a second later.
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        if row("pz-1").is_some_and(|s| s["paused"] == true) {
            break;
        }
        assert!(Instant::now() < until, "the waiting task's session was never paused: {:?}", row("pz-1"));
        std::thread::sleep(Duration::from_millis(200));
    }
    let paused = row("pz-1").unwrap();
    assert_eq!(paused["state"], "exited", "{paused}");
    assert_eq!(running(), 0, "no container of the deployment runs while its one session is paused");
    let (_, rec) = admin(port, "GET", &format!("/v1/tasks/{task}?block=false"), None);
    assert!(rec["finished_at_ms"].is_null(), "still waiting: {rec}");

    // Approved: the call starts the session again and the task completes with its files.
    let out = cli(&d, port, Some(ADMIN_TOKEN), &["approvals", "approve", approval["id"].as_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rec = finished(port, &task);
    assert_eq!((rec["status"].as_str(), rec["output"].as_str()), (Some("completed"), Some("Finished.")), "{rec}");
    for (file, want) in [("notes.txt", "notes of the toucher\n"), ("approved.txt", "")] {
        let (status, body) = http_with(
            port,
            "GET",
            &format!("/v1/sessions/pz-1/files/{file}"),
            &format!("Authorization: Bearer {ADMIN_TOKEN}\r\n"),
            None,
        );
        assert_eq!((status, body.as_str()), (200, want), "{file} kept across the pause");
    }

    // Another user: 404 for the session, by its own id or naming the owner.
    for path in [
        "/v1/sessions/pz-1/pause",
        "/v1/sessions/pz-1/pause?user_id=default",
        "/v1/sessions/pz-1/resume?user_id=default",
    ] {
        let (status, text) = http_with(port, "POST", path, &format!("Authorization: Bearer {mallory}\r\n"), None);
        assert_eq!(status, 404, "{path}: {text}");
        assert!(text.contains("session_not_found"), "{text}");
    }
    let out = cli(&d, port, Some(mallory), &["sandbox", "pause", "pz-1", "--user", "default"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("session_not_found") || stderr(&out).contains("no sandbox session"),
        "{}",
        stderr(&out)
    );

    // The owner (the admin's default user) pauses and resumes on the command line.
    let out = cli(&d, port, Some(ADMIN_TOKEN), &["sandbox", "pause", "pz-1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("paused session pz-1"), "{}", stdout(&out));
    assert_eq!(running(), 0);
    // Nothing else starts it meanwhile: the resume is what does.
    let out = cli(&d, port, Some(ADMIN_TOKEN), &["sandbox", "resume", "pz-1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "resumed session pz-1");
    // Fork on the command line: the copy has the files; its writes stay in it.
    let out = cli(&d, port, Some(ADMIN_TOKEN), &["sandbox", "fork", "pz-1", "pz-1-try"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "forked session pz-1 into pz-1-try");
    let auth = format!("Authorization: Bearer {ADMIN_TOKEN}\r\n");
    let (status, body) = http_with(port, "GET", "/v1/sessions/pz-1-try/files/notes.txt", &auth, None);
    assert_eq!((status, body.as_str()), (200, "notes of the toucher\n"));
    // Another user cannot fork it, nor read or pause the fork; a taken id is a 409.
    let (status, text) = http_with(
        port,
        "POST",
        "/v1/sessions/pz-1/fork?user_id=default",
        &format!("Authorization: Bearer {mallory}\r\n"),
        Some(&json!({ "session_id": "stolen" })),
    );
    assert_eq!(status, 404, "{text}");
    let (status, _) = http_with(
        port,
        "GET",
        "/v1/sessions/pz-1-try/files/notes.txt?user_id=default",
        &format!("Authorization: Bearer {mallory}\r\n"),
        None,
    );
    assert_eq!(status, 404);
    let (status, r) = admin(port, "POST", "/v1/sessions/pz-1/fork", Some(&json!({ "session_id": "pz-1-try" })));
    assert_eq!((status, r["error"]["code"].as_str()), (409, Some("session_exists")), "{r}");
    let (status, r) = admin(port, "POST", "/v1/sessions/pz-1/fork", Some(&json!({ "session": "typo" })));
    assert_eq!((status, r["error"]["code"].as_str()), (400, Some("invalid_field")), "{r}");
    assert!(session_listed(port, "pz-1-try") && !session_listed(port, "stolen"));
    // Snapshots on the command line: take, list, delete; another user's answers 404.
    let out = cli(&d, port, Some(ADMIN_TOKEN), &["sandbox", "snapshot", "take", "pz-1", "v1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "took snapshot v1 of session pz-1");
    let out = cli(&d, port, Some(ADMIN_TOKEN), &["sandbox", "snapshot", "ls", "pz-1"]);
    assert!(out.status.success() && stdout(&out).starts_with("v1  taken "), "{}{}", stdout(&out), stderr(&out));
    let out = cli(&d, port, Some(mallory), &["sandbox", "snapshot", "ls", "pz-1", "--user", "default"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let out = cli(&d, port, Some(ADMIN_TOKEN), &["sandbox", "snapshot", "take", "pz-1", "no/slash"]);
    assert!(!out.status.success() && stderr(&out).contains("invalid snapshot name"), "{}", stderr(&out));
    let out = cli(&d, port, Some(ADMIN_TOKEN), &["sandbox", "snapshot", "rm", "pz-1", "v1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "deleted snapshot v1 of session pz-1");
    // An id that is no session key: a clear 400.
    let (status, r) = admin(port, "POST", &format!("/v1/sessions/{}/pause", "x".repeat(200)), None);
    assert_eq!((status, r["error"]["code"].as_str()), (400, Some("invalid_session_id")), "{r}");
    let (status, r) = admin(port, "POST", "/v1/sessions/never-made/pause", None);
    assert_eq!((status, r["error"]["code"].as_str()), (404, Some("session_not_found")), "{r}");
    let log = std::fs::read_to_string(d.dir.path().join("serve.log")).unwrap();
    assert!(log.contains("session paused"), "the pause is logged");
}
