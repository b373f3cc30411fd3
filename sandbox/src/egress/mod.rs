//! Egress through warden's proxy (`sandbox.egress`): the only way out of a session
//! container that has no network.
//!
//! Every container made while egress is configured runs a tiny forwarder (`forwarder.py`,
//! its own unprivileged user) on `127.0.0.1:`[`FORWARDER_PORT`]; `HTTP_PROXY` and
//! `HTTPS_PROXY` name it. The forwarder relays each connection over a *channel*
//! (`channel.rs`): a `docker exec` that the warden process serving the session opens into
//! the container, carrying a yamux session, so the proxy stays in this process wherever
//! the container runs (a remote Docker host, another replica's container). A pool container
//! has no channel until a session takes it, so it reaches nothing; a channel is opened for
//! one session and serves it only: the channel that carries a connection *is* the session,
//! and so the policy.
//!
//! The proxy (hyper) serves CONNECT tunnels and absolute-form plain-HTTP requests. It
//! judges the host (the policy of `egress_policy.rs`, below this module with the rest of
//! the configuration), resolves names itself, checks every address, and connects to the
//! checked address (never a second resolution). A tunnel must start with a
//! TLS ClientHello whose server name is the CONNECT host (`sni.rs`); anything else is cut.
//! Credentials are added to plain-HTTP requests to their host only — the operator's
//! always, a task's (`Credential::task`) only while a call of that task holds it
//! ([`EgressHold`]); their values live in this process only. With replicas, the
//! narrowings of the session's calls running on other replicas are read from the
//! [`EgressBoard`] for every decision. Every decision passes the session's bounded recorder
//! (`recorder.rs`): within its budget it is logged (`tracing`, fields only) and reported
//! to the observers ([`crate::Sandbox::on_egress`]) with the bytes moved; past it, it is
//! counted and the count reported.
//!
//! This module must never place a credential in a container, never connect to an address
//! it did not check, never serve a connection under another session than its channel's,
//! never judge more widely than every running call of the session allows, never report a
//! decision but through the session's recorder, and never hold more than its named bounds
//! (connections, header bytes, idle time, records).
//!
//! It sits below the containers (`container.rs` starts a container's forwarder with what
//! this module names) and knows a session by its key only.

pub mod channel;
pub mod recorder;
pub mod sni;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use self::recorder::Recorder;
pub use self::recorder::{EgressReport, EgressSuppressed};
/// The forwarder's `uid:gid`, defined with the settings (which keep `sandbox.user` off it).
pub use crate::config::FORWARDER_USER;
/// The egress policy under its former path (`egress::policy`).
pub use crate::egress_policy as policy;
pub use crate::egress_policy::{
    Credential, CredentialConfig, CredentialField, EgressConfig, EgressNarrowing, EgressPolicy, Target, TargetHost,
    address_class,
};
use crate::error::SandboxError;
use crate::session_key::SessionKey;

/// The forwarder's socket for its channels: in a directory of the forwarder's user alone
/// (0700, made by the forwarder, which starts before any sandboxed code and refuses one it
/// did not make), so no sandboxed process can connect to it or take its name — the file
/// system's permissions hold under every runtime, where a peer-credential check alone
/// (which both ends also make) depends on the kernel (gVisor's). `/tmp` is the container's
/// own tmpfs: gone with a stop, made afresh at each start.
pub const CHANNEL_SOCKET: &str = "/tmp/.warden-egress/channels.sock";
/// Port of the in-container forwarder on 127.0.0.1 (what `HTTP_PROXY` names).
pub const FORWARDER_PORT: u16 = 3128;
/// Exit status of the container setup (the agent's `prepare`, which waits up to 10 s, 200
/// polls of 50 ms, until the forwarder accepts connections, so no tool call can run before
/// it) when the forwarder never listened (`agent.py`'s `FORWARDER_NOT_READY`).
pub(crate) const FORWARDER_NOT_READY: i64 = 3;
/// Connections one session may have open through the proxy at once; more are closed at once.
pub const MAX_CONNECTIONS_PER_SESSION: usize = 64;
/// Largest request head (request line and headers) the proxy reads.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Most request headers the proxy accepts.
pub const MAX_HEADERS: usize = 128;
/// Time a client has to send a request head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Time to resolve a name.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time to connect to one address.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Addresses of one name tried in turn before the proxy gives up.
pub const MAX_ADDRESSES_TRIED: usize = 4;
/// Time a tunnel's client has to send its TLS ClientHello.
pub const CLIENT_HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// A tunnel or plain-HTTP exchange with no byte moving either way for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// How often an idle direction of a tunnel looks at the other direction's activity.
const IDLE_POLL: Duration = Duration::from_secs(5);
/// Buffer of each tunnel direction.
const COPY_BUFFER: usize = 64 * 1024;
/// The forwarder's source (comments stripped at use).
const FORWARDER_SOURCE: &str = include_str!("forwarder.py");

/// Longest rule text an egress event keeps (rules quote the host asked for).
const MAX_RULE_LEN: usize = 1024;
/// Longest request method an egress event keeps (`http <method>`); longer ones are cut.
const MAX_METHOD_LEN: usize = 32;

/// `text` cut to at most `max` bytes (at a character boundary), saying how long it was:
/// a sandbox choosing a 60 KiB host name must not write 60 KiB audit lines.
fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    format!("{}…({} bytes)", &text[..text.floor_char_boundary(max)], text.len())
}

/// One egress decision, as audited and streamed. Never holds a credential.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EgressEvent {
    /// The session whose sandbox asked.
    pub session: SessionKey,
    /// `connect` (a tunnel) or `http` (a plain-HTTP request, with its method).
    pub kind: String,
    pub host: String,
    pub port: u16,
    pub allowed: bool,
    /// The rule that decided: `allow \`pypi.org\``, `deny \`…\``, `no allow entry …`, …
    pub rule: String,
    /// Bytes from the sandbox to the server (tunnel payload, or request body).
    pub bytes_sent: u64,
    /// Bytes from the server to the sandbox.
    pub bytes_received: u64,
    /// Whether the proxy added a credential (its name, never its value).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
}

/// Receives what each session's recorder reports: decisions within its budget, and counts
/// of those past it (audit log, task streams). Called on proxy tasks: must not block.
pub type EgressObserver = Arc<dyn Fn(&EgressReport) + Send + Sync>;

/// One call's hold on a narrowing: the hold's id (so it removes only its own entry) and
/// the list.
type HeldNarrowing = (u64, Arc<EgressNarrowing>);
/// One call's hold on a task's credential (a `tool_context` entry with `inject`): the
/// hold's id and the credential.
type HeldCredential = (u64, Arc<Credential>);

/// The egress side of one `Sandbox`: the policy, the observers, the narrowings of running
/// calls, and (with replicas) the board sharing them.
pub(crate) struct Egress {
    pub(crate) policy: Arc<EgressPolicy>,
    /// Where the narrowings of calls are shared with the other replicas (set once by the
    /// host with `--replica-id`; `None`: this process serves every call of its sessions).
    board: std::sync::OnceLock<Arc<dyn EgressBoard>>,
    observers: Mutex<Vec<EgressObserver>>,
    /// The narrowings held by the calls running in each session ([`EgressHold`]): while any
    /// is held, the session's proxy judges every new connection and request by the policy
    /// narrowed by all of them. Entries leave with their last hold.
    holds: Mutex<HashMap<SessionKey, Vec<HeldNarrowing>>>,
    /// The task credentials held by the calls running in each session ([`EgressHold`]):
    /// added to the session's plain-HTTP requests to their host while held, never after.
    credentials: Mutex<HashMap<SessionKey, Vec<HeldCredential>>>,
    next_hold: AtomicU64,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress").field("shared", &self.board.get().is_some()).finish_non_exhaustive()
    }
}

impl Egress {
    /// The egress of a sandbox with `policy`.
    pub(crate) fn new(policy: EgressPolicy) -> Egress {
        Egress {
            policy: Arc::new(policy),
            board: std::sync::OnceLock::new(),
            observers: Mutex::new(vec![]),
            holds: Mutex::default(),
            credentials: Mutex::default(),
            next_hold: AtomicU64::new(0),
        }
    }

    /// Shares this process's holds through `board`, and reads the other replicas' from it
    /// (once; a second board is refused).
    pub(crate) fn share_holds(&self, board: Arc<dyn EgressBoard>) -> Result<(), SandboxError> {
        self.board.set(board).map_err(|_| SandboxError::Config("the egress board is set once".into()))
    }

    /// Narrows `key`'s egress by `narrowings`, and adds `credentials` to its requests,
    /// until the hold drops (see [`EgressHold`]). With replicas the narrowings are on the
    /// board before this returns; when they cannot be, nothing is held and the call must
    /// not run.
    pub(crate) async fn hold(
        self: &Arc<Self>,
        key: &SessionKey,
        narrowings: &[Arc<EgressNarrowing>],
        credentials: &[Arc<Credential>],
    ) -> Result<EgressHold, SandboxError> {
        let mut ids = Vec::with_capacity(narrowings.len() + credentials.len());
        if !narrowings.is_empty() {
            let mut holds = self.holds.lock().unwrap_or_else(|e| e.into_inner());
            let held = holds.entry(key.clone()).or_default();
            for n in narrowings {
                let id = self.next_hold.fetch_add(1, Ordering::Relaxed);
                held.push((id, n.clone()));
                ids.push(id);
            }
        }
        if !credentials.is_empty() {
            let mut holds = self.credentials.lock().unwrap_or_else(|e| e.into_inner());
            let held = holds.entry(key.clone()).or_default();
            for c in credentials {
                let id = self.next_hold.fetch_add(1, Ordering::Relaxed);
                held.push((id, c.clone()));
                ids.push(id);
            }
        }
        let mut hold = EgressHold { egress: Some(self.clone()), key: key.clone(), ids, published: None };
        if let (Some(board), Some(&id)) = (self.board.get(), hold.ids.first())
            && !narrowings.is_empty()
        {
            let shared: Vec<SharedNarrowing> = narrowings.iter().map(|n| SharedNarrowing::of(n)).collect();
            // Withdrawn on drop whatever happens from here (a publish that committed and
            // then failed or was cancelled leaves no row behind; a second withdraw is harmless).
            hold.published = Some((board.clone(), id));
            board.publish(key, id, &shared).await.map_err(|e| {
                SandboxError::Egress(format!(
                    "this call's egress list could not be shared with the other replicas ({e}); it was not run"
                ))
            })?;
        }
        Ok(hold)
    }

    /// The task credentials held in `key`'s session now that apply to `target`, one per
    /// header; `Err` (the refusal's rule) when running calls hold different values for one
    /// header of that host (two tasks of the session with their own credentials for it:
    /// neither may be sent on the other's behalf, so the request gets none and is refused).
    fn task_credentials_for(&self, key: &SessionKey, target: &Target) -> Result<Vec<Arc<Credential>>, String> {
        let holds = self.credentials.lock().unwrap_or_else(|e| e.into_inner());
        let Some(held) = holds.get(key) else { return Ok(vec![]) };
        let mut chosen: Vec<Arc<Credential>> = vec![];
        for (_, c) in held.iter().filter(|(_, c)| c.applies_to(target)) {
            match chosen.iter().find(|o| o.header.eq_ignore_ascii_case(&c.header)) {
                None => chosen.push(c.clone()),
                Some(o) if o.value == c.value => {}
                Some(o) => {
                    return Err(format!(
                        "running calls of this session hold different credentials for header {} of {target} ({} and {}); \
                         run those tasks in sessions of their own",
                        o.header, o.name, c.name
                    ));
                }
            }
        }
        Ok(chosen)
    }

    /// The policy `key`'s proxy applies now: the operator's, narrowed by every narrowing
    /// this process's running calls hold (the narrowest wins when concurrent calls differ).
    fn policy_for(&self, key: &SessionKey) -> Arc<EgressPolicy> {
        let holds = self.holds.lock().unwrap_or_else(|e| e.into_inner());
        match holds.get(key) {
            None => self.policy.clone(),
            Some(held) => {
                // One layer per distinct narrowing: concurrent calls of one task hold the same.
                let mut distinct: Vec<&EgressNarrowing> = Vec::with_capacity(held.len());
                for (_, n) in held {
                    if !distinct.contains(&&**n) {
                        distinct.push(n);
                    }
                }
                Arc::new(self.policy.narrowed(distinct))
            }
        }
    }

    /// With replicas, `policy` (this process's) narrowed further by the lists the
    /// session's calls on the other replicas hold (the board); `None` when they hold none.
    /// `Err` (the refusal's rule) when the board cannot be read: what those calls allow is
    /// then unknown, so nothing is. Asked only for what `policy` admits (a narrowing only
    /// takes away), so a flood of refused requests costs the board nothing.
    async fn with_other_replicas(
        &self,
        key: &SessionKey,
        policy: &EgressPolicy,
    ) -> Result<Option<Arc<EgressPolicy>>, String> {
        let Some(board) = self.board.get() else { return Ok(None) };
        let others = board.others(key).await.map_err(|e| {
            format!("the egress lists of this session's calls on other replicas could not be read ({e})")
        })?;
        if others.is_empty() {
            return Ok(None);
        }
        let mut layers: Vec<EgressNarrowing> = vec![];
        for shared in others {
            // An entry that no longer parses narrows to nothing (deny by default).
            let n = EgressNarrowing::parse(&shared.allow, shared.source.clone())
                .or_else(|_| EgressNarrowing::parse(&[], shared.source))
                .map_err(|e| e.to_string())?;
            if !layers.contains(&n) {
                layers.push(n);
            }
        }
        Ok(Some(Arc::new(policy.narrowed(&layers))))
    }

    pub(crate) fn observe(&self, observer: EgressObserver) {
        self.observers.lock().unwrap_or_else(|e| e.into_inner()).push(observer);
    }

    /// Logs and hands `report` to every observer. Only a session's recorder calls it
    /// ([`SessionProxy::report`]).
    fn emit(&self, report: &EgressReport) {
        match report {
            EgressReport::Decision(ev) => tracing::info!(
                user = %ev.session.user_id, session = %ev.session.session_id, kind = %ev.kind, host = %ev.host, port = ev.port,
                allowed = ev.allowed, rule = %ev.rule, bytes_sent = ev.bytes_sent, bytes_received = ev.bytes_received,
                credential = ev.credential.as_deref().unwrap_or(""), "egress"
            ),
            EgressReport::Suppressed(c) => tracing::warn!(
                user = %c.session.user_id, session = %c.session.session_id, refused = c.refused, allowed = c.allowed,
                connections_closed = c.connections_closed, bytes_sent = c.bytes_sent, bytes_received = c.bytes_received,
                hosts = ?c.hosts, seconds = c.seconds,
                "egress: decisions past the session's record budget were counted, not recorded one by one"
            ),
        }
        let observers = self.observers.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for o in observers {
            o(report);
        }
    }
}

/// A call's narrowing of its session's egress, and its task's credentials
/// ([`crate::Sandbox::hold_egress_with`]): new connections and requests of the session are
/// judged by the narrowed policy, and its plain-HTTP requests to a held credential's host
/// get that credential, until it drops. Connections already open keep the decision they
/// got; a request sent after the drop gets no task credential.
#[must_use = "the narrowing holds only while the hold lives"]
pub struct EgressHold {
    egress: Option<Arc<Egress>>,
    key: SessionKey,
    ids: Vec<u64>,
    /// The board its narrowings are on, under this id (withdrawn on drop).
    published: Option<(Arc<dyn EgressBoard>, u64)>,
}

impl EgressHold {
    /// A hold that narrows nothing (no egress configured).
    pub(crate) fn none(key: &SessionKey) -> EgressHold {
        EgressHold { egress: None, key: key.clone(), ids: vec![], published: None }
    }
}

impl std::fmt::Debug for EgressHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressHold").field("key", &self.key).field("ids", &self.ids).finish_non_exhaustive()
    }
}

impl Drop for EgressHold {
    fn drop(&mut self) {
        if let Some((board, id)) = self.published.take() {
            // Off the board at once; if that fails, the row stays (narrowing the session on
            // the other replicas, never widening it) until this replica's lease runs out or
            // it starts again (which clears its rows).
            let key = self.key.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move { board.withdraw(&key, id).await });
            }
        }
        let (Some(egress), false) = (&self.egress, self.ids.is_empty()) else { return };
        let mut holds = egress.holds.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = holds.get_mut(&self.key) {
            held.retain(|(id, _)| !self.ids.contains(id));
            if held.is_empty() {
                holds.remove(&self.key);
            }
        }
        drop(holds);
        let mut credentials = egress.credentials.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = credentials.get_mut(&self.key) {
            held.retain(|(id, _)| !self.ids.contains(id));
            if held.is_empty() {
                credentials.remove(&self.key);
            }
        }
    }
}

/// The container side of egress: the proxy environment of every container.
pub(crate) fn container_env() -> Vec<String> {
    let proxy = format!("http://127.0.0.1:{FORWARDER_PORT}");
    let no_proxy = "localhost,127.0.0.1,::1";
    vec![
        format!("HTTP_PROXY={proxy}"),
        format!("HTTPS_PROXY={proxy}"),
        format!("http_proxy={proxy}"),
        format!("https_proxy={proxy}"),
        format!("NO_PROXY={no_proxy}"),
        format!("no_proxy={no_proxy}"),
    ]
}

/// The forwarder's command line in `mode`: `serve` (run detached as [`FORWARDER_USER`] when
/// the container starts: the listener on [`FORWARDER_PORT`]) or `channel` (an attached exec
/// of the same user: one warden process's channel, see `channel.rs`).
pub(crate) fn forwarder_argv(mode: &str) -> Vec<String> {
    let code: String = FORWARDER_SOURCE
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    let mut argv = vec!["python3".into(), "-I".into(), "-S".into(), "-c".into(), code, mode.into()];
    if mode == "serve" {
        argv.push(FORWARDER_PORT.to_string());
    }
    argv.push(CHANNEL_SOCKET.into());
    argv
}

/// A call's narrowing as the board keeps it: the entries as written and who narrows.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SharedNarrowing {
    pub source: String,
    pub allow: Vec<String>,
}

impl SharedNarrowing {
    fn of(n: &EgressNarrowing) -> SharedNarrowing {
        SharedNarrowing { source: n.source().to_string(), allow: n.entries().map(str::to_string).collect() }
    }
}

/// A boxed future, as the board's methods return (the trait is used as `dyn`).
pub type BoardFuture<'a, T> = Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Where replicas share the narrowings of their running calls, per session: a session's
/// connections may be served by any replica that has a channel into its container, and
/// each judges by every running call's list ([`crate::Sandbox::share_egress_holds`]; the
/// host's store implements it on PostgreSQL). Rows name their replica, so the holds of a
/// replica that dies lapse with its lease. Task credentials are never on it: their values
/// stay in the process of the call that holds them.
pub trait EgressBoard: Send + Sync + 'static {
    /// Puts `narrowings`, held by a call of this replica under `hold`, on the board;
    /// returns once every replica would read them.
    fn publish<'a>(
        &'a self,
        key: &'a SessionKey,
        hold: u64,
        narrowings: &'a [SharedNarrowing],
    ) -> BoardFuture<'a, Result<(), String>>;
    /// Takes this replica's `hold` off the board.
    fn withdraw<'a>(&'a self, key: &'a SessionKey, hold: u64) -> BoardFuture<'a, ()>;
    /// The narrowings held in `key`'s session by the calls of the *other* live replicas.
    fn others<'a>(&'a self, key: &'a SessionKey) -> BoardFuture<'a, Result<Vec<SharedNarrowing>, String>>;
}

struct SessionProxy {
    egress: Arc<Egress>,
    key: SessionKey,
    slots: Arc<Semaphore>,
    /// Changes (errs) when the session's listener drops: its tunnels end.
    closed: tokio::sync::watch::Receiver<()>,
    /// The session's record budget: every decision passes it ([`SessionProxy::report`]).
    recorder: Mutex<Recorder>,
}

impl SessionProxy {
    fn recorder(&self) -> std::sync::MutexGuard<'_, Recorder> {
        self.recorder.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reports `ev` through the session's recorder: itself within the budget, counted
    /// past it (and a count that came due first).
    fn report(&self, ev: EgressEvent) {
        let reports = self.recorder().decide(ev, Instant::now());
        self.emit(reports.suppressed, reports.decision);
    }

    /// Reports the count if it is due (the accept loop's tick).
    fn report_due(&self) {
        let due = self.recorder().due(Instant::now());
        self.emit(due, None);
    }

    fn emit(&self, suppressed: Option<EgressSuppressed>, decision: Option<EgressEvent>) {
        if let Some(c) = suppressed {
            self.egress.emit(&EgressReport::Suppressed(c));
        }
        if let Some(ev) = decision {
            self.egress.emit(&EgressReport::Decision(ev));
        }
    }
}

impl Drop for SessionProxy {
    /// The last connection, tunnel and the accept loop are gone: what is still counted is
    /// reported now.
    fn drop(&mut self) {
        let last = self.recorder().flush(Instant::now());
        self.emit(last, None);
    }
}

/// A connection's slot among [`MAX_CONNECTIONS_PER_SESSION`]: held by the connection, and
/// taken over by its tunnel when it becomes one (hyper's connection ends at the upgrade).
type Slot = Arc<Mutex<Option<tokio::sync::OwnedSemaphorePermit>>>;

/// Serves one connection of the session's forwarder (a channel's stream) as an HTTP/1
/// proxy connection.
async fn serve_connection<T>(stream: T, session: Arc<SessionProxy>, slot: Slot)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| {
        let s = session.clone();
        let slot = slot.clone();
        async move { Ok::<_, Infallible>(handle(req, s, slot).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES)
        .max_headers(MAX_HEADERS)
        .serve_connection(TokioIo::new(stream), svc)
        .with_upgrades();
    let _ = conn.await;
}

type ProxyBody = BoxBody<Bytes, hyper::Error>;

fn text_response(status: StatusCode, reason: Option<String>, text: String) -> Response<ProxyBody> {
    let mut r = Response::new(Full::new(Bytes::from(text + "\n")).map_err(|never: Infallible| match never {}).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    if let Some(reason) = reason.and_then(|t| hyper::ext::ReasonPhrase::try_from(t.into_bytes()).ok()) {
        r.extensions_mut().insert(reason);
    }
    r
}

/// A refusal the tool sees: 403, the rule in the body and in the reason phrase (which is
/// what clients print for a refused CONNECT).
fn refused(what: &str, rule: &str) -> Response<ProxyBody> {
    let reason: String = format!("Forbidden by warden egress policy: {rule}")
        .chars()
        .map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' })
        .take(200)
        .collect();
    let mut r =
        text_response(StatusCode::FORBIDDEN, Some(reason), format!("warden egress proxy: {what} refused: {rule}"));
    // A refusal ends the connection: no pipelined stream of refused requests on one.
    r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

impl SessionProxy {
    fn event(&self, kind: &str, target: &str, port: u16, allowed: bool, rule: &str) -> EgressEvent {
        EgressEvent {
            session: self.key.clone(),
            kind: bounded(kind, MAX_METHOD_LEN),
            host: bounded(target, crate::egress_policy::MAX_HOST_LEN),
            port,
            allowed,
            rule: bounded(rule, MAX_RULE_LEN),
            bytes_sent: 0,
            bytes_received: 0,
            credential: None,
        }
    }

    /// Judges `target` and resolves it: the admitting rule and the checked addresses.
    async fn decide(&self, target: &Target) -> Result<(String, Vec<SocketAddr>), String> {
        let mut policy = self.egress.policy_for(&self.key);
        let mut admitted = policy.admit(target).map_err(|d| d.rule)?;
        if let Some(narrower) = self.egress.with_other_replicas(&self.key, &policy).await? {
            admitted = narrower.admit(target).map_err(|d| d.rule)?;
            policy = narrower;
        }
        let addrs: Vec<SocketAddr> = match &target.host {
            TargetHost::Ip(ip) => vec![SocketAddr::new(*ip, target.port)],
            TargetHost::Name(name) => {
                match tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((name.as_str(), target.port))).await
                {
                    Ok(Ok(a)) => a.collect(),
                    Ok(Err(e)) => return Err(format!("{name} does not resolve ({e})")),
                    Err(_) => return Err(format!("resolving {name} took longer than {}s", RESOLVE_TIMEOUT.as_secs())),
                }
            }
        };
        if addrs.is_empty() {
            return Err(format!("{} has no address", target));
        }
        for a in &addrs {
            policy.check_address(target, a.ip()).map_err(|d| d.rule)?;
        }
        Ok((admitted.rule, addrs))
    }
}

/// Connects to the first reachable of the checked `addrs`.
async fn connect(addrs: &[SocketAddr]) -> Result<TcpStream, String> {
    let mut last = String::from("no address");
    for a in addrs.iter().take(MAX_ADDRESSES_TRIED) {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(a)).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => last = format!("{a}: {e}"),
            Err(_) => last = format!("{a}: no answer within {}s", CONNECT_TIMEOUT.as_secs()),
        }
    }
    Err(last)
}

async fn handle(req: Request<Incoming>, s: Arc<SessionProxy>, slot: Slot) -> Response<ProxyBody> {
    if req.method() == Method::CONNECT {
        return handle_connect(req, s, slot).await;
    }
    match req.uri().scheme_str() {
        Some("http") => handle_http(req, s).await,
        Some(_) => text_response(
            StatusCode::BAD_REQUEST,
            None,
            "warden egress proxy: only http:// requests are forwarded as such; HTTPS goes through CONNECT".into(),
        ),
        None => text_response(
            StatusCode::BAD_REQUEST,
            None,
            "warden egress proxy: this is an HTTP proxy; send absolute-form requests (set HTTP_PROXY) or CONNECT"
                .into(),
        ),
    }
}

async fn handle_connect(req: Request<Incoming>, s: Arc<SessionProxy>, slot: Slot) -> Response<ProxyBody> {
    let Some((host, port)) = req.uri().authority().and_then(|a| Some((a.host().to_string(), a.port_u16()?))) else {
        return text_response(StatusCode::BAD_REQUEST, None, "warden egress proxy: CONNECT needs host:port".into());
    };
    let what = format!("CONNECT {host}:{port}");
    let Some(target) = Target::new(&host, port) else {
        let rule = format!("`{host}` is not a host name or IP literal");
        s.report(s.event("connect", &host, port, false, &rule));
        return refused(&what, &rule);
    };
    let (rule, addrs) = match s.decide(&target).await {
        Ok(d) => d,
        Err(rule) => {
            s.report(s.event("connect", &host, port, false, &rule));
            return refused(&what, &rule);
        }
    };
    let upstream = match connect(&addrs).await {
        Ok(u) => u,
        Err(e) => {
            s.report(s.event("connect", &host, port, true, &format!("{rule}; connecting failed: {e}")));
            return text_response(StatusCode::BAD_GATEWAY, None, format!("warden egress proxy: {what}: {e}"));
        }
    };
    // The tunnel keeps the connection's slot, and ends with the session's listener.
    let permit = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
    let mut closed = s.closed.clone();
    tokio::spawn(async move {
        let _permit = permit;
        let mut ev = s.event("connect", &host, port, true, &rule);
        let run = async {
            match hyper::upgrade::on(req).await {
                Ok(up) => {
                    if let Err(why) = tunnel(TokioIo::new(up), upstream, &target, &mut ev).await {
                        ev.allowed = false;
                        ev.rule = why;
                    }
                }
                Err(e) => ev.rule = format!("{rule}; the client left before the tunnel opened ({e})"),
            }
        };
        tokio::select! {
            () = run => {}
            _ = closed.changed() => {}
        }
        if s.closed.has_changed().is_err() {
            ev.rule = format!("{rule}; closed: the session ended");
        }
        s.report(ev);
    });
    Response::new(Full::new(Bytes::new()).map_err(|never: Infallible| match never {}).boxed())
}

/// Checks the ClientHello, then relays both ways until both end or the tunnel idles.
async fn tunnel<C>(mut client: C, mut upstream: TcpStream, target: &Target, ev: &mut EgressEvent) -> Result<(), String>
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let mut hello = Vec::with_capacity(2048);
    let mut chunk = [0u8; 4096];
    let until = tokio::time::Instant::now() + CLIENT_HELLO_TIMEOUT;
    let sni = loop {
        match sni::parse(&hello) {
            sni::Hello::ClientHello(name) => break name,
            sni::Hello::NotTls => {
                return Err("a CONNECT tunnel carries TLS only (the first bytes were not a TLS ClientHello)".into());
            }
            sni::Hello::Malformed => return Err("the tunnel's TLS ClientHello is malformed".into()),
            sni::Hello::NeedMore if hello.len() >= sni::MAX_CLIENT_HELLO => {
                return Err("the TLS ClientHello is too large".into());
            }
            sni::Hello::NeedMore => {}
        }
        match tokio::time::timeout_at(until, client.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Err("the client closed the tunnel before its TLS ClientHello".into()),
            Ok(Ok(n)) => hello.extend_from_slice(&chunk[..n]),
            Err(_) => return Err(format!("no TLS ClientHello within {}s", CLIENT_HELLO_TIMEOUT.as_secs())),
        }
    };
    match (&sni, &target.host) {
        (Some(name), TargetHost::Name(host)) if name == host => {}
        (None, TargetHost::Ip(_)) => {}
        (Some(name), _) => return Err(format!("the TLS server name `{name}` is not the CONNECT host {target}")),
        (None, TargetHost::Name(_)) => return Err(format!("TLS without a server name to the CONNECT host {target}")),
    }
    upstream.write_all(&hello).await.map_err(|e| format!("writing to {target}: {e}"))?;
    ev.bytes_sent = hello.len() as u64;
    let activity = Activity::new();
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = upstream.split();
    let (sent, received) = tokio::join!(relay(&mut cr, &mut uw, &activity), relay(&mut ur, &mut cw, &activity));
    ev.bytes_sent += sent;
    ev.bytes_received = received;
    Ok(())
}

/// When a tunnel or exchange last moved a byte.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity { start: Instant::now(), last_ms: AtomicU64::new(0) }
    }
    fn touch(&self) {
        self.last_ms.store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
    fn idle(&self) -> Duration {
        self.start.elapsed().saturating_sub(Duration::from_millis(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// Copies `r` to `w` until end, error, or [`IDLE_TIMEOUT`] with neither direction moving;
/// then shuts `w` down. Returns the bytes copied.
async fn relay<R, W>(r: &mut R, w: &mut W, activity: &Activity) -> u64
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; COPY_BUFFER];
    let mut total = 0u64;
    loop {
        match tokio::time::timeout(IDLE_POLL, r.read(&mut buf)).await {
            Err(_) if activity.idle() >= IDLE_TIMEOUT => break,
            Err(_) => continue,
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => {
                if w.write_all(&buf[..n]).await.is_err() {
                    break;
                }
                total += n as u64;
                activity.touch();
            }
        }
    }
    let _ = w.shutdown().await;
    total
}

/// Hop-by-hop headers (RFC 9110 §7.6.1) and the proxy's own, never forwarded.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn strip_hop_by_hop(h: &mut HeaderMap) {
    let listed: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in listed {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(n);
    }
}

async fn handle_http(req: Request<Incoming>, s: Arc<SessionProxy>) -> Response<ProxyBody> {
    let uri = req.uri().clone();
    let (Some(host), Some(authority)) = (uri.host().map(str::to_string), uri.authority().cloned()) else {
        return text_response(StatusCode::BAD_REQUEST, None, "warden egress proxy: the request URL has no host".into());
    };
    let port = uri.port_u16().unwrap_or(80);
    let kind = format!("http {}", req.method());
    let what = format!("{} http://{authority}", req.method());
    let Some(target) = Target::new(&host, port) else {
        let rule = format!("`{host}` is not a host name or IP literal");
        s.report(s.event(&kind, &host, port, false, &rule));
        return refused(&what, &rule);
    };
    let (rule, addrs) = match s.decide(&target).await {
        Ok(d) => d,
        Err(rule) => {
            s.report(s.event(&kind, &host, port, false, &rule));
            return refused(&what, &rule);
        }
    };
    let task_credentials = match s.egress.task_credentials_for(&s.key, &target) {
        Ok(c) => c,
        Err(why) => {
            s.report(s.event(&kind, &host, port, false, &why));
            return refused(&what, &why);
        }
    };
    let mut ev = s.event(&kind, &host, port, true, &rule);
    let upstream = match connect(&addrs).await {
        Ok(u) => u,
        Err(e) => {
            ev.rule = format!("{rule}; connecting failed: {e}");
            s.report(ev);
            return text_response(StatusCode::BAD_GATEWAY, None, format!("warden egress proxy: {what}: {e}"));
        }
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(upstream)).await {
        Ok(x) => x,
        Err(e) => {
            ev.rule = format!("{rule}; HTTP handshake failed: {e}");
            s.report(ev);
            return text_response(StatusCode::BAD_GATEWAY, None, format!("warden egress proxy: {what}: {e}"));
        }
    };
    tokio::spawn(conn);
    let (mut parts, body) = req.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    // `Host` is the URL's host and port: never its userinfo (`http://user@host/`).
    let host_header = match uri.port_u16() {
        Some(p) => format!("{host}:{p}"),
        None => host.clone(),
    };
    parts
        .headers
        .insert(header::HOST, HeaderValue::from_str(&host_header).unwrap_or(HeaderValue::from_static("invalid")));
    // The task's credentials first, the operator's last: on one header the operator's wins.
    let operator = s.egress.policy.credential_for(&target);
    let mut added: Vec<&str> = vec![];
    for c in task_credentials.iter().map(|c| &**c).chain(operator) {
        let (Ok(name), Ok(mut value)) = (HeaderName::from_bytes(c.header.as_bytes()), HeaderValue::from_str(&c.value))
        else {
            continue; // validated when made: cannot happen
        };
        value.set_sensitive(true);
        parts.headers.remove(&name);
        parts.headers.insert(name, value);
        added.push(&c.name);
    }
    if !added.is_empty() {
        ev.credential = Some(added.join(", "));
    }
    parts.uri = match uri.path_and_query() {
        Some(pq) => pq.as_str().parse().unwrap_or_else(|_| hyper::Uri::from_static("/")),
        None => hyper::Uri::from_static("/"),
    };
    parts.version = hyper::Version::HTTP_11;
    let sent = Arc::new(AtomicU64::new(0));
    let out = Request::from_parts(parts, Counted::new(body, sent.clone(), None));
    let resp = match tokio::time::timeout(IDLE_TIMEOUT, sender.send_request(out)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            ev.rule = format!("{rule}; the server failed: {e}");
            ev.bytes_sent = sent.load(Ordering::Relaxed);
            s.report(ev);
            return text_response(StatusCode::BAD_GATEWAY, None, format!("warden egress proxy: {what}: {e}"));
        }
        Err(_) => {
            ev.rule = format!("{rule}; no response within {}s", IDLE_TIMEOUT.as_secs());
            s.report(ev);
            return text_response(
                StatusCode::GATEWAY_TIMEOUT,
                None,
                format!("warden egress proxy: {what}: no response"),
            );
        }
    };
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let session = s.clone();
    let done: Box<dyn FnOnce(u64) + Send + Sync> = Box::new(move |received| {
        ev.bytes_sent = sent.load(Ordering::Relaxed);
        ev.bytes_received = received;
        session.report(ev);
    });
    Response::from_parts(parts, Counted::new(body, Arc::new(AtomicU64::new(0)), Some(done)).boxed())
}

/// A body that counts its data bytes and, when dropped (finished or abandoned), hands the
/// count to `done`.
struct Counted<B> {
    inner: B,
    count: Arc<AtomicU64>,
    done: Option<Box<dyn FnOnce(u64) + Send + Sync>>,
}

impl<B> Counted<B> {
    fn new(inner: B, count: Arc<AtomicU64>, done: Option<Box<dyn FnOnce(u64) + Send + Sync>>) -> Self {
        Counted { inner, count, done }
    }
}

impl<B> Drop for Counted<B> {
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            done(self.count.load(Ordering::Relaxed));
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Counted<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            self.count.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests;
