//! `memory: user` across sessions: the agent's memory directory saved in the plugin's
//! `state` when a task ends, and put back into a new session's workspace when a fresh task
//! starts there.
//!
//! Claude Code keeps `user` memory in the user's home directory, so it follows the user
//! from project to project; `project` and `local` memory belong to the project. In warden a
//! project is the session's workspace, so `project` and `local` live and die with it, and
//! only `user` needs more: the host's plugin state is per (plugin, user) and lives in the
//! task store (it survives restarts, every replica reads it), which is exactly "per
//! (principal, agent)". Entries not written for `store.retention` expire, like every state
//! entry; every task of the agent that ends writes it again.
//!
//! Everything goes through the session's tools, as calls through the approval gate in the
//! task's stream, like the `MEMORY.md` read the memory prompt makes:
//!
//! - **Start** (any task of a `memory: user` agent): the directory is listed with `Glob`
//!   (id [`LIST_ID`]; the definition's tools include it for this, see
//!   [`crate::agent::host_tools`]) in the same batch as the prompt's `MEMORY.md` read. A
//!   fresh task whose directory has no `MEMORY.md` while state holds a [`Snapshot`] gets the
//!   saved files back with `Write` (ids `memory_restore_<n>`), except those the listing shows
//!   are there already (never overwritten); without a listing (no `Glob`, or it was declined
//!   or failed) nothing is written, since any file may be there. A write the approval gate
//!   declines is said in the prompt and the log, and its note is not shown either (a person
//!   or the policy said no to it); when the writes fail otherwise, or nothing was written
//!   for want of a listing, the prompt shows the saved `MEMORY.md` itself. Text from a
//!   snapshot in the prompt is framed as notes from earlier sessions, not instructions.
//! - **End** (whatever the outcome, as long as the tools answer): the directory is listed
//!   again (id [`SAVE_LIST_ID`]) and every file is read with `Read` (ids `memory_save_<n>`,
//!   one batch), within [`MAX_FILES`], [`MAX_FILE_BYTES`] and [`MAX_BYTES`]; what is past a
//!   bound is left out with a warning. A file whose read fails (declined, not text, not
//!   shown whole) keeps its saved copy; a saved file the session's directory never held (its
//!   restore failed, a resumed task in another session) is kept; a file that was there when
//!   the task started (or was restored) and is gone now was deleted by the agent and is
//!   dropped. When nothing of the directory could be observed nothing is written.
//!
//! The saved value is hostile input when it comes back (a corrupt store, another plugin
//! version): a value that does not parse or has another [`SNAPSHOT_VERSION`] is ignored
//! with a warning, and each file must have a [`safe_relative_path`] under the agent's
//! directory and text within the bounds, else it is dropped with a warning. Paths the
//! listing shows pass the same check. The key and the directory are per exact agent name
//! ([`memory_dir_name`] is injective) and the snapshot names its agent exactly, so an agent
//! file whose name differs from a trusted one's only in spelling (`code reviewer`,
//! `code-reviewer`) never reads or plants the other's notes.
//!
//! Concurrent tasks of one user and agent in different sessions: the last to end wins.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use warden_guest::log::Level;
use warden_guest::{ToolCall, ToolResult, ToolSpec};

use crate::agent::{MEMORY_LIST_TOOL, USER_SCOPE, memory_dir, memory_dir_name};
use crate::host::Host;

/// Format version of the [`Snapshot`] stored in `state`; a value of another version is
/// ignored (with a warning) rather than misread. Version 1 keyed and named snapshots by a
/// lossy sanitised agent name that several agents could share, so its values are not
/// trusted (2: the exact name, under [`state_key`]'s injective key).
pub const SNAPSHOT_VERSION: u32 = 2;

/// Most files kept in a snapshot (the index first, then the newest): notes, not a file
/// store. Also the host's limit on calls in one batch, so the reads and the restore each
/// fit one batch.
pub const MAX_FILES: usize = 64;

/// Largest file kept (bytes of text): notes are short; a bigger file is left out.
pub const MAX_FILE_BYTES: usize = 64 * 1024;

/// Most bytes of text kept in a snapshot altogether: far below the host's default state
/// value limit (4 MiB) and its per-user budget, so memory never crowds out transcripts.
pub const MAX_BYTES: usize = 256 * 1024;

/// Longest relative path kept (bytes); longer names are left out.
pub const MAX_PATH_BYTES: usize = 512;

/// The memory index, shown in the system prompt.
pub const INDEX: &str = "MEMORY.md";

/// Id of the `Glob` call that lists the directory when a task starts.
pub const LIST_ID: &str = "memory_list";

/// Id of the `Glob` call that lists the directory when a task ends.
pub const SAVE_LIST_ID: &str = "memory_save_list";

/// What the sandbox's `Read` answers for an empty file, after the path (mirrors
/// warden-sandbox's `tools/files.rs`).
const READ_EMPTY_SUFFIX: &str = " exists but is empty)";

/// What the sandbox's `Read` puts at the end of a line it cut (mirrors
/// warden-sandbox's `tools/files.rs`): a file with one is not saved as if it were whole.
const READ_LINE_CUT: &str = "… [line truncated]";

/// How the sandbox's `Read` and `Glob` say a path is missing.
const MISSING_FILE: &str = "File does not exist";
const MISSING_PATH: &str = "Path does not exist";

/// The sandbox's `Glob` answer when nothing matched.
const NO_FILES: &str = "No files found";

/// Longest excerpt of a tool's error text quoted in a warning or the prompt.
const REASON_CHARS: usize = 200;

/// How the host answers a call its approval gate did not let run (mirrors
/// warden-approval's `Verdict::declined_message`): `The <tool> call was not run: ` and then
/// one of [`GATE_DECLINED_REASONS`].
const GATE_NOT_RUN: &str = " call was not run: ";

/// The reasons [`GATE_NOT_RUN`] gives when a policy or a person said no (or nobody said yes
/// in time), as opposed to a call the host could not run at all (a canceled task, the
/// tool-call limit).
const GATE_DECLINED_REASONS: &[&str] = &["denied by the approval policy", "declined"];

/// Whether `result` says the approval gate declined the `tool` call: a person or the policy
/// said no, so what the call carried must not reach the agent another way.
pub fn declined_by_gate(result: &ToolResult, tool: &str) -> bool {
    result.is_error
        && result
            .content
            .strip_prefix("The ")
            .and_then(|rest| rest.strip_prefix(tool))
            .and_then(|rest| rest.strip_prefix(GATE_NOT_RUN))
            .is_some_and(|why| GATE_DECLINED_REASONS.iter().any(|r| why.starts_with(r)))
}

/// Why nothing is restored when the directory could not be listed: what it holds is
/// unknown, and a restore never writes over a file that is there.
const UNLISTED: &str = "the memory directory could not be listed, so nothing was written over what it may hold";

/// What is stored under [`state_key`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub version: u32,
    /// The agent's exact name (compared exactly when the value is loaded).
    pub agent: String,
    pub files: Vec<SavedFile>,
}

/// One file of the directory: its path relative to it and its text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedFile {
    pub path: String,
    pub content: String,
}

impl Snapshot {
    pub fn file(&self, path: &str) -> Option<&SavedFile> {
        self.files.iter().find(|f| f.path == path)
    }
}

/// The `state` key of an agent's user memory: `memory/user/<directory name>`, with the
/// injective [`memory_dir_name`], so no two agents share a key.
pub fn state_key(agent: &str) -> String {
    format!("memory/user/{}", memory_dir_name(agent))
}

/// Whether `path` may name a file under the memory directory: `/`-separated parts, none
/// empty, `.` or `..` (so not absolute and never out of the directory), no control or
/// invisible format character (the sandbox refuses those in paths, and a person approving a
/// call must see the real name), no backslash, at most [`MAX_PATH_BYTES`].
pub fn safe_relative_path(path: &str) -> bool {
    !path.is_empty()
        && path.len() <= MAX_PATH_BYTES
        && !path.chars().any(|c| c.is_control() || c == '\\' || is_invisible_format(c))
        && path.split('/').all(|part| !part.is_empty() && part != "." && part != "..")
}

/// The invisible format characters the sandbox refuses in paths (bidirectional overrides
/// and isolates, zero-width characters, the BOM, the soft hyphen).
fn is_invisible_format(c: char) -> bool {
    matches!(c, '\u{00AD}' | '\u{061C}' | '\u{180E}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}')
}

/// A saved value, checked: `None` (with the warnings why) when it is not a snapshot of this
/// version for this agent; otherwise the files that pass every check, in order, within the
/// bounds, first of each path only.
pub fn parse_snapshot(bytes: &[u8], agent: &str) -> (Option<Snapshot>, Vec<String>) {
    let mut warnings = Vec::new();
    #[derive(Deserialize)]
    struct Version {
        version: u32,
    }
    let version = match serde_json::from_slice::<Version>(bytes) {
        Ok(v) => v.version,
        Err(e) => {
            warnings.push(format!("saved memory of subagent `{agent}` ignored: it is not a memory snapshot ({e})"));
            return (None, warnings);
        }
    };
    if version != SNAPSHOT_VERSION {
        warnings.push(format!(
            "saved memory of subagent `{agent}` ignored: it has format version {version}, this plugin reads {SNAPSHOT_VERSION}"
        ));
        return (None, warnings);
    }
    let snapshot: Snapshot = match serde_json::from_slice(bytes) {
        Ok(s) => s,
        Err(e) => {
            warnings.push(format!("saved memory of subagent `{agent}` ignored: it is not a memory snapshot ({e})"));
            return (None, warnings);
        }
    };
    if snapshot.agent != agent {
        warnings.push(format!(
            "saved memory of subagent `{agent}` ignored: it was saved for `{}`",
            excerpt(&snapshot.agent)
        ));
        return (None, warnings);
    }
    let mut kept = Bounded::default();
    for file in snapshot.files {
        if !safe_relative_path(&file.path) {
            warnings.push(format!("saved memory file {:?} dropped: not a plain relative path", excerpt(&file.path)));
        } else if file.content.contains('\0') {
            warnings.push(format!("saved memory file {} dropped: it is not text", file.path));
        } else if kept.has(&file.path) {
            warnings.push(format!("saved memory file {} dropped: it is saved twice", file.path));
        } else if let Err(why) = kept.push(file.clone()) {
            warnings.push(format!("saved memory file {} dropped: {why}", file.path));
        }
    }
    (Some(Snapshot { version: SNAPSHOT_VERSION, agent: agent.to_string(), files: kept.files }), warnings)
}

/// Files gathered within [`MAX_FILES`], [`MAX_FILE_BYTES`] and [`MAX_BYTES`].
#[derive(Debug, Default)]
struct Bounded {
    files: Vec<SavedFile>,
    bytes: usize,
}

impl Bounded {
    fn has(&self, path: &str) -> bool {
        self.files.iter().any(|f| f.path == path)
    }

    /// Adds the file, or says which bound it is past.
    fn push(&mut self, file: SavedFile) -> Result<(), String> {
        if file.content.len() > MAX_FILE_BYTES {
            return Err(format!("{} bytes, over the {MAX_FILE_BYTES}-byte limit per file", file.content.len()));
        }
        if self.files.len() >= MAX_FILES {
            return Err(format!("the memory already holds {MAX_FILES} files, the most kept"));
        }
        if self.bytes + file.content.len() > MAX_BYTES {
            return Err(format!("past the {MAX_BYTES}-byte limit of the whole memory"));
        }
        self.bytes += file.content.len();
        self.files.push(file);
        Ok(())
    }
}

/// What the `Read` of one file gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileRead {
    /// The file's whole text (line ends as `\n`, the last line ended).
    Text(String),
    /// It does not exist.
    Missing,
    /// It exists but `Read` did not show it whole (too long, a line cut, not text).
    NotWhole(String),
    /// The call failed or was declined.
    Failed(String),
}

/// Reads a `Read` result as the whole text of `path`. The sandbox's `Read` numbers every
/// line (`cat -n`); anything but consecutive numbered lines from 1 (a "showing lines"
/// footer, a truncation notice, a cut line) means the text is not whole.
pub fn file_read(result: &ToolResult, path: &str) -> FileRead {
    let content = result.content.as_str();
    if result.is_error {
        return match content.starts_with(MISSING_FILE) {
            true => FileRead::Missing,
            false if content.contains("binary file") => FileRead::NotWhole("it is not text".into()),
            false => FileRead::Failed(excerpt(content.strip_prefix("error: ").unwrap_or(content))),
        };
    }
    if content == format!("(the file {path}{READ_EMPTY_SUFFIX}") {
        return FileRead::Text(String::new());
    }
    let not_whole = |why: &str| FileRead::NotWhole(why.into());
    let Some(body) = content.strip_suffix('\n') else {
        return not_whole("Read did not show it whole");
    };
    let mut text = String::with_capacity(body.len());
    for (i, line) in body.split('\n').enumerate() {
        let Some((number, rest)) = line.split_once('\t') else {
            return not_whole("Read did not show it whole");
        };
        let digits = number.trim_start_matches(' ');
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits != (i + 1).to_string() {
            return not_whole("Read did not show it whole");
        }
        if rest.ends_with(READ_LINE_CUT) {
            return not_whole("a line is longer than Read shows");
        }
        text.push_str(rest);
        text.push('\n');
    }
    FileRead::Text(text)
}

/// What the directory listing gave: relative paths (newest first), or `None` when it could
/// not be listed.
fn listing(result: &ToolResult, dir: &str, warnings: &mut Vec<String>) -> Option<Vec<String>> {
    let content = result.content.trim_end();
    if result.is_error {
        if content.starts_with(MISSING_PATH) {
            return Some(Vec::new());
        }
        warnings.push(format!("memory directory {dir} not listed: {}", excerpt(content)));
        return None;
    }
    if content == NO_FILES {
        return Some(Vec::new());
    }
    let prefix = format!("{dir}/");
    let mut files = Vec::new();
    let mut skipped = 0usize;
    for line in content.lines().filter(|l| !l.trim().is_empty()) {
        match line.strip_prefix(&prefix) {
            Some(rel) if safe_relative_path(rel) => {
                if !files.iter().any(|f| f == rel) {
                    files.push(rel.to_string());
                }
            }
            _ if line.starts_with("(Results are truncated") => {
                warnings.push(format!("memory directory {dir} holds more files than one listing shows"));
            }
            _ => skipped += 1,
        }
    }
    if skipped > 0 {
        warnings.push(format!(
            "{skipped} entries of the memory directory {dir} are not kept: not plain relative names under it"
        ));
    }
    Some(files)
}

/// At most [`REASON_CHARS`] characters of `text`, control characters as spaces.
fn excerpt(text: &str) -> String {
    let mut out: String =
        text.trim().chars().take(REASON_CHARS).map(|c| if c.is_control() { ' ' } else { c }).collect();
    if text.trim().chars().count() > REASON_CHARS {
        out.push('…');
    }
    out
}

fn read_call(id: String, file_path: String, limit: usize) -> ToolCall {
    ToolCall {
        id,
        name: "Read".into(),
        arguments: serde_json::json!({ "file_path": file_path, "limit": limit }).to_string(),
    }
}

/// What the restore did, for the memory prompt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restored {
    /// Files written back.
    pub written: Vec<String>,
    /// Files whose write the approval gate declined, with why: a person or the policy
    /// said no to these notes, so they are not shown to the agent either.
    pub declined: Vec<(String, String)>,
    /// Files not written back for another reason, with why.
    pub failed: Vec<(String, String)>,
    /// The saved `MEMORY.md`, when there is one.
    pub index: Option<String>,
}

/// One task's view of its agent's user memory (see the module docs).
#[derive(Debug)]
pub struct UserMemory {
    agent: String,
    dir: String,
    key: String,
    stored: Option<Snapshot>,
    /// Relative paths the session's directory is known to have held since the task
    /// started (the start listing, `MEMORY.md` when the prompt read it, the files restored):
    /// only those can have been deleted by the agent.
    seen: BTreeSet<String>,
    can_read: bool,
    can_write: bool,
    can_list: bool,
}

impl UserMemory {
    /// Loads what state holds for the agent. `offered`: the tools the agent's model gets
    /// (`Read` and `Write` must be among them: the plugin does with its memory only what
    /// the agent may); `available`: every tool the host lets the task call (`Glob`).
    pub fn load(host: &mut dyn Host, agent: &str, offered: &[ToolSpec], available: &[String]) -> Self {
        let key = state_key(agent);
        let stored = match host.state_get(&key) {
            Ok(Some(bytes)) => {
                let (snapshot, warnings) = parse_snapshot(&bytes, agent);
                for w in warnings {
                    host.log(Level::Warn, &w);
                }
                snapshot
            }
            Ok(None) => None,
            Err(e) => {
                host.log(Level::Warn, &format!("saved memory of subagent `{agent}` not loaded: {e}"));
                None
            }
        };
        let offers = |name: &str| offered.iter().any(|t| t.name == name);
        UserMemory {
            agent: agent.to_string(),
            dir: memory_dir(USER_SCOPE, agent),
            key,
            stored,
            seen: BTreeSet::new(),
            can_read: offers("Read"),
            can_write: offers("Write"),
            can_list: available.iter().any(|t| t == MEMORY_LIST_TOOL),
        }
    }

    pub fn stored(&self) -> Option<&Snapshot> {
        self.stored.as_ref()
    }

    /// The `Glob` call listing the directory, when the task can list it and read what it
    /// finds (without `Read` nothing can be saved, so nothing is listed).
    pub fn list_call(&self, id: &str) -> Option<ToolCall> {
        (self.can_list && self.can_read).then(|| ToolCall {
            id: id.into(),
            name: MEMORY_LIST_TOOL.into(),
            arguments: serde_json::json!({ "pattern": "**", "path": self.dir }).to_string(),
        })
    }

    /// Takes the start listing (`None`: no listing was made or it failed); `index_found`:
    /// the prompt's read found `MEMORY.md`. Returns the listing.
    pub fn started(
        &mut self,
        host: &mut dyn Host,
        result: Option<&ToolResult>,
        index_found: bool,
    ) -> Option<Vec<String>> {
        let mut warnings = Vec::new();
        let files = result.and_then(|r| listing(r, &self.dir, &mut warnings));
        for w in warnings {
            host.log(Level::Warn, &w);
        }
        self.seen.extend(files.iter().flatten().cloned());
        if index_found {
            self.seen.insert(INDEX.into());
        }
        files
    }

    /// Lists the directory when a task starts without the memory prompt (a resumed task),
    /// so what it deletes is known.
    pub fn list_at_start(&mut self, host: &mut dyn Host) {
        let Some(call) = self.list_call(LIST_ID) else { return };
        match host.call_tools(std::slice::from_ref(&call)) {
            Ok(results) => {
                self.started(host, results.first(), false);
            }
            Err(e) => host.log(Level::Warn, &format!("memory directory {} not listed: {e}", self.dir)),
        }
    }

    /// Writes the saved files back into a directory without `MEMORY.md` (all but those
    /// `present`, which are never overwritten; with no listing, `None`, nothing is written,
    /// since any file may be there); `None` when nothing is saved.
    pub fn restore(&mut self, host: &mut dyn Host, present: Option<&[String]>) -> Option<Restored> {
        let snapshot = self.stored.clone().filter(|s| !s.files.is_empty())?;
        let mut restored = Restored { index: snapshot.file(INDEX).map(|f| f.content.clone()), ..Restored::default() };
        let wanted: Vec<&SavedFile> =
            snapshot.files.iter().filter(|f| !present.is_some_and(|p| p.contains(&f.path))).collect();
        if wanted.is_empty() {
            return Some(restored);
        }
        let unwritten = match (self.can_write, present) {
            (false, _) => Some("this subagent has no Write tool in this session"),
            (true, None) => Some(UNLISTED),
            (true, Some(_)) => None,
        };
        if let Some(why) = unwritten {
            restored.failed = wanted.iter().map(|f| (f.path.clone(), why.to_string())).collect();
            host.log(Level::Warn, &format!("memory of subagent `{}` not restored: {why}", self.agent));
            return Some(restored);
        }
        let calls: Vec<ToolCall> = wanted
            .iter()
            .enumerate()
            .map(|(i, f)| ToolCall {
                id: format!("memory_restore_{i}"),
                name: "Write".into(),
                arguments: serde_json::json!({ "file_path": format!("{}/{}", self.dir, f.path), "content": f.content })
                    .to_string(),
            })
            .collect();
        match host.call_tools(&calls) {
            Ok(results) => {
                for (i, file) in wanted.iter().enumerate() {
                    match results.get(i) {
                        Some(r) if !r.is_error => restored.written.push(file.path.clone()),
                        Some(r) if declined_by_gate(r, "Write") => {
                            restored.declined.push((file.path.clone(), excerpt(&r.content)))
                        }
                        Some(r) => restored.failed.push((file.path.clone(), excerpt(&r.content))),
                        None => restored.failed.push((file.path.clone(), "the host returned no result".into())),
                    }
                }
            }
            Err(e) => {
                restored.failed = wanted.iter().map(|f| (f.path.clone(), e.to_string())).collect();
            }
        }
        self.seen.extend(restored.written.iter().cloned());
        if !restored.written.is_empty() {
            host.log(
                Level::Info,
                &format!(
                    "restored {} files of the memory of subagent `{}` from an earlier session",
                    restored.written.len(),
                    self.agent
                ),
            );
        }
        for (path, why) in restored.declined.iter().chain(&restored.failed) {
            host.log(Level::Warn, &format!("memory file {path} of subagent `{}` not restored: {why}", self.agent));
        }
        Some(restored)
    }

    /// Saves the directory into state (see the module docs); every problem is a warning.
    pub fn save(&mut self, host: &mut dyn Host) {
        let agent = self.agent.clone();
        if !self.can_read {
            host.log(Level::Warn, &format!("memory of subagent `{agent}` not saved: it has no Read tool"));
            return;
        }
        let mut warnings = Vec::new();
        let listed = match self.list_call(SAVE_LIST_ID) {
            None => None,
            Some(call) => match host.call_tools(std::slice::from_ref(&call)) {
                Ok(results) => results.first().and_then(|r| listing(r, &self.dir, &mut warnings)),
                Err(e) => {
                    host.log(Level::Warn, &format!("memory of subagent `{agent}` not saved: {e}"));
                    return;
                }
            },
        };
        // What to read: the listing (the index first), or without one the index and the
        // saved files.
        let mut candidates: Vec<String> = Vec::new();
        match &listed {
            Some(files) => {
                if files.iter().any(|f| f == INDEX) {
                    candidates.push(INDEX.into());
                }
                candidates.extend(files.iter().filter(|f| *f != INDEX).cloned());
            }
            None => {
                candidates.push(INDEX.into());
                let saved = self.stored.iter().flat_map(|s| s.files.iter().map(|f| &f.path));
                candidates.extend(saved.filter(|f| *f != INDEX).cloned());
            }
        }
        if candidates.len() > MAX_FILES {
            warnings.push(format!(
                "memory of subagent `{agent}`: {} files left out (at most {MAX_FILES} are kept, the newest): {}",
                candidates.len() - MAX_FILES,
                candidates[MAX_FILES..].join(", ")
            ));
            candidates.truncate(MAX_FILES);
        }
        let reads: Vec<FileRead> = if candidates.is_empty() {
            Vec::new()
        } else {
            let calls: Vec<ToolCall> = candidates
                .iter()
                .enumerate()
                .map(|(i, rel)| read_call(format!("memory_save_{i}"), format!("{}/{rel}", self.dir), MAX_FILE_BYTES))
                .collect();
            match host.call_tools(&calls) {
                Ok(results) => candidates
                    .iter()
                    .enumerate()
                    .map(|(i, rel)| match results.get(i) {
                        Some(r) => file_read(r, &format!("{}/{rel}", self.dir)),
                        None => FileRead::Failed("the host returned no result".into()),
                    })
                    .collect(),
                Err(e) => {
                    for w in warnings {
                        host.log(Level::Warn, &w);
                    }
                    host.log(Level::Warn, &format!("memory of subagent `{agent}` not saved: {e}"));
                    return;
                }
            }
        };

        let mut observed = listed.is_some();
        let mut kept = Bounded::default();
        let mut carry: Vec<&SavedFile> = Vec::new();
        let mut missing: Vec<&str> = Vec::new();
        let saved = |path: &str| self.stored.as_ref().and_then(|s| s.file(path));
        for (rel, read) in candidates.iter().zip(reads) {
            match read {
                FileRead::Text(content) => {
                    observed = true;
                    if let Err(why) = kept.push(SavedFile { path: rel.clone(), content }) {
                        warnings.push(format!("memory file {rel} of subagent `{agent}` not saved: {why}"));
                    }
                }
                FileRead::Missing => {
                    observed = true;
                    missing.push(rel);
                }
                FileRead::NotWhole(why) => {
                    observed = true;
                    warnings.push(format!("memory file {rel} of subagent `{agent}` not saved: {why}"));
                }
                FileRead::Failed(why) => match saved(rel) {
                    Some(file) => {
                        warnings.push(format!(
                            "memory file {rel} of subagent `{agent}` not read ({why}); its saved copy is kept"
                        ));
                        carry.push(file);
                    }
                    None => warnings.push(format!("memory file {rel} of subagent `{agent}` not saved: {why}")),
                },
            }
        }
        // A saved file the directory does not have now (read and missing, or not listed)
        // was deleted if the task saw it there; otherwise this session never held it (its
        // restore failed, a resumed task in another session) and the saved copy is kept.
        // One read but not whole, past a bound or past the listing's first MAX_FILES is
        // left out (said above).
        for file in self.stored.iter().flat_map(|s| s.files.iter()) {
            let read = candidates.contains(&file.path);
            let absent = match read {
                true => missing.contains(&file.path.as_str()),
                false => listed.as_ref().is_some_and(|l| !l.contains(&file.path)),
            };
            if absent && !self.seen.contains(&file.path) && !kept.has(&file.path) {
                carry.push(file);
            }
        }
        for file in carry {
            if kept.has(&file.path) {
                continue;
            }
            if let Err(why) = kept.push(file.clone()) {
                warnings.push(format!("saved memory file {} of subagent `{agent}` dropped: {why}", file.path));
            }
        }
        for w in warnings {
            host.log(Level::Warn, &w);
        }
        if !observed {
            host.log(
                Level::Warn,
                &format!("memory of subagent `{agent}` not saved: nothing of its directory could be read"),
            );
            return;
        }
        if kept.files.is_empty() && self.stored.is_none() {
            return;
        }
        let snapshot = Snapshot { version: SNAPSHOT_VERSION, agent: agent.clone(), files: kept.files };
        let json = serde_json::to_vec(&snapshot).expect("a snapshot serialises");
        match host.state_set(&self.key, &json) {
            Ok(()) => host.log(
                Level::Info,
                &format!(
                    "saved {} files ({} bytes) of the memory of subagent `{agent}` for its later sessions",
                    snapshot.files.len(),
                    kept.bytes
                ),
            ),
            Err(e) => host.log(Level::Warn, &format!("memory of subagent `{agent}` not saved: {e}")),
        }
    }
}
