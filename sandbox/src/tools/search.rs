//! Glob and Grep, both run by ripgrep inside the session container.
//!
//! ripgrep gets its arguments as an argv (never through a shell), searches only the confined
//! path and does not follow symlinks. This module must never pass `-L`/`--follow` or any
//! option that reads files named by the input outside the confined path.

use serde::Deserialize;

use super::ToolOutput;
use crate::agent::Op;
use crate::container::WORKSPACE;
use crate::error::SandboxError;
use crate::exec::ExecResult;
use crate::exec::cap_text;
use crate::session::SessionCtx;
use crate::workspace::{self, Kind, Purpose};

/// Most paths Glob returns (Claude Code's limit); the rest are counted, not listed.
pub const GLOB_MAX_RESULTS: usize = 100;
/// Longest line ripgrep prints in content mode (minified files would flood the model).
pub const GREP_MAX_COLUMNS: usize = 500;
/// Exit code of ripgrep when nothing matched.
const RG_NO_MATCH: i64 = 1;

#[derive(Debug, Deserialize)]
pub(crate) struct GlobInput {
    pattern: String,
    path: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum OutputMode {
    Content,
    #[default]
    FilesWithMatches,
    Count,
}

#[derive(Debug, Deserialize)]
pub(crate) struct GrepInput {
    pattern: String,
    path: Option<String>,
    glob: Option<String>,
    #[serde(rename = "type")]
    file_type: Option<String>,
    #[serde(default)]
    output_mode: OutputMode,
    #[serde(rename = "-i", default)]
    case_insensitive: bool,
    #[serde(rename = "-n")]
    line_numbers: Option<bool>,
    #[serde(rename = "-A")]
    after: Option<u32>,
    #[serde(rename = "-B")]
    before: Option<u32>,
    #[serde(rename = "-C")]
    context: Option<u32>,
    #[serde(default)]
    multiline: bool,
    head_limit: Option<usize>,
}

/// The directory or file to search: given (confined) or /workspace.
async fn search_root(
    ctx: &SessionCtx<'_>,
    path: Option<&str>,
) -> Result<Result<(String, Kind), ToolOutput>, SandboxError> {
    let given = path.filter(|p| !p.is_empty()).unwrap_or(WORKSPACE);
    let t = workspace::resolve(ctx, given, Purpose::Read).await?;
    Ok(match t.kind {
        Kind::Missing => Err(ToolOutput::error(format!("Path does not exist: {given}"))),
        Kind::Other(k) => Err(ToolOutput::error(format!("{given} is not a file or directory ({k})"))),
        k => Ok((t.path, k)),
    })
}

/// Runs ripgrep with its last argument (the search root) pinned: the agent opens the
/// resolved root without following links and hands ripgrep that open file, so a root
/// swapped for a link after the check is never searched.
///
/// `reads`: the search reads file contents (Grep), so a file beneath the root with other
/// hard links — names no rule was checked against, a denied file's perhaps — refuses it.
async fn run_rg(ctx: &SessionCtx<'_>, argv: &[String], root: &str, reads: bool) -> Result<ExecResult, SandboxError> {
    let pin = Some((root, argv.len() - 1));
    let r = ctx.call(Op::Exec { argv, env: &[], pin, refuse_linked: reads }, ctx.inner.config.exec_timeout).await?;
    r.outcome.ok_for(root)?;
    Ok(r)
}

fn rg_base() -> Vec<String> {
    // Hidden files are searched (agents need .env.example, .github, ...), .git is not.
    ["rg", "--color", "never", "--hidden", "--glob", "!.git"].iter().map(|s| s.to_string()).collect()
}

pub(crate) async fn glob(ctx: &SessionCtx<'_>, input: GlobInput, cap: usize) -> Result<ToolOutput, SandboxError> {
    let (root, kind) = match search_root(ctx, input.path.as_deref()).await? {
        Ok(r) => r,
        Err(out) => return Ok(out),
    };
    if kind != Kind::Dir {
        return Ok(ToolOutput::error(format!("{root} is not a directory")));
    }
    // Patterns are relative to the search root; accept ones written from /workspace too.
    let pattern = input.pattern.strip_prefix(&format!("{root}/")).unwrap_or(&input.pattern).to_string();
    let mut argv = rg_base();
    argv.extend([
        "--files".into(),
        "--sortr".into(),
        "modified".into(),
        "--glob".into(),
        pattern,
        "--".into(),
        root.clone(),
    ]);
    let r = run_rg(ctx, &argv, &root, false).await?;
    if r.timed_out {
        return Ok(ToolOutput::error("Glob timed out; narrow the path or pattern"));
    }
    let stdout = r.stdout.text();
    match r.exit_code {
        0 => {}
        RG_NO_MATCH if stdout.trim().is_empty() => return Ok(ToolOutput::ok("No files found")),
        code if stdout.trim().is_empty() => {
            return Ok(ToolOutput::error(format!("Glob failed (rg exit {code}): {}", r.stderr.text().trim())));
        }
        _ => {}
    }
    let files: Vec<&str> = stdout.lines().filter(|l| !l.is_empty()).collect();
    let mut out = files.iter().take(GLOB_MAX_RESULTS).copied().collect::<Vec<_>>().join("\n");
    if files.len() > GLOB_MAX_RESULTS {
        out.push_str(&format!(
            "\n(Results are truncated: showing {GLOB_MAX_RESULTS} of {}. Use a more specific path or pattern.)",
            files.len()
        ));
    }
    Ok(ToolOutput::ok(cap_text(out, cap)))
}

pub(crate) async fn grep(ctx: &SessionCtx<'_>, input: GrepInput, cap: usize) -> Result<ToolOutput, SandboxError> {
    if input.pattern.is_empty() {
        return Err(SandboxError::InvalidInput { tool: "Grep".into(), message: "pattern must not be empty".into() });
    }
    if input.head_limit == Some(0) {
        return Err(SandboxError::InvalidInput {
            tool: "Grep".into(),
            message: "head_limit must be at least 1".into(),
        });
    }
    let (root, _) = match search_root(ctx, input.path.as_deref()).await? {
        Ok(r) => r,
        Err(out) => return Ok(out),
    };
    let mut argv = rg_base();
    match input.output_mode {
        OutputMode::FilesWithMatches => {
            argv.extend(["--files-with-matches".into(), "--sortr".into(), "modified".into()])
        }
        OutputMode::Count => argv.extend(["--count".into(), "--with-filename".into(), "--sort".into(), "path".into()]),
        OutputMode::Content => {
            argv.extend(["--with-filename".into(), "--sort".into(), "path".into()]);
            argv.extend(["--max-columns".into(), GREP_MAX_COLUMNS.to_string(), "--max-columns-preview".into()]);
            if input.line_numbers.unwrap_or(true) {
                argv.push("--line-number".into());
            }
            for (flag, v) in [("-A", input.after), ("-B", input.before), ("-C", input.context)] {
                if let Some(n) = v {
                    argv.extend([flag.to_string(), n.to_string()]);
                }
            }
        }
    }
    if input.case_insensitive {
        argv.push("--ignore-case".into());
    }
    if input.multiline {
        argv.extend(["--multiline".into(), "--multiline-dotall".into()]);
    }
    if let Some(g) = input.glob.filter(|g| !g.is_empty()) {
        argv.extend(["--glob".into(), g]);
    }
    if let Some(t) = input.file_type.filter(|t| !t.is_empty()) {
        argv.extend(["--type".into(), t]);
    }
    argv.extend(["--regexp".into(), input.pattern, "--".into(), root.clone()]);
    let r = run_rg(ctx, &argv, &root, true).await?;
    if r.timed_out {
        return Ok(ToolOutput::error("Grep timed out; narrow the path, glob or type"));
    }
    let stdout = r.stdout.text();
    match r.exit_code {
        RG_NO_MATCH => {
            return Ok(ToolOutput::ok(match input.output_mode {
                OutputMode::FilesWithMatches => "No files found",
                _ => "No matches found",
            }));
        }
        0 => {}
        code if stdout.trim().is_empty() => {
            return Ok(ToolOutput::error(format!("Grep failed (rg exit {code}): {}", r.stderr.text().trim())));
        }
        _ => {}
    }
    let lines: Vec<&str> = stdout.lines().collect();
    let limit = input.head_limit.unwrap_or(usize::MAX);
    let shown: Vec<&str> = lines.iter().take(limit).copied().collect();
    let mut out = String::new();
    if input.output_mode == OutputMode::FilesWithMatches {
        out.push_str(&format!("Found {} file{}\n", lines.len(), if lines.len() == 1 { "" } else { "s" }));
    }
    out.push_str(&shown.join("\n"));
    if lines.len() > shown.len() {
        out.push_str(&format!("\n[showing the first {} of {} lines (head_limit)]", shown.len(), lines.len()));
    }
    Ok(ToolOutput::ok(cap_text(out, cap)))
}
