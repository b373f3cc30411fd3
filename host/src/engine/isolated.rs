//! The engine side of tasks that run in a fork of their session ([`crate::isolation`]):
//! which tasks are isolated and under which session id (decided at admission, so the
//! record names the fork from the start and the fork's redactor is the source's), making
//! the fork when the task starts, and its changes in the record when it ends.

use std::sync::Arc;

use super::{Engine, Finish, LiveTask};
use crate::isolation::{Fork, Isolated};
use crate::plugin::{Isolation, TaskCall};
use crate::task_state::TaskState;

impl Engine {
    /// How a task of `call` is isolated: as asked (`requested`, the task's `isolation`),
    /// else as its definition says; `None` for an unknown subagent (refused elsewhere).
    pub(super) fn isolation_of(&self, call: &TaskCall, requested: Option<Isolation>) -> Option<Isolation> {
        requested.or_else(|| {
            let snapshot = self.registry.snapshot();
            crate::task::resolve(&snapshot, call).ok().and_then(|(r, _)| r.definition.isolation)
        })
    }

    /// The isolation of a task admitted in `source` (of `user`): the fork's session id
    /// ([`crate::isolation::fork_id`]), whose redactor is the source's from now on (what
    /// the source's tasks wrote reaches the fork with the copy; it stays scrubbed there).
    /// Call it before the task's own secrets are remembered.
    pub(super) fn admit_isolated(user: &str, source: String) -> Isolated {
        let fork = crate::isolation::fork_id(&source);
        crate::redact::registry().share(user, &source, &fork);
        Isolated::new(source, fork)
    }

    /// Makes the fork `live`'s record names, from the session the task would have used
    /// without it: the source session under the runtime its subagent runs under. `Err` is
    /// the task's error (it cannot run).
    pub(super) async fn make_fork(&self, live: &Arc<LiveTask>, call: &TaskCall) -> Result<Option<Fork>, String> {
        let record = live.record();
        let Some(isolated) = &record.isolation else { return Ok(None) };
        let sandbox = self
            .tools
            .sandbox()
            .map_err(|e| format!("the task runs in a fork of its session, and there is no sandbox: {e}"))?
            .clone();
        let runtime = {
            let snapshot = self.registry.snapshot();
            crate::task::resolve(&snapshot, call).map_err(|e| e.to_string())?.0.runtime.clone()
        };
        let source = warden_sandbox::SessionKey::new(record.user_id.clone(), isolated.forked_from.clone())
            .with_runtime(runtime.clone());
        let fork =
            warden_sandbox::SessionKey::new(record.user_id.clone(), isolated.session_id.clone()).with_runtime(runtime);
        let made = tokio::select! {
            made = crate::isolation::fork(&sandbox, source, fork) => made?,
            () = live.canceled() => return Err("canceled".into()),
        };
        tracing::info!(task_id = %record.task_id, source = %made.source, fork = %made.fork, "task runs in a fork of its session");
        Ok(Some(made))
    }

    /// `finish` with the fork's changes: in the record's `isolation` and after the text its
    /// parent reads (its output, else its error). A canceled task's changes are not worked
    /// out (its fork holds them).
    pub(super) async fn finish_isolated(&self, live: &LiveTask, fork: Option<Fork>, mut finish: Finish) -> Finish {
        let (Some(fork), Some(mut isolated)) = (fork, live.record().isolation) else { return finish };
        if finish.status != TaskState::Canceled
            && let Ok(sandbox) = self.tools.sandbox()
        {
            isolated.changes = Some(fork.changes(sandbox).await);
        }
        // What the fork holds may quote a secret of the session: kept scrubbed, as every
        // record is (paths and the diff are the fork's text).
        isolated = isolated.scrubbed(&live.redactor());
        let note = isolated.note();
        match (&mut finish.output, &mut finish.error) {
            (Some(text), _) | (None, Some(text)) => {
                text.push_str("\n\n");
                text.push_str(&note);
            }
            (None, None) => finish.output = Some(note),
        }
        live.inner.lock().unwrap().record.isolation = Some(isolated);
        finish
    }
}
