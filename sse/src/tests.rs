use proptest::prelude::*;

use super::*;

/// Feeds `parts` in order and finishes: every event, or the first error.
fn parse(mut p: SseParser, parts: &[&[u8]]) -> Result<Vec<SseEvent>, SseError> {
    let mut out = Vec::new();
    for part in parts {
        out.extend(p.feed(part)?);
    }
    out.extend(p.finish()?);
    Ok(out)
}

fn all(parts: &[&[u8]]) -> Vec<SseEvent> {
    parse(SseParser::new(), parts).unwrap()
}

#[test]
fn events_across_arbitrary_chunk_boundaries() {
    let stream = b"event: message\r\ndata: {\"a\":1}\r\n\r\n: ping\n\nid: 7\ndata: x\ndata: y\n\n";
    let whole = all(&[stream]);
    assert_eq!(whole.len(), 2);
    assert_eq!(whole[0].data, "{\"a\":1}");
    assert_eq!(whole[0].kind(), "message");
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
    assert_eq!(evs[0].event, None);
    assert_eq!(evs[1].event.as_deref(), Some("x"));
    assert_eq!(evs[1].data, "b");
    assert_eq!(evs[1].id.as_deref(), Some("1"));
}

#[test]
fn retry_and_utf8_split() {
    let text = "data: héllo\n\n".as_bytes();
    let cut = text.iter().position(|&b| b == 0xc3).unwrap() + 1;
    let mut p = SseParser::new();
    assert!(p.feed(b"retry: 1500\n").unwrap().is_empty());
    assert!(p.feed(&text[..cut]).unwrap().is_empty());
    let evs = p.feed(&text[cut..]).unwrap();
    assert_eq!(evs[0].data, "héllo");
    assert_eq!(p.retry_ms(), Some(1500));
}

/// A trickled line, byte by byte: every byte examined once. The old parsers rescanned the
/// whole unfinished line on each feed (200 KB took 21 s of CPU on a host thread).
#[test]
fn regression_sse_parsing_was_quadratic_in_a_trickled_line() {
    const N: usize = 200_000;
    let mut p = SseParser::new();
    assert!(p.feed(b"data: ").unwrap().is_empty());
    for _ in 0..N {
        assert!(p.feed(b"x").unwrap().is_empty());
    }
    assert_eq!(p.scanned(), (N + 6) as u64, "each byte fed is scanned once");
    let evs = p.feed(b"\n\n").unwrap();
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0].data.len(), N);
    // Many lines in one chunk (the a2a guest drained its buffer once per line): still
    // one pass over the chunk.
    let mut p = SseParser::new();
    let blank = vec![b'\n'; N];
    assert!(p.feed(&blank).unwrap().is_empty());
    assert_eq!(p.scanned(), N as u64);
    // Interleaved: complete lines and one growing unfinished tail.
    let mut p = SseParser::new();
    let mut fed = 0u64;
    for i in 0..N / 10 {
        let chunk: &[u8] = if i % 2 == 0 { b"data: a\n\ndata: " } else { b"yy" };
        fed += chunk.len() as u64;
        p.feed(chunk).unwrap();
    }
    assert_eq!(p.scanned(), fed);
}

#[test]
fn lines_and_events_are_bounded() {
    let mut p = SseParser::with_limits(16, 32);
    p.feed(b"data: 0123456789").unwrap(); // 16 bytes: at the bound
    assert_eq!(p.feed(b"x"), Err(SseError::LineTooLong { limit: 16 }));
    assert_eq!(p.feed(b"\n\n"), Err(SseError::LineTooLong { limit: 16 }), "a failed parser stays failed");
    assert_eq!(p.finish(), Err(SseError::LineTooLong { limit: 16 }));
    // A terminated line is checked too, not only a pending one.
    let mut p = SseParser::with_limits(16, 32);
    assert_eq!(p.feed(b"data: 0123456789abc\n"), Err(SseError::LineTooLong { limit: 16 }));
    // Data lines add up per event, and the count restarts at each event.
    let mut p = SseParser::with_limits(16, 32);
    let ok = p.feed(b"data:0123456789\ndata:0123456789\n\n").unwrap();
    assert_eq!(ok[0].data.len(), 21);
    let at_bound = p.feed(b"data:0123456789\ndata:0123456789\ndata:0123456789\n\n").unwrap();
    assert_eq!(at_bound[0].data.len(), 32);
    let too_much = p.feed(b"data:0123456789\ndata:0123456789\ndata:0123456789\ndata:0\n");
    assert_eq!(too_much, Err(SseError::EventTooLarge { limit: 32 }));
    // Empty data lines still grow the event (one `\n` each).
    let mut p = SseParser::with_limits(16, 32);
    assert_eq!(p.feed(&b"data\n".repeat(40)), Err(SseError::EventTooLarge { limit: 32 }));
}

#[test]
fn an_overlong_id_is_not_copied_into_every_event() {
    let mut p = SseParser::new();
    let long = format!("id: {}\n", "i".repeat(MAX_SSE_ID + 1));
    p.feed(b"id: short\n").unwrap();
    p.feed(long.as_bytes()).unwrap();
    let evs = p.feed(&b"data:x\n\n".repeat(3)).unwrap();
    assert_eq!(evs.len(), 3);
    assert!(evs.iter().all(|e| e.id.as_deref() == Some("short")));
}

/// Pieces a stream is made of: field names, separators, every line terminator, a BOM and
/// a split UTF-8 character, comments.
fn piece() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"data:".to_vec()),
        Just(b"data: ".to_vec()),
        Just(b"event: e".to_vec()),
        Just(b"id: 7".to_vec()),
        Just(b"retry: 10".to_vec()),
        Just(b": c".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\r\n".to_vec()),
        Just("\u{feff}".as_bytes().to_vec()),
        Just("é".as_bytes().to_vec()),
        Just(b"x".to_vec()),
        Just(b":".to_vec()),
    ]
}

proptest! {
    /// Any chunking of a stream yields the same events as feeding it whole, and the work
    /// done is the stream's length, however it was cut.
    #[test]
    fn any_chunking_yields_the_events_of_the_whole_stream(
        pieces in proptest::collection::vec(piece(), 0..60),
        cuts in proptest::collection::vec(any::<proptest::sample::Index>(), 0..20),
    ) {
        let stream: Vec<u8> = pieces.concat();
        let whole = all(&[&stream]);
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(stream.len() + 1)).collect();
        at.sort_unstable();
        let mut parts: Vec<&[u8]> = Vec::new();
        let mut from = 0;
        for to in at {
            parts.push(&stream[from..to]);
            from = to;
        }
        parts.push(&stream[from..]);
        let mut p = SseParser::new();
        let mut chunked = Vec::new();
        for part in &parts {
            chunked.extend(p.feed(part).unwrap());
        }
        prop_assert!(p.scanned() <= stream.len() as u64);
        chunked.extend(p.finish().unwrap());
        prop_assert_eq!(&chunked, &whole);
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        prop_assert_eq!(all(&bytes), whole);
    }
}
