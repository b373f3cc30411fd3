//! The names the host itself acts and records under: the principals it makes up (the open
//! API, `server.tokens_env` tokens, `warden mcp`'s local client), the users its tasks run
//! as when none is named, who decides an approval on the terminal, and the deciders the
//! audit log names without a person. A configured principal may not take one of them
//! ([`reserved`]): its decisions would be audited as the host's, and its tasks mixed with
//! the host's own.
//!
//! Data and one check only; every module that acts under one of these names takes it from
//! here.

/// The admin every request of an API without tokens acts as.
pub const OPEN_API: &str = "api";
/// Prefix of the admins `server.tokens_env`'s tokens make: `token1`, `token2`, ….
pub const TOKEN_PREFIX: &str = "token";
/// The admin `warden mcp` serves its stdio client as.
pub const MCP_STDIO: &str = "mcp-stdio";
/// The user id of API tasks that name none (and of the token admins' tasks).
pub const DEFAULT_USER: &str = "default";
/// The user id of tasks started from this terminal.
pub const LOCAL_USER: &str = "local";
/// Who decides an approval typed on the terminal.
pub const TTY: &str = "tty";
/// Who declines an approval when there is no terminal to ask on.
pub const NO_TTY: &str = "no-tty";
/// Who approves the demo's calls when it runs without a terminal.
pub const DEMO_AUTO: &str = "demo-auto";

/// Names no configured principal may take, compared without case: the host's own (above),
/// the deciders the audit log records without a person (`policy`, `timeout`, …, see
/// `warden_approval::Verdict::decided_by`) and the words a reader of the audit log takes
/// for the host itself.
pub const RESERVED: &[&str] = &[
    OPEN_API,
    MCP_STDIO,
    DEFAULT_USER,
    LOCAL_USER,
    TTY,
    NO_TTY,
    DEMO_AUTO,
    "policy",
    "timeout",
    "disconnect",
    "cancel",
    "bypass",
    "error",
    "grant",
    "admin",
    "system",
    "host",
    "warden",
];

/// Whether `name` is one of the host's own names: one of [`RESERVED`] or a token admin's
/// `token<N>`, in any case.
pub fn reserved(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    RESERVED.contains(&lower.as_str())
        || lower.strip_prefix(TOKEN_PREFIX).is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_s_names_are_reserved_in_any_case() {
        for name in ["api", "API", "token1", "Token12", "default", "local", "mcp-stdio", "tty", "admin", "Warden"] {
            assert!(reserved(name), "{name}");
        }
        for name in ["alice", "root", "token", "tokenx", "token1a", "apix", "ops"] {
            assert!(!reserved(name), "{name}");
        }
    }
}
