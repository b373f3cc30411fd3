//! Incremental `text/event-stream` parser (the WHATWG event-stream grammar): bytes in,
//! events out, chunk boundaries anywhere (even inside a `\r\n` or a UTF-8 sequence).

/// One dispatched server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field; `message` when absent.
    pub event: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// The last `id:` seen on the stream so far (for `Last-Event-ID`).
    pub id: Option<String>,
}

/// Feed chunks with [`SseParser::feed`], then call [`SseParser::finish`] at end of body.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    started: bool,
    event: String,
    data: String,
    has_data: bool,
    last_id: Option<String>,
    retry_ms: Option<u64>,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// The reconnection delay the server asked for (`retry:`), if any.
    pub fn retry_ms(&self) -> Option<u64> {
        self.retry_ms
    }

    /// The last event id seen (`id:`), if any.
    pub fn last_event_id(&self) -> Option<&str> {
        self.last_id.as_deref()
    }

    /// Adds bytes; returns the events completed by them.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        let mut start = 0;
        let mut i = 0;
        while i < self.buf.len() {
            match self.buf[i] {
                b'\n' => {
                    let line = self.buf[start..i].to_vec();
                    self.line(&line, &mut out);
                    i += 1;
                    start = i;
                }
                b'\r' => {
                    if i + 1 == self.buf.len() {
                        break; // maybe half of a `\r\n`: wait for more
                    }
                    let line = self.buf[start..i].to_vec();
                    self.line(&line, &mut out);
                    i += if self.buf[i + 1] == b'\n' { 2 } else { 1 };
                    start = i;
                }
                _ => i += 1,
            }
        }
        self.buf.drain(..start);
        out
    }

    /// End of body: a final line without its terminator still counts, and a pending
    /// event with data is dispatched (lenient: some servers omit the last blank line).
    pub fn finish(&mut self) -> Option<SseEvent> {
        let mut out = Vec::new();
        if !self.buf.is_empty() {
            let mut rest = std::mem::take(&mut self.buf);
            if rest.last() == Some(&b'\r') {
                rest.pop();
            }
            self.line(&rest, &mut out);
        }
        self.dispatch(&mut out);
        out.pop()
    }

    fn line(&mut self, raw: &[u8], out: &mut Vec<SseEvent>) {
        let mut line = String::from_utf8_lossy(raw).into_owned();
        if !self.started {
            self.started = true;
            if let Some(rest) = line.strip_prefix('\u{feff}') {
                line = rest.to_owned();
            }
        }
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line.starts_with(':') {
            return; // comment / keep-alive
        }
        let (field, value) = match line.find(':') {
            Some(p) => {
                let v = &line[p + 1..];
                (&line[..p], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (line.as_str(), ""),
        };
        match field {
            "event" => self.event = value.to_owned(),
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "id" if !value.contains('\0') => self.last_id = Some(value.to_owned()),
            "retry" => {
                if let Ok(ms) = value.parse() {
                    self.retry_ms = Some(ms);
                }
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        let event = std::mem::take(&mut self.event);
        if !self.has_data {
            return;
        }
        self.has_data = false;
        out.push(SseEvent {
            event: if event.is_empty() { "message".into() } else { event },
            data: std::mem::take(&mut self.data),
            id: self.last_id.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(parts: &[&[u8]]) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for part in parts {
            out.extend(p.feed(part));
        }
        out.extend(p.finish());
        out
    }

    #[test]
    fn events_across_arbitrary_chunk_boundaries() {
        let stream = b"event: message\r\ndata: {\"a\":1}\r\n\r\n: ping\n\nid: 7\ndata: x\ndata: y\n\n";
        let whole = all(&[stream]);
        assert_eq!(whole.len(), 2);
        assert_eq!(whole[0].data, "{\"a\":1}");
        assert_eq!(whole[1].data, "x\ny");
        assert_eq!(whole[1].id.as_deref(), Some("7"));
        for cut in 0..stream.len() {
            assert_eq!(all(&[&stream[..cut], &stream[cut..]]), whole, "cut at {cut}");
        }
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(all(&bytes), whole);
    }

    #[test]
    fn bare_cr_terminators_bom_and_events_without_data() {
        let evs = all(&[b"\xef\xbb\xbfdata:a\r\rid: 1\r\r", b"event: x\rdata:b"]);
        assert_eq!(evs.len(), 2);
        assert_eq!(evs[0].data, "a");
        assert_eq!(evs[1].event, "x");
        assert_eq!(evs[1].data, "b");
    }

    #[test]
    fn retry_and_utf8_split() {
        let text = "data: héllo\n\n".as_bytes();
        let cut = text.iter().position(|&b| b == 0xc3).unwrap() + 1;
        let mut p = SseParser::new();
        assert!(p.feed(b"retry: 1500\n").is_empty());
        assert!(p.feed(&text[..cut]).is_empty());
        let evs = p.feed(&text[cut..]);
        assert_eq!(evs[0].data, "héllo");
        assert_eq!(p.retry_ms(), Some(1500));
    }
}
