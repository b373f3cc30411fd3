//! HTTP plumbing shared by the remote providers: client, key lookup, deadline, status
//! and size checks, error mapping, and reading event streams (with the shared `warden-sse`
//! parser: linear in the stream, lines and events bounded).

use std::time::Duration;

use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, LOCATION, RETRY_AFTER};

use warden_sse::{SseEvent, SseParser};

use crate::{DEFAULT_CONNECT_TIMEOUT, MAX_ERROR_EXCERPT_CHARS, MAX_RESPONSE_BYTES, ModelError};

/// One HTTP client per provider (connection pooling across calls).
///
/// - **No automatic redirects.** Every request carries the API key (`x-api-key`,
///   `Authorization`); a redirect followed by the client would send it to whatever location
///   the server (or a man in the middle of a plain-HTTP `base_url`) names — reqwest drops
///   `Authorization` across hosts but not custom headers such as `x-api-key`. A redirect is
///   [`ModelError::Redirect`], naming the status and the location: fix `base_url` instead.
/// - **Environment proxies are honoured** (`HTTPS_PROXY`, `ALL_PROXY`, `NO_PROXY`…): unlike
///   the host's clients to servers it does not choose, a provider is an operator-chosen
///   endpoint and a site may only reach it through its proxy. The proxy is the operator's.
pub(crate) fn client(provider: &str) -> Result<reqwest::Client, ModelError> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(DEFAULT_CONNECT_TIMEOUT)
        .user_agent(concat!("warden-models/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| {
            ModelError::Config(format!("models.providers.{provider}: cannot build HTTP client: {}", chain(&e)))
        })
}

/// Read the API key from `var` (if any) now. An unset or empty variable is a
/// configuration error naming the variable — never its value.
pub(crate) fn read_key(provider: &str, var: Option<&str>) -> Result<Option<String>, ModelError> {
    let Some(var) = var else { return Ok(None) };
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => Ok(Some(v.trim().to_owned())),
        Ok(_) => Err(ModelError::Config(format!(
            "models.providers.{provider}: environment variable {var} (api_key_env) is empty"
        ))),
        Err(_) => Err(ModelError::Config(format!(
            "models.providers.{provider}: environment variable {var} (api_key_env) is not set; \
             export it, or set `api_key_env: null` for a server that needs no key"
        ))),
    }
}

/// A header value holding a secret: marked sensitive so it is never printed by `Debug`.
pub(crate) fn secret_header(provider: &str, value: &str) -> Result<HeaderValue, ModelError> {
    let mut v = HeaderValue::from_str(value).map_err(|_| {
        ModelError::Config(format!(
            "models.providers.{provider}: the API key contains characters not allowed in an HTTP header"
        ))
    })?;
    v.set_sensitive(true);
    Ok(v)
}

/// The shorter of the request's and the provider's deadline.
pub(crate) fn effective_timeout(request: Option<Duration>, provider: Duration) -> Duration {
    request.map_or(provider, |r| r.min(provider))
}

/// Run `fut` under `timeout`; elapsing is [`ModelError::Timeout`].
pub(crate) async fn with_deadline<T>(
    provider: &str,
    timeout: Duration,
    fut: impl Future<Output = Result<T, ModelError>>,
) -> Result<T, ModelError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(ModelError::Timeout { provider: provider.to_owned(), after: timeout }),
    }
}

/// `source: source: ...` of an error, for messages that need the root cause.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        cur = s.source();
    }
    out
}

pub(crate) fn map_reqwest(provider: &str, url: &str, e: reqwest::Error) -> ModelError {
    let provider = provider.to_owned();
    if e.is_connect() {
        // Skip reqwest's own "error sending request for url (...)" wrapper; the URL is a field.
        let detail = e.source_chain_root();
        ModelError::Connect { provider, url: url.to_owned(), detail }
    } else if e.is_timeout() {
        ModelError::Timeout { provider, after: DEFAULT_CONNECT_TIMEOUT }
    } else if e.is_decode() || e.is_body() {
        ModelError::Transport { provider, detail: format!("reading the response: {}", chain(&e)) }
    } else {
        ModelError::Transport { provider, detail: chain(&e) }
    }
}

trait RootCause {
    fn source_chain_root(&self) -> String;
}

impl RootCause for reqwest::Error {
    fn source_chain_root(&self) -> String {
        let mut cur: &dyn std::error::Error = self;
        let mut parts = Vec::new();
        while let Some(s) = cur.source() {
            parts.push(s.to_string());
            cur = s;
        }
        if parts.is_empty() { self.to_string() } else { parts.join(": ") }
    }
}

/// POST a JSON body and return the response if its status is a success; otherwise
/// read (a capped excerpt of) the body and return [`ModelError::Http`].
pub(crate) async fn post_json(
    provider: &str,
    client: &reqwest::Client,
    url: &str,
    headers: HeaderMap,
    body: &serde_json::Value,
) -> Result<reqwest::Response, ModelError> {
    let bytes = serde_json::to_vec(body).map_err(|e| ModelError::Transport {
        provider: provider.to_owned(),
        detail: format!("encoding the request: {e}"),
    })?;
    let resp = client
        .post(url)
        .headers(headers)
        .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
        .body(bytes)
        .send()
        .await
        .map_err(|e| map_reqwest(provider, url, e))?;
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    if status.is_redirection() {
        // Never followed (see [`client`]): the key must not travel to the new location.
        let location = resp.headers().get(LOCATION).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        return Err(ModelError::Redirect { provider: provider.to_owned(), status: status.as_u16(), location });
    }
    let retry_after = resp
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    // Best effort: a failure to read an error body still reports the status.
    let body = read_body_capped(provider, resp, MAX_ERROR_EXCERPT_CHARS * 4).await.unwrap_or_default();
    Err(ModelError::Http {
        provider: provider.to_owned(),
        status: status.as_u16(),
        retry_after,
        body_excerpt: excerpt(&body),
    })
}

/// The start of `body` as text, at most [`MAX_ERROR_EXCERPT_CHARS`], whitespace collapsed.
pub(crate) fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let collapsed: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if collapsed.chars().count() > MAX_ERROR_EXCERPT_CHARS {
        let cut: String = collapsed.chars().take(MAX_ERROR_EXCERPT_CHARS).collect();
        format!("{cut}…")
    } else if collapsed.is_empty() {
        "(empty body)".to_owned()
    } else {
        collapsed
    }
}

async fn read_body_capped(provider: &str, mut resp: reqwest::Response, limit: usize) -> Result<Vec<u8>, ModelError> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| map_reqwest(provider, "", e))? {
        let room = limit.saturating_sub(out.len());
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if out.len() >= limit {
            break;
        }
    }
    Ok(out)
}

/// The whole body, failing beyond [`MAX_RESPONSE_BYTES`].
pub(crate) async fn read_body(provider: &str, mut resp: reqwest::Response) -> Result<Vec<u8>, ModelError> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| map_reqwest(provider, "", e))? {
        if out.len() + chunk.len() > MAX_RESPONSE_BYTES {
            return Err(too_large(provider));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

pub(crate) fn too_large(provider: &str) -> ModelError {
    ModelError::Malformed {
        provider: provider.to_owned(),
        detail: format!("response larger than {} bytes", MAX_RESPONSE_BYTES),
    }
}

/// Whether the response is an SSE stream (a server may ignore `stream: true`).
pub(crate) fn is_event_stream(resp: &reqwest::Response) -> bool {
    resp.headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with("text/event-stream"))
}

/// Parse a JSON body, naming the provider and what was wrong.
pub(crate) fn parse_json(provider: &str, what: &str, body: &[u8]) -> Result<serde_json::Value, ModelError> {
    serde_json::from_slice(body).map_err(|e| ModelError::Malformed {
        provider: provider.to_owned(),
        detail: format!("{what} is not valid JSON ({e}); body starts: {}", excerpt(body)),
    })
}

/// A header built from a static name and a non-secret value.
pub(crate) fn header(map: &mut HeaderMap, name: &'static str, value: &'static str) {
    map.insert(HeaderName::from_static(name), HeaderValue::from_static(value));
}

/// Read an SSE response to the end (or until `on_event` returns `Ok(true)` = done),
/// enforcing [`MAX_RESPONSE_BYTES`].
pub(crate) async fn read_sse(
    provider: &str,
    mut resp: reqwest::Response,
    mut on_event: impl FnMut(SseEvent) -> Result<bool, ModelError>,
) -> Result<(), ModelError> {
    let mut parser = SseParser::new();
    let malformed =
        |e: warden_sse::SseError| ModelError::Malformed { provider: provider.to_owned(), detail: e.to_string() };
    let mut total = 0usize;
    while let Some(chunk) = resp.chunk().await.map_err(|e| map_reqwest(provider, "", e))? {
        total += chunk.len();
        if total > MAX_RESPONSE_BYTES {
            return Err(too_large(provider));
        }
        for ev in parser.feed(&chunk).map_err(malformed)? {
            if on_event(ev)? {
                return Ok(());
            }
        }
    }
    if let Some(ev) = parser.finish().map_err(malformed)? {
        on_event(ev)?;
    }
    Ok(())
}

/// A non-streamed answer: read and parse the body; when the caller wanted a stream
/// (the server ignored `stream: true`), deliver reasoning and text as one fragment each.
pub(crate) async fn buffered(
    provider: &str,
    resp: reqwest::Response,
    sink: Option<&crate::StreamSink>,
    parse: fn(&str, &[u8]) -> Result<crate::ChatResponse, ModelError>,
) -> Result<crate::ChatResponse, ModelError> {
    let bytes = read_body(provider, resp).await?;
    let out = parse(provider, &bytes)?;
    if let Some(sink) = sink {
        if let Some(r) = &out.reasoning {
            sink.reasoning(r);
        }
        sink.token(&out.message.content);
    }
    Ok(out)
}

/// Logs a failure and returns the result with the API key scrubbed from any error text.
pub(crate) fn redacted<T>(
    provider: &str,
    what: &str,
    result: Result<T, ModelError>,
    key: Option<&str>,
) -> Result<T, ModelError> {
    if let Err(e) = &result {
        tracing::debug!(provider, error = %e.clone().redact(key), "{what}");
    }
    result.map_err(|e| e.redact(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpt_is_capped() {
        let long = "x".repeat(MAX_ERROR_EXCERPT_CHARS * 2);
        assert_eq!(excerpt(long.as_bytes()).chars().count(), MAX_ERROR_EXCERPT_CHARS + 1);
        assert_eq!(excerpt(b""), "(empty body)");
    }
}
