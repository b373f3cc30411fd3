//! Issue 14: a plugin author's whole path, from an empty directory with no warden
//! checkout: `warden plugin new` (Rust and Python, the SDK vendored), a JSON-RPC protocol
//! written against the SDK, `warden plugin build`, `warden plugin test` against a local
//! JSON-RPC server, `keygen`/`sign`, `push` to a real OCI registry, `pull` into the watched
//! plugin directory of a running `warden serve` that requires signatures, and a task
//! through each over HTTP.

use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{Deployment, Server, bin, json_of, python, read_request_body, repo, stdout};
use crate::oci::Registry;

/// A JSON-RPC 2.0 server on 127.0.0.1 answering `ask` with `{"text": "rpc:" + prompt}`
/// (any other method: error -32601); returns its port.
fn jsonrpc_server() -> u16 {
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in server.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let body = read_request_body(&mut reader).unwrap_or_default();
                let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let answer = match req["method"].as_str() {
                    Some("ask") => {
                        json!({ "jsonrpc": "2.0", "id": req["id"], "result": { "text": format!("rpc:{}", req["params"]["prompt"].as_str().unwrap_or("")) } })
                    }
                    _ => {
                        json!({ "jsonrpc": "2.0", "id": req["id"], "error": { "code": -32601, "message": "method not found" } })
                    }
                };
                let text = answer.to_string();
                let mut stream = stream;
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                    text.len()
                );
            });
        }
    });
    port
}

/// The Rust protocol, written against the vendored SDK: `metadata.url` is the endpoint.
const RUST_PLUGIN: &str = r#"//! JSON-RPC subagents: `ask(prompt)` at the reference's `metadata.url`.
use serde_json::{Value, json};
use warden_guest::http::{Request, send_json};
use warden_guest::{Capability, Error, Metadata, Plugin, PluginInfo, SubagentDefinition, SubagentReference, TaskCall, TaskContext};

struct JsonRpc;

impl Plugin for JsonRpc {
    fn info() -> PluginInfo {
        PluginInfo { name: "rpc-rs".into(), version: "0.1.0".into(), kinds: vec!["JSONRPC-RS".into()], capabilities: vec![Capability::Http] }
    }
    fn can_resolve(reference: SubagentReference) -> bool {
        reference.kind == "JSONRPC-RS"
    }
    fn resolve(reference: SubagentReference) -> Result<SubagentDefinition, Error> {
        let meta = Metadata::new(&reference.metadata);
        let url = meta.require("url")?.to_owned();
        let name = meta.get("name").unwrap_or("rpc").to_string();
        Ok(warden_guest::definition(name, "Asks a JSON-RPC server".into(), reference, json!({ "url": url }).to_string()))
    }
    fn execute(_ctx: TaskContext, call: TaskCall, def: SubagentDefinition) -> Result<String, Error> {
        let data: Value = serde_json::from_str(&def.protocol_data)?;
        let url = data["url"].as_str().unwrap_or_default();
        let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "ask", "params": { "prompt": call.prompt } });
        let answer: Value = send_json(&Request::post_json(url, &body)?)?;
        match answer["result"]["text"].as_str() {
            Some(text) => Ok(text.to_owned()),
            None => Err(Error::Remote(format!("no result.text in {answer}"))),
        }
    }
}

warden_guest::export!(JsonRpc);
"#;

/// The same protocol in Python, against the vendored `warden_guest` package.
const PYTHON_PLUGIN: &str = r#"import json
import warden_guest as wg
from wit_world.imports import types

KIND = "JSONRPC-PY"


class JsonRpc(wg.Plugin):
    def info(self):
        return types.PluginInfo(name="rpc-py", version="0.1.0", kinds=[KIND], capabilities=[types.Capability.HTTP])

    def can_resolve(self, reference):
        return reference.kind == KIND

    def resolve(self, reference):
        meta = wg.Metadata.of(reference)
        url = meta.require("url")
        return wg.definition(meta.get("name") or "rpc", "Asks a JSON-RPC server", reference, json.dumps({"url": url}))

    def execute(self, ctx, call, definition):
        url = json.loads(definition.protocol_data)["url"]
        answer = wg.http.post_json(url, {"jsonrpc": "2.0", "id": 1, "method": "ask", "params": {"prompt": call.prompt}})
        text = (answer.get("result") or {}).get("text")
        if text is None:
            raise wg.Remote(f"no result.text in {answer}")
        return text


Meta, Resolver, Executor = wg.export(JsonRpc)
"#;

/// `warden ARGS` in `cwd` as an author runs it: no configuration, no registry
/// credentials; componentize-py (the pinned one the tests installed) and cargo on `PATH`.
/// Guest builds share one target directory so the test does not compile the SDK's
/// dependencies twice (a cache: the projects themselves live in the empty directory).
fn author(cwd: &Path, args: &[&str]) -> Output {
    let venv_bin = python().parent().unwrap().to_path_buf();
    let path = std::env::join_paths(
        std::iter::once(venv_bin).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .unwrap();
    Command::new(bin())
        .current_dir(cwd)
        .args(args)
        .env("PATH", path)
        .env("CARGO_TARGET_DIR", repo().join("target/wasm-build"))
        .env_remove("WARDEN_REGISTRY_USERNAME")
        .env_remove("WARDEN_REGISTRY_PASSWORD")
        .env_remove("WARDEN_REGISTRY_HOST")
        .output()
        .unwrap()
}

fn ok(o: Output, what: &str) -> String {
    assert!(o.status.success(), "{what}: {}\n{}", stdout(&o), String::from_utf8_lossy(&o.stderr));
    stdout(&o).trim().to_owned()
}

#[test]
fn from_an_empty_directory_to_a_task_over_http_in_rust_and_python() {
    let rpc = jsonrpc_server();
    let url = format!("http://127.0.0.1:{rpc}/rpc");
    let grant = format!("http://127.0.0.1:{rpc}");
    let home = tempfile::tempdir().unwrap();
    let registry = Registry::start();
    ok(author(home.path(), &["plugin", "keygen", "--out", "author"]), "keygen");
    let public = std::fs::read_to_string(home.path().join("author.pub")).unwrap().trim().to_owned();

    let mut pushed = Vec::new();
    for (name, kind, lang, file, source) in [
        ("rpc-rs", "JSONRPC-RS", "rust", "src/lib.rs", RUST_PLUGIN),
        ("rpc-py", "JSONRPC-PY", "python", "app.py", PYTHON_PLUGIN),
    ] {
        ok(author(home.path(), &["plugin", "new", name, "--kind", kind, "--lang", lang]), "plugin new");
        let project = home.path().join(name);
        std::fs::write(project.join(file), source).unwrap();
        if lang == "rust" {
            // The protocol uses serde_json as well (already in the vendored lock file).
            let manifest = std::fs::read_to_string(project.join("Cargo.toml")).unwrap();
            let manifest = manifest.replace("[dependencies]\n", "[dependencies]\nserde_json = \"1\"\n");
            std::fs::write(project.join("Cargo.toml"), manifest).unwrap();
        }
        let wasm = ok(author(&project, &["plugin", "build"]), "plugin build");
        assert_eq!(wasm, format!("target/{name}.wasm"));
        // One task, no deployment: the plugin speaks JSON-RPC to the local server.
        let meta = format!("url={url}");
        let task = ["plugin", "test", wasm.as_str(), "--ref", "jsonrpc://local", "--meta", &meta, "--prompt", "hello"];
        let granted: Vec<&str> = task.iter().copied().chain(["--http", grant.as_str()]).collect();
        let answer = ok(author(&project, &granted), "plugin test");
        assert_eq!(answer, "rpc:hello");
        // Without the HTTP grant the same task fails (the host enforces the grant).
        let o = author(&project, &task);
        let said = format!("{}{}", stdout(&o), String::from_utf8_lossy(&o.stderr));
        assert!(!o.status.success() && said.contains("denied") && said.contains("http"), "{said}");
        ok(author(&project, &["plugin", "sign", &wasm, "--key", "../author.key"]), "plugin sign");
        let target = registry.url(&format!("authors/{name}:0.1.0"));
        let o = author(&project, &["plugin", "push", &wasm, &target, "--insecure"]);
        assert!(String::from_utf8_lossy(&o.stderr).contains(&public), "{o:?}");
        ok(o, "plugin push");
        pushed.push(target);
    }

    // An operator's deployment that trusts only the author's key, with an empty plugin dir.
    let d = Deployment::new(&format!(
        "  require_signature: true\n  trust: [\"{public}\"]\n  grants:\n    rpc-rs: {{ http: [\"{grant}\"] }}\n    rpc-py: {{ http: [\"{grant}\"] }}\n\
         subagents:\n  agent_dirs: []\n  references:\n\
         \x20   - {{ uri: \"jsonrpc://rs\", kind: JSONRPC-RS, metadata: {{ name: rs-agent, url: \"{url}\" }} }}\n\
         \x20   - {{ uri: \"jsonrpc://py\", kind: JSONRPC-PY, metadata: {{ name: py-agent, url: \"{url}\" }} }}\n\
         store:\n  path: ./state/tasks.db\n"
    ));
    let server = Server::start(&d);
    for target in &pushed {
        let o = d.warden(&["plugin", "pull", target, "--insecure"]);
        assert!(String::from_utf8_lossy(&o.stderr).contains(&format!("signature verified: {public}")), "{o:?}");
        ok(o, "plugin pull");
    }
    let plugins: PathBuf = d.dir.path().join("plugins");
    assert!(plugins.join("rpc-rs.wasm").is_file() && plugins.join("rpc-py.wasm").is_file());
    // The running server loads both and runs a task through each.
    for (agent, prompt) in [("rs-agent", "from rust"), ("py-agent", "from python")] {
        let task = json!({ "description": "author kit", "prompt": prompt, "subagent_type": agent });
        let until = Instant::now() + Duration::from_secs(120);
        loop {
            let (status, r) = json_of(server.port, "POST", "/v1/tasks", Some(&task));
            if status == 200 && r["status"] == "completed" {
                assert_eq!(r["output"], format!("rpc:{prompt}"), "{r}");
                break;
            }
            assert!(Instant::now() < until, "no task through {agent}: {status} {r}");
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}
