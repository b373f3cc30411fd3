//! Read, Write and Edit, plus the host's binary-safe `upload_file` / `download_file`.
//!
//! File bytes travel as data frames of the agent protocol, and the agent opens the resolved
//! path as the sandbox user without following any link. These functions must never touch a
//! path that `workspace::resolve` has not confined, and never show binary content as text.

use serde::Deserialize;

use super::ToolOutput;
use crate::agent::Op;
use crate::error::SandboxError;
use crate::exec::FILE_OP_TIMEOUT;
use crate::exec::cap_text;
use crate::session::{Sandbox, SessionCtx, SessionKey};
use crate::workspace::{self, Kind, Purpose, Target};

/// Lines Read returns when the call gives no limit (Claude Code's default).
pub const DEFAULT_READ_LIMIT: usize = 2000;
/// Characters kept per line in Read output; longer lines are cut (minified files).
pub const MAX_LINE_CHARS: usize = 2000;
/// Largest file Read and Edit load and Write writes (bigger files: use Bash with head/sed,
/// or Grep); also keeps every agent request far below its frame limit.
pub const MAX_TEXT_FILE_BYTES: u64 = 32 * 1024 * 1024;
/// Largest file `upload_file` / `download_file` move in one call.
pub const MAX_TRANSFER_BYTES: u64 = 256 * 1024 * 1024;
/// Bytes inspected for NUL when deciding whether a file is binary (as git and grep do).
const BINARY_SNIFF_BYTES: usize = 8000;

#[derive(Debug, Deserialize)]
pub(crate) struct ReadInput {
    file_path: String,
    offset: Option<usize>,
    limit: Option<usize>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct WriteInput {
    file_path: String,
    content: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct EditInput {
    file_path: String,
    old_string: String,
    new_string: String,
    #[serde(default)]
    replace_all: bool,
}

/// The content as text, or `Err(its size)` when it is binary: NUL bytes early on, or
/// invalid UTF-8 (validated once, without a copy).
fn text_of(bytes: Vec<u8>) -> Result<String, usize> {
    if bytes[..bytes.len().min(BINARY_SNIFF_BYTES)].contains(&0) {
        return Err(bytes.len());
    }
    String::from_utf8(bytes).map_err(|e| e.as_bytes().len())
}

/// Appends `n` right-aligned in six columns and a tab, as `cat -n` does (`{:>6}\t` without
/// the formatting machinery: Read numbers every line it shows).
fn push_line_number(out: &mut String, n: usize) {
    /// `cat -n`'s width; wider numbers take the room they need.
    const WIDTH: usize = 6;
    let mut buf = [b' '; 20];
    let (mut at, mut n) = (buf.len(), n);
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.push_str(std::str::from_utf8(&buf[at.min(buf.len() - WIDTH)..]).expect("ASCII digits and spaces"));
    out.push('\t');
}

fn not_a_file(path: &str, t: &Target) -> Option<ToolOutput> {
    match &t.kind {
        Kind::File => None,
        Kind::Missing => Some(ToolOutput::error(format!("File does not exist: {path}"))),
        Kind::Dir => {
            Some(ToolOutput::error(format!("{path} is a directory, not a file; use Glob or Bash `ls` to list it")))
        }
        Kind::Other(k) => Some(ToolOutput::error(format!("{path} is not a regular file ({k})"))),
    }
}

/// Reads a confined file through the agent (no link followed; at most `max` bytes).
async fn fetch(ctx: &SessionCtx<'_>, t: &Target, max: u64) -> Result<Vec<u8>, SandboxError> {
    let r = ctx.call(Op::Read { path: &t.path, max, expect: t.identity }, FILE_OP_TIMEOUT).await?;
    r.outcome.ok_for(&t.path)?;
    Ok(r.data)
}

/// Replaces a confined file through the agent (no link followed; mode kept when it existed).
async fn store(ctx: &SessionCtx<'_>, t: &Target, data: &[u8]) -> Result<(), SandboxError> {
    let r = ctx.call(Op::Write { path: &t.path, data }, FILE_OP_TIMEOUT).await?;
    r.outcome.ok_for(&t.path)
}

pub(crate) async fn read(ctx: &SessionCtx<'_>, input: ReadInput, cap: usize) -> Result<ToolOutput, SandboxError> {
    let path = input.file_path.as_str();
    let t = workspace::resolve(ctx, path, Purpose::Read).await?;
    if let Some(out) = not_a_file(path, &t) {
        return Ok(out);
    }
    if t.size > MAX_TEXT_FILE_BYTES {
        return Ok(ToolOutput::error(format!(
            "{path} is {} bytes, over Read's {MAX_TEXT_FILE_BYTES}-byte limit; use Grep, or Bash with head/sed to see parts of it",
            t.size
        )));
    }
    let text = match text_of(fetch(ctx, &t, MAX_TEXT_FILE_BYTES).await?) {
        Ok(text) => text,
        Err(size) => {
            return Ok(ToolOutput::error(format!(
                "{path} is a binary file ({size} bytes); Read shows text only. Inspect it with Bash, e.g. `od -A x -t x1z {path} | head`"
            )));
        }
    };
    if text.is_empty() {
        return Ok(ToolOutput::ok(format!("(the file {path} exists but is empty)")));
    }
    let total = text.lines().count();
    let start = input.offset.unwrap_or(1).max(1);
    let limit = input.limit.unwrap_or(DEFAULT_READ_LIMIT).max(1);
    if start > total {
        return Ok(ToolOutput::error(format!("offset {start} is past the end of {path}, which has {total} lines")));
    }
    let mut out = String::with_capacity(text.len().min(cap) + 64);
    let mut shown = 0;
    for (i, line) in text.lines().enumerate().skip(start - 1).take(limit) {
        push_line_number(&mut out, i + 1);
        // A line of at most MAX_LINE_CHARS bytes has no more chars than that: not scanned.
        let cut = if line.len() > MAX_LINE_CHARS { line.char_indices().nth(MAX_LINE_CHARS) } else { None };
        match cut {
            Some((cut, _)) => {
                out.push_str(&line[..cut]);
                out.push_str("… [line truncated]");
            }
            None => out.push_str(line),
        }
        out.push('\n');
        shown += 1;
        if out.len() > cap * 2 {
            break;
        }
    }
    let last = start - 1 + shown;
    if last < total {
        out.push_str(&format!("[showing lines {start}-{last} of {total}; use offset/limit to read more]\n"));
    }
    Ok(ToolOutput::ok(cap_text(out, cap)))
}

pub(crate) async fn write(ctx: &SessionCtx<'_>, input: WriteInput) -> Result<ToolOutput, SandboxError> {
    let path = input.file_path.as_str();
    if input.content.len() as u64 > MAX_TEXT_FILE_BYTES {
        return Ok(ToolOutput::error(format!(
            "content is {} bytes, over Write's {MAX_TEXT_FILE_BYTES}-byte limit; write the file in parts with Bash",
            input.content.len()
        )));
    }
    let t = workspace::resolve(ctx, path, Purpose::Write).await?;
    let existed = match &t.kind {
        Kind::Missing => false,
        Kind::File => true,
        _ => return Ok(not_a_file(path, &t).expect("not a file")),
    };
    store(ctx, &t, input.content.as_bytes()).await?;
    Ok(ToolOutput::ok(if existed {
        format!("The file {path} has been overwritten ({} bytes).", input.content.len())
    } else {
        format!("File created successfully at: {path} ({} bytes).", input.content.len())
    }))
}

pub(crate) async fn edit(ctx: &SessionCtx<'_>, input: EditInput) -> Result<ToolOutput, SandboxError> {
    let path = input.file_path.as_str();
    if input.old_string.is_empty() {
        return Ok(ToolOutput::error("old_string must not be empty; use Write to create a file"));
    }
    if input.old_string == input.new_string {
        return Ok(ToolOutput::error("No changes to make: old_string and new_string are exactly the same."));
    }
    let t = workspace::resolve(ctx, path, Purpose::Read).await?;
    if let Some(out) = not_a_file(path, &t) {
        return Ok(out);
    }
    if t.size > MAX_TEXT_FILE_BYTES {
        return Ok(ToolOutput::error(format!("{path} is over Edit's {MAX_TEXT_FILE_BYTES}-byte limit")));
    }
    let Ok(text) = text_of(fetch(ctx, &t, MAX_TEXT_FILE_BYTES).await?) else {
        return Ok(ToolOutput::error(format!("{path} is a binary file; Edit changes text files only")));
    };
    let count = text.matches(input.old_string.as_str()).count();
    if count == 0 {
        return Ok(ToolOutput::error(format!("String to replace not found in {path}.")));
    }
    if count > 1 && !input.replace_all {
        return Ok(ToolOutput::error(format!(
            "Found {count} matches of the string to replace in {path}, but replace_all is false. To replace all, set replace_all to true; to replace one, give more surrounding context so old_string is unique."
        )));
    }
    // Checked before building it: a short old_string replaced everywhere by a long one
    // would otherwise make the host build a string many times the limit.
    let replaced = if input.replace_all { count } else { 1 };
    let new_len = (text.len() as u64)
        .saturating_sub(replaced as u64 * input.old_string.len() as u64)
        .saturating_add(replaced as u64 * input.new_string.len() as u64);
    if new_len > MAX_TEXT_FILE_BYTES {
        return Ok(ToolOutput::error(format!(
            "the edited {path} would be {new_len} bytes, over Edit's {MAX_TEXT_FILE_BYTES}-byte limit"
        )));
    }
    let updated = if input.replace_all {
        text.replace(&input.old_string, &input.new_string)
    } else {
        text.replacen(&input.old_string, &input.new_string, 1)
    };
    store(ctx, &t, updated.as_bytes()).await?;
    Ok(ToolOutput::ok(format!(
        "The file {path} has been updated ({count} replacement{}).",
        if count == 1 { "" } else { "s" }
    )))
}

impl Sandbox {
    /// Writes raw bytes to a confined path in the session workspace (binary-safe; creates
    /// parent directories). For the host (attachments) and tests; not a model-facing tool.
    pub async fn upload_file(&self, key: &SessionKey, path: &str, data: &[u8]) -> Result<(), SandboxError> {
        if data.len() as u64 > MAX_TRANSFER_BYTES {
            return Err(SandboxError::File {
                path: path.into(),
                message: format!("larger than the {MAX_TRANSFER_BYTES}-byte transfer limit"),
            });
        }
        let ctx = self.session(key, &[]).await?;
        let t = workspace::resolve(&ctx, path, Purpose::Write).await?;
        match &t.kind {
            Kind::Missing | Kind::File => store(&ctx, &t, data).await,
            _ => Err(SandboxError::File { path: path.into(), message: "exists and is not a regular file".into() }),
        }
    }

    /// Reads raw bytes from a confined path in the session workspace (binary-safe). At most
    /// [`crate::MAX_CONCURRENT_DOWNLOADS`] run at once in this sandbox; others wait.
    pub async fn download_file(&self, key: &SessionKey, path: &str) -> Result<Vec<u8>, SandboxError> {
        // Never closed: the semaphore lives as long as the sandbox.
        let _permit = self.inner.downloads.acquire().await.map_err(|_| SandboxError::ShutDown)?;
        let ctx = self.session(key, &[]).await?;
        let t = workspace::resolve(&ctx, path, Purpose::Read).await?;
        match &t.kind {
            Kind::File => fetch(&ctx, &t, MAX_TRANSFER_BYTES).await,
            Kind::Missing => Err(SandboxError::File { path: path.into(), message: "does not exist".into() }),
            _ => Err(SandboxError::File { path: path.into(), message: "is not a regular file".into() }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_numbers_are_those_of_cat_n() {
        for n in [1, 9, 10, 99_999, 999_999, 1_000_000, 123_456_789, usize::MAX] {
            let mut out = String::from("x");
            push_line_number(&mut out, n);
            assert_eq!(out, format!("x{n:>6}\t"));
        }
    }

    #[test]
    fn text_is_utf8_without_early_nul() {
        assert_eq!(text_of(b"a\nb".to_vec()), Ok("a\nb".to_string()));
        assert_eq!(text_of(b"a\0b".to_vec()), Err(3));
        assert_eq!(text_of(vec![b'a', 0xff]), Err(2));
        assert_eq!(text_of(Vec::new()), Ok(String::new()));
    }
}
