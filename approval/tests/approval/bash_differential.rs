//! Differential test of the Bash recognizer against real bash (issue 11).
//!
//! Property: every command that the policy ALLOWS under [`ALLOW`] (`Bash(echo:*)`,
//! the builtins that assign variables or change directory, `Bash(git status)` and
//! assignments to a few variables bash evaluates or searches with) runs in real bash
//! without executing anything but those builtins and `/usr/bin/git status`, and
//! without creating a file — with state planted before every command the way earlier
//! approved commands could have left it (issue 40; `tripwire/harness.py`): exported
//! variables whose values run code once evaluated, a `BASH_ENV` file, a directory of
//! programs named like common ones, git and XDG configuration under `HOME`.
//!
//! The commands come from a proptest generator with a fixed seed: a grammar of
//! words, quotes, operators, redirections, expansions, substitutions,
//! heredocs, compound commands and control bytes, plus mutations of a corpus
//! that holds every construct the recognizer refuses and the examples of
//! issue 11. They run in ONE container of a tripwire image derived from the
//! sandbox image `warden-sandbox:bookworm` (built by `cargo xtask test`):
//! every executable except `/usr/bin/echo` is replaced by a tripwire that
//! logs its invocation, bash itself runs from a hidden path, a command bash
//! cannot find is logged too, so is every simple command (builtins included,
//! through a DEBUG trap) whose command word is not `echo`, and the harness
//! (`tripwire/harness.py`) lists
//! every file that appears in any directory the unprivileged user can write
//! (the root file system is read-only; `--network none`).
//!
//! Line continuations (backslash-newline, which bash removes before it tokenizes)
//! are generated right after the `$` of expansions and substitutions, inside
//! redirection and list operators (their lookahead) and anywhere in a token
//! ([`continued`]), since a recognizer that reads them at the wrong time sees a
//! literal `$` where bash runs `$(...)`.
//!
//! Before the property, the known bad commands (the issue's examples) run in
//! the same container and must fire a tripwire or create a file, and the
//! policy must ASK for each: so the test would have caught the old splitter,
//! which allowed them.
//!
//! Knobs: `WARDEN_BASH_DIFF_CASES` (default [`DEFAULT_CASES`]) generated
//! commands, `WARDEN_BASH_DIFF_SEED` (a `u64`, default [`DEFAULT_SEED`]).
//! Docker and the sandbox image must be present: the test fails (never skips)
//! without them.
//!
//! Issue 44: the policy also allows the builtins the recognizer now understands in their
//! forms that cannot run code (`test`/`[`, `set`, `trap`, `hash`, `history`, `fc`,
//! `alias`, the completion builtins, `mapfile`, `command -v`, `exec` with redirections
//! only; `${name:-word}`, `${#name}`, `!`), the corpus seeds them ([`NEWLY_UNDERSTOOD`]), and
//! the property holds for them too. The test also runs up to [`DEFAULT_CANDIDATES`]
//! (`WARDEN_BASH_DIFF_CANDIDATES`) of the generated commands the policy ASKS about, and
//! reports those that ran nothing unexpected as candidates for the recognizer to model,
//! counted by the reason they were asked (a report, never a failure: asking is safe).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use warden_approval::{Decision, Policy};

use super::{ctx, policy};

/// Generated commands per run: a few thousand keeps `cargo xtask test` in
/// seconds; raise it with `WARDEN_BASH_DIFF_CASES` for a longer hunt.
const DEFAULT_CASES: usize = 3000;
/// Fixed seed so a failure reproduces; override with `WARDEN_BASH_DIFF_SEED`.
const DEFAULT_SEED: u64 = 0x5741_5244_454e_0011;
/// The sandbox image the tripwire image derives from (`cargo xtask test`
/// builds it).
const BASE_IMAGE: &str = "warden-sandbox:bookworm";
/// Repository of the derived image; the tag is a digest of the recipe and the
/// base image id, so a changed recipe or base rebuilds it.
const TRIPWIRE_REPO: &str = "warden-bash-tripwire";
/// Asked commands run to find candidates (see the module docs): enough to see which
/// reasons keep asking about harmless commands, few enough to stay in seconds.
const DEFAULT_CANDIDATES: usize = 1000;
/// Candidates listed per reason in the report.
const CANDIDATE_EXAMPLES: usize = 3;
/// Share of generated commands that must be allowed, so the property is
/// never vacuous.
const MIN_ALLOWED_SHARE: f64 = 0.1;

/// Longest silence from the harness before the test gives up on it: far
/// beyond its per-command limit (5 s), so only a wedged harness trips it.
const HARNESS_STALL: std::time::Duration = std::time::Duration::from_secs(120);

const SETUP: &str = include_str!("tripwire/setup.sh");
const HARNESS: &str = include_str!("tripwire/harness.py");

/// Commands that the old splitter allowed under `Bash(echo:*)` and that
/// misbehave in real bash (issue 11), plus relatives. Each must be ASKED by
/// the policy and must fire a tripwire or create a file in the container.
const KNOWN_BAD: &[&str] = &[
    "echo ok\r# ; rm -rf x",
    "echo ok\r# ; touch x",
    "cat <<'EOF'\nit's\nEOF\ntouch x",
    "echo <<EOF\nit's\nEOF\ntouch y # '",
    "echo ${z:='a[$(touch z)]'} $((z))",
    "echo ${z:='$(touch p)'} ${z@P}",
    "echo data >&1name",
    "echo hi >&2name 2>&1",
    "echo $((a[$(touch s)]))",
    // Review item 1: bash joins `$\<nl>(` into `$(` before it tokenizes.
    "echo \"$\\\n(touch c)\"",
    "echo \"$\\\n\\\n(touch c)\" x",
    "echo ${x:='a[$(touch i)]'} ${!x}",
    "echo `echo \\`touch b\\``",
    "echo() { touch f; }; echo x",
    "eval 'touch e'",
    "echo ${x:-$(touch d)}",
    "echo hi > out",
    "echo <> rw",
];

/// Issue 40: assignments bash evaluates as arithmetic, `read`/`getopts` targets, and a
/// change of how names are found followed by a command. Each must be ASKED and must fire
/// a tripwire (the planted state makes `RANDOM=pv` evaluate `pv`, `getopts g RANDOM -g`
/// evaluate `g`).
const KNOWN_BAD_STATE: &[&str] = &[
    "export OPTIND='a[$(touch o)]'",
    "OPTIND='a[$(touch o)]'",
    "declare RANDOM='a[$(touch o)]'",
    "readonly SECONDS='a[$(touch o)]'",
    "RANDOM=pv",
    "export OPTIND=pv",
    "read OPTIND <<< 'a[$(touch r)]'",
    "getopts g RANDOM -g",
    "export PATH=/scratch/.planted-bin:$PATH; git status",
    "PATH=/scratch/.planted-bin; git status",
    "cd /scratch/.planted-bin && ./git status",
];

/// What the property's policy allows: `echo`, builtins that assign or change directory
/// (their evaluation is what is under test), one external program (`git status`, whose
/// tripwire line at its real path the harness expects), and assignments to variables
/// that bash evaluates (`OPTIND`, `RANDOM`, `SECONDS`) or searches with (`PATH`).
const ALLOW: &[&str] = &[
    "Bash(echo:*)",
    "Bash(export:*)",
    "Bash(declare:*)",
    "Bash(readonly:*)",
    "Bash(read:*)",
    "Bash(getopts:*)",
    "Bash(cd:*)",
    "Bash(test:*)",
    "Bash([:*)",
    "Bash(set:*)",
    "Bash(trap:*)",
    "Bash(hash:*)",
    "Bash(history:*)",
    "Bash(fc:*)",
    "Bash(alias:*)",
    "Bash(unalias:*)",
    "Bash(complete:*)",
    "Bash(compgen:*)",
    "Bash(compopt:*)",
    "Bash(mapfile:*)",
    "Bash(readarray:*)",
    "Bash(command:*)",
    "Bash(exec:*)",
    "Bash(git status)",
    "Bash(OPTIND=*)",
    "Bash(RANDOM=*)",
    "Bash(SECONDS=*)",
    "Bash(PATH=*)",
];

/// Issue 44: constructs real bash cannot turn into code, now understood; seeds of the
/// corpus, with their relatives that must keep asking (mutations mix the two).
const NEWLY_UNDERSTOOD: &[&str] = &[
    "[ -n \"$pv\" ] && echo set; test -z \"$qv\"; [ \"$g\" -eq 1 ]; [ \"$pv\" = \"$qv\" ]",
    "test -v pv; [ -v 'a[$(touch v)]' ]; [ $pv ]; [ \"$op\" \"$pv\" ]; test -n $qv",
    "declare -i n=42; declare -ix m=1; declare -i k; k=\"$pv\"",
    "echo a!b !! !$; history; history -c; fc -l; history -s 'touch h'; fc -s",
    "alias echo=touch; unalias echo; echo x",
    "complete -o default x; compgen -W 'a b' -- a; compgen -W '$(touch w)'; compgen -C 'touch c' x",
    "set -a; set -o vi; set -- a b; set -o posix; set -x; set -k",
    "trap -l; trap - INT; trap '' HUP; trap 'touch t' EXIT",
    "echo ${pv:-d} ${qv:+a} ${pv%]} ${pv##*[} ${#pv}; echo ${pv:=x} ${!g}",
    "exec 3</dev/null; exec 4>&1; exec touch e",
    "mapfile a </dev/null; readarray -t b </dev/null; mapfile -C 'touch m' -c 1 c <<< x; mapfile OPTIND <<< pv",
    "hash; hash -r; hash -p /opt/.w/tripwire echo; echo",
    "command -v git; command -V echo; command touch c",
    "TZ=UTC echo hi; LC_ALL=C echo; NODE_DEBUG=x echo",
];

/// Seeds for the mutation half of the generator: every class the recognizer
/// refuses, the known bad commands, and plain allowed ones.
const CORPUS: &[&str] = &[
    "echo hi",
    "echo 'a b' \"c $HOME\" $1 ${x} 2>&1",
    "echo $((1 + 2)) >/dev/null",
    "echo a && echo b || echo c; echo d | echo e & echo f",
    "( echo a ); { echo b; }",
    "if echo a; then echo b; else echo c; fi",
    "echo $(echo x) `echo y` <(echo z)",
    "echo hi # ; touch c",
    "echo a\\\necho b",
    "echo x\0touch n",
    "echo \u{1b}[0m; touch esc",
    "echo $'\\x41' \"$(echo q)\"",
    "exec touch e",
    "source /dev/null; . /dev/null",
    "alias echo=touch",
    "trap 'touch t' EXIT; echo",
    "builtin echo x; command touch c",
    "set -x; set -o posix; shopt -s extglob; enable -n echo",
    "coproc touch c",
    "{echo,x}; ec?o hi; $'echo' hi; ~/echo",
    "echo hi!x; echo $[1+1]; ((x=1))",
    "echo \"`echo \"x\"`\"",
    "declare -n r='a[$(touch n)]'; echo $r",
    "read 'a[$(touch r)]' <<< x",
    "printf -v 'a[$(touch v)]' x; [ -v 'a[$(touch v)]' ]",
    "echo {fd}>f; echo >&-; echo <<<word",
    "case x in x) touch k;; esac",
    "for i in 1; do touch l; done",
    "a=(1 2); a[0]=1 echo",
    "echo $\"hi\"",
    "cat <<-EOF\n\ttouch h\n\tEOF\n",
    "echo \"$\\\n(touch c)\" $\\\n'\\x41' \"$\\\n{x}\" $\\\n((1+2))",
    "cat <\\\n(touch p); echo hi &\\\n>f; echo 2>\\\n&1",
    "time -- touch t; time -p -- echo hi; time -- echo hi",
    "$\\\n'\\x74ouch' t; echo 'a\\\nb' \"a\\\nb\" # c\\\ntouch d",
];

/// One interesting token per line: inserted by mutations.
const TOKENS: &[&str] = &[
    "\r", "\0", "\t", "\n", "\u{7f}", "\u{1b}", " ", ";", "&", "|", "(", ")", "{", "}", "<", ">", ">&", "<&", "&>",
    "<<", "<<<", "$", "${", "}", "$(", "$((", "))", "`", "'", "\"", "\\", "#", "!", "*", "?", "[", "]", "~", "=", ":",
    "@P", ":=", "1name", "touch t", "rm x", "eval ", "exec ", "echo ", "EOF", "-", "%", "^", ",", "a[", "]=", "\\\n",
    "$\\\n(", "$\\\n'", "$\\\n{", "$\\\n((", "$\\\n\"", "<\\\n(", ">\\\n(", "&\\\n>", "time -- ",
];

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a valid number")),
        Err(_) => default,
    }
}

// ---------------------------------------------------------------- generator

fn pick(items: &'static [&'static str]) -> BoxedStrategy<String> {
    proptest::sample::select(items).prop_map(str::to_owned).boxed()
}

/// Mostly `benign` (understood, so the property gets many allowed
/// commands), sometimes `risky`.
fn mostly(benign: &'static [&'static str], risky: &'static [&'static str]) -> BoxedStrategy<String> {
    prop_oneof![6 => pick(benign), 1 => pick(risky)].boxed()
}

/// A line continuation (a backslash, then a newline), which bash removes before
/// anything else: inserted after the first character of what `s` generates (right after the `$`
/// of an expansion, the `<` of `<(`, the first character of an operator), or anywhere.
fn continued(s: BoxedStrategy<String>) -> BoxedStrategy<String> {
    let inserted = (s.clone(), any::<bool>(), any::<prop::sample::Index>()).prop_map(|(s, after_first, at)| {
        let chars: Vec<char> = s.chars().collect();
        let i = if after_first { chars.len().min(1) } else { at.index(chars.len() + 1) };
        let mut out: String = chars[..i].iter().collect();
        out.push_str("\\\n");
        out.extend(&chars[i..]);
        out
    });
    prop_oneof![4 => s, 1 => inserted].boxed()
}

fn plain_word() -> BoxedStrategy<String> {
    mostly(
        &[
            "hi", "x", "-n", "-e", "--", "rm", "touch", "f", "/bin/rm", "1name", "out", "a=b", "*", "?", "[ab]",
            "{a,b}", "{1..3}", "~", "~/x", "#", "!", "%", ":", ",", "@", "=", "}", "{", "]", "if", "then", "fi",
            "done", "time", "-p", "2", "é",
        ],
        &["!x", "a!b", "&", "\r"],
    )
}

fn expansion() -> BoxedStrategy<String> {
    continued(expansion_written())
}

fn expansion_written() -> BoxedStrategy<String> {
    mostly(
        &[
            "$x",
            "${x}",
            "$HOME",
            "$1",
            "$?",
            "$$",
            "$#",
            "${#}",
            "$((1+2))",
            "$((2*(3-1)))",
            "$'\\x41'",
            "$",
            "$x[0]",
            "$@",
            "\"$@\"",
            "${10}",
            "$_",
            "${_}",
            "$-",
            "$!",
            r"$'a\'b'",
            r"$'\\'",
            r"$'\''",
            r"$'\n;touch a'",
            r#""\"""#,
            r#""a\\""#,
            r"'\'",
            r#""'""#,
        ],
        &[
            "${z@P}",
            "${z:='a[$(touch z)]'}",
            "${z:='$(touch p)'}",
            "${!x}",
            "${#x}",
            "${x:-$(touch d)}",
            "${x/a/b}",
            "${x:1}",
            "${a[0]}",
            "$((1+2))",
            "$((2*(3-1)))",
            "$((z))",
            "$((a[0]))",
            "$[1+1]",
            "$'\\x41'",
            "$\"hi\"",
        ],
    )
}

fn redirect() -> BoxedStrategy<String> {
    continued(redirect_written())
}

fn redirect_written() -> BoxedStrategy<String> {
    mostly(
        &["2>&1", ">&2", ">/dev/null", "2>/dev/null", "&>/dev/null", "<<<w", ">&-", "1>&2", "<&0", "</dev/null"],
        &[
            ">f",
            ">>f",
            "2>&1",
            ">&1name",
            ">&2",
            ">/dev/null",
            "2>/dev/null",
            "&>/dev/null",
            "<f",
            "<<<w",
            "<>f",
            "&>f",
            "{fd}>f",
            ">&-",
            ">|f",
            "1>&2",
            "<&0",
            ">\"$x\"",
            "<<EOF\nit's\nEOF\n",
            "<<'EOF'\n$(touch h)\nEOF\n",
            "<<-EOF\n\techo x\n\tEOF\n",
            "<<EOF\n$(touch h)\nEOF\n",
        ],
    )
}

fn quoted(depth: u32) -> BoxedStrategy<String> {
    let inner = prop_oneof![
        3 => plain_word(),
        2 => expansion(),
        1 => pick(&[" ", ";", "'", "\\\"", "\\$", "\\\n", "\n", "!", "`echo q`", "$(touch q)"]),
        1 => subst(depth),
    ];
    let single = proptest::collection::vec(pick(&["hi", " ", "$(touch s)", "\"", "\\", "\n", ";", "!x", "`"]), 0..4)
        .prop_map(|v| format!("'{}'", v.concat()));
    let double = proptest::collection::vec(inner, 0..4).prop_map(|v| format!("\"{}\"", v.concat()));
    prop_oneof![single, double].boxed()
}

fn subst(depth: u32) -> BoxedStrategy<String> {
    if depth == 0 {
        return continued(mostly(&["$(echo s)", "`echo b`", "<(echo p)"], &["$(touch s)", ">(touch s)"]));
    }
    let l = list(depth - 1);
    continued(
        (0..4usize, l)
            .prop_map(|(k, l)| match k {
                0 => format!("$({l})"),
                1 => format!("`{l}`"),
                2 => format!("<({l})"),
                _ => format!(">({l})"),
            })
            .boxed(),
    )
}

fn word(depth: u32) -> BoxedStrategy<String> {
    let part = prop_oneof![
        8 => plain_word(),
        3 => quoted(depth),
        3 => expansion(),
        1 => subst(depth),
        1 => pick(&["\\x", "\\;", "\\ ", "\\$", "\\\n", "\\'", "\\\\"]),
    ];
    proptest::collection::vec(part, 1..3).prop_map(|v| v.concat()).boxed()
}

fn command_word() -> BoxedStrategy<String> {
    prop_oneof![
        30 => Just("echo".to_owned()),
        4 => pick(&[
            "\"echo\"", "\\echo", "e'c'ho", "FOO=1 echo", "time echo", "! echo", "time -p echo",
            "{ echo", "} echo", "if echo", "then echo", "else echo", "fi; echo", "do echo",
            "done; echo", "while false; do echo", "! time echo", "time ! echo", "echo\\\n",
            "\\\necho", "2>&1 echo", ">/dev/null echo", "{ time echo", "( time echo )",
            "time -- echo", "time -p -- echo", "time -- -p echo", "$\\\n'echo'", "$\\\n'\\x65cho'",
        ]),
        2 => pick(&[
            "rm", "touch", "cat", "true", "eval", "exec", "source", ".", "alias", "command",
            "builtin", "enable", "trap", "set", "shopt", "let", "declare", "export", "read",
            "printf", "x=1", "$x", "ec*", "{echo,hi}", "$'echo'", "coproc", "[", "test",
            "unset", "/bin/echo", "hash", "typeset", "local", "mapfile",
        ]),
    ]
    .boxed()
}

fn simple(depth: u32) -> BoxedStrategy<String> {
    let arg = prop_oneof![6 => word(depth), 1 => redirect()];
    let sep = pick(&[" ", " ", " ", "", "\t", " \\\n", "  "]);
    (command_word(), proptest::collection::vec((sep, arg), 0..4))
        .prop_map(|(c, args)| {
            let mut s = c;
            for (sep, a) in args {
                s.push_str(if sep.is_empty() { " " } else { &sep });
                s.push_str(&a);
            }
            s
        })
        .boxed()
}

fn compound(depth: u32) -> BoxedStrategy<String> {
    if depth == 0 {
        return simple(0);
    }
    let l = list(depth - 1);
    let s = simple(depth - 1);
    prop_oneof![
        12 => s.clone(),
        1 => l.clone().prop_map(|l| format!("( {l} )")),
        1 => l.clone().prop_map(|l| format!("{{ {l}; }}")),
        1 => (l.clone(), l.clone()).prop_map(|(a, b)| format!("if {a}; then {b}; fi")),
        1 => l.clone().prop_map(|l| format!("while false; do {l}; done")),
        1 => l.clone().prop_map(|l| format!("f() {{ {l}; }}; f")),
        1 => l.clone().prop_map(|l| format!("case x in x) {l};; esac")),
        1 => l.clone().prop_map(|l| format!("for i in 1; do {l}; done")),
        1 => s.clone().prop_map(|s| format!("! {s}")),
        1 => s.prop_map(|s| format!("{s} # ; touch c")),
    ]
    .boxed()
}

fn list(depth: u32) -> BoxedStrategy<String> {
    let op = continued(mostly(
        &[";", " && ", " || ", " | ", " & ", "\n", " |& ", "; ", "|", "&", " #c\n", "\n\n", "&&", "||", "|&"],
        &[";;", "\r", "\r\n", "\0", "\u{1b}"],
    ));
    (compound(depth), proptest::collection::vec((op, compound(depth)), 0..3))
        .prop_map(|(first, rest)| {
            let mut s = first;
            for (op, c) in rest {
                s.push_str(&op);
                s.push_str(&c);
            }
            s
        })
        .boxed()
}

/// Apply a few character-level mutations (insert a token, delete,
/// duplicate) to what `base` generates: corpus entries, or generated lists
/// (most of them allowed, so mutations probe the edge of what is allowed).
fn mutated(base: BoxedStrategy<String>) -> BoxedStrategy<String> {
    let op = (0..3u8, any::<prop::sample::Index>(), 0..TOKENS.len(), 1..6usize);
    (base, proptest::collection::vec(op, 0..4))
        .prop_map(|(seed, ops)| {
            let mut chars: Vec<char> = seed.chars().collect();
            for (kind, at, token, len) in ops {
                let i = at.index(chars.len() + 1);
                match kind {
                    0 => {
                        let t: Vec<char> = TOKENS[token].chars().collect();
                        chars.splice(i..i, t);
                    }
                    1 if i < chars.len() => {
                        let end = (i + len).min(chars.len());
                        chars.drain(i..end);
                    }
                    _ => {
                        let end = (i + len).min(chars.len());
                        let dup: Vec<char> = chars[i..end].to_vec();
                        chars.splice(i..i, dup);
                    }
                }
            }
            chars.into_iter().collect()
        })
        .boxed()
}

fn command() -> BoxedStrategy<String> {
    let newly = NEWLY_UNDERSTOOD.iter().flat_map(|seed| seed.split("; "));
    let corpus: Vec<&'static str> =
        CORPUS.iter().chain(KNOWN_BAD).chain(KNOWN_BAD_STATE).copied().chain(newly).collect();
    let corpus = proptest::sample::select(corpus).prop_map(str::to_owned).boxed();
    prop_oneof![4 => list(2), 1 => mutated(corpus), 2 => mutated(list(1)), 2 => stateful()].boxed()
}

/// Issue 40's constructs: an assignment (plain, `export`, `declare`, `readonly`, a `read` or
/// `getopts` target) of a variable bash evaluates or searches with, or a `cd`, then maybe a
/// later command (`git status`, a relative program, `echo`).
fn stateful() -> BoxedStrategy<String> {
    let change = pick(&[
        "OPTIND={v}",
        "export OPTIND={v}",
        "RANDOM={v}",
        "SECONDS={v}",
        "declare RANDOM={v}",
        "readonly SECONDS={v}",
        "export OPTIND={v} x={v}",
        "RANDOM={v} echo hi",
        "export pv={v}",
        "read OPTIND <<< {v}",
        "read -r x RANDOM <<< {v}",
        "getopts g {v} -g",
        "getopts ab OPTIND -b",
        "export PATH=/scratch/.planted-bin:$PATH",
        "PATH=/scratch/.planted-bin",
        "PATH={v}",
        "cd /scratch/.planted-bin",
        "cd /scratch",
        "cd {v}",
    ]);
    let value = pick(&[
        "1",
        "42",
        "007",
        "pv",
        "qv",
        "'a[$(touch o)]'",
        "\"$x\"",
        "'$(touch o)'",
        "a[1]",
        "1+1",
        "''",
        "$pv",
        "OPTIND",
    ]);
    let then =
        pick(&["", "; git status", " && git status", "; ./git status", "; echo $((1))", "; echo hi", " && bin/git"]);
    (change, value, then).prop_map(|(c, v, t)| format!("{}{t}", c.replace("{v}", &v))).boxed()
}

fn generate(n: usize, seed: u64) -> Vec<String> {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(Config::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    let strategy = command();
    (0..n).map(|_| strategy.new_tree(&mut runner).expect("the generator never rejects").current()).collect()
}

// ---------------------------------------------------------------- docker

fn docker(args: &[&str]) -> std::process::Output {
    Command::new("docker")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `docker {}`: {e} (Docker CLI missing?)", args[0]))
}

/// A container name no other run uses.
fn unique_name(prefix: &str) -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

/// The tripwire image, built from [`BASE_IMAGE`] when missing.
fn tripwire_image() -> String {
    let version = docker(&["version", "--format", "{{.Server.Version}}"]);
    assert!(
        version.status.success(),
        "Docker is unreachable (`docker version` failed: {}); this test needs a running Docker \
         Engine",
        String::from_utf8_lossy(&version.stderr).trim()
    );
    let base = docker(&["image", "inspect", "--format", "{{.Id}}", BASE_IMAGE]);
    assert!(
        base.status.success(),
        "the sandbox image {BASE_IMAGE} is missing: run `cargo xtask test` (or `cargo xtask \
         build`), which builds it"
    );
    let script = SETUP.replace("@HARNESS@", HARNESS.trim_end());
    let mut h = Sha256::new();
    h.update(&base.stdout);
    h.update(script.as_bytes());
    let tag = format!("{TRIPWIRE_REPO}:{}", &hex::encode(h.finalize())[..16]);
    if docker(&["image", "inspect", &tag]).status.success() {
        return tag;
    }
    let name = unique_name("warden-tripwire-build");
    let run = docker(&[
        "run",
        "--name",
        &name,
        "--network",
        "none",
        "--user",
        "0:0",
        BASE_IMAGE,
        "/usr/bin/bash",
        "-c",
        &script,
    ]);
    let commit = run
        .status
        .success()
        .then(|| docker(&["commit", "--change", "CMD [\"/opt/.w/python3\", \"/opt/.w/harness.py\"]", &name, &tag]));
    let _ = docker(&["rm", "-f", &name]);
    assert!(
        run.status.success(),
        "building the tripwire image failed:\n{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let commit = commit.expect("committed after a successful run");
    assert!(
        commit.status.success(),
        "docker commit of the tripwire image failed: {}",
        String::from_utf8_lossy(&commit.stderr)
    );
    // Older recipes' images are dead weight (a failed removal is harmless).
    let listed = docker(&["images", TRIPWIRE_REPO, "--format", "{{.Repository}}:{{.Tag}}"]);
    for old in String::from_utf8_lossy(&listed.stdout).lines() {
        if old != tag {
            let _ = docker(&["rmi", old]);
        }
    }
    tag
}

/// What running one command in the tripwire container produced.
struct Outcome {
    trip: String,
    files: Vec<String>,
    timeout: bool,
    error: Option<String>,
    stderr: String,
}

impl Outcome {
    fn fired(&self) -> bool {
        !self.trip.is_empty() || !self.files.is_empty()
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "tripwires: {:?}; new files: {:?}; timed out: {}; harness error: {:?}; stderr: {:?}",
            self.trip, self.files, self.timeout, self.error, self.stderr
        )
    }
}

/// Run every command in one container; one [`Outcome`] per command.
/// Removes the harness container however the test ends.
struct ContainerGuard(String);

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.0]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    }
}

fn run_all(image: &str, commands: &[String]) -> Vec<Outcome> {
    let guard = ContainerGuard(unique_name("warden-bash-diff"));
    let mut child = Command::new("docker")
        .args([
            "run",
            "--rm",
            "--name",
            &guard.0,
            "-i",
            "--network",
            "none",
            "--read-only",
            "--init",
            "--user",
            "65534:65534",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--memory",
            "512m",
            "--pids-limit",
            "256",
            "--tmpfs",
            "/scratch:rw,mode=1777,size=16m",
            "--tmpfs",
            "/tmp:rw,mode=1777,size=16m",
            "--tmpfs",
            "/trip:rw,mode=1777,size=16m",
            "-e",
            "PYTHONHOME=/usr",
            image,
            "/opt/.w/python3",
            "/opt/.w/harness.py",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("docker run starts");
    let mut stdin = child.stdin.take().expect("piped stdin");
    let input: String = commands.iter().map(|c| hex::encode(c) + "\n").collect();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(input.as_bytes());
    });
    // Lines arrive through a channel so a wedged harness fails the test
    // instead of hanging it.
    let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines() {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut lines = std::iter::from_fn(|| match rx.recv_timeout(HARNESS_STALL) {
        Ok(line) => Some(line.expect("harness output is text")),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => None,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("the harness printed nothing for {HARNESS_STALL:?}: wedged")
        }
    });
    let header: Value = lines.next().and_then(|l| serde_json::from_str(&l).ok()).unwrap_or(Value::Null);
    let mut outcomes = Vec::with_capacity(commands.len());
    for line in lines {
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("harness printed {line:?}: {e}"));
        let s = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
        outcomes.push(Outcome {
            trip: s("trip"),
            files: v["files"]
                .as_array()
                .map(|a| a.iter().filter_map(|f| f.as_str().map(str::to_owned)).collect())
                .unwrap_or_default(),
            timeout: v["timeout"].as_bool().unwrap_or(false),
            error: v["error"].as_str().map(str::to_owned),
            stderr: s("stderr"),
        });
    }
    let _ = writer.join();
    let out = child.wait_with_output().expect("docker run ends");
    assert_eq!(
        outcomes.len(),
        commands.len(),
        "the harness stopped early (status {}; header {header}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let writable: Vec<&str> =
        header["writable"].as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    assert!(
        writable.contains(&"/scratch") && writable.contains(&"/tmp"),
        "the harness must watch the writable directories, saw {header}"
    );
    outcomes
}

fn decide(policy: &Policy, command: &str) -> Decision {
    policy.decide("Bash", &json!({ "command": command }), &ctx(), policy.effective_mode(None)).decision
}

#[test]
fn allowed_echo_commands_run_only_echo_in_real_bash() {
    let cases = env_or("WARDEN_BASH_DIFF_CASES", DEFAULT_CASES);
    let seed = env_or("WARDEN_BASH_DIFF_SEED", DEFAULT_SEED);
    let image = tripwire_image();
    let policy = policy(ALLOW, &[], &[]);
    let known_bad: Vec<&str> = KNOWN_BAD.iter().chain(KNOWN_BAD_STATE).copied().collect();

    // 1. The known bad commands are asked, and the sandbox sees them misbehave.
    for bad in &known_bad {
        assert_eq!(decide(&policy, bad), Decision::Ask, "{bad:?} must ask");
    }
    let generated = generate(cases, seed);
    let (allowed, asked): (Vec<String>, Vec<String>) = generated
        .into_iter()
        .filter(|c| decide(&policy, c) != Decision::Deny)
        .partition(|c| decide(&policy, c) == Decision::Allow);
    let candidates = env_or("WARDEN_BASH_DIFF_CANDIDATES", DEFAULT_CANDIDATES);
    let asked: Vec<String> = asked.into_iter().take(candidates).collect();
    let share = allowed.len() as f64 / cases.max(1) as f64;
    assert!(
        share >= MIN_ALLOWED_SHARE,
        "only {} of {cases} generated commands are allowed; the property would be vacuous",
        allowed.len()
    );
    let mut batch: Vec<String> = known_bad.iter().map(|s| s.to_string()).collect();
    batch.extend(allowed.iter().cloned());
    batch.extend(asked.iter().cloned());
    let outcomes = run_all(&image, &batch);
    let (bad_out, rest) = outcomes.split_at(known_bad.len());
    let (allowed_out, asked_out) = rest.split_at(allowed.len());
    for (cmd, o) in known_bad.iter().zip(bad_out) {
        assert!(
            o.fired(),
            "the tripwire sandbox did not notice {cmd:?} (it must: the old splitter allowed it): \
             {o}"
        );
    }

    // 2. The property: allowed commands fire nothing and create nothing.
    let failures: Vec<String> = allowed
        .iter()
        .zip(allowed_out)
        .filter(|(_, o)| o.fired() || o.error.is_some())
        .map(|(c, o)| format!("{c:?}\n    => {o}"))
        .collect();
    let timeouts = allowed_out.iter().filter(|o| o.timeout).count();
    assert!(
        failures.is_empty(),
        "{} of {} allowed commands (seed {seed:#x}, {cases} generated) ran something other than \
         echo or wrote a file in real bash:\n{}",
        failures.len(),
        allowed.len(),
        failures.iter().take(20).cloned().collect::<Vec<_>>().join("\n")
    );
    eprintln!(
        "bash differential: {cases} generated (seed {seed:#x}), {} allowed, all clean ({timeouts} \
         timed out)",
        allowed.len()
    );

    // 3. Candidates: asked commands that ran nothing unexpected in real bash, by reason.
    let mut by_reason: std::collections::BTreeMap<String, Vec<&str>> = std::collections::BTreeMap::new();
    for (cmd, o) in asked.iter().zip(asked_out) {
        if !o.fired() && o.error.is_none() && !o.timeout {
            let ev = policy.decide("Bash", &json!({ "command": cmd }), &ctx(), policy.effective_mode(None));
            let reason =
                ev.not_understood.map_or_else(|| "understood, asked by the rules".to_owned(), |n| n.reason.to_string());
            by_reason.entry(reason).or_default().push(cmd);
        }
    }
    let clean: usize = by_reason.values().map(Vec::len).sum();
    eprintln!("bash differential: {} asked commands run, {clean} ran nothing unexpected (candidates):", asked.len());
    let mut reasons: Vec<_> = by_reason.into_iter().collect();
    reasons.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
    for (reason, cmds) in reasons {
        let examples: Vec<String> = cmds.iter().take(CANDIDATE_EXAMPLES).map(|c| format!("{c:?}")).collect();
        eprintln!("  {:>5}  {reason}: {}", cmds.len(), examples.join(", "));
    }
}
