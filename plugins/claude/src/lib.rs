//! `claude` plugin: Claude-format Markdown subagents (kind `CLAUDE`).
//!
//! The crate is split so that everything but the host glue is plain Rust, tested natively:
//!
//! - [`frontmatter`]: split a Markdown file into YAML frontmatter and body; parse the
//!   frontmatter as YAML, falling back to a tolerant line reader for the messy files found
//!   in the wild (unquoted colons, `<example>` blocks, `user: "…"` lines).
//! - [`agent`]: the agent definition built from a file: name, description and the
//!   protocol data (JSON) the executor reads back ([`agent::ProtocolData`]).
//! - [`toolset`]: which of the session's tools an agent gets (`tools`, `disallowedTools`,
//!   never a nesting tool).
//! - [`hooks`]: an agent's `PreToolUse` / `PostToolUse` hooks: parsing, matching, the Bash
//!   call that runs one in the sandbox and the verdict read from it.
//! - [`memory`]: `memory: user` across sessions: the memory directory saved in `state`
//!   when a task ends and restored into a new session's workspace.
//! - [`host`]: the [`host::Host`] trait, the host capabilities the loop and the memory use
//!   (model, tools, state, events, log, resources): the WIT imports, or fakes in tests.
//! - [`runner`]: the agent loop as a state machine over [`host::Host`], with transcripts
//!   for `resume`.
//! - `wasm` (only on `wasm32`): the WIT exports over the real host imports.

pub mod agent;
pub mod frontmatter;
pub mod hooks;
pub mod host;
pub mod memory;
pub mod runner;
pub mod toolset;

#[cfg(target_arch = "wasm32")]
mod wasm;

#[cfg(test)]
mod tests;

/// The kind this plugin resolves and executes.
pub const KIND: &str = "CLAUDE";
