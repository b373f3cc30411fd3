//! warden's approval layer: the operator's policy in Claude Code's
//! permission-rule syntax, permission modes capped by the operator, the
//! fail-safe human-in-the-loop gate every tool call passes, and the audit log.
//!
//! Modules:
//! - [`policy`]: `approval:` configuration, rule evaluation, modes applied;
//! - [`rule`] / [`matcher`] / [`shell`]: rule syntax, matching, the
//!   conservative Bash recognizer;
//! - [`operands`]: which files the commands the recognizer knows read and write;
//! - [`mode`]: permission modes and the operator's cap;
//! - [`gate`]: asks, waits, timeouts, batches, events;
//! - [`grants`]: approvals that hold for a session or always (the overlay file);
//! - [`audit`]: the JSONL audit log;
//! - [`display`]: a call as a person reads it when asked.
//!
//! This crate never runs tools, never talks HTTP and never reads a TTY itself:
//! the host wires it into its `tools` capability, API and CLI.

pub mod audit;
pub mod display;
pub mod gate;
pub mod grants;
pub mod matcher;
pub mod mode;
pub mod operands;
pub mod policy;
pub mod rule;
pub mod shell;

pub use audit::{
    AuditDecision, AuditError, AuditLog, AuditRecord, EgressRecord, EgressSuppressedRecord, GapRecord,
    MAX_AUDIT_REASON, Record, RecordOwner, TextFilter, Written, args_digest, audit_reason, sync_open_logs,
};
pub use gate::{
    ApprovalGate, ApprovalRequest, Authority, BoxFuture, ChainLink, Decider, GateError, GateEvent, Observer,
    PendingApproval, PendingLimit, Resolution, UserDecision, Verdict, check_scope,
};
pub use grants::Scope;
pub use mode::{AskHandling, EffectiveMode, PermissionMode, READ_ONLY_TOOLS, effective_mode};
pub use operands::Access;
pub use policy::{CallFacts, Decision, EvalContext, Evaluation, Policy, PolicyConfig, PolicyError, ResolvedFile};
pub use rule::{Rule, RuleError};
pub use shell::{ShellFile, shell_files};
