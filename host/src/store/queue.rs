//! The shared task queue of replicas: several `warden serve` processes on one PostgreSQL
//! store share the work through it (the SQL is in [`super::postgres`]). What the engine
//! asks of it, typed:
//!
//! - **Membership**: [`Store::register_replica`] at start, renewed with the leases.
//! - **Queue and leases**: a task runs on the replica that holds it (`owner`) until its
//!   lease ends; [`Store::enqueue`] adds a task no replica runs yet (under the
//!   cluster-wide `max_queued_tasks`, and its user's share `max_tasks_per_user` of the
//!   tasks queued or held cluster-wide), [`Store::claim`] takes waiting tasks for a replica
//!   with free slots (`FOR UPDATE SKIP LOCKED`), [`Store::renew`] extends what a replica
//!   holds, [`Store::take_expired`] takes the tasks of a replica that stopped renewing so
//!   that they can be ended "replica lost".
//! - **Control across replicas**: cancel requests and approval decisions made on one
//!   replica for a task held by another ([`Store::control`]).
//!
//! On the embedded store (one process by construction) every operation answers as for a
//! replica alone: nothing to claim, nothing held elsewhere. It never decides how a task
//! ends; the engine does, and writes the outcome through [`Store::write`].

use serde_json::Value;

use super::{Backend, FinishReason, Store, StoreError, TaskRecord, TaskState, Write, now_ms};

/// The bounds [`Store::enqueue`] holds, each counted cluster-wide in the same transaction
/// as the task is added, so replicas agree on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    /// `server.max_queued_tasks`: tasks no replica runs yet.
    pub max_queued: usize,
    /// `server.max_tasks_per_user`: tasks of the task's user queued or held by a replica
    /// (nested subagents, which run inside their root's, not counted).
    pub max_per_user: usize,
}

/// What [`Store::enqueue`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// The task waits in the queue.
    Queued,
    /// Not added: [`QueueLimits::max_queued`] tasks wait already.
    QueueFull,
    /// Not added: the task's user has [`QueueLimits::max_per_user`] tasks queued or held.
    UserFull,
}

/// A task this replica took from the queue: its stored record and submission.
#[derive(Debug)]
pub struct Claimed {
    pub record: TaskRecord,
    /// What the engine needs to run it (see the engine's `QueuedSubmission`).
    pub submission: Value,
}

/// What other replicas asked of this one since the last look.
#[derive(Debug, Default)]
pub struct ControlMessages {
    /// Tasks this replica holds that someone canceled elsewhere.
    pub cancels: Vec<String>,
    /// Decisions made elsewhere on this replica's approval requests: (request id, decision).
    pub decisions: Vec<(String, Value)>,
}

/// An approval request waiting in another replica's gate.
#[derive(Debug, Clone)]
pub struct RemoteApproval {
    pub owner: String,
    pub pending: warden_approval::PendingApproval,
}

/// An approval request whose gate died with the replica that ran its task, and the
/// decision a person left on it through another replica meanwhile, if any.
#[derive(Debug, Clone)]
pub struct OrphanedApproval {
    pub pending: warden_approval::PendingApproval,
    /// The decision as the deciding replica wrote it (the engine's remote decision).
    pub decision: Option<Value>,
}

/// A task taken from a replica that stopped renewing its lease: the replica, the record.
pub type Expired = (String, TaskRecord);

impl Store {
    /// Whether several processes may share this store (PostgreSQL): the engine then runs
    /// as a replica.
    pub fn is_shared(&self) -> bool {
        matches!(self.inner.backend, Backend::Postgres(_))
    }

    /// The PostgreSQL backend (`None`: the embedded store); also the egress board's.
    pub(super) fn pg(&self) -> Option<&super::postgres::PgBackend> {
        match &self.inner.backend {
            Backend::Postgres(b) => Some(b),
            Backend::Redb(_) => None,
        }
    }

    /// Registers this process (`instance`) as replica `replica` until `alive_until` (ms);
    /// `Some(until)` when another process holds the id until then and has renewed it
    /// since `stale_until` (what an earlier attempt returned).
    pub async fn register_replica(
        &self,
        replica: &str,
        instance: &str,
        alive_until: u64,
        stale_until: Option<u64>,
    ) -> Result<Option<u64>, StoreError> {
        let Some(pg) = self.pg() else { return Ok(None) };
        pg.register_replica(replica, instance, now_ms(), alive_until, stale_until).await.map_err(|e| self.err(e))
    }

    /// Renews the registration of `replica` and the leases of the tasks among `running`
    /// it holds, until `lease_until`: those task ids, or `None` when another process took
    /// the replica id over.
    pub async fn renew(
        &self,
        replica: &str,
        instance: &str,
        running: &[String],
        lease_until: u64,
    ) -> Result<Option<Vec<String>>, StoreError> {
        let Some(pg) = self.pg() else { return Ok(Some(vec![])) };
        pg.renew(replica, instance, running, lease_until).await.map_err(|e| self.err(e))
    }

    /// Replicas only: the replica holding `task_id` now (`None`: none holds it).
    pub async fn holder(&self, task_id: &str) -> Result<Option<String>, StoreError> {
        let Some(pg) = self.pg() else { return Ok(None) };
        pg.holder(task_id).await.map_err(|e| self.err(e))
    }

    /// Adds `rec` (its first event `first_event`) to the shared queue for any replica to
    /// claim, unless that would exceed one of `limits`.
    pub async fn enqueue(
        &self,
        rec: &TaskRecord,
        first_event: &Value,
        submission: &Value,
        limits: QueueLimits,
    ) -> Result<Enqueued, StoreError> {
        let Some(pg) = self.pg() else { return Err(self.err("the embedded store has no shared queue")) };
        pg.enqueue(rec, first_event, &submission.to_string(), limits).await.map_err(|e| self.err(e))
    }

    /// Takes up to `n` waiting tasks for `replica` until `lease_until`, by the fair-share
    /// rule: the oldest task of the user with the fewest tasks held cluster-wide first, and
    /// no more of a user than makes `max_running_per_user` held by `replica` (the engine's
    /// `schedule` rule, on the shared queue).
    pub async fn claim(
        &self,
        replica: &str,
        n: usize,
        max_running_per_user: usize,
        lease_until: u64,
    ) -> Result<Vec<Claimed>, StoreError> {
        let Some(pg) = self.pg() else { return Ok(vec![]) };
        let rows = pg.claim(replica, n, max_running_per_user, lease_until).await.map_err(|e| self.err(e))?;
        let mut claimed = vec![];
        for (task_id, submission, record) in rows {
            let parsed = record.as_deref().map(serde_json::from_str::<TaskRecord>);
            let submission = submission.as_deref().map(serde_json::from_str::<Value>);
            match (parsed, submission) {
                (Some(Ok(record)), Some(Ok(submission))) => claimed.push(Claimed { record, submission }),
                _ => {
                    // A row warden did not write (or a task purged under it): never run, never kept.
                    tracing::error!(task_id = %task_id, "a claimed task has no readable record or submission; dropping it from the queue");
                    self.write(Write::Release { task_id });
                }
            }
        }
        Ok(claimed)
    }

    /// Where the unclaimed task `task_id` stands in the shared queue (1 = the next
    /// claimed), by the order [`Store::claim`] takes tasks in if nothing else arrives (the
    /// per-replica caps left aside); `None` when it is not waiting there.
    pub async fn queue_position(&self, task_id: &str) -> Result<Option<usize>, StoreError> {
        let Some(pg) = self.pg() else { return Ok(None) };
        pg.queue_position(task_id).await.map_err(|e| self.err(e))
    }

    /// Cancels and decisions other replicas left for `replica`.
    pub async fn control(&self, replica: &str) -> Result<ControlMessages, StoreError> {
        let Some(pg) = self.pg() else { return Ok(ControlMessages::default()) };
        let (cancels, decisions) = pg.control(replica).await.map_err(|e| self.err(e))?;
        let decisions =
            decisions.into_iter().filter_map(|(id, d)| Some((id, serde_json::from_str(&d).ok()?))).collect();
        Ok(ControlMessages { cancels, decisions })
    }

    /// Takes, for `taker`, the tasks whose replica stopped renewing their leases (and with
    /// `own_too` those `taker` held in a previous life); the caller ends them.
    pub async fn take_expired(&self, taker: &str, lease_until: u64, own_too: bool) -> Result<Vec<Expired>, StoreError> {
        let Some(pg) = self.pg() else { return Ok(vec![]) };
        let rows = pg.take_expired(taker, now_ms(), lease_until, own_too).await.map_err(|e| self.err(e))?;
        let mut out = vec![];
        for (task_id, owner, record) in rows {
            match record.as_deref().map(serde_json::from_str::<TaskRecord>) {
                Some(Ok(mut rec)) => {
                    // The queue's holder is who ran it; the record may not say so yet (the
                    // replica died between its claim and writing its copy of the record).
                    rec.replica = Some(owner.clone());
                    out.push((owner, rec))
                }
                _ => self.write(Write::Release { task_id }),
            }
        }
        Ok(out)
    }

    /// Takes `task_id` for `taker` if it waits unclaimed (to end it without running it).
    pub async fn take_unclaimed(
        &self,
        taker: &str,
        task_id: &str,
        lease_until: u64,
    ) -> Result<Option<TaskRecord>, StoreError> {
        let Some(pg) = self.pg() else { return Ok(None) };
        let row = pg.take_unclaimed(taker, task_id, lease_until).await.map_err(|e| self.err(e))?;
        Ok(row.flatten().and_then(|r| serde_json::from_str(&r).ok()))
    }

    /// Hands `task_id`, claimed by `replica` but not started (it began draining, or the
    /// replica that claimed it died before its plugin ran), back to the queue for another
    /// replica; `false` when `replica` does not hold it or it was never queued.
    pub async fn requeue(&self, replica: &str, task_id: &str) -> Result<bool, StoreError> {
        let Some(pg) = self.pg() else { return Ok(false) };
        pg.requeue(replica, task_id).await.map_err(|e| self.err(e))
    }

    /// Ends `replica`'s lease on `task_id` at once: a replica shutting down hands a durable
    /// task to whichever replica's reaper sees it first ([`crate::journal`]).
    pub async fn release_lease(&self, replica: &str, task_id: &str) -> Result<(), StoreError> {
        let Some(pg) = self.pg() else { return Ok(()) };
        pg.release_lease(replica, task_id).await.map_err(|e| self.err(e))
    }

    /// Asks whichever replica holds `task_id` to cancel it; `false` if none holds it.
    pub async fn request_cancel(&self, task_id: &str) -> Result<bool, StoreError> {
        let Some(pg) = self.pg() else { return Ok(false) };
        pg.request_cancel(task_id).await.map_err(|e| self.err(e))
    }

    /// Approval requests waiting in the gates of replicas other than `replica` (the oldest
    /// 1000: a listing stays bounded whatever is waiting).
    pub async fn remote_approvals(&self, replica: &str) -> Result<Vec<RemoteApproval>, StoreError> {
        let Some(pg) = self.pg() else { return Ok(vec![]) };
        let rows = pg.remote_approvals(replica).await.map_err(|e| self.err(e))?;
        Ok(rows
            .into_iter()
            .filter_map(|(owner, p)| Some(RemoteApproval { owner, pending: serde_json::from_str(&p).ok()? }))
            .collect())
    }

    /// Takes `task_id`'s approval requests out of the shared list: its task is being taken
    /// over, so the gate that asked them is gone (they would be listed forever, and a
    /// decision on them would reach no one). Oldest first; none on the embedded store,
    /// whose gate is this process's.
    pub async fn take_approvals_of(&self, task_id: &str) -> Result<Vec<OrphanedApproval>, StoreError> {
        let Some(pg) = self.pg() else { return Ok(vec![]) };
        let rows = pg.take_approvals_of(task_id).await.map_err(|e| self.err(e))?;
        Ok(rows
            .into_iter()
            .filter_map(|(pending, decision)| {
                Some(OrphanedApproval {
                    pending: serde_json::from_str(&pending).ok()?,
                    decision: decision.and_then(|d| serde_json::from_str(&d).ok()),
                })
            })
            .collect())
    }

    /// Leaves `decision` for the replica holding request `request_id`; `false` when the
    /// request is gone or already decided.
    pub async fn decide_remote(&self, request_id: &str, decision: &Value) -> Result<bool, StoreError> {
        let Some(pg) = self.pg() else { return Ok(false) };
        pg.decide_remote(request_id, &decision.to_string()).await.map_err(|e| self.err(e))
    }

    /// Ends `rec` — a task no replica is running any more — with `status`, `reason` and
    /// `message`: a final `error` and `finish` event after its last one, the finished
    /// record, its queue row released and its approval requests dropped. Queued only:
    /// flush to wait for it. A task already finished is left as it is (a finished record
    /// is final).
    pub async fn end_unrun(
        &self,
        mut rec: TaskRecord,
        status: TaskState,
        reason: FinishReason,
        message: &str,
    ) -> Result<TaskRecord, StoreError> {
        if rec.is_finished() {
            self.write(Write::Release { task_id: rec.task_id.clone() });
            return Ok(rec);
        }
        let last = self.events_after(&rec.task_id, 0).await?.last().map(|(s, _)| *s).unwrap_or(0);
        let now = now_ms();
        rec.status = status;
        rec.error = Some(message.to_owned());
        rec.finish_reason = Some(reason);
        rec.updated_at_ms = now;
        rec.finished_at_ms = Some(now);
        let task_id = rec.task_id.clone();
        self.write(Write::Event {
            task_id: task_id.clone(),
            seq: last + 1,
            event: serde_json::json!({ "type": "error", "message": message }),
        });
        self.write(Write::Event {
            task_id: task_id.clone(),
            seq: last + 2,
            event: serde_json::json!({ "type": "finish", "status": status, "reason": reason, "error": message }),
        });
        self.write(Write::Task(rec.clone()));
        self.write(Write::Release { task_id: task_id.clone() });
        if let Some(pg) = self.pg() {
            pg.drop_approvals_of(&[task_id]).await.map_err(|e| self.err(e))?;
        }
        Ok(rec)
    }

    /// Unfinished tasks no replica holds or queues (left by a warden from before the
    /// queue, or by a replica whose final write was lost).
    pub async fn unheld_unfinished(&self) -> Result<Vec<TaskRecord>, StoreError> {
        let Some(pg) = self.pg() else { return Ok(vec![]) };
        let rows = pg.unheld_unfinished().await.map_err(|e| self.err(e))?;
        Ok(rows.iter().filter_map(|r| serde_json::from_str(r).ok()).collect())
    }
}
