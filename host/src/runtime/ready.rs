//! Ready instances: a plugin's next call finds a fresh instance that was instantiated
//! before the call arrived, so instantiation is off the call's path.
//!
//! Every call still runs in a fresh store and a fresh instance that no call ran in
//! before, and the instance ends with its call (nothing a call leaves in memory reaches
//! another). What changes is *when* the instance is made: after a plugin is called, one
//! background filler per plugin build instantiates the next instance under the plugin's
//! limits and deadline with nothing granted (start code reaches no warden import), and
//! the next call binds its capability scope, fuel and deadline to it.
//!
//! This module owns the waiting instance of each build, the filler that makes it, and
//! [`prepare`], the one place a store and instance are made for a call (ready or not).
//! It must never hand one instance to two calls, never keep an instance across builds
//! (a tier upgrade or a reload drops the waiting one), and never hold more instances than
//! its permits ([`crate::config::PluginsConfig::ready_instances`], reserved in the pool
//! beside the call slots): an idle plugin's instance is dropped after [`READY_IDLE`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use wasmtime::component::InstancePre;
use wasmtime::{Store, UpdateDeadline};

use super::bindings::{Bindings, WitVersion};
use super::growth::GrowthPacer;
use super::host_state::{CallScope, HostState};
use super::{CallError, panic_message, root_cause};
use crate::capability::Grants;
use crate::config::Limits;
use crate::services::HostServices;

/// How long a made instance waits for a call before it is dropped and its permit given
/// back: a plugin called at least this often keeps one ready; an idle one holds nothing
/// (its next call instantiates as it would without ready instances, and starts the filler).
pub const READY_IDLE: Duration = Duration::from_secs(30);
/// Ended calls' stores waiting for the filler to drop them: each holds a pool slot, so
/// few; a burst past this drops its stores in the calls themselves.
pub const MAX_SPENT: usize = 8;

/// A store with a fresh instance in it, not yet called.
pub(super) struct Prepared {
    pub(super) store: Store<HostState>,
    pub(super) bindings: Bindings,
    /// Set by the store's limiter when it refused a growth.
    pub(super) memory_hit: Arc<AtomicBool>,
    /// The pool slot the instance occupies, released after the store (field order).
    _slot: Option<OwnedSemaphorePermit>,
}

impl Prepared {
    /// Moves the instance onto a call slot, giving its ready permit back for the next one.
    pub(super) fn occupy(&mut self, slot: OwnedSemaphorePermit) {
        self._slot = Some(slot);
    }

    /// Hands the instance to a call: the call's capability scope, a full fuel tank and the
    /// call's deadline replace what the instantiation ran under.
    fn bind(&mut self, scope: CallScope, limits: &Limits, fuel_enabled: bool) -> Result<(), CallError> {
        let (plugin, deadline) = (scope.plugin.clone(), scope.deadline);
        self.store.data_mut().scope = scope;
        // Growth from here on is this call's, paced up to its deadline.
        self.store.data_mut().limiter.begin_call(deadline);
        // The instantiation succeeded: a growth it was refused is not this call's.
        self.memory_hit.store(false, Ordering::SeqCst);
        arm(&mut self.store, limits, fuel_enabled, deadline).map_err(|e| super::trap(&plugin, &e))
    }
}

/// Sets a store's fuel and its deadline (checked at every epoch tick).
fn arm(store: &mut Store<HostState>, limits: &Limits, fuel_enabled: bool, deadline: Instant) -> wasmtime::Result<()> {
    if fuel_enabled {
        store.set_fuel(limits.fuel.unwrap_or(u64::MAX))?;
    }
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |_| {
        if Instant::now() >= deadline { Ok(UpdateDeadline::Interrupt) } else { Ok(UpdateDeadline::Yield(1)) }
    });
    Ok(())
}

/// Makes a fresh store and instance of `pre` under `scope` (its grants, its deadline)
/// and `limits` (the store's memory budget covers the instantiation). The caller bounds
/// the time this takes; `slot` is held until the store is dropped.
pub(super) async fn prepare(
    pre: &InstancePre<HostState>,
    version: WitVersion,
    limits: &Limits,
    fuel_enabled: bool,
    scope: CallScope,
    slot: Option<OwnedSemaphorePermit>,
    pacer: Option<Arc<GrowthPacer>>,
) -> Result<Prepared, CallError> {
    let (plugin, deadline) = (scope.plugin.clone(), scope.deadline);
    let mut store = Store::new(pre.engine(), HostState::new(scope, limits.memory, pacer));
    store.limiter_async(|s| &mut s.limiter);
    let memory_hit = store.data().limiter.hit_flag();
    arm(&mut store, limits, fuel_enabled, deadline).map_err(|e| super::trap(&plugin, &e))?;
    let instance = pre.instantiate_async(&mut store).await.map_err(|e| {
        if memory_hit.load(Ordering::SeqCst) {
            CallError::MemoryLimit { plugin: plugin.to_string(), limit: limits.memory }
        } else {
            CallError::Instantiate { plugin: plugin.to_string(), message: root_cause(&e) }
        }
    })?;
    let bindings = Bindings::new(version, &mut store, &instance)
        .map_err(|e| CallError::Instantiate { plugin: plugin.to_string(), message: root_cause(&e) })?;
    store.data_mut().limiter.begin_call(deadline);
    Ok(Prepared { store, bindings, memory_hit, _slot: slot })
}

/// What making an instance of one plugin takes, outside any call.
pub(super) struct Recipe {
    pub(super) plugin: Arc<str>,
    pub(super) version: WitVersion,
    pub(super) limits: Limits,
    pub(super) fuel_enabled: bool,
    pub(super) services: Arc<HostServices>,
    /// Instances ready at once across all plugins (`None`: ready instances are off).
    pub(super) permits: Option<Arc<Semaphore>>,
    pub(super) counters: Arc<ReadyCounters>,
    /// The plugin's memory-growth budget, shared by all its calls (`None`: not paced).
    pub(super) pacer: Option<Arc<GrowthPacer>>,
}

impl Recipe {
    /// The scope an instantiation outside a call runs under: no task and **no grant**, so
    /// start code reaches nothing through warden's imports (only WASI clocks and
    /// randomness) — nothing it could read outside a call reaches the call it is bound to.
    fn scope(&self, deadline: Instant) -> CallScope {
        CallScope::outside_task(self.plugin.clone(), Arc::new(Grants::default()), deadline, self.services.clone())
    }

    /// One instance made in the background, within the plugin's call timeout.
    async fn make(&self, pre: &InstancePre<HostState>, permit: OwnedSemaphorePermit) -> Result<Prepared, CallError> {
        let deadline = Instant::now() + self.limits.timeout;
        let (scope, pacer) = (self.scope(deadline), self.pacer.clone());
        let work = prepare(pre, self.version, &self.limits, self.fuel_enabled, scope, Some(permit), pacer);
        let work = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(work));
        match tokio::time::timeout_at(deadline.into(), work).await {
            Ok(Ok(made)) => made,
            Ok(Err(panic)) => {
                Err(CallError::HostFault { plugin: self.plugin.to_string(), message: panic_message(&*panic) })
            }
            Err(_) => Err(CallError::Timeout { plugin: self.plugin.to_string(), limit: self.limits.timeout }),
        }
    }
}

/// How calls got their instances (for tests, benchmarks and metrics).
#[derive(Debug, Default)]
pub struct ReadyCounters {
    /// Calls that found a ready instance.
    pub hits: AtomicU64,
    /// Calls of a plugin build with ready instances on that instantiated their own.
    pub misses: AtomicU64,
    /// Instances made in the background that a call never took (idle, replaced build).
    pub expired: AtomicU64,
}

/// One plugin build's waiting instance and the filler that makes it.
pub(super) struct Ready {
    pre: InstancePre<HostState>,
    recipe: Arc<Recipe>,
    waiting: Mutex<Option<Prepared>>,
    /// Stores of ended calls, dropped by the filler (a store's teardown resets its
    /// memory: off the call's path). At most [`MAX_SPENT`]; past that a call drops its own.
    spent: Mutex<Vec<Prepared>>,
    /// The filler is instantiating (up to the plugin's timeout): ended calls drop their own
    /// stores meanwhile, so their slots are never held for that long.
    making: AtomicBool,
    /// Wakes the filler: a call took (or missed) the instance, or this build is gone.
    wake: Arc<Notify>,
    filler_started: AtomicBool,
}

impl Ready {
    pub(super) fn new(pre: InstancePre<HostState>, recipe: Arc<Recipe>) -> Self {
        Ready {
            pre,
            recipe,
            waiting: Mutex::new(None),
            spent: Mutex::new(Vec::new()),
            making: false.into(),
            wake: Arc::new(Notify::new()),
            filler_started: false.into(),
        }
    }

    /// What this build's instances are made with (kept by a tier upgrade).
    pub(super) fn recipe(&self) -> Arc<Recipe> {
        self.recipe.clone()
    }

    /// Whether an instance waits for the next call.
    pub(super) fn is_waiting(&self) -> bool {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Hands an ended call's store to the filler to drop (with its slot), or drops it here
    /// when ready instances are off or [`MAX_SPENT`] already wait.
    pub(super) fn retire(&self, prepared: Prepared) {
        if self.recipe.permits.is_none()
            || !self.filler_started.load(Ordering::SeqCst)
            || self.making.load(Ordering::SeqCst)
        {
            return drop(prepared);
        }
        let mut spent = self.spent.lock().unwrap_or_else(|e| e.into_inner());
        if spent.len() < MAX_SPENT {
            spent.push(prepared);
        } else {
            drop(spent);
            drop(prepared);
        }
    }

    /// Asks the filler for the next instance: called when a call of this build has ended,
    /// so the instantiation does not compete with the call it would serve.
    pub(super) fn call_ended(self: &Arc<Self>) {
        if self.recipe.permits.is_none() {
            return;
        }
        // A call dropped outside the runtime (at its shutdown) starts nothing.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        if !self.filler_started.swap(true, Ordering::SeqCst) {
            runtime.spawn(fill(Arc::downgrade(self), self.wake.clone()));
        }
        self.wake.notify_one();
    }

    /// The plugin's memory-growth budget (`None`: not paced).
    pub(super) fn pacer(&self) -> Option<&Arc<GrowthPacer>> {
        self.recipe.pacer.as_ref()
    }

    /// The build's instance template (a call that finds no ready instance uses it).
    pub(super) fn pre(&self) -> &InstancePre<HostState> {
        &self.pre
    }

    /// The waiting instance bound to `scope`, if there is one (the caller tells
    /// [`Ready::call_ended`] when the call is over). `None` when ready instances are off or
    /// none waits.
    pub(super) fn take(self: &Arc<Self>, scope: &CallScope, limits: &Limits) -> Option<Result<Prepared, CallError>> {
        self.recipe.permits.as_ref()?;
        let taken = self.waiting.lock().unwrap_or_else(|e| e.into_inner()).take();
        let counters = &self.recipe.counters;
        let Some(mut prepared) = taken else {
            counters.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        // Made under the plugin's limits; a call with other limits (none today) makes its own.
        if *limits != self.recipe.limits {
            counters.expired.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        counters.hits.fetch_add(1, Ordering::Relaxed);
        Some(prepared.bind(scope.clone(), limits, self.recipe.fuel_enabled).map(|()| prepared))
    }
}

impl Drop for Ready {
    fn drop(&mut self) {
        // The filler holds only a weak reference: it wakes, finds the build gone, ends.
        self.wake.notify_one();
        if self.waiting.get_mut().map(|w| w.is_some()).unwrap_or(false) {
            self.recipe.counters.expired.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Sets a build's `making` flag while it is alive (a build gone has no calls to tell).
struct MakingFlag(Weak<Ready>);

impl MakingFlag {
    fn set(&self, on: bool) {
        if let Some(build) = self.0.upgrade() {
            build.making.store(on, Ordering::SeqCst);
        }
    }
}

/// The filler of one build: after each call (each wake) it makes one instance if none
/// waits, as soon as a permit is free, and drops a waiting instance no call took for
/// [`READY_IDLE`]. Ends when the build is dropped. One attempt per wake, so a plugin whose
/// instantiation fails never makes this spin (its calls report the failure themselves).
async fn fill(ready: Weak<Ready>, wake: Arc<Notify>) {
    let mut idle_until: Option<Instant> = None;
    loop {
        let woke = match idle_until {
            Some(at) => tokio::time::timeout_at(at.into(), wake.notified()).await.is_ok(),
            None => {
                wake.notified().await;
                true
            }
        };
        let Some(build) = ready.upgrade() else { return };
        let spent = std::mem::take(&mut *build.spent.lock().unwrap_or_else(|e| e.into_inner()));
        drop(spent);
        if !woke {
            let stale = build.waiting.lock().unwrap_or_else(|e| e.into_inner()).take();
            if stale.is_some() {
                build.recipe.counters.expired.fetch_add(1, Ordering::Relaxed);
            }
            idle_until = None;
            continue;
        }
        idle_until = Some(Instant::now() + READY_IDLE);
        if build.is_waiting() {
            continue;
        }
        let Some(permits) = build.recipe.permits.clone() else { return };
        let (pre, recipe) = (build.pre.clone(), build.recipe.clone());
        let making = MakingFlag(Arc::downgrade(&build));
        // Not held while waiting or instantiating: a build replaced meanwhile goes at once.
        drop(build);
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            // Every permit is taken (by waiting instances or calls running in them): the
            // next one freed, unless a call or the build's end comes first.
            Err(_) => {
                let freed = tokio::select! {
                    permit = permits.acquire_owned() => permit.ok(),
                    () = wake.notified() => None,
                };
                match freed {
                    Some(permit) => permit,
                    None => {
                        // Look again at once: the build may be gone, or filled.
                        wake.notify_one();
                        continue;
                    }
                }
            }
        };
        making.set(true);
        let made = recipe.make(&pre, permit).await;
        making.set(false);
        let Some(build) = ready.upgrade() else {
            recipe.counters.expired.fetch_add(1, Ordering::Relaxed);
            return;
        };
        match made {
            Ok(prepared) => {
                let old = build.waiting.lock().unwrap_or_else(|e| e.into_inner()).replace(prepared);
                drop(old);
            }
            Err(e) => {
                tracing::debug!(plugin = %recipe.plugin, error = %e, "no ready instance: instantiating ahead of a call failed")
            }
        }
    }
}
