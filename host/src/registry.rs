//! The registry: loaded plugins → kinds → subagent definitions.
//!
//! Plugins come from the plugin directory ([`crate::plugin_dir`]); each serves the
//! kinds its `plugin-info` declares. A kind claimed by more than one plugin goes to the
//! first of them in `plugins.priority`. Without such an entry nobody takes a kind from
//! the plugin serving it: on a reload the current owner keeps it, and a kind that had
//! no owner stays unserved and is reported as an error (ambiguous) — a plugin's file
//! name or arrival order never decides. Losers are reported as "shadowed". References from
//! `subagents.references` (and agent files as `CLAUDE` references) are resolved by the
//! first plugin of their kind whose `can-resolve` accepts; definitions are keyed by
//! name and the first one wins a name collision (reported). A definition keeps only the
//! operator MCP servers its plugin is granted (`plugins.grants.<id>.mcp_servers`); each
//! other name it gives is a problem.
//!
//! The registry publishes immutable snapshots: readers never wait on a reload, and a
//! call in flight keeps the plugin version it started with. It must never run a task.
//!
//! No rollback from the directory: a file whose signed version is lower than the highest
//! signed version this process loaded for its id (or an unsigned file where a signed one
//! was loaded) is refused unless `plugins.pins` pins it — the rule `warden plugin pull`
//! applies, through the same [`crate::provenance::check_not_older`]. The floor lives in
//! memory: a restart starts from what the directory holds then.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use serde::Serialize;

use crate::capability::Capability;
use crate::config::Config;
use crate::plugin::{SubagentDefinition, SubagentReference};
use crate::runtime::{LoadedPlugin, Runtime};

/// A file in the plugin directory that could not be loaded.
#[derive(Debug, Clone, Serialize)]
pub struct InvalidPlugin {
    pub id: String,
    pub source: PathBuf,
    pub error: String,
}

/// A definition and where it came from.
#[derive(Debug, Clone, Serialize)]
pub struct Registered {
    #[serde(flatten)]
    pub definition: SubagentDefinition,
    /// The plugin id that resolved it (and executes it).
    pub plugin: String,
    /// The reference URI it was resolved from.
    pub source: String,
    /// The definition's own egress list (its typed `egress`, e.g. from an agent file's
    /// frontmatter), validated: its tool calls reach at most these hosts.
    #[serde(skip)]
    pub egress: Option<Arc<warden_sandbox::EgressNarrowing>>,
    /// Its tasks run in the background when the caller does not say (see [`BACKGROUND_METADATA`]).
    pub background: bool,
    /// How hard its model calls should think (see [`EFFORT_METADATA`]); providers without a
    /// reasoning setting ignore it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub effort: Option<warden_models::ReasoningEffort>,
    /// The name its source gave, when that could not be a name here and the definition is
    /// registered under the id derived from it ([`crate::plugin::safe_subagent_id`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub declared_name: Option<String>,
    /// The container runtime its tasks' sandbox sessions run under when the operator put it
    /// under another than `sandbox.runtime` ([`sandbox_runtime`]); `None`: the default.
    #[serde(rename = "sandbox_runtime", skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
}

/// The runtime `sandbox.runtime_overrides` puts the tasks of a definition under: the entry
/// of the deepest `agent_dir` holding its source file, else the entry of its `plugin`; `None`
/// when no entry applies or the entry's runtime is `sandbox.runtime` anyway (the session is
/// then the task's ordinary one).
fn sandbox_runtime(config: &Config, plugin: &str, source: &str) -> Option<String> {
    let overrides = &config.sandbox.runtime_overrides;
    let file = Path::new(source).canonicalize().ok();
    let by_dir = overrides
        .iter()
        .filter_map(|o| {
            let dir = config.path(o.agent_dir.as_ref()?).canonicalize().ok()?;
            file.as_ref().filter(|f| f.starts_with(&dir)).map(|_| (dir.components().count(), &o.runtime))
        })
        .max_by_key(|(depth, _)| *depth)
        .map(|(_, runtime)| runtime);
    let chosen =
        by_dir.or_else(|| overrides.iter().find(|o| o.plugin.as_deref() == Some(plugin)).map(|o| &o.runtime))?;
    (config.sandbox.runtime.as_ref() != Some(chosen)).then(|| chosen.clone())
}

/// The reference metadata key by which a definition's tasks run in the background when the
/// caller does not say (`run_in_background` absent): `true` or `false`. The operator's
/// reference sets it, or the plugin in the definition it returns (a Claude agent file's
/// `background: true`); the WIT has no typed field for it. The operator's value wins.
pub const BACKGROUND_METADATA: &str = "background";

/// Whether `def`'s tasks run in the background by default (see [`BACKGROUND_METADATA`]);
/// a value other than `true`/`false` is a problem and means no.
fn runs_in_background(operator: &BTreeMap<String, String>, def: &SubagentDefinition) -> Result<bool, String> {
    let value = operator.get(BACKGROUND_METADATA).or_else(|| def.reference.metadata.get(BACKGROUND_METADATA));
    match value.map(|v| v.trim()) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(format!(
            "metadata `{BACKGROUND_METADATA}: {}` ignored (expected true or false)",
            crate::text::escape_control(&other.chars().take(64).collect::<String>())
        )),
    }
}

/// The reference metadata key by which a definition asks for a reasoning effort for its
/// model calls: `low`, `medium`, `high`, `xhigh` or `max` (a Claude agent file's `effort`).
/// Like [`BACKGROUND_METADATA`], the operator's reference or the plugin's definition sets
/// it (the WIT has no typed field for it) and the operator's value wins. The host hands it
/// to every model call of the definition's tasks; a provider without a reasoning setting
/// ignores it (`warden agents` notes which).
pub const EFFORT_METADATA: &str = "effort";

/// `def`'s reasoning effort (see [`EFFORT_METADATA`]); another value is a problem and means none.
fn reasoning_effort(
    operator: &BTreeMap<String, String>,
    def: &SubagentDefinition,
) -> Result<Option<warden_models::ReasoningEffort>, String> {
    let Some(value) = operator.get(EFFORT_METADATA).or_else(|| def.reference.metadata.get(EFFORT_METADATA)) else {
        return Ok(None);
    };
    warden_models::ReasoningEffort::parse(value).map(Some).ok_or_else(|| {
        format!(
            "metadata `{EFFORT_METADATA}: {}` ignored (expected low, medium, high, xhigh or max)",
            crate::text::escape_control(&value.chars().take(64).collect::<String>())
        )
    })
}

/// For `warden agents`: one note per definition with a reasoning effort, saying which
/// configured providers send it (and as what) and which ignore it for want of a reasoning
/// setting. The host does not know which model a definition's plugin will ask for, so every
/// provider is named.
pub fn effort_notes(snapshot: &Snapshot, models: Option<&warden_models::ModelRouter>) -> Vec<RegistryProblem> {
    let (mut sending, mut ignoring) = (Vec::new(), Vec::new());
    for (name, provider) in models.into_iter().flat_map(|m| m.providers()) {
        match provider.reasoning_setting() {
            Some(field) => sending.push(format!("{name} (as `{field}`)")),
            None => ignoring.push(name.to_string()),
        }
    }
    let mut notes = Vec::new();
    for r in snapshot.definitions.values() {
        let Some(effort) = r.effort else { continue };
        let mut text = format!("subagent {:?}: effort `{effort}`", r.definition.name);
        if sending.is_empty() && ignoring.is_empty() {
            text.push_str(" has no effect: no model providers are configured");
        } else {
            if !sending.is_empty() {
                text.push_str(&format!(" is sent by {}", sending.join(", ")));
            }
            if !ignoring.is_empty() {
                let verb = if sending.is_empty() { " is ignored by" } else { "; ignored by" };
                text.push_str(&format!("{verb} {} (no reasoning setting)", ignoring.join(", ")));
            }
        }
        notes.push(RegistryProblem::warning(r.source.clone(), text));
    }
    notes
}

/// For `warden agents`: one note per definition asking for `bypassPermissions` while the
/// operator has not set `approval.allow_bypass`: the mode is accepted, but the gate applies
/// it as `acceptEdits` at most, so what the policy marks `ask` (edits aside) is still
/// asked, which the file's author may not expect.
pub fn bypass_notes(snapshot: &Snapshot, allow_bypass: bool) -> Vec<RegistryProblem> {
    if allow_bypass {
        return Vec::new();
    }
    snapshot
        .definitions
        .values()
        .filter(|r| r.definition.permission_mode == Some(warden_approval::PermissionMode::BypassPermissions))
        .map(|r| {
            RegistryProblem::warning(
                r.source.clone(),
                format!(
                    "subagent {:?}: permissionMode `bypassPermissions` needs `approval.allow_bypass: true` (and `approval.max_mode: bypassPermissions`); without it the mode is applied as `acceptEdits`, so calls the policy marks `ask` (edits aside) are still asked",
                    r.definition.name
                ),
            )
        })
        .collect()
}

/// The definition's `egress` list (`sandbox.egress.allow` patterns), validated.
fn definition_egress(def: &SubagentDefinition) -> Result<Option<Arc<warden_sandbox::EgressNarrowing>>, String> {
    let Some(list) = &def.egress else { return Ok(None) };
    warden_sandbox::EgressNarrowing::parse(list, format!("subagent {:?} (egress)", def.name)).map(|n| Some(Arc::new(n)))
}

/// The MCP servers a subagent defines itself that it may use, and one problem per server
/// it may not: all of them while the operator has not allowed agent-defined servers
/// (`subagents.allow_agent_mcp_servers`), else each that is not a valid stdio entry
/// ([`crate::config::mcp::agent_server_config`]), takes an operator server's name (whose
/// rules and `mcpServers` references mean the operator's server), or repeats a name.
fn admit_agent_mcp_servers(
    config: &Config,
    servers: Vec<crate::plugin::AgentMcpServer>,
) -> (Vec<crate::plugin::AgentMcpServer>, Vec<String>) {
    let (mut admitted, mut refused) = (Vec::new(), Vec::new());
    for server in servers {
        let name = crate::text::escape_control(&server.name).into_owned();
        let why = if !config.subagents.allow_agent_mcp_servers {
            Some(
                "agent-defined servers are off (`subagents.allow_agent_mcp_servers`); warden runs only the operator's \
                 servers (`mcp_servers` in warden.yaml), so configure it there and name it in `mcpServers`"
                    .to_owned(),
            )
        } else if config.mcp_servers.contains_key(&server.name) {
            Some(
                "an operator-configured server has this name; name the operator's server in `mcpServers` instead"
                    .into(),
            )
        } else if admitted.iter().any(|a: &crate::plugin::AgentMcpServer| a.name == server.name) {
            Some("the name is defined twice".into())
        } else {
            crate::config::mcp::agent_server_config(&server).err()
        };
        match why {
            None => admitted.push(server),
            // The problem's source is the subagent's file: the text names the entry.
            Some(why) => refused.push(format!("inline MCP server `{name}` in `mcpServers` refused: {why}")),
        }
    }
    (admitted, refused)
}

/// The operator's MCP servers a definition names that its plugin may reach, in order and
/// each once, and one problem per name it may not
/// ([`crate::capability::Grants::check_mcp_server`]): the plugin wrote the list, whatever
/// its agent file says, so a name is a request the operator's grant decides.
fn granted_mcp_servers(
    grants: &crate::capability::Grants,
    subagent: &str,
    named: Vec<String>,
) -> (Vec<String>, Vec<String>) {
    let (mut granted, mut refused): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
    for server in named {
        if granted.contains(&server) {
            continue;
        }
        match grants.check_mcp_server(&server) {
            Ok(()) => granted.push(server),
            Err(denied) => refused.push(format!("subagent {subagent:?}: {denied}; its tools are not offered")),
        }
    }
    (granted, refused)
}

/// One problem found while building definitions, for `warden agents` and logs.
#[derive(Debug, Clone, Serialize)]
pub struct RegistryProblem {
    pub source: String,
    pub message: String,
    /// A configuration error (not just a warning): `warden config check` fails on it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub error: bool,
}

/// Longest message of a [`RegistryProblem`] (and of its source): a problem quotes what a
/// plugin, its peer or an agent file said, which has no bound of its own here; a
/// screenful is enough to say what is wrong.
pub const MAX_PROBLEM_MESSAGE_BYTES: usize = 4096;

impl RegistryProblem {
    fn warning(source: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(source.into(), message.into(), false)
    }

    /// The line `warden agents` and `warden config check` print for it: `error: …` or
    /// `warning: …` (source and message already one escaped line each).
    pub fn line(&self) -> String {
        let level = if self.error { "error" } else { "warning" };
        format!("{level}: {}: {}", self.source, self.message)
    }
    fn error(source: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(source.into(), message.into(), true)
    }

    /// The one place text becomes a problem: a guest's error or warning, a peer's
    /// answer quoted in it, an agent file's path. Each is made one line (control
    /// characters, CR and LF escaped: no forged log line or `warden agents` row) and cut
    /// to [`MAX_PROBLEM_MESSAGE_BYTES`].
    fn new(source: String, message: String, error: bool) -> Self {
        let line = |t: String| {
            let cut = crate::text::excerpt(&t, MAX_PROBLEM_MESSAGE_BYTES);
            crate::text::escape_control(&cut).into_owned()
        };
        RegistryProblem { source: line(source), message: line(message), error }
    }
}

/// An immutable view of the registry.
#[derive(Default)]
pub struct Snapshot {
    pub plugins: BTreeMap<String, Arc<LoadedPlugin>>,
    /// Replacement attempts that failed while the old version keeps serving.
    pub replace_errors: BTreeMap<String, String>,
    pub invalid: BTreeMap<String, InvalidPlugin>,
    /// kind → plugin ids in resolution order (first = serving).
    pub kinds: BTreeMap<String, Vec<String>>,
    /// Kinds claimed by several plugins that no `plugins.priority` entry and no current
    /// owner decides: served by nobody until the operator chooses. kind → claimants.
    pub ambiguous_kinds: BTreeMap<String, Vec<String>>,
    pub definitions: BTreeMap<String, Registered>,
    pub problems: Vec<RegistryProblem>,
}

/// `warden plugins --json` row.
#[derive(Debug, Clone, Serialize)]
pub struct PluginStatus {
    pub id: String,
    pub name: String,
    pub version: String,
    pub kinds: Vec<String>,
    /// Kinds this plugin claims but another plugin serves.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shadowed_kinds: Vec<String>,
    /// Kinds this plugin claims that are ambiguous (served by nobody; an error).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ambiguous_kinds: Vec<String>,
    pub requested_capabilities: Vec<Capability>,
    pub granted_capabilities: Vec<Capability>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub http_allow: Vec<String>,
    /// `loaded` or `invalid`.
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub source: PathBuf,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub sha256: String,
    /// How the code its calls run now was compiled (`baseline` while the optimised
    /// build compiles in the background); absent for invalid files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<crate::runtime::tier::Tier>,
    /// The `warden:plugin` version the component is built against; absent for invalid files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wit_version: Option<crate::runtime::WitVersion>,
    /// Whether the loaded file's signature verified against `plugins.trust`; absent for
    /// invalid files (a bad signature is their `error`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<SignatureState>,
}

/// The provenance of a loaded plugin file, as `warden plugins` and `GET /v1/plugins`
/// show it: `{"state":"signed","key":"<hex>"}` or `{"state":"unsigned"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum SignatureState {
    /// Signed by `key`, a key `plugins.trust` lists (the check passed).
    Signed { key: String },
    /// No signature file (allowed unless `plugins.require_signature`).
    Unsigned,
}

impl SignatureState {
    fn of(plugin: &LoadedPlugin) -> Self {
        match &plugin.signed_by {
            Some(key) => SignatureState::Signed { key: key.clone() },
            None => SignatureState::Unsigned,
        }
    }
}

impl std::fmt::Display for SignatureState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SignatureState::Signed { key } => write!(f, "signed by {key}"),
            SignatureState::Unsigned => f.write_str("unsigned"),
        }
    }
}

impl Snapshot {
    /// The plugin serving `kind`, if any.
    pub fn plugin_for_kind(&self, kind: &str) -> Option<Arc<LoadedPlugin>> {
        self.kinds.get(kind).and_then(|ids| ids.first()).and_then(|id| self.plugins.get(id)).cloned()
    }

    /// `- name: description` lines, the text a parent agent's Task tool lists.
    pub fn registrations(&self) -> String {
        self.definitions.values().map(|r| format!("-{}: {}\n", r.definition.name, r.definition.description)).collect()
    }

    /// Problems that are configuration errors (`warden config check` fails on them):
    /// ambiguous kinds and agent directories that do not exist.
    pub fn errors(&self) -> Vec<&RegistryProblem> {
        self.problems.iter().filter(|p| p.error).collect()
    }

    pub fn status(&self) -> Vec<PluginStatus> {
        let mut rows: Vec<PluginStatus> = self
            .plugins
            .values()
            .map(|p| PluginStatus {
                id: p.id.clone(),
                name: p.info.name.clone(),
                version: p.info.version.clone(),
                kinds: p.info.kinds.clone(),
                shadowed_kinds: p
                    .info
                    .kinds
                    .iter()
                    .filter(|k| !self.ambiguous_kinds.contains_key(*k))
                    .filter(|k| self.kinds.get(*k).and_then(|ids| ids.first()) != Some(&p.id))
                    .cloned()
                    .collect(),
                ambiguous_kinds: p
                    .info
                    .kinds
                    .iter()
                    .filter(|k| self.ambiguous_kinds.contains_key(*k))
                    .cloned()
                    .collect(),
                requested_capabilities: p.grants.requested().to_vec(),
                granted_capabilities: p.grants.granted().to_vec(),
                http_allow: p.grants.http_patterns(),
                state: "loaded",
                error: self.replace_errors.get(&p.id).cloned(),
                source: p.source.clone(),
                sha256: p.content_hash.clone(),
                tier: Some(p.tier()),
                wit_version: Some(p.wit_version),
                signature: Some(SignatureState::of(p)),
            })
            .collect();
        rows.extend(self.invalid.values().filter(|i| !self.plugins.contains_key(&i.id)).map(|i| PluginStatus {
            id: i.id.clone(),
            name: String::new(),
            version: String::new(),
            kinds: vec![],
            shadowed_kinds: vec![],
            ambiguous_kinds: vec![],
            requested_capabilities: vec![],
            granted_capabilities: vec![],
            http_allow: vec![],
            state: "invalid",
            error: Some(i.error.clone()),
            source: i.source.clone(),
            sha256: String::new(),
            tier: None,
            wit_version: None,
            signature: None,
        }));
        rows.sort_by(|a, b| a.id.cmp(&b.id));
        rows
    }
}

pub struct Registry {
    runtime: Arc<Runtime>,
    config: Arc<Config>,
    current: RwLock<Arc<Snapshot>>,
    /// Serialises writers (loads, reloads); readers never take it.
    write: tokio::sync::Mutex<()>,
    /// The highest signed version loaded for each plugin id since this process started
    /// (kept when the file is removed): a file below it is a rollback.
    floors: std::sync::Mutex<BTreeMap<String, semver::Version>>,
}

/// Why a reference's kind has no plugin, with what would serve: the loaded kinds, and
/// the one it differs from only in case (kinds match exactly, `jsonrpc` is not `JSONRPC`).
pub fn unserved_kind<'a>(kind: &str, loaded: impl Iterator<Item = &'a String>) -> String {
    let loaded: Vec<&String> = loaded.collect();
    let mut text = format!("no loaded plugin serves kind {kind}");
    if let Some(near) = loaded.iter().find(|k| k.eq_ignore_ascii_case(kind)) {
        text.push_str(&format!(" (kinds match exactly: did you mean {near}?)"));
    }
    match loaded.is_empty() {
        true => text.push_str("; no plugin is loaded"),
        false => text
            .push_str(&format!("; loaded kinds: {}", loaded.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", "))),
    }
    text
}

/// The plugin id of a `.wasm` file: its stem.
pub fn plugin_id(path: &Path) -> Option<String> {
    if path.extension().and_then(|e| e.to_str()) != Some("wasm") {
        return None;
    }
    path.file_stem().and_then(|s| s.to_str()).map(str::to_owned)
}

impl Registry {
    pub fn new(runtime: Arc<Runtime>, config: Arc<Config>) -> Self {
        Registry {
            runtime,
            config,
            current: RwLock::new(Arc::new(Snapshot::default())),
            write: tokio::sync::Mutex::new(()),
            floors: std::sync::Mutex::new(BTreeMap::new()),
        }
    }

    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// The current snapshot (cheap; never blocks on a reload in progress).
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.read().unwrap().clone()
    }

    pub fn plugin_dir(&self) -> PathBuf {
        self.config.path(&self.config.plugins.dir)
    }

    /// Loads every `.wasm` in the plugin directory and resolves all references.
    pub async fn load_all(&self) {
        let _w = self.write.lock().await;
        let dir = self.plugin_dir();
        let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
            Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| plugin_id(p).is_some()).collect(),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "plugin directory not readable; no plugins loaded");
                vec![]
            }
        };
        files.sort();
        let mut next = Snapshot::default();
        // In parallel, each under `plugins.load_timeout`: a slow plugin delays no other.
        let loads = files.into_iter().map(|path| async move {
            let id = plugin_id(&path).expect("filtered above");
            let loaded = self.load_file(&id, &path).await;
            (id, path, loaded)
        });
        for (id, path, loaded) in futures_util::future::join_all(loads).await {
            match loaded {
                Ok(p) => {
                    next.plugins.insert(id, Arc::new(p));
                }
                Err(error) => {
                    tracing::error!(plugin = %id, file = %path.display(), %error, "plugin skipped");
                    next.invalid.insert(id.clone(), InvalidPlugin { id, source: path, error });
                }
            }
        }
        self.publish(next, None).await;
    }

    async fn load_file(&self, id: &str, path: &Path) -> Result<LoadedPlugin, String> {
        let timeout = self.config.plugins.load_timeout;
        let load = async {
            let bytes = read_plugin_file(path, self.config.plugins.max_plugin_size).await?;
            let plugins = &self.config.plugins;
            let rules = crate::provenance::Rules {
                id,
                trust: &plugins.trust,
                require_signature: plugins.require_signature,
                pin: plugins.pins.get(id).map(String::as_str),
            };
            let signed = crate::provenance::check(path, &bytes, &rules).map_err(|e| e.to_string())?;
            // No rollback (before compiling): a pinned file is the operator's explicit choice.
            let floor = self.floors.lock().unwrap().get(id).map(ToString::to_string);
            crate::provenance::check_not_older(
                id,
                floor.as_deref(),
                signed.as_ref(),
                rules.pin.is_some(),
                crate::provenance::RollbackOverride::Pin,
            )
            .map_err(|e| e.to_string())?;
            let mut loaded = self
                .runtime
                .load(id, path.to_owned(), &bytes, self.config.limits_for(id), self.config.plugins.grants.get(id))
                .await
                .map_err(|e| e.to_string())?;
            if let Some(s) = &signed {
                let shown = crate::provenance::sig_path(path).display().to_string();
                crate::provenance::check_version(s, &loaded.info.version, &shown).map_err(|e| e.to_string())?;
                tracing::info!(plugin = %id, key = %s.key, version = %s.statement.version, "signature verified");
            }
            if let Some(version) = signed.as_ref().and_then(|s| semver::Version::parse(&s.statement.version).ok()) {
                let mut floors = self.floors.lock().unwrap();
                let floor = floors.entry(id.to_owned()).or_insert_with(|| version.clone());
                if *floor < version {
                    *floor = version;
                }
            }
            loaded.signed_by = signed.map(|s| s.key);
            Ok::<_, String>(loaded)
        };
        let p = tokio::time::timeout(timeout, load).await.map_err(|_| {
            format!("loading took longer than {} (plugins.load_timeout)", humantime::format_duration(timeout))
        })??;
        tracing::info!(
            plugin = %id, name = %p.info.name, version = %p.info.version, kinds = ?p.info.kinds,
            granted = ?p.grants.granted(), origin = ?p.origin, load_ms = p.load_time.as_millis() as u64,
            "plugin loaded"
        );
        Ok(p)
    }

    /// Applies one change in the plugin directory: `path` was added, replaced or removed.
    pub async fn apply_change(&self, path: &Path) {
        let Some(id) = plugin_id(path) else { return };
        let _w = self.write.lock().await;
        let old = self.snapshot();
        let mut next = Snapshot {
            plugins: old.plugins.clone(),
            replace_errors: old.replace_errors.clone(),
            invalid: old.invalid.clone(),
            ..Snapshot::default()
        };
        if !path.exists() {
            let removed = next.plugins.remove(&id).is_some() | next.invalid.remove(&id).is_some();
            next.replace_errors.remove(&id);
            if removed {
                tracing::info!(plugin = %id, "plugin removed");
            }
        } else {
            // Through the one bounded, regular-files-only reader: a FIFO or a device put in
            // the file's place must neither block this writer (and every later reload) nor
            // be read without end. A file that cannot be read this way is not "unchanged"; its
            // load below says why.
            let unchanged = match old.plugins.get(&id) {
                Some(p) => read_plugin_file(path, self.config.plugins.max_plugin_size)
                    .await
                    .is_ok_and(|b| hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&b)) == p.content_hash),
                None => false,
            };
            if unchanged {
                return;
            }
            match self.load_file(&id, path).await {
                Ok(p) => {
                    if let Some(prev) = old.plugins.get(&id) {
                        tracing::info!(plugin = %id, from = %prev.info.version, to = %p.info.version, "plugin replaced");
                    }
                    next.plugins.insert(id.clone(), Arc::new(p));
                    next.invalid.remove(&id);
                    next.replace_errors.remove(&id);
                }
                Err(error) => {
                    if let Some(prev) = old.plugins.get(&id) {
                        let msg = format!("replacement rejected, still serving version {}: {error}", prev.info.version);
                        tracing::error!(plugin = %id, %msg);
                        next.replace_errors.insert(id.clone(), msg);
                    } else {
                        tracing::error!(plugin = %id, file = %path.display(), %error, "plugin skipped");
                        next.invalid.insert(id.clone(), InvalidPlugin { id, source: path.to_owned(), error });
                    }
                }
            }
        }
        self.publish(next, Some(&old)).await;
    }

    /// Computes kinds and definitions for `next` and makes it current. `previous` is
    /// the snapshot being replaced (its kind owners keep their kinds).
    async fn publish(&self, mut next: Snapshot, previous: Option<&Snapshot>) {
        self.assign_kinds(&mut next, previous);
        self.resolve_definitions(&mut next).await;
        *self.current.write().unwrap() = Arc::new(next);
    }

    /// Decides who serves each kind (see the module docs) and reports contested kinds.
    fn assign_kinds(&self, next: &mut Snapshot, previous: Option<&Snapshot>) {
        let priority = &self.config.plugins.priority;
        let rank = |id: &str| priority.iter().position(|p| p == id).unwrap_or(usize::MAX);
        let mut claims: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for p in next.plugins.values() {
            for k in &p.info.kinds {
                claims.entry(k.clone()).or_default().push(p.id.clone());
            }
        }
        for (kind, mut ids) in claims {
            ids.sort();
            ids.dedup();
            if ids.len() == 1 {
                next.kinds.insert(kind, ids);
                continue;
            }
            let current = previous
                .and_then(|p| p.kinds.get(&kind))
                .and_then(|ids| ids.first())
                .filter(|owner| ids.contains(owner))
                .cloned();
            let source = format!("kind {kind}");
            let claimants = ids.join(", ");
            if ids.iter().any(|id| rank(id) != usize::MAX) {
                ids.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.cmp(b)));
                let msg =
                    format!("kind {kind} is claimed by plugins {claimants}; `{}` serves it (plugins.priority)", ids[0]);
                tracing::warn!("{msg}");
                next.problems.push(RegistryProblem::warning(source, msg));
                next.kinds.insert(kind, ids);
            } else if let Some(owner) = current {
                ids.sort_by_key(|id| *id != owner);
                let msg = format!(
                    "kind {kind} is claimed by plugins {claimants}; `{owner}` keeps serving it \
                     (a plugin that arrives later never takes a kind; list the one to use in plugins.priority)"
                );
                tracing::warn!("{msg}");
                next.problems.push(RegistryProblem::warning(source, msg));
                next.kinds.insert(kind, ids);
            } else {
                let msg = format!(
                    "kind {kind} is claimed by plugins {claimants} and plugins.priority names none of them: \
                     no plugin serves it until plugins.priority says which one does"
                );
                tracing::error!("{msg}");
                next.problems.push(RegistryProblem::error(source, msg));
                next.ambiguous_kinds.insert(kind, ids);
            }
        }
    }

    /// Every reference to resolve: configured references, then agent files. Agent
    /// directory entries that are skipped are reported in `problems`.
    fn references(&self, problems: &mut Vec<RegistryProblem>) -> Vec<SubagentReference> {
        let mut refs: Vec<SubagentReference> = self
            .config
            .subagents
            .references
            .iter()
            .map(|r| SubagentReference { uri: r.uri.clone(), kind: r.kind.clone(), metadata: r.metadata.clone() })
            .collect();
        if self.config.subagents.builtin {
            refs.extend(crate::builtin::AGENTS.iter().map(|(name, _)| SubagentReference {
                uri: format!("{}{name}", crate::builtin::URI_SCHEME),
                kind: crate::builtin::KIND.into(),
                metadata: BTreeMap::new(),
            }));
        }
        for configured in &self.config.subagents.agent_dirs {
            let dir = self.config.path(configured);
            let Ok(root) = dir.canonicalize() else {
                let source = dir.display().to_string();
                let message = "agent directory does not exist (subagents.agent_dirs)";
                // The default `./agents` may be absent; a directory the operator named may not.
                problems.push(if configured.as_path() == Path::new(crate::config::DEFAULT_AGENT_DIR) {
                    RegistryProblem::warning(source, message)
                } else {
                    RegistryProblem::error(source, message)
                });
                continue;
            };
            let mut files = vec![];
            collect_markdown(&root, &dir, &mut files, problems);
            files.sort();
            refs.extend(files.into_iter().map(|f| SubagentReference {
                uri: f.display().to_string(),
                kind: "CLAUDE".into(),
                metadata: BTreeMap::new(),
            }));
        }
        for configured in &self.config.subagents.plugin_dirs {
            let (plugins, found) = crate::claude_plugins::discover(&self.config.path(configured));
            problems.extend(found.into_iter().map(|p| RegistryProblem::new(p.source, p.message, p.error)));
            for plugin in plugins {
                let mut files = vec![];
                for path in &plugin.agent_paths {
                    match path.is_dir() {
                        true => collect_markdown(&plugin.root, path, &mut files, problems),
                        false => files.push(path.clone()),
                    }
                }
                files.sort();
                files.dedup();
                let metadata = plugin.metadata();
                refs.extend(files.into_iter().map(|f| SubagentReference {
                    uri: f.display().to_string(),
                    kind: "CLAUDE".into(),
                    metadata: metadata.clone(),
                }));
            }
        }
        refs
    }

    async fn resolve_definitions(&self, next: &mut Snapshot) {
        let mut problems = vec![];
        let references = self.references(&mut problems);
        next.problems.extend(problems);
        // Every source that defines each name: a name defined twice is nobody's (no
        // order — of `references`, of files, of directories — decides which one runs).
        let mut defined_by: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for reference in references {
            let ids = next.kinds.get(&reference.kind).cloned().unwrap_or_default();
            if ids.is_empty() {
                next.problems.push(RegistryProblem::warning(
                    reference.uri.clone(),
                    unserved_kind(&reference.kind, next.kinds.keys()),
                ));
                continue;
            }
            let mut resolved = None;
            for id in &ids {
                let plugin = &next.plugins[id];
                match self.runtime.can_resolve(plugin, &reference).await {
                    Ok(true) => {
                        let (definition, warnings) = self.runtime.resolve_reporting(plugin, &reference).await;
                        // The plugin names the reference in its lines; the problem's source already does.
                        let prefix = format!("{}: ", reference.uri);
                        next.problems.extend(warnings.iter().map(|w| {
                            RegistryProblem::warning(
                                reference.uri.clone(),
                                w.strip_prefix(prefix.as_str()).unwrap_or(w.as_str()),
                            )
                        }));
                        resolved = Some((plugin.clone(), definition));
                        break;
                    }
                    Ok(false) => continue,
                    Err(e) => next
                        .problems
                        .push(RegistryProblem::warning(reference.uri.clone(), format!("can-resolve failed: {e}"))),
                }
            }
            match resolved {
                None => next.problems.push(RegistryProblem::warning(
                    reference.uri.clone(),
                    format!("no plugin of kind {} accepts this reference", reference.kind),
                )),
                Some((_, Err(e))) => {
                    // The guest's text (and its peer's, quoted in it) is logged as the problem has it.
                    // A reference the plugin refuses as invalid (an agent file it will not
                    // register) is an error, as in `warden config check`; a peer that is
                    // down or a plugin that failed is a warning.
                    let refused =
                        matches!(&e, crate::runtime::CallError::Guest(crate::plugin::GuestError::InvalidInput(_)));
                    let problem = RegistryProblem::new(reference.uri.clone(), e.to_string(), refused);
                    tracing::warn!(reference = %problem.source, error = %problem.message, "reference not resolved");
                    next.problems.push(problem)
                }
                Some((plugin, Ok(mut def))) => {
                    if let Some(n) = reference.metadata.get("name") {
                        def.name = n.clone();
                    }
                    if let Some(d) = reference.metadata.get("description") {
                        def.description = d.clone();
                    }
                    // A Claude Code plugin's agents are `plugin-name:agent-name`.
                    if let Some(namespace) = reference.metadata.get(crate::claude_plugins::PLUGIN_METADATA) {
                        def.name = format!("{namespace}:{}", def.name);
                    }
                    // The one admission point of a name, whoever chose it (the plugin, its
                    // peer or the operator's metadata). A name Claude Code takes that cannot
                    // be one here is registered under an id derived from it, said as a warning.
                    let mut declared_name = None;
                    if crate::plugin::check_subagent_name(&def.name).is_err()
                        && let Some(id) = crate::plugin::safe_subagent_id(&def.name)
                    {
                        next.problems.push(RegistryProblem::warning(
                            reference.uri.clone(),
                            format!(
                                "subagent name {:?} cannot be a tool or path name here; registered as `{id}`",
                                crate::text::excerpt(&def.name, 64)
                            ),
                        ));
                        declared_name = Some(std::mem::replace(&mut def.name, id));
                    }
                    if let Err(e) = crate::plugin::check_subagent_name(&def.name) {
                        let fix = if reference.metadata.contains_key("name") {
                            "change its metadata `name`"
                        } else {
                            "give the reference a metadata `name`"
                        };
                        next.problems.push(RegistryProblem::error(
                            reference.uri.clone(),
                            format!("subagent not registered: {e}; {fix}"),
                        ));
                        continue;
                    }
                    // An egress list that cannot be read never runs wider: the subagent is left out.
                    let egress = match definition_egress(&def) {
                        Ok(e) => e,
                        Err(e) => {
                            next.problems.push(RegistryProblem::error(
                                reference.uri.clone(),
                                format!("subagent {:?} not registered: {e}", def.name),
                            ));
                            continue;
                        }
                    };
                    // Isolation (`isolation=fork`) asked by the operator or the plugin; a
                    // value that cannot be read keeps the subagent out.
                    match crate::isolation::definition_isolation(&reference.metadata, &def) {
                        Ok(isolation) => def.isolation = isolation,
                        Err(e) => {
                            next.problems.push(RegistryProblem::error(
                                reference.uri.clone(),
                                format!("subagent {:?} not registered: {e}", def.name),
                            ));
                            continue;
                        }
                    }
                    // The deny rules (`disallowedTools` patterns) of the operator and the
                    // plugin, merged into the definition; unreadable ones keep it out.
                    match crate::nesting::disallowed_tools(&reference.metadata, &def) {
                        Ok(rules) if rules.is_empty() => {}
                        Ok(rules) => {
                            let list = serde_json::to_string(&rules).expect("a list of text serialises");
                            def.reference.metadata.insert(crate::nesting::DISALLOWED_TOOLS_METADATA.into(), list);
                        }
                        Err(e) => {
                            next.problems.push(RegistryProblem::error(
                                reference.uri.clone(),
                                format!("subagent {:?} not registered: {e}", def.name),
                            ));
                            continue;
                        }
                    }
                    let named = std::mem::take(&mut def.mcp_servers);
                    let (granted, refused) = granted_mcp_servers(&plugin.grants, &def.name, named);
                    def.mcp_servers = granted;
                    next.problems
                        .extend(refused.into_iter().map(|e| RegistryProblem::warning(reference.uri.clone(), e)));
                    let servers = std::mem::take(&mut def.agent_mcp_servers);
                    let (admitted, refused) = admit_agent_mcp_servers(&self.config, servers);
                    def.agent_mcp_servers = admitted;
                    next.problems
                        .extend(refused.into_iter().map(|e| RegistryProblem::warning(reference.uri.clone(), e)));
                    let sources = defined_by.entry(def.name.clone()).or_default();
                    sources.push(reference.uri.clone());
                    if sources.len() > 1 {
                        next.definitions.remove(&def.name);
                        continue;
                    }
                    let background = match runs_in_background(&reference.metadata, &def) {
                        Ok(b) => b,
                        Err(e) => {
                            next.problems.push(RegistryProblem::warning(reference.uri.clone(), e));
                            false
                        }
                    };
                    let effort = reasoning_effort(&reference.metadata, &def).unwrap_or_else(|e| {
                        next.problems.push(RegistryProblem::warning(reference.uri.clone(), e));
                        None
                    });
                    next.definitions.insert(
                        def.name.clone(),
                        Registered {
                            definition: def,
                            plugin: plugin.id.clone(),
                            source: reference.uri.clone(),
                            egress,
                            background,
                            effort,
                            declared_name,
                            runtime: sandbox_runtime(&self.config, &plugin.id, &reference.uri),
                        },
                    );
                }
            }
        }
        for (name, sources) in defined_by.into_iter().filter(|(_, s)| s.len() > 1) {
            let message = format!(
                "duplicate subagent name {name:?}, defined by {}: none of them is registered until one name is changed",
                sources.join(", ")
            );
            tracing::error!("{message}");
            next.problems.extend(sources.into_iter().map(|source| RegistryProblem::error(source, message.clone())));
        }
    }
}

/// Reads a plugin file of at most `limit` bytes (`plugins.max_plugin_size`; checked before
/// reading, and while reading in case the file grows): regular files only, never blocking
/// on a FIFO (see [`crate::bounded_read`]), on a blocking thread. The one reader of plugin
/// files: loads, the hot reload's "unchanged?" check, and the `warden plugin` commands.
pub(crate) async fn read_plugin_file(path: &Path, limit: u64) -> Result<Vec<u8>, String> {
    use crate::bounded_read::{ReadError, read_regular};
    let owned = path.to_owned();
    let read = tokio::task::spawn_blocking(move || read_regular(&owned, limit))
        .await
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let too_big =
        |n: u64| format!("the file is {n} bytes, more than the limit of {limit} bytes (plugins.max_plugin_size)");
    match read {
        Ok(bytes) => Ok(bytes),
        Err(ReadError::Io(e)) => Err(format!("cannot read {}: {e}", path.display())),
        Err(ReadError::NotRegular) => Err(format!("{} is not a regular file", path.display())),
        Err(ReadError::TooLarge { size, .. }) => Err(too_big(size)),
    }
}

/// Collects the `.md` files under `dir` (inside the canonical agent directory `root`).
/// Entries that cannot be agent files are skipped and reported: names with control
/// characters, symlinks that lead out of the agent directory, FIFOs, sockets and
/// devices (reading one could block), and unreadable files and directories.
fn collect_markdown(root: &Path, dir: &Path, out: &mut Vec<PathBuf>, problems: &mut Vec<RegistryProblem>) {
    let shown = |p: &Path| crate::text::escape_control(&p.display().to_string()).into_owned();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) => return problems.push(RegistryProblem::warning(shown(dir), format!("skipped: cannot list: {e}"))),
    };
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name();
        let Some(name) = name.to_str().filter(|n| !n.chars().any(char::is_control)) else {
            problems
                .push(RegistryProblem::warning(shown(&p), "skipped: the name is not UTF-8 or has control characters"));
            continue;
        };
        let Ok(ft) = e.file_type() else { continue };
        let is_md = Path::new(name).extension().and_then(|x| x.to_str()) == Some("md");
        let target = if ft.is_symlink() {
            match p.canonicalize() {
                Ok(t) if t.starts_with(root) => t,
                Ok(_) => {
                    problems.push(RegistryProblem::warning(shown(&p), "skipped: a symlink out of the agent directory"));
                    continue;
                }
                Err(err) => {
                    problems.push(RegistryProblem::warning(shown(&p), format!("skipped: a broken symlink: {err}")));
                    continue;
                }
            }
        } else {
            p.clone()
        };
        let Ok(meta) = std::fs::metadata(&target) else { continue };
        if meta.is_dir() {
            if !ft.is_symlink() {
                collect_markdown(root, &p, out, problems);
            }
        } else if !is_md {
            continue;
        } else if !meta.is_file() {
            problems
                .push(RegistryProblem::warning(shown(&p), "skipped: not a regular file (a FIFO, socket or device)"));
        } else if let Err(err) = std::fs::File::open(&target) {
            problems.push(RegistryProblem::warning(shown(&p), format!("skipped: unreadable: {err}")));
        } else {
            out.push(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A guest's resolve error (quoting its peer: an A2A card's error body, an MCP
    /// server's message) went into the registry's log field and problem list as it was:
    /// `\r\n` in it started a forged log line. A problem is one bounded line.
    #[test]
    fn regression_a_guest_error_forged_registry_log_lines() {
        let forged = "card fetch failed: 500\r\n2026-01-01T00:00:00Z ERROR warden: approval granted\u{1b}[2K";
        let p =
            RegistryProblem::warning("a2a://peer\nx", format!("{forged}{}", "x".repeat(3 * MAX_PROBLEM_MESSAGE_BYTES)));
        assert!(!p.message.chars().any(char::is_control), "{:?}", &p.message[..120]);
        assert!(!p.source.chars().any(char::is_control), "{:?}", p.source);
        assert!(p.message.starts_with("card fetch failed: 500\\r\\n2026-01-01"), "{:?}", &p.message[..120]);
        assert!(p.message.len() <= MAX_PROBLEM_MESSAGE_BYTES * 2, "{}", p.message.len());
        assert!(p.message.ends_with(&format!("[{} bytes]", forged.len() + 3 * MAX_PROBLEM_MESSAGE_BYTES)));
        // Plain text is kept as it is.
        assert_eq!(RegistryProblem::error("s", "a \"plain\" line").message, "a \"plain\" line");
    }

    /// Issue 43: which runtime `sandbox.runtime_overrides` gives a definition — the deepest
    /// agent directory holding its file, then its plugin — and none when the entry's runtime
    /// is the default anyway or nothing applies.
    #[test]
    fn the_deepest_agent_directory_then_the_plugin_chooses_the_sandbox_runtime() {
        use warden_sandbox::config::RuntimeOverride;
        let dir = tempfile::tempdir().unwrap();
        let (agents, third) = (dir.path().join("agents"), dir.path().join("agents/third-party"));
        std::fs::create_dir_all(&third).unwrap();
        for f in [agents.join("own.md"), third.join("theirs.md")] {
            std::fs::write(f, "x").unwrap();
        }
        let mut config = Config { base_dir: dir.path().to_owned(), ..Config::default() };
        let rule = |dir: Option<&str>, plugin: Option<&str>, runtime: &str| RuntimeOverride {
            agent_dir: dir.map(PathBuf::from),
            plugin: plugin.map(String::from),
            runtime: runtime.into(),
        };
        config.sandbox.runtime_overrides = vec![
            rule(None, Some("claude"), "kata"),
            rule(Some("./agents/third-party"), None, "runsc"),
            rule(Some("./agents"), None, "runc-strict"),
        ];
        let own = agents.join("own.md").display().to_string();
        let theirs = third.join("theirs.md").display().to_string();
        assert_eq!(sandbox_runtime(&config, "claude", &theirs).as_deref(), Some("runsc"), "the deepest directory");
        assert_eq!(
            sandbox_runtime(&config, "claude", &own).as_deref(),
            Some("runc-strict"),
            "a directory over a plugin"
        );
        assert_eq!(sandbox_runtime(&config, "claude", "a2a://peer").as_deref(), Some("kata"), "the plugin's entry");
        assert_eq!(sandbox_runtime(&config, "other", "a2a://peer"), None, "nothing applies");
        config.sandbox.runtime = Some("runsc".into());
        assert_eq!(sandbox_runtime(&config, "claude", &theirs), None, "the default runtime already");
    }

    fn definition(metadata: &[(&str, &str)]) -> SubagentDefinition {
        SubagentDefinition {
            name: "a".into(),
            description: "d".into(),
            kind: "CLAUDE".into(),
            reference: SubagentReference {
                uri: "a.md".into(),
                kind: "CLAUDE".into(),
                metadata: metadata.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            },
            tools: None,
            permission_mode: None,
            mcp_servers: vec![],
            agent_mcp_servers: vec![],
            egress: None,
            isolation: None,
            protocol_data: "{}".into(),
        }
    }

    fn server(name: &str, command: &str, env: &[(&str, &str)]) -> crate::plugin::AgentMcpServer {
        crate::plugin::AgentMcpServer {
            name: name.into(),
            command: command.into(),
            args: vec!["--flag".into()],
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }

    #[test]
    fn agent_defined_mcp_servers_are_refused_unless_allowed_and_valid() {
        let servers = vec![server("local", "python3", &[]), server("other", "node", &[("A", "1")])];
        let off = Config::default();
        let (admitted, refused) = admit_agent_mcp_servers(&off, servers.clone());
        assert!(admitted.is_empty());
        assert_eq!(refused.len(), 2);
        assert!(
            refused[0].contains("`local`") && refused[0].contains("subagents.allow_agent_mcp_servers"),
            "{refused:?}"
        );

        let mut on = Config::default();
        on.subagents.allow_agent_mcp_servers = true;
        on.mcp_servers.insert("github".into(), Default::default());
        assert_eq!(admit_agent_mcp_servers(&on, servers.clone()), (servers, vec![]));
        let hostile = vec![
            server("github", "x", &[]),                      // the operator's name
            server("a__b", "x", &[]),                        // would read as server `a`
            server("ok", "", &[]),                           // no program
            server("env", "x", &[("T", "${GITHUB_TOKEN}")]), // names a secret
            server("dup-env", "x", &[("A", "1"), ("A", "2")]),
            server("bad-env", "x", &[("A-B", "1")]),
            server("nul", "x\0y", &[]),
            server("fine", "x", &[]),
            server("fine", "y", &[]), // the same name again
        ];
        let (admitted, refused) = admit_agent_mcp_servers(&on, hostile);
        assert_eq!(admitted.iter().map(|s| s.command.as_str()).collect::<Vec<_>>(), ["x"], "{refused:?}");
        assert_eq!(refused.len(), 8, "{refused:?}");
        assert!(refused.iter().all(|e| e.starts_with("inline MCP server `")), "{refused:?}");
        assert!(refused.iter().any(|e| e.contains("operator-configured")));
        assert!(refused.iter().any(|e| e.contains("not expanded")));
        assert!(refused.iter().any(|e| e.contains("defined twice")));
    }

    #[test]
    fn background_default_comes_from_the_operator_then_the_plugin() {
        let operator = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        assert_eq!(runs_in_background(&operator(&[]), &definition(&[])), Ok(false));
        assert_eq!(runs_in_background(&operator(&[]), &definition(&[("background", "true")])), Ok(true));
        assert_eq!(
            runs_in_background(&operator(&[("background", "false")]), &definition(&[("background", "true")])),
            Ok(false)
        );
        assert_eq!(runs_in_background(&operator(&[("background", " true ")]), &definition(&[])), Ok(true));
        let err = runs_in_background(&operator(&[("background", "y\nes")]), &definition(&[])).unwrap_err();
        assert!(err.contains("expected true or false") && !err.contains('\n'), "{err}");
    }

    #[test]
    fn effort_comes_from_the_operator_then_the_plugin_and_a_bad_one_is_a_problem() {
        use warden_models::ReasoningEffort;
        let operator = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        assert_eq!(reasoning_effort(&operator(&[]), &definition(&[])), Ok(None));
        assert_eq!(
            reasoning_effort(&operator(&[]), &definition(&[("effort", "high")])),
            Ok(Some(ReasoningEffort::High))
        );
        assert_eq!(
            reasoning_effort(&operator(&[("effort", "low")]), &definition(&[("effort", "max")])),
            Ok(Some(ReasoningEffort::Low))
        );
        let err = reasoning_effort(&operator(&[]), &definition(&[("effort", "extreme\n")])).unwrap_err();
        assert!(err.contains("expected low, medium, high, xhigh or max") && !err.contains('\n'), "{err}");
    }
}
