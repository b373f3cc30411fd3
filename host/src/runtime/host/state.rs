//! `state`: the key/value store scoped to the plugin.

use super::super::bindings::latest::state;
use super::{Error, HostState};
use crate::capability::Capability;
use crate::services::StateStore;

impl state::Host for HostState {
    async fn get(&mut self, key: String) -> Result<Option<Vec<u8>>, Error> {
        self.check(Capability::State)?;
        StateStore::check_key(&key, &self.scope.services.budgets).map_err(|e| Error::InvalidInput(e.to_string()))?;
        Ok(self.scope.services.state.get(&self.scope.plugin, &key))
    }

    async fn set(&mut self, key: String, value: Vec<u8>) -> Result<(), Error> {
        self.check(Capability::State)?;
        let budgets = &self.scope.services.budgets;
        self.scope
            .services
            .state
            .set(&self.scope.plugin, &key, value, budgets)
            .map_err(|e| Error::Denied(e.to_string()))
    }

    async fn delete(&mut self, key: String) -> Result<(), Error> {
        self.check(Capability::State)?;
        StateStore::check_key(&key, &self.scope.services.budgets).map_err(|e| Error::InvalidInput(e.to_string()))?;
        self.scope.services.state.delete(&self.scope.plugin, &key);
        Ok(())
    }
}
