//! The server name (SNI) of a TLS ClientHello, read from the first bytes a client sends
//! through a CONNECT tunnel, so the proxy can refuse a tunnel whose TLS names another host
//! than the one it was opened (and judged) for.
//!
//! A small parser of its own rather than a crate: it reads one structure (RFC 8446 §4.1.2,
//! RFC 6066 §3), every length is checked against what is left, nothing is allocated beyond
//! the name, and it is property-tested on arbitrary bytes. It only reads; it never decides.

/// Most bytes of a ClientHello the proxy waits for (the TLS limit of one handshake message
/// spread over records is larger, but real ClientHellos, post-quantum key shares included,
/// stay far below this).
pub const MAX_CLIENT_HELLO: usize = 16 * 1024;

/// Record header: type, version, length.
const RECORD_HEADER: usize = 5;
/// TLS record type of handshake messages.
const HANDSHAKE: u8 = 22;
/// Handshake type of a ClientHello.
const CLIENT_HELLO: u8 = 1;
/// Extension number of server_name.
const SERVER_NAME: u16 = 0;

/// What the first bytes of a tunnel are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// A ClientHello may follow; read more (up to [`MAX_CLIENT_HELLO`]).
    NeedMore,
    /// Not TLS (a plain-text protocol, or garbage).
    NotTls,
    /// TLS records that do not hold a well-formed ClientHello.
    Malformed,
    /// A ClientHello, with its host name if it has one (lower case).
    ClientHello(Option<String>),
}

/// Reads a ClientHello from the start of `buf` (possibly spread over several records).
pub fn parse(buf: &[u8]) -> Hello {
    if buf.is_empty() {
        return Hello::NeedMore;
    }
    if buf[0] != HANDSHAKE {
        return Hello::NotTls;
    }
    if buf.len() >= 2 && buf[1] != 3 {
        return Hello::NotTls;
    }
    // Join the payloads of the handshake records until the ClientHello is whole.
    let mut msg: Vec<u8> = Vec::new();
    let mut at = 0;
    loop {
        let Some(header) = buf.get(at..at + RECORD_HEADER) else { return Hello::NeedMore };
        if header[0] != HANDSHAKE || header[1] != 3 {
            return Hello::Malformed;
        }
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len == 0 {
            return Hello::Malformed;
        }
        let Some(payload) = buf.get(at + RECORD_HEADER..at + RECORD_HEADER + len) else { return Hello::NeedMore };
        msg.extend_from_slice(payload);
        at += RECORD_HEADER + len;
        if msg.len() >= 4 {
            if msg[0] != CLIENT_HELLO {
                return Hello::Malformed;
            }
            let body = (usize::from(msg[1]) << 16) | (usize::from(msg[2]) << 8) | usize::from(msg[3]);
            if body + 4 > MAX_CLIENT_HELLO {
                return Hello::Malformed;
            }
            if msg.len() >= body + 4 {
                return match client_hello_sni(&msg[4..body + 4]) {
                    Some(sni) => Hello::ClientHello(sni),
                    None => Hello::Malformed,
                };
            }
        }
        if at >= MAX_CLIENT_HELLO {
            return Hello::Malformed;
        }
    }
}

/// A cursor that refuses to read past its end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2).map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(n)
    }
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(n)
    }
}

/// The SNI host name of a ClientHello body: `Some(None)` when it has none, `None` when the
/// body is malformed (including a server_name extension that holds no valid host name).
fn client_hello_sni(body: &[u8]) -> Option<Option<String>> {
    let mut r = Reader(body);
    r.take(2)?; // legacy_version
    r.take(32)?; // random
    r.vec8()?; // legacy_session_id
    r.vec16()?; // cipher_suites
    r.vec8()?; // legacy_compression_methods
    if r.0.is_empty() {
        return Some(None); // no extensions at all
    }
    let mut exts = Reader(r.vec16()?);
    let mut sni = None;
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let data = exts.vec16()?;
        if kind != usize::from(SERVER_NAME) {
            continue;
        }
        if sni.is_some() {
            return None; // two server_name extensions
        }
        let mut list = Reader(Reader(data).vec16()?);
        let mut host = None;
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let name = list.vec16()?;
            if name_type == 0 {
                if host.is_some() {
                    return None; // RFC 6066: one host_name only
                }
                let text = std::str::from_utf8(name).ok()?;
                host = Some(crate::egress_policy::normalize_name(text)?);
            }
        }
        sni = Some(host?);
    }
    Some(sni)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A ClientHello with `sni` (if any) and an unrelated extension, as one record, or split
    /// over records of at most `split` payload bytes.
    pub(crate) fn client_hello(sni: Option<&str>, split: usize) -> Vec<u8> {
        let mut exts = Vec::new();
        // An unrelated extension first (supported_versions).
        exts.extend_from_slice(&[0, 43, 0, 3, 2, 3, 4]);
        if let Some(name) = sni {
            let n = name.len() as u16;
            let list_len = n + 3;
            exts.extend_from_slice(&[0, 0]);
            exts.extend_from_slice(&(list_len + 2).to_be_bytes());
            exts.extend_from_slice(&list_len.to_be_bytes());
            exts.push(0);
            exts.extend_from_slice(&n.to_be_bytes());
            exts.extend_from_slice(name.as_bytes());
        }
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one cipher suite
        body.extend_from_slice(&[1, 0]); // null compression
        body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        body.extend_from_slice(&exts);
        let mut msg = vec![CLIENT_HELLO];
        msg.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        msg.extend_from_slice(&body);
        let mut out = Vec::new();
        for chunk in msg.chunks(split) {
            out.extend_from_slice(&[HANDSHAKE, 3, 1]);
            out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
            out.extend_from_slice(chunk);
        }
        out
    }

    #[test]
    fn reads_the_server_name() {
        assert_eq!(parse(&client_hello(Some("Example.COM"), 4096)), Hello::ClientHello(Some("example.com".into())));
        assert_eq!(parse(&client_hello(None, 4096)), Hello::ClientHello(None));
        assert_eq!(
            parse(&client_hello(Some("a.example.org"), 7)),
            Hello::ClientHello(Some("a.example.org".into())),
            "over several records"
        );
    }

    #[test]
    fn plain_text_and_truncation_are_told_apart() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        assert_eq!(parse(b"SSH-2.0-OpenSSH"), Hello::NotTls);
        let full = client_hello(Some("example.com"), 4096);
        for cut in 0..full.len() {
            assert_eq!(parse(&full[..cut]), Hello::NeedMore, "cut at {cut}");
        }
        let mut bad = full.clone();
        bad[5] = 2; // a ServerHello, not a ClientHello
        assert_eq!(parse(&bad), Hello::Malformed);
        assert_eq!(parse(&client_hello(Some("not a name"), 4096)), Hello::Malformed);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse(&bytes);
            let mut tls = vec![HANDSHAKE, 3, 1];
            tls.extend_from_slice(&bytes);
            let _ = parse(&tls);
        }

        #[test]
        fn any_split_reads_the_same_name(name in "[a-z]{1,10}(\\.[a-z]{1,10}){1,3}", split in 1usize..300) {
            prop_assert_eq!(parse(&client_hello(Some(&name), split)), Hello::ClientHello(Some(name)));
        }
    }
}
