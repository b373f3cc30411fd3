//! `http` plugin: a plain HTTP endpoint as a subagent.
//!
//! Reference: `uri` = the endpoint URL (may contain `{{prompt}}` / `{{description}}`,
//! inserted percent-encoded), kind `HTTP`, metadata:
//! - `method`: default `POST`;
//! - `headers`: a JSON object or `Name: value` lines. `Authorization: env:NAME` (or
//!   `Authorization: Bearer env:NAME`) sends the operator secret `NAME`
//!   (`plugins.grants.<id>.secrets`) as `Authorization: Bearer <value>`; the host adds
//!   it and the plugin never sees it. Other headers cannot carry secrets (the host
//!   injects secrets only as a bearer token), so `env:` elsewhere is refused;
//! - `body`: a template; `{{prompt}}` and `{{description}}` are replaced by the
//!   JSON-escaped text (without quotes: write `"{{prompt}}"`). Default for methods
//!   with a body: `{"prompt": "{{prompt}}", "description": "{{description}}"}`;
//! - `response_pointer`: a JSON pointer (`/choices/0/text`) into a JSON response;
//!   without it the whole body is the answer;
//! - `timeout`: `30s`, `1500ms`, `2m` or seconds; capped by the task's deadline;
//! - `name`, `description`: the definition's name (default: the URL's last path
//!   segment, else its host) and description.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use warden_guest::http::excerpt;
use warden_guest::{Error, Metadata};

pub const KIND: &str = "HTTP";

#[cfg(target_arch = "wasm32")]
mod wasm;

pub const DEFAULT_BODY: &str = r#"{"prompt": "{{prompt}}", "description": "{{description}}"}"#;

/// A reference's metadata, validated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Endpoint {
    pub url: String,
    pub method: String,
    /// Plain headers (never secrets).
    pub headers: Vec<(String, String)>,
    /// Name of the operator secret sent as `Authorization: Bearer …`.
    pub auth_secret: Option<String>,
    pub body: Option<String>,
    pub response_pointer: Option<String>,
    pub timeout_ms: Option<u32>,
    pub name: String,
    pub description: String,
}

impl Endpoint {
    /// The endpoint a reference describes; bad metadata is `invalid-input` naming the key.
    pub fn from_reference(uri: &str, metadata: &[(String, String)]) -> Result<Endpoint, Error> {
        let meta = Metadata::new(metadata);
        let url = uri.trim().to_owned();
        let rest = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"))
            .ok_or_else(|| Error::InvalidInput(format!("HTTP reference uri {url:?} must be an http(s) URL")))?;
        let method = meta.get("method").unwrap_or("POST").to_ascii_uppercase();
        if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(Error::InvalidInput(format!("metadata `method` {method:?} is not an HTTP method")));
        }
        let (headers, auth_secret) = match meta.get("headers") {
            Some(h) => parse_headers(h).map_err(Error::InvalidInput)?,
            None => (Vec::new(), None),
        };
        let body = match meta.raw("body") {
            Some(b) => Some(b.to_owned()),
            None if matches!(method.as_str(), "GET" | "HEAD" | "DELETE" | "OPTIONS") => None,
            None => Some(DEFAULT_BODY.to_owned()),
        };
        let response_pointer = meta.get("response_pointer").map(str::to_owned);
        if let Some(p) = &response_pointer
            && !p.starts_with('/')
        {
            return Err(Error::InvalidInput(format!(
                "metadata `response_pointer` {p:?} must be a JSON pointer starting with `/`"
            )));
        }
        let timeout_ms = meta.duration_ms("timeout")?;
        let name = match meta.get("name") {
            Some(n) => n.to_owned(),
            None => default_name(rest),
        };
        let description = meta
            .get("description")
            .map(str::to_owned)
            .unwrap_or_else(|| format!("HTTP agent at {}", url.split(['?', '#']).next().unwrap_or(&url)));
        Ok(Endpoint { url, method, headers, auth_secret, body, response_pointer, timeout_ms, name, description })
    }

    /// The URL with the task's text inserted (percent-encoded).
    pub fn render_url(&self, prompt: &str, description: &str) -> String {
        render(&self.url, &percent_encode(prompt), &percent_encode(description))
    }

    /// The request body with the task's text inserted (JSON-escaped).
    pub fn render_body(&self, prompt: &str, description: &str) -> Option<String> {
        self.body.as_ref().map(|b| render_json_template(b, prompt, description))
    }

    /// Headers to send: the configured ones, plus `Content-Type: application/json`
    /// for a body when none is set.
    pub fn request_headers(&self) -> Vec<(String, String)> {
        let mut h = self.headers.clone();
        if self.body.is_some() && !h.iter().any(|(k, _)| k.eq_ignore_ascii_case("content-type")) {
            h.push(("Content-Type".into(), "application/json".into()));
        }
        h
    }

    /// The task's answer from a response: `Err` is the message of a `remote` error.
    pub fn extract(&self, status: u16, body: &[u8]) -> Result<String, String> {
        if !(200..300).contains(&status) {
            let ex = excerpt(body);
            return Err(if ex.is_empty() { format!("HTTP {status}") } else { format!("HTTP {status}: {ex}") });
        }
        let Some(pointer) = &self.response_pointer else {
            return Ok(String::from_utf8_lossy(body).into_owned());
        };
        let json: Value = serde_json::from_slice(body).map_err(|e| {
            format!(
                "the response is not valid JSON ({e}), so `response_pointer` {pointer} cannot apply; body: {}",
                excerpt(body)
            )
        })?;
        match json.pointer(pointer) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(Value::Null) | None => {
                Err(format!("the JSON response has no value at `response_pointer` {pointer}; body: {}", excerpt(body)))
            }
            Some(other) => Ok(other.to_string()),
        }
    }
}

/// `{{prompt}}` / `{{description}}` → JSON-escaped text (no quotes added).
pub fn render_json_template(template: &str, prompt: &str, description: &str) -> String {
    render(template, &json_escape(prompt), &json_escape(description))
}

/// One pass over the template, so placeholders inside the inserted text stay text.
fn render(template: &str, prompt: &str, description: &str) -> String {
    let mut out = String::with_capacity(template.len() + prompt.len());
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let tail = &rest[start..];
        if let Some(after) = tail.strip_prefix("{{prompt}}") {
            out.push_str(prompt);
            rest = after;
        } else if let Some(after) = tail.strip_prefix("{{description}}") {
            out.push_str(description);
            rest = after;
        } else {
            out.push_str("{{");
            rest = &tail[2..];
        }
    }
    out.push_str(rest);
    out
}

fn json_escape(s: &str) -> String {
    let quoted = Value::String(s.to_owned()).to_string();
    quoted[1..quoted.len() - 1].to_owned()
}

fn percent_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn default_name(rest: &str) -> String {
    let path_and_host = rest.split(['?', '#']).next().unwrap_or(rest);
    let (host, path) = path_and_host.split_once('/').unwrap_or((path_and_host, ""));
    path.split('/').rev().find(|s| !s.is_empty() && !s.contains("{{")).unwrap_or(host).to_owned()
}

/// Plain headers and the name of the secret for `Authorization`.
pub type ParsedHeaders = (Vec<(String, String)>, Option<String>);

/// Headers from a JSON object or `Name: value` lines; `Authorization: env:NAME` becomes
/// the secret reference. Returns (plain headers, secret name).
pub fn parse_headers(text: &str) -> Result<ParsedHeaders, String> {
    let pairs: Vec<(String, String)> = if text.trim_start().starts_with('{') {
        let obj: serde_json::Map<String, Value> =
            serde_json::from_str(text).map_err(|e| format!("metadata `headers` is not a JSON object: {e}"))?;
        obj.into_iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k, s)),
                other => Err(format!("metadata `headers`: value of {k:?} must be a string, not {other}")),
            })
            .collect::<Result<_, _>>()?
    } else {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| {
                l.split_once(':')
                    .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                    .ok_or_else(|| format!("metadata `headers`: line {l:?} is not `Name: value`"))
            })
            .collect::<Result<_, _>>()?
    };
    let mut plain = Vec::new();
    let mut secret = None;
    for (name, value) in pairs {
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)) {
            return Err(format!("metadata `headers`: {name:?} is not a valid header name"));
        }
        let value = value.trim().to_owned();
        let reference = value.strip_prefix("Bearer ").unwrap_or(&value).trim().strip_prefix("env:").map(str::trim);
        match reference {
            Some(var) if name.eq_ignore_ascii_case("authorization") => {
                if var.is_empty() {
                    return Err("metadata `headers`: `Authorization: env:` needs a secret name".into());
                }
                secret = Some(var.to_owned());
            }
            Some(_) => {
                return Err(format!(
                    "metadata `headers`: {name}: secrets by reference (`env:`) are only supported in `Authorization` \
                     — the host injects secrets as `Authorization: Bearer <value>` only"
                ));
            }
            None => {
                if name.eq_ignore_ascii_case("authorization") {
                    return Err("metadata `headers`: a literal `Authorization` value would put a credential in the \
                         configuration; use `Authorization: env:NAME` with plugins.grants.<id>.secrets"
                        .into());
                }
                plain.push((name, value));
            }
        }
    }
    Ok((plain, secret))
}

#[cfg(test)]
mod tests {
    use warden_guest::metadata::pairs as md;

    use super::*;

    #[test]
    fn defaults() {
        let e = Endpoint::from_reference("http://127.0.0.1:8080/v1/agents/summarize?x=1", &[]).unwrap();
        assert_eq!(e.method, "POST");
        assert_eq!(e.name, "summarize");
        assert_eq!(e.description, "HTTP agent at http://127.0.0.1:8080/v1/agents/summarize");
        assert_eq!(e.body.as_deref(), Some(DEFAULT_BODY));
        assert_eq!(e.request_headers(), [("Content-Type".to_owned(), "application/json".to_owned())]);
        let g = Endpoint::from_reference("https://example.com/?q={{prompt}}", &md(&[("method", "get")])).unwrap();
        assert_eq!(g.method, "GET");
        assert_eq!(g.name, "example.com");
        assert_eq!(g.body, None);
        assert!(g.request_headers().is_empty());
        assert_eq!(g.render_url("a b&c/é", "d"), "https://example.com/?q=a%20b%26c%2F%C3%A9");
        assert!(Endpoint::from_reference("ftp://x", &[]).is_err());
        assert!(Endpoint::from_reference("http://x", &md(&[("method", "PO ST")])).is_err());
    }

    #[test]
    fn templates_are_json_escaped() {
        let e = Endpoint::from_reference(
            "http://x/a",
            &md(&[("body", r#"{"q": "{{prompt}}", "d": "{{description}}", "n": 1}"#)]),
        )
        .unwrap();
        let body = e.render_body("say \"hi\"\nand \\ {{description}}", "tab\there").unwrap();
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["q"], "say \"hi\"\nand \\ {{description}}");
        assert_eq!(v["d"], "tab\there");
        let d = Endpoint::from_reference("http://x/a", &[]).unwrap().render_body("p", "d").unwrap();
        assert_eq!(serde_json::from_str::<Value>(&d).unwrap(), serde_json::json!({"prompt": "p", "description": "d"}));
    }

    #[test]
    fn headers_and_secrets() {
        let (h, s) = parse_headers("X-Team: blue\nAuthorization: env:API_TOKEN\n# comment\n").unwrap();
        assert_eq!(h, [("X-Team".to_owned(), "blue".to_owned())]);
        assert_eq!(s.as_deref(), Some("API_TOKEN"));
        let (h, s) = parse_headers(r#"{"Accept": "text/plain", "authorization": "Bearer env:T"}"#).unwrap();
        assert_eq!(h, [("Accept".to_owned(), "text/plain".to_owned())]);
        assert_eq!(s.as_deref(), Some("T"));
        assert!(parse_headers("X-Api-Key: env:KEY").unwrap_err().contains("only supported in `Authorization`"));
        assert!(parse_headers("Authorization: Bearer abc").unwrap_err().contains("credential"));
        assert!(parse_headers("no colon").is_err());
        assert!(parse_headers(r#"{"X": 1}"#).is_err());
        assert!(parse_headers("Bad Name: x").is_err());
    }

    #[test]
    fn extraction() {
        let e = Endpoint::from_reference("http://x/a", &md(&[("response_pointer", "/choices/0/text")])).unwrap();
        assert_eq!(e.extract(200, br#"{"choices":[{"text":"hello"}]}"#), Ok("hello".into()));
        assert_eq!(e.extract(200, br#"{"choices":[{"text":{"a":1}}]}"#), Ok(r#"{"a":1}"#.into()));
        assert!(
            e.extract(200, br#"{"choices":[]}"#)
                .unwrap_err()
                .contains("no value at `response_pointer` /choices/0/text")
        );
        let bad = e.extract(200, b"<html>oops</html>").unwrap_err();
        assert!(bad.contains("not valid JSON") && bad.contains("<html>oops</html>"), "{bad}");
        assert_eq!(e.extract(503, b"  busy  "), Err("HTTP 503: busy".into()));
        assert_eq!(e.extract(404, b""), Err("HTTP 404".into()));
        let long = e.extract(500, "é".repeat(400).as_bytes()).unwrap_err();
        assert!(long.ends_with('…') && long.len() < 320);
        let whole = Endpoint::from_reference("http://x/a", &[]).unwrap();
        assert_eq!(whole.extract(200, b"plain answer"), Ok("plain answer".into()));
        assert!(Endpoint::from_reference("http://x/a", &md(&[("response_pointer", "choices")])).is_err());
    }
}
