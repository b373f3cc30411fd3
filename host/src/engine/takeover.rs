//! Durable tasks taken over: a task whose process died while running it (kill -9, a lost
//! machine, a deploy past its drain) runs again here from its import journal
//! ([`crate::journal`]) instead of ending `failed`. Which process takes it over is
//! decided elsewhere (the restarted server at start, a replica's reaper for an expired
//! lease); this module decides whether the task can be taken over and starts it. A task
//! that cannot (not durable, its journal unreadable or past its bound) ends as before,
//! with the reason logged.
//!
//! Approval requests the dead process's gate had published (replicas) are taken out of
//! the shared list when the task is taken over: the replay asks its interrupted call
//! again, and a decision a person made on the old request meanwhile answers that new
//! ask ([`DecidedMeanwhile`]) instead of asking the person twice.

use std::sync::{Arc, Mutex};

use serde_json::json;
use warden_approval::{BoxFuture, Decider, PendingApproval, Scope, UserDecision};

use super::{Engine, Lineage, RemoteDecision, Slot, TaskStart};
use crate::event::{HostEvent, TaskEvent};
use crate::journal::{JournalStart, Recorded};
use crate::store::{FinishReason, StoreError, TaskRecord, TaskState, now_ms};

impl Engine {
    /// Takes over `rec`, a task whose previous process (`from`: a replica id, or this
    /// server's previous run) died while it ran, or ends it `failed` with `reason` and
    /// `message` when it cannot be taken over. `true` when it was taken over.
    pub(super) async fn take_over_or_end(
        self: &Arc<Self>,
        rec: TaskRecord,
        from: &str,
        reason: FinishReason,
        message: &str,
    ) -> Result<bool, StoreError> {
        // This process may still run a copy that lost its lease (it stalled past it, and
        // its own reaper was first to see it): that copy stops, and what it wrote is
        // committed, before the task's journal and events are read, or both copies would
        // run the task's calls.
        if let Some(stale) = self.live_task(&rec.task_id) {
            tracing::warn!(task_id = %rec.task_id, "a copy of the task taken over still ran here; stopping it");
            self.relinquish(&stale);
            self.store.flush().await?;
        }
        match self.replayable(&rec).await {
            Ok(recorded) => {
                self.take_over(rec, recorded, from).await;
                Ok(true)
            }
            Err(_) if self.requeue_if_never_run(&rec).await => {
                tracing::info!(task_id = %rec.task_id, from, "the task's process died before its plugin ran; it goes back to the queue and runs from the start");
                Ok(true)
            }
            Err(why) => {
                tracing::warn!(task_id = %rec.task_id, from, %why, "an interrupted task cannot be taken over; it ends failed");
                self.store.end_unrun(rec, TaskState::Failed, reason, message).await?;
                Ok(false)
            }
        }
    }

    /// Hands `rec` back to the shared queue when its replica died after claiming it and
    /// before its journal began: its header is committed before its plugin runs, so with
    /// no header (and no stored event but the engine's `status` ones) nothing of the
    /// task has happened yet, and it runs from the start on whichever replica claims it.
    /// Only a task that was queued qualifies (its submission waits in the queue until it
    /// ends); one bound to its process (secrets, an asker) never is. `true` when requeued.
    /// (Regression: the chaos test's kill landed between a claim and the header's commit,
    /// and the task ended `host restarted`.)
    async fn requeue_if_never_run(&self, rec: &TaskRecord) -> bool {
        let Some(replica) = &self.replica else { return false };
        if !self.options.durable_tasks || rec.parent_task_id.is_some() || self.is_draining() {
            return false;
        }
        if !matches!(Recorded::read(&self.store, &rec.task_id).await, Ok(r) if r.header.is_none()) {
            return false;
        }
        match self.store.events_after(&rec.task_id, 0).await {
            Ok(events) if events.iter().all(|(_, e)| e["type"] == "status") => {}
            _ => return false,
        }
        match self.store.requeue(replica.id(), &rec.task_id).await {
            Ok(requeued) => requeued,
            Err(e) => {
                tracing::warn!(task_id = %rec.task_id, error = %e, "could not hand a task that never ran back to the queue");
                false
            }
        }
    }

    /// The journal `rec` is replayed from, or why it cannot be.
    async fn replayable(&self, rec: &TaskRecord) -> Result<Recorded, String> {
        if !self.options.durable_tasks {
            return Err("server.durable_tasks is false".into());
        }
        if rec.parent_task_id.is_some() {
            return Err("a nested subagent is not durable on its own (its parent's call to it is)".into());
        }
        if self.is_draining() {
            return Err("this server is draining".into());
        }
        let recorded = Recorded::read(&self.store, &rec.task_id).await?;
        let Some(header) = &recorded.header else {
            return Err("it kept no journal (its secrets or its asker lived only in the process that ran it)".into());
        };
        if recorded.overflowed {
            return Err("its journal reached server.journal_max_bytes".into());
        }
        if !self.options.durable_plugins.get(&header.plugin.id).copied().unwrap_or(true) {
            return Err(format!("plugins.durable.{} is false", header.plugin.id));
        }
        Ok(recorded)
    }

    /// Runs `record` here again, answering its plugin from `recorded` first.
    async fn take_over(self: &Arc<Self>, mut record: TaskRecord, recorded: Recorded, from: &str) {
        let task_id = record.task_id.clone();
        let header = recorded.header.clone().expect("checked by `replayable`");
        let egress = header
            .egress
            .as_deref()
            .map(|list| warden_sandbox::EgressNarrowing::parse(list, "the task (egress)").map(Arc::new))
            .transpose();
        let (events, egress) = match (self.store.events_after(&task_id, 0).await, egress) {
            (Ok(events), Ok(egress)) => (events, egress),
            (events, egress) => {
                let why = [events.err().map(|e| e.to_string()), egress.err()].into_iter().flatten().collect::<Vec<_>>();
                let message = format!("the task could not be resumed: {}", why.join("; "));
                tracing::error!(task_id = %task_id, %message);
                let _ = self.store.end_unrun(record, TaskState::Failed, FinishReason::Error, &message).await;
                return;
            }
        };
        let asker = self.decided_meanwhile(&task_id).await.map(|d| Arc::new(d) as Arc<dyn Decider>);
        // Held before it runs (a task nobody held is claimed here).
        self.hold_here(&mut record);
        record.updated_at_ms = now_ms();
        let events = events.into_iter().map(|(_, e)| e).collect();
        let live = self.new_live(record.clone(), self.tool_budget(header.max_tool_iterations), events);
        self.live.lock().unwrap().insert(task_id.clone(), live.clone());
        live.save_record(record.clone());
        let entries = recorded.calls.len();
        let to = self.replica.as_ref().map_or("this server", |r| r.id()).to_owned();
        let note = json!({ "from": from, "to": to, "journal_entries": entries, "plugin": header.plugin.id });
        live.push(TaskEvent::Host(HostEvent::Takeover(note)).into_json(&record.subagent_type));
        tracing::warn!(task_id = %task_id, from, to = %to, journal_entries = entries, "task taken over; replaying its journal");
        let start = TaskStart {
            call: header.call,
            secrets: Default::default(),
            asker,
            egress: egress.into_iter().collect(),
            slot: Slot::Wait,
            lineage: Lineage::default(),
            journal: Some(JournalStart::Replay(Box::new(recorded))),
        };
        self.launch(live, start);
    }
}

impl Engine {
    /// Takes `task_id`'s approval requests out of the shared list (their gate died with
    /// the process that ran the task); the decisions people made on them meanwhile, for
    /// the replayed task's asks, or `None` when nobody decided one.
    async fn decided_meanwhile(&self, task_id: &str) -> Option<DecidedMeanwhile> {
        let orphans = match self.store.take_approvals_of(task_id).await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(task_id, error = %e, "the approval requests of a task taken over could not be read; they are asked again");
                return None;
            }
        };
        let asked = orphans.len();
        let decided: Vec<(PendingApproval, RemoteDecision)> = orphans
            .into_iter()
            .filter_map(|o| Some((o.pending, serde_json::from_value::<RemoteDecision>(o.decision?).ok()?)))
            .collect();
        if asked > 0 {
            tracing::info!(
                task_id,
                asked,
                decided = decided.len(),
                "approval requests of the task's previous process taken over"
            );
        }
        (!decided.is_empty()).then(|| DecidedMeanwhile(Mutex::new(decided)))
    }
}

/// The decisions people made, through another replica, on a task's approval requests
/// while the process running the task was dead. The taken-over task asks its interrupted
/// calls again; an ask of the same task for the same tool and input is answered by the
/// decision made on it (each decision once, with the scope it was given), everything
/// else waits for a person as usual. The request is still published, so its
/// `approval_request` and decision are in the task's stream and the audit log.
struct DecidedMeanwhile(Mutex<Vec<(PendingApproval, RemoteDecision)>>);

impl DecidedMeanwhile {
    /// The decision made on an earlier ask of `request`'s call, taken (once).
    fn take(&self, request: &PendingApproval) -> Option<RemoteDecision> {
        let mut decided = self.0.lock().unwrap();
        let i = decided.iter().position(|(asked, _)| {
            asked.task_id == request.task_id && asked.tool == request.tool && asked.input == request.input
        })?;
        Some(decided.remove(i).1)
    }
}

impl Decider for DecidedMeanwhile {
    fn decide(&self, request: PendingApproval) -> BoxFuture<'static, Result<UserDecision, String>> {
        let answer = self.decide_scoped(request);
        Box::pin(async move { answer.await.map(|(d, _)| d) })
    }

    fn decide_scoped(&self, request: PendingApproval) -> BoxFuture<'static, Result<(UserDecision, Scope), String>> {
        match self.take(&request) {
            Some(d) => {
                tracing::info!(task_id = request.task_id.as_deref().unwrap_or_default(), request_id = %request.id, decided_by = %d.decided_by, "an approval decided while the task's process was down answers its ask again");
                Box::pin(std::future::ready(Ok(d.into_answer())))
            }
            // Not decided meanwhile: a person decides, as for any ask.
            None => Box::pin(std::future::pending()),
        }
    }
}

impl Engine {
    /// Stops `live` here without ending it: another process took it over and runs it
    /// now (this one stalled past its lease). Its driver is aborted, its events and its
    /// end are not written, and it leaves this process's tasks.
    pub(super) fn relinquish(&self, live: &Arc<super::LiveTask>) {
        use std::sync::atomic::Ordering;
        live.relinquished.store(true, Ordering::SeqCst);
        // Its end is the other process's to write.
        live.finishing.store(true, Ordering::SeqCst);
        {
            let mut inner = live.inner.lock().unwrap();
            inner.sink = None;
            inner.closed = true;
        }
        if let Some(driver) = live.driver.lock().unwrap().take() {
            driver.abort();
        }
        let id = live.id();
        self.gate().cancel_task(&id);
        self.live.lock().unwrap().remove(&id);
        self.task_left.notify_waiters();
        live.bump();
    }
}

impl Engine {
    /// A replica shutting down: each durable task running here (one with a journal) is
    /// stopped here and its lease ended, so another replica's reaper takes it over within
    /// half a lease. Tasks that are not durable stay, for the drain to wait on.
    pub(super) async fn hand_over(&self) {
        let Some(replica) = &self.replica else { return };
        if !self.options.durable_tasks {
            return;
        }
        let tasks: Vec<Arc<super::LiveTask>> = self.live.lock().unwrap().iter().map(|(_, l)| l.clone()).collect();
        let mut moved = 0usize;
        for live in tasks {
            let rec = live.record();
            if rec.is_finished() || rec.parent_task_id.is_some() {
                continue;
            }
            let durable = matches!(self.store.journal(&rec.task_id).await.as_deref(), Ok([(0, _), ..]));
            if !durable {
                continue;
            }
            self.relinquish(&live);
            // What it wrote before is committed before another replica reads it.
            if let Err(e) = self.store.flush().await {
                tracing::warn!(task_id = %rec.task_id, error = %e, "a task handed over: its last writes did not commit");
            }
            if let Err(e) = self.store.release_lease(replica.id(), &rec.task_id).await {
                tracing::warn!(task_id = %rec.task_id, error = %e, "could not end the lease of a task handed over; it lapses");
            }
            moved += 1;
        }
        if moved > 0 {
            tracing::info!(replica = %replica.id(), tasks = moved, "draining: durable tasks handed over to the other replicas");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(task: &str, tool: &str, command: &str) -> PendingApproval {
        serde_json::from_value(json!({
            "id": format!("apr_{task}"), "tool": tool, "input": { "command": command }, "subagent": "s",
            "task_id": task, "session_id": null, "plugin": null, "matched_rule": null, "reason": "asked",
            "created_at": "", "expires_at": "", "scopes": ["once"],
        }))
        .unwrap()
    }

    fn decision(who: &str) -> RemoteDecision {
        serde_json::from_value(json!({ "decision": "approve", "decided_by": who })).unwrap()
    }

    /// A decision made while the task's process was down answers the same call of the
    /// same task, once: not another task's, tool's or input's.
    #[test]
    fn a_decision_made_meanwhile_answers_the_same_call_of_the_same_task_once() {
        let d = DecidedMeanwhile(Mutex::new(vec![(asked("t1", "Bash", "ls"), decision("ann"))]));
        assert!(d.take(&asked("t2", "Bash", "ls")).is_none(), "another task");
        assert!(d.take(&asked("t1", "Bash", "ls -a")).is_none(), "another input");
        assert!(d.take(&asked("t1", "Read", "ls")).is_none(), "another tool");
        let (answer, scope) = d.take(&asked("t1", "Bash", "ls")).expect("the same call").into_answer();
        assert_eq!(
            (answer.who.as_str(), answer.resolution, scope),
            ("ann", warden_approval::Resolution::Approve, Scope::Once)
        );
        assert!(d.take(&asked("t1", "Bash", "ls")).is_none(), "once");
    }
}
