//! Session-level tests against replies recorded from the official Python SDK
//! (`mcp` 2.3.0, `tests/peers/mcp_server.py`), replayed through a scripted transport.

use std::collections::VecDeque;

use serde_json::{Value, json};

use crate::*;

type Reply = (u16, Vec<(String, String)>, Vec<u8>);

#[derive(Default)]
struct Script {
    replies: VecDeque<Result<Reply, McpError>>,
    sent: Vec<HttpRequest>,
    chunk: usize,
}

struct Chunks(VecDeque<Vec<u8>>);

impl Body for Chunks {
    fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, McpError> {
        Ok(self.0.pop_front())
    }
}

impl Transport for Script {
    type Body = Chunks;
    fn send(&mut self, request: &HttpRequest) -> Result<(u16, Vec<(String, String)>, Chunks), McpError> {
        self.sent.push(request.clone());
        let (status, headers, body) = self.replies.pop_front().expect("unexpected request")?;
        let size = if self.chunk == 0 { body.len().max(1) } else { self.chunk };
        Ok((status, headers, Chunks(body.chunks(size).map(<[u8]>::to_vec).collect())))
    }
}

fn json_reply(status: u16, body: &str) -> Result<Reply, McpError> {
    Ok((status, vec![("content-type".into(), "application/json".into())], body.as_bytes().to_vec()))
}

fn sse_reply(session: Option<&str>, events: &[&str]) -> Result<Reply, McpError> {
    let mut headers = vec![("Content-Type".to_owned(), "text/event-stream".to_owned())];
    if let Some(s) = session {
        headers.push(("mcp-session-id".into(), s.into()));
    }
    let body: String = events.iter().map(|e| format!("event: message\r\ndata: {e}\r\n\r\n")).collect();
    Ok((200, headers, body.into_bytes()))
}

fn client(replies: Vec<Result<Reply, McpError>>, preference: Preference) -> Client<Script> {
    let script = Script { replies: replies.into(), ..Script::default() };
    Client::new(script, ClientInfo { name: "warden-test".into(), version: "0.0.1".into() }, preference)
}

fn header<'a>(r: &'a HttpRequest, name: &str) -> Option<&'a str> {
    headers::get(&r.headers, name)
}

fn body(r: &HttpRequest) -> Value {
    serde_json::from_slice(r.body.as_deref().unwrap()).unwrap()
}

const DISCOVER_OK: &str = r#"{"jsonrpc":"2.0","id":1,"result":{"cacheScope":"private","capabilities":{"tools":{"listChanged":true}},"instructions":"A test agent served over MCP.","resultType":"complete","supportedVersions":["2026-07-28"],"ttlMs":0,"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"test-agents","version":"1.0.0"}}}}"#;
const TOOLS: &str = r#"{"jsonrpc":"2.0","id":2,"result":{"resultType":"complete","tools":[{"description":"Answers a question like an agent would.","inputSchema":{"type":"object","properties":{"prompt":{"title":"Prompt","type":"string"}},"required":["prompt"]},"name":"agent"},{"description":"Always fails with a tool error.","inputSchema":{"type":"object","properties":{"prompt":{"type":"string"},"reason":{"default":"x","type":"string"}},"required":["prompt"]},"name":"fail"},{"description":"Adds two integers.","inputSchema":{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"]},"name":"add","annotations":{"destructiveHint":false}}]}}"#;
const PROGRESS_1: &str = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p1","progress":1,"total":2,"message":"thinking"}}"#;
const PROGRESS_2: &str = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p1","progress":2,"total":2,"message":"writing"}}"#;
const CALL_OK: &str = r#"{"jsonrpc":"2.0","id":3,"result":{"content":[{"text":"agent answered: hi","type":"text"}],"isError":false,"resultType":"complete","structuredContent":{"result":"agent answered: hi"}}}"#;
const MISSING_SESSION: &str =
    r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Bad Request: Missing session ID"}}"#;
const INIT_OK: &str = r#"{"jsonrpc":"2.0","id":2,"result":{"capabilities":{"tools":{"listChanged":false}},"instructions":"A test agent served over MCP.","protocolVersion":"2025-11-25","serverInfo":{"name":"test-agents","version":"1.0.0","description":"Legacy agents"}}}"#;

#[test]
fn modern_revision_discover_list_and_call_with_progress() {
    for chunk in [0, 1, 7] {
        let mut c = client(
            vec![
                json_reply(200, DISCOVER_OK),
                json_reply(200, TOOLS),
                sse_reply(None, &[PROGRESS_1, PROGRESS_2, CALL_OK]),
            ],
            Preference::Auto,
        );
        c.transport_mut().chunk = chunk;
        let server = c.connect().unwrap().clone();
        assert_eq!(server.protocol_version, "2026-07-28");
        assert_eq!(server.name.as_deref(), Some("test-agents"));
        assert!(server.has_tools());
        assert_eq!(c.session().era(), Some(&Era::Modern { version: "2026-07-28".into() }));

        let tools = c.list_all_tools().unwrap();
        assert_eq!(tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["agent", "fail", "add"]);
        assert_eq!(tools[2].hint("destructiveHint"), Some(false));

        let mut seen = Vec::new();
        let r = c.call_tool("agent", json!({"prompt": "hi"}), Some(json!("p1")), &mut |u| seen.push(u)).unwrap();
        assert_eq!(r.text, "agent answered: hi");
        assert!(!r.is_error);
        let msgs: Vec<_> = seen
            .iter()
            .map(|u| match u {
                Update::Progress(p) => (p.progress, p.message.clone().unwrap()),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(msgs, [(1.0, "thinking".to_owned()), (2.0, "writing".to_owned())]);

        let sent = &c.transport_mut().sent;
        assert_eq!(header(&sent[0], "mcp-method"), Some("server/discover"));
        assert_eq!(header(&sent[0], "mcp-protocol-version"), Some("2026-07-28"));
        assert_eq!(header(&sent[0], "accept"), Some("application/json, text/event-stream"));
        assert_eq!(body(&sent[0])["params"]["_meta"][META_PROTOCOL_VERSION], "2026-07-28");
        let call = &sent[2];
        assert_eq!(header(call, "mcp-method"), Some("tools/call"));
        assert_eq!(header(call, "mcp-name"), Some("agent"));
        assert_eq!(header(call, "mcp-session-id"), None);
        let b = body(call);
        assert_eq!(b["params"]["name"], "agent");
        assert_eq!(b["params"]["arguments"]["prompt"], "hi");
        assert_eq!(b["params"]["_meta"]["progressToken"], "p1");
        assert_eq!(b["params"]["_meta"][META_CLIENT_CAPABILITIES], json!({}));
        assert_eq!(b["params"]["_meta"][META_CLIENT_INFO]["name"], "warden-test");
    }
}

#[test]
fn handshake_fallback_keeps_the_session_and_closes_it() {
    let mut c = client(
        vec![
            json_reply(400, MISSING_SESSION),
            sse_reply(Some("sess-1"), &[INIT_OK]),
            Ok((202, vec![("mcp-session-id".into(), "sess-1".into())], vec![])),
            sse_reply(Some("sess-1"), &[CALL_OK]),
            json_reply(200, ""),
        ],
        Preference::Auto,
    );
    let server = c.connect().unwrap().clone();
    assert_eq!(server.protocol_version, "2025-11-25");
    assert_eq!(server.description.as_deref(), Some("Legacy agents"));
    assert!(c.has_session_id());
    let r = c.call_tool("agent", json!({"prompt": "hi"}), None, &mut |_| {}).unwrap();
    assert_eq!(r.text, "agent answered: hi");
    c.close();
    let sent = &c.transport_mut().sent;
    let init = body(&sent[1]);
    assert_eq!(init["method"], "initialize");
    assert_eq!(init["params"]["protocolVersion"], "2025-11-25");
    assert_eq!(header(&sent[1], "mcp-session-id"), None);
    assert_eq!(body(&sent[2])["method"], "notifications/initialized");
    assert!(body(&sent[2]).get("id").is_none());
    for r in &sent[2..] {
        assert_eq!(header(r, "mcp-session-id"), Some("sess-1"));
        assert_eq!(header(r, "mcp-protocol-version"), Some("2025-11-25"));
        assert_eq!(header(r, "mcp-method"), None);
    }
    assert!(body(&sent[3])["params"].get("_meta").is_none());
    assert_eq!(sent[4].method, "DELETE");
}

#[test]
fn method_not_found_and_other_refusals_fall_back() {
    for refusal in [
        json_reply(200, r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"Method not found"}}"#),
        json_reply(404, "not here"),
        json_reply(405, ""),
        json_reply(200, r#"{"jsonrpc":"2.0","id":1,"result":{"supportedVersions":["2025-11-25"]}}"#),
    ] {
        let mut c = client(vec![refusal, json_reply(200, INIT_OK), Ok((202, vec![], vec![]))], Preference::Auto);
        assert_eq!(c.connect().unwrap().protocol_version, "2025-11-25");
        assert!(!c.has_session_id());
    }
}

#[test]
fn modern_only_servers_and_forced_revisions() {
    let unsupported = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32022,"message":"Unsupported protocol version","data":{"supported":["2027-01-01"],"requested":"2026-07-28"}}}"#;
    let mut c = client(vec![json_reply(400, unsupported)], Preference::Auto);
    assert!(matches!(c.connect(), Err(McpError::Unsupported(_))));

    let mut c = client(vec![json_reply(400, MISSING_SESSION)], Preference::Modern);
    assert!(matches!(c.connect(), Err(McpError::Rpc { code: -32600, status: 400, .. })));

    let mut c = client(
        vec![json_reply(200, &INIT_OK.replace("\"id\":2", "\"id\":1")), Ok((202, vec![], vec![]))],
        Preference::Handshake,
    );
    c.connect().unwrap();
    assert_eq!(body(&c.transport_mut().sent[0])["method"], "initialize");

    let mut c = client(vec![Err(McpError::Timeout("deadline".into()))], Preference::Auto);
    assert_eq!(c.connect().unwrap_err(), McpError::Timeout("deadline".into()));

    let old = INIT_OK.replace("2025-11-25", "2023-01-01");
    let mut c = client(vec![json_reply(200, MISSING_SESSION), json_reply(200, &old)], Preference::Auto);
    assert!(matches!(c.connect(), Err(McpError::Unsupported(_))));
    assert_eq!(Preference::parse("2025-06-18"), Some(Preference::Handshake));
    assert_eq!(Preference::parse("2026-07-28"), Some(Preference::Modern));
    assert_eq!(Preference::parse("nope"), None);
}

#[test]
fn tool_errors_http_errors_and_expired_sessions() {
    let is_error = r#"{"jsonrpc":"2.0","id":3,"result":{"content":[{"text":"Error executing tool fail: no: hi","type":"text"}],"isError":true,"resultType":"complete"}}"#;
    let mut c =
        client(vec![json_reply(200, DISCOVER_OK), json_reply(200, TOOLS), json_reply(200, is_error)], Preference::Auto);
    c.connect().unwrap();
    c.list_all_tools().unwrap();
    let r = c.call_tool("fail", json!({"prompt": "hi"}), None, &mut |_| {}).unwrap();
    assert!(r.is_error);
    assert_eq!(r.text, "Error executing tool fail: no: hi");

    let mut c = client(
        vec![
            json_reply(200, MISSING_SESSION),
            sse_reply(Some("s"), &[INIT_OK]),
            Ok((202, vec![], vec![])),
            Ok((404, vec![], b"gone".to_vec())),
            Ok((
                502,
                vec![("content-type".into(), "text/html".into())],
                "<h1>bad gateway</h1>".repeat(40).into_bytes(),
            )),
        ],
        Preference::Auto,
    );
    c.connect().unwrap();
    assert_eq!(c.call_tool("agent", json!({}), None, &mut |_| {}).unwrap_err(), McpError::SessionExpired);
    match c.call_tool("agent", json!({}), None, &mut |_| {}).unwrap_err() {
        McpError::Http { status: 502, body } => assert!(body.starts_with("<h1>bad gateway") && body.ends_with('…')),
        other => panic!("{other:?}"),
    }
}

#[test]
fn malformed_replies_are_protocol_errors() {
    let mut p = Session::new(ClientInfo { name: "t".into(), version: "1".into() }).connect().1;
    p.complete(200, &[("content-type".into(), "application/json".into())], b"{not json");
    assert!(matches!(p.result(), Err(McpError::Protocol(m)) if m.contains("not JSON")));

    let mut p = Session::new(ClientInfo { name: "t".into(), version: "1".into() }).connect().1;
    p.complete(200, &[("content-type".into(), "text/event-stream".into())], b": ping\n\n");
    assert!(matches!(p.result(), Err(McpError::Protocol(m)) if m.contains("ended without")));

    // A response to another id is ignored; a server request is surfaced.
    let mut p = Session::new(ClientInfo { name: "t".into(), version: "1".into() }).connect().1;
    let stream = "data: {\"jsonrpc\":\"2.0\",\"id\":99,\"result\":{}}\n\ndata: {\"jsonrpc\":\"2.0\",\"id\":\"s1\",\"method\":\"ping\"}\n\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"ok\":true}}\n\n";
    let updates =
        p.complete(200, &[("content-type".into(), "text/event-stream; charset=utf-8".into())], stream.as_bytes());
    assert_eq!(updates, [Update::ServerRequest { id: json!("s1"), method: "ping".into() }]);
    assert_eq!(p.result().unwrap(), json!({"ok": true}));
}

#[test]
fn stdio_replies_are_read_one_message_at_a_time() {
    // The answer comes after a notification, a server request and another id's response.
    let mut p = Session::new(ClientInfo { name: "t".into(), version: "1".into() }).connect().1;
    assert!(p.expects_reply());
    p.begin_messages();
    assert!(
        p.feed(br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"hi"}}"#).len()
            == 1
    );
    let asked = p.feed(br#"{"jsonrpc":"2.0","id":"s1","method":"ping"}"#);
    assert_eq!(asked, [Update::ServerRequest { id: json!("s1"), method: "ping".into() }]);
    assert!(p.feed(br#"{"jsonrpc":"2.0","id":99,"result":{}}"#).is_empty() && !p.is_done());
    assert!(p.feed(b"   ").is_empty());
    p.feed(br#"{"jsonrpc":"2.0","id":1,"result":{"ok":true}}"#);
    assert!(p.is_done());
    assert_eq!(p.result().unwrap(), json!({"ok": true}));

    // A stream that ends first, and a line that is not JSON, are errors.
    let mut p = Session::new(ClientInfo { name: "t".into(), version: "1".into() }).connect().1;
    p.begin_messages();
    p.finish();
    assert!(matches!(p.result(), Err(McpError::Transport(m)) if m.contains("ended")));
    let mut p = Session::new(ClientInfo { name: "t".into(), version: "1".into() }).connect().1;
    p.begin_messages();
    p.feed(b"Traceback (most recent call last):");
    assert!(matches!(p.result(), Err(McpError::Protocol(m)) if m.contains("not JSON")));
}

#[test]
fn results_join_text_and_name_other_content() {
    let r = ToolResult::from_result(json!({"content": [
        {"type": "text", "text": "one"},
        {"type": "image", "data": "AA==", "mimeType": "image/png"},
        {"type": "resource", "resource": {"uri": "file:///x", "text": "two"}},
        {"type": "text", "text": "three"}
    ]}))
    .unwrap();
    assert_eq!(r.text, "one\n[image content, image/png]\ntwo\nthree");
    let r = ToolResult::from_result(json!({"content": [], "structuredContent": {"a": 1}})).unwrap();
    assert_eq!(r.text, r#"{"a":1}"#);
    assert!(matches!(
        ToolResult::from_result(json!({"resultType": "input_required", "inputRequests": {}})),
        Err(McpError::Unsupported(_))
    ));
}

#[test]
fn agent_tool_selection() {
    let (page, skipped) =
        ToolsPage::from_result(serde_json::from_str::<Value>(TOOLS).unwrap()["result"].clone()).unwrap();
    assert!(skipped.is_empty());
    let tools = page.tools;
    let (_, t) = select_agent_tool(&tools, None, None).unwrap();
    assert_eq!(t, AgentTool { tool: "agent".into(), argument: "prompt".into() });
    let (_, t) = select_agent_tool(&tools, Some("fail"), None).unwrap();
    assert_eq!(t.argument, "prompt"); // the only required string argument
    let (_, t) = select_agent_tool(&tools, Some("fail"), Some("reason")).unwrap();
    assert_eq!(t.argument, "reason");
    assert!(select_agent_tool(&tools, Some("fail"), Some("nope")).unwrap_err().contains("no argument"));
    assert!(select_agent_tool(&tools, Some("missing"), None).unwrap_err().contains("agent, fail, add"));
    assert!(select_agent_tool(&tools, Some("add"), None).unwrap_err().contains("no string argument"));
    let two = [tools[0].clone(), Tool { name: "agent2".into(), ..tools[0].clone() }];
    assert!(select_agent_tool(&two, None, None).unwrap_err().contains("several"));
    assert!(select_agent_tool(&tools[2..], None, None).unwrap_err().contains("set metadata `tool`"));
}

#[test]
fn claude_names_round_trip() {
    assert_eq!(claude_tool_name("fs", "read_file"), "mcp__fs__read_file");
    assert_eq!(claude_tool_name("my server", "a.b"), "mcp__my_server__a_b");
    assert_eq!(parse_claude_tool_name("mcp__fs__read__file"), Some(("fs", "read__file")));
    assert_eq!(parse_claude_tool_name("Read"), None);
    assert_eq!(parse_claude_tool_name("mcp____x"), None);
}

#[test]
fn mcp_name_header_is_encoded_and_pagination_is_followed() {
    let page1 = r#"{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"a","inputSchema":{"type":"object"}}],"nextCursor":"c2"}}"#;
    let page2 = r#"{"jsonrpc":"2.0","id":3,"result":{"tools":[{"name":"b"}]}}"#;
    let call = r#"{"jsonrpc":"2.0","id":4,"result":{"content":[{"type":"text","text":"ok"}]}}"#;
    let mut c = client(
        vec![json_reply(200, DISCOVER_OK), json_reply(200, page1), json_reply(200, page2), json_reply(200, call)],
        Preference::Auto,
    );
    c.connect().unwrap();
    let tools = c.list_all_tools().unwrap();
    assert_eq!(tools.len(), 2);
    assert_eq!(tools[1].input_schema, json!({"type": "object"}));
    c.call_tool("wetter-äpfel", json!({}), None, &mut |_| {}).unwrap();
    let sent = &c.transport_mut().sent;
    assert_eq!(body(&sent[2])["params"]["cursor"], "c2");
    assert_eq!(header(&sent[3], "mcp-name"), Some("=?base64?d2V0dGVyLcOkcGZlbA==?="));
}

// ------------------------------------------------------------------ limits

fn tools_reply(id: u64, tools: &[Value], next: Option<&str>) -> Result<Reply, McpError> {
    let mut result = json!({ "tools": tools });
    if let Some(c) = next {
        result["nextCursor"] = json!(c);
    }
    json_reply(200, &json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string())
}

#[test]
fn parsed_size_counts_what_a_value_costs_not_what_the_text_weighs() {
    let text = format!(r#"{{"a":"{}"}}"#, "x".repeat(10_000));
    assert!(parsed_size(text.as_bytes()) < text.len() + 2_000, "text costs about its length");
    let bomb = format!("[{}]", vec![r#"{"":0}"#; 1000].join(","));
    assert!(parsed_size(bomb.as_bytes()) > 100 * bomb.len(), "one-entry objects cost a B-tree leaf each");
    // Structure inside strings (escaped quotes included) is text, not structure.
    assert!(parsed_size(br#"["{{{{[[[,,,\"{{{{{{"]"#) < 300);
}

#[test]
fn a_page_of_small_objects_is_refused_unparsed() {
    // 1 MiB of `{"":0}`: within the listing's byte bound, ~100 MiB as a Value.
    let objects = vec![r#"{"":0}"#; 150_000].join(",");
    let page = format!(
        r#"{{"jsonrpc":"2.0","id":2,"result":{{"tools":[{{"name":"t","inputSchema":{{"x":[{objects}]}}}}]}}}}"#
    );
    for reply in [json_reply(200, &page), sse_reply(None, &[&page])] {
        let mut c = client(vec![json_reply(200, DISCOVER_OK), reply], Preference::Auto);
        c.transport_mut().chunk = 4096;
        c.connect().unwrap();
        let e = c.list_all_tools().unwrap_err();
        assert!(matches!(&e, McpError::TooLarge { what, .. } if what.contains("memory parsed")), "{e:?}");
    }
}

#[test]
fn a_reply_over_its_byte_bound_is_not_read_to_the_end() {
    // A newline-free event stream (or JSON body) larger than the listing bound.
    let huge = "x".repeat(limits::MAX_LIST_BYTES + 1);
    let sse: Reply = (200, vec![("content-type".into(), "text/event-stream".into())], format!("data: {huge}").into());
    for reply in [Ok(sse), json_reply(200, &huge)] {
        let mut c = client(vec![json_reply(200, DISCOVER_OK), reply], Preference::Auto);
        c.transport_mut().chunk = 64 * 1024;
        c.connect().unwrap();
        match c.list_all_tools().unwrap_err() {
            McpError::TooLarge { limit, .. } => assert_eq!(limit, limits::MAX_LIST_BYTES),
            McpError::Protocol(m) => assert!(m.contains("exceeds"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_listing_is_held_to_its_bounds_across_pages() {
    let limits =
        ListLimits { max_tools: 5, max_description: 16, max_schema: 64, max_annotations: 32, ..ListLimits::default() };
    let mut listing = Listing::new(limits);
    let tool = |n: &str| json!({"name": n});
    let page1 = json!({"tools": [
        tool("a"), tool("a"),
        {"name": "long", "description": "é".repeat(40), "title": "t".repeat(40)},
        {"name": "schema", "inputSchema": {"type": "object", "description": "s".repeat(100)}},
        {"name": "hints", "annotations": {"readOnlyHint": true, "x": "y".repeat(100)}},
        {"name": 7},
    ], "nextCursor": "c1"});
    assert_eq!(listing.add(100, page1).unwrap().as_deref(), Some("c1"));
    // The same cursor again ends the listing (a server looping on one page).
    let page2 = json!({"tools": [tool("b"), tool("a")], "nextCursor": "c1"});
    assert_eq!(listing.add(100, page2).unwrap(), None);
    let (tools, warnings) = listing.finish();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "long", "hints", "b"]);
    assert!(tools[1].description.as_ref().unwrap().len() <= 16);
    assert!(tools[1].title.as_ref().unwrap().ends_with('…'));
    assert_eq!(tools[2].annotations, None);
    assert_eq!(warnings.len(), 5, "{warnings:#?}"); // duplicate ×2, schema, annotations, unparsable
    // The tool bound ends the listing; so does the byte bound, counted across pages.
    let mut listing = Listing::new(ListLimits { max_tools: 2, ..ListLimits::default() });
    let page = json!({"tools": [tool("a"), tool("b"), tool("c")], "nextCursor": "more"});
    assert_eq!(listing.add(10, page).unwrap(), None);
    assert_eq!(listing.finish().0.len(), 2);
    let mut listing = Listing::new(ListLimits { max_bytes: 150, ..ListLimits::default() });
    assert!(listing.add(100, json!({"tools": [], "nextCursor": "x"})).unwrap().is_some());
    assert_eq!(listing.remaining_bytes(), 50);
    assert!(matches!(listing.add(100, json!({"tools": []})), Err(McpError::TooLarge { .. })));
}

#[test]
fn a_listing_stops_after_its_last_page() {
    let tools: Vec<Value> = vec![json!({"name": "t"})];
    let mut replies = vec![json_reply(200, DISCOVER_OK)];
    for page in 0..=MAX_TOOL_PAGES {
        replies.push(tools_reply(page as u64 + 2, &tools, Some(&format!("c{page}"))));
    }
    let mut c = client(replies, Preference::Auto);
    c.connect().unwrap();
    c.list_all_tools().unwrap();
    assert_eq!(c.transport_mut().sent.len(), 1 + MAX_TOOL_PAGES, "no page past the bound is asked for");
}
