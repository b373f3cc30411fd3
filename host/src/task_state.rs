//! Where a task is in its life and why it ended: [`TaskState`] and [`FinishReason`], the
//! typed values behind the record's `status` / `finish_reason`, the stream's `status` and
//! `finish` events and every API's status field (all spelled in snake_case on the wire
//! and in the store, so records written before these types existed read the same).
//! This module holds data only.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A task's state (DESIGN: task states).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Accepted, waiting for a slot.
    Submitted,
    /// Its plugin call runs.
    Working,
    /// Waiting on a person: an approval while it runs, or (finished) the subagent's question.
    InputRequired,
    Completed,
    Failed,
    Canceled,
}

impl TaskState {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Submitted => "submitted",
            TaskState::Working => "working",
            TaskState::InputRequired => "input_required",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Canceled => "canceled",
        }
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The subagent finished its work.
    Stop,
    /// It reached `max_tool_iterations`.
    ToolLimit,
    Canceled,
    /// `server.task_timeout` passed.
    Deadline,
    Error,
    /// The subagent asked the parent a question.
    InputRequired,
    /// The host stopped while the task ran (found on the next start).
    HostRestarted,
    /// The replica running the task stopped renewing its lease (it died or lost the
    /// database); another replica ended the task.
    ReplicaLost,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::ToolLimit => "tool_limit",
            FinishReason::Canceled => "canceled",
            FinishReason::Deadline => "deadline",
            FinishReason::Error => "error",
            FinishReason::InputRequired => "input_required",
            FinishReason::HostRestarted => "host_restarted",
            FinishReason::ReplicaLost => "replica_lost",
        }
    }
}

impl fmt::Display for FinishReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire and store spelling is `as_str`, both ways, for every value.
    #[test]
    fn serde_spelling_is_as_str() {
        use TaskState::*;
        for s in [Submitted, Working, InputRequired, Completed, Failed, Canceled] {
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
            assert_eq!(serde_json::from_value::<TaskState>(s.as_str().into()).unwrap(), s);
        }
        use FinishReason as R;
        for r in [
            R::Stop,
            R::ToolLimit,
            R::Canceled,
            R::Deadline,
            R::Error,
            R::InputRequired,
            R::HostRestarted,
            R::ReplicaLost,
        ] {
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
            assert_eq!(serde_json::from_value::<FinishReason>(r.as_str().into()).unwrap(), r);
        }
    }
}
