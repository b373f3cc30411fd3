//! `clock`: monotonic time, the call's remaining deadline, and a sleep bounded by it and
//! woken by cancellation. Needs no grant: it reveals nothing and reaches nothing outside
//! the call (a plugin could spend its time spinning anyway; sleeping spends none of the host's CPU).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::super::bindings::latest::clock;
use super::{Error, HostState, ImportError, interruptible};

/// The origin of `clock.now-ms`: fixed at the first reading for the host's lifetime, so
/// readings from different calls compare.
fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl HostState {
    /// `clock.sleep` (the WIT error is made of its error by [`super::to_plugin`]).
    async fn clock_sleep(&mut self, ms: u64) -> Result<(), Error> {
        let left = self.scope.remaining();
        let asked = Duration::from_millis(ms);
        if asked >= left {
            return Err(Error::Timeout(format!(
                "a sleep of {ms} ms would not end before the call's deadline ({} ms left)",
                millis(left)
            )));
        }
        let cancel = self.cancel_watch();
        interruptible(cancel, "it slept", async {
            tokio::time::sleep(asked).await;
            Ok(())
        })
        .await
    }
}

impl clock::Host for HostState {
    async fn now_ms(&mut self) -> u64 {
        millis(origin().elapsed())
    }

    async fn remaining_ms(&mut self) -> u64 {
        millis(self.scope.remaining())
    }

    async fn sleep(&mut self, ms: u64) -> Result<(), ImportError> {
        Ok(self.clock_sleep(ms).await?)
    }
}
