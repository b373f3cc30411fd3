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
//! This module must never keep anything but the working directory.

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

/// One session's state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ShellState {
    cwd: Option<String>,
}

impl ShellState {
    /// The working directory the next call starts in.
    pub(crate) fn cwd(&self) -> String {
        self.cwd.clone().unwrap_or_else(|| WORKSPACE.to_string())
    }

    /// Takes the working directory a call ended in (the agent's report). Returns false
    /// (state unchanged) when it is not an absolute, normal path at or beneath /workspace.
    pub(crate) fn update(&mut self, raw: &[u8]) -> bool {
        let Some(cwd) = std::str::from_utf8(raw).ok().filter(|c| is_normal_workspace_path(c)) else {
            return false;
        };
        self.cwd = Some(cwd.to_string());
        true
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
            assert!(!s.update(bad.as_bytes()), "{bad:?}");
            assert_eq!(s.cwd(), WORKSPACE);
        }
        let mut s = ShellState::default();
        assert!(s.update(b"/workspace/deep/er"));
        assert_eq!(s.cwd(), "/workspace/deep/er");
        assert!(!s.update(b"/workspace/.."), "a bad report leaves the state as it was");
        assert_eq!(s.cwd(), "/workspace/deep/er");
    }

    proptest! {
        /// Whatever the report, the kept directory is the workspace or a normal path
        /// beneath it.
        #[test]
        fn the_kept_cwd_is_always_inside(raw in proptest::collection::vec(any::<u8>(), 0..40), tail in "[./a-z]{0,20}") {
            let mut s = ShellState::default();
            s.update(&raw);
            s.update(format!("/workspace{tail}").as_bytes());
            let cwd = s.cwd();
            prop_assert!(is_normal_workspace_path(&cwd), "{cwd:?}");
            prop_assert!(!cwd.split('/').any(|c| c == ".."));
        }
    }
}
