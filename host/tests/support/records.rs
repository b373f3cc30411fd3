//! Task records for store tests, shared by the test binaries (`host`, `api`).

use warden::store::{FinishReason, TaskRecord, TaskState};

/// A record of the `greeter` subagent: completed ones hold the output "kept".
pub fn record(id: &str, status: TaskState, finished: Option<u64>) -> TaskRecord {
    TaskRecord {
        task_id: id.into(),
        status,
        subagent_type: "greeter".into(),
        description: "d".into(),
        session_id: "s".into(),
        user_id: "u".into(),
        principal: Some("alice".into()),
        plugin: None,
        replica: None,
        parent_task_id: None,
        isolation: None,
        background: true,
        output: (status == TaskState::Completed).then(|| "kept".into()),
        error: None,
        finish_reason: finished.map(|_| FinishReason::Stop),
        created_at_ms: 1,
        updated_at_ms: 1,
        finished_at_ms: finished,
    }
}
