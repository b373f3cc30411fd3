//! Pattern matching primitives behind permission rules: Bash command patterns,
//! gitignore-style path globs, lexical path normalisation and URL hosts.
//!
//! Everything here is pure and synchronous: no file-system access (paths are
//! normalised lexically; symlinks are the sandbox's business), no allocation
//! proportional to anything but the inputs, and no panics on any input.

use std::path::{Component, Path, PathBuf};

/// Separates words in a command's match key (the recognizer's `SimpleCommand::match_key`):
/// a control character, which no word of an understood command holds (any such byte makes
/// the command not understood), so a space inside a quoted word (`npm 'test evil'`) never
/// reads as a word boundary.
pub const WORD_BREAK: char = '\u{1f}';

/// How a `Bash(...)` specifier matches one simple command. Both sides are match keys
/// (the recognizer's `SimpleCommand::match_key`: words joined by [`WORD_BREAK`]), so every
/// boundary below is a boundary between two words of the command as it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BashPattern {
    /// `Bash(git status)`: the whole command, exactly (the same words).
    Exact(String),
    /// `Bash(npm run test:*)` (Claude Code's legacy form of `Bash(npm run test *)`): the
    /// command's first words are the prefix's words, followed by nothing or by more words.
    /// Word boundary: `npm test:*` matches neither `npm testx`, `npm test-evil`, `npm tests`
    /// nor `npm test:evil` (another npm script), nor `npm 'test evil'` (one argument).
    Prefix(String),
    /// `Bash(npm run *)`, `Bash(git * main)`: `*` matches any run of characters (word
    /// breaks included) within one simple command; every other character, and every word
    /// break of the pattern, matches itself. A single trailing ` *` is optional, so
    /// `Bash(ls *)` matches `ls` and `ls -la` but never `lsof`.
    Glob(String),
}

impl BashPattern {
    /// Does the pattern match this simple command's match key?
    pub fn matches(&self, key: &str) -> bool {
        match self {
            BashPattern::Exact(p) => key == p,
            BashPattern::Prefix(p) => {
                key == p || key.strip_prefix(p.as_str()).is_some_and(|rest| rest.starts_with(WORD_BREAK))
            }
            BashPattern::Glob(p) => {
                if let Some(base) = p.strip_suffix(OPTIONAL_TAIL)
                    && !base.contains('*')
                    && key == base
                {
                    return true;
                }
                wildcard_match(p.as_bytes(), key.as_bytes())
            }
        }
    }
}

impl BashPattern {
    /// Could the pattern match some command whose match key starts with `fixed` and
    /// continues with anything (the part of a command computed at run time)? Used for
    /// deny and ask rules only, so erring towards `true` is the safe side.
    pub fn could_match_after(&self, fixed: &str) -> bool {
        match self {
            BashPattern::Exact(p) => p.starts_with(fixed),
            BashPattern::Prefix(p) => {
                p.starts_with(fixed) || fixed.strip_prefix(p.as_str()).is_some_and(|rest| rest.starts_with(WORD_BREAK))
            }
            // The whole of `fixed` consumed, the rest of the pattern can always be completed.
            BashPattern::Glob(p) => wildcard_consume(p.as_bytes(), fixed.as_bytes()),
        }
    }
}

/// A word break then `*`: the optional last word of a glob (`Bash(ls *)`).
const OPTIONAL_TAIL: &str = "\u{1f}*";

/// `*` matches any byte sequence; every other byte matches itself; a word break, `*` and a
/// word break match a single word break too (the `*` then stands for no words at all:
/// `Bash(aha * > *)` matches `aha > out.html`).
fn wildcard_match(p: &[u8], t: &[u8]) -> bool {
    wildcard_states(p, t)[p.len()]
}

/// Does some run of the pattern consume all of `t`? (The rest of the pattern can always be
/// completed by some text.)
fn wildcard_consume(p: &[u8], t: &[u8]) -> bool {
    wildcard_states(p, t).contains(&true)
}

/// The pattern positions reachable once all of `t` is consumed (an NFA run over the
/// pattern: O(pattern × text), no recursion, no backtracking); `p.len() + 1` entries.
fn wildcard_states(p: &[u8], t: &[u8]) -> Vec<bool> {
    let brk = WORD_BREAK as u8;
    // Positions reachable from `i` without consuming text: past a `*`, and from a `*`
    // that sits between two word breaks to past the second break.
    let close = |s: &mut Vec<bool>| {
        for i in 0..p.len() {
            if !s[i] || p[i] != b'*' {
                continue;
            }
            s[i + 1] = true;
            if i > 0 && p[i - 1] == brk && p.get(i + 1) == Some(&brk) {
                s[i + 2] = true;
            }
        }
    };
    let mut cur = vec![false; p.len() + 1];
    cur[0] = true;
    close(&mut cur);
    for &c in t {
        let mut next = vec![false; p.len() + 1];
        for i in (0..p.len()).filter(|&i| cur[i]) {
            if p[i] == b'*' {
                next[i] = true;
            } else if p[i] == c {
                next[i + 1] = true;
            }
        }
        close(&mut next);
        if !next.contains(&true) {
            return next;
        }
        cur = next;
    }
    cur
}

/// Lexically normalise `path` against `base` (used when `path` is relative):
/// `.` dropped, `..` pops a component (never above `/`).
/// Returns the absolute normalised path.
pub fn normalize_path(base: &Path, path: &Path) -> PathBuf {
    let joined = if path.is_absolute() { path.to_path_buf() } else { base.join(path) };
    let mut out = PathBuf::from("/");
    for comp in joined.components() {
        match comp {
            Component::Normal(c) => out.push(c),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// A gitignore-style glob over absolute, normalised paths (`/`-separated).
///
/// `*` matches within one path segment, `?` one character of a segment,
/// `[abc]`, `[a-z]`, `[!x]` a character class, and a `**` segment any number
/// (including zero) of segments. As in gitignore, a pattern that matches a
/// directory also matches everything below it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathGlob {
    segments: Vec<String>,
}

impl PathGlob {
    /// `pattern` must be absolute; a trailing `/` means "this directory and
    /// everything in it".
    pub fn new(pattern: &str) -> PathGlob {
        let segments = pattern.split('/').filter(|s| !s.is_empty() && *s != ".").map(str::to_owned).collect();
        PathGlob { segments }
    }

    /// The pattern as an absolute path string.
    pub fn as_string(&self) -> String {
        format!("/{}", self.segments.join("/"))
    }

    /// Does the glob match `path` (absolute, normalised) or one of its
    /// ancestors?
    pub fn matches(&self, path: &Path) -> bool {
        let segs = path_segments(path);
        let pat: Vec<&str> = self.segments.iter().map(String::as_str).collect();
        (0..=segs.len()).any(|n| {
            let prefix: Vec<&str> = segs[..n].iter().map(String::as_str).collect();
            match_segments(&pat, &prefix)
        })
    }

    /// Could the glob match `root` (absolute, normalised), an ancestor of it, or any path
    /// below it? A tool that reads a whole tree (Grep, Glob, LS) reads what such a glob
    /// names when it starts at `root`: `/w/secrets/**` may match below `/w`, `/w/**/.env`
    /// below any directory of `/w`. Errs towards `true`: every segment pattern left over
    /// once `root` is consumed is assumed to match some name.
    pub fn may_match_below(&self, root: &Path) -> bool {
        if self.matches(root) {
            return true;
        }
        let pat: Vec<&str> = self.segments.iter().map(String::as_str).collect();
        // The pattern positions `root`'s segments can lead to (an NFA run; `**` takes
        // any number of segments, zero included).
        let mut states = vec![false; pat.len() + 1];
        states[0] = true;
        let close = |states: &mut Vec<bool>| {
            for i in 0..pat.len() {
                if states[i] && pat[i] == "**" {
                    states[i + 1] = true;
                }
            }
        };
        close(&mut states);
        for seg in path_segments(root) {
            let mut next = vec![false; pat.len() + 1];
            for i in (0..pat.len()).filter(|&i| states[i]) {
                if pat[i] == "**" {
                    next[i] = true;
                } else if segment_match(pat[i], &seg) {
                    next[i + 1] = true;
                }
            }
            close(&mut next);
            if !next.contains(&true) {
                return false;
            }
            states = next;
        }
        // Part of the pattern is left: some path below `root` can complete it.
        states[..pat.len()].contains(&true)
    }
}

/// The normal components of `path`, as text.
fn path_segments(path: &Path) -> Vec<String> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect()
}

fn match_segments(pat: &[&str], path: &[&str]) -> bool {
    // Dynamic programming over (pattern index, path index); no recursion.
    let (np, ns) = (pat.len(), path.len());
    let mut dp = vec![vec![false; ns + 1]; np + 1];
    dp[np][ns] = true;
    for i in (0..np).rev() {
        for j in (0..=ns).rev() {
            dp[i][j] = if pat[i] == "**" {
                dp[i + 1][j] || (j < ns && dp[i][j + 1])
            } else {
                j < ns && segment_match(pat[i], path[j]) && dp[i + 1][j + 1]
            };
        }
    }
    dp[0][0]
}

/// Glob match of one path segment: `*`, `?`, `[...]`; `\x` escapes `x`.
fn segment_match(pat: &str, text: &str) -> bool {
    let p: Vec<char> = pat.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        let step = if pi < p.len() {
            match p[pi] {
                '*' => {
                    star = Some((pi, ti));
                    pi += 1;
                    continue;
                }
                '?' => Some(pi + 1),
                '[' => class_match(&p, pi, t[ti]),
                '\\' if pi + 1 < p.len() => (p[pi + 1] == t[ti]).then_some(pi + 2),
                c => (c == t[ti]).then_some(pi + 1),
            }
        } else {
            None
        };
        match step {
            Some(next) => {
                pi = next;
                ti += 1;
            }
            None => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Match a `[...]` class starting at `p[start]`; returns the index after it.
/// An unterminated `[` matches a literal `[`.
fn class_match(p: &[char], start: usize, c: char) -> Option<usize> {
    let mut i = start + 1;
    let negate = matches!(p.get(i), Some('!' | '^'));
    if negate {
        i += 1;
    }
    let first = i;
    let mut hit = false;
    while i < p.len() && (p[i] != ']' || i == first) {
        if i + 2 < p.len() && p[i + 1] == '-' && p[i + 2] != ']' {
            hit |= p[i] <= c && c <= p[i + 2];
            i += 3;
        } else {
            hit |= p[i] == c;
            i += 1;
        }
    }
    if i >= p.len() {
        return (c == '[').then_some(start + 1);
    }
    (hit != negate).then_some(i + 1)
}

/// Does `pattern` contain glob metacharacters?
pub fn has_glob_meta(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// The host of an `http(s)://` URL, lowercased, without port, userinfo or a
/// trailing dot. `None` when the text is not such a URL.
pub fn url_host(url: &str) -> Option<String> {
    let (scheme, rest) = url.trim().split_once("://")?;
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return None;
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if let Some(v6) = host_port.strip_prefix('[') {
        v6.split_once(']')?.0
    } else {
        host_port.split(':').next().unwrap_or("")
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    (!host.is_empty()).then_some(host)
}

/// `WebFetch(domain:...)`: exact host, or `*.example.com` for any subdomain
/// (not the apex).
pub fn domain_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => host.len() > suffix.len() + 1 && host.ends_with(&format!(".{suffix}")),
        None => host == pattern,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard() {
        assert!(wildcard_match(b"git * main", b"git push origin main"));
        assert!(!wildcard_match(b"git * main", b"git push origin dev"));
        assert!(wildcard_match(b"*", b""));
        // Regression: `Bash(aha * > *)` did not match `aha > output.html` (the middle `*`
        // had to be at least one word).
        assert!(wildcard_match("aha\u{1f}*\u{1f}>\u{1f}*".as_bytes(), "aha\u{1f}>\u{1f}output.html".as_bytes()));
        assert!(wildcard_match("aha\u{1f}*\u{1f}>\u{1f}*".as_bytes(), "aha\u{1f}-x\u{1f}>\u{1f}o".as_bytes()));
        assert!(!wildcard_match("aha\u{1f}*\u{1f}>\u{1f}*".as_bytes(), "ahax\u{1f}>\u{1f}o".as_bytes()));
        assert!(wildcard_consume(b"git*main", b"git pu"));
        assert!(!wildcard_consume(b"git*main", b"gi x"));
    }

    #[test]
    fn globs() {
        let g = PathGlob::new("/w/src/**/*.rs");
        assert!(g.matches(Path::new("/w/src/a/b/c.rs")));
        assert!(g.matches(Path::new("/w/src/c.rs")));
        assert!(!g.matches(Path::new("/w/src/c.rsx")));
        assert!(PathGlob::new("/w/se[c]rets").matches(Path::new("/w/secrets/k")));
        assert!(PathGlob::new("/w/?.txt").matches(Path::new("/w/a.txt")));
        assert!(!PathGlob::new("/w/[!a].txt").matches(Path::new("/w/a.txt")));
    }

    #[test]
    fn may_match_below() {
        let below = |g: &str, root: &str| PathGlob::new(g).may_match_below(Path::new(root));
        assert!(below("/w/secrets/**", "/w"));
        assert!(below("/w/secrets/**", "/"));
        assert!(below("/w/secrets/**", "/w/secrets"));
        assert!(below("/w/secrets/**", "/w/secrets/a/b"), "inside: matches as before");
        assert!(!below("/w/secrets/**", "/w/src"));
        assert!(below("/w/**/.env", "/w/src/deep"));
        assert!(below("/w/s*/key", "/w"));
        assert!(below("/w/s*/key", "/w/src"));
        assert!(!below("/w/s*/key", "/w/docs"));
        assert!(!below("/w/a/key", "/x"));
    }

    #[test]
    fn normalise() {
        assert_eq!(normalize_path(Path::new("/w"), Path::new("./secrets/../secrets/a")), PathBuf::from("/w/secrets/a"));
        assert_eq!(normalize_path(Path::new("/w"), Path::new("../../..")), PathBuf::from("/"));
    }

    #[test]
    fn hosts() {
        assert_eq!(url_host("https://User@Example.COM.:8080/x").as_deref(), Some("example.com"));
        assert_eq!(url_host("http://[::1]:80/").as_deref(), Some("::1"));
        assert_eq!(url_host("ftp://x"), None);
        assert!(domain_matches("*.example.com", "a.example.com"));
        assert!(!domain_matches("*.example.com", "example.com"));
        assert!(!domain_matches("example.com", "evilexample.com"));
    }
}
