//! Plugin state: the key/value store behind the `state` capability, scoped per plugin id
//! and bounded by [`Budgets`] (key length, value size, the bytes one plugin holds). The
//! claude plugin keeps its transcripts here (`transcript/<task-id>`), which is what
//! `resume` continues.
//!
//! ## Where values live, and why
//!
//! Under `warden serve` the task store is the source of truth ([`StateStore::attach`]);
//! how it is read depends on whether another process can write it:
//!
//! - **The embedded store** (redb, `store.path`): one process at a time can open the file
//!   (redb locks it), and every state write of that process goes through this
//!   [`StateStore`]. A copy in memory, loaded once at attach, therefore cannot go stale:
//!   reads come from memory (no I/O on a single server) and budgets are counted there.
//! - **A shared store** (PostgreSQL, `store.url`): other replicas write the same rows, so
//!   any copy could be stale (a transcript replica A saved, read by replica B that runs
//!   the resume). Nothing is kept in memory: every read is one indexed row read from the
//!   database (the claude plugin reads once per resumed task), and every write is one
//!   transaction that counts the plugin's bytes in the database, checks the budget and
//!   writes ([`Store::state_put`], under a per-plugin advisory lock, so replicas writing
//!   at once cannot together pass it).
//! - **No store** (`warden run`, `warden plugin test`, tests): memory only, gone with the
//!   process.
//!
//! With a store, a write returns once it is committed: what a plugin stored before a
//! crash (`kill -9`) is there after the restart, on every replica. A failed store read or
//! write is a [`StateError::Store`] value for the plugin — never a panic, never a stale
//! value. Values are scrubbed of every known secret on their way into the store
//! ([`crate::store::state_key`]).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use crate::config::Budgets;
use crate::store::{StatePut, Store, StoreError, Write};

/// Why the state store refused a write: the budget and its config key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{what} of {got} bytes exceeds the limit of {limit} bytes (plugins.budgets.{key})")]
pub struct StateBudgetExceeded {
    pub what: &'static str,
    pub got: u64,
    pub limit: u64,
    pub key: &'static str,
}

/// Why a state operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StateError {
    /// A budget said no; nothing changed.
    #[error(transparent)]
    Budget(#[from] StateBudgetExceeded),
    /// The task store failed: a read has no value to give, a write may not have been kept.
    #[error("plugin state is unavailable: {0}")]
    Store(#[from] StoreError),
}

/// See the module docs.
#[derive(Default)]
pub struct StateStore {
    /// The values (no store, or the embedded one); unused with a shared store.
    memory: Mutex<HashMap<String, PluginState>>,
    backing: OnceLock<Backing>,
}

/// The task store behind a [`StateStore`], by who else may write it.
enum Backing {
    /// Only this process (redb): memory holds a complete copy.
    Exclusive(Store),
    /// Other replicas too (PostgreSQL): the store is read every time.
    Shared(Store),
}

#[derive(Default)]
struct PluginState {
    values: HashMap<String, Vec<u8>>,
    /// Sum of key and value lengths in `values`.
    bytes: u64,
}

impl StateStore {
    /// The value of `key`, if any.
    pub async fn get(&self, plugin: &str, key: &str) -> Result<Option<Vec<u8>>, StateError> {
        match self.backing.get() {
            Some(Backing::Shared(store)) => Ok(store.state_get(plugin, &crate::store::state_key(key)).await?),
            None | Some(Backing::Exclusive(_)) => {
                Ok(self.memory.lock().unwrap().get(plugin).and_then(|m| m.values.get(key).cloned()))
            }
        }
    }

    /// Stores `value` under `key` unless a budget says no; with a store, returns once the
    /// value is committed.
    pub async fn set(&self, plugin: &str, key: &str, value: Vec<u8>, budgets: &Budgets) -> Result<(), StateError> {
        Self::check_key(key, budgets)?;
        if value.len() as u64 > budgets.max_state_value {
            return Err(StateBudgetExceeded {
                what: "state value",
                got: value.len() as u64,
                limit: budgets.max_state_value,
                key: "max_state_value",
            }
            .into());
        }
        let store = match self.backing.get() {
            Some(Backing::Shared(store)) => {
                return match store.state_put(plugin, key, &value, budgets.max_state_bytes_per_plugin).await? {
                    StatePut::Stored { .. } => Ok(()),
                    StatePut::OverLimit { total } => Err(over_plugin_budget(total, budgets).into()),
                };
            }
            Some(Backing::Exclusive(store)) => Some(store),
            None => None,
        };
        {
            let mut all = self.memory.lock().unwrap();
            let m = all.entry(plugin.to_owned()).or_default();
            let old = m.values.get(key).map(|v| (key.len() + v.len()) as u64).unwrap_or(0);
            let after = m.bytes - old + (key.len() + value.len()) as u64;
            if after > budgets.max_state_bytes_per_plugin {
                return Err(over_plugin_budget(after, budgets).into());
            }
            m.bytes = after;
            if let Some(store) = store {
                // Queued under the lock: writes of one key reach the store in this order.
                store.write(Write::StateSet { plugin: plugin.to_owned(), key: key.to_owned(), value: value.clone() });
            }
            m.values.insert(key.to_owned(), value);
        }
        if let Some(store) = store {
            store.flush().await?;
        }
        Ok(())
    }

    /// Removes `key`; with a store, returns once that is committed.
    pub async fn delete(&self, plugin: &str, key: &str) -> Result<(), StateError> {
        let store = match self.backing.get() {
            Some(Backing::Shared(store)) => return Ok(store.state_delete(plugin, key).await?),
            Some(Backing::Exclusive(store)) => Some(store),
            None => None,
        };
        let removed = {
            let mut all = self.memory.lock().unwrap();
            match all.get_mut(plugin).and_then(|m| m.values.remove(key).map(|v| (m, v))) {
                Some((m, v)) => {
                    m.bytes -= (key.len() + v.len()) as u64;
                    if let Some(store) = store {
                        store.write(Write::StateDelete { plugin: plugin.to_owned(), key: key.to_owned() });
                    }
                    true
                }
                None => false,
            }
        };
        if let (true, Some(store)) = (removed, store) {
            store.flush().await?;
        }
        Ok(())
    }

    /// Makes `store` the source of truth (see the module docs): the embedded store's
    /// state is loaded into memory (returns the number of entries), a shared store is read
    /// on demand from now on (returns 0). Once per host.
    pub async fn attach(&self, store: Store) -> Result<usize, StoreError> {
        if store.is_shared() {
            if self.backing.set(Backing::Shared(store)).is_err() {
                tracing::warn!("plugin state is already backed by a task store; the second one is ignored");
            }
            return Ok(0);
        }
        let entries = store.state_all().await?;
        let n = entries.len();
        {
            let mut all = self.memory.lock().unwrap();
            for (plugin, key, value) in entries {
                let m = all.entry(plugin).or_default();
                m.bytes += (key.len() + value.len()) as u64;
                if let Some(old) = m.values.insert(key.clone(), value) {
                    m.bytes -= (key.len() + old.len()) as u64;
                }
            }
        }
        if self.backing.set(Backing::Exclusive(store)).is_err() {
            tracing::warn!("plugin state is already backed by a task store; the second one is ignored");
        }
        Ok(n)
    }

    /// Bytes (keys + values) `plugin` holds.
    pub async fn bytes_held(&self, plugin: &str) -> Result<u64, StateError> {
        match self.backing.get() {
            Some(Backing::Shared(store)) => Ok(store.state_bytes(plugin).await?),
            None | Some(Backing::Exclusive(_)) => {
                Ok(self.memory.lock().unwrap().get(plugin).map(|m| m.bytes).unwrap_or(0))
            }
        }
    }

    /// Refuses a key longer than `plugins.budgets.max_state_key`.
    pub fn check_key(key: &str, budgets: &Budgets) -> Result<(), StateBudgetExceeded> {
        if key.len() > budgets.max_state_key {
            return Err(StateBudgetExceeded {
                what: "state key",
                got: key.len() as u64,
                limit: budgets.max_state_key as u64,
                key: "max_state_key",
            });
        }
        Ok(())
    }
}

/// The plugin would hold `total` bytes, over `plugins.budgets.max_state_bytes_per_plugin`.
fn over_plugin_budget(total: u64, budgets: &Budgets) -> StateBudgetExceeded {
    StateBudgetExceeded {
        what: "this plugin's state",
        got: total,
        limit: budgets.max_state_bytes_per_plugin,
        key: "max_state_bytes_per_plugin",
    }
}
