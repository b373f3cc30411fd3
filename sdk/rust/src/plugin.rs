//! One trait for the three exported interfaces (`meta`, `resolver`, `executor`) and the
//! [`export!`](crate::export) macro that exports an implementation as the component's
//! world — the same world a plugin exporting the generated traits itself would have.

use std::marker::PhantomData;

use crate::bindings::exports::warden::plugin::{executor, meta, resolver};
use crate::bindings::warden::plugin::types::{
    PluginInfo, SubagentDefinition, SubagentReference, TaskCall, TaskContext,
};
use crate::error::Error;

/// A protocol plugin. Every call runs in a fresh instance: keep nothing in statics
/// between calls (use [`crate::state`]).
pub trait Plugin {
    /// `meta.info`, once at load: name, version, kinds served, capabilities requested.
    fn info() -> PluginInfo;

    /// `resolver.can-resolve`: cheap, no I/O expected.
    fn can_resolve(reference: SubagentReference) -> bool;

    /// `resolver.resolve`: reference → definition. Return `Error::InvalidInput` naming
    /// the field for bad definitions.
    fn resolve(reference: SubagentReference) -> Result<SubagentDefinition, Error>;

    /// `executor.execute`: the task's final text; `Error::InputRequired(question)` pauses
    /// the task until it is resumed.
    fn execute(ctx: TaskContext, call: TaskCall, definition: SubagentDefinition) -> Result<String, Error>;
}

/// The generated `Guest` traits over a [`Plugin`]; what [`export!`](crate::export) exports.
#[doc(hidden)]
pub struct Export<P>(PhantomData<P>);

impl<P: Plugin> meta::Guest for Export<P> {
    fn info() -> PluginInfo {
        P::info()
    }
}

impl<P: Plugin> resolver::Guest for Export<P> {
    fn can_resolve(reference: SubagentReference) -> bool {
        P::can_resolve(reference)
    }

    fn resolve(reference: SubagentReference) -> Result<SubagentDefinition, Error> {
        P::resolve(reference)
    }
}

impl<P: Plugin> executor::Guest for Export<P> {
    fn execute(ctx: TaskContext, call: TaskCall, definition: SubagentDefinition) -> Result<String, Error> {
        P::execute(ctx, call, definition)
    }
}

/// A definition of `reference`'s kind with none of the typed host fields set (every tool,
/// the default permission mode, no MCP servers, no egress narrowing): set those fields on
/// the result when the subagent asks for them.
pub fn definition(
    name: String,
    description: String,
    reference: SubagentReference,
    protocol_data: String,
) -> SubagentDefinition {
    SubagentDefinition {
        name,
        description,
        kind: reference.kind.clone(),
        reference,
        tools: None,
        permission_mode: None,
        mcp_servers: Vec::new(),
        agent_mcp_servers: Vec::new(),
        egress: None,
        protocol_data,
    }
}

/// Exports a [`Plugin`] implementation as the component's `meta`, `resolver` and
/// `executor`: `warden_guest::export!(MyPlugin);`, once, in the plugin's crate.
#[macro_export]
macro_rules! export {
    ($plugin:ty) => {
        const _: () = {
            type WardenGuestExport = $crate::Export<$plugin>;
    $crate::bindings::export_plugin_world!(WardenGuestExport with_types_in $crate::bindings);
        };
    };
}
