//! Incremental `text/event-stream` parser (the WHATWG event-stream grammar): bytes in,
//! events out, chunk boundaries anywhere (inside a `\r\n`, a field name or a UTF-8
//! sequence). Shared by every SSE reader in warden (the host's MCP client, the model
//! providers, the a2a guest), all of which read streams from peers that may be hostile.
//!
//! Two properties hold whatever the peer sends:
//! - **Linear work.** Every byte fed is examined once: an unfinished line is kept aside
//!   and never scanned again, so a line trickled in one-byte pieces costs what it costs
//!   whole ([`SseParser::scanned`] counts the bytes examined, for tests).
//! - **Bounded memory.** A line longer than the parser's line bound, or an event whose
//!   data grows past its event bound, is an [`SseError`] (the stream is unusable, not
//!   silently cut); an over-long `id:` is ignored rather than copied into every event.

use std::fmt;

/// Default bound on one line (field name and value): larger than any event a model
/// provider or an A2A agent streams, small enough that a newline-free body is refused
/// long before the 16 MiB body caps.
pub const MAX_SSE_LINE: usize = 4 * 1024 * 1024;
/// Default bound on one event's data (its `data:` lines joined): as [`MAX_SSE_LINE`].
/// A reader whose events may legitimately be bigger sets its own with
/// [`SseParser::with_limits`].
pub const MAX_SSE_EVENT: usize = 4 * 1024 * 1024;
/// Longest `id:` kept. The last id is copied into every later event, so an unbounded one
/// would turn each three-byte `data:x` event into a copy of it; a longer id is ignored
/// (ids are opaque tokens, typically a few dozen bytes).
pub const MAX_SSE_ID: usize = 1024;

/// One dispatched server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field; `None` when absent or empty (the type is then `message`).
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// The last `id:` seen on the stream so far (for `Last-Event-ID`).
    pub id: Option<String>,
}

impl SseEvent {
    /// The event type: the `event:` field, `message` when there was none.
    pub fn kind(&self) -> &str {
        self.event.as_deref().unwrap_or("message")
    }
}

/// Why a stream cannot be parsed further.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SseError {
    /// A line (without its terminator) longer than `limit` bytes.
    LineTooLong { limit: usize },
    /// An event whose data exceeds `limit` bytes.
    EventTooLarge { limit: usize },
}

impl fmt::Display for SseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SseError::LineTooLong { limit } => write!(f, "an event-stream line exceeds {limit} bytes"),
            SseError::EventTooLarge { limit } => write!(f, "an event's data exceeds {limit} bytes"),
        }
    }
}

impl std::error::Error for SseError {}

/// Feed chunks with [`SseParser::feed`], then call [`SseParser::finish`] at end of body.
/// After an error every later call returns the same error.
#[derive(Debug)]
pub struct SseParser {
    /// The unfinished line: bytes after the last terminator, already scanned.
    line: Vec<u8>,
    /// The last byte seen ended a line with `\r`: a `\n` right after it is that line's.
    after_cr: bool,
    started: bool,
    event: String,
    data: String,
    has_data: bool,
    last_id: Option<String>,
    retry_ms: Option<u64>,
    max_line: usize,
    max_event: usize,
    scanned: u64,
    failed: Option<SseError>,
}

impl Default for SseParser {
    fn default() -> Self {
        Self::new()
    }
}

impl SseParser {
    /// A parser with the default bounds ([`MAX_SSE_LINE`], [`MAX_SSE_EVENT`]).
    pub fn new() -> Self {
        Self::with_limits(MAX_SSE_LINE, MAX_SSE_EVENT)
    }

    /// A parser refusing lines over `max_line` bytes and events with more than
    /// `max_event` bytes of data.
    pub fn with_limits(max_line: usize, max_event: usize) -> Self {
        SseParser {
            line: Vec::new(),
            after_cr: false,
            started: false,
            event: String::new(),
            data: String::new(),
            has_data: false,
            last_id: None,
            retry_ms: None,
            max_line,
            max_event,
            scanned: 0,
            failed: None,
        }
    }

    /// The reconnection delay the server asked for (`retry:`), if any.
    pub fn retry_ms(&self) -> Option<u64> {
        self.retry_ms
    }

    /// The last event id seen (`id:`), if any.
    pub fn last_event_id(&self) -> Option<&str> {
        self.last_id.as_deref()
    }

    /// Bytes examined so far looking for line ends: never more than the bytes fed
    /// (the measure of the parser's work, for tests).
    pub fn scanned(&self) -> u64 {
        self.scanned
    }

    /// Adds bytes; returns the events completed by them.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        let mut out = Vec::new();
        let mut rest = chunk;
        while let Some((&first, tail)) = rest.split_first() {
            if std::mem::take(&mut self.after_cr) && first == b'\n' {
                self.scanned += 1;
                rest = tail;
                continue;
            }
            let Some(end) = rest.iter().position(|&b| b == b'\n' || b == b'\r') else {
                self.scanned += rest.len() as u64;
                self.check_line(rest.len())?;
                self.line.extend_from_slice(rest);
                break;
            };
            self.scanned += end as u64 + 1;
            self.check_line(end)?;
            self.after_cr = rest[end] == b'\r';
            if self.line.is_empty() {
                self.line_done(&rest[..end], &mut out)?;
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(&rest[..end]);
                self.line_done(&line, &mut out)?;
                line.clear();
                self.line = line; // keep the allocation for the next unfinished line
            }
            rest = &rest[end + 1..];
        }
        Ok(out)
    }

    /// End of body: a final line without its terminator still counts, and a pending
    /// event with data is dispatched (lenient: some servers omit the last blank line).
    pub fn finish(&mut self) -> Result<Option<SseEvent>, SseError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        let mut out = Vec::new();
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.line_done(&line, &mut out)?;
        }
        self.dispatch(&mut out);
        Ok(out.pop())
    }

    fn fail(&mut self, e: SseError) -> SseError {
        self.failed = Some(e);
        e
    }

    /// `more` bytes are about to join the unfinished line.
    fn check_line(&mut self, more: usize) -> Result<(), SseError> {
        if self.line.len().saturating_add(more) > self.max_line {
            return Err(self.fail(SseError::LineTooLong { limit: self.max_line }));
        }
        Ok(())
    }

    fn line_done(&mut self, raw: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        let mut raw = raw;
        if !self.started {
            self.started = true;
            raw = raw.strip_prefix("\u{feff}".as_bytes()).unwrap_or(raw);
        }
        if raw.is_empty() {
            self.dispatch(out);
            return Ok(());
        }
        if raw[0] == b':' {
            return Ok(()); // comment / keep-alive
        }
        let line = String::from_utf8_lossy(raw);
        let (field, value) = match line.find(':') {
            Some(p) => {
                let v = &line[p + 1..];
                (&line[..p], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (&*line, ""),
        };
        match field {
            "event" => value.clone_into(&mut self.event),
            "data" => {
                let grown = self.data.len() + usize::from(self.has_data) + value.len();
                if grown > self.max_event {
                    return Err(self.fail(SseError::EventTooLarge { limit: self.max_event }));
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "id" if !value.contains('\0') && value.len() <= MAX_SSE_ID => self.last_id = Some(value.to_owned()),
            "retry" => {
                if let Ok(ms) = value.parse() {
                    self.retry_ms = Some(ms);
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        let event = std::mem::take(&mut self.event);
        if !self.has_data {
            return;
        }
        self.has_data = false;
        out.push(SseEvent {
            event: (!event.is_empty()).then_some(event),
            data: std::mem::take(&mut self.data),
            id: self.last_id.clone(),
        });
    }
}

#[cfg(test)]
mod tests;
