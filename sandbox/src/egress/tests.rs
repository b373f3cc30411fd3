//! The proxy in-process: a yamux channel in front (the forwarder's side played by the
//! same [`channel::Mux`] in client mode), real TCP servers behind.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::compat::FuturesAsyncReadCompatExt;

use tokio::task::JoinSet;

use super::channel::{Channel, Mux};

use super::*;
use crate::egress_policy::{CredentialConfig, EgressConfig};

/// A TCP server on 127.0.0.1 that keeps what each connection sent (up to a pause or
/// `\r\n\r\n`) and answers `reply`.
struct Upstream {
    port: u16,
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
}

async fn upstream(reply: &'static [u8]) -> Upstream {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else { return };
            let log = log.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(300), s.read(&mut buf)).await {
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                    if got.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                log.lock().unwrap().push(got);
                let _ = s.write_all(reply).await;
                let _ = s.shutdown().await;
            });
        }
    });
    Upstream { port, seen }
}

struct Proxy {
    egress: Arc<Egress>,
    forwarder: Arc<Mux>,
    events: Arc<Mutex<Vec<EgressEvent>>>,
    _channel: Channel,
}

/// A channel of `egress` for session `u/s`, and the forwarder's end of it.
fn channel(egress: &Arc<Egress>) -> (Channel, Arc<Mux>) {
    let (host_side, forwarder_side) = tokio::io::duplex(256 * 1024);
    let channel = egress.attach(host_side, &SessionKey::new("u", "s"), "c1");
    (channel, Arc::new(Mux::start(forwarder_side, yamux::Mode::Client, drop)))
}

/// What a tool connecting to the forwarder gets: a new stream of the channel.
async fn connect_through(forwarder: &Mux) -> tokio_util::compat::Compat<yamux::Stream> {
    forwarder.open().await.unwrap().compat()
}

fn proxy(allow: &[String], credentials: Vec<CredentialConfig>) -> Proxy {
    let cfg = EgressConfig { allow: allow.to_vec(), deny: vec!["denied.example".into()], credentials };
    let policy = cfg.resolve(|n| (n == "TEST_TOKEN").then(|| "tok-123-secret".to_string())).unwrap();
    let egress = Arc::new(Egress::new(policy));
    let events = Arc::new(Mutex::new(Vec::new()));
    let log = events.clone();
    egress.observe(Arc::new(move |r: &EgressReport| log.lock().unwrap().extend(r.decision().cloned())));
    let (channel, forwarder) = channel(&egress);
    Proxy { egress, forwarder, events, _channel: channel }
}

impl Proxy {
    /// Sends `request` and reads until the proxy closes (or 3 s pass).
    async fn exchange(&self, request: &[u8]) -> String {
        let mut s = connect_through(&self.forwarder).await;
        s.write_all(request).await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    async fn events(&self, n: usize) -> Vec<EgressEvent> {
        for _ in 0..100 {
            if self.events.lock().unwrap().len() >= n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        self.events.lock().unwrap().clone()
    }
}

#[tokio::test]
async fn plain_http_is_forwarded_with_the_credential_and_without_proxy_headers() {
    let up = upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello").await;
    let hostport = format!("127.0.0.1:{}", up.port);
    let cred = CredentialConfig {
        host: hostport.clone(),
        header: "X-Api-Key".into(),
        value_env: "TEST_TOKEN".into(),
        format: "Key {}".into(),
    };
    let p = proxy(std::slice::from_ref(&hostport), vec![cred]);
    let req = format!(
        "GET http://{hostport}/path?q=1 HTTP/1.1\r\nHost: {hostport}\r\nProxy-Authorization: Basic Zm9vOmJhcg==\r\nX-Api-Key: forged\r\nConnection: close\r\n\r\n"
    );
    let resp = p.exchange(req.as_bytes()).await;
    assert!(resp.starts_with("HTTP/1.1 200") && resp.ends_with("hello"), "{resp}");
    let seen = String::from_utf8(up.seen.lock().unwrap()[0].clone()).unwrap().to_ascii_lowercase();
    assert!(seen.starts_with("get /path?q=1 http/1.1\r\n"), "origin-form upstream: {seen}");
    assert!(seen.contains("x-api-key: key tok-123-secret\r\n"), "{seen}");
    assert!(!seen.contains("forged") && !seen.contains("proxy-authorization"), "{seen}");
    let ev = p.events(1).await;
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert!(ev[0].allowed && ev[0].kind == "http GET" && ev[0].port == up.port, "{ev:?}");
    assert_eq!(ev[0].bytes_received, 5);
    assert_eq!(ev[0].credential.as_deref(), Some("sandbox.egress.credentials[0]"));
    assert!(!format!("{ev:?}").contains("tok-123"), "events never carry the value");
}

#[tokio::test]
async fn refusals_are_403_and_name_the_rule() {
    let up = upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await;
    let p = proxy(&[format!("127.0.0.1:{}", up.port), "localhost:*".into(), "denied.example".into()], vec![]);
    let cases = [
        (
            "GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n".to_string(),
            "no allow entry names example.com:80",
        ),
        (format!("GET http://localhost:{}/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", up.port), "loopback"),
        (
            "CONNECT 169.254.169.254:80 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_string(),
            "no allow entry names 169.254.169.254:80",
        ),
        (
            "CONNECT denied.example:443 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_string(),
            "deny `denied.example`",
        ),
        (
            format!("GET http://127.0.0.1:{}/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", up.port + 1),
            "no allow entry",
        ),
    ];
    for (req, rule) in &cases {
        let resp = p.exchange(req.as_bytes()).await;
        assert!(resp.starts_with("HTTP/1.1 403 Forbidden by warden egress policy"), "{req}: {resp}");
        assert!(resp.contains(rule), "{req}: {resp}");
    }
    assert!(up.seen.lock().unwrap().is_empty(), "nothing reached the server");
    let ev = p.events(cases.len()).await;
    assert!(ev.iter().all(|e| !e.allowed), "{ev:?}");
    let origin = p.exchange(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
    assert!(origin.starts_with("HTTP/1.1 400"), "{origin}");
}

#[tokio::test]
async fn a_tunnel_opens_only_for_a_tls_client_hello_naming_its_host() {
    let up = upstream(b"pong").await;
    let target = format!("127.0.0.1:{}", up.port);
    let p = proxy(std::slice::from_ref(&target), vec![]);
    let connect = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    // An IP target and a ClientHello without a server name: relayed both ways.
    let hello = sni::tests::client_hello(None, 4096);
    let mut req = connect.clone().into_bytes();
    req.extend_from_slice(&hello);
    let resp = p.exchange(&req).await;
    assert!(resp.starts_with("HTTP/1.1 200") && resp.ends_with("pong"), "{resp}");
    assert_eq!(up.seen.lock().unwrap()[0], hello, "the ClientHello reached the server unchanged");
    // A server name that is not the CONNECT host, and plain text: cut before the server.
    for first in [sni::tests::client_hello(Some("evil.example"), 4096), b"GET / HTTP/1.1\r\n\r\n".to_vec()] {
        let mut req = connect.clone().into_bytes();
        req.extend_from_slice(&first);
        let resp = p.exchange(&req).await;
        assert!(resp.starts_with("HTTP/1.1 200") && !resp.contains("pong"), "{resp}");
    }
    // (The proxy connects before it answers 200, so the server saw two silent connections.)
    for _ in 0..100 {
        if up.seen.lock().unwrap().len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let sent: Vec<usize> = up.seen.lock().unwrap().iter().map(Vec::len).collect();
    assert_eq!(sent, [hello.len(), 0, 0], "no byte of a refused tunnel reached the server");
    let ev = p.events(3).await;
    assert!(ev[0].allowed && ev[0].bytes_sent == hello.len() as u64 && ev[0].bytes_received == 4, "{ev:?}");
    let refused: Vec<&str> = ev[1..].iter().filter(|e| !e.allowed).map(|e| e.rule.as_str()).collect();
    assert!(refused.iter().any(|r| r.contains("server name `evil.example`")), "{refused:?}");
    assert!(refused.iter().any(|r| r.contains("TLS only")), "{refused:?}");
}

#[test]
fn the_ready_check_waits_for_the_forwarders_port_and_exits_with_its_status() {
    let agent = crate::agent::AGENT_SOURCE;
    assert!(agent.contains(&format!("\nFORWARDER_NOT_READY = {FORWARDER_NOT_READY}\n")));
    assert!(agent.contains("socket.create_connection((\"127.0.0.1\", forwarder_port), 0.2)"));
    let serve = forwarder_argv("serve");
    assert_eq!(serve[5..], ["serve".to_string(), FORWARDER_PORT.to_string(), CHANNEL_SOCKET.to_string()]);
    assert_eq!(forwarder_argv("channel")[5..], ["channel".to_string(), CHANNEL_SOCKET.to_string()]);
}

/// Regression (attack review, "egress decisions can be flooded"): every refused CONNECT
/// was a log line, an audit line and an event in each running task's stream, with no
/// bound on how many a second — a looping client wrote the audit log full. Now a flood
/// over 16 connections at once is recorded up to the session's refusal budget and
/// counted past it: nothing is lost, and the records are bounded by the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_refusal_flood_writes_at_most_the_buckets_records() {
    use recorder::REFUSALS;
    const CLIENTS: u64 = 16;
    const EACH: u64 = 40;
    let cfg = EgressConfig { allow: vec!["pypi.org".into()], deny: vec![], credentials: vec![] };
    let egress = Arc::new(Egress::new(cfg.resolve(|_| None).unwrap()));
    let reports = Arc::new(Mutex::new(Vec::new()));
    let log = reports.clone();
    egress.observe(Arc::new(move |r: &EgressReport| log.lock().unwrap().push(r.clone())));
    let (listener, forwarder) = channel(&egress);
    let started = Instant::now();
    let mut clients = JoinSet::new();
    for c in 0..CLIENTS {
        let forwarder = forwarder.clone();
        clients.spawn(async move {
            for i in 0..EACH {
                let mut s = connect_through(&forwarder).await;
                s.write_all(format!("CONNECT x{c}-{i}.example:1 HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
                let mut out = Vec::new();
                let _ = s.read_to_end(&mut out).await;
                assert!(out.starts_with(b"HTTP/1.1 403"), "{}", String::from_utf8_lossy(&out));
            }
        });
    }
    while let Some(r) = clients.join_next().await {
        r.unwrap();
    }
    let elapsed = started.elapsed();
    // The session's proxy ends: what it still counts is reported.
    drop(listener);
    for _ in 0..200 {
        if reports.lock().unwrap().iter().any(|r| matches!(r, EgressReport::Suppressed(_))) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let reports = reports.lock().unwrap().clone();
    let recorded = reports.iter().filter(|r| r.decision().is_some_and(|d| !d.allowed)).count() as u64;
    let counted: u64 = reports
        .iter()
        .filter_map(|r| match r {
            EgressReport::Suppressed(c) => Some(c.refused),
            EgressReport::Decision(_) => None,
        })
        .sum();
    assert!(
        recorded <= REFUSALS.most_over(elapsed),
        "{recorded} refusals recorded in {elapsed:?}; the budget allows {}",
        REFUSALS.most_over(elapsed)
    );
    assert_eq!(recorded + counted, CLIENTS * EACH, "every refusal is recorded or counted");
    assert!(counted > 0, "the flood went past the budget");
}

/// A board standing in for the other replicas: what they hold, and what this one put on it.
struct Board {
    others: Mutex<Result<Vec<SharedNarrowing>, String>>,
    published: Mutex<Vec<(SessionKey, u64, Vec<SharedNarrowing>)>>,
}

impl Default for Board {
    fn default() -> Self {
        Board { others: Mutex::new(Ok(vec![])), published: Mutex::default() }
    }
}

impl EgressBoard for Board {
    fn publish<'a>(
        &'a self,
        key: &'a SessionKey,
        hold: u64,
        narrowings: &'a [SharedNarrowing],
    ) -> BoardFuture<'a, Result<(), String>> {
        self.published.lock().unwrap().push((key.clone(), hold, narrowings.to_vec()));
        Box::pin(async { Ok(()) })
    }
    fn withdraw<'a>(&'a self, _key: &'a SessionKey, hold: u64) -> BoardFuture<'a, ()> {
        self.published.lock().unwrap().retain(|(_, h, _)| *h != hold);
        Box::pin(async {})
    }
    fn others<'a>(&'a self, _key: &'a SessionKey) -> BoardFuture<'a, Result<Vec<SharedNarrowing>, String>> {
        let others = self.others.lock().unwrap().clone();
        Box::pin(async move { others })
    }
}

/// With replicas, a call running on another replica narrows the connections this one
/// serves in the session; a board that cannot be read refuses everything; this replica's
/// own holds go on the board (lists only) and off it when they drop.
#[tokio::test]
async fn another_replicas_running_call_narrows_what_this_one_serves() {
    let up = upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok").await;
    let other = upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok").await;
    let (a, b) = (format!("127.0.0.1:{}", up.port), format!("127.0.0.1:{}", other.port));
    let p = proxy(&[a.clone(), b.clone()], vec![]);
    let board = Arc::new(Board::default());
    p.egress.share_holds(board.clone()).unwrap();
    let get =
        |hostport: &str| format!("GET http://{hostport}/ HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\n\r\n");
    // Positive control: nothing held anywhere, both reached.
    assert!(p.exchange(get(&b).as_bytes()).await.ends_with("ok"));
    *board.others.lock().unwrap() =
        Ok(vec![SharedNarrowing { source: "the task on replica r2 (egress)".into(), allow: vec![a.clone()] }]);
    assert!(p.exchange(get(&a).as_bytes()).await.ends_with("ok"), "inside the other replica's list");
    let refused = p.exchange(get(&b).as_bytes()).await;
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    assert!(refused.contains("outside the egress list of the task on replica r2 (egress)"), "{refused}");
    *board.others.lock().unwrap() = Err("connection refused".into());
    let refused = p.exchange(get(&a).as_bytes()).await;
    assert!(refused.starts_with("HTTP/1.1 403") && refused.contains("could not be read"), "{refused}");
    // This replica's own hold: on the board while held, lists only.
    let key = SessionKey::new("u", "s");
    let mine = Arc::new(EgressNarrowing::parse(std::slice::from_ref(&a), "the task (egress)").unwrap());
    let hold = p.egress.hold(&key, &[mine], &[]).await.unwrap();
    let published = board.published.lock().unwrap().clone();
    assert_eq!(published.len(), 1, "{published:?}");
    assert_eq!(published[0].2, [SharedNarrowing { source: "the task (egress)".into(), allow: vec![a.clone()] }]);
    drop(hold);
    for _ in 0..100 {
        if board.published.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(board.published.lock().unwrap().is_empty(), "withdrawn when the call ends");
}

/// A board that refuses a hold: the hold fails (the call is not run), and leaves nothing
/// held here either.
#[tokio::test]
async fn a_hold_that_cannot_be_shared_is_not_held() {
    struct Refusing;
    impl EgressBoard for Refusing {
        fn publish<'a>(
            &'a self,
            _: &'a SessionKey,
            _: u64,
            _: &'a [SharedNarrowing],
        ) -> BoardFuture<'a, Result<(), String>> {
            Box::pin(async { Err("database down".to_string()) })
        }
        fn withdraw<'a>(&'a self, _: &'a SessionKey, _: u64) -> BoardFuture<'a, ()> {
            Box::pin(async {})
        }
        fn others<'a>(&'a self, _: &'a SessionKey) -> BoardFuture<'a, Result<Vec<SharedNarrowing>, String>> {
            Box::pin(async { Ok(vec![]) })
        }
    }
    let egress = Arc::new(Egress::new(
        EgressConfig { allow: vec!["pypi.org".into()], ..Default::default() }.resolve(|_| None).unwrap(),
    ));
    egress.share_holds(Arc::new(Refusing)).unwrap();
    let key = SessionKey::new("u", "s");
    let n = Arc::new(EgressNarrowing::parse(&["pypi.org".into()], "the task (egress)").unwrap());
    let e = egress.hold(&key, &[n], &[]).await.unwrap_err().to_string();
    assert!(e.contains("could not be shared") && e.contains("database down"), "{e}");
    assert!(egress.holds.lock().unwrap().is_empty(), "nothing held here");
}
