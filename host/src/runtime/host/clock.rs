//! `clock`: monotonic time, the call's remaining deadline, and a sleep bounded by it and
//! woken by cancellation. Needs no grant: it reveals nothing and reaches nothing outside
//! the call (a plugin could spend its time spinning anyway; sleeping spends none of the host's CPU).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::super::bindings::latest::clock;
use serde_json::json;

use super::journal::{Durability, Interrupted};
use super::{Error, HostState, ImportError, interruptible, trap};
use crate::journal::Import;

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
    async fn now_ms(&mut self) -> wasmtime::Result<u64> {
        let journal = self.journal();
        let clock = journal.clone();
        let now = self
            .journaled(Import::ClockNowMs, json!({}), Durability::Queued, Interrupted::Rerun, move |_| {
                Box::pin(async move {
                    let raw = millis(origin().elapsed());
                    // A task taken over reads a clock with another origin: live readings
                    // continue from the last one it saw, so they never go backwards.
                    Ok(clock.as_ref().map_or(raw, |j| j.monotonic(raw)))
                })
            })
            .await
            .map_err(trap)?;
        if let Some(j) = journal {
            j.saw_clock(now);
        }
        Ok(now)
    }

    async fn remaining_ms(&mut self) -> wasmtime::Result<u64> {
        let left = millis(self.scope.remaining());
        self.journaled(Import::ClockRemainingMs, json!({}), Durability::Queued, Interrupted::Rerun, move |_| {
            Box::pin(async move { Ok(left) })
        })
        .await
        .map_err(trap)
    }

    async fn sleep(&mut self, ms: u64) -> Result<(), ImportError> {
        self.journaled(Import::ClockSleep, json!({ "ms": ms }), Durability::Queued, Interrupted::Rerun, move |s| {
            Box::pin(s.clock_sleep(ms))
        })
        .await
    }
}
