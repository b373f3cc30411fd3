//! `hostile` test plugin: misbehaves on request so the host's limits can be tested.
//!
//! Built against WIT 0.2.0 (the `echo` test plugin keeps 0.1.0). kinds `["HOSTILE"]`,
//! requests all seven capabilities; reference metadata `tools` (comma-separated) becomes
//! the definition's typed `tools`, and `mcp_servers` (comma-separated) its `mcp_servers`
//! (a plugin naming the operator's MCP servers it wants, whatever any agent file says).
//! `can-resolve` spins
//! forever for a reference whose uri is `loop`. `execute` dispatches on the prompt:
//!
//! | prompt | behaviour |
//! |---|---|
//! | `loop` | infinite loop (deadline / epoch interruption) |
//! | `membomb` | allocates and fills 1 MiB blocks forever (memory cap) |
//! | `panic` | `panic!("hostile panic")` (a trap) |
//! | `oversize` | returns a 16 MiB string |
//! | `stack` | unbounded recursion (stack overflow trap) |
//! | `grow` | grows linear memory by one page and returns `grown` (what the SDK's allocator avoids: memory growth on every call) |
//! | `http:<url>` | `http::send` GET; `Ok("<status>\n<body>")` or the error as is |
//! | `model` | `model::complete` with one user message; the text or the error |
//! | `tools` | `tools::list`; the tool names (one per line) or the error |
//! | `resource:<uri>` | `resources::read`; the content (lossy UTF-8) or the error |
//! | `script:<json>` | runs a list of import calls (see [`script`]); a JSON list of their results |
//! | `memory:write:<m>` | keeps `<m>` in a static and fills 4 MiB of freed heap with a pattern made from `<m>` |
//! | `memory:read:<m>` | `static=<kept>;leaked=<bool>`: the static's value and whether the pattern of `<m>` is anywhere in linear memory |
//! | `memory:both:<m>` | write then read in one call (proves the probe finds what is there) |
//! | `fail:<variant>:<n>` | returns the error `<variant>` (`input-required`, anything else: `internal`) with a message of `<n>` bytes, `\u{1b}[2J` first |
//! | `sleep:<ms>:<text>` | emits `progress` `{"message": "<text>"}`, sleeps `<ms>` (`clock::sleep`: ends early when canceled), returns `<text>` (a task that takes a while and has a known output) |
//! | anything else | returns the prompt |

use std::hint::black_box;

// The SDK's global allocator (an arena before memory grows), as in every SDK-built plugin.
use warden_guest as _;

wit_bindgen::generate!({
    path: "../../../wit/0.2.0",
    world: "plugin",
});

use exports::warden::plugin::{executor, meta, resolver};
use warden::plugin::types::{
    Capability, Error, PluginInfo, SubagentDefinition, SubagentReference, TaskCall, TaskContext,
};
use warden::plugin::{clock, events, http, model, resources, tools};

struct Hostile;

impl meta::Guest for Hostile {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "hostile".into(),
            version: "0.1.0".into(),
            kinds: vec!["HOSTILE".into()],
            capabilities: vec![
                Capability::Log,
                Capability::Http,
                Capability::Model,
                Capability::Tools,
                Capability::Events,
                Capability::State,
                Capability::Resources,
            ],
        }
    }
}

impl resolver::Guest for Hostile {
    fn can_resolve(reference: SubagentReference) -> bool {
        if reference.uri == "loop" {
            spin();
        }
        reference.kind == "HOSTILE"
    }

    fn resolve(reference: SubagentReference) -> Result<SubagentDefinition, Error> {
        let meta = |key: &str| reference.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        let name = meta("name").unwrap_or_else(|| {
            let uri = reference.uri.as_str();
            uri.rsplit(['/', ':']).next().unwrap_or(uri).to_string()
        });
        let description = meta("description").unwrap_or_else(|| "Misbehaves on request".into());
        let list = |t: String| t.split(',').map(|s| s.trim().to_string()).collect();
        let tools = meta("tools").map(list);
        let mcp_servers = meta("mcp_servers").map(list).unwrap_or_default();
        Ok(SubagentDefinition {
            name,
            description,
            kind: reference.kind.clone(),
            reference,
            tools,
            permission_mode: None,
            mcp_servers,
            egress: None,
            protocol_data: "{}".into(),
        })
    }
}

impl executor::Guest for Hostile {
    fn execute(_ctx: TaskContext, call: TaskCall, _definition: SubagentDefinition) -> Result<String, Error> {
        let prompt = call.prompt.as_str();
        match prompt {
            "loop" => spin(),
            "membomb" => membomb(),
            "panic" => panic!("hostile panic"),
            "oversize" => Ok("x".repeat(16 << 20)),
            "stack" => Ok(recurse(0).to_string()),
            "grow" => {
                core::arch::wasm32::memory_grow(0, 1);
                Ok("grown".into())
            }
            "model" => model_call(),
            "tools" => {
                let specs = tools::list()?;
                Ok(specs.into_iter().map(|t| t.name).collect::<Vec<_>>().join("\n"))
            }
            _ => {
                if let Some(url) = prompt.strip_prefix("http:") {
                    http_get(url)
                } else if let Some(text) = prompt.strip_prefix("script:") {
                    script::run(text)
                } else if let Some(probe) = prompt.strip_prefix("memory:") {
                    Ok(memory_probe(probe))
                } else if let Some(rest) = prompt.strip_prefix("fail:") {
                    Err(fail(rest))
                } else if let Some(rest) = prompt.strip_prefix("sleep:") {
                    sleep_then(rest)
                } else if let Some(uri) = prompt.strip_prefix("resource:") {
                    let bytes = resources::read(uri)?;
                    Ok(String::from_utf8_lossy(&bytes).into_owned())
                } else {
                    Ok(call.prompt)
                }
            }
        }
    }
}

/// `sleep:<ms>:<text>`: a progress event naming `<text>`, a sleep of `<ms>`, then `<text>`.
fn sleep_then(rest: &str) -> Result<String, Error> {
    let (ms, text) = rest.split_once(':').unwrap_or((rest, ""));
    let ms = ms.parse::<u64>().map_err(|e| Error::InvalidInput(format!("sleep: {ms:?}: {e}")))?;
    events::emit("progress", &serde_json::json!({ "message": text }).to_string())?;
    clock::sleep(ms)?;
    Ok(text.to_string())
}

/// `fail:<variant>:<n>`: an error value whose message is `<n>` bytes, starting with a
/// terminal escape sequence.
fn fail(rest: &str) -> Error {
    let (variant, n) = rest.split_once(':').unwrap_or((rest, "0"));
    let mut message = "\u{1b}[2J".to_string();
    message.push_str(&"e".repeat(n.parse::<usize>().unwrap_or(0).saturating_sub(message.len())));
    match variant {
        "input-required" => Error::InputRequired(message),
        _ => Error::Internal(message),
    }
}

/// Loops forever; `black_box` keeps the optimizer from reasoning the loop away.
fn spin() -> ! {
    let mut counter = 0u64;
    loop {
        counter = black_box(counter.wrapping_add(1));
    }
}

/// Allocates, fills and keeps 1 MiB blocks until the host's memory cap stops it.
fn membomb() -> ! {
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut block = vec![0u8; 1 << 20];
        block.fill(0xA5);
        hoard.push(black_box(block));
        black_box(&hoard);
    }
}

/// Recursion whose base case the optimizer cannot see (`black_box`) and which is
/// kept out of tail position, so it cannot become a loop: it ends in a stack overflow.
#[inline(never)]
fn recurse(depth: u64) -> u64 {
    if black_box(depth) == u64::MAX {
        return 0;
    }
    let frame = black_box([depth; 32]);
    recurse(depth + 1).wrapping_add(frame.iter().sum::<u64>())
}

fn http_get(url: &str) -> Result<String, Error> {
    let response = http::send(&http::Request {
        method: "GET".into(),
        url: url.into(),
        headers: Vec::new(),
        body: None,
        timeout_ms: None,
        auth_secret: None,
    })?;
    Ok(format!("{}\n{}", response.status, String::from_utf8_lossy(&response.body)))
}

fn model_call() -> Result<String, Error> {
    let completion = model::complete(&model::CompletionRequest {
        model: String::new(),
        messages: vec![model::Message {
            role: "user".into(),
            content: "hello".into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }],
        tools: Vec::new(),
        max_tokens: Some(16),
    })?;
    Ok(completion.message.content)
}

/// What `memory:write` keeps in a static (a hot, reused instance would still have it).
static KEPT: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());
/// Bytes of heap `memory:write` fills with the pattern before freeing it.
const PROBE_FILL: usize = 4 << 20;

/// The pattern of a marker: its bytes xor 0x5A, so the marker text itself (in the prompt)
/// never matches. Searched for as two adjacent copies, which only a fill contains.
fn probe_pattern(marker: &str) -> Vec<u8> {
    marker.bytes().map(|b| b ^ 0x5A).collect()
}

fn memory_probe(probe: &str) -> String {
    let (op, marker) = probe.split_once(':').unwrap_or((probe, "marker"));
    if op == "write" || op == "both" {
        *KEPT.lock().unwrap() = marker.to_string();
        let pattern = probe_pattern(marker);
        let fill: Vec<u8> = pattern.iter().copied().cycle().take(PROBE_FILL).collect();
        drop(black_box(fill));
    }
    if op == "write" {
        return String::new();
    }
    let kept = KEPT.lock().unwrap().clone();
    let mut needle = probe_pattern(marker);
    needle.extend_from_within(..);
    format!("static={kept};leaked={}", linear_memory_contains(&needle))
}

/// Whether `needle` occurs anywhere in this instance's linear memory (outside `needle`).
fn linear_memory_contains(needle: &[u8]) -> bool {
    #[cfg(target_arch = "wasm32")]
    {
        let size = core::arch::wasm32::memory_size(0) * 65536;
        let own = needle.as_ptr() as usize;
        // Address 0 is never read (a null pointer); the rest of memory is the guest's own.
        let mut addr = 8usize;
        while addr + needle.len() <= size {
            if addr != own {
                // SAFETY: in bounds of linear memory (checked above); wasm has no unmapped pages below its size.
                let window = unsafe { core::slice::from_raw_parts(addr as *const u8, needle.len()) };
                if window == needle {
                    return true;
                }
            }
            addr += 1;
        }
        false
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        let _ = needle;
        false
    }
}

mod script;

export!(Hostile);
