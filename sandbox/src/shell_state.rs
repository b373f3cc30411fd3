//! A session's Bash state — working directory and exported variables — kept by the host.
//!
//! After each Bash call the agent hands back what the shell exported (`env -0`) and its
//! working directory; this module decides what of it may reach later calls, and the host
//! keeps the result in memory for the session (a host restart starts sessions afresh). It
//! is data the agent puts into the next command's environment, never a script that runs.
//!
//! What never carries over: variables that change how a shell, the loader or a common tool
//! starts or parses (see [`is_unsafe_name`]); a variable named like a per-task secret or
//! whose value contains one; a working directory outside /workspace. And variables exported
//! by a call that carried no secrets, or other secrets, never reach a call that carries
//! secrets: a later task's secrets meet only state that calls with those same secrets wrote.
//!
//! This module must never log a variable's value and never keep a secret's value.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};

use crate::container::WORKSPACE;

/// Most variables kept per session; past it, new ones are dropped.
pub(crate) const MAX_VARS: usize = 512;
/// Most bytes of names and values kept per session.
pub(crate) const MAX_BYTES: usize = 256 * 1024;
/// Environment the container starts with: variables equal to these are not state.
const BASE_ENV: [(&str, &str); 3] =
    [("PATH", crate::container::CONTAINER_PATH), ("HOME", crate::container::CONTAINER_HOME), ("LANG", "C.UTF-8")];

/// Names that change how bash, the dynamic loader or a common tool starts, parses or finds
/// programs. A planted one would run code (or change what an allowed command does) in a
/// later call, so none is ever restored.
const UNSAFE_NAMES: &[&str] = &[
    "PATH",
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "BASH_COMPAT",
    "POSIXLY_CORRECT",
    "PROMPT_COMMAND",
    "PS0",
    "PS1",
    "PS2",
    "PS3",
    "PS4",
    "IFS",
    "CDPATH",
    "GLOBIGNORE",
    "HISTFILE",
    "INPUTRC",
    "TMOUT",
    "BASH_XTRACEFD",
    "EXECIGNORE",
    "PWD",
    "OLDPWD",
    "SHLVL",
    "_",
    "HOME",
    "TMPDIR",
    "LANG",
    "LANGUAGE",
    "PYTHONSTARTUP",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONINSPECT",
    "PERL5OPT",
    "PERL5LIB",
    "PERLLIB",
    "RUBYOPT",
    "RUBYLIB",
    "NODE_OPTIONS",
    "NODE_PATH",
    "PAGER",
    "EDITOR",
    "VISUAL",
    "BROWSER",
    "SSH_ASKPASS",
    "SUDO_ASKPASS",
    "MANPAGER",
    "LESSOPEN",
    "LESSCLOSE",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "CLASSPATH",
    "MAKEFLAGS",
    "MFLAGS",
    "GCONV_PATH",
    "LOCPATH",
    "NLSPATH",
    "HOSTALIASES",
    "RES_OPTIONS",
    "TERMINFO",
];

/// Prefixes of unsafe names: exported functions, loader, git, locale, npm, cargo, pip.
const UNSAFE_PREFIXES: &[&str] = &[
    "BASH_FUNC_",
    "LD_",
    "GIT_",
    "LC_",
    "npm_config_",
    "NPM_CONFIG_",
    "CARGO_",
    "RUSTC",
    "RUSTDOC",
    "PIP_",
    "MALLOC_",
];

/// Whether a variable may never be restored (see [`UNSAFE_NAMES`]); also any name that is
/// not a shell identifier.
pub(crate) fn is_unsafe_name(name: &str) -> bool {
    let ident = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    !ident || UNSAFE_NAMES.contains(&name) || UNSAFE_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Which calls' secrets wrote a variable ([`Writer`], defined with the lanes that also
/// key on it, below this module).
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
    vars: BTreeMap<String, (String, Writer)>,
}

impl ShellState {
    /// What a call with `secrets` starts from: the working directory, and the variables it
    /// may see (all, for a call without secrets; only those written by calls with the
    /// same secrets, otherwise).
    pub(crate) fn for_call(&self, secrets: &[(String, String)]) -> (String, Vec<(String, String)>) {
        let me = writer_of(secrets);
        let vars = self
            .vars
            .iter()
            .filter(|(_, (_, w))| me == 0 || *w == me)
            .map(|(k, (v, _))| (k.clone(), v.clone()))
            .collect();
        (self.cwd.clone().unwrap_or_else(|| WORKSPACE.to_string()), vars)
    }

    /// Takes what a call exported (`cwd\0K=V\0…`, as the agent reports it) as the new
    /// state, keeping only what may carry over. Returns false (state unchanged) when the
    /// report is not of that shape.
    pub(crate) fn update(&mut self, raw: &[u8], secrets: &[(String, String)]) -> bool {
        let mut items = raw.split(|b| *b == 0).filter(|i| !i.is_empty());
        let Some(cwd) = items.next().and_then(|c| std::str::from_utf8(c).ok()) else { return false };
        if !cwd.starts_with('/') {
            return false;
        }
        let me = writer_of(secrets);
        let secret_values: Vec<&str> = secrets.iter().map(|(_, v)| v.as_str()).filter(|v| !v.is_empty()).collect();
        // Variables this call could not see stay as they were; the ones it saw are replaced
        // by what it exported (so an `unset` sticks).
        let mut vars: BTreeMap<String, (String, Writer)> =
            self.vars.iter().filter(|(_, (_, w))| me != 0 && *w != me).map(|(k, v)| (k.clone(), v.clone())).collect();
        let mut bytes: usize = vars.iter().map(|(k, (v, _))| k.len() + v.len()).sum();
        for item in items {
            let Ok(item) = std::str::from_utf8(item) else { continue };
            let Some((name, value)) = item.split_once('=') else { continue };
            let carried = !is_unsafe_name(name)
                && !secrets.iter().any(|(k, _)| k == name)
                && !secret_values.iter().any(|s| value.contains(s))
                && !BASE_ENV.iter().any(|(k, v)| *k == name && *v == value);
            if !carried || vars.len() >= MAX_VARS || bytes + name.len() + value.len() > MAX_BYTES {
                continue;
            }
            bytes += name.len() + value.len();
            // Unchanged variables keep who wrote them; new or changed ones are this call's.
            let writer = match self.vars.get(name) {
                Some((old, w)) if old == value => *w,
                _ => me,
            };
            vars.insert(name.to_string(), (value.to_string(), writer));
        }
        let inside = cwd == WORKSPACE || cwd.strip_prefix(WORKSPACE).is_some_and(|r| r.starts_with('/'));
        self.cwd = inside.then(|| cwd.to_string());
        self.vars = vars;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn report(cwd: &str, vars: &[(&str, &str)]) -> Vec<u8> {
        let mut v = format!("{cwd}\0").into_bytes();
        for (k, val) in vars {
            v.extend(format!("{k}={val}\0").bytes());
        }
        v
    }

    fn secret(v: &str) -> Vec<(String, String)> {
        vec![("API_TOKEN".to_string(), v.to_string())]
    }

    #[test]
    fn planted_hooks_never_carry_over() {
        let mut s = ShellState::default();
        let raw = report(
            "/workspace/deep",
            &[
                ("BASH_ENV", "/workspace/hook.sh"),
                ("BASH_FUNC_ls%%", "() { env; }"),
                ("PATH", "/workspace/.b:/usr/bin"),
                ("GIT_CONFIG_COUNT", "1"),
                ("LD_PRELOAD", "/x.so"),
                ("POSIXLY_CORRECT", "1"),
                ("GREETING", "hello world"),
            ],
        );
        assert!(s.update(&raw, &[]));
        let (cwd, vars) = s.for_call(&[]);
        assert_eq!(cwd, "/workspace/deep");
        assert_eq!(vars, vec![("GREETING".to_string(), "hello world".to_string())]);
    }

    #[test]
    fn a_cwd_outside_the_workspace_is_not_kept() {
        let mut s = ShellState::default();
        s.update(&report("/tmp/evil", &[]), &[]);
        assert_eq!(s.for_call(&[]).0, WORKSPACE);
    }

    /// Regression (issue 11): a task's secret was copied into the persisted state and a
    /// later task read it.
    #[test]
    fn secrets_and_copies_are_never_kept() {
        let mut s = ShellState::default();
        let raw = report("/workspace", &[("API_TOKEN", "sk-1"), ("COPY", "x-sk-1-y"), ("OK", "fine")]);
        s.update(&raw, &secret("sk-1"));
        let (_, vars) = s.for_call(&secret("sk-1"));
        assert_eq!(vars, vec![("OK".to_string(), "fine".to_string())]);
    }

    /// Review finding: variables written without secrets never reach a call with secrets.
    #[test]
    fn a_call_with_secrets_sees_only_state_written_with_the_same_secrets() {
        let mut s = ShellState::default();
        s.update(&report("/workspace", &[("FROM_A", "1")]), &[]);
        assert!(s.for_call(&secret("sk-2")).1.is_empty(), "task A's exports do not reach task B");
        s.update(&report("/workspace", &[("FROM_B", "2")]), &secret("sk-2"));
        assert_eq!(s.for_call(&secret("sk-2")).1, vec![("FROM_B".to_string(), "2".to_string())]);
        assert!(s.for_call(&secret("sk-3")).1.is_empty());
        assert_eq!(s.for_call(&[]).1.len(), 2, "calls without secrets see everything; B kept A's");
        s.update(&report("/workspace", &[("FROM_B", "2")]), &[]);
        assert_eq!(s.for_call(&[]).1.len(), 1, "an unset by a call that saw it sticks");
    }

    proptest! {
        /// Whatever a call exports, no secret value survives and no unsafe name is kept.
        #[test]
        fn nothing_secret_or_unsafe_survives(
            vars in proptest::collection::vec(("[A-Za-z_][A-Za-z0-9_]{0,12}", "[ -~]{0,20}"), 0..20),
            secret_value in "[a-z0-9]{4,12}",
        ) {
            let mut raw = b"/workspace\0".to_vec();
            for (k, v) in &vars {
                raw.extend(format!("{k}={v}{}\0", if k.len() % 2 == 0 { secret_value.as_str() } else { "" }).bytes());
            }
            let mut s = ShellState::default();
            s.update(&raw, &secret(&secret_value));
            for who in [vec![], secret(&secret_value)] {
                for (k, v) in s.for_call(&who).1 {
                    prop_assert!(!v.contains(&secret_value));
                    prop_assert!(!is_unsafe_name(&k));
                }
            }
        }
    }
}
