//! Claude Code plugin folders and marketplace folders as sources of agent files
//! (`subagents.plugin_dirs`): which plugins a folder holds, what each is called and where
//! its agent files are.
//!
//! A folder is, as in Anthropic's plugin directory:
//! - a **plugin**: `.claude-plugin/plugin.json` (its `name`; the folder's name without one)
//!   and the default `agents/` folder, plus the files and folders its `agents` field lists;
//! - a **marketplace**: `.claude-plugin/marketplace.json` whose `plugins` entries name a
//!   plugin and its `source`, a folder inside the marketplace (relative, under
//!   `metadata.pluginRoot` when set). Other sources (GitHub, git, URL, npm) are never
//!   fetched: each is a warning.
//!
//! The registry reads the agent files of each plugin and registers them namespaced
//! `plugin-name:agent-name`, as Claude Code does, so two plugins may each have a
//! `reviewer`. The plugin's skills are found next to its `agents/` (`skills/`) as for any
//! agent file; its hooks file (`hooks/hooks.json`, or the path or object `plugin.json`'s
//! `hooks` gives) and MCP servers file (`.mcp.json`, or `plugin.json`'s `mcpServers`) are
//! read here and handed to the claude plugin as JSON text in the reference metadata
//! [`PLUGIN_HOOKS_METADATA`] and [`PLUGIN_MCP_METADATA`] (its `resources` grant reads
//! definition files only). A plugin whose hooks or MCP file cannot be read is not loaded:
//! its agents would run without hooks that could forbid what they do.
//!
//! This module only reads manifests (bounded, regular files only) and paths: every path
//! it returns is inside the folder the operator named, after symlinks are resolved. It
//! never fetches, runs or registers anything.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::bounded_read::{ReadError, read_regular};

/// The reference metadata key naming the Claude Code plugin an agent file belongs to: the
/// registry registers the definition as `<plugin>:<name>`.
pub const PLUGIN_METADATA: &str = "claude_plugin";

/// The reference metadata key giving the plugin's folder (for the operator's eyes: what
/// the plugin needs of it comes in the keys below).
pub const PLUGIN_ROOT_METADATA: &str = "claude_plugin_root";

/// The reference metadata key holding the plugin's hooks file, as JSON text.
pub const PLUGIN_HOOKS_METADATA: &str = "claude_plugin_hooks";

/// The reference metadata key holding the plugin's MCP servers file, as JSON text.
pub const PLUGIN_MCP_METADATA: &str = "claude_plugin_mcp";

/// Largest `plugin.json` / `marketplace.json` read: real manifests are a few KiB (a
/// marketplace of a hundred plugins tens of KiB); a bound keeps a hostile folder from
/// making the host read a huge file at every reload.
pub const MAX_MANIFEST_BYTES: u64 = 1024 * 1024;

/// Most plugins one marketplace may list: the largest public marketplaces list a few
/// hundred; each becomes a folder walk at every reload.
pub const MAX_MARKETPLACE_PLUGINS: usize = 1000;

/// The manifest folder of a plugin or marketplace.
const MANIFEST_DIR: &str = ".claude-plugin";

/// A plugin found in a folder: its name and the folders and files its agents are in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plugin {
    pub name: String,
    /// The plugin's folder (canonical).
    pub root: PathBuf,
    /// Folders to search for `.md` agent files, and single agent files (canonical, inside `root`).
    pub agent_paths: Vec<PathBuf>,
    /// Its hooks file (`{"hooks": {…}}`), as JSON text.
    pub hooks: Option<String>,
    /// Its MCP servers file (`{"mcpServers": {…}}`), as JSON text.
    pub mcp_servers: Option<String>,
}

impl Plugin {
    /// The reference metadata every agent file of the plugin is resolved with.
    pub fn metadata(&self) -> std::collections::BTreeMap<String, String> {
        let mut metadata = std::collections::BTreeMap::from([
            (PLUGIN_METADATA.to_owned(), self.name.clone()),
            (PLUGIN_ROOT_METADATA.to_owned(), self.root.display().to_string()),
        ]);
        if let Some(hooks) = &self.hooks {
            metadata.insert(PLUGIN_HOOKS_METADATA.to_owned(), hooks.clone());
        }
        if let Some(mcp) = &self.mcp_servers {
            metadata.insert(PLUGIN_MCP_METADATA.to_owned(), mcp.clone());
        }
        metadata
    }
}

/// Something wrong with a folder or manifest; `error` when the operator named something
/// that cannot be used (the registry reports it as a configuration error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub source: String,
    pub message: String,
    pub error: bool,
}

impl Problem {
    fn error(source: &Path, message: impl Into<String>) -> Self {
        Problem { source: source.display().to_string(), message: message.into(), error: true }
    }
    fn warning(source: &Path, message: impl Into<String>) -> Self {
        Problem { source: source.display().to_string(), message: message.into(), error: false }
    }
}

/// The plugins of one `subagents.plugin_dirs` entry (see the module docs).
pub fn discover(dir: &Path) -> (Vec<Plugin>, Vec<Problem>) {
    let mut problems = Vec::new();
    let Ok(root) = dir.canonicalize() else {
        problems.push(Problem::error(dir, "plugin folder does not exist (subagents.plugin_dirs)"));
        return (Vec::new(), problems);
    };
    let marketplace = root.join(MANIFEST_DIR).join("marketplace.json");
    let plugins = if marketplace.is_file() {
        marketplace_plugins(&root, &marketplace, &mut problems)
    } else if root.join(MANIFEST_DIR).join("plugin.json").is_file() || root.join("agents").is_dir() {
        plugin(&root, None, &mut problems).into_iter().collect()
    } else {
        problems.push(Problem::error(
            dir,
            "not a Claude Code plugin or marketplace folder (no .claude-plugin/plugin.json, .claude-plugin/marketplace.json or agents/) (subagents.plugin_dirs)",
        ));
        Vec::new()
    };
    (plugins, problems)
}

/// A manifest's JSON object, or a problem.
fn read_manifest(path: &Path, problems: &mut Vec<Problem>) -> Option<serde_json::Map<String, Value>> {
    let bytes = match read_regular(path, MAX_MANIFEST_BYTES) {
        Ok(b) => b,
        Err(ReadError::TooLarge { size, .. }) => {
            problems
                .push(Problem::error(path, format!("{size} bytes; a manifest may have at most {MAX_MANIFEST_BYTES}")));
            return None;
        }
        Err(ReadError::NotRegular) => {
            problems.push(Problem::error(path, "not a regular file"));
            return None;
        }
        Err(ReadError::Io(e)) => {
            problems.push(Problem::error(path, format!("cannot read: {e}")));
            return None;
        }
    };
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(o)) => Some(o),
        Ok(_) => {
            problems.push(Problem::error(path, "expected a JSON object"));
            None
        }
        Err(e) => {
            problems.push(Problem::error(path, format!("not valid JSON: {e}")));
            None
        }
    }
}

/// `path` (relative to `base`) resolved, if it exists inside `root`.
fn inside(root: &Path, base: &Path, path: &str) -> Result<PathBuf, String> {
    let joined = base.join(path);
    let resolved = joined.canonicalize().map_err(|e| format!("`{path}` cannot be used: {e}"))?;
    match resolved.starts_with(root) {
        true => Ok(resolved),
        false => Err(format!("`{path}` leads out of the folder")),
    }
}

/// The plugin in folder `root`; `listed_name` is a marketplace entry's name (which wins,
/// as in Claude Code, over the folder's).
fn plugin(root: &Path, listed_name: Option<&str>, problems: &mut Vec<Problem>) -> Option<Plugin> {
    let manifest_path = root.join(MANIFEST_DIR).join("plugin.json");
    let manifest = if manifest_path.is_file() { read_manifest(&manifest_path, problems) } else { None };
    let declared = manifest.as_ref().and_then(|m| m.get("name")).and_then(Value::as_str);
    let folder = root.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let name = listed_name.or(declared).unwrap_or(folder).trim().to_string();
    if let Err(e) = crate::plugin::check_plugin_name(&name) {
        problems.push(Problem::error(root, format!("plugin not loaded: {e}")));
        return None;
    }
    let mut agent_paths = Vec::new();
    if let Ok(default) = root.join("agents").canonicalize()
        && default.starts_with(root)
        && default.is_dir()
    {
        agent_paths.push(default);
    }
    let listed: Vec<String> = match manifest.as_ref().and_then(|m| m.get("agents")) {
        None | Some(Value::Null) => vec![],
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
        Some(other) => {
            problems.push(Problem::warning(
                &manifest_path,
                format!("`agents` ignored: expected a path or a list of paths, not {other}"),
            ));
            vec![]
        }
    };
    for path in listed {
        match inside(root, root, &path) {
            Ok(p) if !agent_paths.contains(&p) => agent_paths.push(p),
            Ok(_) => {}
            Err(e) => problems.push(Problem::warning(&manifest_path, format!("`agents` entry {e}"))),
        }
    }
    let hooks = plugin_file(root, &manifest_path, manifest.as_ref(), "hooks", "hooks/hooks.json", problems).ok()?;
    let mcp_servers = plugin_file(root, &manifest_path, manifest.as_ref(), "mcpServers", ".mcp.json", problems).ok()?;
    Some(Plugin { name, root: root.to_path_buf(), agent_paths, hooks, mcp_servers })
}

/// A plugin's hooks or MCP servers file as JSON text: the object `plugin.json`'s `field`
/// holds (wrapped as the file would be), the file it names, or `default` when it exists.
/// `Err` (with a problem) when one is named or present but cannot be read: the plugin is
/// then not loaded.
fn plugin_file(
    root: &Path,
    manifest_path: &Path,
    manifest: Option<&serde_json::Map<String, Value>>,
    field: &str,
    default: &str,
    problems: &mut Vec<Problem>,
) -> Result<Option<String>, ()> {
    let path = match manifest.and_then(|m| m.get(field)) {
        Some(Value::Object(inline)) => {
            return Ok(Some(
                Value::Object(serde_json::Map::from_iter([(field.to_owned(), Value::Object(inline.clone()))]))
                    .to_string(),
            ));
        }
        Some(Value::String(path)) => match inside(root, root, path) {
            Ok(p) => p,
            Err(e) => {
                problems.push(Problem::error(manifest_path, format!("plugin not loaded: `{field}` {e}")));
                return Err(());
            }
        },
        None | Some(Value::Null) => match root.join(default) {
            p if p.exists() || p.is_symlink() => match inside(root, root, default) {
                Ok(p) => p,
                Err(e) => {
                    problems.push(Problem::error(&p, format!("plugin not loaded: {e}")));
                    return Err(());
                }
            },
            _ => return Ok(None),
        },
        Some(other) => {
            problems.push(Problem::error(
                manifest_path,
                format!("plugin not loaded: `{field}` must be a path or an object, not {other}"),
            ));
            return Err(());
        }
    };
    let mut found = Vec::new();
    let file = read_manifest(&path, &mut found);
    let failed = !found.is_empty();
    problems.extend(found.into_iter().map(|p| Problem { message: format!("plugin not loaded: {}", p.message), ..p }));
    match (file, failed) {
        (Some(o), false) => Ok(Some(Value::Object(o).to_string())),
        _ => Err(()),
    }
}

/// The plugins a marketplace lists with a folder inside it.
fn marketplace_plugins(root: &Path, path: &Path, problems: &mut Vec<Problem>) -> Vec<Plugin> {
    let Some(market) = read_manifest(path, problems) else { return Vec::new() };
    let base = match market.get("metadata").and_then(|m| m.get("pluginRoot")).and_then(Value::as_str) {
        Some(sub) => match inside(root, root, sub) {
            Ok(b) => b,
            Err(e) => {
                problems.push(Problem::error(path, format!("`metadata.pluginRoot` {e}")));
                return Vec::new();
            }
        },
        None => root.to_path_buf(),
    };
    let Some(Value::Array(entries)) = market.get("plugins") else {
        problems.push(Problem::error(path, "expected `plugins`: a list of {name, source} entries"));
        return Vec::new();
    };
    if entries.len() > MAX_MARKETPLACE_PLUGINS {
        problems.push(Problem::error(
            path,
            format!("{} plugins listed; at most {MAX_MARKETPLACE_PLUGINS} are read", entries.len()),
        ));
    }
    let mut plugins = Vec::new();
    for (i, entry) in entries.iter().take(MAX_MARKETPLACE_PLUGINS).enumerate() {
        let name = entry.get("name").and_then(Value::as_str);
        let shown = name.map(|n| format!("`{}`", crate::text::escape_control(n))).unwrap_or(format!("#{i}"));
        match entry.get("source") {
            Some(Value::String(source)) => match inside(root, &base, source) {
                Ok(dir) if dir.is_dir() => plugins.extend(plugin(&dir, name, problems)),
                Ok(_) => problems.push(Problem::warning(path, format!("plugin {shown}: `{source}` is not a folder"))),
                Err(e) => problems.push(Problem::warning(path, format!("plugin {shown}: source {e}"))),
            },
            Some(Value::Object(o)) => problems.push(Problem::warning(
                path,
                format!(
                    "plugin {shown}: source `{}` is not fetched (warden reads plugins in the marketplace's folder only); skipped",
                    o.get("source").and_then(Value::as_str).unwrap_or("?")
                ),
            )),
            _ => problems.push(Problem::warning(path, format!("plugin {shown}: no `source`; skipped"))),
        }
    }
    plugins
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, path: &str, text: &str) {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn a_plugin_folder_is_named_by_its_manifest_and_lists_its_agent_folders() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        write(
            &root,
            "p/.claude-plugin/plugin.json",
            r#"{"name": "code-review", "agents": ["./extra/one.md", "../x"]}"#,
        );
        write(&root, "p/agents/reviewer.md", "x");
        write(&root, "p/extra/one.md", "x");
        let (plugins, problems) = discover(&root.join("p"));
        assert_eq!(plugins.len(), 1, "{problems:?}");
        assert_eq!(plugins[0].name, "code-review");
        assert_eq!(plugins[0].agent_paths, [root.join("p/agents"), root.join("p/extra/one.md")]);
        assert_eq!((plugins[0].hooks.as_deref(), plugins[0].mcp_servers.as_deref()), (None, None));
        assert!(problems.iter().any(|p| p.message.contains("`../x`") && !p.error), "{problems:?}");
        // Without a manifest: the folder's name.
        write(&root, "bare/agents/a.md", "x");
        assert_eq!(discover(&root.join("bare")).0[0].name, "bare");
        let (none, problems) = discover(&root.join("bare/agents"));
        assert!(none.is_empty() && problems[0].error && problems[0].message.contains("not a Claude Code plugin"));
    }

    /// A plugin's hooks and MCP servers reach its agents as metadata; one whose hooks file
    /// cannot be read is not loaded (its agents would run without hooks that could forbid).
    #[test]
    fn a_plugin_s_hooks_and_mcp_files_are_handed_over_and_a_broken_one_keeps_it_out() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        write(&root, "p/agents/a.md", "x");
        write(
            &root,
            "p/hooks/hooks.json",
            r#"{"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "./done.sh"}]}]}}"#,
        );
        write(&root, "p/.mcp.json", r#"{"mcpServers": {"db": {"command": "db-mcp"}}}"#);
        let (plugins, problems) = discover(&root.join("p"));
        assert!(problems.is_empty(), "{problems:?}");
        let metadata = plugins[0].metadata();
        assert!(metadata[PLUGIN_HOOKS_METADATA].contains("./done.sh"));
        assert!(metadata[PLUGIN_MCP_METADATA].contains("db-mcp"));
        assert_eq!(metadata[PLUGIN_METADATA], "p");
        // Inline in plugin.json.
        write(&root, "q/agents/a.md", "x");
        write(&root, "q/.claude-plugin/plugin.json", r#"{"name": "q", "mcpServers": {"fs": {"command": "fs-mcp"}}}"#);
        let (plugins, _) = discover(&root.join("q"));
        assert_eq!(plugins[0].mcp_servers.as_deref(), Some(r#"{"mcpServers":{"fs":{"command":"fs-mcp"}}}"#));
        write(&root, "p/hooks/hooks.json", "{ not json");
        let (plugins, problems) = discover(&root.join("p"));
        assert!(plugins.is_empty(), "{plugins:?}");
        assert!(
            problems.iter().any(|p| p.error && p.message.contains("plugin not loaded: not valid JSON")),
            "{problems:?}"
        );
    }

    #[test]
    fn a_marketplace_lists_its_local_plugins_and_skips_remote_ones() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        write(
            &root,
            ".claude-plugin/marketplace.json",
            r#"{"name": "m", "metadata": {"pluginRoot": "./plugins"}, "plugins": [
                {"name": "a", "source": "./alpha"},
                {"name": "b", "source": "./beta"},
                {"name": "far", "source": {"source": "github", "repo": "o/r"}},
                {"name": "out", "source": "../../"}
            ]}"#,
        );
        write(&root, "plugins/alpha/agents/reviewer.md", "x");
        write(&root, "plugins/beta/.claude-plugin/plugin.json", r#"{"name": "beta-declared"}"#);
        write(&root, "plugins/beta/agents/reviewer.md", "x");
        let (plugins, problems) = discover(&root);
        let names: Vec<&str> = plugins.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["a", "b"], "the marketplace's name wins: {problems:?}");
        assert!(problems.iter().any(|p| p.message.contains("`far`") && p.message.contains("not fetched")));
        assert!(problems.iter().any(|p| p.message.contains("`out`") && p.message.contains("out of the folder")));
    }
}
