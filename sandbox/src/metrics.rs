//! Counters the host exports (Prometheus text at `/metrics`) and the CLI prints.
//!
//! Only counts and durations live here: never session contents, commands or environment.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

/// Live counters, updated lock-free.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub sessions_active: AtomicU64,
    pub sessions_created: AtomicU64,
    pub sessions_removed: AtomicU64,
    pub sessions_paused: AtomicU64,
    pub pauses: AtomicU64,
    pub resumes: AtomicU64,
    pub containers_recreated: AtomicU64,
    pub execs: AtomicU64,
    pub exec_timeouts: AtomicU64,
    pub exec_latency_micros: AtomicU64,
    pub tool_calls: AtomicU64,
    pub tool_errors: AtomicU64,
    pub commands_started: AtomicU64,
    pub warm_hits: AtomicU64,
    pub warm_waits: AtomicU64,
    pub warm_misses: AtomicU64,
    pub warm_created: AtomicU64,
    pub warm_failures: AtomicU64,
    pub warm_grown: AtomicU64,
    pub warm_trimmed: AtomicU64,
}

impl Metrics {
    /// Records one finished exec round trip.
    pub(crate) fn exec_done(&self, took: Duration, timed_out: bool) {
        self.execs.fetch_add(1, Ordering::Relaxed);
        self.exec_latency_micros.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        if timed_out {
            self.exec_timeouts.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A consistent-enough copy for reporting.
    pub(crate) fn snapshot(&self) -> MetricsSnapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MetricsSnapshot {
            sessions_active: get(&self.sessions_active),
            sessions_created_total: get(&self.sessions_created),
            sessions_removed_total: get(&self.sessions_removed),
            sessions_paused: get(&self.sessions_paused),
            pauses_total: get(&self.pauses),
            resumes_total: get(&self.resumes),
            containers_recreated_total: get(&self.containers_recreated),
            execs_total: get(&self.execs),
            exec_timeouts_total: get(&self.exec_timeouts),
            exec_latency_seconds_sum: get(&self.exec_latency_micros) as f64 / 1e6,
            exec_latency_count: get(&self.execs),
            tool_calls_total: get(&self.tool_calls),
            tool_errors_total: get(&self.tool_errors),
            commands_started_total: get(&self.commands_started),
            // Filled in by `Sandbox::metrics` from the pool itself.
            warm_pool_ready: 0,
            warm_pool_hits_total: get(&self.warm_hits),
            warm_pool_waits_total: get(&self.warm_waits),
            warm_pool_misses_total: get(&self.warm_misses),
            warm_pool_created_total: get(&self.warm_created),
            warm_pool_failures_total: get(&self.warm_failures),
            // Filled in by `Sandbox::metrics` from the pool itself.
            warm_pool_target: 0,
            warm_pool_grown_total: get(&self.warm_grown),
            warm_pool_trimmed_total: get(&self.warm_trimmed),
            // Filled in by `Sandbox::metrics` from the disk attachers.
            disk_helpers_total: 0,
            disks_attached_total: 0,
        }
    }
}

/// A point-in-time copy of the sandbox counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MetricsSnapshot {
    /// Sessions with a live container in this host.
    pub sessions_active: u64,
    /// Sessions that got a container, created or from the warm pool (including recreations).
    pub sessions_created_total: u64,
    /// Sessions removed (idle, ended, shut down).
    pub sessions_removed_total: u64,
    /// Sessions paused now (container stopped, workspace kept; `sandbox.pause_after`).
    pub sessions_paused: u64,
    /// Pauses done (by `pause_after` or asked for).
    pub pauses_total: u64,
    /// Paused sessions started again by a call or a resume.
    pub resumes_total: u64,
    /// Containers recreated after they vanished mid-session.
    pub containers_recreated_total: u64,
    /// Execs run (tools and Bash).
    pub execs_total: u64,
    /// Execs ended by their hard timeout.
    pub exec_timeouts_total: u64,
    /// Sum of exec round-trip latencies, seconds.
    pub exec_latency_seconds_sum: f64,
    /// Number of latencies in the sum.
    pub exec_latency_count: u64,
    /// Tool calls handled.
    pub tool_calls_total: u64,
    /// Tool calls that ended in an error (result or `SandboxError`).
    pub tool_errors_total: u64,
    /// Processes the in-container agents started directly (one per Bash/Glob/Grep call
    /// that ran; file operations start none).
    pub commands_started_total: u64,
    /// Warm pool containers ready to be handed out now.
    pub warm_pool_ready: u64,
    /// New sessions handed a ready pool container.
    pub warm_pool_hits_total: u64,
    /// New sessions that waited for a pool container being prepared (none was ready, one
    /// was on its way).
    pub warm_pool_waits_total: u64,
    /// New sessions whose container was created cold (pool on, nothing ready or coming).
    pub warm_pool_misses_total: u64,
    /// Pool containers prepared.
    pub warm_pool_created_total: u64,
    /// Pool containers that failed to be prepared or handed out, or stopped while idle (each
    /// is removed).
    pub warm_pool_failures_total: u64,
    /// Containers the warm pool aims to hold now (every Docker host's pool): `warm_pool`,
    /// or more after new sessions found it empty (up to `warm_pool_max`).
    pub warm_pool_target: u64,
    /// New sessions that found the pool empty and raised its target by one.
    pub warm_pool_grown_total: u64,
    /// Idle pool containers removed because the target decayed below what the pool held.
    pub warm_pool_trimmed_total: u64,
    /// Disk helpers run to attach workspace disks (`sandbox.disk`); cold starts at once
    /// share one, so this grows slower than `disks_attached_total` under a burst.
    pub disk_helpers_total: u64,
    /// Workspace disks those helpers attached (or found attached). A fork's or a session's
    /// from a snapshot is attached by its copy's helper and counted in neither.
    pub disks_attached_total: u64,
}

impl MetricsSnapshot {
    /// Prometheus text exposition of these counters (prefix `warden_sandbox_`).
    pub fn to_prometheus(&self) -> String {
        let mut out = String::new();
        let mut put = |name: &str, kind: &str, help: &str, value: String| {
            out.push_str(&format!(
                "# HELP warden_sandbox_{name} {help}\n# TYPE warden_sandbox_{name} {kind}\nwarden_sandbox_{name} {value}\n"
            ));
        };
        put("sessions_active", "gauge", "Sessions with a live container.", self.sessions_active.to_string());
        put(
            "sessions_created_total",
            "counter",
            "Sessions that got a container (created or from the warm pool).",
            self.sessions_created_total.to_string(),
        );
        put("sessions_removed_total", "counter", "Sessions removed.", self.sessions_removed_total.to_string());
        put(
            "sessions_paused",
            "gauge",
            "Paused sessions (workspace kept, no container running).",
            self.sessions_paused.to_string(),
        );
        put("pauses_total", "counter", "Sessions paused.", self.pauses_total.to_string());
        put("resumes_total", "counter", "Paused sessions started again.", self.resumes_total.to_string());
        put(
            "containers_recreated_total",
            "counter",
            "Containers recreated after vanishing.",
            self.containers_recreated_total.to_string(),
        );
        put(
            "commands_started_total",
            "counter",
            "Processes the in-container agents started (one per command that ran).",
            self.commands_started_total.to_string(),
        );
        put(
            "warm_pool_ready",
            "gauge",
            "Warm pool containers ready for new sessions.",
            self.warm_pool_ready.to_string(),
        );
        put(
            "warm_pool_hits_total",
            "counter",
            "New sessions handed a ready pool container.",
            self.warm_pool_hits_total.to_string(),
        );
        put(
            "warm_pool_waits_total",
            "counter",
            "New sessions that waited for a pool container being prepared.",
            self.warm_pool_waits_total.to_string(),
        );
        put(
            "warm_pool_misses_total",
            "counter",
            "New sessions created cold with the pool on.",
            self.warm_pool_misses_total.to_string(),
        );
        put(
            "warm_pool_created_total",
            "counter",
            "Pool containers prepared.",
            self.warm_pool_created_total.to_string(),
        );
        put(
            "warm_pool_failures_total",
            "counter",
            "Pool containers that failed to be prepared or handed out, or stopped while idle.",
            self.warm_pool_failures_total.to_string(),
        );
        put(
            "warm_pool_target",
            "gauge",
            "Containers the warm pool aims to hold now (warm_pool, grown by demand up to warm_pool_max).",
            self.warm_pool_target.to_string(),
        );
        put(
            "warm_pool_grown_total",
            "counter",
            "New sessions that found the warm pool empty and raised its target.",
            self.warm_pool_grown_total.to_string(),
        );
        put(
            "warm_pool_trimmed_total",
            "counter",
            "Idle pool containers removed because the pool's target decayed.",
            self.warm_pool_trimmed_total.to_string(),
        );
        put(
            "disk_helpers_total",
            "counter",
            "Disk helpers run to attach workspace disks (shared by cold starts at once).",
            self.disk_helpers_total.to_string(),
        );
        put(
            "disks_attached_total",
            "counter",
            "Workspace disks attached by disk helpers.",
            self.disks_attached_total.to_string(),
        );
        put("execs_total", "counter", "Execs run.", self.execs_total.to_string());
        put("exec_timeouts_total", "counter", "Execs killed by their timeout.", self.exec_timeouts_total.to_string());
        put(
            "exec_latency_seconds_sum",
            "counter",
            "Sum of exec latencies.",
            format!("{:.6}", self.exec_latency_seconds_sum),
        );
        put("exec_latency_seconds_count", "counter", "Number of exec latencies.", self.exec_latency_count.to_string());
        put("tool_calls_total", "counter", "Tool calls handled.", self.tool_calls_total.to_string());
        put("tool_errors_total", "counter", "Tool calls that failed.", self.tool_errors_total.to_string());
        out
    }
}
