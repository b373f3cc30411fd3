//! The engine as one replica of several on a shared (PostgreSQL) store: membership, the
//! claim loop that takes queued tasks when this replica has free slots, the lease
//! renewals of the tasks it holds, the reaper that ends the tasks of a replica that
//! stopped renewing ("replica lost"), and the control loop that applies cancels and
//! approval decisions made on other replicas. The store holds the shared state
//! ([`crate::store::Store::claim`] and friends); this module only drives it, and never
//! finishes a task it runs itself other than through [`super::Engine`].

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Engine;
use crate::plugin::TaskCall;
use crate::store::{FinishReason, now_ms};

/// How often an idle replica looks for queued tasks (a replica that frees a slot looks at
/// once): the longest a task queued on a busy replica waits while another one idles.
pub const CLAIM_POLL: Duration = Duration::from_millis(250);
/// How often a replica looks for cancels and approval decisions other replicas left for
/// it: the delay a person deciding on another replica sees.
pub const CONTROL_POLL: Duration = Duration::from_millis(250);
/// How often a caller on one replica re-reads a task running on another (its events for
/// a stream, its record for a blocking TaskOutput).
pub const REMOTE_POLL: Duration = Duration::from_millis(200);

/// Who this replica is.
#[derive(Debug, Clone)]
pub struct ReplicaOptions {
    /// `server.replica_id` / `--replica-id`.
    pub id: String,
    /// `server.task_lease`.
    pub lease: Duration,
}

impl Default for ReplicaOptions {
    fn default() -> Self {
        ReplicaOptions { id: crate::config::default_replica_id(), lease: crate::config::DEFAULT_TASK_LEASE }
    }
}

/// A queued task as a claiming replica needs it: what the parent asked, without secrets
/// (a task with `tool_context` or a per-connection asker is never queued; it runs where
/// it was submitted).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct QueuedSubmission {
    pub call: TaskCall,
    #[serde(default)]
    pub max_tool_iterations: Option<u32>,
    #[serde(default)]
    pub egress: Option<Vec<String>>,
}

/// A decision on another replica's approval request, as left in the store.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct RemoteDecision {
    pub decision: warden_approval::Resolution,
    #[serde(default)]
    pub scope: warden_approval::Scope,
    pub decided_by: String,
    /// What the decision may change; absent (a replica of an earlier version) is a user's.
    #[serde(default)]
    pub authority: warden_approval::Authority,
}

impl RemoteDecision {
    /// The answer as the gate takes it, and how long it holds.
    pub fn into_answer(self) -> (warden_approval::UserDecision, warden_approval::Scope) {
        let answer = warden_approval::UserDecision {
            resolution: self.decision,
            who: self.decided_by,
            authority: self.authority,
        };
        (answer, self.scope)
    }
}

/// This replica's state.
pub(super) struct Replica {
    pub options: ReplicaOptions,
    /// This process, among processes that may (by mistake) share a replica id.
    pub instance: String,
    /// Woken when a slot frees here: claim at once.
    pub wake: tokio::sync::Notify,
}

impl Replica {
    pub fn new(options: ReplicaOptions) -> Self {
        Replica { options, instance: uuid::Uuid::new_v4().simple().to_string(), wake: tokio::sync::Notify::new() }
    }

    pub fn id(&self) -> &str {
        &self.options.id
    }

    /// The end of a lease taken or renewed now.
    pub fn lease_until(&self) -> u64 {
        now_ms() + self.options.lease.as_millis() as u64
    }

    /// The error of a task whose replica stopped renewing its lease.
    pub fn lost_message(owner: &str) -> String {
        format!("replica lost: replica {owner} stopped renewing the task's lease")
    }
}

impl Engine {
    /// Joins the cluster: registers the replica id (a previous process under the id that
    /// does not renew it within a renewal interval is taken for dead; refused while a
    /// running one renews it),
    /// ends what this replica ran in a previous life and what no replica holds ("host
    /// restarted"), then starts the claim, lease, reaper and control loops.
    pub(super) async fn join_cluster(self: &Arc<Self>) -> anyhow::Result<()> {
        let Some(replica) = &self.replica else { return Ok(()) };
        let id = replica.id().to_owned();
        let lease = replica.options.lease;
        // A previous holder of the id that does not renew it within one renewal interval
        // is dead (a crash, kill -9): take the id over; one that renews is running.
        let mut seen = None;
        loop {
            match self.store.register_replica(&id, &replica.instance, replica.lease_until(), seen).await? {
                None => break,
                Some(until) if seen.is_none() => {
                    tracing::warn!(replica = %id, "replica id registered by another process; waiting one renewal interval to see whether it is alive");
                    seen = Some(until);
                    tokio::time::sleep(lease / 3 + Duration::from_millis(500)).await;
                }
                Some(_) => anyhow::bail!(
                    "replica id {id:?} is in use by another running warden on this database \
                     (it keeps renewing it); give each replica its own --replica-id (server.replica_id)"
                ),
            }
        }
        // The narrowings of this replica's calls go on the board, and every connection it
        // serves is judged by the other replicas' too (`sandbox.egress` with replicas).
        if let Ok(sb) = self.tools().sandbox()
            && sb.egress_policy().is_some()
            && let Some(board) = crate::store::StoreEgressBoard::open(self.store.clone(), id.clone()).await?
        {
            sb.share_egress_holds(Arc::new(board))?;
        }
        let mut ended = vec![];
        for (owner, rec) in self.store.take_expired(&id, replica.lease_until(), true).await? {
            let (reason, message) = if owner == id {
                (FinishReason::HostRestarted, crate::store::HOST_RESTARTED.to_owned())
            } else {
                (FinishReason::ReplicaLost, Replica::lost_message(&owner))
            };
            let task_id = rec.task_id.clone();
            if !self.take_over_or_end(rec, &owner, reason, &message).await? {
                ended.push(task_id);
            }
        }
        for rec in self.store.unheld_unfinished().await? {
            let task_id = rec.task_id.clone();
            let msg = crate::store::HOST_RESTARTED;
            if !self.take_over_or_end(rec, "no replica", FinishReason::HostRestarted, msg).await? {
                ended.push(task_id);
            }
        }
        self.store.flush().await?;
        if !ended.is_empty() {
            tracing::warn!(replica = %id, count = ended.len(), tasks = ?ended, "tasks interrupted by a restart marked failed");
        }
        tracing::info!(replica = %id, lease = %humantime::format_duration(lease), "joined the replicas on the shared store");
        let weak = Arc::downgrade(self);
        tokio::spawn(claim_loop(weak.clone()));
        tokio::spawn(lease_loop(weak.clone()));
        tokio::spawn(reap_loop(weak.clone()));
        tokio::spawn(control_loop(weak));
        Ok(())
    }

    /// Renews this replica's leases. A task running here that the renewal did not find
    /// held and whose stored record is finished was ended by another replica (this one
    /// stalled past its lease): it is stopped here, its end already written. (A task not
    /// held whose record is not finished was submitted a moment ago: its hold is still
    /// on its way to the store.)
    async fn renew_leases(&self, replica: &Replica) {
        let running: Vec<String> = self.live.lock().unwrap().ids().cloned().collect();
        let held = match self.store.renew(replica.id(), &replica.instance, &running, replica.lease_until()).await {
            Ok(Some(held)) => held.into_iter().collect::<HashSet<_>>(),
            Ok(None) => {
                // A zombie: it stopped renewing long enough for another process to take its
                // id. It takes no more work (`/readyz` says draining) and stops what it runs.
                tracing::error!(replica = %replica.id(), "another process took this replica id over; draining");
                self.draining.store(true, std::sync::atomic::Ordering::SeqCst);
                HashSet::new()
            }
            Err(e) => {
                tracing::warn!(replica = %replica.id(), error = %e, "lease renewal failed; retrying");
                return;
            }
        };
        let suspects: Vec<Arc<super::LiveTask>> = self
            .live
            .lock()
            .unwrap()
            .iter()
            .filter(|(id, l)| !held.contains(*id) && !l.finishing.load(std::sync::atomic::Ordering::SeqCst))
            .map(|(_, l)| l.clone())
            .collect();
        for live in suspects {
            let id = live.id();
            if let Ok(Some(rec)) = self.store.task(&id).await
                && rec.is_finished()
            {
                tracing::warn!(task_id = %id, replica = %replica.id(), status = %rec.status, "task ended by another replica (lease lost); stopping it here");
                live.request_cancel();
                self.gate().cancel_task(&id);
            } else if let Ok(Some(holder)) = self.store.holder(&id).await
                && holder != replica.id()
            {
                // Taken over (durable) by a replica that saw this one's lease lapse: it
                // runs the task now, so this copy stops without writing anything more.
                tracing::warn!(task_id = %id, replica = %replica.id(), %holder, "task taken over by another replica (lease lost); stopping it here");
                self.relinquish(&live);
            }
        }
    }

    /// With replicas: `record` is held by this replica from now on (its lease written,
    /// its record naming it). `false` alone on its store.
    pub(super) fn hold_here(&self, record: &mut crate::store::TaskRecord) -> bool {
        let Some(replica) = &self.replica else { return false };
        record.replica = Some(replica.id().to_owned());
        self.store.write(crate::store::Write::Claim {
            task_id: record.task_id.clone(),
            owner: replica.id().to_owned(),
            lease_until_ms: replica.lease_until(),
        });
        true
    }

    /// Ends the tasks of replicas that stopped renewing their leases.
    async fn reap(self: &Arc<Self>, replica: &Replica) {
        let expired = match self.store.take_expired(replica.id(), replica.lease_until(), false).await {
            Ok(e) => e,
            Err(e) => return tracing::warn!(error = %e, "looking for lost tasks failed"),
        };
        for (owner, rec) in expired {
            let task_id = rec.task_id.clone();
            let message = Replica::lost_message(&owner);
            match self.take_over_or_end(rec, &owner, FinishReason::ReplicaLost, &message).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(task_id = %task_id, lost_replica = %owner, "task of a lost replica ended failed")
                }
                Err(e) => tracing::error!(task_id = %task_id, error = %e, "could not end a lost replica's task"),
            }
        }
        if let Err(e) = self.store.flush().await {
            tracing::error!(error = %e, "ending lost tasks was not committed");
        }
    }

    /// Applies cancels and approval decisions other replicas left for this one.
    async fn apply_control(&self, replica: &Replica) {
        let msgs = match self.store.control(replica.id()).await {
            Ok(m) => m,
            Err(e) => return tracing::warn!(error = %e, "reading cancels and decisions from other replicas failed"),
        };
        for id in msgs.cancels {
            if let Some(live) = self.live_task(&id) {
                tracing::info!(task_id = %id, "task canceled through another replica");
                live.request_cancel();
                self.gate().cancel_task(&id);
            }
        }
        for (request_id, decision) in msgs.decisions {
            let applied = serde_json::from_value::<RemoteDecision>(decision).ok().and_then(|d| {
                let (answer, scope) = d.into_answer();
                self.gate().resolve_scoped(&request_id, answer, scope).ok()
            });
            if applied.is_none() {
                // Already resolved here (timed out, its task ended) or unreadable: gone.
                self.store.write(crate::store::Write::ApprovalWithdrawn { request_id });
            }
        }
    }

    /// Takes queued tasks for this replica's free slots.
    async fn claim(self: &Arc<Self>, replica: &Replica) {
        if self.is_draining() {
            return;
        }
        let free = self.slots.free();
        if free == 0 {
            return;
        }
        let max_running = self.options.max_running_per_user;
        let claimed = match self.store.claim(replica.id(), free, max_running, replica.lease_until()).await {
            Ok(c) => c,
            Err(e) => return tracing::warn!(error = %e, "claiming queued tasks failed"),
        };
        for c in claimed {
            let permit = self.slots.try_acquire(&c.record.user_id);
            self.start_claimed(c, permit).await;
        }
    }
}

async fn claim_loop(engine: Weak<Engine>) {
    loop {
        let Some(e) = engine.upgrade() else { return };
        let Some(replica) = e.replica.clone() else { return };
        e.claim(&replica).await;
        drop(e);
        tokio::select! {
            _ = replica.wake.notified() => {}
            _ = tokio::time::sleep(CLAIM_POLL) => {}
        }
    }
}

async fn lease_loop(engine: Weak<Engine>) {
    let Some(lease) = engine.upgrade().and_then(|e| e.replica.as_ref().map(|r| r.options.lease)) else { return };
    let mut tick = tokio::time::interval(lease / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(e) = engine.upgrade() else { return };
        let Some(replica) = e.replica.clone() else { return };
        e.renew_leases(&replica).await;
    }
}

/// Looks for tasks of replicas that stopped renewing, every half lease: a loop of its own,
/// so ending many lost tasks (a flush behind a busy writer) never delays this replica's
/// own renewals.
async fn reap_loop(engine: Weak<Engine>) {
    let Some(lease) = engine.upgrade().and_then(|e| e.replica.as_ref().map(|r| r.options.lease)) else { return };
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + lease / 2, lease / 2);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(e) = engine.upgrade() else { return };
        let Some(replica) = e.replica.clone() else { return };
        e.reap(&replica).await;
    }
}

async fn control_loop(engine: Weak<Engine>) {
    loop {
        tokio::time::sleep(CONTROL_POLL).await;
        let Some(e) = engine.upgrade() else { return };
        let Some(replica) = e.replica.clone() else { return };
        e.apply_control(&replica).await;
    }
}
