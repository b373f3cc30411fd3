use serde_json::Value;

/// JSON-RPC error codes this crate reacts to.
pub mod codes {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    /// 2026-07-28: HTTP headers disagree with the body.
    pub const HEADER_MISMATCH: i64 = -32020;
    /// 2026-07-28: a client capability the request needs is missing.
    pub const MISSING_REQUIRED_CLIENT_CAPABILITY: i64 = -32021;
    /// 2026-07-28: `data = {"supported": [...], "requested": "..."}`.
    pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
}

/// Why an MCP exchange failed.
#[derive(Debug, Clone, PartialEq)]
pub enum McpError {
    /// A non-2xx reply that carried no JSON-RPC error; `body` is a short excerpt.
    Http { status: u16, body: String },
    /// A JSON-RPC error object (from a 2xx or a 4xx reply; `status` is the HTTP status).
    Rpc { status: u16, code: i64, message: String, data: Option<Value> },
    /// The server no longer knows the `Mcp-Session-Id` (HTTP 404): start a new session.
    SessionExpired,
    /// The peer broke the protocol (bad JSON, wrong content type, no response, ...).
    Protocol(String),
    /// No revision or feature both sides support (also: a 2026-07-28
    /// `input_required` result, which this client does not answer).
    Unsupported(String),
    /// The transport gave up waiting.
    Timeout(String),
    /// The transport failed (connection, policy, limits).
    Transport(String),
    /// A reply (or a whole tool listing) over one of the bounds of [`crate::limits`]: `what`
    /// says which, `limit` is the bound in bytes. Refused before it is parsed or kept.
    TooLarge { what: String, limit: usize },
}

impl McpError {
    /// Longest body excerpt kept in [`McpError::Http`].
    pub const EXCERPT: usize = 300;

    pub(crate) fn http(status: u16, body: &[u8]) -> Self {
        McpError::Http { status, body: excerpt(body) }
    }
}

/// The first [`McpError::EXCERPT`] bytes of `body` as text, cut at a char boundary.
pub fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.len() <= McpError::EXCERPT {
        return text.to_owned();
    }
    let mut cut = McpError::EXCERPT;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &text[..cut])
}

impl std::fmt::Display for McpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            McpError::Http { status, body } if body.is_empty() => write!(f, "HTTP {status}"),
            McpError::Http { status, body } => write!(f, "HTTP {status}: {body}"),
            McpError::Rpc { code, message, .. } => write!(f, "MCP error {code}: {message}"),
            McpError::SessionExpired => write!(f, "the MCP session expired (HTTP 404 for its Mcp-Session-Id)"),
            McpError::Protocol(m) => write!(f, "MCP protocol error: {m}"),
            McpError::Unsupported(m) => write!(f, "unsupported: {m}"),
            McpError::Timeout(m) => write!(f, "timed out: {m}"),
            McpError::Transport(m) => write!(f, "transport error: {m}"),
            McpError::TooLarge { what, limit } => write!(f, "the server's {what}: over the bound of {limit} bytes"),
        }
    }
}

impl std::error::Error for McpError {}
