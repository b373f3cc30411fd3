//! `http`: outbound HTTP(S) through the plugin's allow-list, secrets injected by reference
//! and scrubbed from what comes back, bounded in size and by the call's deadline. A request
//! whose URL, method, headers or body carry a secret of the call's task (or of the host) in
//! a form the scrubber knows is refused before anything touches the network
//! ([`HostState::refuse_secrets`]); an encoded one (base64, hex, split over requests) is not
//! recognised.

use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::Resource;

use super::super::bindings::latest::http;
use super::super::host_state::BodyStream;
use super::journal::{Durability, Interrupted};
use super::{Error, HostState, ImportError, bounded, interruptible, over_budget};
use crate::capability::{Denied, Grants, Reach};
use crate::journal::{Import, Next};
use crate::redact::{ByteStreamScrubber, Redactor};
use crate::services::PluginHttp;
use crate::services::{
    MAX_HTTP_HEADER_BYTES, MAX_HTTP_HEADERS, MAX_HTTP_METHOD_BYTES, MAX_HTTP_REDIRECTS, MAX_HTTP_REQUEST_BODY,
    MAX_HTTP_RESPONSE_BODY, MAX_SECRET_NAME_BYTES, MAX_URL_BYTES,
};

/// Request headers a plugin may not set: framing and routing are the host's (a forged
/// `Host` would send an allow-listed address's request to another virtual host).
const RESERVED_REQUEST_HEADERS: [&str; 10] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
];

/// What the HTTP import needs from one request after validation.
struct Outbound {
    method: reqwest::Method,
    url: reqwest::Url,
    headers: reqwest::header::HeaderMap,
    body: Option<Vec<u8>>,
    timeout: Duration,
    /// The secret injected into this request (its header is stripped on a redirect to
    /// another origin, its value scrubbed from the response).
    secret: Option<InjectedSecret>,
    /// The internal addresses the URL may reach (see [`check_destination`]).
    reach: Reach,
}

/// A secret injected into one request, and the one guard that keeps its value from
/// coming back to the plugin: the request may ask for nothing the scrubber could not see
/// through, and every byte of the response — header names and values, the body buffered
/// or streamed — passes the scrubber ([`crate::redact`]) before the plugin sees it.
///
/// What the scrubber cannot see through is refused: a compressed body (the request asks
/// for `Accept-Encoding: identity`, whatever the plugin set, and an encoded response is
/// an error), a partial body (`Range` / `If-Range` requests, `206` responses: pieces of
/// the value, each too short to match), and `TRACE` (the server echoes the request,
/// secret included, in whatever shape it likes).
struct InjectedSecret {
    header: reqwest::header::HeaderName,
    /// Scrubs the value (and its JSON- and `Debug`-escaped forms).
    redactor: Arc<Redactor>,
}

/// Methods never sent with an injected secret: `TRACE` echoes the request back,
/// `CONNECT` opens a tunnel whose bytes the host does not read.
const ECHO_METHODS: [reqwest::Method; 2] = [reqwest::Method::TRACE, reqwest::Method::CONNECT];

/// Request headers never sent with an injected secret: they ask for a part of the body.
const PARTIAL_BODY_HEADERS: [reqwest::header::HeaderName; 2] = [reqwest::header::RANGE, reqwest::header::IF_RANGE];

impl InjectedSecret {
    /// Refuses methods and headers that would let the value come back unscrubbable, and
    /// asks for an uncompressed body.
    fn harden(&self, method: &reqwest::Method, headers: &mut reqwest::header::HeaderMap) -> Result<(), Error> {
        if ECHO_METHODS.contains(method) {
            return Err(Error::Denied(format!(
                "method {method} may not carry an injected secret (the server would echo it back)"
            )));
        }
        if let Some(h) = PARTIAL_BODY_HEADERS.iter().find(|h| headers.contains_key(*h)) {
            return Err(Error::Denied(format!(
                "header {:?} may not be sent with an injected secret (a partial body could carry it in pieces)",
                h.as_str()
            )));
        }
        headers.insert(reqwest::header::ACCEPT_ENCODING, reqwest::header::HeaderValue::from_static("identity"));
        Ok(())
    }

    /// Refuses a response the scrubber cannot read whole: an encoded (compressed) body or
    /// a partial one.
    fn check_response(&self, resp: &reqwest::Response) -> Result<(), Error> {
        let plain = |name: reqwest::header::HeaderName, ok: &[&str]| {
            resp.headers().get_all(name).iter().all(|v| {
                v.to_str().is_ok_and(|v| {
                    v.split(',').map(str::trim).all(|c| c.is_empty() || ok.iter().any(|o| c.eq_ignore_ascii_case(o)))
                })
            })
        };
        if !plain(reqwest::header::CONTENT_ENCODING, &["identity"])
            || !plain(reqwest::header::TRANSFER_ENCODING, &["identity", "chunked"])
        {
            return Err(Error::Remote(
                "the response body is encoded (compressed) though the request asked for none; refused, as the \
                 injected secret could not be scrubbed from it"
                    .into(),
            ));
        }
        if resp.status() == reqwest::StatusCode::PARTIAL_CONTENT
            || resp.headers().contains_key(reqwest::header::CONTENT_RANGE)
        {
            return Err(Error::Remote(
                "the response is a partial body; refused, as the injected secret could not be scrubbed from it".into(),
            ));
        }
        Ok(())
    }
}

/// The allow-list for `url`, and the internal addresses it may reach ([`Grants::reach`]):
/// an address literal is checked here, a name after resolution by the resolver of the
/// plugin's client for that reach.
fn check_destination(grants: &Grants, url: &reqwest::Url) -> Result<Reach, Error> {
    grants.check_url(url)?;
    let reach = grants.reach(url);
    let host = url.host_str().unwrap_or_default();
    if let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>() {
        grants.check_address(reach, &ip.to_string(), ip)?;
    }
    Ok(reach)
}

impl HostState {
    /// Refuses a request that carries a secret of the call's task — its session's
    /// `tool_context` values, whatever their delivery — or of the host, raw or JSON- or
    /// `Debug`-escaped ([`crate::redact`]), in its URL, method, a header name or value, or
    /// its body: a plugin never sends a task's secret anywhere. Checked on what the plugin
    /// wrote, before the host adds an injected secret. The error names where, never what.
    fn refuse_secrets(&self, req: &http::Request) -> Result<(), Error> {
        let secrets = self.scope.redactor();
        let place = if secrets.finds(req.url.as_bytes()) {
            Some("its URL".to_owned())
        } else if secrets.finds(req.method.as_bytes()) {
            Some("its method".to_owned())
        } else if let Some((k, _)) =
            req.headers.iter().find(|(k, v)| secrets.finds(k.as_bytes()) || secrets.finds(v.as_bytes()))
        {
            Some(format!("header {:?}", secrets.scrub(&crate::text::escape_control(k))))
        } else if req.body.as_deref().is_some_and(|b| secrets.finds(b)) {
            Some("its body".to_owned())
        } else {
            None
        };
        match place {
            None => Ok(()),
            Some(place) => {
                tracing::warn!(plugin = %self.scope.plugin, task_id = self.task_id(), session = self.session_id(),
                    place = %place, "plugin HTTP request refused: it carries a secret of the task");
                Err(Error::Denied(format!(
                    "the request carries a secret of this task in {place}; a plugin may not send a task's secrets \
                     (tool_context values) anywhere. Name a host-held secret with `auth-secret` instead"
                )))
            }
        }
    }

    fn prepare(&self, req: http::Request) -> Result<Outbound, Error> {
        bounded("the URL (bytes)", req.url.len(), MAX_URL_BYTES)?;
        let url = reqwest::Url::parse(&req.url).map_err(|e| {
            Error::InvalidInput(format!("invalid URL {:?}: {e}", crate::text::escape_control(&req.url)))
        })?;
        // The allow-list is checked before anything touches the network.
        let reach = check_destination(&self.scope.grants, &url)?;
        bounded("the HTTP method (bytes)", req.method.len(), MAX_HTTP_METHOD_BYTES)?;
        let method = reqwest::Method::from_bytes(req.method.to_ascii_uppercase().as_bytes()).map_err(|_| {
            Error::InvalidInput(format!("invalid HTTP method {:?}", crate::text::escape_control(&req.method)))
        })?;
        bounded("the number of request headers", req.headers.len(), MAX_HTTP_HEADERS)?;
        let header_bytes = req.headers.iter().fold(0usize, |n, (k, v)| n.saturating_add(k.len() + v.len()));
        bounded("the request headers (bytes)", header_bytes, MAX_HTTP_HEADER_BYTES)?;
        bounded("the secret name (bytes)", req.auth_secret.as_ref().map_or(0, String::len), MAX_SECRET_NAME_BYTES)?;
        let mut headers = reqwest::header::HeaderMap::new();
        for (k, v) in &req.headers {
            let shown = || crate::text::escape_control(k).into_owned();
            let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| Error::InvalidInput(format!("invalid header name {:?}", shown())))?;
            if RESERVED_REQUEST_HEADERS.contains(&name.as_str()) {
                return Err(Error::Denied(format!("header {:?} is set by the host, not by plugins", name.as_str())));
            }
            let value = reqwest::header::HeaderValue::from_str(v)
                .map_err(|_| Error::InvalidInput(format!("invalid value for header {:?}", shown())))?;
            headers.try_append(name, value).map_err(|_| Error::InvalidInput("too many request headers".into()))?;
        }
        let mut injected = None;
        if let Some(secret) = &req.auth_secret {
            // Only to the origins the operator named for this secret.
            let rule = self.scope.grants.secret_for(secret, &url)?;
            let value = std::env::var(&rule.grant.env).map_err(|_| {
                Error::Unavailable(format!("secret `{secret}` is configured but its environment variable is not set"))
            })?;
            let name = reqwest::header::HeaderName::from_bytes(rule.grant.header.to_ascii_lowercase().as_bytes())
                .map_err(|_| Error::Unavailable(format!("secret `{secret}` has an invalid header name")))?;
            if headers.contains_key(&name) {
                return Err(Error::InvalidInput(format!(
                    "header {:?} carries secret `{secret}`; the plugin may not set it too",
                    name.as_str()
                )));
            }
            let mut header = reqwest::header::HeaderValue::from_str(&rule.grant.header_value(&value))
                .map_err(|_| Error::Unavailable(format!("secret `{secret}` is not a valid header value")))?;
            header.set_sensitive(true);
            headers.insert(name.clone(), header);
            let secret = InjectedSecret { header: name, redactor: Arc::new(Redactor::with_secrets([value.as_str()])) };
            secret.harden(&method, &mut headers)?;
            injected = Some(secret);
        }
        bounded("the request body (bytes)", req.body.as_ref().map_or(0, Vec::len), MAX_HTTP_REQUEST_BODY)?;
        self.refuse_secrets(&req)?;
        let timeout = self.io_timeout(req.timeout_ms)?;
        Ok(Outbound { method, url, headers, body: req.body, timeout, secret: injected, reach })
    }
}

/// The final response of an exchange, and the scrubber of the secret injected into it.
struct Answer {
    response: reqwest::Response,
    scrubber: Option<Arc<Redactor>>,
}

impl Answer {
    /// The response, once the injected secret's guard accepts it.
    fn of(response: reqwest::Response, out: &Outbound) -> Result<Answer, Error> {
        if let Some(secret) = &out.secret {
            secret.check_response(&response)?;
        }
        Ok(Answer { response, scrubber: out.secret.as_ref().map(|s| s.redactor.clone()) })
    }
}

/// Sends, following redirects by hand so every hop passes the allow-list. Takes owned
/// handles (not `&HostState`) so the future stays `Send` across awaits.
async fn dispatch(http: PluginHttp, grants: Arc<Grants>, mut out: Outbound) -> Result<Answer, Error> {
    {
        let started = std::time::Instant::now();
        for _ in 0..=MAX_HTTP_REDIRECTS {
            let timeout = out.timeout.saturating_sub(started.elapsed());
            let mut rb = http.client(out.reach).request(out.method.clone(), out.url.clone());
            rb = rb.headers(out.headers.clone()).timeout(timeout);
            if let Some(b) = &out.body {
                rb = rb.body(b.clone());
            }
            let resp = rb.send().await.map_err(|e| {
                if let Some(denied) = denied_in(&e) {
                    // The resolver refused every address of the name.
                    Error::Denied(denied.to_string())
                } else if e.is_timeout() {
                    Error::Timeout(format!("HTTP request to {} timed out", out.url))
                } else {
                    Error::Remote(format!("HTTP request to {} failed: {}", out.url, error_chain(&e)))
                }
            })?;
            if !resp.status().is_redirection() {
                return Answer::of(resp, &out);
            }
            let Some(location) = resp.headers().get(reqwest::header::LOCATION).and_then(|l| l.to_str().ok()) else {
                return Answer::of(resp, &out);
            };
            let next = out
                .url
                .join(location)
                .map_err(|e| Error::Remote(format!("invalid redirect location {location:?}: {e}")))?;
            out.reach = check_destination(&grants, &next)?;
            if next.origin() != out.url.origin() {
                // Credentials never follow a redirect to another origin.
                out.headers.remove(reqwest::header::AUTHORIZATION);
                out.headers.remove(reqwest::header::COOKIE);
                if let Some(secret) = &out.secret {
                    out.headers.remove(&secret.header);
                }
            }
            if resp.status() == reqwest::StatusCode::SEE_OTHER {
                out.method = reqwest::Method::GET;
                out.body = None;
            }
            out.url = next;
        }
        Err(Error::Remote(format!("more than {MAX_HTTP_REDIRECTS} redirects")))
    }
}

/// The capability denial inside a request error (from the plugin client's resolver).
fn denied_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a Denied> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(d) = c.downcast_ref::<Denied>() {
            return Some(d);
        }
        cur = c.source();
    }
    None
}

/// A failure while reading a response body: a timeout is a timeout, not a remote fault.
fn body_error(e: &reqwest::Error) -> Error {
    if e.is_timeout() {
        Error::Timeout(format!("reading the HTTP response body timed out: {}", error_chain(e)))
    } else {
        Error::Remote(error_chain(e))
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// The response headers a plugin sees, names and values scrubbed of an injected secret.
fn response_headers(resp: &reqwest::Response, secret: Option<&Redactor>) -> Vec<(String, String)> {
    resp.headers()
        .iter()
        .filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str(), v)))
        .map(|(k, v)| match secret {
            Some(r) => (r.scrub(k).into_owned(), r.scrub(v).into_owned()),
            None => (k.to_owned(), v.to_owned()),
        })
        .collect()
}

impl HostState {
    /// `http.send` (the WIT error is made of its error by [`super::to_plugin`]).
    pub(super) async fn http_send(&mut self, req: http::Request) -> Result<http::Response, Error> {
        let out = self.prepare(req)?;
        let timeout = out.timeout;
        let cancel = self.cancel_watch();
        let work = dispatch(self.scope.http.clone(), self.scope.grants.clone(), out);
        let Answer { response: mut resp, scrubber } =
            interruptible(cancel.clone(), "an HTTP request was under way", work).await?;
        let status = resp.status().as_u16();
        let headers = response_headers(&resp, scrubber.as_deref());
        if resp.content_length().is_some_and(|n| n > MAX_HTTP_RESPONSE_BODY) {
            return Err(Error::Remote(format!("response body exceeds the limit of {MAX_HTTP_RESPONSE_BODY} bytes")));
        }
        let mut body = Vec::new();
        let read = async {
            while let Some(chunk) = resp.chunk().await.map_err(|e| body_error(&e))? {
                if body.len() as u64 + chunk.len() as u64 > MAX_HTTP_RESPONSE_BODY {
                    return Err(Error::Remote(format!(
                        "response body exceeds the limit of {MAX_HTTP_RESPONSE_BODY} bytes"
                    )));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(())
        };
        let read = async {
            tokio::time::timeout(timeout, read)
                .await
                .map_err(|_| Error::Timeout("reading the HTTP response body timed out".into()))?
        };
        interruptible(cancel, "an HTTP response was being read", read).await?;
        if let Some(r) = &scrubber {
            body = r.scrub_bytes(&body).into_owned();
        }
        Ok(http::Response { status, headers, body })
    }

    /// `http.send-streaming` (the WIT error is made of its error by [`super::to_plugin`]).
    async fn http_send_streaming(
        &mut self,
        req: http::Request,
    ) -> Result<(http::StreamHead, Resource<BodyStream>), Error> {
        let budgets = self.scope.services.budgets;
        if self.usage.open_streams >= budgets.max_http_streams_per_call {
            return Err(over_budget(
                "open HTTP response streams",
                budgets.max_http_streams_per_call.into(),
                "max_http_streams_per_call",
            ));
        }
        let out = self.prepare(req)?;
        let work = dispatch(self.scope.http.clone(), self.scope.grants.clone(), out);
        let Answer { response: resp, scrubber } =
            interruptible(self.cancel_watch(), "an HTTP request was under way", work).await?;
        let head =
            http::StreamHead { status: resp.status().as_u16(), headers: response_headers(&resp, scrubber.as_deref()) };
        let scrubber = scrubber.map(|r| (r, ByteStreamScrubber::new()));
        let handle = self
            .table
            .push(BodyStream { response: Some(resp), delivered: 0, scrubber, ended: false })
            .map_err(|e| Error::Internal(format!("cannot hold the response stream: {e}")))?;
        self.usage.open_streams += 1;
        Ok((head, handle))
    }
}

/// Whether a request may be sent again when the host died while it was in flight: the
/// methods HTTP calls safe. Any other may have been received and acted on.
fn is_safe(method: &str) -> bool {
    method.eq_ignore_ascii_case("GET") || method.eq_ignore_ascii_case("HEAD")
}

/// How a durable task's request ends when the host died while it was in flight.
fn when_interrupted(method: &str) -> Interrupted {
    match is_safe(method) {
        true => Interrupted::Rerun,
        false => Interrupted::Fail(Error::Unavailable(format!(
            "the host running this task restarted while this {method} request was in flight: it may or may not have \
             been received"
        ))),
    }
}

/// How durable a request's record is: a safe one is committed once answered; any other
/// is recorded under way before it is sent, so it is never sent twice.
fn durability(method: &str) -> Durability {
    if is_safe(method) { Durability::Committed } else { Durability::Effect }
}

impl http::Host for HostState {
    async fn send(&mut self, req: http::Request) -> Result<http::Response, ImportError> {
        let args = serde_json::to_value(&req).expect("a request serialises");
        let method = req.method.clone();
        self.journaled(Import::HttpSend, args, durability(&method), when_interrupted(&method), move |s| {
            Box::pin(s.http_send(req))
        })
        .await
    }

    async fn send_streaming(
        &mut self,
        req: http::Request,
    ) -> Result<(http::StreamHead, Resource<BodyStream>), ImportError> {
        let Some(journal) = self.journal() else { return Ok(self.http_send_streaming(req).await?) };
        // The head is journaled; the body's chunks are, one `body-stream.next` each.
        let import = Import::HttpSendStreaming;
        let digest = crate::journal::digest(&serde_json::to_value(&req).expect("a request serialises"));
        let seq = match super::journal::next(&journal, import, &digest)? {
            Next::Recorded(result) => {
                let head: http::StreamHead = super::journal::recorded(import, result)?;
                let stream = BodyStream { response: None, delivered: 0, scrubber: None, ended: false };
                let handle = self
                    .table
                    .push(stream)
                    .map_err(|e| Error::Internal(format!("cannot hold the response stream: {e}")))?;
                self.usage.open_streams += 1;
                return Ok((head, handle));
            }
            Next::Interrupted { seq, .. } => match when_interrupted(&req.method) {
                Interrupted::Rerun => Some(seq),
                Interrupted::Fail(e) => {
                    let r: Result<http::StreamHead, Error> = Err(e.clone());
                    self.record(&journal, seq, import, &digest, &r, Durability::Committed).await?;
                    return Err(e.into());
                }
            },
            Next::Live { seq } => seq,
        };
        let Some(seq) = seq else { return Ok(self.http_send_streaming(req).await?) };
        let durability = durability(&req.method);
        if durability == Durability::Effect {
            journal.started(seq, import, &digest, vec![]);
            self.commit(&journal).await?;
        }
        let r = self.http_send_streaming(req).await;
        let head = r.as_ref().map(|(h, _)| h.clone()).map_err(Clone::clone);
        self.record(&journal, seq, import, &digest, &head, Durability::Committed).await?;
        Ok(r?)
    }
}

impl HostState {
    /// `http.body-stream.next` (the WIT error is made of its error by [`super::to_plugin`]).
    async fn http_body_next(&mut self, stream: Resource<BodyStream>) -> Result<Option<Vec<u8>>, Error> {
        let timeout = self.io_timeout(None)?;
        let cancel = self.cancel_watch();
        let body = self.table.get_mut(&stream).map_err(|e| Error::InvalidInput(format!("unknown body stream: {e}")))?;
        if body.ended {
            let rest = body.scrubber.as_mut().map(|(r, s)| s.finish(r)).unwrap_or_default();
            return Ok((!rest.is_empty()).then_some(rest));
        }
        let Some(response) = body.response.as_mut() else {
            return Err(Error::Unavailable(
                "the host running this task restarted while this response was being read; the rest of it is gone \
                 (send the request again)"
                    .into(),
            ));
        };
        let read = async {
            tokio::time::timeout(timeout, response.chunk())
                .await
                .map_err(|_| Error::Timeout("reading the HTTP response stream timed out".into()))?
                .map_err(|e| body_error(&e))
        };
        let chunk = interruptible(cancel, "it waited for the HTTP response stream", read).await?;
        let Some(chunk) = chunk else {
            body.ended = true;
            let rest = body.scrubber.as_mut().map(|(r, s)| s.finish(r)).unwrap_or_default();
            return Ok((!rest.is_empty()).then_some(rest));
        };
        body.delivered += chunk.len() as u64;
        if body.delivered > MAX_HTTP_RESPONSE_BODY {
            return Err(Error::Remote(format!("response stream exceeds the limit of {MAX_HTTP_RESPONSE_BODY} bytes")));
        }
        Ok(Some(match body.scrubber.as_mut() {
            Some((r, s)) => s.push(r, &chunk),
            None => chunk.to_vec(),
        }))
    }
}

impl http::HostBodyStream for HostState {
    async fn next(&mut self, stream: Resource<BodyStream>) -> Result<Option<Vec<u8>>, ImportError> {
        // A chunk read is not repeated: a stream whose connection died ends with an error.
        let args = serde_json::json!({ "stream": stream.rep() });
        self.journaled(Import::BodyStreamNext, args, Durability::Committed, Interrupted::Rerun, move |s| {
            Box::pin(s.http_body_next(stream))
        })
        .await
    }

    async fn drop(&mut self, stream: Resource<BodyStream>) -> wasmtime::Result<()> {
        self.table.delete(stream)?;
        self.usage.open_streams = self.usage.open_streams.saturating_sub(1);
        Ok(())
    }
}
