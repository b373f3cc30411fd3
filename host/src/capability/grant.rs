//! The operator's grant of one plugin (`plugins.grants.<id>`): plain data, parsed from
//! warden.yaml by [`crate::config`] and checked by [`super::Grants`]. It never decides
//! anything itself.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What the operator grants one plugin. Every field defaults to "no".
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct GrantConfig {
    pub log: bool,
    /// Allow-list of outbound URLs in Spin's grammar (`https://*.example.com`,
    /// `http://localhost:*`); empty = no network.
    pub http: Vec<String>,
    pub model: bool,
    pub tools: bool,
    pub events: bool,
    pub state: bool,
    pub resources: bool,
    /// Secrets the host may inject into this plugin's HTTP requests, by name. The plugin
    /// only ever sees the name; the value goes only to the secret's `origins`.
    pub secrets: BTreeMap<String, SecretGrant>,
    /// The operator's MCP servers (keys of `mcp_servers`) this plugin's subagents may use
    /// as `mcp__<server>__<tool>`, through `tools`. The plugin writes its definitions (an
    /// agent file's `mcpServers` is only what the plugin says it is), so a definition
    /// naming a server not listed here is a registry problem and never reaches the server;
    /// an `all_agents` server too is offered only to plugins listed here. Empty = none.
    pub mcp_servers: Vec<String>,
}

/// Header a secret is sent in unless `header` says otherwise.
pub const DEFAULT_SECRET_HEADER: &str = "Authorization";

/// One secret of `plugins.grants.<id>.secrets`:
/// `{ env: PARTNER_TOKEN, origins: ["https://api.partner.example"], header: X-API-Key }`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SecretGrant {
    /// Environment variable holding the value.
    pub env: String,
    /// Origins the secret may be sent to, in the `http` allow-list grammar
    /// (`https://api.example.com`, `http://127.0.0.1:*`). Required: a secret is never
    /// sent to an origin the operator did not name for it, nor after a redirect elsewhere.
    pub origins: Vec<String>,
    /// Header that carries it (default `Authorization`).
    #[serde(default = "default_secret_header")]
    pub header: String,
    /// Text before the value: default `Bearer` for `Authorization`, none for other
    /// headers; `""` for none.
    #[serde(default)]
    pub scheme: Option<String>,
}

fn default_secret_header() -> String {
    DEFAULT_SECRET_HEADER.into()
}

impl SecretGrant {
    /// The header value for `value`: `<scheme> <value>` or the value alone.
    pub fn header_value(&self, value: &str) -> String {
        let scheme = match &self.scheme {
            Some(s) => s.trim(),
            None if self.header.eq_ignore_ascii_case(DEFAULT_SECRET_HEADER) => "Bearer",
            None => "",
        };
        if scheme.is_empty() { value.to_owned() } else { format!("{scheme} {value}") }
    }
}
