//! Native unit tests of the pure modules, with a scripted [`Host`].

use std::collections::{HashMap, VecDeque};

use serde_json::{Value, json};

use warden_guest::Error;
use warden_guest::http::{Request, Response, StreamHead};

use crate::card::{self, Version};
use crate::exec::{self, Call, ChunkStream, Host, Plan};
use crate::proto::{self, Event, State, Tracker};
use crate::sse::SseParser;

// ------------------------------------------------------------------ cards

fn fixtures() -> std::path::PathBuf {
    let p = std::env::var_os("WARDEN_FIXTURES")
        .filter(|v| !v.is_empty())
        .map(|d| std::path::PathBuf::from(d).join("a2a-cards"))
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/a2a-cards"));
    assert!(p.is_dir(), "card fixtures missing at {}", p.display());
    p
}

fn fixture_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(fixture_files(&p));
        } else if p.extension().is_some_and(|x| x == "json") {
            out.push(p);
        }
    }
    out.sort();
    out
}

#[test]
fn every_valid_fixture_card_resolves_and_invalid_ones_name_the_problem() {
    let files = fixture_files(&fixtures());
    assert_eq!(files.len(), 13, "expected the 13 fixture cards");
    let url = "http://127.0.0.1:9/.well-known/agent-card.json";
    let mut invalid = 0;
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        let r = card::parse_card(&bytes, url, None);
        if f.to_string_lossy().contains("/invalid/") {
            invalid += 1;
            let e = r.expect_err(&format!("{} must be rejected", f.display()));
            assert!(e.contains("field `"), "{}: {e}", f.display());
        } else {
            let info = r.unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            assert!(!info.name.is_empty());
            assert!(info.endpoint.starts_with("http"), "{}: {}", f.display(), info.endpoint);
        }
    }
    assert_eq!(invalid, 2);
}

#[test]
fn invalid_fixture_errors_name_fields() {
    let dir = fixtures().join("a2aproject-A2A/invalid");
    let e = card::parse_card(
        &std::fs::read(dir.join("cli-testdata-invalid-missing-required.json")).unwrap(),
        "http://h/",
        None,
    )
    .unwrap_err();
    for f in ["capabilities", "defaultInputModes", "defaultOutputModes", "skills"] {
        assert!(e.contains(&format!("missing required field `{f}`")), "{e}");
    }
    let e = card::parse_card(
        &std::fs::read(dir.join("cli-testdata-invalid-invalid-format.json")).unwrap(),
        "http://h/",
        None,
    )
    .unwrap_err();
    assert!(e.contains("field `name` must be a string, found a number"), "{e}");
    assert!(e.contains("field `protocolVersion` must be a string"), "{e}");
    assert!(e.contains("field `capabilities` must be an object"), "{e}");
    assert!(e.contains("missing required field `skills[0].id`"), "{e}");
}

fn base_card() -> Value {
    json!({
        "name": "A", "description": "d", "version": "1", "capabilities": {},
        "defaultInputModes": ["text/plain"], "defaultOutputModes": ["text/plain"], "skills": []
    })
}

fn parse(card: &Value, forced: Option<Version>) -> Result<card::CardInfo, String> {
    card::parse_card(card.to_string().as_bytes(), "http://h:1/x/.well-known/agent-card.json", forced)
}

#[test]
fn picks_jsonrpc_and_prefers_1_0() {
    let mut c = base_card();
    c["supportedInterfaces"] = json!([
        {"url": "http://h/grpc", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
        {"url": "http://h/v03", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
        {"url": "http://h/v10", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
    ]);
    let i = parse(&c, None).unwrap();
    assert_eq!((i.endpoint.as_str(), i.version), ("http://h/v10", Version::V1_0));
    let i = parse(&c, Some(Version::V0_3)).unwrap();
    assert_eq!((i.endpoint.as_str(), i.version), ("http://h/v03", Version::V0_3));
}

#[test]
fn legacy_cards_use_url_and_0_3() {
    let mut c = base_card();
    c["url"] = json!("http://h/rpc");
    c["preferredTransport"] = json!("JSONRPC");
    c["protocolVersion"] = json!("0.3.0");
    c["capabilities"] = json!({"streaming": true});
    let i = parse(&c, None).unwrap();
    assert_eq!((i.endpoint.as_str(), i.version, i.streaming), ("http://h/rpc", Version::V0_3, true));
    // Older cards: no version at all.
    c.as_object_mut().unwrap().remove("protocolVersion");
    c.as_object_mut().unwrap().remove("preferredTransport");
    assert_eq!(parse(&c, None).unwrap().version, Version::V0_3);
    // Forcing a version the card does not offer names what it offers.
    let e = parse(&c, Some(Version::V1_0)).unwrap_err();
    assert!(e.contains("protocol_version 1.0") && e.contains("0.3"), "{e}");
    // additionalInterfaces: a JSON-RPC one behind a preferred gRPC one.
    c["preferredTransport"] = json!("GRPC");
    c["additionalInterfaces"] = json!([{"url": "http://h/jr", "transport": "JSONRPC"}]);
    assert_eq!(parse(&c, None).unwrap().endpoint, "http://h/jr");
}

#[test]
fn no_jsonrpc_interface_is_an_error_and_no_endpoint_means_the_card_base() {
    let mut c = base_card();
    c["supportedInterfaces"] = json!([{"url": "http://h/g", "protocolBinding": "GRPC"}]);
    let e = parse(&c, None).unwrap_err();
    assert!(e.contains("no JSON-RPC interface") && e.contains("GRPC"), "{e}");
    let c = base_card();
    let i = parse(&c, None).unwrap();
    assert_eq!((i.endpoint.as_str(), i.version), ("http://h:1/x/", Version::V1_0));
    let mut c = base_card();
    c["supportedInterfaces"] = json!([{"url": "/a2a", "transport": "jsonrpc"}]);
    assert_eq!(parse(&c, None).unwrap().endpoint, "http://h:1/a2a");
}

#[test]
fn card_urls_and_versions() {
    assert_eq!(
        card::card_urls("http://h:1/"),
        vec!["http://h:1/.well-known/agent-card.json", "http://h:1/.well-known/agent.json"]
    );
    assert_eq!(card::card_urls("http://h/cards/x.json"), vec!["http://h/cards/x.json"]);
    assert_eq!(Version::parse("1.0.2"), Some(Version::V1_0));
    assert_eq!(Version::parse("0.2.5"), Some(Version::V0_3));
    assert_eq!(Version::parse("2.0"), None);
}

// ------------------------------------------------------------------ proto

#[test]
fn parses_1_0_and_0_3_results_alike() {
    let v10 = json!({"task": {"id": "t", "contextId": "c", "status": {"state": "TASK_STATE_INPUT_REQUIRED",
        "message": {"role": "ROLE_AGENT", "parts": [{"text": "Name?"}]}}}});
    let v03 = json!({"kind": "task", "id": "t", "contextId": "c", "status": {"state": "input-required",
        "message": {"kind": "message", "role": "agent", "parts": [{"kind": "text", "text": "Name?"}]}}});
    for r in [v10, v03] {
        let mut t = Tracker::default();
        t.apply(proto::parse_result(&r).unwrap());
        assert_eq!(t.state, Some(State::InputRequired));
        assert_eq!(t.status_text.as_deref(), Some("Name?"));
        assert_eq!((t.task_id.as_deref(), t.context_id.as_deref()), (Some("t"), Some("c")));
    }
    // GetTask in 1.0 returns a bare task.
    let bare = json!({"id": "t", "status": {"state": "TASK_STATE_COMPLETED"}, "artifacts": [{"artifactId": "a", "parts": [{"text": "x"}, {"data": {"k": 1}}]}]});
    let mut t = Tracker::default();
    t.apply(proto::parse_result(&bare).unwrap());
    assert_eq!(t.result_text(), "x\n{\"k\":1}");
}

#[test]
fn artifacts_append_and_result_prefers_artifacts() {
    let mut t = Tracker::default();
    for (i, append) in [(1, false), (2, true), (3, true)] {
        let parts = vec![proto::Part::Text(format!("p{i} "))];
        t.apply(Event::Artifact { task_id: Some("t".into()), artifact_id: "r".into(), parts, append });
    }
    t.apply(
        proto::parse_result(&json!({"statusUpdate": {"taskId": "t", "status": {"state": "TASK_STATE_COMPLETED",
        "message": {"role": "ROLE_AGENT", "parts": [{"text": "done"}]}}}}))
        .unwrap(),
    );
    assert_eq!(t.result_text(), "p1 p2 p3");
    let mut t = Tracker::default();
    t.apply(
        proto::parse_result(&json!({"kind": "message", "role": "agent", "parts": [{"kind": "text", "text": "hi"}]}))
            .unwrap(),
    );
    assert_eq!((t.state, t.result_text().as_str()), (Some(State::Completed), "hi"));
}

#[test]
fn requests_follow_each_version() {
    let m = proto::user_message(Version::V1_0, "m", "hi", Some("c"), Some("t"));
    assert_eq!(
        m,
        json!({"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}], "contextId": "c", "taskId": "t"})
    );
    let m = proto::user_message(Version::V0_3, "m", "hi", None, None);
    assert_eq!(
        m,
        json!({"kind": "message", "messageId": "m", "role": "user", "parts": [{"kind": "text", "text": "hi"}]})
    );
    assert!(proto::headers(Version::V1_0, false).contains(&("A2A-Version".into(), "1.0".into())));
    assert!(!proto::headers(Version::V0_3, false).iter().any(|(k, _)| k == "A2A-Version"));
    assert_eq!(proto::method(Version::V0_3, proto::Op::Cancel), "tasks/cancel");
    assert_eq!(proto::method(Version::V1_0, proto::Op::Get), "GetTask");
}

#[test]
fn rpc_errors_are_named() {
    let e = proto::parse_response(br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"Task not found"}}"#)
        .unwrap_err();
    assert_eq!(e.to_string(), "A2A error -32001: Task not found");
}

// ------------------------------------------------------------------ sse

#[test]
fn sse_events_across_chunk_boundaries() {
    let mut p = SseParser::new();
    let mut got = Vec::new();
    for chunk in ["data: {\"a\"", ":1}\r", "\n\r\n: comment\nevent: x\ndata: l1\ndata: l2\n", "\n", "data: tail"] {
        got.extend(p.feed(chunk.as_bytes()).unwrap().into_iter().map(|e| e.data));
    }
    got.extend(p.finish().unwrap().map(|e| e.data));
    assert_eq!(got, vec!["{\"a\":1}", "l1\nl2", "tail"]);
}

/// The guest's own parser rescanned the unfinished line on every chunk and drained its
/// buffer once per line: a trickled line (or a chunk of blank lines) burnt the task's
/// deadline in CPU. The shared parser examines each byte once.
#[test]
fn regression_a2a_sse_parsing_was_quadratic_in_a_trickled_line() {
    let mut p = SseParser::new();
    let n = 100_000;
    for _ in 0..n {
        assert!(p.feed(b"x").unwrap().is_empty());
    }
    assert!(p.feed(&vec![b'\n'; n]).unwrap().is_empty(), "a line without a field is no event");
    assert_eq!(p.scanned(), 2 * n as u64);
    // A newline-free stream is refused at the line bound instead of growing to the body cap.
    let mut p = SseParser::new();
    let big = vec![b'x'; crate::sse::MAX_SSE_LINE + 1];
    assert!(p.feed(&big).is_err());
}

// ------------------------------------------------------------------ exec

#[derive(Default)]
struct Fake {
    now: u64,
    /// Milliseconds each request takes.
    latency: u64,
    responses: VecDeque<Result<Value, Error>>,
    stream: Option<(Vec<String>, Option<Error>)>,
    requests: Vec<(String, Value, Option<String>)>,
    events: Vec<Value>,
    state: HashMap<String, Vec<u8>>,
    /// The warden task is canceled from this time on (ms).
    cancel_at: Option<u64>,
}

struct Chunks(VecDeque<Vec<u8>>, Option<Error>);

impl ChunkStream for Chunks {
    fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, Error> {
        match self.0.pop_front() {
            Some(c) => Ok(Some(c)),
            None => match self.1.take() {
                Some(e) => Err(e),
                None => Ok(None),
            },
        }
    }
}

impl Fake {
    fn record(&mut self, req: &Request) -> Value {
        let body: Value = serde_json::from_slice(req.body.as_deref().unwrap_or(b"null")).unwrap();
        let version = req.headers.iter().find(|(k, _)| k == "A2A-Version").map(|(_, v)| v.clone());
        self.requests.push((body["method"].as_str().unwrap_or("GET").to_string(), body.clone(), version));
        body
    }
    fn methods(&self) -> Vec<&str> {
        self.requests.iter().map(|(m, _, _)| m.as_str()).collect()
    }
}

fn rpc_ok(result: Value) -> Result<Value, Error> {
    Ok(json!({"jsonrpc": "2.0", "id": 1, "result": result}))
}

impl Host for Fake {
    fn send(&mut self, req: Request) -> Result<Response, Error> {
        self.now += self.latency;
        self.record(&req);
        let body = self.responses.pop_front().expect("unexpected request")?;
        Ok(Response { status: 200, headers: vec![], body: body.to_string().into_bytes() })
    }
    fn send_streaming(&mut self, req: Request) -> Result<(StreamHead, Box<dyn ChunkStream>), Error> {
        self.record(&req);
        let (events, err) = self.stream.take().expect("unexpected stream");
        let chunks = events.into_iter().map(|e| format!("data: {e}\n\n").into_bytes()).collect();
        let head = StreamHead { status: 200, headers: vec![("content-type".into(), "text/event-stream".into())] };
        Ok((head, Box::new(Chunks(chunks, err))))
    }
    fn emit(&mut self, kind: &str, data: &Value) {
        assert_eq!(kind, "progress");
        self.events.push(data.clone());
    }
    fn state_get(&mut self, key: &str) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.state.get(key).cloned())
    }
    fn state_set(&mut self, key: &str, value: &[u8]) -> Result<(), Error> {
        self.state.insert(key.into(), value.to_vec());
        Ok(())
    }
    fn state_delete(&mut self, key: &str) {
        self.state.remove(key);
    }
    fn now_ms(&mut self) -> u64 {
        self.now
    }
    fn sleep_ms(&mut self, ms: u64) -> Result<(), Error> {
        if let Some(at) = self.cancel_at.filter(|at| self.now + ms >= *at) {
            self.now = self.now.max(at);
            return Err(Error::Canceled("the task was canceled while it slept".into()));
        }
        self.now += ms;
        Ok(())
    }
    fn canceled(&mut self) -> bool {
        self.cancel_at.is_some_and(|at| self.now >= at)
    }
    fn log(&mut self, _: &str) {}
}

fn plan(version: Version, streaming: bool) -> Plan {
    Plan { endpoint: "http://h/".into(), version, streaming, auth_secret: None }
}

fn call<'a>(task: &'a str, prompt: &'a str, resume: Option<&'a str>) -> Call<'a> {
    Call { task_id: task, prompt, resume, deadline_ms: 30_000 }
}

fn task(state: &str, text: Option<&str>, artifact: Option<&str>) -> Value {
    let mut t = json!({"id": "rt", "contextId": "rc", "status": {"state": state}});
    if let Some(x) = text {
        t["status"]["message"] = json!({"role": "ROLE_AGENT", "parts": [{"text": x}]});
    }
    if let Some(a) = artifact {
        t["artifacts"] = json!([{"artifactId": "a", "parts": [{"text": a}]}]);
    }
    json!({ "task": t })
}

#[test]
fn blocking_send_completes_with_artifact_text() {
    let mut h = Fake::default();
    h.responses.push_back(rpc_ok(task("TASK_STATE_COMPLETED", None, Some("echo: hi"))));
    let out = exec::execute(&mut h, plan(Version::V1_0, false), &call("w1", "hi", None)).unwrap();
    assert_eq!(out, "echo: hi");
    assert_eq!(h.methods(), vec!["SendMessage"]);
    let (_, body, version) = &h.requests[0];
    assert_eq!(version.as_deref(), Some("1.0"));
    assert_eq!(body["params"]["message"]["parts"][0]["text"], "hi");
    assert_eq!(body["params"]["message"]["messageId"], "warden-w1");
}

#[test]
fn retries_reuse_the_message_id() {
    let mut h = Fake::default();
    h.responses.push_back(Err(Error::Remote("connection refused".into())));
    h.responses.push_back(rpc_ok(json!({"kind": "task", "id": "rt", "status": {"state": "completed"},
        "artifacts": [{"artifactId": "a", "parts": [{"kind": "text", "text": "ok"}]}]})));
    let out = exec::execute(&mut h, plan(Version::V0_3, false), &call("w1", "hi", None)).unwrap();
    assert_eq!(out, "ok");
    assert_eq!(h.methods(), vec!["message/send", "message/send"]);
    assert_eq!(h.requests[0].1["params"]["message"]["messageId"], h.requests[1].1["params"]["message"]["messageId"]);
    assert_eq!(h.requests[0].1["params"]["configuration"]["blocking"], true);
    assert_eq!(h.requests[0].2, None, "0.3 requests carry no A2A-Version header");
}

#[test]
fn failed_and_rejected_carry_the_remote_reason() {
    for state in ["TASK_STATE_FAILED", "TASK_STATE_REJECTED"] {
        let mut h = Fake::default();
        h.responses.push_back(rpc_ok(task(state, Some("boom"), None)));
        let e = exec::execute(&mut h, plan(Version::V1_0, false), &call("w1", "hi", None)).unwrap_err();
        assert!(matches!(&e, Error::Remote(m) if m.contains("boom")), "{e:?}");
    }
}

#[test]
fn input_required_saves_ids_and_resume_continues_them() {
    let mut h = Fake::default();
    h.responses.push_back(rpc_ok(task("TASK_STATE_INPUT_REQUIRED", Some("What is your name?"), None)));
    let e = exec::execute(&mut h, plan(Version::V1_0, false), &call("w1", "hi", None)).unwrap_err();
    assert_eq!(e, Error::InputRequired("What is your name?".into()));
    assert!(h.state.contains_key("a2a/w1"));

    h.responses.push_back(rpc_ok(task("TASK_STATE_COMPLETED", None, Some("Hello, Ada!"))));
    let out = exec::execute(&mut h, plan(Version::V1_0, false), &call("w2", "Ada", Some("w1"))).unwrap();
    assert_eq!(out, "Hello, Ada!");
    let m = &h.requests[1].1["params"]["message"];
    assert_eq!((m["taskId"].as_str(), m["contextId"].as_str()), (Some("rt"), Some("rc")));
    assert_ne!(m["messageId"], h.requests[0].1["params"]["message"]["messageId"]);
    assert!(!h.state.contains_key("a2a/w1"), "a finished resume forgets the saved task");

    let e = exec::execute(&mut h, plan(Version::V1_0, false), &call("w3", "x", Some("nope"))).unwrap_err();
    assert!(matches!(e, Error::NotFound(_)));
}

#[test]
fn non_terminal_answers_are_polled_with_backoff() {
    let mut h = Fake::default();
    h.responses.push_back(rpc_ok(task("TASK_STATE_WORKING", None, None)));
    h.responses.push_back(rpc_ok(json!({"id": "rt", "status": {"state": "TASK_STATE_WORKING"}})));
    h.responses.push_back(rpc_ok(json!({"id": "rt", "status": {"state": "TASK_STATE_COMPLETED"},
        "history": [{"role": "ROLE_USER", "parts": [{"text": "hi"}]}, {"role": "ROLE_AGENT", "parts": [{"text": "fine"}]}]})));
    let out = exec::execute(&mut h, plan(Version::V1_0, false), &call("w1", "hi", None)).unwrap();
    assert_eq!(out, "fine");
    assert_eq!(h.methods(), vec!["SendMessage", "GetTask", "GetTask"]);
    assert_eq!(h.requests[1].1["params"], json!({"id": "rt"}));
    assert_eq!(h.now, exec::backoff_ms(0) + exec::backoff_ms(1));
    assert!(exec::backoff_ms(20) == 2_000);
}

#[test]
fn streaming_relays_status_events() {
    let mut h = Fake::default();
    let ev = |r: Value| json!({"jsonrpc": "2.0", "id": 1, "result": r}).to_string();
    h.stream = Some((
        vec![
            ev(json!({"kind": "task", "id": "rt", "contextId": "rc", "status": {"state": "submitted"}})),
            ev(json!({"kind": "status-update", "taskId": "rt", "status": {"state": "working",
                "message": {"kind": "message", "role": "agent", "parts": [{"kind": "text", "text": "step 1/2"}]}}})),
            ev(
                json!({"kind": "artifact-update", "taskId": "rt", "artifact": {"artifactId": "r", "parts": [{"kind": "text", "text": "a"}]}}),
            ),
            ev(
                json!({"kind": "artifact-update", "taskId": "rt", "append": true, "artifact": {"artifactId": "r", "parts": [{"kind": "text", "text": "b"}]}}),
            ),
            ev(json!({"kind": "status-update", "taskId": "rt", "final": true, "status": {"state": "completed"}})),
        ],
        None,
    ));
    let out = exec::execute(&mut h, plan(Version::V0_3, true), &call("w1", "go", None)).unwrap();
    assert_eq!(out, "ab");
    assert_eq!(h.methods(), vec!["message/stream"]);
    let states: Vec<&str> = h.events.iter().map(|e| e["state"].as_str().unwrap()).collect();
    assert_eq!(states, vec!["submitted", "working", "completed"]);
    assert_eq!(h.events[1]["message"], "step 1/2");
}

#[test]
fn a_broken_stream_falls_back_to_polling() {
    let mut h = Fake::default();
    let ev = |r: Value| json!({"jsonrpc": "2.0", "id": 1, "result": r}).to_string();
    h.stream = Some((
        vec![ev(json!({"task": {"id": "rt", "status": {"state": "TASK_STATE_WORKING"}}}))],
        Some(Error::Remote("reset".into())),
    ));
    h.responses.push_back(rpc_ok(task("TASK_STATE_COMPLETED", None, Some("late"))["task"].clone()));
    let out = exec::execute(&mut h, plan(Version::V1_0, true), &call("w1", "go", None)).unwrap();
    assert_eq!(out, "late");
    assert_eq!(h.methods(), vec!["SendStreamingMessage", "GetTask"]);
}

/// The slow-stream peer's events (1.0), as `tests/peers/a2a_agents.py` streams them: the
/// task, then per step a `working` status and an artifact chunk appended to `result`,
/// then `completed`.
fn slow_stream_events(steps: usize) -> Vec<String> {
    let ev = |r: Value| json!({"jsonrpc": "2.0", "id": 1, "result": r}).to_string();
    let status = |state: &str, text: &str| {
        ev(json!({"statusUpdate": {"taskId": "rt", "contextId": "rc", "status": {"state": state,
            "message": {"role": "ROLE_AGENT", "parts": [{"text": text}]}}}}))
    };
    let mut events = vec![
        ev(json!({"task": {"id": "rt", "contextId": "rc", "status": {"state": "TASK_STATE_SUBMITTED"}}})),
        status("TASK_STATE_WORKING", "starting"),
    ];
    for i in 1..=steps {
        events.push(status("TASK_STATE_WORKING", &format!("step {i}/{steps}")));
        events.push(ev(json!({"artifactUpdate": {"taskId": "rt", "contextId": "rc", "append": i > 1,
            "lastChunk": i == steps, "artifact": {"artifactId": "result", "name": "result",
            "parts": [{"text": format!("part{i} ")}]}}})));
    }
    events.push(status("TASK_STATE_COMPLETED", "done"));
    events
}

/// Done when (issue 42), scenario (d), the plugin's half: a stream cut by a takeover of
/// the warden task (the replayed chunks, then `unavailable` for the rest) is followed by
/// polling the peer's task, and the output is the uninterrupted stream's. The polled task
/// holds the artifact's streamed chunks as parts (the A2A SDK's store extends the parts on
/// `append`): they used to be joined with newlines ("part1 \npart2 \npart3") where the
/// stream concatenated them ("part1 part2 part3"). The message is sent once.
#[test]
fn a_stream_cut_by_a_takeover_is_polled_to_the_uninterrupted_output() {
    let steps = 4;
    let mut whole = Fake { stream: Some((slow_stream_events(steps), None)), ..Fake::default() };
    let uninterrupted = exec::execute(&mut whole, plan(Version::V1_0, true), &call("w1", "go", None)).unwrap();
    assert_eq!(uninterrupted, "part1 part2 part3 part4");
    assert_eq!(whole.methods(), vec!["SendStreamingMessage"]);

    // Cut after step 2's chunk; the peer's task as GetTask returns it once completed.
    let mut cut = Fake::default();
    let events = slow_stream_events(steps);
    let unavailable = Error::Unavailable(
        "the host running this task restarted while this response was being read; the rest of it is gone".into(),
    );
    cut.stream = Some((events[..6].to_vec(), Some(unavailable)));
    let parts: Vec<Value> = (1..=steps).map(|i| json!({"text": format!("part{i} ")})).collect();
    cut.responses.push_back(rpc_ok(json!({"id": "rt", "contextId": "rc", "status": {"state": "TASK_STATE_WORKING"},
        "artifacts": [{"artifactId": "result", "name": "result", "parts": parts[..3]}]})));
    cut.responses.push_back(rpc_ok(json!({"id": "rt", "contextId": "rc",
        "status": {"state": "TASK_STATE_COMPLETED", "message": {"role": "ROLE_AGENT", "parts": [{"text": "done"}]}},
        "artifacts": [{"artifactId": "result", "name": "result", "parts": parts}]})));
    let taken_over = exec::execute(&mut cut, plan(Version::V1_0, true), &call("w1", "go", None)).unwrap();
    assert_eq!(taken_over, uninterrupted);
    assert_eq!(cut.methods(), vec!["SendStreamingMessage", "GetTask", "GetTask"], "the message is sent once");
    assert_eq!(cut.requests[1].1["params"], json!({"id": "rt"}));
    let last = cut.events.last().unwrap();
    assert_eq!((last["state"].as_str(), last["message"].as_str()), (Some("completed"), Some("done")));
}

#[test]
fn artifact_text_joins_text_parts_as_they_are_and_puts_other_parts_on_their_own_lines() {
    use proto::Part::{Other, Text};
    let text = |parts: &[proto::Part]| proto::artifact_text(parts);
    assert_eq!(text(&[Text("Hel".into()), Text("lo".into())]), "Hello");
    assert_eq!(text(&[Text("x".into()), Other("{}".into()), Text("y".into())]), "x\n{}\ny");
    assert_eq!(text(&[Other("[file a]".into()), Other("[file b]".into())]), "[file a]\n[file b]");
    // Appended chunks and the same parts whole give the same text.
    let mut streamed = Tracker::default();
    for (i, append) in [(1, false), (2, true)] {
        let parts = vec![Text(format!("p{i} "))];
        streamed.apply(Event::Artifact { task_id: Some("t".into()), artifact_id: "r".into(), parts, append });
    }
    let mut polled = Tracker::default();
    polled.apply(
        proto::parse_result(&json!({"id": "t", "status": {"state": "TASK_STATE_COMPLETED"},
            "artifacts": [{"artifactId": "r", "parts": [{"text": "p1 "}, {"text": "p2 "}]}]}))
        .unwrap(),
    );
    assert_eq!((streamed.result_text().as_str(), polled.result_text().as_str()), ("p1 p2", "p1 p2"));
}

#[test]
fn the_deadline_cancels_the_remote_task() {
    let mut h = Fake { latency: 400, ..Fake::default() };
    h.responses.push_back(rpc_ok(task("TASK_STATE_WORKING", None, None)));
    for _ in 0..20 {
        h.responses.push_back(rpc_ok(json!({"id": "rt", "status": {"state": "TASK_STATE_WORKING"}})));
    }
    let e = {
        let mut c = call("w1", "hi", None);
        c.deadline_ms = 3_000;
        exec::execute(&mut h, plan(Version::V1_0, false), &c).unwrap_err()
    };
    assert!(matches!(&e, Error::Timeout(m) if m.contains("canceled")), "{e:?}");
    assert_eq!(h.methods().last(), Some(&"CancelTask"));
    assert!(h.now <= 3_000, "stopped before the deadline: {}", h.now);
}

#[test]
fn a_canceled_warden_task_cancels_the_polled_remote_task() {
    let mut h = Fake { cancel_at: Some(500), ..Fake::default() };
    h.responses.push_back(rpc_ok(task("TASK_STATE_WORKING", None, None)));
    for _ in 0..5 {
        h.responses.push_back(rpc_ok(json!({"id": "rt", "status": {"state": "TASK_STATE_WORKING"}})));
    }
    h.responses.push_back(rpc_ok(json!({"id": "rt", "status": {"state": "TASK_STATE_CANCELED"}})));
    let e = exec::execute(&mut h, plan(Version::V1_0, false), &call("w1", "hi", None)).unwrap_err();
    assert!(matches!(&e, Error::Canceled(m) if m.contains("remote task rt was canceled")), "{e:?}");
    assert_eq!(h.methods().last(), Some(&"CancelTask"));
    assert_eq!(h.requests.last().unwrap().1["params"], json!({"id": "rt"}));
}

#[test]
fn a_cancel_during_a_stream_cancels_the_remote_task() {
    let mut h = Fake::default();
    let ev = |r: Value| json!({"jsonrpc": "2.0", "id": 1, "result": r}).to_string();
    h.stream = Some((
        vec![ev(json!({"kind": "task", "id": "rt", "contextId": "rc", "status": {"state": "working"}}))],
        Some(Error::Canceled("the task was canceled while it waited for the HTTP response stream".into())),
    ));
    h.responses.push_back(rpc_ok(json!({"id": "rt", "status": {"state": "canceled"}})));
    let e = exec::execute(&mut h, plan(Version::V0_3, true), &call("w1", "go", None)).unwrap_err();
    assert!(matches!(&e, Error::Canceled(m) if m.contains("remote task rt was canceled")), "{e:?}");
    assert_eq!(h.methods(), vec!["message/stream", "tasks/cancel"]);
}

#[test]
fn a_cancel_before_any_remote_task_cancels_nothing_remote() {
    let mut h = Fake { cancel_at: Some(0), ..Fake::default() };
    h.responses.push_back(Err(Error::Canceled("the task was canceled while an HTTP request was under way".into())));
    let e = exec::execute(&mut h, plan(Version::V1_0, false), &call("w1", "hi", None)).unwrap_err();
    assert!(matches!(&e, Error::Canceled(m) if m.contains("before the remote agent created a task")), "{e:?}");
    assert_eq!(h.methods(), vec!["SendMessage"]);
}

#[test]
fn json_rpc_errors_are_remote_failures() {
    let mut h = Fake::default();
    h.responses
        .push_back(Ok(json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "Method not found"}})));
    let e = exec::execute(&mut h, plan(Version::V1_0, false), &call("w1", "hi", None)).unwrap_err();
    assert_eq!(e, Error::Remote("A2A error -32601: Method not found".into()));
}

#[test]
fn plan_reads_protocol_data_and_auth_metadata() {
    let meta = vec![("auth_env".to_string(), "PARTNER_TOKEN".to_string())];
    let p =
        Plan::from_definition(r#"{"endpoint":"http://h/","protocol_version":"0.3","streaming":true}"#, &meta).unwrap();
    assert_eq!(
        p,
        Plan {
            endpoint: "http://h/".into(),
            version: Version::V0_3,
            streaming: true,
            auth_secret: Some("PARTNER_TOKEN".into())
        }
    );
    assert!(Plan::from_definition("{}", &[]).is_err());
}

#[test]
fn resolve_falls_back_to_agent_json_and_validates_metadata() {
    struct CardHost(Vec<String>);
    impl Host for CardHost {
        fn send(&mut self, req: Request) -> Result<Response, Error> {
            self.0.push(req.url.clone());
            if req.url.ends_with("agent-card.json") {
                return Ok(Response { status: 404, headers: vec![], body: vec![] });
            }
            let card = json!({"name": "Old", "description": "d", "version": "1", "url": "http://h/rpc", "capabilities": {},
                "defaultInputModes": [], "defaultOutputModes": [], "skills": []});
            Ok(Response { status: 200, headers: vec![], body: card.to_string().into_bytes() })
        }
        fn send_streaming(&mut self, _: Request) -> Result<(StreamHead, Box<dyn ChunkStream>), Error> {
            unreachable!()
        }
        fn emit(&mut self, _: &str, _: &Value) {}
        fn state_get(&mut self, _: &str) -> Result<Option<Vec<u8>>, Error> {
            Ok(None)
        }
        fn state_set(&mut self, _: &str, _: &[u8]) -> Result<(), Error> {
            Ok(())
        }
        fn state_delete(&mut self, _: &str) {}
        fn now_ms(&mut self) -> u64 {
            0
        }
        fn sleep_ms(&mut self, _: u64) -> Result<(), Error> {
            Ok(())
        }
        fn log(&mut self, _: &str) {}
    }
    let mut h = CardHost(vec![]);
    let (info, url) = exec::resolve(&mut h, "http://h", &[]).unwrap();
    assert_eq!(
        (info.name.as_str(), info.version, url.as_str()),
        ("Old", Version::V0_3, "http://h/.well-known/agent.json")
    );
    assert_eq!(h.0.len(), 2);
    let e = exec::resolve(&mut h, "http://h", &[("protocol_version".into(), "7".into())]).unwrap_err();
    assert!(matches!(e, Error::InvalidInput(m) if m.contains("protocol_version")));
}
