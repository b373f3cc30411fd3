//! `cancel`: whether the task this call serves was canceled, polled or awaited with a
//! timeout capped by the call's remaining time. Needs no grant.

use std::time::Duration;

use serde_json::json;

use super::super::bindings::latest::cancel;
use super::journal::{Durability, Interrupted};
use super::{HostState, trap};
use crate::journal::Import;

impl cancel::Host for HostState {
    async fn is_canceled(&mut self) -> wasmtime::Result<bool> {
        let canceled = self.scope.cancel().is_some_and(|c| c.is_canceled());
        self.journaled(Import::CancelIsCanceled, json!({}), Durability::Queued, Interrupted::Rerun, move |_| {
            Box::pin(async move { Ok(canceled) })
        })
        .await
        .map_err(trap)
    }

    async fn wait(&mut self, timeout_ms: u64) -> wasmtime::Result<bool> {
        let args = json!({ "timeout_ms": timeout_ms });
        self.journaled(Import::CancelWait, args, Durability::Queued, Interrupted::Rerun, move |s| {
            Box::pin(async move {
                let timeout = Duration::from_millis(timeout_ms).min(s.scope.remaining());
                Ok(match s.scope.cancel().cloned() {
                    Some(signal) => tokio::time::timeout(timeout, signal.canceled()).await.is_ok(),
                    None => {
                        tokio::time::sleep(timeout).await;
                        false
                    }
                })
            })
        })
        .await
        .map_err(trap)
    }
}
