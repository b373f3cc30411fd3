//! The plugin's exports and [`runner::Host`] over the host imports (wasm32 only). No logic
//! lives here: it hands the calls to the crate's pure modules.

use warden_guest::log::Level;
use warden_guest::{
    AgentMcpServer, Capability, Completion, CompletionRequest, Error, PermissionMode, Plugin, PluginInfo,
    SubagentDefinition, SubagentReference, TaskCall, TaskContext, ToolCall, ToolResult, ToolSpec, events, log, model,
    resources, state,
};

use crate::{KIND, agent, runner};

struct Claude;

impl Plugin for Claude {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "claude".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            kinds: vec![KIND.into()],
            capabilities: vec![
                Capability::Log,
                Capability::Model,
                Capability::Tools,
                Capability::Events,
                Capability::State,
                Capability::Resources,
            ],
        }
    }

    fn can_resolve(reference: SubagentReference) -> bool {
        reference.kind.eq_ignore_ascii_case(KIND) && !reference.uri.trim().is_empty()
    }

    fn resolve(reference: SubagentReference) -> Result<SubagentDefinition, Error> {
        let bytes = resources::read(&reference.uri).map_err(|e| e.context(&reference.uri))?;
        let mut parsed = agent::parse_agent(&reference.uri, &bytes, &reference.metadata)?;
        // An agent of a Claude Code plugin (`subagents.plugin_dirs`) gets the plugin's hooks and MCP servers.
        let plugin_file = |key: &str| reference.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        agent::apply_plugin_files(
            &mut parsed,
            plugin_file(agent::PLUGIN_HOOKS_METADATA),
            plugin_file(agent::PLUGIN_MCP_METADATA),
        );
        // The host lists what is logged here as the file's problems in `warden agents`.
        for warning in &parsed.warnings {
            log::warn(&format!("{}: {warning}", reference.uri));
        }
        let parsed = parsed.registrable(&reference.uri)?;
        // What the host acts on goes in the typed fields; the rest is this plugin's own.
        let (mode, _) = parsed.protocol.permission_mode();
        let mut reference = reference;
        if parsed.protocol.background && !reference.metadata.iter().any(|(k, _)| k == agent::BACKGROUND_METADATA) {
            // WIT (0.2.0, 0.3.0) has no typed fields for these: the host reads the metadata keys.
            reference.metadata.push((agent::BACKGROUND_METADATA.into(), "true".into()));
        }
        if let Some(effort) = &parsed.protocol.effort
            && !reference.metadata.iter().any(|(k, _)| k == agent::EFFORT_METADATA)
        {
            reference.metadata.push((agent::EFFORT_METADATA.into(), effort.clone()));
        }
        if let Some(isolation) = parsed.protocol.isolation {
            // The host's name for it, in place of an operator's entry (whose one accepted
            // value is the same).
            reference.metadata.retain(|(k, _)| k != agent::ISOLATION_METADATA);
            reference.metadata.push((agent::ISOLATION_METADATA.into(), isolation.host_name().into()));
        }
        let patterns = agent::disallowed_patterns(&parsed.protocol);
        if !patterns.is_empty() {
            // Added to what the operator's reference lists, never in place of it.
            let key = agent::DISALLOWED_TOOLS_METADATA;
            let mut rules: Vec<String> = match reference.metadata.iter().position(|(k, _)| k == key) {
                Some(i) => serde_json::from_str(&reference.metadata.remove(i).1).map_err(|e| {
                    Error::InvalidInput(format!("{}: metadata `{key}` is not a JSON list ({e})", reference.uri))
                })?,
                None => Vec::new(),
            };
            rules.extend(patterns);
            reference.metadata.push((key.into(), serde_json::to_string(&rules).expect("a list serialises")));
        }
        Ok(SubagentDefinition {
            name: parsed.name,
            description: parsed.description,
            kind: KIND.into(),
            tools: agent::host_tools(&parsed.protocol),
            permission_mode: mode.map(|m| match m {
                agent::PermissionMode::Default => PermissionMode::Default,
                agent::PermissionMode::AcceptEdits => PermissionMode::AcceptEdits,
                agent::PermissionMode::Plan => PermissionMode::Plan,
                agent::PermissionMode::DontAsk => PermissionMode::DontAsk,
                agent::PermissionMode::BypassPermissions => PermissionMode::BypassPermissions,
            }),
            mcp_servers: parsed.protocol.mcp_server_names(),
            agent_mcp_servers: parsed
                .protocol
                .inline_mcp_servers()
                .0
                .into_iter()
                .map(|s| AgentMcpServer { name: s.name, command: s.command, args: s.args, env: s.env })
                .collect(),
            egress: parsed.protocol.egress.clone(),
            protocol_data: parsed.protocol.to_json(),
            reference,
        })
    }

    fn execute(ctx: TaskContext, call: TaskCall, definition: SubagentDefinition) -> Result<String, Error> {
        let task = runner::TaskInput {
            task_id: ctx.task_id,
            prompt: call.prompt,
            model: call.model,
            resume: call.resume,
            session_id: ctx.session_id,
        };
        let agent = runner::AgentInput {
            name: definition.name,
            uri: definition.reference.uri,
            protocol_data: definition.protocol_data,
        };
        runner::run(&mut Imports, &task, &agent)
    }
}

/// [`runner::Host`] over the imports.
struct Imports;

impl runner::Host for Imports {
    fn complete(&mut self, request: &CompletionRequest) -> Result<Completion, Error> {
        model::complete(request)
    }

    fn list_tools(&mut self) -> Result<Vec<ToolSpec>, Error> {
        model::list_tools()
    }

    fn call_tools(&mut self, calls: &[ToolCall]) -> Result<Vec<ToolResult>, Error> {
        model::call_tools(calls)
    }

    fn state_get(&mut self, key: &str) -> Result<Option<Vec<u8>>, Error> {
        state::get(key)
    }

    fn state_set(&mut self, key: &str, value: &[u8]) -> Result<(), Error> {
        state::set(key, value)
    }

    fn emit(&mut self, kind: &str, data: &str) {
        let _ = events::emit_raw(kind, data);
    }

    fn log(&mut self, level: Level, message: &str) {
        let _ = log::write(level, message);
    }

    fn read_resource(&mut self, uri: &str) -> Result<Vec<u8>, Error> {
        resources::read(uri)
    }
}

warden_guest::export!(Claude);
