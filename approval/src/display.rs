//! A tool call as a person reads it when asked to approve it: the command for Bash, the
//! path and a diff for Write and Edit, the pattern for searches — not raw JSON.
//!
//! Everything shown comes from a model: control characters (terminal escape sequences
//! included) and invisible format characters ([`is_hidden_or_control`]) are shown as
//! `\u{..}` escapes, and long text is cut to [`MAX_SHOWN_LINES`] lines.

use serde_json::Value;

/// Lines of file content or diff shown; the rest is counted, not shown.
pub const MAX_SHOWN_LINES: usize = 40;
/// Characters of one shown line; longer lines are cut with `…`.
pub const MAX_LINE_CHARS: usize = 200;

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

/// `s` with control and invisible characters other than tab escaped (one line).
fn clean(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for (i, c) in s.chars().enumerate() {
        if i >= MAX_LINE_CHARS {
            out.push('…');
            break;
        }
        if is_hidden_or_control(c) && c != '\t' {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    out
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
            let cmd = text(input, "command");
            let mut first = true;
            for l in cmd.lines() {
                out.push(format!("{} {}", if first { "  $" } else { "   " }, clean(l)));
                first = false;
            }
            let d = text(input, "description");
            if !d.is_empty() {
                out.push(format!("  ({})", clean(d)));
            }
        }
        "Write" => {
            let content = text(input, "content");
            out.push(format!("  write {} ({} lines)", clean(text(input, "file_path")), content.lines().count()));
            lines(&mut out, "  + ", content, &mut budget);
        }
        "Edit" => {
            let all = input.get("replace_all").and_then(Value::as_bool) == Some(true);
            out.push(format!(
                "  edit {}{}",
                clean(text(input, "file_path")),
                if all { " (every occurrence)" } else { "" }
            ));
            lines(&mut out, "  - ", text(input, "old_string"), &mut budget);
            lines(&mut out, "  + ", text(input, "new_string"), &mut budget);
        }
        "Read" => out.push(format!("  read {}", clean(text(input, "file_path")))),
        "Glob" | "Grep" => {
            let path = text(input, "path");
            let at = if path.is_empty() { String::new() } else { format!(" in {}", clean(path)) };
            out.push(format!("  {} {}{at}", tool.to_lowercase(), clean(text(input, "pattern"))));
        }
        _ => {
            let json = serde_json::to_string_pretty(input).unwrap_or_default();
            out.push(format!("  {}", clean(tool)));
            lines(&mut out, "    ", &json, &mut budget);
        }
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn calls_read_as_a_person_would_write_them() {
        assert_eq!(
            describe_call("Bash", &json!({ "command": "git status", "description": "see changes" })),
            "  $ git status\n  (see changes)"
        );
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
}
