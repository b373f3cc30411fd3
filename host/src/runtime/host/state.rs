//! `state`: the key/value store scoped to the plugin and the task's user
//! ([`crate::plugin_state`]).

use super::super::bindings::latest::state;
use super::journal::{Durability, Interrupted};
use super::{Error, HostState, ImportError};
use crate::capability::Capability;
use crate::journal::Import;
use crate::services::{StateError, StateNamespace, StateStore};

impl HostState {
    /// `state.get` (the WIT error is made of its error by [`super::to_plugin`]).
    async fn state_get(&mut self, key: String) -> Result<Option<Vec<u8>>, Error> {
        self.check(Capability::State)?;
        let key = self.stored_key(&key);
        StateStore::check_key(&key, &self.scope.services.budgets).map_err(|e| Error::InvalidInput(e.to_string()))?;
        let got = self.scope.services.state.get(&self.state_namespace(), &key).await;
        got.map_err(|e| self.state_error("get", e))
    }

    /// `state.set` (the WIT error is made of its error by [`super::to_plugin`]).
    async fn state_set(&mut self, key: String, value: Vec<u8>) -> Result<(), Error> {
        self.check(Capability::State)?;
        let redactor = self.scope.redactor();
        let (key, value) = (redactor.scrub(&key).into_owned(), redactor.scrub_bytes(&value).into_owned());
        let services = &self.scope.services;
        let done = services.state.set(&self.state_namespace(), &key, value, &services.budgets).await;
        done.map_err(|e| self.state_error("set", e))
    }

    /// `state.delete` (the WIT error is made of its error by [`super::to_plugin`]).
    async fn state_delete(&mut self, key: String) -> Result<(), Error> {
        self.check(Capability::State)?;
        let key = self.stored_key(&key);
        StateStore::check_key(&key, &self.scope.services.budgets).map_err(|e| Error::InvalidInput(e.to_string()))?;
        let done = self.scope.services.state.delete(&self.state_namespace(), &key).await;
        done.map_err(|e| self.state_error("delete", e))
    }
}

impl state::Host for HostState {
    async fn get(&mut self, key: String) -> Result<Option<Vec<u8>>, ImportError> {
        let args = serde_json::json!({ "key": &key });
        self.journaled(Import::StateGet, args, Durability::Queued, Interrupted::Rerun, move |s| {
            Box::pin(s.state_get(key))
        })
        .await
    }

    async fn set(&mut self, key: String, value: Vec<u8>) -> Result<(), ImportError> {
        // The value's digest stands for it: a journal does not hold plugin state twice.
        let args = serde_json::json!({ "key": &key, "value": crate::journal::digest(&serde_json::json!(&value)) });
        self.journaled(Import::StateSet, args, Durability::Queued, Interrupted::Rerun, move |s| {
            Box::pin(s.state_set(key, value))
        })
        .await
    }

    async fn delete(&mut self, key: String) -> Result<(), ImportError> {
        let args = serde_json::json!({ "key": &key });
        self.journaled(Import::StateDelete, args, Durability::Queued, Interrupted::Rerun, move |s| {
            Box::pin(s.state_delete(key))
        })
        .await
    }
}

impl HostState {
    /// The state this call reaches: its plugin's, for its task's user (a call outside any
    /// task, such as `resolve`, reaches the plugin's own, which no task reaches).
    fn state_namespace(&self) -> StateNamespace {
        let user = self.scope.task.as_ref().map(|t| t.user_id.as_str()).unwrap_or("");
        StateNamespace::new(&*self.scope.plugin, user)
    }

    /// The key `key` is stored under: scrubbed, as its value is, with the call's redactor
    /// (its task's session's secrets and the host's, never another tenant's: plugin state
    /// is opaque to the engine, and a value scrubbed with every tenant's secrets would be
    /// rewritten by any tenant's `tool_context`).
    fn stored_key(&self, key: &str) -> String {
        self.scope.redactor().scrub(key).into_owned()
    }

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
