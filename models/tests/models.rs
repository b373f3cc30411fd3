//! Provider tests against local fake servers (`fake_openai`, `fake_anthropic`) started
//! by each test on 127.0.0.1:0, plus the scripted provider and the router.
//!
//! The fakes are deliberately tiny HTTP/1.1 servers on a tokio `TcpListener`: each
//! serves a queue of canned replies in order, records every request (method, path,
//! headers, JSON body), and can stream SSE in small fragments with delays (so the
//! client's incremental parsing is exercised), hang (timeouts), or send broken bodies.

use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use warden_models::anthropic::{AnthropicOptions, AnthropicProvider};
use warden_models::openai::{OpenAiOptions, OpenAiProvider};
use warden_models::scripted::ScriptedProvider;
use warden_models::{
    ChatRequest, ChatResponse, FinishReason, Message, ModelError, ModelEvent, ModelRouter, ModelsConfig, Provider,
    ProviderConfig, ReasoningEffort, StreamSink, ToolCall, ToolSpec, Usage,
};

// ---------------------------------------------------------------------------------------
// Shared fixtures
// ---------------------------------------------------------------------------------------

const OPENAI_KEY_ENV: &str = "WARDEN_MODELS_TEST_OPENAI_KEY";
const OPENAI_KEY: &str = "sk-test-SECRET-openai-7f3a9c";
const ANTHROPIC_KEY_ENV: &str = "WARDEN_MODELS_TEST_ANTHROPIC_KEY";
const ANTHROPIC_KEY: &str = "sk-ant-test-SECRET-2b8e41";
const UNSET_KEY_ENV: &str = "WARDEN_MODELS_TEST_KEY_THAT_IS_NEVER_SET";

/// Every test calls this first, so the variables are set exactly once, before any test
/// thread reads the environment.
fn init_env() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: runs once, before any test in this binary reads the environment
        // (every test calls `init_env` first and `Once` blocks them until it is done).
        unsafe {
            std::env::set_var(OPENAI_KEY_ENV, OPENAI_KEY);
            std::env::set_var(ANTHROPIC_KEY_ENV, ANTHROPIC_KEY);
            std::env::remove_var(UNSET_KEY_ENV);
        }
    });
}

/// Assert no form of any test key appears in an error's Display or Debug text.
fn assert_no_key(e: &ModelError) {
    for text in [e.to_string(), format!("{e:?}")] {
        for key in [OPENAI_KEY, ANTHROPIC_KEY, "SECRET"] {
            assert!(!text.contains(key), "error text leaks a key: {text}");
        }
    }
}

fn tool_spec() -> ToolSpec {
    ToolSpec {
        name: "Read".into(),
        description: "Read a file".into(),
        input_schema: json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
    }
}

/// A conversation that already went through one tool round (two parallel calls).
fn tool_round_trip_messages() -> Vec<Message> {
    vec![
        Message::system("You are terse."),
        Message::user("Read a and b"),
        Message::assistant_tool_calls(
            "Reading both.",
            vec![
                ToolCall { id: "call_a".into(), name: "Read".into(), arguments: json!({"path": "a"}) },
                ToolCall { id: "call_b".into(), name: "Read".into(), arguments: json!({"path": "b"}) },
            ],
        ),
        Message::tool_result("call_a", "contents of a"),
        Message::tool_result("call_b", "contents of b"),
    ]
}

fn collect_sink() -> (StreamSink, Arc<Mutex<Vec<ModelEvent>>>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let e = events.clone();
    (StreamSink::new(move |ev| e.lock().unwrap().push(ev)), events)
}

fn tokens(events: &[ModelEvent]) -> Vec<String> {
    events.iter().filter_map(|e| if let ModelEvent::Token(t) = e { Some(t.clone()) } else { None }).collect()
}

fn reasoning(events: &[ModelEvent]) -> Vec<String> {
    events.iter().filter_map(|e| if let ModelEvent::Reasoning(t) = e { Some(t.clone()) } else { None }).collect()
}

// ---------------------------------------------------------------------------------------
// The fake servers
// ---------------------------------------------------------------------------------------

mod fake {
    use super::*;

    /// One request as the fake received it.
    #[derive(Debug, Clone)]
    pub struct Recorded {
        pub method: String,
        pub path: String,
        pub headers: Vec<(String, String)>,
        pub body: Value,
    }

    impl Recorded {
        pub fn header(&self, name: &str) -> Option<&str> {
            self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
        }
    }

    /// What the fake answers to one request.
    pub enum Reply {
        /// A complete response with this status, extra headers and body.
        Body { status: u16, headers: Vec<(&'static str, String)>, content_type: &'static str, body: String },
        /// `text/event-stream`, written `fragment` bytes at a time with `delay` between writes.
        Sse { body: String, fragment: usize, delay: Duration },
        /// Read the request, then say nothing for this long.
        Hang(Duration),
    }

    pub fn json(status: u16, body: Value) -> Reply {
        Reply::Body { status, headers: vec![], content_type: "application/json", body: body.to_string() }
    }

    pub fn raw(status: u16, content_type: &'static str, body: &str) -> Reply {
        Reply::Body { status, headers: vec![], content_type, body: body.to_owned() }
    }

    /// SSE from `data:` payloads (OpenAI style: no `event:` lines).
    pub fn sse_data(chunks: &[Value], done: bool) -> Reply {
        let mut body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
        if done {
            body.push_str("data: [DONE]\n\n");
        }
        Reply::Sse { body, fragment: 7, delay: Duration::from_millis(1) }
    }

    /// SSE with named events (Anthropic style), plus a keep-alive comment.
    pub fn sse_events(events: &[Value]) -> Reply {
        let mut body = String::from(": keep-alive\n\n");
        for e in events {
            body.push_str(&format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()));
        }
        Reply::Sse { body, fragment: 11, delay: Duration::from_millis(1) }
    }

    pub struct FakeServer {
        pub base_url: String,
        requests: Arc<Mutex<Vec<Recorded>>>,
    }

    impl FakeServer {
        pub fn requests(&self) -> Vec<Recorded> {
            self.requests.lock().unwrap().clone()
        }
        pub fn only_request(&self) -> Recorded {
            let r = self.requests();
            assert_eq!(r.len(), 1, "expected exactly one request, got {r:?}");
            r.into_iter().next().unwrap()
        }
    }

    /// The OpenAI-compatible fake: serves `POST /v1/chat/completions`; base URL ends in `/v1`.
    pub async fn fake_openai(replies: Vec<Reply>) -> FakeServer {
        let mut s = serve("/v1/chat/completions", replies).await;
        s.base_url.push_str("/v1");
        s
    }

    /// The Anthropic Messages fake: serves `POST /v1/messages`; base URL is the root.
    pub async fn fake_anthropic(replies: Vec<Reply>) -> FakeServer {
        serve("/v1/messages", replies).await
    }

    async fn serve(path: &'static str, replies: Vec<Reply>) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let queue = Arc::new(Mutex::new(std::collections::VecDeque::from(replies)));
        let recorded = requests.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else { return };
                let recorded = recorded.clone();
                let queue = queue.clone();
                tokio::spawn(async move {
                    let Some(req) = read_request(&mut stream).await else { return };
                    let wrong_path = req.method != "POST" || req.path != path;
                    recorded.lock().unwrap().push(req);
                    let reply = if wrong_path {
                        raw(404, "text/plain", "fake: no such endpoint")
                    } else {
                        queue
                            .lock()
                            .unwrap()
                            .pop_front()
                            .unwrap_or_else(|| raw(500, "text/plain", "fake: no reply queued"))
                    };
                    write_reply(&mut stream, reply).await;
                });
            }
        });
        FakeServer { base_url, requests }
    }

    async fn read_request(stream: &mut tokio::net::TcpStream) -> Option<Recorded> {
        let mut buf = Vec::new();
        let mut tmp = [0u8; 4096];
        let head_end = loop {
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p;
            }
            let n = stream.read(&mut tmp).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&tmp[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let mut first = lines.next()?.split(' ');
        let (method, path) = (first.next()?.to_owned(), first.next()?.to_owned());
        let headers: Vec<(String, String)> =
            lines.filter_map(|l| l.split_once(':').map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))).collect();
        let len: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = buf[head_end + 4..].to_vec();
        while body.len() < len {
            let n = stream.read(&mut tmp).await.ok()?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&tmp[..n]);
        }
        let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
        Some(Recorded { method, path, headers, body })
    }

    fn reason(status: u16) -> &'static str {
        match status {
            200 => "OK",
            301 => "Moved Permanently",
            302 => "Found",
            303 => "See Other",
            307 => "Temporary Redirect",
            308 => "Permanent Redirect",
            400 => "Bad Request",
            401 => "Unauthorized",
            404 => "Not Found",
            429 => "Too Many Requests",
            500 => "Internal Server Error",
            503 => "Service Unavailable",
            _ => "Status",
        }
    }

    async fn write_reply(stream: &mut tokio::net::TcpStream, reply: Reply) {
        match reply {
            Reply::Body { status, headers, content_type, body } => {
                let mut head = format!(
                    "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
                    reason(status),
                    body.len()
                );
                for (k, v) in headers {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str("\r\n");
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(body.as_bytes()).await;
            }
            Reply::Sse { body, fragment, delay } => {
                let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n";
                let _ = stream.write_all(head.as_bytes()).await;
                for piece in body.as_bytes().chunks(fragment) {
                    if stream.write_all(piece).await.is_err() {
                        return;
                    }
                    let _ = stream.flush().await;
                    tokio::time::sleep(delay).await;
                }
            }
            Reply::Hang(d) => tokio::time::sleep(d).await,
        }
        let _ = stream.shutdown().await;
    }
}

use fake::{Reply, fake_anthropic, fake_openai};

// ---------------------------------------------------------------------------------------
// OpenAI-compatible provider against `fake_openai`
// ---------------------------------------------------------------------------------------

fn openai_at(base_url: &str, timeout: Duration) -> OpenAiProvider {
    init_env();
    OpenAiProvider::new(OpenAiOptions {
        name: "local".into(),
        base_url: base_url.into(),
        api_key_env: Some(OPENAI_KEY_ENV.into()),
        timeout,
    })
    .unwrap()
}

fn openai_text_body(content: &str) -> Value {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    })
}

fn chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

mod openai {
    use super::*;

    #[tokio::test]
    async fn request_shape_bearer_key_and_text_answer() {
        let server = fake_openai(vec![fake::json(200, openai_text_body("Both files are short."))]).await;
        let p = openai_at(&server.base_url, Duration::from_secs(10));
        let mut req = ChatRequest::new("qwen3", tool_round_trip_messages());
        req.tools = vec![tool_spec()];
        req.max_tokens = Some(256);
        let out = p.complete(req, None).await.unwrap();

        assert_eq!(out.message.content, "Both files are short.");
        assert_eq!(out.finish_reason, FinishReason::Stop);
        assert_eq!(out.usage, Some(Usage { input_tokens: 12, output_tokens: 3 }));
        assert!(out.message.tool_calls.is_empty());

        let r = server.only_request();
        assert_eq!(r.header("authorization"), Some(format!("Bearer {OPENAI_KEY}").as_str()));
        let b = &r.body;
        assert_eq!(b["model"], "qwen3");
        assert_eq!(b["max_tokens"], 256);
        assert!(b.get("stream").is_none(), "no sink → not streaming");
        assert_eq!(
            b["tools"][0],
            json!({"type": "function", "function": {
            "name": "Read", "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}})
        );
        let m = b["messages"].as_array().unwrap();
        assert_eq!(m.len(), 5);
        assert_eq!(m[0], json!({"role": "system", "content": "You are terse."}));
        assert_eq!(m[1], json!({"role": "user", "content": "Read a and b"}));
        assert_eq!(m[2]["role"], "assistant");
        assert_eq!(m[2]["content"], "Reading both.");
        assert_eq!(
            m[2]["tool_calls"][0],
            json!({"id": "call_a", "type": "function",
            "function": {"name": "Read", "arguments": "{\"path\":\"a\"}"}})
        );
        assert_eq!(m[3], json!({"role": "tool", "tool_call_id": "call_a", "content": "contents of a"}));
        assert_eq!(m[4], json!({"role": "tool", "tool_call_id": "call_b", "content": "contents of b"}));
    }

    #[tokio::test]
    async fn tool_calls_non_streaming() {
        let body = json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "Read", "arguments": "{\"path\": \"README.md\"}"}},
            {"id": "call_2", "type": "function", "function": {"name": "Glob", "arguments": ""}}
        ]}}]});
        let server = fake_openai(vec![fake::json(200, body)]).await;
        let p = openai_at(&server.base_url, Duration::from_secs(10));
        let out = p.complete(ChatRequest::new("m", vec![Message::user("read it")]), None).await.unwrap();
        assert_eq!(out.finish_reason, FinishReason::ToolCalls);
        assert_eq!(out.message.content, "");
        assert_eq!(
            out.message.tool_calls,
            vec![
                ToolCall { id: "call_1".into(), name: "Read".into(), arguments: json!({"path": "README.md"}) },
                ToolCall { id: "call_2".into(), name: "Glob".into(), arguments: json!({}) },
            ]
        );
    }

    #[tokio::test]
    async fn tool_calls_with_finish_stop_are_reported_as_tool_calls() {
        let body = json!({"choices": [{"finish_reason": "stop", "message": {"role": "assistant", "content": "",
            "tool_calls": [{"id": "x", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}]}}]});
        let server = fake_openai(vec![fake::json(200, body)]).await;
        let out = openai_at(&server.base_url, Duration::from_secs(10))
            .complete(ChatRequest::new("m", vec![Message::user("go")]), None)
            .await
            .unwrap();
        assert_eq!(out.finish_reason, FinishReason::ToolCalls);
    }

    #[tokio::test]
    async fn streamed_tokens_arrive_in_order() {
        let pieces = ["Hel", "lo, ", "wörld", " 🌍", "!"];
        let mut chunks = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
        chunks.extend(pieces.iter().map(|p| chunk(json!({"content": p}), None)));
        chunks.push(chunk(json!({}), Some("stop")));
        chunks.push(json!({"id": "c", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 5}}));
        let server = fake_openai(vec![fake::sse_data(&chunks, true)]).await;
        let p = openai_at(&server.base_url, Duration::from_secs(10));
        let (sink, events) = collect_sink();
        let out = p.complete(ChatRequest::new("m", vec![Message::user("hi")]), Some(sink)).await.unwrap();

        assert_eq!(tokens(&events.lock().unwrap()), pieces);
        assert_eq!(out.message.content, "Hello, wörld 🌍!");
        assert_eq!(out.finish_reason, FinishReason::Stop);
        assert_eq!(out.usage, Some(Usage { input_tokens: 5, output_tokens: 5 }));
        let body = server.only_request().body;
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"]["include_usage"], true);
    }

    #[tokio::test]
    async fn streamed_tool_calls_with_fragmented_arguments() {
        let chunks = vec![
            chunk(json!({"role": "assistant", "content": "Let me check."}), None),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "call_r", "type": "function",
                "function": {"name": "Read", "arguments": ""}}]}),
                None,
            ),
            chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"pa"}}]}), None),
            chunk(
                json!({"tool_calls": [{"index": 1, "id": "call_g", "type": "function",
                "function": {"name": "Grep", "arguments": "{\"pattern\":"}}]}),
                None,
            ),
            chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "th\": \"src/ma"}}]}), None),
            chunk(json!({"tool_calls": [{"index": 1, "function": {"arguments": " \"fn main\"}"}}]}), None),
            chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "in.rs\"}"}}]}), None),
            chunk(json!({}), Some("tool_calls")),
        ];
        let server = fake_openai(vec![fake::sse_data(&chunks, true)]).await;
        let (sink, events) = collect_sink();
        let out = openai_at(&server.base_url, Duration::from_secs(10))
            .complete(ChatRequest::new("m", vec![Message::user("find main")]), Some(sink))
            .await
            .unwrap();
        assert_eq!(out.finish_reason, FinishReason::ToolCalls);
        assert_eq!(out.message.content, "Let me check.");
        assert_eq!(tokens(&events.lock().unwrap()), ["Let me check."]);
        assert_eq!(
            out.message.tool_calls,
            vec![
                ToolCall { id: "call_r".into(), name: "Read".into(), arguments: json!({"path": "src/main.rs"}) },
                ToolCall { id: "call_g".into(), name: "Grep".into(), arguments: json!({"pattern": "fn main"}) },
            ]
        );
    }

    #[tokio::test]
    async fn streamed_reasoning_content_becomes_reasoning_events() {
        let chunks = vec![
            chunk(json!({"role": "assistant", "reasoning_content": "9.11 vs 9.8: "}), None),
            chunk(json!({"reasoning_content": "compare tenths."}), None),
            // newer vLLM spells it `reasoning`
            chunk(json!({"reasoning": " 8 > 1."}), None),
            chunk(json!({"content": "9.8 is greater."}), None),
            chunk(json!({}), Some("stop")),
        ];
        let server = fake_openai(vec![fake::sse_data(&chunks, true)]).await;
        let (sink, events) = collect_sink();
        let out = openai_at(&server.base_url, Duration::from_secs(10))
            .complete(ChatRequest::new("m", vec![Message::user("which is greater?")]), Some(sink))
            .await
            .unwrap();
        let events = events.lock().unwrap().clone();
        assert_eq!(
            events,
            vec![
                ModelEvent::Reasoning("9.11 vs 9.8: ".into()),
                ModelEvent::Reasoning("compare tenths.".into()),
                ModelEvent::Reasoning(" 8 > 1.".into()),
                ModelEvent::Token("9.8 is greater.".into()),
            ]
        );
        assert_eq!(out.reasoning.as_deref(), Some("9.11 vs 9.8: compare tenths. 8 > 1."));
        assert_eq!(out.message.content, "9.8 is greater.");
    }

    #[tokio::test]
    async fn reasoning_content_non_streaming() {
        let body = json!({"choices": [{"finish_reason": "stop", "message": {"role": "assistant",
            "content": "42", "reasoning_content": "6 times 7"}}]});
        let server = fake_openai(vec![fake::json(200, body)]).await;
        let out = openai_at(&server.base_url, Duration::from_secs(10))
            .complete(ChatRequest::new("m", vec![Message::user("?")]), None)
            .await
            .unwrap();
        assert_eq!(out.reasoning.as_deref(), Some("6 times 7"));
        assert_eq!(out.message.content, "42");
    }

    /// Issue 20: an agent's `effort` reaches an OpenAI-compatible server as
    /// `reasoning_effort`; `max`, which the API does not name, as its highest level.
    #[tokio::test]
    async fn reasoning_effort_is_sent_as_the_api_names_it() {
        let mut replies = vec![];
        for _ in 0..3 {
            replies.push(fake::json(200, openai_text_body("ok")));
        }
        let server = fake_openai(replies).await;
        let p = openai_at(&server.base_url, Duration::from_secs(10));
        assert_eq!(p.reasoning_setting(), Some("reasoning_effort"));
        for effort in [None, Some(ReasoningEffort::Medium), Some(ReasoningEffort::Max)] {
            let mut req = ChatRequest::new("m", vec![Message::user("hi")]);
            req.reasoning_effort = effort;
            p.complete(req, None).await.unwrap();
        }
        let sent: Vec<Value> = server.requests().iter().map(|r| r.body["reasoning_effort"].clone()).collect();
        assert_eq!(sent, [Value::Null, json!("medium"), json!("xhigh")]);
        // Providers without a reasoning setting say so (and ignore the field).
        let anthropic = anthropic_at(&server.base_url, Duration::from_secs(10));
        assert_eq!(anthropic.reasoning_setting(), None);
    }

    #[test]
    fn effort_levels_parse_as_agent_files_name_them() {
        for (name, effort) in [
            ("low", ReasoningEffort::Low),
            (" Medium ", ReasoningEffort::Medium),
            ("high", ReasoningEffort::High),
            ("xhigh", ReasoningEffort::XHigh),
            ("MAX", ReasoningEffort::Max),
        ] {
            assert_eq!(ReasoningEffort::parse(name), Some(effort), "{name}");
            assert_eq!(ReasoningEffort::parse(effort.as_str()), Some(effort));
        }
        for bad in ["", "extreme", "minimal", "hi gh"] {
            assert_eq!(ReasoningEffort::parse(bad), None, "{bad}");
        }
        assert_eq!(serde_json::to_value(ReasoningEffort::XHigh).unwrap(), json!("xhigh"));
    }

    #[tokio::test]
    async fn server_ignoring_stream_still_feeds_the_sink() {
        let server = fake_openai(vec![fake::json(200, openai_text_body("whole answer"))]).await;
        let (sink, events) = collect_sink();
        let out = openai_at(&server.base_url, Duration::from_secs(10))
            .complete(ChatRequest::new("m", vec![Message::user("hi")]), Some(sink))
            .await
            .unwrap();
        assert_eq!(out.message.content, "whole answer");
        assert_eq!(tokens(&events.lock().unwrap()), ["whole answer"]);
    }

    #[tokio::test]
    async fn http_429_with_retry_after_and_500() {
        let server = fake_openai(vec![
            Reply::Body {
                status: 429,
                headers: vec![("Retry-After", "7".into())],
                content_type: "application/json",
                body: json!({"error": {"message": "Rate limit reached", "type": "rate_limit_exceeded"}}).to_string(),
            },
            fake::raw(500, "text/plain", "upstream exploded"),
        ])
        .await;
        let p = openai_at(&server.base_url, Duration::from_secs(10));
        let e = p.complete(ChatRequest::new("m", vec![Message::user("hi")]), None).await.unwrap_err();
        match &e {
            ModelError::Http { provider, status, retry_after, body_excerpt } => {
                assert_eq!((provider.as_str(), *status, *retry_after), ("local", 429, Some(Duration::from_secs(7))));
                assert!(body_excerpt.contains("Rate limit reached"), "{body_excerpt}");
            }
            other => panic!("expected Http, got {other:?}"),
        }
        assert!(e.is_transient());
        assert!(e.to_string().contains("HTTP 429") && e.to_string().contains("retry after 7s"), "{e}");

        let (sink, _) = collect_sink();
        let e = p.complete(ChatRequest::new("m", vec![Message::user("hi")]), Some(sink)).await.unwrap_err();
        assert!(
            matches!(&e, ModelError::Http { status: 500, retry_after: None, body_excerpt, .. } if body_excerpt == "upstream exploded"),
            "{e:?}"
        );
        assert!(e.is_transient());
    }

    #[tokio::test]
    async fn malformed_bodies_say_what_is_wrong() {
        let server = fake_openai(vec![
            fake::raw(200, "application/json", "{\"choices\": [ {\"message\": "),
            fake::json(200, json!({"id": "x", "object": "chat.completion"})),
            fake::json(
                200,
                json!({"choices": [{"message": {"role": "assistant", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "Read", "arguments": "{\"path\": "}}]}}]}),
            ),
            fake::json(200, json!({"choices": [{"message": {"role": "assistant", "content": 17}}]})),
        ])
        .await;
        let p = openai_at(&server.base_url, Duration::from_secs(10));
        let mut details = Vec::new();
        for _ in 0..4 {
            match p.complete(ChatRequest::new("m", vec![Message::user("hi")]), None).await.unwrap_err() {
                ModelError::Malformed { provider, detail } => {
                    assert_eq!(provider, "local");
                    details.push(detail);
                }
                other => panic!("expected Malformed, got {other:?}"),
            }
        }
        assert!(details[0].contains("not valid JSON"), "{}", details[0]);
        assert!(details[1].contains("`choices`"), "{}", details[1]);
        assert!(details[2].contains("tool call `Read`") && details[2].contains("c1"), "{}", details[2]);
        assert!(details[3].contains("content"), "{}", details[3]);
    }

    #[tokio::test]
    async fn malformed_streams() {
        let bad_chunk = Reply::Sse { body: "data: {\"choices\": [\n\n".into(), fragment: 64, delay: Duration::ZERO };
        let truncated = fake::sse_data(&[chunk(json!({"content": "partial"}), None)], false);
        let server = fake_openai(vec![bad_chunk, truncated]).await;
        let p = openai_at(&server.base_url, Duration::from_secs(10));
        for expected in ["stream chunk is not valid JSON", "stream ended before"] {
            let (sink, _) = collect_sink();
            let e = p.complete(ChatRequest::new("m", vec![Message::user("hi")]), Some(sink)).await.unwrap_err();
            assert!(matches!(&e, ModelError::Malformed { detail, .. } if detail.contains(expected)), "{e:?}");
        }
    }

    #[tokio::test]
    async fn error_object_inside_the_stream_is_a_provider_error() {
        let server = fake_openai(vec![fake::sse_data(
            &[
                chunk(json!({"content": "a"}), None),
                json!({"error": {"message": "model crashed", "type": "server_error"}}),
            ],
            false,
        )])
        .await;
        let (sink, _) = collect_sink();
        let e = openai_at(&server.base_url, Duration::from_secs(10))
            .complete(ChatRequest::new("m", vec![Message::user("hi")]), Some(sink))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, ModelError::Provider { kind, message, .. } if kind == "server_error" && message == "model crashed"),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn timeout_configured_and_per_request() {
        let server =
            fake_openai(vec![Reply::Hang(Duration::from_secs(20)), Reply::Hang(Duration::from_secs(20))]).await;
        let p = openai_at(&server.base_url, Duration::from_millis(300));
        let start = Instant::now();
        let e = p.complete(ChatRequest::new("m", vec![Message::user("hi")]), None).await.unwrap_err();
        assert!(matches!(e, ModelError::Timeout { after, .. } if after == Duration::from_millis(300)), "{e:?}");
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(e.to_string().contains("300ms"), "{e}");

        // The request's own (shorter) deadline wins over the provider's.
        let p = openai_at(&server.base_url, Duration::from_secs(60));
        let mut req = ChatRequest::new("m", vec![Message::user("hi")]);
        req.timeout = Some(Duration::from_millis(200));
        let (sink, _) = collect_sink();
        let e = p.complete(req, Some(sink)).await.unwrap_err();
        assert!(matches!(e, ModelError::Timeout { after, .. } if after == Duration::from_millis(200)), "{e:?}");
    }

    #[tokio::test]
    async fn connection_refused_is_connect() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let p = openai_at(&format!("http://{addr}/v1"), Duration::from_secs(10));
        let e = p.complete(ChatRequest::new("m", vec![Message::user("hi")]), None).await.unwrap_err();
        assert!(matches!(&e, ModelError::Connect { url, .. } if url.contains(&addr.to_string())), "{e:?}");
    }

    #[tokio::test]
    async fn api_key_never_appears_in_errors_even_when_echoed() {
        let echo = format!("Incorrect API key provided: Bearer {OPENAI_KEY}");
        let server = fake_openai(vec![
            fake::json(401, json!({"error": {"message": echo, "type": "invalid_request_error"}})),
            fake::raw(200, "text/html", &format!("<html>proxy saw {OPENAI_KEY}</html>")),
            fake::sse_data(&[json!({"error": {"message": echo, "type": "auth"}})], false),
        ])
        .await;
        let p = openai_at(&server.base_url, Duration::from_secs(10));
        let e = p.complete(ChatRequest::new("m", vec![Message::user("hi")]), None).await.unwrap_err();
        assert!(
            matches!(&e, ModelError::Http { status: 401, body_excerpt, .. } if body_excerpt.contains("[REDACTED]")),
            "{e:?}"
        );
        assert_no_key(&e);
        let e = p.complete(ChatRequest::new("m", vec![Message::user("hi")]), None).await.unwrap_err();
        assert!(matches!(e, ModelError::Malformed { .. }), "{e:?}");
        assert_no_key(&e);
        let (sink, _) = collect_sink();
        let e = p.complete(ChatRequest::new("m", vec![Message::user("hi")]), Some(sink)).await.unwrap_err();
        assert!(matches!(e, ModelError::Provider { .. }), "{e:?}");
        assert_no_key(&e);
        // ... while every request did carry it as a bearer token.
        for r in server.requests() {
            assert_eq!(r.header("authorization"), Some(format!("Bearer {OPENAI_KEY}").as_str()));
        }
    }

    #[tokio::test]
    async fn missing_key_variable_is_a_config_error_and_sends_nothing() {
        init_env();
        let server = fake_openai(vec![fake::json(200, openai_text_body("x"))]).await;
        let p = OpenAiProvider::new(OpenAiOptions {
            api_key_env: Some(UNSET_KEY_ENV.into()),
            ..OpenAiOptions::new("cloud", server.base_url.clone())
        })
        .unwrap();
        let e = p.complete(ChatRequest::new("m", vec![Message::user("hi")]), None).await.unwrap_err();
        assert!(matches!(&e, ModelError::Config(msg) if msg.contains(UNSET_KEY_ENV) && msg.contains("cloud")), "{e:?}");
        assert!(server.requests().is_empty());
    }

    #[tokio::test]
    async fn no_key_configured_sends_no_authorization() {
        init_env();
        let server = fake_openai(vec![fake::json(200, openai_text_body("local answer"))]).await;
        let p = OpenAiProvider::new(OpenAiOptions::new("local", server.base_url.clone())).unwrap();
        let out = p.complete(ChatRequest::new("m", vec![Message::user("hi")]), None).await.unwrap();
        assert_eq!(out.message.content, "local answer");
        assert_eq!(server.only_request().header("authorization"), None);
    }
}

// ---------------------------------------------------------------------------------------
// Anthropic Messages provider against `fake_anthropic`
// ---------------------------------------------------------------------------------------

fn anthropic_at(base_url: &str, timeout: Duration) -> AnthropicProvider {
    init_env();
    AnthropicProvider::new(AnthropicOptions {
        name: "claude".into(),
        base_url: base_url.into(),
        api_key_env: Some(ANTHROPIC_KEY_ENV.into()),
        timeout,
    })
    .unwrap()
}

mod anthropic {
    use super::*;

    #[tokio::test]
    async fn tool_use_round_trip() {
        let reply = json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [
                {"type": "text", "text": "Now grep."},
                {"type": "tool_use", "id": "toolu_01", "name": "Grep", "input": {"pattern": "TODO"}}
            ],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 40, "output_tokens": 9}
        });
        let server = fake_anthropic(vec![fake::json(200, reply)]).await;
        let p = anthropic_at(&server.base_url, Duration::from_secs(10));
        let mut msgs = tool_round_trip_messages();
        msgs.push(Message::user("also look for TODOs"));
        let mut req = ChatRequest::new("claude-x", msgs);
        req.tools = vec![tool_spec()];
        let out = p.complete(req, None).await.unwrap();

        assert_eq!(out.finish_reason, FinishReason::ToolCalls);
        assert_eq!(out.message.content, "Now grep.");
        assert_eq!(
            out.message.tool_calls,
            vec![ToolCall { id: "toolu_01".into(), name: "Grep".into(), arguments: json!({"pattern": "TODO"}) }]
        );
        assert_eq!(out.usage, Some(Usage { input_tokens: 40, output_tokens: 9 }));

        let r = server.only_request();
        assert_eq!(r.header("x-api-key"), Some(ANTHROPIC_KEY));
        assert_eq!(r.header("anthropic-version"), Some("2023-06-01"));
        assert_eq!(r.header("authorization"), None);
        let b = &r.body;
        assert_eq!(b["model"], "claude-x");
        assert_eq!(b["system"], "You are terse.");
        assert_eq!(b["max_tokens"], 4096);
        assert!(b.get("stream").is_none());
        assert_eq!(b["tools"][0]["name"], "Read");
        assert_eq!(b["tools"][0]["input_schema"]["required"], json!(["path"]));
        assert_eq!(
            b["messages"],
            json!([
                {"role": "user", "content": [{"type": "text", "text": "Read a and b"}]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Reading both."},
                    {"type": "tool_use", "id": "call_a", "name": "Read", "input": {"path": "a"}},
                    {"type": "tool_use", "id": "call_b", "name": "Read", "input": {"path": "b"}}
                ]},
                // consecutive tool results (and the user text after them) merged into one user message
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_a", "content": "contents of a"},
                    {"type": "tool_result", "tool_use_id": "call_b", "content": "contents of b"},
                    {"type": "text", "text": "also look for TODOs"}
                ]}
            ])
        );
    }

    #[tokio::test]
    async fn thinking_blocks_become_reasoning() {
        let reply = json!({"type": "message", "role": "assistant", "content": [
            {"type": "thinking", "thinking": "Short question, short answer.", "signature": "sig=="},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Yes."}
        ], "stop_reason": "end_turn"});
        let server = fake_anthropic(vec![fake::json(200, reply)]).await;
        let out = anthropic_at(&server.base_url, Duration::from_secs(10))
            .complete(ChatRequest::new("c", vec![Message::user("ok?")]), None)
            .await
            .unwrap();
        assert_eq!(out.reasoning.as_deref(), Some("Short question, short answer."));
        assert_eq!(out.message.content, "Yes.");
        assert_eq!(out.finish_reason, FinishReason::Stop);
    }

    fn streamed_events() -> Vec<Value> {
        vec![
            json!({"type": "message_start", "message": {"id": "msg_s", "type": "message", "role": "assistant",
                "content": [], "model": "c", "stop_reason": null, "usage": {"input_tokens": 25, "output_tokens": 1}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Need the file"}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": " first."}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "EqQB"}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "ping"}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "I'll read "}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "it — ok."}}),
            json!({"type": "content_block_stop", "index": 1}),
            json!({"type": "content_block_start", "index": 2, "content_block":
                {"type": "tool_use", "id": "toolu_9", "name": "Read", "input": {}}}),
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": ""}}),
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"path\": \"Car"}}),
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "go.toml\"}"}}),
            json!({"type": "content_block_stop", "index": 2}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 31}}),
            json!({"type": "message_stop"}),
        ]
    }

    #[tokio::test]
    async fn streaming_text_thinking_and_tool_use() {
        let server = fake_anthropic(vec![fake::sse_events(&streamed_events())]).await;
        let (sink, events) = collect_sink();
        let out = anthropic_at(&server.base_url, Duration::from_secs(10))
            .complete(ChatRequest::new("c", vec![Message::user("read Cargo.toml")]), Some(sink))
            .await
            .unwrap();
        let events = events.lock().unwrap().clone();
        assert_eq!(
            events,
            vec![
                ModelEvent::Reasoning("Need the file".into()),
                ModelEvent::Reasoning(" first.".into()),
                ModelEvent::Token("I'll read ".into()),
                ModelEvent::Token("it — ok.".into()),
            ]
        );
        assert_eq!(out.message.content, "I'll read it — ok.");
        assert_eq!(out.reasoning.as_deref(), Some("Need the file first."));
        assert_eq!(
            out.message.tool_calls,
            vec![ToolCall { id: "toolu_9".into(), name: "Read".into(), arguments: json!({"path": "Cargo.toml"}) }]
        );
        assert_eq!(out.finish_reason, FinishReason::ToolCalls);
        assert_eq!(out.usage, Some(Usage { input_tokens: 25, output_tokens: 31 }));
        assert_eq!(server.only_request().body["stream"], true);
    }

    #[tokio::test]
    async fn http_errors_429_500_and_overloaded() {
        let server = fake_anthropic(vec![
            Reply::Body {
                status: 429,
                headers: vec![("retry-after", "12".into())],
                content_type: "application/json",
                body: json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}})
                    .to_string(),
            },
            fake::json(500, json!({"type": "error", "error": {"type": "api_error", "message": "internal"}})),
            fake::json(529, json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})),
        ])
        .await;
        let p = anthropic_at(&server.base_url, Duration::from_secs(10));
        let mut got = Vec::new();
        for _ in 0..3 {
            let e = p.complete(ChatRequest::new("c", vec![Message::user("hi")]), None).await.unwrap_err();
            assert!(e.is_transient(), "{e:?}");
            match e {
                ModelError::Http { status, retry_after, body_excerpt, .. } => {
                    got.push((status, retry_after, body_excerpt))
                }
                other => panic!("expected Http, got {other:?}"),
            }
        }
        assert_eq!((got[0].0, got[0].1), (429, Some(Duration::from_secs(12))));
        assert!(got[0].2.contains("rate_limit_error"));
        assert_eq!(got[1].0, 500);
        assert_eq!(got[2].0, 529);
        assert!(got[2].2.contains("Overloaded"));
    }

    #[tokio::test]
    async fn malformed_bodies_and_streams() {
        let mut truncated = streamed_events();
        truncated.truncate(9); // stops mid-text, no message_stop
        let server = fake_anthropic(vec![
            fake::raw(200, "application/json", "not json at all"),
            fake::json(200, json!({"type": "message", "role": "assistant"})),
            fake::json(200, json!({"type": "message", "content": [{"type": "tool_use", "name": "Read", "input": {}}]})),
            fake::sse_events(&truncated),
        ])
        .await;
        let p = anthropic_at(&server.base_url, Duration::from_secs(10));
        let expected = ["not valid JSON", "missing `content` array", "has no `id`", "before `message_stop`"];
        for (i, want) in expected.iter().enumerate() {
            let sink = (i == 3).then(|| collect_sink().0);
            let e = p.complete(ChatRequest::new("c", vec![Message::user("hi")]), sink).await.unwrap_err();
            assert!(matches!(&e, ModelError::Malformed { detail, .. } if detail.contains(want)), "{want}: {e:?}");
        }
    }

    #[tokio::test]
    async fn error_event_in_stream() {
        let events = vec![
            streamed_events()[0].clone(),
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ];
        let server = fake_anthropic(vec![fake::sse_events(&events)]).await;
        let (sink, _) = collect_sink();
        let e = anthropic_at(&server.base_url, Duration::from_secs(10))
            .complete(ChatRequest::new("c", vec![Message::user("hi")]), Some(sink))
            .await
            .unwrap_err();
        assert!(matches!(&e, ModelError::Provider { kind, .. } if kind == "overloaded_error"), "{e:?}");
        assert!(e.is_transient());
    }

    #[tokio::test]
    async fn timeout() {
        let server = fake_anthropic(vec![Reply::Hang(Duration::from_secs(20))]).await;
        let start = Instant::now();
        let e = anthropic_at(&server.base_url, Duration::from_millis(250))
            .complete(ChatRequest::new("c", vec![Message::user("hi")]), None)
            .await
            .unwrap_err();
        assert!(matches!(e, ModelError::Timeout { .. }), "{e:?}");
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn key_is_sent_but_never_in_errors() {
        let server = fake_anthropic(vec![fake::json(
            401,
            json!({"type": "error", "error": {"type": "authentication_error", "message": format!("invalid x-api-key {ANTHROPIC_KEY}")}}),
        )])
        .await;
        let e = anthropic_at(&server.base_url, Duration::from_secs(10))
            .complete(ChatRequest::new("c", vec![Message::user("hi")]), None)
            .await
            .unwrap_err();
        assert!(matches!(e, ModelError::Http { status: 401, .. }), "{e:?}");
        assert_no_key(&e);
        assert_eq!(server.only_request().header("x-api-key"), Some(ANTHROPIC_KEY));
    }
}

// ---------------------------------------------------------------------------------------
// Redirects: never followed, so the API key never reaches the new location
// ---------------------------------------------------------------------------------------

mod redirects {
    use super::*;

    /// The redirect statuses a client could follow (303 turns the POST into a GET).
    const REDIRECTS: [u16; 5] = [301, 302, 303, 307, 308];

    fn redirect_to(status: u16, location: &str) -> Reply {
        Reply::Body {
            status,
            headers: vec![("Location", location.to_owned())],
            content_type: "text/plain",
            body: String::new(),
        }
    }

    /// `origin` answered every request with a redirect to `target`: the error names the
    /// status and location, the origin got the key, and `target` was never contacted.
    fn assert_not_followed(e: &ModelError, status: u16, target: &str, target_server: &fake::FakeServer) {
        match e {
            ModelError::Redirect { status: s, location, .. } => {
                assert_eq!((*s, location.as_deref()), (status, Some(target)), "{e:?}");
            }
            other => panic!("HTTP {status}: expected Redirect, got {other:?}"),
        }
        assert!(e.to_string().contains(&format!("HTTP {status}")) && e.to_string().contains(target), "{e}");
        assert!(!e.is_transient(), "a redirect is configuration, not a transient failure");
        assert_no_key(e);
        let seen = target_server.requests();
        assert!(seen.is_empty(), "HTTP {status}: the redirect was followed; the target received {seen:?}");
    }

    /// The provider API under test, with its fake and how it sends the key.
    #[derive(Clone, Copy)]
    enum Api {
        Anthropic,
        Openai,
    }

    impl Api {
        async fn serve(self, replies: Vec<Reply>) -> fake::FakeServer {
            match self {
                Api::Anthropic => fake_anthropic(replies).await,
                Api::Openai => fake_openai(replies).await,
            }
        }

        fn endpoint(self, server: &fake::FakeServer) -> String {
            match self {
                Api::Anthropic => format!("{}/v1/messages", server.base_url),
                Api::Openai => format!("{}/chat/completions", server.base_url),
            }
        }

        fn provider(self, base_url: &str) -> Box<dyn Provider> {
            match self {
                Api::Anthropic => Box::new(anthropic_at(base_url, Duration::from_secs(10))),
                Api::Openai => Box::new(openai_at(base_url, Duration::from_secs(10))),
            }
        }

        /// The header carrying the key, and its value.
        fn key_header(self) -> (&'static str, String) {
            match self {
                Api::Anthropic => ("x-api-key", ANTHROPIC_KEY.to_owned()),
                Api::Openai => ("authorization", format!("Bearer {OPENAI_KEY}")),
            }
        }
    }

    /// Every redirect status, streamed or not: the origin gets the key, the location nothing.
    async fn redirects_are_not_followed(api: Api) {
        for status in REDIRECTS {
            for stream in [false, true] {
                let target_server = api.serve(vec![fake::json(200, openai_text_body("followed"))]).await;
                let target = api.endpoint(&target_server);
                let origin = api.serve(vec![redirect_to(status, &target)]).await;
                let sink = stream.then(|| collect_sink().0);
                let e = api
                    .provider(&origin.base_url)
                    .complete(ChatRequest::new("m", vec![Message::user("hi")]), sink)
                    .await
                    .unwrap_err();
                assert_not_followed(&e, status, &target, &target_server);
                let (header, key) = api.key_header();
                assert_eq!(origin.only_request().header(header), Some(key.as_str()));
            }
        }
    }

    #[tokio::test]
    async fn regression_anthropic_redirect_does_not_carry_the_x_api_key() {
        redirects_are_not_followed(Api::Anthropic).await;
    }

    #[tokio::test]
    async fn regression_openai_redirect_does_not_carry_the_authorization() {
        redirects_are_not_followed(Api::Openai).await;
    }
}

// ---------------------------------------------------------------------------------------
// Scripted provider
// ---------------------------------------------------------------------------------------

const SCRIPT: &str = r#"
- reasoning: "The user wants a listing."
  text: "Let me look at the workspace."
  tool_calls:
    - name: Bash
      arguments: { command: "ls /workspace" }
    - name: Read
      id: read_readme
      arguments: { path: README.md }
- expect:
    last_tool_result_contains: "README"
  text: "There is a README and a src directory."
- error: "simulated 503 from the provider"
"#;

fn scripted(text: &str) -> ScriptedProvider {
    ScriptedProvider::from_yaml_str("demo", std::path::Path::new("script.yaml"), text).unwrap()
}

/// The conversation after `n` assistant turns of [`SCRIPT`].
fn scripted_conversation(n: usize) -> Vec<Message> {
    let mut m = vec![Message::system("sys"), Message::user("What is in the workspace?")];
    if n >= 1 {
        m.push(Message::assistant_tool_calls(
            "Let me look at the workspace.",
            vec![
                ToolCall { id: "call_0_0".into(), name: "Bash".into(), arguments: json!({"command": "ls /workspace"}) },
                ToolCall { id: "read_readme".into(), name: "Read".into(), arguments: json!({"path": "README.md"}) },
            ],
        ));
        m.push(Message::tool_result("call_0_0", "README.md\nsrc"));
        m.push(Message::tool_result("read_readme", "# README\nhello"));
    }
    if n >= 2 {
        m.push(Message::assistant("There is a README and a src directory."));
        m.push(Message::user("thanks"));
    }
    m
}

mod scripted_provider {
    use super::*;

    #[tokio::test]
    async fn turns_in_order_with_tool_calls() {
        let p = scripted(SCRIPT);
        let first = p.complete(ChatRequest::new("anything", scripted_conversation(0)), None).await.unwrap();
        assert_eq!(first.finish_reason, FinishReason::ToolCalls);
        assert_eq!(first.reasoning.as_deref(), Some("The user wants a listing."));
        assert_eq!(first.message.content, "Let me look at the workspace.");
        assert_eq!(first.message.tool_calls, scripted_conversation(1)[2].tool_calls);

        let second = p.complete(ChatRequest::new("anything", scripted_conversation(1)), None).await.unwrap();
        assert_eq!(second.finish_reason, FinishReason::Stop);
        assert_eq!(second.message.content, "There is a README and a src directory.");
        assert!(second.message.tool_calls.is_empty());

        // Stateless: asking for turn 0 again (a resumed or parallel task) gives turn 0 again.
        let again = p.complete(ChatRequest::new("anything", scripted_conversation(0)), None).await.unwrap();
        assert_eq!(again, first);
    }

    #[tokio::test]
    async fn streams_text_word_by_word() {
        let p = scripted(SCRIPT);
        let (sink, events) = collect_sink();
        let out = p.complete(ChatRequest::new("m", scripted_conversation(0)), Some(sink)).await.unwrap();
        let events = events.lock().unwrap().clone();
        let toks = tokens(&events);
        assert_eq!(toks, ["Let ", "me ", "look ", "at ", "the ", "workspace."]);
        assert_eq!(toks.concat(), out.message.content);
        assert_eq!(reasoning(&events).concat(), "The user wants a listing.");
        // reasoning first, then the answer
        assert!(matches!(events.first(), Some(ModelEvent::Reasoning(_))));
        assert!(matches!(events.last(), Some(ModelEvent::Token(_))));
    }

    #[tokio::test]
    async fn error_turn_and_exhaustion() {
        let p = scripted(SCRIPT);
        let e = p.complete(ChatRequest::new("m", scripted_conversation(2)), None).await.unwrap_err();
        assert_eq!(
            e,
            ModelError::ScriptedFailure {
                provider: "demo".into(),
                turn: 2,
                message: "simulated 503 from the provider".into()
            }
        );
        let mut conv = scripted_conversation(2);
        conv.push(Message::assistant("(after the failure)"));
        let e = p.complete(ChatRequest::new("m", conv), None).await.unwrap_err();
        assert!(matches!(&e, ModelError::ScriptExhausted { turns: 3, .. }), "{e:?}");
        assert!(e.to_string().contains("script.yaml"), "{e}");

        let empty = scripted("");
        let e = empty.complete(ChatRequest::new("m", vec![Message::user("hi")]), None).await.unwrap_err();
        assert!(matches!(e, ModelError::ScriptExhausted { turns: 0, .. }));
    }

    #[tokio::test]
    async fn expectations_are_checked() {
        let p = scripted(SCRIPT);
        let mut conv = scripted_conversation(1);
        conv[4] = Message::tool_result("read_readme", "no such file");
        conv[3] = Message::tool_result("call_0_0", "empty");
        let e = p.complete(ChatRequest::new("m", conv), None).await.unwrap_err();
        match e {
            ModelError::ScriptMismatch { turn, detail, .. } => {
                assert_eq!(turn, 1);
                assert!(detail.contains("README") && detail.contains("no such file"), "{detail}");
            }
            other => panic!("expected ScriptMismatch, got {other:?}"),
        }
        let p = scripted("- expect: { last_user_contains: deploy }\n  text: ok\n");
        let e = p.complete(ChatRequest::new("m", vec![Message::user("build it")]), None).await.unwrap_err();
        assert!(matches!(e, ModelError::ScriptMismatch { turn: 0, .. }), "{e:?}");
        let ok = p.complete(ChatRequest::new("m", vec![Message::user("please deploy")]), None).await.unwrap();
        assert_eq!(ok.message.content, "ok");
        let p = scripted("- expect: { system_contains: \"## MEMORY.md\" }\n  text: ok\n");
        let e = p.complete(ChatRequest::new("m", vec![Message::system("plain"), Message::user("u")]), None).await;
        let detail = match e {
            Err(ModelError::ScriptMismatch { detail, .. }) => detail,
            other => panic!("expected ScriptMismatch, got {other:?}"),
        };
        assert!(detail.contains("expected the system prompt to contain"), "{detail}");
        let with = vec![Message::system("You help.\n\n## MEMORY.md\n- x"), Message::user("u")];
        assert_eq!(p.complete(ChatRequest::new("m", with), None).await.unwrap().message.content, "ok"); // The tools a request offers: each named one must be there, each refused one not.
        let p =
            scripted("- expect: { tools_offered: [Read, mcp__s__a], tools_not_offered: [mcp__s__b] }\n  text: ok\n");
        let tool = |name: &str| ToolSpec { name: name.into(), description: String::new(), input_schema: json!({}) };
        let offering = |names: &[&str]| {
            let mut r = ChatRequest::new("m", vec![Message::user("u")]);
            r.tools = names.iter().map(|n| tool(n)).collect();
            r
        };
        let ok = p.complete(offering(&["Read", "mcp__s__a", "Bash"]), None).await.unwrap();
        assert_eq!(ok.message.content, "ok");
        for (names, want) in [
            (&["Read"][..], "expected the tool \"mcp__s__a\" to be offered; offered: [Read]"),
            (&["Read", "mcp__s__a", "mcp__s__b"][..], "expected the tool \"mcp__s__b\" not to be offered"),
        ] {
            match p.complete(offering(names), None).await {
                Err(ModelError::ScriptMismatch { turn: 0, detail, .. }) => assert!(detail.contains(want), "{detail}"),
                other => panic!("expected ScriptMismatch, got {other:?}"),
            }
        }
    }

    #[test]
    fn bad_scripts_are_config_errors_naming_provider_and_file() {
        let path = std::path::Path::new("demo/script.yaml");
        for (text, want) in [
            ("- txt: hello\n", "unknown field `txt`"),
            ("- error: boom\n  text: hi\n", "`error` cannot be combined"),
            ("turns: []\n", "expected a list of turns"),
            ("- tool_calls: [{ arguments: {} }]\n", "missing field `name`"),
        ] {
            let e = ScriptedProvider::from_yaml_str("demo", path, text).unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, ModelError::Config(_)), "{msg}");
            assert!(msg.contains("models.providers.demo") && msg.contains("demo/script.yaml"), "{msg}");
            assert!(msg.contains(want), "{want}: {msg}");
        }
        let e = ScriptedProvider::load("demo", std::path::Path::new("/nonexistent/script.yaml")).unwrap_err();
        assert!(e.to_string().contains("cannot read script /nonexistent/script.yaml"), "{e}");
    }
}

// ---------------------------------------------------------------------------------------
// Configuration and router
// ---------------------------------------------------------------------------------------

mod router {
    use super::*;

    fn dir_with_script() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("demo")).unwrap();
        std::fs::write(dir.path().join("demo/script.yaml"), "- text: scripted hello\n").unwrap();
        dir
    }

    const DESIGN_EXAMPLE: &str = r#"
default: demo/scripted
aliases: { sonnet: demo/scripted, opus: demo/scripted, haiku: demo/scripted }
providers:
  local: { type: openai, base_url: "http://127.0.0.1:8000/v1", api_key_env: OPENAI_API_KEY }
  claude: { type: anthropic, api_key_env: ANTHROPIC_API_KEY }
  demo: { type: scripted, script: ./demo/script.yaml }
"#;

    #[tokio::test]
    async fn design_example_config_builds_and_resolves() {
        init_env();
        let dir = dir_with_script();
        let cfg = ModelsConfig::from_yaml_str(DESIGN_EXAMPLE).unwrap();
        let router = ModelRouter::from_config(&cfg, dir.path()).unwrap();
        assert_eq!(router.provider_names().collect::<Vec<_>>(), ["claude", "demo", "local"]);
        let (p, model) = router.resolve(Some("sonnet")).unwrap();
        assert_eq!((p.name(), model.as_str()), ("demo", "scripted"));
        let out = p.complete(ChatRequest::new(model, vec![Message::user("hi")]), None).await.unwrap();
        assert_eq!(out.message.content, "scripted hello");
        let (p, model) = router.resolve(Some("claude/claude-sonnet-4-5")).unwrap();
        assert_eq!((p.name(), model.as_str()), ("claude", "claude-sonnet-4-5"));
    }

    #[test]
    fn defaults_aliases_and_names() {
        init_env();
        let dir = dir_with_script();
        let cfg = ModelsConfig::from_yaml_str(
            r#"
default: demo/scripted
aliases: { fast: local/qwen3, quick: fast, opus: claude/claude-opus-4 }
providers:
  local: { type: openai, base_url: "http://127.0.0.1:9/v1" }
  claude: { type: anthropic, api_key_env: null, base_url: "http://127.0.0.1:9" }
  demo: { type: scripted, script: demo/script.yaml }
"#,
        )
        .unwrap();
        let router = ModelRouter::from_config(&cfg, dir.path()).unwrap();
        let r = |name: Option<&str>| {
            let (p, m) = router.resolve(name).unwrap();
            format!("{}/{m}", p.name())
        };
        assert_eq!(r(None), "demo/scripted");
        assert_eq!(r(Some("")), "demo/scripted");
        assert_eq!(r(Some("  ")), "demo/scripted");
        assert_eq!(r(Some("inherit")), "demo/scripted");
        assert_eq!(r(Some("fast")), "local/qwen3");
        assert_eq!(r(Some("quick")), "local/qwen3", "alias of an alias");
        assert_eq!(r(Some("opus")), "claude/claude-opus-4", "configured shorthand");
        assert_eq!(r(Some("sonnet")), "demo/scripted", "unconfigured shorthand → default");
        assert_eq!(r(Some("haiku")), "demo/scripted");
        assert_eq!(r(Some("local/meta-llama/Llama-3.1-8B")), "local/meta-llama/Llama-3.1-8B");
    }

    #[test]
    fn unknown_names_list_what_is_available() {
        init_env();
        let dir = dir_with_script();
        let cfg = ModelsConfig::from_yaml_str(
            "default: demo/s\naliases: { fast: demo/x }\nproviders:\n  demo: { type: scripted, script: demo/script.yaml }\n",
        )
        .unwrap();
        let router = ModelRouter::from_config(&cfg, dir.path()).unwrap();
        for (name, why) in [
            ("gpt-4o", "not `provider/model` nor an alias"),
            ("openai/gpt-4o", "no provider `openai`"),
            ("demo/", "names no model"),
        ] {
            let e = router.resolve(Some(name)).err().expect("unknown model must fail");
            let msg = e.to_string();
            assert!(matches!(e, ModelError::UnknownModel { .. }), "{msg}");
            assert!(msg.contains(name) && msg.contains(why), "{msg}");
            assert!(msg.contains("demo/<model>") && msg.contains("fast") && msg.contains("sonnet"), "{msg}");
        }
        let empty = ModelRouter::from_config(&ModelsConfig::default(), dir.path()).unwrap();
        let msg = empty.resolve(None).err().unwrap().to_string();
        assert!(msg.contains("no model providers are configured"), "{msg}");
    }

    #[test]
    fn config_errors_name_the_provider_and_key() {
        init_env();
        let dir = dir_with_script();
        let e = ModelsConfig::from_yaml_str("providers:\n  local: { type: openai, bsae_url: x }\n").unwrap_err();
        assert!(e.to_string().contains("bsae_url") && e.to_string().contains("local"), "{e}");
        let e = ModelsConfig::from_yaml_str("providers:\n  x: { type: gemini }\n").unwrap_err();
        assert!(e.to_string().contains("gemini"), "{e}");
        let e = ModelsConfig::from_yaml_str("defualt: demo/x\n").unwrap_err();
        assert!(e.to_string().contains("defualt"), "{e}");
        let e = ModelsConfig::from_yaml_str("providers:\n  l: { type: openai, timeout: soon }\n").unwrap_err();
        assert!(e.to_string().contains("invalid duration `soon`"), "{e}");

        let e =
            ProviderConfig::from_yaml("mine", serde_yaml::from_str("{ type: openai, scrpt: x }").unwrap()).unwrap_err();
        assert!(e.to_string().contains("models.providers.mine") && e.to_string().contains("scrpt"), "{e}");

        let build = |yaml: &str| {
            ModelRouter::from_config(&ModelsConfig::from_yaml_str(yaml).unwrap(), dir.path()).unwrap_err().to_string()
        };
        let msg = build("default: demo/x\nproviders:\n  demo: { type: scripted }\n");
        assert!(msg.contains("models.providers.demo") && msg.contains("`script` is required"), "{msg}");
        let msg = build("default: local/x\nproviders:\n  local: { type: openai, script: s.yaml }\n");
        assert!(msg.contains("models.providers.local") && msg.contains("only to `type: scripted`"), "{msg}");
        let msg = build("default: local/x\nproviders:\n  local: { type: openai, base_url: localhost:8000 }\n");
        assert!(msg.contains("must start with http"), "{msg}");
        let msg = build("default: nope/x\nproviders:\n  demo: { type: scripted, script: demo/script.yaml }\n");
        assert!(msg.contains("models.default") && msg.contains("no provider `nope`"), "{msg}");
        let msg = build(
            "default: demo/x\naliases: { a: b, b: a }\nproviders:\n  demo: { type: scripted, script: demo/script.yaml }\n",
        );
        assert!(msg.contains("models.aliases.a") && msg.contains("cycle"), "{msg}");
        let msg = build("default: demo/x\nproviders:\n  demo: { type: scripted, script: missing.yaml }\n");
        assert!(msg.contains("cannot read script") && msg.contains("missing.yaml"), "{msg}");
    }

    #[tokio::test]
    async fn configured_timeout_and_key_variable_are_used() {
        init_env();
        let server =
            fake_openai(vec![Reply::Hang(Duration::from_secs(20)), fake::json(200, openai_text_body("hi"))]).await;
        let yaml = format!(
            "default: slow/m\nproviders:\n  slow: {{ type: openai, base_url: \"{}\", api_key_env: {OPENAI_KEY_ENV}, timeout: 250ms }}\n",
            server.base_url
        );
        let router =
            ModelRouter::from_config(&ModelsConfig::from_yaml_str(&yaml).unwrap(), std::path::Path::new(".")).unwrap();
        let (p, model) = router.resolve(None).unwrap();
        let e = p.complete(ChatRequest::new(model.clone(), vec![Message::user("x")]), None).await.unwrap_err();
        assert!(matches!(e, ModelError::Timeout { after, .. } if after == Duration::from_millis(250)), "{e:?}");
        let ok: ChatResponse = p.complete(ChatRequest::new(model, vec![Message::user("x")]), None).await.unwrap();
        assert_eq!(ok.message.content, "hi");
        for r in server.requests() {
            assert_eq!(r.header("authorization"), Some(format!("Bearer {OPENAI_KEY}").as_str()));
        }
    }
}
