//! Instance allocation: wasmtime's pooling allocator with copy-on-write memory images.
//!
//! Every plugin call still gets a fresh instance in a fresh store (no guest state is
//! ever shared between calls); the pool only keeps the *address space* of instance
//! slots reserved, so instantiating is a few `madvise`/`mmap` of a ready image instead
//! of fresh mappings, and ending a call resets the slot instead of unmapping it.
//!
//! This module owns the pool's shape (how many slots, how large) and the slot permits
//! that make a call wait for a free slot instead of failing when the pool is busy. It
//! must never hand one instance to two calls, and it never weakens the per-store memory
//! budget ([`super::host_state::CallLimiter`] still decides every growth).

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime::{Config as EngineConfig, Enabled, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::host_state::MAX_TABLE_ELEMENTS;

/// Fewest component slots a pool has: room for loads (`meta.info` of every plugin at
/// once), resolver calls of queued tasks and the executor calls of running ones.
pub const MIN_POOL_INSTANCES: u32 = 128;
/// Component slots per concurrently running task: its executor call plus resolver
/// calls and nested calls a subagent may start.
pub const POOL_INSTANCES_PER_TASK: u32 = 4;
/// Core instances one component may create. The bundled Rust plugins use a handful; a
/// componentize-py component about a dozen (the interpreter, libc, the WASI adapter
/// and shims). A component needing more is refused at instantiation with a clear error.
pub const MAX_CORE_INSTANCES_PER_COMPONENT: u32 = 32;
/// Linear memories one component may hold (each core module has at most one: the
/// engine has multi-memory off). All of them share the one per-store memory budget.
pub const MAX_MEMORIES_PER_COMPONENT: u32 = 8;
/// Tables one component may hold (function tables of its modules and adapters).
pub const MAX_TABLES_PER_COMPONENT: u32 = 16;
/// Dirty bytes of a slot's linear memory reset in place (copied back from the image)
/// between calls instead of being returned to the kernel. With Linux's `PAGEMAP_SCAN`
/// (6.7+) only the pages a call wrote are copied, so a small guest's call ends with no
/// `madvise` at all: no page faults on its next call and, above all, no TLB-shootdown
/// interrupts that stall every other thread of the host (measured: a victim plugin's p99
/// rose 8x while another plugin's resets interrupted it). Larger working sets are
/// returned to the kernel beyond this, so an idle slot holds at most this much.
pub const MEMORY_KEEP_RESIDENT: usize = 2 * 1024 * 1024;
/// The same for a slot's tables (function tables are small; 256 KiB is 32k entries).
pub const TABLE_KEEP_RESIDENT: usize = 256 * 1024;

/// The size of the instance pool, derived from the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolOptions {
    /// Component instances alive at once (each a fresh instance of one call).
    pub instances: u32,
    /// Largest single linear memory: the largest memory budget of any plugin (a budget
    /// covers all memories of an instance, so no single memory can be larger).
    pub max_memory: u64,
}

impl PoolOptions {
    /// A pool for `max_concurrent_tasks` running tasks whose plugins have at most
    /// `max_memory` bytes of memory budget each.
    pub fn for_tasks(max_concurrent_tasks: usize, max_memory: u64) -> Self {
        Self::for_chains(max_concurrent_tasks, 1, max_memory)
    }

    /// [`PoolOptions::for_tasks`] when each running task may be a chain of `max_depth`
    /// nested subagents (`subagents.max_depth`): every level's executor call holds its
    /// instance while the level below runs, so a task takes one more slot per level.
    pub fn for_chains(max_concurrent_tasks: usize, max_depth: usize, max_memory: u64) -> Self {
        let extra_levels = u32::try_from(max_depth.saturating_sub(1)).unwrap_or(u32::MAX);
        let per_task = POOL_INSTANCES_PER_TASK.saturating_add(extra_levels);
        let per_tasks = u32::try_from(max_concurrent_tasks).unwrap_or(u32::MAX).saturating_mul(per_task);
        PoolOptions { instances: per_tasks.max(MIN_POOL_INSTANCES), max_memory }
    }

    /// wasmtime's pooling configuration for this pool. Every count that bounds a slot is
    /// set here (none is left to a default that might change between wasmtime versions).
    fn pooling_config(&self) -> PoolingAllocationConfig {
        let n = self.instances;
        let mut p = PoolingAllocationConfig::new();
        p.total_component_instances(n)
            .total_core_instances(n.saturating_mul(MAX_CORE_INSTANCES_PER_COMPONENT))
            .total_memories(n.saturating_mul(MAX_MEMORIES_PER_COMPONENT))
            .total_tables(n.saturating_mul(MAX_TABLES_PER_COMPONENT))
            .total_stacks(n)
            .max_core_instances_per_component(MAX_CORE_INSTANCES_PER_COMPONENT)
            .max_memories_per_component(MAX_MEMORIES_PER_COMPONENT)
            .max_tables_per_component(MAX_TABLES_PER_COMPONENT)
            .max_memories_per_module(1)
            .max_tables_per_module(MAX_TABLES_PER_COMPONENT)
            .table_elements(MAX_TABLE_ELEMENTS)
            .max_memory_size(usize::try_from(self.max_memory).unwrap_or(usize::MAX))
            .linear_memory_keep_resident(MEMORY_KEEP_RESIDENT)
            .table_keep_resident(TABLE_KEEP_RESIDENT)
            // Reset only the pages a call dirtied, where the kernel can say which.
            .pagemap_scan(Enabled::Auto);
        p
    }

    /// Applies the pool to an engine configuration.
    pub(super) fn apply(&self, cfg: &mut EngineConfig) {
        cfg.allocation_strategy(InstanceAllocationStrategy::Pooling(self.pooling_config()));
    }
}

/// Permits for pool slots: a call holds one from before instantiation until its store
/// is dropped, so a busy pool makes calls wait (within their deadline) rather than fail.
#[derive(Clone)]
pub(super) struct Slots(Option<Arc<Semaphore>>);

impl Slots {
    pub(super) fn pooled(instances: u32) -> Self {
        Slots(Some(Arc::new(Semaphore::new(instances as usize))))
    }

    /// A free slot now, if there is one (never waits).
    pub(super) fn try_acquire(&self) -> Option<OwnedSemaphorePermit> {
        self.0.as_ref()?.clone().try_acquire_owned().ok()
    }

    /// On-demand allocation: no pool, nothing to wait for.
    pub(super) fn unbounded() -> Self {
        Slots(None)
    }

    pub(super) async fn acquire(&self) -> Option<OwnedSemaphorePermit> {
        match &self.0 {
            // The semaphore is never closed.
            Some(s) => s.clone().acquire_owned().await.ok(),
            None => None,
        }
    }

    pub(super) fn is_pooled(&self) -> bool {
        self.0.is_some()
    }
}
