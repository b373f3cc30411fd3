//! Integration tests of the host library against real components built by
//! `cargo xtask build` (test plugins in `target/test-plugins`). Grouped by area.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use warden::config::{Config, GrantConfig, Limits};
use warden::plugin::{GuestError, SubagentReference, TaskCall, TaskContext};
use warden::registry::Registry;
use warden::runtime::{CallError, LoadedPlugin, Origin, Runtime, RuntimeOptions};
use warden::services::HostServices;

/// Directory of the test components; `cargo xtask test` sets `WARDEN_TEST_PLUGINS`.
fn test_plugins() -> PathBuf {
    let dir = std::env::var_os("WARDEN_TEST_PLUGINS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-plugins"));
    assert!(
        dir.join("echo.wasm").is_file(),
        "test plugins missing in {} — run `cargo xtask test` (or `cargo xtask build`) first",
        dir.display()
    );
    dir
}

fn plugin_bytes(name: &str) -> Vec<u8> {
    let p = test_plugins().join(format!("{name}.wasm"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn runtime(cache: Option<PathBuf>) -> Runtime {
    Runtime::new(RuntimeOptions { cache_dir: cache, fuel: false }, Arc::new(HostServices::new(vec![]))).unwrap()
}

async fn load(rt: &Runtime, name: &str, limits: Limits, grant: Option<GrantConfig>) -> LoadedPlugin {
    rt.load(name, PathBuf::from(format!("{name}.wasm")), &plugin_bytes(name), limits, grant.as_ref())
        .await
        .unwrap_or_else(|e| panic!("loading {name}: {e}"))
}

fn reference(kind: &str, uri: &str) -> SubagentReference {
    SubagentReference { uri: uri.into(), kind: kind.into(), metadata: Default::default() }
}

fn ctx() -> TaskContext {
    TaskContext { task_id: "task_test".into(), session_id: "s".into(), user_id: "u".into() }
}

async fn execute(rt: &Runtime, p: &LoadedPlugin, prompt: &str) -> Result<String, CallError> {
    let def = rt.resolve(p, &reference(&p.info.kinds[0], "test://x")).await.expect("resolve");
    let call = TaskCall { description: "d".into(), prompt: prompt.into(), subagent_type: def.name.clone(), ..Default::default() };
    rt.execute(p, ctx(), &call, &def, None).await
}

fn all_grants(http: Vec<String>) -> GrantConfig {
    GrantConfig { log: true, http, model: true, tools: true, events: true, state: true, resources: true, ..Default::default() }
}

fn short(timeout_ms: u64) -> Limits {
    Limits { timeout: Duration::from_millis(timeout_ms), ..Limits::default() }
}

mod spi {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn echo_info_resolve_execute() {
        let rt = runtime(None);
        let p = load(&rt, "echo", Limits::default(), None).await;
        assert_eq!((p.info.name.as_str(), p.info.version.as_str()), ("echo", "0.1.0"));
        assert_eq!(p.info.kinds, vec!["ECHO".to_string()]);
        assert!(rt.can_resolve(&p, &reference("ECHO", "echo://a")).await.unwrap());
        assert!(!rt.can_resolve(&p, &reference("A2A", "echo://a")).await.unwrap());
        let def = rt.resolve(&p, &reference("ECHO", "echo://agents/greeter")).await.unwrap();
        assert_eq!(def.name, "greeter");
        assert_eq!(def.kind, "ECHO");
        assert_eq!(execute(&rt, &p, "hello wasm").await.unwrap(), "hello wasm");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_plugin_template_builds_and_runs() {
        let rt = runtime(None);
        let p = load(&rt, "rust-plugin", Limits::default(), None).await;
        assert_eq!(p.info.kinds, vec!["TEMPLATE".to_string()]);
        assert_eq!(execute(&rt, &p, "quiet please").await.unwrap(), "QUIET PLEASE");
        assert!(matches!(execute(&rt, &p, "").await, Err(CallError::Guest(GuestError::InvalidInput(_)))));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn state_denied_without_grant_and_works_with_it() {
        let rt = runtime(None);
        let denied = load(&rt, "echo", Limits::default(), None).await;
        match execute(&rt, &denied, "state:v1").await {
            Err(CallError::Guest(GuestError::Denied(m))) => assert!(m.contains("`state`"), "{m}"),
            other => panic!("expected a denial naming `state`, got {other:?}"),
        }
        let granted = load(&rt, "echo", Limits::default(), Some(GrantConfig { state: true, ..Default::default() })).await;
        assert_eq!(execute(&rt, &granted, "state:v1").await.unwrap(), "v1");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn events_reach_the_task_sink_only_when_granted() {
        let rt = runtime(None);
        let p = load(&rt, "echo", Limits::default(), Some(GrantConfig { events: true, ..Default::default() })).await;
        let def = rt.resolve(&p, &reference("ECHO", "e://x")).await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        let call = TaskCall { prompt: "hi".into(), ..Default::default() };
        rt.execute(&p, ctx(), &call, &def, Some(tx)).await.unwrap();
        let ev = rx.recv().await.expect("one event");
        assert_eq!((ev.plugin.as_str(), ev.kind.as_str()), ("echo", "status"));
        assert_eq!(ev.data["message"], "echoing");

        let ungranted = load(&rt, "echo", Limits::default(), None).await;
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        rt.execute(&ungranted, ctx(), &call, &def, Some(tx)).await.unwrap();
        assert!(rx.recv().await.is_none(), "an ungranted plugin must not emit events");
    }
}

mod hostile {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn infinite_loop_times_out_while_other_plugins_keep_working() {
        let rt = Arc::new(runtime(None));
        let hostile = Arc::new(load(&rt, "hostile", short(1000), None).await);
        let echo = Arc::new(load(&rt, "echo", Limits::default(), None).await);
        let started = Instant::now();
        let looping = {
            let (rt, h) = (rt.clone(), hostile.clone());
            tokio::spawn(async move { execute(&rt, &h, "loop").await })
        };
        // While the loop spins, the other plugin answers promptly, many times.
        let mut answered = 0;
        while !looping.is_finished() {
            assert_eq!(execute(&rt, &echo, "still here").await.unwrap(), "still here");
            answered += 1;
        }
        let r = looping.await.unwrap();
        let elapsed = started.elapsed();
        assert!(matches!(r, Err(CallError::Timeout { .. })), "{r:?}");
        assert!(elapsed < Duration::from_millis(1000 + 1000), "timed out after {elapsed:?}, deadline was 1 s");
        assert!(answered > 5, "echo answered only {answered} times during the loop");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn memory_bomb_fails_with_memory_limit() {
        let rt = runtime(None);
        let limits = Limits { memory: 32 << 20, ..Limits::default() };
        let p = load(&rt, "hostile", limits, None).await;
        match execute(&rt, &p, "membomb").await {
            Err(e @ CallError::MemoryLimit { .. }) => assert!(e.to_string().contains("memory limit of 33554432")),
            other => panic!("expected MemoryLimit, got {other:?}"),
        }
        // The same plugin still serves the next call.
        assert_eq!(execute(&rt, &p, "fine").await.unwrap(), "fine");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn panic_is_a_trap_error_for_that_call_only() {
        let rt = runtime(None);
        let p = load(&rt, "hostile", Limits::default(), None).await;
        match execute(&rt, &p, "panic").await {
            Err(e @ CallError::Trap { .. }) => assert!(e.to_string().contains("panicked"), "{e}"),
            other => panic!("expected Trap, got {other:?}"),
        }
        assert_eq!(execute(&rt, &p, "after").await.unwrap(), "after");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn runaway_recursion_traps() {
        let rt = runtime(None);
        let p = load(&rt, "hostile", Limits::default(), None).await;
        // Rust guests keep their stack in linear memory: overflowing it is an
        // out-of-bounds access (or a wasm stack exhaustion) — a trap either way.
        let r = execute(&rt, &p, "stack").await;
        assert!(
            matches!(r, Err(CallError::Trap { ref message, .. }) if message.contains("out of bounds") || message.contains("stack")),
            "{r:?}"
        );
        assert_eq!(execute(&rt, &p, "next").await.unwrap(), "next");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn oversized_output_is_refused() {
        let rt = runtime(None);
        let limits = Limits { max_output: 1 << 20, ..Limits::default() };
        let p = load(&rt, "hostile", limits, None).await;
        match execute(&rt, &p, "oversize").await {
            Err(CallError::OutputTooLarge { size, limit, .. }) => assert_eq!((size, limit), (16 << 20, 1 << 20)),
            other => panic!("expected OutputTooLarge, got {other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn ungranted_http_is_refused_without_network_traffic() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/secret", listener.local_addr().unwrap());
        let rt = runtime(None);
        // No http grant at all.
        let p = load(&rt, "hostile", Limits::default(), None).await;
        match execute(&rt, &p, &format!("http:{url}")).await {
            Err(CallError::Guest(GuestError::Denied(m))) => assert!(m.contains("`http`"), "{m}"),
            other => panic!("expected a denial, got {other:?}"),
        }
        // Granted, but for another host.
        let p = load(&rt, "hostile", Limits::default(), Some(all_grants(vec!["https://*.example.com".into()]))).await;
        match execute(&rt, &p, &format!("http:{url}")).await {
            Err(CallError::Guest(GuestError::Denied(m))) => assert!(m.contains("allow-list"), "{m}"),
            other => panic!("expected a denial, got {other:?}"),
        }
        let accepted = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
        assert!(accepted.is_err(), "a denied request reached the network");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn granted_http_reaches_an_allowed_host() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\npong!").await.unwrap();
        });
        let rt = runtime(None);
        let p = load(&rt, "hostile", Limits::default(), Some(all_grants(vec!["http://127.0.0.1:*".into()]))).await;
        let out = execute(&rt, &p, &format!("http:http://{addr}/ping")).await.unwrap();
        assert!(out.contains("200") && out.contains("pong!"), "{out}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn capabilities_without_a_host_side_answer_with_error_values() {
        let rt = runtime(None);
        let p = load(&rt, "hostile", Limits::default(), Some(all_grants(vec![]))).await;
        for prompt in ["model", "tools"] {
            match execute(&rt, &p, prompt).await {
                Err(CallError::Guest(GuestError::Unavailable(_))) => {}
                other => panic!("{prompt}: expected an unavailable error value, got {other:?}"),
            }
        }
        let ungranted = load(&rt, "hostile", Limits::default(), None).await;
        for (prompt, cap) in [("model", "`model`"), ("tools", "`tools`"), ("resource:/etc/passwd", "`resources`")] {
            match execute(&rt, &ungranted, prompt).await {
                Err(CallError::Guest(GuestError::Denied(m))) => assert!(m.contains(cap), "{m}"),
                other => panic!("{prompt}: expected a denial, got {other:?}"),
            }
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn resources_outside_agent_dirs_are_denied() {
        let rt = runtime(None);
        let p = load(&rt, "hostile", Limits::default(), Some(all_grants(vec![]))).await;
        match execute(&rt, &p, "resource:../../etc/passwd").await {
            Err(CallError::Guest(GuestError::Denied(m) | GuestError::NotFound(m))) => assert!(!m.contains("root:"), "{m}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        match execute(&rt, &p, "resource:/etc/passwd").await {
            Err(CallError::Guest(GuestError::Denied(m))) => assert!(m.contains("outside"), "{m}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn wasi_probes_get_errors_not_data() {
        let rt = runtime(None);
        let limits = Limits { memory: 256 << 20, timeout: Duration::from_secs(60), ..Limits::default() };
        let p = load(&rt, "wasi-probe", limits, None).await;
        let out = execute(&rt, &p, "probe").await.expect("the probe reports, it does not fail");
        let report: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        let probes = report.as_object().expect("a JSON object of probes");
        assert!(probes.len() >= 4, "{out}");
        for (probe, result) in probes {
            let r = result.as_str().unwrap_or_default();
            assert!(r.starts_with("error"), "WASI probe {probe} got data: {r}");
        }
        assert!(!out.contains("root:x:0:0"), "{out}");
    }
}

mod cache {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn second_load_comes_from_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let rt = runtime(Some(dir.path().join("cache")));
        let a = load(&rt, "echo", Limits::default(), None).await;
        let b = load(&rt, "echo", Limits::default(), None).await;
        assert_eq!((a.origin, b.origin), (Origin::Compiled, Origin::Cached));
        assert_eq!(execute(&rt, &b, "cached").await.unwrap(), "cached");
        // A tampered or truncated entry is discarded and recompiled, never trusted.
        for e in std::fs::read_dir(dir.path().join("cache")).unwrap() {
            std::fs::write(e.unwrap().path(), b"not native code").unwrap();
        }
        let c = load(&rt, "echo", Limits::default(), None).await;
        assert_eq!(c.origin, Origin::Compiled);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn garbage_is_rejected_with_a_reason() {
        let rt = runtime(None);
        let e = rt.load("junk", "junk.wasm".into(), b"\0asm garbage", Limits::default(), None).await.unwrap_err();
        assert!(e.to_string().contains("not a valid WebAssembly component"), "{e}");
    }
}

mod registry {
    use super::*;

    struct Fixture {
        _dir: tempfile::TempDir,
        plugins: PathBuf,
        registry: Arc<Registry>,
    }

    async fn fixture(extra_yaml: &str, files: &[(&str, &str)]) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let plugins = dir.path().join("plugins");
        std::fs::create_dir_all(&plugins).unwrap();
        for (src, dst) in files {
            std::fs::write(plugins.join(format!("{dst}.wasm")), plugin_bytes(src)).unwrap();
        }
        let yaml = format!(
            "plugins:\n  dir: {}\n  cache_dir: {}\n{extra_yaml}",
            plugins.display(),
            dir.path().join("cache").display()
        );
        let cfg_path = dir.path().join("warden.yaml");
        std::fs::write(&cfg_path, yaml).unwrap();
        let registry = warden::start(Config::from_file(&cfg_path).unwrap()).await.unwrap();
        Fixture { _dir: dir, plugins, registry }
    }

    const ECHO_REF: &str = "subagents:\n  references:\n    - { uri: \"echo://greeter\", kind: ECHO, metadata: { description: Greets } }\n";

    async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
        let until = Instant::now() + Duration::from_secs(20);
        while !f() {
            assert!(Instant::now() < until, "timed out waiting for: {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn references_resolve_to_definitions_and_registrations() {
        let f = fixture(ECHO_REF, &[("echo", "echo")]).await;
        let snap = f.registry.snapshot();
        let r = snap.definitions.get("greeter").expect("greeter registered");
        assert_eq!((r.plugin.as_str(), r.definition.description.as_str()), ("echo", "Greets"));
        assert_eq!(snap.registrations(), "-greeter: Greets\n");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn duplicate_names_keep_the_first_and_are_reported() {
        let yaml = "subagents:\n  references:\n    - { uri: \"echo://a/same\", kind: ECHO }\n    - { uri: \"echo://b/same\", kind: ECHO }\n";
        let f = fixture(yaml, &[("echo", "echo")]).await;
        let snap = f.registry.snapshot();
        assert_eq!(snap.definitions["same"].source, "echo://a/same");
        assert!(snap.problems.iter().any(|p| p.source == "echo://b/same" && p.message.contains("duplicate")));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn two_plugins_claiming_one_kind_resolve_by_priority_then_name() {
        let f = fixture("", &[("echo", "b-echo"), ("echo", "a-echo")]).await;
        let snap = f.registry.snapshot();
        assert_eq!(snap.plugin_for_kind("ECHO").unwrap().id, "a-echo");
        let status = snap.status();
        assert_eq!(status.iter().find(|s| s.id == "b-echo").unwrap().shadowed_kinds, vec!["ECHO".to_string()]);
        assert!(snap.problems.iter().any(|p| p.message.contains("`a-echo` serves it")));

        let f = fixture("  priority: [b-echo]\n", &[("echo", "b-echo"), ("echo", "a-echo")]).await;
        assert_eq!(f.registry.snapshot().plugin_for_kind("ECHO").unwrap().id, "b-echo");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn watched_dir_adds_replaces_and_removes_without_restart() {
        let f = fixture(ECHO_REF, &[("hostile", "hostile")]).await;
        let _watch = warden::plugin_dir::watch(f.registry.clone()).unwrap();
        assert!(f.registry.snapshot().plugin_for_kind("ECHO").is_none());

        // add
        std::fs::write(f.plugins.join("echo.wasm"), plugin_bytes("echo")).unwrap();
        wait_for("ECHO to appear", || f.registry.snapshot().plugin_for_kind("ECHO").is_some()).await;
        assert!(f.registry.snapshot().definitions.contains_key("greeter"));
        let call = TaskCall { prompt: "hi".into(), subagent_type: "greeter".into(), ..Default::default() };
        let run = |r: Arc<Registry>, c: TaskCall| async move {
            let scope = warden::task::TaskScope { session_id: "s".into(), user_id: "u".into(), ..Default::default() };
            warden::task::run(&r, warden::task::new_task_id(), &c, scope).await.unwrap()
        };
        assert_eq!(run(f.registry.clone(), call.clone()).await.output.as_deref(), Some("hi"));

        // replace: an in-flight call keeps its version; new calls get the new one
        let old = f.registry.snapshot().plugin_for_kind("ECHO").unwrap();
        let tmp = f.plugins.join("echo.wasm.part");
        std::fs::write(&tmp, plugin_bytes("echo-v2")).unwrap();
        std::fs::rename(&tmp, f.plugins.join("echo.wasm")).unwrap();
        wait_for("version 0.2.0", || {
            f.registry.snapshot().plugin_for_kind("ECHO").is_some_and(|p| p.info.version == "0.2.0")
        })
        .await;
        assert_eq!(run(f.registry.clone(), call.clone()).await.output.as_deref(), Some("v2: hi"));
        assert_eq!(old.info.version, "0.1.0", "the old instance stays usable by whoever holds it");
        let def = f.registry.snapshot().definitions["greeter"].definition.clone();
        let out = f.registry.runtime().execute(&old, ctx(), &call, &def, None).await.unwrap();
        assert_eq!(out, "hi");

        // garbage next to it: reported invalid, the others stay loaded
        std::fs::write(f.plugins.join("garbage.wasm"), b"this is not wasm").unwrap();
        wait_for("garbage listed invalid", || f.registry.snapshot().invalid.contains_key("garbage")).await;
        let status = f.registry.snapshot().status();
        let g = status.iter().find(|s| s.id == "garbage").unwrap();
        assert_eq!(g.state, "invalid");
        assert!(g.error.as_deref().unwrap().contains("not a valid WebAssembly component"));
        assert!(status.iter().any(|s| s.id == "echo" && s.state == "loaded"));
        assert!(status.iter().any(|s| s.id == "hostile" && s.state == "loaded"));

        // remove
        std::fs::remove_file(f.plugins.join("echo.wasm")).unwrap();
        wait_for("ECHO to disappear", || f.registry.snapshot().plugin_for_kind("ECHO").is_none()).await;
        assert!(!f.registry.snapshot().definitions.contains_key("greeter"));
        let scope = warden::task::TaskScope { session_id: "s".into(), user_id: "u".into(), ..Default::default() };
        let err = warden::task::run(&f.registry, "t".into(), &call, scope).await.unwrap_err();
        assert!(matches!(err, warden::task::TaskError::UnknownSubagent { .. }), "{err:?}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_plugin_that_hangs_in_can_resolve_is_reported_not_fatal() {
        let yaml = "  limits: { timeout: 500ms }\nsubagents:\n  references:\n    - { uri: loop, kind: HOSTILE }\n    - { uri: \"h://ok\", kind: HOSTILE }\n";
        let f = fixture(yaml, &[("hostile", "hostile")]).await;
        let snap = f.registry.snapshot();
        assert!(snap.problems.iter().any(|p| p.source == "loop" && p.message.contains("timed out")), "{:?}", snap.problems);
        assert!(snap.definitions.contains_key("ok"));
    }
}
