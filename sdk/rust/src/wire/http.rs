//! HTTP requests and responses as plain values — the Rust twins of the WIT `http`
//! records (the bindings use them as they are) — with JSON bodies both ways and status
//! checks whose errors quote a bounded excerpt of the body. No host calls here:
//! [`crate::http`] adds them.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

/// Longest excerpt of a body quoted in an error message, in bytes (cut at a character
/// boundary): enough to show the gist of an error page, short enough for a log line.
pub const EXCERPT_BYTES: usize = 300;

/// Most of a call's remaining time kept back from a request's timeout by
/// [`timeout_within`], so a slow peer ends the request with an error value before the
/// host interrupts the whole call.
pub const DEADLINE_MARGIN_MAX_MS: u64 = 500;

/// One outbound request (the WIT `http.request`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Request {
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
    /// Upper bound in ms; the host also caps it by the call's remaining deadline.
    pub timeout_ms: Option<u32>,
    /// Name of an operator-configured secret the host sends as
    /// `Authorization: Bearer <value>`; the plugin never sees the value.
    pub auth_secret: Option<String>,
}

impl Request {
    pub fn new(method: impl Into<String>, url: impl Into<String>) -> Self {
        Self { method: method.into(), url: url.into(), ..Self::default() }
    }

    /// `GET url`, asking for JSON.
    pub fn get(url: impl Into<String>) -> Self {
        Self::new("GET", url).with_header("accept", "application/json")
    }

    /// `POST url` with `body` as JSON (and `content-type`/`accept` set to JSON).
    pub fn post_json(url: impl Into<String>, body: &impl Serialize) -> Result<Self> {
        Self::new("POST", url).with_json_body(body)
    }

    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// `body` serialised as JSON, with `content-type` and `accept` headers unless set.
    pub fn with_json_body(mut self, body: &impl Serialize) -> Result<Self> {
        let bytes =
            serde_json::to_vec(body).map_err(|e| Error::Internal(format!("serialising the request body: {e}")))?;
        self.body = Some(bytes);
        for name in ["content-type", "accept"] {
            if header(&self.headers, name).is_none() {
                self.headers.push((name.into(), "application/json".into()));
            }
        }
        Ok(self)
    }

    pub fn with_timeout_ms(mut self, ms: u32) -> Self {
        self.timeout_ms = Some(ms);
        self
    }

    pub fn with_auth_secret(mut self, secret: Option<String>) -> Self {
        self.auth_secret = secret;
        self
    }
}

/// A whole response (the WIT `http.response`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The first header called `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The response if its status is 2xx, else a `remote` error: `{what} returned HTTP
    /// {status}: {excerpt of the body}` (`what` names the peer, e.g. `the A2A endpoint …`).
    pub fn error_for_status(self, what: &str) -> Result<Self> {
        if self.is_success() {
            return Ok(self);
        }
        let ex = excerpt(&self.body);
        Err(Error::Remote(if ex.is_empty() {
            format!("{what} returned HTTP {}", self.status)
        } else {
            format!("{what} returned HTTP {}: {ex}", self.status)
        }))
    }

    /// The body as `T`; a body that is not that JSON is a `remote` error quoting an
    /// excerpt (the peer answered something else than it should).
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_slice(&self.body).map_err(|e| {
            Error::Remote(format!("the response is not the expected JSON ({e}); body: {}", excerpt(&self.body)))
        })
    }

    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// The first header called `name` (any case) in a header list.
pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

/// The body as trimmed text, at most [`EXCERPT_BYTES`] (then ending with `…`).
pub fn excerpt(body: &[u8]) -> String {
    crate::text::truncate(String::from_utf8_lossy(body).trim(), EXCERPT_BYTES)
}

/// A request timeout inside a call that has `deadline_ms` left: a tenth of it (at most
/// [`DEADLINE_MARGIN_MAX_MS`]) is kept back so a timeout is an error value, not an
/// interrupted call.
pub fn timeout_within(deadline_ms: u64) -> u32 {
    let margin = (deadline_ms / 10).min(DEADLINE_MARGIN_MAX_MS);
    u32::try_from(deadline_ms.saturating_sub(margin)).unwrap_or(u32::MAX)
}

/// Status and headers of a streamed response (the WIT `http.stream-head`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StreamHead {
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

#[cfg(test)]
mod tests {
    use super::{EXCERPT_BYTES, Request, Response, excerpt, timeout_within};
    use crate::Error;

    #[test]
    fn json_requests_carry_body_and_headers() {
        let r = Request::post_json("http://x/rpc", &serde_json::json!({"q": 1})).unwrap();
        assert_eq!((r.method.as_str(), r.body.as_deref()), ("POST", Some(&br#"{"q":1}"#[..])));
        assert_eq!(
            r.headers,
            [("content-type".into(), "application/json".into()), ("accept".into(), "application/json".into())]
        );
        let r = Request::new("PUT", "http://x")
            .with_header("Content-Type", "application/merge-patch+json")
            .with_json_body(&1)
            .unwrap();
        assert_eq!(r.headers.len(), 2, "an explicit content type is kept: {:?}", r.headers);
        let r = Request::get("http://x").with_timeout_ms(5).with_auth_secret(Some("TOKEN".into()));
        assert_eq!((r.timeout_ms, r.auth_secret.as_deref()), (Some(5), Some("TOKEN")));
    }

    #[test]
    fn status_errors_are_remote_and_quote_the_body() {
        let ok = Response { status: 204, ..Response::default() };
        assert!(ok.error_for_status("the endpoint").is_ok());
        let bad = Response { status: 502, body: b"  upstream down \n".to_vec(), ..Response::default() };
        assert_eq!(
            bad.error_for_status("the endpoint"),
            Err(Error::Remote("the endpoint returned HTTP 502: upstream down".into()))
        );
        let empty = Response { status: 404, ..Response::default() };
        assert_eq!(empty.error_for_status("x").unwrap_err().message(), "x returned HTTP 404");
    }

    #[test]
    fn json_bodies_parse_or_name_the_problem() {
        let r = Response { status: 200, body: br#"{"a": [1, 2]}"#.to_vec(), ..Response::default() };
        let v: serde_json::Value = r.json().unwrap();
        assert_eq!(v["a"][1], 2);
        let html = Response { status: 200, body: b"<html>oops</html>".to_vec(), ..Response::default() };
        let e = html.json::<serde_json::Value>().unwrap_err();
        assert!(
            matches!(&e, Error::Remote(m) if m.contains("not the expected JSON") && m.ends_with("<html>oops</html>")),
            "{e}"
        );
    }

    #[test]
    fn headers_match_in_any_case() {
        let r = Response { headers: vec![("Content-Type".into(), "text/event-stream".into())], ..Response::default() };
        assert_eq!(r.header("content-type"), Some("text/event-stream"));
        assert_eq!(r.header("accept"), None);
    }

    #[test]
    fn excerpts_are_bounded_at_a_character_boundary() {
        let long = "é".repeat(400);
        let ex = excerpt(long.as_bytes());
        assert!(ex.ends_with('…') && ex.len() <= EXCERPT_BYTES + '…'.len_utf8(), "{}", ex.len());
        assert_eq!(excerpt(b" short "), "short");
    }

    #[test]
    fn request_timeouts_stay_inside_the_deadline() {
        assert_eq!(timeout_within(30_000), 29_500);
        assert_eq!(timeout_within(1_000), 900);
        assert_eq!(timeout_within(0), 0);
        assert_eq!(timeout_within(u64::MAX), u32::MAX);
    }
}
