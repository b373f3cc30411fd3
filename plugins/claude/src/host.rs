//! The host capabilities the agent loop ([`crate::runner`]) and the memory it keeps
//! ([`crate::memory`]) use: the WIT imports in the wasm build, fakes in the tests. No logic.

use warden_guest::log::Level;
use warden_guest::{Completion, CompletionRequest, Error, ToolCall, ToolResult, ToolSpec};

/// The host capabilities the loop uses.
pub trait Host {
    fn complete(&mut self, request: &CompletionRequest) -> Result<Completion, Error>;
    fn list_tools(&mut self) -> Result<Vec<ToolSpec>, Error>;
    fn call_tools(&mut self, calls: &[ToolCall]) -> Result<Vec<ToolResult>, Error>;
    fn state_get(&mut self, key: &str) -> Result<Option<Vec<u8>>, Error>;
    fn state_set(&mut self, key: &str, value: &[u8]) -> Result<(), Error>;
    /// Best effort: failures are the host's to report.
    fn emit(&mut self, kind: &str, data: &str);
    /// Best effort.
    fn log(&mut self, level: Level, message: &str);
    fn read_resource(&mut self, uri: &str) -> Result<Vec<u8>, Error>;
}
