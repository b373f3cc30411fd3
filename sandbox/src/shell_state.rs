//! A session's Bash state — its working directory — kept by the host.
//!
//! After each Bash call the agent reports the shell's physical working directory, which it
//! read from `/proc/<pid>/cwd` when the shell stopped on its way out (never from anything
//! the command wrote); this module checks it again (an absolute path at or beneath
//! /workspace, no `.` or `..` component, no NUL) and keeps it in memory for the session (a
//! host restart starts sessions afresh). Variables do not carry over between calls
//! (`crate::environment`): Claude Code keeps the working directory, not the environment,
//! and a carried variable is state that steers what a later allowed command runs.
//!
//! The directory is kept per [`Writer`] — the fingerprint of the secrets a call carries,
//! the same key the session's lanes run on: calls with the same secrets continue where the
//! last of them ended; a call with other secrets starts where its own last call ended, or
//! in /workspace. So a task can never leave another task's commands in a directory of its
//! choosing (where `python3 -c 'import json'` imports a planted `json.py`, and git reads a
//! planted repository's configuration).
//!
//! This module must never keep anything but the working directories, nor more than
//! [`MAX_WRITERS`] of them.

use std::hash::{BuildHasher, Hasher};

use crate::container::WORKSPACE;

/// Longest working directory kept (the agent reports at most this much).
pub(crate) const MAX_CWD_BYTES: usize = 4096;

/// Which calls' secrets ran a command ([`Writer`], defined with the lanes that key on it).
pub(crate) use crate::lanes::{NO_SECRETS, Writer};

/// The fingerprint of a call's secrets (the order of the pairs does not matter).
pub fn writer_of(secrets: &[(String, String)]) -> Writer {
    static KEY: std::sync::OnceLock<std::collections::hash_map::RandomState> = std::sync::OnceLock::new();
    if secrets.is_empty() {
        return NO_SECRETS;
    }
    let mut sorted: Vec<&(String, String)> = secrets.iter().collect();
    sorted.sort();
    let mut h = KEY.get_or_init(Default::default).build_hasher();
    for (k, v) in sorted {
        h.write(k.as_bytes());
        h.write_u8(0);
        h.write(v.as_bytes());
        h.write_u8(0);
    }
    h.finish().max(1)
}

/// Most fingerprints whose working directory one session keeps: far more than the tasks
/// with distinct secrets one session runs; past it the least recently used is forgotten
/// (its next call starts in /workspace).
pub(crate) const MAX_WRITERS: usize = 64;

/// One session's state: each fingerprint's working directory, least recently used first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ShellState {
    cwds: Vec<(Writer, String)>,
}

impl ShellState {
    /// The working directory the next call of `writer` starts in.
    pub(crate) fn cwd(&self, writer: Writer) -> String {
        self.cwds.iter().find(|(w, _)| *w == writer).map_or_else(|| WORKSPACE.to_string(), |(_, c)| c.clone())
    }

    /// Takes the working directory a call of `writer` ended in (the agent's report).
    /// Returns false (state unchanged) when it is not an absolute, normal path at or
    /// beneath /workspace.
    pub(crate) fn update(&mut self, writer: Writer, raw: &[u8]) -> bool {
        let Some(cwd) = std::str::from_utf8(raw).ok().filter(|c| is_normal_workspace_path(c)) else {
            return false;
        };
        self.reset(writer);
        if self.cwds.len() >= MAX_WRITERS {
            self.cwds.remove(0);
        }
        self.cwds.push((writer, cwd.to_string()));
        true
    }

    /// Sends `writer`'s next call back to /workspace.
    pub(crate) fn reset(&mut self, writer: Writer) {
        self.cwds.retain(|(w, _)| *w != writer);
    }
}

/// Whether `path` is /workspace or beneath it, written normally: absolute, no empty, `.`
/// or `..` component, no NUL or other control character, at most [`MAX_CWD_BYTES`].
pub(crate) fn is_normal_workspace_path(path: &str) -> bool {
    let Some(rest) = path.strip_prefix(WORKSPACE) else { return false };
    path.len() <= MAX_CWD_BYTES
        && !path.chars().any(char::is_control)
        && (rest.is_empty()
            || rest.strip_prefix('/').is_some_and(|r| r.split('/').all(|c| !c.is_empty() && c != "." && c != "..")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Regression (issue 40, item 3): a command wrote `/workspace/../etc` into the state
    /// descriptor, and the next call ran there.
    #[test]
    fn a_cwd_that_leaves_the_workspace_is_not_kept() {
        for bad in [
            "/workspace/../etc",
            "/workspace/./x",
            "/workspace//x",
            "/workspace/",
            "/workspacex",
            "/tmp/evil",
            "workspace",
            "/workspace/a\0b",
            "/workspace/a\nb",
        ] {
            let mut s = ShellState::default();
            assert!(!s.update(NO_SECRETS, bad.as_bytes()), "{bad:?}");
            assert_eq!(s.cwd(NO_SECRETS), WORKSPACE);
        }
        let mut s = ShellState::default();
        assert!(s.update(NO_SECRETS, b"/workspace/deep/er"));
        assert_eq!(s.cwd(NO_SECRETS), "/workspace/deep/er");
        assert!(!s.update(NO_SECRETS, b"/workspace/.."), "a bad report leaves the state as it was");
        assert_eq!(s.cwd(NO_SECRETS), "/workspace/deep/er");
    }

    /// Review (round 3): the session's one working directory was every task's, so a task
    /// left the next task's commands in a directory of its choosing. Each fingerprint has
    /// its own; the oldest is forgotten past [`MAX_WRITERS`].
    #[test]
    fn a_task_never_moves_another_tasks_shell() {
        let (a, b) = (writer_of(&[("T".into(), "1".into())]), writer_of(&[("T".into(), "2".into())]));
        let mut s = ShellState::default();
        assert!(s.update(NO_SECRETS, b"/workspace/trap"));
        assert_eq!(s.cwd(a), WORKSPACE, "a task with secrets starts in /workspace");
        assert!(s.update(a, b"/workspace/mine"));
        assert_eq!(
            (s.cwd(a), s.cwd(b), s.cwd(NO_SECRETS)),
            ("/workspace/mine".into(), WORKSPACE.into(), "/workspace/trap".into())
        );
        s.reset(a);
        assert_eq!(s.cwd(a), WORKSPACE);
        for i in 0..MAX_WRITERS as u64 + 5 {
            assert!(s.update(1000 + i, b"/workspace/x"));
        }
        assert_eq!(s.cwds.len(), MAX_WRITERS);
        assert_eq!(s.cwd(NO_SECRETS), WORKSPACE, "the least recently used was forgotten");
    }

    proptest! {
        /// Whatever the report, the kept directory is the workspace or a normal path
        /// beneath it.
        #[test]
        fn the_kept_cwd_is_always_inside(raw in proptest::collection::vec(any::<u8>(), 0..40), tail in "[./a-z]{0,20}") {
            let mut s = ShellState::default();
            s.update(NO_SECRETS, &raw);
            s.update(NO_SECRETS, format!("/workspace{tail}").as_bytes());
            let cwd = s.cwd(NO_SECRETS);
            prop_assert!(is_normal_workspace_path(&cwd), "{cwd:?}");
            prop_assert!(!cwd.split('/').any(|c| c == ".."));
        }
    }
}
