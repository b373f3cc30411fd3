//! Plugin state: the key/value store behind the `state` capability, scoped per plugin
//! **per user** ([`StateNamespace`]: a task reaches only what tasks of its own user stored
//! through the same plugin) and bounded by [`Budgets`] (key length, value size, the bytes
//! one plugin holds for one user). The claude plugin keeps its transcripts here
//! (`transcript/<task-id>`), which is what `resume` continues; `resume` runs as the user of
//! the task it continues, so it finds them.
//!
//! Entries expire: one not written for `store.retention` is removed by the retention
//! sweep that purges old tasks ([`StateStore::expire`]), so what a tenant stored once does
//! not stay for ever.
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
//!   transaction that counts the namespace's bytes in the database, checks the budget and
//!   writes ([`Store::state_put`], under a per-namespace advisory lock, so replicas writing
//!   at once cannot together pass it).
//! - **No store** (`warden run`, `warden plugin test`, tests): memory only, gone with the
//!   process.
//!
//! With a store, a write returns once it is committed: what a plugin stored before a
//! crash (`kill -9`) is there after the restart, on every replica, with the time it was
//! written (expiry counts from it). A failed store read or write is a
//! [`StateError::Store`] value for the plugin — never a panic, never a stale value. Keys
//! and values arrive scrubbed of the calling task's session secrets and the host's (the
//! `state` import does it: only it knows whose they are).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::config::Budgets;
use crate::store::{StatePut, Store, StoreError, Write, now_ms};

/// Whose state a `state` call reaches: one plugin's, for one user (a tenant of the API).
/// The one place the store key of a namespace is made ([`StateNamespace::store_key`]);
/// every read, write, budget count and expiry goes through it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StateNamespace {
    plugin: String,
    /// The task's `user_id`; empty for a call outside any task (`resolve`), which no
    /// tenant's task reaches (a task's user id is never empty).
    user: String,
}

impl StateNamespace {
    pub fn new(plugin: impl Into<String>, user: impl Into<String>) -> Self {
        StateNamespace { plugin: plugin.into(), user: user.into() }
    }

    /// The key the store keeps this namespace's entries under (its `plugin_state` column):
    /// `<plugin>/<user>`, each part with `%`, `/` and NUL percent-escaped, so two
    /// namespaces never share a key, whatever their characters, and the key holds no NUL
    /// (PostgreSQL `text` cannot). Entries stored before namespaces (under the bare plugin
    /// id, no `/`) match no namespace; they expire with the first retention sweep.
    pub fn store_key(&self) -> String {
        fn escape(part: &str, out: &mut String) {
            for c in part.chars() {
                match c {
                    '%' => out.push_str("%25"),
                    '/' => out.push_str("%2F"),
                    '\0' => out.push_str("%00"),
                    c => out.push(c),
                }
            }
        }
        let mut key = String::with_capacity(self.plugin.len() + self.user.len() + 1);
        escape(&self.plugin, &mut key);
        key.push('/');
        escape(&self.user, &mut key);
        key
    }
}

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
    /// The values by [`StateNamespace::store_key`] (no store, or the embedded one); unused
    /// with a shared store.
    memory: Mutex<HashMap<String, NamespaceState>>,
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
struct NamespaceState {
    values: HashMap<String, Entry>,
    /// Sum of key and value lengths in `values`.
    bytes: u64,
}

struct Entry {
    value: Vec<u8>,
    /// When it was last written (ms since the Unix epoch): what expiry counts from. The
    /// store keeps the same time ([`Write::StateSet`]), so both expire it at once.
    written_at_ms: u64,
}

impl StateStore {
    /// The value of `key` in `ns`, if any.
    pub async fn get(&self, ns: &StateNamespace, key: &str) -> Result<Option<Vec<u8>>, StateError> {
        let namespace = ns.store_key();
        match self.backing.get() {
            Some(Backing::Shared(store)) => Ok(store.state_get(&namespace, key).await?),
            None | Some(Backing::Exclusive(_)) => {
                Ok(self.memory.lock().unwrap().get(&namespace).and_then(|m| m.values.get(key).map(|e| e.value.clone())))
            }
        }
    }

    /// Stores `value` under `key` in `ns` unless a budget says no; with a store, returns
    /// once the value is committed.
    pub async fn set(
        &self,
        ns: &StateNamespace,
        key: &str,
        value: Vec<u8>,
        budgets: &Budgets,
    ) -> Result<(), StateError> {
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
        let namespace = ns.store_key();
        let now = now_ms();
        let store = match self.backing.get() {
            Some(Backing::Shared(store)) => {
                let limit = budgets.max_state_bytes_per_plugin;
                return match store.state_put(&namespace, key, &value, now, limit).await? {
                    StatePut::Stored { .. } => Ok(()),
                    StatePut::OverLimit { total } => Err(over_namespace_budget(total, budgets).into()),
                };
            }
            Some(Backing::Exclusive(store)) => Some(store),
            None => None,
        };
        {
            let mut all = self.memory.lock().unwrap();
            let m = all.entry(namespace.clone()).or_default();
            let old = m.values.get(key).map(|e| (key.len() + e.value.len()) as u64).unwrap_or(0);
            let after = m.bytes - old + (key.len() + value.len()) as u64;
            if after > budgets.max_state_bytes_per_plugin {
                return Err(over_namespace_budget(after, budgets).into());
            }
            m.bytes = after;
            if let Some(store) = store {
                // Queued under the lock: writes of one key reach the store in this order.
                store.write(Write::StateSet {
                    namespace,
                    key: key.to_owned(),
                    value: value.clone(),
                    written_at_ms: now,
                });
            }
            m.values.insert(key.to_owned(), Entry { value, written_at_ms: now });
        }
        if let Some(store) = store {
            store.flush().await?;
        }
        Ok(())
    }

    /// Removes `key` from `ns`; with a store, returns once that is committed.
    pub async fn delete(&self, ns: &StateNamespace, key: &str) -> Result<(), StateError> {
        let namespace = ns.store_key();
        let store = match self.backing.get() {
            Some(Backing::Shared(store)) => return Ok(store.state_delete(&namespace, key).await?),
            Some(Backing::Exclusive(store)) => Some(store),
            None => None,
        };
        let removed = {
            let mut all = self.memory.lock().unwrap();
            match all.get_mut(&namespace).and_then(|m| m.values.remove(key).map(|e| (m, e))) {
                Some((m, e)) => {
                    m.bytes -= (key.len() + e.value.len()) as u64;
                    if let Some(store) = store {
                        store.write(Write::StateDelete { namespace, key: key.to_owned() });
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

    /// Removes every entry not written within `retention` (the retention sweep, with the
    /// finished tasks it purges); with a store, from the store too. Returns how many
    /// entries left memory (with a shared store, how many rows the database removed).
    pub async fn expire(&self, retention: Duration) -> Result<usize, StateError> {
        let cutoff = now_ms().saturating_sub(u64::try_from(retention.as_millis()).unwrap_or(u64::MAX));
        let store = match self.backing.get() {
            Some(Backing::Shared(store)) => return Ok(store.state_expire(cutoff).await?),
            Some(Backing::Exclusive(store)) => Some(store),
            None => None,
        };
        let mut removed = 0;
        self.memory.lock().unwrap().retain(|_, m| {
            let NamespaceState { values, bytes } = m;
            values.retain(|key, e| {
                let keep = e.written_at_ms >= cutoff;
                if !keep {
                    *bytes -= (key.len() + e.value.len()) as u64;
                    removed += 1;
                }
                keep
            });
            !values.is_empty()
        });
        if let Some(store) = store {
            // The store applies the same rule to the same times; what is queued (written
            // before this sweep began) is committed first, so it goes there as it went here.
            store.flush().await?;
            store.state_expire(cutoff).await?;
        }
        Ok(removed)
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
            for e in entries {
                let m = all.entry(e.namespace).or_default();
                m.bytes += (e.key.len() + e.value.len()) as u64;
                let entry = Entry { value: e.value, written_at_ms: e.written_at_ms };
                if let Some(old) = m.values.insert(e.key.clone(), entry) {
                    m.bytes -= (e.key.len() + old.value.len()) as u64;
                }
            }
        }
        if self.backing.set(Backing::Exclusive(store)).is_err() {
            tracing::warn!("plugin state is already backed by a task store; the second one is ignored");
        }
        Ok(n)
    }

    /// Bytes (keys + values) `ns` holds.
    pub async fn bytes_held(&self, ns: &StateNamespace) -> Result<u64, StateError> {
        let namespace = ns.store_key();
        match self.backing.get() {
            Some(Backing::Shared(store)) => Ok(store.state_bytes(&namespace).await?),
            None | Some(Backing::Exclusive(_)) => {
                Ok(self.memory.lock().unwrap().get(&namespace).map(|m| m.bytes).unwrap_or(0))
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

/// The namespace would hold `total` bytes, over `plugins.budgets.max_state_bytes_per_plugin`
/// (counted per plugin per user).
fn over_namespace_budget(total: u64, budgets: &Budgets) -> StateBudgetExceeded {
    StateBudgetExceeded {
        what: "this plugin's state for this user",
        got: total,
        limit: budgets.max_state_bytes_per_plugin,
        key: "max_state_bytes_per_plugin",
    }
}

#[cfg(test)]
mod tests {
    use super::StateNamespace;

    proptest::proptest! {
        /// Two namespaces share a store key only when they are the same namespace, whatever
        /// the characters of plugin and user (a user id ending in what looks like another
        /// plugin's id cannot reach its state); no key holds NUL.
        #[test]
        fn store_keys_are_one_to_one(
            a in ("[a-z/%\\x00]{0,6}", "[a-z/%\\x00.]{0,6}"),
            b in ("[a-z/%\\x00]{0,6}", "[a-z/%\\x00.]{0,6}"),
        ) {
            let (na, nb) = (StateNamespace::new(a.0.clone(), a.1.clone()), StateNamespace::new(b.0.clone(), b.1.clone()));
            proptest::prop_assert_eq!(na.store_key() == nb.store_key(), a == b);
            proptest::prop_assert!(!na.store_key().contains('\0'));
        }
    }

    #[test]
    fn a_namespace_key_names_plugin_then_user() {
        assert_eq!(StateNamespace::new("claude", "alice").store_key(), "claude/alice");
        assert_eq!(StateNamespace::new("a/b", "c").store_key(), "a%2Fb/c");
        assert_ne!(StateNamespace::new("a/b", "c").store_key(), StateNamespace::new("a", "b/c").store_key());
        // Entries from before namespaces were stored under the bare plugin id.
        assert_ne!(StateNamespace::new("claude", "").store_key(), "claude");
    }
}
