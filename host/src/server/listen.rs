//! The API's accept loop: every TCP connection passes one admission point ([`Admission`])
//! before a byte of it is read, and is closed by this module when it holds a place
//! without using it. It serves the router it is given and never looks at a request:
//! authentication and everything after it are the router's.
//!
//! The rules, all before authentication (no token needed to open a socket):
//! - At most `server.max_connections` are open at once, and at most
//!   `server.max_connections_per_address` from one client address (an IPv6 /64; loopback
//!   clients are not counted, see [`crate::config::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS`]).
//! - A connection is **busy** while a request of it is being served (from its complete head
//!   until its response body is written or dropped: event streams stay busy), **idle**
//!   otherwise; **unproven** until its first request head arrived in full.
//! - Past either cap, a new connection closes the idle connection to shed (see
//!   [`Admission::admit`]): unproven before proven, then the one idle longest — of the
//!   same address for the per-address cap. Busy connections are never closed. Only when
//!   every place is busy does the new connection wait (the total cap) or get closed (the
//!   address cap).
//! - A connection's first request head must arrive whole within
//!   `server.first_request_timeout` (5 s); later heads, and keep-alive idleness, within
//!   `server.header_read_timeout` (hyper's HTTP/1 timer).
//!
//! Why shed the oldest idle connection instead of refusing the new one: refusing lets
//! whoever holds the places first keep them — 520 sockets that sent nothing made
//! `/healthz` wait 28 s, renewable for ever. A live client sends its request the moment
//! it has connected, so the newest connection is the likeliest to be useful and the
//! oldest idle one the least; a flood then only closes the flood's own sockets, at the
//! rate it opens them, while a request gets its place at once. Why no separate, smaller
//! budget for unproven connections: the shed order already never keeps an unproven
//! connection at the expense of a proven or busy one, without a second number to size.
//!
//! Regressions: `axum::serve` installs no timer, so hyper's header-read timeout never ran
//! and nothing capped connections (a few thousand stalled heads took every file
//! descriptor); then with the cap, 520 connections that sent nothing held its 512 places
//! for the 30 s header timeout, renewable for ever, and `/healthz` waited behind them.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use hyper::body::{Body as HttpBody, Bytes, Frame, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tower::Service;

/// How long the loop waits after a failed `accept` (out of file descriptors, say) before
/// trying again, instead of spinning on the error.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// What connections may hold (`server.max_connections`, `server.max_connections_per_address`,
/// `server.first_request_timeout`, `server.header_read_timeout`).
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub max_connections_per_address: usize,
    pub first_request_timeout: Duration,
    pub header_read_timeout: Duration,
}

/// Who a connection counts against for `server.max_connections_per_address`: an IPv4
/// address, or an IPv6 /64 (one subscriber's usual allocation: per address, a single
/// host could open a place per address of its prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Peer {
    V4(std::net::Ipv4Addr),
    V6Prefix(u64),
}

impl Peer {
    /// The key of `ip`, or `None` for loopback (not counted per address).
    fn of(ip: IpAddr) -> Option<Peer> {
        let ip = ip.to_canonical();
        if ip.is_loopback() {
            return None;
        }
        Some(match ip {
            IpAddr::V4(v4) => Peer::V4(v4),
            IpAddr::V6(v6) => Peer::V6Prefix((u128::from(v6) >> 64) as u64),
        })
    }
}

/// What the service and the admission table know of one connection.
#[derive(Debug)]
struct Activity {
    /// Requests being served (a response body still being written counts).
    busy: AtomicUsize,
    /// Whether a first request head arrived.
    proven: AtomicBool,
    /// When it last became idle, in nanoseconds since `epoch`.
    idle_since: AtomicU64,
    epoch: Instant,
}

impl Activity {
    fn new(epoch: Instant) -> Arc<Self> {
        let now = epoch.elapsed().as_nanos() as u64;
        Arc::new(Activity {
            busy: AtomicUsize::new(0),
            proven: AtomicBool::new(false),
            idle_since: AtomicU64::new(now),
            epoch,
        })
    }

    /// A request head arrived: busy until the guard is dropped (with the response body).
    fn begin(self: &Arc<Self>) -> Busy {
        self.proven.store(true, Ordering::Release);
        self.busy.fetch_add(1, Ordering::AcqRel);
        Busy(self.clone())
    }

    fn is_idle(&self) -> bool {
        self.busy.load(Ordering::Acquire) == 0
    }

    /// The shed order of an idle connection: unproven first, then idle longest.
    fn shed_order(&self) -> (bool, u64) {
        (self.proven.load(Ordering::Acquire), self.idle_since.load(Ordering::Acquire))
    }
}

/// One request being served; dropped with its response body (or the request, if the
/// connection closes first).
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        let now = self.0.epoch.elapsed().as_nanos() as u64;
        self.0.idle_since.store(now, Ordering::Release);
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its connection busy until it is written or dropped.
struct Tracked {
    inner: Body,
    _busy: Busy,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// One open connection in the table.
struct Open {
    peer: Option<Peer>,
    activity: Arc<Activity>,
    shed: CancellationToken,
}

/// What [`Admission::admit`] decided for a new connection.
#[derive(Debug)]
enum Admit {
    /// Serve it as connection `id` (a shed connection, if any, was closed to make room).
    Serve { id: u64, activity: Arc<Activity>, shed: CancellationToken },
    /// Every place is busy serving requests: wait until one closes, then ask again.
    Wait,
    /// Its address's every place is busy serving requests: close it.
    Refuse,
}

/// The open connections and the caps: the one place a connection is let in or shed.
struct Admission {
    limits: ConnectionLimits,
    open: HashMap<u64, Open>,
    per_peer: HashMap<Peer, usize>,
    next_id: u64,
    epoch: Instant,
    /// Connections closed to make room (for the log and tests).
    shed: u64,
}

impl Admission {
    fn new(limits: ConnectionLimits) -> Self {
        Admission { limits, open: HashMap::new(), per_peer: HashMap::new(), next_id: 0, epoch: Instant::now(), shed: 0 }
    }

    /// Lets a connection from `ip` in, shedding first the idle connection the caps name:
    /// past `max_connections_per_address`, that address's unproven-then-longest-idle one
    /// (none idle: [`Admit::Refuse`]); past `max_connections`, anyone's (none idle:
    /// [`Admit::Wait`]).
    fn admit(&mut self, ip: IpAddr) -> Admit {
        let peer = Peer::of(ip);
        if let Some(p) = peer
            && self.per_peer.get(&p).copied().unwrap_or(0) >= self.limits.max_connections_per_address
        {
            match self.victim(|o| o.peer == Some(p)) {
                Some(id) => self.close(id, true),
                None => return Admit::Refuse,
            }
        }
        if self.open.len() >= self.limits.max_connections {
            match self.victim(|_| true) {
                Some(id) => self.close(id, true),
                None => return Admit::Wait,
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        let activity = Activity::new(self.epoch);
        let shed = CancellationToken::new();
        self.open.insert(id, Open { peer, activity: activity.clone(), shed: shed.clone() });
        if let Some(p) = peer {
            *self.per_peer.entry(p).or_default() += 1;
        }
        Admit::Serve { id, activity, shed }
    }

    /// The idle connection among `which` to shed: unproven before proven, then the one
    /// idle longest (the id breaks ties: the older connection).
    fn victim(&self, which: impl Fn(&Open) -> bool) -> Option<u64> {
        self.open
            .iter()
            .filter(|(_, o)| which(o) && o.activity.is_idle())
            .min_by_key(|(id, o)| (o.activity.shed_order(), **id))
            .map(|(id, _)| *id)
    }

    /// Takes connection `id` out of the table; `shed` closes it too (its task sees the token).
    fn close(&mut self, id: u64, shed: bool) {
        let Some(o) = self.open.remove(&id) else { return };
        if let Some(p) = o.peer
            && let Some(n) = self.per_peer.get_mut(&p)
        {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&p);
            }
        }
        if shed {
            self.shed += 1;
            o.shed.cancel();
        }
    }
}

/// Serves `app` on `listener` within `limits` until `shutdown` resolves; then stops
/// accepting, lets each connection finish the request it is serving, and returns once all
/// have closed (long-lived streams end through the server's shutdown token).
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    let table = Arc::new(Mutex::new(Admission::new(limits)));
    let closed = Arc::new(Notify::new());
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    tokio::pin!(shutdown);
    'accept: loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a connection; retrying");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let (id, activity, shed) = loop {
            // Registered before asking, so a close between the answer and the wait is seen.
            let freed = closed.notified();
            let admitted = table.lock().unwrap_or_else(|e| e.into_inner()).admit(peer.ip());
            match admitted {
                Admit::Serve { id, activity, shed } => break (id, activity, shed),
                Admit::Refuse => {
                    tracing::debug!(%peer, "refused: every connection of this address is serving a request");
                    continue 'accept;
                }
                Admit::Wait => tokio::select! {
                    () = freed => {}
                    () = &mut shutdown => break 'accept,
                },
            }
        };
        // Event streams and MCP/SSE replies are written in small pieces: without NODELAY,
        // Nagle's algorithm held each behind the peer's delayed ACK (~40 ms per MCP call).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let service = {
            let (app, activity) = (app.clone(), activity.clone());
            hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let busy = activity.begin();
                let response = app.clone().call(req);
                async move {
                    let response = response.await?;
                    Ok::<_, std::convert::Infallible>(response.map(|inner| Tracked { inner, _busy: busy }))
                }
            })
        };
        let conn = graceful.watch(http.serve_connection(TokioIo::new(tcp), service));
        let (table, closed, first_request) = (table.clone(), closed.clone(), limits.first_request_timeout);
        tokio::spawn(async move {
            tokio::pin!(conn);
            let deadline = tokio::time::sleep(first_request);
            tokio::pin!(deadline);
            let mut waiting_for_first = true;
            loop {
                tokio::select! {
                    ended = &mut conn => {
                        if let Err(e) = ended {
                            tracing::debug!(%peer, error = %e, "connection ended with an error");
                        }
                        break;
                    }
                    () = shed.cancelled() => {
                        tracing::debug!(%peer, "connection closed to make room for a new one");
                        break;
                    }
                    () = &mut deadline, if waiting_for_first => {
                        if !activity.proven.load(Ordering::Acquire) {
                            tracing::debug!(%peer, "connection closed: no request within server.first_request_timeout");
                            break;
                        }
                        waiting_for_first = false;
                    }
                }
            }
            table.lock().unwrap_or_else(|e| e.into_inner()).close(id, false);
            closed.notify_one();
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn limits(max_connections: usize, max_connections_per_address: usize) -> ConnectionLimits {
        ConnectionLimits {
            max_connections,
            max_connections_per_address,
            first_request_timeout: Duration::from_secs(5),
            header_read_timeout: Duration::from_secs(30),
        }
    }

    fn served(a: Admit) -> (u64, Arc<Activity>, CancellationToken) {
        match a {
            Admit::Serve { id, activity, shed } => (id, activity, shed),
            other => panic!("{other:?}"),
        }
    }

    const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn past_the_cap_the_oldest_unproven_connection_is_shed_never_a_busy_one() {
        let mut t = Admission::new(limits(3, 10));
        let (_, a_act, a_shed) = served(t.admit(LOCAL));
        let (_, b_act, b_shed) = served(t.admit(LOCAL));
        let (_, _c_act, c_shed) = served(t.admit(LOCAL));
        // a serves a request; b has served one and is idle (proven); c never sent one.
        let _busy = a_act.begin();
        drop(b_act.begin());
        let (_, _, _d_shed) = served(t.admit(LOCAL));
        assert!(c_shed.is_cancelled() && !a_shed.is_cancelled() && !b_shed.is_cancelled());
        // The unproven d goes next (c is gone) ...
        let (_, e_act, e_shed) = served(t.admit(LOCAL));
        assert!(!b_shed.is_cancelled());
        // ... and with none unproven left, the proven one idle longest (b, not e); never a.
        drop(e_act.begin());
        served(t.admit(LOCAL));
        assert!(b_shed.is_cancelled() && !e_shed.is_cancelled() && !a_shed.is_cancelled());
        assert_eq!(t.open.len(), 3);
    }

    #[test]
    fn when_every_place_is_busy_the_new_connection_waits_or_is_refused() {
        let mut t = Admission::new(limits(2, 1));
        let remote: IpAddr = "203.0.113.7".parse().unwrap();
        let (_, act, _) = served(t.admit(remote));
        let _busy = act.begin();
        // Its address is full of busy connections: refused; another address is served.
        assert!(matches!(t.admit(remote), Admit::Refuse));
        let (id, act2, _) = served(t.admit("2001:db8::1".parse().unwrap()));
        let _busy2 = act2.begin();
        // Everything busy: wait; a close makes room.
        assert!(matches!(t.admit(LOCAL), Admit::Wait));
        t.close(id, false);
        served(t.admit(LOCAL));
    }

    #[test]
    fn an_address_past_its_cap_sheds_its_own_connection_and_loopback_is_not_counted() {
        let mut t = Admission::new(limits(100, 2));
        let (a, b): (IpAddr, IpAddr) = ("198.51.100.1".parse().unwrap(), "198.51.100.2".parse().unwrap());
        let (_, _, b_shed) = served(t.admit(b));
        let (_, _, a1) = served(t.admit(a));
        let (_, _, a2) = served(t.admit(a));
        served(t.admit(a));
        assert!(a1.is_cancelled() && !a2.is_cancelled() && !b_shed.is_cancelled());
        // One IPv6 /64 is one address.
        served(t.admit("2001:db8:0:1::1".parse().unwrap()));
        served(t.admit("2001:db8:0:1::2".parse().unwrap()));
        served(t.admit("2001:db8:0:1:ffff::3".parse().unwrap()));
        assert_eq!(t.per_peer[&Peer::of("2001:db8:0:1::9".parse().unwrap()).unwrap()], 2);
        for _ in 0..50 {
            served(t.admit(LOCAL));
        }
        assert_eq!(t.shed, 2, "loopback connections are not capped per address");
    }

    proptest! {
        /// Whatever the order of opens, requests and closes: the table never holds more
        /// than the caps, and a busy connection is never shed.
        #[test]
        fn caps_hold_and_busy_connections_are_never_shed(ops in proptest::collection::vec((0u8..4, 0u8..4), 1..200)) {
            let mut t = Admission::new(limits(8, 3));
            let mut conns: Vec<(u64, Arc<Activity>, CancellationToken, Option<Busy>)> = vec![];
            for (op, who) in ops {
                let ip: IpAddr = if who == 0 { LOCAL } else { IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, who)) };
                match op {
                    0 | 1 => match t.admit(ip) {
                        Admit::Serve { id, activity, shed } => conns.push((id, activity, shed, None)),
                        Admit::Wait => {
                            prop_assert!(t.open.values().all(|o| !o.activity.is_idle()));
                        }
                        Admit::Refuse => {}
                    },
                    2 => if let Some(c) = conns.iter_mut().find(|c| c.3.is_none() && !c.2.is_cancelled()) {
                        c.3 = Some(c.1.begin());
                    },
                    _ => if let Some(c) = conns.iter_mut().find(|c| c.3.is_some()) {
                        c.3 = None;
                    },
                }
                for c in &conns {
                    prop_assert!(!(c.2.is_cancelled() && c.3.is_some()), "a busy connection was shed");
                }
                prop_assert!(t.open.len() <= 8);
                prop_assert!(t.per_peer.values().all(|n| *n <= 3));
            }
        }
    }
}
