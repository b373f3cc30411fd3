//! The counters behind `GET /metrics`: tasks by outcome, queue and running gauges, a run
//! time histogram and HTTP request counts. Plain atomics; the server renders them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Counters behind `GET /metrics`.
#[derive(Default)]
pub struct Metrics {
    pub submitted: AtomicU64,
    pub rejected: AtomicU64,
    pub completed: AtomicU64,
    pub failed: AtomicU64,
    pub canceled: AtomicU64,
    pub input_required: AtomicU64,
    pub queued: AtomicU64,
    pub running: AtomicU64,
    /// Task run time histogram: cumulative counts per bucket of [`DURATION_BUCKETS`].
    pub duration_buckets: [AtomicU64; DURATION_BUCKETS.len()],
    pub duration_count: AtomicU64,
    pub duration_sum_ms: AtomicU64,
    pub http_requests: AtomicU64,
    pub http_client_errors: AtomicU64,
    pub http_server_errors: AtomicU64,
}

/// Upper bounds (seconds) of the task duration histogram.
pub const DURATION_BUCKETS: [f64; 10] = [0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0, 1800.0];

impl Metrics {
    pub(super) fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        for (i, b) in DURATION_BUCKETS.iter().enumerate() {
            if s <= *b {
                self.duration_buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.duration_count.fetch_add(1, Ordering::Relaxed);
        self.duration_sum_ms.fetch_add(d.as_millis() as u64, Ordering::Relaxed);
    }
}
