//! Agent cards: validation, and choosing the JSON-RPC endpoint and protocol version.
//!
//! Accepted shapes:
//! - 1.0: `supportedInterfaces: [{url, protocolBinding, protocolVersion}]` (drafts used
//!   `transport` for the binding and a card-level `protocolVersion`);
//! - 0.3: `url` + `preferredTransport` + `protocolVersion` + `additionalInterfaces:
//!   [{url, transport}]`;
//! - older (0.2 and before, `/.well-known/agent.json`): `url` and no version — spoken to
//!   with the 0.3 methods, which 0.2 already used;
//! - a card with no endpoint at all: the agent is assumed to serve JSON-RPC where the
//!   card was found.

use serde_json::Value;

/// The two wire dialects this plugin speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1_0,
    V0_3,
}

impl Version {
    /// `1`, `1.0`, `1.0.2`, `v1` → 1.0; any `0.x` → 0.3; anything else → none.
    pub fn parse(s: &str) -> Option<Version> {
        let s = s.trim();
        let s = s.strip_prefix(['v', 'V']).unwrap_or(s);
        let major = s.split('.').next()?;
        match major {
            "1" => Some(Version::V1_0),
            "0" => Some(Version::V0_3),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Version::V1_0 => "1.0",
            Version::V0_3 => "0.3",
        }
    }
}

/// What the executor needs from a card.
#[derive(Debug, Clone, PartialEq)]
pub struct CardInfo {
    pub name: String,
    pub description: String,
    /// The JSON-RPC endpoint, absolute.
    pub endpoint: String,
    pub version: Version,
    pub streaming: bool,
}

/// The well-known card locations for a base URI, newest first.
pub fn card_urls(uri: &str) -> Vec<String> {
    let uri = uri.trim();
    let path = uri.split(['?', '#']).next().unwrap_or(uri);
    if path.ends_with(".json") {
        return vec![uri.to_string()];
    }
    let base = uri.trim_end_matches('/');
    vec![format!("{base}/.well-known/agent-card.json"), format!("{base}/.well-known/agent.json")]
}

/// `scheme://authority` of an absolute URL.
fn origin(url: &str) -> &str {
    let after_scheme = url.find("://").map(|i| i + 3).unwrap_or(0);
    match url[after_scheme..].find('/') {
        Some(i) => &url[..after_scheme + i],
        None => url,
    }
}

/// Where an agent whose card names no endpoint is assumed to listen: the directory the
/// well-known card sits under, else the card's origin.
fn base_of(card_url: &str) -> String {
    match card_url.find("/.well-known/") {
        Some(i) => format!("{}/", &card_url[..i]),
        None => format!("{}/", origin(card_url)),
    }
}

/// Resolves a possibly relative interface URL against the card's URL.
fn absolute(url: &str, card_url: &str) -> String {
    if url.contains("://") {
        url.to_string()
    } else if url.starts_with('/') {
        format!("{}{url}", origin(card_url))
    } else {
        format!("{}{url}", base_of(card_url))
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Collects every problem of a card, so one error names them all.
struct Problems(Vec<String>);

impl Problems {
    fn string<'a>(&mut self, card: &'a Value, field: &str, required: bool) -> Option<&'a str> {
        match card.get(field) {
            None | Some(Value::Null) => {
                if required {
                    self.0.push(format!("missing required field `{field}`"));
                }
                None
            }
            Some(Value::String(s)) => Some(s),
            Some(other) => {
                self.0.push(format!("field `{field}` must be a string, found {}", kind_of(other)));
                None
            }
        }
    }

    fn string_list(&mut self, card: &Value, field: &str) {
        match card.get(field) {
            None | Some(Value::Null) => self.0.push(format!("missing required field `{field}`")),
            Some(Value::Array(items)) => {
                if let Some((i, bad)) = items.iter().enumerate().find(|(_, v)| !v.is_string()) {
                    self.0.push(format!("field `{field}[{i}]` must be a string, found {}", kind_of(bad)));
                }
            }
            Some(other) => {
                self.0.push(format!("field `{field}` must be an array of strings, found {}", kind_of(other)))
            }
        }
    }
}

struct Candidate {
    url: String,
    binding: Option<String>,
    version: Option<String>,
}

fn is_jsonrpc(binding: &Option<String>) -> bool {
    match binding {
        None => true,
        Some(b) => b.replace(['-', '_'], "").eq_ignore_ascii_case("jsonrpc"),
    }
}

/// Validates a card and picks its JSON-RPC interface. `forced` (reference metadata
/// `protocol_version`) restricts the choice to one version; otherwise 1.0 is preferred.
/// The error text names every missing or wrong field.
pub fn parse_card(bytes: &[u8], card_url: &str, forced: Option<Version>) -> Result<CardInfo, String> {
    let card: Value = serde_json::from_slice(bytes).map_err(|e| format!("not valid JSON: {e}"))?;
    if !card.is_object() {
        return Err(format!("an agent card must be a JSON object, found {}", kind_of(&card)));
    }
    let mut p = Problems(Vec::new());
    let name = p.string(&card, "name", true).map(str::trim);
    if name == Some("") {
        p.0.push("field `name` is empty".into());
    }
    let description = p.string(&card, "description", true);
    p.string(&card, "version", true);
    let card_version = p.string(&card, "protocolVersion", false);
    match card.get("capabilities") {
        None | Some(Value::Null) => p.0.push("missing required field `capabilities`".into()),
        Some(Value::Object(c)) => {
            if let Some(s) = c.get("streaming").filter(|s| !s.is_boolean() && !s.is_null()) {
                p.0.push(format!("field `capabilities.streaming` must be a boolean, found {}", kind_of(s)));
            }
        }
        Some(other) => p.0.push(format!("field `capabilities` must be an object, found {}", kind_of(other))),
    }
    p.string_list(&card, "defaultInputModes");
    p.string_list(&card, "defaultOutputModes");
    match card.get("skills") {
        None | Some(Value::Null) => p.0.push("missing required field `skills`".into()),
        Some(Value::Array(skills)) => {
            for (i, s) in skills.iter().enumerate() {
                if !s.is_object() {
                    p.0.push(format!("field `skills[{i}]` must be an object, found {}", kind_of(s)));
                    continue;
                }
                for f in ["id", "name"] {
                    match s.get(f) {
                        Some(Value::String(_)) => {}
                        None | Some(Value::Null) => p.0.push(format!("missing required field `skills[{i}].{f}`")),
                        Some(o) => p.0.push(format!("field `skills[{i}].{f}` must be a string, found {}", kind_of(o))),
                    }
                }
            }
        }
        Some(other) => p.0.push(format!("field `skills` must be an array, found {}", kind_of(other))),
    }

    // Interfaces, in the card's order.
    let mut candidates = Vec::new();
    match card.get("supportedInterfaces") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for (i, itf) in list.iter().enumerate() {
                let field = |f: &str| itf.get(f).and_then(Value::as_str).map(str::to_string);
                match field("url") {
                    Some(url) => candidates.push(Candidate {
                        url,
                        binding: field("protocolBinding").or_else(|| field("transport")),
                        version: field("protocolVersion")
                            .or_else(|| card_version.map(str::to_string))
                            .or_else(|| Some("1.0".into())),
                    }),
                    None => p.0.push(format!("missing required field `supportedInterfaces[{i}].url`")),
                }
            }
        }
        Some(other) => p.0.push(format!("field `supportedInterfaces` must be an array, found {}", kind_of(other))),
    }
    let legacy_version = card_version.map(str::to_string).or_else(|| Some("0.3".into()));
    if let Some(url) = p.string(&card, "url", false) {
        let binding = card.get("preferredTransport").and_then(Value::as_str).map(str::to_string);
        candidates.push(Candidate { url: url.to_string(), binding, version: legacy_version.clone() });
    }
    if let Some(Value::Array(list)) = card.get("additionalInterfaces") {
        for itf in list {
            if let Some(url) = itf.get("url").and_then(Value::as_str) {
                let binding = itf.get("transport").and_then(Value::as_str).map(str::to_string);
                candidates.push(Candidate { url: url.to_string(), binding, version: legacy_version.clone() });
            }
        }
    }
    if !p.0.is_empty() {
        return Err(p.0.join("; "));
    }

    let (endpoint, version) = if candidates.is_empty() {
        // No endpoint declared: JSON-RPC where the card was found.
        let declared = card_version.and_then(Version::parse).unwrap_or(Version::V1_0);
        let version = forced.unwrap_or(declared);
        (base_of(card_url), version)
    } else {
        let offered: Vec<String> = candidates.iter().filter_map(|c| c.binding.clone()).collect();
        let jsonrpc: Vec<(&Candidate, Version)> = candidates
            .iter()
            .filter(|c| is_jsonrpc(&c.binding))
            .filter_map(|c| Some((c, Version::parse(c.version.as_deref()?)?)))
            .collect();
        if jsonrpc.is_empty() {
            return Err(format!(
                "the card offers no JSON-RPC interface of protocol 1.x or 0.x (bindings offered: {})",
                if offered.is_empty() { "none".into() } else { offered.join(", ") }
            ));
        }
        let chosen = match forced {
            Some(v) => jsonrpc.iter().find(|(_, cv)| *cv == v).ok_or_else(|| {
                let have: Vec<&str> = jsonrpc.iter().map(|(_, v)| v.as_str()).collect();
                format!(
                    "protocol_version {} was asked for, but the card's JSON-RPC interfaces speak {}",
                    v.as_str(),
                    have.join(", ")
                )
            })?,
            None => jsonrpc.iter().find(|(_, v)| *v == Version::V1_0).unwrap_or(&jsonrpc[0]),
        };
        (absolute(&chosen.0.url, card_url), chosen.1)
    };
    let streaming = card.pointer("/capabilities/streaming").and_then(Value::as_bool).unwrap_or(false);
    Ok(CardInfo {
        name: name.unwrap_or_default().to_string(),
        description: description.unwrap_or_default().trim().to_string(),
        endpoint,
        version,
        streaming,
    })
}
