//! Session lifecycle costs against the real Docker Engine (issue 50), side by side in one
//! run: the first call after a resume vs a warm-pool new session vs a warm session (and vs
//! a bare `docker start`, a resume's floor); a fork
//! of a workspace holding 200 MB; what paused sessions hold compared with running idle ones.
//!
//! Run: `cargo bench -p warden-sandbox --bench lifecycle_bench` (needs Docker and the
//! `warden-sandbox:bookworm` image). Prints a Markdown table for BENCHMARKS.md.
//! `-- --paused N` sets how many sessions the memory comparison pauses (default 100).
//! `-- --burst N` measures only a burst instead (issue 50 item 5): N new sessions at once,
//! each running `Bash(echo hi)` (`warm_pool: 2`), side by side with N concurrent bare
//! `docker run -d` of the same image, twice: a first burst on a pool at its floor and a
//! second one after the pool followed the first.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;
use warden_sandbox::{Sandbox, SandboxConfig, SessionKey};

/// Iterations of the warm call, the warm-pool start and the resume.
const ITERS: usize = 10;
/// Forks measured.
const FORK_ITERS: usize = 5;
/// Size of the workspace a fork copies, MiB.
const FORK_MIB: usize = 200;
/// Sessions paused for the memory comparison by default.
const DEFAULT_PAUSED: usize = 100;

fn quantile(v: &mut [Duration], q: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

async fn echo(sb: &Sandbox, k: &SessionKey) -> Duration {
    let t = Instant::now();
    let o = sb.call_tool(k, "Bash", json!({"command": "echo hi"}), &[]).await.expect("Bash");
    assert_eq!(o.content, "hi\n", "{}", o.content);
    t.elapsed()
}

/// Memory (bytes) Docker reports for the running containers of `scope`, and how many run.
fn running_memory(scope: &str) -> (usize, u64) {
    let ids = running_ids(scope);
    if ids.is_empty() {
        return (0, 0);
    }
    let mut args = vec!["stats".to_string(), "--no-stream".into(), "--format".into(), "{{.MemUsage}}".into()];
    args.extend(ids.iter().cloned());
    let out = Command::new("docker").args(&args).output().unwrap();
    let total = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split('/').next())
        .map(|used| parse_size(used.trim()))
        .sum();
    (ids.len(), total)
}

/// The ids of the running containers of `scope`.
fn running_ids(scope: &str) -> Vec<String> {
    let out = Command::new("docker").args(["ps", "-q", "--filter", &format!("label=warden.scope={scope}")]).output();
    String::from_utf8_lossy(&out.unwrap().stdout).split_whitespace().map(str::to_string).collect()
}

/// `12.3MiB` → bytes.
fn parse_size(s: &str) -> u64 {
    let split = s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: f64 = n.parse().unwrap_or(0.0);
    let mult = match unit {
        "KiB" | "kB" => 1024.0,
        "MiB" | "MB" => 1024.0 * 1024.0,
        "GiB" | "GB" => 1024.0 * 1024.0 * 1024.0,
        _ => 1.0,
    };
    (n * mult) as u64
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // Phase timings of cold starts and pool fills: `RUST_LOG=warden_sandbox=debug`.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let args: Vec<String> = std::env::args().collect();
    let paused_n = args
        .iter()
        .position(|a| a == "--paused")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(DEFAULT_PAUSED);
    if let Some(n) = args.iter().position(|a| a == "--burst").and_then(|i| args.get(i + 1)).and_then(|n| n.parse().ok())
    {
        burst(n).await;
        return;
    }
    let scope = format!("bench-life-{}", std::process::id());
    let load_before = loadavg();
    let sb = Sandbox::new(SandboxConfig {
        scope: scope.clone(),
        warm_pool: 1,
        max_sessions: paused_n + 8,
        max_sessions_per_user: paused_n + 8,
        max_paused_sessions: paused_n + 8,
        paused_disk_budget: warden_sandbox::ByteSize(u64::MAX),
        ..SandboxConfig::default()
    })
    .unwrap();
    sb.connect().await.unwrap();

    // A warm session: every call after the first.
    let warm_key = SessionKey::new("bench", "warm");
    echo(&sb, &warm_key).await;
    let mut warm = Vec::new();
    for _ in 0..ITERS * 3 {
        warm.push(echo(&sb, &warm_key).await);
    }
    // A new session from the warm pool (waiting for the pool to be full first), and the
    // first call after a resume of a session with files, interleaved.
    let mut pool = Vec::new();
    let mut resume = Vec::new();
    // The floor of a resume: a bare `docker start` of a stopped container of the same
    // image (Engine API, as warden calls it), interleaved with the resumes.
    let mut bare_start = Vec::new();
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let bare = bare_stopped_container(&scope);
    let paused_key = SessionKey::new("bench", "paused");
    sb.call_tool(&paused_key, "Bash", json!({"command": "head -c 10000000 /dev/urandom > f"}), &[]).await.unwrap();
    for i in 0..ITERS {
        while sb.metrics().warm_pool_ready < 1 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let k = SessionKey::new("bench", format!("pool-{i}"));
        pool.push(echo(&sb, &k).await);
        sb.end_session(&k).await.unwrap();
        sb.pause_session(&paused_key).await.unwrap();
        resume.push(echo(&sb, &paused_key).await);
        let t = Instant::now();
        docker.start_container(&bare, None::<bollard::query_parameters::StartContainerOptions>).await.unwrap();
        bare_start.push(t.elapsed());
        let stop = bollard::query_parameters::StopContainerOptions { t: Some(0), ..Default::default() };
        docker.stop_container(&bare, Some(stop)).await.unwrap();
    }
    Command::new("docker").args(["rm", "-f", &bare]).output().unwrap();

    // Forks of a session holding FORK_MIB of files, running (frozen for the copy) and paused.
    let src = SessionKey::new("bench", "fork-source");
    let fill = format!("head -c {}M /dev/urandom > big && sync && du -sh /workspace", FORK_MIB);
    let du = sb.call_tool(&src, "Bash", json!({"command": fill, "timeout": 600000}), &[]).await.unwrap().content;
    let mut fork = Vec::new();
    let mut fork_paused = Vec::new();
    for i in 0..FORK_ITERS {
        let k = SessionKey::new("bench", format!("fork-{i}"));
        let t = Instant::now();
        sb.fork_session(&src, &k).await.unwrap();
        fork.push(t.elapsed());
        sb.end_session(&k).await.unwrap();
    }
    sb.pause_session(&src).await.unwrap();
    for i in 0..FORK_ITERS {
        let k = SessionKey::new("bench", format!("forkp-{i}"));
        let t = Instant::now();
        sb.fork_session(&src, &k).await.unwrap();
        fork_paused.push(t.elapsed());
        sb.end_session(&k).await.unwrap();
    }
    for k in [&warm_key, &paused_key, &src] {
        sb.end_session(k).await.unwrap();
    }
    sb.shutdown().await.unwrap();

    // Idle sessions running vs the same sessions paused (no warm pool: only sessions run).
    let sb = Sandbox::new(SandboxConfig {
        scope: format!("{scope}-idle"),
        warm_pool: 0,
        max_sessions: paused_n + 8,
        max_sessions_per_user: paused_n + 8,
        max_paused_sessions: paused_n + 8,
        paused_disk_budget: warden_sandbox::ByteSize(u64::MAX),
        ..SandboxConfig::default()
    })
    .unwrap();
    let keys: Vec<SessionKey> = (0..paused_n).map(|i| SessionKey::new("bench", format!("idle-{i}"))).collect();
    for chunk in keys.chunks(4) {
        futures_util::future::join_all(chunk.iter().map(|k| echo(&sb, k))).await;
    }
    let (running_n, running_mem) = running_memory(&format!("{scope}-idle"));
    let cpu_running = cpu_cores_of(&format!("{scope}-idle"));
    for k in &keys {
        sb.pause_session(k).await.unwrap();
    }
    let (paused_running, paused_mem) = running_memory(&format!("{scope}-idle"));
    sb.shutdown().await.unwrap();

    let row = |name: &str, v: &mut Vec<Duration>| {
        format!("| {name} | {} | {} | {} |", v.len(), ms(quantile(v, 0.5)), ms(quantile(v, 0.9)))
    };
    let (w50, p50, r50) = (quantile(&mut warm, 0.5), quantile(&mut pool, 0.5), quantile(&mut resume, 0.5));
    let (f50, s50) = (quantile(&mut fork, 0.5), quantile(&mut bare_start, 0.5));
    println!(
        "| measurement | n | median | p90 |\n|---|---|---|---|\n{}\n{}\n{}\n{}\n{}\n{}\n",
        row("warm session, `Bash(echo hi)`", &mut warm),
        row("new session from the warm pool, first `Bash(echo hi)`", &mut pool),
        row("first `Bash(echo hi)` after a resume (10 MB workspace)", &mut resume),
        row("bare `docker start` of a stopped container of the image (Engine API)", &mut bare_start),
        row(&format!("fork of a running session holding {FORK_MIB} MiB (frozen copy + new container)"), &mut fork),
        row(&format!("fork of a paused session holding {FORK_MIB} MiB"), &mut fork_paused),
    );
    println!(
        "resume / warm-pool start: {:.2}× (target ≤ 2×); resume / bare docker start: {:.2}×; resume / warm call: {:.0}×; fork median {} (target ≤ 1 s); source workspace `du`: {}",
        r50.as_secs_f64() / p50.as_secs_f64(),
        r50.as_secs_f64() / s50.as_secs_f64(),
        r50.as_secs_f64() / w50.as_secs_f64(),
        ms(f50),
        du.trim()
    );
    println!(
        "{paused_n} idle sessions running: {running_n} containers, {:.1} MiB memory (`docker stats`), {:.3} cores in use (`docker stats` CPU sum); \
         the same {paused_n} paused: {paused_running} containers running, {:.1} MiB, no CPU (no process)",
        running_mem as f64 / 1048576.0,
        cpu_running,
        paused_mem as f64 / 1048576.0
    );
    println!("load average before: {}, after: {}", load_before, loadavg());
}

/// Cores the running containers of `scope` use now: the sum of `docker stats`' CPU
/// percentages (one sample), over 100.
fn cpu_cores_of(scope: &str) -> f64 {
    let ids = running_ids(scope);
    if ids.is_empty() {
        return 0.0;
    }
    let mut args = vec!["stats".to_string(), "--no-stream".into(), "--format".into(), "{{.CPUPerc}}".into()];
    args.extend(ids);
    let out = Command::new("docker").args(&args).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().trim_end_matches('%').parse::<f64>().ok())
        .sum::<f64>()
        / 100.0
}

/// The load average's three figures.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A stopped bare container of the sandbox image (its idle command, init, no network),
/// labelled with `scope`: what a resume's `docker start` is compared with.
fn bare_stopped_container(scope: &str) -> String {
    let image = warden_sandbox::config::DEFAULT_IMAGE;
    let label = format!("bench-bare={scope}");
    let out = Command::new("docker")
        .args([
            "create",
            "--init",
            "--network",
            "none",
            "--label",
            &label,
            "--entrypoint",
            "",
            image,
            "sleep",
            "infinity",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "docker create: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `n` concurrent bare `docker run -d` of the sandbox image (its idle command, init), then
/// removes them (not timed). Returns the wall time.
async fn bare_docker_runs(n: usize, label: &str) -> Duration {
    let image = warden_sandbox::config::DEFAULT_IMAGE;
    let t = Instant::now();
    let runs = (0..n).map(|_| {
        let label = label.to_string();
        tokio::task::spawn_blocking(move || {
            let out = Command::new("docker")
                .args(["run", "-d", "--init", "--label", &label, "--entrypoint", "", image, "sleep", "infinity"])
                .output()
                .unwrap();
            assert!(out.status.success(), "docker run: {}", String::from_utf8_lossy(&out.stderr));
        })
    });
    for r in futures_util::future::join_all(runs).await {
        r.unwrap();
    }
    let wall = t.elapsed();
    let out = Command::new("docker").args(["ps", "-aq", "--filter", &format!("label={label}")]).output().unwrap();
    let ids: Vec<String> = String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_string).collect();
    assert_eq!(ids.len(), n, "every bare container runs");
    let mut rm = vec!["rm".to_string(), "-f".into()];
    rm.extend(ids);
    Command::new("docker").args(&rm).output().unwrap();
    wall
}

/// `n` new sessions at once, each running `Bash(echo hi)`: the wall time and each
/// session's time to its first result; the sessions are ended afterwards (not timed).
async fn session_burst(sb: &Sandbox, n: usize, round: &str) -> (Duration, Vec<Duration>) {
    let keys: Vec<SessionKey> = (0..n).map(|i| SessionKey::new(format!("burst-{i}"), format!("{round}-{i}"))).collect();
    let t = Instant::now();
    let mut each = futures_util::future::join_all(keys.iter().map(|k| echo(sb, k))).await;
    let wall = t.elapsed();
    each.sort();
    futures_util::future::join_all(keys.iter().map(|k| sb.end_session(k))).await;
    (wall, each)
}

/// Issue 50 item 5: a burst of `n` new sessions vs `n` bare `docker run -d`, side by side.
async fn burst(n: usize) {
    let scope = format!("bench-burst-{}", std::process::id());
    let label = format!("warden-bench-burst={scope}");
    let load_before = loadavg();
    let sb = Sandbox::new(SandboxConfig {
        scope: scope.clone(),
        warm_pool: 2,
        max_sessions: 2 * n + 8,
        max_sessions_per_user: 2 * n + 8,
        ..SandboxConfig::default()
    })
    .unwrap();
    sb.connect().await.unwrap();
    // Starts the pool (and pulls nothing: the image is local), then waits for it to be full.
    let first = SessionKey::new("burst", "first");
    echo(&sb, &first).await;
    sb.end_session(&first).await.unwrap();
    let wait_ready = |want: u64| {
        let sb = &sb;
        async move {
            let t = Instant::now();
            while sb.metrics().warm_pool_ready < want && t.elapsed() < Duration::from_secs(120) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    wait_ready(2).await;
    let mut lines = Vec::new();
    for round in ["first", "second"] {
        let before = sb.metrics();
        let ready_before = format!("{} ready, target {}", before.warm_pool_ready, before.warm_pool_target);
        let bare = bare_docker_runs(n, &label).await;
        let (wall, mut each) = session_burst(&sb, n, round).await;
        let m = sb.metrics();
        lines.push(format!(
            "| {round} burst (pool before: {ready_before}) | {n} | {} ({:.1}/s) | {} | {} | {} ({:.1}/s) | {:.2}× |",
            ms(wall),
            n as f64 / wall.as_secs_f64(),
            ms(quantile(&mut each, 0.5)),
            ms(quantile(&mut each, 0.99)),
            ms(bare),
            n as f64 / bare.as_secs_f64(),
            wall.as_secs_f64() / bare.as_secs_f64(),
        ));
        println!("after the {round} burst: {m:?}");
        // The pool follows the burst: it refills up to its target (grown by the burst's
        // misses), given at most the time a host between two waves would have.
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let m = sb.metrics();
            if m.warm_pool_ready >= m.warm_pool_target {
                break;
            }
        }
    }
    sb.shutdown().await.unwrap();
    println!(
        "| burst | sessions | wall (sessions/s) | p50 | p99 | {n} bare `docker run -d` (runs/s) | sessions / docker |\n|---|---|---|---|---|---|---|"
    );
    for l in lines {
        println!("{l}");
    }
    println!("load average before: {load_before}, after: {}", loadavg());
}
