//! What each parent-agent protocol layer costs (BENCHMARKS.md `## Protocol layers`): the
//! same trivial task (the `echo` test plugin) through `POST /v1/tasks`, through `/mcp`
//! (`tools/call`, 2026-07-28, one stateless request) and through A2A (`SendMessage`,
//! protocol 1.0), measured side by side in one run: rounds alternate the protocols so
//! drift of the machine hits all alike. One keep-alive HTTP client, calls in sequence.
//!
//! `cargo test -p warden-e2e --test e2e protocols -- --ignored --nocapture`; `WARDEN_BIN`
//! picks the binary (a release build for absolute figures).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::*;

/// Rounds per protocol (alternating) and calls per round.
const ROUNDS: usize = 5;
const CALLS: usize = 200;

/// A body that is either JSON or an SSE stream whose last `data:` line is the answer.
fn last_json(text: &str) -> Value {
    if let Ok(v) = serde_json::from_str(text) {
        return v;
    }
    let data = text.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim).rfind(|l| !l.is_empty());
    serde_json::from_str(data.unwrap_or_else(|| panic!("no JSON in {text}"))).unwrap()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Layer {
    Rest,
    Mcp,
    A2a,
}

async fn one_call(http: &reqwest::Client, base: &str, layer: Layer, i: usize) {
    let prompt = format!("ping {i}");
    let (url, body, headers): (String, Value, Vec<(&str, &str)>) = match layer {
        Layer::Rest => (
            format!("{base}/v1/tasks"),
            json!({ "description": "bench", "prompt": prompt, "subagent_type": "greeter" }),
            vec![],
        ),
        Layer::Mcp => (
            format!("{base}/mcp"),
            json!({ "jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
                "name": "greeter", "arguments": { "prompt": prompt },
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {},
                    "io.modelcontextprotocol/clientInfo": { "name": "bench", "version": "1" }
                }
            }}),
            vec![
                ("mcp-protocol-version", "2026-07-28"),
                ("mcp-method", "tools/call"),
                ("mcp-name", "greeter"),
                ("accept", "application/json, text/event-stream"),
            ],
        ),
        Layer::A2a => (
            format!("{base}/a2a/greeter"),
            json!({ "jsonrpc": "2.0", "id": i, "method": "SendMessage", "params": {
                "message": { "messageId": format!("m{i}"), "role": "ROLE_USER", "parts": [{ "text": prompt }] },
                "configuration": { "blocking": true }
            }}),
            vec![("a2a-version", "1.0")],
        ),
    };
    let mut req = http.post(url).header("content-type", "application/json").body(body.to_string());
    for (k, v) in headers {
        req = req.header(k, v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let text = resp.text().await.unwrap();
    assert!(status.is_success(), "{layer:?}: {status} {text}");
    let answer = last_json(&text);
    let found = answer.to_string().contains(&format!("ping {i}"));
    assert!(found, "{layer:?}: the answer lacks the echo: {answer}");
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "benchmark: run explicitly"]
async fn bench_protocol_layers() {
    let d = Deployment::new(
        "  grants:\n    echo: { log: true, events: true, state: true }\n\
         subagents:\n  agent_dirs: []\n  references:\n    - { uri: \"echo://greeter\", kind: ECHO }\n\
         store:\n  path: ./state/tasks.db\n",
    );
    d.add("echo", "echo");
    let serve = Server::start(&d);
    let base = format!("http://127.0.0.1:{}", serve.port);
    let http = reqwest::Client::new();
    let layers: Vec<Layer> = match std::env::var("WARDEN_LAYERS") {
        Ok(v) => v
            .split(',')
            .map(|l| match l {
                "rest" => Layer::Rest,
                "mcp" => Layer::Mcp,
                "a2a" => Layer::A2a,
                other => panic!("unknown layer {other}"),
            })
            .collect(),
        Err(_) => vec![Layer::Rest, Layer::Mcp, Layer::A2a],
    };
    for &l in &layers {
        for i in 0..20 {
            one_call(&http, &base, l, i).await; // warm-up
        }
    }
    let mut times: Vec<Vec<Duration>> = vec![vec![]; layers.len()];
    for _ in 0..ROUNDS {
        for (k, &l) in layers.iter().enumerate() {
            for i in 0..CALLS {
                let t = Instant::now();
                one_call(&http, &base, l, i).await;
                times[k].push(t.elapsed());
            }
        }
    }
    let rest = median(&mut times[0].clone());
    println!("protocol layers: {} calls each in {ROUNDS} alternating rounds, sequential, keep-alive", ROUNDS * CALLS);
    for (k, l) in layers.iter().enumerate() {
        let m = median(&mut times[k]);
        let p90 = times[k][times[k].len() * 9 / 10];
        println!(
            "  {l:?}: median {:.3} ms, p90 {:.3} ms, ratio to {:?} {:.2}x",
            m.as_secs_f64() * 1e3,
            p90.as_secs_f64() * 1e3,
            layers[0],
            m.as_secs_f64() / rest.as_secs_f64()
        );
    }
}
