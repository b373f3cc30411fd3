//! `warden:plugin@0.3.0`, the current version (`wit/0.3.0/`): the bindings every host
//! import is implemented against (`runtime/host/*.rs`) and the conversions between its
//! records and [`crate::plugin`] types.

use crate::capability::Capability;
use crate::plugin::{AgentMcpServer, GuestError, PluginInfo, SubagentDefinition, SubagentReference, TaskCall};

bindgen_plugin_world!("../wit/0.3.0");

pub(crate) use warden::plugin::types;
pub(crate) use warden::plugin::{cancel, clock, events, http, log, model, resources, state, tools};

impl From<types::Capability> for Capability {
    fn from(c: types::Capability) -> Self {
        match c {
            types::Capability::Log => Capability::Log,
            types::Capability::Http => Capability::Http,
            types::Capability::Model => Capability::Model,
            types::Capability::Tools => Capability::Tools,
            types::Capability::Events => Capability::Events,
            types::Capability::State => Capability::State,
            types::Capability::Resources => Capability::Resources,
        }
    }
}

impl From<types::Error> for GuestError {
    fn from(e: types::Error) -> Self {
        match e {
            types::Error::NotFound(m) => GuestError::NotFound(m),
            types::Error::InvalidInput(m) => GuestError::InvalidInput(m),
            types::Error::Denied(m) => GuestError::Denied(m),
            types::Error::Timeout(m) => GuestError::Timeout(m),
            types::Error::Remote(m) => GuestError::Remote(m),
            types::Error::Unavailable(m) => GuestError::Unavailable(m),
            types::Error::InputRequired(m) => GuestError::InputRequired(m),
            types::Error::Internal(m) => GuestError::Internal(m),
            types::Error::Canceled(m) => GuestError::Canceled(m),
        }
    }
}

pub(crate) fn from_wit_info(i: types::PluginInfo) -> PluginInfo {
    PluginInfo {
        name: i.name,
        version: i.version,
        kinds: i.kinds,
        capabilities: i.capabilities.into_iter().map(Capability::from).collect(),
    }
}

pub(crate) fn to_wit_reference(r: &SubagentReference) -> types::SubagentReference {
    types::SubagentReference {
        uri: r.uri.clone(),
        kind: r.kind.clone(),
        metadata: r.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    }
}

pub(crate) fn from_wit_reference(r: types::SubagentReference) -> SubagentReference {
    SubagentReference { uri: r.uri, kind: r.kind, metadata: r.metadata.into_iter().collect() }
}

pub(crate) fn to_wit_call(c: &TaskCall) -> types::TaskCall {
    types::TaskCall {
        description: c.description.clone(),
        prompt: c.prompt.clone(),
        subagent_type: c.subagent_type.clone(),
        model: c.model.clone(),
        resume: c.resume.clone(),
        run_in_background: c.run_in_background,
    }
}

fn to_wit_mode(m: warden_approval::PermissionMode) -> types::PermissionMode {
    use warden_approval::PermissionMode as M;
    match m {
        M::Default => types::PermissionMode::Default,
        M::AcceptEdits => types::PermissionMode::AcceptEdits,
        M::Plan => types::PermissionMode::Plan,
        M::DontAsk => types::PermissionMode::DontAsk,
        M::BypassPermissions => types::PermissionMode::BypassPermissions,
    }
}

fn from_wit_mode(m: types::PermissionMode) -> warden_approval::PermissionMode {
    use warden_approval::PermissionMode as M;
    match m {
        types::PermissionMode::Default => M::Default,
        types::PermissionMode::AcceptEdits => M::AcceptEdits,
        types::PermissionMode::Plan => M::Plan,
        types::PermissionMode::DontAsk => M::DontAsk,
        types::PermissionMode::BypassPermissions => M::BypassPermissions,
    }
}

pub(crate) fn to_wit_definition(d: &SubagentDefinition) -> types::SubagentDefinition {
    types::SubagentDefinition {
        name: d.name.clone(),
        description: d.description.clone(),
        kind: d.kind.clone(),
        reference: to_wit_reference(&d.reference),
        tools: d.tools.clone(),
        permission_mode: d.permission_mode.map(to_wit_mode),
        mcp_servers: d.mcp_servers.clone(),
        agent_mcp_servers: d.agent_mcp_servers.iter().map(to_wit_agent_server).collect(),
        egress: d.egress.clone(),
        protocol_data: d.protocol_data.clone(),
    }
}

pub(crate) fn from_wit_definition(d: types::SubagentDefinition) -> SubagentDefinition {
    SubagentDefinition {
        name: d.name,
        description: d.description,
        kind: d.kind,
        reference: from_wit_reference(d.reference),
        tools: d.tools,
        permission_mode: d.permission_mode.map(from_wit_mode),
        mcp_servers: d.mcp_servers,
        agent_mcp_servers: d.agent_mcp_servers.into_iter().map(from_wit_agent_server).collect(),
        egress: d.egress,
        // Read from the reference's metadata by the registry (no WIT field).
        isolation: None,
        protocol_data: d.protocol_data,
    }
}

fn to_wit_agent_server(s: &AgentMcpServer) -> types::AgentMcpServer {
    types::AgentMcpServer {
        name: s.name.clone(),
        command: s.command.clone(),
        args: s.args.clone(),
        env: s.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    }
}

fn from_wit_agent_server(s: types::AgentMcpServer) -> AgentMcpServer {
    AgentMcpServer { name: s.name, command: s.command, args: s.args, env: s.env }
}
