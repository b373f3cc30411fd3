//! A minimal warden protocol plugin: serves kind `TEMPLATE`, resolves any reference of
//! that kind to a definition named after `metadata.name` or the URI's last segment, and
//! answers a task with the upper-cased prompt. Replace the `impl Plugin` block with your
//! protocol; `warden_guest` (the SDK) has the error type and the host helpers.

use warden_guest::{
    Capability, Error, Metadata, Plugin, PluginInfo, SubagentDefinition, SubagentReference, TaskCall, TaskContext, log,
};

struct Template;

impl Plugin for Template {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "rust-plugin".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            kinds: vec!["TEMPLATE".into()],
            // Ask only for what you use; the operator grants at most this.
            capabilities: vec![Capability::Log],
        }
    }

    fn can_resolve(reference: SubagentReference) -> bool {
        reference.kind == "TEMPLATE"
    }

    fn resolve(reference: SubagentReference) -> Result<SubagentDefinition, Error> {
        let meta = Metadata::new(&reference.metadata);
        let name = match meta.get("name") {
            Some(name) => name.to_string(),
            None => reference.uri.trim_end_matches('/').rsplit(['/', ':']).next().unwrap_or_default().to_string(),
        };
        if name.is_empty() {
            return Err(Error::InvalidInput(format!("uri {:?} has no name segment", reference.uri)));
        }
        // The typed fields (`tools`, `permission_mode`, `mcp_servers`, `egress`) start unset;
        // set them on the result when the subagent asks the host for them.
        let description = meta.get("description").unwrap_or("Shouts the prompt back").to_string();
        Ok(warden_guest::definition(name, description, reference, "{}".into()))
    }

    fn execute(ctx: TaskContext, call: TaskCall, _definition: SubagentDefinition) -> Result<String, Error> {
        // Logging is best effort: without the `log` grant the line is dropped, the task goes on.
        log::info(&format!("task {} started", ctx.task_id));
        if call.prompt.is_empty() {
            return Err(Error::InvalidInput("prompt is empty".into()));
        }
        Ok(call.prompt.to_uppercase())
    }
}

warden_guest::export!(Template);
