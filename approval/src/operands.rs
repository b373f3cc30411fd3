//! Which files a recognised command reads or writes: the option tables of the commands
//! whose file operands the policy judges by the file rules (`Read(...)`, `Edit(...)`,
//! `Write(...)`), the same way as redirections.
//!
//! [`operands`] takes a simple command's program name and its arguments and returns every
//! argument that names a file, with how the file is used ([`Access`]). The tables below
//! hold, per command, the options that take an argument (and which of those arguments
//! are files), so an option's argument is never taken for a file and a file is never taken
//! for an option's argument. The parsing follows GNU `getopt_long`, as the GNU tools do:
//! short options cluster (`-rn`), a short option's argument may be attached (`-n5`) or the
//! next word, a long option's argument is `--opt=value` or the next word, a long option
//! may be abbreviated to any unambiguous prefix, `--` ends the options and options may
//! follow operands (GNU permutation).
//!
//! Errs towards files: an option a table does not know is read as taking no argument, so
//! the word after it is judged as a file (never skipped). A command not in
//! [`FILE_COMMAND_NAMES`] has no file operands here (its redirections still do).
//!
//! This module must never do I/O: paths are as written; the policy resolves them against
//! the shell's working directory, and the host resolves links.

use serde::Serialize;

/// How a command uses a file operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// Reads the file (`cat f`, `< f`).
    Read,
    /// Reads a directory tree below the path (`grep -r x dir`, `cp -r dir d`, `diff a b`).
    ReadTree,
    /// Writes, creates, truncates or removes the file (`> f`, `tee f`, `rm f`).
    Write,
    /// Writes or removes a directory tree below the path (`rm -r dir`, `cp -r a dir`).
    WriteTree,
    /// Both: `<> f`, `sed -i ... f`, the source of `mv`.
    ReadWrite,
    /// Removes the file (`rm f`, `rmdir d`, `unlink f`): a write that leaves nothing behind.
    Remove,
    /// Removes a directory tree (`rm -r dir`).
    RemoveTree,
}

impl Access {
    /// Whether the access reads (the file or a tree below it).
    pub fn reads(self) -> bool {
        matches!(self, Access::Read | Access::ReadTree | Access::ReadWrite)
    }

    /// Whether the access writes (the file or a tree below it).
    pub fn writes(self) -> bool {
        matches!(self, Access::Write | Access::WriteTree | Access::ReadWrite | Access::Remove | Access::RemoveTree)
    }

    /// Whether the access reaches everything below the path, not only the path.
    pub fn tree(self) -> bool {
        matches!(self, Access::ReadTree | Access::WriteTree | Access::RemoveTree)
    }

    /// How a reason names the access: `reads`, `writes`, `reads and writes`, `removes`.
    pub fn verb(self) -> &'static str {
        match self {
            Access::Read | Access::ReadTree => "reads",
            Access::Write | Access::WriteTree => "writes",
            Access::ReadWrite => "reads and writes",
            Access::Remove | Access::RemoveTree => "removes",
        }
    }
}

/// One argument word of a command, as the recognizer saw it.
#[derive(Debug, Clone, Copy)]
pub struct Arg<'a> {
    /// The dequoted text.
    pub text: &'a str,
    /// Its value is known only at run time (an expansion, glob, brace or tilde).
    pub computed: bool,
}

/// A file argument of a command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileArg {
    /// The path as the program receives it (dequoted; for a computed word the text before
    /// its expansion, which says nothing about the path).
    pub path: String,
    /// How the file is used.
    pub access: Access,
    /// The path is known only at run time: the policy cannot judge it.
    pub computed: bool,
    /// Named by a redirection (`> f`, `>> f`, `< f`), not by the program's operands. Both
    /// are judged the same way (a write by the Write/Edit rules and the permission mode, as
    /// a Write call of that path would be); only which Bash allow rule shows the write
    /// differs (one with the redirection in it, or one naming the whole command).
    pub redirect: bool,
}

impl FileArg {
    /// What a reason says after the path: ` through a redirection` for a file a
    /// redirection names, nothing for an operand.
    pub fn how(&self) -> &'static str {
        if self.redirect { " through a redirection" } else { "" }
    }
}

/// What an option's argument is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OptArg {
    /// Not a file (a number, a pattern, a label).
    Value,
    /// A file read (`grep -f FILE`).
    Reads,
    /// A file or directory written (`sort -o FILE`, `cp -t DIR`).
    Writes,
}

/// How a command's positional operands (after its options) are used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operands {
    /// Every operand is read.
    Read,
    /// Every operand is a tree read (`diff` compares directories' files).
    ReadTree,
    /// Every operand is written (`tee`, `touch`, `truncate`, `mkdir`, `chmod`); a tree with
    /// a recursive option (`chmod -R`).
    Write,
    /// Every operand is removed (`rm`, `rmdir`, `unlink`); a tree with a recursive option
    /// (`rm -r`).
    Remove,
    /// The last operand is written (a destination), the others read; with a target option
    /// (`-t DIR`) every operand is a source. `sources_written`: the sources are moved (mv).
    CopyLike { sources_written: bool },
    /// Up to two operands: the first read, the second written (`uniq IN OUT`).
    InOut,
    /// `dd`: `if=FILE` read, `of=FILE` written, nothing else a file.
    Dd,
}

/// One command's table.
struct FileCommand {
    names: &'static [&'static str],
    /// Short options that take an argument, with what it is.
    short: &'static [(char, OptArg)],
    /// Long options (without `--`) that take an argument (`--opt=x` or `--opt x`).
    long: &'static [(&'static str, OptArg)],
    operands: Operands,
    /// The first operand is a script or pattern (grep, sed), not a file, unless one of
    /// these options gave it.
    script_unless: &'static [&'static str],
    /// Options that make the operands tree reads (`-r`, `--recursive`).
    recursive: &'static [&'static str],
    /// Options that make read operands written too (`sed -i`).
    in_place: &'static [&'static str],
    /// With a recursive option and no operand, the command reads the working directory.
    recursive_default_dot: bool,
    /// Options after which every operand is written (`install -d DIR...`).
    all_written: &'static [&'static str],
    /// The first operand may be a mode written like an option (`chmod -w f`, `chmod
    /// -x,u+r f`): a word of only mode characters ([`MODE_CHARS`]) is that operand.
    mode_operand: bool,
}

/// The characters of a symbolic or octal `chmod` mode.
const MODE_CHARS: &str = "rwxXstugoa+-=,01234567";

const GREP: FileCommand = FileCommand {
    names: &["grep", "egrep", "fgrep", "rgrep"],
    short: &[
        ('e', OptArg::Value),
        ('f', OptArg::Reads),
        ('m', OptArg::Value),
        ('A', OptArg::Value),
        ('B', OptArg::Value),
        ('C', OptArg::Value),
        ('d', OptArg::Value),
        ('D', OptArg::Value),
    ],
    long: &[
        ("regexp", OptArg::Value),
        ("file", OptArg::Reads),
        ("max-count", OptArg::Value),
        ("after-context", OptArg::Value),
        ("before-context", OptArg::Value),
        ("context", OptArg::Value),
        ("directories", OptArg::Value),
        ("devices", OptArg::Value),
        ("label", OptArg::Value),
        ("include", OptArg::Value),
        ("exclude", OptArg::Value),
        ("exclude-from", OptArg::Reads),
        ("exclude-dir", OptArg::Value),
        ("binary-files", OptArg::Value),
        ("group-separator", OptArg::Value),
    ],
    operands: Operands::Read,
    script_unless: &["-e", "-f", "--regexp", "--file"],
    recursive: &["-r", "-R", "--recursive", "--dereference-recursive", "-drecurse", "--directories=recurse"],
    in_place: &[],
    recursive_default_dot: true,
    all_written: &[],
    mode_operand: false,
};

const SED: FileCommand = FileCommand {
    names: &["sed"],
    short: &[('e', OptArg::Value), ('f', OptArg::Reads), ('l', OptArg::Value)],
    long: &[("expression", OptArg::Value), ("file", OptArg::Reads), ("line-length", OptArg::Value)],
    operands: Operands::Read,
    script_unless: &["-e", "-f", "--expression", "--file"],
    recursive: &[],
    in_place: &["-i", "--in-place"],
    recursive_default_dot: false,
    all_written: &[],
    mode_operand: false,
};

/// Plain defaults for a table entry.
const NONE: FileCommand = FileCommand {
    names: &[],
    short: &[],
    long: &[],
    operands: Operands::Read,
    script_unless: &[],
    recursive: &[],
    in_place: &[],
    recursive_default_dot: false,
    all_written: &[],
    mode_operand: false,
};

/// `cp`'s and `mv`'s and `ln`'s shared options that take an argument.
const COPY_SHORT: &[(char, OptArg)] = &[('S', OptArg::Value), ('t', OptArg::Writes)];
const COPY_LONG: &[(&str, OptArg)] = &[("suffix", OptArg::Value), ("target-directory", OptArg::Writes)];

/// Every command whose file operands are judged, with its options that take an argument
/// (GNU coreutils, grep, sed, diffutils, binutils `strings`, `file`, gzip's `zcat`,
/// util-linux `more`, `rev`, `less`). docs/operators.md lists the same commands.
pub const FILE_COMMAND_NAMES: &[&str] = &[
    "cat",
    "tac",
    "nl",
    "head",
    "tail",
    "less",
    "more",
    "grep",
    "egrep",
    "fgrep",
    "rgrep",
    "sed",
    "cut",
    "wc",
    "sort",
    "uniq",
    "base64",
    "od",
    "strings",
    "diff",
    "cmp",
    "cp",
    "mv",
    "ln",
    "tee",
    "touch",
    "rm",
    "truncate",
    "dd",
    "install",
    "link",
    "mkdir",
    "rmdir",
    "unlink",
    "shred",
    "chmod",
    "chown",
    "chgrp",
    "paste",
    "join",
    "comm",
    "expand",
    "unexpand",
    "fold",
    "fmt",
    "pr",
    "tsort",
    "rev",
    "md5sum",
    "sha1sum",
    "sha224sum",
    "sha256sum",
    "sha384sum",
    "sha512sum",
    "b2sum",
    "cksum",
    "sum",
    "base32",
    "basenc",
    "shuf",
    "file",
    "zcat",
];

const FILE_COMMANDS: &[FileCommand] = &[
    FileCommand { names: &["cat"], ..NONE },
    FileCommand { names: &["tac"], short: &[('s', OptArg::Value)], long: &[("separator", OptArg::Value)], ..NONE },
    FileCommand {
        names: &["nl"],
        short: &[
            ('b', OptArg::Value),
            ('d', OptArg::Value),
            ('f', OptArg::Value),
            ('h', OptArg::Value),
            ('i', OptArg::Value),
            ('l', OptArg::Value),
            ('n', OptArg::Value),
            ('s', OptArg::Value),
            ('v', OptArg::Value),
            ('w', OptArg::Value),
        ],
        long: &[
            ("body-numbering", OptArg::Value),
            ("section-delimiter", OptArg::Value),
            ("footer-numbering", OptArg::Value),
            ("header-numbering", OptArg::Value),
            ("line-increment", OptArg::Value),
            ("join-blank-lines", OptArg::Value),
            ("number-format", OptArg::Value),
            ("number-separator", OptArg::Value),
            ("starting-line-number", OptArg::Value),
            ("number-width", OptArg::Value),
        ],
        ..NONE
    },
    FileCommand {
        names: &["head"],
        short: &[('c', OptArg::Value), ('n', OptArg::Value)],
        long: &[("bytes", OptArg::Value), ("lines", OptArg::Value)],
        ..NONE
    },
    FileCommand {
        names: &["tail"],
        short: &[('c', OptArg::Value), ('n', OptArg::Value), ('s', OptArg::Value)],
        long: &[
            ("bytes", OptArg::Value),
            ("lines", OptArg::Value),
            ("sleep-interval", OptArg::Value),
            ("pid", OptArg::Value),
            ("max-unchanged-stats", OptArg::Value),
        ],
        ..NONE
    },
    FileCommand {
        names: &["less"],
        short: &[
            ('b', OptArg::Value),
            ('h', OptArg::Value),
            ('j', OptArg::Value),
            ('k', OptArg::Reads),
            ('o', OptArg::Writes),
            ('O', OptArg::Writes),
            ('p', OptArg::Value),
            ('P', OptArg::Value),
            ('t', OptArg::Value),
            ('T', OptArg::Reads),
            ('x', OptArg::Value),
            ('y', OptArg::Value),
            ('z', OptArg::Value),
            ('#', OptArg::Value),
        ],
        long: &[
            ("buffers", OptArg::Value),
            ("max-back-scroll", OptArg::Value),
            ("jump-target", OptArg::Value),
            ("lesskey-file", OptArg::Reads),
            ("log-file", OptArg::Writes),
            ("LOG-FILE", OptArg::Writes),
            ("pattern", OptArg::Value),
            ("prompt", OptArg::Value),
            ("tag", OptArg::Value),
            ("tag-file", OptArg::Reads),
            ("tabs", OptArg::Value),
            ("max-forw-scroll", OptArg::Value),
            ("window", OptArg::Value),
            ("shift", OptArg::Value),
        ],
        ..NONE
    },
    FileCommand { names: &["more"], short: &[('n', OptArg::Value)], long: &[("lines", OptArg::Value)], ..NONE },
    GREP,
    SED,
    FileCommand {
        names: &["cut"],
        short: &[('b', OptArg::Value), ('c', OptArg::Value), ('d', OptArg::Value), ('f', OptArg::Value)],
        long: &[
            ("bytes", OptArg::Value),
            ("characters", OptArg::Value),
            ("delimiter", OptArg::Value),
            ("fields", OptArg::Value),
            ("output-delimiter", OptArg::Value),
        ],
        ..NONE
    },
    FileCommand { names: &["wc"], long: &[("files0-from", OptArg::Reads)], ..NONE },
    FileCommand {
        names: &["sort"],
        short: &[
            ('k', OptArg::Value),
            ('t', OptArg::Value),
            ('o', OptArg::Writes),
            ('S', OptArg::Value),
            ('T', OptArg::Writes),
        ],
        long: &[
            ("key", OptArg::Value),
            ("field-separator", OptArg::Value),
            ("output", OptArg::Writes),
            ("buffer-size", OptArg::Value),
            ("temporary-directory", OptArg::Writes),
            ("parallel", OptArg::Value),
            ("batch-size", OptArg::Value),
            ("compress-program", OptArg::Value),
            ("files0-from", OptArg::Reads),
            ("random-source", OptArg::Reads),
        ],
        ..NONE
    },
    FileCommand {
        names: &["uniq"],
        short: &[('f', OptArg::Value), ('s', OptArg::Value), ('w', OptArg::Value)],
        long: &[("skip-fields", OptArg::Value), ("skip-chars", OptArg::Value), ("check-chars", OptArg::Value)],
        operands: Operands::InOut,
        ..NONE
    },
    FileCommand { names: &["base64"], short: &[('w', OptArg::Value)], long: &[("wrap", OptArg::Value)], ..NONE },
    FileCommand {
        names: &["od"],
        short: &[
            ('A', OptArg::Value),
            ('j', OptArg::Value),
            ('N', OptArg::Value),
            ('S', OptArg::Value),
            ('t', OptArg::Value),
        ],
        long: &[
            ("address-radix", OptArg::Value),
            ("skip-bytes", OptArg::Value),
            ("read-bytes", OptArg::Value),
            ("format", OptArg::Value),
            ("endian", OptArg::Value),
        ],
        ..NONE
    },
    FileCommand {
        names: &["strings"],
        short: &[
            ('n', OptArg::Value),
            ('t', OptArg::Value),
            ('e', OptArg::Value),
            ('T', OptArg::Value),
            ('s', OptArg::Value),
        ],
        long: &[
            ("bytes", OptArg::Value),
            ("radix", OptArg::Value),
            ("encoding", OptArg::Value),
            ("target", OptArg::Value),
            ("output-separator", OptArg::Value),
        ],
        ..NONE
    },
    FileCommand {
        names: &["diff"],
        short: &[
            ('C', OptArg::Value),
            ('U', OptArg::Value),
            ('D', OptArg::Value),
            ('F', OptArg::Value),
            ('I', OptArg::Value),
            ('L', OptArg::Value),
            ('S', OptArg::Value),
            ('W', OptArg::Value),
            ('x', OptArg::Value),
            ('X', OptArg::Reads),
        ],
        long: &[
            ("ifdef", OptArg::Value),
            ("show-function-line", OptArg::Value),
            ("ignore-matching-lines", OptArg::Value),
            ("label", OptArg::Value),
            ("starting-file", OptArg::Value),
            ("width", OptArg::Value),
            ("exclude", OptArg::Value),
            ("exclude-from", OptArg::Reads),
            ("from-file", OptArg::Reads),
            ("to-file", OptArg::Reads),
            ("line-format", OptArg::Value),
            ("old-line-format", OptArg::Value),
            ("new-line-format", OptArg::Value),
            ("unchanged-line-format", OptArg::Value),
            ("old-group-format", OptArg::Value),
            ("new-group-format", OptArg::Value),
            ("changed-group-format", OptArg::Value),
            ("unchanged-group-format", OptArg::Value),
            ("horizon-lines", OptArg::Value),
            ("palette", OptArg::Value),
            ("tabsize", OptArg::Value),
        ],
        operands: Operands::ReadTree,
        ..NONE
    },
    FileCommand {
        names: &["cmp"],
        short: &[('i', OptArg::Value), ('n', OptArg::Value)],
        long: &[("ignore-initial", OptArg::Value), ("bytes", OptArg::Value)],
        ..NONE
    },
    FileCommand {
        names: &["cp"],
        short: COPY_SHORT,
        long: COPY_LONG,
        operands: Operands::CopyLike { sources_written: false },
        recursive: &["-r", "-R", "-a", "--recursive", "--archive"],
        ..NONE
    },
    FileCommand {
        names: &["mv"],
        short: COPY_SHORT,
        long: COPY_LONG,
        operands: Operands::CopyLike { sources_written: true },
        ..NONE
    },
    FileCommand {
        names: &["ln"],
        short: COPY_SHORT,
        long: COPY_LONG,
        operands: Operands::CopyLike { sources_written: false },
        ..NONE
    },
    FileCommand {
        names: &["install"],
        short: &[
            ('m', OptArg::Value),
            ('o', OptArg::Value),
            ('g', OptArg::Value),
            ('S', OptArg::Value),
            ('t', OptArg::Writes),
        ],
        long: &[
            ("mode", OptArg::Value),
            ("owner", OptArg::Value),
            ("group", OptArg::Value),
            ("suffix", OptArg::Value),
            ("strip-program", OptArg::Value),
            ("target-directory", OptArg::Writes),
        ],
        operands: Operands::CopyLike { sources_written: false },
        all_written: &["-d", "--directory"],
        ..NONE
    },
    FileCommand { names: &["link"], operands: Operands::CopyLike { sources_written: false }, ..NONE },
    FileCommand { names: &["tee", "touch"], operands: Operands::Write, ..NONE },
    FileCommand {
        names: &["mkdir"],
        short: &[('m', OptArg::Value)],
        long: &[("mode", OptArg::Value)],
        operands: Operands::Write,
        ..NONE
    },
    FileCommand { names: &["rm"], operands: Operands::Remove, recursive: &["-r", "-R", "--recursive"], ..NONE },
    FileCommand { names: &["rmdir", "unlink"], operands: Operands::Remove, ..NONE },
    FileCommand {
        names: &["shred"],
        short: &[('n', OptArg::Value), ('s', OptArg::Value)],
        long: &[("iterations", OptArg::Value), ("size", OptArg::Value), ("random-source", OptArg::Reads)],
        operands: Operands::Write,
        ..NONE
    },
    FileCommand {
        names: &["chmod"],
        long: &[("reference", OptArg::Reads)],
        operands: Operands::Write,
        script_unless: &["--reference"],
        recursive: &["-R", "--recursive"],
        mode_operand: true,
        ..NONE
    },
    FileCommand {
        names: &["chown", "chgrp"],
        long: &[("reference", OptArg::Reads), ("from", OptArg::Value)],
        operands: Operands::Write,
        script_unless: &["--reference"],
        recursive: &["-R", "--recursive"],
        ..NONE
    },
    FileCommand { names: &["paste"], short: &[('d', OptArg::Value)], long: &[("delimiters", OptArg::Value)], ..NONE },
    FileCommand {
        names: &["join"],
        short: &[
            ('a', OptArg::Value),
            ('e', OptArg::Value),
            ('j', OptArg::Value),
            ('o', OptArg::Value),
            ('t', OptArg::Value),
            ('v', OptArg::Value),
            ('1', OptArg::Value),
            ('2', OptArg::Value),
        ],
        ..NONE
    },
    FileCommand { names: &["comm"], long: &[("output-delimiter", OptArg::Value)], ..NONE },
    FileCommand {
        names: &["expand", "unexpand"],
        short: &[('t', OptArg::Value)],
        long: &[("tabs", OptArg::Value)],
        ..NONE
    },
    FileCommand { names: &["fold"], short: &[('w', OptArg::Value)], long: &[("width", OptArg::Value)], ..NONE },
    FileCommand {
        names: &["fmt"],
        short: &[('w', OptArg::Value), ('p', OptArg::Value), ('g', OptArg::Value)],
        long: &[("width", OptArg::Value), ("prefix", OptArg::Value), ("goal", OptArg::Value)],
        ..NONE
    },
    FileCommand {
        names: &["pr"],
        short: &[
            ('D', OptArg::Value),
            ('h', OptArg::Value),
            ('l', OptArg::Value),
            ('N', OptArg::Value),
            ('o', OptArg::Value),
            ('w', OptArg::Value),
            ('W', OptArg::Value),
        ],
        long: &[
            ("date-format", OptArg::Value),
            ("header", OptArg::Value),
            ("length", OptArg::Value),
            ("first-line-number", OptArg::Value),
            ("indent", OptArg::Value),
            ("width", OptArg::Value),
            ("page-width", OptArg::Value),
        ],
        ..NONE
    },
    FileCommand { names: &["tsort", "rev", "zcat", "sum"], ..NONE },
    FileCommand {
        names: &["md5sum", "sha1sum", "sha224sum", "sha256sum", "sha384sum", "sha512sum", "b2sum", "cksum"],
        short: &[('a', OptArg::Value), ('l', OptArg::Value)],
        long: &[("algorithm", OptArg::Value), ("length", OptArg::Value)],
        ..NONE
    },
    FileCommand {
        names: &["base32", "basenc"],
        short: &[('w', OptArg::Value)],
        long: &[("wrap", OptArg::Value)],
        ..NONE
    },
    FileCommand {
        names: &["shuf"],
        short: &[('i', OptArg::Value), ('n', OptArg::Value), ('o', OptArg::Writes)],
        long: &[
            ("input-range", OptArg::Value),
            ("head-count", OptArg::Value),
            ("output", OptArg::Writes),
            ("random-source", OptArg::Reads),
        ],
        ..NONE
    },
    FileCommand {
        names: &["file"],
        short: &[
            ('e', OptArg::Value),
            ('f', OptArg::Reads),
            ('F', OptArg::Value),
            ('m', OptArg::Reads),
            ('P', OptArg::Value),
        ],
        long: &[
            ("exclude", OptArg::Value),
            ("exclude-quiet", OptArg::Value),
            ("files-from", OptArg::Reads),
            ("separator", OptArg::Value),
            ("magic-file", OptArg::Reads),
            ("parameter", OptArg::Value),
        ],
        ..NONE
    },
    FileCommand {
        names: &["truncate"],
        short: &[('s', OptArg::Value), ('r', OptArg::Reads)],
        long: &[("size", OptArg::Value), ("reference", OptArg::Reads)],
        operands: Operands::Write,
        ..NONE
    },
    FileCommand { names: &["dd"], operands: Operands::Dd, ..NONE },
];

/// `touch -r FILE`/`--reference` and `-d`/`-t` take arguments, `tee`'s options none: one row
/// for both, and these for `touch` only.
const TOUCH_SHORT: &[(char, OptArg)] = &[('r', OptArg::Reads), ('d', OptArg::Value), ('t', OptArg::Value)];
const TOUCH_LONG: &[(&str, OptArg)] = &[("reference", OptArg::Reads), ("date", OptArg::Value)];

fn table(name: &str) -> Option<&'static FileCommand> {
    FILE_COMMANDS.iter().find(|c| c.names.contains(&name))
}

/// The file arguments of `program` (its file name, `cat` for `/bin/cat`) called with
/// `args`; empty for a command not in [`FILE_COMMAND_NAMES`].
pub fn operands(program: &str, args: &[Arg<'_>]) -> Vec<FileArg> {
    let Some(cmd) = table(program) else { return Vec::new() };
    let (short, long) = if program == "touch" { (TOUCH_SHORT, TOUCH_LONG) } else { (cmd.short, cmd.long) };
    let mut out = Vec::new();
    let mut positional: Vec<Arg<'_>> = Vec::new();
    let (mut script_given, mut recursive, mut in_place, mut target_dir) = (false, false, false, false);
    let mut all_written = false;
    let mut options_done = false;
    let mut i = 0;
    let push = |out: &mut Vec<FileArg>, a: &Arg<'_>, access: Access| {
        out.push(FileArg { path: a.text.to_owned(), access, computed: a.computed, redirect: false });
    };
    while i < args.len() {
        let a = args[i];
        i += 1;
        // A computed word may turn out to be an option or an operand: judged as an operand
        // (it is computed, so the policy cannot clear it anyway).
        if options_done || a.computed || !a.text.starts_with('-') || a.text == "-" {
            if program == "dd" {
                if let Some(p) = a.text.strip_prefix("if=") {
                    push(&mut out, &Arg { text: p, ..a }, Access::Read);
                } else if let Some(p) = a.text.strip_prefix("of=") {
                    push(&mut out, &Arg { text: p, ..a }, Access::Write);
                } else if a.computed {
                    push(&mut out, &a, Access::ReadWrite);
                }
                continue;
            }
            positional.push(a);
            continue;
        }
        if a.text == "--" {
            options_done = true;
            continue;
        }
        if cmd.mode_operand && a.text.len() > 1 && a.text[1..].chars().all(|c| MODE_CHARS.contains(c)) {
            positional.push(a);
            continue;
        }
        let flag = |list: &[&str]| list.contains(&a.text);
        all_written |= flag(cmd.all_written);
        script_given |= flag(cmd.script_unless);
        recursive |= flag(cmd.recursive);
        in_place |= flag(cmd.in_place) || cmd.in_place.iter().any(|p| p.len() == 2 && a.text.starts_with(p));
        if let Some(body) = a.text.strip_prefix("--") {
            let (name, value) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (body, None),
            };
            script_given |= cmd.script_unless.iter().any(|s| s.strip_prefix("--").is_some_and(|s| s.starts_with(name)));
            all_written |= cmd.all_written.iter().any(|s| s.strip_prefix("--").is_some_and(|s| s.starts_with(name)));
            in_place |= cmd.in_place.iter().any(|s| s.strip_prefix("--").is_some_and(|s| s.starts_with(name)));
            recursive |= value.is_none() && cmd.recursive.iter().any(|s| s.strip_prefix("--") == Some(name));
            // Abbreviations: an unambiguous prefix of a long option that takes an argument.
            let takes = long.iter().find(|(l, _)| *l == name).or_else(|| {
                let mut prefixed = long.iter().filter(|(l, _)| l.starts_with(name));
                match (prefixed.next(), prefixed.next()) {
                    (Some(one), None) if !name.is_empty() => Some(one),
                    _ => None,
                }
            });
            if let Some((l, kind)) = takes {
                target_dir |= *l == "target-directory";
                let arg = match value {
                    Some(v) => Some(Arg { text: v, computed: a.computed }),
                    None => args.get(i).copied().inspect(|_| i += 1),
                };
                if let Some(arg) = arg {
                    recursive |= cmd.recursive.contains(&format!("--{l}={}", arg.text).as_str());
                    option_arg(&mut out, &arg, *kind);
                }
            }
            continue;
        }
        // A cluster of short options: `-rn`, `-n5`, `-e PATTERN`.
        let chars: Vec<char> = a.text.chars().skip(1).collect();
        for (k, c) in chars.iter().enumerate() {
            if let Some((_, kind)) = short.iter().find(|(s, _)| s == c) {
                script_given |= cmd.script_unless.contains(&format!("-{c}").as_str());
                target_dir |= *c == 't' && matches!(cmd.operands, Operands::CopyLike { .. });
                let rest: String = chars[k + 1..].iter().collect();
                let arg = if rest.is_empty() {
                    args.get(i).copied().inspect(|_| i += 1)
                } else {
                    Some(Arg { text: &rest, computed: a.computed })
                };
                if let Some(arg) = arg {
                    recursive |= cmd.recursive.contains(&format!("-{c}{}", arg.text).as_str());
                    option_arg(&mut out, &arg, *kind);
                }
                break;
            }
            recursive |= cmd.recursive.contains(&format!("-{c}").as_str());
            all_written |= cmd.all_written.contains(&format!("-{c}").as_str());
            in_place |= cmd.in_place.contains(&format!("-{c}").as_str()) && program == "sed";
        }
    }
    let mut files: &[Arg<'_>] = &positional;
    if !cmd.script_unless.is_empty() && !script_given && !files.is_empty() {
        files = &files[1..];
    }
    let read = if recursive { Access::ReadTree } else { Access::Read };
    let read = if in_place { Access::ReadWrite } else { read };
    if all_written {
        files.iter().for_each(|a| push(&mut out, a, Access::Write));
        return out;
    }
    match cmd.operands {
        Operands::Read => {
            if files.is_empty() && recursive && cmd.recursive_default_dot {
                push(&mut out, &Arg { text: ".", computed: false }, Access::ReadTree);
            }
            files.iter().filter(|a| a.text != "-").for_each(|a| push(&mut out, a, read));
        }
        Operands::ReadTree => files.iter().filter(|a| a.text != "-").for_each(|a| push(&mut out, a, Access::ReadTree)),
        Operands::Write => {
            let access = if recursive { Access::WriteTree } else { Access::Write };
            files.iter().for_each(|a| push(&mut out, a, access));
        }
        Operands::Remove => {
            let access = if recursive { Access::RemoveTree } else { Access::Remove };
            files.iter().for_each(|a| push(&mut out, a, access));
        }
        Operands::InOut => {
            for (k, a) in files.iter().enumerate().filter(|(_, a)| a.text != "-") {
                push(&mut out, a, if k == 0 { Access::Read } else { Access::Write });
            }
        }
        Operands::CopyLike { sources_written } => {
            let source = match (sources_written, recursive) {
                (true, _) => Access::ReadWrite,
                (false, true) => Access::ReadTree,
                (false, false) => Access::Read,
            };
            let (sources, dest) = match files.split_last() {
                Some((last, rest)) if !target_dir => (rest, Some(last)),
                _ => (files, None),
            };
            sources.iter().for_each(|a| push(&mut out, a, source));
            if let Some(d) = dest {
                let written = if recursive { Access::WriteTree } else { Access::Write };
                push(&mut out, d, written);
                // A directory destination receives each source under its own name.
                for s in sources {
                    let name = s.text.trim_end_matches('/').rsplit('/').next().unwrap_or_default();
                    if !name.is_empty() && name != "." && name != ".." {
                        let path = format!("{}/{name}", d.text.trim_end_matches('/'));
                        out.push(FileArg {
                            path,
                            access: written,
                            computed: d.computed || s.computed,
                            redirect: false,
                        });
                    }
                }
            }
        }
        Operands::Dd => {}
    }
    out
}

/// An option's argument: a file when the table says so.
fn option_arg(out: &mut Vec<FileArg>, a: &Arg<'_>, kind: OptArg) {
    let access = match kind {
        OptArg::Value => return,
        OptArg::Reads => Access::Read,
        OptArg::Writes => Access::Write,
    };
    out.push(FileArg { path: a.text.to_owned(), access, computed: a.computed, redirect: false });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(cmd: &str) -> Vec<(String, Access)> {
        let words: Vec<&str> = cmd.split(' ').collect();
        let args: Vec<Arg<'_>> = words[1..].iter().map(|w| Arg { text: w, computed: false }).collect();
        operands(words[0], &args).into_iter().map(|f| (f.path, f.access)).collect()
    }

    fn paths(cmd: &str) -> Vec<String> {
        files(cmd).into_iter().map(|(p, _)| p).collect()
    }

    #[test]
    fn every_listed_command_has_a_table() {
        for name in FILE_COMMAND_NAMES {
            assert!(table(name).is_some(), "{name}");
        }
        for c in FILE_COMMANDS {
            for n in c.names {
                assert!(FILE_COMMAND_NAMES.contains(n), "{n} is missing from FILE_COMMAND_NAMES");
            }
        }
    }

    #[test]
    fn options_and_their_arguments() {
        assert_eq!(paths("cat -n .env - b"), [".env", "b"]);
        assert_eq!(paths("head -n 5 .env"), [".env"]);
        assert_eq!(paths("head -n5 .env"), [".env"]);
        assert_eq!(paths("head --lines 5 .env --bytes=3"), [".env"]);
        assert_eq!(paths("head --li 5 .env"), [".env"], "an abbreviated long option takes its argument");
        assert_eq!(paths("tail -- -n"), ["-n"]);
        assert_eq!(paths("cat -Z .env"), [".env"], "an unknown option takes no argument");
        assert_eq!(paths("grep -e x .env"), [".env"]);
        assert_eq!(paths("grep x .env y"), [".env", "y"]);
        assert_eq!(paths("grep -ri x"), ["."]);
        assert_eq!(files("grep -r x docs"), [("docs".into(), Access::ReadTree)]);
        assert_eq!(files("grep -f pats a"), [("pats".into(), Access::Read), ("a".into(), Access::Read)]);
        assert_eq!(paths("sed s/a/b/ .env"), [".env"]);
        assert_eq!(files("sed -i s/a/b/ f"), [("f".into(), Access::ReadWrite)]);
        assert_eq!(files("sed -i.bak -e s/a/b/ f"), [("f".into(), Access::ReadWrite)]);
        assert_eq!(files("sort -o out in"), [("out".into(), Access::Write), ("in".into(), Access::Read)]);
        assert_eq!(files("uniq a b"), [("a".into(), Access::Read), ("b".into(), Access::Write)]);
        assert_eq!(files("dd if=.env of=x bs=1"), [(".env".into(), Access::Read), ("x".into(), Access::Write)]);
        assert_eq!(files("touch -r .env x"), [(".env".into(), Access::Read), ("x".into(), Access::Write)]);
        assert_eq!(files("less -o log f"), [("log".into(), Access::Write), ("f".into(), Access::Read)]);
        assert!(files("echo .env").is_empty());
    }

    #[test]
    fn copies_and_moves() {
        assert_eq!(
            files("cp .env docs"),
            [("docs".into(), Access::Write), ("docs/.env".into(), Access::Write)].into_iter().fold(
                vec![(".env".into(), Access::Read)],
                |mut v, x| {
                    v.push(x);
                    v
                }
            )
        );
        assert_eq!(files("mv a b")[0], ("a".into(), Access::ReadWrite));
        assert_eq!(
            files("cp -t dir a b"),
            [("dir".into(), Access::Write), ("a".into(), Access::Read), ("b".into(), Access::Read)]
        );
        assert_eq!(files("cp -r src d")[0], ("src".into(), Access::ReadTree));
        assert_eq!(files("ln .env docs/h")[0], (".env".into(), Access::Read));
        assert_eq!(files("diff a b"), [("a".into(), Access::ReadTree), ("b".into(), Access::ReadTree)]);
        assert_eq!(
            files("install -m 755 -o root a bin/a"),
            [("a".into(), Access::Read), ("bin/a".into(), Access::Write), ("bin/a/a".into(), Access::Write)]
        );
        assert_eq!(files("install -d a b"), [("a".into(), Access::Write), ("b".into(), Access::Write)]);
        assert_eq!(files("install -t bin a")[0], ("bin".into(), Access::Write));
    }

    #[test]
    fn writes_removals_and_modes() {
        assert_eq!(files("rm -f a"), [("a".into(), Access::Remove)]);
        assert_eq!(files("rm -rf a"), [("a".into(), Access::RemoveTree)]);
        assert_eq!(files("rmdir a"), [("a".into(), Access::Remove)]);
        assert_eq!(files("mkdir -m 700 -p a"), [("a".into(), Access::Write)]);
        assert_eq!(files("shred -n 3 -u a"), [("a".into(), Access::Write)]);
        // The mode is the first operand, also when it looks like an option.
        assert_eq!(files("chmod 644 a"), [("a".into(), Access::Write)]);
        assert_eq!(files("chmod -w a"), [("a".into(), Access::Write)]);
        assert_eq!(files("chmod -v -x,u+r a"), [("a".into(), Access::Write)]);
        assert_eq!(files("chmod -R +x hooks"), [("hooks".into(), Access::WriteTree)]);
        assert_eq!(files("chmod --reference=r a"), [("r".into(), Access::Read), ("a".into(), Access::Write)]);
        assert_eq!(files("chown -R me:me a"), [("a".into(), Access::WriteTree)]);
        assert_eq!(files("shuf -n 2 -o out in"), [("out".into(), Access::Write), ("in".into(), Access::Read)]);
        assert_eq!(paths("join -t , -1 2 a b"), ["a", "b"]);
        assert_eq!(paths("sha256sum -c sums"), ["sums"]);
        assert_eq!(paths("file -m magic x"), ["magic", "x"]);
    }
}
