//! The wire protocol of the in-container agent (`agent.py`): typed operations out,
//! length-prefixed frames back.
//!
//! Tool arguments never share a channel with control data: a request is a list of
//! length-prefixed fields, a response a sequence of typed, length-prefixed frames ending in
//! one result frame. Before anything is encoded, [`check_text`] refuses NUL (and, for
//! paths and patterns, every other control character) with an error that names the field,
//! so no byte a model chooses can start a second command or forge a result.
//!
//! This module owns the encoding and decoding only, and the one path the protocol is built
//! on, [`WORKSPACE`]; running a request on a live exec is `exec.rs`, mounting the workspace
//! there is `container.rs`. It must never accept a frame larger than its limit, never treat
//! command output as anything but data, and never encode a string it has not checked.

use std::collections::HashMap;
use std::time::Duration;

use crate::error::SandboxError;

/// The agent's source, run as root as `python3 -I -S -c <AGENT_SOURCE> serve <uid> <gid>`
/// (isolated mode: no `PYTHON*` variables, no site packages, so nothing in the container
/// can alter it); it drops to the sandbox user before it reads anything.
pub(crate) const AGENT_SOURCE: &str = include_str!("agent.py");

/// Mount point of the session's workspace volume; every file tool is confined to it. The
/// agent's source assumes it (`WS` in `agent.py`): it resolves and opens every path
/// beneath it, and every exec starts in it.
pub const WORKSPACE: &str = "/workspace";

/// The session's *use mark* in the container: created empty by the host's workspace setup
/// (root's, mode 0600, so nothing sandboxed can open, touch or lock it); every serving agent
/// holds a shared lock on it during a request and writes it at the request's start and end,
/// so its mtime is the last use by any replica and a held lock means a call is running
/// (`agent.py`'s `USE_MARK`, which must match). On the container's /tmp: it lives and dies
/// with the container.
#[allow(dead_code, reason = "the agent's own path, named here for the host's readers; a test keeps the two in step")]
pub(crate) const USE_MARK: &str = "/tmp/.warden-used";

/// The container's *sweep turn* (`agent.py`'s `SWEEP_LOCK`, which must match): every sweep
/// of the agent stops all of the sandbox user's processes while it reads /proc, so two at
/// once could stop each other for good; each round holds an exclusive lock on this file.
/// Root's, mode 0600, made by the host's workspace setup before any sandboxed code runs;
/// every process that sweeps opens it as root before it drops to the sandbox user, so no
/// sandboxed process can hold, write or plant it. On /tmp, like the use mark.
#[allow(dead_code, reason = "the agent's own path, named here for the host's readers; a test keeps the two in step")]
pub(crate) const SWEEP_LOCK: &str = "/tmp/.warden-sweep";

/// The settings every process of a container starts with (resource limits, niceness, CPU
/// affinity), recorded by the agent's `prepare` before any sandboxed code runs (`agent.py`'s
/// `SETTINGS_RECORD`, which must match): root's, mode 0644. A serving agent whose own
/// settings differ (a command changed them) exits before its next request.
#[allow(dead_code, reason = "the agent's own path, named here for the host's readers; a test keeps the two in step")]
pub(crate) const SETTINGS_RECORD: &str = "/tmp/.warden-settings";

/// Where the agent records settled session processes (`agent.py`'s `SETTLED`, which must
/// match): a directory of root's, mode 0755, made by the host's workspace setup before any
/// sandboxed code runs, so the sandbox user reads the records but can never write one. One
/// file per session process: it and the descendants it had once settled, the only ones
/// that may run beside a command (see `agent.py`). On /tmp, like the use mark.
pub(crate) const SETTLED_DIR: &str = "/tmp/.warden-settled";

/// The variable in a session process's environment whose value (the host's random tag)
/// names it to the agent's `settle` (`agent.py`'s `TAG_VAR`, which must match). Only the
/// host starts exec roots, so an exec root carrying a tag is the process given it.
pub(crate) const PROCESS_TAG_VAR: &str = "WARDEN_SESSION_PROCESS";

/// Largest payload of one response frame the host accepts (the agent sends 64 KiB chunks).
pub(crate) const MAX_FRAME: usize = 1024 * 1024;
/// Frame header: kind byte + u32 length.
const FRAME_HEADER: usize = 5;

/// Which characters a text field may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TextClass {
    /// Paths, patterns, globs, names: no control characters at all (C0, DEL).
    Strict,
    /// Shell commands: no NUL; other control characters reach the approval recognizer,
    /// which asks a person about anything it does not model.
    Command,
}

/// Refuses `value` when it holds a byte its class forbids; the error names tool and field.
pub(crate) fn check_text(tool: &str, field: &str, value: &str, class: TextClass) -> Result<(), SandboxError> {
    let bad = value.char_indices().find(|(_, c)| match class {
        TextClass::Strict => c.is_control() || is_invisible_format(*c),
        TextClass::Command => *c == '\0',
    });
    match bad {
        None => Ok(()),
        Some((at, c)) => Err(SandboxError::InvalidInput {
            tool: tool.to_string(),
            message: format!(
                "`{field}` contains the control or invisible format character U+{:04X} at byte {at}; {} are refused",
                c as u32,
                match class {
                    TextClass::Strict => "control and invisible format characters",
                    TextClass::Command => "NUL bytes",
                }
            ),
        }),
    }
}

/// Unicode format characters that change how a name is displayed without being seen
/// (bidirectional overrides and isolates, zero-width characters, the BOM, soft hyphen):
/// a path holding one could show a person approving it a different path.
fn is_invisible_format(c: char) -> bool {
    matches!(c, '\u{00AD}' | '\u{061C}' | '\u{180E}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}')
}

/// Where a tool path leads, as `Sandbox::resolve_path` found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedPath {
    /// The path after symlink resolution beneath /workspace.
    pub path: String,
    /// A regular file with more than one hard link: it has names (perhaps a denied one)
    /// that no check saw, so a policy should not allow it without asking.
    pub other_names: bool,
    /// Which file it named (none when missing): a call pinned to this path uses only
    /// that file ([`FileIdentity`]).
    pub identity: Option<FileIdentity>,
}

impl ResolvedPath {
    /// A working directory a Bash call is pinned to (it runs there or not at all).
    pub fn directory(path: String) -> Self {
        ResolvedPath { path, other_names: false, identity: None }
    }
}

/// Which file a path named when it was checked: its device and inode. A file opened
/// later is the checked one only if its identity is the same (a hard link of another file
/// renamed over the name is not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    pub dev: u64,
    pub ino: u64,
}

/// What the host asks the agent to do.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op<'a> {
    /// Run argv (no shell) with extra environment. `pin`: a resolved path under /workspace
    /// the agent opens without following links; argv[`pin_arg`] is replaced by that open
    /// file, and the open file's name in the output is replaced by the path.
    /// `refuse_linked`: refuse to run when a regular file beneath the pinned directory
    /// (outside `.git`) has more than one hard link — a search would read it under a name
    /// no rule was checked against.
    Exec { argv: &'a [String], env: &'a [(String, String)], pin: Option<(&'a str, usize)>, refuse_linked: bool },
    /// Run a Bash command in `cwd` with the container's environment plus the task's
    /// variables `env` (never one of the container's own); the agent reports the shell's
    /// physical working directory at its end in a state frame.
    Bash { command: &'a str, env: &'a [(String, String)], cwd: &'a str },
    /// Resolve a path beneath /workspace (symlinks followed, never out of it); `tree`: for
    /// a directory, also count the regular files beneath it (outside `.git`) that have
    /// other hard links (`linked`, at most a few).
    Stat { path: &'a str, for_write: bool, tree: bool },
    /// Read a resolved regular file of at most `max` bytes, following no link; when
    /// `expect` is given, only if the opened file is that one (device and inode).
    Read { path: &'a str, max: u64, expect: Option<FileIdentity> },
    /// Replace a resolved file with `data`, following no link (parents created).
    Write { path: &'a str, data: &'a [u8] },
    /// Kill what settled session processes started that their records do not hold, then
    /// the orphans (after a session process's call: `Sandbox::contain`).
    Contain,
}

impl Op<'_> {
    /// The request's fields; `nonce` comes back in the result; `timeout`/`grace`/`cap`
    /// only matter for commands.
    pub(crate) fn encode(&self, nonce: &str, timeout: Duration, grace: Duration, cap: usize) -> Vec<u8> {
        let mut f = Fields::default();
        let op = match self {
            Op::Exec { .. } => "exec",
            Op::Bash { .. } => "bash",
            Op::Stat { .. } => "stat",
            Op::Read { .. } => "read",
            Op::Write { .. } => "write",
            Op::Contain => "contain",
        };
        f.text(op);
        f.text(nonce);
        let limits = |f: &mut Fields| {
            f.num(timeout.as_millis().max(1) as u64);
            f.num(grace.as_millis() as u64);
            f.num(cap as u64);
        };
        match self {
            Op::Exec { argv, env, pin, refuse_linked } => {
                limits(&mut f);
                f.text(pin.map(|p| p.0).unwrap_or(""));
                f.text(&pin.map(|p| p.1 as i64).unwrap_or(-1).to_string());
                f.text(if *refuse_linked { "refuse-linked" } else { "" });
                f.num(argv.len() as u64);
                argv.iter().for_each(|a| f.text(a));
                f.num(env.len() as u64);
                env.iter().for_each(|(k, v)| {
                    f.text(k);
                    f.text(v)
                });
            }
            Op::Bash { command, env, cwd } => {
                limits(&mut f);
                f.text(command);
                f.num(env.len() as u64);
                env.iter().for_each(|(k, v)| {
                    f.text(k);
                    f.text(v)
                });
                f.text(cwd);
            }
            Op::Stat { path, for_write, tree } => {
                f.text(path);
                f.text(if *for_write { "write" } else { "read" });
                f.text(if *tree { "tree" } else { "" });
            }
            Op::Read { path, max, expect } => {
                f.text(path);
                f.num(*max);
                f.text(&expect.map(|id| format!("{}:{}", id.dev, id.ino)).unwrap_or_default());
            }
            Op::Write { path, data } => {
                f.text(path);
                f.bytes(data);
            }
            Op::Contain => {}
        }
        f.finish()
    }
}

#[derive(Default)]
struct Fields(Vec<u8>);

impl Fields {
    fn bytes(&mut self, b: &[u8]) {
        self.0.extend_from_slice(&(b.len() as u32).to_be_bytes());
        self.0.extend_from_slice(b);
    }
    fn text(&mut self, s: &str) {
        self.bytes(s.as_bytes())
    }
    fn num(&mut self, n: u64) {
        self.text(&n.to_string())
    }
    fn finish(self) -> Vec<u8> {
        let mut out = (self.0.len() as u32).to_be_bytes().to_vec();
        out.extend(self.0);
        out
    }
}

/// One decoded response frame.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    /// The agent's first frame: its pid and start time (fields).
    Hello(HashMap<String, String>),
    /// What a Bash command exported: `cwd\0K=V\0…`.
    State(Vec<u8>),
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Data(Vec<u8>),
    /// The last frame: the result fields.
    Result(HashMap<String, String>),
}

impl Frame {
    /// The frame's kind, for error messages.
    pub(crate) fn kind_name(&self) -> &'static str {
        match self {
            Frame::Hello(_) => "hello",
            Frame::State(_) => "state",
            Frame::Stdout(_) => "stdout",
            Frame::Stderr(_) => "stderr",
            Frame::Data(_) => "data",
            Frame::Result(_) => "result",
        }
    }
}

/// Reassembles frames from the exec's output stream, whatever its chunking.
#[derive(Default)]
pub(crate) struct FrameReader {
    buf: Vec<u8>,
}

impl FrameReader {
    pub(crate) fn feed(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete frame; `Err` when the stream is not the protocol (garbage on the
    /// agent's stdout, an oversized frame).
    pub(crate) fn next(&mut self) -> Result<Option<Frame>, String> {
        if self.buf.len() < FRAME_HEADER {
            return Ok(None);
        }
        let len = u32::from_be_bytes(self.buf[1..5].try_into().expect("4 bytes")) as usize;
        if len > MAX_FRAME {
            return Err(format!("agent frame of {len} bytes is over the {MAX_FRAME}-byte limit"));
        }
        if self.buf.len() < FRAME_HEADER + len {
            return Ok(None);
        }
        let kind = self.buf[0];
        let payload: Vec<u8> = self.buf[FRAME_HEADER..FRAME_HEADER + len].to_vec();
        self.buf.drain(..FRAME_HEADER + len);
        Ok(Some(match kind {
            b'o' => Frame::Stdout(payload),
            b'e' => Frame::Stderr(payload),
            b'd' => Frame::Data(payload),
            b'h' => Frame::Hello(decode_result(&payload)?),
            b's' => Frame::State(payload),
            b'r' => Frame::Result(decode_result(&payload)?),
            k => return Err(format!("unknown agent frame kind {k:#04x}")),
        }))
    }
}

fn decode_result(mut p: &[u8]) -> Result<HashMap<String, String>, String> {
    let mut items = Vec::new();
    while !p.is_empty() {
        if p.len() < 4 {
            return Err("truncated result field".into());
        }
        let n = u32::from_be_bytes(p[..4].try_into().expect("4 bytes")) as usize;
        if p.len() < 4 + n {
            return Err("truncated result field".into());
        }
        items.push(String::from_utf8_lossy(&p[4..4 + n]).into_owned());
        p = &p[4 + n..];
    }
    if items.len() % 2 != 0 {
        return Err("odd number of result fields".into());
    }
    let mut map = HashMap::new();
    let mut it = items.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        map.insert(k, v);
    }
    Ok(map)
}

/// What the agent reported about a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Status {
    Ok,
    /// The path resolves outside /workspace (`resolved` says where, when known).
    Outside,
    /// An ordinary failure with the agent's message (missing file, ENOSPC, a link…).
    Error(String),
    /// The agent refused the request itself (malformed, NUL): a host bug or an attack.
    Refused(String),
    /// The agent gave no result: the host killed the request, which overran its deadline
    /// or whose agent was killed (out of memory, or by its own command). A command's
    /// result says which (timed out, or exit 137); it ran, so it is never "not run".
    Killed,
}

/// What a file operation the host killed ([`Status::Killed`]) fails with.
pub(crate) const KILLED_FILE_OP: &str =
    "the operation did not finish: the sandbox agent overran its deadline or was killed";

/// A result frame's fields, typed access; or, when the agent gave none, the host's kill.
#[derive(Debug)]
pub(crate) struct Outcome {
    fields: HashMap<String, String>,
    /// No result frame: the host killed the request (it overran its deadline, or its agent
    /// was killed).
    killed_by_host: bool,
}

impl Outcome {
    /// The fields of the agent's frame.
    pub(crate) fn from_agent(fields: HashMap<String, String>) -> Self {
        Outcome { fields, killed_by_host: false }
    }

    /// What a request the host killed reports (see [`Status::Killed`]).
    pub(crate) fn killed_by_host() -> Self {
        Outcome { fields: HashMap::new(), killed_by_host: true }
    }

    /// `Ok` for an `ok` status; otherwise the error for an operation on `path` (already
    /// resolved): outside the workspace, or the agent's message.
    pub(crate) fn ok_for(&self, path: &str) -> Result<(), SandboxError> {
        match self.status() {
            Status::Ok => Ok(()),
            Status::Outside => {
                Err(SandboxError::PathOutsideWorkspace { path: path.to_string(), resolved: path.to_string() })
            }
            Status::Error(message) | Status::Refused(message) => {
                Err(SandboxError::File { path: path.to_string(), message })
            }
            Status::Killed => Err(SandboxError::File { path: path.to_string(), message: KILLED_FILE_OP.into() }),
        }
    }

    pub(crate) fn status(&self) -> Status {
        if self.killed_by_host {
            return Status::Killed;
        }
        let msg = || self.get("message").to_string();
        match self.get("status") {
            "ok" => Status::Ok,
            "outside" => Status::Outside,
            "refused" => Status::Refused(msg()),
            _ => Status::Error(msg()),
        }
    }
    pub(crate) fn get(&self, k: &str) -> &str {
        self.fields.get(k).map(String::as_str).unwrap_or("")
    }
    pub(crate) fn num(&self, k: &str) -> i64 {
        self.get(k).parse().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![kind];
        v.extend((payload.len() as u32).to_be_bytes());
        v.extend(payload);
        v
    }

    #[test]
    fn the_agent_uses_the_same_use_mark() {
        assert!(AGENT_SOURCE.contains(&format!("USE_MARK = \"{USE_MARK}\"")));
        assert!(AGENT_SOURCE.contains(&format!("SWEEP_LOCK = \"{SWEEP_LOCK}\"")));
        assert!(AGENT_SOURCE.contains(&format!("SETTINGS_RECORD = \"{SETTINGS_RECORD}\"")));
    }

    #[test]
    fn the_agent_uses_the_same_settled_records_and_tag() {
        assert!(AGENT_SOURCE.contains(&format!("SETTLED = \"{SETTLED_DIR}\"")));
        assert!(AGENT_SOURCE.contains(&format!("TAG_VAR = b\"{}\"", PROCESS_TAG_VAR)));
    }

    proptest! {
        /// Any output bytes, cut anywhere, come back as the same data and one result:
        /// nothing the command prints can end a call early or forge its status.
        #[test]
        fn output_never_forges_a_result(out in proptest::collection::vec(any::<u8>(), 0..2000), cuts in proptest::collection::vec(1usize..97, 1..20)) {
            let mut wire = frame(b'o', &out);
            let mut result = Fields::default();
            for x in ["status", "ok", "code", "0"] { result.text(x); }
            wire.extend(frame(b'r', &result.0));
            let mut r = FrameReader::default();
            let mut got = Vec::new();
            let mut results = 0;
            let mut at = 0;
            for c in cuts.iter().cycle() {
                if at >= wire.len() { break; }
                let end = (at + c).min(wire.len());
                r.feed(&wire[at..end]);
                at = end;
                while let Some(f) = r.next().unwrap() {
                    match f { Frame::Stdout(d) => got.extend(d), Frame::Result(_) => results += 1, _ => panic!("unexpected frame") }
                }
            }
            prop_assert_eq!(got, out);
            prop_assert_eq!(results, 1);
        }

        /// The strict check refuses every control character and accepts everything else.
        #[test]
        fn strict_text_refuses_exactly_controls(s in "[^\\p{C}\u{AD}\u{61C}\u{180E}]*", c in proptest::prop_oneof![proptest::char::range('\0', '\u{9f}'), proptest::char::range('\u{2000}', '\u{206f}'), Just('\u{feff}')]) {
            prop_assert!(check_text("Read", "file_path", &s, TextClass::Strict).is_ok());
            let with = format!("{s}{c}{s}");
            prop_assert_eq!(check_text("Read", "file_path", &with, TextClass::Strict).is_err(), c.is_control() || is_invisible_format(c));
            prop_assert_eq!(check_text("Bash", "command", &with, TextClass::Command).is_err(), c == '\0');
        }
    }
}
