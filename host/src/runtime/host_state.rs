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
use crate::event::EventSink;
use crate::plugin::{CancelSignal, TaskContext};
use crate::scope::TaskScope;
use crate::services::HostServices;

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
    /// The running task's context (`execute` calls only): its events, tools, allowed tools
    /// and cancellation. Shared with the tool host, never copied.
    pub task_scope: Option<Arc<TaskScope>>,
    pub services: Arc<HostServices>,
    /// The plugin's HTTP clients (its grant's address check in their resolvers).
    pub http: crate::services::PluginHttp,
    /// `resolve` calls only: where the warnings the plugin logs go besides the log, so the
    /// registry can list them as the reference's problems (`warden agents`).
    pub warnings: Option<WarningSink>,
}

/// The warnings a plugin logged during one call (bounded by the call's log budget).
pub type WarningSink = Arc<std::sync::Mutex<Vec<String>>>;

impl CallScope {
    /// A call outside any task (loading, resolving, instantiating ahead of a call): the
    /// plugin's `grants`, the host's HTTP clients, until `deadline`.
    pub fn outside_task(plugin: Arc<str>, grants: Arc<Grants>, deadline: Instant, services: Arc<HostServices>) -> Self {
        CallScope {
            plugin,
            grants,
            task: None,
            deadline,
            task_scope: None,
            http: services.http.clone(),
            services,
            warnings: None,
        }
    }

    /// Where the task's events go (`execute` calls of a task that keeps events).
    pub fn events(&self) -> Option<&EventSink> {
        self.task_scope.as_ref()?.events.as_ref()
    }

    /// The redactor of this call's text (import errors, plugin state): its task's
    /// session's, the host's for a call outside any task.
    pub fn redactor(&self) -> Arc<crate::redact::Redactor> {
        let task = self.task.as_ref();
        crate::redact::registry().owner(task.map(|t| t.user_id.as_str()), task.map(|t| t.session_id.as_str()))
    }

    /// The task's cancellation (`execute` calls run by a task).
    pub fn cancel(&self) -> Option<&CancelSignal> {
        self.task_scope.as_ref()?.cancel.as_ref()
    }

    /// The definition's `tools` list (`None` = every tool): what the tools import offers.
    pub fn allowed_tools(&self) -> Option<&Vec<String>> {
        self.task_scope.as_ref()?.allowed_tools.as_ref()
    }

    /// When the call ends: its deadline, or once the task is canceled the end of the
    /// grace period ([`super::CANCEL_GRACE`]) if that is sooner.
    pub fn effective_deadline(&self) -> Instant {
        match self.cancel().and_then(CancelSignal::canceled_at) {
            Some(at) => self.deadline.min(at + super::CANCEL_GRACE),
            None => self.deadline,
        }
    }

    /// Time left before [`Self::effective_deadline`] (zero when past it).
    pub fn remaining(&self) -> Duration {
        self.effective_deadline().saturating_duration_since(Instant::now())
    }
}

/// The memory budget of one store: every linear memory *and* every table of every core
/// instance in it count against one limit, so a component made of many modules (or
/// many memories) cannot multiply the cap. Remembers whether it refused a growth so a
/// resulting trap can be reported as "memory limit" rather than a generic fault.
pub struct CallLimiter {
    memory_limit: usize,
    /// Bytes of linear memory and table storage granted so far in this store (memories
    /// and tables only grow and live as long as the store).
    used: usize,
    /// Table elements granted so far in this store.
    table_elements: usize,
    hit: Arc<AtomicBool>,
    /// The plugin's growth budget (`None`: not paced, as for load-time calls).
    pacer: Option<Arc<super::growth::GrowthPacer>>,
    /// The deadline of the call this store serves, once instantiated: growth from then on
    /// is the call's, paced; growth while instantiating (start code) is not.
    armed: Option<std::time::Instant>,
    /// Whether this call has grown a memory yet (charged [`super::growth::GROWN_CALL_CHARGE`] once).
    grew: bool,
}

/// Table elements allowed per instance (all tables together): far above what real
/// guests use, low enough that a table bomb cannot eat host memory.
pub const MAX_TABLE_ELEMENTS: usize = 100_000;
/// Host bytes one table element is charged against the memory budget (a function
/// reference is a pointer plus metadata in wasmtime; 16 bytes is an upper bound).
pub const TABLE_ELEMENT_BYTES: usize = 16;

impl CallLimiter {
    pub fn new(memory_limit: u64) -> Self {
        CallLimiter {
            memory_limit: usize::try_from(memory_limit).unwrap_or(usize::MAX),
            used: 0,
            table_elements: 0,
            hit: Arc::new(AtomicBool::new(false)),
            pacer: None,
            armed: None,
            grew: false,
        }
    }

    /// The instance is made: growth from now on belongs to the call ending at `deadline`.
    pub fn begin_call(&mut self, deadline: std::time::Instant) {
        self.armed = Some(deadline);
    }

    /// Paces this store's memory growth by its plugin's budget (see [`super::growth`]).
    pub fn paced_by(mut self, pacer: Option<Arc<super::growth::GrowthPacer>>) -> Self {
        self.pacer = pacer;
        self
    }

    /// The charge for a growth from `current` to `desired` bytes against the plugin's
    /// budget (`None` when not paced, or still instantiating); an error when the growth
    /// could not happen before the call's deadline.
    fn growth_charge(&mut self, current: usize, desired: usize) -> wasmtime::Result<Option<super::growth::Charge>> {
        let (Some(pacer), Some(deadline)) = (self.pacer.as_ref(), self.armed) else { return Ok(None) };
        let bytes = desired.saturating_sub(current) as u64;
        match pacer.charge_growth(bytes, !self.grew, deadline) {
            Ok(charge) => {
                self.grew = true;
                Ok(Some(charge))
            }
            Err(wait) => Err(wasmtime::format_err!(
                "memory growth budget exceeded: growing by {bytes} bytes would wait {wait:?}, past the call's deadline (plugins.budgets.memory_growth_per_second)"
            )),
        }
    }

    pub fn hit_flag(&self) -> Arc<AtomicBool> {
        self.hit.clone()
    }
}

/// The limiter calls use (their stores are async): the same budget as
/// [`wasmtime::ResourceLimiter`], and growth within it waits for the plugin's growth
/// budget without holding a thread.
#[async_trait::async_trait]
impl wasmtime::ResourceLimiterAsync for CallLimiter {
    async fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if !wasmtime::ResourceLimiter::memory_growing(self, current, desired, maximum)? {
            return Ok(false);
        }
        if let Some(charge) = self.growth_charge(current, desired)? {
            // Dropped with the call while waiting: the charge is given back.
            if !charge.wait().is_zero() {
                tokio::time::sleep(charge.wait()).await;
            }
            charge.keep();
        }
        Ok(true)
    }

    async fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        wasmtime::ResourceLimiter::table_growing(self, current, desired, maximum)
    }
}

impl wasmtime::ResourceLimiter for CallLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let after = self.used.saturating_sub(current).saturating_add(desired);
        if after > self.memory_limit {
            self.hit.store(true, Ordering::SeqCst);
            return Err(wasmtime::format_err!(
                "memory limit exceeded: the plugin asked for {after} bytes of memories and tables in total, the limit is {} bytes",
                self.memory_limit
            ));
        }
        self.used = after;
        Ok(true)
    }

    fn table_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let elements = self.table_elements.saturating_sub(current).saturating_add(desired);
        let after = self
            .used
            .saturating_sub(current.saturating_mul(TABLE_ELEMENT_BYTES))
            .saturating_add(desired.saturating_mul(TABLE_ELEMENT_BYTES));
        if elements > MAX_TABLE_ELEMENTS || after > self.memory_limit {
            self.hit.store(true, Ordering::SeqCst);
            return Ok(false);
        }
        self.table_elements = elements;
        self.used = after;
        Ok(true)
    }
}

/// A streamed HTTP response body handed to a plugin as a `body-stream` resource.
pub struct BodyStream {
    /// `None`: a stream a durable task's replay handed back, whose connection died with
    /// the process that opened it (its chunks come from the journal while it lasts).
    pub response: Option<reqwest::Response>,
    /// Bytes delivered so far, checked against the response size limit.
    pub delivered: u64,
    /// Removes an injected secret's value from the body, across chunk boundaries.
    pub scrubber: Option<(std::sync::Arc<crate::redact::Redactor>, crate::redact::ByteStreamScrubber)>,
    /// The response body has ended (only the scrubber's held bytes may remain).
    pub ended: bool,
}

pub struct HostState {
    pub scope: CallScope,
    pub limiter: CallLimiter,
    pub table: ResourceTable,
    wasi: WasiCtx,
    pub stdout: MemoryOutputPipe,
    pub stderr: MemoryOutputPipe,
    /// What this call consumed through the imports, checked against `plugins.budgets`.
    pub usage: CallUsage,
}

/// Per-call consumption of the budgeted imports (see [`crate::config::Budgets`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct CallUsage {
    pub events: u32,
    pub event_bytes: u64,
    pub log_lines: u32,
    pub log_bytes: u64,
    /// Streamed HTTP responses open now.
    pub open_streams: u32,
}

impl HostState {
    pub fn new(scope: CallScope, memory_limit: u64, pacer: Option<Arc<super::growth::GrowthPacer>>) -> Self {
        let stdout = MemoryOutputPipe::new(MAX_CAPTURED_STDIO);
        let stderr = MemoryOutputPipe::new(MAX_CAPTURED_STDIO);
        // Deny-all WASI: no preopened directories, no environment, no arguments,
        // closed stdin, no sockets and no name lookup. Clocks and randomness stay,
        // as every language runtime needs them.
        let mut b = WasiCtx::builder();
        b.stdout(stdout.clone()).stderr(stderr.clone()).allow_tcp(false).allow_udp(false).allow_ip_name_lookup(false);
        HostState {
            scope,
            limiter: CallLimiter::new(memory_limit).paced_by(pacer),
            table: ResourceTable::new(),
            wasi: b.build(),
            stdout,
            stderr,
            usage: CallUsage::default(),
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A core module with one memory of `pages` 64 KiB pages (and, when `second`, two).
    fn module_with_memory(pages: u64, second: bool) -> Vec<u8> {
        use wasm_encoder::{MemorySection, MemoryType, Module};
        let mut memories = MemorySection::new();
        let ty = MemoryType { minimum: pages, maximum: None, memory64: false, shared: false, page_size_log2: None };
        memories.memory(ty);
        if second {
            memories.memory(ty);
        }
        let mut m = Module::new();
        m.section(&memories);
        m.finish()
    }

    fn engine() -> wasmtime::Engine {
        // The runtime's engine settings (multi-memory off, ...).
        let services = Arc::new(HostServices::new(vec![]));
        let rt = crate::runtime::Runtime::new(crate::runtime::RuntimeOptions::uncached(), services).unwrap();
        rt.engine().clone()
    }

    #[test]
    fn regression_many_memories_each_under_the_limit_multiplied_it() {
        let engine = engine();
        let mut store = wasmtime::Store::new(&engine, CallLimiter::new(64 << 20));
        store.limiter(|l| l);
        // 40 MiB each: every memory alone fits the 64 MiB budget, two together do not.
        let module = wasmtime::Module::new(&engine, module_with_memory(640, false)).unwrap();
        wasmtime::Instance::new(&mut store, &module, &[]).expect("the first memory fits");
        let second = wasmtime::Instance::new(&mut store, &module, &[]);
        assert!(second.is_err(), "all memories of a store share one budget");
        assert!(store.data().hit_flag().load(Ordering::SeqCst));
    }

    /// Resident memory of this process, from /proc (Linux).
    fn rss_bytes() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS");
        kb * 1024
    }

    /// A core module whose start function fills its whole memory of `pages` pages, so
    /// every page it gets is resident.
    fn module_touching_memory(pages: u64) -> Vec<u8> {
        use wasm_encoder::{
            CodeSection, Function, FunctionSection, Instruction, MemorySection, MemoryType, Module, StartSection,
            TypeSection,
        };
        let mut m = Module::new();
        let mut types = TypeSection::new();
        types.ty().function([], []);
        m.section(&types);
        let mut funcs = FunctionSection::new();
        funcs.function(0);
        m.section(&funcs);
        let mut memories = MemorySection::new();
        memories.memory(MemoryType {
            minimum: pages,
            maximum: None,
            memory64: false,
            shared: false,
            page_size_log2: None,
        });
        m.section(&memories);
        m.section(&StartSection { function_index: 0 });
        let mut code = CodeSection::new();
        let mut f = Function::new([]);
        f.instruction(&Instruction::I32Const(0))
            .instruction(&Instruction::I32Const(0xA5))
            .instruction(&Instruction::I32Const((pages * 65536) as i32))
            .instruction(&Instruction::MemoryFill(0))
            .instruction(&Instruction::End);
        code.function(&f);
        m.section(&code);
        m.finish()
    }

    /// The attack, measured: 30 memories of 40 MiB each, all filled, in one
    /// instance's store with a 64 MiB budget. Before, each passed the limit alone and the
    /// store held 1.2 GB; now the second is refused and resident memory stays near 40 MiB.
    #[cfg(target_os = "linux")]
    #[test]
    fn resident_memory_stays_within_the_budget() {
        let engine = engine();
        let module = wasmtime::Module::new(&engine, module_touching_memory(640)).unwrap();
        let before = rss_bytes();
        let mut store = wasmtime::Store::new(&engine, CallLimiter::new(64 << 20));
        store.limiter(|l| l);
        // The engine interrupts on epochs; this store's start functions may run to the end.
        store.set_epoch_deadline(u64::MAX / 2);
        let started = (0..30).filter(|_| wasmtime::Instance::new(&mut store, &module, &[]).is_ok()).count();
        let grown = rss_bytes().saturating_sub(before);
        drop(store);
        assert_eq!(started, 1);
        assert!(grown < 128 << 20, "resident memory grew by {} MiB", grown >> 20);
    }

    #[test]
    fn regression_multi_memory_modules_are_refused() {
        let e = wasmtime::Module::new(&engine(), module_with_memory(1, true)).unwrap_err();
        assert!(format!("{e:?}").contains("multiple memories"), "{e:?}");
    }

    /// Growth is the call's from the moment the instance is made (a memory declared with 0
    /// pages grown in the call included), never before it (start code); and a growth that
    /// could not happen before the call's deadline fails at once, naming the budget's key.
    #[tokio::test]
    async fn growth_is_paced_from_instantiation_on_and_never_past_the_deadline() {
        use crate::runtime::growth::GrowthPacer;
        use wasmtime::ResourceLimiterAsync;
        let pacer = Arc::new(GrowthPacer::new(64 << 20).unwrap());
        let mut l = CallLimiter::new(1 << 31).paced_by(Some(pacer.clone()));
        assert!(l.memory_growing(0, 1 << 20, None).await.unwrap());
        assert!(l.memory_growing(1 << 20, 2 << 20, None).await.unwrap());
        assert_eq!(pacer.counts().grown_calls, 0, "instantiation was charged");
        l.begin_call(std::time::Instant::now() + std::time::Duration::from_secs(10));
        assert!(l.memory_growing(0, 64 << 10, None).await.unwrap());
        assert_eq!(pacer.counts().grown_calls, 1, "growth from an empty memory went unpaced");
        // 1 GiB at 64 MiB/s waits ~16 s: past the 10 s deadline.
        let e = l.memory_growing(64 << 10, 1 << 30, None).await.unwrap_err();
        assert!(e.to_string().contains("plugins.budgets.memory_growth_per_second"), "{e}");
    }

    #[test]
    fn tables_count_against_the_same_budget() {
        use wasmtime::ResourceLimiter;
        let mut l = CallLimiter::new(1 << 20);
        assert!(l.memory_growing(0, 900 << 10, None).unwrap());
        // 100 KiB of table elements would pass the memory left over (124 KiB)...
        assert!(l.table_growing(0, (100 << 10) / TABLE_ELEMENT_BYTES, None).unwrap());
        // ...but not another 100 KiB.
        assert!(!l.table_growing(0, (100 << 10) / TABLE_ELEMENT_BYTES, None).unwrap());
        assert!(!l.table_growing(0, MAX_TABLE_ELEMENTS + 1, None).unwrap());
    }
}
