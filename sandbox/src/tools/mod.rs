//! The sandbox tools with Claude Code's names and parameters: Read, Write, Edit, Glob,
//! Grep, Bash — their schemas and the single entry point [`Sandbox::call_tool`].
//!
//! This layer parses and validates input and formats results; the work happens in the
//! session's container. It must never run a tool outside the session's sandbox, never skip
//! path confinement, and never log tool input environment values (they carry secrets).

mod bash;
mod files;
mod search;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::atomic::Ordering;

pub use crate::agent::ResolvedPath;
use crate::agent::{TextClass, check_text};
use crate::error::SandboxError;
use crate::session::{Sandbox, SessionKey};

/// Names of every tool this crate provides, in `tool_specs` order.
pub const TOOL_NAMES: [&str; 6] = ["Read", "Write", "Edit", "Glob", "Grep", "Bash"];
/// Most environment variables one call may pass.
const MAX_ENV_VARS: usize = 64;

/// The result of one tool call, as the model sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolOutput {
    /// Text for the model (capped at `sandbox.max_output`, truncation stated).
    pub content: String,
    /// True when the tool failed in the ordinary way (missing file, non-zero exit, ...).
    pub is_error: bool,
}

impl ToolOutput {
    pub(crate) fn ok(content: impl Into<String>) -> Self {
        Self { content: content.into(), is_error: false }
    }

    pub(crate) fn error(content: impl Into<String>) -> Self {
        Self { content: content.into(), is_error: true }
    }
}

/// A tool's name, description and JSON Schema for its input (for the model's tool list).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Claude Code's tool name.
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// JSON Schema of the input object.
    pub input_schema: Value,
}

/// Specs of every sandbox tool.
pub fn tool_specs() -> Vec<ToolSpec> {
    let spec = |name: &str, description: &str, input_schema: Value| ToolSpec {
        name: name.into(),
        description: description.into(),
        input_schema,
    };
    vec![
        spec(
            "Read",
            "Reads a file from the session workspace (/workspace). Returns lines numbered like `cat -n`, starting at 1. By default reads up to 2000 lines from the start; use offset and limit for long files. Binary files are reported, not shown.",
            json!({"type":"object","properties":{
                "file_path":{"type":"string","description":"Path of the file (absolute under /workspace, or relative to it)"},
                "offset":{"type":"integer","minimum":1,"description":"Line number to start reading from"},
                "limit":{"type":"integer","minimum":1,"description":"Number of lines to read"}},
                "required":["file_path"],"additionalProperties":false}),
        ),
        spec(
            "Write",
            "Writes a file in the session workspace, replacing it if it exists and creating parent directories.",
            json!({"type":"object","properties":{
                "file_path":{"type":"string","description":"Path of the file (absolute under /workspace, or relative to it)"},
                "content":{"type":"string","description":"The content to write"}},
                "required":["file_path","content"],"additionalProperties":false}),
        ),
        spec(
            "Edit",
            "Replaces exact text in a file. old_string must occur exactly once unless replace_all is true.",
            json!({"type":"object","properties":{
                "file_path":{"type":"string","description":"Path of the file to modify"},
                "old_string":{"type":"string","description":"The text to replace"},
                "new_string":{"type":"string","description":"The replacement text (must differ from old_string)"},
                "replace_all":{"type":"boolean","default":false,"description":"Replace every occurrence"}},
                "required":["file_path","old_string","new_string"],"additionalProperties":false}),
        ),
        spec(
            "Glob",
            "Finds files by glob pattern (e.g. `**/*.rs`), newest first. Searches /workspace unless path is given.",
            json!({"type":"object","properties":{
                "pattern":{"type":"string","description":"The glob pattern to match files against"},
                "path":{"type":"string","description":"Directory to search in (default /workspace)"}},
                "required":["pattern"],"additionalProperties":false}),
        ),
        spec(
            "Grep",
            "Searches file contents with ripgrep (regular expressions). output_mode: files_with_matches (default), content, count.",
            json!({"type":"object","properties":{
                "pattern":{"type":"string","description":"Regular expression to search for"},
                "path":{"type":"string","description":"File or directory to search (default /workspace)"},
                "glob":{"type":"string","description":"Only search files matching this glob (rg --glob)"},
                "type":{"type":"string","description":"Only search files of this type (rg --type), e.g. rust, py"},
                "output_mode":{"type":"string","enum":["content","files_with_matches","count"]},
                "-i":{"type":"boolean","description":"Case insensitive"},
                "-n":{"type":"boolean","description":"Line numbers (content mode; default true)"},
                "-A":{"type":"integer","minimum":0,"description":"Lines after each match (content mode)"},
                "-B":{"type":"integer","minimum":0,"description":"Lines before each match (content mode)"},
                "-C":{"type":"integer","minimum":0,"description":"Lines around each match (content mode)"},
                "multiline":{"type":"boolean","description":"Let patterns span lines (rg -U --multiline-dotall)"},
                "head_limit":{"type":"integer","minimum":1,"description":"Only the first N lines/entries of output"}},
                "required":["pattern"],"additionalProperties":false}),
        ),
        spec(
            "Bash",
            "Runs a bash command in the session sandbox (the working directory persists between calls; exported variables do not, so set them in the same command that needs them; every process a call starts, including `&` jobs, `nohup`, `setsid` and daemons, ends with the call: nothing keeps running in the background; files in /workspace persist, also when an idle session is paused (its container stopped; no process survives a pause); no network unless the operator allows it). Returns stdout, stderr and the exit code. timeout is in milliseconds (max 600000).",
            json!({"type":"object","properties":{
                "command":{"type":"string","description":"The command to run"},
                "timeout":{"type":"integer","minimum":1,"maximum":bash::MAX_TIMEOUT_MS,"description":"Timeout in milliseconds"},
                "description":{"type":"string","description":"What the command does, in a few words"},
                "run_in_background":{"type":"boolean","description":"Not supported in the sandbox; use `cmd > file 2>&1 &`"}},
                "required":["command"],"additionalProperties":false}),
        ),
    ]
}

/// Fields whose text is data written into a file, not a name, pattern or command: any
/// character is allowed (they travel as length-prefixed bytes).
const CONTENT_FIELDS: [&str; 3] = ["content", "old_string", "new_string"];

/// The one input check every tool call passes before anything reaches a container: every
/// string field is refused when it holds NUL, and every field but commands and file
/// content when it holds any other control character. The error names tool and field.
pub(crate) fn validate_strings(tool: &str, input: &Value) -> Result<(), SandboxError> {
    fn walk(tool: &str, field: &str, v: &Value) -> Result<(), SandboxError> {
        match v {
            Value::String(s) => {
                let class = if field == "command" || CONTENT_FIELDS.contains(&field) {
                    TextClass::Command
                } else {
                    TextClass::Strict
                };
                check_text(tool, field, s, class)
            }
            Value::Array(items) => items.iter().try_for_each(|x| walk(tool, field, x)),
            Value::Object(map) => map.iter().try_for_each(|(k, x)| {
                check_text(tool, "field name", k, TextClass::Strict)?;
                walk(tool, k, x)
            }),
            _ => Ok(()),
        }
    }
    walk(tool, "input", input)
}

pub(crate) fn parse<T: DeserializeOwned>(tool: &str, input: Value) -> Result<T, SandboxError> {
    validate_strings(tool, &input)?;
    serde_json::from_value(input)
        .map_err(|e| SandboxError::InvalidInput { tool: tool.to_string(), message: e.to_string() })
}

pub(crate) fn validate_env(env: &[(String, String)]) -> Result<(), SandboxError> {
    if env.len() > MAX_ENV_VARS {
        return Err(SandboxError::InvalidInput {
            tool: "Bash".into(),
            message: format!("more than {MAX_ENV_VARS} environment variables"),
        });
    }
    for (name, value) in env {
        let mut chars = name.chars();
        let ok_start = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if !ok_start || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') || value.contains('\0') {
            // The value is deliberately not shown: it may be a secret.
            return Err(SandboxError::InvalidInput {
                tool: "Bash".into(),
                message: format!("environment variable name `{name}` is not a shell identifier (or its value has NUL)"),
            });
        }
    }
    Ok(())
}

/// [`validate_env`] for a task's own variables, whose names must also pass the one
/// validator of names from outside warden ([`crate::environment::check_name`]): the host
/// checked them when the task was submitted, this is the second line.
pub(crate) fn validate_task_env(env: &[(String, String)]) -> Result<(), SandboxError> {
    validate_env(env)?;
    for (name, _) in env {
        crate::environment::check_name(name)
            .map_err(|e| SandboxError::InvalidInput { tool: "Bash".into(), message: e.to_string() })?;
    }
    Ok(())
}

/// The path field a file tool reads or writes (Read/Write/Edit `file_path`, Glob/Grep
/// `path`, default /workspace), or `None` for tools without one.
pub fn tool_path(tool: &str, input: &Value) -> Option<String> {
    let field = match tool {
        "Read" | "Write" | "Edit" => "file_path",
        "Glob" | "Grep" => "path",
        _ => return None,
    };
    match input.get(field).and_then(Value::as_str) {
        Some(p) if !p.is_empty() => Some(p.to_string()),
        _ if field == "path" => Some(crate::container::WORKSPACE.to_string()),
        _ => None,
    }
}

impl Sandbox {
    /// The path a file tool would really use for `path`: symlinks resolved beneath
    /// /workspace (a link out of it is an error). The host shows it to the approval policy
    /// besides the path as given, so a rule about `.env` also covers `docs/link-to-env`,
    /// and then pins the call to it with [`Sandbox::call_tool_pinned`].
    pub async fn resolve_path(&self, key: &SessionKey, path: &str) -> Result<ResolvedPath, SandboxError> {
        let ctx = self.session(key, &[]).await?;
        let t = crate::workspace::resolve(&ctx, path, crate::workspace::Purpose::Read).await?;
        let other_names = t.kind == crate::workspace::Kind::File && t.links > 1;
        Ok(ResolvedPath { path: t.path, other_names, identity: t.identity })
    }

    /// Where a file a shell command names leads (`path` absolute, beneath /workspace), as
    /// the kernel resolves it for the command (`..` after links); `tree`: the command reads
    /// or writes everything beneath it, so a directory holding files with other hard links
    /// has [`ResolvedPath::other_names`] too. For the approval gate's judgement of a Bash
    /// call's file operands (`warden_approval::shell_files`).
    pub async fn resolve_shell_path(
        &self,
        key: &SessionKey,
        path: &str,
        tree: bool,
    ) -> Result<ResolvedPath, SandboxError> {
        let ctx = self.session(key, &[]).await?;
        let t = crate::workspace::resolve_as_kernel(&ctx, path, tree).await?;
        let other_names = (t.kind == crate::workspace::Kind::File && t.links > 1) || t.linked > 0;
        Ok(ResolvedPath { path: t.path, other_names, identity: t.identity })
    }

    /// The working directory the session's next Bash call with `secrets` starts in
    /// (`/workspace` for a new session, or for the first call with these secrets): what
    /// the approval gate judges a command's relative paths from.
    pub async fn shell_cwd(&self, key: &SessionKey, secrets: &[(String, String)]) -> Result<String, SandboxError> {
        Ok(self.session(key, secrets).await?.shell_cwd())
    }

    /// Runs one tool call in the session's sandbox (creating the container on first use).
    ///
    /// `env` is extra environment for Bash (per-task secrets); it is never logged and not
    /// persisted in the session's shell state. `Ok` with `is_error` is an ordinary tool
    /// failure; `Err` is a refused request or an infrastructure failure — the host should
    /// show its `Display` to the model as an error result.
    pub async fn call_tool(
        &self,
        key: &SessionKey,
        tool: &str,
        input: Value,
        env: &[(String, String)],
    ) -> Result<ToolOutput, SandboxError> {
        self.call_tool_pinned(key, tool, input, env, None).await
    }

    /// [`Sandbox::call_tool`], refusing the call when its path no longer resolves to
    /// `approved`, or to another file there (a link or a file swapped between the
    /// approval and the call).
    #[tracing::instrument(skip(self, input, env, approved), fields(user = %key.user_id, session = %key.session_id))]
    pub async fn call_tool_pinned(
        &self,
        key: &SessionKey,
        tool: &str,
        input: Value,
        env: &[(String, String)],
        approved: Option<&ResolvedPath>,
    ) -> Result<ToolOutput, SandboxError> {
        self.inner.metrics.tool_calls.fetch_add(1, Ordering::Relaxed);
        let result = self.dispatch(key, tool, input, env, approved).await.map_err(|e| self.name_host(key, e));
        if !matches!(result, Ok(ToolOutput { is_error: false, .. })) {
            self.inner.metrics.tool_errors.fetch_add(1, Ordering::Relaxed);
        }
        match &result {
            Ok(out) => tracing::debug!(tool, is_error = out.is_error, bytes = out.content.len(), "tool call done"),
            Err(e) => tracing::debug!(tool, error = %e, "tool call refused or failed"),
        }
        result
    }

    async fn dispatch(
        &self,
        key: &SessionKey,
        tool: &str,
        input: Value,
        env: &[(String, String)],
        approved: Option<&ResolvedPath>,
    ) -> Result<ToolOutput, SandboxError> {
        // Validate before touching Docker, so bad calls fail the same way everywhere.
        let cap = self.inner.config.max_output.0 as usize;
        match tool {
            "Read" => {
                let i = parse::<files::ReadInput>(tool, input)?;
                let ctx = self.session(key, env).await?.pinned(approved);
                files::read(&ctx, i, cap).await
            }
            "Write" => {
                let i = parse::<files::WriteInput>(tool, input)?;
                let ctx = self.session(key, env).await?.pinned(approved);
                files::write(&ctx, i).await
            }
            "Edit" => {
                let i = parse::<files::EditInput>(tool, input)?;
                let ctx = self.session(key, env).await?.pinned(approved);
                files::edit(&ctx, i).await
            }
            // Glob and Grep take no lane (`lanes`): ripgrep runs with no secrets in its
            // environment and no code the model chose, so it has nothing to steal and
            // steals nothing; it runs beside any command.
            "Glob" => {
                let i = parse::<search::GlobInput>(tool, input)?;
                let ctx = self.session(key, env).await?.pinned(approved);
                search::glob(&ctx, i, cap).await
            }
            "Grep" => {
                let i = parse::<search::GrepInput>(tool, input)?;
                let ctx = self.session(key, env).await?.pinned(approved);
                search::grep(&ctx, i, cap).await
            }
            // Waits for its secret lane (`lanes`) inside `bash::run`.
            "Bash" => {
                let i = parse::<bash::BashInput>(tool, input)?;
                validate_task_env(env)?;
                let timeout = bash::timeout_of(&i, self.inner.config.exec_timeout)?;
                let ctx = self.session(key, env).await?.pinned(approved);
                bash::run(&ctx, i, timeout, cap).await
            }
            other => Err(SandboxError::UnknownTool(other.to_string())),
        }
    }
}
