//! Compound shell command splitter.
//!
//! Splits a Bash command line into the simple commands it would run, so that a
//! permission rule is checked against every one of them: list and pipeline
//! operators (`&&`, `||`, `;`, `|`, `|&`, `&`, newlines), subshells `( ... )`,
//! command substitution `$(...)` and backticks (also inside double quotes, where
//! the shell still executes them), process substitution `<(...)` / `>(...)`, and
//! command substitutions nested inside arithmetic `$(( ... ))`.
//!
//! The splitter is quoting aware (`'...'`, `"..."`, `$'...'`, backslash escapes)
//! and produces each simple command as dequoted words joined by single spaces,
//! so `git   "status"` and `git status` are the same text for matching.
//! Harmless redirections (fd duplication such as `2>&1`, and output to
//! `/dev/null`) are dropped; all others stay in the text.
//!
//! What it must never do: panic on any input, or report a command as
//! [`Split::complete`] when it could not understand it. Anything it does not
//! understand (unbalanced quotes or parentheses, too deep nesting, too long
//! input) makes the split *incomplete*, and the policy then refuses to allow the
//! command without asking. It errs on the side of splitting too much: a word
//! it is unsure about becomes a separate command that needs its own permission.
//! It does not expand variables, globs or aliases, and it does not try to see
//! through wrappers (`env`, `xargs`, `sudo`, `sh -c`): allow rules therefore
//! never match such commands by accident, but deny rules are a best effort
//! against a determined author — the allow list and the `ask` default are the
//! real boundary.

/// Longest command line (in bytes) the splitter analyses. Longer input is
/// reported incomplete, so it is never allowed without asking. 64 KiB is far
/// beyond any command a person would review, and bounds the work per call.
pub const MAX_COMMAND_LEN: usize = 64 * 1024;

/// Deepest nesting of subshells / substitutions analysed. Deeper input is
/// reported incomplete. Bounds recursion so hostile input cannot overflow the
/// stack; real commands rarely nest more than three levels.
pub const MAX_NESTING: usize = 32;

/// Most simple commands collected from one command line. Beyond this the split
/// is reported incomplete; bounds memory for pathological input.
pub const MAX_PARTS: usize = 4096;

/// Words that introduce or close a compound command; stripped from the front of
/// a part so that `if rm -rf /; then ...` is checked as `rm -rf /`.
const LEADING_RESERVED: &[&str] = &[
    "{", "}", "!", "if", "then", "else", "elif", "fi", "do", "done", "while", "until", "time",
    "esac", "coproc",
];

/// Output redirection targets that write nothing anyone can read back.
const HARMLESS_OUTPUT_TARGETS: &[&str] = &["/dev/null", "/dev/stdout", "/dev/stderr"];

/// One simple command found in a command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimpleCommand {
    /// Dequoted words; kept redirections appear as an operator word followed by
    /// its target word. Substitutions appear as the placeholder `$(...)`.
    pub words: Vec<String>,
    /// The command word (the first word after `NAME=value` assignments)
    /// contains an expansion (`$x`, `$(...)`, backticks, `$'...'`), so what
    /// runs cannot be known from the text.
    pub dynamic_command: bool,
    /// An output redirection writes to a file (anything but `/dev/null` and
    /// fd duplication).
    pub writes_file: bool,
}

impl SimpleCommand {
    /// The canonical text matched against rules: words joined by one space.
    pub fn text(&self) -> String {
        self.words.join(" ")
    }
}

/// Result of [`split`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// Every simple command found, in source order (substitutions come before
    /// the command that contains them).
    pub commands: Vec<SimpleCommand>,
    /// False when the input was not fully understood; see the module docs.
    pub complete: bool,
    /// Why the split is incomplete (first problem found).
    pub problem: Option<String>,
}

/// Split a command line into its simple commands. Never panics.
pub fn split(command: &str) -> Split {
    if command.len() > MAX_COMMAND_LEN {
        return Split {
            commands: Vec::new(),
            complete: false,
            problem: Some(format!("command longer than {MAX_COMMAND_LEN} bytes")),
        };
    }
    let mut out = Vec::new();
    let mut problem = None;
    let mut p = Parser {
        chars: command.chars().collect(),
        pos: 0,
        depth: 0,
        record: true,
        out: &mut out,
        problem: &mut problem,
    };
    p.parse_list(false);
    Split {
        complete: problem.is_none(),
        commands: out,
        problem,
    }
}

#[derive(Default)]
struct Word {
    text: String,
    dynamic: bool,
}

#[derive(Default)]
struct CommandBuilder {
    words: Vec<Word>,
    cur: Option<Word>,
    pending_redirect: Option<String>,
    writes_file: bool,
}

struct Parser<'a> {
    chars: Vec<char>,
    pos: usize,
    depth: usize,
    /// Whether simple commands at this level are collected (false inside
    /// arithmetic, where only nested substitutions execute).
    record: bool,
    out: &'a mut Vec<SimpleCommand>,
    problem: &'a mut Option<String>,
}

impl Parser<'_> {
    fn fail(&mut self, why: impl Into<String>) {
        if self.problem.is_none() {
            *self.problem = Some(why.into());
        }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, off: usize) -> Option<char> {
        self.chars.get(self.pos + off).copied()
    }

    fn word<'b>(&self, b: &'b mut CommandBuilder) -> &'b mut Word {
        b.cur.get_or_insert_with(Word::default)
    }

    /// Parse a command list until end of input, or (when `nested`) until the
    /// matching `)`, which is consumed.
    fn parse_list(&mut self, nested: bool) {
        let mut b = CommandBuilder::default();
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' | '\r' => {
                    self.pos += 1;
                    self.end_word(&mut b);
                }
                '\n' | ';' | '|' => {
                    self.pos += 1;
                    if c != '\n' && matches!(self.peek(), Some(n) if n == c || n == '&') {
                        self.pos += 1; // `;;`, `||`, `|&`, `;&`
                    }
                    self.end_command(&mut b);
                }
                '&' => {
                    if self.peek_at(1) == Some('>') {
                        // `&>file` / `&>>file`: redirect stdout and stderr.
                        self.end_word(&mut b);
                        self.pos += 2;
                        let mut op = String::from("&>");
                        if self.peek() == Some('>') {
                            self.pos += 1;
                            op.push('>');
                        }
                        b.pending_redirect = Some(op);
                    } else {
                        self.pos += 1;
                        if self.peek() == Some('&') {
                            self.pos += 1;
                        }
                        self.end_command(&mut b);
                    }
                }
                '(' => {
                    self.pos += 1;
                    self.end_command(&mut b);
                    self.nested(|p| p.parse_list(true));
                }
                ')' => {
                    self.pos += 1;
                    self.end_command(&mut b);
                    if nested {
                        return;
                    }
                    self.fail("unbalanced `)`");
                }
                '\'' => {
                    self.pos += 1;
                    self.word(&mut b);
                    self.single_quoted(&mut b);
                }
                '"' => {
                    self.pos += 1;
                    self.word(&mut b);
                    self.double_quoted(&mut b);
                }
                '\\' => {
                    self.pos += 1;
                    match self.peek() {
                        Some('\n') => self.pos += 1, // line continuation
                        Some(n) => {
                            self.pos += 1;
                            self.word(&mut b).text.push(n);
                        }
                        None => self.word(&mut b).text.push('\\'),
                    }
                }
                '$' => self.dollar(&mut b, false),
                '`' => {
                    self.pos += 1;
                    self.backtick(&mut b);
                }
                '<' | '>' => self.redirect(&mut b),
                '#' if b.cur.is_none() => {
                    // Comment: up to (not including) the newline.
                    while let Some(n) = self.peek() {
                        if n == '\n' {
                            break;
                        }
                        self.pos += 1;
                    }
                }
                _ => {
                    self.pos += 1;
                    self.word(&mut b).text.push(c);
                }
            }
        }
        self.end_command(&mut b);
        if nested {
            self.fail("unbalanced `(`");
        }
    }

    /// Run `f` one nesting level deeper (recording commands), or give up.
    fn nested(&mut self, f: impl FnOnce(&mut Self)) {
        self.nested_with(true, f);
    }

    fn nested_with(&mut self, record: bool, f: impl FnOnce(&mut Self)) {
        if self.depth >= MAX_NESTING {
            self.fail(format!("nesting deeper than {MAX_NESTING}"));
            self.pos = self.chars.len();
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
                None => return self.fail("unterminated single quote"),
                Some('\'') => {
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
                None => return self.fail("unterminated double quote"),
                Some('"') => {
                    self.pos += 1;
                    return;
                }
                Some('\\') => {
                    self.pos += 1;
                    match self.peek() {
                        Some('\n') => self.pos += 1,
                        Some(n @ ('$' | '`' | '"' | '\\')) => {
                            self.pos += 1;
                            self.word(b).text.push(n);
                        }
                        _ => self.word(b).text.push('\\'),
                    }
                }
                Some('$') => self.dollar(b, true),
                Some('`') => {
                    self.pos += 1;
                    self.backtick(b);
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
        self.pos += 1;
        match self.peek() {
            Some('(') if self.peek_at(1) == Some('(') => {
                // Arithmetic `$(( ... ))`: only nested substitutions run.
                self.pos += 2;
                self.nested_with(false, |p| {
                    p.parse_list(true);
                    if p.peek() == Some(')') {
                        p.pos += 1;
                    } else {
                        p.fail("unterminated `$((`");
                    }
                });
                let w = self.word(b);
                w.text.push_str("$((...))");
                w.dynamic = true;
            }
            Some('(') => {
                self.pos += 1;
                self.nested(|p| p.parse_list(true));
                let w = self.word(b);
                w.text.push_str("$(...)");
                w.dynamic = true;
            }
            Some('\'') if !in_double_quotes => {
                // ANSI-C quoting: escapes are not decoded, so the word's real
                // value is unknown.
                self.pos += 1;
                self.word(b).dynamic = true;
                loop {
                    match self.peek() {
                        None => return self.fail("unterminated $'...' quote"),
                        Some('\\') => {
                            self.pos += 1;
                            self.word(b).text.push('\\');
                            if let Some(n) = self.peek() {
                                self.pos += 1;
                                self.word(b).text.push(n);
                            }
                        }
                        Some('\'') => {
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
            Some('"') if !in_double_quotes => {
                // Locale translation `$"..."`: same as a double-quoted string.
                self.pos += 1;
                self.word(b);
                self.double_quoted(b);
            }
            _ => {
                let w = self.word(b);
                w.text.push('$');
                w.dynamic = true;
            }
        }
    }

    /// After an opening backtick: collect up to the closing one (unescaping
    /// `` \` `` and `\\`), then split the contents as a nested command line.
    fn backtick(&mut self, b: &mut CommandBuilder) {
        let mut inner = String::new();
        loop {
            match self.peek() {
                None => {
                    self.fail("unterminated backtick");
                    break;
                }
                Some('`') => {
                    self.pos += 1;
                    break;
                }
                Some('\\') => {
                    self.pos += 1;
                    match self.peek() {
                        Some(n @ ('`' | '\\' | '$')) => {
                            self.pos += 1;
                            inner.push(n);
                        }
                        _ => inner.push('\\'),
                    }
                }
                Some(c) => {
                    self.pos += 1;
                    inner.push(c);
                }
            }
        }
        if self.depth >= MAX_NESTING {
            self.fail(format!("nesting deeper than {MAX_NESTING}"));
        } else {
            let mut sub = Parser {
                chars: inner.chars().collect(),
                pos: 0,
                depth: self.depth + 1,
                record: true,
                out: &mut *self.out,
                problem: &mut *self.problem,
            };
            sub.parse_list(false);
        }
        let w = self.word(b);
        w.text.push_str("$(...)");
        w.dynamic = true;
    }

    /// At an unquoted `<` or `>`: a redirection or a process substitution.
    fn redirect(&mut self, b: &mut CommandBuilder) {
        let c = self.peek().unwrap_or('>');
        if self.peek_at(1) == Some('(') {
            // Process substitution `<(cmd)` / `>(cmd)`: runs `cmd`.
            self.pos += 2;
            self.nested(|p| p.parse_list(true));
            let w = self.word(b);
            w.text.push(c);
            w.text.push_str("(...)");
            w.dynamic = true;
            return;
        }
        // A word of only digits right before the operator is its fd number.
        let mut op = String::new();
        if let Some(w) = &b.cur
            && !w.text.is_empty()
            && !w.dynamic
            && w.text.chars().all(|ch| ch.is_ascii_digit())
        {
            op.push_str(&w.text);
            b.cur = None;
        }
        self.end_word(b);
        self.pos += 1;
        op.push(c);
        match (c, self.peek()) {
            ('>', Some('>' | '|')) | ('<', Some('>')) => {
                op.push(self.peek().unwrap_or('>'));
                self.pos += 1;
            }
            ('<', Some('<')) => {
                op.push('<');
                self.pos += 1;
                if matches!(self.peek(), Some('<' | '-')) {
                    op.push(self.peek().unwrap_or('<'));
                    self.pos += 1;
                }
            }
            _ => {}
        }
        if self.peek() == Some('&') {
            // fd duplication / closing: `2>&1`, `>&2`, `<&0`, `>&-`.
            let start = self.pos + 1;
            let mut end = start;
            while matches!(self.chars.get(end), Some(d) if d.is_ascii_digit()) {
                end += 1;
            }
            if end == start && self.chars.get(end) == Some(&'-') {
                end += 1;
            }
            if end > start {
                self.pos = end;
                return; // harmless: dropped
            }
            op.push('&'); // `>&file` = `&>file`
            self.pos += 1;
        }
        b.pending_redirect = Some(op);
    }

    fn end_word(&mut self, b: &mut CommandBuilder) {
        let Some(w) = b.cur.take() else { return };
        if let Some(op) = b.pending_redirect.take() {
            let output = op.contains('>');
            if output && !w.dynamic && HARMLESS_OUTPUT_TARGETS.contains(&w.text.as_str()) {
                return;
            }
            if output {
                b.writes_file = true;
            }
            b.words.push(Word {
                text: op,
                dynamic: false,
            });
        }
        b.words.push(w);
    }

    fn end_command(&mut self, b: &mut CommandBuilder) {
        self.end_word(b);
        if let Some(op) = b.pending_redirect.take() {
            self.fail(format!("redirection `{op}` without a target"));
        }
        let mut b = std::mem::take(b);
        let mut start = 0;
        while start < b.words.len()
            && !b.words[start].dynamic
            && LEADING_RESERVED.contains(&b.words[start].text.as_str())
        {
            start += 1;
        }
        let words: Vec<Word> = b.words.drain(start..).collect();
        if words.is_empty() || !self.record {
            return;
        }
        if self.out.len() >= MAX_PARTS {
            self.fail(format!("more than {MAX_PARTS} commands"));
            self.pos = self.chars.len();
            return;
        }
        let dynamic_command = words
            .iter()
            .find(|w| !is_assignment(&w.text))
            .is_some_and(|w| w.dynamic);
        self.out.push(SimpleCommand {
            words: words.into_iter().map(|w| w.text).collect(),
            dynamic_command,
            writes_file: b.writes_file,
        });
    }
}

/// `NAME=value` (or `NAME+=value`) prefix assignment.
fn is_assignment(word: &str) -> bool {
    let Some(eq) = word.find('=') else {
        return false;
    };
    let name = word[..eq].strip_suffix('+').unwrap_or(&word[..eq]);
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(cmd: &str) -> Vec<String> {
        split(cmd)
            .commands
            .iter()
            .map(SimpleCommand::text)
            .collect()
    }

    #[test]
    fn splits_operators() {
        assert_eq!(
            texts("a && b || c; d | e & f\ng"),
            ["a", "b", "c", "d", "e", "f", "g"]
        );
        assert_eq!(texts("a |& b ;; c"), ["a", "b", "c"]);
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
        assert_eq!(
            texts("diff <(ls a) >(cat)"),
            ["ls a", "cat", "diff <(...) >(...)"]
        );
        assert_eq!(texts("echo $((1 + $(id -u)))"), ["id -u", "echo $((...))"]);
    }

    #[test]
    fn redirects() {
        let s = split("ls 2>&1 >/dev/null");
        assert_eq!(s.commands[0].text(), "ls");
        assert!(!s.commands[0].writes_file);
        let s = split("echo hi > out.txt");
        assert_eq!(s.commands[0].text(), "echo hi > out.txt");
        assert!(s.commands[0].writes_file);
        assert_eq!(texts("cat a &> b"), ["cat a &> b"]);
    }

    #[test]
    fn reserved_words_and_comments() {
        assert_eq!(texts("if true; then rm -rf /; fi"), ["true", "rm -rf /"]);
        assert_eq!(texts("{ ls; }"), ["ls"]);
        assert_eq!(texts("echo hi # ; rm -rf /"), ["echo hi"]);
    }

    #[test]
    fn incomplete() {
        assert!(!split("echo 'x").complete);
        assert!(!split("echo $(x").complete);
        assert!(!split("a )").complete);
        assert!(!split("echo >").complete);
        assert!(split("echo ok").complete);
    }

    #[test]
    fn dynamic_command_word() {
        assert!(split("$CMD -rf /").commands[0].dynamic_command);
        assert!(!split("X=$(id) ls").commands[1].dynamic_command);
        assert!(!split("echo $HOME").commands[0].dynamic_command);
    }
}
