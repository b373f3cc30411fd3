//! End-to-end tests of the real `warden` binary with real plugin components and real
//! peers. `cargo xtask test` builds everything and points `WARDEN_BIN`,
//! `WARDEN_PLUGINS`, `WARDEN_TEST_PLUGINS` and `WARDEN_PYTHON` at it.
//! One binary; one module per area.

mod common;

mod a2a;
mod a2a_server;
mod author_kit;
mod claude;
mod cli;
mod console;
mod durable;
mod http_agent;
mod isolation;
mod mcp;
mod mcp_server;
mod mixed;
mod nesting;
mod oci;
mod operator;
mod protocols;
mod replicas;
mod serve;
