//! The plugin runtime: one wasmtime `Engine`, compiled components (compiled in a
//! bounded child process, [`compiler`]; cached on disk, [`cache`]), an `InstancePre` per
//! plugin, and per call a fresh `Store` and instance (from the [`pool`] when pooled) with
//! a deadline, a memory cap and optional fuel.
//!
//! A trap, a timeout or a limit hit ends that call with a [`CallError`]; nothing a
//! plugin does may panic or stall the host. This module must never grant a capability
//! by itself — every import goes through [`crate::capability`].

pub mod bindings;
pub mod cache;
pub mod compiler;
pub mod growth;
mod host;
pub(crate) mod host_state;
pub mod pool;
pub mod ready;
pub mod tier;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use wasmtime::component::{Component, InstancePre, Linker};
use wasmtime::{Config as EngineConfig, Engine, Store, Trap};

use crate::capability::Grants;
use crate::config::Limits;
use crate::plugin::{GuestError, PluginInfo, SubagentDefinition, SubagentReference, TaskCall, TaskContext};
use crate::scope::TaskScope;
use crate::services::HostServices;
use bindings::Bindings;
pub use bindings::WitVersion;
use bindings::latest::types as wit;
pub use cache::Origin;
pub use host_state::CallScope;
use host_state::HostState;

/// How often the epoch advances. A spinning guest yields to the async executor once
/// per tick and notices its deadline within one tick.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);
/// Stack available to guest code: deep enough for real parsers, bounded so runaway
/// recursion traps instead of exhausting the host stack.
pub const MAX_WASM_STACK: usize = 1024 * 1024;
/// Time allowed for loading-time calls (`meta.info`): a plugin that cannot describe
/// itself within this is rejected.
pub const INFO_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Time a plugin call keeps after its task is canceled, to clean up (cancel a remote task,
/// save state) and return, before it is dropped. Only for WIT 0.2.0 and later, which can
/// see the cancellation; 0.1.0 calls are dropped at once. Well under the engine's wait for
/// a canceled task to end, so a cancel request still answers promptly.
pub const CANCEL_GRACE: Duration = Duration::from_secs(3);

/// Why a plugin call did not return a value.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum CallError {
    /// The plugin returned an error value.
    #[error("{0}")]
    Guest(GuestError),
    #[error("plugin `{plugin}` timed out after {limit:?}")]
    Timeout { plugin: String, limit: Duration },
    #[error("plugin `{plugin}` exceeded its memory limit of {limit} bytes")]
    MemoryLimit { plugin: String, limit: u64 },
    #[error("plugin `{plugin}` ran out of fuel ({fuel} units)")]
    OutOfFuel { plugin: String, fuel: u64 },
    #[error("plugin `{plugin}` returned {size} bytes, more than the output limit of {limit} bytes")]
    OutputTooLarge { plugin: String, size: u64, limit: u64 },
    #[error("plugin `{plugin}` trapped: {message}")]
    Trap { plugin: String, message: String },
    #[error("plugin `{plugin}` could not be instantiated: {message}")]
    Instantiate { plugin: String, message: String },
    /// The task was canceled and the call did not return within its grace period.
    #[error("plugin `{plugin}` call ended: its task was canceled")]
    Canceled { plugin: String },
    /// Host code serving the call panicked (a bug in warden, never the plugin's doing
    /// alone); the call ends, the host keeps serving.
    #[error("host fault while serving plugin `{plugin}`: {message}")]
    HostFault { plugin: String, message: String },
}

/// The text of a caught panic payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic with a non-text payload".into())
}

/// Why a component could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("not a valid WebAssembly component: {0}")]
    Compile(String),
    #[error("does not fit the warden:plugin world: {0}")]
    World(String),
    #[error("unsupported WIT version: {0}")]
    Version(String),
    #[error("meta.info failed: {0}")]
    Info(CallError),
    #[error("invalid plugin-info: {0}")]
    InvalidInfo(String),
    #[error("invalid grant: {0}")]
    Grant(String),
}

/// A loaded, ready-to-instantiate plugin. Immutable: replacing a plugin creates a new
/// `LoadedPlugin`; calls in flight keep the `Arc` of the old one.
pub struct LoadedPlugin {
    /// Operator-chosen id: the file stem. Grants and limits are keyed by it.
    pub id: String,
    pub info: PluginInfo,
    pub grants: Arc<Grants>,
    /// Outbound HTTP for this plugin: names resolve through its grant's address check.
    http: crate::services::PluginHttp,
    pub limits: Limits,
    pub source: PathBuf,
    pub content_hash: String,
    pub origin: Origin,
    pub load_time: Duration,
    /// The `warden:plugin` version the component is built against.
    pub wit_version: WitVersion,
    /// The trusted key (hex) whose signature over the file verified when it loaded;
    /// `None` for an unsigned file (allowed unless `plugins.require_signature`). Set by
    /// the registry, which runs the provenance check.
    pub signed_by: Option<String>,
    /// The code calls run: a baseline build while the optimised one compiles, then that.
    build: tier::CurrentBuild,
    /// The background optimised compile, stopped if the plugin goes away first.
    _upgrade: Option<tier::Upgrade>,
}

/// The import and export names of a compiled component.
fn names_of(component: &Component, engine: &Engine) -> (Vec<String>, Vec<String>) {
    let ty = component.component_type();
    (ty.imports(engine).map(|(n, _)| n.to_string()).collect(), ty.exports(engine).map(|(n, _)| n.to_string()).collect())
}

impl LoadedPlugin {
    /// The import and export names of the plugin's component.
    pub fn component_names(&self) -> (Vec<String>, Vec<String>) {
        let pre = self.build.pre();
        names_of(pre.component(), pre.engine())
    }

    /// Whether a ready instance waits for this plugin's next call ([`ready`]).
    pub fn instance_waiting(&self) -> bool {
        self.build.ready().is_waiting()
    }

    /// How the code calls run now was compiled.
    pub fn tier(&self) -> tier::Tier {
        self.build.tier()
    }

    /// How this plugin's calls have grown memory (zero when growth is not paced:
    /// `plugins.budgets.memory_growth_per_second` is 0).
    pub fn memory_growth(&self) -> growth::GrowthCounts {
        self.build.ready().pacer().map(|p| p.counts()).unwrap_or_default()
    }
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin").field("id", &self.id).field("info", &self.info).finish()
    }
}

/// The engine and everything shared by all plugins.
pub struct Runtime {
    engine: Engine,
    linker: Linker<HostState>,
    cache: Arc<cache::CompileCache>,
    services: Arc<HostServices>,
    fuel_enabled: bool,
    /// Pool slot permits (unbounded when instances are allocated on demand).
    slots: pool::Slots,
    /// Permits of ready instances across all plugins (`None`: off), beside `slots`.
    ready_permits: Option<Arc<tokio::sync::Semaphore>>,
    ready_counters: Arc<ready::ReadyCounters>,
    /// The baseline (Winch) engine for the first build of large components.
    baseline: Option<Baseline>,
    tier_up_min_size: usize,
    compiler: compiler::Compiler,
    _ticker: EpochTicker,
}

/// The engine and linker of baseline builds. Instances of baseline builds are allocated
/// on demand (they live only until the optimised build is installed).
struct Baseline {
    engine: Engine,
    linker: Linker<HostState>,
}

/// Advances the engine's epoch every [`EPOCH_TICK`] until dropped.
struct EpochTicker {
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Options fixed for the engine's lifetime.
pub struct RuntimeOptions {
    /// `None` disables the compile cache.
    pub cache_dir: Option<PathBuf>,
    /// Instrument code for fuel metering (needed when any plugin has a fuel limit;
    /// it costs some speed, so it is off otherwise).
    pub fuel: bool,
    /// Pooled, copy-on-write instance slots; `None` allocates every instance on demand.
    /// A pool the machine cannot reserve (address-space limits) falls back to on-demand
    /// allocation with a warning.
    pub pool: Option<pool::PoolOptions>,
    /// Where components are compiled (a bounded child process for the `warden` binary).
    pub compiler: compiler::Compiler,
    /// Compile large components in two tiers (see [`tier`]).
    pub tiered: bool,
    /// Smallest component compiled in two tiers when `tiered` (tests lower it to run
    /// small guests on the baseline compiler).
    pub tier_up_min_size: usize,
    /// Instances made ahead of calls, across all plugins ([`ready`]); 0 turns it off.
    /// A pool reserves this many slots beside the call slots.
    pub ready_instances: u32,
}

impl RuntimeOptions {
    /// On-demand allocation, no compile cache, no fuel: for tools and tests.
    pub fn uncached() -> Self {
        RuntimeOptions {
            cache_dir: None,
            fuel: false,
            pool: None,
            compiler: compiler::Compiler::InProcess,
            tiered: false,
            tier_up_min_size: tier::TIER_UP_MIN_SIZE,
            ready_instances: 0,
        }
    }
}

/// The engine settings every runtime shares, pooled or not, for one compiler tier.
fn engine_config(options: &RuntimeOptions, tier: tier::Tier) -> EngineConfig {
    let mut cfg = EngineConfig::new();
    if tier == tier::Tier::Baseline {
        // The baseline build lives for the seconds the optimised one takes; what counts
        // is how soon it answers. Winch compiles the wasm functions; the trampolines
        // into every escaping function (thousands in an interpreter) are Cranelift's,
        // compiled here without its optimisation passes, and no native-to-wasm address
        // map is built (a trap's backtrace names functions, not offsets, until the
        // optimised build is in). About 10% off an 18 MB Python component's compile.
        cfg.strategy(wasmtime::Strategy::Winch)
            .cranelift_opt_level(wasmtime::OptLevel::None)
            .generate_address_map(false);
    }
    cfg.wasm_component_model(true)
        // Native unwind tables serve only the system's unwinder stepping through wasm
        // frames (debuggers, profilers); wasmtime's own backtraces and trap handling do
        // not use them, and registering them costs time on every load.
        .native_unwind_info(false)
        .epoch_interruption(true)
        .consume_fuel(options.fuel)
        .max_wasm_stack(MAX_WASM_STACK)
        // Proposals warden's plugins do not need are off: fewer ways around the
        // one memory budget per instance (a module with 30 memories) and less
        // attack surface in the compiler and runtime. (Threads are not compiled in:
        // the `threads` feature of wasmtime is not enabled.)
        .wasm_multi_memory(false)
        .wasm_memory64(false)
        .wasm_shared_everything_threads(false);
    cfg
}

/// The engine, pooled when asked and possible, with the slots that go with it.
fn new_engine(options: &RuntimeOptions) -> anyhow::Result<(Engine, pool::Slots)> {
    if let Some(p) = options.pool {
        let mut cfg = engine_config(options, tier::Tier::Optimized);
        // Ready instances occupy slots of their own: calls never wait behind them.
        let slots = pool::PoolOptions { instances: p.instances.saturating_add(options.ready_instances), ..p };
        slots.apply(&mut cfg);
        match Engine::new(&cfg) {
            Ok(engine) => return Ok((engine, pool::Slots::pooled(p.instances))),
            Err(e) => tracing::warn!(
                instances = p.instances,
                max_memory = p.max_memory,
                error = %root_cause(&e),
                "cannot reserve the plugin instance pool; allocating instances on demand (slower calls)"
            ),
        }
    }
    let engine = Engine::new(&engine_config(options, tier::Tier::Optimized))
        .map_err(|e| anyhow::anyhow!("cannot create the wasm engine: {e}"))?;
    Ok((engine, pool::Slots::unbounded()))
}

/// A linker with WASI (deny-all) and warden's imports, for one engine.
fn new_linker(engine: &Engine) -> anyhow::Result<Linker<HostState>> {
    let mut linker = Linker::<HostState>::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(|e| anyhow::anyhow!("{e}"))?;
    bindings::add_to_linker(&mut linker).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(linker)
}

impl Runtime {
    pub fn new(options: RuntimeOptions, services: Arc<HostServices>) -> anyhow::Result<Runtime> {
        let (engine, slots) = new_engine(&options)?;
        let linker = new_linker(&engine)?;
        let baseline = if options.tiered {
            match Engine::new(&engine_config(&options, tier::Tier::Baseline)) {
                Ok(engine) => Some(Baseline { linker: new_linker(&engine)?, engine }),
                Err(e) => {
                    tracing::warn!(error = %root_cause(&e), "no baseline compiler; large plugins compile optimised only");
                    None
                }
            }
        } else {
            None
        };
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        {
            let engines: Vec<Engine> =
                std::iter::once(engine.clone()).chain(baseline.as_ref().map(|b| b.engine.clone())).collect();
            let stop = stop.clone();
            std::thread::Builder::new().name("warden-epoch".into()).spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    for engine in &engines {
                        engine.increment_epoch();
                    }
                }
            })?;
        }
        let cache = Arc::new(cache::CompileCache::new(&engine, options.cache_dir));
        Ok(Runtime {
            engine,
            linker,
            cache,
            services,
            fuel_enabled: options.fuel,
            slots,
            ready_permits: (options.ready_instances > 0)
                .then(|| Arc::new(tokio::sync::Semaphore::new(options.ready_instances as usize))),
            ready_counters: Arc::default(),
            baseline,
            tier_up_min_size: options.tier_up_min_size,
            compiler: options.compiler,
            _ticker: EpochTicker { stop },
        })
    }

    pub fn services(&self) -> &Arc<HostServices> {
        &self.services
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The import and export names of a component (for `warden plugin inspect`), compiled
    /// the quickest way this runtime can (the baseline compiler when tiered).
    pub async fn component_names(&self, bytes: &[u8]) -> Result<(Vec<String>, Vec<String>), LoadError> {
        let (engine, tier) = match &self.baseline {
            Some(b) => (&b.engine, tier::Tier::Baseline),
            None => (&self.engine, tier::Tier::Optimized),
        };
        let compiled =
            self.compiler.compile(engine, self.fuel_enabled, tier, bytes).await.map_err(LoadError::Compile)?;
        Ok(names_of(&compiled.component, engine))
    }

    /// How calls got their instances: ready ones taken, instantiated in the call, dropped unused.
    pub fn ready_counters(&self) -> &ready::ReadyCounters {
        &self.ready_counters
    }

    /// Whether instances come from the pool (false: on demand, by choice or fallback).
    pub fn is_pooled(&self) -> bool {
        self.slots.is_pooled()
    }

    /// Compiles (or loads from cache) a component and reads its `plugin-info`.
    /// `grant_for` maps the plugin id to its operator grant.
    pub async fn load(
        &self,
        id: &str,
        source: PathBuf,
        bytes: &[u8],
        limits: Limits,
        grant: Option<&crate::config::GrantConfig>,
    ) -> Result<LoadedPlugin, LoadError> {
        let started = Instant::now();
        let engine = self.engine.clone();
        let content_hash = cache::CompileCache::content_hash(bytes);
        let cached = {
            let (cache, engine, hash) = (self.cache.clone(), engine.clone(), content_hash.clone());
            tokio::task::spawn_blocking(move || cache.lookup(&engine, &hash)).await.ok().flatten()
        };
        let world = |e: wasmtime::Error| LoadError::World(root_cause(&e));
        // The component, and whether it is a baseline build (for the baseline's linker).
        let (component, baseline, origin) = match (cached, &self.baseline) {
            (Some(c), _) => (c, false, Origin::Cached),
            (None, Some(baseline)) if bytes.len() >= self.tier_up_min_size => {
                match self.compiler.compile(&baseline.engine, self.fuel_enabled, tier::Tier::Baseline, bytes).await {
                    Ok(quick) => (quick.component, true, Origin::Compiled),
                    Err(e) => {
                        tracing::warn!(plugin = id, error = %e, "baseline compile failed; compiling optimised only");
                        (self.compile_optimized(bytes, &content_hash).await?, false, Origin::Compiled)
                    }
                }
            }
            (None, _) => (self.compile_optimized(bytes, &content_hash).await?, false, Origin::Compiled),
        };
        // The version first: a plugin of an unsupported version is told so, not that an
        // import is missing.
        let wit_version = WitVersion::of_component(&component, &engine).map_err(LoadError::Version)?;
        let pre = match (baseline, &self.baseline) {
            (true, Some(b)) => b.linker.instantiate_pre(&component),
            _ => self.linker.instantiate_pre(&component),
        }
        .map_err(world)?;
        let upgrade = baseline.then_some(());
        let tier = if upgrade.is_some() { tier::Tier::Baseline } else { tier::Tier::Optimized };
        let info = self.call_info(id, wit_version, &pre).await.map_err(LoadError::Info)?;
        validate_info(&info)?;
        let grants = Arc::new(Grants::new(id, &info.capabilities, grant).map_err(|e| LoadError::Grant(e.to_string()))?);
        let http = crate::services::PluginHttp::new(grants.clone());
        if info.name != id {
            tracing::warn!(plugin = id, claimed = %info.name, "plugin names itself differently from its file; grants use the file name");
        }
        let recipe = Arc::new(ready::Recipe {
            plugin: id.into(),
            version: wit_version,
            limits,
            fuel_enabled: self.fuel_enabled,
            services: self.services.clone(),
            permits: self.ready_permits.clone(),
            counters: self.ready_counters.clone(),
            pacer: growth::GrowthPacer::new(self.services.budgets.memory_growth_per_second).map(Arc::new),
        });
        let build = tier::CurrentBuild::new(pre, tier, recipe);
        let upgrade = upgrade.map(|()| self.spawn_upgrade(id, &build, bytes, &content_hash));
        Ok(LoadedPlugin {
            id: id.to_owned(),
            info,
            grants,
            http,
            limits,
            source,
            content_hash,
            origin,
            load_time: started.elapsed(),
            wit_version,
            signed_by: None,
            build,
            _upgrade: upgrade,
        })
    }

    /// Compiles `bytes` optimised (in a child process under `plugins.compile_memory` for
    /// the `warden` binary; a caller's timeout drops this future, which kills the child)
    /// and caches the result.
    async fn compile_optimized(&self, bytes: &[u8], content_hash: &str) -> Result<Component, LoadError> {
        let compiled = self
            .compiler
            .compile(&self.engine, self.fuel_enabled, tier::Tier::Optimized, bytes)
            .await
            .map_err(LoadError::Compile)?;
        let (cache, hash) = (self.cache.clone(), content_hash.to_owned());
        let component = compiled.component.clone();
        let _ =
            tokio::task::spawn_blocking(move || cache.store(&hash, &compiled.component, compiled.artifact.as_deref()))
                .await;
        Ok(component)
    }

    /// Compiles the optimised build in the background and installs it into `build`.
    fn spawn_upgrade(&self, id: &str, build: &tier::CurrentBuild, bytes: &[u8], content_hash: &str) -> tier::Upgrade {
        let (engine, linker, compiler, cache) =
            (self.engine.clone(), self.linker.clone(), self.compiler.clone(), self.cache.clone());
        let (fuel, bytes, hash, id, target) =
            (self.fuel_enabled, bytes.to_vec(), content_hash.to_owned(), id.to_owned(), build.downgrade());
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let compiled = match compiler.compile(&engine, fuel, tier::Tier::Optimized, &bytes).await {
                Ok(c) => c,
                Err(e) => {
                    return tracing::warn!(plugin = %id, error = %e, "the optimised compile failed; the baseline build keeps serving");
                }
            };
            let pre = match linker.instantiate_pre(&compiled.component) {
                Ok(pre) => pre,
                Err(e) => {
                    return tracing::warn!(plugin = %id, error = %root_cause(&e), "the optimised build does not link; the baseline build keeps serving");
                }
            };
            let component = compiled.component.clone();
            let _ =
                tokio::task::spawn_blocking(move || cache.store(&hash, &component, compiled.artifact.as_deref())).await;
            if let Some(build) = target.upgrade() {
                build.upgrade(pre);
                tracing::info!(plugin = %id, took_ms = started.elapsed().as_millis() as u64, "optimised build installed");
            }
        });
        tier::Upgrade(task.abort_handle())
    }

    async fn call_info(
        &self,
        id: &str,
        version: WitVersion,
        pre: &InstancePre<HostState>,
    ) -> Result<PluginInfo, CallError> {
        let limits = Limits { timeout: INFO_CALL_TIMEOUT, ..Limits::default() };
        let scope = self.scope(id, Arc::new(Grants::default()), limits.timeout);
        self.run(id, version, Instances::Fresh(pre), limits, scope, |bindings, store| Box::pin(bindings.info(store)))
            .await
    }

    fn scope(&self, plugin: &str, grants: Arc<Grants>, timeout: Duration) -> CallScope {
        CallScope::outside_task(plugin.into(), grants, Instant::now() + timeout, self.services.clone())
    }

    pub async fn can_resolve(&self, plugin: &LoadedPlugin, reference: &SubagentReference) -> Result<bool, CallError> {
        let mut scope = self.scope(&plugin.id, plugin.grants.clone(), plugin.limits.timeout);
        scope.http = plugin.http.clone();
        let (source, r) = (Instances::Build(plugin.build.ready()), reference.clone());
        self.run(&plugin.id, plugin.wit_version, source, plugin.limits, scope, move |b, store| {
            Box::pin(async move { b.can_resolve(store, &r).await })
        })
        .await
    }

    pub async fn resolve(
        &self,
        plugin: &LoadedPlugin,
        reference: &SubagentReference,
    ) -> Result<SubagentDefinition, CallError> {
        self.resolve_reporting(plugin, reference).await.0
    }

    /// [`Self::resolve`], with the warnings the plugin logged while resolving (with the log
    /// grant): what a definition's author should hear about (unknown fields, ignored
    /// values), listed by `warden agents` as the reference's problems.
    pub async fn resolve_reporting(
        &self,
        plugin: &LoadedPlugin,
        reference: &SubagentReference,
    ) -> (Result<SubagentDefinition, CallError>, Vec<String>) {
        let mut scope = self.scope(&plugin.id, plugin.grants.clone(), plugin.limits.timeout);
        scope.http = plugin.http.clone();
        let sink = host_state::WarningSink::default();
        scope.warnings = Some(sink.clone());
        let (source, r) = (Instances::Build(plugin.build.ready()), reference.clone());
        let resolved = self
            .run(&plugin.id, plugin.wit_version, source, plugin.limits, scope, move |b, store| {
                Box::pin(async move { b.resolve(store, &r).await })
            })
            .await
            .and_then(|r| r.map_err(CallError::Guest));
        let warnings = std::mem::take(&mut *sink.lock().unwrap());
        (resolved, warnings)
    }

    pub async fn execute(
        &self,
        plugin: &LoadedPlugin,
        task: TaskContext,
        call: &TaskCall,
        definition: &SubagentDefinition,
        scope: impl Into<TaskScope>,
    ) -> Result<String, CallError> {
        let timeout = plugin.limits.timeout;
        let ctx = wit::TaskContext {
            task_id: task.task_id.clone(),
            session_id: task.session_id.clone(),
            user_id: task.user_id.clone(),
            deadline_ms: timeout.as_millis() as u64,
        };
        // The task's context is completed here, once, with what the call and the definition
        // say, then shared by the call's imports and the tool host.
        let mut task_scope: TaskScope = scope.into();
        task_scope.task_id.clone_from(&task.task_id);
        task_scope.session_id.clone_from(&task.session_id);
        task_scope.user_id.clone_from(&task.user_id);
        task_scope.subagent.clone_from(&definition.name);
        task_scope.plugin.clone_from(&plugin.id);
        task_scope.permission_mode = definition.permission_mode;
        task_scope.mcp_servers.clone_from(&definition.mcp_servers);
        task_scope.plugin_grants = plugin.grants.clone();
        task_scope.agent_mcp_servers.clone_from(&definition.agent_mcp_servers);
        task_scope.allowed_tools.clone_from(&definition.tools);
        // Validated when registered; a definition whose deny rules cannot be read never
        // runs without them.
        task_scope.own_denied_tools = crate::nesting::disallowed_tools(&Default::default(), definition)
            .map_err(|e| CallError::Guest(crate::plugin::GuestError::InvalidInput(e)))?;
        // A task taken over keeps the deadline it started with.
        let spent = task_scope.journal.as_ref().map_or(Duration::ZERO, |j| j.elapsed());
        let task_scope = Arc::new(task_scope);
        let mut scope = self.scope(&plugin.id, plugin.grants.clone(), timeout.saturating_sub(spent));
        scope.task = Some(task);
        scope.task_scope = Some(task_scope.clone());
        scope.http = plugin.http.clone();
        let (source, call, def) = (Instances::Build(plugin.build.ready()), call.clone(), definition.clone());
        let out = self
            .run(&plugin.id, plugin.wit_version, source, plugin.limits, scope, move |b, store| {
                Box::pin(async move { b.execute(store, &ctx, &call, &def).await })
            })
            .await;
        // However the call ended: what the task started for itself ends with it.
        if let Some(tools) = &self.services.tools {
            tools.end_task(&task_scope).await;
        }
        let out = out?;
        // The task's output: its result, or the question it waits on (`input-required`),
        // both stored and streamed as the task's `output`. (A WIT string is UTF-8 by the
        // canonical ABI; control characters are escaped by JSON and by every printer.)
        let text = match &out {
            Ok(text) | Err(GuestError::InputRequired(text)) => text.len() as u64,
            Err(_) => 0,
        };
        if text > plugin.limits.max_output {
            return Err(CallError::OutputTooLarge {
                plugin: plugin.id.clone(),
                size: text,
                limit: plugin.limits.max_output,
            });
        }
        out.map_err(CallError::Guest)
    }

    /// Runs `f` in a fresh instance under the limits: a ready one of the plugin's build
    /// if one waits ([`ready`]), else one instantiated for this call.
    async fn run<R: Send + 'static>(
        &self,
        plugin: &str,
        version: WitVersion,
        source: Instances<'_>,
        limits: Limits,
        scope: CallScope,
        f: impl for<'a> FnOnce(
            &'a Bindings,
            &'a mut Store<HostState>,
        ) -> std::pin::Pin<Box<dyn Future<Output = wasmtime::Result<R>> + Send + 'a>>
        + Send,
    ) -> Result<R, CallError> {
        let deadline = scope.deadline;
        let cancel = scope.cancel().cloned();
        // Whatever way the call ends, its build's filler makes the next ready instance.
        struct CallEnded(Option<Arc<ready::Ready>>);
        impl Drop for CallEnded {
            fn drop(&mut self) {
                if let Some(ready) = &self.0 {
                    ready.call_ended();
                }
            }
        }
        let _ended = CallEnded(match &source {
            Instances::Fresh(_) => None,
            Instances::Build(ready) => Some(ready.clone()),
        });
        let (pre, ready, pacer) = match source {
            Instances::Fresh(pre) => (pre.clone(), None, None),
            Instances::Build(ready) => {
                let mut taken = ready.take(&scope, &limits);
                // The call runs on a call slot when one is free, so the ready permit goes
                // back to make the next instance while this one runs.
                if let Some(Ok(prepared)) = &mut taken
                    && Engine::same(ready.pre().engine(), &self.engine)
                    && let Some(slot) = self.slots.try_acquire()
                {
                    prepared.occupy(slot);
                }
                (ready.pre().clone(), taken, ready.pacer().cloned())
            }
        };
        // Instantiating here: a pool slot for the whole call (released after the store is
        // dropped); waiting for one counts against the call's deadline. (A ready instance
        // holds a slot of its own.)
        let needs_slot = ready.is_none() && Engine::same(pre.engine(), &self.engine);
        let slot = async {
            match needs_slot {
                true => self.slots.acquire().await,
                false => None,
            }
        };
        let slot = match tokio::time::timeout_at(deadline.into(), slot).await {
            Ok(slot) => slot,
            Err(_) => return Err(CallError::Timeout { plugin: plugin.into(), limit: limits.timeout }),
        };
        let fuel = limits.fuel;
        let work = async {
            let mut prepared = match ready {
                Some(ready) => ready?,
                None => ready::prepare(&pre, version, &limits, self.fuel_enabled, scope, slot, pacer).await?,
            };
            let memory_hit = prepared.memory_hit.clone();
            let classify = |e: wasmtime::Error| -> CallError {
                if memory_hit.load(Ordering::SeqCst) {
                    return CallError::MemoryLimit { plugin: plugin.into(), limit: limits.memory };
                }
                match e.downcast_ref::<Trap>() {
                    Some(Trap::Interrupt) => CallError::Timeout { plugin: plugin.into(), limit: limits.timeout },
                    Some(Trap::OutOfFuel) => CallError::OutOfFuel { plugin: plugin.into(), fuel: fuel.unwrap_or(0) },
                    _ => trap(plugin, &e),
                }
            };
            let r = f(&prepared.bindings, &mut prepared.store).await.map_err(classify);
            // Plugin text reaches the log only as `log` writes do (grant, budgets, escaping).
            prepared.store.data_mut().log_captured_stdio();
            match &_ended.0 {
                Some(ready) => ready.retire(prepared),
                None => drop(prepared),
            }
            r
        };
        // A panic in host code serving this call (an import, a binding) ends this call
        // with an error; the store and instance it poisoned are dropped with it.
        let work = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(work));
        // A canceled task ends the call: at once for versions that cannot see it, after
        // the grace period for those that can (they return earlier when they are done).
        let grace = if version >= WitVersion::V0_2_0 { CANCEL_GRACE } else { Duration::ZERO };
        let canceled = async {
            match &cancel {
                Some(c) => {
                    c.canceled().await;
                    tokio::time::sleep(grace).await;
                }
                None => std::future::pending().await,
            }
        };
        let work = async {
            tokio::select! {
                r = work => Some(r),
                () = canceled => None,
            }
        };
        match tokio::time::timeout_at(deadline.into(), work).await {
            Ok(None) => Err(CallError::Canceled { plugin: plugin.into() }),
            Ok(Some(Ok(r))) => r,
            Ok(Some(Err(panic))) => {
                let message = panic_message(&*panic);
                tracing::error!(plugin, %message, "host fault while serving a plugin call");
                Err(CallError::HostFault { plugin: plugin.into(), message })
            }
            Err(_) => Err(CallError::Timeout { plugin: plugin.into(), limit: limits.timeout }),
        }
    }
}

/// Where a call's instance comes from.
enum Instances<'a> {
    /// Instantiated for this call from a template (loading-time calls).
    Fresh(&'a InstancePre<HostState>),
    /// A plugin's current build: its ready instance if one waits, else instantiated.
    Build(Arc<ready::Ready>),
}

/// Baselines for the benchmarks: the same generated bindings called with none of
/// warden's machinery (no limits, deadline, capability scope or output checks).
/// Not for production use.
#[doc(hidden)]
pub mod bench {
    use super::*;

    fn bare_store(rt: &Runtime) -> Store<HostState> {
        let scope = rt.scope("bench", Arc::new(Grants::default()), Duration::from_secs(3600));
        let mut store = Store::new(&rt.engine, HostState::new(scope, u64::MAX, None));
        // Epoch interruption is an engine setting; give the baseline an unreachable deadline.
        store.set_epoch_deadline(u64::MAX / 2);
        store
    }

    fn args(prompt: &str) -> (wit::TaskContext, TaskCall, SubagentDefinition) {
        let reference =
            SubagentReference { uri: "bench://x".into(), kind: "HOSTILE".into(), metadata: Default::default() };
        (
            wit::TaskContext { task_id: "t".into(), session_id: "s".into(), user_id: "u".into(), deadline_ms: 0 },
            TaskCall {
                description: "d".into(),
                prompt: prompt.into(),
                subagent_type: "x".into(),
                ..TaskCall::default()
            },
            SubagentDefinition::new("x".into(), "d".into(), reference, "{}".into()),
        )
    }

    /// A fresh store and instance per call, then the typed `execute` call.
    pub async fn raw_fresh_execute(rt: &Runtime, plugin: &LoadedPlugin, prompt: &str) -> String {
        let mut store = bare_store(rt);
        let instance = plugin.build.pre().instantiate_async(&mut store).await.expect("instantiate");
        let b = Bindings::new(plugin.wit_version, &mut store, &instance).expect("bindings");
        let (c, t, d) = args(prompt);
        b.execute(&mut store, &c, &t, &d).await.expect("call").expect("ok")
    }

    /// Instantiation from the plugin's `InstancePre` alone.
    pub async fn instantiate_only(rt: &Runtime, plugin: &LoadedPlugin) {
        let mut store = bare_store(rt);
        plugin.build.pre().instantiate_async(&mut store).await.expect("instantiate");
    }

    /// One long-lived instance; each call is only the typed `execute` call.
    pub struct HotInstance {
        store: Store<HostState>,
        bindings: Bindings,
    }

    impl HotInstance {
        pub async fn new(rt: &Runtime, plugin: &LoadedPlugin) -> Self {
            let mut store = bare_store(rt);
            let instance = plugin.build.pre().instantiate_async(&mut store).await.expect("instantiate");
            let bindings = Bindings::new(plugin.wit_version, &mut store, &instance).expect("bindings");
            HotInstance { store, bindings }
        }

        pub async fn execute(&mut self, prompt: &str) -> String {
            let (c, t, d) = args(prompt);
            self.bindings.execute(&mut self.store, &c, &t, &d).await.expect("call").expect("ok")
        }
    }
}

fn trap(plugin: &str, e: &wasmtime::Error) -> CallError {
    let mut message = root_cause(e);
    if matches!(e.downcast_ref::<Trap>(), Some(Trap::UnreachableCodeReached)) {
        message.push_str(" (the plugin panicked or aborted)");
    }
    CallError::Trap { plugin: plugin.into(), message }
}

/// The error chain as one line, without wasm backtraces.
fn root_cause(e: &wasmtime::Error) -> String {
    let mut parts = vec![];
    for c in e.chain() {
        let s = c.to_string();
        let first = s.lines().next().unwrap_or("").to_owned();
        if !first.is_empty() && !parts.contains(&first) {
            parts.push(first);
        }
    }
    parts.join(": ")
}

/// Longest `plugin-info` name: a name, shown in `warden plugins` and logs.
pub const MAX_INFO_NAME_LEN: usize = 128;
/// Longest `plugin-info` version: a semantic version with pre-release and build parts fits.
pub const MAX_INFO_VERSION_LEN: usize = 64;

/// Whether `text` is what a plugin may call itself: printable ASCII and spaces only, so its
/// self-reported name and version reach logs, terminals (`warden plugins`, `warden demo`)
/// and task events as they are, never as line breaks or terminal controls.
fn printable(text: &str) -> bool {
    text.chars().all(|c| c.is_ascii_graphic() || c == ' ')
}

fn validate_info(info: &PluginInfo) -> Result<(), LoadError> {
    let bad = |m: String| Err(LoadError::InvalidInfo(m));
    if info.name.trim().is_empty() {
        return bad("name is empty".into());
    }
    for (field, text, max) in
        [("name", &info.name, MAX_INFO_NAME_LEN), ("version", &info.version, MAX_INFO_VERSION_LEN)]
    {
        if text.len() > max || !printable(text) {
            let shown = crate::text::escape_control(&text.chars().take(max).collect::<String>()).into_owned();
            return bad(format!("{field} \"{shown}\" must be at most {max} printable ASCII characters"));
        }
    }
    if info.kinds.is_empty() {
        return bad("kinds is empty: a plugin must serve at least one kind".into());
    }
    for k in &info.kinds {
        if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return bad(format!("kind {k:?} must be non-empty [A-Za-z0-9_-]"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::io::AsyncWriteExt;

    use super::*;
    use crate::capability::Capability;
    use crate::config::{Budgets, GrantConfig};

    /// Log output captured by a test subscriber.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A call's state for plugin `p` (which asks for `log`) with the `log` grant or not,
    /// after the plugin wrote `stdout` and `stderr`; and the log lines that state's
    /// end-of-call handling of its stdio wrote.
    async fn stdio_logged(log: bool, budgets: Budgets, stdout: &[u8], stderr: &[u8]) -> Vec<String> {
        let mut services = HostServices::new(vec![]);
        services.budgets = budgets;
        let rt = Runtime::new(RuntimeOptions::uncached(), Arc::new(services)).unwrap();
        let grant = GrantConfig { log, ..Default::default() };
        let grants = Arc::new(Grants::new("p", &[Capability::Log], Some(&grant)).unwrap());
        let mut state = HostState::new(rt.scope("p", grants, Duration::from_secs(5)), u64::MAX, None);
        state.stdout.clone().write_all(stdout).await.unwrap();
        state.stderr.clone().write_all(stderr).await.unwrap();
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || state.log_captured_stdio());
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_owned).collect()
    }

    /// WASI stdout/stderr went to the operator log unescaped (a plugin could forge whole
    /// records of the host's), with no `log` grant and outside the per-call log budgets.
    #[tokio::test]
    async fn regression_plugin_stdio_reaches_the_log_only_as_log_writes_do() {
        let forged = b"ok\n2026-05-01T10:00:00Z  INFO warden::tools: tool call decision=Allow\x1b[2J\n";
        // No `log` grant: nothing of it is logged (its size is noted at debug only).
        let lines = stdio_logged(false, Budgets::default(), forged, b"panicked at x\n").await;
        assert!(lines.is_empty(), "{lines:?}");
        // Granted: each line is one record of the plugin's, escaped, tagged with its stream.
        let lines = stdio_logged(true, Budgets::default(), forged, b"panicked at x\n").await;
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines.iter().all(|l| l.contains("plugin=\"p\"")), "{lines:?}");
        assert!(lines[0].contains(" INFO ") && lines[0].contains(": ok plugin="), "{lines:?}");
        assert!(lines[0].contains("stream=\"stdout\""), "{lines:?}");
        assert!(
            lines[1].contains("stream=\"stdout\"") && lines[1].contains("decision=Allow\\u{1b}[2J plugin="),
            "{lines:?}"
        );
        assert!(!lines.iter().any(|l| l.contains('\u{1b}')), "{lines:?}");
        assert!(lines[2].contains(" WARN ") && lines[2].contains(": panicked at x plugin="), "{lines:?}");
        assert!(lines[2].contains("stream=\"stderr\""), "{lines:?}");
        // The per-call budget counts these lines: past it, the rest is dropped with one note.
        let two = Budgets { max_log_lines_per_call: 2, ..Budgets::default() };
        let lines = stdio_logged(true, two, b"1\n2\n3\n4\n", b"5\n").await;
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[0].contains(": 1 plugin=") && lines[1].contains(": 2 plugin="), "{lines:?}");
        assert!(lines[2].contains("the rest of the plugin's output dropped"), "{lines:?}");
        assert!(lines[2].contains("max_log_lines_per_call"), "{lines:?}");
        let small = Budgets { max_log_bytes_per_call: 4, ..Budgets::default() };
        let lines = stdio_logged(true, small, b"abc\ndefgh\n", b"").await;
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[1].contains("max_log_bytes_per_call"), "{lines:?}");
    }

    fn info(name: &str, version: &str) -> PluginInfo {
        PluginInfo { name: name.into(), version: version.into(), kinds: vec!["K".into()], capabilities: vec![] }
    }

    /// A plugin's self-reported name and version reached logs and terminals as they were.
    #[test]
    fn regression_plugin_info_names_and_versions_are_short_printable_text() {
        assert!(validate_info(&info("my plugin", "1.0.0-rc.1+build")).is_ok());
        for (name, version) in [
            ("p\nforged", "1.0.0"),
            ("p", "1.0.0\r\n2026 INFO forged"),
            ("p\u{1b}[2J", "1"),
            ("p", "1\u{202e}"),
            (&"n".repeat(MAX_INFO_NAME_LEN + 1), "1"),
            ("p", &"1".repeat(MAX_INFO_VERSION_LEN + 1)),
        ] {
            match validate_info(&info(name, version)) {
                Err(LoadError::InvalidInfo(m)) => {
                    assert!(m.contains("printable ASCII") && !m.contains('\n') && !m.contains('\u{1b}'), "{m}")
                }
                other => panic!("{name:?} {version:?}: {other:?}"),
            }
        }
    }
}
