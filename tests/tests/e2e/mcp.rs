//! The `mcp` plugin against real MCP servers built with the official Python SDK
//! (`tests/peers/mcp_server.py`, PyPI `mcp` 2.3.0) over streamable HTTP: the current
//! revision (2026-07-28: `server/discover`, no session) and an earlier one (the
//! `initialize` handshake with `Mcp-Session-Id`). Each: resolve, call (with progress
//! events), a tool error, and a slow tool past its deadline. Also the operator's MCP
//! servers as tools: a stdio one as a subagent of its own, and only the servers a plugin is
//! granted reaching its subagents, whatever its definitions name.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::common::{Deployment, Peer, bin, bundled_plugin, json};

struct Mcp {
    deployment: Deployment,
    _peer: Peer,
}

impl Mcp {
    /// A peer started with `peer_args` and a deployment with the `mcp` plugin and three
    /// references to it: the default agent tool, `fail` and `slow` (3 s call limit).
    fn start(peer_args: &[&str]) -> Mcp {
        let peer = Peer::start("mcp_server.py", peer_args);
        let url = format!("{}/mcp", peer.url());
        let deployment = Deployment::new(&format!(
            "  limits: {{ timeout: 3s }}\n  grants:\n    mcp: {{ http: [\"http://127.0.0.1:*\"], events: true, log: true }}\n\
             subagents:\n  references:\n\
             \x20   - {{ uri: \"{url}\", kind: MCP, metadata: {{}} }}\n\
             \x20   - {{ uri: \"{url}\", kind: MCP, metadata: {{ tool: fail, description: Fails on purpose }} }}\n\
             \x20   - {{ uri: \"{url}\", kind: MCP, metadata: {{ tool: slow, name: sluggish }} }}\n"
        ));
        std::fs::copy(bundled_plugin("mcp"), deployment.dir.path().join("plugins/mcp.wasm")).unwrap();
        Mcp { deployment, _peer: peer }
    }

    fn warden(&self, args: &[&str]) -> Output {
        Command::new(bin())
            .current_dir(self.deployment.dir.path())
            .arg("--config")
            .arg(self.deployment.dir.path().join("warden.yaml"))
            .args(args)
            .output()
            .unwrap()
    }

    fn check(&self, revision: &str, progress: bool) {
        // Resolve: name and description from the server and tool, or the metadata.
        let out = self.warden(&["agents", "--json"]);
        let agents = json(&out);
        let find = |name: &str| {
            agents["agents"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["name"] == name)
                .unwrap_or_else(|| panic!("no agent {name}: {agents}"))
                .clone()
        };
        let agent = find("test-agents");
        assert_eq!(agent["kind"], "MCP");
        assert_eq!(agent["description"], "Answers a question like an agent would.");
        let data: serde_json::Value = serde_json::from_str(agent["protocol_data"].as_str().unwrap()).unwrap();
        assert_eq!(data["tool"], "agent");
        assert_eq!(data["argument"], "prompt");
        assert_eq!(data["protocol_version"], revision, "negotiated revision");
        assert_eq!(find("fail")["description"], "Fails on purpose");
        assert_eq!(find("sluggish")["description"], "Reports progress, then takes its time.");

        // Call: the tool's text is the result; progress notifications become status events.
        let out = self.warden(&["run", "test-agents", "what is \"up\"?"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "stdout: {}\nstderr: {stderr}", String::from_utf8_lossy(&out.stdout));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "agent answered: what is \"up\"?");
        if progress {
            assert!(stderr.contains("thinking") && stderr.contains("writing"), "progress events missing: {stderr}");
        }

        // A tool error (`isError`) fails the task with the tool's text.
        let out = self.warden(&["run", "fail", "x", "--json"]);
        let v = json(&out);
        assert_eq!(v["status"], "failed", "{v}");
        assert!(v["error"].as_str().unwrap().contains("the tool refused: x"), "{v}");
        assert_eq!(out.status.code(), Some(1));

        // A slow tool fails at the call's deadline (3 s), not when the tool finishes (30 s).
        let started = Instant::now();
        let out = self.warden(&["run", "sluggish", "x", "--json"]);
        let elapsed = started.elapsed();
        let v = json(&out);
        assert_eq!(v["status"], "failed", "{v}");
        let error = v["error"].as_str().unwrap().to_lowercase();
        assert!(error.contains("timed out") || error.contains("timeout"), "{v}");
        assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    }
}

#[test]
fn mcp_current_revision_2026_07_28() {
    Mcp::start(&[]).check("2026-07-28", true);
}

#[test]
fn mcp_earlier_revision_with_session() {
    Mcp::start(&["--legacy"]).check("2025-11-25", true);
}

#[test]
fn mcp_earlier_revision_stateless_json_responses() {
    // application/json replies carry no progress notifications.
    Mcp::start(&["--legacy", "--stateless", "--json-response"]).check("2025-11-25", false);
}

#[test]
fn mcp_unreachable_or_denied_server_is_reported_not_fatal() {
    // No grant for the port: the reference is reported, the host carries on.
    let d = Deployment::new(
        "  grants:\n    mcp: { http: [\"http://example.com\"] }\nsubagents:\n  references:\n    - { uri: \"http://127.0.0.1:9/mcp\", kind: MCP, metadata: {} }\n",
    );
    std::fs::copy(bundled_plugin("mcp"), d.dir.path().join("plugins/mcp.wasm")).unwrap();
    let out = d.warden(&["agents", "--json"]);
    let v = json(&out);
    assert_eq!(v["agents"].as_array().unwrap().len(), 0, "{v}");
    let problems = v["problems"].to_string();
    assert!(problems.contains("denied") || problems.contains("allow"), "{problems}");
}

/// Issue 22: an operator's stdio server as a subagent of the MCP kind
/// (`uri: mcp-stdio:<name>`): the official `mcp-server-time` runs in the task's sandbox
/// session and its tool is called through the gate (denied until a rule allows it).
#[test]
fn a_stdio_reference_server_is_itself_a_subagent() {
    let scope = format!("e2e{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let config = |allow: &str| {
        format!(
            "  grants:\n    mcp: {{ events: true, log: true, tools: true, mcp_servers: [time] }}\n\
             subagents:\n  references:\n\
             \x20   - {{ uri: \"mcp-stdio:time\", kind: MCP, metadata: {{ tool: get_current_time, name: clock }} }}\n\
             mcp_servers:\n  time: {{ command: mcp-server-time }}\n\
             sandbox:\n  scope: {scope}\n\
             approval:\n  default: deny\n  allow: [{allow}]\n"
        )
    };
    let d = Deployment::new(&config("\"mcp__time__*\""));
    std::fs::copy(bundled_plugin("mcp"), d.dir.path().join("plugins/mcp.wasm")).unwrap();
    let agents = json(&d.warden(&["agents", "--json"]));
    let clock = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "clock")
        .unwrap_or_else(|| panic!("{agents}"));
    assert!(clock["description"].as_str().unwrap().contains("stdio server time"), "{clock}");
    let out = d.warden(&["run", "clock", "Europe/Paris", "--json"]);
    let v = json(&out);
    assert_eq!(v["status"], "completed", "{v} {}", String::from_utf8_lossy(&out.stderr));
    let text = v["output"].as_str().unwrap();
    assert!(text.contains("Europe/Paris") && text.contains("datetime"), "{text}");
    // Without an allow rule the gate decides: no call reaches the server.
    std::fs::write(
        d.dir.path().join("warden.yaml"),
        format!("plugins:\n  dir: ./plugins\n  cache_dir: ./cache\n{}", config("Read")),
    )
    .unwrap();
    let v = json(&d.warden(&["run", "clock", "UTC", "--json"]));
    assert_ne!(v["status"], "completed", "{v}");
    assert!(v.to_string().contains("not run") || v.to_string().contains("denied"), "{v}");
}

/// Supply-chain review finding 1: the operator's MCP servers a subagent reached were
/// whatever its plugin's definition named, so any plugin granted `tools` reached every
/// configured server (and with an operator rule such as `allow: [mcp__github__*]`, written
/// for another plugin's agents, called it unasked). The hostile test plugin's definition
/// names two servers (its own choice: metadata `mcp_servers`); the operator granted it one.
/// The other is a problem naming the plugin, the server and the key that grants it, and it
/// is neither offered nor called, though an allow rule names its tool.
#[test]
fn regression_a_plugin_reached_every_mcp_server_its_definition_named() {
    let (calc, github) = (Peer::start("mcp_server.py", &[]), Peer::start("mcp_server.py", &[]));
    let d = Deployment::new(&format!(
        "  grants:\n    hostile: {{ tools: true, mcp_servers: [calc] }}\n\
         subagents:\n  references:\n\
         \x20   - {{ uri: \"h://picker\", kind: HOSTILE, metadata: {{ mcp_servers: \"calc, github\" }} }}\n\
         mcp_servers:\n  calc: {{ url: \"{}/mcp\" }}\n  github: {{ url: \"{}/mcp\" }}\n\
         approval:\n  default: deny\n  allow: [\"mcp__calc__add\", \"mcp__github__add\"]\n",
        calc.url(),
        github.url()
    ));
    d.add("hostile", "hostile");
    let agents = json(&d.warden(&["agents", "--json"]));
    let picker = agents["agents"].as_array().unwrap().iter().find(|a| a["name"] == "picker").cloned();
    let picker = picker.unwrap_or_else(|| panic!("{agents}"));
    assert_eq!(picker["mcp_servers"], serde_json::json!(["calc"]), "{picker}");
    let problems: Vec<&str> = agents["problems"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["source"] == "h://picker")
        .filter_map(|p| p["message"].as_str())
        .collect();
    assert_eq!(
        problems,
        ["subagent \"picker\": MCP server `github` denied: not granted to plugin `hostile` \
             (plugins.grants.hostile.mcp_servers); its tools are not offered"]
    );
    // Offered: the granted server's tools only.
    let listed = json(&d.warden(&["run", "picker", "tools", "--json"]));
    assert_eq!(listed["status"], "completed", "{listed}");
    let names = listed["output"].as_str().unwrap();
    assert!(names.lines().any(|n| n == "mcp__calc__add"), "{names}");
    assert!(!names.contains("mcp__github__"), "{names}");
    // Called past the listing: the allow rule passes the gate, the grant does not.
    let call = |tool: &str| {
        let script = serde_json::json!([{ "op": "tools_call", "name": tool, "arguments": r#"{"a": 20, "b": 22}"# }]);
        let out = json(&d.warden(&["run", "picker", &format!("script:{script}"), "--json"]));
        assert_eq!(out["status"], "completed", "{out}");
        let results: Vec<String> = serde_json::from_str(out["output"].as_str().unwrap()).unwrap();
        let detail = results[0].strip_prefix("ok:").unwrap_or_else(|| panic!("{results:?}"));
        serde_json::from_str::<serde_json::Value>(detail).unwrap()[0].clone()
    };
    let granted = call("mcp__calc__add");
    assert_eq!(granted["is_error"], false, "{granted}");
    assert!(granted["content"].as_str().unwrap().contains("42"), "{granted}");
    let refused = call("mcp__github__add");
    let content = refused["content"].as_str().unwrap();
    assert_eq!(refused["is_error"], true, "{refused}");
    assert!(!content.contains("42"), "the ungranted server ran the call: {content}");
    assert!(content.contains("not granted to plugin `hostile` (plugins.grants.hostile.mcp_servers)"), "{content}");
}
