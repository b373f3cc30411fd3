//! gVisor (`runsc`) as a Docker runtime for the sandbox: `cargo xtask runsc`, and the part of
//! `cargo xtask test` that lets the sandbox tests run under it.
//!
//! Installs Debian's `runsc` package when the binary is missing or older than [`MIN_VERSION`]
//! (Debian 13's package, see [`PACKAGE_URL`] for why not Debian 12's), and registers it with the
//! local Docker Engine under the name [`RUNTIME`] with [`RUNTIME_ARGS`]: it edits the engine's
//! `daemon.json` (the `runtimes` key only, every other key kept as it is), prints exactly what
//! it changed, and asks the engine to reload its configuration (SIGHUP, which reloads runtimes
//! without restarting any container). Does nothing when the engine already lists the runtime
//! with those arguments.
//!
//! Owns the engine's `runtimes.runsc` entry and nothing else of the engine's configuration; it
//! never restarts the engine and never touches a remote engine (`DOCKER_HOST` naming another
//! machine is refused with the steps to run there).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::{apt, process};

/// The runtime name warden's configuration uses (`sandbox.runtime: runsc`).
pub const RUNTIME: &str = "runsc";
/// Arguments the engine passes to runsc for every container:
/// - `--network=none`: gVisor's own network stack is not used — a sandbox has no network
///   (`sandbox.network: none`) and reaches the outside only through the egress proxy (over a
///   Docker exec). Without it a `--network none` container fails to start on engines like
///   this one ("cannot run with network enabled in root network namespace").
///
/// Nothing else: host unix sockets stay closed to the sandbox (gVisor's default).
pub const RUNTIME_ARGS: [&str; 1] = ["--network=none"];
/// The engine's configuration file (Docker's documented default location).
const DAEMON_JSON: &str = "/etc/docker/daemon.json";
/// The oldest gVisor release the sandbox works under. Debian 12's package (0.0~20221219)
/// answers `statx` with EINVAL for the flags Debian 12's coreutils pass, so `ls -l` and
/// `stat` fail for every file in a sandbox under it.
const MIN_VERSION: &str = "0.0~20240729";
/// Debian 13's runsc package (0.0~20240729), a static binary with no dependencies, installed
/// on Debian 12 as it is; [`PACKAGE_SHA256`] pins it.
const PACKAGE_URL: &str =
    "https://deb.debian.org/debian/pool/main/g/golang-gvisor-gvisor/runsc_0.0~20240729.0-4+b7_amd64.deb";
/// SHA-256 of [`PACKAGE_URL`]'s file (as Debian's trixie package index lists it).
const PACKAGE_SHA256: &str = "3c25a5130dfac2f71237d5baad56ac86a255de87a0400f11b36a555156dc325a";
/// How long the engine may take to list the runtime after the reload.
const RELOAD_WAIT: Duration = Duration::from_secs(15);

/// Installs and registers runsc when needed (see the module docs).
pub fn ensure() -> Result<()> {
    let binary = installed_binary()?;
    if registered_args().as_deref() == Some(&RUNTIME_ARGS.map(String::from)[..]) {
        println!("xtask: gVisor: the Docker Engine runs `{RUNTIME}` ({}) already", binary.display());
        return Ok(());
    }
    if let Ok(host) = std::env::var("DOCKER_HOST")
        && !host.is_empty()
        && !host.starts_with("unix://")
    {
        bail!(
            "DOCKER_HOST={host} names another machine's engine: register gVisor there (install Debian's `runsc`, add \
             \"runtimes\": {{\"{RUNTIME}\": {{\"path\": \"/usr/bin/runsc\", \"runtimeArgs\": {RUNTIME_ARGS:?}}}}} to its \
             {DAEMON_JSON}, send dockerd SIGHUP)"
        );
    }
    if !process::is_root() {
        bail!("registering gVisor with the Docker Engine edits {DAEMON_JSON}: run `cargo xtask runsc` as root");
    }
    register(Path::new(DAEMON_JSON), &binary)?;
    reload()?;
    Ok(())
}

/// The runsc binary, installed from Debian 13's package when it is missing or older than
/// [`MIN_VERSION`].
fn installed_binary() -> Result<PathBuf> {
    if let Some(p) = process::which("runsc") {
        match version(&p) {
            Some(v) if v.as_str() >= MIN_VERSION => return Ok(p),
            v => println!(
                "xtask: gVisor: {} is {}; the sandbox needs {MIN_VERSION} or newer (older releases fail statx)",
                p.display(),
                v.as_deref().unwrap_or("of an unknown version")
            ),
        }
    }
    if !apt::available() || process::which("dpkg").is_none() || process::which("curl").is_none() {
        bail!(
            "gVisor's runsc {MIN_VERSION} or newer is not installed and cannot be installed here (Debian, root, dpkg \
             and curl are needed): install it (https://gvisor.dev/docs/user_guide/install/) and run `cargo xtask \
             runsc` again"
        );
    }
    let deb = std::env::temp_dir().join(format!("warden-runsc-{}.deb", std::process::id()));
    println!("xtask: gVisor: installing Debian 13's runsc package ({PACKAGE_URL})");
    process::run(Command::new("curl").args(["-fsSL", "--retry", "3", "-o"]).arg(&deb).arg(PACKAGE_URL))?;
    let digest = process::stdout_of(Command::new("sha256sum").arg(&deb)).unwrap_or_default();
    if digest.split_whitespace().next() != Some(PACKAGE_SHA256) {
        let _ = std::fs::remove_file(&deb);
        bail!("{PACKAGE_URL} does not have the SHA-256 pinned in xtask/src/runsc.rs ({PACKAGE_SHA256}): not installed");
    }
    let installed = process::run(Command::new("dpkg").arg("-i").arg(&deb));
    let _ = std::fs::remove_file(&deb);
    installed?;
    let p = process::which("runsc").context("the runsc package installed no `runsc` on PATH")?;
    match version(&p) {
        Some(v) if v.as_str() >= MIN_VERSION => Ok(p),
        v => bail!("{} reports version {v:?} after the install; expected {MIN_VERSION} or newer", p.display()),
    }
}

/// The version `runsc --version` reports (`0.0~20240729.0`).
fn version(binary: &Path) -> Option<String> {
    let out = process::stdout_of(Command::new(binary).arg("--version"))?;
    out.lines().next()?.strip_prefix("runsc version ").map(|v| v.trim().to_string())
}

/// The arguments the engine has registered for [`RUNTIME`], when it lists it.
fn registered_args() -> Option<Vec<String>> {
    let out = Command::new("docker").args(["info", "--format", "{{json .Runtimes}}"]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let runtimes: Value = serde_json::from_slice(&out.stdout).ok()?;
    let entry = runtimes.get(RUNTIME)?;
    Some(
        entry
            .get("runtimeArgs")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
            .unwrap_or_default(),
    )
}

/// Writes the `runtimes.runsc` entry into the engine's configuration file (created when
/// absent), printing the entry before and after. The file is replaced atomically.
fn register(path: &Path, binary: &Path) -> Result<()> {
    let mut config = match std::fs::read(path) {
        Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => json!({}),
        Ok(bytes) => serde_json::from_slice::<Value>(&bytes)
            .with_context(|| format!("{} is not valid JSON; fix it before registering gVisor", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => json!({}),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let Some(object) = config.as_object_mut() else {
        bail!("{} does not hold a JSON object; fix it before registering gVisor", path.display());
    };
    let runtimes = object.entry("runtimes").or_insert_with(|| json!({}));
    let Some(runtimes) = runtimes.as_object_mut() else {
        bail!("{}: `runtimes` is not an object; fix it before registering gVisor", path.display());
    };
    let entry = json!({ "path": binary.to_string_lossy(), "runtimeArgs": RUNTIME_ARGS });
    let before = runtimes.insert(RUNTIME.to_string(), entry.clone());
    println!(
        "xtask: gVisor: {}: runtimes.{RUNTIME}: {} -> {entry}",
        path.display(),
        before.map_or_else(|| "(absent)".to_string(), |v| v.to_string())
    );
    let text = serde_json::to_string_pretty(&config)? + "\n";
    let tmp = path.with_extension("json.warden-tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(())
}

/// Asks the engine to reload its configuration (SIGHUP to dockerd) and waits until it lists
/// the runtime with the expected arguments.
fn reload() -> Result<()> {
    let out = Command::new("pidof").arg("dockerd").output().context("running pidof")?;
    let pids = String::from_utf8_lossy(&out.stdout).split_whitespace().map(String::from).collect::<Vec<_>>();
    if pids.is_empty() {
        bail!("no dockerd process found to reload: restart the Docker Engine so it reads {DAEMON_JSON}");
    }
    println!("xtask: gVisor: asking dockerd (pid {}) to reload its configuration (SIGHUP)", pids.join(" "));
    process::run(Command::new("kill").arg("-HUP").args(&pids))?;
    let deadline = Instant::now() + RELOAD_WAIT;
    loop {
        if registered_args().as_deref() == Some(&RUNTIME_ARGS.map(String::from)[..]) {
            println!("xtask: gVisor: the Docker Engine runs `{RUNTIME}` now");
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the Docker Engine does not list the `{RUNTIME}` runtime {RELOAD_WAIT:?} after the reload: check its \
                 log (journalctl -u docker) and {DAEMON_JSON}"
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
