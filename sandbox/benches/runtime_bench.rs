//! runc vs gVisor (`runsc`), side by side in one run, against the real Docker Engine.
//!
//! Run: `cargo bench -p warden-sandbox --bench runtime_bench` (needs Docker, the
//! `warden-sandbox:bookworm` image and gVisor registered as `runsc`: `cargo xtask runsc`).
//! Prints a Markdown table for BENCHMARKS.md ("Sandbox runtimes"). Each measurement runs under
//! both runtimes in alternation (runc, runsc, runc, …), so load on the machine falls on both.

use std::time::{Duration, Instant};

use serde_json::json;
use warden_sandbox::egress::CredentialConfig;
use warden_sandbox::{ByteSize, EgressConfig, Sandbox, SandboxConfig, SessionKey};

/// New sessions measured per runtime, cold and from the warm pool.
const NEW_SESSION_ITERS: usize = 6;
/// Iterations of each warm measurement.
const WARM_ITERS: usize = 30;
/// Iterations of the heavier warm measurements (git status, 1 MB transfers, egress).
const HEAVY_ITERS: usize = 10;
/// Files in the git repository of the `git status` measurement.
const REPO_FILES: usize = 1000;
/// Size of the transfer payload.
const XFER_BYTES: usize = 1024 * 1024;

/// The runtimes compared: Docker's default and gVisor.
const RUNTIMES: [(&str, Option<&str>); 2] = [("runc", None), ("runsc", Some("runsc"))];

fn median(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (v[v.len() / 2], v[(v.len() * 9 / 10).min(v.len() - 1)])
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

async fn timed<F: std::future::Future<Output = T>, T>(f: F) -> (Duration, T) {
    let t = Instant::now();
    let out = f.await;
    (t.elapsed(), out)
}

async fn bash(sb: &Sandbox, k: &SessionKey, cmd: &str) -> String {
    let o = sb.call_tool(k, "Bash", json!({ "command": cmd }), &[]).await.unwrap();
    assert!(!o.is_error, "`{cmd}`: {}", o.content);
    o.content
}

/// A host server answering every HTTP request `ok`.
async fn http_server() -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok").await;
            });
        }
    });
    port
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let scope = format!("rtbench{}", std::process::id());
    let port = http_server().await;
    let cfg = |runtime: Option<&str>, name: &str, pool: usize| SandboxConfig {
        scope: format!("{scope}{name}"),
        runtime: runtime.map(String::from),
        max_output: ByteSize(4 * 1024 * 1024),
        warm_pool: pool,
        egress: Some(EgressConfig {
            allow: vec![format!("127.0.0.1:{port}")],
            deny: vec![],
            credentials: Vec::<CredentialConfig>::new(),
        }),
        ..SandboxConfig::default()
    };
    let mut rows: Vec<(&str, Vec<Vec<Duration>>)> = Vec::new();
    let mut push = |name: &'static str, which: usize, d: Duration| {
        if !rows.iter().any(|(n, _)| *n == name) {
            rows.push((name, vec![Vec::new(), Vec::new()]));
        }
        rows.iter_mut().find(|(n, _)| *n == name).unwrap().1[which].push(d);
    };

    // New sessions: cold (no pool) and from a full warm pool.
    let cold: Vec<Sandbox> =
        RUNTIMES.iter().map(|(n, r)| Sandbox::new(cfg(*r, &format!("c{n}"), 0)).unwrap()).collect();
    let pooled: Vec<Sandbox> =
        RUNTIMES.iter().map(|(n, r)| Sandbox::new(cfg(*r, &format!("w{n}"), 1)).unwrap()).collect();
    for sb in &pooled {
        sb.connect().await.unwrap();
    }
    for i in 0..NEW_SESSION_ITERS {
        for which in 0..RUNTIMES.len() {
            let k = SessionKey::new("bench", format!("cold{i}"));
            let (d, out) = timed(bash(&cold[which], &k, "echo hi")).await;
            assert_eq!(out, "hi\n");
            push("new session, first `Bash(echo hi)`: cold", which, d);
            cold[which].end_session(&k).await.unwrap();

            let sb = &pooled[which];
            while sb.metrics().warm_pool_ready < 1 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let k = SessionKey::new("bench", format!("warm{i}"));
            let (d, out) = timed(bash(sb, &k, "echo hi")).await;
            assert_eq!(out, "hi\n");
            push("new session, first `Bash(echo hi)`: warm pool", which, d);
            sb.end_session(&k).await.unwrap();
        }
    }
    for sb in pooled {
        sb.shutdown().await.unwrap();
    }

    // Warm sessions: one per runtime, prepared alike.
    let key = SessionKey::new("bench", "warm");
    let script = format!(
        "git init -q repo && cd repo && for i in $(seq 1 {REPO_FILES}); do echo $i > f$i.txt; done && \
         git add -A && git -c user.email=b@x -c user.name=b commit -qm init && echo $i >> f1.txt && echo done"
    );
    for sb in &cold {
        bash(sb, &key, "echo warm").await;
        assert!(bash(sb, &key, &script).await.ends_with("done\n"));
    }
    let text: String = format!("{}\n", "x".repeat(99)).repeat(XFER_BYTES / 100);
    for i in 0..WARM_ITERS {
        for (which, sb) in cold.iter().enumerate() {
            let (d, out) = timed(bash(sb, &key, "echo hi")).await;
            assert_eq!(out, "hi\n");
            push("warm `Bash(echo hi)`", which, d);
            let (d, _) = timed(bash(sb, &key, "python3 -c pass")).await;
            push("warm `Bash(python3 -c pass)`", which, d);
            if i >= HEAVY_ITERS {
                continue;
            }
            let (d, out) = timed(bash(sb, &key, "git -C /workspace/repo status --short")).await;
            assert!(out.contains("f1.txt"), "{out}");
            push("warm `git status` in a 1,000-file repository", which, d);
            let (d, o) =
                timed(sb.call_tool(&key, "Write", json!({"file_path": "big.txt", "content": text}), &[])).await;
            assert!(!o.unwrap().is_error);
            push("`Write` 1 MB", which, d);
            let (d, o) =
                timed(sb.call_tool(&key, "Read", json!({"file_path": "big.txt", "limit": 100_000}), &[])).await;
            assert!(o.unwrap().content.len() > XFER_BYTES);
            push("`Read` 1 MB", which, d);
            let cmd = format!("curl -sS --max-time 20 --noproxy '' http://127.0.0.1:{port}/");
            let (d, out) = timed(bash(sb, &key, &cmd)).await;
            assert_eq!(out.trim(), "ok", "egress reached the server");
            push("`curl` through the egress proxy (HTTP, host server)", which, d);
        }
    }
    let kernels: Vec<String> = {
        let mut v = Vec::new();
        for sb in &cold {
            v.push(bash(sb, &key, "uname -r").await.trim().to_string());
        }
        v
    };
    for sb in cold {
        sb.shutdown().await.unwrap();
    }

    println!("| measurement | runc median (p90) | runsc median (p90) | runsc / runc |\n|---|---|---|---|");
    for (name, per) in rows {
        let n = per[0].len();
        let (a, b) = (median(per[0].clone()), median(per[1].clone()));
        println!(
            "| {name} ({n} each) | {} ({}) | {} ({}) | **{:.2}×** |",
            ms(a.0),
            ms(a.1),
            ms(b.0),
            ms(b.1),
            b.0.as_secs_f64() / a.0.as_secs_f64()
        );
    }
    println!("\nkernels seen inside: runc {}, runsc {}", kernels[0], kernels[1]);
}
