//! Tasks that run in a fork of their parent's session: a definition's `isolation` (a
//! Claude agent file's `isolation: worktree`) or a task's (`isolation: "fork"` on
//! `POST /v1/tasks` and the Task tool).
//!
//! Such a task is given a session of its own when it is admitted — `<source>-fork-<hex>`,
//! same user ([`fork_id`]) — and when it starts, the session it would have used (the
//! parent task's, or the one the caller named; made first when it does not exist yet,
//! under the runtime the subagent runs under) is forked into it
//! ([`warden_sandbox::Sandbox::fork_session`]: a copy of the workspace, a container of
//! its own, no process, shell state or secret of the source). Right after the copy the
//! host records the fork's state ([`Fork`]); when the task ends it compares the fork
//! against that state ([`Fork::changes`]) and the task's record says where it ran and
//! what changed ([`Isolated`]), as does the text its parent reads ([`Isolated::note`]).
//! Nothing flows back into the source's workspace; the fork is an ordinary session of
//! the user, ended after `sandbox.idle_ttl` like any other.
//!
//! How the fork is compared, with commands the host runs in the fork's container
//! ([`warden_sandbox::Sandbox::run_host_command`]), never through the approval gate:
//! - the workspace is a git repository (`/workspace/.git`): the whole working tree
//!   (what `.gitignore` does not exclude; committed or not) is written as a tree into a
//!   repository of the host's own at `/workspace/.git/warden-fork` — its own config, so no
//!   filter, fsmonitor, hook or external diff of the workspace's runs — before and after;
//!   the changes are `git diff` between the two trees (so what was uncommitted in the
//!   parent's workspace already is not counted as the task's);
//! - otherwise (also when the repositories are in directories of the workspace): a listing
//!   of the workspace's regular files outside `.git` directories (path, size, modification
//!   time) before and after, kept by the host; added, changed and removed files.
//!
//! This module decides nothing about who may fork: the caller (the engine) forks only the
//! session of the task's own user, for a task admitted as isolated.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use warden_sandbox::{Sandbox, SessionKey};

use crate::plugin::Isolation;

/// Most bytes of unified diff an isolated task's result carries (in its record and in the
/// text its parent reads, which becomes part of the parent model's context); a longer
/// diff is cut at a line boundary and says so. The fork holds the whole change.
pub const MAX_DIFF_BYTES: usize = 64 * 1024;

/// Most changed files an isolated task's result lists (a workspace that is not a git
/// repository); more are counted, not listed.
pub const MAX_LISTED_CHANGES: usize = 500;

/// Most regular files compared in a workspace that is not a git repository: a larger
/// one's changes are not listed (the result says so; the fork holds them).
pub const MAX_COMPARED_FILES: usize = 50_000;

/// Most bytes of a workspace's file listing the host reads (path, size and time of each
/// file): 50,000 files of paths up to ~160 bytes. A longer listing is not compared, like
/// one of more than [`MAX_COMPARED_FILES`] files, so that one is never held in memory
/// whole (each file's path may be 4 KiB).
pub const MAX_LISTING_BYTES: usize = 8 * 1024 * 1024;

/// Longest one of the host's commands in the fork may run (recording the state, writing
/// a tree, the diff, one page of output).
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// Longest session id (the engine's and the sandbox's rule).
const MAX_SESSION_ID_LEN: usize = 128;

/// Most bytes of stderr of a failed command quoted in a result.
const MAX_QUOTED_ERROR: usize = 512;

/// Where the host's own git repository lives in a fork whose workspace is one: inside
/// `.git`, which no listing or diff of the working tree includes.
const GIT_BASE: &str = "/workspace/.git/warden-fork";

/// Where an isolated task ran and what it changed: the `isolation` of its record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Isolated {
    /// How it was isolated (`fork`).
    pub mode: Isolation,
    /// The session it was forked from (the parent's, or the one the caller named).
    pub forked_from: String,
    /// The fork: where the task ran and its files are (same user; kept for
    /// `sandbox.idle_ttl`).
    pub session_id: String,
    /// What changed in the fork against the source's workspace as it was copied; absent
    /// until the task ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes: Option<Changes>,
}

/// What an isolated task changed in its fork.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Changes {
    /// The workspace is a git repository: a unified diff of its working tree (files
    /// `.gitignore` excludes left out) against its state when it was copied.
    Diff {
        diff: String,
        /// Cut at [`MAX_DIFF_BYTES`].
        truncated: bool,
    },
    /// Otherwise: the regular files added, changed (size or modification time) and removed.
    Files {
        files: Vec<FileChange>,
        /// Files changed beyond the [`MAX_LISTED_CHANGES`] listed.
        #[serde(default, skip_serializing_if = "is_zero")]
        more: usize,
    },
    /// They could not be worked out (the reason); the fork holds them.
    Unavailable { reason: String },
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One changed file of a workspace that is not a git repository.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChange {
    /// Relative to /workspace.
    pub path: String,
    pub change: ChangeKind,
    /// Its size now, bytes (absent when removed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Its size at the copy, bytes (absent when added).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_size: Option<u64>,
}

/// How a file changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Added,
    Changed,
    Removed,
}

impl Isolated {
    /// As kept and shown: every secret `redactor` knows scrubbed from its text, and a diff
    /// whose sides still hold one — a secret written into a file across lines (a key) is a
    /// `+` at the start of each of its lines in a diff, which scrubbing the diff's text
    /// cannot see — not shown at all.
    pub fn scrubbed(self, redactor: &crate::redact::Redactor) -> Isolated {
        let mut value = serde_json::to_value(&self).unwrap_or_default();
        redactor.scrub_value(&mut value);
        let mut isolated = serde_json::from_value(value).unwrap_or_else(|_| Isolated {
            changes: Some(Changes::Unavailable { reason: "they could not be scrubbed".into() }),
            ..self
        });
        if let Some(Changes::Diff { diff, .. }) = &isolated.changes
            && diff_sides(diff).iter().any(|side| redactor.finds(side.as_bytes()))
        {
            isolated.changes = Some(Changes::Unavailable {
                reason: "the diff holds a secret of the session across lines; read the files in the fork".into(),
            });
        }
        isolated
    }

    /// A task admitted to run in `fork`, a fork of `source`: no changes yet.
    pub fn new(source: String, fork: String) -> Self {
        Isolated { mode: Isolation::Fork, forked_from: source, session_id: fork, changes: None }
    }

    /// What the parent reads after the task's own text: where it ran and what it changed.
    pub fn note(&self) -> String {
        let mut text = format!(
            "[isolation: this task ran in session `{}`, a fork of session `{}`; nothing it changed is in `{}`. ",
            self.session_id, self.forked_from, self.forked_from
        );
        match &self.changes {
            None => text.push_str("Its changes were not worked out.]"),
            Some(Changes::Diff { diff, .. }) if diff.is_empty() => text.push_str("It changed no file.]"),
            Some(Changes::Diff { diff, truncated }) => {
                text.push_str("What it changed (unified diff against the workspace as it was copied):\n");
                // The files' text, control characters escaped (lines and tabs kept).
                text.push_str(&crate::text::escape_multiline(diff));
                if !diff.ends_with('\n') {
                    text.push('\n');
                }
                if *truncated {
                    text.push_str(&format!("[diff cut at {MAX_DIFF_BYTES} bytes: the fork holds every change]\n"));
                }
                text.push(']');
            }
            Some(Changes::Files { files, more }) if files.is_empty() => {
                debug_assert_eq!(*more, 0);
                text.push_str("It changed no file.]");
            }
            Some(Changes::Files { files, more }) => {
                text.push_str("Files it changed:\n");
                // As long as a diff at most (paths may be 4 KiB each): the rest counted.
                let mut more = *more;
                for (i, f) in files.iter().enumerate() {
                    if text.len() > MAX_DIFF_BYTES {
                        more += files.len() - i;
                        break;
                    }
                    let size = |s: Option<u64>| s.map_or_else(String::new, |s| format!("{s} bytes"));
                    let line = match f.change {
                        ChangeKind::Added => format!("added {} ({})", f.path, size(f.size)),
                        ChangeKind::Removed => format!("removed {} (was {})", f.path, size(f.old_size)),
                        ChangeKind::Changed => {
                            format!("changed {} ({}, was {})", f.path, size(f.size), size(f.old_size))
                        }
                    };
                    text.push_str(&crate::text::escape_control(&line));
                    text.push('\n');
                }
                if more > 0 {
                    text.push_str(&format!("… and {more} more\n"));
                }
                text.push(']');
            }
            Some(Changes::Unavailable { reason }) => {
                text.push_str(&format!("Its changes could not be listed ({reason}); the fork holds them.]"))
            }
        }
        text
    }
}

/// The reference metadata key by which a definition asks for [`Isolation`] (`isolation=fork`):
/// set by a plugin on the reference it returns (the Claude plugin, for an agent file's
/// `isolation: worktree`) or by the operator on a reference in the configuration. The WIT
/// has no typed field for it, so a plugin of any WIT version may ask.
pub const ISOLATION_METADATA: &str = "isolation";

/// A definition's isolation: the operator's reference metadata, then the plugin's (either
/// asking is enough: isolation only takes away). `Err` names a value that cannot be read;
/// the registry then leaves the subagent out, since running it in the calling session
/// would change files it was meant to keep apart.
pub fn definition_isolation(
    operator: &BTreeMap<String, String>,
    def: &crate::plugin::SubagentDefinition,
) -> Result<Option<Isolation>, String> {
    let mut isolation = None;
    for value in
        [operator.get(ISOLATION_METADATA), def.reference.metadata.get(ISOLATION_METADATA)].into_iter().flatten()
    {
        isolation = Some(Isolation::parse(value.trim()).map_err(|e| format!("metadata `{ISOLATION_METADATA}`: {e}"))?);
    }
    Ok(isolation)
}

/// The session id of a fork of `source` for one task: `<source>-fork-<12 hex>`, the source
/// id cut so that the whole stays within the session id rules (1-128 of `[A-Za-z0-9_.-]`,
/// which `source` already follows).
pub fn fork_id(source: &str) -> String {
    let suffix = format!("-fork-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let mut end = source.len().min(MAX_SESSION_ID_LEN.saturating_sub(suffix.len()));
    while !source.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{suffix}", &source[..end])
}

/// A fork made for a task, with the state it was compared from.
#[derive(Debug, Clone)]
pub struct Fork {
    pub source: SessionKey,
    pub fork: SessionKey,
    baseline: Baseline,
}

/// The fork's workspace as it was copied.
#[derive(Debug, Clone)]
enum Baseline {
    /// A git repository: the tree of its working tree, in [`GIT_BASE`].
    Git { tree: String },
    /// Regular files: path → (size, modification time in ns).
    Files(BTreeMap<String, (u64, u128)>),
    /// Not recorded (the reason).
    Unavailable(String),
}

/// Forks `source` into `fork` for a task (see the module docs): `source` is made first
/// when the sandbox does not hold it, and the fork's state is recorded before anything
/// runs in it. `Err`: why there is no fork (the task cannot run).
pub async fn fork(sandbox: &Sandbox, source: SessionKey, fork: SessionKey) -> Result<Fork, String> {
    sandbox.open_session(&source).await.map_err(|e| format!("the session to fork could not be made: {e}"))?;
    sandbox.fork_session(&source, &fork).await.map_err(|e| format!("the session could not be forked: {e}"))?;
    let baseline = match record_baseline(sandbox, &fork).await {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(session = %fork, error = %e, "the fork's state could not be recorded");
            Baseline::Unavailable(format!("its state at the copy could not be recorded: {e}"))
        }
    };
    Ok(Fork { source, fork, baseline })
}

impl Fork {
    /// What changed in the fork since it was made.
    pub async fn changes(&self, sandbox: &Sandbox) -> Changes {
        let result = match &self.baseline {
            Baseline::Unavailable(why) => return Changes::Unavailable { reason: why.clone() },
            Baseline::Git { tree } => git_changes(sandbox, &self.fork, tree).await,
            Baseline::Files(before) => match file_listing(sandbox, &self.fork).await {
                Ok(Some(after)) => Ok(compare(before, &after)),
                Ok(None) => Err(too_many_files()),
                Err(e) => Err(e),
            },
        };
        result.unwrap_or_else(|reason| Changes::Unavailable { reason })
    }
}

/// The shell prelude of every git command here: `g` runs git on the repository `$gd`
/// (its index inside it) over the workspace's working tree, with no configuration but the
/// repository's own (no system or global file; the workspace's own repository's config is
/// never read), so nothing the workspace holds runs.
fn git_prelude() -> String {
    format!(
        "set -u\nbase={GIT_BASE}\ngd=$base\n\
         export GIT_WORK_TREE=/workspace GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_TERMINAL_PROMPT=0 \
         GIT_OPTIONAL_LOCKS=0 GIT_ATTR_NOSYSTEM=1\n\
         g() {{ GIT_DIR=\"$gd\" GIT_INDEX_FILE=\"$gd/warden-index\" /usr/bin/git \
         -c core.excludesFile=/workspace/.git/info/exclude -c core.fsmonitor=false \
         -c core.hooksPath=/dev/null -c core.autocrlf=false -c core.quotePath=false \"$@\"; }}\n\
         cd /workspace || exit 90\n"
    )
}

/// Records the fork's state: a git tree, or the listing of its files. (`/workspace/.git`
/// as a symbolic link is no repository here: the host's would be made where it leads.)
async fn record_baseline(sandbox: &Sandbox, fork: &SessionKey) -> Result<Baseline, String> {
    // The host's repository is made fresh (a fork of a fork carries its source's).
    let script = format!(
        "{{ [ -d /workspace/.git ] && [ ! -L /workspace/.git ]; }} || {{ echo files; exit 0; }}\n\
         {}rm -rf \"$base\" && env -u GIT_DIR -u GIT_WORK_TREE /usr/bin/git init -q --bare \"$base\" >/dev/null || exit 91\n\
         g add -A -- . >/dev/null || exit 92\nprintf 'git %s\\n' \"$(g write-tree)\"\n",
        git_prelude()
    );
    let out = run(sandbox, fork, &script).await?;
    let text = String::from_utf8_lossy(&out);
    match text.trim() {
        "files" => Ok(file_listing(sandbox, fork)
            .await?
            .map_or_else(|| Baseline::Unavailable(too_many_files()), Baseline::Files)),
        other => match other.strip_prefix("git ") {
            Some(tree) if is_object_id(tree) => Ok(Baseline::Git { tree: tree.to_owned() }),
            _ => Err(format!("unexpected answer {:?}", crate::text::escape_control(&crate::text::excerpt(other, 80)))),
        },
    }
}

/// A git object id (SHA-1 or SHA-256, hexadecimal).
fn is_object_id(s: &str) -> bool {
    matches!(s.len(), 40 | 64) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The unified diff of the fork's working tree against `tree`. The task could write into
/// the host's repository (it is in the fork's workspace), so only its objects are used:
/// the diff runs in a new repository of the host's outside the workspace (its own config,
/// no attributes, hooks or index of the task's), reading them as alternates.
async fn git_changes(sandbox: &Sandbox, fork: &SessionKey, tree: &str) -> Result<Changes, String> {
    debug_assert!(is_object_id(tree));
    let script = format!(
        "{}[ ! -L /workspace/.git ] || {{ echo '/workspace/.git became a symbolic link' >&2; exit 95; }}\n\
         gd=$(mktemp -d /tmp/warden-fork.XXXXXXXXXX) || exit 95\ntrap 'rm -rf \"$gd\"' EXIT\n\
         env -u GIT_DIR -u GIT_WORK_TREE /usr/bin/git init -q --bare \"$gd\" >/dev/null || exit 91\n\
         printf '%s\\n' \"$base/objects\" > \"$gd/objects/info/alternates\"\n\
         g cat-file -e {tree}^{{tree}} 2>/dev/null || {{ echo 'the state recorded in .git/warden-fork is gone' >&2; exit 93; }}\n\
         g add -A -- . >/dev/null || exit 92\nt=$(g write-tree) || exit 94\nset -o pipefail\n\
         g diff --no-ext-diff --no-textconv --no-color {tree} \"$t\" | head -c {}\n\
         s=$?; [ \"$s\" = 0 ] || [ \"$s\" = 141 ] || exit 96\n",
        git_prelude(),
        MAX_DIFF_BYTES + 1
    );
    let out = collect(sandbox, fork, &script, MAX_DIFF_BYTES + 1).await?;
    let truncated = out.len() > MAX_DIFF_BYTES;
    let mut diff = String::from_utf8_lossy(&out).into_owned();
    if truncated {
        let mut cut_at = diff.len().min(MAX_DIFF_BYTES);
        while !diff.is_char_boundary(cut_at) {
            cut_at -= 1;
        }
        // At the last whole line within the bound (none when the first line is longer:
        // a part of a line could be a part of a secret the redactor then cannot see).
        let cut_at = diff[..cut_at].rfind('\n').map_or(0, |i| i + 1);
        diff.truncate(cut_at);
    }
    Ok(Changes::Diff { diff, truncated })
}

/// The two sides of a unified diff as text without git's line prefixes — the removed and
/// context lines, then the added and context lines, each joined as the files hold them —
/// so that the redactor can look for a secret written into a file across lines (a PEM
/// key is a `+` at the start of each of its lines in the diff).
pub fn diff_sides(diff: &str) -> [String; 2] {
    let (mut old, mut new) = (String::new(), String::new());
    // A file's header (`diff --git`, `--- a/…`, `+++ b/…`) runs up to its first hunk.
    let mut in_hunk = false;
    for line in diff.lines() {
        if line.starts_with("diff ") {
            in_hunk = false;
        } else if line.starts_with("@@") {
            in_hunk = true;
        }
        if !in_hunk {
            continue;
        }
        let (to_old, to_new) = match line.as_bytes().first() {
            Some(b'+') => (false, true),
            Some(b'-') => (true, false),
            Some(b' ') => (true, true),
            _ => continue,
        };
        for (side, wanted) in [(&mut old, to_old), (&mut new, to_new)] {
            if wanted {
                side.push_str(&line[1..]);
                side.push('\n');
            }
        }
    }
    [old, new]
}

/// The workspace's regular files (outside every `.git` directory, links not followed):
/// path → (size, modification time in ns); `None` past [`MAX_COMPARED_FILES`].
async fn file_listing(sandbox: &Sandbox, key: &SessionKey) -> Result<Option<BTreeMap<String, (u64, u128)>>, String> {
    let script = format!("exec /usr/bin/python3 -I -S -c '{LISTING_PY}' {MAX_COMPARED_FILES}");
    let out = collect(sandbox, key, &script, MAX_LISTING_BYTES + 1).await?;
    if out.len() > MAX_LISTING_BYTES {
        return Ok(None);
    }
    let mut files = BTreeMap::new();
    for entry in out.split(|b| *b == 0).filter(|e| !e.is_empty()) {
        if entry == b"MORE" {
            return Ok(None);
        }
        let text = String::from_utf8_lossy(entry);
        let mut parts = text.splitn(3, ' ');
        let (Some(size), Some(mtime), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            return Err("unexpected listing".into());
        };
        let (Ok(size), Ok(mtime)) = (size.parse::<u64>(), mtime.parse::<u128>()) else {
            return Err("unexpected listing".into());
        };
        files.insert(path.to_owned(), (size, mtime));
    }
    Ok(Some(files))
}

/// Why a workspace's files are not compared.
fn too_many_files() -> String {
    format!("the workspace holds more than {MAX_COMPARED_FILES} files or {MAX_LISTING_BYTES} bytes of file names")
}

/// The listing [`file_listing`] runs (Python's standard library only; no `'` in it, as it
/// goes between single quotes): `<size> <mtime ns> <path>` NUL-terminated per regular
/// file, `MORE` past the count given as its argument.
const LISTING_PY: &str = r#"
import os, stat, sys
out, n, most = sys.stdout.buffer, 0, int(sys.argv[1])
for d, dirs, files in os.walk("/workspace"):
    if ".git" in dirs:
        dirs.remove(".git")
    for f in files:
        p = os.path.join(d, f)
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        n += 1
        if n > most:
            out.write(b"MORE\0")
            sys.exit(0)
        out.write(b"%d %d %s\0" % (st.st_size, st.st_mtime_ns, os.fsencode(os.path.relpath(p, "/workspace"))))
"#;

/// Added, changed and removed files between two listings, in path order.
fn compare(before: &BTreeMap<String, (u64, u128)>, after: &BTreeMap<String, (u64, u128)>) -> Changes {
    let mut all = Vec::new();
    for (path, &(size, mtime)) in after {
        match before.get(path) {
            None => {
                all.push(FileChange { path: path.clone(), change: ChangeKind::Added, size: Some(size), old_size: None })
            }
            Some(&(old, old_mtime)) if old != size || old_mtime != mtime => all.push(FileChange {
                path: path.clone(),
                change: ChangeKind::Changed,
                size: Some(size),
                old_size: Some(old),
            }),
            Some(_) => {}
        }
    }
    for (path, &(old, _)) in before {
        if !after.contains_key(path) {
            all.push(FileChange { path: path.clone(), change: ChangeKind::Removed, size: None, old_size: Some(old) });
        }
    }
    all.sort_by(|a, b| a.path.cmp(&b.path));
    let more = all.len().saturating_sub(MAX_LISTED_CHANGES);
    all.truncate(MAX_LISTED_CHANGES);
    Changes::Files { files: all, more }
}

/// Runs `script` in `key`'s container; its stdout when it exits 0.
async fn run(sandbox: &Sandbox, key: &SessionKey, script: &str) -> Result<Vec<u8>, String> {
    let out = sandbox.run_host_command(key, script, COMMAND_TIMEOUT).await.map_err(|e| e.to_string())?;
    if out.timed_out {
        return Err(format!("timed out after {}", humantime::format_duration(COMMAND_TIMEOUT)));
    }
    if out.exit_code != 0 {
        return Err(format!(
            "exit code {}: {}",
            out.exit_code,
            crate::text::escape_control(&crate::text::excerpt(out.stderr.trim(), MAX_QUOTED_ERROR))
        ));
    }
    if out.stdout_dropped > 0 {
        return Err("the answer was longer than sandbox.max_output".into());
    }
    Ok(out.stdout)
}

/// Runs `script` in `key`'s container with its stdout going to a file of the container's
/// /tmp, then reads that file back a page (`sandbox.max_output`) at a time, at most `max`
/// bytes: the whole answer, however `sandbox.max_output` is set.
async fn collect(sandbox: &Sandbox, key: &SessionKey, script: &str, max: usize) -> Result<Vec<u8>, String> {
    // A file of its own (mktemp), never a name a task of the session could have put a
    // link at; the script runs in a subshell so its `exit` ends only it.
    let start = format!(
        "out=$(mktemp /tmp/tmp.XXXXXXXXXX) || exit 95\n( {script} ) >\"$out\" || {{ c=$?; rm -f \"$out\"; exit $c; }}\n\
         printf '%s %s\\n' \"$out\" \"$(stat -c %s \"$out\")\"\n"
    );
    let head = run(sandbox, key, &start).await?;
    let head = String::from_utf8_lossy(&head);
    let (path, size) = head.trim().split_once(' ').ok_or("unexpected answer")?;
    let valid_path =
        path.strip_prefix("/tmp/tmp.").is_some_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric()));
    let size: usize = size.parse().map_err(|_| "unexpected answer")?;
    if !valid_path {
        return Err("unexpected answer".into());
    }
    let page = sandbox.max_host_command_output().max(1);
    let wanted = size.min(max);
    let mut bytes = Vec::with_capacity(wanted.min(16 * 1024 * 1024));
    let read: Result<(), String> = async {
        while bytes.len() < wanted {
            let n = page.min(wanted - bytes.len());
            let chunk = run(sandbox, key, &format!("tail -c +{} {path} | head -c {n}", bytes.len() + 1)).await?;
            if chunk.is_empty() {
                return Err("the answer file shrank".into());
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(())
    }
    .await;
    if let Err(e) = run(sandbox, key, &format!("rm -f {path}")).await {
        tracing::debug!(session = %key, error = %e, "removing a host answer file failed");
    }
    read.map(|()| bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fork_ids_follow_the_session_id_rules_and_differ() {
        let a = fork_id("sess-1");
        assert!(a.starts_with("sess-1-fork-") && a.len() == "sess-1-fork-".len() + 12, "{a}");
        assert_ne!(a, fork_id("sess-1"));
        let long = "x".repeat(128);
        let f = fork_id(&long);
        assert_eq!(f.len(), 128, "{f}");
        assert!(f.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')));
    }

    #[test]
    fn isolation_is_asked_by_the_operators_or_the_plugins_reference_metadata() {
        let def = |metadata: &[(&str, &str)]| {
            let reference = crate::plugin::SubagentReference {
                uri: "agents/refactorer.md".into(),
                kind: "CLAUDE".into(),
                metadata: metadata.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            };
            crate::plugin::SubagentDefinition::new("refactorer".into(), "d".into(), reference, "{}".into())
        };
        let none = BTreeMap::new();
        let fork: BTreeMap<String, String> = [(ISOLATION_METADATA.to_string(), "fork".to_string())].into();
        assert_eq!(definition_isolation(&none, &def(&[])), Ok(None));
        assert_eq!(definition_isolation(&none, &def(&[(ISOLATION_METADATA, "fork")])), Ok(Some(Isolation::Fork)));
        assert_eq!(definition_isolation(&fork, &def(&[])), Ok(Some(Isolation::Fork)));
        // A value that cannot be read, from either side, is an error naming it and the
        // accepted ones (the registry leaves the subagent out), never "no isolation".
        let bad = definition_isolation(&none, &def(&[(ISOLATION_METADATA, "container")])).unwrap_err();
        assert!(bad.contains("\"container\"") && bad.contains("accepted: fork"), "{bad}");
        let bad: BTreeMap<String, String> = [(ISOLATION_METADATA.to_string(), "none".to_string())].into();
        assert!(definition_isolation(&bad, &def(&[(ISOLATION_METADATA, "fork")])).is_err());
    }

    /// A secret written into a file is a `+` at the start of each of its lines in a diff:
    /// the sides hold the files' text again, so the redactor sees it whole.
    #[test]
    fn a_diffs_sides_hold_the_files_text() {
        let diff = "diff --git a/k b/k\n--- a/k\n+++ b/k\n@@ -1,3 +1,4 @@\n same\n-old\n---- removed dashes\n\
                    +-----BEGIN KEY-----\n+abc\n\\ No newline at end of file\ndiff --git a/z b/z\n--- a/z\n+++ b/z\n";
        let [old, new] = diff_sides(diff);
        assert_eq!(old, "same\nold\n--- removed dashes\n");
        assert_eq!(new, "same\n-----BEGIN KEY-----\nabc\n");
    }

    /// A secret on one line of a diff is scrubbed there; one written across lines (a key)
    /// keeps the whole diff from being shown; paths are scrubbed too.
    #[test]
    fn a_secret_in_the_changes_is_scrubbed_or_the_diff_withheld() {
        let key = "-----BEGIN KEY-----\nc2VjcmV0LWtleS1ib2R5\n-----END KEY-----";
        let redactor = crate::redact::Redactor::with_secrets(["tok-123456789", key]);
        let with = |changes: Changes| {
            Isolated { changes: Some(changes), ..Isolated::new("s".into(), "s-fork-1".into()) }.scrubbed(&redactor)
        };
        let diff = |body: &str| Changes::Diff {
            diff: format!("diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -0,0 +1,3 @@\n{body}"),
            truncated: false,
        };
        let one_line = with(diff("+token=tok-123456789\n"));
        let Some(Changes::Diff { diff: shown, .. }) = &one_line.changes else { panic!("{one_line:?}") };
        assert!(shown.contains("+token=[redacted]") && !shown.contains("tok-123"), "{shown}");
        let across = with(diff(&key.lines().map(|l| format!("+{l}\n")).collect::<String>()));
        let Some(Changes::Unavailable { reason }) = &across.changes else { panic!("{across:?}") };
        assert!(reason.contains("across lines"), "{reason}");
        // Positive control: the same lines without the secret are shown.
        assert!(matches!(with(diff("+-----BEGIN KEY-----\n+other\n")).changes, Some(Changes::Diff { .. })));
        let files = with(Changes::Files {
            files: vec![FileChange {
                path: "tok-123456789.txt".into(),
                change: ChangeKind::Added,
                size: Some(1),
                old_size: None,
            }],
            more: 0,
        });
        assert!(!serde_json::to_string(&files).unwrap().contains("tok-123"), "{files:?}");
    }

    #[test]
    fn listings_compare_to_added_changed_and_removed_files() {
        let before = BTreeMap::from([("a".to_string(), (1, 10)), ("b".into(), (2, 20)), ("c".into(), (3, 30))]);
        let after = BTreeMap::from([("a".to_string(), (1, 10)), ("b".into(), (2, 21)), ("d".into(), (4, 40))]);
        let Changes::Files { files, more } = compare(&before, &after) else { panic!() };
        assert_eq!(more, 0);
        assert_eq!(
            files,
            vec![
                FileChange { path: "b".into(), change: ChangeKind::Changed, size: Some(2), old_size: Some(2) },
                FileChange { path: "c".into(), change: ChangeKind::Removed, size: None, old_size: Some(3) },
                FileChange { path: "d".into(), change: ChangeKind::Added, size: Some(4), old_size: None },
            ]
        );
        let many: BTreeMap<String, (u64, u128)> =
            (0..MAX_LISTED_CHANGES + 3).map(|i| (format!("f{i:05}"), (1, 1))).collect();
        let Changes::Files { files, more } = compare(&BTreeMap::new(), &many) else { panic!() };
        assert_eq!((files.len(), more), (MAX_LISTED_CHANGES, 3));
    }

    #[test]
    fn the_note_names_the_fork_and_the_changes() {
        let mut i = Isolated::new("s".into(), "s-fork-1".into());
        assert!(i.note().contains("session `s-fork-1`, a fork of session `s`"), "{}", i.note());
        i.changes = Some(Changes::Diff { diff: "diff --git a/x b/x\n".into(), truncated: true });
        let note = i.note();
        assert!(note.contains("diff --git a/x b/x\n[diff cut at"), "{note}");
        i.changes = Some(Changes::Files {
            files: vec![FileChange {
                path: "n\u{1b}".into(),
                change: ChangeKind::Added,
                size: Some(3),
                old_size: None,
            }],
            more: 2,
        });
        let note = i.note();
        assert!(note.contains("added n\\u{1b} (3 bytes)\n… and 2 more\n]"), "{note}");
        let v = serde_json::to_value(&i).unwrap();
        assert_eq!(v["mode"], "fork");
        assert_eq!(v["changes"]["kind"], "files");
        assert_eq!(v["changes"]["files"][0]["change"], "added");
        assert_eq!(serde_json::from_value::<Isolated>(v).unwrap(), i);
    }
}
