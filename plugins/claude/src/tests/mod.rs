//! Native tests that span modules: the agent loop against a fake host, every fixture
//! agent file, the built-in agents.

mod builtin;
mod fake;
mod fixtures;
mod memory;
mod runner;
