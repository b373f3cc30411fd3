//! Plugin runtime costs, measured in one run so the ratios compare like with like.
//!
//! Run: `cargo xtask build --plugins-only && cargo bench -p warden --bench runtime` (release profile)
//! (set WARDEN_TEST_PLUGINS / WARDEN_PLUGINS to use other plugin directories).
//!
//! - warden `execute` (fresh store + instance, limits, capability scope, deadline) with
//!   pooled and with on-demand instances, vs the same generated bindings with none of
//!   the limits, vs one hot instance (target, issue 17: fresh instance ≤ 2× hot, release
//!   profile), and with ready instances (made in the background before the call), per
//!   call when one waits and back to back;
//! - instantiation from `InstancePre`, pooled and on demand;
//! - a cold 18 MB Python component's first call, optimised only vs tiered (target,
//!   issue 17: ≤ 1.5 s on 2 cores);
//! - start-up (`warden::Host::start`) with every available plugin, cold cache vs warm cache.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use warden::config::Limits;
use warden::plugin::{SubagentReference, TaskCall, TaskContext};
use warden::runtime::bench;
use warden::runtime::pool::PoolOptions;
use warden::{Runtime, RuntimeOptions};

/// Calls per measurement round; enough for stable medians of microsecond calls.
const CALLS: usize = 2000;
/// Rounds per measurement; the median round is reported.
const ROUNDS: usize = 7;

fn dir(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(default))
}

/// Median over rounds of the per-call time of `f`, in microseconds.
async fn per_call<F, Fut>(mut f: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..CALLS / 10 {
        f().await;
    }
    let mut rounds = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for _ in 0..CALLS {
            f().await;
        }
        rounds.push(t.elapsed().as_secs_f64() * 1e6 / CALLS as f64);
    }
    rounds.sort_by(|a, b| a.partial_cmp(b).unwrap());
    rounds[ROUNDS / 2]
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let test_plugins = dir("WARDEN_TEST_PLUGINS", "target/test-plugins");
    let bundled = dir("WARDEN_PLUGINS", "target/plugins");
    let services = Arc::new(warden::services::HostServices::new(vec![]));
    let on_demand = Runtime::new(RuntimeOptions::uncached(), services.clone()).unwrap();
    let pool = PoolOptions::for_tasks(warden::config::DEFAULT_MAX_CONCURRENT_TASKS, Limits::default().memory);
    let pooled = Runtime::new(RuntimeOptions { pool: Some(pool), ..RuntimeOptions::uncached() }, services).unwrap();
    assert!(pooled.is_pooled(), "the pool could not be reserved on this machine");
    let bytes = std::fs::read(test_plugins.join("hostile.wasm")).expect("run `cargo xtask build --plugins-only` first");
    let reference = SubagentReference { uri: "bench://x".into(), kind: "HOSTILE".into(), metadata: Default::default() };
    let call = TaskCall { prompt: "ping".into(), subagent_type: "x".into(), ..Default::default() };
    let ctx = TaskContext { task_id: "t".into(), session_id: "s".into(), user_id: "u".into() };

    let mut figures = Vec::new();
    for rt in [&pooled, &on_demand] {
        let plugin = rt.load("hostile", "hostile.wasm".into(), &bytes, Limits::default(), None).await.unwrap();
        let def = rt.resolve(&plugin, &reference).await.unwrap();
        let warden_us = per_call(|| async {
            let out = rt.execute(&plugin, ctx.clone(), &call, &def, None).await.unwrap();
            assert_eq!(out, "ping");
        })
        .await;
        let fresh_us = per_call(|| async {
            assert_eq!(bench::raw_fresh_execute(rt, &plugin, "ping").await, "ping");
        })
        .await;
        let inst_us = per_call(|| async { bench::instantiate_only(rt, &plugin).await }).await;
        let mut hot = bench::HotInstance::new(rt, &plugin).await;
        let mut hot_rounds = Vec::new();
        for _ in 0..ROUNDS {
            let t = Instant::now();
            for _ in 0..CALLS {
                assert_eq!(hot.execute("ping").await, "ping");
            }
            hot_rounds.push(t.elapsed().as_secs_f64() * 1e6 / CALLS as f64);
        }
        hot_rounds.sort_by(|a, b| a.partial_cmp(b).unwrap());
        figures.push((warden_us, fresh_us, inst_us, hot_rounds[ROUNDS / 2]));
    }
    let [(pool_us, pool_raw_us, pool_inst_us, hot_us), (od_us, od_raw_us, od_inst_us, _)] = figures[..] else {
        unreachable!()
    };

    // Ready instances (pooled, as `warden serve` runs by default): each timed call finds
    // an instance made in the background (the bench waits for it untimed), and the same
    // calls back to back, where the background cannot keep up.
    let ready = Runtime::new(
        RuntimeOptions {
            pool: Some(pool),
            // Off by default (`plugins.ready_instances`); the value an operator would try.
            ready_instances: 16,
            ..RuntimeOptions::uncached()
        },
        Arc::new(warden::services::HostServices::new(vec![])),
    )
    .unwrap();
    let plugin = ready.load("hostile", "hostile.wasm".into(), &bytes, Limits::default(), None).await.unwrap();
    let def = ready.resolve(&plugin, &reference).await.unwrap();
    let hits_before = ready.ready_counters().hits.load(std::sync::atomic::Ordering::SeqCst);
    let mut ready_rounds = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let mut timed = Duration::ZERO;
        for _ in 0..CALLS {
            while !plugin.instance_waiting() {
                tokio::task::yield_now().await;
            }
            let t = Instant::now();
            let out = ready.execute(&plugin, ctx.clone(), &call, &def, None).await.unwrap();
            timed += t.elapsed();
            assert_eq!(out, "ping");
        }
        ready_rounds.push(timed.as_secs_f64() * 1e6 / CALLS as f64);
    }
    ready_rounds.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let ready_us = ready_rounds[ROUNDS / 2];
    let hits = ready.ready_counters().hits.load(std::sync::atomic::Ordering::SeqCst) - hits_before;
    assert_eq!(hits, (ROUNDS * CALLS) as u64, "every timed call took a ready instance");
    let back_to_back_us = per_call(|| async {
        let out = ready.execute(&plugin, ctx.clone(), &call, &def, None).await.unwrap();
        assert_eq!(out, "ping");
    })
    .await;

    println!("## Plugin runtime (one run, profile: {})\n", if cfg!(debug_assertions) { "dev" } else { "release" });
    println!("| measurement | per call | ratio |");
    println!("|---|---|---|");
    println!(
        "| warden `execute`, pooled instances (fresh store + instance, limits, scope, deadline) | {pool_us:.1} µs | 1.00× |"
    );
    println!(
        "| raw wasmtime, pooled: same bindings, fresh store + instance, no limits | {pool_raw_us:.1} µs | warden = {:.2}× |",
        pool_us / pool_raw_us
    );
    println!(
        "| raw wasmtime: one hot instance, typed call only | {hot_us:.1} µs | warden pooled = **{:.2}×** (target ≤ 2×) |",
        pool_us / hot_us
    );
    println!(
        "| warden `execute`, ready instance (made in the background before the call; fresh, pooled) | {ready_us:.1} µs | ready / hot = **{:.2}×** (target ≤ 2×) |",
        ready_us / hot_us
    );
    println!(
        "| warden `execute`, ready instances on, calls back to back (the background cannot keep up) | {back_to_back_us:.1} µs | {:.2}× pooled |",
        back_to_back_us / pool_us
    );
    println!(
        "| warden `execute`, on-demand instances | {od_us:.1} µs | on demand = **{:.2}×** pooled |",
        od_us / pool_us
    );
    println!("| raw wasmtime, on demand: fresh store + instance, no limits | {od_raw_us:.1} µs | |");
    println!("| instantiation from `InstancePre`, pooled | {pool_inst_us:.1} µs | |");
    println!(
        "| instantiation from `InstancePre`, on demand | {od_inst_us:.1} µs | on demand = {:.2}× pooled |",
        od_inst_us / pool_inst_us
    );

    // A cold 18 MB Python component: load (compile in the `warden` child process, as the
    // binary does) and answer a first call, optimised only vs tiered (baseline first).
    let python = std::fs::read(test_plugins.join("wasi-probe.wasm")).expect("wasi-probe.wasm");
    let python_limits = Limits { memory: 256 << 20, timeout: Duration::from_secs(120), ..Limits::default() };
    let probe_ref =
        SubagentReference { uri: "bench://probe".into(), kind: "WASI-PROBE".into(), metadata: Default::default() };
    let mut cold = Vec::new();
    for (tiered, in_child) in [(false, true), (true, true), (true, false)] {
        let compiler = match in_child {
            true => warden::runtime::compiler::Compiler::ChildProcess {
                exe: env!("CARGO_BIN_EXE_warden").into(),
                memory: warden::config::DEFAULT_COMPILE_MEMORY,
            },
            false => warden::runtime::compiler::Compiler::InProcess,
        };
        let rt = Runtime::new(
            RuntimeOptions { compiler, tiered, pool: Some(pool), ..RuntimeOptions::uncached() },
            Arc::new(warden::services::HostServices::new(vec![])),
        )
        .unwrap();
        let t = Instant::now();
        let p = rt.load("wasi-probe", "wasi-probe.wasm".into(), &python, python_limits, None).await.unwrap();
        let loaded = t.elapsed();
        let def =
            rt.resolve(&p, &SubagentReference { kind: p.info.kinds[0].clone(), ..probe_ref.clone() }).await.unwrap();
        let probe = TaskCall { prompt: "probe".into(), subagent_type: "x".into(), ..Default::default() };
        rt.execute(&p, ctx.clone(), &probe, &def, None).await.unwrap();
        let first = t.elapsed();
        while p.tier() != warden::runtime::tier::Tier::Optimized {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        cold.push((loaded, first, t.elapsed()));
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("\n## Cold load of the 18 MB Python component (`wasi-probe`), compiled in the child process\n");
    println!("| compilation | loaded | first call answered | optimised build running |");
    println!("|---|---|---|---|");
    println!(
        "| optimised only (Cranelift) | {:.0} ms | {:.0} ms | {:.0} ms |",
        ms(cold[0].0),
        ms(cold[0].1),
        ms(cold[0].2)
    );
    println!(
        "| tiered (Winch first, Cranelift in the background) | {:.0} ms | {:.0} ms (**{:.1}×** sooner; target ≤ 1500 ms) | {:.0} ms |",
        ms(cold[1].0),
        ms(cold[1].1),
        ms(cold[0].1) / ms(cold[1].1),
        ms(cold[1].2)
    );
    println!(
        "| tiered, compiled in this process (library embedders; no memory bound) | {:.0} ms | {:.0} ms | {:.0} ms |",
        ms(cold[2].0),
        ms(cold[2].1),
        ms(cold[2].2)
    );

    // Start-up with every plugin we can find, cold cache vs warm cache.
    let scratch = tempfile::tempdir().unwrap();
    let pdir = scratch.path().join("plugins");
    std::fs::create_dir_all(&pdir).unwrap();
    let mut n = 0;
    for d in [&bundled, &test_plugins] {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            if e.path().extension().is_some_and(|x| x == "wasm") {
                std::fs::copy(e.path(), pdir.join(e.file_name())).unwrap();
                n += 1;
            }
        }
    }
    let yaml =
        format!("plugins:\n  dir: {}\n  cache_dir: {}\n", pdir.display(), scratch.path().join("cache").display());
    std::fs::write(scratch.path().join("warden.yaml"), yaml).unwrap();
    let start = || async {
        let cfg = warden::Config::from_file(&scratch.path().join("warden.yaml")).unwrap();
        let t = Instant::now();
        let reg = warden::Host::start(cfg).await.unwrap().registry;
        let took = t.elapsed();
        assert_eq!(reg.snapshot().plugins.len(), n, "{:?}", reg.snapshot().invalid);
        // Let background optimised builds finish (and reach the cache) before the next start.
        while reg.snapshot().plugins.values().any(|p| p.tier() != warden::runtime::tier::Tier::Optimized) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        took
    };
    let cold = start().await;
    let mut warm: Vec<Duration> = Vec::new();
    for _ in 0..5 {
        warm.push(start().await);
    }
    warm.sort();
    let warm = warm[2];
    println!("\n## Start-up with {n} plugins\n");
    println!("| cache | start-up | ratio |");
    println!("|---|---|---|");
    println!("| cold (compile everything; large ones baseline first) | {:.0} ms | 1.00× |", cold.as_secs_f64() * 1e3);
    println!(
        "| warm (compile cache) | {:.0} ms | cold = {:.1}× warm |",
        warm.as_secs_f64() * 1e3,
        cold.as_secs_f64() / warm.as_secs_f64()
    );
}
