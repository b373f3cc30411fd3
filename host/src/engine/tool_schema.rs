//! The Task and TaskOutput tool definitions a parent agent registers, built from the
//! registry's subagents. Data only: the CLI (`warden tool-schema`) and the API
//! (`GET /v1/tools`) present it.

use serde_json::{Value, json};

/// The Task and TaskOutput tool definitions a parent agent registers (`warden
/// tool-schema`, `GET /v1/tools`): JSON schema plus a description listing the
/// subagents this host serves.
pub fn tool_schema(snapshot: &crate::registry::Snapshot) -> Value {
    let registrations = snapshot.registrations();
    let task_description = format!(
        "Launch a subagent to handle a task on its own. The subagent works in its own context \
         (and, for file and shell work, in a sandbox of this session) and returns one final text result.\n\n\
         Available subagent types and what they are for:\n{}\n\
         Give a short `description` (3-5 words) and a complete, self-contained `prompt`: the subagent \
         does not see this conversation. Set `run_in_background` to get a task id at once and collect \
         the result later with TaskOutput.",
        if registrations.is_empty() { "(none loaded)\n".to_string() } else { registrations }
    );
    let names: Vec<&String> = snapshot.definitions.keys().collect();
    json!([
        {
            "name": "Task",
            "description": task_description,
            "input_schema": {
                "type": "object",
                "properties": {
                    "description": { "type": "string", "maxLength": crate::task::MAX_DESCRIPTION_BYTES, "description": "A short (3-5 word) description of the task" },
                    "prompt": { "type": "string", "description": "The task for the subagent to perform" },
                    "subagent_type": { "type": "string", "enum": names, "description": "The type of subagent to use" },
                    "model": { "type": "string", "description": "Optional model alias or provider/model for the subagent" },
                    "resume": { "type": "string", "description": "Optional id of an earlier subagent run to continue" },
                    "run_in_background": { "type": "boolean", "description": "Return a task id at once; fetch the result with TaskOutput. Absent: the subagent's default (waits for the result unless its definition says background)" },
                    "isolation": isolation_property()
                },
                "required": ["description", "prompt", "subagent_type"],
                "additionalProperties": false
            }
        },
        {
            "name": "TaskOutput",
            "description": "Get the status and result of a task started with run_in_background. By default waits \
                            (block=true) up to timeout ms (default 30000, at most 600000) for it to finish. \
                            Status is one of submitted, working, input_required, completed, failed, canceled.",
            "input_schema": {
                "type": "object",
                "properties": {
                    "task_id": { "type": "string", "description": "The task id returned by Task" },
                    "block": { "type": "boolean", "default": true, "description": "Wait for the task to finish" },
                    "timeout": { "type": "integer", "minimum": 0, "maximum": 600000, "default": 30000, "description": "Longest wait in milliseconds" }
                },
                "required": ["task_id"],
                "additionalProperties": false
            }
        }
    ])
}

/// The `isolation` input of the Task tool and of the MCP subagent tools.
pub fn isolation_property() -> Value {
    json!({
        "type": "string",
        "enum": crate::plugin::Isolation::ACCEPTED,
        "description": "\"fork\": run in a fork of the session (a copy of its workspace); the result names the fork and lists what changed there, and nothing flows back. Absent: as the subagent's definition says"
    })
}
