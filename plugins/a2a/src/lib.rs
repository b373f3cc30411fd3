//! `a2a` plugin: resolves and executes remote agents that speak Google's A2A protocol,
//! version 1.0 (`SendMessage`, `A2A-Version: 1.0`, card `supportedInterfaces`) or 0.3
//! (`message/send`, `kind`-tagged parts, card `url`/`preferredTransport`).
//!
//! Layout: [`card`] (agent cards → endpoint and protocol version), [`proto`] (JSON-RPC
//! requests and responses of both versions, normalised), [`sse`] (server-sent events),
//! [`exec`] (the task flow: send or stream, poll, resume, cancel at the deadline) — all
//! pure and tested natively against a fake [`exec::Host`]. `wasm` binds them to the
//! warden:plugin world; every byte of network goes through the host's `http` capability.

pub mod card;
pub mod exec;
pub mod proto;
pub mod sse;

#[cfg(target_arch = "wasm32")]
mod wasm;

/// Why a resolve or execute failed; maps one to one onto the WIT `error` variant.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    NotFound(String),
    InvalidInput(String),
    Denied(String),
    Timeout(String),
    Remote(String),
    Unavailable(String),
    InputRequired(String),
    Internal(String),
}

impl Failure {
    pub fn message(&self) -> &str {
        match self {
            Failure::NotFound(m)
            | Failure::InvalidInput(m)
            | Failure::Denied(m)
            | Failure::Timeout(m)
            | Failure::Remote(m)
            | Failure::Unavailable(m)
            | Failure::InputRequired(m)
            | Failure::Internal(m) => m,
        }
    }
}

/// A value from the reference metadata.
pub fn metadata<'a>(metadata: &'a [(String, String)], key: &str) -> Option<&'a str> {
    metadata
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests;
