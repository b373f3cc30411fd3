//! An I/O-free client for the Model Context Protocol over streamable HTTP.
//!
//! It speaks the 2026-07-28 revision (no handshake: `server/discover`, a `_meta`
//! envelope and `MCP-Protocol-Version` / `Mcp-Method` / `Mcp-Name` headers on every
//! request) and falls back to the `initialize` handshake of 2025-11-25 and earlier
//! (`Mcp-Session-Id`, `notifications/initialized`, `MCP-Protocol-Version` on later
//! requests). Replies may be `application/json` or `text/event-stream`; progress
//! notifications are surfaced as they are parsed.
//!
//! The crate never touches the network: [`Session`] builds [`HttpRequest`]s and
//! [`Pending`] reads replies, so the same code runs in the host (reqwest, async) and
//! in a WebAssembly plugin (the host `http` import). [`Client`] drives a session over
//! a blocking [`Transport`].
//!
//! Async use (one endpoint):
//!
//! ```text
//! let mut session = Session::new(ClientInfo { name: "warden".into(), version: "0.1.0".into() });
//! let mut next = Some(session.connect());
//! while let Some((req, mut pending)) = next {
//!     let resp = http.request(req.method, url).headers(req.headers).body(req.body).send().await?;
//!     pending.begin(resp.status(), &headers_of(&resp));
//!     while !pending.is_done() { match resp.chunk().await? { Some(c) => for u in pending.feed(&c) { .. }, None => break } }
//!     pending.finish();
//!     next = session.advance(pending)?;
//! }
//! // list: session.list_tools(cursor) -> same I/O -> ToolsPage::from_result(pending.result()?)
//! // call: session.call_tool(name, args, token) -> same I/O -> ToolResult::from_result(pending.result()?)
//! ```

mod client;
mod error;
mod exchange;
pub mod headers;
pub mod limits;
mod session;
mod tools;

/// The `text/event-stream` parser replies are read with (the shared `warden-sse` crate).
pub use warden_sse as sse;

pub use client::{Body, Client, Headers, Transport};
pub use error::{McpError, codes, excerpt};
pub use exchange::{HttpRequest, Pending, Progress, Purpose, Update};
pub use limits::{ListLimits, Listing, MAX_TOOL_PAGES, json_len, parsed_size};
pub use session::{
    ClientInfo, Era, HANDSHAKE_VERSIONS, LATEST_VERSION, META_CLIENT_CAPABILITIES, META_CLIENT_INFO,
    META_PROTOCOL_VERSION, META_SERVER_INFO, MODERN_VERSIONS, Preference, ServerInfo, Session,
};
pub use tools::{
    AgentTool, MAX_TOOL_NAME, NamePartError, Tool, ToolResult, ToolsPage, check_name_part, checked_tool_name,
    claude_tool_name, parse_claude_tool_name, select_agent_tool,
};

#[cfg(test)]
mod tests;
