//! `script:<json>`: a list of host import calls with adversarial arguments, so the host
//! tests can generate them (proptest) and drive every import through a real component.
//!
//! The script is a JSON array of objects, each with an `op` and its arguments; every op
//! takes `"repeat": n` (default 1) to make the call n times. A text argument is a JSON
//! string or `{"repeat": "<text>", "times": n}` (large inputs without a large prompt).
//!
//! | op | call | arguments |
//! |---|---|---|
//! | `log` | `log::write` | `level` (trace..error), `message` |
//! | `log_bad_utf8` | `log::write` with bytes that are not UTF-8 | |
//! | `emit` | `events::emit` | `kind`, `data` |
//! | `state_set` | `state::set` | `key`, `value` (text) or `value_len` (bytes of 0xA5), `distinct` (key + index per repeat) |
//! | `state_get` / `state_delete` | `state::get` / `state::delete`; `state_get` gives `ok:<length>`, or with `show: true` `ok:<the value as text>` | `key` |
//! | `http` | `http::send` or, with `stream: true`, `http::send_streaming` (streams stay open until the script ends, or with `read: true` are read to the end); the result is the status, the body and the `x-…` response headers | `method`, `url`, `headers` ([[k, v]]), `extra_headers` (n copies of `x-h: v`), `body` (text) or `body_len`, `timeout_ms`, `auth_secret` |
//! | `resource` | `resources::read` | `uri` |
//! | `model` | `model::complete` | `model`, `role`, `messages` (count), `content`, `arguments`, `tools` (count) |
//! | `tools_list` / `tools_call` | `tools::list` / `tools::call`; `tools_call` gives `ok:[{"is_error", "content"}]` (content cut at 4 KiB) | `calls` (count), `name`, `arguments` |
//! | `sleep` | `clock::sleep`; `ok:<ms slept>` | `ms` |
//! | `now` / `remaining` | `clock::now_ms` / `clock::remaining_ms`; `ok:<ms>` | |
//! | `canceled` | `cancel::is_canceled`; `ok:<bool>` | |
//! | `cancel_wait` | `cancel::wait`; `ok:<bool>:<ms waited>` | `ms` |
//!
//! The result is a JSON array with one entry per op: `"ok"`, `"ok:<detail>"` or
//! `"err:<variant>:<message>"` of the last repetition that failed (the first failure of
//! an op stops its repetitions).

use serde_json::{Value, json};

use crate::warden::plugin::types::Error;
use crate::warden::plugin::{cancel, clock, events, http, log, model, resources, state, tools};

fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => {
            let unit = o.get("repeat").and_then(Value::as_str).unwrap_or("x");
            let times = o.get("times").and_then(Value::as_u64).unwrap_or(1) as usize;
            unit.repeat(times)
        }
        Some(other) => other.to_string(),
        None => String::new(),
    }
}

fn num(op: &Value, key: &str) -> Option<u64> {
    op.get(key).and_then(Value::as_u64)
}

fn describe(e: &Error) -> String {
    let (variant, message) = match e {
        Error::NotFound(m) => ("not-found", m),
        Error::InvalidInput(m) => ("invalid-input", m),
        Error::Denied(m) => ("denied", m),
        Error::Timeout(m) => ("timeout", m),
        Error::Remote(m) => ("remote", m),
        Error::Unavailable(m) => ("unavailable", m),
        Error::InputRequired(m) => ("input-required", m),
        Error::Internal(m) => ("internal", m),
        Error::Canceled(m) => ("canceled", m),
    };
    let mut message = message.clone();
    message.truncate(message.floor_char_boundary(512));
    format!("err:{variant}:{message}")
}

fn level(name: &str) -> log::Level {
    match name {
        "trace" => log::Level::Trace,
        "debug" => log::Level::Debug,
        "warn" => log::Level::Warn,
        "error" => log::Level::Error,
        _ => log::Level::Info,
    }
}

fn request(op: &Value) -> http::Request {
    let mut headers: Vec<(String, String)> = op
        .get("headers")
        .and_then(Value::as_array)
        .map(|hs| hs.iter().map(|h| (text(h.get(0)), text(h.get(1)))).collect())
        .unwrap_or_default();
    for _ in 0..num(op, "extra_headers").unwrap_or(0) {
        headers.push(("x-h".into(), "v".into()));
    }
    http::Request {
        method: op.get("method").map(|m| text(Some(m))).unwrap_or_else(|| "GET".into()),
        url: text(op.get("url")),
        headers,
        body: op
            .get("body")
            .map(|b| text(Some(b)).into_bytes())
            .or_else(|| num(op, "body_len").map(|n| vec![b'b'; n as usize])),
        timeout_ms: num(op, "timeout_ms").map(|n| n as u32),
        auth_secret: op.get("auth_secret").map(|s| text(Some(s))),
    }
}

/// One call of `op`; `streams` keeps streamed bodies open until the script ends.
fn call(op: &Value, index: u64, streams: &mut Vec<http::BodyStream>) -> Result<String, Error> {
    let name = op.get("op").and_then(Value::as_str).unwrap_or("");
    match name {
        "log" => log::write(level(&text(op.get("level"))), &text(op.get("message"))).map(|_| String::new()),
        "log_bad_utf8" => {
            // SAFETY: deliberately not UTF-8: the host must refuse it without harm.
            let bad = unsafe { String::from_utf8_unchecked(vec![b'a', 0xff, 0xfe, b'\n']) };
            log::write(log::Level::Info, &bad).map(|_| String::new())
        }
        "emit" => events::emit(&text(op.get("kind")), &text(op.get("data"))).map(|_| String::new()),
        "state_set" => {
            let mut key = text(op.get("key"));
            if op.get("distinct").and_then(Value::as_bool).unwrap_or(false) {
                key.push_str(&index.to_string());
            }
            let value = match op.get("value") {
                Some(v) => text(Some(v)).into_bytes(),
                None => vec![0xA5u8; num(op, "value_len").unwrap_or(0) as usize],
            };
            state::set(&key, &value).map(|_| String::new())
        }
        "state_get" => {
            let show = op.get("show").and_then(Value::as_bool).unwrap_or(false);
            state::get(&text(op.get("key"))).map(|v| match v {
                Some(v) if show => String::from_utf8_lossy(&v).into_owned(),
                Some(v) => v.len().to_string(),
                None => String::new(),
            })
        }
        "state_delete" => state::delete(&text(op.get("key"))).map(|_| String::new()),
        "http" => {
            let req = request(op);
            // Response headers named `x-…` are shown after the body, one per line.
            let extra = |headers: &[(String, String)]| -> String {
                headers.iter().filter(|(k, _)| k.starts_with("x-")).map(|(k, v)| format!("\n{k}: {v}")).collect()
            };
            if op.get("stream").and_then(Value::as_bool).unwrap_or(false) {
                let (head, body) = http::send_streaming(&req)?;
                if !op.get("read").and_then(Value::as_bool).unwrap_or(false) {
                    streams.push(body);
                    return Ok(head.status.to_string());
                }
                let mut all = Vec::new();
                while let Some(chunk) = body.next()? {
                    all.extend(chunk);
                }
                Ok(format!("{} {}{}", head.status, String::from_utf8_lossy(&all), extra(&head.headers)))
            } else {
                let r = http::send(&req)?;
                Ok(format!("{} {}{}", r.status, String::from_utf8_lossy(&r.body), extra(&r.headers)))
            }
        }
        "resource" => resources::read(&text(op.get("uri"))).map(|b| b.len().to_string()),
        "sleep" => {
            let started = clock::now_ms();
            clock::sleep(num(op, "ms").unwrap_or(0)).map(|()| (clock::now_ms() - started).to_string())
        }
        "now" => Ok(clock::now_ms().to_string()),
        "remaining" => Ok(clock::remaining_ms().to_string()),
        "canceled" => Ok(cancel::is_canceled().to_string()),
        "cancel_wait" => {
            let started = clock::now_ms();
            let canceled = cancel::wait(num(op, "ms").unwrap_or(0));
            Ok(format!("{canceled}:{}", clock::now_ms() - started))
        }
        "model" => {
            let messages = (0..num(op, "messages").unwrap_or(1))
                .map(|i| model::Message {
                    role: op.get("role").map(|r| text(Some(r))).unwrap_or_else(|| "user".into()),
                    content: text(op.get("content")),
                    tool_calls: if op.get("arguments").is_some() {
                        vec![model::ToolCall {
                            id: i.to_string(),
                            name: "Bash".into(),
                            arguments: text(op.get("arguments")),
                        }]
                    } else {
                        Vec::new()
                    },
                    tool_call_id: None,
                })
                .collect();
            let tools = (0..num(op, "tools").unwrap_or(0))
                .map(|i| model::ToolSpec { name: format!("t{i}"), description: "d".into(), input_schema: "{}".into() })
                .collect();
            let req = model::CompletionRequest { model: text(op.get("model")), messages, tools, max_tokens: Some(1) };
            model::complete(&req).map(|c| c.message.content)
        }
        "tools_list" => tools::list().map(|t| t.len().to_string()),
        "tools_call" => {
            let calls = (0..num(op, "calls").unwrap_or(1))
                .map(|i| model::ToolCall {
                    id: i.to_string(),
                    name: op.get("name").map(|n| text(Some(n))).unwrap_or_else(|| "Bash".into()),
                    arguments: text(op.get("arguments")),
                })
                .collect::<Vec<_>>();
            tools::call(&calls).map(|results| {
                let shown: Vec<Value> = results
                    .iter()
                    .map(|r| {
                        let mut content = r.content.clone();
                        content.truncate(content.floor_char_boundary(4096));
                        json!({ "is_error": r.is_error, "content": content })
                    })
                    .collect();
                Value::Array(shown).to_string()
            })
        }
        other => Err(Error::InvalidInput(format!("unknown script op {other:?}"))),
    }
}

/// Runs the script in `text`; a malformed script is an `invalid-input` error.
pub fn run(text: &str) -> Result<String, Error> {
    let ops: Vec<Value> = serde_json::from_str(text).map_err(|e| Error::InvalidInput(format!("script: {e}")))?;
    let mut streams = Vec::new();
    let mut results = Vec::new();
    for op in &ops {
        let mut result = "ok".to_string();
        for i in 0..num(op, "repeat").unwrap_or(1) {
            match call(op, i, &mut streams) {
                Ok(detail) if detail.is_empty() => result = "ok".into(),
                Ok(detail) => result = format!("ok:{detail}"),
                Err(e) => {
                    result = describe(&e);
                    break;
                }
            }
        }
        results.push(Value::String(result));
    }
    drop(streams);
    Ok(json!(results).to_string())
}
