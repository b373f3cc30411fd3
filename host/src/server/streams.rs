//! Requests that hold a connection open once admitted — a task's event stream (SSE, MCP
//! progress, A2A streaming), the live task list, a long poll (`block=true`, MCP
//! `TaskOutput`, an A2A blocking send) — counted per principal. [`Streams::admit`] is the
//! one admission point: every such path takes a [`StreamPermit`] before it starts (the
//! follower of [`super::follow`] and the task-list feed cannot be built without one) and
//! gives it back when it ends. It never looks at what a stream carries.
//!
//! Regression: nothing bounded them per principal. One tenant's stalled streams and long
//! polls took every connection the API had (`server.max_connections`) and, with whole-log
//! replays, gigabytes of memory, for every tenant.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;

use super::{ApiError, Principal};

/// Open streams and long polls per principal, each at most `max_per_principal`
/// (`server.max_streams_per_principal`).
pub struct Streams {
    max_per_principal: usize,
    /// Open permits per principal name; a principal with none has no entry.
    open: Mutex<HashMap<String, usize>>,
}

/// One admitted stream or long poll of a principal; dropping it ends the hold.
pub struct StreamPermit {
    streams: Arc<Streams>,
    principal: String,
}

impl Streams {
    pub fn new(max_per_principal: usize) -> Arc<Streams> {
        Arc::new(Streams { max_per_principal, open: Mutex::new(HashMap::new()) })
    }

    /// A permit for one more stream or long poll of `who`, or 429 `too_many_streams`
    /// naming `server.max_streams_per_principal` when `who` holds that many already.
    pub fn admit(self: &Arc<Self>, who: &Principal) -> Result<StreamPermit, ApiError> {
        let mut open = self.open.lock().unwrap();
        let held = open.entry(who.name.clone()).or_default();
        if *held >= self.max_per_principal {
            tracing::warn!(
                principal = %who.name, max = self.max_per_principal,
                "stream refused: the principal has server.max_streams_per_principal open"
            );
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_streams",
                format!(
                    "principal `{}` has {} event streams and long polls open \
                     (server.max_streams_per_principal); close one first",
                    who.name, self.max_per_principal
                ),
            ));
        }
        *held += 1;
        Ok(StreamPermit { streams: self.clone(), principal: who.name.clone() })
    }

    /// Streams and long polls `name` holds now.
    pub fn held_by(&self, name: &str) -> usize {
        self.open.lock().unwrap().get(name).copied().unwrap_or(0)
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut open = self.streams.open.lock().unwrap();
        if let Some(held) = open.get_mut(&self.principal) {
            *held -= 1;
            if *held == 0 {
                open.remove(&self.principal);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the order of admissions and releases over several principals, each
        /// holds at most the maximum, every refusal is at the maximum, a release makes room
        /// again, and nothing is left counted once every permit is gone.
        #[test]
        fn a_principal_never_holds_more_than_its_share(
            max in 1usize..5,
            ops in proptest::collection::vec((0usize..3, any::<bool>()), 0..80),
        ) {
            let streams = Streams::new(max);
            let who: Vec<Principal> = (0..3).map(|i| Principal::named(&format!("p{i}"), crate::config::Role::User, vec![])).collect();
            let mut held: Vec<Vec<StreamPermit>> = vec![vec![], vec![], vec![]];
            for (p, admit) in ops {
                if admit {
                    match streams.admit(&who[p]) {
                        Ok(permit) => held[p].push(permit),
                        Err(e) => {
                            prop_assert_eq!(held[p].len(), max);
                            prop_assert_eq!(e.code, "too_many_streams");
                        }
                    }
                } else {
                    held[p].pop();
                }
                for (i, w) in who.iter().enumerate() {
                    prop_assert_eq!(streams.held_by(&w.name), held[i].len());
                }
            }
            drop(held);
            prop_assert!(streams.open.lock().unwrap().is_empty());
        }
    }
}
