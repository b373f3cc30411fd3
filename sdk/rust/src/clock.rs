//! Time as the call sees it (the `clock` import, WIT 0.2.0): a monotonic clock to pace
//! polling, the call's remaining deadline, and a sleep the host bounds by that deadline
//! and ends early when the task is canceled. Needs no capability grant.

#[cfg(feature = "bindings")]
pub use imports::{now_ms, remaining_ms, sleep};

#[cfg(feature = "bindings")]
mod imports {
    use crate::bindings::warden::plugin::clock as wit;
    use crate::error::Result;

    /// Monotonic milliseconds (arbitrary origin, never backwards): for pacing and
    /// measuring, not for the date.
    pub fn now_ms() -> u64 {
        wit::now_ms()
    }

    /// Milliseconds left before the host interrupts this call (after a cancellation: the
    /// grace period left, if that is sooner).
    pub fn remaining_ms() -> u64 {
        wit::remaining_ms()
    }

    /// Sleeps `ms` milliseconds. `Err(Timeout)` at once when the sleep would not end before
    /// the deadline (nothing slept); `Err(Canceled)` when the task is canceled meanwhile.
    pub fn sleep(ms: u64) -> Result<()> {
        wit::sleep(ms)
    }
}
