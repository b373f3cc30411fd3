//! An incremental server-sent-events parser: feed body chunks, take complete events'
//! `data` (multi-line data joined with `\n`). Comments, `event:`, `id:` and `retry:`
//! lines are ignored; CRLF, CR and LF line ends are accepted.

#[derive(Default)]
pub struct SseParser {
    buf: Vec<u8>,
    data: Vec<String>,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a chunk; returns the data of every event completed by it.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(chunk);
        let mut events = Vec::new();
        while let Some(pos) = self.buf.iter().position(|&b| b == b'\n' || b == b'\r') {
            // A lone CR at the end of the buffer may be the first half of CRLF.
            if self.buf[pos] == b'\r' && pos + 1 == self.buf.len() {
                break;
            }
            let line: Vec<u8> = self.buf.drain(..pos).collect();
            let skip = if self.buf[0] == b'\r' && self.buf.get(1) == Some(&b'\n') { 2 } else { 1 };
            self.buf.drain(..skip);
            self.line(&String::from_utf8_lossy(&line), &mut events);
        }
        events
    }

    /// Ends the stream: a final event without a trailing blank line still counts.
    pub fn finish(&mut self) -> Vec<String> {
        let mut events = Vec::new();
        if !self.buf.is_empty() {
            let line = String::from_utf8_lossy(&std::mem::take(&mut self.buf)).into_owned();
            self.line(&line, &mut events);
        }
        self.line("", &mut events);
        events
    }

    fn line(&mut self, line: &str, events: &mut Vec<String>) {
        if line.is_empty() {
            if !self.data.is_empty() {
                events.push(self.data.join("\n"));
                self.data.clear();
            }
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        if field == "data" {
            self.data.push(value.to_string());
        }
    }
}
