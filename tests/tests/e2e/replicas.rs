//! Replicas (issue 16): three real `warden serve` processes, each with its own
//! `--replica-id` and port, on one fresh PostgreSQL database (`store.url`). Tasks are
//! queued in the database and claimed by whichever replica has a free slot; any replica
//! answers for any task (record, event stream, cancel, approvals); a replica killed with
//! `kill -9` loses its leases and its running tasks end `failed` ("replica lost") while
//! its share of the queue runs elsewhere.
//!
//! The load is the `hostile` test plugin's `sleep:<ms>:<text>` (a progress event, a sleep,
//! then `<text>`): long enough that tasks are running when a replica dies, with an output
//! that names its task. The approval is a Claude subagent (scripted model) whose Bash
//! call the policy marks `ask`, in the real Docker sandbox.
//!
//! The benchmark (`bench_replicas`, ignored): trivial tasks per second end to end with one
//! replica and with three on the same PostgreSQL, beside one server on the embedded redb
//! store, in one run: `cargo test -p warden-e2e --test e2e replicas -- --ignored --nocapture`
//! (`WARDEN_BIN` picks the binary; a release build for absolute figures).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::*;

/// Replicas of the cluster under test.
const REPLICAS: usize = 3;
/// Background tasks submitted round-robin over the replicas.
const TASKS: usize = 300;
/// `server.task_lease`: short, so a dead replica's tasks are declared lost quickly.
const LEASE: Duration = Duration::from_secs(3);
/// `server.max_concurrent_tasks` of each replica: few enough slots that the 300 tasks
/// take tens of seconds, so tasks run (and wait in the queue) when the replica dies.
const SLOTS_PER_REPLICA: usize = 6;
/// Longest the whole run may take after the kill before a task counts as missing.
const RUN_BOUND: Duration = Duration::from_secs(300);
/// How long after the kill the dead replica's running tasks may still read unfinished:
/// the lease, plus the time a live replica takes to notice an expired one, with room
/// for a loaded CI machine.
const LOST_BOUND: Duration = Duration::from_secs(LEASE.as_secs() * 2 + 5);

const TOUCHER: &str = "---\nname: toucher\ndescription: Touches a file, which a person must approve\ntools: Bash\nmodel: main/scripted\n---\nTouch.\n";
/// A Bash call that waits for a person; after approval its output must reach the model.
const TOUCHER_SCRIPT: &str = r##"
- tool_calls: [{ name: Bash, arguments: { command: "touch approved.txt && echo touched" } }]
- expect: { last_tool_result_contains: "touched" }
  text: "Finished."
"##;

/// The deployment the replicas share: the hostile plugin as subagent `sleeper`, the
/// toucher agent, a sandbox scope of its own and the database; with the guard that removes
/// the scope's containers and volumes (drop it after the replicas: each leaves its
/// sessions to the others when it stops, so the last one leaves them behind).
///
/// One user sends the whole load: its share of the cluster (`server.max_tasks_per_user`, a
/// bound for several tenants) is raised to it. Durable tasks are off: this test is about
/// what a kill costs without them (`durable.rs` has the takeover).
fn cluster_deployment(db: &TestDatabase) -> (Deployment, ScopeCleanup) {
    let scope = format!("rep{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let d = Deployment::new(&format!(
        "  limit_overrides:\n    hostile: {{ timeout: 10m }}\n\
         \x20 grants:\n    hostile: {{ events: true }}\n    \
         claude: {{ log: true, events: true, state: true, resources: true, model: true, tools: true }}\n\
         subagents:\n  agent_dirs: [./agents]\n  references:\n    - {{ uri: \"hostile://sleeper\", kind: HOSTILE }}\n\
         models:\n  default: main/scripted\n  providers:\n    main: {{ type: scripted, script: ./main.yaml }}\n\
         sandbox:\n  scope: {scope}\n\
         approval:\n  default: deny\n  allow: [Read, \"Bash(echo *)\"]\n  ask: [\"Bash(touch *)\"]\n  timeout: 5m\n\
         server:\n  max_concurrent_tasks: {SLOTS_PER_REPLICA}\n  max_queued_tasks: 1000\n  max_tasks_per_user: 1000\n  task_lease: {}s\n  durable_tasks: false\n\
         store:\n  url: {}\n",
        LEASE.as_secs(),
        db.url
    ));
    d.add("hostile", "hostile");
    let root = d.dir.path();
    std::fs::copy(bundled_plugin("claude"), root.join("plugins/claude.wasm")).unwrap();
    std::fs::create_dir_all(root.join("agents")).unwrap();
    std::fs::write(root.join("agents/toucher.md"), TOUCHER).unwrap();
    std::fs::write(root.join("main.yaml"), TOUCHER_SCRIPT).unwrap();
    (d, ScopeCleanup(scope))
}

/// The replica ids `r1`, `r2`, ...
fn replica_id(i: usize) -> String {
    format!("r{}", i + 1)
}

/// Every replica's log, for failure messages.
fn logs(d: &Deployment) -> String {
    let mut all = String::new();
    for i in 0..REPLICAS {
        let id = replica_id(i);
        let log = std::fs::read_to_string(d.dir.path().join(format!("serve-{id}.log"))).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        all.push_str(&format!("--- {id} (last 40 lines)\n"));
        for l in tail.iter().rev() {
            all.push_str(l);
            all.push('\n');
        }
    }
    all
}

/// Submits a background task; its id.
fn submit(port: u16, body: &Value) -> String {
    let (status, r) = json_of(port, "POST", "/v1/tasks", Some(body));
    assert_eq!(status, 202, "{r}");
    r["task_id"].as_str().unwrap().to_owned()
}

fn sleeper(ms: u64, text: &str) -> Value {
    json!({ "description": "replicas", "prompt": format!("sleep:{ms}:{text}"), "subagent_type": "sleeper", "run_in_background": true })
}

/// The task record now (no waiting).
fn record(port: u16, task: &str) -> Value {
    let (status, r) = json_of(port, "GET", &format!("/v1/tasks/{task}?block=false"), None);
    assert_eq!(status, 200, "{task}: {r}");
    r
}

/// Waits until `task` runs (status `working`) on some replica; its record.
fn working(port: u16, task: &str, within: Duration) -> Value {
    let until = Instant::now() + within;
    loop {
        let r = record(port, task);
        if r["status"] == "working" && r["replica"].is_string() {
            return r;
        }
        assert!(r["finished_at_ms"].is_null(), "{task} ended before it was seen running: {r}");
        assert!(Instant::now() < until, "{task} not running within {within:?}: {r}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// The `id` and `data` of every frame of an SSE body, heartbeats left out.
fn frames(body: &str) -> Vec<(Option<u64>, Value)> {
    crate::common::sse_frames(body)
}

/// A task's stored events through the API (`GET /v1/tasks/{id}/events` after it finished).
fn events(port: u16, task: &str, last_event_id: Option<u64>) -> Vec<(Option<u64>, Value)> {
    let header = last_event_id.map(|n| format!("Last-Event-ID: {n}\r\n")).unwrap_or_default();
    let (status, body) = http_with(port, "GET", &format!("/v1/tasks/{task}/events"), &header, None);
    assert_eq!(status, 200, "{task}: {body}");
    frames(&body)
}

/// The replica index whose id `record` names.
fn runner(record: &Value) -> usize {
    let id = record["replica"].as_str().unwrap_or_else(|| panic!("no replica in {record}"));
    (0..REPLICAS).find(|&i| replica_id(i) == id).unwrap_or_else(|| panic!("unknown replica {id}: {record}"))
}

/// Done when (issue 16): three replicas on one database, 300 tasks round-robin, a stream,
/// an approval and a cancel across replicas, `kill -9` of a replica mid-run; every task
/// ends once, either completed with its output or — only if the dead replica ran it —
/// failed with "replica lost".
#[test]
fn three_replicas_share_the_queue_stream_approve_cancel_and_survive_a_kill_9() {
    let db = TestDatabase::create();
    let (d, _cleanup) = cluster_deployment(&db);
    let mut servers: Vec<Option<Server>> =
        (0..REPLICAS).map(|i| Some(Server::start_replica(&d, &replica_id(i)))).collect();
    let ports: Vec<u16> = servers.iter().map(|s| s.as_ref().unwrap().port).collect();
    for &port in &ports {
        let (status, ready) = json_of(port, "GET", "/readyz", None);
        assert_eq!((status, ready["checks"]["store"].as_str()), (200, Some("ok")), "{ready}\n{}", logs(&d));
    }

    // The approval: submitted to r1; wherever it runs, every replica lists it.
    let touch = json!({ "description": "touch", "prompt": "touch it", "subagent_type": "toucher", "session_id": "rep-touch", "run_in_background": true });
    let approval_task = submit(ports[0], &touch);
    let until = Instant::now() + Duration::from_secs(120);
    let approval = loop {
        let (_, list) = json_of(ports[1], "GET", "/v1/approvals", None);
        if let Some(a) = list["approvals"].as_array().unwrap().iter().find(|a| a["task_id"] == approval_task.as_str()) {
            break a.clone();
        }
        let r = record(ports[2], &approval_task);
        assert!(r["finished_at_ms"].is_null(), "{approval_task} ended without asking: {r}\n{}", logs(&d));
        assert!(Instant::now() < until, "no approval listed for {approval_task}: {list}\n{}", logs(&d));
        std::thread::sleep(Duration::from_millis(100));
    };
    let approval_runner = runner(&record(ports[0], &approval_task));

    // A task to cancel and a task to stream, claimed before the load (the queue is FIFO).
    let to_cancel = submit(ports[1], &sleeper(300_000, "never"));
    let streamed = submit(ports[2], &sleeper(8_000, "streamed"));
    // The load: task i prints "task i" after 0.5-2 s.
    let load: Vec<String> = (0..TASKS)
        .map(|i| submit(ports[i % REPLICAS], &sleeper(500 + (i as u64 * 97) % 1500, &format!("task {i}"))))
        .collect();

    // The stream: from a replica that does not run the task, until its finish event.
    let s = working(ports[0], &streamed, Duration::from_secs(60));
    let stream_from = (runner(&s) + 1) % REPLICAS;
    let stream_port = ports[stream_from];
    let stream_task = streamed.clone();
    let stream = std::thread::spawn(move || {
        let t = Instant::now();
        let (status, body) = http(stream_port, "GET", &format!("/v1/tasks/{stream_task}/events"), None);
        (status, body, t.elapsed())
    });

    // Every replica lists the pending approval; one that does not run the task decides it.
    for (i, &port) in ports.iter().enumerate() {
        let (status, list) = json_of(port, "GET", "/v1/approvals", None);
        assert_eq!(status, 200, "{list}");
        let ids: Vec<&str> = list["approvals"].as_array().unwrap().iter().filter_map(|a| a["id"].as_str()).collect();
        assert!(ids.contains(&approval["id"].as_str().unwrap()), "{} does not list {approval}: {list}", replica_id(i));
    }
    let decide_on = (approval_runner + 2) % REPLICAS;
    let (status, decided) = json_of(
        ports[decide_on],
        "POST",
        &format!("/v1/approvals/{}", approval["id"].as_str().unwrap()),
        Some(&json!({ "decision": "approve", "scope": "once" })),
    );
    assert_eq!((status, decided["decision"].as_str()), (200, Some("approve")), "{decided}\n{}", logs(&d));

    // The cancel: through a replica that does not run the task.
    let cancel_runner = runner(&working(ports[2], &to_cancel, Duration::from_secs(60)));
    let cancel_on = (cancel_runner + 1) % REPLICAS;
    let (status, canceled) = json_of(ports[cancel_on], "POST", &format!("/v1/tasks/{to_cancel}/cancel"), None);
    assert_eq!(status, 200, "cancel of {to_cancel} on {}: {canceled}\n{}", replica_id(cancel_on), logs(&d));
    let (_, c) = json_of(ports[cancel_on], "GET", &format!("/v1/tasks/{to_cancel}?timeout_ms=20000"), None);
    assert_eq!(
        (c["status"].as_str(), c["finish_reason"].as_str(), c["replica"].as_str()),
        (Some("canceled"), Some("canceled"), Some(replica_id(cancel_runner).as_str())),
        "canceled through {}: {c}\n{}",
        replica_id(cancel_on),
        logs(&d)
    );

    // The stream ended with the finish event, live from the other replica.
    let (status, body, took) = stream.join().unwrap();
    assert_eq!(status, 200, "{body}");
    let streamed_events = frames(&body);
    let types: Vec<&str> = streamed_events.iter().map(|(_, e)| e["type"].as_str().unwrap_or("")).collect();
    assert!(types.contains(&"progress"), "no plugin event streamed: {body}");
    let (_, last) = streamed_events.last().unwrap_or_else(|| panic!("empty stream: {body}"));
    assert_eq!(
        (last["type"].as_str(), last["status"].as_str(), last["output"].as_str()),
        (Some("finish"), Some("completed"), Some("streamed")),
        "{body}"
    );
    let ids: Vec<u64> = streamed_events.iter().map(|(id, _)| id.expect("every event has an id")).collect();
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>(), "each event once, in order: {body}");
    // (Whether it was followed live depends on the machine's speed: the sleeper may have
    // ended before the stream opened. Timings decide nothing here.)
    let _ = took;
    // Reconnecting to yet another replica with Last-Event-ID: exactly the later events.
    let again = events(ports[(stream_from + 1) % REPLICAS], &streamed, Some(2));
    assert_eq!(again, streamed_events[2..].to_vec(), "Last-Event-ID 2 on another replica");

    // kill -9 a replica that runs load tasks now (never the approval's: it must complete).
    let (_, listed) = json_of(ports[approval_runner], "GET", "/v1/tasks?limit=500", None);
    let mut running: Vec<Vec<String>> = vec![vec![]; REPLICAS];
    for t in listed["tasks"].as_array().unwrap() {
        if t["status"] == "working"
            && let Some(r) = t["replica"].as_str()
            && let Some(i) = (0..REPLICAS).find(|&i| replica_id(i) == r)
        {
            running[i].push(t["task_id"].as_str().unwrap().to_owned());
        }
    }
    let victim = (0..REPLICAS).filter(|&i| i != approval_runner).max_by_key(|&i| running[i].len()).unwrap();
    assert!(
        !running[victim].is_empty(),
        "no load task runs on a replica but the approval's: {running:?}\n{}",
        logs(&d)
    );
    let mut dead = servers[victim].take().unwrap();
    dead.child.kill().unwrap(); // SIGKILL: no shutdown code runs, the leases just stop
    dead.child.wait().unwrap();
    let killed_at = Instant::now();
    let victim_id = replica_id(victim);
    let alive: Vec<u16> = (0..REPLICAS).filter(|&i| i != victim).map(|i| ports[i]).collect();

    // The dead replica's running tasks end within about a lease.
    for t in &running[victim] {
        let left = LOST_BOUND.saturating_sub(killed_at.elapsed());
        let (_, r) = json_of(alive[0], "GET", &format!("/v1/tasks/{t}?timeout_ms={}", left.as_millis().max(1)), None);
        assert!(
            !r["finished_at_ms"].is_null(),
            "{t} of the killed {victim_id} unfinished {:?} after the kill: {r}\n{}",
            killed_at.elapsed(),
            logs(&d)
        );
    }
    let lost_after = killed_at.elapsed();

    // The approved task completes with its Bash call's output seen by the model.
    let (_, r) = json_of(alive[1], "GET", &format!("/v1/tasks/{approval_task}?timeout_ms=120000"), None);
    assert_eq!(
        (r["status"].as_str(), r["output"].as_str()),
        (Some("completed"), Some("Finished.")),
        "{r}\n{}",
        logs(&d)
    );
    let ran: Vec<Value> = events(alive[0], &approval_task, None).into_iter().map(|(_, e)| e).collect();
    assert!(
        ran.iter().any(|e| e["type"] == "tool_result" && e["name"] == "Bash" && e["is_error"] != true),
        "the approved Bash call did not run: {ran:?}"
    );

    // Every task ends; none twice; only the dead replica's may be lost.
    let all: Vec<(&str, Option<String>)> = load
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), Some(format!("task {i}"))))
        .chain([
            (streamed.as_str(), Some("streamed".to_owned())),
            (approval_task.as_str(), Some("Finished.".to_owned())),
        ])
        .chain([(to_cancel.as_str(), None)])
        .collect();
    let deadline = killed_at + RUN_BOUND;
    let mut claimed_by: BTreeMap<String, usize> = BTreeMap::new();
    let mut lost = vec![];
    for (k, (task, expected)) in all.iter().enumerate() {
        let port = alive[k % alive.len()];
        let left = deadline.saturating_duration_since(Instant::now()).as_millis().max(1);
        let (status, r) = json_of(port, "GET", &format!("/v1/tasks/{task}?timeout_ms={left}"), None);
        assert_eq!(status, 200, "{task} missing: {r}");
        assert!(!r["finished_at_ms"].is_null(), "{task} unfinished {RUN_BOUND:?} after the kill: {r}\n{}", logs(&d));
        let on = r["replica"].as_str().unwrap_or_else(|| panic!("{task} ran on no replica: {r}")).to_owned();
        *claimed_by.entry(on.clone()).or_default() += 1;
        match (r["status"].as_str(), expected) {
            (Some("completed"), Some(out)) => assert_eq!(r["output"].as_str(), Some(out.as_str()), "{task}: {r}"),
            (Some("canceled"), None) => {}
            (Some("failed"), Some(_)) => {
                assert_eq!(r["finish_reason"], "replica_lost", "{task}: {r}\n{}", logs(&d));
                assert!(r["error"].as_str().unwrap_or("").contains("replica lost"), "{task}: {r}");
                assert_eq!(on, victim_id, "{task} lost though {on} (alive) ran it: {r}");
                lost.push(task.to_string());
            }
            _ => panic!("{task}: unexpected end (expected {expected:?}): {r}\n{}", logs(&d)),
        }
        // Its stored events, through the API: exactly one finish, last, agreeing with the record.
        let evs = events(port, task, None);
        let finishes: Vec<&Value> = evs.iter().map(|(_, e)| e).filter(|e| e["type"] == "finish").collect();
        assert_eq!(finishes.len(), 1, "{task} has {} finish events: {evs:?}", finishes.len());
        assert_eq!(evs.last().unwrap().1["type"], "finish", "{task}: the finish is not last: {evs:?}");
        assert_eq!(finishes[0]["status"], r["status"], "{task}: finish event and record disagree: {evs:?}\n{r}");
    }
    assert!(!lost.is_empty(), "the kill of {victim_id} (running {:?}) lost nothing", running[victim]);
    let ids: BTreeSet<String> = (0..REPLICAS).map(replica_id).collect();
    assert_eq!(claimed_by.keys().cloned().collect::<BTreeSet<_>>(), ids, "every replica claims tasks: {claimed_by:?}");

    // Metrics: every sample of a replica names it.
    for &i in &[(victim + 1) % REPLICAS, (victim + 2) % REPLICAS] {
        let (status, text) = http(ports[i], "GET", "/metrics", None);
        assert_eq!(status, 200, "{text}");
        let label = format!("replica=\"{}\"", replica_id(i));
        let unlabeled: Vec<&str> =
            text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty() && !l.contains(&label)).collect();
        assert!(unlabeled.is_empty(), "samples of {} without {label}: {unlabeled:?}", replica_id(i));
    }
    println!(
        "replicas: {} tasks, {} lost with the killed {victim_id} (its running tasks ended {lost_after:?} after the \
         kill), claimed {claimed_by:?}",
        all.len(),
        lost.len()
    );
    drop(servers);
}

/// One deployment of the benchmark: its servers (one, or the replicas of a cluster).
struct Setup {
    name: &'static str,
    /// Stopped before their deployment's directory goes.
    servers: Vec<Server>,
    _d: Deployment,
}

/// The echo plugin as subagent `greeter` on the given store section.
fn echo_deployment(store: &str) -> Deployment {
    let d = Deployment::new(&format!(
        "  grants:\n    echo: {{ log: true, events: true, state: true }}\n\
         subagents:\n  agent_dirs: []\n  references:\n    - {{ uri: \"echo://greeter\", kind: ECHO }}\n{store}"
    ));
    d.add("echo", "echo");
    d
}

/// `n` synchronous trivial tasks from `clients` concurrent clients, round-robin over the
/// setup's servers; tasks per second.
async fn fire(http: &reqwest::Client, setup: &Setup, n: usize, clients: usize) -> f64 {
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let bases: std::sync::Arc<Vec<String>> =
        std::sync::Arc::new(setup.servers.iter().map(|s| format!("http://127.0.0.1:{}/v1/tasks", s.port)).collect());
    let started = Instant::now();
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            let (http, next, bases) = (http.clone(), next.clone(), bases.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= n {
                        return;
                    }
                    let body =
                        json!({ "description": "bench", "prompt": format!("ping {i}"), "subagent_type": "greeter" });
                    let resp = http
                        .post(&bases[i % bases.len()])
                        .header("content-type", "application/json")
                        .body(body.to_string())
                        .send()
                        .await
                        .unwrap();
                    let status = resp.status().as_u16();
                    let v: Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
                    assert_eq!((status, v["output"].as_str()), (200, Some(format!("ping {i}").as_str())), "{v}");
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    n as f64 / started.elapsed().as_secs_f64()
}

/// BENCHMARKS.md `## Replicas`: trivial tasks (the `echo` test plugin, synchronous
/// `POST /v1/tasks`) per second end to end, from `WARDEN_REPLICA_CLIENTS` (default 64)
/// concurrent clients, `WARDEN_REPLICA_TASKS` (default 1000) tasks per round: one server
/// on the embedded redb store, one replica on PostgreSQL, three replicas on another
/// PostgreSQL database of the same server (clients round-robin over them). Rounds
/// alternate the setups so drift of the machine hits all alike; the median round counts.
#[test]
#[ignore = "benchmark: run explicitly"]
fn bench_replicas() {
    const ROUNDS: usize = 3;
    let n: usize = std::env::var("WARDEN_REPLICA_TASKS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let clients: usize = std::env::var("WARDEN_REPLICA_CLIENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
    let (db1, db3) = (TestDatabase::create(), TestDatabase::create());
    let redb = echo_deployment("store:\n  path: ./state/tasks.db\n");
    let one = echo_deployment(&format!("store:\n  url: {}\n", db1.url));
    let three = echo_deployment(&format!("store:\n  url: {}\n", db3.url));
    let setups = vec![
        Setup { name: "redb, 1 server", servers: vec![Server::start(&redb)], _d: redb },
        Setup { name: "PostgreSQL, 1 replica", servers: vec![Server::start_replica(&one, "r1")], _d: one },
        Setup {
            name: "PostgreSQL, 3 replicas",
            servers: (0..3).map(|i| Server::start_replica(&three, &replica_id(i))).collect(),
            _d: three,
        },
    ];
    // A runtime of its own: the test databases are made and dropped outside it.
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let rates = rt.block_on(async {
        let http = reqwest::Client::new();
        for s in &setups {
            fire(&http, s, 100, clients).await; // warm-up: instances, connections
        }
        let mut rates: Vec<Vec<f64>> = vec![vec![]; setups.len()];
        for _ in 0..ROUNDS {
            for (k, s) in setups.iter().enumerate() {
                rates[k].push(fire(&http, s, n, clients).await);
            }
        }
        rates
    });
    let median = |v: &Vec<f64>| {
        let mut v = v.clone();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let medians: Vec<f64> = rates.iter().map(median).collect();
    println!(
        "replicas: {n} trivial tasks per round, {clients} concurrent clients, {ROUNDS} alternating rounds (median)"
    );
    println!("| setup | tasks/s | rounds | vs redb | vs 1 replica |");
    println!("|---|---:|---|---:|---:|");
    for (k, s) in setups.iter().enumerate() {
        let rounds: Vec<String> = rates[k].iter().map(|r| format!("{r:.0}")).collect();
        println!(
            "| {} | {:.0} | {} | {:.2}x | {:.2}x |",
            s.name,
            medians[k],
            rounds.join(", "),
            medians[k] / medians[0],
            medians[k] / medians[1]
        );
    }
    drop(setups);
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate (P-256, one day),
/// made with the `openssl` CLI in `dir`: `ca.pem`, `server.pem`/`server.key`,
/// `client.pem`/`client.key`.
fn make_certs(dir: &std::path::Path) {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl").current_dir(dir).args(args).output().expect("the openssl CLI");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    run(&[
        &["req", "-x509", "-days", "1", "-subj", "/CN=warden-e2e-ca", "-keyout", "ca.key", "-out", "ca.pem"][..],
        &key,
        &["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=keyCertSign,cRLSign"],
    ]
    .concat());
    for (name, ext) in [
        ("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ] {
        let (k, csr, crt, extfile) =
            (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"), format!("{name}.ext"));
        run(&[&["req", "-subj", &format!("/CN=warden-e2e-{name}"), "-keyout", &k, "-out", &csr][..], &key].concat());
        std::fs::write(dir.join(&extfile), ext).unwrap();
        run(&[
            "x509",
            "-req",
            "-days",
            "1",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-extfile",
            &extfile,
        ]);
    }
}

/// The sandbox tests' TLS proxy (`sandbox/tests/support/tls_proxy.py`: client
/// certificates verified against `ca.pem`) in front of the local Docker socket on `port`;
/// killed when dropped.
struct TlsProxy {
    child: std::process::Child,
    port: u16,
}

impl TlsProxy {
    fn start(certs: &std::path::Path) -> TlsProxy {
        let port = free_port();
        let socket = warden_sandbox::config::DEFAULT_DOCKER_ENDPOINT.trim_start_matches("unix://");
        let child = std::process::Command::new(python())
            .arg(repo().join("sandbox/tests/support/tls_proxy.py"))
            .arg(port.to_string())
            .args([certs.join("server.pem"), certs.join("server.key"), certs.join("ca.pem")])
            .arg(socket)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < until, "the TLS proxy never listened on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        TlsProxy { child, port }
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `sandbox.hosts` entry of the TLS endpoint `proxy` (client certificate of `certs`).
fn tls_host_entry(certs: &std::path::Path, proxy: &TlsProxy) -> String {
    let c = |f: &str| certs.join(f).display().to_string();
    format!(
        "    - endpoint: tcp://127.0.0.1:{}\n      tls: {{ ca: {}, cert: {}, key: {} }}\n",
        proxy.port,
        c("ca.pem"),
        c("client.pem"),
        c("client.key")
    )
}

/// `sandbox.hosts` (indented for the `sandbox:` section): the local socket, then `proxy`.
fn local_and_tls_hosts(certs: &std::path::Path, proxy: &TlsProxy) -> String {
    format!(
        "  hosts:\n    - endpoint: {}\n{}",
        warden_sandbox::config::DEFAULT_DOCKER_ENDPOINT,
        tls_host_entry(certs, proxy)
    )
}

/// The deployment of the two-host tests: replicas on `db` with one slot each, the `sleeper`
/// (hostile plugin) and Claude agents of `./agents`, models `providers` (the default named
/// by the second), sessions of `scope` over the local socket and the TLS endpoint `tls`,
/// `sandbox` lines added to the section, `allow` as the only tools allowed, and every
/// replica's audit lines in `audit.jsonl`.
fn two_host_cluster(
    db: &TestDatabase,
    tls: (&std::path::Path, &TlsProxy),
    scope: &str,
    (providers, default): (&str, &str),
    sandbox: &str,
    allow: &str,
) -> Deployment {
    let d = Deployment::new(&format!(
        "  limit_overrides:\n    hostile: {{ timeout: 10m }}\n\
         \x20 grants:\n    hostile: {{ events: true }}\n    \
         claude: {{ log: true, events: true, state: true, resources: true, model: true, tools: true }}\n\
         subagents:\n  agent_dirs: [./agents]\n  references:\n    - {{ uri: \"hostile://sleeper\", kind: HOSTILE }}\n\
         models:\n  default: {default}/scripted\n  providers:\n{providers}\
         sandbox:\n  scope: {scope}\n  warm_pool: 0\n{}{sandbox}\
         approval:\n  default: deny\n  allow: [{allow}]\n  audit_log: ./audit.jsonl\n\
         server:\n  max_concurrent_tasks: 1\n  task_lease: {}s\n\
         store:\n  url: {}\n",
        local_and_tls_hosts(tls.0, tls.1),
        LEASE.as_secs(),
        db.url
    ));
    d.add("hostile", "hostile");
    std::fs::copy(bundled_plugin("claude"), d.dir.path().join("plugins/claude.wasm")).unwrap();
    std::fs::create_dir_all(d.dir.path().join("agents")).unwrap();
    d
}

/// Done when (issue 16): sessions are placed over two Docker endpoints (the local socket
/// and a TLS TCP endpoint in front of the same engine), and a session keeps its container
/// across replicas: a file one replica's task writes is read by the next task of the
/// session on the other replica. Each replica has one slot, and a `sleeper` task keeps the
/// writer's replica busy, so the reader can only run on the other one.
#[test]
fn a_session_keeps_its_container_on_its_docker_host_across_replicas() {
    let db = TestDatabase::create();
    let certs = tempfile::tempdir().unwrap();
    make_certs(certs.path());
    let proxy = TlsProxy::start(certs.path());
    let tcp = format!("tcp://127.0.0.1:{}", proxy.port);
    let sessions = ["sess-a", "sess-b"];
    let mut providers = String::new();
    for s in sessions {
        providers.push_str(&format!("    w-{s}: {{ type: scripted, script: ./w-{s}.yaml }}\n    r-{s}: {{ type: scripted, script: ./r-{s}.yaml }}\n"));
    }
    let scope = format!("rep{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    // Dropped last: every replica leaves its sessions to the others, so with all of them
    // stopped nothing would remove the scope's containers and volumes.
    let _cleanup = ScopeCleanup(scope.clone());
    let d = two_host_cluster(&db, (certs.path(), &proxy), &scope, (&providers, "w-sess-a"), "", "Read, Write");
    let root = d.dir.path();
    for s in sessions {
        for (role, tools) in [("w", "Write"), ("r", "Read")] {
            std::fs::write(
                root.join(format!("agents/{role}-{s}.md")),
                format!("---\nname: {role}-{s}\ndescription: {tools} in {s}\ntools: {tools}\nmodel: {role}-{s}/scripted\n---\n{tools}.\n"),
            )
            .unwrap();
        }
        std::fs::write(
            root.join(format!("w-{s}.yaml")),
            format!("- tool_calls: [{{ name: Write, arguments: {{ file_path: \"note.txt\", content: \"written in {s}\" }} }}]\n- text: wrote\n"),
        )
        .unwrap();
        std::fs::write(
            root.join(format!("r-{s}.yaml")),
            format!("- tool_calls: [{{ name: Read, arguments: {{ file_path: \"note.txt\" }} }}]\n- expect: {{ last_tool_result_contains: \"written in {s}\" }}\n  text: read\n"),
        )
        .unwrap();
    }
    let servers: Vec<Server> = (0..2).map(|i| Server::start_replica(&d, &replica_id(i))).collect();
    let ports: Vec<u16> = servers.iter().map(|s| s.port).collect();
    let run = |port: u16, agent: &str, session: &str| -> Value {
        let body = json!({ "description": "session", "prompt": "go", "subagent_type": agent, "session_id": session });
        let (status, r) = json_of(port, "POST", "/v1/tasks", Some(&body));
        assert_eq!((status, r["status"].as_str()), (200, Some("completed")), "{agent} in {session}: {r}\n{}", logs(&d));
        r
    };
    let hosts = |port: u16| -> BTreeMap<String, Vec<String>> {
        let (status, r) = json_of(port, "GET", "/v1/sessions", None);
        assert_eq!(status, 200, "{r}");
        let mut by_session: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for row in r["sessions"].as_array().unwrap() {
            by_session
                .entry(row["session_id"].as_str().unwrap().to_owned())
                .or_default()
                .push(row["docker_host"].as_str().unwrap().to_owned());
        }
        by_session
    };

    // The writers, one after the other (each placement sees the other's container).
    let writers: Vec<usize> = sessions.iter().map(|s| runner(&run(ports[0], &format!("w-{s}"), s))).collect();
    let placed = hosts(ports[1]);
    let on: BTreeSet<&str> = sessions.iter().map(|s| placed[*s][0].as_str()).collect();
    assert_eq!(
        on,
        BTreeSet::from([warden_sandbox::config::DEFAULT_DOCKER_ENDPOINT, tcp.as_str()]),
        "one session per host: {placed:?}"
    );

    // Each reader runs on the replica that did not write: the writer's replica is kept
    // busy by a sleeper (started until it lands there; a sleeper on the other is canceled).
    for (s, &writer) in sessions.iter().zip(&writers) {
        let mut sleepers = vec![];
        let blocked = loop {
            let t = submit(ports[0], &sleeper(120_000, "blocker"));
            let on = runner(&working(ports[0], &t, Duration::from_secs(60)));
            sleepers.push(t);
            if on == writer {
                break sleepers;
            }
            assert!(sleepers.len() < 3, "a sleeper never ran on {}: {sleepers:?}", replica_id(writer));
        };
        for t in &blocked[..blocked.len() - 1] {
            let (status, r) = json_of(ports[0], "POST", &format!("/v1/tasks/{t}/cancel"), None);
            assert_eq!(status, 200, "{r}");
        }
        let read = run(ports[writer], &format!("r-{s}"), s);
        assert_eq!(read["output"], "read", "{read}");
        assert_ne!(runner(&read), writer, "the reader ran where the writer did: {read}");
        let (status, r) = json_of(ports[0], "POST", &format!("/v1/tasks/{}/cancel", blocked.last().unwrap()), None);
        assert_eq!(status, 200, "{r}");
    }
    // Still one container per session, where it was placed.
    assert_eq!(hosts(ports[0]), placed, "a session moved or got a second container");
    drop(servers);
}

/// An HTTP server on 127.0.0.1 (its port) answering `cred` when a request carries
/// `X-Token: Bearer <token>` and `none` otherwise (never echoing the header).
fn credential_server(token: &'static str) -> u16 {
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut s in server.incoming().flatten() {
            let mut buf = vec![0u8; 16 * 1024];
            let n = s.read(&mut buf).unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
            let body: &[u8] = if head.contains(&format!("x-token: bearer {token}")) { b"cred" } else { b"none" };
            let _ = s.write_all(
                &[b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\n".as_slice(), body].concat(),
            );
        }
    });
    port
}

/// Done when (issue 49): `sandbox.egress` with two replicas on PostgreSQL and two Docker
/// hosts (the local socket and a TLS endpoint). A session made by one replica is used by a
/// task on the other: the allowed server is reached with the task's injected credential,
/// the server the task's list leaves out and a host the operator never allowed are
/// refused, and the task's stream shows the decisions; after `kill -9` of the replica that
/// made the session, the other one's calls in it work under the same policy. A second
/// session is placed on the other Docker host and gets the same.
#[test]
fn egress_follows_a_session_across_replicas_and_docker_hosts() {
    const TOKEN: &str = "s3cret-egress-49";
    let db = TestDatabase::create();
    let certs = tempfile::tempdir().unwrap();
    make_certs(certs.path());
    let proxy = TlsProxy::start(certs.path());
    let tcp = format!("tcp://127.0.0.1:{}", proxy.port);
    let (allowed, left_out) = (credential_server(TOKEN), credential_server(TOKEN));
    let scope = format!("rep{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let _cleanup = ScopeCleanup(scope.clone());
    let egress = format!("  egress:\n    allow: [\"127.0.0.1:{allowed}\", \"127.0.0.1:{left_out}\"]\n");
    let providers = "    main: { type: scripted, script: ./main.yaml }\n";
    let d = two_host_cluster(&db, (certs.path(), &proxy), &scope, (providers, "main"), &egress, "Bash");
    let root = d.dir.path();
    std::fs::write(
        root.join("agents/fetcher.md"),
        "---\nname: fetcher\ndescription: Fetches\ntools: Bash\nmodel: main/scripted\n---\nFetch.\n",
    )
    .unwrap();
    let curl = |p: u16| format!("curl -sS --max-time 20 --noproxy '' http://127.0.0.1:{p}/");
    std::fs::write(
        root.join("main.yaml"),
        format!(
            "- tool_calls: [{{ name: Bash, arguments: {{ command: \"{}; echo; {}; echo; curl -sS --max-time 20 http://1.1.1.1/; echo\" }} }}]\n\
             - text: \"fetched\"\n  expect: {{ last_tool_result_contains: \"cred\" }}\n",
            curl(allowed),
            curl(left_out)
        ),
    )
    .unwrap();
    let mut servers: Vec<Option<Server>> = (0..2).map(|i| Some(Server::start_replica(&d, &replica_id(i)))).collect();
    let ports: Vec<u16> = servers.iter().map(|s| s.as_ref().unwrap().port).collect();
    let fetch = |port: u16, session: &str| -> Value {
        let body = json!({
            "description": "fetch", "prompt": "go", "subagent_type": "fetcher", "session_id": session,
            "egress": [format!("127.0.0.1:{allowed}")],
            "tool_context": { "token": { "value": TOKEN, "inject": { "host": format!("127.0.0.1:{allowed}"), "header": "X-Token", "format": "Bearer {}" } } },
        });
        let (status, r) = json_of(port, "POST", "/v1/tasks", Some(&body));
        assert_eq!((status, r["status"].as_str()), (200, Some("completed")), "{session}: {r}\n{}", logs(&d));
        r
    };
    // What a fetch's Bash call saw, and the egress decisions in its stream.
    let check = |port: u16, task: &Value, what: &str| {
        let id = task["task_id"].as_str().unwrap();
        let evs: Vec<Value> = events(port, id, None).into_iter().map(|(_, e)| e).collect();
        let result = evs.iter().find(|e| e["type"] == "tool_result").unwrap_or_else(|| panic!("{what}: {evs:?}"));
        let content = result["content"].as_str().unwrap();
        let lines: Vec<&str> = content.lines().collect();
        assert_eq!(lines.first(), Some(&"cred"), "{what}: the allowed server, with the injected credential: {content}");
        assert!(
            content.contains(&format!("127.0.0.1:{left_out} is outside the egress list of the task (egress)")),
            "{what}: the task's list applies: {content}"
        );
        assert!(content.contains("no allow entry names 1.1.1.1:80"), "{what}: {content}");
        assert!(!content.contains(TOKEN), "{what}: the credential never reaches the sandbox");
        let egress: Vec<&Value> = evs.iter().filter(|e| e["type"] == "egress").collect();
        assert!(
            egress.iter().any(|e| e["allowed"] == true && e["port"] == allowed && e["credential"].is_string()),
            "{what}: {egress:?}"
        );
        assert!(egress.iter().any(|e| e["allowed"] == false && e["port"] == left_out), "{what}: {egress:?}");
    };

    // The session is made by whichever replica runs the first task; the second task runs on
    // the other one (the maker is kept busy by a sleeper).
    let first = fetch(ports[0], "eg-a");
    check(ports[0], &first, "first task");
    let maker = runner(&first);
    let mut sleepers = vec![];
    loop {
        let t = submit(ports[0], &sleeper(120_000, "blocker"));
        let on = runner(&working(ports[0], &t, Duration::from_secs(60)));
        sleepers.push(t);
        if on == maker {
            break;
        }
        assert!(sleepers.len() < 3, "a sleeper never ran on {}: {sleepers:?}", replica_id(maker));
    }
    for t in &sleepers[..sleepers.len() - 1] {
        let (status, r) = json_of(ports[0], "POST", &format!("/v1/tasks/{t}/cancel"), None);
        assert_eq!(status, 200, "{r}");
    }
    let other = 1 - maker;
    let second = fetch(ports[other], "eg-a");
    assert_eq!(runner(&second), other, "{second}");
    check(ports[other], &second, "on the replica that did not make the session");

    // kill -9 of the maker: the other replica's calls in the session keep the policy.
    let mut dead = servers[maker].take().unwrap();
    dead.child.kill().unwrap();
    let _ = dead.child.wait();
    let third = fetch(ports[other], "eg-a");
    check(ports[other], &third, "after kill -9 of the maker");

    // The audit log (both replicas append to it) has the decisions, never the credential.
    let audit = std::fs::read_to_string(root.join("audit.jsonl")).unwrap();
    assert!(!audit.contains(TOKEN), "the credential is never in the audit log");
    let lines: Vec<Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &Value| v["event"] == "egress" && v["session_id"] == "eg-a")
        .collect();
    assert!(lines.iter().any(|l| l["decision"] == "allow" && l["port"] == allowed), "{audit}");
    assert!(lines.iter().any(|l| l["decision"] == "deny" && l["port"] == left_out), "{audit}");

    // A second session goes to the other Docker host, and is served alike.
    let remote = fetch(ports[other], "eg-b");
    check(ports[other], &remote, "second session");
    let (status, r) = json_of(ports[other], "GET", "/v1/sessions", None);
    assert_eq!(status, 200, "{r}");
    let on: BTreeSet<&str> =
        r["sessions"].as_array().unwrap().iter().filter_map(|s| s["docker_host"].as_str()).collect();
    assert_eq!(
        on,
        BTreeSet::from([warden_sandbox::config::DEFAULT_DOCKER_ENDPOINT, tcp.as_str()]),
        "one session per Docker host: {r}"
    );
    drop(servers);
}

/// An HTTPS server on 127.0.0.1 (`server.pem` of `certs`, made by [`make_certs`]) answering
/// every request `ok`; killed when dropped.
struct TlsServer(std::process::Child, u16);

impl TlsServer {
    fn start(certs: &std::path::Path) -> TlsServer {
        let port = free_port();

        let child = std::process::Command::new(python())
            .arg(repo().join("sandbox/tests/support/https_server.py"))
            .arg(port.to_string())
            .args([certs.join("server.pem"), certs.join("server.key")])
            .spawn()
            .unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < until, "the HTTPS server never listened on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        TlsServer(child, port)
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// BENCHMARKS.md `## Egress with replicas and remote hosts`: an HTTPS request (CONNECT,
/// TLS handshake, GET) from a sandbox through the egress proxy to a server on the host, as
/// curl inside the sandbox times it (`time_total`), with one server on the local Docker
/// socket, with two replicas on PostgreSQL (each connection judged with the board's
/// narrowings, each call claiming its channel), and with one server whose only Docker host
/// is the TLS endpoint (the channel through the Docker API over TLS). Each task's Bash call
/// makes `WARDEN_EGRESS_REQUESTS` (default 20) requests in a row; rounds alternate the
/// setups; the median request of all rounds counts.
#[test]
#[ignore = "benchmark: run explicitly"]
fn bench_egress() {
    const ROUNDS: usize = 5;
    let n: usize = std::env::var("WARDEN_EGRESS_REQUESTS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let db = TestDatabase::create();
    let certs = tempfile::tempdir().unwrap();
    make_certs(certs.path());
    let docker_tls = TlsProxy::start(certs.path());
    let https = TlsServer::start(certs.path());
    // A scope per setup: a server without a replica id takes its scope's leftovers for its own.
    let scopes: Vec<String> =
        (0..3).map(|i| format!("beg{i}{}", &uuid::Uuid::new_v4().simple().to_string()[..10])).collect();
    let _cleanup: Vec<ScopeCleanup> = scopes.iter().cloned().map(ScopeCleanup).collect();
    let deployment = |scope: &str, hosts: &str, store: &str| -> Deployment {
        let d = Deployment::new(&format!(
            "  limit_overrides:\n    claude: {{ timeout: 10m }}\n\
             \x20 grants:\n    claude: {{ log: true, events: true, state: true, resources: true, model: true, tools: true }}\n\
             subagents:\n  agent_dirs: [./agents]\n\
             models:\n  default: main/scripted\n  providers:\n    main: {{ type: scripted, script: ./main.yaml }}\n\
             sandbox:\n  scope: {scope}\n  warm_pool: 0\n{hosts}  egress:\n    allow: [\"127.0.0.1:{}\"]\n\
             approval:\n  default: deny\n  allow: [Bash]\n{store}",
            https.1
        ));
        let root = d.dir.path();
        std::fs::copy(bundled_plugin("claude"), root.join("plugins/claude.wasm")).unwrap();
        std::fs::create_dir_all(root.join("agents")).unwrap();
        std::fs::write(
            root.join("agents/fetcher.md"),
            "---\nname: fetcher\ndescription: Fetches\ntools: Bash\nmodel: main/scripted\n---\nFetch.\n",
        )
        .unwrap();
        // A chain, not a loop: the gate allows what it fully understands without asking.
        let one = format!("curl -k -sS -o /dev/null -w '%{{time_total}} ' --noproxy '' https://127.0.0.1:{}/", https.1);
        let command = vec![one; n].join("; ");
        std::fs::write(
            root.join("main.yaml"),
            format!("- tool_calls: [{{ name: Bash, arguments: {{ command: \"{command}\" }} }}]\n- text: \"fetched\"\n"),
        )
        .unwrap();
        d
    };
    let remote = format!("  hosts:\n{}", tls_host_entry(certs.path(), &docker_tls));
    let setups: Vec<(&str, Deployment, Vec<Server>)> = {
        let single = deployment(&scopes[0], "", "");
        let replicas = deployment(&scopes[1], "", &format!("store:\n  url: {}\n", db.url));
        let tls = deployment(&scopes[2], &remote, "");
        let s1 = vec![Server::start(&single)];
        let s2 = (0..2).map(|i| Server::start_replica(&replicas, &replica_id(i))).collect();
        let s3 = vec![Server::start(&tls)];
        vec![
            ("1 server, local Docker socket", single, s1),
            ("2 replicas on PostgreSQL, local Docker socket", replicas, s2),
            ("1 server, remote Docker host (TLS)", tls, s3),
        ]
    };
    // One request list per task: the times curl printed, in ms.
    let dirs: Vec<std::path::PathBuf> = setups.iter().map(|(_, d, _)| d.dir.path().to_path_buf()).collect();
    let log_of = |k: usize| -> String {
        let mut all = String::new();
        for f in ["serve.log", "serve-r1.log", "serve-r2.log"] {
            let log = std::fs::read_to_string(dirs[k].join(f)).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            all.extend(tail.into_iter().rev().map(|l| format!("{l}\n")));
        }
        all
    };
    let run = |name: &str, servers: &[Server], round: usize| -> Vec<f64> {
        let k = setups.iter().position(|(n, ..)| *n == name).unwrap();
        let port = servers[round % servers.len()].port;
        let session = "bench";
        let body = json!({ "description": "bench", "prompt": "go", "subagent_type": "fetcher", "session_id": session, "run_in_background": true });
        let task = submit(port, &body);
        let until = Instant::now() + Duration::from_secs(600);
        let r = loop {
            let r = record(port, &task);
            if !r["finished_at_ms"].is_null() || Instant::now() > until {
                break r;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(r["status"].as_str(), Some("completed"), "{name}: {r}\n{}", log_of(k));
        let evs: Vec<Value> = events(port, r["task_id"].as_str().unwrap(), None).into_iter().map(|(_, e)| e).collect();
        let content = evs.iter().find(|e| e["type"] == "tool_result").unwrap()["content"].as_str().unwrap().to_owned();
        let times: Vec<f64> =
            content.split_whitespace().filter_map(|t| t.parse::<f64>().ok()).map(|s| s * 1e3).collect();
        assert_eq!(times.len(), n, "{name}: every request answered: {content}");
        times
    };
    for (name, _, servers) in &setups {
        run(name, servers, 0); // warm-up: the session's container, its channel
    }
    let mut all: Vec<Vec<f64>> = vec![vec![]; setups.len()];
    for round in 0..ROUNDS {
        for (k, (name, _, servers)) in setups.iter().enumerate() {
            all[k].extend(run(name, servers, round));
        }
    }
    let quantile = |v: &Vec<f64>, q: f64| {
        let mut v = v.clone();
        v.sort_by(f64::total_cmp);
        v[((v.len() as f64 * q) as usize).min(v.len() - 1)]
    };
    println!("egress: {n} HTTPS requests per task, {ROUNDS} alternating rounds; curl's time_total in the sandbox");
    println!("| setup | median | p90 | vs 1 server |");
    println!("|---|---:|---:|---:|");
    let base = quantile(&all[0], 0.5);
    for (k, (name, ..)) in setups.iter().enumerate() {
        let (m, p) = (quantile(&all[k], 0.5), quantile(&all[k], 0.9));
        println!("| {name} | {m:.1} ms | {p:.1} ms | {:.2}x |", m / base);
    }
    drop(setups);
}
