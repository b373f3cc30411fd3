//! Per-call store state: the capability scope of one plugin call, its limits and the
//! deny-all WASI context. One `HostState` lives in one `Store` for one call and is
//! dropped with it; it must never be shared between calls or plugins.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use wasmtime::component::ResourceTable;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::capability::Grants;
use crate::services::HostServices;
use crate::plugin::{EventSink, TaskContext};

/// Bytes of a plugin's stdout/stderr kept per call (WASI plugins only); the rest is
/// dropped. Enough for a panic message and a few diagnostic lines.
pub const MAX_CAPTURED_STDIO: usize = 64 * 1024;

/// Everything a host import may use during one call.
#[derive(Clone)]
pub struct CallScope {
    /// The plugin's id (file stem), used in logs and error texts.
    pub plugin: Arc<str>,
    pub grants: Arc<Grants>,
    pub task: Option<TaskContext>,
    pub deadline: Instant,
    pub events: Option<EventSink>,
    /// Who is calling tools in this call (set for `execute` calls only).
    pub tools: Option<crate::tools::ToolScope>,
    pub services: Arc<HostServices>,
}

impl CallScope {
    /// Time left before the call's deadline (zero when past it).
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
}

/// Linear-memory and table cap for one store; remembers whether it refused a growth
/// so a resulting trap can be reported as "memory limit" rather than a generic fault.
pub struct CallLimiter {
    memory_limit: usize,
    hit: Arc<AtomicBool>,
}

/// Table elements allowed per instance: far above what real guests use, low enough
/// that a table bomb cannot eat host memory.
pub const MAX_TABLE_ELEMENTS: usize = 100_000;

impl CallLimiter {
    pub fn new(memory_limit: u64) -> Self {
        CallLimiter { memory_limit: memory_limit as usize, hit: Arc::new(AtomicBool::new(false)) }
    }
    pub fn hit_flag(&self) -> Arc<AtomicBool> {
        self.hit.clone()
    }
}

impl wasmtime::ResourceLimiter for CallLimiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.memory_limit {
            self.hit.store(true, Ordering::SeqCst);
            return Err(wasmtime::format_err!(
                "memory limit exceeded: the plugin asked for {desired} bytes, the limit is {} bytes",
                self.memory_limit
            ));
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

/// A streamed HTTP response body handed to a plugin as a `body-stream` resource.
pub struct BodyStream {
    pub response: reqwest::Response,
    /// Bytes delivered so far, checked against the response size limit.
    pub delivered: u64,
}

pub struct HostState {
    pub scope: CallScope,
    pub limiter: CallLimiter,
    pub table: ResourceTable,
    wasi: WasiCtx,
    pub stdout: MemoryOutputPipe,
    pub stderr: MemoryOutputPipe,
    /// Events emitted in this call, checked against the per-call cap.
    pub events_emitted: u32,
}

impl HostState {
    pub fn new(scope: CallScope, memory_limit: u64) -> Self {
        let stdout = MemoryOutputPipe::new(MAX_CAPTURED_STDIO);
        let stderr = MemoryOutputPipe::new(MAX_CAPTURED_STDIO);
        // Deny-all WASI: no preopened directories, no environment, no arguments,
        // closed stdin, no sockets and no name lookup. Clocks and randomness stay,
        // as every language runtime needs them.
        let mut b = WasiCtx::builder();
        b.stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        HostState {
            scope,
            limiter: CallLimiter::new(memory_limit),
            table: ResourceTable::new(),
            wasi: b.build(),
            stdout,
            stderr,
            events_emitted: 0,
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}
