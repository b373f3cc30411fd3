//! Text that came from a plugin, an agent file or a remote peer, made safe to show.
//!
//! [`escape_control`] is the one escaper: every plugin- or agent-provided string the CLI
//! prints and every plugin log line goes through it, so no such string can move the
//! cursor, set a window title (OSC), forge a second log line or hide text behind a
//! bidirectional override. This module only transforms text; it never prints.

use std::borrow::Cow;

/// Characters that must not reach a terminal or a log line as they are: C0 and C1
/// controls (ESC starts ANSI/OSC sequences, CR/LF start new lines), DEL, the Unicode
/// bidirectional controls (text that reads differently than it is) and every other
/// invisible format character ([`warden_approval::display::is_hidden_or_control`], the
/// one predicate the approval question uses too).
fn is_unsafe(c: char) -> bool {
    warden_approval::display::is_hidden_or_control(c)
}

/// `s` with every unsafe character written as an escape (`\n`, `\t`, `\r`, `\u{1b}`), and
/// backslashes doubled only when something else was escaped, so plain text stays as it is
/// and an escaped string cannot be confused with one that contained the escape literally.
/// For one-line contexts: names, versions, log lines, error texts.
pub fn escape_control(s: &str) -> Cow<'_, str> {
    escape(s, false)
}

/// `s` cut to at most `max` bytes (at a character boundary), followed by `… [N bytes]`
/// when it was cut: for a peer's or plugin's text quoted in a one-line message.
pub fn excerpt(s: &str, max: usize) -> Cow<'_, str> {
    if s.len() <= max {
        return Cow::Borrowed(s);
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    Cow::Owned(format!("{}… [{} bytes]", &s[..cut], s.len()))
}

/// Words of a prompt that describe a task whose caller gave no description.
pub const DESCRIPTION_WORDS: usize = 5;

/// The default description of a task: the first [`DESCRIPTION_WORDS`] words of its prompt.
pub fn first_words(prompt: &str) -> String {
    prompt.split_whitespace().take(DESCRIPTION_WORDS).collect::<Vec<_>>().join(" ")
}

/// Like [`escape_control`], but line feeds and tabs stay: for multi-line text shown as
/// such (a task's output, a tool result).
pub fn escape_multiline(s: &str) -> Cow<'_, str> {
    escape(s, true)
}

fn escape(s: &str, keep_lines: bool) -> Cow<'_, str> {
    let kept = |c: char| keep_lines && matches!(c, '\n' | '\t');
    if !s.chars().any(|c| is_unsafe(c) && !kept(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            c if kept(c) => out.push(c),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\\' => out.push_str("\\\\"),
            c if is_unsafe(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn examples() {
        assert_eq!(escape_control("plain text, ünïcode"), "plain text, ünïcode");
        assert_eq!(escape_control("a\nb"), "a\\nb");
        assert_eq!(escape_control("\u{1b}]0;pwned\u{7}"), "\\u{1b}]0;pwned\\u{7}");
        assert_eq!(escape_control("x\u{202E}y"), "x\\u{202e}y");
        assert_eq!(escape_control("c:\\dir"), "c:\\dir");
    }

    /// Every bidirectional control (Trojan Source) and the invisible format characters
    /// named in the issue; inserted anywhere in arbitrary text, none survives either escaper.
    const INVISIBLE: &[char] = &[
        '\u{202A}',
        '\u{202B}',
        '\u{202C}',
        '\u{202D}',
        '\u{202E}',
        '\u{2066}',
        '\u{2067}',
        '\u{2068}',
        '\u{2069}',
        '\u{200E}',
        '\u{200F}',
        '\u{061C}',
        '\u{200B}',
        '\u{200C}',
        '\u{200D}',
        '\u{2060}',
        '\u{2028}',
        '\u{2029}',
        '\u{FEFF}',
        '\u{00AD}',
        '\u{180E}',
        '\u{E0001}',
        '\u{E0041}',
        '\u{E007F}',
        '\u{FFF9}',
        '\u{3164}',
    ];

    proptest! {
        #[test]
        fn output_never_holds_a_control_character(s in any::<String>()) {
            let e = escape_control(&s);
            prop_assert!(!e.chars().any(is_unsafe), "{e:?}");
        }

        #[test]
        fn multiline_keeps_only_line_feeds_and_tabs(s in any::<String>()) {
            let e = escape_multiline(&s);
            prop_assert!(!e.chars().any(|c| is_unsafe(c) && c != '\n' && c != '\t'), "{e:?}");
            prop_assert_eq!(e.matches('\n').count(), s.matches('\n').count());
        }

        #[test]
        fn regression_no_bidi_or_invisible_format_character_survives(
            s in any::<String>(), at in any::<proptest::sample::Index>(), which in 0..INVISIBLE.len(),
        ) {
            let mut chars: Vec<char> = s.chars().collect();
            chars.insert(at.index(chars.len() + 1), INVISIBLE[which]);
            let s: String = chars.into_iter().collect();
            for e in [escape_control(&s), escape_multiline(&s)] {
                prop_assert!(!e.chars().any(|c| INVISIBLE.contains(&c)), "{e:?}");
            }
        }

        #[test]
        fn an_excerpt_is_bounded_and_keeps_short_text(s in any::<String>(), max in 0usize..64) {
            let e = excerpt(&s, max);
            if s.len() <= max {
                prop_assert_eq!(e.as_ref(), s.as_str());
            } else {
                prop_assert!(e.len() <= max + 32, "{}", e.len());
                prop_assert!(e.ends_with(&format!("… [{} bytes]", s.len())), "{}", e);
            }
        }

        #[test]
        fn safe_text_is_unchanged(s in "[ -~]*") {
            prop_assert_eq!(escape_control(&s), s.as_str());
        }
    }
}
