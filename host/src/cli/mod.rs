//! The `warden` command line: parsing and presentation only. Every command builds the
//! same composition root ([`crate::app::Host::start`]) and prints what the library returns.
//! Exit codes: 0 ok, 1 task failed or declined, 2 usage or configuration error.

/// `println!` for command output: a reader that went away (`warden plugins | head -1`)
/// stops the output instead of panicking the process (Rust ignores SIGPIPE, so every
/// `println!` to a closed pipe panicked), and the command still finishes its clean-up.
macro_rules! out {
    () => { $crate::cli::write_stdout(format_args!("")) };
    ($($arg:tt)*) => { $crate::cli::write_stdout(format_args!($($arg)*)) };
}

mod approval;
mod demo;
mod plugin_build;
mod plugin_test;
mod prompt;
mod remote;
mod sandbox;
mod scaffold;
mod serve;
mod signing;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use serde::Serialize;

use crate::config::Config;
use crate::plugin::TaskCall;
// Every plugin- or agent-provided string printed in text mode goes through these.
use crate::task;
use crate::task_state::TaskState;
use crate::text::{escape_control as esc, escape_multiline as esc_lines};

/// Exit code for a failed, declined or input-requiring task.
pub const EXIT_TASK_FAILED: u8 = 1;
/// Exit code for usage and configuration errors.
pub const EXIT_USAGE: u8 = 2;
/// The user id of tasks started from this terminal.
pub const LOCAL_USER: &str = crate::actor::LOCAL_USER;

#[derive(Parser, Debug)]
#[command(name = "warden", version, about = "WebAssembly plugin host for sandboxed subagent executors")]
pub struct Cli {
    /// Configuration file (default: ./warden.yaml if present, else built-in defaults).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run one task and print its result.
    Run {
        subagent_type: String,
        prompt: String,
        /// Short description of the task (default: the first words of the prompt).
        #[arg(long)]
        description: Option<String>,
        #[arg(long)]
        model: Option<String>,
        /// Session whose sandbox the task uses (default: a new one).
        #[arg(long)]
        session: Option<String>,
        /// A host the task's tool calls may reach (repeat for more): narrows
        /// `sandbox.egress` and the subagent's own list, never widens them.
        #[arg(long = "egress", value_name = "PATTERN")]
        egress: Vec<String>,
        /// Print one JSON object {task_id, status, output}.
        #[arg(long)]
        json: bool,
    },
    /// List resolved subagents.
    Agents {
        #[arg(long)]
        json: bool,
    },
    /// List loaded plugins and invalid plugin files.
    Plugins {
        #[arg(long)]
        json: bool,
    },
    /// Work with one plugin file.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
    /// Work with the configuration.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// One tool call through the approval gate and the session's sandbox, as a subagent
    /// would make it.
    Tool {
        /// Tool name: Read, Write, Edit, Glob, Grep, Bash.
        tool: String,
        /// Arguments as a JSON object, e.g. '{"command": "ls"}'.
        args: String,
        /// Session whose sandbox to use (default: a new one, removed afterwards).
        #[arg(long)]
        session: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Sandbox sessions and their containers.
    Sandbox {
        #[command(subcommand)]
        command: SandboxCommand,
    },
    /// The approval policy of the configuration.
    Approval {
        #[command(subcommand)]
        command: ApprovalCommand,
    },
    /// Pending approvals of a running `warden serve`: list (default), approve, decline.
    /// The token is read from $WARDEN_TOKEN.
    Approvals {
        #[command(subcommand)]
        command: Option<ApprovalsCommand>,
        #[command(flatten)]
        api: remote::ApiArgs,
        /// Print the list as JSON.
        #[arg(long)]
        json: bool,
    },
    /// One task of a running `warden serve`. The token is read from $WARDEN_TOKEN.
    Task {
        #[command(subcommand)]
        command: TaskCommand,
        #[command(flatten)]
        api: remote::ApiArgs,
    },
    /// Serve the HTTP API (default 127.0.0.1:7878, `server.addr`).
    Serve {
        /// Listen address, overriding `server.addr` (e.g. 127.0.0.1:0 for any free port).
        #[arg(long)]
        addr: Option<String>,
        /// This server's name among replicas on one PostgreSQL store, overriding
        /// `server.replica_id` (default: the host name).
        #[arg(long)]
        replica_id: Option<String>,
    },
    /// Serve MCP on stdin/stdout for a parent agent that launches warden (Claude Code,
    /// Claude Desktop, Cursor, Zed...): one tool per subagent (`mcp.mode`).
    Mcp {
        #[command(subcommand)]
        command: Option<McpCommand>,
        /// Also serve the HTTP API here (e.g. 127.0.0.1:7878), where approvals wait for a
        /// person when the client cannot be asked (no elicitation); without it they are
        /// declined.
        #[arg(long, value_name = "ADDR")]
        api: Option<String>,
    },
    /// Print the Task and TaskOutput tool definitions (JSON schema and a description
    /// listing the available subagents) for a parent agent.
    ToolSchema,
    /// The offline demo: a Claude subagent, a scripted model, a real sandbox, an approval.
    Demo {
        /// Directory with the bundled plugins (default: `plugins` next to the binary's
        /// target directory, i.e. `target/plugins`).
        #[arg(long)]
        plugins: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
pub enum McpCommand {
    /// Print the `mcp_servers:` block for warden.yaml from an existing `.mcp.json`
    /// (checked; stdio servers run in the session's sandbox).
    Import { file: PathBuf },
}

#[derive(Subcommand, Debug)]
pub enum SandboxCommand {
    /// List sessions and their containers.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Remove stopped warden containers and unused warden volumes.
    Prune,
    /// End sessions of a running `warden serve` now (their containers and workspaces):
    /// one SESSION, or every session idle for longer than --idle-over. The token is
    /// read from $WARDEN_TOKEN.
    End {
        /// The session id.
        session: Option<String>,
        /// The session's user (needed only when several users have a session of that id).
        #[arg(long)]
        user: Option<String>,
        /// End every session of the deployment idle for at least this long (e.g. 30m).
        #[arg(long, value_name = "DURATION", conflicts_with_all = ["session", "user"])]
        idle_over: Option<String>,
        #[command(flatten)]
        api: remote::ApiArgs,
    },
    /// Pause a session of a running `warden serve` now: its container stops (no process
    /// survives), its workspace is kept, and its next call starts it again. The token is
    /// read from $WARDEN_TOKEN.
    Pause {
        /// The session id.
        session: String,
        /// The session's user (default: the token's own; another user's needs an admin).
        #[arg(long)]
        user: Option<String>,
        #[command(flatten)]
        api: remote::ApiArgs,
    },
    /// Fork a session of a running `warden serve`: a new session NEW of the same user on a
    /// copy of SESSION's workspace, with a container of its own (no process, shell state or
    /// secret shared).
    Fork {
        /// The session to copy.
        session: String,
        /// The new session's id.
        new: String,
        /// The session's user (default: the token's own; another user's needs an admin).
        #[arg(long)]
        user: Option<String>,
        #[command(flatten)]
        api: remote::ApiArgs,
    },
    /// Start a paused session's container again now (files kept, processes not).
    Resume {
        /// The session id.
        session: String,
        /// The session's user (default: the token's own; another user's needs an admin).
        #[arg(long)]
        user: Option<String>,
        #[command(flatten)]
        api: remote::ApiArgs,
    },
    /// Named snapshots of a session's workspace on a running `warden serve`: take one, list
    /// them, delete one. A new session starts from one with `snapshot` on `POST /v1/tasks`.
    Snapshot {
        #[command(subcommand)]
        command: SnapshotCommand,
    },
}

#[derive(Subcommand, Debug)]
pub enum SnapshotCommand {
    /// Store a copy of SESSION's workspace as NAME (only the workspace: no process, shell
    /// state or secret).
    Take(SnapshotNamed),
    /// List the snapshots taken of SESSION.
    Ls {
        /// The session.
        session: String,
        /// The session's user (default: the token's own; another user's needs an admin).
        #[arg(long)]
        user: Option<String>,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: remote::ApiArgs,
    },
    /// Delete the snapshot NAME taken of SESSION.
    Rm(SnapshotNamed),
}

/// One snapshot of a session: `take` and `rm`.
#[derive(clap::Args, Debug)]
pub struct SnapshotNamed {
    /// The session (the one copied, or the one it was taken of).
    session: String,
    /// The snapshot's name: letters, digits, `.`, `_`, `-` (unique for the user).
    name: String,
    /// The session's user (default: the token's own; another user's needs an admin).
    #[arg(long)]
    user: Option<String>,
    #[command(flatten)]
    api: remote::ApiArgs,
}

#[derive(Subcommand, Debug)]
pub enum ApprovalCommand {
    /// What the policy decides for one tool call, and why (the rule and the reason),
    /// without running it. Exit 0 whatever the decision; 2 for bad input.
    Check {
        /// Tool name: Bash, Read, Write, Edit, Glob, Grep, WebFetch, mcp__server__tool, ...
        tool: String,
        /// The call's input as a JSON object, e.g. '{"command": "ls"}'.
        args: String,
        /// The permission mode an agent claims (default, acceptEdits, plan, dontAsk,
        /// bypassPermissions), capped by `approval.max_mode` as for an agent.
        #[arg(long)]
        mode: Option<String>,
        /// Print one JSON object {decision, rule, reason, bypass, not_understood}.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum TaskCommand {
    /// Print a durable task's import journal (JSON, scrubbed): its header, then each
    /// import call of its plugin and what the host answered.
    Journal {
        /// The task id.
        id: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum ApprovalsCommand {
    /// List pending approvals (the default).
    List,
    /// Approve a pending tool call.
    Approve {
        /// The request id (apr_...).
        id: String,
        /// How long the approval holds: once, session (the same call in the same
        /// session) or always (appended to the operator's overlay); as the request offers.
        #[arg(long, value_enum, default_value = "once")]
        scope: ApprovalScope,
    },
    /// Decline a pending tool call.
    Decline {
        /// The request id (apr_...).
        id: String,
    },
}

/// `--scope` of `warden approvals approve`.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub enum ApprovalScope {
    Once,
    Session,
    Always,
}

impl ApprovalScope {
    fn as_str(self) -> &'static str {
        match self {
            ApprovalScope::Once => "once",
            ApprovalScope::Session => "session",
            ApprovalScope::Always => "always",
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum PluginCommand {
    /// Create a plugin project (WIT vendored, versions pinned, name and kind filled in).
    New {
        name: String,
        /// The kind the plugin serves, e.g. JSONRPC.
        #[arg(long)]
        kind: String,
        #[arg(long, value_enum, default_value = "rust")]
        lang: scaffold::Lang,
        /// Where to create it (default: ./NAME).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Build a plugin project (Rust crate or Python app.py) into a component with the
    /// toolchain present, then load it to check it; prints the component's path.
    Build(plugin_build::BuildArgs),
    /// Show a component's world, WIT version, imports, exports and requested capabilities.
    Inspect {
        file: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Resolve and execute one task through a plugin file, with grants from the command
    /// line and nothing written (no config needed, no store, no Docker, no cache).
    Test(plugin_test::TestArgs),
    /// Create an Ed25519 key pair for signing plugins: NAME.key (private, mode 0600) and
    /// NAME.pub; prints the public key to list in `plugins.trust`.
    Keygen {
        #[arg(long, value_name = "NAME")]
        out: PathBuf,
    },
    /// Sign a plugin file: writes FILE.sig beside it, stating the file's SHA-256, its
    /// plugin id and the version the component reports (loaded as `inspect` loads it).
    Sign {
        file: PathBuf,
        /// The private key file from `warden plugin keygen`.
        #[arg(long, value_name = "KEYFILE")]
        key: PathBuf,
        /// The plugin id the signature is for (default: the file's name without .wasm);
        /// the signature holds only for a plugin installed under this id.
        #[arg(long, value_name = "ID")]
        id: Option<String>,
    },
    /// Check a plugin file's signature against `plugins.trust` (and `--trust` keys), its
    /// id, version and pin, as loading would with `require_signature: true`.
    Verify {
        file: PathBuf,
        /// Another trusted public key (64 hex digits; repeatable).
        #[arg(long, value_name = "KEY")]
        trust: Vec<String>,
    },
    /// Publish a plugin file (and its FILE.sig) as a Wasm OCI artifact, the layout
    /// `wkg oci push` writes. Credentials: WARDEN_REGISTRY_USERNAME and
    /// WARDEN_REGISTRY_PASSWORD (else anonymous).
    Push {
        file: PathBuf,
        /// Where: oci://REGISTRY/REPOSITORY:TAG
        target: String,
        /// Plain HTTP, for a registry on this machine (127.0.0.1, localhost) only.
        #[arg(long)]
        insecure: bool,
    },
    /// Fetch a Wasm OCI artifact, verify its digest, pin and signature as loading would,
    /// and install it atomically into the plugin directory as ID.wasm. Credentials as for
    /// push.
    Pull {
        /// oci://REGISTRY/REPOSITORY:TAG (or @sha256:DIGEST)
        source: String,
        /// The plugin id to install as (default: the repository's last segment). A signed
        /// artifact installs only as the id its signature names.
        #[arg(long = "as", value_name = "ID")]
        id: Option<String>,
        /// Plain HTTP, for a registry on this machine (127.0.0.1, localhost) only.
        #[arg(long)]
        insecure: bool,
        /// Install even when the artifact is an older version than the installed plugin of
        /// this id, or unsigned where the installed one is signed (a deliberate rollback).
        #[arg(long)]
        allow_downgrade: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Validate the configuration file.
    Check,
}

/// Set once writing to stdout failed: later output is dropped (see [`out!`]).
static STDOUT_BROKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// One line of command output on stdout; after the first failure (a closed pipe, a full
/// disk) output stops, and an error other than a closed pipe is reported once on stderr.
pub(crate) fn write_stdout(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    use std::sync::atomic::Ordering;
    if STDOUT_BROKEN.load(Ordering::Relaxed) {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(line).and_then(|()| stdout.write_all(b"\n")).and_then(|()| stdout.flush()) {
        STDOUT_BROKEN.store(true, Ordering::Relaxed);
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("error: cannot write to stdout: {e}");
        }
    }
}

/// Entry point used by `main`.
pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(crate::runtime::compiler::CHILD_ARG) {
        return crate::runtime::compiler::child_main(&args[2..]);
    }
    // Plugins are compiled in bounded child processes of this binary.
    if let Ok(exe) = std::env::current_exe() {
        crate::runtime::compiler::use_child_processes_of(exe);
    }
    let cli = Cli::parse();
    init_tracing();
    let config = match Config::load(cli.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let code = match rt.block_on(dispatch(cli.command, config)) {
        Ok(code) => code,
        Err(e) => {
            // The chain may quote what a plugin, a project or a peer wrote: escaped.
            eprintln!("error: {}", esc_lines(&format!("{e:#}")));
            ExitCode::from(EXIT_USAGE)
        }
    };
    // Audit lines are written by a thread of each log, which does not outlive the process.
    drop(rt);
    warden_approval::sync_open_logs();
    code
}

/// Runs one task from this terminal through the engine, as the server runs its tasks
/// (same validation, limits, redaction, tool budget and `finish`), with an in-memory
/// store: its events are printed as they arrive (unless `print_events` is off), its
/// gated tool calls are asked on the terminal (or approved, with `auto_approve`).
pub(crate) async fn run_on_terminal(
    host: &crate::app::Host,
    call: TaskCall,
    session_id: &str,
    auto_approve: bool,
    print_events: bool,
    egress: Option<Vec<String>>,
) -> anyhow::Result<Result<task::TaskOutcome, crate::engine::SubmitError>> {
    use crate::engine::{Asker, Engine, EngineOptions, Submission};
    let store = crate::store::Store::in_memory()?;
    let engine = Engine::start(host, store, EngineOptions::from_config(&host.config)).await?;
    let submission = Submission {
        call,
        session_id: Some(session_id.to_owned()),
        user_id: Some(LOCAL_USER.into()),
        asker: Some(Asker(prompt::terminal_decider(auto_approve))),
        egress,
        ..Submission::default()
    };
    let live = match engine.submit(submission).await {
        // With an asker the task always runs in this process.
        Ok(submitted) => submitted.live.expect("a task with an asker runs here"),
        Err(e) => return Ok(Err(e)),
    };
    let mut changed = live.watch();
    let mut seen = 0;
    loop {
        // Read before printing: a finish seen here means every event is already in.
        let finished = live.record().is_finished();
        for (seq, ev) in live.events_after(seen) {
            seen = seq;
            if print_events {
                print_event(&ev);
            }
        }
        if finished || changed.changed().await.is_err() {
            break;
        }
    }
    Ok(Ok(task::TaskOutcome::from(live.record())))
}

/// Prints one task event for a person reading the terminal (stderr for progress,
/// so stdout carries only results). Host bookkeeping (status changes, the plugin build,
/// the final error and finish, which the caller prints) is not shown.
pub fn print_event(ev: &serde_json::Value) {
    let text = |k: &str| esc(ev.get(k).and_then(|v| v.as_str()).unwrap_or_default()).into_owned();
    match ev.get("type").and_then(|t| t.as_str()).unwrap_or_default() {
        "tool_call" => {
            eprintln!("  → {} {}", text("name"), esc(&ev.get("input").cloned().unwrap_or_default().to_string()))
        }
        "tool_result" => {
            let content = ev.get("content").and_then(|v| v.as_str()).unwrap_or_default();
            let first = esc(content.lines().next().unwrap_or_default());
            let more = content.lines().count().saturating_sub(1);
            let mark = if ev["is_error"].as_bool() == Some(true) { "✗" } else { "←" };
            let tail = if more > 0 { format!(" (+{more} lines)") } else { String::new() };
            eprintln!("  {mark} {}: {first}{tail}", text("name"));
        }
        "token" | "reasoning" | "status" | "plugin" | "finish" | "error" | "approval_request" | "approval_resolved" => {
        }
        "progress" => eprintln!("  · {}", text("message")),
        kind => eprintln!("  [{}] {}: {}", text("plugin"), esc(kind), esc(&ev.to_string())),
    }
}

/// Libraries whose `info` lines narrate their own per-request lifecycle: rmcp logs three
/// (with the client's whole capability set) for every stateless MCP call, which at
/// `WARDEN_LOG=info` buried warden's own lines and cost /mcp a tenth of its latency.
/// They stay at `warn` unless `WARDEN_LOG` names them.
const CHATTY_LIBRARIES: &[&str] = &["rmcp"];

/// The log filter for a `WARDEN_LOG` value (`warn` when unset or invalid).
fn log_filter(spec: Option<&str>) -> tracing_subscriber::EnvFilter {
    let spec = spec.map(str::trim).filter(|s| !s.is_empty()).unwrap_or("warn");
    let mut directives = spec.to_owned();
    for lib in CHATTY_LIBRARIES {
        let named = spec.split(',').any(|d| d.trim().split(['=', ':', '[']).next() == Some(lib));
        if !named {
            directives.push_str(&format!(",{lib}=warn"));
        }
    }
    tracing_subscriber::EnvFilter::try_new(&directives).unwrap_or_else(|e| {
        eprintln!("warden: WARDEN_LOG={spec:?} is not a valid log filter ({e}); using `warn`");
        tracing_subscriber::EnvFilter::new("warn")
    })
}

fn init_tracing() {
    let filter = log_filter(std::env::var("WARDEN_LOG").ok().as_deref());
    // Every log line, at every level and from every module and plugin, is scrubbed of the
    // secrets of whose it is.
    crate::logging::init(filter, std::io::stderr);
}

async fn dispatch(command: Command, mut config: Config) -> anyhow::Result<ExitCode> {
    // Only `serve` and `mcp` live long enough to hand out pre-warmed sandboxes; a one-shot command
    // would leave its warm pool behind for the next start of the scope to remove.
    if !matches!(command, Command::Serve { .. } | Command::Mcp { command: None, .. }) {
        config.sandbox.warm_pool = 0;
    }
    match command {
        Command::Config { command: ConfigCommand::Check } => {
            // The file parsed; now what it leads to: plugins, kinds and agent directories.
            let source = config.source_name();
            let store = config.store.describe();
            let host = crate::app::Host::start(config).await?;
            let registry = host.registry.clone();
            let snap = registry.snapshot();
            // The same lines as `warden agents`: errors fail the check, warnings do not.
            for p in &snap.problems {
                eprintln!("{}", esc(&p.line()));
            }
            // The runtimes sessions would run under, on each Docker host that answers.
            let mut runtime_errors = 0;
            if let Ok(sandbox) = host.tools.sandbox() {
                for (endpoint, result) in sandbox.check_runtimes().await {
                    match result {
                        Ok(()) => {}
                        Err(e @ warden_sandbox::SandboxError::DockerUnavailable(_)) => {
                            eprintln!("warning: sandbox: {}; the runtimes there were not checked", esc(&e.to_string()));
                        }
                        Err(e) => {
                            runtime_errors += 1;
                            eprintln!("error: sandbox ({}): {}", esc(&endpoint), esc(&e.to_string()));
                        }
                    }
                }
            }
            if !snap.errors().is_empty() || runtime_errors > 0 {
                return Ok(ExitCode::from(EXIT_USAGE));
            }
            out!("{source}: ok");
            out!("store: {store}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin { command: PluginCommand::Inspect { file, json } } => inspect(config, &file, json).await,
        Command::Plugin { command: PluginCommand::Test(args) } => plugin_test::run(config, args).await,
        Command::Plugin { command: PluginCommand::Build(args) } => plugin_build::run(config, args).await,
        Command::Plugin { command: PluginCommand::New { name, kind, lang, dir } } => {
            scaffold::new(&name, &kind, lang, dir)
        }
        Command::Plugin { command: PluginCommand::Keygen { out } } => signing::keygen(&out),
        Command::Plugin { command: PluginCommand::Sign { file, key, id } } => {
            signing::sign(&config, &file, &key, id.as_deref()).await
        }
        Command::Plugin { command: PluginCommand::Verify { file, trust } } => {
            signing::verify(&config, &file, &trust).await
        }
        Command::Plugin { command: PluginCommand::Push { file, target, insecure } } => {
            signing::push(&config, &file, &target, insecure).await
        }
        Command::Plugin { command: PluginCommand::Pull { source, id, insecure, allow_downgrade } } => {
            signing::pull(&config, &source, id.as_deref(), insecure, allow_downgrade).await
        }
        Command::Tool { tool, args, session, json } => sandbox::tool(config, &tool, &args, session, json).await,
        Command::Sandbox { command: SandboxCommand::Ls { json } } => sandbox::ls(config, json).await,
        Command::Sandbox { command: SandboxCommand::Prune } => sandbox::prune(config).await,
        Command::Sandbox { command: SandboxCommand::End { session, user, idle_over, api } } => {
            remote::sandbox_end(config, api, session, user, idle_over).await
        }
        Command::Approval { command: ApprovalCommand::Check { tool, args, mode, json } } => {
            approval::check(&config, &tool, &args, mode.as_deref(), json)
        }
        Command::Sandbox { command: SandboxCommand::Pause { session, user, api } } => {
            remote::sandbox_lifecycle(config, api, &session, user, remote::Lifecycle::Pause).await
        }
        Command::Sandbox { command: SandboxCommand::Fork { session, new, user, api } } => {
            remote::sandbox_fork(config, api, &session, &new, user).await
        }
        Command::Sandbox { command: SandboxCommand::Resume { session, user, api } } => {
            remote::sandbox_lifecycle(config, api, &session, user, remote::Lifecycle::Resume).await
        }
        Command::Sandbox { command: SandboxCommand::Snapshot { command } } => {
            let (session, user, api, action) = match command {
                SnapshotCommand::Take(SnapshotNamed { session, name, user, api }) => {
                    (session, user, api, remote::SnapshotAction::Take(name))
                }
                SnapshotCommand::Ls { session, user, json, api } => {
                    (session, user, api, remote::SnapshotAction::List { json })
                }
                SnapshotCommand::Rm(SnapshotNamed { session, name, user, api }) => {
                    (session, user, api, remote::SnapshotAction::Delete(name))
                }
            };
            remote::sandbox_snapshot(config, api, &session, user, action).await
        }
        Command::Approvals { command: None | Some(ApprovalsCommand::List), api, json } => {
            remote::approvals_list(config, api, json).await
        }
        Command::Approvals { command: Some(ApprovalsCommand::Approve { id, scope }), api, .. } => {
            remote::approvals_decide(config, api, &id, "approve", scope.as_str()).await
        }
        Command::Approvals { command: Some(ApprovalsCommand::Decline { id }), api, .. } => {
            remote::approvals_decide(config, api, &id, "decline", "once").await
        }
        Command::Task { command: TaskCommand::Journal { id }, api } => remote::task_journal(config, api, &id).await,
        Command::Demo { plugins } => demo::run(plugins).await,
        Command::Serve { addr, replica_id } => serve::serve(config, addr, replica_id).await,
        Command::Mcp { command: Some(McpCommand::Import { file }), .. } => {
            match crate::config::mcp::read_mcp_json(&file) {
                Ok(servers) => {
                    let yaml = serde_yaml::to_string(&serde_json::json!({ "mcp_servers": servers }))?;
                    out!("{}", yaml.trim_end());
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    Ok(ExitCode::from(EXIT_USAGE))
                }
            }
        }
        Command::Mcp { command: None, api } => serve::mcp_stdio(config, api).await,
        Command::ToolSchema => serve::tool_schema(config).await,
        Command::Plugins { json } => {
            let host = crate::app::Host::start(config).await?;
            let registry = host.registry.clone();
            let rows = registry.snapshot().status();
            if json {
                out!("{}", serde_json::to_string_pretty(&rows)?);
            } else if rows.is_empty() {
                out!("no plugins in {}", registry.plugin_dir().display());
            } else {
                for r in rows {
                    match r.error {
                        Some(e) if r.state == "invalid" => out!("{:<16} invalid  {}", esc(&r.id), esc(&e)),
                        e => {
                            let caps: Vec<_> = r.granted_capabilities.iter().map(|c| c.name()).collect();
                            out!(
                                "{:<16} {:<8} {:<10} kinds={} granted=[{}] {}{}{}{}{}",
                                esc(&r.id),
                                r.state,
                                esc(&r.version),
                                esc(&r.kinds.join(",")),
                                caps.join(","),
                                r.signature.map(|s| s.to_string()).unwrap_or_default(),
                                if r.shadowed_kinds.is_empty() {
                                    String::new()
                                } else {
                                    format!(" shadowed={}", esc(&r.shadowed_kinds.join(",")))
                                },
                                if r.ambiguous_kinds.is_empty() {
                                    String::new()
                                } else {
                                    format!(
                                        " error: kinds {} are claimed by other plugins too and served by none (set plugins.priority)",
                                        esc(&r.ambiguous_kinds.join(","))
                                    )
                                },
                                if r.tier == Some(crate::runtime::tier::Tier::Baseline) {
                                    " tier=baseline (optimised build compiling)"
                                } else {
                                    ""
                                },
                                e.map(|e| format!(" error: {}", esc(&e))).unwrap_or_default()
                            );
                        }
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Agents { json } => {
            let host = crate::app::Host::start(config).await?;
            let registry = host.registry.clone();
            let snap = registry.snapshot();
            let mut notes =
                crate::registry::effort_notes(&snap, host.services.models.as_ref().ok().map(|m| m.as_ref()));
            notes.extend(crate::registry::bypass_notes(&snap, host.config.approval.allow_bypass));
            if json {
                #[derive(Serialize)]
                struct Agents<'a> {
                    agents: Vec<&'a crate::registry::Registered>,
                    problems: &'a [crate::registry::RegistryProblem],
                    notes: &'a [crate::registry::RegistryProblem],
                }
                let out =
                    Agents { agents: snap.definitions.values().collect(), problems: &snap.problems, notes: &notes };
                out!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                for r in snap.definitions.values() {
                    let d = &r.definition;
                    out!("{:<24} {:<8} {}  ({})", esc(&d.name), esc(&d.kind), esc(&d.description), esc(&r.source));
                }
                // The same lines as `warden config check`: `error:` for files refused,
                // `warning:` for what was ignored.
                for p in &snap.problems {
                    eprintln!("{}", esc(&p.line()));
                }
                for n in &notes {
                    eprintln!("note: {}: {}", esc(&n.source), esc(&n.message));
                }
            }
            // Refused files fail the listing as they fail `warden config check`.
            Ok(if snap.errors().is_empty() { ExitCode::SUCCESS } else { ExitCode::from(EXIT_USAGE) })
        }
        Command::Run { subagent_type, prompt, description, model, session, egress, json } => {
            // `--egress` given at all narrows (to what it lists); never given, nothing.
            let egress = (!egress.is_empty()).then_some(egress);
            let host = crate::app::Host::start(config).await?;
            let description = description.unwrap_or_else(|| crate::text::first_words(&prompt));
            let call = TaskCall { description, prompt, subagent_type, model, resume: None, run_in_background: false };
            let ephemeral = session.is_none();
            let session_id = session.unwrap_or_else(|| format!("sess_{}", uuid::Uuid::new_v4()));
            let result = run_on_terminal(&host, call, &session_id, false, !json, egress).await;
            if ephemeral {
                sandbox::end_session(&host, &session_id).await;
            }
            let outcome = match result? {
                Ok(o) => o,
                Err(e) => {
                    eprintln!("error: {}", esc(&e.to_string()));
                    return Ok(ExitCode::from(EXIT_USAGE));
                }
            };
            if json {
                out!("{}", serde_json::to_string(&outcome)?);
            } else {
                match (&outcome.status, &outcome.output, &outcome.error) {
                    (TaskState::Completed, Some(o), _) => out!("{}", esc_lines(o)),
                    (TaskState::InputRequired, Some(q), _) => out!("input required: {}", esc_lines(q)),
                    (_, _, Some(e)) => eprintln!("task {} failed: {}", outcome.task_id, esc(e)),
                    _ => {}
                }
            }
            Ok(if outcome.status == TaskState::Completed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_TASK_FAILED)
            })
        }
    }
}

#[derive(Serialize)]
struct Inspection {
    file: PathBuf,
    valid: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    world: &'static str,
    /// Every `warden:plugin` version the component names (one for a valid plugin).
    wit_versions: Vec<String>,
    /// The version the plugin is served as (when it loads).
    #[serde(skip_serializing_if = "Option::is_none")]
    wit_version: Option<crate::runtime::WitVersion>,
    /// The versions this warden loads.
    supported_wit: [crate::runtime::WitVersion; crate::runtime::WitVersion::SUPPORTED.len()],
    imports: Vec<String>,
    exports: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    info: Option<crate::plugin::PluginInfo>,
}

/// A runtime for one plugin file on the command line (`plugin inspect`, `test`, `build`):
/// no side effects (no compile cache written anywhere), and answers from a baseline build
/// for large components (seconds, not tens of seconds, for Python).
fn one_off_runtime(
    config: &Config,
    services: crate::services::HostServices,
) -> anyhow::Result<crate::runtime::Runtime> {
    crate::runtime::Runtime::new(
        crate::runtime::RuntimeOptions {
            compiler: crate::runtime::compiler::Compiler::default_for_start(config.plugins.compile_memory),
            tiered: true,
            ..crate::runtime::RuntimeOptions::uncached()
        },
        std::sync::Arc::new(services),
    )
}

/// A plugin file loaded as `warden plugin inspect` loads it: read within
/// `plugins.max_plugin_size`, nothing granted. The file's bytes and the runtime come back
/// too, to look further at a component that does not load.
struct Ungranted {
    runtime: crate::runtime::Runtime,
    bytes: Vec<u8>,
    loaded: Result<crate::runtime::LoadedPlugin, crate::runtime::LoadError>,
}

async fn load_ungranted(config: &Config, file: &Path) -> anyhow::Result<Ungranted> {
    let bytes = crate::registry::read_plugin_file(file, config.plugins.max_plugin_size)
        .await
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let runtime = one_off_runtime(config, crate::services::HostServices::new(vec![]))?;
    let id = crate::registry::plugin_id(file).unwrap_or_else(|| "inspected".into());
    let loaded = runtime.load(&id, file.to_owned(), &bytes, config.limits_for(&id), None).await;
    Ok(Ungranted { runtime, bytes, loaded })
}

async fn inspect(config: Config, file: &Path, json: bool) -> anyhow::Result<ExitCode> {
    // One compile when the plugin loads (its names come from that build); a second, for
    // the names alone, only when it does not.
    let Ungranted { runtime, bytes, loaded } = load_ungranted(&config, file).await?;
    let mut report = Inspection {
        file: file.to_owned(),
        valid: false,
        error: None,
        world: "warden:plugin/plugin",
        wit_versions: vec![],
        wit_version: None,
        supported_wit: crate::runtime::WitVersion::SUPPORTED,
        imports: vec![],
        exports: vec![],
        info: None,
    };
    let names = match &loaded {
        Ok(p) => Ok(p.component_names()),
        Err(_) => runtime.component_names(&bytes).await,
    };
    match names {
        Err(e) => report.error = Some(e.to_string()),
        Ok((imports, exports)) => {
            report.imports = imports;
            report.exports = exports;
            report.wit_versions =
                crate::runtime::WitVersion::named_in(report.imports.iter().chain(&report.exports).map(String::as_str));
            match loaded {
                Ok(p) => {
                    report.valid = true;
                    report.wit_version = Some(p.wit_version);
                    report.info = Some(p.info.clone());
                }
                Err(e) => report.error = Some(e.to_string()),
            }
        }
    }
    if json {
        out!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        out!("file:     {}", report.file.display());
        out!("valid:    {}", if report.valid { "yes" } else { "no" });
        if let Some(e) = &report.error {
            out!("error:    {}", esc(e));
        }
        out!("world:    {}", report.world);
        out!(
            "wit:      {} (this warden supports {})",
            esc(&report.wit_versions.join(", ")),
            crate::runtime::WitVersion::supported_range()
        );
        if let Some(i) = &report.info {
            out!("name:     {} {}", esc(&i.name), esc(&i.version));
            out!("kinds:    {}", esc(&i.kinds.join(", ")));
            let caps: Vec<_> = i.capabilities.iter().map(|c| c.name()).collect();
            out!("requests: {}", caps.join(", "));
        }
        out!("imports:");
        for i in &report.imports {
            out!("  {}", esc(i));
        }
        out!("exports:");
        for e in &report.exports {
            out!("  {}", esc(e));
        }
    }
    Ok(if report.valid { ExitCode::SUCCESS } else { ExitCode::from(EXIT_USAGE) })
}

#[cfg(test)]
mod tests {
    use super::log_filter;

    #[test]
    fn chatty_libraries_stay_at_warn_unless_named() {
        assert_eq!(log_filter(None).to_string(), "rmcp=warn,warn");
        let info = log_filter(Some("info")).to_string();
        assert!(info.contains("rmcp=warn") && info.contains("info"), "{info}");
        let named = log_filter(Some("info,rmcp=debug")).to_string();
        assert!(named.contains("rmcp=debug") && !named.contains("rmcp=warn"), "{named}");
        // An invalid filter falls back to `warn` instead of logging nothing or everything.
        assert_eq!(log_filter(Some("warden=loud")).to_string(), "warn");
    }
}
