//! Integration tests of warden-sandbox against the real Docker Engine.
//!
//! Own harness (`harness = false`): tests run a few at a time, each with its own sandbox
//! scope; after each test the runner checks that nothing of that scope is left, and after
//! all tests that nothing warden-labelled from this run remains. Without Docker or without
//! the sandbox image every test fails loudly — nothing is skipped.
//!
//! Run: `cargo test -p warden-sandbox --test sandbox [-- FILTER...]`

use std::future::Future;
use std::pin::Pin;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use warden_sandbox::{Sandbox, SandboxConfig, SandboxError, SessionKey, ToolOutput};

/// Tests running at once (the machine has 2 cores and other builds run).
const CONCURRENCY: usize = 4;
/// Tests that run with no other test beside them: `sessions::prune_removes_leftovers`
/// prunes every scope with a 1 s idle TTL, which would remove the stopped containers of
/// paused sessions that other tests hold; the sweep races each keep a dozen calls running
/// at once, a load under which other tests' idle TTLs ran out.
const RUN_ALONE: [&str; 4] = [
    "sessions::prune_removes_leftovers",
    "state::concurrent_sweeps_never_stop_each_other",
    "state::a_sweep_beside_a_cd_never_loses_it",
    "state::a_command_stopping_the_agents_wedges_no_sweep",
];
/// Per-test limit: above the process-rule test's five-minute command (the slowest test
/// on a loaded 2-core machine), so a hung test still fails on its own.
const TEST_TIMEOUT: Duration = Duration::from_secs(360);

/// What every test gets: a scope no other test (or run) uses, and the container runtime its
/// sandboxes run under (the boundary groups run once under runc and once under gVisor).
#[derive(Clone)]
struct Ctx {
    scope: String,
    runtime: Option<&'static str>,
    /// The sandboxes get the default warm pool ([`POOLED_GROUPS`]); else none unless the
    /// test asks for one.
    pooled: bool,
}

/// Groups whose sandboxes keep the default warm pool: the pool's own tests and the session
/// lifecycle's. Every other test's sandbox starts with `warm_pool: 0` (a test that needs a
/// pool sets it): a pool of two would create, refill and remove three containers (and
/// disks) around a test's one session, which made the whole suite take about twice as long
/// for nothing those tests look at.
const POOLED_GROUPS: [&str; 2] = ["pool", "sessions"];

impl Ctx {
    fn sandbox(&self) -> Sandbox {
        self.sandbox_with(|_| {})
    }

    fn sandbox_with(&self, f: impl FnOnce(&mut SandboxConfig)) -> Sandbox {
        let mut cfg = SandboxConfig {
            scope: self.scope.clone(),
            runtime: self.runtime.map(String::from),
            ..SandboxConfig::default()
        };
        if !self.pooled {
            cfg.warm_pool = 0;
        }
        f(&mut cfg);
        Sandbox::new(cfg).expect("valid config")
    }

    /// The same runtime under another scope.
    fn scoped(&self, scope: String) -> Ctx {
        Ctx { scope, ..self.clone() }
    }
}

/// The runtime name of gVisor as `cargo xtask runsc` registers it.
const GVISOR: &str = "runsc";
/// Test groups that run a second time with every sandbox under gVisor: the boundary of the
/// sandbox (processes, files, links, disk, secrets, egress, the agent's reach).
const GVISOR_GROUPS: [&str; 8] =
    ["tools", "confinement", "file_bounds", "limits", "boundary", "state", "egress", "runtime"];

fn key(session: &str) -> SessionKey {
    SessionKey::new("tester", session)
}

async fn tool(sb: &Sandbox, k: &SessionKey, name: &str, input: Value) -> ToolOutput {
    match sb.call_tool(k, name, input.clone(), &[]).await {
        Ok(o) => o,
        Err(e) => panic!("{name} {input} failed: {e}"),
    }
}

async fn bash(sb: &Sandbox, k: &SessionKey, cmd: &str) -> ToolOutput {
    tool(sb, k, "Bash", json!({ "command": cmd })).await
}

async fn bash_ok(sb: &Sandbox, k: &SessionKey, cmd: &str) -> String {
    let o = bash(sb, k, cmd).await;
    assert!(!o.is_error, "`{cmd}` failed: {}", o.content);
    o.content
}

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().expect("run docker CLI");
    assert!(out.status.success(), "docker {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `pid args` of every process in a container, read from its own /proc by a root exec:
/// `docker top` lists the host's view, which under gVisor is not the sandbox's processes.
fn container_ps(id: &str) -> String {
    let script = r#"for p in /proc/[0-9]*; do a=$(tr '\0' ' ' 2>/dev/null < "$p/cmdline") || continue; echo "${p#/proc/} $a"; done"#;
    docker(&["exec", "-u", "0", id, "sh", "-c", script])
}

/// Container id of a session (via list_sessions).
async fn container_of(sb: &Sandbox, k: &SessionKey) -> String {
    let s = sb.list_sessions().await.unwrap();
    let mine: Vec<_> = s.iter().filter(|i| &i.key == k && i.scope == sb.config().scope).collect();
    assert_eq!(mine.len(), 1, "exactly one container for {k}: {s:?}");
    mine[0].container_id.clone()
}

/// Waits until the warm pool holds `n` ready containers (each fill takes about a cold start).
async fn pool_ready(sb: &Sandbox, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while sb.metrics().warm_pool_ready != n {
        assert!(Instant::now() < deadline, "the warm pool never held {n} ready containers: {:?}", sb.metrics());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Full ids of the containers of `scope` still under their pool name (never handed out).
/// The loop device of each running container of `scope`'s workspace (`sandbox.disk`), one
/// entry per container.
fn mounted_devices(scope: &str) -> Vec<String> {
    let ids = docker(&["ps", "-q", "--no-trunc", "--filter", &format!("label=warden.scope={scope}")]);
    ids.split_whitespace()
        .map(|id| {
            let volume = docker(&[
                "inspect",
                "-f",
                "{{range .Mounts}}{{if eq .Destination \"/workspace\"}}{{.Name}}{{end}}{{end}}",
                id,
            ]);
            docker(&["volume", "inspect", "-f", "{{index .Options \"device\"}}", volume.trim()]).trim().to_string()
        })
        .collect()
}

fn pooled(scope: &str) -> Vec<String> {
    docker(&[
        "ps",
        "-a",
        "--no-trunc",
        "--filter",
        &format!("label=warden.scope={scope}"),
        "--filter",
        "label=warden.pool=true",
        "--format",
        "{{.ID}} {{.Names}}",
    ])
    .lines()
    .filter_map(|l| l.split_once(' '))
    .filter(|(_, name)| name.starts_with("warden-pool."))
    .map(|(id, _)| id.to_string())
    .collect()
}

/// Whether a container with this id exists (in any state).
fn container_exists(id: &str) -> bool {
    !docker(&["ps", "-aq", "--filter", &format!("id={id}")]).trim().is_empty()
}

/// Names of the volumes of `scope`.
fn volumes_of_scope(scope: &str) -> Vec<String> {
    docker(&["volume", "ls", "-q", "--filter", &format!("label=warden.scope={scope}")])
        .lines()
        .map(str::to_string)
        .collect()
}

/// The volumes a session's container uses: the workspace it mounts, that workspace's disk
/// (`sandbox.disk`) and, for a container from the warm pool, the binding volume that
/// carries the session key.
fn volumes_of_session(scope: &str, id: &str, k: &SessionKey) -> Vec<String> {
    let j: Value = serde_json::from_str(&docker(&["inspect", id])).unwrap();
    let ws = j[0]["Mounts"][0]["Name"].as_str().unwrap().to_string();
    let disk = format!("warden-disk-{}", ws.strip_prefix("warden-ws-").unwrap());
    let mut v = vec![ws, disk];
    v.extend(
        docker(&[
            "volume",
            "ls",
            "-q",
            "--filter",
            &format!("label=warden.scope={scope}"),
            "--filter",
            "label=warden.binding=true",
            "--filter",
            &format!("label=warden.session={}", k.session_id),
        ])
        .lines()
        .map(str::to_string),
    );
    v
}

/// Processes in a container whose command line starts with `prefix`.
///
/// Every `/proc` reader in this file puts `2>/dev/null` before `< "$p/cmdline"`: bash
/// applies redirections left to right, so a process that exits between the glob and the
/// read made `< file` fail while stderr still went to the call's output (CI flake in
/// `limits::timeout_kills_children`: "/proc/36/cmdline: No such file or directory").
async fn procs_starting_with(sb: &Sandbox, k: &SessionKey, prefix: &str) -> String {
    let script = format!(
        r#"for p in /proc/[0-9]*; do c=$(tr '\0' ' ' 2>/dev/null < "$p/cmdline"); case "$c" in "{prefix}"*) echo "LEFT $c";; esac; done; true"#
    );
    bash_ok(sb, k, &script).await
}

mod tools {
    use super::*;

    pub async fn read_write_edit(c: Ctx) {
        let sb = c.sandbox();
        let k = key("rwe");
        let w =
            tool(&sb, &k, "Write", json!({"file_path": "notes/a.txt", "content": "alpha\nbeta\ngamma\nbeta\n"})).await;
        assert!(!w.is_error && w.content.contains("created"), "{}", w.content);
        let r = tool(&sb, &k, "Read", json!({"file_path": "/workspace/notes/a.txt"})).await;
        assert_eq!(r.content, "     1\talpha\n     2\tbeta\n     3\tgamma\n     4\tbeta\n");
        // Lines are cut after MAX_LINE_CHARS characters, not bytes.
        let max = 2000; // tools::files::MAX_LINE_CHARS
        let (wide, long) = ("é".repeat(max), "y".repeat(max + 1));
        tool(&sb, &k, "Write", json!({"file_path": "lines.txt", "content": format!("{wide}\n{long}\n")})).await;
        let r = tool(&sb, &k, "Read", json!({"file_path": "lines.txt"})).await;
        assert_eq!(r.content, format!("     1\t{wide}\n     2\t{}… [line truncated]\n", &long[..max]));
        let r = tool(&sb, &k, "Read", json!({"file_path": "notes/a.txt", "offset": 2, "limit": 2})).await;
        assert!(r.content.starts_with("     2\tbeta\n     3\tgamma\n"), "{}", r.content);
        assert!(r.content.contains("showing lines 2-3 of 4"), "{}", r.content);

        let e = tool(&sb, &k, "Edit", json!({"file_path": "notes/a.txt", "old_string": "beta", "new_string": "BETA"}))
            .await;
        assert!(e.is_error && e.content.contains("Found 2 matches"), "{}", e.content);
        let e =
            tool(&sb, &k, "Edit", json!({"file_path": "notes/a.txt", "old_string": "gamma", "new_string": "GAMMA"}))
                .await;
        assert!(!e.is_error, "{}", e.content);
        let e = tool(
            &sb,
            &k,
            "Edit",
            json!({"file_path": "notes/a.txt", "old_string": "beta", "new_string": "B", "replace_all": true}),
        )
        .await;
        assert!(!e.is_error && e.content.contains("2 replacements"), "{}", e.content);
        let e =
            tool(&sb, &k, "Edit", json!({"file_path": "notes/a.txt", "old_string": "zeta", "new_string": "Z"})).await;
        assert!(e.is_error && e.content.contains("not found"), "{}", e.content);
        assert_eq!(bash_ok(&sb, &k, "cat notes/a.txt").await, "alpha\nB\nGAMMA\nB\n");

        let w = tool(&sb, &k, "Write", json!({"file_path": "notes/a.txt", "content": "new"})).await;
        assert!(w.content.contains("overwritten"), "{}", w.content);
        let r = tool(&sb, &k, "Read", json!({"file_path": "missing.txt"})).await;
        assert!(r.is_error && r.content.contains("does not exist"), "{}", r.content);
        let r = tool(&sb, &k, "Read", json!({"file_path": "notes"})).await;
        assert!(r.is_error && r.content.contains("directory"), "{}", r.content);
        // Files belong to the session user, not root.
        assert_eq!(bash_ok(&sb, &k, "stat -c %u:%g notes/a.txt").await.trim(), "1000:1000");
        sb.shutdown().await.unwrap();
    }

    pub async fn binary_roundtrip(c: Ctx) {
        let sb = c.sandbox();
        let k = key("bin");
        let data: Vec<u8> = (0..200_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        sb.upload_file(&k, "blob/data.bin", &data).await.unwrap();
        assert_eq!(sb.download_file(&k, "/workspace/blob/data.bin").await.unwrap(), data);
        assert_eq!(bash_ok(&sb, &k, "stat -c %s blob/data.bin").await.trim(), data.len().to_string());
        // Produced inside, fetched out byte for byte.
        bash_ok(&sb, &k, "head -c 4096 /dev/urandom > r.bin && od -A n -t x1 -v r.bin | tr -d ' \\n' > r.hex").await;
        let raw = sb.download_file(&k, "r.bin").await.unwrap();
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(sb.download_file(&k, "r.hex").await.unwrap(), hex.as_bytes());
        let r = tool(&sb, &k, "Read", json!({"file_path": "r.bin"})).await;
        assert!(r.is_error && r.content.contains("binary file"), "{}", r.content);
        sb.shutdown().await.unwrap();
    }

    pub async fn glob(c: Ctx) {
        let sb = c.sandbox();
        let k = key("glob");
        bash_ok(&sb, &k, "mkdir -p src/a docs && touch -d 2020-01-01 src/main.rs src/a/lib.rs docs/x.md .hidden.rs && touch src/a/new.rs").await;
        let g = tool(&sb, &k, "Glob", json!({"pattern": "**/*.rs"})).await;
        let lines: Vec<&str> = g.content.lines().collect();
        assert_eq!(lines.len(), 4, "{}", g.content);
        assert_eq!(lines[0], "/workspace/src/a/new.rs", "newest first: {}", g.content);
        assert!(lines.contains(&"/workspace/.hidden.rs"));
        let g = tool(&sb, &k, "Glob", json!({"pattern": "*.rs", "path": "src/a"})).await;
        assert_eq!(g.content.lines().count(), 2, "{}", g.content);
        let g = tool(&sb, &k, "Glob", json!({"pattern": "**/*.py"})).await;
        assert_eq!(g.content, "No files found");
        let g = tool(&sb, &k, "Glob", json!({"pattern": "*", "path": "nope"})).await;
        assert!(g.is_error, "{}", g.content);
        sb.shutdown().await.unwrap();
    }

    pub async fn grep(c: Ctx) {
        let sb = c.sandbox();
        let k = key("grep");
        bash_ok(&sb, &k, "mkdir -p p && printf 'fn main() {}\\nlet Needle = 1;\\nneedle again\\nx\\ny\\n' > p/a.rs && printf 'needle in py\\n' > p/b.py && printf 'nothing\\n' > p/c.txt").await;
        let g = tool(&sb, &k, "Grep", json!({"pattern": "needle"})).await;
        assert!(g.content.starts_with("Found 2 files"), "{}", g.content);
        let g = tool(&sb, &k, "Grep", json!({"pattern": "needle", "-i": true, "output_mode": "count"})).await;
        assert!(
            g.content.contains("/workspace/p/a.rs:2") && g.content.contains("/workspace/p/b.py:1"),
            "{}",
            g.content
        );
        let g = tool(&sb, &k, "Grep", json!({"pattern": "Needle", "output_mode": "content", "path": "p/a.rs"})).await;
        assert_eq!(g.content.trim(), "/workspace/p/a.rs:2:let Needle = 1;");
        let g =
            tool(&sb, &k, "Grep", json!({"pattern": "Needle", "output_mode": "content", "-A": 1, "-n": false})).await;
        assert!(g.content.contains("let Needle = 1;") && g.content.contains("needle again"), "{}", g.content);
        let g = tool(&sb, &k, "Grep", json!({"pattern": "needle", "type": "py"})).await;
        assert!(g.content.contains("b.py") && !g.content.contains("a.rs"), "{}", g.content);
        let g = tool(&sb, &k, "Grep", json!({"pattern": "needle", "glob": "*.rs"})).await;
        assert!(g.content.contains("a.rs") && !g.content.contains("b.py"), "{}", g.content);
        let g =
            tool(&sb, &k, "Grep", json!({"pattern": ".", "output_mode": "content", "path": "p/a.rs", "head_limit": 2}))
                .await;
        assert!(g.content.contains("head_limit") && g.content.lines().count() == 3, "{}", g.content);
        let g = tool(&sb, &k, "Grep", json!({"pattern": "absent-text"})).await;
        assert!(!g.is_error && g.content == "No files found", "{}", g.content);
        let g = tool(&sb, &k, "Grep", json!({"pattern": "(unclosed"})).await;
        assert!(g.is_error, "{}", g.content);
        sb.shutdown().await.unwrap();
    }

    pub async fn bash_state_and_secrets(c: Ctx) {
        let sb = c.sandbox();
        let k = key("bash");
        let o = bash(&sb, &k, "echo out; echo err >&2; exit 3").await;
        assert!(o.is_error);
        assert_eq!(o.content, "out\n[stderr]\nerr\n[exit code: 3]");
        // The working directory persists; variables do not (issue 40: state a command leaves
        // behind must not steer a later one).
        bash_ok(&sb, &k, "mkdir -p deep/dir && cd deep/dir && export GREETING='hello world'").await;
        assert_eq!(bash_ok(&sb, &k, "pwd; echo \"[${GREETING:-unset}]\"").await, "/workspace/deep/dir\n[unset]\n");
        // A task's variables: visible to the call, never persisted.
        let env = vec![("API_TOKEN".to_string(), "s3cr3t".to_string())];
        let o = sb.call_tool(&k, "Bash", json!({"command": "echo ${API_TOKEN}"}), &env).await.unwrap();
        assert_eq!(o.content, "s3cr3t\n");
        assert_eq!(bash_ok(&sb, &k, "echo \"[${API_TOKEN:-unset}]\"").await, "[unset]\n");
        let state = bash_ok(&sb, &k, "env").await;
        assert!(!state.contains("s3cr3t") && !state.contains("GREETING"), "{state}");
        assert!(state.contains("HOME=/workspace\n"), "HOME is the workspace: {state}");
        let bad = sb.call_tool(&k, "Bash", json!({"command": "true"}), &[("BAD-NAME".into(), "x".into())]).await;
        assert!(matches!(bad, Err(SandboxError::InvalidInput { .. })), "{bad:?}");
        sb.shutdown().await.unwrap();
    }

    pub async fn output_is_capped(c: Ctx) {
        let sb = c.sandbox_with(|cfg| cfg.max_output = warden_sandbox::ByteSize(16 * 1024));
        let k = key("cap");
        let o = bash(&sb, &k, "seq 1 200000; echo LAST-LINE").await;
        assert!(!o.is_error);
        assert!(o.content.len() <= 16 * 1024 + 64, "{}", o.content.len());
        assert!(o.content.starts_with("1\n2\n3\n"), "head kept");
        assert!(o.content.trim_end().ends_with("LAST-LINE"), "tail kept");
        assert!(o.content.contains("bytes truncated"), "truncation stated");
        sb.shutdown().await.unwrap();
    }

    pub async fn errors_are_clear(c: Ctx) {
        let sb = c.sandbox();
        let k = key("errs");
        let e = sb.call_tool(&k, "WebFetch", json!({}), &[]).await;
        assert!(matches!(e, Err(SandboxError::UnknownTool(_))), "{e:?}");
        let e = sb.call_tool(&k, "Read", json!({"path": "x"}), &[]).await;
        assert!(
            matches!(&e, Err(SandboxError::InvalidInput { message, .. }) if message.contains("file_path")),
            "{e:?}"
        );
        let e = sb.call_tool(&k, "Bash", json!({"command": "true", "timeout": 700_000}), &[]).await;
        assert!(matches!(e, Err(SandboxError::InvalidInput { .. })), "{e:?}");
        assert_eq!(
            warden_sandbox::tool_specs().iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            warden_sandbox::TOOL_NAMES
        );
        sb.shutdown().await.unwrap();
    }
}

mod confinement {
    use super::*;

    fn refused(r: Result<ToolOutput, SandboxError>, what: &str) {
        match r {
            Err(SandboxError::PathOutsideWorkspace { path, resolved }) => {
                let msg = SandboxError::PathOutsideWorkspace { path: path.clone(), resolved }.to_string();
                assert!(msg.contains(&path) && msg.contains("outside the workspace"), "{msg}");
            }
            other => panic!("{what} was not refused: {other:?}"),
        }
    }

    pub async fn escapes_are_refused(c: Ctx) {
        let sb = c.sandbox();
        let k = key("esc");
        let call = |tool: &'static str, input: Value| {
            let sb = sb.clone();
            let k = k.clone();
            async move { sb.call_tool(&k, tool, input, &[]).await }
        };
        refused(call("Read", json!({"file_path": "../../etc/passwd"})).await, "../../etc/passwd");
        refused(call("Read", json!({"file_path": "/etc/shadow"})).await, "/etc/shadow");
        refused(call("Read", json!({"file_path": "/workspace/../etc/passwd"})).await, "/workspace/../etc/passwd");
        refused(call("Write", json!({"file_path": "/tmp/x", "content": "x"})).await, "Write /tmp/x");
        refused(call("Glob", json!({"pattern": "*", "path": "/"})).await, "Glob /");
        refused(call("Grep", json!({"pattern": "root", "path": "../"})).await, "Grep ../");
        bash_ok(&sb, &k, "ln -s / rootlink && ln -s /etc/passwd pw && mkdir -p d && ln -s /tmp d/tmplink").await;
        refused(call("Read", json!({"file_path": "rootlink/etc/passwd"})).await, "symlink to /");
        refused(call("Read", json!({"file_path": "pw"})).await, "symlink to /etc/passwd");
        refused(call("Write", json!({"file_path": "d/tmplink/evil", "content": "x"})).await, "write via symlink");
        refused(
            call("Edit", json!({"file_path": "pw", "old_string": "root", "new_string": "toor"})).await,
            "edit via symlink",
        );
        refused(call("Grep", json!({"pattern": "root", "path": "rootlink"})).await, "grep via symlink");
        assert!(matches!(
            sb.download_file(&k, "rootlink/etc/hostname").await,
            Err(SandboxError::PathOutsideWorkspace { .. })
        ));
        assert!(matches!(sb.upload_file(&k, "../x", b"x").await, Err(SandboxError::PathOutsideWorkspace { .. })));
        // Nothing was created outside.
        assert_eq!(
            bash_ok(&sb, &k, "ls /tmp/evil 2>&1; ls /tmp/x 2>&1; true").await.matches("No such file").count(),
            2
        );
        // Symlinks within the workspace are fine.
        bash_ok(&sb, &k, "echo inside > real.txt && ln -s real.txt alias.txt").await;
        let r = tool(&sb, &k, "Read", json!({"file_path": "alias.txt"})).await;
        assert_eq!(r.content, "     1\tinside\n");
        sb.shutdown().await.unwrap();
    }
}

mod file_bounds {
    use super::*;

    /// The file tools read nothing without bound into the host: a link to a device or to
    /// /proc is outside the workspace, a FIFO is no regular file (and never blocks), and a
    /// sparse file far over the limits is refused by its size before a byte is read.
    pub async fn devices_fifos_and_huge_files_are_never_read_unbounded(c: Ctx) {
        let sb = c.sandbox_with(|cfg| cfg.warm_pool = 0);
        let k = key("bounds");
        bash_ok(&sb, &k, "ln -s /dev/zero zero && ln -s /proc/self/environ env && mkfifo pipe && truncate -s 100G big")
            .await;
        for link in ["zero", "env"] {
            let r = sb.call_tool(&k, "Read", json!({"file_path": link}), &[]).await;
            assert!(matches!(r, Err(SandboxError::PathOutsideWorkspace { .. })), "{link}: {r:?}");
            let r = sb.download_file(&k, link).await;
            assert!(matches!(r, Err(SandboxError::PathOutsideWorkspace { .. })), "{link}: {r:?}");
        }
        let started = Instant::now();
        let r = tool(&sb, &k, "Read", json!({"file_path": "pipe"})).await;
        assert!(r.is_error && r.content.contains("fifo"), "{}", r.content);
        assert!(matches!(sb.download_file(&k, "pipe").await, Err(SandboxError::File { .. })));
        assert!(started.elapsed() < Duration::from_secs(30), "a FIFO blocked the call");
        let r = tool(&sb, &k, "Read", json!({"file_path": "big"})).await;
        assert!(r.is_error && r.content.contains("limit"), "{}", r.content);
        let r = tool(&sb, &k, "Edit", json!({"file_path": "big", "old_string": "a", "new_string": "b"})).await;
        assert!(r.is_error && r.content.contains("limit"), "{}", r.content);
        match sb.download_file(&k, "big").await {
            Err(SandboxError::File { message, .. }) => assert!(message.contains("larger than"), "{message}"),
            other => panic!("a 100 GiB download was not refused: {:?}", other.map(|d| d.len())),
        }
        sb.shutdown().await.unwrap();
    }
}

mod limits {
    use super::*;

    /// The container of session `k` runs as hardened; returns its `docker inspect`.
    async fn assert_hardened(sb: &Sandbox, k: &SessionKey) -> Value {
        assert_eq!(bash_ok(sb, k, "id -u; id -g").await, "1000\n1000\n");
        assert!(bash_ok(sb, k, "grep CapEff /proc/self/status").await.contains("0000000000000000"));
        // prctl(PR_GET_NO_NEW_PRIVS): gVisor's /proc/<pid>/status has no NoNewPrivs line.
        let nnp = "python3 -c 'import ctypes; print(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))'";
        assert_eq!(bash_ok(sb, k, nnp).await, "1\n", "no new privileges");
        // Read-only root: as the mount says (gVisor checks the user's permission on /etc
        // before the file system's, so the write fails with EACCES there first).
        let o = bash(sb, k, "touch /etc/evil").await;
        assert!(
            o.is_error && (o.content.contains("Read-only file system") || o.content.contains("Permission denied")),
            "{}",
            o.content
        );
        let root = bash_ok(sb, k, "awk '$2 == \"/\" { print $4 }' /proc/mounts").await;
        assert!(root.starts_with("ro,"), "the root file system is mounted read-only: {root}");
        assert!(bash(sb, k, "test -e /var/run/docker.sock || test -e /run/docker.sock").await.is_error);
        let id = container_of(sb, k).await;
        let j: Value = serde_json::from_str(&docker(&["inspect", &id])).unwrap();
        let h = &j[0]["HostConfig"];
        assert_eq!(h["CapDrop"], json!(["ALL"]));
        assert_eq!(h["ReadonlyRootfs"], json!(true));
        assert_eq!(h["NetworkMode"], json!("none"));
        assert_eq!(h["PidsLimit"], json!(256));
        assert_eq!(h["Memory"], json!(512 * 1024 * 1024));
        assert_eq!(h["MemorySwap"], h["Memory"], "no swap: the memory limit is real");
        assert_eq!(h["IpcMode"], json!("private"));
        assert_eq!(h["NanoCpus"], json!(1_000_000_000));
        assert_eq!(h["Init"], json!(true));
        assert_eq!(h["Privileged"], json!(false));
        assert!(h["SecurityOpt"].to_string().contains("no-new-privileges"));
        let runtime = sb.config().runtime.clone().unwrap_or_else(|| "runc".into());
        assert_eq!(h["Runtime"], json!(runtime), "the configured runtime");
        // Root with SETUID/SETGID only, for the agents' drop to 1000:1000 (checked above).
        assert_eq!(j[0]["Config"]["User"], json!("0:0"));
        assert_eq!(h["CapAdd"], json!(["SETUID", "SETGID"]));
        let mounts = j[0]["Mounts"].as_array().unwrap();
        assert_eq!(mounts.len(), 1, "only the workspace volume: {mounts:?}");
        assert_eq!(mounts[0]["Destination"], json!("/workspace"));
        assert_eq!(mounts[0]["Type"], json!("volume"));
        assert_eq!(j[0]["Config"]["Labels"]["warden.managed"], json!("true"));
        j
    }

    /// A cold session container and one from the warm pool: the same hardening, and each
    /// names its session (labels for the cold one; for the pooled one, whose labels were
    /// fixed before it had a session, its name and the binding volume).
    pub async fn hardening_is_applied(c: Ctx) {
        let k = key("hard");
        let cold_ctx = c.scoped(format!("{}cold", c.scope));
        let cold_sb = cold_ctx.sandbox_with(|cfg| cfg.warm_pool = 0);
        let cold = assert_hardened(&cold_sb, &k).await;
        let labels = &cold[0]["Config"]["Labels"];
        assert_eq!(labels["warden.session"], json!("hard"));
        assert_eq!(labels["warden.user"], json!("tester"));
        assert_eq!(labels["warden.pool"], Value::Null);

        let sb = c.sandbox_with(|cfg| cfg.warm_pool = 2);
        sb.connect().await.unwrap();
        pool_ready(&sb, 2).await;
        let warm = assert_hardened(&sb, &k).await;
        assert_eq!(sb.metrics().warm_pool_hits_total, 1, "{:?}", sb.metrics());
        let labels = &warm[0]["Config"]["Labels"];
        assert_eq!(labels["warden.pool"], json!("true"));
        assert_eq!(labels["warden.session"], Value::Null);
        let name = |j: &Value| j[0]["Name"].as_str().unwrap().trim_start_matches('/').to_string();
        // Renamed to the session's own name, the form a cold container has.
        assert_eq!(name(&cold), warden_sandbox::container::names(&cold_ctx.scope, &k).container);
        assert_eq!(name(&warm), warden_sandbox::container::names(&c.scope, &k).container);
        let binding = docker(&[
            "volume",
            "ls",
            "--filter",
            &format!("label=warden.scope={}", c.scope),
            "--filter",
            "label=warden.binding=true",
            "--format",
            "{{.Label \"warden.user\"}}/{{.Label \"warden.session\"}}",
        ]);
        assert_eq!(binding, "tester/hard\n");
        // Everything but labels, names and the workspace volume's name is the same.
        for part in ["HostConfig", "Config"] {
            let strip = |j: &Value| {
                let mut v = j[0][part].clone();
                for volatile in ["Labels", "Hostname", "Mounts"] {
                    v.as_object_mut().unwrap().remove(volatile);
                }
                v
            };
            assert_eq!(strip(&warm), strip(&cold), "{part} of a pooled and a cold container");
        }
        sb.shutdown().await.unwrap();
        cold_sb.shutdown().await.unwrap();
    }

    pub async fn a_dropped_call_kills_its_command(c: Ctx) {
        let sb = c.sandbox();
        let k = key("dropcancel");
        bash_ok(&sb, &k, "true").await;
        // The caller gives up (task canceled): the future is dropped mid-exec.
        let call = sb.call_tool(&k, "Bash", json!({"command": "sleep 1000 & sleep 1000", "timeout": 600000}), &[]);
        assert!(tokio::time::timeout(Duration::from_secs(2), call).await.is_err(), "sleep returned early");
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let left = procs_starting_with(&sb, &k, "sleep 1000").await;
            if left.is_empty() {
                break;
            }
            assert!(Instant::now() < until, "a canceled command kept running: {left}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(bash_ok(&sb, &k, "echo fine").await, "fine\n", "the session still works");
        sb.shutdown().await.unwrap();
    }

    /// Regression (CI, issue 42's last run): a command whose agent the host had to kill (it
    /// overran its deadline, or the command killed its agent) was reported as "[not run: ;
    /// the shell is back in /workspace, run it again]" and the session's directory was
    /// reset: it ran, and was killed. Both ways of being killed are reported as such, and
    /// the shell stays where it was. Positive control: each command really started (its
    /// mark file exists).
    pub async fn regression_a_killed_command_was_reported_as_not_run(c: Ctx) {
        let sb = c.sandbox();
        let k = key("killed-report");
        bash_ok(&sb, &k, "mkdir -p /workspace/sub && cd /workspace/sub").await;
        // The command kills its agent: the host sees the agent die mid-request.
        let o = bash(&sb, &k, "touch /workspace/ran-1; kill -9 $PPID; sleep 5").await;
        assert!(o.is_error && o.content.contains("[exit code: 137"), "{}", o.content);
        assert!(!o.content.contains("not run"), "{}", o.content);
        // The command stops its agent, whose own timeout then never fires: the host's
        // deadline kills it.
        let o = tool(
            &sb,
            &k,
            "Bash",
            json!({"command": "touch /workspace/ran-2; kill -STOP $PPID; sleep 1000", "timeout": 1000}),
        )
        .await;
        assert!(o.is_error && o.content.contains("[timed out after 1000 ms"), "{}", o.content);
        assert!(!o.content.contains("not run"), "{}", o.content);
        assert_eq!(
            bash_ok(&sb, &k, "ls /workspace/ran-1 /workspace/ran-2 >/dev/null && pwd").await,
            "/workspace/sub\n"
        );
        assert_eq!(procs_starting_with(&sb, &k, "sleep 1000").await, "", "the overrun command was killed");
        sb.shutdown().await.unwrap();
    }

    pub async fn timeout_kills_children(c: Ctx) {
        let sb = c.sandbox();
        let k = key("timeout");
        let started = Instant::now();
        let o =
            tool(&sb, &k, "Bash", json!({"command": "echo before; sleep 1000 & sleep 1000", "timeout": 1500})).await;
        assert!(o.is_error && o.content.contains("timed out"), "{}", o.content);
        assert!(o.content.starts_with("before\n"), "output before the timeout is kept: {}", o.content);
        assert!(started.elapsed() < Duration::from_secs(15), "took {:?}", started.elapsed());
        // A command ignoring TERM is KILLed after the grace period, children too.
        let o =
            tool(&sb, &k, "Bash", json!({"command": "trap '' TERM; sleep 1000 & sleep 1000", "timeout": 1000})).await;
        assert!(o.is_error && o.content.contains("timed out"), "{}", o.content);
        assert_eq!(procs_starting_with(&sb, &k, "sleep 1000").await, "", "no sleep left behind");
        // A background job does not hold the call open, and ends with it.
        let t0 = Instant::now();
        assert_eq!(bash_ok(&sb, &k, "sleep 1000 & echo started").await, "started\n");
        assert!(t0.elapsed() < Duration::from_secs(10), "took {:?}", t0.elapsed());
        assert_eq!(procs_starting_with(&sb, &k, "sleep 1000").await, "", "background job ended with its call");
        // The session still works, state intact.
        assert_eq!(bash_ok(&sb, &k, "echo fine").await, "fine\n");
        sb.shutdown().await.unwrap();
    }

    pub async fn fork_bomb_is_contained(c: Ctx) {
        let sb = c.sandbox();
        let k = key("forkbomb");
        let o = tool(&sb, &k, "Bash", json!({"command": "bomb() { bomb | bomb & }; bomb", "timeout": 5000})).await;
        // Whatever the bomb reports, it must end and the host must be unaffected.
        let _ = o;
        assert!(Command::new("true").status().unwrap().success(), "host can still fork");
        // The session recovers (the group was killed) or is recreated.
        let mut alive = String::new();
        for _ in 0..20 {
            let r = bash(&sb, &k, "echo alive").await;
            if !r.is_error {
                alive = r.content;
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert_eq!(alive, "alive\n");
        let n: usize = bash_ok(&sb, &k, "ls -d /proc/[0-9]* | wc -l").await.trim().parse().unwrap();
        assert!(n < 20, "bomb processes left: {n}");
        sb.shutdown().await.unwrap();
    }

    pub async fn network_is_off(c: Ctx) {
        let sb = c.sandbox();
        let k = key("net");
        let o = bash(
            &sb,
            &k,
            "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=3); print('CONNECTED')\"",
        )
        .await;
        assert!(o.is_error && !o.content.contains("CONNECTED"), "{}", o.content);
        assert!(o.content.contains("unreachable") || o.content.contains("Errno"), "{}", o.content);
        // The interfaces the sandbox has (gVisor has no /sys/class/net): loopback only.
        let interfaces = "python3 -c 'import socket; print(*[n for _, n in socket.if_nameindex()])'";
        assert_eq!(bash_ok(&sb, &k, interfaces).await.trim(), "lo");
        sb.shutdown().await.unwrap();
    }

    pub async fn memory_hog_is_killed(c: Ctx) {
        let sb = c.sandbox_with(|cfg| cfg.memory = warden_sandbox::ByteSize(128 * 1024 * 1024));
        let k = key("memhog");
        bash_ok(&sb, &k, "echo kept > before.txt").await;
        let hog = json!({"command": "python3 -c \"x = b'a' * (1024 * 1024 * 1024); print('ALLOCATED')\""});
        match (c.runtime, sb.call_tool(&k, "Bash", hog, &[]).await) {
            // runc: the kernel's OOM killer ends the process inside the container.
            (_, Ok(o)) => {
                assert!(o.is_error && !o.content.lines().any(|l| l == "ALLOCATED"), "{}", o.content);
                assert!(o.content.contains("137") || o.content.contains("MemoryError"), "{}", o.content);
            }
            // gVisor: the memory limit is the whole sandbox's (its kernel included), so the
            // OOM kill ends the container; the call fails saying so and the next one gets a
            // new container on the same workspace.
            (Some(GVISOR), Err(e)) => assert!(e.to_string().contains("container was replaced"), "{e}"),
            (_, Err(e)) => panic!("the hog's call failed instead of reporting the kill: {e}"),
        }
        assert_eq!(bash_ok(&sb, &k, "echo still here; cat before.txt").await, "still here\nkept\n");
        sb.shutdown().await.unwrap();
    }
}

mod sessions {
    pub use super::runtime::{
        a_session_under_another_runtime_is_a_session_of_its_own, an_unregistered_runtime_is_refused_by_name,
    };
    use super::*;

    pub async fn reuse_and_concurrent_first_use(c: Ctx) {
        let sb = c.sandbox();
        let k = key("concurrent");
        let calls = (0..8).map(|i| {
            let sb = sb.clone();
            let k = k.clone();
            tokio::spawn(async move { bash_ok(&sb, &k, &format!("echo {i} > f{i}; echo ok")).await })
        });
        for r in futures_util::future::join_all(calls).await {
            assert_eq!(r.unwrap(), "ok\n");
        }
        let id = container_of(&sb, &k).await;
        assert_eq!(sb.metrics().sessions_created_total, 1);
        assert_eq!(bash_ok(&sb, &k, "ls f* | wc -l").await.trim(), "8");
        assert_eq!(container_of(&sb, &k).await, id, "reused");
        let m = sb.metrics();
        assert_eq!(m.sessions_active, 1);
        assert!(
            m.execs_total >= 9 && m.exec_latency_count == m.execs_total && m.exec_latency_seconds_sum > 0.0,
            "{m:?}"
        );
        assert!(m.to_prometheus().contains("warden_sandbox_execs_total"));
        let info = sb.list_sessions().await.unwrap().into_iter().find(|i| i.key == k).unwrap();
        assert!(info.owned_here && info.last_used.is_some() && info.state == "running", "{info:?}");
        sb.shutdown().await.unwrap();
        assert!(matches!(sb.call_tool(&k, "Bash", json!({"command": "true"}), &[]).await, Err(SandboxError::ShutDown)));
    }

    pub async fn twenty_sessions_are_isolated(c: Ctx) {
        let sb = c.sandbox();
        let tasks = (0..20).map(|i| {
            let sb = sb.clone();
            tokio::spawn(async move {
                let k = SessionKey::new(format!("user{i}"), "iso");
                let w = tool(
                    &sb,
                    &k,
                    "Write",
                    json!({"file_path": format!("secret-{i}.txt"), "content": format!("secret of {i}")}),
                )
                .await;
                assert!(!w.is_error, "{}", w.content);
                (i, k)
            })
        });
        let keys: Vec<(usize, SessionKey)> =
            futures_util::future::join_all(tasks).await.into_iter().map(|r| r.unwrap()).collect();
        let checks = keys.into_iter().map(|(i, k)| {
            let sb = sb.clone();
            tokio::spawn(async move {
                let listing = bash_ok(&sb, &k, "ls -A /workspace").await;
                assert_eq!(listing, format!("secret-{i}.txt\n"), "session {i} sees only its own files");
                let g = tool(&sb, &k, "Grep", json!({"pattern": "secret of"})).await;
                assert_eq!(g.content, format!("Found 1 file\n/workspace/secret-{i}.txt"));
            })
        });
        for r in futures_util::future::join_all(checks).await {
            r.unwrap();
        }
        assert_eq!(sb.metrics().sessions_active, 20);
        sb.shutdown().await.unwrap();
    }

    pub async fn max_sessions_is_enforced(c: Ctx) {
        let sb = c.sandbox_with(|cfg| cfg.max_sessions = 2);
        bash_ok(&sb, &key("m1"), "true").await;
        bash_ok(&sb, &key("m2"), "true").await;
        let e = sb.call_tool(&key("m3"), "Bash", json!({"command": "true"}), &[]).await;
        match e {
            Err(e @ SandboxError::TooManySessions { max: 2 }) => {
                assert!(e.to_string().contains("max_sessions"))
            }
            other => panic!("expected TooManySessions, got {other:?}"),
        }
        assert!(sb.end_session(&key("m1")).await.unwrap());
        bash_ok(&sb, &key("m3"), "true").await;
        sb.shutdown().await.unwrap();
    }

    /// Regression (second-tenant attack on main): one user could take every session of
    /// `max_sessions`, so no other user got a sandbox. Past `max_sessions_per_user` that
    /// user's new session fails with an error naming the key; another user's still starts,
    /// and the user's existing sessions keep working.
    pub async fn one_user_cannot_take_every_session(c: Ctx) {
        let sb = c.sandbox_with(|cfg| {
            cfg.max_sessions = 4;
            cfg.max_sessions_per_user = 2;
            cfg.warm_pool = 0;
        });
        let greedy = |s: &str| SessionKey::new("greedy", s);
        bash_ok(&sb, &greedy("g1"), "true").await;
        bash_ok(&sb, &greedy("g2"), "true").await;
        match sb.call_tool(&greedy("g3"), "Bash", json!({"command": "true"}), &[]).await {
            Err(e @ SandboxError::TooManyUserSessions { max: 2, .. }) => {
                let text = e.to_string();
                assert!(text.contains("sandbox.max_sessions_per_user") && text.contains("greedy"), "{text}");
            }
            other => panic!("expected TooManyUserSessions, got {other:?}"),
        }
        assert!(sb.upload_file(&greedy("g4"), "f", b"x").await.is_err(), "no path around the limit");
        bash_ok(&sb, &key("other"), "true").await;
        bash_ok(&sb, &greedy("g1"), "true").await;
        assert_eq!(sb.metrics().sessions_active, 3);
        assert!(sb.end_session(&greedy("g1")).await.unwrap());
        bash_ok(&sb, &greedy("g3"), "true").await;
        sb.shutdown().await.unwrap();
    }

    /// With the warm pool on (the default), so the reaped container is a pooled one.
    pub async fn idle_sessions_are_reaped(c: Ctx) {
        let sb = c.sandbox_with(|cfg| cfg.idle_ttl = Duration::from_secs(2));
        let k = key("idle");
        bash_ok(&sb, &k, "echo x > f").await;
        let id = container_of(&sb, &k).await;
        let volumes = volumes_of_session(&c.scope, &id, &k);
        assert_eq!(volumes.len(), 3, "workspace, disk and binding: {volumes:?}");
        // Reaped within the TTL plus a sweep interval; removing the workspace disk runs a
        // helper container, which takes a while on a busy engine: poll, with a generous cap.
        let reaped_by = Instant::now() + Duration::from_secs(30);
        let (mut left, mut vols);
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            left = container_exists(&id);
            vols = volumes_of_scope(&c.scope);
            vols.retain(|v| volumes.contains(v));
            if (!left && vols.is_empty()) || Instant::now() > reaped_by {
                break;
            }
        }
        assert!(!left, "container reaped");
        assert_eq!(vols, Vec::<String>::new(), "volumes reaped");
        assert_eq!(sb.metrics().sessions_active, 0);
        // A new call starts afresh.
        assert_eq!(bash_ok(&sb, &k, "ls").await, "");
        sb.shutdown().await.unwrap();
    }

    /// Pool off, so that nothing at all may be left in the scope (with the pool:
    /// `pool::an_ended_session_is_gone_and_never_handed_out_again`).
    pub async fn end_session_removes_everything(c: Ctx) {
        let sb = c.sandbox_with(|cfg| cfg.warm_pool = 0);
        let k = key("end");
        bash_ok(&sb, &k, "echo x > f").await;
        assert!(sb.end_session(&k).await.unwrap());
        let label = format!("label=warden.scope={}", c.scope);
        assert_eq!(docker(&["ps", "-aq", "--filter", &label]).trim(), "");
        assert_eq!(docker(&["volume", "ls", "-q", "--filter", &label]).trim(), "");
        sb.shutdown().await.unwrap();
    }

    /// Regression: a container or volume planted under a session's (predictable) names —
    /// another warden's on the engine (another scope), or made by hand — was adopted as the
    /// session's (the volume attached as its workspace) or removed to make room. Now its
    /// labels must prove it this scope's and this session's: anything else is refused and
    /// left as it was, by a cold start, by a pool hand-out and by ending the session.
    pub async fn regression_planted_objects_under_a_sessions_names_are_never_adopted(c: Ctx) {
        let names = |k: &SessionKey| warden_sandbox::container::names(&c.scope, k);
        let elsewhere = format!("warden.scope={}x", c.scope);
        // Labelled as the same session of another warden (scope), or not labelled at all.
        let foreign = |k: &SessionKey| -> Vec<String> {
            let (user, session) = (format!("warden.user={}", k.user_id), format!("warden.session={}", k.session_id));
            ["warden.managed=true", &elsewhere, &user, &session]
                .iter()
                .flat_map(|l| ["--label".into(), l.to_string()])
                .collect()
        };
        let not_owned = |r: Result<ToolOutput, SandboxError>, object: warden_sandbox::DockerObject, name: &str| match r
        {
            Err(e @ SandboxError::NotOwned { .. }) => {
                assert!(
                    matches!(&e, SandboxError::NotOwned { object: o, name: n } if *o == object && n == name),
                    "{e}"
                );
                assert!(e.to_string().contains(name), "{e}");
            }
            other => panic!("a planted {object} {name} was not refused: {other:?}"),
        };
        let run = |args: Vec<String>| docker(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let cold = c.sandbox_with(|cfg| cfg.warm_pool = 0);
        let pooled = c.sandbox();

        // A container holding the session's name.
        for labelled in [true, false] {
            let k = key(&format!("planted-container-{labelled}"));
            let name = names(&k).container;
            let labels = if labelled { foreign(&k) } else { Vec::new() };
            let create = ["create".to_string(), "--name".into(), name.clone()].into_iter().chain(labels);
            let planted = run(create.chain(["warden-sandbox:bookworm".into(), "true".into()]).collect());
            let planted = planted.trim();
            for sb in [&cold, &pooled] {
                let r = sb.call_tool(&k, "Bash", json!({"command": "echo hi"}), &[]).await;
                not_owned(r, warden_sandbox::DockerObject::Container, &name);
                assert!(container_exists(planted), "the planted container was removed");
            }
            assert!(matches!(cold.end_session(&k).await, Err(SandboxError::NotOwned { .. })));
            assert!(container_exists(planted), "ending the session removed the planted container");
            docker(&["rm", "-f", planted]);
        }

        // A workspace volume holding the session's name.
        for labelled in [true, false] {
            let k = key(&format!("planted-volume-{labelled}"));
            let volume = names(&k).volume;
            let labels = if labelled { foreign(&k) } else { Vec::new() };
            run(["volume".to_string(), "create".into()].into_iter().chain(labels).chain([volume.clone()]).collect());
            let r = cold.call_tool(&k, "Bash", json!({"command": "echo hi"}), &[]).await;
            not_owned(r, warden_sandbox::DockerObject::Volume, &volume);
            assert!(matches!(cold.end_session(&k).await, Err(SandboxError::NotOwned { .. })));
            assert_eq!(docker(&["volume", "inspect", "--format", "{{.Name}}", &volume]).trim(), volume, "removed");
            docker(&["volume", "rm", &volume]);
        }

        // A binding volume claiming the session for another warden: no pool container is
        // handed out under it (the session starts cold instead; never bound).
        let k = key("planted-binding");
        let binding = names(&k).binding;
        let args = ["volume".to_string(), "create".into(), "--label".into(), "warden.binding=true".into()];
        run(args.into_iter().chain(foreign(&k)).chain([binding.clone()]).collect());
        pool_ready(&pooled, 2).await;
        assert_eq!(bash_ok(&pooled, &k, "echo hi").await, "hi\n");
        assert_eq!(pooled.metrics().warm_pool_hits_total, 0, "handed out under a foreign binding");
        let labels = docker(&["volume", "inspect", "--format", "{{json .Labels}}", &binding]);
        assert!(
            labels.contains(&elsewhere[elsewhere.find('=').unwrap() + 1..]),
            "the planted binding changed: {labels}"
        );
        assert!(matches!(pooled.end_session(&k).await, Err(SandboxError::NotOwned { .. })));
        docker(&["volume", "rm", &binding]);

        // Nothing planted was needed for an ordinary session meanwhile.
        bash_ok(&cold, &key("ordinary"), "true").await;
        cold.shutdown().await.unwrap();
        pooled.shutdown().await.unwrap();
    }

    /// Regression: container names were the first 24 characters of each id plus a 64-bit
    /// FNV-1a hash, so these two users (found by a rho search) of one session id got one
    /// name in scope `t`: the second tenant's calls ran in the first one's container and
    /// read its files. Names are a SHA-256 of the whole (scope, user, session) now.
    /// The collision holds in scope `t` only (the scope was hashed too), so this test uses
    /// that scope rather than its own; it removes everything it made (and a leftover of an
    /// aborted run is adopted or removed by the next).
    pub async fn regression_two_tenants_whose_old_names_collided_get_two_containers(_: Ctx) {
        let sb = Ctx { scope: "t".into(), runtime: None, pooled: false }.sandbox_with(|cfg| cfg.warm_pool = 0);
        let a = SessionKey::new("tenant-aaaaaaaaaaaaaaaaa9e7a2e0a57f47f8c", "s");
        let b = SessionKey::new("tenant-aaaaaaaaaaaaaaaaa60a3fe52f75f5632", "s");
        bash_ok(&sb, &a, "echo secret-of-a > mine.txt").await;
        assert_eq!(bash_ok(&sb, &b, "cat mine.txt 2>/dev/null || echo none").await, "none\n");
        assert_ne!(container_of(&sb, &a).await, container_of(&sb, &b).await);
        sb.shutdown().await.unwrap();
    }

    pub async fn killed_container_is_recreated(c: Ctx) {
        let sb = c.sandbox();
        let k = key("killed");
        bash_ok(&sb, &k, "echo survived > keep.txt").await;
        let first = container_of(&sb, &k).await;
        docker(&["kill", &first]);
        assert_eq!(bash_ok(&sb, &k, "cat keep.txt").await, "survived\n", "volume kept");
        let second = container_of(&sb, &k).await;
        assert_ne!(first, second);
        docker(&["rm", "-f", &second]);
        let r = tool(&sb, &k, "Read", json!({"file_path": "keep.txt"})).await;
        assert_eq!(r.content, "     1\tsurvived\n");
        assert_eq!(sb.metrics().containers_recreated_total, 2);
        sb.shutdown().await.unwrap();
    }

    pub async fn orphans_are_adopted_or_removed(c: Ctx) {
        let k_run = key("orphan-running");
        let k_stop = key("orphan-stopped");
        {
            let crashed = c.sandbox();
            bash_ok(&crashed, &k_run, "echo from-before > carry.txt").await;
            bash_ok(&crashed, &k_stop, "true").await;
            let stopped = container_of(&crashed, &k_stop).await;
            docker(&["stop", "-t", "0", &stopped]);
            // No pool container half-made when it goes (one would remove itself, later).
            pool_ready(&crashed, 2).await;
            // Dropped without shutdown: the host "crashed".
        }
        // Without room for paused sessions, the stopped one is removed (with room, it is
        // adopted paused: `lifecycle::regression_a_paused_session_was_removed_…`).
        let restarted = c.sandbox_with(|cfg| cfg.max_paused_sessions = 0);
        restarted.connect().await.unwrap();
        let sessions: Vec<_> =
            restarted.list_sessions().await.unwrap().into_iter().filter(|s| s.scope == c.scope).collect();
        assert_eq!(sessions.len(), 1, "stopped orphan removed, running one adopted: {sessions:?}");
        assert!(sessions[0].owned_here && sessions[0].key == k_run);
        assert_eq!(bash_ok(&restarted, &k_run, "cat carry.txt").await, "from-before\n");
        assert_eq!(restarted.metrics().sessions_created_total, 0, "adopted, not recreated");
        restarted.shutdown().await.unwrap();
    }

    /// The stopped container is a pooled one (the pool is on): its volumes are found by
    /// what it mounts; the pool's own containers stay.
    pub async fn prune_removes_leftovers(c: Ctx) {
        let sb = c.sandbox();
        let k = key("prune");
        bash_ok(&sb, &k, "true").await;
        let id = container_of(&sb, &k).await;
        let volumes = volumes_of_session(&c.scope, &id, &k);
        pool_ready(&sb, 2).await;
        let pool = pooled(&c.scope);
        docker(&["stop", "-t", "0", &id]);
        // Another host (different scope, idle TTL 1 s) prunes once the container exited
        // longer ago than that TTL: the stopped container and its volume go.
        let other = c.scoped(format!("{}-o", c.scope)).sandbox_with(|cfg| cfg.idle_ttl = Duration::from_secs(1));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let report = other.prune().await.unwrap();
        assert!(report.containers.iter().any(|n| n.contains(&c.scope)), "{report:?}");
        for v in &volumes {
            assert!(report.volumes.contains(v), "{v} pruned: {report:?}");
        }
        assert!(!container_exists(&id));
        assert_eq!(pooled(&c.scope), pool, "the running pool is no leftover");
        other.shutdown().await.unwrap();
        sb.shutdown().await.unwrap();
    }

    /// Regression: prune removed every exited container with its workspace, so a live host
    /// whose session container's main process had just died recreated that session on an
    /// empty workspace. One that exited within the pruner's idle TTL stays, volumes and all.
    pub async fn prune_keeps_a_session_that_exited_recently(c: Ctx) {
        let sb = c.sandbox();
        let k = key("prune-young");
        bash_ok(&sb, &k, "echo kept > keep.txt").await;
        let id = container_of(&sb, &k).await;
        let volumes = volumes_of_session(&c.scope, &id, &k);
        docker(&["stop", "-t", "0", &id]);
        let other = c.scoped(format!("{}-o", c.scope)).sandbox();
        let report = other.prune().await.unwrap();
        assert!(
            !report.containers.iter().any(|n| n.contains(&c.scope)),
            "a container that exited just now was pruned: {report:?}"
        );
        for v in &volumes {
            assert!(!report.volumes.contains(v), "{v} pruned: {report:?}");
        }
        assert!(container_exists(&id));
        // The live host recreates the container on the same workspace.
        assert_eq!(bash_ok(&sb, &k, "cat keep.txt").await, "kept\n");
        other.shutdown().await.unwrap();
        sb.shutdown().await.unwrap();
    }

    pub async fn docker_unavailable_is_clear(c: Ctx) {
        let sb = c.sandbox_with(|cfg| cfg.docker_host = Some("unix:///nonexistent/docker.sock".into()));
        let e = sb.call_tool(&key("nodocker"), "Bash", json!({"command": "true"}), &[]).await;
        match e {
            Err(e @ SandboxError::DockerUnavailable(_)) => {
                let m = e.to_string();
                assert!(m.contains("Docker is unavailable") && m.contains("text-only subagents keep working"), "{m}");
            }
            other => panic!("expected DockerUnavailable, got {other:?}"),
        }
        sb.shutdown().await.unwrap();
    }

    pub async fn missing_image_is_clear(c: Ctx) {
        let sb = c.sandbox_with(|cfg| cfg.image = "warden-sandbox:no-such-tag".into());
        let e = sb.call_tool(&key("noimage"), "Bash", json!({"command": "true"}), &[]).await;
        match e {
            Err(e @ SandboxError::ImageMissing { .. }) => {
                let m = e.to_string();
                assert!(m.contains("cargo xtask build") && m.contains("docker import"), "{m}");
            }
            other => panic!("expected ImageMissing, got {other:?}"),
        }
        // The failed session does not count against the limit.
        assert_eq!(sb.metrics().sessions_active, 0);
        sb.shutdown().await.unwrap();
    }
}

/// Issue 17 item 3: the warm pool of hardened, never-used containers.
/// Pause and resume (`sandbox.pause_after`, `Sandbox::pause_session`): a paused session
/// runs no container and keeps its workspace; the next call starts it again. Forks
/// (`Sandbox::fork_session`): a new session on a copy of another's workspace.
mod lifecycle {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// The Docker state of a container (`running`, `exited`, ...).
    fn state_of(id: &str) -> String {
        docker(&["inspect", "--format", "{{.State.Status}}", id]).trim().to_string()
    }

    /// Processes of the sandbox's container whose command line contains `needle`
    /// (read from /proc by a root exec, not through the tools).
    fn procs_with(id: &str, needle: &str) -> Vec<String> {
        // The needle's last character in brackets: the script's own command line does not match.
        let (head, last) = needle.split_at(needle.len() - 1);
        let script = format!(
            r#"for p in /proc/[0-9]*; do c=$(tr '\0' ' ' 2>/dev/null < "$p/cmdline"); case "$c" in *"{head}"[{last}]*) echo "$c";; esac; done; true"#
        );
        docker(&["exec", "-u", "0", id, "bash", "--norc", "-c", &script]).lines().map(str::to_string).collect()
    }

    /// Waits (up to a generous limit: a busy engine) until `k`'s session is paused.
    async fn until_paused(sb: &Sandbox, k: &SessionKey) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !sb.is_paused(k) {
            assert!(Instant::now() < deadline, "{k} was never paused: {:?}", sb.metrics());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A paused session runs nothing — its container is stopped and the session's
    /// long-running process ended — and keeps its files; the next call starts the same
    /// container again and sees the files, not the process.
    pub async fn a_paused_session_keeps_its_files_and_no_process(c: Ctx) {
        let sb = c.sandbox_with(|cfg| cfg.warm_pool = 0);
        let k = key("pause");
        bash_ok(&sb, &k, "mkdir -p src && echo kept > src/a.txt && head -c 100000 /dev/urandom > blob").await;
        let sum = bash_ok(&sb, &k, "sha256sum blob").await;
        let id = container_of(&sb, &k).await;
        // A process that outlives calls: the session's own (an MCP server's kind).
        let argv: Vec<String> = ["sleep", "31337"].iter().map(|s| s.to_string()).collect();
        let mut process = sb.spawn_process(&k, &argv, &[]).await.expect("session process");
        let deadline = Instant::now() + Duration::from_secs(30);
        while procs_with(&id, "sleep 31337").is_empty() {
            assert!(Instant::now() < deadline, "the session process never ran (positive control)");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(sb.pause_session(&k).await.unwrap(), "it was running");
        assert!(sb.is_paused(&k));
        assert_eq!(state_of(&id), "exited", "no container runs while paused");
        let info = sb.list_sessions().await.unwrap().into_iter().find(|i| i.key == k).unwrap();
        assert!(info.paused && info.owned_here, "{info:?}");
        let m = sb.metrics();
        assert_eq!((m.sessions_active, m.sessions_paused, m.pauses_total), (0, 1, 1), "{m:?}");
        // The process ended with the pause: its output stream is closed.
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), process.stdout.read_to_end(&mut rest))
            .await
            .expect("the session process's stream ends with the pause")
            .unwrap();
        // Pausing again changes nothing.
        assert!(!sb.pause_session(&k).await.unwrap());
        // The next call resumes it: same container, same files, not the process.
        assert_eq!(bash_ok(&sb, &k, "cat src/a.txt").await, "kept\n");
        assert_eq!(bash_ok(&sb, &k, "sha256sum blob").await, sum);
        assert_eq!(container_of(&sb, &k).await, id, "the stopped container was started again");
        assert_eq!(state_of(&id), "running");
        assert!(procs_with(&id, "sleep 31337").is_empty(), "no process survives a pause");
        assert!(!sb.is_paused(&k));
        let m = sb.metrics();
        assert_eq!((m.sessions_active, m.sessions_paused, m.resumes_total), (1, 0, 1), "{m:?}");
        // Tools work as before (a write, an edit, a search).
        let w = tool(&sb, &k, "Write", json!({"file_path": "b.txt", "content": "after"})).await;
        assert!(!w.is_error, "{}", w.content);
        let g = tool(&sb, &k, "Grep", json!({"pattern": "kept"})).await;
        assert_eq!(g.content, "Found 1 file\n/workspace/src/a.txt");
        sb.shutdown().await.unwrap();
    }

    /// Regression: a host that restarted (crashed, or a new deploy) removed the sessions it
    /// had paused, workspaces and all, so a session paused while its task waited for a person
    /// lost its files. A restarted host adopts them still paused — within
    /// `max_paused_sessions`, their idle clock running from when they stopped — and the next
    /// call, a resume or the session's end does what it does to a session it paused itself.
    pub async fn regression_a_paused_session_was_removed_when_its_host_restarted(c: Ctx) {
        let keys = [key("by-call"), key("by-resume"), key("by-end")];
        let mut ids = Vec::new();
        {
            let before = c.sandbox_with(|cfg| cfg.warm_pool = 0);
            for k in &keys {
                bash_ok(&before, k, &format!("echo {} > kept.txt", k.session_id)).await;
                ids.push(container_of(&before, k).await);
                assert!(before.pause_session(k).await.unwrap(), "{k} was running");
            }
            // Dropped without shutdown: the host "crashed" with its sessions paused.
        }
        for id in &ids {
            assert_eq!(state_of(id), "exited", "paused before the restart (positive control)");
        }
        let after = c.sandbox_with(|cfg| cfg.warm_pool = 0);
        after.connect().await.unwrap();
        for k in &keys {
            assert!(after.is_paused(k), "{k} adopted paused");
        }
        let m = after.metrics();
        assert_eq!((m.sessions_active, m.sessions_paused), (0, 3), "{m:?}");
        let info = after.list_sessions().await.unwrap();
        assert!(info.iter().filter(|i| i.scope == c.scope).all(|i| i.paused && i.owned_here), "{info:?}");
        // A call resumes its session: the same container, the files of before.
        assert_eq!(bash_ok(&after, &keys[0], "cat kept.txt").await, "by-call\n");
        assert_eq!(container_of(&after, &keys[0]).await, ids[0], "started again, not recreated");
        assert_eq!(state_of(&ids[0]), "running");
        // So does `resume_session`.
        assert!(after.resume_session(&keys[1]).await.unwrap(), "it was paused");
        assert_eq!(state_of(&ids[1]), "running");
        assert_eq!(bash_ok(&after, &keys[1], "cat kept.txt").await, "by-resume\n");
        let m = after.metrics();
        let counts = (m.sessions_active, m.sessions_paused, m.resumes_total, m.sessions_created_total);
        assert_eq!(counts, (2, 1, 2, 0), "{m:?}");
        // Ending the third removes its container and workspace.
        let ws = volumes_of_session(&c.scope, &ids[2], &keys[2]);
        after.end_session(&keys[2]).await.unwrap();
        assert!(!container_exists(&ids[2]));
        assert!(volumes_of_scope(&c.scope).iter().all(|v| !ws.contains(v)), "{ws:?}");
        assert_eq!(after.metrics().sessions_paused, 0);
        // Controls: a host with room for one paused session adopts one and removes the
        // other's container; with no room for any it removes them all, workspaces too.
        for k in &keys[..2] {
            assert!(after.pause_session(k).await.unwrap());
        }
        drop(after);
        let one = c.sandbox_with(|cfg| {
            cfg.warm_pool = 0;
            cfg.max_paused_sessions = 1;
        });
        one.connect().await.unwrap();
        assert_eq!(keys[..2].iter().filter(|k| one.is_paused(k)).count(), 1, "{:?}", one.metrics());
        assert_eq!(ids[..2].iter().filter(|id| container_exists(id)).count(), 1, "the other removed");
        let kept = keys[..2].iter().find(|k| one.is_paused(k)).unwrap().clone();
        drop(one);
        let none = c.sandbox_with(|cfg| {
            cfg.warm_pool = 0;
            cfg.max_paused_sessions = 0;
        });
        none.connect().await.unwrap();
        assert!(!none.is_paused(&kept));
        assert!(ids.iter().all(|id| !container_exists(id)), "no paused session without room for one");
        assert!(volumes_of_scope(&c.scope).is_empty(), "{:?}", volumes_of_scope(&c.scope));
        none.shutdown().await.unwrap();
    }

    /// `pause_after` pauses an idle session by itself; `idle_ttl` still ends a paused one
    /// (container and workspace removed: the harness checks nothing is left).
    pub async fn idle_sessions_pause_then_end(c: Ctx) {
        let sb = c.sandbox_with(|cfg| {
            cfg.warm_pool = 0;
            cfg.pause_after = Duration::from_secs(1);
            cfg.idle_ttl = Duration::from_secs(8);
        });
        let k = key("auto");
        bash_ok(&sb, &k, "echo x > f").await;
        let id = container_of(&sb, &k).await;
        until_paused(&sb, &k).await;
        assert_eq!(state_of(&id), "exited");
        // Resumed by a call, paused again once idle.
        assert_eq!(bash_ok(&sb, &k, "cat f").await, "x\n");
        until_paused(&sb, &k).await;
        // Ended by idle_ttl while paused.
        let deadline = Instant::now() + Duration::from_secs(60);
        while container_exists(&id) || !volumes_of_scope(&c.scope).is_empty() {
            assert!(Instant::now() < deadline, "the paused session was never ended by idle_ttl");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert!(!sb.is_paused(&k));
        assert_eq!(sb.metrics().sessions_paused, 0);
        sb.shutdown().await.unwrap();
    }

    /// Paused sessions free their room under `max_sessions` (a resume needs it back, with a
    /// clear error until then) and count against `max_paused_sessions` and the disk budget.
    pub async fn paused_sessions_have_limits_of_their_own(c: Ctx) {
        let sb = c.sandbox_with(|cfg| {
            cfg.warm_pool = 0;
            cfg.max_sessions = 1;
            cfg.max_paused_sessions = 1;
        });
        let (a, b) = (key("a"), key("b"));
        bash_ok(&sb, &a, "echo a > f").await;
        assert!(matches!(
            sb.call_tool(&b, "Bash", json!({"command": "true"}), &[]).await,
            Err(SandboxError::TooManySessions { .. })
        ));
        sb.pause_session(&a).await.unwrap();
        // a's room is free now.
        bash_ok(&sb, &b, "echo b > f").await;
        // One paused session is the most: b stays running, with a clear error.
        match sb.pause_session(&b).await {
            Err(e @ SandboxError::TooManyPausedSessions { .. }) => {
                assert!(e.to_string().contains("sandbox.max_paused_sessions"), "{e}")
            }
            other => panic!("expected TooManyPausedSessions, got {other:?}"),
        }
        // a cannot run again while b holds the only room.
        match sb.call_tool(&a, "Bash", json!({"command": "cat f"}), &[]).await {
            Err(SandboxError::TooManySessions { max: 1 }) => {}
            other => panic!("expected TooManySessions, got {other:?}"),
        }
        assert!(sb.is_paused(&a), "a refused resume leaves it paused");
        assert!(sb.end_session(&b).await.unwrap());
        assert_eq!(bash_ok(&sb, &a, "cat f").await, "a\n");
        // Unknown sessions: nothing to pause or resume.
        assert!(matches!(sb.pause_session(&key("nobody")).await, Err(SandboxError::SessionNotFound { .. })));
        assert!(matches!(sb.resume_session(&key("nobody")).await, Err(SandboxError::SessionNotFound { .. })));
        sb.shutdown().await.unwrap();

        // The disk budget: two default-sized workspaces do not fit in one and a half.
        let sb = c.sandbox_with(|cfg| {
            cfg.warm_pool = 0;
            cfg.disk = warden_sandbox::ByteSize(64 * 1024 * 1024);
            cfg.paused_disk_budget = warden_sandbox::ByteSize(96 * 1024 * 1024);
        });
        bash_ok(&sb, &a, "true").await;
        bash_ok(&sb, &b, "true").await;
        sb.pause_session(&a).await.unwrap();
        match sb.pause_session(&b).await {
            Err(e @ SandboxError::TooManyPausedSessions { .. }) => {
                assert!(e.to_string().contains("sandbox.paused_disk_budget"), "{e}")
            }
            other => panic!("expected the disk budget to refuse, got {other:?}"),
        }
        sb.shutdown().await.unwrap();
    }

    /// Fork: twenty forks of one session each see the source's files at the fork, write
    /// their own, and see none of the others' writes; the source is unchanged and keeps
    /// running; the fork shares no process and no shell state; taken ids and unknown
    /// sources are refused.
    /// Regression (review of the shared disk helpers): a fork's copy is attached by its
    /// helper and its first container mounts that device; an end of the fork arriving in
    /// between detached the device, which a cold start beside it could attach to its own
    /// disk by then, and the fork's container would mount that other session's disk. Ends
    /// now wait for the fork's first container. Whatever the order, no two containers ever
    /// mount one device, and a session made afterwards under the fork's key starts empty.
    pub async fn a_fork_ended_while_it_is_made_never_mounts_another_sessions_disk(c: Ctx) {
        const ROUNDS: usize = 4;
        let sb = c.sandbox_with(|cfg| {
            cfg.warm_pool = 0;
            cfg.disk = warden_sandbox::ByteSize(64 * 1024 * 1024);
        });
        let src = key("raced-source");
        bash_ok(&sb, &src, "echo source-only > s.txt").await;
        let mut ended_during = 0;
        for round in 0..ROUNDS {
            let fork = key(&format!("raced-fork-{round}"));
            let bystander = key(&format!("raced-cold-{round}"));
            let making = {
                let (sb, src, fork) = (sb.clone(), src.clone(), fork.clone());
                tokio::spawn(async move { sb.fork_session(&src, &fork).await })
            };
            // The end lands somewhere inside the fork (later each round), beside a cold
            // start whose attach may take any device freed meanwhile.
            tokio::time::sleep(Duration::from_millis(150 * round as u64)).await;
            let cold = {
                let (sb, k) = (sb.clone(), bystander.clone());
                tokio::spawn(async move { bash_ok(&sb, &k, "echo mine > b.txt; ls -A").await })
            };
            let during = !making.is_finished();
            let ended = sb.end_session(&fork).await.expect("end");
            // The fork either failed (its session ended under it) or was made and ended.
            let _ = making.await.unwrap();
            ended_during += usize::from(during && ended);
            assert_eq!(cold.await.unwrap(), "b.txt\n", "round {round}: the cold session sees only its own file");
            // No two running containers of this test mount one loop device.
            let devices = mounted_devices(&c.scope);
            let unique: std::collections::HashSet<_> = devices.iter().collect();
            assert_eq!(unique.len(), devices.len(), "round {round}: a device mounted twice: {devices:?}");
            // The fork's key, used afterwards: the fork if it outlived the end, else empty.
            let after = bash_ok(&sb, &fork, "ls -A").await;
            assert!(after == "s.txt\n" || after.is_empty(), "round {round}: {after:?}");
        }
        assert!(ended_during > 0, "at least one end found the fork being made");
        sb.shutdown().await.unwrap();
    }

    pub async fn twenty_forks_are_copies_isolated_from_each_other(c: Ctx) {
        // Counts processes running `sleep 27182` (the pattern does not match itself).
        const FIND_SLEEP: &str = "grep -las 'sleep.2718[2]' /proc/[0-9]*/cmdline | wc -l";
        let sb = c.sandbox_with(|cfg| {
            cfg.warm_pool = 0;
            cfg.max_sessions = 24;
            cfg.max_sessions_per_user = 24;
        });
        let src = key("source");
        bash_ok(&sb, &src, "mkdir -p d && echo original > d/a.txt && head -c 3000000 /dev/urandom > big && cd d").await;
        let sum = bash_ok(&sb, &src, "sha256sum /workspace/big").await;
        // A session process of the source: a fork gets none of its processes.
        let argv: Vec<String> = ["sleep", "27182"].iter().map(|s| s.to_string()).collect();
        let _process = sb.spawn_process(&src, &argv, &[]).await.expect("session process");
        let forks: Vec<SessionKey> = (0..20).map(|i| key(&format!("fork-{i}"))).collect();
        // A few at a time, as a parent fanning out would.
        for group in forks.chunks(5) {
            let made = group.iter().map(|f| {
                let (sb, src, f) = (sb.clone(), src.clone(), f.clone());
                async move { sb.fork_session(&src, &f).await }
            });
            for r in futures_util::future::join_all(made).await {
                r.expect("fork");
            }
        }
        let ids: std::collections::HashSet<String> =
            futures_util::future::join_all(forks.iter().map(|f| container_of(&sb, f))).await.into_iter().collect();
        assert_eq!(ids.len(), 20, "a container of its own each");
        assert!(!ids.contains(&container_of(&sb, &src).await));
        let checks = forks.iter().enumerate().map(|(i, f)| {
            let (sb, f, sum) = (sb.clone(), f.clone(), sum.clone());
            async move {
                // The fork starts in /workspace (no shell state of the source's `cd d`).
                assert_eq!(bash_ok(&sb, &f, "pwd; cat d/a.txt").await, "/workspace\noriginal\n");
                assert_eq!(bash_ok(&sb, &f, "sha256sum /workspace/big").await, sum);
                let procs = bash_ok(&sb, &f, FIND_SLEEP).await;
                assert_eq!(procs.trim(), "0", "no process of the source in fork {i}");
                bash_ok(&sb, &f, &format!("echo {i} > own-{i}.txt && echo changed-{i} > d/a.txt")).await;
            }
        });
        futures_util::future::join_all(checks).await;
        for (i, f) in forks.iter().enumerate() {
            let listing = bash_ok(&sb, f, "ls own-*; cat d/a.txt").await;
            assert_eq!(listing, format!("own-{i}.txt\nchanged-{i}\n"), "fork {i} sees only its own writes");
        }
        // The source is as it was, its process still running (positive control: it is seen).
        assert_eq!(bash_ok(&sb, &src, "ls /workspace; cat /workspace/d/a.txt").await, "big\nd\noriginal\n");
        let procs = bash_ok(&sb, &src, FIND_SLEEP).await;
        assert_ne!(procs.trim(), "0", "the source's session process runs on");
        // A paused source forks too, and stays paused.
        sb.end_session(&forks[19]).await.unwrap();
        sb.pause_session(&src).await.unwrap();
        sb.fork_session(&src, &forks[19]).await.unwrap();
        assert!(sb.is_paused(&src));
        assert_eq!(bash_ok(&sb, &forks[19], "cat d/a.txt").await, "original\n");
        // Refused: a taken id, an unknown source, another user's fork, itself.
        assert!(matches!(sb.fork_session(&src, &forks[0]).await, Err(SandboxError::SessionExists { .. })));
        assert!(matches!(sb.fork_session(&key("nobody"), &key("x")).await, Err(SandboxError::SessionNotFound { .. })));
        let other = SessionKey::new("someone-else", "stolen");
        assert!(matches!(sb.fork_session(&src, &other).await, Err(SandboxError::InvalidInput { .. })));
        assert!(matches!(sb.fork_session(&src, &src).await, Err(SandboxError::SessionExists { .. })));
        assert!(!sb.list_sessions().await.unwrap().iter().any(|i| i.key == other || i.key == key("x")));
        sb.shutdown().await.unwrap();
    }

    /// Without `sandbox.disk` the workspace is a plain volume: a fork copies its files.
    pub async fn a_fork_of_a_plain_volume_copies_its_files(c: Ctx) {
        let sb = c.sandbox_with(|cfg| {
            cfg.warm_pool = 0;
            cfg.disk = warden_sandbox::ByteSize(0);
        });
        let (src, fork) = (key("plain"), key("plain-fork"));
        bash_ok(&sb, &src, "mkdir d && echo x > d/f && ln -s d/f link").await;
        sb.fork_session(&src, &fork).await.unwrap();
        assert_eq!(bash_ok(&sb, &fork, "cat link; readlink link").await, "x\nd/f\n");
        bash_ok(&sb, &fork, "echo y > d/f").await;
        assert_eq!(bash_ok(&sb, &src, "cat d/f").await, "x\n");
        sb.shutdown().await.unwrap();
    }

    /// Snapshots (issue 50 item 3): a snapshot stores the workspace as it was and nothing
    /// else; a new session from it has the same files (and none of the source's processes,
    /// shell state or secrets), the snapshot does not change when that session writes, and it
    /// outlives its source session and the sandbox that took it. Names are checked, a
    /// snapshot is its user's only, and the quota and the disk budget refuse the next one
    /// with an error naming the limit.
    pub async fn a_session_from_a_snapshot_has_the_same_files(c: Ctx) {
        const FIND_SLEEP: &str = "grep -las 'sleep.3141[5]' /proc/[0-9]*/cmdline | wc -l";
        let disk = 64 * 1024 * 1024;
        let config = |cfg: &mut SandboxConfig| {
            cfg.warm_pool = 0;
            cfg.disk = warden_sandbox::ByteSize(disk);
            cfg.max_snapshots_per_user = 2;
            cfg.snapshot_disk_budget = warden_sandbox::ByteSize(3 * disk);
        };
        let sb = c.sandbox_with(config);
        let src = key("snap-source");
        bash_ok(
            &sb,
            &src,
            "mkdir -p d && echo original > d/a.txt && ln -s d/a.txt link && head -c 2000000 /dev/urandom > big && cd d",
        )
        .await;
        let sum = bash_ok(&sb, &src, "sha256sum /workspace/big").await;
        let argv: Vec<String> = ["sleep", "31415"].iter().map(|s| s.to_string()).collect();
        let _process = sb.spawn_process(&src, &argv, &[]).await.expect("session process");
        // A task's secret, visible to its call (positive control), never in the workspace.
        let env = vec![("API_TOKEN".to_string(), "snap-s3cr3t".to_string())];
        let o = sb.call_tool(&src, "Bash", json!({"command": "echo ${API_TOKEN}"}), &env).await.unwrap();
        assert_eq!(o.content, "snap-s3cr3t\n");
        let info = sb.snapshot_session(&src, "before").await.expect("snapshot");
        assert_eq!(
            (info.name.as_str(), info.user_id.as_str(), info.session_id.as_str()),
            ("before", "tester", "snap-source")
        );
        assert!(info.created_at.is_some(), "{info:?}");
        // The source goes on, and changes after the snapshot are not in it.
        bash_ok(&sb, &src, "echo changed > /workspace/d/a.txt && touch /workspace/later").await;
        let restored = key("snap-restored");
        sb.session_from_snapshot(&restored, "before").await.expect("session from snapshot");
        assert_eq!(
            bash_ok(&sb, &restored, "pwd; cat d/a.txt; readlink link; ls").await,
            "/workspace\noriginal\nd/a.txt\nbig\nd\nlink\n"
        );
        assert_eq!(bash_ok(&sb, &restored, "sha256sum /workspace/big").await, sum);
        assert_eq!(bash_ok(&sb, &restored, FIND_SLEEP).await.trim(), "0", "no process of the source");
        let leak = bash_ok(&sb, &restored, "env; grep -rl snap-s3cr3t /workspace; true").await;
        assert!(!leak.contains("snap-s3cr3t"), "{leak}");
        assert_ne!(bash_ok(&sb, &src, FIND_SLEEP).await.trim(), "0", "the source's process runs on (positive control)");
        assert_ne!(container_of(&sb, &restored).await, container_of(&sb, &src).await);
        // Writes of the restored session change neither the snapshot nor the source.
        bash_ok(&sb, &restored, "echo restored > d/a.txt").await;
        let again = key("snap-again");
        sb.session_from_snapshot(&again, "before").await.unwrap();
        assert_eq!(bash_ok(&sb, &again, "cat d/a.txt").await, "original\n");
        assert_eq!(bash_ok(&sb, &src, "cat /workspace/d/a.txt").await, "changed\n");
        // Refused: a bad name, a taken name, an unknown snapshot, a taken session id, another
        // user's snapshot (it is not theirs to see).
        for bad in ["", "../x", "-rf", "a b", "x/y"] {
            match sb.snapshot_session(&src, bad).await {
                Err(e @ SandboxError::InvalidSnapshotName { .. }) => {
                    assert!(e.to_string().contains("letters, digits"), "{e}")
                }
                other => panic!("{bad:?}: expected InvalidSnapshotName, got {other:?}"),
            }
        }
        assert!(matches!(sb.snapshot_session(&src, "before").await, Err(SandboxError::SnapshotExists { .. })));
        assert!(matches!(
            sb.session_from_snapshot(&key("x"), "nope").await,
            Err(SandboxError::SnapshotNotFound { .. })
        ));
        assert!(matches!(sb.session_from_snapshot(&again, "before").await, Err(SandboxError::SessionExists { .. })));
        let stranger = SessionKey::new("someone-else", "stolen");
        assert!(matches!(
            sb.session_from_snapshot(&stranger, "before").await,
            Err(SandboxError::SnapshotNotFound { .. })
        ));
        assert!(matches!(
            sb.delete_snapshot("someone-else", "before").await,
            Err(SandboxError::SnapshotNotFound { .. })
        ));
        assert!(matches!(sb.snapshot_session(&key("nobody"), "n").await, Err(SandboxError::SessionNotFound { .. })));
        // The quota: two per user; the third is refused, naming the limit.
        sb.snapshot_session(&src, "second").await.unwrap();
        match sb.snapshot_session(&src, "third").await {
            Err(e @ SandboxError::TooManySnapshots { .. }) => {
                assert!(e.to_string().contains("sandbox.max_snapshots_per_user"), "{e}")
            }
            other => panic!("expected the quota to refuse, got {other:?}"),
        }
        // The disk budget: three workspaces of `disk`; another user's second is the fourth.
        let theirs = SessionKey::new("other-user", "theirs");
        bash_ok(&sb, &theirs, "echo theirs > f").await;
        sb.snapshot_session(&theirs, "mine").await.unwrap();
        match sb.snapshot_session(&theirs, "mine-too").await {
            Err(e @ SandboxError::TooManySnapshots { .. }) => {
                assert!(e.to_string().contains("sandbox.snapshot_disk_budget"), "{e}")
            }
            other => panic!("expected the disk budget to refuse, got {other:?}"),
        }
        let names = |l: Vec<warden_sandbox::SnapshotInfo>| l.into_iter().map(|i| i.name).collect::<Vec<_>>();
        assert_eq!(names(sb.list_snapshots(Some("tester")).await.unwrap()), ["before", "second"]);
        assert_eq!(names(sb.list_snapshots(Some("other-user")).await.unwrap()), ["mine"]);
        // A snapshot outlives its session, and the sandbox (a restarted host) that took it.
        assert!(sb.end_session(&src).await.unwrap());
        sb.shutdown().await.unwrap();
        let sb = c.sandbox_with(config);
        assert_eq!(names(sb.list_snapshots(None).await.unwrap()), ["before", "mine", "second"]);
        let later = key("snap-later");
        sb.session_from_snapshot(&later, "before").await.unwrap();
        assert_eq!(bash_ok(&sb, &later, "cat d/a.txt").await, "original\n");
        // Deleted, it is gone (and its room is free again).
        for (user, name) in [("tester", "before"), ("tester", "second"), ("other-user", "mine")] {
            sb.delete_snapshot(user, name).await.unwrap();
        }
        assert!(sb.list_snapshots(None).await.unwrap().is_empty());
        assert!(matches!(
            sb.session_from_snapshot(&key("y"), "before").await,
            Err(SandboxError::SnapshotNotFound { .. })
        ));
        sb.shutdown().await.unwrap();
    }

    /// `snapshot_on_end`: an ended session's workspace is kept as its end snapshot, and the
    /// session comes back from it with its files (and not its working directory); a live
    /// session is never replaced; end snapshots give way, oldest first, to the disk budget.
    pub async fn an_ended_session_comes_back_from_its_end_snapshot(c: Ctx) {
        let disk = 64 * 1024 * 1024;
        let sb = c.sandbox_with(|cfg| {
            cfg.warm_pool = 0;
            cfg.disk = warden_sandbox::ByteSize(disk);
            cfg.snapshot_on_end = true;
            cfg.snapshot_disk_budget = warden_sandbox::ByteSize(2 * disk);
        });
        let (k, other, third) = (key("ends"), key("ends-2"), key("ends-3"));
        bash_ok(&sb, &k, "echo kept > f && mkdir d && cd d").await;
        assert!(!sb.restore_ended_session(&k).await.unwrap(), "a live session is left alone");
        assert!(sb.end_session(&k).await.unwrap());
        assert!(!sb.list_sessions().await.unwrap().iter().any(|i| i.key == k), "ended");
        assert!(!sb.restore_ended_session(&key("never")).await.unwrap(), "no end snapshot, nothing made");
        assert!(sb.restore_ended_session(&k).await.unwrap());
        assert_eq!(bash_ok(&sb, &k, "pwd; cat f").await, "/workspace\nkept\n");
        // Two end snapshots fit the budget; a named snapshot then takes the oldest one's room.
        bash_ok(&sb, &other, "echo two > f").await;
        bash_ok(&sb, &third, "echo three > f").await;
        sb.end_session(&k).await.unwrap();
        sb.end_session(&other).await.unwrap();
        sb.snapshot_session(&third, "named").await.unwrap();
        assert!(!sb.restore_ended_session(&k).await.unwrap(), "the oldest end snapshot made room");
        assert!(sb.restore_ended_session(&other).await.unwrap());
        assert_eq!(bash_ok(&sb, &other, "cat f").await, "two\n");
        sb.delete_snapshot("tester", "named").await.unwrap();
        sb.shutdown().await.unwrap();
        // The sessions ended by the shutdown left end snapshots: this test's to remove.
        let ends = docker(&[
            "volume",
            "ls",
            "-q",
            "--filter",
            &format!("label=warden.scope={}", c.scope),
            "--filter",
            "label=warden.snapshot_end=true",
        ]);
        let ends: Vec<&str> = ends.lines().collect();
        assert_eq!(ends.len(), 2, "the shutdown kept the two live sessions' workspaces: {ends:?}");
        docker(&[["volume", "rm"].as_slice(), ends.as_slice()].concat());
    }

    /// Without `sandbox.disk` a snapshot holds the workspace's files; a session from it has
    /// them, links as links.
    pub async fn a_snapshot_of_a_plain_volume_copies_its_files(c: Ctx) {
        let sb = c.sandbox_with(|cfg| {
            cfg.warm_pool = 0;
            cfg.disk = warden_sandbox::ByteSize(0);
        });
        let src = key("plain-snap");
        bash_ok(&sb, &src, "mkdir d && echo x > d/f && ln -s d/f link").await;
        sb.snapshot_session(&src, "plain").await.unwrap();
        bash_ok(&sb, &src, "echo y > d/f").await;
        let restored = key("plain-restored");
        sb.session_from_snapshot(&restored, "plain").await.unwrap();
        assert_eq!(bash_ok(&sb, &restored, "cat link; readlink link").await, "x\nd/f\n");
        sb.delete_snapshot("tester", "plain").await.unwrap();
        sb.shutdown().await.unwrap();
    }

    /// The host's own commands (`Sandbox::run_host_command`, how the host compares a
    /// task's fork with its source): raw stdout, the exit code, in /workspace whatever the
    /// session's shell left, which they leave as it was, and no task environment.
    /// `Sandbox::open_session` makes a missing session and leaves a held one alone.
    pub async fn host_commands_run_beside_the_shell_and_leave_it_as_it_was(c: Ctx) {
        let sb = c.sandbox_with(|cfg| cfg.warm_pool = 0);
        let k = key("inspected");
        sb.open_session(&k).await.unwrap();
        assert!(sb.list_sessions().await.unwrap().iter().any(|i| i.key == k), "made by open_session");
        let env = [("TASK_SECRET".to_string(), "task-secret-value-1".to_string())];
        let o = sb
            .call_tool(&k, "Bash", json!({ "command": "mkdir -p d && cd d && echo \"$TASK_SECRET\"" }), &env)
            .await
            .unwrap();
        assert_eq!(o.content, "task-secret-value-1\n", "positive control: the task's command has it");
        let out = sb
            .run_host_command(
                &k,
                "pwd; printf 'a\\0b'; echo \"${TASK_SECRET:-none}\"; echo err >&2; exit 3",
                Duration::from_secs(30),
            )
            .await
            .unwrap();
        assert_eq!(out.stdout, b"/workspace\na\0bnone\n");
        assert_eq!((out.exit_code, out.timed_out, out.stdout_dropped, out.stderr.as_str()), (3, false, 0, "err\n"));
        let pwd = sb.call_tool(&k, "Bash", json!({ "command": "pwd" }), &env).await.unwrap();
        assert_eq!(pwd.content, "/workspace/d\n", "the task's shell is where the task left it");
        // A held session is left alone (a paused one stays paused).
        sb.pause_session(&k).await.unwrap();
        sb.open_session(&k).await.unwrap();
        assert!(sb.is_paused(&k));
        sb.shutdown().await.unwrap();
    }

    /// A resume is served by the session's egress proxy again (a new channel to the new
    /// forwarder).
    pub async fn a_resumed_session_keeps_egress(c: Ctx) {
        let sb = c.sandbox_with(|cfg| {
            cfg.warm_pool = 0;
            cfg.egress = Some(serde_json::from_value(json!({"allow": ["example.invalid"]})).unwrap());
        });
        let k = key("egress");
        // The proxy answers through the forwarder: the name is allowed but does not resolve
        // (502 from the proxy); with no proxy behind the forwarder curl gets no answer (000).
        let probe = "curl -s -o /dev/null -w '%{http_code}\\n' --max-time 20 http://example.invalid/ || true";
        let before = bash_ok(&sb, &k, probe).await;
        assert_eq!(before, "403\n", "positive control");
        sb.pause_session(&k).await.unwrap();
        assert_eq!(bash_ok(&sb, &k, probe).await, before);
        sb.shutdown().await.unwrap();
    }
}

mod pool {
    use super::*;
    use std::collections::HashSet;

    /// A new session's first command runs in a container that was waiting in the pool.
    pub async fn first_command_runs_in_a_pooled_container(c: Ctx) {
        let sb = c.sandbox();
        sb.connect().await.unwrap();
        pool_ready(&sb, 2).await;
        let waiting = pooled(&c.scope);
        assert_eq!(waiting.len(), 2, "{waiting:?}");
        let k = key("warm");
        assert_eq!(
            bash_ok(&sb, &k, "id -u; pwd; ls -A /workspace; echo first > f; cat f").await,
            "1000\n/workspace\nfirst\n",
            "a never-used, empty workspace"
        );
        let id = container_of(&sb, &k).await;
        assert!(waiting.contains(&id), "{id} is one of the pool's {waiting:?}");
        assert!(!pooled(&c.scope).contains(&id), "renamed: no longer a pool container");
        let m = sb.metrics();
        assert_eq!((m.warm_pool_hits_total, m.warm_pool_waits_total, m.warm_pool_misses_total), (1, 0, 0), "{m:?}");
        assert_eq!(m.sessions_created_total, 1);
        assert_eq!(m.sessions_active, 1);
        assert!(m.to_prometheus().contains("warden_sandbox_warm_pool_hits_total 1"));
        sb.shutdown().await.unwrap();
    }

    /// More new sessions at once than the pool holds: every one gets a container (and a
    /// workspace) of its own.
    pub async fn two_sessions_never_share_a_container(c: Ctx) {
        let sb = c.sandbox();
        sb.connect().await.unwrap();
        pool_ready(&sb, 2).await;
        let waiting = pooled(&c.scope);
        let keys: Vec<SessionKey> = (0..5).map(|i| key(&format!("share{i}"))).collect();
        let calls = keys.iter().enumerate().map(|(i, k)| {
            let (sb, k) = (sb.clone(), k.clone());
            tokio::spawn(async move { bash_ok(&sb, &k, &format!("echo {i} > mine-{i}; ls -A")).await })
        });
        for (i, r) in futures_util::future::join_all(calls).await.into_iter().enumerate() {
            assert_eq!(r.unwrap(), format!("mine-{i}\n"), "session {i} sees only its own file");
        }
        let mut ids = HashSet::new();
        let mut workspaces = HashSet::new();
        for k in &keys {
            let id = container_of(&sb, k).await;
            let j: Value = serde_json::from_str(&docker(&["inspect", &id])).unwrap();
            workspaces.insert(j[0]["Mounts"][0]["Name"].as_str().unwrap().to_string());
            ids.insert(id);
        }
        assert_eq!(ids.len(), 5, "five containers: {ids:?}");
        assert_eq!(workspaces.len(), 5, "five workspaces: {workspaces:?}");
        for w in &waiting {
            assert!(ids.contains(w), "both ready containers were handed out: {w}");
        }
        let m = sb.metrics();
        assert_eq!(m.warm_pool_hits_total, 2, "{m:?}");
        assert_eq!(m.warm_pool_hits_total + m.warm_pool_waits_total + m.warm_pool_misses_total, 5, "{m:?}");
        sb.shutdown().await.unwrap();
    }

    /// Cold starts at once share disk helpers (a container lifecycle each, as costly as the
    /// session's own container) instead of running one each, and every session still gets
    /// a disk of its own: its own files, its own limit.
    pub async fn cold_starts_at_once_share_disk_helpers(c: Ctx) {
        const LIMIT: u64 = 32 * 1024 * 1024;
        const SESSIONS: usize = 6;
        let sb = c.sandbox_with(|cfg| {
            cfg.warm_pool = 0;
            cfg.disk = warden_sandbox::ByteSize(LIMIT);
        });
        sb.connect().await.unwrap();
        let keys: Vec<SessionKey> = (0..SESSIONS).map(|i| key(&format!("disks{i}"))).collect();
        let calls = keys.iter().enumerate().map(|(i, k)| {
            let (sb, k) = (sb.clone(), k.clone());
            tokio::spawn(async move {
                bash_ok(&sb, &k, &format!("echo {i} > mine-{i}; ls -A; df -B1 --output=size /workspace | tail -n 1"))
                    .await
            })
        });
        for (i, r) in futures_util::future::join_all(calls).await.into_iter().enumerate() {
            let out = r.unwrap();
            let (files, size) = out.split_once('\n').unwrap();
            assert_eq!(files, format!("mine-{i}"), "session {i} sees only its own file: {out}");
            let size: u64 = size.trim().parse().unwrap();
            assert!(size <= LIMIT && size > LIMIT / 2, "session {i} has a disk of the limit's size: {size}");
        }
        // One session filling its disk takes nothing from another's.
        let full = bash(&sb, &keys[0], "head -c 40000000 /dev/zero > fill; echo rc=$?").await;
        assert!(full.content.contains("No space left on device"), "{}", full.content);
        assert_eq!(bash_ok(&sb, &keys[1], "head -c 20000000 /dev/zero > fill && echo written").await, "written\n");
        let m = sb.metrics();
        assert_eq!(m.disks_attached_total, SESSIONS as u64, "every cold start's disk was attached here: {m:?}");
        assert!(m.disk_helpers_total < m.disks_attached_total, "helpers were shared: {m:?}");
        assert!(m.to_prometheus().contains(&format!("warden_sandbox_disks_attached_total {SESSIONS}")));
        sb.shutdown().await.unwrap();
    }

    /// An ended session's container, workspace, disk and binding are gone; the pool refills
    /// with new containers, and neither a new session nor the same key gets the old one.
    pub async fn an_ended_session_is_gone_and_never_handed_out_again(c: Ctx) {
        let sb = c.sandbox();
        sb.connect().await.unwrap();
        pool_ready(&sb, 2).await;
        let a = key("ended");
        bash_ok(&sb, &a, "echo private > a.txt").await;
        let old = container_of(&sb, &a).await;
        let volumes = volumes_of_session(&c.scope, &old, &a);
        assert_eq!(volumes.len(), 3, "workspace, disk and binding: {volumes:?}");
        assert!(sb.end_session(&a).await.unwrap());
        assert!(!container_exists(&old), "container removed");
        let left: Vec<String> = volumes_of_scope(&c.scope).into_iter().filter(|v| volumes.contains(v)).collect();
        assert_eq!(left, Vec::<String>::new(), "volumes removed");
        pool_ready(&sb, 2).await;
        assert!(!pooled(&c.scope).contains(&old));
        let b = key("after");
        assert_eq!(bash_ok(&sb, &b, "ls -A").await, "", "a fresh workspace");
        assert_ne!(container_of(&sb, &b).await, old);
        assert_eq!(bash_ok(&sb, &a, "ls -A").await, "", "the ended session starts afresh");
        assert_ne!(container_of(&sb, &a).await, old);
        assert_eq!(sb.metrics().warm_pool_hits_total, 3, "{:?}", sb.metrics());
        sb.shutdown().await.unwrap();
    }

    /// The pool refills in the background, and sessions + pool never exceed `max_sessions`.
    pub async fn the_pool_refills_within_max_sessions(c: Ctx) {
        let sb = c.sandbox_with(|cfg| cfg.max_sessions = 3);
        sb.connect().await.unwrap();
        pool_ready(&sb, 2).await;
        let scope_label = format!("label=warden.scope={}", c.scope);
        // Every container this host keeps is pool-made here (helpers carry no pool label).
        let containers =
            || docker(&["ps", "-aq", "--filter", &scope_label, "--filter", "label=warden.pool=true"]).lines().count();
        // Holds `ready` for a while (longer than a fill takes), never past the limit.
        let steady = |ready: u64| {
            let sb = sb.clone();
            async move {
                pool_ready(&sb, ready).await;
                for _ in 0..15 {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    assert!(containers() <= 3, "sessions + pool exceed max_sessions: {}", containers());
                    assert_eq!(sb.metrics().warm_pool_ready, ready, "{:?}", sb.metrics());
                }
            }
        };
        bash_ok(&sb, &key("r1"), "true").await;
        steady(2).await; // 1 session + 2 ready: refilled
        assert_eq!(sb.metrics().warm_pool_created_total, 3);
        bash_ok(&sb, &key("r2"), "true").await;
        steady(1).await; // 2 sessions + 1 ready
        bash_ok(&sb, &key("r3"), "true").await;
        steady(0).await; // 3 sessions, no room for the pool
        match sb.call_tool(&key("r4"), "Bash", json!({"command": "true"}), &[]).await {
            Err(SandboxError::TooManySessions { max: 3 }) => {}
            other => panic!("expected TooManySessions, got {other:?}"),
        }
        assert!(sb.end_session(&key("r1")).await.unwrap());
        steady(1).await; // room again
        assert_eq!(sb.metrics().warm_pool_hits_total, 3, "{:?}", sb.metrics());
        sb.shutdown().await.unwrap();
    }

    /// Pool containers are nobody's session: not listed, not ended with one, and a session
    /// only ever sees its own container.
    pub async fn a_pool_container_is_no_sessions(c: Ctx) {
        let sb = c.sandbox();
        sb.connect().await.unwrap();
        pool_ready(&sb, 2).await;
        let mine = |list: Vec<warden_sandbox::SessionInfo>| -> Vec<(SessionKey, String)> {
            list.into_iter().filter(|s| s.scope == c.scope).map(|s| (s.key, s.container_id)).collect()
        };
        assert_eq!(mine(sb.list_sessions().await.unwrap()), vec![], "the pool lists no session");
        let k = key("only");
        bash_ok(&sb, &k, "echo x > f").await;
        pool_ready(&sb, 2).await;
        let waiting = pooled(&c.scope);
        let listed = mine(sb.list_sessions().await.unwrap());
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0].0, k);
        assert!(!waiting.contains(&listed[0].1), "{listed:?} vs pool {waiting:?}");
        // Ending an unknown session, or this one, leaves the pool alone. (Pruning is not
        // tried here: it reaches every scope, so other tests running now.)
        assert!(!sb.end_session(&key("never-was")).await.unwrap());
        assert!(sb.end_session(&k).await.unwrap());
        assert_eq!(pooled(&c.scope), waiting, "the pool is untouched");
        for id in &waiting {
            let j: Value = serde_json::from_str(&docker(&["inspect", id])).unwrap();
            assert_eq!(j[0]["State"]["Running"], json!(true));
        }
        sb.shutdown().await.unwrap();
        assert_eq!(pooled(&c.scope), Vec::<String>::new(), "shutdown removes the pool");
    }

    /// A restarted host removes its scope's pool containers that were never handed out, and
    /// a pooled container whose binding is gone; it adopts a handed-out one with its
    /// workspace; another scope's pool is untouched.
    pub async fn a_restart_removes_stale_pool_containers_of_its_scope_only(c: Ctx) {
        let other = c.scoped(format!("{}other", c.scope));
        let neighbour = other.sandbox();
        neighbour.connect().await.unwrap();
        pool_ready(&neighbour, 2).await;
        let neighbours_pool = pooled(&other.scope);
        assert_eq!(neighbours_pool.len(), 2);

        let (kept, unbound) = (key("kept"), key("unbound"));
        let (kept_id, unbound_id, stale, stale_volumes) = {
            let crashed = c.sandbox();
            crashed.connect().await.unwrap();
            pool_ready(&crashed, 2).await;
            bash_ok(&crashed, &kept, "echo carried > c.txt").await;
            bash_ok(&crashed, &unbound, "true").await;
            pool_ready(&crashed, 2).await;
            let kept_id = container_of(&crashed, &kept).await;
            let unbound_id = container_of(&crashed, &unbound).await;
            // A crash between the two steps of a hand-out: renamed, never bound.
            let unbound_volumes = volumes_of_session(&c.scope, &unbound_id, &unbound);
            assert_eq!(unbound_volumes.len(), 3, "{unbound_volumes:?}");
            docker(&["volume", "rm", &unbound_volumes[2]]);
            let stale = pooled(&c.scope);
            assert_eq!(stale.len(), 2);
            let stale_volumes: Vec<String> =
                stale.iter().flat_map(|id| volumes_of_session(&c.scope, id, &key("none"))).collect();
            (kept_id, unbound_id, stale, stale_volumes)
            // Dropped without shutdown: the host "crashed".
        };
        let restarted = c.sandbox();
        restarted.connect().await.unwrap();
        for id in stale.iter().chain([&unbound_id]) {
            assert!(!container_exists(id), "{id} removed on restart");
        }
        let vols = volumes_of_scope(&c.scope);
        for v in &stale_volumes {
            assert!(!vols.contains(v), "{v} removed on restart");
        }
        let listed: Vec<SessionKey> = restarted
            .list_sessions()
            .await
            .unwrap()
            .into_iter()
            .filter(|s| s.scope == c.scope)
            .map(|s| s.key)
            .collect();
        assert_eq!(listed, vec![kept.clone()]);
        assert_eq!(container_of(&restarted, &kept).await, kept_id, "adopted");
        assert_eq!(bash_ok(&restarted, &kept, "cat c.txt").await, "carried\n");
        assert_eq!(restarted.metrics().sessions_created_total, 0, "adopted, not recreated");
        assert_eq!(pooled(&other.scope), neighbours_pool, "another scope's pool is untouched");
        for id in &neighbours_pool {
            let j: Value = serde_json::from_str(&docker(&["inspect", id])).unwrap();
            assert_eq!(j[0]["State"]["Running"], json!(true));
        }
        // The unbound session's key starts afresh in a new container.
        assert_eq!(bash_ok(&restarted, &unbound, "ls -A").await, "");
        assert_ne!(container_of(&restarted, &unbound).await, unbound_id);
        restarted.shutdown().await.unwrap();
        neighbour.shutdown().await.unwrap();
    }

    /// Regression: `warden sandbox ls|prune` connected like a serving host, so listing the
    /// scope of a live host adopted its sessions (killing their running commands) and
    /// removed its pool; shutting the lister down then removed the adopted sessions too.
    pub async fn listing_or_pruning_adopted_a_live_hosts_sessions_and_pool(c: Ctx) {
        let live = c.sandbox();
        let k = key("live");
        bash_ok(&live, &k, "echo kept > f").await;
        pool_ready(&live, 2).await;
        let session = container_of(&live, &k).await;
        let pool = pooled(&c.scope);
        assert_eq!(pool.len(), 2, "{pool:?}");
        // A command of the live host runs while another process of its scope lists and prunes.
        let running = {
            let (live, k) = (live.clone(), k.clone());
            tokio::spawn(async move { bash_ok(&live, &k, "sleep 3; echo finished").await })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        let admin = c.sandbox();
        let listed: Vec<_> = admin.list_sessions().await.unwrap().into_iter().filter(|s| s.scope == c.scope).collect();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!((&listed[0].key, &listed[0].container_id, listed[0].owned_here), (&k, &session, false));
        let report = admin.prune().await.unwrap();
        assert!(!report.containers.iter().any(|n| n.contains(&c.scope)), "{report:?}");
        assert!(!report.volumes.iter().any(|v| v.contains(&c.scope)), "{report:?}");
        assert_eq!(admin.metrics().sessions_active, 0, "the lister adopted nothing");
        admin.shutdown().await.unwrap();
        assert_eq!(running.await.unwrap(), "finished\n", "the live host's command was not swept");
        assert_eq!(pooled(&c.scope), pool, "the live host's pool is untouched (and the lister kept none)");
        for id in pool.iter().chain([&session]) {
            let j: Value = serde_json::from_str(&docker(&["inspect", id])).unwrap();
            assert_eq!(j[0]["State"]["Running"], json!(true), "{id}");
        }
        assert_eq!(bash_ok(&live, &k, "cat f").await, "kept\n");
        assert_eq!(container_of(&live, &k).await, session, "the same container");
        assert_eq!(live.metrics().sessions_created_total, 1);
        live.shutdown().await.unwrap();
    }

    /// A pool container that stopped while idle is discarded (with its workspace), never
    /// handed out; the sessions get running containers and the pool refills.
    pub async fn a_stopped_pool_container_is_never_handed_out(c: Ctx) {
        let sb = c.sandbox();
        sb.connect().await.unwrap();
        pool_ready(&sb, 2).await;
        let waiting = pooled(&c.scope);
        let stopped = waiting[0].clone();
        let j: Value = serde_json::from_str(&docker(&["inspect", &stopped])).unwrap();
        let ws = j[0]["Mounts"][0]["Name"].as_str().unwrap().to_string();
        docker(&["stop", "-t", "0", &stopped]);
        // Two new sessions: whichever of the two waiting containers comes first, one of
        // them meets the stopped one.
        let (a, b) = (key("healthy-a"), key("healthy-b"));
        assert_eq!(bash_ok(&sb, &a, "echo a").await, "a\n");
        assert_eq!(bash_ok(&sb, &b, "echo b").await, "b\n");
        for k in [&a, &b] {
            let id = container_of(&sb, k).await;
            assert_ne!(id, stopped, "{k} got the stopped container");
            let j: Value = serde_json::from_str(&docker(&["inspect", &id])).unwrap();
            assert_eq!(j[0]["State"]["Running"], json!(true), "{k}");
        }
        assert!(!container_exists(&stopped), "the stopped pool container is removed");
        let left: Vec<String> = volumes_of_scope(&c.scope)
            .into_iter()
            .filter(|v| v.ends_with(ws.strip_prefix("warden-ws-").unwrap()))
            .collect();
        assert_eq!(left, Vec::<String>::new(), "its workspace (and disk) are removed");
        assert_eq!(sb.metrics().warm_pool_failures_total, 1, "{:?}", sb.metrics());
        pool_ready(&sb, 2).await;
        sb.shutdown().await.unwrap();
    }

    /// A pool container that stopped while idle is replaced without waiting for a session
    /// (the refill task's periodic check, every 10 s).
    pub async fn an_idle_pool_container_that_stopped_is_replaced(c: Ctx) {
        let sb = c.sandbox();
        sb.connect().await.unwrap();
        pool_ready(&sb, 2).await;
        let waiting = pooled(&c.scope);
        docker(&["stop", "-t", "0", &waiting[0]]);
        let deadline = Instant::now() + Duration::from_secs(60);
        while container_exists(&waiting[0]) {
            assert!(Instant::now() < deadline, "the stopped pool container was never removed");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        pool_ready(&sb, 2).await;
        let now = pooled(&c.scope);
        assert!(now.contains(&waiting[1]) && !now.contains(&waiting[0]) && now.len() == 2, "{now:?} after {waiting:?}");
        assert_eq!(sb.metrics().warm_pool_failures_total, 1, "{:?}", sb.metrics());
        sb.shutdown().await.unwrap();
    }

    /// A burst of new sessions past the pool: every one gets a container of its own; each
    /// that found nothing ready raises the pool's target (up to `warm_pool_max`), the pool
    /// fills above its floor, and once no new session comes the target decays back to
    /// `warm_pool` and the idle containers above it are removed.
    pub async fn the_pool_follows_a_burst_and_decays_to_its_floor(c: Ctx) {
        /// Sessions started at once: more than the floor and the ceiling together.
        const BURST: usize = 6;
        /// `warm_pool_max`: the burst's misses reach it.
        const CEILING: usize = 4;
        let sb = c.sandbox_with(|cfg| {
            cfg.warm_pool = 1;
            cfg.warm_pool_max = CEILING;
            // Long enough that the pool fills above its floor before the first halving.
            cfg.warm_pool_decay = Duration::from_secs(20);
        });
        sb.connect().await.unwrap();
        pool_ready(&sb, 1).await;
        assert_eq!(sb.metrics().warm_pool_target, 1, "{:?}", sb.metrics());
        let keys: Vec<SessionKey> = (0..BURST).map(|i| key(&format!("burst{i}"))).collect();
        let calls = keys.iter().map(|k| {
            let (sb, k) = (sb.clone(), k.clone());
            tokio::spawn(async move { bash_ok(&sb, &k, "echo hi").await })
        });
        for r in futures_util::future::join_all(calls).await {
            assert_eq!(r.unwrap(), "hi\n");
        }
        let mut ids = HashSet::new();
        for k in &keys {
            ids.insert(container_of(&sb, k).await);
        }
        assert_eq!(ids.len(), BURST, "a container per session: {ids:?}");
        let m = sb.metrics();
        assert_eq!(m.warm_pool_hits_total + m.warm_pool_waits_total + m.warm_pool_misses_total, BURST as u64, "{m:?}");
        assert_eq!(m.warm_pool_grown_total, (CEILING - 1) as u64, "each miss raised the target to the ceiling: {m:?}");
        // The pool holds more than its floor once the refill caught up.
        let deadline = Instant::now() + Duration::from_secs(120);
        while sb.metrics().warm_pool_ready < 2 {
            assert!(Instant::now() < deadline, "the pool never grew above its floor: {:?}", sb.metrics());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for k in &keys {
            assert!(sb.end_session(k).await.unwrap());
        }
        // No new session: back to the floor, the containers above it removed.
        let deadline = Instant::now() + Duration::from_secs(100);
        loop {
            let m = sb.metrics();
            if m.warm_pool_target == 1 && m.warm_pool_ready == 1 && pooled(&c.scope).len() == 1 {
                assert!(m.warm_pool_trimmed_total >= 1, "{m:?}");
                assert!(ids.iter().all(|id| !container_exists(id)), "the ended sessions' containers are gone");
                break;
            }
            assert!(Instant::now() < deadline, "the pool never decayed to its floor: {m:?} {:?}", pooled(&c.scope));
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        sb.shutdown().await.unwrap();
    }

    /// A pooled session's container that vanished is recreated on the same (pool) workspace.
    pub async fn a_vanished_pooled_container_keeps_its_workspace(c: Ctx) {
        let sb = c.sandbox();
        sb.connect().await.unwrap();
        pool_ready(&sb, 2).await;
        let k = key("vanish");
        bash_ok(&sb, &k, "echo survived > keep.txt").await;
        let first = container_of(&sb, &k).await;
        let volumes = volumes_of_session(&c.scope, &first, &k);
        docker(&["rm", "-f", &first]);
        assert_eq!(bash_ok(&sb, &k, "cat keep.txt").await, "survived\n");
        let second = container_of(&sb, &k).await;
        assert_ne!(first, second);
        assert_eq!(volumes_of_session(&c.scope, &second, &k), volumes, "same workspace and binding");
        assert!(sb.end_session(&k).await.unwrap());
        let left: Vec<String> = volumes_of_scope(&c.scope).into_iter().filter(|v| volumes.contains(v)).collect();
        assert_eq!(left, Vec::<String>::new(), "volumes removed");
        sb.shutdown().await.unwrap();
    }
}

/// Issue 11's tool-call boundary: framed protocol, processes, session state, links, notes.
mod egress {
    use super::*;
    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use warden_sandbox::egress::CredentialConfig;
    use warden_sandbox::{BoardFuture, EgressBoard, EgressConfig, EgressEvent, EgressReport, SharedNarrowing};

    /// The test's credential: only in this process's environment (the proxy reads it).
    const TOKEN_ENV: &str = "WARDEN_SANDBOX_TEST_EGRESS_TOKEN";
    /// Built at run time so that no command line of the test ever spells it.
    fn token() -> String {
        format!("{}-{}", "egress-token", "5f3a9c")
    }

    /// A server on the host's 127.0.0.1 that records the first bytes of each connection and
    /// answers an HTTP request with `reached <path>`, anything else with garbage.
    pub(super) async fn test_server() -> (u16, Arc<Mutex<Vec<Vec<u8>>>>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let log = log.clone();
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    let mut buf = [0u8; 8192];
                    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(500), s.read(&mut buf)).await {
                        if n == 0 {
                            break;
                        }
                        got.extend_from_slice(&buf[..n]);
                        if got.windows(4).any(|w| w == b"\r\n\r\n") {
                            break;
                        }
                    }
                    let reply = match got.strip_prefix(b"GET ") {
                        Some(rest) => {
                            let path = String::from_utf8_lossy(rest.split(|b| *b == b' ').next().unwrap_or_default())
                                .into_owned();
                            let body = format!("reached {path}");
                            format!(
                                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                                body.len()
                            )
                            .into_bytes()
                        }
                        None => b"not tls".to_vec(),
                    };
                    log.lock().unwrap().push(got);
                    let _ = s.write_all(&reply).await;
                    let _ = s.shutdown().await;
                });
            }
        });
        (port, seen)
    }

    /// The tests' egress settings: `127.0.0.1:<port>` (with the test's credential) and
    /// `extra` allowed, `denied.example` allowed and denied.
    pub(super) fn egress_config(port: u16, extra: &[u16]) -> EgressConfig {
        let mut allow = vec![format!("127.0.0.1:{port}"), "localhost:*".into(), "denied.example".into()];
        allow.extend(extra.iter().map(|p| format!("127.0.0.1:{p}")));
        EgressConfig {
            allow,
            deny: vec!["denied.example".into()],
            credentials: vec![CredentialConfig {
                host: format!("127.0.0.1:{port}"),
                header: "X-Warden-Test".into(),
                value_env: TOKEN_ENV.into(),
                format: "Token {}".into(),
            }],
        }
    }

    /// Every egress decision `sb` reports, as it reports them.
    pub(super) fn record_decisions(sb: &Sandbox) -> Arc<Mutex<Vec<EgressEvent>>> {
        let events = Arc::new(Mutex::new(Vec::new()));
        let log = events.clone();
        sb.on_egress(Arc::new(move |r: &EgressReport| log.lock().unwrap().extend(r.decision().cloned())));
        events
    }

    fn egress_sandbox(c: &Ctx, port: u16, warm_pool: usize) -> (Sandbox, Arc<Mutex<Vec<EgressEvent>>>) {
        let sb = c.sandbox_with(|cfg| {
            cfg.warm_pool = warm_pool;
            cfg.egress = Some(egress_config(port, &[]));
        });
        let events = record_decisions(&sb);
        (sb, events)
    }

    /// The board of replicas (PostgreSQL's `egress_holds` in warden) in memory: each
    /// replica's rows, and the replicas whose lease ran out.
    /// A row of [`Board`]: the replica, the session, the hold, its lists.
    type BoardRow = (String, SessionKey, u64, Vec<SharedNarrowing>);

    #[derive(Default)]
    struct Board {
        rows: Mutex<Vec<BoardRow>>,
        dead: Mutex<Vec<String>>,
    }

    /// One replica's view of [`Board`].
    struct ReplicaBoard {
        replica: String,
        board: Arc<Board>,
    }

    impl EgressBoard for ReplicaBoard {
        fn publish<'a>(
            &'a self,
            key: &'a SessionKey,
            hold: u64,
            narrowings: &'a [SharedNarrowing],
        ) -> BoardFuture<'a, Result<(), String>> {
            self.board.rows.lock().unwrap().push((self.replica.clone(), key.clone(), hold, narrowings.to_vec()));
            Box::pin(async { Ok(()) })
        }
        fn withdraw<'a>(&'a self, _: &'a SessionKey, hold: u64) -> BoardFuture<'a, ()> {
            self.board.rows.lock().unwrap().retain(|(r, _, h, _)| !(r == &self.replica && *h == hold));
            Box::pin(async {})
        }
        fn others<'a>(&'a self, key: &'a SessionKey) -> BoardFuture<'a, Result<Vec<SharedNarrowing>, String>> {
            let dead = self.board.dead.lock().unwrap().clone();
            let rows = self.board.rows.lock().unwrap();
            let found = rows
                .iter()
                .filter(|(r, k, ..)| r != &self.replica && !dead.contains(r) && k == key)
                .flat_map(|(.., n)| n.clone())
                .collect();
            Box::pin(async move { Ok(found) })
        }
    }

    /// Issue 49, replicas: a session made by one replica is served by another through a
    /// channel of its own (its decisions, the operator's credential); a call running on one
    /// replica narrows the connections the other serves, until it ends; a replica that dies
    /// (its hold never withdrawn, its lease run out) leaves the other's calls working and
    /// narrowed by nothing of it.
    pub async fn replicas_serve_a_sessions_egress_under_every_replicas_narrowings(c: Ctx) {
        use warden_sandbox::EgressNarrowing;
        set_token();
        let (port, seen) = test_server().await;
        let (other, _) = test_server().await;
        let board = Arc::new(Board::default());
        let replica = |id: &str| {
            let sb = c.sandbox_with(|cfg| {
                cfg.warm_pool = 0;
                cfg.replica_id = Some(id.to_string());
                cfg.egress = Some(egress_config(port, &[other]));
            });
            sb.share_egress_holds(Arc::new(ReplicaBoard { replica: id.into(), board: board.clone() })).unwrap();
            let events = record_decisions(&sb);
            (sb, events)
        };
        let ((r1, _), (r2, events2)) = (replica("r1"), replica("r2"));
        let k = key("egress-replicas");
        let get = |p: u16| format!("curl -sS --max-time 20 --noproxy '' http://127.0.0.1:{p}/x");
        assert_eq!(bash_ok(&r1, &k, &get(port)).await.trim(), "reached /x");
        let id = container_of(&r1, &k).await;
        assert_eq!(bash_ok(&r2, &k, &get(port)).await.trim(), "reached /x", "served by r2's channel");
        assert_eq!(container_of(&r2, &k).await, id, "one container");
        assert!(
            events2.lock().unwrap().iter().any(|e| e.allowed && e.session == k && e.credential.is_some()),
            "r2 decided and added the credential: {:?}",
            events2.lock().unwrap()
        );
        let sent =
            seen.lock().unwrap().iter().map(|b| String::from_utf8_lossy(b).to_ascii_lowercase()).collect::<Vec<_>>();
        assert!(sent.iter().all(|r| r.contains(&format!("x-warden-test: token {}", token()))), "{sent:?}");
        // A call of r1 narrowed to `port`: r2's connections are judged by its list too.
        let narrow =
            Arc::new(EgressNarrowing::parse(&[format!("127.0.0.1:{port}")], "the task on r1 (egress)").unwrap());
        {
            let _hold = r1.hold_egress(&k, std::slice::from_ref(&narrow)).await.unwrap();
            let o = bash(&r2, &k, &get(other)).await;
            assert!(
                o.content.contains(&format!("127.0.0.1:{other} is outside the egress list of the task on r1 (egress)")),
                "{}",
                o.content
            );
            assert_eq!(bash_ok(&r2, &k, &get(port)).await.trim(), "reached /x", "inside every list");
        }
        // Its end takes it off the board: r2 reaches `other` again.
        let until = Instant::now() + Duration::from_secs(10);
        while !board.rows.lock().unwrap().is_empty() {
            assert!(Instant::now() < until, "the ended call's hold stayed on the board");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(bash_ok(&r2, &k, &get(other)).await.trim(), "reached /x");
        // r1 dies holding the narrowing (positive control: in effect), then its lease runs out.
        std::mem::forget(r1.hold_egress(&k, &[narrow]).await.unwrap());
        assert!(bash(&r2, &k, &get(other)).await.content.contains("outside the egress list of the task on r1"));
        drop(r1);
        board.dead.lock().unwrap().push("r1".into());
        assert_eq!(bash_ok(&r2, &k, &get(other)).await.trim(), "reached /x", "r1's hold lapsed with it");
        assert_eq!(bash_ok(&r2, &k, &get(port)).await.trim(), "reached /x", "r2's channel outlives r1");
        r2.end_session(&k).await.unwrap();
        r2.shutdown().await.unwrap();
    }

    pub(super) fn set_token() {
        // SAFETY: one test sets this variable, always to the same value, before any sandbox
        // of it reads it; no other code reads or writes it.
        unsafe { std::env::set_var(TOKEN_ENV, token()) };
    }

    pub async fn the_proxy_is_the_only_way_out(c: Ctx) {
        set_token();
        let (port, seen) = test_server().await;
        let (sb, events) = egress_sandbox(&c, port, 0);
        let k = key("egress");
        // Allowed over plain HTTP, with the credential added on the way. (`--noproxy ''`:
        // NO_PROXY sends 127.0.0.1 to the sandbox's own loopback; the allow entry names the
        // host's, which only the proxy reaches.)
        let out = bash_ok(&sb, &k, &format!("curl -sS --max-time 20 --noproxy '' http://127.0.0.1:{port}/hello")).await;
        assert_eq!(out.trim(), "reached /hello");
        let first = String::from_utf8_lossy(&seen.lock().unwrap()[0]).to_ascii_lowercase();
        assert!(first.contains(&format!("x-warden-test: token {}", token())), "the credential arrived: {first}");
        // Allowed through CONNECT: the tunnel opens (200) and the TLS ClientHello arrives.
        let code = bash(
            &sb,
            &k,
            &format!(
                "curl -sk --max-time 20 --noproxy '' -o /dev/null -w '%{{http_connect}}' https://127.0.0.1:{port}/"
            ),
        )
        .await;
        assert!(code.content.contains("200"), "CONNECT answered: {}", code.content);
        assert!(
            seen.lock().unwrap().iter().any(|b| b.starts_with(&[0x16, 0x03])),
            "a TLS ClientHello reached the server"
        );
        // Refused, each with its rule in the answer.
        for (url, rule) in [
            ("http://denied.example/".to_string(), "deny `denied.example`"),
            ("http://1.1.1.1/".to_string(), "no allow entry names 1.1.1.1:80"),
            ("http://169.254.169.254/latest/meta-data/".to_string(), "no allow entry names 169.254.169.254:80"),
            (format!("http://localhost:{port}/"), "loopback"),
        ] {
            // `--noproxy ''`: curl would go around the proxy for localhost (NO_PROXY).
            let o = bash(&sb, &k, &format!("curl -sS --max-time 20 --noproxy '' {url}")).await;
            assert!(o.content.contains("refused") && o.content.contains(rule), "{url}: {}", o.content);
        }
        let o = bash(&sb, &k, "curl -sS --max-time 20 -o /dev/null https://denied.example/ 2>&1; echo rc=$?").await;
        assert!(o.content.contains("403") && !o.content.contains("rc=0"), "CONNECT to a denied host: {}", o.content);
        // Around the proxy: no route for TCP or UDP, not even to the host's loopback port.
        let direct = bash(&sb, &k, &format!(
            "curl -sS --max-time 5 --noproxy '*' http://1.1.1.1/ 2>&1; curl -sS --max-time 5 --noproxy '*' http://127.0.0.1:{port}/ 2>&1; \
             python3 -c \"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'x', ('8.8.8.8', 53)); print('UDP SENT')\" 2>&1; true"
        )).await;
        assert!(!direct.content.contains("reached") && !direct.content.contains("UDP SENT"), "{}", direct.content);
        assert!(
            direct.content.contains("unreachable") || direct.content.contains("Couldn't connect"),
            "{}",
            direct.content
        );
        // The credential is nowhere in the sandbox: environment, any process's, files.
        let t = token();
        let (a, b) = t.split_at(6);
        let look = format!(
            "T=\"{a}\"\"{b}\"; env | grep -cF \"$T\"; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -cF \"$T\"; \
             grep -rlF \"$T\" /workspace /tmp /etc /run /opt /usr/local 2>/dev/null | wc -l; env | grep -c '^HTTPS_PROXY=http://127.0.0.1:3128$'"
        );
        let counts: Vec<String> = bash(&sb, &k, &look).await.content.split_whitespace().map(str::to_string).collect();
        assert_eq!(counts, ["0", "0", "0", "1"], "env, /proc/*/environ, files; the proxy variable is set");
        // Every decision was reported, the credential by name only.
        let ev = events.lock().unwrap().clone();
        assert!(
            ev.iter().any(|e| e.allowed
                && e.kind == "http GET"
                && e.credential.as_deref() == Some("sandbox.egress.credentials[0]")
                && e.bytes_received > 0),
            "{ev:?}"
        );
        assert!(ev.iter().any(|e| e.allowed && e.kind == "connect" && e.bytes_sent > 0), "{ev:?}");
        assert!(ev.iter().filter(|e| !e.allowed).count() >= 5, "{ev:?}");
        assert!(!format!("{ev:?}").contains(&t));
        sb.shutdown().await.unwrap();
    }

    /// Regression (attack review, "egress decisions can be flooded"): a command in the
    /// sandbox looping refused CONNECTs straight at its proxy made one log line,
    /// audit line and task event each, unbounded. Now the session records its refusal
    /// budget's worth and counts the rest, reported when its proxy ends.
    pub async fn regression_a_refusal_flood_from_the_sandbox_is_counted_not_recorded(c: Ctx) {
        use warden_sandbox::egress::recorder::REFUSALS;
        const FLOOD: u64 = 600;
        let sb = c.sandbox_with(|cfg| {
            cfg.egress = Some(EgressConfig { allow: vec!["pypi.org".into()], ..EgressConfig::default() });
        });
        let reports = Arc::new(Mutex::new(Vec::new()));
        let log = reports.clone();
        sb.on_egress(Arc::new(move |r: &EgressReport| log.lock().unwrap().push(r.clone())));
        let k = key("egress-flood");
        // The session's budget starts full when its proxy starts (with the session), so
        // the bound is counted from before that, not from the flood's start.
        let started = std::time::Instant::now();
        bash_ok(&sb, &k, "true").await;
        let flood = format!(
            r#"python3 - <<'PY'
import socket
n = 0
for i in range({FLOOD}):
    s = socket.create_connection(('127.0.0.1', 3128))
    s.sendall(b'CONNECT x%d.example:1 HTTP/1.1\r\n\r\n' % i)
    r = b''
    while True:
        b = s.recv(4096)
        if not b:
            break
        r += b
    s.close()
    n += r.startswith(b'HTTP/1.1 403')
print(n)
PY"#
        );
        assert_eq!(bash_ok(&sb, &k, &flood).await.trim(), FLOOD.to_string(), "every CONNECT was refused");
        let elapsed = started.elapsed();
        assert!(sb.end_session(&k).await.unwrap());
        for _ in 0..200 {
            if reports.lock().unwrap().iter().any(|r| matches!(r, EgressReport::Suppressed(_))) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let reports = reports.lock().unwrap().clone();
        let recorded = reports.iter().filter(|r| r.decision().is_some_and(|d| !d.allowed)).count() as u64;
        let counted: u64 = reports
            .iter()
            .filter_map(|r| match r {
                EgressReport::Suppressed(c) => Some(c.refused),
                EgressReport::Decision(_) => None,
            })
            .sum();
        assert!(recorded <= REFUSALS.most_over(elapsed), "{recorded} recorded in {elapsed:?}");
        assert_eq!(recorded + counted, FLOOD, "every refusal is recorded or counted: {reports:?}");
        assert!(counted > 0, "the flood went past the budget");
        sb.shutdown().await.unwrap();
    }

    /// Per-agent and per-task narrowing (issue 21): while a call holds narrowings, the
    /// session reaches only what the operator's list *and* every held list allow; the
    /// hold's end restores the operator's list; another session is never narrowed.
    pub async fn a_held_narrowing_only_takes_away(c: Ctx) {
        use warden_sandbox::EgressNarrowing;
        set_token();
        let (port, _seen) = test_server().await;
        let (other, _seen_other) = test_server().await;
        let sb = c.sandbox_with(|cfg| {
            cfg.egress = Some(EgressConfig {
                allow: vec![format!("127.0.0.1:{port}"), format!("127.0.0.1:{other}")],
                ..EgressConfig::default()
            });
        });
        let (k, neighbour) = (key("narrow"), key("narrow-neighbour"));
        let get = |p: u16| format!("curl -sS --max-time 20 --noproxy '' http://127.0.0.1:{p}/x");
        let agent = Arc::new(
            EgressNarrowing::parse(&[format!("127.0.0.1:{port}"), "evil.example".into()], "subagent \"a\" (egress)")
                .unwrap(),
        );
        let task = Arc::new(EgressNarrowing::parse(&["127.0.0.1:*".into()], "the task (egress)").unwrap());
        {
            let _hold = sb.hold_egress(&k, &[agent.clone(), task.clone()]).await.unwrap();
            assert_eq!(
                bash_ok(&sb, &k, &get(port)).await.trim(),
                "reached /x",
                "allowed by the operator and by both lists"
            );
            let o = bash(&sb, &k, &get(other)).await;
            assert!(
                o.content.contains(&format!("127.0.0.1:{other} is outside the egress list of subagent \"a\" (egress)")),
                "the refusal names the narrowing list: {}",
                o.content
            );
            // A list cannot add a host the operator did not allow (`evil.example`, `:*`).
            let o = bash(&sb, &k, "curl -sS --max-time 20 http://evil.example/").await;
            assert!(o.content.contains("no allow entry names evil.example:80"), "{}", o.content);
            // Another session is not narrowed by this one's calls.
            assert_eq!(bash_ok(&sb, &neighbour, &get(other)).await.trim(), "reached /x");
        }
        // The hold ended with its call: the operator's list applies again.
        assert_eq!(bash_ok(&sb, &k, &get(other)).await.trim(), "reached /x");
        // An empty list narrows to nothing.
        let nothing = Arc::new(EgressNarrowing::parse(&[], "the task (egress)").unwrap());
        let _hold = sb.hold_egress(&k, &[nothing]).await.unwrap();
        let o = bash(&sb, &k, &get(port)).await;
        assert!(o.content.contains("outside the egress list of the task (egress)"), "{}", o.content);
        sb.shutdown().await.unwrap();
    }

    /// A host that restarts serves the proxy of the sessions it adopts again (a channel of
    /// its own into each); a session whose forwarder no longer answers (it died, or its
    /// container predates channels) gets a new container on its workspace.
    pub async fn an_adopted_session_gets_its_proxy_back(c: Ctx) {
        set_token();
        let (port, _seen) = test_server().await;
        let (kept, lost) = (key("egress-adopt"), key("egress-lost"));
        let paused = key("egress-paused");
        let get = format!("curl -sS --max-time 20 --noproxy '' http://127.0.0.1:{port}/again");
        let gone = {
            let (crashed, _events) = egress_sandbox(&c, port, 0);
            assert_eq!(bash_ok(&crashed, &kept, &get).await.trim(), "reached /again");
            assert_eq!(bash_ok(&crashed, &paused, &get).await.trim(), "reached /again");
            assert!(crashed.pause_session(&paused).await.unwrap());
            bash_ok(&crashed, &lost, "echo kept > note").await;
            let gone = container_of(&crashed, &lost).await;
            // Its forwarder ends (every process of the forwarder's user).
            docker(&["exec", "-u", "65533:65533", &gone, "sh", "-c", "kill -9 -1; true"]);
            gone
            // Dropped without shutdown: the host "crashed".
        };
        let (restarted, events) = egress_sandbox(&c, port, 0);
        restarted.connect().await.unwrap();
        let sessions: Vec<_> =
            restarted.list_sessions().await.unwrap().into_iter().filter(|s| s.scope == c.scope).collect();
        let mut adopted: Vec<&SessionKey> = sessions.iter().map(|s| &s.key).collect();
        adopted.sort_by_key(|k| k.session_id.clone());
        assert_eq!(adopted, [&kept, &lost, &paused], "{sessions:?}");
        assert!(restarted.is_paused(&paused), "adopted paused");
        for k in [&kept, &paused, &lost] {
            assert_eq!(
                bash_ok(&restarted, k, &get).await.trim(),
                "reached /again",
                "the adopted session's proxy serves again ({k})"
            );
            assert!(events.lock().unwrap().iter().any(|e| e.allowed && &e.session == k), "the new host audits {k}");
        }
        assert_ne!(container_of(&restarted, &lost).await, gone, "a new container for the forwarder that died");
        assert_eq!(bash_ok(&restarted, &lost, "cat note").await, "kept\n", "on the same workspace");
        assert_eq!(restarted.metrics().sessions_created_total, 1, "the others adopted, not recreated");
        restarted.shutdown().await.unwrap();
    }

    /// Sandboxed code can neither use nor take the forwarder's channel socket (through which
    /// a channel is served every new connection of the session); the forwarder's own user
    /// can (the positive control).
    pub async fn sandboxed_code_cannot_reach_the_forwarders_channel_socket(c: Ctx) {
        set_token();
        let (port, _seen) = test_server().await;
        let (sb, _events) = egress_sandbox(&c, port, 0);
        let k = key("egress-socket");
        let probe = "import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect('/tmp/.warden-egress/channels.sock')\n    print('connected')\nexcept OSError as e:\n    print(type(e).__name__)\n";
        let out = bash_ok(&sb, &k, &format!("python3 -c \"{probe}\"; stat -c '%u %a' /tmp/.warden-egress")).await;
        assert_eq!(out, "PermissionError\n65533 700\n", "{out}");
        let id = container_of(&sb, &k).await;
        let control = docker(&["exec", "-u", "65533:65533", &id, "python3", "-c", probe]);
        assert_eq!(control, "connected\n", "the forwarder's user connects");
        sb.shutdown().await.unwrap();
    }

    /// A pool container's forwarder has no channel: a tool in it reaches nothing. Once
    /// bound, each session's connections are served (and audited) as that session's.
    pub async fn a_pool_container_reaches_nothing_until_bound_and_each_session_is_its_own(c: Ctx) {
        set_token();
        let (port, _seen) = test_server().await;
        let (sb, events) = egress_sandbox(&c, port, 1);
        sb.connect().await.unwrap();
        pool_ready(&sb, 1).await;
        let waiting = pooled(&c.scope);
        assert_eq!(waiting.len(), 1, "{waiting:?}");
        let curl = format!("curl -sS --max-time 10 --noproxy '' -x http://127.0.0.1:3128 http://127.0.0.1:{port}/pool");
        let out = std::process::Command::new("docker")
            .args(["exec", "-u", "1000:1000", &waiting[0], "sh", "-c", &format!("{curl}; echo exit=$?")])
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(!out.contains("reached") && !out.contains("exit=0"), "a pool container reaches nothing: {out}");
        let (a, b) = (key("egress-a"), key("egress-b"));
        // Positive control: the same request from the same container, once bound to `a`.
        assert_eq!(bash_ok(&sb, &a, &curl).await.trim(), "reached /pool");
        assert_eq!(container_of(&sb, &a).await, waiting[0], "the pool's container");
        assert_eq!(bash_ok(&sb, &b, &curl).await.trim(), "reached /pool");
        let seen: Vec<SessionKey> =
            events.lock().unwrap().iter().filter(|e| e.allowed).map(|e| e.session.clone()).collect();
        assert_eq!(seen, [a.clone(), b.clone()], "each connection audited as its own session's");
        sb.end_session(&a).await.unwrap();
        assert_eq!(bash_ok(&sb, &b, &curl).await.trim(), "reached /pool", "another session's end leaves b's");
        sb.shutdown().await.unwrap();
    }
}

mod boundary {
    use super::*;
    use proptest::strategy::{Just, Strategy, ValueTree};
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

    /// Command lines of every process in the session container (as the sandbox user sees).
    /// A line-per-request session process (`sh -c script`), asked over its stdio: each
    /// request line is answered `ok <line>`.
    struct LineServer {
        stdin: Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
        stdout: tokio::io::BufReader<Pin<Box<dyn tokio::io::AsyncRead + Send>>>,
        settler: warden_sandbox::Settler,
    }

    impl LineServer {
        async fn start(sb: &Sandbox, k: &SessionKey, script: &str) -> LineServer {
            let argv: Vec<String> = ["sh", "-c", script].map(String::from).into();
            let process = sb.spawn_process(k, &argv, &[]).await.expect("session process");
            let settler = process.settler();
            LineServer { stdin: process.stdin, stdout: tokio::io::BufReader::new(process.stdout), settler }
        }

        async fn ask(&mut self, line: &str) {
            use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
            self.stdin.write_all(format!("{line}\n").as_bytes()).await.unwrap();
            self.stdin.flush().await.unwrap();
            let mut answer = String::new();
            tokio::time::timeout(Duration::from_secs(30), self.stdout.read_line(&mut answer)).await.unwrap().unwrap();
            assert_eq!(answer.trim_end(), format!("ok {line}"), "the session process answers");
        }
    }

    async fn processes(sb: &Sandbox, k: &SessionKey) -> String {
        bash_ok(sb, k, "for p in /proc/[0-9]*; do tr '\\0' ' ' 2>/dev/null < $p/cmdline && echo; done").await
    }

    /// Regression (issue 11): `setsid`, `setsid -f`, double fork and `nohup … & disown`
    /// all survived their call.
    pub async fn detached_processes_end_with_their_call(c: Ctx) {
        let sb = c.sandbox();
        let k = key("detached");
        bash_ok(
            &sb,
            &k,
            "setsid sleep 1001 & setsid -f bash -c 'while :; do sleep 1; done'; (sleep 1002 &); \
             nohup sleep 1003 >/dev/null 2>&1 & disown; setsid bash -c '(sleep 1004 &)' ; echo started",
        )
        .await;
        let ps = processes(&sb, &k).await;
        for leftover in ["sleep 1001", "while :", "sleep 1002", "sleep 1003", "sleep 1004"] {
            assert!(!ps.contains(leftover), "`{leftover}` outlived its call:\n{ps}");
        }
        assert!(ps.contains("sleep infinity"), "the container's main process survives:\n{ps}");
        sb.shutdown().await.unwrap();
    }

    /// Regression (second review): a program left running by a session process (an MCP
    /// server running git, whose `core.fsmonitor` the model wrote) was orphaned to init and
    /// ran until some command ended, beside that command, able to read its environment.
    /// Orphans are killed before every command starts; the session process lives on.
    pub async fn an_orphan_of_a_session_process_never_runs_beside_a_later_command(c: Ctx) {
        let sb = c.sandbox();
        let k = key("session-orphan");
        use tokio::io::AsyncBufReadExt;
        // `ready` once both orphans exist (a fixed wait let a loaded machine start them
        // after the command below had already swept).
        let argv: Vec<String> =
            ["sh", "-c", "(sleep 1007 &); (setsid sleep 1008 &); echo ready; exec cat"].map(String::from).into();
        let mut process = sb.spawn_process(&k, &argv, &[]).await.expect("session process");
        let mut ready = String::new();
        let mut stdout = tokio::io::BufReader::new(&mut process.stdout);
        tokio::time::timeout(Duration::from_secs(30), stdout.read_line(&mut ready)).await.unwrap().unwrap();
        assert_eq!(ready.trim_end(), "ready");
        // Whole command lines: the session process's own (`sh -c (sleep 1007 &); …`) names
        // the orphans until it has exec'd `cat`, which may come after `ready` on a loaded
        // machine (a substring match failed on that). Every later command's listing must
        // be free of orphans, until one shows the session process as `cat`.
        let until = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let ps = processes(&sb, &k).await;
            for orphan in ["sleep 1007", "sleep 1008"] {
                assert!(!ps.lines().any(|l| l.trim() == orphan), "`{orphan}` ran beside a later command:\n{ps}");
            }
            if ps.lines().any(|l| l.trim() == "cat") {
                break;
            }
            assert!(std::time::Instant::now() < until, "the session process itself lives on as `cat`:\n{ps}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        drop(process);
        sb.shutdown().await.unwrap();
    }

    /// What a containment failure is judged by (the agent's inputs, read as root after the
    /// fact): the settled-record directory and its records, and every process's pid, ppid,
    /// state (T: stopped), start time, owner and command line.
    fn settled_evidence(container: &str) -> String {
        const SCRIPT: &str = "ls -lan /tmp/.warden-settled; for f in /tmp/.warden-settled/*; do echo \"record $f:\"; cat \"$f\"; done; \
                              echo 'pid ppid state starttime uid cmdline'; for p in /proc/[0-9]*; do \
                              echo \"${p#/proc/} $(cut -d' ' -f3,4,22 $p/stat 2>/dev/null | awk '{print $2, $1, $3}') $(stat -c %u $p) $(tr '\\0\\n' '  ' < $p/cmdline | head -c 80)\"; done";
        let out = Command::new("docker").args(["exec", "-u", "0", container, "sh", "-c", SCRIPT]).output();
        match out {
            Ok(o) => format!(
                "settled evidence:\n{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => format!("settled evidence unavailable: {e}"),
        }
    }

    /// Regression (third review): a program a session process started while serving (an
    /// MCP server's tool call running git, which ran a hook the model wrote) and kept alive
    /// was its descendant, not an orphan, so no sweep touched it: it ran beside every later
    /// command, able to read its environment. Once settled, everything a session process
    /// starts is killed before the next command starts; the process itself and the helpers
    /// it had when it settled (a `uvx`/`npx` wrapper's server) run on and keep answering.
    pub async fn what_a_settled_session_process_starts_never_runs_beside_a_later_command(c: Ctx) {
        let sb = c.sandbox();
        let k = key("session-leftover");
        // A line-per-request "server": `spawn` starts a child and a grandchild that stay.
        let script = "sleep 1011 & while read line; do \
                      if [ \"$line\" = spawn ]; then sleep 1012 & sh -c 'sleep 1013 & wait' & fi; \
                      echo \"ok $line\"; done";
        let mut server = LineServer::start(&sb, &k, script).await;
        server.ask("hello").await;
        server.settler.settle().await.expect("settled");
        server.ask("spawn").await;
        // Settling again never widens the record: the first one holds.
        server.settler.settle().await.expect("settled again");
        let line = |ps: &str, cmd: &str| ps.lines().any(|l| l.trim() == cmd);
        let ps = processes(&sb, &k).await;
        if let Some(leftover) =
            ["sleep 1012", "sleep 1013", "sh -c sleep 1013 & wait"].into_iter().find(|l| line(&ps, l))
        {
            let evidence = settled_evidence(&container_of(&sb, &k).await);
            panic!("`{leftover}` ran beside a later command:\n{ps}\n{evidence}");
        }
        assert!(line(&ps, "sleep 1011"), "a helper it had when it settled lives on:\n{ps}");
        assert!(ps.contains("while read line"), "the session process itself lives on:\n{ps}");
        server.ask("ping").await;
        // The records are root's: no sandboxed command can add to them.
        let forged = bash(&sb, &k, "echo 1 1 > /tmp/.warden-settled/1-1").await;
        assert!(forged.is_error, "a command wrote a record: {}", forged.content);
        drop(server);
        sb.shutdown().await.unwrap();
    }

    /// Regression (attacker review, finding 8): the agent contained settled session
    /// processes and swept orphans only when a command (Bash, Glob, Grep) started, so what a
    /// session process's call left running (an MCP server's git running a hook the model
    /// wrote: a child kept alive, a double-forked daemon) ran on through every later file
    /// or MCP call until some command started, its egress judged by the operator's full
    /// list. The host contains the session after each such call (`Sandbox::contain`): both
    /// end then, with no command in between; every file operation ends orphans too. The
    /// server itself lives on and answers.
    pub async fn regression_a_session_process_calls_leftover_outlived_it(c: Ctx) {
        let sb = c.sandbox();
        let k = key("process-call-leftover");
        // A line-per-request "server": `call` leaves a child and a double-forked daemon.
        let script = "while read line; do \
                      if [ \"$line\" = call ]; then sleep 1021 & (setsid sleep 1022 &); fi; \
                      echo \"ok $line\"; done";
        let mut server = LineServer::start(&sb, &k, script).await;
        server.ask("hello").await;
        server.settler.settle().await.expect("settled");
        let id = container_of(&sb, &k).await;
        // Seen from outside: no command runs in between (a command's start would contain).
        let top = || container_ps(&id);
        let running = |ps: &str, cmd: &str| ps.lines().any(|l| l.trim_end().ends_with(cmd));

        server.ask("call").await;
        let killed = sb.contain(&k).await.expect("contained");
        let ps = top();
        if let Some(left) = ["sleep 1021", "sleep 1022"].into_iter().find(|l| running(&ps, l)) {
            panic!("`{left}` outlived the call that started it:\n{ps}\n{}", settled_evidence(&id));
        }
        assert!(killed >= 2, "contain says what it killed: {killed}\n{ps}");
        assert!(ps.contains("while read line"), "the session process itself lives on:\n{ps}");
        server.ask("ping").await;

        // A file tool alone ends the daemon (an orphan: no live call owns it).
        server.ask("call").await;
        let w = tool(&sb, &k, "Write", json!({"file_path": "/workspace/after-call", "content": "x"})).await;
        assert!(!w.is_error, "{}", w.content);
        let ps = top();
        assert!(!running(&ps, "sleep 1022"), "a daemon of the call ran on through a file tool:\n{ps}");
        sb.contain(&k).await.expect("contained");
        let ps = top();
        assert!(!running(&ps, "sleep 1021"), "contain ended the call's child:\n{ps}");

        // A session this sandbox does not hold has nothing to contain, and gets no container.
        assert_eq!(sb.contain(&key("never-used")).await.expect("nothing to contain"), 0);
        assert!(!sb.list_sessions().await.unwrap().iter().any(|s| s.key == key("never-used")), "no container made");
        drop(server);
        sb.shutdown().await.unwrap();
    }

    /// Waits until the session's workspace holds `name` (a command says it runs), through
    /// Read, which takes no lane.
    async fn wait_for_workspace_file(sb: &Sandbox, k: &SessionKey, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let read = sb.call_tool(k, "Read", json!({"file_path": format!("/workspace/{name}")}), &[]).await;
            if matches!(read, Ok(ToolOutput { is_error: false, .. })) {
                return;
            }
            assert!(Instant::now() < deadline, "{name} never appeared: {read:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Regression (attacker review, finding 6): every command of a session runs as one uid,
    /// so task B's command (no secrets, prompt-injected) read `/proc/<pid>/environ` of task
    /// A's command running at the same time with `tool_context` secrets. Commands with
    /// different secrets never run at the same time (secret lanes): whichever starts
    /// second waits for the first, B never sees the secret, and both calls complete.
    pub async fn regression_a_concurrent_call_read_another_tasks_secrets_from_proc(c: Ctx) {
        let sb = c.sandbox();
        let k = key("secret-lanes");
        const SECRET: &str = "tok-4e1d2b9a07c3f865";
        let env = vec![("API_TOKEN".to_string(), SECRET.to_string())];
        // B reads every environment it can, for about 3 s, in a loop.
        let steal = |tag: &str| {
            format!(
                "touch /workspace/{tag}; for i in $(seq 30); do \
                 cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -a '^API_TOKEN='; sleep 0.1; done; echo b-done"
            )
        };
        let spawn_call = |command: String, env: Vec<(String, String)>| {
            let (sb, k) = (sb.clone(), k.clone());
            tokio::spawn(async move { sb.call_tool(&k, "Bash", json!({ "command": command }), &env).await })
        };
        bash_ok(&sb, &k, "true").await;

        // B first; A (with the secret) arrives while B reads.
        let b = spawn_call(steal("b-runs"), vec![]);
        wait_for_workspace_file(&sb, &k, "b-runs").await;
        let a = sb.call_tool(&k, "Bash", json!({"command": "sleep 2; echo a-done"}), &env).await.unwrap();
        let b = b.await.unwrap().unwrap();
        assert!(!b.content.contains(SECRET), "B read A's secret: {}", b.content);
        assert!(!b.is_error && b.content.ends_with("b-done\n"), "B completes: {}", b.content);
        assert_eq!(a.content, "a-done\n", "A completes");

        // A first; B arrives while A runs.
        let a = spawn_call("touch /workspace/a-runs; sleep 3; echo a-done".into(), env.clone());
        wait_for_workspace_file(&sb, &k, "a-runs").await;
        let b = sb.call_tool(&k, "Bash", json!({ "command": steal("b-again") }), &[]).await.unwrap();
        let a = a.await.unwrap().unwrap();
        assert!(!b.content.contains(SECRET), "B read A's secret: {}", b.content);
        assert!(!b.is_error && b.content.ends_with("b-done\n"), "B completes: {}", b.content);
        assert_eq!(a.content, "a-done\n", "A completes");

        // Calls with the same secrets (or none) still run side by side.
        let started = Instant::now();
        let both = futures_util::future::join(
            sb.call_tool(&k, "Bash", json!({"command": "sleep 4"}), &env),
            sb.call_tool(&k, "Bash", json!({"command": "sleep 4"}), &env),
        )
        .await;
        assert!(both.0.is_ok() && both.1.is_ok(), "{both:?}");
        let took = started.elapsed();
        assert!(took < Duration::from_millis(7500), "one fingerprint waited for itself: {took:?}");
        sb.shutdown().await.unwrap();
    }

    /// Regression (egress review): a command that SIGKILLs its own agent (`kill -9 $PPID`)
    /// skipped the agent's sweep, so a `setsid` child outlived the call (and its egress
    /// narrowing) until some later command's sweep.
    pub async fn a_command_that_kills_its_agent_leaves_nothing_behind(c: Ctx) {
        let sb = c.sandbox();
        let k = key("agent-killer");
        let out = bash(&sb, &k, "setsid sleep 1005 & setsid -f sleep 1006; sleep 0.5; kill -9 $PPID; sleep 5").await;
        assert!(out.is_error, "the call reports the kill: {}", out.content);
        // Checked from outside (no tool runs from here on), so the call above must have swept.
        let ps = sb
            .list_sessions()
            .await
            .unwrap()
            .into_iter()
            .find(|s| s.key == k && s.scope == c.scope)
            .map(|s| container_ps(&s.container_id))
            .unwrap();
        for leftover in ["sleep 1005", "sleep 1006"] {
            assert!(!ps.contains(leftover), "`{leftover}` outlived its call:\n{ps}");
        }
        sb.shutdown().await.unwrap();
    }

    /// Regression (issue 11): after a host crash, the commands of interrupted tasks kept
    /// running in the adopted container.
    pub async fn adoption_kills_commands_of_the_dead_host(c: Ctx) {
        let k = key("adopt-kill");
        {
            // With a pool, whose containers the crash leaves behind too.
            let crashed = c.sandbox_with(|cfg| cfg.warm_pool = 2);
            bash_ok(&crashed, &k, "true").await;
            let id = container_of(&crashed, &k).await;
            // A command still running when the host died (started outside any agent call).
            docker(&["exec", "-d", "-u", "1000:1000", &id, "sleep", "1234"]);
            docker(&["exec", "-d", "-u", "1000:1000", &id, "setsid", "sleep", "1235"]);
            std::thread::sleep(Duration::from_millis(300));
            pool_ready(&crashed, 2).await;
            // Dropped without shutdown: the host "crashed".
        }
        let restarted = c.sandbox();
        restarted.connect().await.unwrap();
        let ps = processes(&restarted, &k).await;
        assert!(!ps.contains("sleep 1234") && !ps.contains("sleep 1235"), "{ps}");
        restarted.shutdown().await.unwrap();
    }

    /// Regression (issue 11): a hook planted in the persisted shell state ran while a later
    /// task's secrets were in the environment, and copied them for a third task.
    pub async fn planted_state_never_sees_a_later_tasks_secret(c: Ctx) {
        let sb = c.sandbox();
        let k = key("state-hook");
        const SECRET: &str = "tok-7f3a9c1e55d04b2a";
        // Task A (no secrets) plants every hook it can.
        bash_ok(
            &sb,
            &k,
            "printf 'env > /workspace/leak1\\n' > /workspace/hook.sh; \
             export BASH_ENV=/workspace/hook.sh ENV=/workspace/hook.sh PROMPT_COMMAND='env > /workspace/leak2'; \
             ls() { env > /workspace/leak3; command ls \"$@\"; }; export -f ls; \
             export LD_PRELOAD=/workspace/nothing.so PATH=/workspace/.b:$PATH; \
             mkdir -p .b; printf '#!/bin/sh\\nenv > /workspace/leak4\\n' > .b/ls; chmod +x .b/ls; true",
        )
        .await;
        // Task B gets the secret and copies it into exported variables and the state file.
        let env = vec![("API_TOKEN".to_string(), SECRET.to_string())];
        let o = sb
            .call_tool(
                &k,
                "Bash",
                json!({"command": "ls >/dev/null; export STOLEN=\"x$API_TOKEN\" ALSO=$API_TOKEN; echo ok"}),
                &env,
            )
            .await
            .unwrap();
        assert_eq!(o.content, "ok\n", "B runs normally");
        // Task C (no secrets) looks everywhere it can.
        let seen = bash_ok(
            &sb,
            &k,
            "cat /workspace/leak* 2>/dev/null; env; grep -rl -- 'tok-7f3a' /workspace /tmp 2>/dev/null; echo done",
        )
        .await;
        assert!(!seen.contains(SECRET) && !seen.contains("tok-7f3a"), "{seen}");
        assert!(!seen.contains("BASH_ENV") && !seen.contains("LD_PRELOAD"), "{seen}");
        sb.shutdown().await.unwrap();
    }

    /// Review finding: a command of the sandbox user opened its agent's /proc entries
    /// (stdin, stdout, environment) and forged results, injected requests and read a later
    /// task's secrets. The agent drops from root to that user, which makes it non-dumpable.
    pub async fn commands_cannot_reach_their_agent(c: Ctx) {
        let sb = c.sandbox();
        let k = key("agent-reach");
        let probe = "for p in /proc/[0-9]*; do \
              [ \"$(awk '/^PPid:/ {print $2}' $p/status 2>/dev/null)\" = 0 ] || continue; \
              [ \"$(awk '/^Uid:/ {print $2}' $p/status)\" = 1000 ] || continue; \
              echo agent; ls $p/fd >/dev/null 2>&1 && echo OPENED-FD; cat $p/environ >/dev/null 2>&1 && echo READ-ENV; \
              tr '\\0' '\\n' 2>/dev/null < $p/environ | sed -n 's/^\\([A-Za-z_][A-Za-z0-9_]*\\)=.*/NAME \\1/p'; \
              head -c 1 $p/mem >/dev/null 2>&1 && echo READ-MEM; \
              printf 'r\\0\\0\\0\\0' > $p/fd/1 2>/dev/null && echo WROTE-STDOUT; \
              printf 'x' > $p/fd/0 2>/dev/null && echo WROTE-STDIN; done; true";
        let out = bash_ok(&sb, &k, probe).await;
        assert!(out.contains("agent"), "the probe found the agent: {out}");
        // gVisor lists a non-dumpable process's descriptors and shows its environment to
        // its user (Linux does neither): what matters holds under both — its descriptors
        // cannot be opened, its memory not read, and its environment is the container's
        // own, which every command has (no task's variable, nothing of the host).
        let tolerated: &[&str] = if c.runtime == Some(GVISOR) { &["OPENED-FD", "READ-ENV"] } else { &[] };
        for breach in ["OPENED-FD", "READ-ENV", "READ-MEM", "WROTE-STDOUT", "WROTE-STDIN"] {
            assert!(tolerated.contains(&breach) || !out.contains(breach), "{breach}: {out}");
        }
        if out.contains("READ-ENV") {
            assert!(out.contains("NAME PATH"), "the environment check read the environment: {out}");
        }
        let id = container_of(&sb, &k).await;
        let public = docker(&["inspect", "--format", "{{range .Config.Env}}{{println .}}{{end}}", &id]);
        for name in out.lines().filter_map(|l| l.strip_prefix("NAME ")) {
            let known = public.lines().any(|l| l.split('=').next() == Some(name));
            assert!(
                known || ["HOME", "HOSTNAME", "PWD"].contains(&name),
                "the agent's environment holds {name}: {out}"
            );
        }
        assert_eq!(bash_ok(&sb, &k, "echo in-step").await, "in-step\n");
        sb.shutdown().await.unwrap();
    }

    /// Regression (issue 11): a command printing far more than the cap reported "84 bytes"
    /// truncated; the note must state what was really dropped.
    pub async fn truncation_note_states_the_real_size(c: Ctx) {
        let sb = c.sandbox_with(|cfg| cfg.max_output = warden_sandbox::ByteSize(16 * 1024));
        let k = key("trunc");
        let o =
            bash(&sb, &k, "head -c 20000000 /dev/zero | tr '\\0' q; echo; head -c 3000000 /dev/zero | tr '\\0' z >&2")
                .await;
        let dropped: Vec<u64> = o
            .content
            .match_indices("[... ")
            .map(|(at, _)| {
                let rest = &o.content[at + 5..];
                rest[..rest.find(' ').unwrap()].parse().unwrap()
            })
            .collect();
        assert_eq!(dropped.len(), 2, "one note per stream: {}", &o.content[..200.min(o.content.len())]);
        let kept_a = o.content.matches('q').count() as u64;
        let kept_b = o.content.matches('z').count() as u64;
        // The trailing newline is always in the kept tail.
        assert_eq!(dropped[0] + kept_a, 20_000_000, "stdout: kept {kept_a} + dropped {}", dropped[0]);
        assert_eq!(dropped[1] + kept_b, 3_000_000, "stderr: kept {kept_b} + dropped {}", dropped[1]);
        assert!(o.content.len() <= 16 * 1024, "{}", o.content.len());
        sb.shutdown().await.unwrap();
    }

    /// Strings mixing text, quotes, newlines, control characters, NUL and forged protocol
    /// bytes (old end markers, frame headers).
    fn hostile_string() -> impl Strategy<Value = String> {
        let piece = proptest::prop_oneof![
            "[a-z ./*-]{0,8}",
            proptest::char::range('\0', '\u{1f}').prop_map(String::from),
            Just("\0".to_string()),
            Just("\u{1e}warden-end:0:0\n".to_string()),
            Just("r\0\0\0\u{4}".to_string()),
            Just("'\";`$(echo INJECTED)`".to_string()),
            Just("\u{7f}\u{85}é".to_string()),
        ];
        proptest::collection::vec(piece, 0..6).prop_map(|v| v.concat())
    }

    fn has_control(s: &str) -> bool {
        s.chars().any(char::is_control)
    }

    /// Property (issue 11): random bytes in every string field of every tool start at most
    /// one command, none when a field holds NUL (or, outside commands and file content, any
    /// control character), and never desynchronise the agent: the next call gets exactly
    /// its own output.
    pub async fn random_bytes_start_at_most_one_command(c: Ctx) {
        let sb = c.sandbox();
        let k = key("fuzz");
        bash_ok(&sb, &k, "mkdir -p d && echo hello > d/f.txt").await;
        let cases: usize = std::env::var("WARDEN_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(40);
        let mut runner =
            TestRunner::new_with_rng(Config::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &[11; 32]));
        let s = hostile_string();
        for i in 0..cases {
            let mut g = || s.new_tree(&mut runner).unwrap().current();
            let (a, b, cc) = (g(), g(), g());
            let calls = [
                ("Bash", json!({"command": format!("echo {a}"), "timeout": 3000}), !a.contains('\0'), true),
                ("Read", json!({"file_path": format!("d/{a}")}), !has_control(&a), false),
                (
                    "Write",
                    json!({"file_path": format!("w/{a}"), "content": b}),
                    !has_control(&a) && !b.contains('\0'),
                    false,
                ),
                (
                    "Edit",
                    json!({"file_path": "d/f.txt", "old_string": format!("zz{a}"), "new_string": b}),
                    !a.contains('\0') && !b.contains('\0'),
                    false,
                ),
                (
                    "Grep",
                    json!({"pattern": format!("x{a}"), "path": "d", "glob": cc}),
                    !has_control(&a) && !has_control(&cc),
                    true,
                ),
                ("Glob", json!({"pattern": format!("*{a}"), "path": "d"}), !has_control(&a), true),
            ];
            for (tool, input, valid, runs_command) in calls {
                let before = sb.metrics().commands_started_total;
                let r = sb.call_tool(&k, tool, input.clone(), &[]).await;
                let started = sb.metrics().commands_started_total - before;
                if !valid {
                    assert!(matches!(r, Err(SandboxError::InvalidInput { .. })), "case {i} {tool} {input}: {r:?}");
                    assert_eq!(started, 0, "case {i} {tool} {input}: refused input started a command");
                } else {
                    assert!(started <= u64::from(runs_command), "case {i} {tool} {input}: {started} commands");
                }
                let canary = format!("canary-{i}-{tool}");
                assert_eq!(
                    bash_ok(&sb, &k, &format!("echo {canary}")).await,
                    format!("{canary}\n"),
                    "after case {i} {tool} {input}"
                );
            }
        }
        let ps = processes(&sb, &k).await;
        assert!(!ps.contains("INJECTED"), "{ps}");
        sb.shutdown().await.unwrap();
    }

    /// Property (issue 11): a directory swapped for a link out of the workspace while Read
    /// and Write run never lets either leave it.
    pub async fn symlink_swaps_never_leave_the_workspace(c: Ctx) {
        let sb = c.sandbox();
        let k = key("swap");
        bash_ok(&sb, &k, "mkdir -p /tmp/out && echo OUTSIDE > /tmp/out/f && mkdir -p d && echo inside > d/f").await;
        let rounds: usize = std::env::var("WARDEN_SWAP_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(600);
        let racer = {
            let (sb, k) = (sb.clone(), k.clone());
            tokio::spawn(async move {
                sb.call_tool(
                    &k,
                    "Bash",
                    json!({"command": "end=$((SECONDS+40)); while [ $SECONDS -lt $end ] && [ ! -e stop ]; do \
                    rm -rf d; ln -s /tmp/out d; rm -f d; mkdir d; echo inside > d/f; done", "timeout": 60000}),
                    &[],
                )
                .await
            })
        };
        let (mut inside, mut refused) = (0, 0);
        for i in 0..rounds {
            let r = if i % 2 == 0 {
                sb.call_tool(&k, "Read", json!({"file_path": "d/f"}), &[]).await
            } else {
                sb.call_tool(&k, "Write", json!({"file_path": "d/f", "content": "written\n"}), &[]).await
            };
            match r {
                Ok(ref o) if !o.is_error => inside += 1,
                _ => refused += 1,
            }
            if let Ok(o) = &r {
                assert!(!o.content.contains("OUTSIDE"), "round {i}: {}", o.content);
            }
        }
        bash_ok(&sb, &k, "touch stop").await;
        racer.await.unwrap().unwrap();
        let out = bash_ok(&sb, &k, "cat /tmp/out/f; ls /tmp/out").await;
        assert_eq!(out, "OUTSIDE\nf\n", "nothing written outside the workspace");
        assert!(inside > 0, "some operations ran ({inside} ok, {refused} refused)");
        sb.shutdown().await.unwrap();
    }

    /// Regression (issue 11): `fallocate -l 5G` succeeded and could fill the host's disk.
    pub async fn disk_limit_is_enforced_by_the_kernel(c: Ctx) {
        const LIMIT: u64 = 32 * 1024 * 1024;
        let sb = c.sandbox_with(|cfg| cfg.disk = warden_sandbox::ByteSize(LIMIT));
        let k = key("disk");
        let o =
            bash(&sb, &k, "fallocate -l 5G big; echo rc=$?; head -c 50000000 /dev/zero > fill; echo rc=$?; ls").await;
        assert!(o.content.contains("No space left on device"), "{}", o.content);
        assert!(o.content.contains("reached its sandbox.disk limit"), "{}", o.content);
        assert!(!o.content.contains("rc=0"), "both writes fail: {}", o.content);
        assert!(!o.content.contains("lost+found"), "the workspace starts empty: {}", o.content);
        let w = sb.call_tool(&k, "Write", json!({"file_path": "more.txt", "content": "x".repeat(1 << 20)}), &[]).await;
        assert!(format!("{w:?}").contains("sandbox.disk"), "Write says which limit: {w:?}");
        bash_ok(&sb, &k, "rm -f fill big; echo fits > small").await;
        // The host holds at most the limit for this session: the image file's real size.
        let ws = container_of(&sb, &k).await;
        let name = docker(&["inspect", "-f", "{{range .Mounts}}{{.Name}}{{end}}", &ws]);
        let disk = name.trim().replacen("warden-ws-", "warden-disk-", 1);
        let used_kb: u64 = docker(&[
            "run",
            "--rm",
            "-v",
            &format!("{disk}:/d:ro"),
            warden_sandbox::config::DEFAULT_IMAGE,
            "du",
            "-sk",
            "/d",
        ])
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
        assert!(used_kb * 1024 <= LIMIT + 1024 * 1024, "{used_kb} KiB on the host");
        // The workspace survives a replaced container, as without a limit. (Under gVisor a
        // container killed from outside can leave the agent's exec stream open, so the next
        // call notices only at its deadline: not part of the disk boundary, see docs/operators.md.)
        if c.runtime != Some(GVISOR) {
            docker(&["kill", &ws]);
        }
        assert_eq!(bash_ok(&sb, &k, "cat small").await, "fits\n");
        sb.shutdown().await.unwrap();
    }

    /// Write and Edit never build or send more than the text-file limit: an Edit that
    /// replaces every byte of a file with a long string is refused before it is built.
    pub async fn oversized_writes_and_edits_are_refused(c: Ctx) {
        let sb = c.sandbox();
        let k = key("oversize");
        bash_ok(&sb, &k, "head -c 100000 /dev/zero | tr '\\0' a > f").await;
        let e = tool(
            &sb,
            &k,
            "Edit",
            json!({"file_path": "f", "old_string": "a", "new_string": "b".repeat(400), "replace_all": true}),
        )
        .await;
        assert!(e.is_error && e.content.contains("over Edit's"), "{}", e.content);
        assert_eq!(bash_ok(&sb, &k, "wc -c < f").await, "100000\n", "file unchanged");
        let big = "x".repeat(33 * 1024 * 1024);
        let w = tool(&sb, &k, "Write", json!({"file_path": "g", "content": big})).await;
        assert!(w.is_error && w.content.contains("over Write's"), "{}", w.content);
        sb.shutdown().await.unwrap();
    }

    /// Read and Grep of a link to a denied file report the resolved path, so the approval
    /// policy can judge the file that would really be read.
    pub async fn resolved_path_follows_links_inside_only(c: Ctx) {
        let sb = c.sandbox();
        let k = key("resolve");
        bash_ok(
            &sb,
            &k,
            "echo SECRET > .env; mkdir -p docs; ln -s ../.env docs/link-to-env; ln -s /etc/passwd docs/out",
        )
        .await;
        let path = |p: &'static str| {
            let (sb, k) = (sb.clone(), k.clone());
            async move { sb.resolve_path(&k, p).await.map(|r| (r.path, r.other_names)) }
        };
        assert_eq!(path("docs/link-to-env").await.unwrap(), ("/workspace/.env".into(), false));
        assert_eq!(path("/workspace/docs/../docs/link-to-env").await.unwrap().0, "/workspace/.env");
        assert!(matches!(path("docs/out").await, Err(SandboxError::PathOutsideWorkspace { .. })));
        assert_eq!(path("docs/new/file").await.unwrap().0, "/workspace/docs/new/file");
        // Review finding: a hard link is another name for the same file.
        bash_ok(&sb, &k, "ln .env docs/notes.txt").await;
        assert_eq!(path("docs/notes.txt").await.unwrap(), ("/workspace/docs/notes.txt".into(), true));
        sb.shutdown().await.unwrap();
    }
}

/// Issue 16 item 3: sessions placed over several Docker hosts. Both hosts are the local
/// engine: its socket, and a TLS endpoint with client-certificate verification in front
/// of it (`tests/support/tls_proxy.py`: socat cannot serve the TLS 1.3 resumption rustls
/// does when it verifies clients), so placement, a replica reaching a session, a host going down and the
/// scope rules are all exercised on one machine.
mod hosts {
    use super::*;
    use std::path::{Path, PathBuf};
    use warden_sandbox::config::DEFAULT_DOCKER_ENDPOINT;
    use warden_sandbox::{DockerHost, DockerTls};

    /// A CA, a server certificate for 127.0.0.1 and a client certificate, made with the
    /// `openssl` CLI in a scratch directory.
    struct Certs {
        dir: tempfile::TempDir,
    }

    fn openssl(dir: &Path, args: &[&str]) {
        let out = Command::new("openssl").current_dir(dir).args(args).output().expect("the openssl CLI is required");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// A P-256 key and a certificate signed by `ca` (or self-signed as a CA when `None`).
    fn issue(dir: &Path, name: &str, ca: Option<&str>, ext: &str) {
        let (key, crt) = (format!("{name}.key"), format!("{name}.pem"));
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", &key];
        let subj = format!("/CN=warden-test-{name}");
        match ca {
            None => {
                let mut a = vec!["req", "-x509", "-days", "1", "-subj", &subj, "-out", &crt];
                a.extend(ec);
                a.extend(["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=keyCertSign,cRLSign"]);
                openssl(dir, &a);
            }
            Some(ca) => {
                let csr = format!("{name}.csr");
                let mut a = vec!["req", "-subj", &subj, "-out", &csr];
                a.extend(ec);
                openssl(dir, &a);
                std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
                let (ca_crt, ca_key, extfile) = (format!("{ca}.pem"), format!("{ca}.key"), format!("{name}.ext"));
                openssl(
                    dir,
                    &[
                        "x509",
                        "-req",
                        "-days",
                        "1",
                        "-in",
                        &csr,
                        "-CA",
                        &ca_crt,
                        "-CAkey",
                        &ca_key,
                        "-CAcreateserial",
                        "-out",
                        &crt,
                        "-extfile",
                        &extfile,
                    ],
                );
            }
        }
    }

    impl Certs {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let d = dir.path();
            issue(d, "ca", None, "");
            issue(d, "server", Some("ca"), "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n");
            issue(d, "client", Some("ca"), "extendedKeyUsage=clientAuth\n");
            // A client certificate from a CA the endpoint does not trust.
            issue(d, "rogue-ca", None, "");
            issue(d, "rogue", Some("rogue-ca"), "extendedKeyUsage=clientAuth\n");
            Self { dir }
        }

        fn path(&self, file: &str) -> PathBuf {
            self.dir.path().join(file)
        }

        fn tls(&self, client: &str) -> DockerTls {
            DockerTls {
                ca: self.path("ca.pem"),
                cert: self.path(&format!("{client}.pem")),
                key: self.path(&format!("{client}.key")),
            }
        }
    }

    /// A proxy terminating TLS (client certificates verified against the test CA) in front
    /// of the local engine's socket. Stopped (with every connection it serves) on drop.
    struct TlsProxy {
        port: u16,
        child: Option<std::process::Child>,
    }

    impl TlsProxy {
        fn start(certs: &Certs, port: u16) -> Self {
            use std::os::unix::process::CommandExt;
            let socket = DEFAULT_DOCKER_ENDPOINT.trim_start_matches("unix://");
            let python = std::env::var("WARDEN_PYTHON").unwrap_or_else(|_| "python3".into());
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/tls_proxy.py");
            let child = Command::new(&python)
                .arg(script)
                .arg(port.to_string())
                .args([certs.path("server.pem"), certs.path("server.key"), certs.path("ca.pem")])
                .arg(socket)
                .stderr(std::process::Stdio::null())
                .process_group(0)
                .spawn()
                .unwrap_or_else(|e| panic!("{python} is required for these tests: {e}"));
            // Listening within a few seconds.
            let deadline = Instant::now() + Duration::from_secs(10);
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(Instant::now() < deadline, "the TLS proxy never listened on 127.0.0.1:{port}");
                std::thread::sleep(Duration::from_millis(50));
            }
            Self { port, child: Some(child) }
        }

        fn endpoint(&self) -> String {
            format!("tcp://127.0.0.1:{}", self.port)
        }

        /// Stops the proxy and every connection it serves (the host is down).
        fn stop(&mut self) {
            if let Some(mut c) = self.child.take() {
                let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", c.id())]).status();
                let _ = c.wait();
            }
        }
    }

    impl Drop for TlsProxy {
        fn drop(&mut self) {
            self.stop();
        }
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    /// The local socket first, the TLS endpoint second.
    fn two_hosts(c: &Ctx, certs: &Certs, proxy: &TlsProxy, client: &str) -> Sandbox {
        c.sandbox_with(|cfg| {
            cfg.warm_pool = 0;
            cfg.hosts = vec![
                DockerHost { endpoint: DEFAULT_DOCKER_ENDPOINT.into(), tls: None },
                DockerHost { endpoint: proxy.endpoint(), tls: Some(certs.tls(client)) },
            ];
        })
    }

    async fn host_of(sb: &Sandbox, k: &SessionKey) -> String {
        let s = sb.list_sessions().await.unwrap();
        let mine: Vec<_> = s.iter().filter(|i| &i.key == k && i.scope == sb.config().scope).collect();
        assert_eq!(mine.len(), 1, "exactly one container for {k}: {s:?}");
        mine[0].docker_host.clone()
    }

    pub async fn placement_spreads_sessions_and_a_replica_reaches_them(c: Ctx) {
        let certs = Certs::new();
        let proxy = TlsProxy::start(&certs, free_port());
        let sb = two_hosts(&c, &certs, &proxy, "client");
        // The replica is up (connected to both hosts, nothing to adopt) before the sessions exist.
        let replica = two_hosts(&c, &certs, &proxy, "client");
        replica.connect().await.unwrap();
        let statuses = replica.ping_hosts().await;
        assert!(statuses.iter().all(|s| s.error.is_none()), "{statuses:?}");
        let keys: Vec<SessionKey> = (0..4).map(|i| key(&format!("spread{i}"))).collect();
        for (i, k) in keys.iter().enumerate() {
            let w = tool(&sb, k, "Write", json!({"file_path": "who.txt", "content": format!("session {i}")})).await;
            assert!(!w.is_error, "{}", w.content);
        }
        let mut on = std::collections::HashMap::<String, Vec<&SessionKey>>::new();
        for k in &keys {
            on.entry(host_of(&sb, k).await).or_default().push(k);
        }
        assert_eq!(on.get(DEFAULT_DOCKER_ENDPOINT).map(Vec::len), Some(2), "least-loaded placement: {on:?}");
        assert_eq!(on.get(&proxy.endpoint()).map(Vec::len), Some(2), "least-loaded placement: {on:?}");
        // The replica reaches a session on the TLS host: same container, same workspace.
        let remote = on[&proxy.endpoint()][0].clone();
        let id = container_of(&sb, &remote).await;
        let want = bash_ok(&sb, &remote, "cat who.txt").await;
        let got = tool(&replica, &remote, "Read", json!({"file_path": "who.txt"})).await;
        assert!(!got.is_error && got.content.contains(&want), "replica read {:?}, want {want:?}", got.content);
        assert_eq!(bash_ok(&replica, &remote, "cat who.txt").await, want);
        let listed = replica.list_sessions().await.unwrap();
        let row = listed.iter().find(|i| i.key == remote).unwrap();
        assert_eq!((row.container_id.as_str(), row.docker_host.as_str()), (id.as_str(), proxy.endpoint().as_str()));
        assert!(row.owned_here, "the replica holds it now: {row:?}");
        assert_eq!(listed.iter().filter(|i| i.scope == c.scope).count(), 4, "no container was made twice: {listed:?}");
        replica.shutdown().await.unwrap();
        sb.shutdown().await.unwrap();
    }

    /// An HTTPS server (the test CA's `server` certificate) on the host's 127.0.0.1,
    /// answering every GET `ok`; killed on drop.
    struct HttpsServer(std::process::Child, u16);

    impl HttpsServer {
        fn start(certs: &Certs) -> HttpsServer {
            let port = free_port();

            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/https_server.py");
            let child = Command::new("python3")
                .arg(script)
                .arg(port.to_string())
                .args([certs.path("server.pem"), certs.path("server.key")])
                .spawn()
                .unwrap();
            let until = Instant::now() + Duration::from_secs(10);
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(Instant::now() < until, "the HTTPS server never listened");
                std::thread::sleep(Duration::from_millis(50));
            }
            HttpsServer(child, port)
        }
    }

    impl Drop for HttpsServer {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Issue 49, remote Docker hosts: a session on a TLS endpoint reaches the proxy (its
    /// channel goes through the Docker API over TLS): the allowed server, with the
    /// credential, an HTTPS server end to end (CONNECT, TLS, GET, three in a row); the
    /// denied and the unlisted hosts refused.
    pub async fn egress_reaches_the_proxy_from_a_tls_docker_host(c: Ctx) {
        let certs = Certs::new();
        let proxy = TlsProxy::start(&certs, free_port());
        let https = HttpsServer::start(&certs);
        super::egress::set_token();
        let (port, seen) = super::egress::test_server().await;
        let sb = c.sandbox_with(|cfg| {
            cfg.warm_pool = 0;
            cfg.hosts = vec![DockerHost { endpoint: proxy.endpoint(), tls: Some(certs.tls("client")) }];
            cfg.egress = Some(super::egress::egress_config(port, &[https.1]));
        });
        let events = super::egress::record_decisions(&sb);
        let k = key("remote-egress");
        let get = format!("curl -sS --max-time 20 --noproxy '' http://127.0.0.1:{port}/remote");
        assert_eq!(bash_ok(&sb, &k, &get).await.trim(), "reached /remote");
        assert_eq!(host_of(&sb, &k).await, proxy.endpoint(), "the session is on the TLS host");
        assert!(
            String::from_utf8_lossy(&seen.lock().unwrap()[0]).to_ascii_lowercase().contains("x-warden-test: token")
        );
        let tls = format!(
            "for i in 1 2 3; do curl -k -sS --max-time 20 --noproxy '' https://127.0.0.1:{}/; echo; done",
            https.1
        );
        assert_eq!(bash_ok(&sb, &k, &tls).await, "ok\nok\nok\n", "HTTPS through the tunnel");
        for (url, rule) in [("http://denied.example/", "deny `denied.example`"), ("http://1.1.1.1/", "no allow entry")]
        {
            let o = bash(&sb, &k, &format!("curl -sS --max-time 20 {url}")).await;
            assert!(o.content.contains(rule), "{url}: {}", o.content);
        }
        assert!(events.lock().unwrap().iter().any(|e| e.allowed && e.session == k), "{:?}", events.lock().unwrap());
        sb.end_session(&k).await.unwrap();
        sb.shutdown().await.unwrap();
    }

    pub async fn the_tls_endpoint_refuses_clients_without_a_trusted_certificate(c: Ctx) {
        let certs = Certs::new();
        let proxy = TlsProxy::start(&certs, free_port());
        let url = format!("https://127.0.0.1:{}/_ping", proxy.port);
        let curl = |extra: &[&str]| {
            let ca = certs.path("ca.pem");
            let mut cmd = Command::new("curl");
            cmd.args(["-sS", "--max-time", "10", "--cacert"]).arg(&ca).args(extra).arg(&url);
            cmd.output().expect("the curl CLI is required")
        };
        let anonymous = curl(&[]);
        assert!(
            !anonymous.status.success() && !String::from_utf8_lossy(&anonymous.stdout).contains("OK"),
            "a client without a certificate got through: {anonymous:?}"
        );
        let (cert, key_file) = (certs.path("client.pem"), certs.path("client.key"));
        let (cert, key_file) = (cert.to_str().unwrap(), key_file.to_str().unwrap());
        let trusted = curl(&["--cert", cert, "--key", key_file]);
        assert_eq!(String::from_utf8_lossy(&trusted.stdout), "OK", "{trusted:?}");
        // warden with a certificate from another CA: that host fails, naming itself; the
        // socket answers, so the sandbox is ready and new sessions go there.
        let sb = two_hosts(&c, &certs, &proxy, "rogue");
        let statuses = sb.ping_hosts().await;
        assert_eq!(statuses[0].error, None, "{statuses:?}");
        let err = statuses[1].error.as_deref().expect("an untrusted client certificate is refused");
        assert!(err.contains(&proxy.endpoint()), "{err}");
        sb.ping().await.unwrap();
        let k = key("rogue");
        bash_ok(&sb, &k, "true").await;
        assert_eq!(host_of(&sb, &k).await, DEFAULT_DOCKER_ENDPOINT);
        sb.shutdown().await.unwrap();
    }

    pub async fn a_host_that_is_down_fails_only_its_sessions(c: Ctx) {
        let certs = Certs::new();
        let port = free_port();
        let mut proxy = TlsProxy::start(&certs, port);
        let endpoint = proxy.endpoint();
        let sb = two_hosts(&c, &certs, &proxy, "client");
        let (local, remote) = (key("on-socket"), key("on-tls"));
        bash_ok(&sb, &local, "echo a > a.txt").await;
        bash_ok(&sb, &remote, "echo b > b.txt").await;
        assert_eq!(host_of(&sb, &local).await, DEFAULT_DOCKER_ENDPOINT);
        assert_eq!(host_of(&sb, &remote).await, endpoint);
        proxy.stop();
        let err = sb.call_tool(&remote, "Bash", json!({"command": "cat b.txt"}), &[]).await.unwrap_err();
        assert!(matches!(err, SandboxError::DockerUnavailable(_)) && err.to_string().contains(&endpoint), "{err}");
        assert_eq!(bash_ok(&sb, &local, "cat a.txt").await, "a\n", "the other host keeps serving");
        let fresh = key("while-down");
        bash_ok(&sb, &fresh, "true").await;
        assert_eq!(host_of(&sb, &fresh).await, DEFAULT_DOCKER_ENDPOINT, "new sessions go to the healthy host");
        let statuses = sb.ping_hosts().await;
        assert!(statuses[0].error.is_none() && statuses[1].error.as_deref().is_some_and(|e| e.contains(&endpoint)));
        sb.ping().await.expect("ready while one host answers");
        // Back: the session is served again, from the same container and workspace.
        let proxy = TlsProxy::start(&certs, port);
        assert_eq!(bash_ok(&sb, &remote, "cat b.txt").await, "b\n");
        sb.shutdown().await.unwrap();
        drop(proxy);
    }

    pub async fn adoption_and_reaping_leave_other_scopes_alone(c: Ctx) {
        let certs = Certs::new();
        let proxy = TlsProxy::start(&certs, free_port());
        // Another deployment on the same engine.
        let other = Sandbox::new(SandboxConfig {
            scope: format!("{}other", c.scope),
            warm_pool: 0,
            ..SandboxConfig::default()
        })
        .unwrap();
        let theirs = key("theirs");
        bash_ok(&other, &theirs, "echo keep > k.txt").await;
        let their_id = container_of(&other, &theirs).await;
        // Ours: a short idle TTL; both hosts reap their own session. (Regression: with 1 s
        // the first session was reaped under CI load before the second was even listed.)
        let sb = c.sandbox_with(|cfg| {
            cfg.warm_pool = 0;
            cfg.idle_ttl = Duration::from_secs(5);
            cfg.hosts = vec![
                DockerHost { endpoint: DEFAULT_DOCKER_ENDPOINT.into(), tls: None },
                DockerHost { endpoint: proxy.endpoint(), tls: Some(certs.tls("client")) },
            ];
        });
        let (a, b) = (key("reaped-a"), key("reaped-b"));
        // Each session's container and host are read right after its command, well within
        // its idle TTL.
        bash_ok(&sb, &a, "true").await;
        let (ida, host_a) = (container_of(&sb, &a).await, host_of(&sb, &a).await);
        bash_ok(&sb, &b, "true").await;
        let (idb, host_b) = (container_of(&sb, &b).await, host_of(&sb, &b).await);
        assert_ne!(host_a, host_b, "one on each host");
        let deadline = Instant::now() + Duration::from_secs(30);
        while container_exists(&ida) || container_exists(&idb) {
            assert!(Instant::now() < deadline, "idle sessions were not reaped on both hosts");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Leftovers of ours on both hosts (a host that died), then a restart: each adopted
        // by its host, the other scope's running session untouched.
        let lefts = [key("leftover1"), key("leftover2")];
        let (mut left_ids, mut left_hosts) = (Vec::new(), Vec::new());
        for k in &lefts {
            bash_ok(&sb, k, &format!("echo {} > l.txt", k.session_id)).await;
            // Read right after its command, within its idle TTL (regression: read after the
            // second session's cold start, the first had been reaped under CI load).
            left_ids.push(container_of(&sb, k).await);
            left_hosts.push(host_of(&sb, k).await);
        }
        assert_ne!(left_hosts[0], left_hosts[1], "one on each host");
        drop(sb);
        let restarted = c.sandbox_with(|cfg| {
            cfg.warm_pool = 0;
            cfg.hosts = vec![
                DockerHost { endpoint: DEFAULT_DOCKER_ENDPOINT.into(), tls: None },
                DockerHost { endpoint: proxy.endpoint(), tls: Some(certs.tls("client")) },
            ];
        });
        restarted.connect().await.unwrap();
        for (k, id) in lefts.iter().zip(&left_ids) {
            assert_eq!(&container_of(&restarted, k).await, id, "adopted, not recreated");
            assert!(restarted.list_sessions().await.unwrap().iter().any(|i| &i.key == k && i.owned_here));
            assert_eq!(bash_ok(&restarted, k, "cat l.txt").await, format!("{}\n", k.session_id));
        }
        assert!(container_exists(&their_id), "another scope's container was touched");
        restarted.prune().await.unwrap();
        assert!(container_exists(&their_id), "prune removed another scope's running container");
        assert_eq!(bash_ok(&other, &theirs, "cat k.txt").await, "keep\n");
        restarted.shutdown().await.unwrap();
        other.shutdown().await.unwrap();
    }
}

/// Several `warden serve` processes (replicas, `sandbox.replica_id`) share one scope: a
/// session keeps its one container across them, and no replica sweeps, removes or reaps
/// what another one is using.
mod replicas {
    use super::*;

    /// A replica of this test's scope.
    fn replica(c: &Ctx, id: &str, f: impl FnOnce(&mut SandboxConfig)) -> Sandbox {
        c.sandbox_with(|cfg| {
            cfg.replica_id = Some(id.to_string());
            f(cfg);
        })
    }

    /// Waits (generously) until the session container `id` has `file` in its workspace.
    async fn wait_for_file(id: &str, file: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let path = format!("/workspace/{file}");
        loop {
            let out = Command::new("docker").args(["exec", id, "test", "-e", &path]).output().unwrap();
            if out.status.success() {
                return;
            }
            assert!(Instant::now() < deadline, "{path} never appeared in {id}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A Bash call on `sb` that announces itself (`started`) and then waits for the test
    /// to create `go` before it ends with `done`: it runs for as long as the test needs.
    fn blocking_call(sb: &Sandbox, k: &SessionKey, started: &str, go: &str) -> tokio::task::JoinHandle<ToolOutput> {
        let (sb, k) = (sb.clone(), k.clone());
        let cmd = format!("touch {started}; while [ ! -e {go} ]; do sleep 0.1; done; echo done");
        tokio::spawn(async move { bash(&sb, &k, &cmd).await })
    }

    fn release(id: &str, go: &str) {
        docker(&["exec", "-u", "1000:1000", id, "touch", &format!("/workspace/{go}")]);
    }

    async fn owned_here(sb: &Sandbox, k: &SessionKey) -> bool {
        sb.list_sessions().await.unwrap().iter().any(|i| &i.key == k && i.owned_here)
    }

    /// (a) A replica that connects adopts nothing of another live replica: the command that
    /// replica runs right now in its session goes on, its warm-pool containers stay.
    pub async fn connecting_kills_no_command_and_no_pool_of_another_replica(c: Ctx) {
        let r1 = replica(&c, "r1", |cfg| cfg.warm_pool = 1);
        let k = key("busy");
        bash_ok(&r1, &k, "echo one > f").await;
        let id = container_of(&r1, &k).await;
        pool_ready(&r1, 1).await;
        let r1_pool = pooled(&c.scope);
        assert_eq!(r1_pool.len(), 1, "{r1_pool:?}");
        let running = blocking_call(&r1, &k, "started", "go");
        wait_for_file(&id, "started").await;
        let r2 = replica(&c, "r2", |cfg| cfg.warm_pool = 1);
        r2.connect().await.unwrap();
        pool_ready(&r2, 1).await;
        assert!(!owned_here(&r2, &k).await, "r2 adopted r1's session");
        release(&id, "go");
        let out = running.await.unwrap();
        assert!(!out.is_error && out.content.contains("done"), "r1's command was killed: {}", out.content);
        for p in &r1_pool {
            assert!(container_exists(p), "r2 removed r1's pool container {p}");
        }
        assert_eq!(pooled(&c.scope).len(), 2, "one pool container each");
        assert_eq!(container_of(&r1, &k).await, id);
        r1.end_session(&k).await.unwrap();
        r2.shutdown().await.unwrap();
        r1.shutdown().await.unwrap();
    }

    /// (b) A session made on one replica is used from another: the same container and files,
    /// both ways; two replicas using a new session at once make one container; a container
    /// that vanished is made again on the same workspace, and the other replica finds it.
    pub async fn a_session_is_one_container_across_replicas(c: Ctx) {
        let r1 = replica(&c, "r1", |cfg| cfg.warm_pool = 1);
        let r2 = replica(&c, "r2", |cfg| cfg.warm_pool = 0);
        r1.connect().await.unwrap();
        pool_ready(&r1, 1).await;
        let k = key("shared");
        bash_ok(&r1, &k, "echo from-r1 > a.txt").await;
        let id = container_of(&r1, &k).await;
        let read = tool(&r2, &k, "Read", json!({"file_path": "a.txt"})).await;
        assert!(read.content.contains("from-r1"), "{}", read.content);
        bash_ok(&r2, &k, "echo from-r2 > b.txt").await;
        assert_eq!(bash_ok(&r1, &k, "cat b.txt").await, "from-r2\n");
        assert_eq!(container_of(&r2, &k).await, id, "one container");
        assert!(owned_here(&r2, &k).await);
        let hostname = bash_ok(&r1, &k, "cat /etc/hostname").await;

        // The container vanished (killed, or removed by a reaper racing a call): the next
        // call remakes it on the same workspace, and the other replica reaches that one.
        docker(&["rm", "-f", &id]);
        assert_eq!(bash_ok(&r1, &k, "cat a.txt b.txt").await, "from-r1\nfrom-r2\n", "workspace kept");
        let again = container_of(&r1, &k).await;
        assert_ne!(again, id);
        assert_eq!(bash_ok(&r2, &k, "cat a.txt").await, "from-r1\n");
        assert_eq!(container_of(&r2, &k).await, again, "r2 reached r1's new container");
        assert_ne!(bash_ok(&r2, &k, "cat /etc/hostname").await, hostname);

        // First use of a new session on both replicas at once: one container.
        let fresh = key("raced");
        let (a, b) = tokio::join!(bash_ok(&r1, &fresh, "cat /etc/hostname"), bash_ok(&r2, &fresh, "cat /etc/hostname"));
        assert_eq!(a, b, "both replicas use one container");
        container_of(&r1, &fresh).await;
        for k in [&k, &fresh] {
            r1.end_session(k).await.unwrap();
            r2.end_session(k).await.unwrap();
        }
        r2.shutdown().await.unwrap();
        r1.shutdown().await.unwrap();
    }

    /// (c) A replica whose session went idle leaves it to a replica that still uses it; the
    /// last one to use it removes it once no replica used it for the idle TTL.
    pub async fn an_idle_session_is_reaped_only_when_no_replica_uses_it(c: Ctx) {
        let ttl = |cfg: &mut SandboxConfig| {
            cfg.warm_pool = 0;
            cfg.idle_ttl = Duration::from_secs(5);
        };
        let (r1, r2) = (replica(&c, "r1", ttl), replica(&c, "r2", ttl));
        let k = key("kept-alive");
        bash_ok(&r1, &k, "echo kept > f").await;
        let id = container_of(&r1, &k).await;
        let volumes = volumes_of_session(&c.scope, &id, &k);
        let hostname = bash_ok(&r1, &k, "cat /etc/hostname").await;
        // r2 keeps using the session until r1's reaper has looked at it (and let go).
        let deadline = Instant::now() + Duration::from_secs(90);
        while owned_here(&r1, &k).await {
            assert!(Instant::now() < deadline, "r1 never let go of the session it stopped using");
            assert_eq!(bash_ok(&r2, &k, "cat f; cat /etc/hostname").await, format!("kept\n{hostname}"));
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        assert!(container_exists(&id), "r1 removed a session r2 was using");
        assert_eq!(bash_ok(&r2, &k, "cat f").await, "kept\n");
        assert_eq!(container_of(&r2, &k).await, id);
        assert_eq!(r2.metrics().sessions_created_total, 0, "r2 never made a container of its own");
        // Nobody uses it now: gone within a few TTLs (its volumes too).
        let deadline = Instant::now() + Duration::from_secs(90);
        while container_exists(&id) || volumes_of_scope(&c.scope).iter().any(|v| volumes.contains(v)) {
            assert!(Instant::now() < deadline, "a session no replica used was never reaped");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        r2.shutdown().await.unwrap();
        r1.shutdown().await.unwrap();
    }

    /// A replica that shuts down leaves its sessions to the others (their files stay); a
    /// session no replica holds any more is reaped by a live one once idle for the TTL.
    pub async fn a_replica_that_shuts_down_leaves_its_sessions_to_the_others(c: Ctx) {
        // Long enough that the steps before the reaping never look idle to anyone (with 8 s,
        // two cold starts and a shutdown under a full run's load outlasted it).
        let ttl = |cfg: &mut SandboxConfig| {
            cfg.warm_pool = 1;
            cfg.idle_ttl = Duration::from_secs(20);
        };
        let (r1, r2) = (replica(&c, "r1", ttl), replica(&c, "r2", ttl));
        r1.connect().await.unwrap();
        let (used, left) = (key("used-on"), key("left"));
        bash_ok(&r2, &used, "echo carried > f").await;
        bash_ok(&r2, &left, "true").await;
        let (used_id, left_id) = (container_of(&r2, &used).await, container_of(&r2, &left).await);
        let mut volumes = volumes_of_session(&c.scope, &used_id, &used);
        volumes.extend(volumes_of_session(&c.scope, &left_id, &left));
        r2.shutdown().await.unwrap();
        assert!(container_exists(&used_id) && container_exists(&left_id), "shutdown removed sessions");
        let r2_pool: Vec<String> = pooled(&c.scope).into_iter().filter(|p| pooled_by(p, "r2")).collect();
        assert!(r2_pool.is_empty(), "shutdown left its warm pool behind: {r2_pool:?}");
        assert_eq!(bash_ok(&r1, &used, "cat f").await, "carried\n");
        assert_eq!(container_of(&r1, &used).await, used_id);
        let deadline = Instant::now() + Duration::from_secs(90);
        while container_exists(&left_id)
            || container_exists(&used_id)
            || volumes_of_scope(&c.scope).iter().any(|v| volumes.contains(v))
        {
            assert!(Instant::now() < deadline, "sessions no replica used were never reaped");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        r1.shutdown().await.unwrap();
    }

    /// Whether pool container `id` was made by `replica`.
    fn pooled_by(id: &str, replica: &str) -> bool {
        docker(&["inspect", "--format", "{{index .Config.Labels \"warden.replica\"}}", id]).trim() == replica
    }

    /// (d) A replica restarted under its id adopts its own leftovers: its session (the agents
    /// of its earlier life and their commands swept), not its stale pool; the call another
    /// replica runs in that session meanwhile goes on.
    pub async fn a_restarted_replica_adopts_its_own_leftovers_only(c: Ctx) {
        let k = key("restarted");
        let r2 = replica(&c, "r2", |cfg| cfg.warm_pool = 0);
        let (id, stale_pool) = {
            let r1 = replica(&c, "r1", |cfg| cfg.warm_pool = 1);
            bash_ok(&r1, &k, "echo before > f").await;
            pool_ready(&r1, 1).await;
            let id = container_of(&r1, &k).await;
            (id, pooled(&c.scope))
            // Dropped without shutdown: r1 "crashed".
        };
        // What r1's dead life left running: an agent of that life (tagged as r1's agents
        // are) with its command, and the call r2 runs in the same container now.
        docker(&[
            "exec",
            "-d",
            "-u",
            "1000:1000",
            &id,
            "sh",
            "-c",
            "sleep 1234; true",
            "x",
            "y",
            "serve",
            "1000",
            "1000",
            "r1",
            "dead-life",
        ]);
        let running = blocking_call(&r2, &k, "r2-started", "r2-go");
        wait_for_file(&id, "r2-started").await;
        let r1 = replica(&c, "r1", |cfg| cfg.warm_pool = 1);
        r1.connect().await.unwrap();
        assert!(owned_here(&r1, &k).await, "r1 adopted its own session");
        assert_eq!(container_of(&r1, &k).await, id, "adopted, not recreated");
        for p in &stale_pool {
            assert!(!container_exists(p), "r1's stale pool container {p} was kept");
        }
        let ps = procs_starting_with(&r1, &k, "sleep 1234").await;
        assert!(!ps.contains("LEFT"), "the command of r1's dead life survived adoption: {ps}");
        assert_eq!(bash_ok(&r1, &k, "cat f").await, "before\n");
        release(&id, "r2-go");
        let out = running.await.unwrap();
        assert!(!out.is_error && out.content.contains("done"), "r2's command was swept: {}", out.content);
        assert_eq!(r1.metrics().sessions_created_total, 0);
        r1.end_session(&k).await.unwrap();
        r2.shutdown().await.unwrap();
        r1.shutdown().await.unwrap();
    }
}

/// Issue 40: what a command inherits or leaves behind — processes, descriptors, variables,
/// tool configuration, file names — must not change what a later allowed call runs or reads.
mod state {
    use super::*;

    /// Rounds of `concurrent_sweeps_never_stop_each_other`: each races dropped calls' kill
    /// sweeps against commands starting, so the interleavings differ from round to round.
    const FREEZER_ROUNDS: usize = 8;
    /// Commands started at once in each round.
    const FREEZER_CALLS: usize = 6;

    /// Every sweep stops all of the sandbox user's processes while it reads /proc, and the
    /// sweeps of concurrent calls, of dropped calls' kills and of file operations run at
    /// the same time. Two that stopped each other stayed stopped, with every process of the
    /// session, until a host deadline (CI: a call dropped mid-command, then the next call
    /// timed out after 120 s). Here every round drops two running calls (their kill sweeps
    /// start at once) and starts six commands and a file read beside them: each must
    /// answer with its own output, not time out. Positive control: each dropped call's
    /// command was running when it was dropped, and is gone after the round.
    pub async fn concurrent_sweeps_never_stop_each_other(c: Ctx) {
        let sb = c.sandbox();
        let k = key("freezers");
        bash_ok(&sb, &k, "echo x > probe.txt").await;
        for round in 0..FREEZER_ROUNDS {
            let marker = format!("sleep 100{round}");
            let long = json!({"command": format!("touch started-{round}-$$; {marker} & {marker}"), "timeout": 600_000});
            let dropped = (0..2).map(|_| {
                let call = sb.call_tool(&k, "Bash", long.clone(), &[]);
                async move { tokio::time::timeout(Duration::from_millis(1500), call).await.is_err() }
            });
            let dropped = futures_util::future::join_all(dropped);
            // The commands start as the dropped calls' sweeps do.
            let racers = async {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                let calls = (0..FREEZER_CALLS)
                    .map(|i| tool(&sb, &k, "Bash", json!({"command": format!("echo {round}-{i}"), "timeout": 60_000})));
                let read = tool(&sb, &k, "Read", json!({"file_path": "probe.txt"}));
                futures_util::future::join(futures_util::future::join_all(calls), read).await
            };
            let (gone, (outs, read)) = futures_util::future::join(dropped, racers).await;
            assert!(gone.iter().all(|g| *g), "round {round}: a long command returned early");
            for (i, o) in outs.iter().enumerate() {
                assert!(!o.is_error && o.content == format!("{round}-{i}\n"), "round {round}, call {i}: {}", o.content);
            }
            assert!(!read.is_error && read.content.contains('x'), "round {round}: {}", read.content);
            let started = bash_ok(&sb, &k, &format!("ls started-{round}-* | wc -l")).await;
            assert_eq!(started.trim(), "2", "round {round}: both dropped calls' commands ran");
            let until = Instant::now() + Duration::from_secs(60);
            loop {
                let left = procs_starting_with(&sb, &k, &marker).await;
                if left.is_empty() {
                    break;
                }
                assert!(Instant::now() < until, "round {round}: a dropped command kept running: {left}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        sb.shutdown().await.unwrap();
    }

    /// A command of the session stops every other agent and once-off sweep (exec roots of
    /// the sandbox user) over and over while other calls run: a sweep holding the session's
    /// turn may be among them, and every other sweep waits for that turn. The waiters
    /// continue stopped exec roots once they have waited long enough, so every call still
    /// answers. Positive control: the stopper stopped some process each pass.
    pub async fn a_command_stopping_the_agents_wedges_no_sweep(c: Ctx) {
        let sb = c.sandbox();
        let k = key("stopper");
        bash_ok(&sb, &k, "echo x > /workspace/probe.txt").await;
        // Its own agent aside: stopping that only stops its own call. One interpreter for
        // every pass (a fork per /proc entry is slow under gVisor on a loaded machine).
        const STOPPER: &str = r#"python3 - <<'PY'
import os, signal, time
sh = open("/proc/%d/stat" % os.getppid()).read()
me = int(sh[sh.rfind(")") + 2:].split()[1])  # the shell's parent: this call's agent
uid, n, end = os.getuid(), 0, time.monotonic() + 4
while time.monotonic() < end:
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == me:
            continue
        try:
            st = open("/proc/%s/stat" % p).read()
            if st[st.rfind(")") + 2:].split()[1] == "0" and os.stat("/proc/" + p).st_uid == uid:
                os.kill(int(p), signal.SIGSTOP)
                n += 1
        except OSError:
            pass
    time.sleep(0.05)
print("stops %d" % n)
PY"#;
        let stopper = tool(&sb, &k, "Bash", json!({"command": STOPPER, "timeout": 120_000}));
        let others = async {
            let mut outs = vec![];
            for round in 0..4 {
                let calls = (0..FREEZER_CALLS)
                    .map(|i| tool(&sb, &k, "Bash", json!({"command": format!("echo {round}-{i}"), "timeout": 90_000})));
                let read = tool(&sb, &k, "Read", json!({"file_path": "/workspace/probe.txt"}));
                outs.push((round, futures_util::future::join(futures_util::future::join_all(calls), read).await));
            }
            outs
        };
        let (stopper, others) = futures_util::future::join(stopper, others).await;
        let stops: usize = stopper.content.trim().strip_prefix("stops ").and_then(|n| n.parse().ok()).unwrap_or(0);
        assert!(stops > 0, "the stopper stopped exec roots: {}", stopper.content);
        for (round, (outs, read)) in others {
            for (i, o) in outs.iter().enumerate() {
                assert!(!o.is_error && o.content == format!("{round}-{i}\n"), "round {round}, call {i}: {}", o.content);
            }
            assert!(!read.is_error, "round {round}: {}", read.content);
        }
        assert_eq!(bash_ok(&sb, &k, "echo fine").await, "fine\n");
        sb.shutdown().await.unwrap();
    }

    /// Review (round 3) of the "state a command leaves behind" class, tool configuration
    /// and process settings: task A (no secrets) plants what the image's tools read at
    /// start — a Python user-site `.pth` and `usercustomize`, a `~/.curlrc` that dumps a
    /// request's headers (`libcurl`), pip configuration, a working directory holding a
    /// `json.py` — and lowers the file-size limit and raises the niceness of every agent.
    /// Task B, with a secret, then runs ordinary commands: each behaves as on a clean
    /// machine and nothing of A's runs in them; task C finds the secret nowhere.
    /// Positive control: the same commands run beside warden (`docker exec` with the
    /// workspace as HOME, A's directory as working directory) do run A's plants.
    pub async fn planted_tool_configuration_never_runs_in_a_later_task(c: Ctx) {
        let sb = c.sandbox();
        let k = key("tool-config");
        const SECRET: &str = "tok-5c0ffee1d2e3";
        const PLANT: &str = r#"set -e
            site=$(python3 -c 'import site; print(site.getusersitepackages())')
            mkdir -p "$site" /workspace/.config/pip /workspace/.pip /workspace/trap
            leak='import os; open("/workspace/leak-%s", "a").write(os.environ.get("API_TOKEN", "none") + "\\n")'
            printf "$leak\n" pth > "$site/zz.pth"
            printf "$leak\n" usercustomize > "$site/usercustomize.py"
            printf "$leak\n" cwd > /workspace/trap/json.py
            printf 'libcurl = /workspace/leak-curl\n' > /workspace/.curlrc
            printf '[global]\nindex-url = http://planted.invalid/simple\n' | tee /workspace/.config/pip/pip.conf > /workspace/.pip/pip.conf
            n=0; for p in /proc/[0-9]*; do
              [ "$(awk '/^PPid:/ {print $2}' "$p/status" 2>/dev/null)" = 0 ] || continue
              [ "$(stat -c %u "$p" 2>/dev/null)" = "$(id -u)" ] || continue
              prlimit --pid "${p#/proc/}" --fsize=16 && renice -n 7 -p "${p#/proc/}" >/dev/null && n=$((n+1))
            done
            echo "tampered $n"; prlimit --pid $PPID --fsize --noheadings --output SOFT
            cd /workspace/trap"#;
        let planted = bash_ok(&sb, &k, PLANT).await;
        assert!(planted.starts_with("tampered ") && !planted.starts_with("tampered 0"), "{planted}");
        assert!(planted.lines().any(|l| l.trim() == "16"), "A lowered its own agent's file-size limit: {planted}");
        // B: ordinary commands, with a secret.
        const INNOCENT: &str = r#"python3 -c 'print("py ok")'; python3 -c 'import json; print("json", json.__file__)'
            curl -s -H "X-Token: $API_TOKEN" file:///etc/hostname > /dev/null; echo "curl $?"
            echo "pip files $(pip config list | grep -vc '^:env:')"; seq 1 100 | wc -l; nice; pwd"#;
        let env = vec![("API_TOKEN".to_string(), SECRET.to_string())];
        let b = sb.call_tool(&k, "Bash", json!({"command": INNOCENT}), &env).await.unwrap();
        assert!(!b.is_error, "{}", b.content);
        assert_eq!(
            b.content, "py ok\njson /usr/lib/python3.11/json/__init__.py\ncurl 0\npip files 0\n100\n0\n/workspace\n",
            "B ran as on a clean machine"
        );
        // C looks everywhere it can.
        let seen = bash_ok(&sb, &k, "cat /workspace/leak-* 2>/dev/null; grep -rl -- 'tok-5c0ffee' /workspace /tmp /dev/shm 2>/dev/null; echo done").await;
        assert_eq!(seen, "done\n", "nothing of B's reached a file: {seen}");
        // Positive control: without warden's tool variables (`TOOL_CONFIG`) and with A's
        // working directory, the plants do run.
        let id = container_of(&sb, &k).await;
        let control = docker(&[
            "exec",
            "-u",
            "1000:1000",
            "-w",
            "/workspace/trap",
            "-e",
            "HOME=/workspace",
            "-e",
            "API_TOKEN=CONTROL",
            &id,
            "env",
            "-u",
            "PYTHONNOUSERSITE",
            "-u",
            "PIP_CONFIG_FILE",
            "-u",
            "CURL_HOME",
            "-u",
            "XDG_CONFIG_HOME",
            "sh",
            "-c",
            "python3 -c 'import json' ; curl -s -H \"X-Token: $API_TOKEN\" file:///etc/hostname >/dev/null; \
             pip config list 2>/dev/null; cat /workspace/leak-pth /workspace/leak-usercustomize /workspace/leak-cwd; \
             echo \"curl-dump $(grep -c CONTROL /workspace/leak-curl)\"",
        ]);
        assert!(
            control.contains("planted.invalid"),
            "the planted pip.conf is read without warden's environment: {control}"
        );
        assert!(control.matches("CONTROL").count() >= 3, "the .pth, usercustomize and json.py run there: {control}");
        assert!(
            !control.contains("curl-dump 0") && control.contains("curl-dump "),
            "the .curlrc dumps the header there: {control}"
        );
        sb.shutdown().await.unwrap();
    }

    /// Rounds of `a_sweep_beside_a_cd_never_loses_it`.
    const CD_ROUNDS: usize = 30;

    /// The shell's working directory is read by the agent while the shell stops itself on
    /// its way out, and every sweep continues every stopped process of the sandbox user: a
    /// sweep of a file operation run beside a `cd` could let the shell go before its
    /// directory was read, so the session silently stayed where it was and the next command
    /// (`rm -rf *`, say) ran elsewhere than the model was told. Each round `cd`s into a new
    /// directory while reads run beside it; the next command must run there.
    pub async fn a_sweep_beside_a_cd_never_loses_it(c: Ctx) {
        let sb = c.sandbox();
        let k = key("cd-race");
        bash_ok(&sb, &k, "echo x > /workspace/probe.txt").await;
        for round in 0..CD_ROUNDS {
            let cd_command = format!("mkdir -p /workspace/d{round} && sleep 0.2 && cd /workspace/d{round}");
            let done = std::sync::atomic::AtomicBool::new(false);
            let cd = async {
                let o = bash(&sb, &k, &cd_command).await;
                done.store(true, std::sync::atomic::Ordering::SeqCst);
                o
            };
            // Reads one after another, in four streams, for as long as the `cd` runs: their
            // sweeps land at every point of it, its end too.
            let readers = (0..4).map(|_| async {
                let mut n = 0;
                while !done.load(std::sync::atomic::Ordering::SeqCst) {
                    let r = tool(&sb, &k, "Read", json!({"file_path": "/workspace/probe.txt"})).await;
                    assert!(!r.is_error, "round {round}: {}", r.content);
                    n += 1;
                }
                n
            });
            let (cd, reads) = futures_util::future::join(cd, futures_util::future::join_all(readers)).await;
            assert!(!cd.is_error, "round {round}: {}", cd.content);
            assert!(reads.iter().sum::<usize>() > 0, "round {round}: reads ran beside the cd");
            assert_eq!(bash_ok(&sb, &k, "pwd").await, format!("/workspace/d{round}\n"), "round {round}");
        }
        sb.shutdown().await.unwrap();
    }

    /// Every thread of the sandbox user in `container`, as root sees them (`pid tid state
    /// ppid comm`), except the agents (exec roots: parent 0) and their threads.
    fn sandbox_user_threads(container: &str) -> String {
        const SCRIPT: &str = r#"for t in /proc/[0-9]*/task/[0-9]*; do
              p=${t%/task/*}; [ "$(stat -c %u "$t" 2>/dev/null)" = 1000 ] || continue
              pp=$(awk '/^PPid:/ {print $2}' "$p/status" 2>/dev/null); [ "$pp" = 0 ] && continue
              echo "${p#/proc/} ${t##*/} $(awk '/^State:/ {print $2}' "$t/status" 2>/dev/null) $pp $(cat "$t/comm" 2>/dev/null)"
            done; true"#;
        docker(&["exec", "-u", "0", container, "sh", "-c", SCRIPT])
    }

    /// Issue 40, item 1 (and its "done when"): a thread-group leader that exits with a raw
    /// `exit` syscall while another of its threads runs shows as `Z` and was skipped by the
    /// sweep, so it ran on across calls. After a call that starts such a survivor, a
    /// double-fork, a hopper (a process that keeps moving to a new pid) and thirty fast
    /// hoppers (fork-and-exit chains that a read of a running /proc never sees alive: the
    /// review of the fix found them surviving), no thread of the sandbox user remains but
    /// the agents'.
    pub async fn the_process_rule_leaves_no_thread_of_the_sandbox_user(c: Ctx) {
        // Room for the hoppers' short-lived processes and the zombies init has yet to reap
        // on a loaded machine: the test's own commands must still be able to fork.
        let sb = c.sandbox_with(|cfg| cfg.pids = 4096);
        let k = key("process-rule");
        // Each survivor appends to its own file while it lives; the command returns once all
        // three have written (the positive control: every technique really ran).
        const START: &str = r#"rm -f /workspace/alive-*
python3 - <<'PY'
import ctypes, os, threading, time
if os.fork() == 0:
    os.setsid()  # out of the call's process group: only the sweep can find it
    def beat():
        while True:
            open("/workspace/alive-zombie-leader", "a").write("x")
            time.sleep(0.1)
    threading.Thread(target=beat).start()
    time.sleep(0.3)
    nr = {"x86_64": 60, "aarch64": 93}[os.uname().machine]
    ctypes.CDLL(None).syscall(nr, 0)  # SYS_exit: this thread only
PY
(setsid sh -c 'while :; do echo x >> /workspace/alive-double-fork; sleep 0.1; done' &)
hop() { echo x >> /workspace/alive-hopper; sleep 0.1; (hop &) ; }
(hop &)
# The three survivors above run before the fast hoppers take the machine (CI flake: under
# load the zombie leader's python had not started within the wait below).
for i in $(seq 600); do
  [ -s /workspace/alive-zombie-leader ] && [ -s /workspace/alive-double-fork ] && [ -s /workspace/alive-hopper ] && break
  sleep 0.1
done
# Fast hoppers: chains that fork and exit faster than /proc can be read (review finding).
for i in $(seq FAST_HOPPERS); do perl -e '
use POSIX (); POSIX::setsid();
open STDOUT, ">/dev/null"; open STDERR, ">/dev/null";
my $n = 0;
while (1) {
  my $p = fork(); if (!defined $p) { select(undef, undef, undef, 0.001); next }
  exit 0 if $p;
  $n++; if ($n % 1000 == 0) { open F, ">>/workspace/alive-fast-hopper"; print F "x"; close F }
}' & done
# The most threads of a zombie process, as its status counts them (gVisor lists no task
# directory for a zombie leader; builtins only: the hoppers keep the machine busy).
zombie_leader_threads() {
  local p line k v t; zl=0
  for p in /proc/[0-9]*; do
    read -r line 2>/dev/null < $p/stat || continue
    [[ $line == *") Z "* ]] || continue
    t=0; while read -r k v; do [[ $k == Threads: ]] && t=$v; done 2>/dev/null < $p/status
    (( t > zl )) && zl=$t
  done
}
for i in $(seq 300); do
  zombie_leader_threads
  [ -s /workspace/alive-zombie-leader ] && [ -s /workspace/alive-double-fork ] && [ -s /workspace/alive-hopper ] && \
    [ -s /workspace/alive-fast-hopper ] && [ "${zl:-0}" -ge 2 ] && break
  sleep 0.1
done
echo "zombie leader threads: ${zl:-0}"
ls /workspace/alive-*"#;
        // Its exit status is not the point (a fork may still fail under load); the
        // positive controls below are.
        // Thirty fast hoppers; under gVisor's ptrace platform, where a fork costs ~25 ms, one
        // keeps the machine as busy (four kept the survivors from starting within the wait).
        let hoppers = if c.runtime == Some(GVISOR) { "1" } else { "30" };
        // Five minutes, not the default two: on a loaded 2-core machine the hoppers made the
        // whole script outlast 120 s (local full runs), with no output left to judge.
        let start = json!({ "command": START.replace("FAST_HOPPERS", hoppers), "timeout": 300_000 });
        let out = tool(&sb, &k, "Bash", start).await.content;
        for f in ["alive-zombie-leader", "alive-double-fork", "alive-hopper", "alive-fast-hopper"] {
            assert!(out.contains(f), "the {f} survivor never ran (positive control): {out}");
        }
        assert!(
            out.lines()
                .any(|l| l.strip_prefix("zombie leader threads: ").is_some_and(|n| n.trim() != "0" && n.trim() != "1")),
            "the leader was a zombie with a live thread while the call ran (positive control): {out}"
        );
        let container = container_of(&sb, &k).await;
        let left = sandbox_user_threads(&container);
        assert!(left.trim().is_empty(), "threads of the sandbox user outlived their call:\n{left}");
        // And nothing writes any more: the files stay as they are.
        let sizes = || docker(&["exec", "-u", "0", &container, "sh", "-c", "wc -c /workspace/alive-* | sort"]);
        let before = sizes();
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(before, sizes(), "a survivor still writes");
        sb.shutdown().await.unwrap();
    }

    /// Issue 40, item 3: the session-state descriptor was open in the command; writing
    /// `/workspace/../etc` and a variable into it set the next call's working directory
    /// and environment. A command inherits descriptors 0-2 only, and the state is read
    /// from /proc.
    pub async fn a_command_cannot_write_the_next_calls_state(c: Ctx) {
        let sb = c.sandbox();
        let k = key("state-fd");
        let fds = bash_ok(&sb, &k, "ls /proc/$$/fd | sort -n | tr '\\n' ' '").await;
        assert_eq!(fds.trim(), "0 1 2", "the shell of a command holds descriptors 0-2 only");
        // Every descriptor a forger could try, with a state that would leave the workspace.
        bash_ok(
            &sb,
            &k,
            "mkdir -p /workspace/sub; for fd in 3 4 5 6 7 8 9 10 11 12; do \
               printf '/workspace/../etc\\0XDG_CONFIG_HOME=/workspace/.cfg\\0' >&$fd; done 2>/dev/null; \
             cd /workspace/sub; true",
        )
        .await;
        assert_eq!(
            bash_ok(&sb, &k, "pwd; echo \"[${XDG_CONFIG_HOME:-unset}]\"").await,
            "/workspace/sub\n[/tmp/.warden-config]\n",
            "the directory the shell really ended in, and warden's own value of the variable"
        );
        // A shell that stops itself early in one directory and ends in another: the last
        // stop wins, and it is a real directory of the workspace.
        let o = bash(&sb, &k, "cd /workspace; kill -STOP $$; cd /tmp; kill -KILL $$").await;
        assert!(o.content.contains("exit code: 137"), "the shell killed itself: {}", o.content);
        assert_eq!(bash_ok(&sb, &k, "pwd").await, "/workspace\n");
        // A link out of the workspace is not a directory beneath it.
        bash_ok(&sb, &k, "ln -sfn /etc /workspace/out; cd /workspace/out").await;
        assert_eq!(bash_ok(&sb, &k, "pwd -P").await, "/workspace\n");
        sb.shutdown().await.unwrap();
    }

    /// Issue 40, items 4-7: variables and configuration planted by an approved command (or
    /// given as a task's variables) made an allowed `git status` run a planted
    /// `core.fsmonitor` — from `.git/config`, `~/.gitconfig` and the XDG path — and a
    /// task variable named `BASH_ENV`/`PS4`/`PATH` ran code in an allowed `echo hi`.
    pub async fn planted_configuration_does_not_run_in_an_allowed_git_status(c: Ctx) {
        let sb = c.sandbox();
        let k = key("git-config");
        // An approved command plants everything it can.
        bash_ok(
            &sb,
            &k,
            r#"set -e; cd /workspace; git init -q repo; cd repo; echo a > a; git add a
               printf '#!/bin/sh
touch /workspace/PWNED-$1
' > /workspace/hook; chmod +x /workspace/hook
               git config core.fsmonitor '/workspace/hook fsmonitor-local'
               git config core.hooksPath /workspace/hooks; mkdir -p /workspace/hooks
               cp /workspace/hook /workspace/hooks/post-index-change
               printf '[core]
	fsmonitor = /workspace/hook fsmonitor-home
' > /workspace/.gitconfig
               mkdir -p /workspace/.cfg/git /tmp/x; printf '[core]
	fsmonitor = /workspace/hook fsmonitor-xdg
' > /workspace/.cfg/git/config
               cp /workspace/.gitconfig /tmp/.gitconfig
               export XDG_CONFIG_HOME=/workspace/.cfg HOME=/tmp"#,
        )
        .await;
        // The allowed command, in a later call.
        let out =
            bash_ok(&sb, &k, "cd /workspace/repo && git status --short; ls /workspace | grep -c PWNED || true").await;
        assert!(out.trim_end().ends_with('0'), "a planted program ran in git status: {out}");
        // Positive control: without warden's overrides, the planted monitor runs.
        let control = bash_ok(
            &sb,
            &k,
            "cd /workspace/repo && env -u GIT_CONFIG_COUNT git status --short >/dev/null 2>&1; ls /workspace | grep PWNED || true",
        )
        .await;
        assert!(
            control.contains("PWNED-fsmonitor-local"),
            "the planted fsmonitor is live (positive control): {control}"
        );
        // The overrides leave git usable: commit, diff and log work as usual.
        let usable = bash_ok(
            &sb,
            &k,
            "cd /workspace && git init -q plain && cd plain && echo a > f && git add f && \
             git -c user.email=a@b -c user.name=n commit -qm first && echo b > f && git diff --stat && git log --oneline",
        )
        .await;
        assert!(usable.contains("f | 2") && usable.contains("first"), "{usable}");
        // Task variables that steer programs are refused before anything runs.
        for name in
            ["BASH_ENV", "PS4", "SHELLOPTS", "PATH", "GIT_CONFIG_COUNT", "XDG_CONFIG_HOME", "HOME", "LD_PRELOAD"]
        {
            let r = sb
                .call_tool(
                    &k,
                    "Bash",
                    json!({"command": "echo hi"}),
                    &[(name.into(), "$(touch /workspace/pwn)".into())],
                )
                .await;
            assert!(matches!(r, Err(SandboxError::InvalidInput { .. })), "{name}: {r:?}");
        }
        assert_eq!(bash_ok(&sb, &k, "ls /workspace/pwn 2>/dev/null; echo checked").await, "checked\n");
        sb.shutdown().await.unwrap();
    }

    /// Issue 40, item 2: a hard link of `.env` swapped over `docs/a.md` between the gate's
    /// check and the agent's open made an allowed Read return the secret. The call is pinned
    /// to the identity of the file that was judged.
    pub async fn a_file_swapped_after_the_check_is_not_read(c: Ctx) {
        let sb = c.sandbox();
        let k = key("read-identity");
        bash_ok(&sb, &k, "mkdir -p docs; echo 'DOTENV-SECRET=1' > .env; echo 'just docs' > docs/a.md").await;
        let judged = sb.resolve_path(&k, "docs/a.md").await.unwrap();
        assert!(!judged.other_names && judged.identity.is_some(), "{judged:?}");
        // The swap, after the check.
        bash_ok(&sb, &k, "ln .env docs/tmp && mv docs/tmp docs/a.md").await;
        let r = sb.call_tool_pinned(&k, "Read", json!({"file_path": "docs/a.md"}), &[], Some(&judged)).await;
        match r {
            Err(e) => assert!(e.to_string().contains("replaced"), "{e}"),
            Ok(o) => panic!("the swapped file was read: {}", o.content),
        }
        // Positive control: the name now leads to the secret.
        let o = tool(&sb, &k, "Read", json!({"file_path": "docs/a.md"})).await;
        assert!(o.content.contains("DOTENV-SECRET=1"), "{}", o.content);
        // An unchanged file is read as judged.
        bash_ok(&sb, &k, "echo 'other docs' > docs/b.md").await;
        let judged = sb.resolve_path(&k, "docs/b.md").await.unwrap();
        let o = sb.call_tool_pinned(&k, "Read", json!({"file_path": "docs/b.md"}), &[], Some(&judged)).await.unwrap();
        assert!(o.content.contains("other docs"), "{}", o.content);
        sb.shutdown().await.unwrap();
    }

    /// Issue 40, item 8: after `ln .env docs/h`, a Grep of `docs` in content mode printed
    /// the secret (only the search root's link count was checked).
    pub async fn a_search_never_reads_a_hard_link_of_another_name(c: Ctx) {
        let sb = c.sandbox();
        let k = key("grep-links");
        bash_ok(&sb, &k, "mkdir -p docs; echo 'DOTENV-SECRET=1' > .env; echo 'docs text' > docs/a.md; ln .env docs/h")
            .await;
        // Positive control: the link holds the secret.
        assert!(bash_ok(&sb, &k, "cat docs/h").await.contains("DOTENV-SECRET=1"));
        let g = sb.call_tool(&k, "Grep", json!({"pattern": ".", "path": "docs", "output_mode": "content"}), &[]).await;
        let refusal = match g {
            Err(e) => e.to_string(),
            Ok(o) => panic!("the search ran: {}", o.content),
        };
        assert!(!refusal.contains("DOTENV-SECRET"), "{refusal}");
        assert!(
            refusal.contains("/workspace/docs/h") && refusal.contains("hard link"),
            "the refusal names the file: {refusal}"
        );
        // Glob lists names only, and a search without the link runs.
        let gl = tool(&sb, &k, "Glob", json!({"pattern": "*", "path": "docs"})).await;
        assert!(!gl.is_error && gl.content.contains("docs/h"), "{}", gl.content);
        bash_ok(&sb, &k, "rm docs/h").await;
        let g = tool(&sb, &k, "Grep", json!({"pattern": "docs", "path": "docs", "output_mode": "content"})).await;
        assert!(!g.is_error && g.content.contains("docs text"), "{}", g.content);
        sb.shutdown().await.unwrap();
    }
}

type TestFn = fn(Ctx) -> Pin<Box<dyn Future<Output = ()> + Send>>;

mod runtime {
    use super::*;

    /// The kernel release a process sees: the host's own under runc; gVisor's (its own
    /// kernel, which says so in its log) under runsc. Proves the gVisor runs of the boundary
    /// groups really ran under gVisor.
    pub async fn the_sandbox_runs_under_the_configured_kernel(c: Ctx) {
        let sb = c.sandbox_with(|cfg| cfg.warm_pool = 0);
        let k = key("kernel");
        let inside = bash_ok(&sb, &k, "uname -r; dmesg 2>&1 | head -n 3").await;
        let host = String::from_utf8(Command::new("uname").arg("-r").output().unwrap().stdout).unwrap();
        let release = inside.lines().next().unwrap_or_default().trim();
        let id = container_of(&sb, &k).await;
        let runtime = docker(&["inspect", "--format", "{{.HostConfig.Runtime}}", &id]);
        match c.runtime {
            Some(GVISOR) => {
                assert_ne!(release, host.trim(), "gVisor's kernel is not the host's: {inside}");
                assert!(inside.contains("gVisor"), "gVisor's kernel log says so: {inside}");
                assert_eq!(runtime.trim(), GVISOR);
            }
            _ => {
                assert_eq!(release, host.trim(), "runc shares the host's kernel: {inside}");
                assert!(!inside.contains("gVisor"), "{inside}");
                assert_eq!(runtime.trim(), "runc");
            }
        }
        let listed = sb.list_sessions().await.unwrap();
        let row = listed.iter().find(|s| s.key == k && s.scope == c.scope).expect("listed");
        assert_eq!(row.runtime, runtime.trim(), "the listing names the runtime");
        sb.shutdown().await.unwrap();
    }

    /// A subagent the operator puts under gVisor never shares the default runtime's
    /// container (nor its files), in either direction: the same session id under two
    /// runtimes is two sessions, each listed with its runtime. The pool (runc) never serves
    /// the gVisor key.
    pub async fn a_session_under_another_runtime_is_a_session_of_its_own(c: Ctx) {
        let sb = c.sandbox_with(|cfg| cfg.warm_pool = 1);
        sb.connect().await.unwrap();
        pool_ready(&sb, 1).await;
        let plain = key("shared-id");
        let gvisor = key("shared-id").with_runtime(Some(GVISOR.into()));
        bash_ok(&sb, &plain, "echo runc-side > mine.txt").await;
        pool_ready(&sb, 1).await;
        let before = pooled(&c.scope);
        let out = bash_ok(&sb, &gvisor, "uname -r; ls; echo gvisor-side > theirs.txt").await;
        assert!(!out.contains("mine.txt"), "the gVisor session sees none of the runc session's files: {out}");
        assert_eq!(pooled(&c.scope), before, "the runc pool did not serve the gVisor session");
        let other = bash_ok(&sb, &plain, "ls").await;
        assert!(other.contains("mine.txt") && !other.contains("theirs.txt"), "{other}");
        let (a, b) = (container_of(&sb, &plain).await, container_of(&sb, &gvisor).await);
        assert_ne!(a, b, "two containers");
        let runtime = |id: &str| docker(&["inspect", "--format", "{{.HostConfig.Runtime}}", id]).trim().to_string();
        assert_eq!((runtime(&a).as_str(), runtime(&b).as_str()), ("runc", GVISOR));
        let listed = sb.list_sessions().await.unwrap();
        let rows: Vec<_> = listed
            .iter()
            .filter(|s| s.key.session_id == "shared-id" && s.scope == c.scope)
            .map(|s| s.runtime.as_str())
            .collect();
        assert_eq!(rows.len(), 2, "{listed:?}");
        assert!(rows.contains(&"runc") && rows.contains(&GVISOR), "{rows:?}");
        assert!(sb.end_session(&gvisor).await.unwrap());
        assert!(container_exists(&a) && !container_exists(&b), "ending one runtime's session leaves the other's");
        sb.shutdown().await.unwrap();
    }

    /// A runtime the engine does not have is refused before any container is made, naming
    /// the setting and the engine; `check_runtimes` says the same.
    pub async fn an_unregistered_runtime_is_refused_by_name(c: Ctx) {
        let sb = c.sandbox_with(|cfg| {
            cfg.runtime = Some("no-such-runtime".into());
            cfg.warm_pool = 0;
        });
        let err = sb.call_tool(&key("x"), "Bash", json!({"command": "true"}), &[]).await.unwrap_err().to_string();
        assert!(err.contains("sandbox.runtime `no-such-runtime`") && err.contains("no runtime"), "{err}");
        let checks = sb.check_runtimes().await;
        assert!(
            checks.iter().all(|(_, r)| r.as_ref().is_err_and(|e| e.to_string().contains("no-such-runtime"))),
            "{checks:?}"
        );
        let fine = c.sandbox_with(|cfg| cfg.warm_pool = 0);
        assert!(fine.check_runtimes().await.iter().all(|(_, r)| r.is_ok()), "the positive control passes");
        sb.shutdown().await.unwrap();
        fine.shutdown().await.unwrap();
    }
}

macro_rules! tests {
    ($($path:ident :: $name:ident),* $(,)?) => {
        vec![$((concat!(stringify!($path), "::", stringify!($name)), (|c| Box::pin($path::$name(c))) as TestFn)),*]
    };
}

fn all_tests() -> Vec<(&'static str, TestFn)> {
    tests![
        tools::read_write_edit,
        tools::binary_roundtrip,
        tools::glob,
        tools::grep,
        tools::bash_state_and_secrets,
        tools::output_is_capped,
        tools::errors_are_clear,
        confinement::escapes_are_refused,
        file_bounds::devices_fifos_and_huge_files_are_never_read_unbounded,
        limits::hardening_is_applied,
        limits::timeout_kills_children,
        limits::a_dropped_call_kills_its_command,
        limits::regression_a_killed_command_was_reported_as_not_run,
        limits::fork_bomb_is_contained,
        limits::network_is_off,
        limits::memory_hog_is_killed,
        sessions::reuse_and_concurrent_first_use,
        sessions::twenty_sessions_are_isolated,
        sessions::max_sessions_is_enforced,
        sessions::one_user_cannot_take_every_session,
        sessions::idle_sessions_are_reaped,
        sessions::end_session_removes_everything,
        sessions::regression_planted_objects_under_a_sessions_names_are_never_adopted,
        sessions::regression_two_tenants_whose_old_names_collided_get_two_containers,
        sessions::killed_container_is_recreated,
        sessions::orphans_are_adopted_or_removed,
        sessions::prune_removes_leftovers,
        sessions::prune_keeps_a_session_that_exited_recently,
        sessions::docker_unavailable_is_clear,
        sessions::missing_image_is_clear,
        lifecycle::a_paused_session_keeps_its_files_and_no_process,
        lifecycle::idle_sessions_pause_then_end,
        lifecycle::regression_a_paused_session_was_removed_when_its_host_restarted,
        lifecycle::paused_sessions_have_limits_of_their_own,
        lifecycle::a_resumed_session_keeps_egress,
        lifecycle::twenty_forks_are_copies_isolated_from_each_other,
        lifecycle::a_fork_ended_while_it_is_made_never_mounts_another_sessions_disk,
        lifecycle::host_commands_run_beside_the_shell_and_leave_it_as_it_was,
        lifecycle::a_fork_of_a_plain_volume_copies_its_files,
        lifecycle::a_session_from_a_snapshot_has_the_same_files,
        lifecycle::a_snapshot_of_a_plain_volume_copies_its_files,
        lifecycle::an_ended_session_comes_back_from_its_end_snapshot,
        pool::first_command_runs_in_a_pooled_container,
        pool::two_sessions_never_share_a_container,
        pool::cold_starts_at_once_share_disk_helpers,
        pool::an_ended_session_is_gone_and_never_handed_out_again,
        pool::the_pool_refills_within_max_sessions,
        pool::a_pool_container_is_no_sessions,
        pool::a_restart_removes_stale_pool_containers_of_its_scope_only,
        pool::a_vanished_pooled_container_keeps_its_workspace,
        pool::listing_or_pruning_adopted_a_live_hosts_sessions_and_pool,
        pool::a_stopped_pool_container_is_never_handed_out,
        pool::an_idle_pool_container_that_stopped_is_replaced,
        pool::the_pool_follows_a_burst_and_decays_to_its_floor,
        boundary::detached_processes_end_with_their_call,
        state::the_process_rule_leaves_no_thread_of_the_sandbox_user,
        state::concurrent_sweeps_never_stop_each_other,
        state::planted_tool_configuration_never_runs_in_a_later_task,
        state::a_command_stopping_the_agents_wedges_no_sweep,
        state::a_sweep_beside_a_cd_never_loses_it,
        state::a_command_cannot_write_the_next_calls_state,
        state::planted_configuration_does_not_run_in_an_allowed_git_status,
        state::a_file_swapped_after_the_check_is_not_read,
        state::a_search_never_reads_a_hard_link_of_another_name,
        boundary::commands_cannot_reach_their_agent,
        boundary::adoption_kills_commands_of_the_dead_host,
        boundary::planted_state_never_sees_a_later_tasks_secret,
        boundary::truncation_note_states_the_real_size,
        boundary::random_bytes_start_at_most_one_command,
        boundary::symlink_swaps_never_leave_the_workspace,
        boundary::resolved_path_follows_links_inside_only,
        boundary::disk_limit_is_enforced_by_the_kernel,
        boundary::oversized_writes_and_edits_are_refused,
        egress::the_proxy_is_the_only_way_out,
        egress::a_held_narrowing_only_takes_away,
        egress::regression_a_refusal_flood_from_the_sandbox_is_counted_not_recorded,
        boundary::a_command_that_kills_its_agent_leaves_nothing_behind,
        boundary::an_orphan_of_a_session_process_never_runs_beside_a_later_command,
        boundary::what_a_settled_session_process_starts_never_runs_beside_a_later_command,
        boundary::regression_a_session_process_calls_leftover_outlived_it,
        boundary::regression_a_concurrent_call_read_another_tasks_secrets_from_proc,
        egress::an_adopted_session_gets_its_proxy_back,
        egress::a_pool_container_reaches_nothing_until_bound_and_each_session_is_its_own,
        egress::replicas_serve_a_sessions_egress_under_every_replicas_narrowings,
        egress::sandboxed_code_cannot_reach_the_forwarders_channel_socket,
        hosts::egress_reaches_the_proxy_from_a_tls_docker_host,
        hosts::placement_spreads_sessions_and_a_replica_reaches_them,
        hosts::the_tls_endpoint_refuses_clients_without_a_trusted_certificate,
        hosts::a_host_that_is_down_fails_only_its_sessions,
        hosts::adoption_and_reaping_leave_other_scopes_alone,
        replicas::connecting_kills_no_command_and_no_pool_of_another_replica,
        replicas::a_session_is_one_container_across_replicas,
        replicas::an_idle_session_is_reaped_only_when_no_replica_uses_it,
        replicas::a_replica_that_shuts_down_leaves_its_sessions_to_the_others,
        replicas::a_restarted_replica_adopts_its_own_leftovers_only,
        runtime::the_sandbox_runs_under_the_configured_kernel,
        sessions::a_session_under_another_runtime_is_a_session_of_its_own,
        sessions::an_unregistered_runtime_is_refused_by_name,
    ]
}

/// Warden-labelled containers and volumes whose scope starts with `prefix`.
fn leftovers(prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    let containers = docker(&[
        "ps",
        "-a",
        "--filter",
        "label=warden.managed=true",
        "--format",
        "{{.Names}} {{.Label \"warden.scope\"}}",
    ]);
    let volumes = docker(&[
        "volume",
        "ls",
        "--filter",
        "label=warden.managed=true",
        "--format",
        "{{.Name}} {{.Label \"warden.scope\"}}",
    ]);
    for (kind, list) in [("container", containers), ("volume", volumes)] {
        for line in list.lines() {
            if let Some((name, scope)) = line.split_once(' ')
                && scope.starts_with(prefix)
            {
                found.push(format!("{kind} {name}"));
            }
        }
    }
    found
}

/// Removes `items` (from `leftovers`): containers first, then volumes through the sandbox
/// crate, which detaches the loop device of a `sandbox.disk` image before removing its
/// volume (`docker volume rm` alone would leak the device). Disk volumes go last, after the
/// workspace volumes mounted from them.
/// `scope` labels the disk helper containers this runs (they remove themselves).
async fn remove_leftovers(scope: &str, items: Vec<String>) {
    let mut volumes = Vec::new();
    for item in items {
        let (kind, name) = item.split_once(' ').unwrap();
        if kind == "container" {
            let name = name.to_string();
            let _ =
                tokio::task::spawn_blocking(move || Command::new("docker").args(["rm", "-f", &name]).output()).await;
        } else {
            volumes.push(name.to_string());
        }
    }
    if volumes.is_empty() {
        return;
    }
    volumes.sort_by_key(|v| v.starts_with("warden-disk-"));
    let cleaner = Sandbox::new(SandboxConfig { scope: scope.to_string(), warm_pool: 0, ..SandboxConfig::default() })
        .expect("valid config");
    for v in volumes {
        if let Err(e) = cleaner.remove_volume(&v).await {
            eprintln!("clean-up: removing volume {v} failed: {e}");
        }
    }
    let _ = cleaner.shutdown().await;
}

/// Whether the engine lists the gVisor runtime (`cargo xtask runsc` registers it).
fn gvisor_registered() -> bool {
    let out = Command::new("docker").args(["info", "--format", "{{json .Runtimes}}"]).output().expect("docker info");
    String::from_utf8_lossy(&out.stdout).contains(&format!("\"{GVISOR}\""))
}

fn preflight() {
    let out = Command::new("docker").args(["version", "--format", "{{.Server.Version}}"]).output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "Docker Engine is required for these tests and is not reachable: {}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!("Docker CLI is required for these tests: {e}"),
    }
    let img =
        Command::new("docker").args(["image", "inspect", warden_sandbox::config::DEFAULT_IMAGE]).output().unwrap();
    assert!(
        img.status.success(),
        "the sandbox image {} is missing: run `cargo xtask build` (or see TOOLCHAIN.md) first",
        warden_sandbox::config::DEFAULT_IMAGE
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Every test under the engine's default runtime, then the boundary groups again under
    // gVisor (named `runsc/<group>::<test>`).
    let tests: Vec<(String, Option<&'static str>, TestFn)> = all_tests()
        .into_iter()
        .map(|(name, f)| (name.to_string(), None, f))
        .chain(
            all_tests()
                .into_iter()
                .filter(|(name, _)| GVISOR_GROUPS.iter().any(|g| name.split("::").next() == Some(*g)))
                .map(|(name, f)| (format!("{GVISOR}/{name}"), Some(GVISOR), f)),
        )
        .collect();
    if args.iter().any(|a| a == "--list") {
        for (name, _, _) in &tests {
            println!("{name}: test");
        }
        return;
    }
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let selected: Vec<(usize, String, Option<&'static str>, TestFn)> = tests
        .into_iter()
        .enumerate()
        .filter(|(_, (name, _, _))| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .map(|(i, (n, r, f))| (i, n, r, f))
        .collect();
    preflight();
    assert!(
        selected.iter().all(|(_, _, runtime, _)| runtime.is_none()) || gvisor_registered(),
        "gVisor (`{GVISOR}`) is not registered with the Docker Engine: run `cargo xtask runsc` first"
    );
    let run_prefix = format!("t{}x", std::process::id());
    let started = Instant::now();
    println!("running {} tests (scope prefix {run_prefix})", selected.len());
    std::panic::set_hook(Box::new(|info| eprintln!("{info}")));
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let failures = rt.block_on(async {
        let sem = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
        let handles = selected.into_iter().map(|(i, name, runtime, f)| {
            let sem = sem.clone();
            let scope = format!("{run_prefix}{i}");
            tokio::spawn(async move {
                let alone = RUN_ALONE.iter().any(|t| name.ends_with(t));
                let _permit = sem.acquire_many_owned(if alone { CONCURRENCY as u32 } else { 1 }).await.unwrap();
                let t0 = Instant::now();
                let pooled = POOLED_GROUPS
                    .iter()
                    .any(|g| name.trim_start_matches(GVISOR).trim_start_matches('/').starts_with(&format!("{g}::")));
                let mut task = tokio::spawn(f(Ctx { scope: format!("{scope}-"), runtime, pooled }));
                let outcome = match tokio::time::timeout(TEST_TIMEOUT, &mut task).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) if e.is_panic() => {
                        let p = e.into_panic();
                        let msg = p
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        Err(format!("panicked: {msg}"))
                    }
                    Ok(Err(e)) => Err(format!("task failed: {e}")),
                    Err(_) => {
                        task.abort();
                        let _ = task.await;
                        Err(format!("timed out after {TEST_TIMEOUT:?}"))
                    }
                };
                let scope_prefix = format!("{scope}-");
                let p = scope_prefix.clone();
                let left = tokio::task::spawn_blocking(move || leftovers(&p)).await.unwrap();
                remove_leftovers(&scope_prefix, left.clone()).await;
                let outcome = match outcome {
                    Ok(()) if !left.is_empty() => Err(format!("left behind: {left:?}")),
                    o => o,
                };
                match &outcome {
                    Ok(()) => println!("test {name} ... ok ({:.1}s)", t0.elapsed().as_secs_f64()),
                    Err(m) => println!("test {name} ... FAILED ({:.1}s)\n    {m}", t0.elapsed().as_secs_f64()),
                }
                outcome.err().map(|m| (name, m))
            })
        });
        futures_util::future::join_all(handles).await.into_iter().filter_map(|r| r.unwrap()).collect::<Vec<_>>()
    });
    // Final check: nothing warden-labelled from this run remains.
    let left = leftovers(&run_prefix);
    rt.block_on(remove_leftovers(&run_prefix, left.clone()));
    let others = leftovers("");
    if !others.is_empty() {
        println!("note: warden-labelled objects of other runs/hosts exist (not ours, left alone): {others:?}");
    }
    println!("\nfinal check: {} warden-labelled containers/volumes of this run remain", left.len());
    println!(
        "test result: {}. {} failed; finished in {:.1}s",
        if failures.is_empty() && left.is_empty() { "ok" } else { "FAILED" },
        failures.len(),
        started.elapsed().as_secs_f64()
    );
    if !failures.is_empty() || !left.is_empty() {
        for (name, m) in &failures {
            println!("  FAILED {name}: {m}");
        }
        std::process::exit(1);
    }
}
