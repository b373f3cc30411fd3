//! Every import of a durable task's call goes through [`HostState::journaled`]: answered
//! from the task's journal while a replay lasts (nothing is run, nothing observable
//! repeats), run and recorded once past it ([`crate::journal`] holds the format and the
//! cursor). This file decides, per import, how much durability a result needs before the
//! plugin sees it ([`Durability`]) and how a call that was under way when the previous
//! process died ends ([`Interrupted`]). A call outside a durable task runs as it is.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Error, HostState, ImportError};
use crate::journal::{Import, Next, TaskJournal, digest};

/// How durable a live call's record must be before its result reaches the plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Durability {
    /// Queued behind everything before it, not waited for: losing it only means the
    /// call runs again after a takeover, which has no effect outside the task (a clock
    /// reading, a log line or event written in the same queue, a state read or write
    /// of the same value).
    Queued,
    /// Committed before the plugin sees the result: a result that cost something (a
    /// model's answer, a response) is never asked for twice.
    Committed,
    /// Recorded `started` and committed before the call runs, then its result committed:
    /// a call with effects outside warden that must never run twice on its own.
    Effect,
}

/// How a call that was under way when the previous process died ends in the replay.
pub(super) enum Interrupted {
    /// Run again (it has no effect outside warden, or repeating it is safe: a model call,
    /// an HTTP `GET`/`HEAD`).
    Rerun,
    /// Answered with this error (it may or may not have had its effect).
    Fail(Error),
}

/// The live work of one import, borrowing the call's state.
pub(super) type Live<'a, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'a>>;

/// What the journal says about the next call, `import` with arguments `digest`; a call
/// the journal does not hold ends the call ([`ImportError::Journal`]).
pub(super) fn next(journal: &TaskJournal, import: Import, digest: &str) -> Result<Next, ImportError> {
    journal.next(import, digest).map_err(|d| ImportError::Journal(d.to_string()))
}

/// A recorded result of `import`, as the plugin got it.
pub(super) fn recorded<T: DeserializeOwned>(import: Import, result: serde_json::Value) -> Result<T, ImportError> {
    let r: Result<T, Error> = serde_json::from_value(result)
        .map_err(|e| ImportError::Journal(format!("the journal's result of {import} cannot be read: {e}")))?;
    Ok(r?)
}

/// Whether `import` sends task events (the plugin's, the model's text, the tool host's):
/// its record must follow them in the store's queue.
fn sends_events(import: Import) -> bool {
    matches!(import, Import::EventsEmit | Import::ModelComplete | Import::ToolsCall)
}

impl HostState {
    /// The task's journal, when the call serves a durable task.
    pub(super) fn journal(&self) -> Option<Arc<TaskJournal>> {
        self.scope.task_scope.as_ref()?.journal.clone()
    }

    /// Runs `live` as import `import` with arguments `args` through the task's journal
    /// (see the module docs); without one, runs it.
    pub(super) async fn journaled<T>(
        &mut self,
        import: Import,
        args: serde_json::Value,
        durability: Durability,
        interrupted: Interrupted,
        live: impl for<'a> FnOnce(&'a mut HostState) -> Live<'a, T> + Send,
    ) -> Result<T, ImportError>
    where
        T: Serialize + DeserializeOwned + Send,
    {
        let Some(journal) = self.journal() else { return Ok(live(self).await?) };
        let digest = digest(&args);
        let seq = match next(&journal, import, &digest)? {
            Next::Recorded(result) => return recorded(import, result),
            Next::Interrupted { seq, .. } => match interrupted {
                Interrupted::Rerun => Some(seq),
                Interrupted::Fail(e) => {
                    let r: Result<T, Error> = Err(e);
                    journal.done(seq, import, &digest, serde_json::to_value(&r).expect("a result serialises"));
                    self.commit(&journal).await?;
                    return Ok(r?);
                }
            },
            Next::Live { seq } => seq,
        };
        let Some(seq) = seq else { return Ok(live(self).await?) };
        if durability == Durability::Effect {
            journal.started(seq, import, &digest, vec![]);
            self.commit(&journal).await?;
        }
        let r = live(self).await;
        self.record(&journal, seq, import, &digest, &r, durability).await?;
        Ok(r?)
    }

    /// Records what live call `seq` returned, with the durability it needs. Task events
    /// the call produced are queued first, so a committed result implies its events are.
    pub(super) async fn record<T: Serialize>(
        &mut self,
        journal: &TaskJournal,
        seq: u64,
        import: Import,
        digest: &str,
        r: &Result<T, Error>,
        durability: Durability,
    ) -> Result<(), ImportError> {
        if sends_events(import) {
            self.events_queued().await;
        }
        journal.done(seq, import, digest, serde_json::to_value(r).expect("a result serialises"));
        if durability != Durability::Queued {
            self.commit(journal).await?;
        }
        Ok(())
    }

    /// Commits the journal so far; a task store that cannot commit ends the call (the
    /// task could not be taken over past this point, so it does not go on pretending).
    pub(super) async fn commit(&mut self, journal: &TaskJournal) -> Result<(), ImportError> {
        let task_id = self.task_id().to_owned();
        journal.flush().await.map_err(|e| {
            tracing::error!(task_id, error = %e, "the task's journal could not be committed");
            ImportError::Journal(format!("the task's journal could not be committed: {e}"))
        })
    }

    /// Waits until the task's engine has queued every event this call sent so far (the
    /// event channel is drained in order; see [`crate::event::EventBarrier`]).
    async fn events_queued(&mut self) {
        let Some(sink) = self.scope.events().cloned() else { return };
        let (barrier, passed) = crate::event::EventBarrier::new();
        if sink.send(crate::event::TaskEvent::Barrier(barrier)).await.is_ok() {
            let _ = passed.await;
        }
    }
}
