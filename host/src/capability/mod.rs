//! Capabilities: what a plugin may ask of the host, and the one checker that decides.
//!
//! A plugin *requests* capabilities in its `plugin-info`; the operator *grants* them in
//! `plugins.grants.<id>`. The effective set is the intersection. Every host import
//! calls [`Grants::check`] before doing anything, and a denial is an error value naming
//! the capability — never a trap, never a silent success. Which of the operator's MCP
//! servers a plugin's subagents may reach is part of its grant too
//! ([`Grants::check_mcp_server`]), checked when a definition is registered and again
//! whenever MCP tools are listed or called. This module must never perform the
//! capability itself.

pub mod grant;
pub mod http;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Serialize;

pub use grant::{GrantConfig, SecretGrant};
use http::AllowList;
pub use http::Reach;

/// A host capability (mirrors the WIT `capability` enum).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Capability {
    Log,
    Http,
    Model,
    Tools,
    Events,
    State,
    Resources,
}

impl Capability {
    pub const ALL: [Capability; 7] = [
        Capability::Log,
        Capability::Http,
        Capability::Model,
        Capability::Tools,
        Capability::Events,
        Capability::State,
        Capability::Resources,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Capability::Log => "log",
            Capability::Http => "http",
            Capability::Model => "model",
            Capability::Tools => "tools",
            Capability::Events => "events",
            Capability::State => "state",
            Capability::Resources => "resources",
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why the checker said no. Becomes WIT `error::denied(text)`.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum Denied {
    #[error("capability `{capability}` denied: plugin `{plugin}` did not request it")]
    NotRequested { plugin: String, capability: Capability },
    #[error("capability `{capability}` denied: not granted to plugin `{plugin}` (plugins.grants.{plugin})")]
    NotGranted { plugin: String, capability: Capability },
    #[error(
        "capability `http` denied: {url} is not in the allow-list of plugin `{plugin}` (plugins.grants.{plugin}.http)"
    )]
    UrlNotAllowed { plugin: String, url: String },
    #[error(
        "capability `http` denied: secret `{secret}` is not granted to plugin `{plugin}` (plugins.grants.{plugin}.secrets)"
    )]
    SecretNotGranted { plugin: String, secret: String },
    #[error(
        "capability `http` denied: secret `{secret}` may not be sent to {origin} (plugins.grants.{plugin}.secrets.{secret}.origins)"
    )]
    SecretOrigin { plugin: String, secret: String, origin: String },
    #[error(
        "capability `http` denied: {host} resolves to the non-public address {ip}, which no entry of the allow-list of plugin `{plugin}` allowing this URL names (plugins.grants.{plugin}.http)"
    )]
    InternalAddress { plugin: String, host: String, ip: std::net::IpAddr },
    #[error("MCP server `{server}` denied: not granted to plugin `{plugin}` (plugins.grants.{plugin}.mcp_servers)")]
    McpServerNotGranted { plugin: String, server: String },
}

/// A granted secret: where its value lives, where it may go and how it is sent.
#[derive(Debug, Clone)]
pub struct SecretRule {
    pub grant: SecretGrant,
    origins: AllowList,
}

impl SecretRule {
    /// May the secret go to `url`'s origin?
    pub fn allows(&self, url: &reqwest::Url) -> bool {
        self.origins.allows(url)
    }
}

/// The effective grants of one plugin: operator grant ∩ plugin request.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    plugin: String,
    requested: Vec<Capability>,
    granted: Vec<Capability>,
    http: AllowList,
    secrets: BTreeMap<String, SecretRule>,
    /// `plugins.grants.<id>.mcp_servers`: the operator's MCP servers its subagents may use.
    mcp_servers: BTreeSet<String>,
}

impl Grants {
    /// Intersects the operator's grant with what the plugin asked for.
    pub fn new(
        plugin: &str,
        requested: &[Capability],
        grant: Option<&GrantConfig>,
    ) -> Result<Self, http::PatternError> {
        let default = GrantConfig::default();
        let g = grant.unwrap_or(&default);
        let operator = |c: Capability| match c {
            Capability::Log => g.log,
            Capability::Http => !g.http.is_empty(),
            Capability::Model => g.model,
            Capability::Tools => g.tools,
            Capability::Events => g.events,
            Capability::State => g.state,
            Capability::Resources => g.resources,
        };
        let mut requested = requested.to_vec();
        requested.sort();
        requested.dedup();
        let granted = requested.iter().copied().filter(|c| operator(*c)).collect::<Vec<_>>();
        let http = if granted.contains(&Capability::Http) { AllowList::parse(&g.http)? } else { AllowList::default() };
        let secrets = g
            .secrets
            .iter()
            .map(|(name, grant)| {
                Ok((name.clone(), SecretRule { grant: grant.clone(), origins: AllowList::parse(&grant.origins)? }))
            })
            .collect::<Result<_, http::PatternError>>()?;
        let mcp_servers = g.mcp_servers.iter().cloned().collect();
        Ok(Grants { plugin: plugin.to_owned(), requested, granted, http, secrets, mcp_servers })
    }

    /// The single gate every host import passes through.
    pub fn check(&self, capability: Capability) -> Result<(), Denied> {
        if self.granted.contains(&capability) {
            return Ok(());
        }
        if !self.requested.contains(&capability) {
            return Err(Denied::NotRequested { plugin: self.plugin.clone(), capability });
        }
        Err(Denied::NotGranted { plugin: self.plugin.clone(), capability })
    }

    /// `http` plus the allow-list for this URL.
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), Denied> {
        self.check(Capability::Http)?;
        if self.http.allows(url) {
            Ok(())
        } else {
            Err(Denied::UrlNotAllowed { plugin: self.plugin.clone(), url: url.to_string() })
        }
    }

    /// The rule of a granted secret, if it may be sent to `url`.
    pub fn secret_for(&self, secret: &str, url: &reqwest::Url) -> Result<&SecretRule, Denied> {
        let rule = self
            .secrets
            .get(secret)
            .ok_or_else(|| Denied::SecretNotGranted { plugin: self.plugin.clone(), secret: secret.to_owned() })?;
        if !rule.allows(url) {
            return Err(Denied::SecretOrigin {
                plugin: self.plugin.clone(),
                secret: secret.to_owned(),
                origin: url.origin().ascii_serialization(),
            });
        }
        Ok(rule)
    }

    /// May this plugin's subagents use the operator's MCP server `server`? The one check of
    /// MCP reach: the registry asks it for every server a definition names (a name it
    /// denies is a problem and is dropped from the definition), and the tool host asks it
    /// again for every server whose tools it lists or calls, so a definition that did not
    /// come through the registry reaches no more. Deny by default: only names in
    /// `plugins.grants.<id>.mcp_servers` pass.
    pub fn check_mcp_server(&self, server: &str) -> Result<(), Denied> {
        if self.mcp_servers.contains(server) {
            return Ok(());
        }
        Err(Denied::McpServerNotGranted { plugin: self.plugin.clone(), server: server.to_owned() })
    }

    /// Which internal addresses a request to `url` may reach: decided by the allow-list
    /// entries that allow `url` alone ([`AllowList::reach`]).
    pub fn reach(&self, url: &reqwest::Url) -> Reach {
        self.http.reach(url)
    }

    /// May this plugin connect to `ip`, reached as URL host `host`, in a request whose
    /// reach is `reach` ([`Grants::reach`])? Checked after DNS resolution, on the address
    /// actually connected to.
    pub fn check_address(&self, reach: Reach, host: &str, ip: std::net::IpAddr) -> Result<(), Denied> {
        if reach.allows(host, ip) {
            return Ok(());
        }
        Err(Denied::InternalAddress { plugin: self.plugin.clone(), host: host.to_owned(), ip })
    }

    pub fn granted(&self) -> &[Capability] {
        &self.granted
    }

    pub fn requested(&self) -> &[Capability] {
        &self.requested
    }

    pub fn http_patterns(&self) -> Vec<String> {
        self.http.patterns()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intersection_of_request_and_grant() {
        let grant =
            GrantConfig { log: true, model: true, http: vec!["https://*.example.com".into()], ..Default::default() };
        let g = Grants::new("p", &[Capability::Log, Capability::Http, Capability::Tools], Some(&grant)).unwrap();
        assert_eq!(g.granted(), &[Capability::Log, Capability::Http]);
        assert!(g.check(Capability::Log).is_ok());
        // granted by the operator but not requested by the plugin
        assert!(matches!(g.check(Capability::Model), Err(Denied::NotRequested { .. })));
        // requested but not granted
        let e = g.check(Capability::Tools).unwrap_err();
        assert!(e.to_string().contains("`tools` denied"), "{e}");
        assert!(g.check_url(&reqwest::Url::parse("https://a.example.com/").unwrap()).is_ok());
        assert!(g.check_url(&reqwest::Url::parse("https://example.org/").unwrap()).is_err());
    }

    #[test]
    fn nothing_granted_means_nothing_allowed() {
        let g = Grants::new("p", &Capability::ALL, None).unwrap();
        for c in Capability::ALL {
            assert!(g.check(c).is_err(), "{c}");
        }
        assert!(g.check_mcp_server("github").is_err(), "no MCP server without a grant naming it");
        // `tools` alone reaches no MCP server.
        let tools = GrantConfig { tools: true, ..Default::default() };
        let g = Grants::new("p", &Capability::ALL, Some(&tools)).unwrap();
        let e = g.check_mcp_server("github").unwrap_err().to_string();
        assert_eq!(e, "MCP server `github` denied: not granted to plugin `p` (plugins.grants.p.mcp_servers)");
    }

    proptest::proptest! {
        /// A plugin reaches exactly the MCP servers its grant names: whatever the other
        /// capabilities, whatever the plugin requested, and a denial names the plugin, the
        /// server and the key that would grant it.
        #[test]
        fn an_mcp_server_is_reachable_exactly_when_the_grant_names_it(
            granted in proptest::collection::vec("[a-c]{1,2}", 0..4),
            asked in "[a-c]{1,2}",
            tools in proptest::bool::ANY,
            requested in proptest::sample::subsequence(Capability::ALL.to_vec(), 0..=Capability::ALL.len()),
        ) {
            let grant = GrantConfig { tools, mcp_servers: granted.clone(), ..Default::default() };
            let g = Grants::new("plug", &requested, Some(&grant)).unwrap();
            match g.check_mcp_server(&asked) {
                Ok(()) => proptest::prop_assert!(granted.contains(&asked)),
                Err(e) => {
                    proptest::prop_assert!(!granted.contains(&asked));
                    proptest::prop_assert_eq!(
                        e,
                        Denied::McpServerNotGranted { plugin: "plug".into(), server: asked.clone() }
                    );
                }
            }
        }
    }
}
