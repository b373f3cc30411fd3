//! Revision negotiation and request building: the state one client keeps for one server.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::error::{McpError, codes};
use crate::exchange::{HttpRequest, Pending, Purpose};
use crate::headers;

/// Revisions that use the per-request `_meta` envelope and `server/discover`, newest first.
pub const MODERN_VERSIONS: &[&str] = &["2026-07-28"];
/// Revisions reached through the `initialize` handshake, newest first.
pub const HANDSHAKE_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];
/// The newest revision this crate speaks.
pub const LATEST_VERSION: &str = MODERN_VERSIONS[0];

pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

/// Which revisions to try.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Preference {
    /// `server/discover` at the newest revision; on any refusal, the `initialize` handshake.
    #[default]
    Auto,
    /// Only the per-request revision (no fallback).
    Modern,
    /// Only the `initialize` handshake (no probe).
    Handshake,
}

impl Preference {
    /// Parses `auto`, `modern`/`2026-07-28`, `handshake`/`legacy`/an older revision.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "" | "auto" => Some(Preference::Auto),
            "modern" | "latest" => Some(Preference::Modern),
            "handshake" | "legacy" => Some(Preference::Handshake),
            v if MODERN_VERSIONS.contains(&v) => Some(Preference::Modern),
            v if HANDSHAKE_VERSIONS.contains(&v) => Some(Preference::Handshake),
            _ => None,
        }
    }
}

/// Who we are, sent to the server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientInfo {
    pub name: String,
    pub version: String,
}

/// What the server said about itself.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ServerInfo {
    /// The revision in use.
    pub protocol_version: String,
    pub name: Option<String>,
    pub title: Option<String>,
    pub version: Option<String>,
    /// `serverInfo.description` (2025-11-25+), if given.
    pub description: Option<String>,
    pub instructions: Option<String>,
    pub capabilities: Value,
}

impl ServerInfo {
    pub fn has_tools(&self) -> bool {
        self.capabilities.get("tools").is_some()
    }

    fn identity(&mut self, info: Option<&Value>) {
        let s = |k: &str| info.and_then(|i| i.get(k)).and_then(Value::as_str).map(str::to_owned);
        self.name = s("name");
        self.title = s("title");
        self.version = s("version");
        self.description = s("description");
    }
}

/// The negotiated way of talking to the server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "era", rename_all = "lowercase")]
pub enum Era {
    /// 2026-07-28+: every request carries `_meta` and the routing headers; no session.
    Modern { version: String },
    /// Up to 2025-11-25: after `initialize`, the session id (if the server gave one).
    Handshake { version: String, session_id: Option<String> },
}

/// One client's protocol state for one MCP endpoint. I/O-free: it builds
/// [`HttpRequest`]s and reads replies through [`Pending`]; the caller moves the bytes.
///
/// ```text
/// let mut out = Some(session.connect());
/// while let Some((request, mut pending)) = out {
///     send(request) -> pending.begin / feed / finish
///     out = session.advance(pending)?;          // None once connected
/// }
/// let (request, pending) = session.list_tools(None)?;   ...  Session::parse_tools_page
/// let (request, pending) = session.call_tool("t", args, Some(token))?; ... ToolResult::from_result
/// if let Some(request) = session.close() { send(request) }  // best effort
/// ```
#[derive(Debug, Clone)]
pub struct Session {
    client: ClientInfo,
    preference: Preference,
    era: Option<Era>,
    server: Option<ServerInfo>,
    next_id: i64,
}

impl Session {
    pub fn new(client: ClientInfo) -> Self {
        Session { client, preference: Preference::Auto, era: None, server: None, next_id: 1 }
    }

    pub fn with_preference(mut self, preference: Preference) -> Self {
        self.preference = preference;
        self
    }

    /// The negotiated era, once connected.
    pub fn era(&self) -> Option<&Era> {
        self.era.as_ref()
    }

    /// The server's identity and capabilities, once connected.
    pub fn server(&self) -> Option<&ServerInfo> {
        self.server.as_ref()
    }

    pub fn is_connected(&self) -> bool {
        self.era.is_some() && self.server.is_some()
    }

    /// Forgets the connection (after [`McpError::SessionExpired`]); call [`Session::connect`] again.
    pub fn reset(&mut self) {
        self.era = None;
        self.server = None;
    }

    /// The first request of the negotiation: a `server/discover` probe, or `initialize`
    /// when the preference is [`Preference::Handshake`].
    pub fn connect(&mut self) -> (HttpRequest, Pending) {
        self.reset();
        match self.preference {
            Preference::Handshake => self.initialize(),
            Preference::Auto | Preference::Modern => self.discover(LATEST_VERSION),
        }
    }

    /// Consumes the finished reply to a negotiation request. Returns the next request
    /// to send, or `None` once connected.
    pub fn advance(&mut self, mut pending: Pending) -> Result<Option<(HttpRequest, Pending)>, McpError> {
        let result = pending.result();
        match pending.purpose {
            Purpose::Discover => match result {
                Ok(r) => match modern_version(&r) {
                    Some(version) => {
                        let mut info = ServerInfo {
                            protocol_version: version.clone(),
                            instructions: r.get("instructions").and_then(Value::as_str).map(str::to_owned),
                            capabilities: r.get("capabilities").cloned().unwrap_or_else(|| json!({})),
                            ..ServerInfo::default()
                        };
                        let stamp =
                            r.get("serverInfo").or_else(|| r.get("_meta").and_then(|m| m.get(META_SERVER_INFO)));
                        info.identity(stamp);
                        self.era = Some(Era::Modern { version });
                        self.server = Some(info);
                        Ok(None)
                    }
                    None => self.fall_back(McpError::Unsupported(format!(
                        "the server's server/discover lists no revision this client speaks ({})",
                        MODERN_VERSIONS.join(", ")
                    ))),
                },
                Err(e @ (McpError::Timeout(_) | McpError::Transport(_))) => Err(e),
                Err(McpError::Rpc { code: codes::UNSUPPORTED_PROTOCOL_VERSION, ref data, ref message, .. })
                    if modern_only(data.as_ref()) =>
                {
                    Err(McpError::Unsupported(format!(
                        "the server speaks only revisions this client does not ({message}; {})",
                        data.as_ref().map(Value::to_string).unwrap_or_default()
                    )))
                }
                Err(e) => self.fall_back(e),
            },
            Purpose::Initialize => {
                let r = result?;
                let version = r.get("protocolVersion").and_then(Value::as_str).unwrap_or("").to_owned();
                if !HANDSHAKE_VERSIONS.contains(&version.as_str()) {
                    return Err(McpError::Unsupported(format!(
                        "the server answered initialize with revision {version:?}; this client speaks {}",
                        HANDSHAKE_VERSIONS.join(", ")
                    )));
                }
                let mut info = ServerInfo {
                    protocol_version: version.clone(),
                    instructions: r.get("instructions").and_then(Value::as_str).map(str::to_owned),
                    capabilities: r.get("capabilities").cloned().unwrap_or_else(|| json!({})),
                    ..ServerInfo::default()
                };
                info.identity(r.get("serverInfo"));
                self.era = Some(Era::Handshake { version, session_id: pending.session_id().map(str::to_owned) });
                self.server = Some(info);
                let body = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
                let request = self.post(&body, "notifications/initialized");
                Ok(Some((request, Pending::new(Purpose::Initialized, None, None, true))))
            }
            Purpose::Initialized => {
                result?;
                Ok(None)
            }
            Purpose::Call => Err(McpError::Protocol("advance() takes negotiation replies only".into())),
        }
    }

    fn fall_back(&mut self, why: McpError) -> Result<Option<(HttpRequest, Pending)>, McpError> {
        if self.preference == Preference::Modern {
            return Err(why);
        }
        Ok(Some(self.initialize()))
    }

    fn discover(&mut self, version: &str) -> (HttpRequest, Pending) {
        let id = self.id();
        let body = json!({
            "jsonrpc": "2.0", "id": id, "method": "server/discover",
            "params": {"_meta": self.envelope(version)},
        });
        let mut request = base_post(&body);
        request.headers.push((headers::PROTOCOL_VERSION.into(), version.into()));
        request.headers.push((headers::METHOD.into(), "server/discover".into()));
        (request, Pending::new(Purpose::Discover, Some(json!(id)), None, false))
    }

    fn initialize(&mut self) -> (HttpRequest, Pending) {
        let id = self.id();
        let body = json!({
            "jsonrpc": "2.0", "id": id, "method": "initialize",
            "params": {
                "protocolVersion": HANDSHAKE_VERSIONS[0],
                "capabilities": {},
                "clientInfo": self.client,
            },
        });
        (base_post(&body), Pending::new(Purpose::Initialize, Some(json!(id)), None, false))
    }

    /// Any request, once connected: `params` gets the era's envelope, and the
    /// `progressToken` when given.
    pub fn request(
        &mut self,
        method: &str,
        params: Value,
        progress_token: Option<Value>,
    ) -> Result<(HttpRequest, Pending), McpError> {
        let era = self.era.clone().ok_or_else(|| McpError::Protocol("not connected: call connect() first".into()))?;
        let mut params = match params {
            Value::Object(m) => m,
            Value::Null => Map::new(),
            other => return Err(McpError::Protocol(format!("params must be an object, not {other}"))),
        };
        let mut meta = match params.remove("_meta") {
            Some(Value::Object(m)) => m,
            _ => Map::new(),
        };
        if let Era::Modern { version } = &era {
            meta.extend(self.envelope(version));
        }
        if let Some(t) = &progress_token {
            meta.insert("progressToken".into(), t.clone());
        }
        if !meta.is_empty() {
            params.insert("_meta".into(), Value::Object(meta));
        }
        let id = self.id();
        let params = Value::Object(params);
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let mut request = self.post(&body, method);
        if let (Era::Modern { .. }, Some(key)) = (&era, headers::name_param(method))
            && let Some(name) = params.get(key).and_then(Value::as_str)
        {
            request.headers.push((headers::NAME.into(), headers::encode_value(name)));
        }
        let expect_session = matches!(era, Era::Handshake { session_id: Some(_), .. });
        Ok((request, Pending::new(Purpose::Call, Some(json!(id)), progress_token, expect_session)))
    }

    /// `tools/list`, one page.
    pub fn list_tools(&mut self, cursor: Option<&str>) -> Result<(HttpRequest, Pending), McpError> {
        let params = match cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let (request, mut pending) = self.request("tools/list", params, None)?;
        pending.limit_bytes(crate::limits::MAX_LIST_BYTES);
        Ok((request, pending))
    }

    /// `tools/call`; progress notifications for it carry `progress_token`.
    pub fn call_tool(
        &mut self,
        name: &str,
        arguments: Value,
        progress_token: Option<Value>,
    ) -> Result<(HttpRequest, Pending), McpError> {
        let (request, mut pending) =
            self.request("tools/call", json!({"name": name, "arguments": arguments}), progress_token)?;
        pending.limit_bytes(crate::limits::MAX_RESULT_BYTES);
        Ok((request, pending))
    }

    /// Ends a handshake-era session (`DELETE` with its id); `None` when there is
    /// nothing to end. A 405 reply means the server does not allow it; ignore it.
    pub fn close(&mut self) -> Option<HttpRequest> {
        let Some(Era::Handshake { version, session_id: Some(id) }) = self.era.take() else {
            return None;
        };
        self.server = None;
        let mut h = vec![(headers::SESSION_ID.to_owned(), id)];
        if sends_version_header(&version) {
            h.push((headers::PROTOCOL_VERSION.into(), version));
        }
        Some(HttpRequest { method: "DELETE", headers: h, body: None })
    }

    fn id(&mut self) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn envelope(&self, version: &str) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert(META_PROTOCOL_VERSION.into(), json!(version));
        m.insert(META_CLIENT_INFO.into(), json!(self.client));
        m.insert(META_CLIENT_CAPABILITIES.into(), json!({}));
        m
    }

    /// A POST with the era's headers.
    fn post(&self, body: &Value, method: &str) -> HttpRequest {
        let mut request = base_post(body);
        match &self.era {
            Some(Era::Modern { version }) => {
                request.headers.push((headers::PROTOCOL_VERSION.into(), version.clone()));
                request.headers.push((headers::METHOD.into(), method.into()));
            }
            Some(Era::Handshake { version, session_id }) => {
                if let Some(id) = session_id {
                    request.headers.push((headers::SESSION_ID.into(), id.clone()));
                }
                if sends_version_header(version) {
                    request.headers.push((headers::PROTOCOL_VERSION.into(), version.clone()));
                }
            }
            None => {}
        }
        request
    }
}

/// Handshake revisions before 2025-06-18 predate the `MCP-Protocol-Version` header.
fn sends_version_header(version: &str) -> bool {
    !matches!(version, "2024-11-05" | "2025-03-26")
}

fn base_post(body: &Value) -> HttpRequest {
    HttpRequest {
        method: "POST",
        headers: vec![
            ("Content-Type".into(), "application/json".into()),
            ("Accept".into(), headers::ACCEPT_BOTH.into()),
        ],
        body: Some(body.to_string().into_bytes()),
    }
}

/// The newest modern revision both sides list in a discover result.
fn modern_version(result: &Value) -> Option<String> {
    let listed = result.get("supportedVersions")?.as_array()?;
    MODERN_VERSIONS.iter().find(|v| listed.iter().any(|l| l.as_str() == Some(v))).map(|v| (*v).to_owned())
}

/// A -32022 whose `supported` list names no handshake revision: falling back is futile.
fn modern_only(data: Option<&Value>) -> bool {
    let Some(list) = data.and_then(|d| d.get("supported")).and_then(Value::as_array) else {
        return false;
    };
    !list.iter().any(|v| v.as_str().is_some_and(|v| HANDSHAKE_VERSIONS.contains(&v)))
}
