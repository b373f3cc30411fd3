//! `http`: outbound HTTP(S) through the plugin's allow-list, secrets injected by reference
//! and scrubbed from what comes back, bounded in size and by the call's deadline.

use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::Resource;

use super::super::bindings::latest::http;
use super::super::host_state::{BodyStream, SecretScrubber};
use super::{Error, HostState, bounded, interruptible, over_budget};
use crate::capability::{Denied, Grants};
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
    /// The secret injected into this request: its header and its value (to strip on a
    /// redirect to another origin and to scrub from the response).
    secret: Option<(reqwest::header::HeaderName, String)>,
}

/// The allow-list for `url`, and for an address literal the address check too (names
/// are checked after resolution, by the plugin client's resolver).
fn check_destination(grants: &Grants, url: &reqwest::Url) -> Result<(), Error> {
    grants.check_url(url)?;
    let host = url.host_str().unwrap_or_default();
    if let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>() {
        grants.check_address(&ip.to_string(), ip)?;
    }
    Ok(())
}

impl HostState {
    fn prepare(&self, req: http::Request) -> Result<Outbound, Error> {
        bounded("the URL (bytes)", req.url.len(), MAX_URL_BYTES)?;
        let url = reqwest::Url::parse(&req.url).map_err(|e| {
            Error::InvalidInput(format!("invalid URL {:?}: {e}", crate::text::escape_control(&req.url)))
        })?;
        // The allow-list is checked before anything touches the network.
        check_destination(&self.scope.grants, &url)?;
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
            injected = Some((name, value));
        }
        bounded("the request body (bytes)", req.body.as_ref().map_or(0, Vec::len), MAX_HTTP_REQUEST_BODY)?;
        let timeout = self.io_timeout(req.timeout_ms)?;
        Ok(Outbound { method, url, headers, body: req.body, timeout, secret: injected })
    }
}

/// Sends, following redirects by hand so every hop passes the allow-list. Takes owned
/// handles (not `&HostState`) so the future stays `Send` across awaits.
async fn dispatch(client: reqwest::Client, grants: Arc<Grants>, mut out: Outbound) -> Result<reqwest::Response, Error> {
    {
        let started = std::time::Instant::now();
        for _ in 0..=MAX_HTTP_REDIRECTS {
            let timeout = out.timeout.saturating_sub(started.elapsed());
            let mut rb = client.request(out.method.clone(), out.url.clone());
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
                return Ok(resp);
            }
            let Some(location) = resp.headers().get(reqwest::header::LOCATION).and_then(|l| l.to_str().ok()) else {
                return Ok(resp);
            };
            let next = out
                .url
                .join(location)
                .map_err(|e| Error::Remote(format!("invalid redirect location {location:?}: {e}")))?;
            check_destination(&grants, &next)?;
            if next.origin() != out.url.origin() {
                // Credentials never follow a redirect to another origin.
                out.headers.remove(reqwest::header::AUTHORIZATION);
                out.headers.remove(reqwest::header::COOKIE);
                if let Some((name, _)) = &out.secret {
                    out.headers.remove(name);
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

/// The response headers a plugin sees, with an injected secret's value scrubbed.
fn response_headers(resp: &reqwest::Response, secret: Option<&str>) -> Vec<(String, String)> {
    resp.headers()
        .iter()
        .filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str().to_owned(), v.to_owned())))
        .map(|(k, v)| match secret {
            Some(s) if !s.is_empty() && v.contains(s) => (k, v.replace(s, "[redacted]")),
            _ => (k, v),
        })
        .collect()
}

impl http::Host for HostState {
    async fn send(&mut self, req: http::Request) -> Result<http::Response, Error> {
        let out = self.prepare(req)?;
        let timeout = out.timeout;
        let secret = out.secret.as_ref().map(|(_, v)| v.clone());
        let cancel = self.cancel_watch();
        let work = dispatch(self.scope.http.clone(), self.scope.grants.clone(), out);
        let mut resp = interruptible(cancel.clone(), "an HTTP request was under way", work).await?;
        let status = resp.status().as_u16();
        let headers = response_headers(&resp, secret.as_deref());
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
        if let Some(secret) = &secret {
            body = SecretScrubber::scrub_all(secret, &body);
        }
        Ok(http::Response { status, headers, body })
    }

    async fn send_streaming(&mut self, req: http::Request) -> Result<(http::StreamHead, Resource<BodyStream>), Error> {
        let budgets = self.scope.services.budgets;
        if self.usage.open_streams >= budgets.max_http_streams_per_call {
            return Err(over_budget(
                "open HTTP response streams",
                budgets.max_http_streams_per_call.into(),
                "max_http_streams_per_call",
            ));
        }
        let out = self.prepare(req)?;
        let secret = out.secret.as_ref().map(|(_, v)| v.clone());
        let work = dispatch(self.scope.http.clone(), self.scope.grants.clone(), out);
        let resp = interruptible(self.cancel_watch(), "an HTTP request was under way", work).await?;
        let head =
            http::StreamHead { status: resp.status().as_u16(), headers: response_headers(&resp, secret.as_deref()) };
        let scrubber = secret.as_deref().and_then(SecretScrubber::new);
        let handle = self
            .table
            .push(BodyStream { response: resp, delivered: 0, scrubber, ended: false })
            .map_err(|e| Error::Internal(format!("cannot hold the response stream: {e}")))?;
        self.usage.open_streams += 1;
        Ok((head, handle))
    }
}

impl http::HostBodyStream for HostState {
    async fn next(&mut self, stream: Resource<BodyStream>) -> Result<Option<Vec<u8>>, Error> {
        let timeout = self.io_timeout(None)?;
        let cancel = self.cancel_watch();
        let body = self.table.get_mut(&stream).map_err(|e| Error::InvalidInput(format!("unknown body stream: {e}")))?;
        if body.ended {
            let rest = body.scrubber.as_mut().map(SecretScrubber::finish).unwrap_or_default();
            return Ok((!rest.is_empty()).then_some(rest));
        }
        let read = async {
            tokio::time::timeout(timeout, body.response.chunk())
                .await
                .map_err(|_| Error::Timeout("reading the HTTP response stream timed out".into()))?
                .map_err(|e| body_error(&e))
        };
        let chunk = interruptible(cancel, "it waited for the HTTP response stream", read).await?;
        let Some(chunk) = chunk else {
            body.ended = true;
            let rest = body.scrubber.as_mut().map(SecretScrubber::finish).unwrap_or_default();
            return Ok((!rest.is_empty()).then_some(rest));
        };
        body.delivered += chunk.len() as u64;
        if body.delivered > MAX_HTTP_RESPONSE_BODY {
            return Err(Error::Remote(format!("response stream exceeds the limit of {MAX_HTTP_RESPONSE_BODY} bytes")));
        }
        Ok(Some(match body.scrubber.as_mut() {
            Some(s) => s.feed(&chunk),
            None => chunk.to_vec(),
        }))
    }

    async fn drop(&mut self, stream: Resource<BodyStream>) -> wasmtime::Result<()> {
        self.table.delete(stream)?;
        self.usage.open_streams = self.usage.open_streams.saturating_sub(1);
        Ok(())
    }
}
