//! The CLI commands of issue 2: plugins, plugin inspect, agents, run, config check.

use crate::common::*;

#[test]
fn plugins_json_shows_every_field_and_invalid_files() {
    let d = Deployment::new(GRANTS);
    d.add("echo", "echo");
    d.add("hostile", "hostile");
    std::fs::write(d.dir.path().join("plugins/broken.wasm"), b"garbage").unwrap();
    let o = d.warden(&["plugins", "--json"]);
    assert!(o.status.success(), "{o:?}");
    let rows = json(&o);
    let rows = rows.as_array().unwrap();
    let echo = rows.iter().find(|r| r["id"] == "echo").unwrap();
    assert_eq!(echo["name"], "echo");
    assert_eq!(echo["version"], "0.1.0");
    assert_eq!(echo["kinds"], serde_json::json!(["ECHO"]));
    assert_eq!(echo["granted_capabilities"], serde_json::json!(["log", "events", "state"]));
    assert_eq!(echo["state"], "loaded");
    let hostile = rows.iter().find(|r| r["id"] == "hostile").unwrap();
    assert_eq!(hostile["granted_capabilities"], serde_json::json!([]), "nothing granted = nothing allowed");
    // Each row names the WIT version its component is built against (echo is frozen 0.1.0).
    assert_eq!((echo["wit_version"].as_str(), hostile["wit_version"].as_str()), (Some("0.1.0"), Some("0.2.0")));
    let broken = rows.iter().find(|r| r["id"] == "broken").unwrap();
    assert_eq!(broken["state"], "invalid");
    assert!(broken.get("wit_version").is_none(), "{broken}");
    // Provenance: a file without a signature loads (not required here) and says so.
    assert_eq!(echo["signature"], serde_json::json!({ "state": "unsigned" }));
    assert!(broken.get("signature").is_none(), "{broken}");
    let o = d.warden(&["plugins"]);
    assert!(stdout(&o).lines().any(|l| l.starts_with("echo ") && l.contains("] unsigned")), "{o:?}");
    assert!(broken["error"].as_str().unwrap().contains("not a valid WebAssembly component"));
}

#[test]
fn replacing_a_file_switches_the_version() {
    let d = Deployment::new(GRANTS);
    d.add("echo", "echo");
    assert_eq!(json(&d.warden(&["plugins", "--json"]))[0]["version"], "0.1.0");
    d.add("echo-v2", "echo");
    assert_eq!(json(&d.warden(&["plugins", "--json"]))[0]["version"], "0.2.0");
}

#[test]
fn run_echo_prints_the_result_and_json() {
    let d = Deployment::new(GRANTS);
    d.add("echo", "echo");
    let o = d.warden(&["run", "greeter", "hello from the CLI"]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(stdout(&o).trim(), "hello from the CLI");
    let o = d.warden(&["run", "greeter", "as json", "--json"]);
    let v = json(&o);
    assert_eq!(v["status"], "completed");
    assert_eq!(v["output"], "as json");
    assert!(v["task_id"].as_str().unwrap().starts_with("task_"));
}

#[test]
fn regression_output_to_a_closed_pipe_panicked() {
    // `warden tool-schema | head -c0`: the reader is gone before the first line.
    let d = Deployment::new(GRANTS);
    d.add("echo", "echo");
    for args in [&["tool-schema"][..], &["run", "greeter", "to nobody"], &["agents", "--json"]] {
        let mut child = std::process::Command::new(bin())
            .current_dir(d.dir.path())
            .arg("--config")
            .arg(d.dir.path().join("warden.yaml"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked") && !stderr.contains("error"), "{args:?}: {stderr}");
    }
}

#[test]
fn regression_a_text_only_run_connected_to_docker_and_swept_the_scope() {
    // A Docker endpoint nobody listens on: any contact would fail and warn.
    let d = Deployment::new(&format!("{GRANTS}sandbox:\n  docker_host: unix:///nonexistent/warden-test.sock\n"));
    d.add("echo", "echo");
    let o = d.warden(&["run", "greeter", "text only"]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(stdout(&o).trim(), "text only");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!stderr.contains("sandbox") && !stderr.contains("docker"), "{stderr}");
}

#[test]
fn run_failures_use_the_documented_exit_codes() {
    let d = Deployment::new(
        "  limits: { timeout: 1s }\nsubagents:\n  references:\n    - { uri: \"h://bad\", kind: HOSTILE }\n",
    );
    d.add("hostile", "hostile");
    let o = d.warden(&["run", "bad", "panic", "--json"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let v = json(&o);
    assert_eq!(v["status"], "failed");
    assert!(v["error"].as_str().unwrap().contains("panicked"), "{v}");

    let o = d.warden(&["run", "nobody", "hi"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("unknown subagent_type \"nobody\"") && err.contains("bad"), "{err}");
}

#[test]
fn agents_json_lists_definitions_and_problems() {
    let d = Deployment::new(&format!("{GRANTS}    - {{ uri: \"a2a://x\", kind: A2A }}\n"));
    d.add("echo", "echo");
    let v = json(&d.warden(&["agents", "--json"]));
    assert_eq!(v["agents"][0]["name"], "greeter");
    assert_eq!(v["agents"][0]["description"], "Greets people");
    assert_eq!(v["agents"][0]["kind"], "ECHO");
    assert_eq!(v["agents"][0]["plugin"], "echo");
    assert!(v["problems"].as_array().unwrap().iter().any(|p| p["message"].as_str().unwrap().contains("kind A2A")));
}

#[test]
fn plugin_inspect_shows_world_and_capabilities() {
    let d = Deployment::new("");
    let o = d.warden(&["plugin", "inspect", test_plugin("hostile").to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{o:?}");
    let v = json(&o);
    assert_eq!(v["valid"], true);
    assert_eq!(v["wit_versions"], serde_json::json!(["0.2.0"]));
    assert_eq!(v["wit_version"], "0.2.0");
    assert_eq!(v["supported_wit"], serde_json::json!(["0.1.0", "0.2.0", "0.3.0"]));
    assert!(v["exports"].as_array().unwrap().iter().any(|e| e == "warden:plugin/executor@0.2.0"));
    assert!(v["imports"].as_array().unwrap().iter().any(|e| e == "warden:plugin/http@0.2.0"));
    assert_eq!(v["info"]["capabilities"].as_array().unwrap().len(), 7);
    // The bundled plugins are built against the current 0.3.0.
    let current = json(&d.warden(&["plugin", "inspect", bundled_plugin("claude").to_str().unwrap(), "--json"]));
    assert_eq!(current["wit_version"], "0.3.0", "{current}");
    // A plugin built against the frozen 0.1.0 is served as 0.1.0; the text form says the range.
    let old = json(&d.warden(&["plugin", "inspect", test_plugin("echo").to_str().unwrap(), "--json"]));
    assert_eq!(
        (&old["wit_versions"], &old["wit_version"]),
        (&serde_json::json!(["0.1.0"]), &serde_json::json!("0.1.0"))
    );
    let text = stdout(&d.warden(&["plugin", "inspect", test_plugin("echo").to_str().unwrap()]));
    assert!(text.contains("wit:      0.1.0 (this warden supports 0.1.0–0.3.0)"), "{text}");
    // Inspecting writes nothing: no compile cache next to the config (regression: 35 MB).
    assert!(!d.dir.path().join("cache").exists() && !d.dir.path().join(".warden").exists());

    let junk = d.dir.path().join("junk.wasm");
    std::fs::write(&junk, b"junk").unwrap();
    let o = d.warden(&["plugin", "inspect", junk.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stdout(&o).contains("valid:    no"));

    // A file over plugins.max_plugin_size is refused before it is read.
    let d = Deployment::new("  max_plugin_size: 1000\n");
    let o = d.warden(&["plugin", "inspect", test_plugin("hostile").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("plugins.max_plugin_size"), "{o:?}");
}

#[test]
fn config_check_names_file_key_and_expectation() {
    let d = Deployment::new("  limits: { timeout: soon }\n");
    let o = d.warden(&["config", "check"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("warden.yaml: plugins.limits.timeout") && err.contains("expected like 30s"), "{err}");
    let ok = Deployment::new("");
    assert!(ok.warden(&["config", "check"]).status.success());
}

#[test]
fn config_check_fails_on_an_ambiguous_kind_and_a_missing_agent_dir() {
    // Two plugins claim ECHO and plugins.priority names neither: nobody serves it.
    let d = Deployment::new(GRANTS);
    d.add("echo", "echo");
    d.add("echo-v2", "aaa-helper");
    let o = d.warden(&["config", "check"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("kind ECHO") && err.contains("plugins.priority"), "{err}");
    let listed = stdout(&d.warden(&["plugins"]));
    assert!(listed.contains("served by none"), "{listed}");
    let d = Deployment::new(&format!("  priority: [echo]\n{GRANTS}"));
    d.add("echo", "echo");
    d.add("echo-v2", "aaa-helper");
    assert!(d.warden(&["config", "check"]).status.success());
    let d = Deployment::new("subagents:\n  agent_dirs: [./no-such-dir]\n");
    let o = d.warden(&["config", "check"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("does not exist"), "{o:?}");
}

#[test]
fn plugin_provided_strings_reach_the_terminal_escaped() {
    let d = Deployment::new(GRANTS);
    d.add("echo", "echo");
    d.add("echo", "evil\u{1b}]0;owned\u{7}");
    let o = d.warden(&["plugins"]);
    let out = stdout(&o);
    assert!(!out.contains('\u{1b}') && !out.contains('\u{7}'), "{out:?}");
    assert!(out.contains("evil\\u{1b}]0;owned\\u{7}"), "{out:?}");
    // A task's output keeps its lines but loses its escape sequences.
    let d = Deployment::new(GRANTS);
    d.add("echo", "echo");
    let o = d.warden(&["run", "greeter", "line one\n\u{1b}[2Jline two"]);
    assert_eq!(stdout(&o), "line one\n\\u{1b}[2Jline two\n");
}

#[test]
fn the_demo_runs_end_to_end_offline() {
    // No terminal: the demo (and only the demo) auto-approves, and says so.
    let plugins = bundled_plugin("claude").parent().unwrap().to_owned();
    let o = std::process::Command::new(bin())
        .args(["demo", "--plugins"])
        .arg(&plugins)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let out = stdout(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("final answer: I wrote RELEASE_NOTES.md"), "{out}");
    assert!(err.contains("→ Bash") && err.contains("← Write: File created successfully"), "{err}");
    assert!(err.contains("auto-approving"), "{err}");
    assert!(out.contains("Bash   approve  by user:demo-auto") && out.contains("Read   allow    by policy"), "{out}");
}

#[test]
fn plugin_test_runs_one_task_with_flag_grants_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let test = |args: &[&str]| {
        std::process::Command::new(bin()).current_dir(dir.path()).args(["plugin", "test"]).args(args).output().unwrap()
    };
    let echo = test_plugin("echo");
    let echo = echo.to_str().unwrap();
    let o = test(&[echo, "--ref", "echo://greeter", "--prompt", "hello plugin"]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(stdout(&o).trim(), "hello plugin");
    // Nothing is granted by default; a flag grants exactly one capability.
    let o = test(&[echo, "--ref", "echo://greeter", "--prompt", "state:v1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("capability `state` denied"), "{o:?}");
    let o = test(&[echo, "--ref", "echo://greeter", "--prompt", "state:v1", "--grant", "state,events", "--json"]);
    let v = json(&o);
    assert_eq!((v["status"].as_str(), v["output"].as_str()), (Some("completed"), Some("v1")), "{v}");
    assert_eq!(v["definition"]["name"], "greeter");
    // Events read as in a task's stream: `type`, fields, the subagent and `source: plugin`.
    assert_eq!(
        (v["events"][0]["type"].as_str(), v["events"][0]["source"].as_str()),
        (Some("progress"), Some("plugin"))
    );
    // A model call is answered by the scripted model.
    std::fs::write(dir.path().join("script.yaml"), "- text: \"from the script\"\n").unwrap();
    let hostile = test_plugin("hostile");
    let o = test(&[
        hostile.to_str().unwrap(),
        "--ref",
        "test://x",
        "--prompt",
        "model",
        "--grant",
        "model",
        "--model-script",
        "script.yaml",
    ]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(stdout(&o).trim(), "from the script");
    let o = test(&[echo, "--ref", "echo://greeter", "--prompt", "x", "--grant", "everything"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("expected one of log, events"), "{o:?}");
    // No config, cache, store or anything else was written.
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("script.yaml")]);
}

#[test]
fn plugin_keygen_sign_verify_and_a_tampered_file_is_refused() {
    let d = Deployment::new("");
    let wasm = d.dir.path().join("echo.wasm");
    std::fs::copy(test_plugin("echo"), &wasm).unwrap();
    let o = d.warden(&["plugin", "keygen", "--out", d.dir.path().join("release").to_str().unwrap()]);
    assert!(o.status.success(), "{o:?}");
    let public = stdout(&o).trim().to_owned();
    assert_eq!(public.len(), 64, "{public}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(d.dir.path().join("release.key")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let o = d.warden(&[
        "plugin",
        "sign",
        wasm.to_str().unwrap(),
        "--key",
        d.dir.path().join("release.key").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{o:?}");
    assert!(d.dir.path().join("echo.wasm.sig").is_file());
    let o = d.warden(&["plugin", "verify", wasm.to_str().unwrap(), "--trust", &public]);
    assert!(o.status.success(), "{o:?}");
    assert!(stdout(&o).contains(&public));
    // Without the key in the trust list, or with one byte changed, verification fails.
    let o = d.warden(&["plugin", "verify", wasm.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not in plugins.trust"), "{o:?}");
    let mut bytes = std::fs::read(&wasm).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&wasm, bytes).unwrap();
    let o = d.warden(&["plugin", "verify", wasm.to_str().unwrap(), "--trust", &public]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("does not match"), "{o:?}");
    // A malformed trust entry is a config error naming the key.
    let bad = Deployment::new("  trust: [nothex]\n");
    let o = bad.warden(&["config", "check"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("plugins.trust[0]"), "{o:?}");
    let bad = Deployment::new(&format!("  trust: [{{ key: {public}, ids: [\"../x\"] }}]\n"));
    let o = bad.warden(&["config", "check"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("plugins.trust[0].ids[0]"), "{o:?}");
}

/// A signature covered the file's bytes only: `github.wasm` beside a copy of another
/// plugin's signed file and `.sig` verified (and loaded, with github's grants).
#[test]
fn regression_a_signature_verifies_only_for_the_plugin_id_and_version_it_names() {
    let d = Deployment::new("");
    let dir = d.dir.path();
    std::fs::copy(test_plugin("echo"), dir.join("weather.wasm")).unwrap();
    let o = d.warden(&["plugin", "keygen", "--out", dir.join("vendor").to_str().unwrap()]);
    assert!(o.status.success(), "{o:?}");
    let public = stdout(&o).trim().to_owned();
    let key = dir.join("vendor.key");
    let o = d.warden(&["plugin", "sign", dir.join("weather.wasm").to_str().unwrap(), "--key", key.to_str().unwrap()]);
    assert!(o.status.success(), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("signed: plugin weather version 0.1.0"), "{o:?}");
    let verify =
        |file: &str, trust: &str| d.warden(&["plugin", "verify", dir.join(file).to_str().unwrap(), "--trust", trust]);
    let o = verify("weather.wasm", &public);
    assert!(o.status.success(), "{o:?}");
    assert!(stdout(&o).contains(&format!("ok: plugin weather version 0.1.0, signed by {public}")), "{o:?}");
    // The same file and signature under another id are refused, saying which id they are for.
    std::fs::copy(dir.join("weather.wasm"), dir.join("github.wasm")).unwrap();
    std::fs::copy(dir.join("weather.wasm.sig"), dir.join("github.wasm.sig")).unwrap();
    let o = verify("github.wasm", &public);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("signed for plugin id weather, not github"), "{o:?}");
    // Signed for github on purpose (`--id`), it verifies as github.
    let o = d.warden(&[
        "plugin",
        "sign",
        dir.join("github.wasm").to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
        "--id",
        "github",
    ]);
    assert!(o.status.success(), "{o:?}");
    assert!(verify("github.wasm", &public).status.success());
    // Another component (version 0.2.0) under a signature for 0.1.0's content is refused.
    std::fs::copy(test_plugin("echo-v2"), dir.join("github.wasm")).unwrap();
    let o = verify("github.wasm", &public);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("does not match the file"), "{o:?}");
}

/// `warden` in `cwd`, finding the test virtualenv's componentize-py on `PATH` and building
/// Rust guests in the shared wasm target dir (the standard library is built once there).
fn warden_in(cwd: &std::path::Path, args: &[&str]) -> std::process::Output {
    let venv_bin = python().parent().unwrap().to_owned();
    let path = std::env::join_paths(
        std::iter::once(venv_bin).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .unwrap();
    std::process::Command::new(bin())
        .current_dir(cwd)
        .env("PATH", path)
        .env("CARGO_TARGET_DIR", repo().join("target/wasm-build"))
        .env("CARGO_NET_OFFLINE", "true")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn plugin_new_makes_projects_that_build_and_answer_a_task() {
    let dir = tempfile::tempdir().unwrap();
    // Python: scaffold, `warden plugin build` in the project (componentize-py from PATH,
    // output target/NAME.wasm), then one task through `warden plugin test`.
    let o = warden_in(dir.path(), &["plugin", "new", "json-rpc", "--kind", "JSONRPC", "--lang", "python"]);
    assert!(o.status.success(), "{o:?}");
    let py = dir.path().join("json-rpc");
    for f in ["app.py", "requirements.txt", "warden.yaml", "README.md", "wit/world.wit", "warden_guest/__init__.py"] {
        assert!(py.join(f).is_file(), "{f} missing");
    }
    let app = std::fs::read_to_string(py.join("app.py")).unwrap();
    assert!(app.contains("NAME = \"json-rpc\"") && app.contains("KIND = \"JSONRPC\""), "{app}");
    let readme = std::fs::read_to_string(py.join("README.md")).unwrap();
    assert!(readme.contains("warden plugin build") && readme.contains("target/json-rpc.wasm"), "{readme}");
    let o = warden_in(&py, &["plugin", "build"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(stdout(&o).trim(), "target/json-rpc.wasm", "the path is the only line on stdout");
    assert!(String::from_utf8_lossy(&o.stderr).contains("built json-rpc 0.1.0: kinds JSONRPC"), "{o:?}");
    let o = warden_in(
        &py,
        &["plugin", "test", "target/json-rpc.wasm", "--ref", "jsonrpc://example", "--prompt", "hello python"],
    );
    assert!(o.status.success(), "{o:?}");
    assert_eq!(stdout(&o).trim(), "HELLO PYTHON");
    // Rust: scaffold, `warden plugin build DIR` from outside it, one task.
    let o = warden_in(dir.path(), &["plugin", "new", "my-proto", "--kind", "MYPROTO"]);
    assert!(o.status.success(), "{o:?}");
    let rs = dir.path().join("my-proto");
    let lib = std::fs::read_to_string(rs.join("src/lib.rs")).unwrap();
    assert!(lib.contains("\"my-proto\"") && lib.contains("\"MYPROTO\"") && !lib.contains("TEMPLATE"), "{lib}");
    // The SDK and its WIT are vendored: nothing points back into a warden checkout.
    assert!(rs.join("warden-guest/wit/world.wit").is_file() && rs.join("warden-guest/src/lib.rs").is_file());
    let manifest = std::fs::read_to_string(rs.join("Cargo.toml")).unwrap();
    assert!(manifest.contains("path = \"warden-guest\"") && !manifest.contains("../"), "{manifest}");
    let o = warden_in(dir.path(), &["plugin", "build", "my-proto"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(stdout(&o).trim(), "my-proto/target/my-proto.wasm");
    assert!(String::from_utf8_lossy(&o.stderr).contains("built my-proto 0.1.0: kinds MYPROTO"), "{o:?}");
    let o = warden_in(
        &rs,
        &[
            "plugin",
            "test",
            "target/my-proto.wasm",
            "--ref",
            "myproto://example",
            "--grant",
            "log",
            "--prompt",
            "hello rust",
        ],
    );
    assert!(o.status.success(), "{o:?}");
    assert_eq!(stdout(&o).trim(), "HELLO RUST");
    // Never over an existing directory; bad names are refused with the rule.
    let o = warden_in(dir.path(), &["plugin", "new", "my-proto", "--kind", "MYPROTO"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("already exists"), "{o:?}");
    let o = warden_in(dir.path(), &["plugin", "new", "Bad_Name", "--kind", "X"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("lower-case"), "{o:?}");
}

#[test]
fn plugin_build_says_what_it_expected_to_find() {
    let dir = tempfile::tempdir().unwrap();
    let stderr = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).into_owned();
    // An empty directory: neither kind of project.
    let o = warden_in(dir.path(), &["plugin", "build"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(stderr(&o).contains("no Cargo.toml (a Rust plugin) or app.py (a Python plugin)"), "{o:?}");
    assert!(stdout(&o).is_empty(), "{o:?}");
    // A Cargo.toml cargo cannot read: cargo's own diagnostics, then which build failed.
    let broken = dir.path().join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("Cargo.toml"), "[package]\nname = \"broken\"\nversion = \n").unwrap();
    let o = warden_in(dir.path(), &["plugin", "build", "broken"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = stderr(&o);
    assert!(
        err.contains(&format!("building the Rust plugin in {}", broken.display())) && err.contains("failed"),
        "{err}"
    );
    assert!(!broken.join("target/broken.wasm").exists());
    // A Cargo.toml without a package: named, before any toolchain runs.
    std::fs::write(broken.join("Cargo.toml"), "[workspace]\n").unwrap();
    let o = warden_in(&broken, &["plugin", "build"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(stderr(&o).contains("Cargo.toml: no `name"), "{o:?}");
    // A missing directory.
    let o = warden_in(dir.path(), &["plugin", "build", "nowhere"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(stderr(&o).contains("nowhere: not a directory"), "{o:?}");
}
