//! Pacing of linear-memory growth, per plugin (`plugins.budgets.memory_growth_per_second`).
//!
//! Every call runs in a fresh instance from the pool. When a call grows its memory, the
//! pool takes the growth back before the slot's next instance: page-protection changes
//! and a return of pages to the kernel, each a TLB shootdown that interrupts every core
//! running the host — and so every other plugin's call (BENCHMARKS.md, "Isolation": a
//! plugin growing memory on every call made another plugin's p99 7× slower). Within one
//! call's memory budget that cost is not a matter of bytes but of how often it happens,
//! so this module bounds the rate: growth is charged to its plugin's token bucket (a call
//! that grows at all is charged [`GROWN_CALL_CHARGE`] on top), and a growth past the
//! budget waits — the plugin's call is slowed, and nothing else is; a growth that could not
//! happen before its call's deadline fails that call at once instead of sleeping into it.
//!
//! This module owns the bucket arithmetic. It must never block a thread (the limiter
//! awaits the wait it returns) and never charge one plugin's growth to another.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a call that grows memory at all is charged on top of the bytes: the resets its
/// growth causes cost about the same whether it grew by one page or by many, so a plugin
/// cannot grow a page per call more often than one growing a MiB per call.
pub const GROWN_CALL_CHARGE: u64 = 2 * 1024 * 1024;

/// How much growth an idle plugin may do at once, in seconds of its rate: a call that
/// grows to a large memory limit once is not slowed, a plugin doing it back to back is.
pub const BURST_SECONDS: f64 = 0.25;

/// The least burst, whatever the rate: an idle plugin's call that grows a few MiB never waits.
pub const MIN_BURST: u64 = 4 * GROWN_CALL_CHARGE;

/// One plugin's token bucket of memory growth, shared by all its calls.
#[derive(Debug)]
pub struct GrowthPacer {
    /// Bytes of growth per second.
    rate: f64,
    /// Most bytes the bucket holds.
    burst: f64,
    bucket: Mutex<Bucket>,
    /// Calls that grew memory, and growths that had to wait (for tests and `/metrics`).
    grown_calls: AtomicU64,
    paced: AtomicU64,
}

/// What a plugin's calls have grown so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GrowthCounts {
    /// Calls that grew a memory at all.
    pub grown_calls: u64,
    /// Growths that waited for the budget.
    pub paced: u64,
}

#[derive(Debug)]
struct Bucket {
    /// Bytes that may grow now without waiting; negative while growth waits its turn.
    tokens: f64,
    at: Instant,
}

impl GrowthPacer {
    /// A pacer of `bytes_per_second` (`None` for 0: growth is not paced).
    pub fn new(bytes_per_second: u64) -> Option<Self> {
        if bytes_per_second == 0 {
            return None;
        }
        let rate = bytes_per_second as f64;
        let burst = (rate * BURST_SECONDS).max(MIN_BURST as f64);
        let bucket = Mutex::new(Bucket { tokens: burst, at: Instant::now() });
        Some(GrowthPacer { rate, burst, bucket, grown_calls: AtomicU64::new(0), paced: AtomicU64::new(0) })
    }

    /// Charges a call's growth of `bytes` ([`GROWN_CALL_CHARGE`] more for the call's first)
    /// and returns the charge, whose [`Charge::wait`] the growth must wait first. When that
    /// wait would end after `deadline`, nothing is charged and the wait is the error: the
    /// call cannot grow in time, and sleeping into its timeout would only hold its slot.
    pub fn charge_growth(
        self: &Arc<Self>,
        bytes: u64,
        first_in_call: bool,
        deadline: Instant,
    ) -> Result<Charge, Duration> {
        let bytes = bytes.saturating_add(if first_in_call { GROWN_CALL_CHARGE } else { 0 });
        let now = Instant::now();
        let wait = self.charge_at(bytes, now, deadline.saturating_duration_since(now))?;
        if first_in_call {
            self.grown_calls.fetch_add(1, Ordering::Relaxed);
        }
        if !wait.is_zero() {
            self.paced.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Charge { pacer: self.clone(), bytes, wait, kept: false })
    }

    /// Gives `bytes` back (a growth that never happened).
    fn refund(&self, bytes: u64) {
        let mut b = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        b.tokens = (b.tokens + bytes as f64).min(self.burst);
    }

    pub fn counts(&self) -> GrowthCounts {
        GrowthCounts {
            grown_calls: self.grown_calls.load(Ordering::Relaxed),
            paced: self.paced.load(Ordering::Relaxed),
        }
    }

    /// Charges `bytes` at `now` and returns how long the growth must wait first; the charge
    /// is taken at once, so concurrent calls of the plugin queue behind each other. A wait
    /// longer than `limit` is refused (the error) and nothing is charged.
    fn charge_at(&self, bytes: u64, now: Instant, limit: Duration) -> Result<Duration, Duration> {
        let mut b = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        // Never backwards (a caller's `now` read before another took the lock).
        let now = now.max(b.at);
        let refill = now.saturating_duration_since(b.at).as_secs_f64() * self.rate;
        let tokens = (b.tokens + refill).min(self.burst);
        let after = tokens - bytes as f64;
        let wait = match after >= 0.0 {
            true => Duration::ZERO,
            false => Duration::try_from_secs_f64(-after / self.rate).unwrap_or(Duration::MAX),
        };
        b.at = now;
        if wait > limit {
            b.tokens = tokens;
            return Err(wait);
        }
        b.tokens = after;
        Ok(wait)
    }
}

/// A growth charged to its plugin's budget: given back when dropped before [`Charge::keep`]
/// (the call ended while the growth waited).
#[derive(Debug)]
pub struct Charge {
    pacer: Arc<GrowthPacer>,
    bytes: u64,
    wait: Duration,
    kept: bool,
}

impl Charge {
    /// How long the growth waits before it happens.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// The growth happened: the charge stays.
    pub fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if !self.kept {
            self.pacer.refund(self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn zero_turns_pacing_off() {
        assert!(GrowthPacer::new(0).is_none());
    }

    proptest! {
        /// Whatever the sequence of charges, the growth let through by time `t` never
        /// exceeds the burst plus `rate × t`: the waits returned keep every plugin to its
        /// budget (here, time advances only by the waits: a plugin growing back to back).
        #[test]
        fn growth_never_outruns_the_budget(charges in proptest::collection::vec(1u64..(8 << 20), 1..200)) {
            let rate = 64u64 << 20;
            let pacer = GrowthPacer::new(rate).unwrap();
            let start = pacer.bucket.lock().unwrap().at;
            let mut waited = Duration::ZERO;
            let mut total = 0u64;
            for bytes in charges {
                // The caller sleeps out each wait before its next growth.
                waited += pacer.charge_at(bytes, start + waited, Duration::MAX).unwrap();
                total += bytes;
                let allowed = pacer.burst + rate as f64 * waited.as_secs_f64();
                prop_assert!(total as f64 <= allowed + 1.0, "{total} bytes through in {waited:?}");
                // ...and never slows it more than its bytes at the rate.
                prop_assert!(waited.as_secs_f64() <= total as f64 / rate as f64 + 1e-6, "{total} bytes waited {waited:?}");
            }
        }
    }

    #[test]
    fn an_idle_plugin_grows_its_burst_without_waiting_and_then_waits() {
        let pacer = Arc::new(GrowthPacer::new(1 << 30).unwrap());
        let far = Instant::now() + Duration::from_secs(60);
        let first = pacer.charge_growth(200 << 20, true, far).unwrap();
        assert_eq!(first.wait(), Duration::ZERO);
        first.keep();
        let second = pacer.charge_growth(200 << 20, false, far).unwrap();
        assert!(second.wait() > Duration::from_millis(100), "{:?}", second.wait());
        assert_eq!(pacer.counts(), GrowthCounts { grown_calls: 1, paced: 1 });
    }

    /// A growth that cannot happen before its call's deadline is refused without a charge,
    /// and a charge dropped before it was kept (the call ended while waiting) is given
    /// back: neither leaves debt that would slow the plugin's next calls.
    #[test]
    fn growth_past_the_deadline_and_abandoned_growth_cost_nothing() {
        let pacer = Arc::new(GrowthPacer::new(8 << 20).unwrap());
        let soon = Instant::now() + Duration::from_millis(100);
        // The burst (8 MiB) goes, then 8 MiB more would wait ~1 s: past the deadline.
        pacer.charge_growth(8 << 20, false, soon).unwrap().keep();
        let refused = pacer.charge_growth(8 << 20, false, soon).unwrap_err();
        assert!(refused > Duration::from_millis(900), "{refused:?}");
        // Abandoned: charged, then dropped.
        let far = Instant::now() + Duration::from_secs(60);
        drop(pacer.charge_growth(4 << 20, false, far).unwrap());
        // The bucket holds what it held after the burst (plus a little refill): 1 MiB now
        // waits about 1/8 s, not the ~5/8 s it would with the abandoned or refused debt.
        let next = pacer.charge_growth(1 << 20, false, far).unwrap();
        assert!(next.wait() <= Duration::from_millis(130), "{:?}", next.wait());
    }
}
