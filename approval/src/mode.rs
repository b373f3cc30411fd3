//! Permission modes (an agent file's `permissionMode`) and the operator's cap.
//!
//! A mode is split into two independent effects, so that capping is exact:
//! - **read-only** (`plan`): only the tools of [`READ_ONLY_TOOLS`] pass; every other
//!   name (Write, Bash, an MCP server's `mcp__*` tool, a name no one knows yet) is denied;
//! - **what an `ask` becomes** ([`AskHandling`]): denied (`dontAsk`), asked
//!   (`default`, `plan`), allowed for file edits inside the workspace
//!   (`acceptEdits`), or allowed for everything (`bypassPermissions`).
//!
//! The effective mode of a subagent is the *stricter* of what it asks for and
//! the operator's `max_mode` on each axis ([`effective_mode`]); bypass also
//! needs `allow_bypass: true`. This module must never let a requested mode
//! relax anything beyond the operator's cap.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A permission mode, as written in agent files and `approval.max_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PermissionMode {
    /// Policy as written; `ask` prompts a person.
    #[default]
    Default,
    /// `ask` becomes allow for file edits (Edit, Write, MultiEdit,
    /// NotebookEdit) inside the workspace, and for a Bash command that asks only because
    /// its output redirections write workspace files no rule covers; never for executable
    /// configuration, never for any other Bash ask.
    AcceptEdits,
    /// Read-only: only [`READ_ONLY_TOOLS`] are allowed; every other tool is denied.
    Plan,
    /// Never prompt: `ask` becomes deny.
    DontAsk,
    /// `ask` becomes allow (audited as `bypass`); deny still denies.
    BypassPermissions,
}

/// What an `ask` decision turns into under a mode, least to most permissive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum AskHandling {
    /// `dontAsk`: decline without asking.
    Deny,
    /// Ask a person.
    Prompt,
    /// Allow file edits inside the workspace; ask for the rest.
    AcceptEdits,
    /// Allow without asking, recorded as a bypass.
    Bypass,
}

/// The mode actually applied to a subagent's calls (see [`effective_mode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct EffectiveMode {
    /// Only [`READ_ONLY_TOOLS`] pass; every other tool is denied.
    pub read_only: bool,
    /// What an `ask` becomes.
    pub on_ask: AskHandling,
}

impl Default for EffectiveMode {
    fn default() -> Self {
        PermissionMode::Default.into()
    }
}

impl EffectiveMode {
    /// The stricter of the two on each axis: read-only if either is, the stricter
    /// handling of an ask. A nested subagent runs under the strictest mode of its chain.
    pub fn stricter(self, other: EffectiveMode) -> EffectiveMode {
        EffectiveMode { read_only: self.read_only || other.read_only, on_ask: self.on_ask.min(other.on_ask) }
    }
}

impl From<PermissionMode> for EffectiveMode {
    fn from(m: PermissionMode) -> Self {
        let on_ask = match m {
            PermissionMode::Default | PermissionMode::Plan => AskHandling::Prompt,
            PermissionMode::AcceptEdits => AskHandling::AcceptEdits,
            PermissionMode::DontAsk => AskHandling::Deny,
            PermissionMode::BypassPermissions => AskHandling::Bypass,
        };
        EffectiveMode { read_only: m == PermissionMode::Plan, on_ask }
    }
}

/// The only tools a read-only (`plan`) mode lets through; every other name is denied.
///
/// An allow-list, not a list of mutating tools: a name nobody listed (an MCP server's
/// `mcp__fs__write_file`, a tool added later) could write or run anything, and MCP
/// annotations such as `readOnlyHint` are the server's own claim, so none is trusted.
/// `Read`, `Glob`, `Grep` and `LS` only read the workspace. `Agent` (and its older name
/// `Task`) starts a subagent, whose calls are judged under the strictest mode of its
/// chain ([`EffectiveMode::stricter`]): the child of a read-only parent is read-only too.
pub const READ_ONLY_TOOLS: &[&str] = &["Read", "Glob", "Grep", "LS", "Agent", "Task"];

/// Whether a read-only (`plan`) mode lets `tool` through (an exact name of
/// [`READ_ONLY_TOOLS`]; the comparison is case-sensitive, as tool names are).
pub fn allowed_when_read_only(tool: &str) -> bool {
    READ_ONLY_TOOLS.contains(&tool)
}

/// The mode applied to a subagent: on each axis the stricter of what the agent
/// requested (`None` = `default`) and the operator's `max_mode`; bypass is
/// reachable only when `allow_bypass` is set (otherwise it degrades to
/// `acceptEdits`). An agent can therefore always make itself *stricter*
/// (`plan`, `dontAsk`) but never more permissive than the operator allows.
pub fn effective_mode(requested: Option<PermissionMode>, max: PermissionMode, allow_bypass: bool) -> EffectiveMode {
    let req = EffectiveMode::from(requested.unwrap_or_default());
    let cap = EffectiveMode::from(max);
    let mut on_ask = req.on_ask.min(cap.on_ask);
    if on_ask == AskHandling::Bypass && !allow_bypass {
        on_ask = AskHandling::AcceptEdits;
    }
    EffectiveMode { read_only: req.read_only || cap.read_only, on_ask }
}

impl PermissionMode {
    /// The name used in agent files and configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            PermissionMode::Default => "default",
            PermissionMode::AcceptEdits => "acceptEdits",
            PermissionMode::Plan => "plan",
            PermissionMode::DontAsk => "dontAsk",
            PermissionMode::BypassPermissions => "bypassPermissions",
        }
    }
}

impl fmt::Display for PermissionMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown permission mode name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown permission mode `{0}` (expected default, acceptEdits, plan, dontAsk or bypassPermissions)")]
pub struct UnknownMode(pub String);

impl FromStr for PermissionMode {
    type Err = UnknownMode;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            PermissionMode::Default,
            PermissionMode::AcceptEdits,
            PermissionMode::Plan,
            PermissionMode::DontAsk,
            PermissionMode::BypassPermissions,
        ]
        .into_iter()
        .find(|m| m.as_str() == s.trim())
        .ok_or_else(|| UnknownMode(s.to_owned()))
    }
}
