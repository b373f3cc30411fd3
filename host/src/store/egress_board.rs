//! The egress board of replicas ([`warden_sandbox::EgressBoard`]) on the shared store:
//! the narrowings of the tool calls running on each replica, per session, so that whichever
//! replica serves a session's connections judges them by every running call's list (the
//! SQL is in [`super::postgres`], table `egress_holds`). A row names its replica; rows of a
//! replica whose lease ran out are ignored, so a dead replica's holds lapse with it.
//!
//! It holds lists of host patterns only, never a credential (task credentials stay in the
//! process of the call that holds them).

use warden_sandbox::{BoardFuture, EgressBoard, SessionKey, SharedNarrowing};

use super::{Store, now_ms};

/// Replica `replica`'s view of the board on `store` (PostgreSQL).
pub struct StoreEgressBoard {
    store: Store,
    replica: String,
}

impl StoreEgressBoard {
    /// The board of `replica` on `store`, after clearing what an earlier life of the
    /// replica left on it (its calls ended with it). `None` on a store that is not shared.
    pub async fn open(store: Store, replica: String) -> Result<Option<StoreEgressBoard>, super::StoreError> {
        let Some(pg) = store.pg() else { return Ok(None) };
        pg.clear_egress_holds(&replica).await.map_err(|e| store.err(e))?;
        Ok(Some(StoreEgressBoard { store, replica }))
    }

    /// Its backend: PostgreSQL, as [`StoreEgressBoard::open`] checked.
    fn pg(&self) -> Result<&super::postgres::PgBackend, String> {
        self.store.pg().ok_or_else(|| "the store is not shared".to_string())
    }
}

impl EgressBoard for StoreEgressBoard {
    fn publish<'a>(
        &'a self,
        key: &'a SessionKey,
        hold: u64,
        narrowings: &'a [SharedNarrowing],
    ) -> BoardFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let json = serde_json::to_string(narrowings).map_err(|e| e.to_string())?;
            let hold = i64::try_from(hold).map_err(|_| "hold id out of range".to_string())?;
            self.pg()?.publish_egress_hold((&key.user_id, &key.session_id), &self.replica, hold, &json).await
        })
    }

    fn withdraw<'a>(&'a self, _key: &'a SessionKey, hold: u64) -> BoardFuture<'a, ()> {
        Box::pin(async move {
            let (Ok(pg), Ok(hold)) = (self.pg(), i64::try_from(hold)) else { return };
            if let Err(e) = pg.withdraw_egress_hold(&self.replica, hold).await {
                // It lapses with this replica's lease, or goes at its next start.
                tracing::warn!(replica = %self.replica, error = %e, "an ended call's egress list stays on the board");
            }
        })
    }

    fn others<'a>(&'a self, key: &'a SessionKey) -> BoardFuture<'a, Result<Vec<SharedNarrowing>, String>> {
        Box::pin(async move {
            let now = i64::try_from(now_ms()).unwrap_or(i64::MAX);
            let rows = self.pg()?.others_egress_holds((&key.user_id, &key.session_id), &self.replica, now).await?;
            let mut all = vec![];
            for row in rows {
                // A row that does not read back narrows to nothing (deny by default).
                match serde_json::from_str::<Vec<SharedNarrowing>>(&row) {
                    Ok(list) => all.extend(list),
                    Err(_) => all.push(SharedNarrowing { source: "an unreadable egress hold".into(), allow: vec![] }),
                }
            }
            Ok(all)
        })
    }
}
