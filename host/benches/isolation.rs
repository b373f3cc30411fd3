//! One plugin under attack by another: the victim's call latency alone and while a hostile
//! plugin runs each attack without pause, measured side by side in one run.
//!
//! Run: `cargo xtask build --plugins-only && cargo bench -p warden --bench isolation` (release profile)
//! (`WARDEN_TEST_PLUGINS` picks another plugin directory; `--write FILE` also replaces the
//! `## Isolation` section of FILE). Target (issue 12): the victim's p99 within 1.5× of its
//! baseline under every attack.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use warden::config::Limits;
use warden::plugin::{SubagentDefinition, SubagentReference, TaskCall, TaskContext};
use warden::runtime::pool::PoolOptions;
use warden::{LoadedPlugin, Runtime, RuntimeOptions};

/// Victim calls per measurement (sequential, one at a time, as a parent agent waits):
/// a p99 rests on 50 samples.
const CALLS: usize = 5_000;
/// Alternating rounds (alone, then under attack) per attack; the median is reported.
const ROUNDS: usize = 5;
/// Attacker calls running at once (one per core is what a task limit of 2 allows here).
const ATTACKERS: usize = 1;
/// The attacker's deadline per call: the loop and memory attacks run until it.
const ATTACK_TIMEOUT: Duration = Duration::from_millis(500);

/// The attacks of issue 12 that need no other host service, as hostile-plugin prompts.
fn attacks() -> Vec<(&'static str, String)> {
    let script = |ops: &str| format!("script:{ops}");
    vec![
        // Not an attack: a second plugin answering as fast as it is called. The share of the
        // victim's slowdown that any busy neighbour causes on this machine.
        ("busy neighbour (no attack: `ping` back to back)", "ping".into()),
        ("infinite loop (to the deadline)", "loop".into()),
        ("memory bomb (to the cap)", "membomb".into()),
        ("stack overflow", "stack".into()),
        // What the SDK's allocator avoids, done on purpose: one page of memory growth per
        // call, which the pool takes back before the slot's next instance.
        ("memory growth on every call", "grow".into()),
        ("16 MiB output", "oversize".into()),
        ("panic", "panic".into()),
        ("100,000 HTTP headers", script(r#"[{"op":"http","url":"http://127.0.0.1:9/","extra_headers":100000}]"#)),
        (
            "log flood (newlines, 8 KiB lines)",
            script(r#"[{"op":"log","level":"info","message":{"repeat":"x\n","times":4096},"repeat":2000}]"#),
        ),
    ]
}

fn dir(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(default))
}

struct Victim {
    rt: Arc<Runtime>,
    plugin: LoadedPlugin,
    def: SubagentDefinition,
}

impl Victim {
    /// Per-call latencies of `CALLS` sequential calls, sorted, in microseconds.
    async fn measure(&self) -> Vec<f64> {
        let call = TaskCall { prompt: "ping".into(), subagent_type: "x".into(), ..Default::default() };
        let ctx = TaskContext { task_id: "v".into(), session_id: "s".into(), user_id: "u".into() };
        let mut v = Vec::with_capacity(CALLS);
        for _ in 0..CALLS {
            let t = Instant::now();
            let out = self.rt.execute(&self.plugin, ctx.clone(), &call, &self.def, None).await.unwrap();
            v.push(t.elapsed().as_secs_f64() * 1e6);
            assert_eq!(out, "ping");
        }
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v
    }

    /// [`Victim::measure`] while `ATTACKERS` calls of `attacker` run `prompt` back to back;
    /// also returns how many attacker calls ran.
    async fn measure_under(&self, attacker: &Arc<LoadedPlugin>, prompt: &str) -> (Vec<f64>, u64) {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU64::new(0));
        let mut handles = Vec::new();
        for _ in 0..ATTACKERS {
            let (rt, attacker, def, stop, rounds) =
                (self.rt.clone(), attacker.clone(), self.def.clone(), stop.clone(), rounds.clone());
            let call = TaskCall { prompt: prompt.to_owned(), subagent_type: "x".into(), ..Default::default() };
            handles.push(tokio::spawn(async move {
                let ctx = TaskContext { task_id: "a".into(), session_id: "s".into(), user_id: "u".into() };
                while !stop.load(Ordering::Relaxed) {
                    let _ = rt.execute(&attacker, ctx.clone(), &call, &def, None).await;
                    rounds.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let under = self.measure().await;
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.await.unwrap();
        }
        (under, rounds.load(Ordering::Relaxed))
    }
}

fn pct(v: &[f64], p: f64) -> f64 {
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)]
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let plugins = dir("WARDEN_TEST_PLUGINS", "target/test-plugins");
    let bytes = std::fs::read(plugins.join("hostile.wasm")).expect("run `cargo xtask build --plugins-only` first");
    let services = Arc::new(warden::services::HostServices::new(vec![]));
    // Instances as `warden serve` allocates them by default: pooled, copy-on-write.
    let pool = PoolOptions::for_tasks(warden::config::DEFAULT_MAX_CONCURRENT_TASKS, Limits::default().memory);
    let rt =
        Arc::new(Runtime::new(RuntimeOptions { pool: Some(pool), ..RuntimeOptions::uncached() }, services).unwrap());
    assert!(rt.is_pooled(), "the instance pool could not be reserved");
    let grant = warden::config::GrantConfig { log: true, ..Default::default() };
    let victim_plugin = rt.load("victim", "victim.wasm".into(), &bytes, Limits::default(), Some(&grant)).await.unwrap();
    let attacker_limits = Limits { timeout: ATTACK_TIMEOUT, ..Limits::default() };
    let attacker =
        Arc::new(rt.load("attacker", "attacker.wasm".into(), &bytes, attacker_limits, Some(&grant)).await.unwrap());
    let reference = SubagentReference { uri: "bench://x".into(), kind: "HOSTILE".into(), metadata: Default::default() };
    let def = rt.resolve(&victim_plugin, &reference).await.unwrap();
    let victim = Victim { rt: rt.clone(), plugin: victim_plugin, def: def.clone() };

    victim.measure().await; // warm-up
    let mut rows = Vec::new();
    let mut worst = 1.0f64;
    // The control: the victim's p99 while a benign plugin is called as fast as it answers.
    // An attack's share of the slowdown is its p99 over this one.
    let mut busy_p99: Option<f64> = None;
    let mut worst_vs_busy = 0.0f64;
    // `WARDEN_ATTACK=<text>` runs only the attacks whose name contains it (for profiling one).
    let only = std::env::var("WARDEN_ATTACK").ok();
    for (name, prompt) in attacks().into_iter().filter(|(n, _)| only.as_deref().is_none_or(|o| n.contains(o))) {
        // Alternate alone / under attack so drift of the machine hits both alike; the
        // median round is reported.
        let mut measured = Vec::new();
        let mut calls = 0;
        for _ in 0..ROUNDS {
            let alone = victim.measure().await;
            let (under, n) = victim.measure_under(&attacker, &prompt).await;
            calls += n;
            measured.push((pct(&alone, 0.99), pct(&under, 0.5), pct(&under, 0.99)));
        }
        let median = |f: &dyn Fn(&(f64, f64, f64)) -> f64| {
            let mut v: Vec<f64> = measured.iter().map(f).collect();
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            v[v.len() / 2]
        };
        let ratio = median(&|m| m.2 / m.0);
        let (alone99, p50, p99) = (median(&|m| m.0), median(&|m| m.1), median(&|m| m.2));
        let vs_busy = match busy_p99 {
            Some(busy) if prompt != "ping" => {
                worst_vs_busy = worst_vs_busy.max(p99 / busy);
                format!("{:.2}×", p99 / busy)
            }
            _ => "—".to_owned(),
        };
        if prompt == "ping" {
            busy_p99 = Some(p99);
        } else {
            worst = worst.max(ratio);
        }
        rows.push(format!(
            "| {name} | {p50:.0} µs | {alone99:.0} µs | {p99:.0} µs | **{ratio:.2}×** | {vs_busy} | {calls} calls |"
        ));
    }
    let table = format!(
        "| running in another plugin | victim p50 under it | victim p99 alone | victim p99 under it | p99 ratio to alone (median of rounds) | p99 ratio to busy neighbour | attacker |\n|---|---|---|---|---|---|---|\n{}\n",
        rows.join("\n")
    );
    println!("{table}");
    println!("worst p99 ratio: {worst:.2}× (target ≤ 1.5×); worst over a busy benign neighbour: {worst_vs_busy:.2}×");
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--write") {
        let path = args.get(i + 1).expect("--write FILE");
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let section = format!(
            "## Isolation\n\nCommand: `cargo xtask build --plugins-only && cargo bench -p warden --bench isolation -- --write ../BENCHMARKS.md` (from `host/`; profile: {})\n\n\
             Machine: {} cores; instances pooled as `warden serve` allocates them. The victim (the hostile test plugin answering `ping`, default limits) is called {CALLS} times one after \
             another, alone and then while {ATTACKERS} call(s) of a second plugin run each attack back to back (deadline {} ms), in {ROUNDS} \
             alternating rounds per attack. Target (issue 12): victim p99 ≤ 1.5× its baseline. Load average at the end: {}.\n\n{table}\nWorst p99 ratio to alone: **{worst:.2}×**; \
             worst p99 ratio to the busy benign neighbour (what an attack adds over ordinary load): **{worst_vs_busy:.2}×**.\n",
            if cfg!(debug_assertions) { "dev" } else { "release" },
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            ATTACK_TIMEOUT.as_millis(),
            load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
        );
        let existing = std::fs::read_to_string(path).unwrap_or_else(|_| "# Benchmarks\n\n".into());
        let updated = match existing.find("## Isolation\n") {
            Some(start) => {
                let end = existing[start + 1..].find("\n## ").map(|e| start + 1 + e + 1).unwrap_or(existing.len());
                format!("{}{}{}", &existing[..start], section, &existing[end..])
            }
            None => format!("{}{}{}", existing, if existing.ends_with("\n\n") { "" } else { "\n" }, section),
        };
        std::fs::write(path, updated).unwrap();
        println!("wrote {path}");
    }
}
