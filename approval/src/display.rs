//! A tool call as a person reads it when asked to approve it: the command for Bash, the
//! path and a diff for Write and Edit, the pattern for searches — not raw JSON.
//!
//! Everything shown comes from a model: control characters (terminal escape sequences
//! included) are shown as `\u{..}` escapes, and long text is cut to
//! [`MAX_SHOWN_LINES`] lines.

use serde_json::Value;

/// Lines of file content or diff shown; the rest is counted, not shown.
pub const MAX_SHOWN_LINES: usize = 40;
/// Characters of one shown line; longer lines are cut with `…`.
pub const MAX_LINE_CHARS: usize = 200;

/// `s` with control characters other than tab escaped (one line).
fn clean(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for (i, c) in s.chars().enumerate() {
        if i >= MAX_LINE_CHARS {
            out.push('…');
            break;
        }
        if c.is_control() && c != '\t'
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        {
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
}
