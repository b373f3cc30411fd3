//! `warden-guest`: the Rust SDK for warden protocol plugins.
//!
//! A plugin is a WebAssembly component of the world `plugin` in the WIT package
//! `warden:plugin@0.3.0` (`wit/`). This crate generates the bindings once and adds what every
//! plugin needs on top of them:
//!
//! - [`Error`]: the one error type, case for case the WIT `error` (the bindings use it as
//!   theirs), with `?` conversions from serde_json and UTF-8 failures;
//! - [`Metadata`]: the reference's `metadata` with typed getters whose errors name the key;
//! - [`http`]: requests and responses as plain values, JSON bodies, status checks, and
//!   `send`/`send_json`/`send_streaming` over the `http` import;
//! - [`model`]: messages, tool specs, tool calls and results, `complete`, `list_tools`,
//!   `call_tools`; [`events`], [`state`] (bytes or JSON), [`log`], [`resources`];
//! - [`clock`] (monotonic time, the remaining deadline, a bounded sleep) and [`cancel`]
//!   (the task's cancellation, polled or awaited).
//!   These plain types are also the bindings' types for the same WIT records, so they
//!   cross the boundary without conversion;
//! - [`Plugin`] and [`export!`]: one trait for the three exports.
//!
//! ```no_run
//! use warden_guest::{
//!     Capability, Error, Metadata, Plugin, PluginInfo, SubagentDefinition, SubagentReference, TaskCall,
//!     TaskContext, log,
//! };
//!
//! struct Echo;
//!
//! impl Plugin for Echo {
//!     fn info() -> PluginInfo {
//!         PluginInfo {
//!             name: "echo".into(),
//!             version: "0.1.0".into(),
//!             kinds: vec!["ECHO".into()],
//!             capabilities: vec![Capability::Log],
//!         }
//!     }
//!
//!     fn can_resolve(reference: SubagentReference) -> bool {
//!         reference.kind == "ECHO"
//!     }
//!
//!     fn resolve(reference: SubagentReference) -> Result<SubagentDefinition, Error> {
//!         let name = Metadata::new(&reference.metadata).require("name")?.to_string();
//!         Ok(warden_guest::definition(name, "Echoes the prompt".into(), reference, "{}".into()))
//!     }
//!
//!     fn execute(_: TaskContext, call: TaskCall, _: SubagentDefinition) -> Result<String, Error> {
//!         log::info("echoing");
//!         Ok(call.prompt)
//!     }
//! }
//!
//! warden_guest::export!(Echo);
//! # fn main() {}
//! ```
//!
//! Features: `bindings` (default) generates the bindings and enables everything that
//! calls the host. Without it only the pure parts build — what a plugin's native unit
//! tests need — so bundled plugins enable it for their wasm build only. `allocator`
//! (default) makes [`alloc`]'s arena-first allocator the plugin's global allocator on wasm:
//! calls that allocate little never grow memory (see that module for why it matters).

pub mod cancel;
pub mod clock;
pub mod error;
pub mod events;
pub mod http;
pub mod log;
pub mod metadata;
pub mod model;
pub mod resources;
pub mod state;
pub mod text;
pub mod wire;

#[cfg(all(feature = "allocator", target_arch = "wasm32"))]
pub mod alloc;
#[cfg(feature = "bindings")]
pub mod bindings;
#[cfg(feature = "bindings")]
mod plugin;

pub use error::{Error, Result};
pub use metadata::Metadata;
pub use model::{Completion, CompletionRequest, Message, ToolCall, ToolResult, ToolSpec};

#[cfg(feature = "bindings")]
pub use bindings::warden::plugin::types::{
    AgentMcpServer, Capability, PermissionMode, PluginInfo, SubagentDefinition, SubagentReference, TaskCall,
    TaskContext,
};
#[cfg(feature = "bindings")]
pub use plugin::definition;
#[cfg(feature = "bindings")]
pub use plugin::{Export, Plugin};
