//! The one scrubber: every way a `tool_context` secret could leave warden goes through
//! a [`Redactor`].
//!
//! A task's `tool_context` values are secrets: each goes only where its entry says
//! (`crate::tool_context`), and nothing else. [`SecretRegistry::remember`] records them for the task's
//! session (user id + session id) — a session remembers every secret given to any of its
//! tasks, so a later task of the session is scrubbed of them too. Text is scrubbed with
//! the secrets of whose it is ([`SecretRegistry::owner`]): a session's with the session's
//! secrets and the host's, text of no session with the host's only.
//!
//! The operator's text — log lines (`crate::logging`) and the audit log's free-text
//! fields — is the host's, not a tenant's: a tenant value may rewrite it only where it
//! could be a secret and never where it is a word. So it is scrubbed with
//! [`SecretRegistry::operator`]: the host's secrets and, of its owner session, only the
//! values [`fit_for_operator_text`] (at least [`MIN_OPERATOR_SECRET_BYTES`], not made of
//! letters, `_` and `-` alone, not part of the session's own user or session id); text
//! of no known session with [`SecretRegistry::operator_union`], the host's secrets and
//! every session's fit values. A tenant that passes `task_`, `session`, `Bash` or its own
//! name as a `tool_context` value therefore blanks none of them from any operator's line,
//! its own included; those values are still scrubbed from everything the tenant, its
//! plugins and its models read, and from every line a plugin writes to the log: plugin
//! text is the task's, scrubbed with the session's whole [`Redactor`] at the `log`
//! import before it becomes a record, whatever the values look like.
//!
//! Where text leaves, it is scrubbed with the session's [`Redactor`]: task events (the
//! engine, before they are kept or stored), outputs, errors and task records, SSE frames
//! and HTTP bodies (again on the way out, so a secret learned later is scrubbed from
//! older records too), pending approvals, downloaded files, tool results before a
//! plugin (and its model) reads them, the errors imports return to a plugin, plugin state
//! (key and value, at the `state` import), a plugin's events and log lines (at their
//! imports) and the audit log's free-text fields. A plugin's outgoing HTTP request that
//! holds one ([`Redactor::finds`]) is refused rather than scrubbed.
//!
//! Streamed text (`token`, `reasoning`) goes through a [`StreamScrubber`], which always
//! holds back the last (longest secret − 1) bytes, so a secret split over chunks is
//! caught — always, not only when the tail could still grow into a secret: where a
//! stream's events end must not tell which text starts a secret.
//!
//! What a secret is matched as: its exact bytes, its JSON-escaped form and its Rust
//! `Debug`-escaped form (how `tracing` prints `?` fields). Encodings (base64, hex,
//! URL-encoding) of a secret are not recognised. Values shorter than
//! [`MIN_SECRET_BYTES`] are not scrubbed (they would match everywhere).
//!
//! Secrets are kept in memory only, never on disk, in clear or hashed: after a restart
//! the host no longer knows a session's earlier secrets, and a client must pass them
//! again in the next task's `tool_context` for that task to be scrubbed of them.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use aho_corasick::{AhoCorasick, MatchKind};
use serde_json::Value;

/// A `tool_context` key as an environment variable name: upper-cased, every character
/// outside `[A-Z0-9_]` replaced by `_`, a leading digit prefixed with `_`.
pub fn env_name(key: &str) -> String {
    let mut s: String = key
        .chars()
        .map(|c| c.to_ascii_uppercase())
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
        .collect();
    if s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    s
}

/// What a scrubbed secret reads as.
pub const REDACTED: &str = "[redacted]";
/// Secrets shorter than this are not scrubbed: they would match everywhere, and
/// `tool_context` values are tokens and keys, far longer.
pub const MIN_SECRET_BYTES: usize = 4;
/// Tenant values shorter than this never rewrite operator text (log lines, audit fields):
/// short values match words and ids of the host's own text (`task_`, `Bash`, a user
/// name), while tokens, keys and passwords are longer.
pub const MIN_OPERATOR_SECRET_BYTES: usize = 8;
/// Longest `tool_context` value accepted: a PEM private key fits; longer values would
/// make every stream hold back that much text.
pub const MAX_SECRET_BYTES: usize = 4096;
/// Most secrets one session may hold: a deployment passes a handful of tokens per task.
pub const MAX_SESSION_SECRETS: usize = 256;
/// Most secret bytes the whole host holds (every session): bounds memory and the size of
/// the log scrubber's automaton. Beyond it, tasks with new secrets are refused until the
/// host restarts (secrets are never forgotten while the host runs: forgetting one would
/// let it out).
pub const MAX_TOTAL_SECRET_BYTES: usize = 4 * 1024 * 1024;
/// Most secret bytes one user's sessions hold together: an eighth of the host's, so no
/// one tenant can fill [`MAX_TOTAL_SECRET_BYTES`] (which only a restart empties) and
/// refuse every other tenant's secrets.
pub const MAX_USER_SECRET_BYTES: usize = MAX_TOTAL_SECRET_BYTES / 8;
const _: () = assert!(MAX_USER_SECRET_BYTES < MAX_TOTAL_SECRET_BYTES / 2, "one user must not fill the host's budget");
/// Scrub passes over one text: a replacement next to other text can, in theory, form a
/// secret again; after this many passes the whole text is withheld.
const MAX_PASSES: usize = 4;

/// Why secrets could not be remembered (the task is refused).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("a tool_context value of {0} bytes exceeds the limit of {MAX_SECRET_BYTES} bytes")]
    TooLong(usize),
    #[error("a tool_context value must not be part of the redaction marker {REDACTED:?}")]
    LooksLikeMarker,
    #[error("this session already holds the maximum of {MAX_SESSION_SECRETS} secrets")]
    SessionFull,
    #[error(
        "this host holds the maximum of {MAX_TOTAL_SECRET_BYTES} bytes of secrets; it forgets them only on restart"
    )]
    HostFull,
    #[error(
        "this user's sessions hold the maximum of {MAX_USER_SECRET_BYTES} bytes of secrets; the host forgets them only on restart"
    )]
    UserFull,
    #[error("secrets cannot be compiled for scrubbing: {0}")]
    Build(String),
}

/// Whether a `tool_context` value of the session `(user_id, session_id)` may rewrite
/// operator text (see the module documentation): at least [`MIN_OPERATOR_SECRET_BYTES`],
/// with a character other than an ASCII letter, `_` or `-` (a digit, punctuation, a
/// space, anything non-ASCII: every token and key has one, an identifier or a word has
/// none), and not part of the session's own user id or session id (a tenant must not
/// blank its own name out of the lines about it).
pub fn fit_for_operator_text(value: &str, user_id: &str, session_id: &str) -> bool {
    value.len() >= MIN_OPERATOR_SECRET_BYTES
        && value.chars().any(|c| !(c.is_ascii_alphabetic() || c == '_' || c == '-'))
        && !user_id.contains(value)
        && !session_id.contains(value)
}

/// The forms a secret is matched in: raw, JSON-escaped and `Debug`-escaped.
fn forms(secret: &str) -> impl Iterator<Item = String> {
    let json = serde_json::to_string(secret).unwrap_or_default();
    let json = json.get(1..json.len().saturating_sub(1)).unwrap_or_default().to_owned();
    let debug = format!("{secret:?}");
    let debug = debug.get(1..debug.len().saturating_sub(1)).unwrap_or_default().to_owned();
    [secret.to_owned(), json, debug].into_iter().filter(|f| f.len() >= MIN_SECRET_BYTES)
}

/// A compiled secret set.
#[derive(Default)]
struct Matcher {
    ac: Option<AhoCorasick>,
    longest: usize,
    /// Whether a pattern holds a newline (a PEM key): if none does, no secret spans one.
    newline_in_a_secret: bool,
}

impl Matcher {
    fn build(secrets: &BTreeSet<String>) -> Result<Matcher, SecretError> {
        let patterns: BTreeSet<Vec<u8>> = secrets.iter().flat_map(|s| forms(s)).map(String::into_bytes).collect();
        if patterns.is_empty() {
            return Ok(Matcher::default());
        }
        let ac = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&patterns)
            .map_err(|e| SecretError::Build(e.to_string()))?;
        let longest = patterns.iter().map(Vec::len).max().unwrap_or(0);
        let newline_in_a_secret = patterns.iter().any(|p| p.contains(&b'\n'));
        Ok(Matcher { ac: Some(ac), longest, newline_in_a_secret })
    }

    fn scrub<'t>(&self, text: &'t [u8]) -> Cow<'t, [u8]> {
        let Some(ac) = &self.ac else { return Cow::Borrowed(text) };
        if !ac.is_match(text) {
            return Cow::Borrowed(text);
        }
        let mut cur = text.to_vec();
        for _ in 0..MAX_PASSES {
            let mut out = Vec::with_capacity(cur.len());
            let mut last = 0;
            for m in ac.find_iter(&cur) {
                out.extend_from_slice(&cur[last..m.start()]);
                out.extend_from_slice(REDACTED.as_bytes());
                last = m.end();
            }
            out.extend_from_slice(&cur[last..]);
            if !ac.is_match(&out) {
                return Cow::Owned(out);
            }
            cur = out;
        }
        Cow::Owned(REDACTED.as_bytes().to_vec())
    }

    /// Where streamed `text` may be cut: everything before can be emitted (scrubbed)
    /// now, the rest must wait for more text. The cut is moved forward to the nearest
    /// position `boundary` accepts (a character boundary of text; any byte of a body).
    ///
    /// Where it falls depends on the text's length and on complete matches only, never
    /// on whether the text *starts* a secret: a cut that held back exactly the tails that
    /// could still grow into a secret would tell a reader of the stream (a tenant asking
    /// its model to echo guesses, a plugin reading a server that echoes its request)
    /// which guesses are prefixes of a secret, one character at a time. So the last
    /// (longest form − 1) bytes are always held: every position before the cut has at
    /// least `longest` bytes after it, so whether a secret starts there is already
    /// decided, and a complete match straddling the cut is emitted whole (it reads as
    /// [`REDACTED`] anyway). When no secret holds a newline, everything up to the last
    /// newline is decided too (no match spans one), so a line — an SSE event, a line of
    /// model text — is never held waiting for the next; that tells a reader one bit per
    /// secret set (whether some secret holds a newline), never which text starts one.
    fn stream_cut(&self, text: &[u8], boundary: impl Fn(usize) -> bool) -> usize {
        let Some(ac) = &self.ac else { return text.len() };
        let mut cut = text.len().saturating_sub(self.longest.saturating_sub(1));
        if !self.newline_in_a_secret
            && let Some(newline) = text.iter().rposition(|&b| b == b'\n')
        {
            cut = cut.max(newline + 1);
        }
        for m in ac.find_iter(text) {
            if m.start() >= cut {
                break;
            }
            cut = cut.max(m.end());
        }
        // No pattern starts inside a character (patterns are whole UTF-8 strings), so
        // the bytes up to the next character boundary are decided too.
        (cut..=text.len()).find(|&i| boundary(i)).unwrap_or(text.len())
    }
}

/// A set of secrets and the scrubber compiled from it. It only grows. Cheap to read
/// from many threads; adding recompiles.
#[derive(Default)]
pub struct Redactor {
    secrets: Mutex<BTreeSet<String>>,
    matcher: RwLock<Arc<Matcher>>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor").field("secrets", &self.len()).finish_non_exhaustive()
    }
}

impl Redactor {
    pub fn new() -> Self {
        Self::default()
    }

    /// A redactor of `secrets` (tests, one-off scrubs of a refused request).
    pub fn with_secrets<'a>(secrets: impl IntoIterator<Item = &'a str>) -> Self {
        let r = Redactor::new();
        let set: BTreeSet<String> =
            secrets.into_iter().filter(|s| s.len() >= MIN_SECRET_BYTES).map(str::to_owned).collect();
        if let Ok(m) = Matcher::build(&set) {
            *r.matcher.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(m);
            *r.secrets.lock().unwrap_or_else(|p| p.into_inner()) = set;
        }
        r
    }

    /// The secrets held (to seed another redactor with them).
    fn secrets(&self) -> Vec<String> {
        self.secrets.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect()
    }

    /// Number of secrets held.
    pub fn len(&self) -> usize {
        self.secrets.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Length of the longest form of any secret held.
    pub fn longest(&self) -> usize {
        self.matcher().longest
    }

    fn matcher(&self) -> Arc<Matcher> {
        self.matcher.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Adds `secrets` (those of at least [`MIN_SECRET_BYTES`]); at most `cap` secrets in
    /// all. Returns the bytes of the secrets that were new.
    fn add(&self, secrets: &[&str], cap: usize) -> Result<usize, SecretError> {
        self.add_counting(secrets, cap, 0)
    }

    /// [`Redactor::add`] where `exempt` of the held secrets do not count against `cap`
    /// (a session's copy of the host's own secrets).
    fn add_counting(&self, secrets: &[&str], cap: usize, exempt: usize) -> Result<usize, SecretError> {
        let mut held = self.secrets.lock().unwrap_or_else(|p| p.into_inner());
        let new: BTreeSet<String> = secrets
            .iter()
            .filter(|s| s.len() >= MIN_SECRET_BYTES && !held.contains(**s))
            .map(|s| (*s).to_owned())
            .collect();
        if new.is_empty() {
            return Ok(0);
        }
        if held.len().saturating_sub(exempt) + new.len() > cap {
            return Err(SecretError::SessionFull);
        }
        let mut all = held.clone();
        all.extend(new.iter().cloned());
        let m = Matcher::build(&all)?;
        *self.matcher.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(m);
        *held = all;
        Ok(new.iter().map(String::len).sum())
    }

    /// `text` with every secret replaced by [`REDACTED`].
    pub fn scrub<'t>(&self, text: &'t str) -> Cow<'t, str> {
        match self.matcher().scrub(text.as_bytes()) {
            Cow::Borrowed(_) => Cow::Borrowed(text),
            // Patterns are whole UTF-8 strings, so matches fall on character boundaries.
            Cow::Owned(b) => {
                Cow::Owned(String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
            }
        }
    }

    /// Whether `bytes` hold any secret, in any form matched ([`forms`]): what a plugin's
    /// outgoing request is refused for.
    pub fn finds(&self, bytes: &[u8]) -> bool {
        self.matcher().ac.as_ref().is_some_and(|ac| ac.is_match(bytes))
    }

    /// Bytes with every secret replaced by [`REDACTED`] (files, log lines).
    pub fn scrub_bytes<'t>(&self, bytes: &'t [u8]) -> Cow<'t, [u8]> {
        self.matcher().scrub(bytes)
    }

    /// Scrubs every string and object key in `v`.
    pub fn scrub_value(&self, v: &mut Value) {
        let m = self.matcher();
        if m.ac.is_some() {
            scrub_value_with(&m, v);
        }
    }

    /// A scrubbed copy of `v`.
    pub fn scrubbed(&self, v: &Value) -> Value {
        let mut v = v.clone();
        self.scrub_value(&mut v);
        v
    }
}

fn scrub_str(m: &Matcher, s: &str) -> Option<String> {
    match m.scrub(s.as_bytes()) {
        Cow::Borrowed(_) => None,
        Cow::Owned(b) => {
            Some(String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
        }
    }
}

fn scrub_value_with(m: &Matcher, v: &mut Value) {
    match v {
        Value::String(s) => {
            if let Some(t) = scrub_str(m, s) {
                *s = t;
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| scrub_value_with(m, x)),
        Value::Object(map) => {
            if map.keys().any(|k| scrub_str(m, k).is_some()) {
                let old = std::mem::take(map);
                for (k, val) in old {
                    map.insert(scrub_str(m, &k).unwrap_or(k), val);
                }
            }
            map.values_mut().for_each(|x| scrub_value_with(m, x));
        }
        _ => {}
    }
}

/// Scrubs one stream of text that arrives in chunks (a model's `token` events): a
/// secret split over chunks is caught. Each [`StreamScrubber::push`] returns what may be
/// shown now; the last (longest secret's length − 1) bytes are held back whatever they
/// are ([`Matcher::stream_cut`]). [`StreamScrubber::finish`] returns the rest.
#[derive(Debug, Default)]
pub struct StreamScrubber {
    held: String,
}

impl StreamScrubber {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `chunk`; returns the scrubbed text that is safe to emit now (maybe empty).
    pub fn push(&mut self, redactor: &Redactor, chunk: &str) -> String {
        self.held.push_str(chunk);
        let m = redactor.matcher();
        let cut = m.stream_cut(self.held.as_bytes(), |i| self.held.is_char_boundary(i));
        let rest = self.held.split_off(cut);
        let ready = std::mem::replace(&mut self.held, rest);
        scrub_str(&m, &ready).unwrap_or(ready)
    }

    /// The held tail, scrubbed; the stream is over.
    pub fn finish(&mut self, redactor: &Redactor) -> String {
        let rest = std::mem::take(&mut self.held);
        redactor.scrub(&rest).into_owned()
    }

    /// Bytes held back right now.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

/// [`StreamScrubber`] over bytes: an HTTP response body a plugin reads in chunks, with
/// the value of the secret injected into its request ([`Redactor::with_secrets`]). A
/// secret split over chunks is caught; at most (longest form − 1) bytes are held back.
#[derive(Debug, Default)]
pub struct ByteStreamScrubber {
    held: Vec<u8>,
}

impl ByteStreamScrubber {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `chunk`; returns the scrubbed bytes that are safe to deliver now (maybe none).
    pub fn push(&mut self, redactor: &Redactor, chunk: &[u8]) -> Vec<u8> {
        self.held.extend_from_slice(chunk);
        let m = redactor.matcher();
        let cut = m.stream_cut(&self.held, |_| true);
        let rest = self.held.split_off(cut);
        let ready = std::mem::replace(&mut self.held, rest);
        m.scrub(&ready).into_owned()
    }

    /// The held tail, scrubbed; the body is over.
    pub fn finish(&mut self, redactor: &Redactor) -> Vec<u8> {
        let rest = std::mem::take(&mut self.held);
        redactor.scrub_bytes(&rest).into_owned()
    }

    /// Bytes held back right now.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

/// Every secret this process was given, per session, and what of them scrubs operator
/// text.
#[derive(Default)]
pub struct SecretRegistry {
    /// Each session's redactor: its own secrets and the host's.
    sessions: Mutex<HashMap<(String, String), Arc<Redactor>>>,
    /// Each session's redactor of operator text: its values [`fit_for_operator_text`]
    /// and the host's secrets.
    operator_sessions: Mutex<HashMap<(String, String), Arc<Redactor>>>,
    /// Secrets of the host itself, not of any session (the credentials it holds: egress
    /// proxy credentials, MCP server tokens, plugin-granted secrets, model API keys):
    /// scrubbed from every session's events, outputs and tool results, and from logs.
    host: Arc<Redactor>,
    /// The host's secrets and every session's values fit for operator text: for operator
    /// text of no known session.
    operator_union: Redactor,
    held: Mutex<HeldBytes>,
}

/// Secret bytes held, in all and per user (the budgets' counts).
#[derive(Default)]
struct HeldBytes {
    total: usize,
    per_user: HashMap<String, usize>,
}

/// The process-wide registry (log lines are written by code that knows no session,
/// so the log scrubber must reach every secret from anywhere).
pub fn registry() -> &'static SecretRegistry {
    static REGISTRY: OnceLock<SecretRegistry> = OnceLock::new();
    REGISTRY.get_or_init(SecretRegistry::default)
}

impl SecretRegistry {
    /// Checks `values` as secrets for a task without remembering them.
    pub fn check<'a>(values: impl IntoIterator<Item = &'a str>) -> Result<(), SecretError> {
        for v in values {
            if v.len() > MAX_SECRET_BYTES {
                return Err(SecretError::TooLong(v.len()));
            }
            if v.len() >= MIN_SECRET_BYTES && REDACTED.contains(v) {
                return Err(SecretError::LooksLikeMarker);
            }
        }
        Ok(())
    }

    /// Remembers `values` as secrets of the session `(user_id, session_id)` for the rest
    /// of this process's life.
    pub fn remember(&self, user_id: &str, session_id: &str, values: &[&str]) -> Result<(), SecretError> {
        Self::check(values.iter().copied())?;
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let incoming: usize = values.iter().map(|v| v.len()).sum();
        if held.total + incoming > MAX_TOTAL_SECRET_BYTES {
            return Err(SecretError::HostFull);
        }
        let user_held = held.per_user.get(user_id).copied().unwrap_or(0);
        if user_held + incoming > MAX_USER_SECRET_BYTES {
            return Err(SecretError::UserFull);
        }
        if values.iter().all(|v| v.len() < MIN_SECRET_BYTES) {
            return Ok(());
        }
        let host = self.host.secrets();
        let session = self
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((user_id.to_owned(), session_id.to_owned()))
            .or_insert_with(|| Arc::new(Redactor::with_secrets(host.iter().map(String::as_str))))
            .clone();
        let new_bytes = session.add_counting(values, MAX_SESSION_SECRETS, host.len())?;
        *held.per_user.entry(user_id.to_owned()).or_default() += new_bytes;
        held.total += new_bytes;
        let fit: Vec<&str> = values.iter().copied().filter(|v| fit_for_operator_text(v, user_id, session_id)).collect();
        if !fit.is_empty() {
            let operator = self
                .operator_sessions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry((user_id.to_owned(), session_id.to_owned()))
                .or_insert_with(|| Arc::new(Redactor::with_secrets(host.iter().map(String::as_str))))
                .clone();
            operator.add(&fit, usize::MAX)?;
            self.operator_union.add(&fit, usize::MAX)?;
        }
        Ok(())
    }

    /// Makes the session `(user_id, fork)` — a fork of `(user_id, source)`, whose workspace
    /// is a copy of the source's and may hold what the source's tasks wrote — scrub every
    /// secret the source's does, now and later (the two share one redactor). A fork never
    /// gets the source's secrets themselves: they stay with the source's tasks.
    pub fn inherit(&self, user_id: &str, source: &str, fork: &str) {
        for map in [&self.sessions, &self.operator_sessions] {
            let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(r) = map.get(&(user_id.to_owned(), source.to_owned())).cloned() {
                map.insert((user_id.to_owned(), fork.to_owned()), r);
            }
        }
    }

    /// [`SecretRegistry::inherit`] for a fork named before it is made (a task that runs in
    /// a fork of its session is admitted, then copied when it starts): the source gets a
    /// redactor now if it has none, and the fork shares it, so a secret the source is given
    /// in between — and may write into the workspace the fork will copy — is scrubbed from
    /// the fork's text too. Call it before the fork is given secrets of its own.
    pub fn share(&self, user_id: &str, source: &str, fork: &str) {
        let host = self.host.secrets();
        for map in [&self.sessions, &self.operator_sessions] {
            let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
            let r = map
                .entry((user_id.to_owned(), source.to_owned()))
                .or_insert_with(|| Arc::new(Redactor::with_secrets(host.iter().map(String::as_str))))
                .clone();
            map.insert((user_id.to_owned(), fork.to_owned()), r);
        }
    }

    /// Whether the session `(user_id, session_id)` was given secrets of its own (a task
    /// of it must run where they are held).
    pub fn has_session_secrets(&self, user_id: &str, session_id: &str) -> bool {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&(user_id.to_owned(), session_id.to_owned()))
    }

    /// Remembers `values` as secrets of the host itself (e.g. `sandbox.egress.credentials`):
    /// scrubbed from every session's tool output ([`SecretRegistry::host`]) and, as every
    /// secret, from logs, the audit log, stored events and error messages.
    pub fn remember_host(&self, values: &[&str]) -> Result<(), SecretError> {
        Self::check(values.iter().copied())?;
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.total += self.host.add(values, usize::MAX)?;
        for session in self.sessions.lock().unwrap_or_else(|p| p.into_inner()).values() {
            session.add(values, usize::MAX)?;
        }
        for operator in self.operator_sessions.lock().unwrap_or_else(|p| p.into_inner()).values() {
            operator.add(values, usize::MAX)?;
        }
        self.operator_union.add(values, usize::MAX)?;
        Ok(())
    }

    /// The host's own secrets (see [`SecretRegistry::remember_host`]): the redactor of
    /// text that belongs to no session.
    pub fn host(&self) -> Arc<Redactor> {
        self.host.clone()
    }

    /// The session's redactor as it is now: the session's secrets and the host's (only
    /// the host's if the session was never given a secret). Look it up again for later
    /// text: it grows.
    pub fn session(&self, user_id: &str, session_id: &str) -> Arc<Redactor> {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(user_id.to_owned(), session_id.to_owned()))
            .cloned()
            .unwrap_or_else(|| self.host.clone())
    }

    /// The redactor of text owned by `(user_id, session_id)`: the session's when both
    /// are known, else the host's. Text is scrubbed with the secrets of whose it is — a
    /// tenant's `tool_context` value never rewrites another tenant's text, and its
    /// [`REDACTED`] marks never tell one tenant another's secrets.
    pub fn owner(&self, user_id: Option<&str>, session_id: Option<&str>) -> Arc<Redactor> {
        match (user_id, session_id) {
            (Some(user), Some(session)) => self.session(user, session),
            _ => self.host(),
        }
    }

    /// The redactor of operator text (log lines, audit fields) owned by
    /// `(user_id, session_id)`: the host's secrets and that session's values
    /// [`fit_for_operator_text`]; the host's only when the owner is not a known session.
    /// Never for text a tenant or a plugin reads (it misses the session's other values).
    pub fn operator(&self, user_id: Option<&str>, session_id: Option<&str>) -> Arc<Redactor> {
        let (Some(user), Some(session)) = (user_id, session_id) else { return self.host() };
        self.operator_sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(user.to_owned(), session.to_owned()))
            .cloned()
            .unwrap_or_else(|| self.host.clone())
    }

    /// The host's secrets and every session's values [`fit_for_operator_text`]: for
    /// operator log lines that name no session (`crate::logging`), which any tenant's
    /// secret could be in. Never for text a tenant or a plugin reads or that is parsed
    /// again (a tenant's value would rewrite other tenants' text, and where it reads
    /// [`REDACTED`] would tell that tenant another's secret).
    pub fn operator_union(&self) -> &Redactor {
        &self.operator_union
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn stream(r: &Redactor, chunks: &[&str]) -> String {
        let mut s = StreamScrubber::new();
        let mut out = String::new();
        for c in chunks {
            out.push_str(&s.push(r, c));
            assert!(s.held() < r.longest().max(1), "held {} of longest {}", s.held(), r.longest());
        }
        out + &s.finish(r)
    }

    #[test]
    fn a_secret_split_over_token_events_is_caught() {
        let r = Redactor::with_secrets(["hunter two"]);
        assert_eq!(stream(&r, &["say hunter", " two", " now"]), "say [redacted] now");
        assert_eq!(stream(&r, &["h", "u", "nter t", "wo"]), "[redacted]");
        // Text that only starts like the secret is not held for ever.
        assert_eq!(stream(&r, &["hunter", " three"]), "hunter three");
        // No secret holds a newline, so a whole line is never held for the next one.
        assert_eq!(StreamScrubber::new().push(&r, "data: hunter\n\n"), "data: hunter\n\n");
        assert_eq!(StreamScrubber::new().push(&r, "ab\ncd"), "ab\n");
        let pem = Redactor::with_secrets(["-----BEGIN KEY-----\nabc"]);
        assert_eq!(StreamScrubber::new().push(&pem, "ab\ncd"), "", "a secret may span this newline");
    }

    #[test]
    fn json_and_debug_escaped_forms_are_scrubbed() {
        let secret = "pa\"ss\\wo\nrd";
        let r = Redactor::with_secrets([secret]);
        let json = serde_json::to_string(&serde_json::json!({ "x": secret })).unwrap();
        assert!(!r.scrub(&json).contains("ss\\\\wo"), "{}", r.scrub(&json));
        assert_eq!(r.scrub(&format!("{secret:?}")), "\"[redacted]\"");
        let mut v = serde_json::json!({ secret: [secret, 1] });
        r.scrub_value(&mut v);
        assert_eq!(v, serde_json::json!({ "[redacted]": ["[redacted]", 1] }));
    }

    #[test]
    fn nested_secrets_are_scrubbed_whole() {
        let r = Redactor::with_secrets(["abcd", "abcdefgh"]);
        assert_eq!(r.scrub("xabcdefghy abcdz"), "x[redacted]y [redacted]z");
        assert_eq!(stream(&r, &["xabcd", "efg", "hy"]), "x[redacted]y");
        assert_eq!(stream(&r, &["xabcd", "efz"]), "x[redacted]efz");
    }

    #[test]
    fn host_secrets_are_scrubbed_for_every_session_and_from_logs() {
        // The egress proxy's credentials belong to no session: a server echoing one must
        // not hand it to any session's model, nor may a log line carry it.
        let reg = SecretRegistry::default();
        reg.remember_host(&["egress-credential-value"]).unwrap();
        assert_eq!(reg.host().scrub("echo: egress-credential-value"), "echo: [redacted]");
        assert_eq!(reg.operator_union().scrub("log egress-credential-value"), "log [redacted]");
        assert_eq!(reg.operator(Some("u"), Some("s")).scrub("log egress-credential-value"), "log [redacted]");
        assert!(!reg.has_session_secrets("u", "s"), "not a session's secret");
        // Every session's events and outputs are scrubbed of it, sessions started before
        // and after it was registered, and it never counts against a session's limit.
        reg.remember("u", "before", &["session-secret-1"]).unwrap();
        reg.remember_host(&["model-api-key-value"]).unwrap();
        reg.remember("u", "after", &["session-secret-2"]).unwrap();
        for s in ["before", "after", "none"] {
            let r = reg.session("u", s);
            assert_eq!(r.scrub("egress-credential-value model-api-key-value"), "[redacted] [redacted]", "{s}");
        }
        assert_eq!(reg.session("u", "before").scrub("session-secret-2"), "session-secret-2");
        assert!(reg.has_session_secrets("u", "after"));
        assert!(reg.remember_host(&[&"x".repeat(MAX_SECRET_BYTES + 1)]).is_err());
    }

    #[test]
    fn the_registry_remembers_secrets_per_session_and_refuses_what_it_cannot_hold() {
        let reg = SecretRegistry::default();
        reg.remember("u", "s1", &["first-secret"]).unwrap();
        reg.remember("u", "s1", &["second-secret"]).unwrap();
        let s1 = reg.session("u", "s1");
        assert_eq!(s1.scrub("first-secret second-secret"), "[redacted] [redacted]");
        assert_eq!(reg.session("u", "s2").scrub("first-secret"), "first-secret", "other sessions keep their text");
        // A word-like value never rewrites operator text; one that could be a key does.
        assert_eq!(reg.operator_union().scrub("first-secret"), "first-secret");
        reg.remember("u", "s1", &["third-secret-3"]).unwrap();
        assert_eq!(reg.operator_union().scrub("third-secret-3"), "[redacted]");
        let long = "x".repeat(MAX_SECRET_BYTES + 1);
        assert_eq!(reg.remember("u", "s1", &[&long]), Err(SecretError::TooLong(long.len())));
        assert_eq!(reg.remember("u", "s1", &["redacted"]), Err(SecretError::LooksLikeMarker));
        let many: Vec<String> = (0..=MAX_SESSION_SECRETS).map(|i| format!("secret-{i:04}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(reg.remember("u", "s3", &many), Err(SecretError::SessionFull));
        assert!(!reg.sessions.lock().unwrap().contains_key(&("u".into(), "s2".into())), "no entry without secrets");
    }

    /// Regression (attacker review): a tenant's `tool_context` values were added to the
    /// one scrubber of every tenant's plugin state, import errors and audit lines.
    #[test]
    fn text_is_scrubbed_with_its_owners_secrets_only() {
        let reg = SecretRegistry::default();
        reg.remember_host(&["host-credential-1"]).unwrap();
        reg.remember("bob", "b", &["bob-secret-1"]).unwrap();
        let text = "host-credential-1 bob-secret-1";
        assert_eq!(reg.owner(Some("bob"), Some("b")).scrub(text), "[redacted] [redacted]");
        let others = [
            (Some("alice"), Some("b")),
            (Some("bob"), Some("c")),
            (None, Some("b")),
            (Some("bob"), None),
            (None, None),
        ];
        for (user, session) in others {
            assert_eq!(reg.owner(user, session).scrub(text), "[redacted] bob-secret-1", "{user:?} {session:?}");
        }
    }

    /// Regression (attack review F7): every tenant's `tool_context` values (4 bytes and
    /// up) scrubbed every operator log line and its own audit fields, so a tenant passing
    /// `task_`, `session`, `Bash` or its own name blanked those words host-wide. Words and
    /// short values now never rewrite operator text, whoever's it is.
    #[test]
    fn regression_a_tenants_words_rewrote_operator_text() {
        let reg = SecretRegistry::default();
        let words = ["task_", "session", "Bash", "alice", "mallory", "tool_call", "user_id", "INFO"];
        reg.remember("mallory", "m1", &words).unwrap();
        let line = "INFO task{user=alice session=s1 task_id=task_9b1c}: warden::engine: tool Bash user_id=mallory";
        assert_eq!(reg.operator_union().scrub(line), line);
        for (user, session) in [(Some("mallory"), Some("m1")), (Some("alice"), Some("s1")), (None, None)] {
            assert_eq!(reg.operator(user, session).scrub(line), line, "{user:?} {session:?}");
        }
        // Still scrubbed from what the tenant and its plugins read.
        assert_eq!(reg.session("mallory", "m1").scrub("Bash"), "[redacted]");
        // Nor may a value that could be a key blank the tenant's own ids.
        reg.remember("mallory.2024", "m1", &["mallory.2024"]).unwrap();
        assert_eq!(reg.operator(Some("mallory.2024"), Some("m1")).scrub("user=mallory.2024"), "user=mallory.2024");
    }

    /// Regression (attacker review): the host-wide secret budget, which only a restart
    /// empties, could be filled by one user through many sessions, and every other
    /// tenant's secrets were then refused.
    #[test]
    fn regression_one_user_cannot_fill_the_secret_budget() {
        let reg = SecretRegistry::default();
        let mut held = 0;
        let refused = loop {
            // A new session every 100 values: the session cap is not what stops it.
            let value = format!("{held:08}{}", "x".repeat(MAX_SECRET_BYTES - 8));
            match reg.remember("mallory", &format!("s{}", held / 100), &[value.as_str()]) {
                Ok(()) => held += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(refused, SecretError::UserFull);
        assert_eq!(held, MAX_USER_SECRET_BYTES / MAX_SECRET_BYTES);
        reg.remember("alice", "s", &["alice-secret-value"]).expect("another tenant's secrets are held");
    }

    /// Secrets as real ones look and worse: spaces, unicode, regex metacharacters.
    fn secret() -> impl Strategy<Value = String> {
        prop::string::string_regex(r"[a-fA-Z0-9 .*+?()\[\]{}|^$\\/\x22'é日本🔑-]{4,24}")
            .unwrap()
            .prop_filter("not part of the marker", |s| !REDACTED.contains(s.as_str()))
    }

    /// Text that cannot be part of a secret: none of its characters is in the secrets'
    /// alphabet.
    fn plain() -> impl Strategy<Value = String> {
        prop::string::string_regex("[ghkmnpqwxz,;:!~\n]{0,12}").unwrap()
    }

    /// Splits `text` at character boundaries into chunks, as providers do (1-byte
    /// tokens, words, whole sentences).
    fn chunk(text: &str, cuts: &[usize]) -> Vec<String> {
        let bounds: BTreeSet<usize> = cuts
            .iter()
            .map(|c| c % (text.len() + 1))
            .filter(|&c| text.is_char_boundary(c))
            .chain([0, text.len()])
            .collect();
        let b: Vec<usize> = bounds.into_iter().collect();
        b.windows(2).map(|w| text[w[0]..w[1]].to_owned()).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn no_chunking_lets_a_secret_through_and_other_text_survives(
            secrets in prop::collection::vec(secret(), 1..4),
            parts in prop::collection::vec((plain(), any::<bool>(), any::<prop::sample::Index>()), 1..8),
            cuts in prop::collection::vec(any::<usize>(), 0..40),
        ) {
            let r = Redactor::with_secrets(secrets.iter().map(String::as_str));
            let mut text = String::new();
            let mut expected_plain = String::new();
            for (p, with_secret, i) in &parts {
                text.push_str(p);
                expected_plain.push_str(p);
                if *with_secret {
                    text.push_str(&secrets[i.index(secrets.len())]);
                }
            }
            let chunks = chunk(&text, &cuts);
            let chunks: Vec<&str> = chunks.iter().map(String::as_str).collect();
            for out in [stream(&r, &chunks), r.scrub(&text).into_owned()] {
                for s in &secrets {
                    prop_assert!(!out.contains(s.as_str()), "secret {s:?} in {out:?} (chunks {chunks:?})");
                }
                // Non-secret text is preserved: removing the markers gives the plain parts back.
                prop_assert_eq!(out.replace(REDACTED, ""), expected_plain.clone());
            }
        }

        /// An HTTP body in arbitrary byte chunks (a chunk may end inside a character):
        /// the secret never arrives whole, everything else arrives unchanged.
        #[test]
        fn regression_a_secret_split_over_body_chunks_is_caught(
            secret in secret(),
            parts in prop::collection::vec((plain(), any::<bool>()), 1..8),
            cuts in prop::collection::vec(any::<usize>(), 0..40),
        ) {
            let r = Redactor::with_secrets([secret.as_str()]);
            let (mut body, mut expected_plain) = (Vec::new(), Vec::new());
            for (p, with_secret) in &parts {
                body.extend_from_slice(p.as_bytes());
                expected_plain.extend_from_slice(p.as_bytes());
                if *with_secret {
                    body.extend_from_slice(secret.as_bytes());
                }
            }
            let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).chain([0, body.len()]).collect();
            bounds.sort_unstable();
            bounds.dedup();
            let mut s = ByteStreamScrubber::new();
            let mut out = Vec::new();
            for w in bounds.windows(2) {
                out.extend(s.push(&r, &body[w[0]..w[1]]));
                prop_assert!(s.held() < r.longest().max(1));
            }
            out.extend(s.finish(&r));
            let text = String::from_utf8(out).expect("cuts inside a character are joined again");
            prop_assert!(!text.contains(secret.as_str()), "{text:?}");
            prop_assert_eq!(text.replace(REDACTED, "").into_bytes(), expected_plain);
        }

        /// Regression (attacker review): a stream held back exactly the tails that could
        /// still grow into a secret, so where its events ended told a reader (a tenant
        /// asking its model to echo guesses, a plugin reading a server that echoes its
        /// request) which text starts a secret: a prefix oracle, one character per try.
        /// Now two secret sets of the same lengths cut a text holding neither secret at
        /// the same places, whatever prefixes of one of them it holds.
        #[test]
        fn regression_where_a_stream_is_cut_tells_nothing_of_a_secrets_prefix(
            secret in "[a-z0-9]{4,24}",
            parts in prop::collection::vec((plain(), any::<prop::sample::Index>()), 1..8),
            cuts in prop::collection::vec(any::<usize>(), 0..40),
        ) {
            let mut text = String::new();
            for (p, k) in &parts {
                text.push_str(p);
                text.push_str(&secret[..k.index(secret.len())]);
            }
            prop_assume!(!text.contains(secret.as_str()));
            let known = Redactor::with_secrets([secret.as_str()]);
            let unrelated_secret = "Z".repeat(secret.len());
            let unrelated = Redactor::with_secrets([unrelated_secret.as_str()]);
            let chunks = chunk(&text, &cuts);
            let events = |r: &Redactor| {
                let mut s = StreamScrubber::new();
                chunks.iter().map(|c| s.push(r, c)).collect::<Vec<_>>()
            };
            let body = |r: &Redactor| {
                let mut s = ByteStreamScrubber::new();
                chunks.iter().map(|c| s.push(r, c.as_bytes())).collect::<Vec<_>>()
            };
            prop_assert_eq!(events(&known), events(&unrelated), "chunks {:?}", chunks);
            prop_assert_eq!(body(&known), body(&unrelated), "chunks {:?}", chunks);
        }

        #[test]
        fn streamed_and_whole_scrubbing_agree(
            secrets in prop::collection::vec(secret(), 1..3),
            text in prop::string::string_regex(r"[a-z .*é日]{0,60}").unwrap(),
            cuts in prop::collection::vec(any::<usize>(), 0..20),
        ) {
            let r = Redactor::with_secrets(secrets.iter().map(String::as_str));
            let chunks = chunk(&text, &cuts);
            let chunks: Vec<&str> = chunks.iter().map(String::as_str).collect();
            prop_assert_eq!(stream(&r, &chunks), r.scrub(&text).into_owned());
        }
    }

    /// Any text made of what a tenant value may not rewrite in operator text with: ASCII
    /// letters, `_`, `-`, and short values of anything.
    fn unfit_value() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::string::string_regex("[A-Za-z_-]{4,16}").unwrap(),
            prop::string::string_regex("[a-z0-9 .:=]{4,7}").unwrap(),
        ]
        .prop_filter("not part of the marker", |s| !REDACTED.contains(s.as_str()))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Whatever values other sessions (and the owner) registered, an operator line of
        /// the owner holding none of the owner's values and no host secret is unchanged;
        /// the owner's own fit values never survive in it.
        #[test]
        fn an_owners_operator_line_is_rewritten_by_its_own_secrets_only(
            others in prop::collection::vec(("[a-c]{1,2}", "[a-c]{1,2}", secret()), 0..8),
            own in prop::collection::vec(secret(), 0..3),
            parts in prop::collection::vec((plain(), any::<bool>(), any::<prop::sample::Index>()), 1..8),
            words in prop::collection::vec(unfit_value(), 0..6),
        ) {
            let reg = SecretRegistry::default();
            for (user, session, value) in &others {
                // Another session's value: the owner's line may quote it freely.
                let _ = reg.remember(&format!("other-{user}"), session, &[value.as_str()]);
            }
            let own: Vec<&str> = own.iter().map(String::as_str).collect();
            reg.remember("owner", "sess", &own).unwrap();
            let _ = reg.remember("owner", "sess", &words.iter().map(String::as_str).collect::<Vec<_>>());
            let fit: Vec<&str> = own.iter().copied().filter(|v| fit_for_operator_text(v, "owner", "sess")).collect();
            // A line of plain text, other sessions' values and the owner's words.
            let mut line = String::new();
            for (p, quote, i) in &parts {
                line.push_str(p);
                if *quote && !others.is_empty() {
                    line.push_str(&others[i.index(others.len())].2);
                } else if *quote && !words.is_empty() {
                    line.push_str(&words[i.index(words.len())]);
                }
            }
            prop_assume!(!own.iter().any(|v| forms(v).any(|f| line.contains(&f))));
            let r = reg.operator(Some("owner"), Some("sess"));
            prop_assert_eq!(r.scrub(&line).into_owned(), line.clone());
            // The owner's fit values are scrubbed from its own lines.
            for v in &fit {
                let with = format!("{line}{v}");
                prop_assert!(!r.scrub(&with).contains(v), "{v:?} in {:?}", r.scrub(&with));
            }
        }

        /// Values unfit for operator text — words, identifiers, short values — never
        /// rewrite an operator line, attributed or not, whoever registered them.
        #[test]
        fn unfit_values_never_rewrite_an_operator_line(
            values in prop::collection::vec(("[a-c]{1,2}", "[a-c]{1,2}", unfit_value()), 1..10),
            line in prop::string::string_regex(r"[A-Za-z_ :=.{}0-9-]{0,80}").unwrap(),
            quoted in prop::collection::vec(any::<prop::sample::Index>(), 0..4),
        ) {
            let reg = SecretRegistry::default();
            for (user, session, value) in &values {
                reg.remember(user, session, &[value.as_str()]).unwrap();
            }
            let mut line = line;
            for i in &quoted {
                line.push_str(&values[i.index(values.len())].2);
            }
            prop_assert_eq!(reg.operator_union().scrub(&line).into_owned(), line.clone());
            for (user, session, _) in &values {
                prop_assert_eq!(reg.operator(Some(user), Some(session)).scrub(&line).into_owned(), line.clone());
            }
        }
    }
}
