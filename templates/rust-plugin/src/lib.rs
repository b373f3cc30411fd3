//! A minimal warden protocol plugin: serves kind `TEMPLATE`, resolves any reference of
//! that kind to a definition named after the URI's last segment, and answers a task
//! with the upper-cased prompt. Replace the three `impl` blocks with your protocol.

wit_bindgen::generate!({
    // Point this at the `wit/` folder of the warden version you target.
    path: "../../wit",
    world: "plugin",
});

use exports::warden::plugin::{executor, meta, resolver};
use warden::plugin::log;
use warden::plugin::types::{
    Capability, Error, PluginInfo, SubagentDefinition, SubagentReference, TaskCall, TaskContext,
};

struct Plugin;

impl meta::Guest for Plugin {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "rust-plugin".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            kinds: vec!["TEMPLATE".into()],
            // Ask only for what you use; the operator grants at most this.
            capabilities: vec![Capability::Log],
        }
    }
}

impl resolver::Guest for Plugin {
    fn can_resolve(reference: SubagentReference) -> bool {
        reference.kind == "TEMPLATE"
    }

    fn resolve(reference: SubagentReference) -> Result<SubagentDefinition, Error> {
        let name = reference.uri.rsplit(['/', ':']).next().unwrap_or_default().to_string();
        if name.is_empty() {
            return Err(Error::InvalidInput(format!("uri {:?} has no name segment", reference.uri)));
        }
        Ok(SubagentDefinition {
            name,
            description: "Shouts the prompt back".into(),
            kind: reference.kind.clone(),
            reference,
            protocol_data: "{}".into(),
        })
    }
}

impl executor::Guest for Plugin {
    fn execute(ctx: TaskContext, call: TaskCall, _def: SubagentDefinition) -> Result<String, Error> {
        // A denied capability is an error value, never a trap: ignoring it is fine for logs.
        let _ = log::write(log::Level::Info, &format!("task {} started", ctx.task_id));
        if call.prompt.is_empty() {
            return Err(Error::InvalidInput("prompt is empty".into()));
        }
        Ok(call.prompt.to_uppercase())
    }
}

export!(Plugin);
