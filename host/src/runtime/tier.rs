//! Tiered compilation: a large component first runs from a quick baseline build
//! (wasmtime's Winch, a single-pass compiler) and is swapped to the optimised Cranelift
//! build when that finishes in the background.
//!
//! This module owns which build a plugin's calls use and the background upgrade. A call
//! takes the build current when it starts and keeps it to its end; the swap never
//! changes what a plugin is (same bytes, same content hash, same info and grants), only
//! how fast it runs. It must never share an instance between calls or builds (each build
//! has its own ready instance, [`super::ready`]).

use std::sync::{Arc, RwLock};

use serde::Serialize;
use wasmtime::component::InstancePre;

use super::host_state::HostState;
use super::ready::{Ready, Recipe};

/// Smallest component compiled in two tiers. Smaller ones (every bundled Rust plugin is
/// well under 1 MiB) compile optimised in well under a second; the two-tier path is for
/// the interpreters (an 18 MB componentize-py component takes 5–14 s optimised).
pub const TIER_UP_MIN_SIZE: usize = 4 * 1024 * 1024;

/// How a plugin's current code was compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// Winch: compiled quickly, runs slower; the optimised build is on its way.
    Baseline,
    /// Cranelift: the final build.
    Optimized,
}

struct Build {
    /// The build's instance template and its ready instance.
    ready: Arc<Ready>,
    tier: Tier,
}

/// The build a plugin's calls use now, swappable once from baseline to optimised.
#[derive(Clone)]
pub struct CurrentBuild(Arc<RwLock<Build>>);

impl CurrentBuild {
    pub(super) fn new(pre: InstancePre<HostState>, tier: Tier, recipe: Arc<Recipe>) -> Self {
        CurrentBuild(Arc::new(RwLock::new(Build { ready: Arc::new(Ready::new(pre, recipe)), tier })))
    }

    /// The instance template for a call starting now (cheap: reference-counted).
    pub(super) fn pre(&self) -> InstancePre<HostState> {
        self.ready().pre().clone()
    }

    /// The current build's instance template and ready instance, for a call starting now.
    pub(super) fn ready(&self) -> Arc<Ready> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).ready.clone()
    }

    pub fn tier(&self) -> Tier {
        self.0.read().unwrap_or_else(|e| e.into_inner()).tier
    }

    /// Installs the optimised build; calls starting from now on use it. The baseline
    /// build's ready instance goes with it.
    pub(super) fn upgrade(&self, pre: InstancePre<HostState>) {
        let mut build = self.0.write().unwrap_or_else(|e| e.into_inner());
        let ready = Arc::new(Ready::new(pre, build.ready.recipe()));
        let old = std::mem::replace(&mut *build, Build { ready, tier: Tier::Optimized });
        drop(build);
        drop(old);
    }

    /// A handle that does not keep the plugin alive: an upgrade finishing after the
    /// plugin was replaced or removed has nothing to install.
    pub(super) fn downgrade(&self) -> WeakBuild {
        WeakBuild(Arc::downgrade(&self.0))
    }
}

/// A [`CurrentBuild`] that may be gone.
pub(super) struct WeakBuild(std::sync::Weak<RwLock<Build>>);

impl WeakBuild {
    pub(super) fn upgrade(&self) -> Option<CurrentBuild> {
        self.0.upgrade().map(CurrentBuild)
    }
}

/// The background optimised compile of a plugin; dropping it (with the plugin) stops
/// the compile and kills its compiler process.
pub(super) struct Upgrade(pub(super) tokio::task::AbortHandle);

impl Drop for Upgrade {
    fn drop(&mut self) {
        self.0.abort();
    }
}
