//! Cancellation of the task a call serves (the `cancel` import, WIT 0.2.0). Poll it in
//! loops, or wait on it with a timeout instead of sleeping; a host wait under way when the
//! task is canceled ends with [`crate::Error::Canceled`]. After a cancellation the call has
//! a short grace period ([`crate::clock::remaining_ms`]) to clean up — cancel remote work,
//! save state — and return. Needs no capability grant.

#[cfg(feature = "bindings")]
pub use imports::{is_canceled, wait};

#[cfg(feature = "bindings")]
mod imports {
    use crate::bindings::warden::plugin::cancel as wit;

    /// Whether the task has been canceled (once true, true for the rest of the call).
    pub fn is_canceled() -> bool {
        wit::is_canceled()
    }

    /// Waits up to `timeout_ms` (capped by the time left) for the task to be canceled;
    /// true when it was.
    pub fn wait(timeout_ms: u64) -> bool {
        wit::wait(timeout_ms)
    }
}
