//! Built-in subagents: Claude Code's general-purpose, Explore, Plan and Bash agents,
//! offered as `builtin://<name>` references of kind `CLAUDE` when `subagents.builtin: true`.
//! The files are the claude plugin's (`plugins/claude/builtin/`); the host only lists
//! them and serves their text through `resources.read`, it never parses them.

/// `builtin://` URIs name one of [`AGENTS`].
pub const URI_SCHEME: &str = "builtin://";

/// The kind the built-in agents are registered as.
pub const KIND: &str = "CLAUDE";

/// (name, agent file text) of every built-in agent.
pub const AGENTS: [(&str, &str); 4] = [
    ("general-purpose", include_str!("../../plugins/claude/builtin/general-purpose.md")),
    ("Explore", include_str!("../../plugins/claude/builtin/Explore.md")),
    ("Plan", include_str!("../../plugins/claude/builtin/Plan.md")),
    ("Bash", include_str!("../../plugins/claude/builtin/Bash.md")),
];

/// The text of the built-in agent `uri` names, if it is a `builtin://` URI of one.
pub fn agent_text(uri: &str) -> Option<Result<&'static str, String>> {
    let name = uri.strip_prefix(URI_SCHEME)?;
    Some(
        AGENTS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, text)| *text)
            .ok_or_else(|| format!("no built-in agent {name:?}")),
    )
}
