//! warden: a WebAssembly plugin host for sandboxed subagent executors.
//!
//! Layers, each module using only those below it (checked by `cargo xtask test`, see
//! `xtask/src/layering.rs`):
//! - edges: [`cli`] (the `warden` binary's commands) and [`server`] (HTTP API, MCP, A2A);
//! - [`app`]: the composition root, [`Host::start`];
//! - [`engine`] (background tasks, queue, cancel, persisted in [`store`]) running one
//!   task through [`task`];
//! - [`registry`] (plugins, kinds, definitions) fed by [`plugin_dir`] (hot reload),
//!   [`oci`] and [`provenance`] (where plugin files come from), and [`claude_plugins`]
//!   (Claude Code plugin and marketplace folders as sources of agent files);
//! - [`runtime`] (wasmtime engine, limits, host imports);
//! - [`services`], [`tools`], [`mcp_tools`] (what imports use), [`nesting`] (the `Agent`
//!   tool's rules);
//! - [`config`] (warden.yaml, plain validated data), [`actor`] (the host's own names);
//! - [`capability`] (grants and the one grant checker), [`plugin`] (SPI types), [`event`]
//!   and [`task_state`] (the typed task flow), [`scope`] (the one context of a running task),
//!   [`journal`] (a durable task's import journal, over [`store`]), [`store`],
//!   [`logging`] (the operator's log, scrubbed per owner) over [`redact`], [`builtin`], [`text`],
//!   [`bounded_read`], [`http_client`] (the one hardened outbound HTTP client builder),
//!   [`tool_context`] (a task's secrets and where each is delivered).
//!
//! This file only declares modules and re-exports; it holds nothing other modules import.

pub mod actor;
pub mod app;
pub mod bounded_read;
pub mod builtin;
pub mod capability;
pub mod claude_plugins;
pub mod cli;
pub mod config;
pub mod engine;
pub mod event;
pub mod http_client;
pub mod isolation;
pub mod journal;
pub mod logging;
pub mod mcp_tools;
pub mod nesting;
pub mod oci;
pub mod plugin;
pub mod plugin_dir;
pub mod plugin_state;
pub mod provenance;
pub mod redact;
pub mod registry;
pub mod runtime;
pub mod scope;
pub mod server;
pub mod services;
pub mod store;
pub mod task;
pub mod task_state;
pub mod text;
pub mod tool_context;
pub mod tools;

pub use app::Host;
pub use config::Config;
pub use plugin::{GuestError, SubagentDefinition, SubagentReference, TaskCall, TaskContext};
pub use registry::Registry;
pub use runtime::{CallError, LoadedPlugin, Runtime, RuntimeOptions};
