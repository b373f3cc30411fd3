//! Compiling components to native code: in a child process bounded in memory and
//! killed with the load that started it, or (tools, tests, embedders) in this process.
//!
//! A hostile component can be a compile bomb: a few megabytes that make the compiler
//! allocate gigabytes and run for minutes. In this process nothing can stop it once it
//! runs, so the `warden` binary compiles in a child of itself (`warden
//! __compile-component`): component bytes on stdin, wasmtime's precompiled artifact on
//! stdout, an error text on stderr. The child runs under an address-space limit
//! (`plugins.compile_memory`) and is killed when the load is dropped (by
//! `plugins.load_timeout` or shutdown), so a bomb fails that one plugin with a clear error
//! while the host keeps serving.
//!
//! This module owns that protocol and the limits. It must never deserialize bytes that
//! did not come from its own child (or its own in-process compile), and never let a
//! child outlive the load that started it.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wasmtime::Engine;
use wasmtime::component::Component;

/// The argument that turns the `warden` binary into the compiler child.
pub const CHILD_ARG: &str = "__compile-component";
/// The flag telling the child to instrument code for fuel (it must build exactly the
/// engine configuration of its parent, or the artifact will not load).
const FUEL_FLAG: &str = "--fuel";
/// The flag asking the child for a baseline (Winch) build instead of an optimised one.
const BASELINE_FLAG: &str = "--baseline";
/// Bytes of the child's stderr kept for the error message.
const MAX_CHILD_ERROR: u64 = 4096;
/// glibc malloc arenas the child may create: each reserves 64 MiB of address space, which
/// counts against the limit without holding memory; two are plenty for the compiler.
const CHILD_MALLOC_ARENAS: &str = "2";

/// Where components are compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compiler {
    /// In this process, bounded in time only by abandoning it (the compile finishes in
    /// the background). For tools, tests and embedders without the `warden` binary.
    InProcess,
    /// In a child process of `exe` (the `warden` binary) with at most `memory` bytes of
    /// address space, killed when the load is dropped.
    ChildProcess { exe: PathBuf, memory: u64 },
}

static BINARY: OnceLock<PathBuf> = OnceLock::new();

/// Called once by the `warden` binary: runtimes built by [`crate::app::Host::start`] compile in
/// child processes of this executable from now on.
pub fn use_child_processes_of(exe: PathBuf) {
    let _ = BINARY.set(exe);
}

impl Compiler {
    /// The compiler [`crate::app::Host::start`] uses: a child process when this process is the
    /// `warden` binary (see [`use_child_processes_of`]), else in process.
    pub fn default_for_start(memory: u64) -> Self {
        match BINARY.get() {
            Some(exe) => Compiler::ChildProcess { exe: exe.clone(), memory },
            None => Compiler::InProcess,
        }
    }

    /// Compiles `bytes` for `engine`. Returns the component and, when a child compiled
    /// it, the artifact it sent (so a cache can store it without serializing again).
    pub async fn compile(
        &self,
        engine: &Engine,
        fuel: bool,
        tier: super::tier::Tier,
        bytes: &[u8],
    ) -> Result<Compiled, String> {
        match self {
            Compiler::InProcess => {
                let (engine, bytes) = (engine.clone(), bytes.to_vec());
                // CPU-heavy: on a blocking thread so the async workers keep serving.
                let component = tokio::task::spawn_blocking(move || Component::new(&engine, &bytes))
                    .await
                    .map_err(|e| format!("the compiler failed: {e}"))?
                    .map_err(|e| super::root_cause(&e))?;
                Ok(Compiled { component, artifact: None })
            }
            Compiler::ChildProcess { exe, memory } => {
                let artifact = compile_in_child(exe, *memory, fuel, tier, bytes).await?;
                let engine = engine.clone();
                let component = tokio::task::spawn_blocking(move || {
                    // SAFETY: the artifact is what our own child wrote for this exact engine
                    // configuration (`Engine::precompile_component`); wasmtime checks its header.
                    let c = unsafe { Component::deserialize(&engine, &artifact) };
                    c.map(|c| (c, artifact))
                })
                .await
                .map_err(|e| format!("loading the compiled code failed: {e}"))?
                .map_err(|e| format!("the compiled code does not load: {}", super::root_cause(&e)))?;
                Ok(Compiled { component: component.0, artifact: Some(component.1) })
            }
        }
    }
}

/// A compiled component and, when available, its serialized artifact.
pub struct Compiled {
    pub component: Component,
    pub artifact: Option<Vec<u8>>,
}

async fn compile_in_child(
    exe: &std::path::Path,
    memory: u64,
    fuel: bool,
    tier: super::tier::Tier,
    bytes: &[u8],
) -> Result<Vec<u8>, String> {
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg(CHILD_ARG)
        .args(fuel.then_some(FUEL_FLAG))
        .args((tier == super::tier::Tier::Baseline).then_some(BASELINE_FLAG))
        .env_clear()
        .env("MALLOC_ARENA_MAX", CHILD_MALLOC_ARENAS)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let limit = memory as libc::rlim_t;
    // SAFETY: only async-signal-safe calls (setrlimit) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let as_limit = libc::rlimit { rlim_cur: limit, rlim_max: limit };
            let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            if libc::setrlimit(libc::RLIMIT_AS, &as_limit) != 0 || libc::setrlimit(libc::RLIMIT_CORE, &no_core) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| format!("cannot start the compiler process {}: {e}", exe.display()))?;
    let mut stdin = child.stdin.take().expect("piped");
    let mut stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let input = bytes.to_vec();
    let write = async move {
        // A child that dies early closes the pipe; its exit status tells why.
        let _ = stdin.write_all(&input).await;
        drop(stdin);
    };
    // The artifact cannot be larger than the memory the child may use.
    let read_out = async {
        let mut out = Vec::new();
        (&mut stdout).take(memory).read_to_end(&mut out).await.map(|_| out)
    };
    let read_err = async {
        let mut err = Vec::new();
        let _ = stderr.take(MAX_CHILD_ERROR).read_to_end(&mut err).await;
        err
    };
    let ((), out, err) = tokio::join!(write, read_out, read_err);
    let status = child.wait().await.map_err(|e| format!("the compiler process failed: {e}"))?;
    let err = String::from_utf8_lossy(&err);
    let err = err.trim();
    if status.success() {
        return out.map_err(|e| format!("reading the compiler's output: {e}"));
    }
    // Under RLIMIT_AS exhaustion shows as a failed allocation, ENOMEM, or EAGAIN from a
    // thread whose stack cannot be mapped (the compiler's worker pool panics with it).
    let out_of_memory = err.contains("memory allocation")
        || err.contains("Cannot allocate memory")
        || err.contains("out of memory")
        || err.contains("Resource temporarily unavailable")
        || std::os::unix::process::ExitStatusExt::signal(&status)
            .is_some_and(|s| s == libc::SIGABRT || s == libc::SIGSEGV);
    if out_of_memory {
        return Err(format!("compiling needs more than {} MiB of memory (plugins.compile_memory)", memory >> 20));
    }
    Err(match err.lines().last() {
        Some(line) if !line.is_empty() => line.to_owned(),
        _ => format!("the compiler process ended with {status}"),
    })
}

/// The child's side: reads a component on stdin, writes the precompiled artifact on
/// stdout. Returns the process exit code. Never reads configuration or plugin files.
pub fn child_main(args: &[String]) -> std::process::ExitCode {
    use std::io::{Read, Write};
    let fuel = args.iter().any(|a| a == FUEL_FLAG);
    let tier = match args.iter().any(|a| a == BASELINE_FLAG) {
        true => super::tier::Tier::Baseline,
        false => super::tier::Tier::Optimized,
    };
    let options = super::RuntimeOptions { fuel, ..super::RuntimeOptions::uncached() };
    let run = || -> Result<Vec<u8>, String> {
        let engine = Engine::new(&super::engine_config(&options, tier)).map_err(|e| e.to_string())?;
        let mut bytes = Vec::new();
        std::io::stdin().read_to_end(&mut bytes).map_err(|e| format!("reading the component: {e}"))?;
        engine.precompile_component(&bytes).map_err(|e| super::root_cause(&e))
    };
    match run() {
        Ok(artifact) => match std::io::stdout().lock().write_all(&artifact) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("writing the compiled code: {e}");
                std::process::ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("{e}");
            std::process::ExitCode::FAILURE
        }
    }
}
