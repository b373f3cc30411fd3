//! Durable tasks taken over: a task whose process died while running it (kill -9, a lost
//! machine, a deploy past its drain) runs again here from its import journal
//! ([`crate::journal`]) instead of ending `failed`. Which process takes it over is
//! decided elsewhere (the restarted server at start, a replica's reaper for an expired
//! lease); this module decides whether the task can be taken over and starts it. A task
//! that cannot (not durable, its journal unreadable or past its bound) ends as before,
//! with the reason logged.

use std::sync::Arc;

use serde_json::json;

use super::{Engine, Lineage, Slot, TaskStart};
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
            Err(why) => {
                tracing::warn!(task_id = %rec.task_id, from, %why, "an interrupted task cannot be taken over; it ends failed");
                self.store.end_unrun(rec, TaskState::Failed, reason, message).await?;
                Ok(false)
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
            asker: None,
            egress: egress.into_iter().collect(),
            slot: Slot::Wait,
            lineage: Lineage::default(),
            journal: Some(JournalStart::Replay(Box::new(recorded))),
        };
        self.launch(live, start);
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
