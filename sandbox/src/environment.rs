//! The environment a sandboxed call starts with: warden's fixed set, then the task's
//! variables the caller chose to export (and the operator allowed), nothing else.
//!
//! Nothing carries over between calls: a variable one command exports is gone in the next
//! (as in Claude Code, which keeps the working directory, not the environment), so no call
//! can leave behind a variable that steers what a later allowed command runs. The fixed
//! set ([`base_env`]) is the container's environment: `PATH`, `HOME` (the workspace, a
//! directory the file tools can see and the gate judges, not a shared scratch space),
//! `LANG`, the egress proxy's variables when egress is on, git's overrides of every
//! setting that runs a program ([`GIT_OVERRIDES`], at the highest precedence git has), and
//! [`TOOL_CONFIG`]: the user configuration of the image's other tools comes from a
//! directory no sandboxed process can write, never from the workspace, so a file one task's
//! command planted (a Python `.pth`, a `.curlrc` with `--trace-ascii`, a `pip.conf`) is
//! never read by another task's allowed command.
//!
//! [`check_name`] is the one validator of a variable name that comes from outside warden
//! (a `tool_context` key exported into the sandbox, an operator's list): a shell
//! identifier that names nothing that changes how bash, the dynamic loader, an
//! interpreter or a common tool starts, parses, finds programs or reads configuration.
//! The host checks names before a task exists; the agent refuses a name of the fixed set
//! as a second line.
//!
//! This module must never hold or log a variable's value.

use crate::agent::WORKSPACE;

/// PATH inside the container (imported images carry no environment).
pub(crate) const CONTAINER_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// HOME inside the container: the workspace, a directory the file tools can see and the
/// approval gate judges (`~/.gitconfig` is `/workspace/.gitconfig`), not a scratch space
/// beside it that persists between calls unseen.
pub(crate) const CONTAINER_HOME: &str = WORKSPACE;

/// Longest variable name accepted from outside warden: longer names are not needed by any
/// program and would only make the request bigger.
pub const MAX_NAME_BYTES: usize = 128;

/// Names that change how bash, the dynamic loader or a common tool starts, parses, finds
/// programs or reads configuration: a value chosen by a caller (or planted by an earlier
/// call) would run code, or change what an allowed command does.
const UNSAFE_NAMES: &[&str] = &[
    "PATH",
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "BASH_COMPAT",
    "BASH_XTRACEFD",
    "BASH_LOADABLES_PATH",
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
    "HISTFILESIZE",
    "HISTSIZE",
    "HISTCONTROL",
    "HISTIGNORE",
    "HISTTIMEFORMAT",
    "INPUTRC",
    "TMOUT",
    "EXECIGNORE",
    "FUNCNEST",
    "OPTIND",
    "OPTERR",
    "LINENO",
    "RANDOM",
    "SRANDOM",
    "SECONDS",
    "HISTCMD",
    "COLUMNS",
    "LINES",
    "PWD",
    "OLDPWD",
    "SHLVL",
    "_",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TMPDIR",
    "TMP",
    "TEMP",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TZDIR",
    "TERM",
    "TERMINFO",
    "TERMINFO_DIRS",
    "TERMCAP",
    "PYTHONSTARTUP",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONINSPECT",
    "PYTHONUSERBASE",
    "PYTHONEXECUTABLE",
    "PERL5OPT",
    "PERL5LIB",
    "PERLLIB",
    "PERL5DB",
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
    "MANOPT",
    "LESS",
    "LESSOPEN",
    "LESSCLOSE",
    "LESSKEY",
    "JAVA_TOOL_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "_JAVA_OPTIONS",
    "CLASSPATH",
    "MAKEFLAGS",
    "MFLAGS",
    "MAKEFILES",
    "GCONV_PATH",
    "LOCPATH",
    "NLSPATH",
    "HOSTALIASES",
    "RES_OPTIONS",
    "LOCALDOMAIN",
    "CURL_HOME",
    "WGETRC",
    "GNUPGHOME",
    "GIT_DIR",
    "CC",
    "CXX",
    "CPP",
    "LD",
    "AR",
    "SHELLCHECK_OPTS",
    "PROMPT_DIRTRIM",
    "MAIL",
    "MAILPATH",
    "MAILCHECK",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
];

/// Prefixes of unsafe names: exported functions, the loader, git, configuration
/// locations, locale, package managers and build tools that read code-running settings
/// from their environment, and warden's own variables.
const UNSAFE_PREFIXES: &[&str] = &[
    "BASH_",
    "LD_",
    "GIT_",
    "XDG_",
    "LC_",
    "SSH_",
    "SSH2_",
    "GPG_",
    "npm_",
    "NPM_",
    "YARN_",
    "PNPM_",
    "BUN_",
    "DENO_",
    "CARGO_",
    "RUSTC",
    "RUSTDOC",
    "RUSTFLAGS",
    "RUSTUP_",
    "PIP_",
    "UV_",
    "POETRY_",
    "VIRTUAL_ENV",
    "CONDA",
    "PYTHON",
    "MALLOC_",
    "GLIBC_",
    "GCONV_",
    "GEM_",
    "BUNDLE_",
    "GOFLAGS",
    "GOENV",
    "GOPATH",
    "GOROOT",
    "GOTOOLCHAIN",
    "CFLAGS",
    "CXXFLAGS",
    "CPPFLAGS",
    "LDFLAGS",
    "PKG_CONFIG",
    "DOCKER_",
    "KUBECONFIG",
    "WARDEN_",
];

/// Why a variable name from outside warden is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvNameError {
    #[error("{0:?} is not a shell variable name ([A-Za-z_][A-Za-z0-9_]*)")]
    NotAnIdentifier(String),
    #[error("{0:?} is longer than {MAX_NAME_BYTES} bytes")]
    TooLong(String),
    #[error(
        "{0:?} changes how the shell or a program in the sandbox starts, finds programs or reads configuration; \
         it is never set from outside warden"
    )]
    Steering(String),
}

/// Whether `name` may be set in a sandboxed call's environment from outside warden (see
/// the module documentation); the error says why not.
pub fn check_name(name: &str) -> Result<(), EnvNameError> {
    let ident = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ident {
        return Err(EnvNameError::NotAnIdentifier(name.to_owned()));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(EnvNameError::TooLong(name.to_owned()));
    }
    let upper = name.to_ascii_uppercase();
    let steering = UNSAFE_NAMES.iter().any(|n| n.eq_ignore_ascii_case(name))
        || UNSAFE_PREFIXES.iter().any(|p| upper.starts_with(&p.to_ascii_uppercase()));
    if steering {
        return Err(EnvNameError::Steering(name.to_owned()));
    }
    Ok(())
}

/// git settings that run a program, overridden for every call (`GIT_CONFIG_COUNT`, the
/// same precedence as `git -c`, above every configuration file): hooks, the file-system
/// monitor, pagers and editors, external diff, ssh and proxy commands, credential and
/// password helpers, signing programs, and the `ext::` transport. What git can still run
/// from a repository's own `.git/config` (filter, textconv and merge drivers, which have
/// names of the repository's choosing, and `diff.external`, which no value turns off: an
/// empty one makes every `git diff` fail) is listed in docs/operators.md.
pub const GIT_OVERRIDES: &[(&str, &str)] = &[
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.pager", "cat"),
    ("core.editor", "true"),
    ("sequence.editor", "true"),
    ("core.sshCommand", "ssh -F /dev/null"),
    ("core.gitProxy", ""),
    ("core.askPass", ""),
    ("core.attributesFile", "/dev/null"),
    ("core.excludesFile", "/dev/null"),
    ("credential.helper", ""),
    ("diff.tool", ""),
    ("merge.tool", ""),
    ("gpg.program", "false"),
    ("gpg.ssh.program", "false"),
    ("gpg.x509.program", "false"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("push.gpgSign", "false"),
    ("log.showSignature", "false"),
    ("protocol.ext.allow", "never"),
    ("uploadpack.packObjectsHook", ""),
    ("receive.procReceiveRefs", ""),
];

/// Where the fixed set points the image's tools for their user configuration: a directory
/// of root's (mode 0755) that the host's workspace setup makes before any sandboxed code
/// runs, holding only an empty `.curlrc` (`container.rs`). On /tmp, like the agent's own
/// files: it lives and dies with the container.
pub(crate) const TOOL_CONFIG_DIR: &str = "/tmp/.warden-config";

/// The image's tools that read configuration (code they run, files they write, where they
/// send requests) from the home directory — the workspace — each pointed away from it:
/// - Python: no user site directory, so no `.pth` file or `usercustomize` under
///   `~/.local` runs at a later interpreter's start (`PYTHONNOUSERSITE`);
/// - pip: no configuration file at all (`PIP_CONFIG_FILE=/dev/null`; an operator's
///   `/etc/pip.conf` too), so no planted `pip.conf` sends a later install to another index
///   or a planted directory, and no cache (`PIP_NO_CACHE_DIR`), so no wheel or index page
///   planted in `~/.cache/pip` is installed by a later task;
/// - curl: `$CURL_HOME/.curlrc` is the first it looks for and the empty one in
///   [`TOOL_CONFIG_DIR`] ends the search, so `~/.curlrc` (`trace-ascii`, `libcurl`, `url`
///   options that copy a later request's headers or run a planted script) is never read;
/// - every tool that follows the XDG base directories (`XDG_CONFIG_HOME`), git included.
///
/// git's own settings are [`GIT_OVERRIDES`]; what remains is listed in docs/operators.md.
pub const TOOL_CONFIG: &[(&str, &str)] = &[
    ("PYTHONNOUSERSITE", "1"),
    ("PIP_CONFIG_FILE", "/dev/null"),
    ("PIP_NO_CACHE_DIR", "1"),
    ("CURL_HOME", TOOL_CONFIG_DIR),
    ("XDG_CONFIG_HOME", TOOL_CONFIG_DIR),
];

/// The environment every sandboxed process starts with (the container's own): see the
/// module documentation. `extra` (the egress proxy's variables) comes after the fixed set.
pub(crate) fn base_env(extra: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut env = vec![
        format!("PATH={CONTAINER_PATH}"),
        format!("HOME={CONTAINER_HOME}"),
        "LANG=C.UTF-8".to_owned(),
        // No system or user configuration file: only the repository's own, overridden below.
        "GIT_CONFIG_NOSYSTEM=1".to_owned(),
        "GIT_CONFIG_GLOBAL=/dev/null".to_owned(),
        "GIT_ATTR_NOSYSTEM=1".to_owned(),
        "GIT_TERMINAL_PROMPT=0".to_owned(),
        // The variables git reads before any configuration (a `pager.<command>` of the
        // repository's choosing included).
        "GIT_PAGER=cat".to_owned(),
        "GIT_EDITOR=true".to_owned(),
        "GIT_SEQUENCE_EDITOR=true".to_owned(),
        "GIT_SSH_COMMAND=ssh -F /dev/null".to_owned(),
        "GIT_ASKPASS=".to_owned(),
        format!("GIT_CONFIG_COUNT={}", GIT_OVERRIDES.len()),
    ];
    for (i, (key, value)) in GIT_OVERRIDES.iter().enumerate() {
        env.push(format!("GIT_CONFIG_KEY_{i}={key}"));
        env.push(format!("GIT_CONFIG_VALUE_{i}={value}"));
    }
    env.extend(TOOL_CONFIG.iter().map(|(name, value)| format!("{name}={value}")));
    env.extend(extra);
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Regression (issue 40, item 4): `tool_context` keys became environment names
    /// unchecked (`bash_env`, `shellopts`/`ps4`, `path`, `git_config_count`).
    #[test]
    fn tool_context_keys_that_steer_programs_are_refused() {
        for name in [
            "BASH_ENV",
            "SHELLOPTS",
            "PS4",
            "PATH",
            "GIT_CONFIG_COUNT",
            "GIT_CONFIG_KEY_0",
            "XDG_CONFIG_HOME",
            "LD_PRELOAD",
            "BASH_FUNC_ls%%",
            "HOME",
            "OPTIND",
            "WARDEN_SESSION_PROCESS",
            "NODE_OPTIONS",
            "path",
            "Bash_Env",
        ] {
            assert!(check_name(name).is_err(), "{name} must be refused");
        }
        for name in ["RT_SECRET", "API_TOKEN", "GITHUB_TOKEN", "OPENAI_API_KEY", "_X1"] {
            assert_eq!(check_name(name), Ok(()), "{name} is an ordinary secret's name");
        }
        assert!(matches!(check_name("A-B"), Err(EnvNameError::NotAnIdentifier(_))));
        assert!(matches!(check_name(&"A".repeat(MAX_NAME_BYTES + 1)), Err(EnvNameError::TooLong(_))));
    }

    /// The agent's `prepare` makes the directory the fixed set names.
    #[test]
    fn the_agent_makes_the_tool_configuration_directory() {
        let agent = crate::agent::AGENT_SOURCE;
        assert!(agent.contains(&format!("TOOL_CONFIG_DIR = \"{TOOL_CONFIG_DIR}\"")));
        assert!(TOOL_CONFIG.iter().any(|(n, v)| *n == "CURL_HOME" && *v == TOOL_CONFIG_DIR));
    }

    /// Every name of the fixed set is refused from outside: a caller can never replace
    /// one of warden's own variables.
    #[test]
    fn no_name_of_the_fixed_set_can_be_set_from_outside() {
        let proxies = ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy"];
        for var in base_env(proxies.map(|p| format!("{p}=x"))) {
            let name = var.split_once('=').expect("NAME=value").0;
            assert!(check_name(name).is_err(), "{name} of the fixed set must be refused");
        }
    }

    #[test]
    fn every_override_is_counted_and_home_is_the_workspace() {
        let env = base_env([]);
        assert!(env.contains(&format!("GIT_CONFIG_COUNT={}", GIT_OVERRIDES.len())));
        assert!(env.contains(&format!(
            "GIT_CONFIG_KEY_{}={}",
            GIT_OVERRIDES.len() - 1,
            GIT_OVERRIDES.last().unwrap().0
        )));
        assert!(env.contains(&"HOME=/workspace".to_owned()));
    }

    proptest! {
        /// Whatever the case, a name that starts with an unsafe prefix or is an unsafe name
        /// is refused.
        #[test]
        fn unsafe_names_are_refused_in_any_case(
            i in 0..UNSAFE_PREFIXES.len(), rest in "[A-Za-z0-9_]{0,12}", upper in any::<bool>(),
        ) {
            let name = format!("{}{rest}", UNSAFE_PREFIXES[i]);
            let name = if upper { name.to_ascii_uppercase() } else { name.to_ascii_lowercase() };
            prop_assert!(check_name(&name).is_err());
        }
    }
}
