//! How a session container's connections reach the proxy: one byte stream per container
//! and warden process (a `docker exec` of the forwarder in its `channel` mode, attached),
//! carrying a yamux session. The forwarder in the container opens one yamux stream per
//! connection a tool makes to `127.0.0.1:`[`super::FORWARDER_PORT`]; this process serves
//! each as its own proxy connection ([`super::serve_connection`]).
//!
//! Because the stream is a Docker exec, it goes wherever the Docker API goes: a remote
//! Docker host (over its TLS connection) and every replica that serves the session, each
//! with a channel of its own. Nothing reaches a container but what its channels bring: a
//! pool container has none until a session takes it, and a channel is a session's (the
//! process that opened it serves it under that session's key and policy only).
//!
//! With several channels in one container (replicas), the forwarder sends a new connection
//! to the channel that last *claimed* the container ([`Channel::claim`]): each call claims
//! before it runs, so its own connections are served by the replica that holds its
//! narrowing and its task's credentials. Every replica judges by the narrowings of all the
//! session's running calls, wherever they run (`EgressBoard`), so a connection served by
//! another replica is never judged more widely.
//!
//! This module must never serve a stream under another key than its channel's, never
//! buffer past yamux's per-stream window, and never outlive its [`Channel`] (dropping it
//! ends the exec, the yamux session and every connection on it).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::compat::{FuturesAsyncReadCompatExt, TokioAsyncReadCompatExt};

use super::recorder::{self, Recorder};
use super::{Egress, MAX_CONNECTIONS_PER_SESSION, SessionProxy, Slot};
use crate::error::SandboxError;
use crate::session_key::SessionKey;

/// What a claim writes on its stream, and what the forwarder answers.
const CLAIM: &[u8] = b"claim\n";
const CLAIMED: &[u8] = b"ok\n";
/// Time the forwarder has to answer a claim (one round trip through the Docker API).
pub const CLAIM_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest answer read from a claim stream.
const MAX_CLAIM_ANSWER: u64 = 64;
/// Streams yamux lets a channel have at once: the proxy's own bound
/// ([`MAX_CONNECTIONS_PER_SESSION`], which closes any connection past it first) and room
/// for claims; yamux's backstop.
const MAX_STREAMS: usize = MAX_CONNECTIONS_PER_SESSION + 8;
/// yamux's default window of one stream (its `DEFAULT_CREDIT`).
const STREAM_WINDOW: usize = 256 * 1024;
/// What the host buffers for one channel at most: every stream at yamux's default window,
/// never grown (yamux would grow a fast stream's window towards 1 GiB per connection, memory
/// a session's tools could make warden hold outside the container's limits).
const MAX_CHANNEL_BUFFER: usize = MAX_STREAMS * STREAM_WINDOW;

/// A yamux session over a byte stream, driven by a task of its own: inbound streams go to
/// a handler, outbound ones are opened on request. Used both ways round: the proxy's
/// channel (server) and the tests' stand-in for the forwarder (client).
pub(crate) struct Mux {
    opens: mpsc::UnboundedSender<oneshot::Sender<Result<yamux::Stream, String>>>,
    task: JoinHandle<()>,
}

impl Mux {
    /// Starts driving yamux over `io` in `mode`; every inbound stream goes to `inbound`.
    /// Ends when the transport does (or on a protocol error).
    pub(crate) fn start<T, F>(io: T, mode: yamux::Mode, mut inbound: F) -> Mux
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        F: FnMut(yamux::Stream) + Send + 'static,
    {
        let mut config = yamux::Config::default();
        config.set_max_num_streams(MAX_STREAMS);
        config.set_max_connection_receive_window(Some(MAX_CHANNEL_BUFFER));
        let mut conn = yamux::Connection::new(io.compat(), config, mode);
        let (opens, mut requests) = mpsc::unbounded_channel::<oneshot::Sender<Result<yamux::Stream, String>>>();
        let task = tokio::spawn(async move {
            enum Event {
                Opened(Result<yamux::Stream, yamux::ConnectionError>),
                Inbound(Option<Result<yamux::Stream, yamux::ConnectionError>>),
            }
            let mut waiting: VecDeque<oneshot::Sender<Result<yamux::Stream, String>>> = VecDeque::new();
            loop {
                let event = std::future::poll_fn(|cx| {
                    while let std::task::Poll::Ready(Some(w)) = requests.poll_recv(cx) {
                        waiting.push_back(w);
                    }
                    if !waiting.is_empty()
                        && let std::task::Poll::Ready(r) = conn.poll_new_outbound(cx)
                    {
                        return std::task::Poll::Ready(Event::Opened(r));
                    }
                    conn.poll_next_inbound(cx).map(Event::Inbound)
                })
                .await;
                match event {
                    Event::Opened(r) => {
                        if let Some(w) = waiting.pop_front() {
                            let _ = w.send(r.map_err(|e| e.to_string()));
                        }
                    }
                    Event::Inbound(Some(Ok(stream))) => inbound(stream),
                    Event::Inbound(Some(Err(_)) | None) => break,
                }
            }
            for w in waiting {
                let _ = w.send(Err("the channel closed".into()));
            }
        });
        Mux { opens, task }
    }

    /// Opens a stream to the other side.
    pub(crate) async fn open(&self) -> Result<yamux::Stream, String> {
        let (tx, rx) = oneshot::channel();
        self.opens.send(tx).map_err(|_| "the channel closed".to_string())?;
        rx.await.map_err(|_| "the channel closed".to_string())?
    }

    /// Whether the yamux session still runs (its transport is open).
    pub(crate) fn is_alive(&self) -> bool {
        !self.task.is_finished()
    }
}

impl Drop for Mux {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A session's channel into one container: dropping it ends every connection it carries.
pub(crate) struct Channel {
    mux: Mux,
    /// The container it reaches.
    container: String,
    /// Reports the session recorder's counts when due.
    ticker: JoinHandle<()>,
    /// Dropped with the channel: every tunnel of the session through it ends.
    _closing: tokio::sync::watch::Sender<()>,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel").field("container", &self.container).finish_non_exhaustive()
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.ticker.abort();
    }
}

impl Channel {
    /// Whether it still carries connections of container `id`.
    pub(crate) fn serves(&self, id: &str) -> bool {
        self.container == id && self.mux.is_alive()
    }

    /// Asks the forwarder to send new connections through this channel, and waits for its
    /// answer (which also proves the whole way there works).
    pub(crate) async fn claim(&self) -> Result<(), SandboxError> {
        let fail = |m: String| SandboxError::Docker { action: "claim the egress channel".into(), message: m };
        let stream = self.mux.open().await.map_err(fail)?;
        let mut stream = stream.compat();
        let exchange = async {
            stream.write_all(CLAIM).await?;
            stream.shutdown().await?;
            let mut answer = Vec::new();
            (&mut stream).take(MAX_CLAIM_ANSWER).read_to_end(&mut answer).await?;
            Ok::<_, std::io::Error>(answer)
        };
        match tokio::time::timeout(CLAIM_TIMEOUT, exchange).await {
            Ok(Ok(answer)) if answer == CLAIMED => Ok(()),
            Ok(Ok(answer)) => Err(fail(format!(
                "the forwarder answered {:?}, not {:?}",
                String::from_utf8_lossy(&answer),
                String::from_utf8_lossy(CLAIMED)
            ))),
            Ok(Err(e)) => Err(fail(e.to_string())),
            Err(_) => Err(fail(format!("no answer within {}s", CLAIM_TIMEOUT.as_secs()))),
        }
    }
}

/// Time a stream dropped unclosed has to send its FIN.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// A proxy connection's stream that ends with a FIN, never a reset, however its server
/// lets go of it: yamux resets a stream dropped without a close, and the forwarder would
/// then cut the tool's connection before it read the last answer (a refusal with
/// `Connection: close`, say). Dropped unclosed, it closes on a task of its own.
struct Graceful(Option<tokio_util::compat::Compat<yamux::Stream>>);

impl Graceful {
    fn inner(&mut self) -> std::pin::Pin<&mut tokio_util::compat::Compat<yamux::Stream>> {
        std::pin::Pin::new(self.0.as_mut().expect("taken only in drop"))
    }
}

impl AsyncRead for Graceful {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.inner().poll_read(cx, buf)
    }
}

impl AsyncWrite for Graceful {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.inner().poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.inner().poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.inner().poll_shutdown(cx)
    }
}

impl Drop for Graceful {
    fn drop(&mut self) {
        if let (Some(mut stream), Ok(rt)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            // A closed stream closes again at once (yamux keeps its state).
            rt.spawn(async move {
                let _ = tokio::time::timeout(CLOSE_TIMEOUT, stream.shutdown()).await;
            });
        }
    }
}

impl Egress {
    /// Serves `key`'s proxy on the yamux session over `io` (the server side): every stream
    /// the other side opens is one proxy connection of the session. `container` names what
    /// `io` reaches.
    pub(crate) fn attach<T>(self: &Arc<Self>, io: T, key: &SessionKey, container: &str) -> Channel
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (closing, closed) = tokio::sync::watch::channel(());
        let session = Arc::new(SessionProxy {
            egress: self.clone(),
            key: key.clone(),
            slots: Arc::new(Semaphore::new(MAX_CONNECTIONS_PER_SESSION)),
            closed,
            recorder: Mutex::new(Recorder::new(key.clone(), Instant::now())),
        });
        let s = session.clone();
        let mut connections = JoinSet::new();
        let mux = Mux::start(io, yamux::Mode::Server, move |stream| {
            while connections.try_join_next().is_some() {}
            let Ok(permit) = s.slots.clone().try_acquire_owned() else {
                let (log, due) = s.recorder().connection_closed(Instant::now());
                s.emit(due, None);
                if log {
                    tracing::warn!(user = %s.key.user_id, session = %s.key.session_id, max = MAX_CONNECTIONS_PER_SESSION, "egress: too many connections; closing one");
                }
                return;
            };
            let s = s.clone();
            connections.spawn(async move {
                let slot: Slot = Arc::new(Mutex::new(Some(permit)));
                super::serve_connection(Graceful(Some(stream.compat())), s, slot).await;
            });
        });
        let ticker = tokio::spawn(async move {
            let mut tick = tokio::time::interval(recorder::SUPPRESSED_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                session.report_due();
            }
        });
        Channel { mux, container: container.to_string(), ticker, _closing: closing }
    }

    /// Opens a channel into the running container `id` for `key`'s session (an attached exec
    /// of the forwarder's `channel` mode) and claims it.
    pub(crate) async fn open_channel(
        self: &Arc<Self>,
        docker: &bollard::Docker,
        id: &str,
        key: &SessionKey,
    ) -> Result<Channel, SandboxError> {
        let io =
            crate::exec::start_attached(docker, id, super::FORWARDER_USER, super::forwarder_argv("channel")).await?;
        let channel = self.attach(io, key, id);
        channel.claim().await?;
        Ok(channel)
    }
}
