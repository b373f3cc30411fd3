//! `cancel`: whether the task this call serves was canceled, polled or awaited with a
//! timeout capped by the call's remaining time. Needs no grant.

use std::time::Duration;

use super::super::bindings::latest::cancel;
use super::HostState;

impl cancel::Host for HostState {
    async fn is_canceled(&mut self) -> bool {
        self.scope.cancel().is_some_and(|c| c.is_canceled())
    }

    async fn wait(&mut self, timeout_ms: u64) -> bool {
        let timeout = Duration::from_millis(timeout_ms).min(self.scope.remaining());
        match self.scope.cancel().cloned() {
            Some(signal) => tokio::time::timeout(timeout, signal.canceled()).await.is_ok(),
            None => {
                tokio::time::sleep(timeout).await;
                false
            }
        }
    }
}
