//! `a2a` plugin: resolves and executes remote agents that speak Google's A2A protocol,
//! version 1.0 (`SendMessage`, `A2A-Version: 1.0`, card `supportedInterfaces`) or 0.3
//! (`message/send`, `kind`-tagged parts, card `url`/`preferredTransport`).
//!
//! Layout: [`card`] (agent cards → endpoint and protocol version), [`proto`] (JSON-RPC
//! requests and responses of both versions, normalised), [`sse`] (server-sent events: the shared `warden-sse` parser),
//! [`exec`] (the task flow: send or stream, poll, resume, cancel at the deadline) — all
//! pure and tested natively against a fake [`exec::Host`]. `wasm` binds them to the
//! warden:plugin world; every byte of network goes through the host's `http` capability.

pub mod card;
pub mod exec;
pub mod proto;
pub use warden_sse as sse;

#[cfg(target_arch = "wasm32")]
mod wasm;

#[cfg(test)]
mod tests;
