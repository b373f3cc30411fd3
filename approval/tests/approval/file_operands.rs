//! Issue 44 item 6 / issue 40 item 7: one mechanism judges a command's file reads and
//! writes — redirections and the file operands of the commands `operands` knows — by the
//! file rules, on resolved paths: deny rules reach the shell, a write operand follows the
//! operator's Write policy and the permission mode, executable configuration keeps asking,
//! unknown programs are unchanged, and the decision equals that of the equivalent Read and
//! Write tool calls combined with the Bash rule.

use proptest::prelude::*;
use warden_approval::operands::FILE_COMMAND_NAMES;
use warden_approval::policy::is_executable_config;

use super::asks_only_when_it_must::{decide, decide_mode, with};
use super::*;

/// Every program of the table, allowed by its own prefix rule.
fn program_rules() -> Vec<String> {
    FILE_COMMAND_NAMES.iter().map(|p| format!("Bash({p}:*)")).collect()
}

/// Write operands are writes, judged as a Write call of their path: an `Edit` allow rule
/// covering the workspace allows them, a deny path rule denies, executable configuration
/// and paths outside the workspace ask — whichever program writes them, exactly as a
/// redirection is judged.
#[test]
fn write_operands_are_judged_as_redirections_are() {
    let mut allow = program_rules();
    allow.push("Edit(/**)".into());
    let allow: Vec<&str> = allow.iter().map(String::as_str).collect();
    let p = with(&allow, &[], &["Edit(./secrets/**)"], Decision::Ask);
    for (cmd, want) in [
        ("cp a.txt b.txt", Decision::Allow),
        ("mv a.txt docs/", Decision::Allow),
        ("touch notes.txt", Decision::Allow),
        ("cat a.txt | tee out.log", Decision::Allow),
        ("cat a.txt | tee /dev/null", Decision::Allow),
        ("rm -rf build", Decision::Allow),
        ("mkdir -p src/new", Decision::Allow),
        ("install -m 644 a.txt dist/a.txt", Decision::Allow),
        ("dd if=a.img of=b.img bs=1M", Decision::Allow),
        ("sed -i s/a/b/ notes.txt", Decision::Allow),
        ("chmod -w notes.txt", Decision::Allow),
        ("sort -o sorted.txt notes.txt", Decision::Allow),
        // A deny path rule denies, through every program and a redirection alike.
        ("cp a.txt secrets/key", Decision::Deny),
        ("rm secrets/key", Decision::Deny),
        ("echo x > secrets/key", Decision::Deny),
        ("truncate -s 0 secrets/key", Decision::Deny),
        ("mv secrets/key a.txt", Decision::Deny),
        ("dd if=a.txt of=secrets/key", Decision::Deny),
        // Executable configuration asks, whatever the rules.
        ("touch .bashrc", Decision::Ask),
        ("cp hook .git/hooks/pre-commit", Decision::Ask),
        ("tee -a .envrc", Decision::Ask),
        ("ln -s /x .husky/pre-commit", Decision::Ask),
        ("chmod +x .git/hooks/pre-commit", Decision::Ask),
        ("install -d .git/hooks", Decision::Ask),
        ("mv planted .git", Decision::Ask),
        ("sed -i s/a/b/ .git/config", Decision::Ask),
        // A recursive copy writes whatever its source holds, `.git/hooks` included.
        ("cp -r planted docs", Decision::Ask),
        // ... and a tree written over the whole workspace could reach the denied files.
        ("cp -r planted .", Decision::Deny),
        // Outside the workspace no Edit rule covers; a computed path is unknown.
        ("touch /tmp/x", Decision::Ask),
        ("cp a.txt ../outside", Decision::Ask),
        ("rm \"$F\"", Decision::Ask),
    ] {
        let ev = decide(&p, cmd);
        assert_eq!(ev.decision, want, "{cmd:?}: {}", ev.reason);
    }
    // Regression: a read-and-write met the Read ask rule first and never the Edit deny rule.
    let both = with(&["Bash(sed:*)"], &["Read(./secrets/**)"], &["Edit(./secrets/**)"], Decision::Allow);
    assert_eq!(decide(&both, "sed -i s/a/b/ secrets/k").decision, Decision::Deny);
    assert_eq!(decide(&both, "sed s/a/b/ secrets/k").decision, Decision::Ask);
    let ev = decide(&p, "touch .bashrc");
    assert!(
        ev.reason.contains("/workspace/.bashrc") && ev.reason.contains("executable configuration"),
        "{}",
        ev.reason
    );
}

/// Without an `Edit`/`Write` allow rule, a write operand is `default`'s and the mode's, as
/// a Write call of the file: asked, allowed by `acceptEdits` inside the workspace (never
/// executable configuration), declined by `dontAsk`, denied by `default: deny`. A Bash
/// allow rule that names the whole command word for word shows its files and allows them.
#[test]
fn write_operands_follow_the_write_policy_and_the_mode() {
    let p = with(&["Bash(touch:*)", "Bash(rm:*)", "Bash(rm -r build)"], &[], &[], Decision::Ask);
    let ev = decide(&p, "touch notes.txt");
    assert_eq!(ev.decision, Decision::Ask);
    assert!(
        ev.reason.contains("writes /workspace/notes.txt") && ev.reason.contains("no Edit/Write allow rule"),
        "{}",
        ev.reason
    );
    assert_eq!(decide_mode(&p, "touch notes.txt", PermissionMode::AcceptEdits).decision, Decision::Allow);
    assert_eq!(decide_mode(&p, "rm old.txt", PermissionMode::AcceptEdits).decision, Decision::Allow);
    assert_eq!(decide_mode(&p, "touch .zshrc", PermissionMode::AcceptEdits).decision, Decision::Ask);
    assert_eq!(decide_mode(&p, "touch /tmp/x", PermissionMode::AcceptEdits).decision, Decision::Ask);
    assert_eq!(decide_mode(&p, "touch notes.txt", PermissionMode::DontAsk).decision, Decision::Deny);
    // The rule that names the whole command shows the files it removes.
    assert_eq!(decide(&p, "rm -r build").decision, Decision::Allow, "{}", decide(&p, "rm -r build").reason);
    assert_eq!(decide(&p, "rm -r build2").decision, Decision::Ask);
    let strict = with(&["Bash(touch:*)"], &[], &[], Decision::Deny);
    assert_eq!(decide(&strict, "touch notes.txt").decision, Decision::Deny);
    // A bare `Write` allows a Write call of any path, and so the write (not executable
    // configuration).
    let bare = with(&["Bash(touch:*)", "Write"], &[], &[], Decision::Deny);
    assert_eq!(decide(&bare, "touch /tmp/x").decision, Decision::Allow);
    assert_eq!(decide(&bare, "touch .bashrc").decision, Decision::Ask);
    let ws = with(&["Bash(touch:*)", "Write(./notes/**)"], &[], &[], Decision::Deny);
    assert_eq!(decide(&ws, "touch notes/a.md").decision, Decision::Allow);
    assert_eq!(decide(&ws, "touch other.md").decision, Decision::Deny);
    // A bare `Bash` allows every command with its files (deny path rules still apply).
    let open = with(&["Bash"], &[], &["Edit(./secrets/**)"], Decision::Ask);
    assert_eq!(decide(&open, "touch notes.txt").decision, Decision::Allow);
    assert_eq!(decide(&open, "touch secrets/x").decision, Decision::Deny);
}

/// `Read` deny rules reach the file operands of every reading program of the table.
#[test]
fn read_deny_rules_reach_every_reading_program() {
    let allow = program_rules();
    let allow: Vec<&str> = allow.iter().map(String::as_str).collect();
    let p = with(&allow, &[], &["Read(./.env)"], Decision::Ask);
    for cmd in [
        "cat .env",
        "head -n 1 .env",
        "grep -e KEY .env",
        "paste a .env",
        "join a .env",
        "comm a .env",
        "md5sum .env",
        "sha256sum -c .env",
        "rev .env",
        "fold -w 5 .env",
        "pr -h x .env",
        "base32 .env",
        "shuf .env",
        "file .env",
        "zcat .env",
        "cp .env docs/x",
        "install .env docs/x",
        "tsort .env",
        "expand -t 4 .env",
    ] {
        let ev = decide(&p, cmd);
        assert_eq!(ev.decision, Decision::Deny, "{cmd:?}: {}", ev.reason);
    }
    // The pattern of grep, the mode of chmod and option values are not files.
    assert_eq!(decide(&p, "grep .env notes.txt").decision, Decision::Allow);
    assert_eq!(decide(&p, "fold -w .env a").decision, Decision::Allow);
    // Unknown programs: unchanged (their operands are not seen; see docs/operators.md).
    let other = with(&["Bash(python3:*)", "Bash(frob:*)"], &[], &["Read(./.env)", "Edit(/**)"], Decision::Ask);
    assert_eq!(decide(&other, "python3 .env").decision, Decision::Allow);
    assert_eq!(decide(&other, "frob notes.txt").decision, Decision::Allow);
}

/// One program of the table with the roles of its operands, written out here (not taken
/// from the table) for the differential property below.
#[derive(Debug, Clone, Copy)]
enum Shape {
    /// `prog FILE...`: every operand read.
    Reads(&'static str),
    /// `prog PATTERN FILE...`: the first word is not a file.
    PatternThenReads(&'static str),
    /// `prog FILE...`: every operand written (or removed).
    Writes(&'static str),
    /// `prog SRC... DEST`: sources read (`moved`: and written), DEST and DEST/<name> written.
    Copies(&'static str, bool),
    /// `sed -i s/a/b/ FILE...`: read and written.
    InPlace,
    /// `dd if=A of=B`.
    Dd,
}

const SHAPES: &[Shape] = &[
    Shape::Reads("cat"),
    Shape::Reads("head"),
    Shape::Reads("tail"),
    Shape::Reads("wc"),
    Shape::Reads("sort"),
    Shape::Reads("md5sum"),
    Shape::Reads("paste"),
    Shape::Reads("nl"),
    Shape::Reads("base64"),
    Shape::PatternThenReads("grep"),
    Shape::Writes("tee"),
    Shape::Writes("touch"),
    Shape::Writes("mkdir"),
    Shape::Writes("rm"),
    Shape::Writes("rmdir"),
    Shape::Writes("unlink"),
    Shape::Writes("shred"),
    Shape::Copies("cp", false),
    Shape::Copies("ln", false),
    Shape::Copies("install", false),
    Shape::Copies("mv", true),
    Shape::InPlace,
    Shape::Dd,
];

const PATHS: &[&str] = &[
    "a.txt",
    "docs/b.md",
    ".env",
    "secrets/k",
    "out/y",
    ".bashrc",
    ".git/hooks/pre-commit",
    "/tmp/x",
    "/workspace/docs/c.md",
];

/// Bash rules (about the programs of [`SHAPES`]) and path rules, for any list.
fn rule_pool() -> Vec<&'static str> {
    vec![
        "Bash(cat:*)",
        "Bash(grep:*)",
        "Bash(cp:*)",
        "Bash(mv:*)",
        "Bash(rm:*)",
        "Bash(tee:*)",
        "Bash(touch:*)",
        "Bash(sed:*)",
        "Bash(dd:*)",
        "Bash(install:*)",
        "Read(./.env)",
        "Read(./secrets/**)",
        "Edit(./secrets/**)",
        "Edit(./docs/**)",
        "Write(./out/**)",
        "Edit(/**)",
        "Read(./docs/**)",
    ]
}

/// The command, and each (path, reads, writes) it touches by the shape's roles.
fn command_of(shape: Shape, paths: &[&'static str]) -> (String, Vec<(String, bool, bool)>) {
    let name = |p: &str| p.rsplit('/').next().unwrap_or_default().to_owned();
    let mut files = Vec::new();
    let cmd = match shape {
        Shape::Reads(prog) | Shape::Writes(prog) => {
            let writes = matches!(shape, Shape::Writes(_));
            files.extend(paths.iter().map(|p| (p.to_string(), !writes, writes)));
            format!("{prog} {}", paths.join(" "))
        }
        Shape::PatternThenReads(prog) => {
            files.extend(paths.iter().map(|p| (p.to_string(), true, false)));
            format!("{prog} KEY {}", paths.join(" "))
        }
        Shape::Copies(prog, moved) => {
            let (dest, sources) = paths.split_last().expect("at least one path");
            // A lone operand is taken for the destination (erring towards a write).
            files.extend(sources.iter().map(|p| (p.to_string(), true, moved)));
            files.push((dest.to_string(), false, true));
            files.extend(sources.iter().map(|s| (format!("{dest}/{}", name(s)), false, true)));
            format!("{prog} {}", paths.join(" "))
        }
        Shape::InPlace => {
            files.extend(paths.iter().map(|p| (p.to_string(), true, true)));
            format!("sed -i s/a/b/ {}", paths.join(" "))
        }
        Shape::Dd => {
            let (src, dst) = (paths[0], paths[paths.len() - 1]);
            files.push((src.to_string(), true, false));
            files.push((dst.to_string(), false, true));
            format!("dd if={src} of={dst} bs=4k")
        }
    };
    (cmd, files)
}

fn program(shape: Shape) -> &'static str {
    match shape {
        Shape::Reads(p) | Shape::PatternThenReads(p) | Shape::Writes(p) | Shape::Copies(p, _) => p,
        Shape::InPlace => "sed",
        Shape::Dd => "dd",
    }
}

/// What the rules say about the program alone (its Bash rule), as Claude Code's rules read.
fn bash_rule(p: &PolicyConfig, prog: &str) -> Decision {
    let rule = format!("Bash({prog}:*)");
    if p.deny.contains(&rule) {
        Decision::Deny
    } else if p.ask.contains(&rule) {
        Decision::Ask
    } else if p.allow.contains(&rule) {
        Decision::Allow
    } else {
        p.default
    }
}

/// The oracle: the Bash rule, combined with the Read call of each file read (its deny and
/// ask rules) and the Write call of each file written (its deny and ask rules; and, when
/// the Bash rule allows the command, its whole decision, with executable configuration
/// always asked) — each on the path as written and on where `resolve` says it leads.
fn expected(p: &Policy, shape: Shape, files: &[(String, bool, bool)], resolve: impl Fn(&str) -> String) -> Decision {
    let bash = bash_rule(p.config(), program(shape));
    let mut worst = bash;
    for (path, reads, writes) in files {
        let absolute = std::path::Path::new("/workspace").join(path).to_string_lossy().into_owned();
        for judged in [absolute.clone(), resolve(&absolute)] {
            for (tool, applies) in [("Read", *reads), ("Write", *writes)] {
                if !applies {
                    continue;
                }
                let ev = p.evaluate(tool, &json!({ "file_path": judged, "content": "" }), &ctx());
                let restricted = ev.matched_rule.is_some() && ev.decision != Decision::Allow;
                if restricted || (tool == "Write" && bash == Decision::Allow) {
                    worst = worst.max(ev.decision);
                }
                if tool == "Write" && bash == Decision::Allow && is_executable_config(std::path::Path::new(&judged)) {
                    worst = worst.max(Decision::Ask);
                }
            }
        }
    }
    worst
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Differential: for generated commands of a program of the table and its operands, the
    /// Bash decision equals the decision of the equivalent explicit Read and Write tool
    /// calls on the same paths combined with the Bash rule — whichever rules the policy's
    /// lists hold, and whatever its `default`.
    #[test]
    fn a_commands_files_are_judged_as_the_equivalent_file_tool_calls(
        shape in proptest::sample::select(SHAPES.to_vec()),
        paths in proptest::collection::vec(proptest::sample::select(PATHS.to_vec()), 1..4),
        allow in proptest::sample::subsequence([rule_pool(), vec!["Write"]].concat(), 0..8),
        ask in proptest::sample::subsequence(rule_pool(), 0..3),
        deny in proptest::sample::subsequence(rule_pool(), 0..3),
        default in proptest::sample::select(vec![Decision::Allow, Decision::Ask, Decision::Deny]),
    ) {
        let p = with(&allow, &ask, &deny, default);
        let (cmd, files) = command_of(shape, &paths);
        let ev = decide(&p, &cmd);
        prop_assert_eq!(ev.decision, expected(&p, shape, &files, str::to_owned), "{} under allow {:?} ask {:?} deny {:?} default {:?}: {}",
            cmd, allow, ask, deny, default, ev.reason);
    }

    /// The same where the sandbox resolves the paths (links): each of [`PATHS`] may lead to
    /// another of them, as the host reports it ([`ResolvedFile`]); the decision equals the
    /// file tool calls' on the path as written and where it leads, together.
    #[test]
    fn a_commands_files_are_judged_where_they_resolve_as_the_file_tool_calls(
        shape in proptest::sample::select(SHAPES.to_vec()),
        paths in proptest::collection::vec(proptest::sample::select(PATHS.to_vec()), 1..4),
        links in proptest::collection::vec(proptest::option::of(0..PATHS.len()), PATHS.len()),
        allow in proptest::sample::subsequence([rule_pool(), vec!["Write"]].concat(), 0..8),
        ask in proptest::sample::subsequence(rule_pool(), 0..3),
        deny in proptest::sample::subsequence(rule_pool(), 0..3),
        default in proptest::sample::select(vec![Decision::Allow, Decision::Ask, Decision::Deny]),
    ) {
        let absolute = |p: &str| std::path::Path::new("/workspace").join(p).to_string_lossy().into_owned();
        let resolve = |path: &str| match PATHS.iter().position(|p| absolute(p) == path) {
            Some(i) => links[i].map_or_else(|| path.to_owned(), |j| absolute(PATHS[j])),
            None => path.to_owned(),
        };
        let p = with(&allow, &ask, &deny, default);
        let (cmd, files) = command_of(shape, &paths);
        let looked_up: Vec<ResolvedFile> = shell_files(&cmd, std::path::Path::new("/workspace"))
            .into_iter()
            .map(|f| ResolvedFile { resolved: Some(resolve(&f.path)), path: f.path, other_names: false })
            .collect();
        let facts = CallFacts { shell_files: Some(&looked_up), ..CallFacts::default() };
        let ev = p.decide_call("Bash", &json!({ "command": cmd }), &facts, &ctx(), p.effective_mode(None));
        prop_assert_eq!(ev.decision, expected(&p, shape, &files, resolve), "{} with links {:?} under allow {:?} ask {:?} deny {:?} default {:?}: {}",
            cmd, links, allow, ask, deny, default, ev.reason);
    }
}

/// The shapes above are programs of the table.
#[test]
fn the_generated_programs_are_in_the_table() {
    for shape in SHAPES {
        assert!(FILE_COMMAND_NAMES.contains(&program(*shape)), "{shape:?}");
    }
}
