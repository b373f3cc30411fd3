//! The `sandbox.egress` settings ([`EgressConfig`]) and the egress policy made of them:
//! which hosts and ports a session's sandbox may reach through warden's proxy, which
//! addresses are never reached by name, and which credentials the proxy adds.
//!
//! Plain data and pure decisions at the bottom of the crate: the configuration (`config.rs`)
//! holds the settings and the proxy (`egress/`) asks the policy; this module names no
//! container, session, socket or Docker call.
//!
//! Patterns (`sandbox.egress.allow` / `deny`): an exact host name (`pypi.org`), a suffix
//! wildcard (`*.pythonhosted.org`: any name *below* it, not the name itself), an IPv4
//! literal (`127.0.0.1`) or a bracketed IPv6 literal (`[::1]`), each with an optional port
//! (`api.github.com:443`) or `:*` for every port. An allow entry without a port allows the
//! web ports 80 and 443 only; a deny entry without a port denies every port. Deny wins over
//! allow; a host no allow entry names is refused.
//!
//! Addresses: a name is resolved by the proxy, and every address it resolves to must be
//! public (see [`address_class`]); loopback, link-local (the cloud metadata address),
//! private, shared (CGNAT), unique-local, multicast, documentation and reserved ranges are
//! reached only when the request names that IP literal itself and an allow entry names it
//! exactly — never through a name.
//!
//! This module must never widen a policy: narrowing ([`EgressPolicy::narrowed`]) only
//! intersects, and anything it cannot parse is an error naming the field, never a default.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

use crate::error::SandboxError;

/// Most entries of `allow`, of `deny` and of `credentials` each: a policy is read by people.
pub const MAX_EGRESS_RULES: usize = 256;
/// Longest host name (RFC 1035: 253 characters without the trailing dot).
pub const MAX_HOST_LEN: usize = 253;
/// Longest allow or deny entry: `*.` + the longest host name + `:65535`. Anything longer
/// cannot be a valid entry and is refused without being quoted back.
const MAX_PATTERN_LEN: usize = 2 + MAX_HOST_LEN + 6;
/// Ports an allow entry without a port allows: the web (HTTP and HTTPS).
pub const DEFAULT_ALLOW_PORTS: [u16; 2] = [80, 443];
/// Shortest environment value of a credential that is scrubbed on its own (besides the
/// formatted header value, which always is).
pub const MIN_SCRUBBED_RAW_BYTES: usize = 8;
/// Longest credential value accepted from the host environment.
pub const MAX_CREDENTIAL_BYTES: usize = 8 * 1024;

/// The `sandbox.egress` section.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EgressConfig {
    /// Hosts the sandbox may reach (patterns, see the module doc). Empty: nothing.
    pub allow: Vec<String>,
    /// Hosts it may never reach, whatever `allow` says.
    pub deny: Vec<String>,
    /// Headers the proxy adds to plain-HTTP requests to one host, their values read from the
    /// host's environment (never placed in the sandbox).
    pub credentials: Vec<CredentialConfig>,
}

/// One `sandbox.egress.credentials` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialConfig {
    /// The exact host (optionally `host:port`) whose plain-HTTP requests get the header.
    pub host: String,
    /// Header name, e.g. `Authorization`.
    pub header: String,
    /// Environment variable of the warden process holding the value.
    pub value_env: String,
    /// How the value is written; `{}` is replaced by it. Default `{}`.
    #[serde(default = "default_format")]
    pub format: String,
}

fn default_format() -> String {
    "{}".into()
}

/// Which host a pattern names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    /// One name, lower case, no trailing dot.
    Exact(String),
    /// Every name ending in `.<suffix>` (the suffix itself excluded).
    Suffix(String),
    /// One IP address.
    Ip(IpAddr),
}

/// Which ports a pattern names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PortPattern {
    /// No port given: the web ports for allow entries, every port for deny entries.
    Unspecified,
    /// `:*`.
    Any,
    One(u16),
}

/// One parsed allow or deny entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    host: HostPattern,
    port: PortPattern,
    /// The entry as the operator wrote it (named in decisions).
    text: String,
}

/// Whether a pattern is read as an allow or a deny entry (they differ in the meaning of a
/// missing port).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Allow,
    Deny,
}

impl Pattern {
    /// Parses one entry; the error says what is wrong and what is expected.
    pub fn parse(text: &str) -> Result<Pattern, String> {
        let t = text.trim();
        if t.len() > MAX_PATTERN_LEN {
            // Never a valid entry; not quoted, so a huge one never fills an error or a log.
            return Err(format!("an entry of {} bytes; expected a host pattern of at most {MAX_PATTERN_LEN}", t.len()));
        }
        if t.is_empty() {
            return Err("an empty entry; expected a host such as `pypi.org`, `*.example.com`, `10.0.0.5:8080`".into());
        }
        if t.contains("://") || t.contains('/') {
            return Err(format!(
                "`{t}` looks like a URL; expected a host with an optional port, such as `pypi.org` or `api.github.com:443`"
            ));
        }
        let (host, port) = split_host_port(t)?;
        let port = match port {
            None => PortPattern::Unspecified,
            Some("*") => PortPattern::Any,
            Some(p) => {
                PortPattern::One(parse_port(p).ok_or_else(|| format!("`{t}`: the port must be 1-65535 or `*`"))?)
            }
        };
        let host = if let Some(ip) = parse_ip_literal(host) {
            if ip.is_unspecified() || ip.is_multicast() || ip == IpAddr::V4(Ipv4Addr::BROADCAST) {
                return Err(format!("`{t}`: {ip} is not a unicast address a connection could go to"));
            }
            HostPattern::Ip(canonical(ip))
        } else if let Some(suffix) = host.strip_prefix("*.") {
            let suffix = normalize_name(suffix).ok_or_else(|| bad_name(t))?;
            if !suffix.contains('.') {
                return Err(format!("`{t}`: a wildcard must leave at least two labels (`*.example.com`, not `*.com`)"));
            }
            HostPattern::Suffix(suffix)
        } else if host.contains('*') {
            return Err(format!("`{t}`: `*` is only allowed as the whole first label (`*.example.com`)"));
        } else {
            HostPattern::Exact(normalize_name(host).ok_or_else(|| bad_name(t))?)
        };
        Ok(Pattern { host, port, text: t.to_string() })
    }

    /// Whether the entry names `host` (normalized, see [`Target`]) on `port`.
    fn matches(&self, target: &Target, side: Side) -> bool {
        let port_ok = match self.port {
            PortPattern::Any => true,
            PortPattern::One(p) => p == target.port,
            PortPattern::Unspecified => side == Side::Deny || DEFAULT_ALLOW_PORTS.contains(&target.port),
        };
        port_ok && self.matches_host(&target.host)
    }

    fn matches_host(&self, host: &TargetHost) -> bool {
        match (&self.host, host) {
            (HostPattern::Exact(p), TargetHost::Name(n)) => p == n,
            (HostPattern::Suffix(s), TargetHost::Name(n)) => {
                n.len() > s.len() + 1 && n.ends_with(s.as_str()) && n.as_bytes()[n.len() - s.len() - 1] == b'.'
            }
            (HostPattern::Ip(p), TargetHost::Ip(ip)) => p == ip,
            _ => false,
        }
    }

    /// Whether this deny entry names a resolved address (IP entries only).
    fn denies_address(&self, ip: IpAddr, port: u16) -> bool {
        let port_ok = match self.port {
            PortPattern::One(p) => p == port,
            PortPattern::Any | PortPattern::Unspecified => true,
        };
        port_ok && matches!(self.host, HostPattern::Ip(p) if p == canonical(ip))
    }

    /// The entry as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

fn bad_name(t: &str) -> String {
    format!(
        "`{t}`: not a host name (letters, digits, `-` and `.`, labels of 1-63 characters, at most {MAX_HOST_LEN} in all) or IP literal"
    )
}

fn parse_port(p: &str) -> Option<u16> {
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    p.parse::<u16>().ok().filter(|p| *p != 0)
}

/// Splits `host[:port]`, `[v6][:port]` or a bare IPv6 literal.
fn split_host_port(t: &str) -> Result<(&str, Option<&str>), String> {
    if let Some(rest) = t.strip_prefix('[') {
        let (inside, after) = rest.split_once(']').ok_or_else(|| format!("`{t}`: unclosed `[`"))?;
        return match after {
            "" => Ok((inside, None)),
            a => match a.strip_prefix(':') {
                Some(p) => Ok((inside, Some(p))),
                None => Err(format!("`{t}`: expected `:port` after `]`")),
            },
        };
    }
    if t.parse::<Ipv6Addr>().is_ok() {
        return Ok((t, None));
    }
    match t.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => Ok((h, Some(p))),
        Some(_) => Err(format!("`{t}`: an IPv6 address with a port is written `[addr]:port`")),
        None => Ok((t, None)),
    }
}

/// An IP literal (`1.2.3.4`, `::1`, brackets already removed). Only the dotted-quad form
/// counts for IPv4 (no `127.1` or decimal forms: they are refused as names instead).
fn parse_ip_literal(h: &str) -> Option<IpAddr> {
    h.parse::<IpAddr>().ok()
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// A host name in lower case without a trailing dot, if it is one (LDH labels of 1-63
/// characters, at most [`MAX_HOST_LEN`]; not all-numeric, so `127.1` is never a name).
pub(crate) fn normalize_name(h: &str) -> Option<String> {
    let h = h.strip_suffix('.').unwrap_or(h).to_ascii_lowercase();
    if h.is_empty() || h.len() > MAX_HOST_LEN {
        return None;
    }
    let labels_ok = h.split('.').all(|l| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    });
    // A last label of digits only would make the name an IP-like string (`127.1`, `1.2.3`).
    let last_numeric = h.rsplit('.').next().is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()));
    (labels_ok && !last_numeric).then_some(h)
}

/// What a connection asks for, normalized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub host: TargetHost,
    pub port: u16,
}

/// The host of a [`Target`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetHost {
    Name(String),
    Ip(IpAddr),
}

impl Target {
    /// A target from a request's host (name, IPv4, IPv6 with or without brackets) and port;
    /// `None` when the host is neither a host name nor an IP literal.
    pub fn new(host: &str, port: u16) -> Option<Target> {
        let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        let host = match parse_ip_literal(bare) {
            Some(ip) => TargetHost::Ip(canonical(ip)),
            None => TargetHost::Name(normalize_name(host)?),
        };
        Some(Target { host, port })
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            TargetHost::Name(n) => write!(f, "{n}:{}", self.port),
            TargetHost::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            TargetHost::Ip(ip) => write!(f, "{ip}:{}", self.port),
        }
    }
}

/// The class of an address a name may never lead to, or `None` for a public address.
/// IPv4-mapped, NAT64 (64:ff9b::/96) and 6to4 (2002::/16) addresses are judged by the IPv4
/// address they carry.
pub fn address_class(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_class(v4),
        IpAddr::V6(v6) => v6_class(v6),
    }
}

fn v4_class(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    let class = match o {
        [0, ..] => "unspecified (0.0.0.0/8)",
        [127, ..] => "loopback (127.0.0.0/8)",
        [10, ..] => "private (10.0.0.0/8)",
        [172, b, ..] if (16..=31).contains(&b) => "private (172.16.0.0/12)",
        [192, 168, ..] => "private (192.168.0.0/16)",
        [169, 254, ..] => "link-local (169.254.0.0/16, the cloud metadata address)",
        [100, b, ..] if (64..=127).contains(&b) => "shared address space (100.64.0.0/10, CGNAT)",
        [192, 0, 0, _] => "IETF protocol assignments (192.0.0.0/24)",
        [192, 0, 2, _] | [198, 51, 100, _] | [203, 0, 113, _] => "documentation",
        [192, 88, 99, _] => "6to4 relay anycast (192.88.99.0/24)",
        [198, 18 | 19, ..] => "benchmarking (198.18.0.0/15)",
        [224..=239, ..] => "multicast (224.0.0.0/4)",
        [240..=255, ..] => "reserved (240.0.0.0/4, broadcast)",
        _ => return None,
    };
    Some(class)
}

fn v6_class(ip: Ipv6Addr) -> Option<&'static str> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return v4_class(v4);
    }
    let s = ip.segments();
    // NAT64 well-known prefix: the last 32 bits are an IPv4 address.
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        return v4_class(Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8));
    }
    // 6to4: bits 16-47 are an IPv4 address.
    if s[0] == 0x2002 {
        return v4_class(Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8));
    }
    let class = if ip.is_unspecified() {
        "unspecified (::)"
    } else if ip.is_loopback() {
        "loopback (::1)"
    } else if s[0..6] == [0, 0, 0, 0, 0, 0] {
        "IPv4-compatible (::/96, deprecated)"
    } else if s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1 {
        "local-use NAT64 (64:ff9b:1::/48)"
    } else if s[0] == 0x100 && s[1..4] == [0, 0, 0] {
        "discard-only (100::/64)"
    } else if s[0] == 0x2001 && s[1] == 0xdb8 {
        "documentation (2001:db8::/32)"
    } else if s[0] == 0x2001 && s[1] == 0 {
        "Teredo (2001::/32)"
    } else if s[0] & 0xfe00 == 0xfc00 {
        "unique-local (fc00::/7)"
    } else if s[0] & 0xffc0 == 0xfe80 {
        "link-local (fe80::/10)"
    } else if s[0] & 0xffc0 == 0xfec0 {
        "site-local (fec0::/10, deprecated)"
    } else if s[0] & 0xff00 == 0xff00 {
        "multicast (ff00::/8)"
    } else {
        return None;
    };
    Some(class)
}

/// A credential the proxy adds: header name and the full value (`format` applied), read
/// from the host environment. Its `Debug` never shows the value.
#[derive(Clone)]
pub struct Credential {
    /// Normalized host the credential is for.
    host: TargetHost,
    /// `Some`: only this port.
    port: Option<u16>,
    pub(crate) header: String,
    /// The header's value: `format` with the environment value in it.
    pub(crate) value: String,
    /// The environment value alone (scrubbed too: a server may echo just the token).
    raw: String,
    /// `sandbox.egress.credentials[i]` (named in decisions, never the value).
    pub(crate) name: String,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential").field("name", &self.name).field("header", &self.header).finish_non_exhaustive()
    }
}

/// Which part of a credential is wrong ([`Credential::task`]'s error names it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialField {
    Host,
    Header,
    Format,
    Value,
}

impl CredentialField {
    /// The field's name as configuration and requests spell it.
    pub fn name(self) -> &'static str {
        match self {
            CredentialField::Host => "host",
            CredentialField::Header => "header",
            CredentialField::Format => "format",
            CredentialField::Value => "value",
        }
    }
}

/// Longest `format` template of a credential.
pub const MAX_CREDENTIAL_FORMAT_BYTES: usize = 256;

impl Credential {
    pub(crate) fn applies_to(&self, target: &Target) -> bool {
        self.host == target.host && self.port.is_none_or(|p| p == target.port)
    }

    /// A credential of one task (a `tool_context` entry with `inject`): the same checks as
    /// a `sandbox.egress.credentials` entry (one exact host the operator's `policy`
    /// allows, a header that can carry a credential, a template with one `{}`, a value of
    /// at most [`MAX_CREDENTIAL_BYTES`] without control characters). `name` is how
    /// decisions name it (`tool_context.<key>`), never the value. The proxy adds it only
    /// while a call of its task holds it ([`crate::Sandbox::hold_egress_with`]).
    pub fn task(
        policy: &EgressPolicy,
        host: &str,
        header: &str,
        format: &str,
        value: &str,
        name: String,
    ) -> Result<Credential, (CredentialField, String)> {
        Credential::build(policy, host, header, format, Some(value.to_owned()), name)
    }

    /// The one validation of a credential, operator's or task's; `raw: None` checks all
    /// but the value.
    fn build(
        policy: &EgressPolicy,
        host: &str,
        header: &str,
        format: &str,
        raw: Option<String>,
        name: String,
    ) -> Result<Credential, (CredentialField, String)> {
        use CredentialField as F;
        let pattern = Pattern::parse(host).map_err(|e| (F::Host, format!("expected one host: {e}")))?;
        let port = match pattern.port {
            PortPattern::One(p) => Some(p),
            PortPattern::Unspecified => None,
            PortPattern::Any => return Err((F::Host, "expected one host with an optional port, not `:*`".into())),
        };
        let target_host = match pattern.host {
            HostPattern::Exact(n) => TargetHost::Name(n),
            HostPattern::Ip(ip) => TargetHost::Ip(ip),
            HostPattern::Suffix(_) => {
                return Err((F::Host, "expected one exact host; a credential never goes to a wildcard".into()));
            }
        };
        let probe = Target { host: target_host.clone(), port: port.unwrap_or(80) };
        if policy.admit(&probe).is_err() {
            return Err((
                F::Host,
                format!(
                    "`{}` on port {} is not allowed by sandbox.egress (allow it, or remove the credential)",
                    bounded_text(host),
                    probe.port
                ),
            ));
        }
        let header = header.trim();
        let lower = header.to_ascii_lowercase();
        let token = !header.is_empty()
            && header.len() <= MAX_HOST_LEN
            && header.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token
            || matches!(
                lower.as_str(),
                "host"
                    | "content-length"
                    | "transfer-encoding"
                    | "connection"
                    | "upgrade"
                    | "te"
                    | "trailer"
                    | "keep-alive"
            )
            || lower.starts_with("proxy-")
        {
            return Err((
                F::Header,
                format!(
                    "expected a header name that can carry a credential, e.g. Authorization (not {:?})",
                    bounded_text(header)
                ),
            ));
        }
        if format.matches("{}").count() != 1 || format.len() > MAX_CREDENTIAL_FORMAT_BYTES {
            return Err((F::Format, "expected a template with exactly one `{}`, e.g. \"Bearer {}\"".into()));
        }
        let raw = raw.unwrap_or_default();
        let value = format.replacen("{}", &raw, 1);
        if raw.len() > MAX_CREDENTIAL_BYTES || value.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            return Err((F::Value, format!("must be at most {MAX_CREDENTIAL_BYTES} bytes without control characters")));
        }
        Ok(Credential { host: target_host, port, header: header.to_string(), value, raw, name })
    }

    /// How decisions name it (never the value).
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// `text` cut for an error message (a request may send a huge host or header name).
fn bounded_text(text: &str) -> &str {
    &text[..text.floor_char_boundary(MAX_PATTERN_LEN)]
}

/// Why a connection was refused; the message names the rule, for the tool and the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    /// Which rule refused: `deny <entry>`, `no allow entry`, `address <class>`, ...
    pub rule: String,
}

/// A host-level decision before name resolution: the allow entry that admits the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// `allow <entry>` (the base policy's entry).
    pub rule: String,
}

/// The validated policy of a sandbox: allow layers (the operator's list, then each
/// narrowing), deny entries, credentials.
#[derive(Debug, Clone)]
pub struct EgressPolicy {
    /// A target must match an entry of *every* layer (layer 0: `sandbox.egress.allow`).
    allow: Vec<Vec<Pattern>>,
    /// Where each narrowing layer came from (`allow[i + 1]`), for the refusal's rule.
    sources: Vec<String>,
    deny: Vec<Pattern>,
    credentials: Vec<Credential>,
}

/// An allow-list that can only shrink a policy: an agent file's or a task's `egress`
/// list, validated. A target must then be allowed by the operator's policy *and* by
/// this list; a narrowing never adds a host, never lifts a deny entry or the address
/// checks, and never adds a credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressNarrowing {
    patterns: Vec<Pattern>,
    /// Who narrows, as the refusal names it: `agent file reviewer.md (egress)`, `the task (egress)`.
    source: String,
}

impl EgressNarrowing {
    /// Checks every entry (the same patterns as `sandbox.egress.allow`); the error names
    /// the entry (`egress[2]: expected a host pattern: ...`). `source` says who narrows.
    pub fn parse(allow: &[String], source: impl Into<String>) -> Result<EgressNarrowing, String> {
        if allow.len() > MAX_EGRESS_RULES {
            return Err(format!("egress: at most {MAX_EGRESS_RULES} entries, not {}", allow.len()));
        }
        let patterns = allow
            .iter()
            .enumerate()
            .map(|(i, t)| Pattern::parse(t).map_err(|e| format!("egress[{i}]: expected a host pattern: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(EgressNarrowing { patterns, source: source.into() })
    }

    /// Who narrows (for logs and refusals).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The entries as written (what [`EgressNarrowing::parse`] reads back).
    pub fn entries(&self) -> impl Iterator<Item = &str> {
        self.patterns.iter().map(|p| p.text.as_str())
    }
}

impl EgressConfig {
    /// Checks every entry; the error names the field (`sandbox.egress.allow[2]`) and what
    /// is expected. Does not read the credentials' environment variables.
    pub fn validate(&self) -> Result<(), SandboxError> {
        self.parse(|_| Ok(String::new())).map(drop)
    }

    /// The policy, with the credentials' values read from `env` (the host environment).
    pub fn resolve(&self, env: impl Fn(&str) -> Option<String>) -> Result<EgressPolicy, SandboxError> {
        self.parse(|name| {
            env(name).ok_or_else(|| format!("the environment variable {name} is not set in the warden process"))
        })
    }

    fn parse(&self, env: impl Fn(&str) -> Result<String, String>) -> Result<EgressPolicy, SandboxError> {
        let bad = |key: String, msg: String| SandboxError::Config(format!("sandbox.egress.{key}: {msg}"));
        let list = |name: &str, items: &[String]| -> Result<Vec<Pattern>, SandboxError> {
            if items.len() > MAX_EGRESS_RULES {
                return Err(bad(name.into(), format!("at most {MAX_EGRESS_RULES} entries")));
            }
            items
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    Pattern::parse(t).map_err(|e| bad(format!("{name}[{i}]"), format!("expected a host pattern: {e}")))
                })
                .collect()
        };
        let allow = list("allow", &self.allow)?;
        let deny = list("deny", &self.deny)?;
        if self.credentials.len() > MAX_EGRESS_RULES {
            return Err(bad("credentials".into(), format!("at most {MAX_EGRESS_RULES} entries")));
        }
        let mut policy = EgressPolicy { allow: vec![allow], sources: vec![], deny, credentials: vec![] };
        for (i, c) in self.credentials.iter().enumerate() {
            let key = |f: &str| format!("credentials[{i}].{f}");
            let var_ok = !c.value_env.is_empty()
                && c.value_env.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !c.value_env.as_bytes()[0].is_ascii_digit();
            // The host, header and format are judged before the environment is read.
            let checked = Credential::build(&policy, &c.host, &c.header, &c.format, None, String::new());
            if let Err((field, msg)) = checked
                && field != CredentialField::Value
            {
                return Err(bad(key(field.name()), msg));
            }
            if !var_ok {
                return Err(bad(
                    key("value_env"),
                    "expected the name of an environment variable of the warden process, e.g. GH_TOKEN".into(),
                ));
            }
            let raw = env(&c.value_env).map_err(|e| bad(key("value_env"), e))?;
            let name = format!("sandbox.egress.{}", key("")).trim_end_matches('.').to_string();
            let credential = Credential::build(&policy, &c.host, &c.header, &c.format, Some(raw), name).map_err(
                |(field, msg)| match field {
                    CredentialField::Value => bad(key("value_env"), format!("the value of {} {msg}", c.value_env)),
                    other => bad(key(other.name()), msg),
                },
            )?;
            policy.credentials.push(credential);
        }
        Ok(policy)
    }
}

impl EgressPolicy {
    /// The policy narrowed by `narrowings` (an agent's and a task's lists): a target must be
    /// allowed by this policy *and* by every narrowing, so narrowing can only take away.
    pub fn narrowed<'a>(&self, narrowings: impl IntoIterator<Item = &'a EgressNarrowing>) -> EgressPolicy {
        let mut p = self.clone();
        for n in narrowings {
            p.allow.push(n.patterns.clone());
            p.sources.push(n.source.clone());
        }
        p
    }

    /// The host-level decision: deny entries first (deny wins), then every allow layer.
    pub fn admit(&self, target: &Target) -> Result<Admitted, Denied> {
        if let Some(d) = self.deny.iter().find(|d| d.matches(target, Side::Deny)) {
            return Err(Denied { rule: format!("deny `{d}`") });
        }
        let mut rule = None;
        for (i, layer) in self.allow.iter().enumerate() {
            match layer.iter().find(|a| a.matches(target, Side::Allow)) {
                Some(a) if i == 0 => rule = Some(format!("allow `{a}`")),
                Some(_) => {}
                None if i == 0 => {
                    return Err(Denied { rule: format!("no allow entry names {target} (sandbox.egress.allow)") });
                }
                None => {
                    let source = self.sources.get(i - 1).map(String::as_str).unwrap_or("a narrowing");
                    return Err(Denied { rule: format!("{target} is outside the egress list of {source}") });
                }
            }
        }
        rule.map(|rule| Admitted { rule }).ok_or_else(|| Denied { rule: "no allow entry".into() })
    }

    /// Checks one address `target` resolved to (or is): a deny entry naming it refuses it;
    /// a non-public address is refused unless the target is that IP literal itself (which
    /// then passed [`EgressPolicy::admit`] through an entry naming it exactly).
    pub fn check_address(&self, target: &Target, ip: IpAddr) -> Result<(), Denied> {
        let ip = canonical(ip);
        if let Some(d) = self.deny.iter().find(|d| d.denies_address(ip, target.port)) {
            return Err(Denied { rule: format!("deny `{d}` (resolved address {ip})") });
        }
        let literal = matches!(target.host, TargetHost::Ip(t) if t == ip);
        match address_class(ip) {
            Some(class) if !literal => Err(Denied {
                rule: format!(
                    "{target} resolves to {ip}, a {class} address; a name never reaches one (allow the IP literal itself to reach it)"
                ),
            }),
            _ => Ok(()),
        }
    }

    /// The credential the proxy adds to a plain-HTTP request to `target`, if any.
    pub(crate) fn credential_for(&self, target: &Target) -> Option<&Credential> {
        self.credentials.iter().find(|c| c.applies_to(target))
    }

    /// Every credential value (for the host's scrubber of tool output; never logged): the
    /// header value as sent, and the environment value alone when it is at least
    /// [`MIN_SCRUBBED_RAW_BYTES`] long (a shorter one would blank ordinary words).
    pub fn secret_values(&self) -> Vec<String> {
        let mut values = Vec::with_capacity(self.credentials.len() * 2);
        for c in &self.credentials {
            values.push(c.value.clone());
            if c.raw != c.value && c.raw.len() >= MIN_SCRUBBED_RAW_BYTES {
                values.push(c.raw.clone());
            }
        }
        values
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_entry_is_refused_without_being_quoted() {
        let huge = format!("{}.example.com", "a\u{0}".repeat(100_000));
        let e = Pattern::parse(&huge).unwrap_err();
        assert!(e.len() < 200 && !e.contains('\u{0}') && e.contains("at most"), "{}", &e[..e.len().min(300)]);
        // The longest valid entry still passes.
        let longest = format!("*.{}:65535", ["a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(61)].join("."));
        assert_eq!(longest.len(), MAX_PATTERN_LEN);
        Pattern::parse(&longest).unwrap();
    }
    use proptest::prelude::*;

    fn policy(allow: &[&str], deny: &[&str]) -> EgressPolicy {
        EgressConfig {
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
            credentials: vec![],
        }
        .resolve(|_| None)
        .unwrap()
    }

    fn t(host: &str, port: u16) -> Target {
        Target::new(host, port).unwrap()
    }

    #[test]
    fn patterns_parse_and_bad_ones_name_the_problem() {
        for ok in [
            "pypi.org",
            "*.pythonhosted.org",
            "api.github.com:443",
            "127.0.0.1:8080",
            "[::1]:80",
            "::1",
            "example.com:*",
            "Example.COM.",
        ] {
            Pattern::parse(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for (bad, says) in [
            ("", "empty"),
            ("*", "first label"),
            ("*.com", "two labels"),
            ("foo.*.com", "first label"),
            ("*foo.com", "first label"),
            ("https://pypi.org", "URL"),
            ("pypi.org/simple", "URL"),
            ("pypi.org:0", "port"),
            ("pypi.org:65536", "port"),
            ("pypi.org:http", "port"),
            ("0.0.0.0", "unicast"),
            ("224.0.0.1", "unicast"),
            ("[::1]80", "after `]`"),
            ("127.1", "not a host"),
            ("exa mple.com", "not a host"),
            ("-bad.com", "not a host"),
        ] {
            let e = Pattern::parse(bad).err().unwrap_or_else(|| panic!("{bad:?} parsed"));
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn deny_wins_and_ports_default_to_the_web_for_allow_only() {
        let p =
            policy(&["*.example.com", "pypi.org", "api.github.com:8443", "any.example.org:*"], &["bad.example.com"]);
        assert!(p.admit(&t("a.example.com", 443)).is_ok());
        assert!(p.admit(&t("a.b.example.com", 80)).is_ok());
        assert!(p.admit(&t("example.com", 443)).is_err(), "the suffix itself is not below it");
        assert!(p.admit(&t("badexample.com", 443)).is_err());
        assert!(p.admit(&t("a.example.com", 22)).is_err(), "no port: 80 and 443 only");
        assert!(p.admit(&t("api.github.com", 443)).is_err());
        assert!(p.admit(&t("api.github.com", 8443)).is_ok());
        assert!(p.admit(&t("any.example.org", 2222)).is_ok());
        let d = p.admit(&t("bad.example.com", 443)).unwrap_err();
        assert_eq!(d.rule, "deny `bad.example.com`");
        assert!(p.admit(&t("BAD.Example.com.", 8080)).is_err(), "deny without a port: every port");
        assert!(p.admit(&t("1.2.3.4", 80)).unwrap_err().rule.contains("no allow entry"));
    }

    #[test]
    fn names_never_reach_private_addresses_but_exact_literals_may() {
        let p = policy(&["localhost:*", "127.0.0.1:8080", "internal.test"], &["10.9.9.9"]);
        let local = t("localhost", 8080);
        assert!(p.admit(&local).is_ok());
        let e = p.check_address(&local, "127.0.0.1".parse().unwrap()).unwrap_err();
        assert!(e.rule.contains("loopback"), "{}", e.rule);
        let lit = t("127.0.0.1", 8080);
        assert!(p.admit(&lit).is_ok());
        assert!(p.check_address(&lit, "127.0.0.1".parse().unwrap()).is_ok());
        assert!(p.admit(&t("127.0.0.1", 8081)).is_err());
        assert!(
            p.check_address(&t("internal.test", 443), "169.254.169.254".parse().unwrap())
                .unwrap_err()
                .rule
                .contains("metadata")
        );
        assert!(p.check_address(&t("internal.test", 443), "::ffff:10.0.0.1".parse().unwrap()).is_err());
        assert!(p.check_address(&t("internal.test", 443), "93.184.216.34".parse().unwrap()).is_ok());
        assert!(
            p.check_address(&t("internal.test", 443), "10.9.9.9".parse().unwrap()).unwrap_err().rule.contains("deny")
        );
    }

    #[test]
    fn narrowing_only_takes_away() {
        let base = policy(&["*.example.com", "pypi.org"], &[]);
        let agent = EgressNarrowing::parse(
            &["pypi.org".into(), "evil.org".into(), "*.example.com".into()],
            "agent file a.md (egress)",
        )
        .unwrap();
        let task = EgressNarrowing::parse(&["pypi.org".into(), "a.example.com".into()], "the task (egress)").unwrap();
        let narrow = base.narrowed([&agent]);
        assert!(narrow.admit(&t("pypi.org", 443)).is_ok());
        assert!(narrow.admit(&t("a.example.com", 443)).is_ok());
        assert!(narrow.admit(&t("evil.org", 443)).is_err(), "a narrowing cannot add a host");
        let both = base.narrowed([&agent, &task]);
        assert!(both.admit(&t("pypi.org", 443)).is_ok());
        assert!(both.admit(&t("a.example.com", 443)).is_ok());
        let refused = both.admit(&t("b.example.com", 443)).unwrap_err();
        assert_eq!(refused.rule, "b.example.com:443 is outside the egress list of the task (egress)");
        let refused = base.narrowed([&task, &agent]).admit(&t("evil.org", 443)).unwrap_err();
        assert!(refused.rule.contains("sandbox.egress.allow"), "the operator's list is judged first: {}", refused.rule);
        assert_eq!(
            base.narrowed([]).admit(&t("b.example.com", 443)).map(|a| a.rule),
            Ok("allow `*.example.com`".into())
        );
    }

    #[test]
    fn a_narrowing_names_its_bad_entry() {
        let e = EgressNarrowing::parse(&["pypi.org".into(), "*".into()], "x").unwrap_err();
        assert!(e.starts_with("egress[1]: expected a host pattern"), "{e}");
        let e = EgressNarrowing::parse(&vec!["a.test".to_string(); MAX_EGRESS_RULES + 1], "x").unwrap_err();
        assert!(e.contains("at most"), "{e}");
    }

    #[test]
    fn the_address_classifier_knows_the_special_ranges() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "192.0.2.1",
            "198.18.0.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "2001:db8::1",
            "::127.0.0.1",
        ] {
            assert!(address_class(ip.parse().unwrap()).is_some(), "{ip} is not public");
        }
        for ip in [
            "93.184.216.34",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "64:ff9b::101:101",
            "2002:101:101::",
        ] {
            assert_eq!(address_class(ip.parse().unwrap()), None, "{ip} is public");
        }
    }

    #[test]
    fn credentials_are_validated_and_resolved_from_the_environment() {
        let cfg = |host: &str, header: &str, env: &str, format: &str| EgressConfig {
            allow: vec!["api.example.com".into(), "*.example.org".into()],
            deny: vec![],
            credentials: vec![CredentialConfig {
                host: host.into(),
                header: header.into(),
                value_env: env.into(),
                format: format.into(),
            }],
        };
        let env = |n: &str| (n == "TOKEN").then(|| "s3cret".to_string());
        let p = cfg("api.example.com", "Authorization", "TOKEN", "Bearer {}").resolve(env).unwrap();
        let c = p.credential_for(&t("api.example.com", 80)).unwrap();
        assert_eq!((c.header.as_str(), c.value.as_str()), ("Authorization", "Bearer s3cret"));
        assert_eq!(p.secret_values(), ["Bearer s3cret"], "a raw value under 8 bytes is not scrubbed alone");
        let long = |n: &str| (n == "TOKEN").then(|| "s3cret-long".to_string());
        let p2 = cfg("api.example.com", "Authorization", "TOKEN", "Bearer {}").resolve(long).unwrap();
        assert_eq!(p2.secret_values(), ["Bearer s3cret-long", "s3cret-long"], "the raw value is scrubbed too");
        assert!(!format!("{p:?}").contains("s3cret"), "Debug never shows the value");
        assert!(p.credential_for(&t("other.example.com", 80)).is_none());
        for (c, field) in [
            (cfg("*.example.org", "Authorization", "TOKEN", "{}"), "credentials[0].host"),
            (cfg("nope.example.net", "Authorization", "TOKEN", "{}"), "credentials[0].host"),
            (cfg("api.example.com", "Proxy-Authorization", "TOKEN", "{}"), "credentials[0].header"),
            (cfg("api.example.com", "Bad Header", "TOKEN", "{}"), "credentials[0].header"),
            (cfg("api.example.com", "Authorization", "1X", "{}"), "credentials[0].value_env"),
            (cfg("api.example.com", "Authorization", "MISSING", "{}"), "credentials[0].value_env"),
            (cfg("api.example.com", "Authorization", "TOKEN", "Bearer"), "credentials[0].format"),
        ] {
            let e = c.resolve(env).unwrap_err().to_string();
            assert!(e.contains(&format!("sandbox.egress.{field}")), "{e}");
        }
        // `validate` checks the shape without the environment.
        cfg("api.example.com", "Authorization", "MISSING", "{}").validate().unwrap();
    }

    /// Internal addresses the property test draws from: loopback, private, shared (CGNAT),
    /// link-local (the cloud metadata address) and unique-local, IPv4 and IPv6.
    const INTERNAL: [&str; 10] = [
        "127.0.0.1",
        "127.1.2.3",
        "10.0.0.1",
        "172.16.0.5",
        "192.168.1.10",
        "100.64.0.1",
        "169.254.169.254",
        "::1",
        "fd00::1",
        "fe80::1",
    ];

    /// An allow entry for `INTERNAL[i]`: no port (80 and 443), `:*` (`Some(None)`) or one port.
    fn internal_entry(i: usize, port: Option<Option<u16>>) -> String {
        let ip: IpAddr = INTERNAL[i].parse().unwrap();
        let host = if ip.is_ipv6() { format!("[{ip}]") } else { ip.to_string() };
        match port {
            None => host,
            Some(None) => format!("{host}:*"),
            Some(Some(p)) => format!("{host}:{p}"),
        }
    }

    proptest! {
        /// The class fixed in the host's plugin HTTP check (an internal address allowed by
        /// one entry was reachable through every entry): here an internal address is reached
        /// only as the IP literal an entry names with that port — never through a name
        /// (`localhost`, a wildcard, a public name) and never as another literal — whatever
        /// else the list allows.
        #[test]
        fn an_internal_address_is_reached_only_through_the_entry_naming_it(
            literals in proptest::collection::vec(
                (0..INTERNAL.len(), prop_oneof![Just(None), Just(Some(None)), Just(Some(Some(8080u16)))]),
                0..4,
            ),
            names in proptest::collection::vec(
                prop_oneof![Just("localhost:*"), Just("*.corp.test:*"), Just("metadata.test"), Just("pypi.org")],
                0..4,
            ),
            via_name in prop_oneof![Just("localhost"), Just("db.corp.test"), Just("metadata.test"), Just("pypi.org")],
            target in 0..INTERNAL.len(),
            port in prop_oneof![Just(80u16), Just(443u16), Just(8080u16), Just(9000u16)],
        ) {
            let mut allow: Vec<String> = literals.iter().map(|&(i, p)| internal_entry(i, p)).collect();
            allow.extend(names.iter().map(|n| n.to_string()));
            let allow: Vec<&str> = allow.iter().map(String::as_str).collect();
            let p = policy(&allow, &[]);
            let ip: IpAddr = INTERNAL[target].parse().unwrap();
            let reaches = |target: &Target, ip: IpAddr| p.admit(target).is_ok() && p.check_address(target, ip).is_ok();

            prop_assert!(!reaches(&t(via_name, port), ip), "{via_name}:{port} resolving to {ip} with {allow:?}");
            let literal = t(INTERNAL[target], port);
            let named = literals.iter().any(|&(i, entry_port)| {
                INTERNAL[i] == INTERNAL[target]
                    && match entry_port {
                        None => DEFAULT_ALLOW_PORTS.contains(&port),
                        Some(None) => true,
                        Some(Some(p)) => p == port,
                    }
            });
            prop_assert_eq!(reaches(&literal, ip), named, "{} with {:?}", literal, allow);
            for other in INTERNAL.iter().filter(|o| **o != INTERNAL[target]) {
                let other: IpAddr = other.parse().unwrap();
                prop_assert!(p.check_address(&literal, other).is_err(), "{literal} connecting to {other}");
            }
        }

        #[test]
        fn a_suffix_pattern_matches_exactly_the_names_below_it(
            labels in proptest::collection::vec("[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?", 1..4),
            suffix in "[a-z]{1,8}\\.(com|org|example)",
            port in 1u16..,
        ) {
            let p = Pattern::parse(&format!("*.{suffix}:*")).unwrap();
            let name = format!("{}.{suffix}", labels.join("."));
            if let Some(target) = Target::new(&name, port) {
                prop_assert!(p.matches(&target, Side::Allow));
            }
            prop_assert!(!p.matches(&Target::new(&suffix, port).unwrap(), Side::Allow));
            let glued = format!("{}{suffix}", labels[0]);
            prop_assert!(!p.matches(&Target::new(&glued, port).unwrap(), Side::Allow));
        }

        #[test]
        fn narrowing_never_widens(
            base in proptest::collection::vec("[ab]\\.(x|y)\\.test(:(80|443|\\*))?", 0..4),
            deny in proptest::collection::vec("[ab]\\.(x|y)\\.test(:(80|443))?", 0..2),
            layers in proptest::collection::vec(proptest::collection::vec("(\\*\\.)?[ab]?\\.?(x|y)\\.test(:(80|443|\\*))?", 0..4), 0..3),
            host in "[ab]\\.(x|y)\\.test",
            port in prop_oneof![Just(80u16), Just(443u16), Just(8080u16)],
        ) {
            let cfg = EgressConfig { allow: base, deny, credentials: vec![] };
            let p = cfg.resolve(|_| None).unwrap();
            let narrowings: Vec<EgressNarrowing> = layers
                .iter()
                .map(|l| {
                    let l: Vec<String> = l.iter().filter(|n| Pattern::parse(n).is_ok()).cloned().collect();
                    EgressNarrowing::parse(&l, "test").unwrap()
                })
                .collect();
            let n = p.narrowed(&narrowings);
            let target = Target::new(&host, port).unwrap();
            if n.admit(&target).is_ok() {
                // Admitted by the narrowed policy: admitted by the base and by every layer alone.
                prop_assert!(p.admit(&target).is_ok());
                for one in &narrowings {
                    prop_assert!(p.narrowed([one]).admit(&target).is_ok());
                }
            }
        }

        #[test]
        fn any_ipv4_mapped_address_is_judged_like_its_ipv4(a in any::<u32>()) {
            let v4 = Ipv4Addr::from(a);
            prop_assert_eq!(address_class(IpAddr::V6(v4.to_ipv6_mapped())), address_class(IpAddr::V4(v4)));
        }

        #[test]
        fn parsing_arbitrary_text_never_panics(s in "\\PC{0,40}") {
            let _ = Pattern::parse(&s);
            let _ = Target::new(&s, 443);
        }
    }
}
