//! `resume`: which earlier task a submission continues, and where it runs.
//!
//! The plugin finds what it continues by task id alone (the claude plugin's transcript
//! under `transcript/<task-id>` in the task store), so the engine checks the id first: it
//! must name a task of the same user and subagent, or one tenant would continue
//! another's. A resumed task runs in the **session** of the task it continues — the same
//! sandbox, so the files the conversation talks about are there: without `session_id` it
//! gets that session; a different `session_id` is refused (a conversation moved to another
//! sandbox would refer to files that are not there).

use super::{DEFAULT_USER, Engine, Submission, SubmitError};

impl Engine {
    /// The session `sub` must run in because it resumes a task (`None` without `resume`).
    /// Refuses a `resume` that is not one of this user's tasks of this subagent
    /// ([`SubmitError::UnknownResume`], the same for another user's task as for none), and
    /// a `session_id` other than that task's ([`SubmitError::InvalidField`] naming it).
    pub(super) async fn resumed_session(&self, sub: &Submission) -> Result<Option<String>, SubmitError> {
        let Some(resume) = &sub.call.resume else { return Ok(None) };
        let user = sub.user_id.as_deref().unwrap_or(DEFAULT_USER);
        let resumed = self
            .get(resume)
            .await
            .ok()
            .flatten()
            .filter(|r| r.user_id == user && r.subagent_type == sub.call.subagent_type);
        let Some(resumed) = resumed else {
            return Err(SubmitError::UnknownResume(
                crate::text::escape_control(&resume.chars().take(128).collect::<String>()).into_owned(),
            ));
        };
        match &sub.session_id {
            Some(given) if *given != resumed.session_id => Err(SubmitError::InvalidField {
                field: "session_id",
                message: format!(
                    "task {} ran in session {expected}, and a resumed task runs in the session of the task it \
                     continues: omit session_id or pass {expected}",
                    resumed.task_id,
                    expected = resumed.session_id
                ),
            }),
            _ => Ok(Some(resumed.session_id)),
        }
    }
}
