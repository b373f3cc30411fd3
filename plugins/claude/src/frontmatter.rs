//! Markdown files with YAML frontmatter, as Claude Code writes (and people hand-edit) them.
//!
//! [`split`] finds the frontmatter between a leading `---` line and the next line of three
//! or more dashes alone (`---`, or a longer run such as `----------` that some files close
//! with; a `---` later in the body is body text). [`parse_fields`] reads the frontmatter:
//!
//! 1. as YAML, whenever it is valid YAML and a mapping — always, whatever its keys: Claude
//!    Code reads it with a YAML parser, so a top-level `context:` or `user:` key is a key
//!    (an unknown field, warned about), never a line of the field before it;
//! 2. otherwise (only what YAML cannot parse) with a tolerant line reader: a top-level entry starts at a column-0 line
//!    `key:`, unless the key is a dialogue word or the line sits inside an `<example>` block;
//!    every other line continues the current entry. Each entry's value is read as YAML on
//!    its own when that works (so `tools: [a, b]` and `maxTurns: 5` keep their types) and as
//!    text otherwise (so `description: Use this: for that` stays whole).
//!
//! YAML anchors and aliases are never expanded: a frontmatter (or an entry) that may hold
//! one ([`may_hold_alias`]) is not given to the YAML parser at all, since a few hundred KiB
//! of aliases to a large anchor expand to billions of nodes (serde_yaml bounds alias jumps
//! only relative to the document's size). No agent file needs them. The frontmatter's size
//! is bounded by [`MAX_FRONTMATTER_BYTES`], checked by the caller before reading it.

use serde_json::{Map, Value};

/// Largest frontmatter an agent file may have: Claude Code's longest descriptions (with
/// examples) are a few KiB; the bound keeps the YAML reader's work small in a 64 MiB guest.
pub const MAX_FRONTMATTER_BYTES: usize = 256 * 1024;

/// How the frontmatter was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseMode {
    Yaml,
    Tolerant,
}

/// The frontmatter's fields, in a JSON-shaped map, and how they were read.
#[derive(Debug, Clone)]
pub struct Fields {
    pub map: Map<String, Value>,
    pub mode: ParseMode,
    /// Things a user may want to know (dropped lines, duplicate keys, ...).
    pub warnings: Vec<String>,
}

/// Why a file has no usable frontmatter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SplitError {
    /// The file does not start with a `---` line.
    Missing,
    /// A `---` line opens the frontmatter but no line of dashes closes it.
    Unterminated,
}

impl SplitError {
    pub fn describe(&self) -> &'static str {
        match self {
            Self::Missing => "no YAML frontmatter (the file must start with a `---` line)",
            Self::Unterminated => "the YAML frontmatter is not closed by a `---` line (three or more dashes alone)",
        }
    }
}

/// The frontmatter text (without the `---` lines) and the body, line endings normalised to `\n`.
pub fn split(text: &str) -> Result<(String, String), SplitError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text).replace("\r\n", "\n");
    let mut lines = text.split_inclusive('\n');
    // Blank lines before the opening `---` are tolerated.
    let mut consumed = 0;
    let opened = loop {
        match lines.next() {
            Some(line) if line.trim().is_empty() => consumed += line.len(),
            Some(line) if is_fence(line) => {
                consumed += line.len();
                break true;
            }
            _ => break false,
        }
    };
    if !opened {
        return Err(SplitError::Missing);
    }
    let start = consumed;
    for line in lines {
        if is_closing_fence(line) {
            let frontmatter = text[start..consumed].to_string();
            let body = text[consumed + line.len()..].to_string();
            return Ok((frontmatter, body));
        }
        consumed += line.len();
    }
    Err(SplitError::Unterminated)
}

fn is_fence(line: &str) -> bool {
    line.trim_end() == "---"
}

/// The line that closes a frontmatter: three or more dashes alone (trailing white space
/// allowed). Files in the wild close with longer runs (`--------`), which Claude Code reads.
fn is_closing_fence(line: &str) -> bool {
    let line = line.trim_end();
    line.len() >= 3 && line.bytes().all(|b| b == b'-')
}

/// Keys Claude Code (and tools around it) put in agent frontmatter. A column-0 line with one
/// of these always starts a new entry in the tolerant reader.
const KNOWN_KEYS: &[&str] = &[
    "name",
    "description",
    "tools",
    "disallowedTools",
    "disallowed_tools",
    "disallowed-tools",
    "allowedTools",
    "allowed-tools",
    "model",
    "color",
    "skills",
    "permissionMode",
    "permission_mode",
    "permission-mode",
    "maxTurns",
    "max_turns",
    "max-turns",
    "mcpServers",
    "mcp_servers",
    "mcp-servers",
    "egress",
    "hooks",
    "memory",
    "background",
    "effort",
    "isolation",
    "initialPrompt",
    "initial_prompt",
    "initial-prompt",
    "version",
    "author",
    "tags",
];

/// Words that start lines of example dialogue inside descriptions; never keys.
const DIALOGUE_WORDS: &[&str] =
    &["user", "assistant", "human", "ai", "claude", "context", "commentary", "example", "examples", "note", "response"];

fn is_dialogue(key: &str) -> bool {
    DIALOGUE_WORDS.iter().any(|w| w.eq_ignore_ascii_case(key))
}

/// Whether `text` may hold a YAML anchor (`&a`) or alias (`*a`): a `&` or `*` that starts
/// a node (at the start of a line's content, or after `: `, `- `, `? `, `[`, `{` or `,`)
/// and is followed by a name. Quotes are not tracked, so a quoted `: *x` counts too: a
/// false alarm only means the text is read without the YAML parser.
pub fn may_hold_alias(text: &str) -> bool {
    text.lines().any(|line| {
        let bytes = line.as_bytes();
        bytes.iter().enumerate().any(|(i, &b)| {
            if b != b'&' && b != b'*' {
                return false;
            }
            let named = bytes.get(i + 1).is_some_and(|n| !n.is_ascii_whitespace());
            let before = bytes[..i].iter().rposition(|c| !matches!(c, b' ' | b'\t'));
            let starts_node = match before {
                None => true,
                Some(j) => {
                    matches!(bytes[j], b'[' | b'{' | b',') || (j < i - 1 && matches!(bytes[j], b':' | b'-' | b'?'))
                }
            };
            named && starts_node
        })
    })
}

/// The YAML value of `text`, unless it may hold an anchor or alias ([`may_hold_alias`]).
fn yaml_value(text: &str) -> Result<serde_yaml::Value, String> {
    if may_hold_alias(text) {
        return Err("it may use YAML anchors or aliases, which agent files may not".into());
    }
    serde_yaml::from_str::<serde_yaml::Value>(text).map_err(|e| format!("it is not valid YAML ({e})"))
}

/// Reads the frontmatter's fields (see the module docs for the rules).
pub fn parse_fields(frontmatter: &str) -> Fields {
    match yaml_value(frontmatter) {
        Ok(serde_yaml::Value::Null) if frontmatter.trim().is_empty() => {
            Fields { map: Map::new(), mode: ParseMode::Yaml, warnings: Vec::new() }
        }
        Ok(serde_yaml::Value::Mapping(mapping)) => {
            let mut map = Map::new();
            for (key, value) in mapping {
                map.insert(key_text(&key), yaml_to_json(value));
            }
            // Valid YAML is read as YAML, as Claude Code reads it: a key that looks like a
            // line of example dialogue is still a key (its unknown-field warning says so).
            Fields { map, mode: ParseMode::Yaml, warnings: Vec::new() }
        }
        Ok(_) => tolerant(frontmatter, "it is not a mapping"),
        Err(why) => tolerant(frontmatter, &why),
    }
}

fn tolerant(frontmatter: &str, why: &str) -> Fields {
    let mut warnings = vec![format!("frontmatter read with the tolerant reader: {why}")];
    // Entries: key and the lines that belong to it (the first one is the `key:` line).
    let mut entries: Vec<(String, Vec<&str>)> = Vec::new();
    let mut in_example = false;
    for line in frontmatter.lines() {
        let starts_entry =
            top_level_key(line).filter(|key| KNOWN_KEYS.contains(key) || (!in_example && !is_dialogue(key)));
        match starts_entry {
            Some(key) => entries.push((key.to_string(), vec![line])),
            None => match entries.last_mut() {
                Some((_, lines)) => lines.push(line),
                None if line.trim().is_empty() || line.trim_start().starts_with('#') => {}
                None => warnings.push(format!("ignored a frontmatter line before any key: {line:?}")),
            },
        }
        in_example = example_state_after(line, in_example);
    }

    let mut map = Map::new();
    for (key, lines) in entries {
        let value = entry_value(&key, &lines);
        if map.insert(key.clone(), value).is_some() {
            warnings.push(format!("frontmatter key `{key}` appears more than once; the last one wins"));
        }
    }
    Fields { map, mode: ParseMode::Tolerant, warnings }
}

/// `key` when `line` is `key:` or `key: value` at column 0, with a plain identifier key.
fn top_level_key(line: &str) -> Option<&str> {
    let (key, rest) = line.split_once(':')?;
    let valid = !key.is_empty()
        && key.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    (valid && (rest.is_empty() || rest.starts_with([' ', '\t']))).then_some(key)
}

/// Whether an `<example>` block is open after `line` (the last tag on the line wins).
fn example_state_after(line: &str, open: bool) -> bool {
    let lower = line.to_ascii_lowercase();
    let last_open = lower.rfind("<example>");
    let last_close = lower.rfind("</example>");
    match (last_open, last_close) {
        (None, None) => open,
        (Some(_), None) => true,
        (None, Some(_)) => false,
        (Some(o), Some(c)) => o > c,
    }
}

/// One entry's value: YAML when the entry parses on its own, text otherwise.
fn entry_value(key: &str, lines: &[&str]) -> Value {
    let snippet = lines.join("\n");
    if let Ok(serde_yaml::Value::Mapping(mapping)) = yaml_value(&snippet)
        && mapping.len() == 1
        && let Some((_, value)) = mapping.into_iter().next()
    {
        return yaml_to_json(value);
    }
    let first = lines[0][key.len() + 1..].trim();
    let rest = &lines[1..];
    if is_block_indicator(first) {
        return Value::String(block_scalar(first, rest));
    }
    let mut parts: Vec<&str> = Vec::with_capacity(lines.len());
    if !first.is_empty() {
        parts.push(first);
    }
    parts.extend(rest.iter().map(|l| l.trim()));
    // Trailing blank lines belong to nobody.
    while parts.last().is_some_and(|p| p.is_empty()) {
        parts.pop();
    }
    if parts.is_empty() {
        return Value::Null;
    }
    Value::String(unquote(&parts.join("\n")))
}

fn is_block_indicator(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some('|' | '>')) && chars.all(|c| matches!(c, '-' | '+' | '0'..='9'))
}

/// A line's indentation: its leading ASCII spaces and tabs, in bytes (YAML indents with
/// those only; other Unicode white space is content, and counting it in bytes would cut a
/// character in two).
fn indentation(line: &str) -> usize {
    line.bytes().take_while(|b| matches!(b, b' ' | b'\t')).count()
}

/// A `|` or `>` block scalar, read leniently: the continuation lines dedented by their
/// smallest indentation; `>` folds lines into spaces (blank lines stay line breaks).
fn block_scalar(indicator: &str, lines: &[&str]) -> String {
    let indent = lines.iter().filter(|l| !l.trim().is_empty()).map(|l| indentation(l)).min().unwrap_or(0);
    // At most `indent` bytes of indentation come off each line, and only ASCII ones: the
    // cut is always on a character boundary.
    let dedented: Vec<&str> = lines.iter().map(|l| &l[indentation(l).min(indent)..]).collect();
    let text = if indicator.starts_with('|') {
        dedented.join("\n")
    } else {
        let mut out = String::new();
        for line in dedented {
            if line.trim().is_empty() {
                out.push('\n');
            } else {
                if !out.is_empty() && !out.ends_with('\n') {
                    out.push(' ');
                }
                out.push_str(line.trim_end());
            }
        }
        out
    };
    text.trim().to_string()
}

/// Strips one pair of matching outer quotes; `"…"` also gets the common escapes undone.
fn unquote(s: &str) -> String {
    let s = s.trim();
    if s.len() >= 2 && s.starts_with('"') && s.ends_with('"') {
        let inner = &s[1..s.len() - 1];
        let mut out = String::with_capacity(inner.len());
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            if c != '\\' {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('"') => out.push('"'),
                Some('\\') => out.push('\\'),
                Some(other) => {
                    out.push('\\');
                    out.push(other);
                }
                None => out.push('\\'),
            }
        }
        out
    } else if s.len() >= 2 && s.starts_with('\'') && s.ends_with('\'') {
        s[1..s.len() - 1].replace("''", "'")
    } else {
        s.to_string()
    }
}

/// A YAML map key as text.
fn key_text(key: &serde_yaml::Value) -> String {
    match key {
        serde_yaml::Value::String(s) => s.clone(),
        other => serde_yaml::to_string(other).unwrap_or_default().trim().to_string(),
    }
}

/// YAML → JSON: tags are dropped, non-string keys become text, non-finite floats text.
pub fn yaml_to_json(value: serde_yaml::Value) -> Value {
    use serde_yaml::Value as Y;
    match value {
        Y::Null => Value::Null,
        Y::Bool(b) => Value::Bool(b),
        Y::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                let f = n.as_f64().unwrap_or(f64::NAN);
                serde_json::Number::from_f64(f).map(Value::Number).unwrap_or_else(|| Value::String(n.to_string()))
            }
        }
        Y::String(s) => Value::String(s),
        Y::Sequence(items) => Value::Array(items.into_iter().map(yaml_to_json).collect()),
        Y::Mapping(mapping) => {
            Value::Object(mapping.into_iter().map(|(k, v)| (key_text(&k), yaml_to_json(v))).collect())
        }
        Y::Tagged(tagged) => yaml_to_json(tagged.value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_finds_frontmatter_and_keeps_later_fences_in_the_body() {
        let (fm, body) = split("---\nname: a\n---\nintro\n---\nmore\n").unwrap();
        assert_eq!(fm, "name: a\n");
        assert_eq!(body, "intro\n---\nmore\n");
    }

    #[test]
    fn split_handles_crlf_bom_and_leading_blank_lines() {
        let (fm, body) = split("\u{feff}\r\n---\r\nname: a\r\n---  \r\nbody\r\n").unwrap();
        assert_eq!(fm, "name: a\n");
        assert_eq!(body, "body\n");
    }

    /// Files closed by a longer run of dashes (`----------`) were "not closed" although
    /// Claude Code reads them (and warden read them before the closer became exact).
    #[test]
    fn regression_a_frontmatter_closed_by_a_longer_run_of_dashes_was_not_closed() {
        let (fm, body) = split("---\nname: a\ndescription: d\n--------------------\nBody.\n---\nmore\n").unwrap();
        assert_eq!(fm, "name: a\ndescription: d\n");
        assert_eq!(body, "Body.\n---\nmore\n");
        let (fm, _) = split("---\nname: a\n----  \nBody.\n").unwrap();
        assert_eq!(fm, "name: a\n");
        assert_eq!(split("---\nname: a\n-- \n- x\n"), Err(SplitError::Unterminated), "two dashes close nothing");
        assert_eq!(split("---\nname: a\n--- x\n"), Err(SplitError::Unterminated), "dashes alone only");
    }

    #[test]
    fn split_reports_missing_and_unterminated_frontmatter() {
        assert_eq!(split("# Title\nname: a\n"), Err(SplitError::Missing));
        assert_eq!(split(""), Err(SplitError::Missing));
        assert_eq!(split("---\nname: a\n"), Err(SplitError::Unterminated));
    }

    #[test]
    fn empty_frontmatter_is_an_empty_map() {
        let (fm, _) = split("---\n---\nbody").unwrap();
        let fields = parse_fields(&fm);
        assert!(fields.map.is_empty());
        assert_eq!(fields.mode, ParseMode::Yaml);
    }

    #[test]
    fn valid_yaml_is_read_as_yaml() {
        let fields = parse_fields("name: a\ndescription: >-\n  folded\n  text\ntools: [Read, Grep]\nmaxTurns: 3\n");
        assert_eq!(fields.mode, ParseMode::Yaml);
        assert_eq!(fields.map["description"], "folded text");
        assert_eq!(fields.map["tools"], serde_json::json!(["Read", "Grep"]));
        assert_eq!(fields.map["maxTurns"], 3);
    }

    #[test]
    fn unquoted_colons_fall_back_to_the_tolerant_reader() {
        let fields = parse_fields(
            "name: reviewer\ndescription: Use this agent for reviews. Examples: <example>Context: a PR</example>\nmodel: sonnet\n",
        );
        assert_eq!(fields.mode, ParseMode::Tolerant);
        assert_eq!(fields.map["name"], "reviewer");
        assert_eq!(fields.map["description"], "Use this agent for reviews. Examples: <example>Context: a PR</example>");
        assert_eq!(fields.map["model"], "sonnet");
    }

    #[test]
    fn generator_style_one_line_description_with_escaped_newlines() {
        // The shape Claude Code's agent generator writes: one long unquoted line with
        // literal `\n`, `Context:` and `user: "…"` inside; invalid YAML.
        let fm = "name: code-reviewer\ndescription: Use this agent after writing code. Examples:\\n\\n<example>\\nContext: The user added a function.\\nuser: \"Please review it\"\\nassistant: \"I'll use the code-reviewer agent\"\\n</example>\ntools: Glob, Grep, Read\nmodel: sonnet\ncolor: red\n";
        let fields = parse_fields(fm);
        assert_eq!(fields.mode, ParseMode::Tolerant);
        let description = fields.map["description"].as_str().unwrap();
        assert!(description.starts_with("Use this agent after writing code. Examples:\\n\\n<example>"));
        assert!(description.ends_with("</example>"), "{description}");
        assert_eq!(fields.map["tools"], "Glob, Grep, Read");
        assert_eq!(fields.map["model"], "sonnet");
        assert_eq!(fields.map["color"], "red");
    }

    #[test]
    fn multi_line_examples_with_dialogue_lines_stay_in_the_description() {
        let fm = "name: helper\ndescription: Use this agent when code was written.\n<example>\nContext: The user wrote code.\nuser: \"Please review it\"\nassistant: \"I'll use the helper agent\"\n</example>\ntools: Read, Grep\n";
        let fields = parse_fields(fm);
        assert_eq!(fields.mode, ParseMode::Tolerant);
        let description = fields.map["description"].as_str().unwrap();
        assert!(description.starts_with("Use this agent when code was written.\n<example>"));
        assert!(description.contains("user: \"Please review it\""));
        assert!(description.ends_with("</example>"));
        assert_eq!(fields.map["tools"], "Read, Grep");
        assert!(!fields.map.contains_key("user"));
    }

    /// Valid YAML with a top-level key from the example-dialogue words (`context`, `user`,
    /// …) went to the tolerant reader, which glued that key's lines onto the field before
    /// it: `context: fork` after a `tools:` list became a tool named "context: fork".
    #[test]
    fn regression_valid_yaml_with_a_dialogue_word_key_was_read_by_the_tolerant_reader() {
        let fm = "name: forked\ndescription: Runs in a fork\ntools:\n  - Read\n  - Grep\ncontext: fork\n";
        let fields = parse_fields(fm);
        assert_eq!(fields.mode, ParseMode::Yaml);
        assert_eq!(fields.map["tools"], serde_json::json!(["Read", "Grep"]));
        assert_eq!(fields.map["context"], "fork");
        let fields = parse_fields("name: a\ndescription: Reviews code, e.g.\nuser: \"review this\"\nmodel: haiku\n");
        assert_eq!(fields.mode, ParseMode::Yaml);
        assert_eq!(fields.map["description"], "Reviews code, e.g.");
        assert_eq!(fields.map["user"], "review this");
        assert_eq!(fields.map["model"], "haiku");
        for word in DIALOGUE_WORDS {
            let fields = parse_fields(&format!("name: a\ntools: [Read]\n{word}: x\n"));
            assert_eq!(fields.mode, ParseMode::Yaml, "{word}");
            assert_eq!(fields.map["tools"], serde_json::json!(["Read"]), "{word}");
        }
    }

    #[test]
    fn tolerant_reader_keeps_unknown_keys_lists_and_block_scalars() {
        let fm = "name: x\ndescription: |\n  line one: with colon\n  line two\ntools:\n  - Read\n  - Bash\ncolor: blue\nnote-to-self: a: b\n";
        let fields = parse_fields(fm);
        assert_eq!(fields.mode, ParseMode::Tolerant);
        assert_eq!(fields.map["description"], "line one: with colon\nline two");
        assert_eq!(fields.map["tools"], serde_json::json!(["Read", "Bash"]));
        assert_eq!(fields.map["color"], "blue");
        assert_eq!(fields.map["note-to-self"], "a: b");
    }

    #[test]
    fn tolerant_reader_unquotes_broken_quoted_descriptions() {
        let fields = parse_fields("name: q\ndescription: \"Say \\\"hi\\\": then stop\" extra\nmodel: opus\n");
        assert_eq!(fields.mode, ParseMode::Tolerant);
        assert_eq!(fields.map["description"], "\"Say \\\"hi\\\": then stop\" extra");
        // A quoted scalar over several lines is valid YAML: its line break folds to a space.
        let fields = parse_fields("name: q\ndescription: \"Use when: a\nuser: b\"\n");
        assert_eq!(fields.mode, ParseMode::Yaml);
        assert_eq!(fields.map["description"], "Use when: a user: b");
    }

    #[test]
    fn duplicate_keys_warn_and_the_last_wins() {
        let fields = parse_fields("name: a\nname: b\n");
        assert_eq!(fields.mode, ParseMode::Tolerant);
        assert_eq!(fields.map["name"], "b");
        assert!(fields.warnings.iter().any(|w| w.contains("more than once")));
    }

    /// A block scalar's indentation was measured in bytes of Unicode white space and the
    /// lines cut there: a line of U+3000 (ideographic space) under a `|` entry read by the
    /// tolerant reader panicked the guest ("byte index 2 is not a char boundary").
    #[test]
    fn regression_unicode_white_space_in_a_block_scalar_panicked() {
        // `x: a: b` is not YAML: the tolerant reader reads the rest.
        let fields = parse_fields("x: a: b\ndescription: |\n  a\n\u{3000}\n  b\n");
        assert_eq!(fields.mode, ParseMode::Tolerant);
        assert_eq!(fields.map["description"], "a\n\u{3000}\nb");
        let fields = parse_fields("x: a: b\ndescription: >\n  \u{3000}\n\u{3000}\u{3000}a\n \u{a0}b\n");
        assert!(fields.map["description"].as_str().unwrap().ends_with("a  \u{a0}b"), "{:?}", fields.map);
    }

    /// `a: &x [0, 0, …]` and `b: [*x, *x, …]` in a few MiB stayed under serde_yaml's alias
    /// limit and expanded to ~10^11 nodes: the guest trapped after burning its CPU. Anchors
    /// and aliases never reach the YAML parser, in the whole frontmatter or in one entry.
    #[test]
    fn regression_yaml_aliases_amplified_a_small_frontmatter() {
        let anchor = vec!["0"; 2000].join(", ");
        let aliases = vec!["*x"; 2000].join(", ");
        for fm in [
            format!("name: a\nbig: &x [{anchor}]\nmany: [{aliases}]\n"),
            format!("name: a\nuser: x\nbig: {{a: &x [{anchor}], b: [{aliases}]}}\n"),
            "name: a\nbig: &x\n  - 0\nmany:\n  - *x\n".to_string(),
        ] {
            let fields = parse_fields(&fm);
            assert_eq!(fields.mode, ParseMode::Tolerant, "{}", &fm[..40]);
            assert!(fields.warnings[0].contains("anchors or aliases"), "{:?}", fields.warnings);
            for v in fields.map.values() {
                assert!(v.is_string() || v.is_null(), "an entry was read as YAML: {v}");
            }
        }
    }

    #[test]
    fn anchor_and_alias_detection() {
        for yes in ["a: &x 1", "a: *x", "- *x", "[*x]", "{a: *x}", "a: [1,*x]", "&x a: 1", "  *x", "? *x"] {
            assert!(may_hold_alias(yes), "{yes}");
        }
        for no in ["a: R&D", "a: 2*3", "- * item", "a: b & c", "a: \"x\"", "a:*x", "tools: Read, Grep"] {
            assert!(!may_hold_alias(no), "{no}");
        }
    }

    mod arbitrary {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Whatever the frontmatter holds (any Unicode, block scalars, white space of
            /// every kind), reading it never panics.
            #[test]
            fn reading_any_frontmatter_never_panics(
                lines in prop::collection::vec(
                    prop_oneof![
                        any::<String>(),
                        "[ \t\u{a0}\u{3000}\u{2028}\u{85}]{0,4}[a-z|>:&*\u{3000}é-]{0,6}",
                        prop::sample::select(vec!["description: |", "description: >-", "user: x", "  a", "\u{3000}"])
                            .prop_map(str::to_string),
                    ],
                    0..12,
                ),
            ) {
                let fm = lines.join("\n");
                let _ = parse_fields(&fm);
                let _ = split(&format!("---\n{fm}\n---\nbody"));
            }
        }
    }

    #[test]
    fn example_tags_are_tracked_per_line() {
        assert!(example_state_after("<example>", false));
        assert!(!example_state_after("<example>x</example>", false));
        assert!(!example_state_after("</example>", true));
        assert!(example_state_after("text", true));
        assert!(example_state_after("</example> then <example>", true));
    }
}
