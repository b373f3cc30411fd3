//! `echo` test plugin: returns the prompt, exercising `log`, `events` and `state`.
//!
//! - kinds `["ECHO"]`, capabilities `log`, `events`, `state`;
//! - a prompt `state:<value>` stores `<value>` under key `k`, reads it back and
//!   returns what was read (errors propagate as `Err`);
//! - built with `--features v2` it reports version `0.2.0` and prefixes results
//!   with `v2: ` (hot-swap tests).

wit_bindgen::generate!({
    path: "../../../wit/0.1.0",
    world: "plugin",
});

use exports::warden::plugin::{executor, meta, resolver};
use warden::plugin::types::{
    Capability, Error, PluginInfo, SubagentDefinition, SubagentReference, TaskCall, TaskContext,
};
use warden::plugin::{events, log, state};

const VERSION: &str = if cfg!(feature = "v2") { "0.2.0" } else { "0.1.0" };
const PREFIX: &str = if cfg!(feature = "v2") { "v2: " } else { "" };

struct Echo;

impl meta::Guest for Echo {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "echo".into(),
            version: VERSION.into(),
            kinds: vec!["ECHO".into()],
            capabilities: vec![Capability::Log, Capability::Events, Capability::State],
        }
    }
}

fn metadata<'a>(reference: &'a SubagentReference, key: &str) -> Option<&'a str> {
    reference.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// The last segment of a URI, after the last `/` or `:`.
fn last_segment(uri: &str) -> &str {
    uri.rsplit(['/', ':']).next().unwrap_or(uri)
}

impl resolver::Guest for Echo {
    fn can_resolve(reference: SubagentReference) -> bool {
        reference.kind == "ECHO"
    }

    fn resolve(reference: SubagentReference) -> Result<SubagentDefinition, Error> {
        let name = metadata(&reference, "name").unwrap_or_else(|| last_segment(&reference.uri)).to_string();
        let description = metadata(&reference, "description").unwrap_or("Echoes the prompt back").to_string();
        Ok(SubagentDefinition {
            name,
            description,
            kind: reference.kind.clone(),
            reference,
            protocol_data: "{}".into(),
        })
    }
}

impl executor::Guest for Echo {
    fn execute(ctx: TaskContext, call: TaskCall, _definition: SubagentDefinition) -> Result<String, Error> {
        let _ = log::write(log::Level::Info, &format!("echo executing {}", ctx.task_id));
        let _ = events::emit("progress", &serde_json::json!({ "message": "echoing" }).to_string());
        let output = match call.prompt.strip_prefix("state:") {
            Some(value) => {
                state::set("k", value.as_bytes())?;
                let stored = state::get("k")?.unwrap_or_default();
                String::from_utf8_lossy(&stored).into_owned()
            }
            None => call.prompt,
        };
        Ok(format!("{PREFIX}{output}"))
    }
}

export!(Echo);
