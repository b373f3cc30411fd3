//! `state`: the key/value store scoped to the plugin ([`crate::plugin_state`]).

use super::super::bindings::latest::state;
use super::{Error, HostState};
use crate::capability::Capability;
use crate::services::{StateError, StateStore};

impl state::Host for HostState {
    async fn get(&mut self, key: String) -> Result<Option<Vec<u8>>, Error> {
        self.check(Capability::State)?;
        StateStore::check_key(&key, &self.scope.services.budgets).map_err(|e| Error::InvalidInput(e.to_string()))?;
        let got = self.scope.services.state.get(&self.scope.plugin, &key).await;
        got.map_err(|e| self.state_error("get", e))
    }

    async fn set(&mut self, key: String, value: Vec<u8>) -> Result<(), Error> {
        self.check(Capability::State)?;
        let services = &self.scope.services;
        let done = services.state.set(&self.scope.plugin, &key, value, &services.budgets).await;
        done.map_err(|e| self.state_error("set", e))
    }

    async fn delete(&mut self, key: String) -> Result<(), Error> {
        self.check(Capability::State)?;
        StateStore::check_key(&key, &self.scope.services.budgets).map_err(|e| Error::InvalidInput(e.to_string()))?;
        let done = self.scope.services.state.delete(&self.scope.plugin, &key).await;
        done.map_err(|e| self.state_error("delete", e))
    }
}

impl HostState {
    /// A state failure as the plugin sees it: a budget is `denied` (naming its key); a
    /// task store failure is `unavailable`, logged here with its cause (the plugin is not
    /// told where the store is or what the database said).
    fn state_error(&self, op: &'static str, e: StateError) -> Error {
        match e {
            StateError::Budget(e) => Error::Denied(e.to_string()),
            StateError::Store(e) => {
                tracing::error!(
                    plugin = %self.scope.plugin,
                    task_id = self.task_id(),
                    session = self.session_id(),
                    op,
                    error = %e,
                    "plugin state: the task store failed"
                );
                Error::Unavailable("plugin state is unavailable: the task store failed (the host log says why)".into())
            }
        }
    }
}
