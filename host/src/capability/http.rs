//! The outbound-HTTP allow-list: Spin's grammar for allowed hosts.
//!
//! A pattern is `scheme://host[:port]`: scheme `http`, `https` or `*`; host an exact
//! name or address, `*.domain` (any subdomain, not the domain itself) or `*`; port a
//! number, `*`, or a range `low..high` (high exclusive, like Rust). No port means the
//! scheme's default port. This module decides; it must never touch the network.

use std::fmt;
use std::ops::Range;

/// A pattern the allow-list could not accept.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("invalid allowed URL {pattern:?}: {reason}")]
pub struct PatternError {
    pub pattern: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Scheme {
    Any,
    Exact(String),
}

#[derive(Debug, Clone, PartialEq)]
enum Host {
    Any,
    /// `*.example.com` → stored as `.example.com`.
    Subdomain(String),
    Exact(String),
}

#[derive(Debug, Clone, PartialEq)]
enum Port {
    Any,
    /// No port given: the scheme's default port.
    Default,
    Range(Range<u32>),
}

/// One parsed allow-list entry.
#[derive(Debug, Clone, PartialEq)]
pub struct AllowedUrl {
    text: String,
    scheme: Scheme,
    host: Host,
    port: Port,
}

impl fmt::Display for AllowedUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

impl AllowedUrl {
    pub fn parse(pattern: &str) -> Result<Self, PatternError> {
        let err = |reason: &str| PatternError { pattern: pattern.to_owned(), reason: reason.to_owned() };
        let (scheme, rest) = pattern
            .split_once("://")
            .ok_or_else(|| err("a scheme is required, e.g. https://example.com or http://localhost:*"))?;
        let scheme = match scheme {
            "*" => Scheme::Any,
            "http" | "https" => Scheme::Exact(scheme.to_owned()),
            _ => return Err(err("scheme must be http, https or *")),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains('/') || rest.contains('?') || rest.contains('@') {
            return Err(err("only scheme, host and port are allowed (no path, query or user)"));
        }
        let (host, port) = match rest.rsplit_once(':') {
            // IPv6 literals are not supported in patterns; a ':' separates the port.
            Some((h, p)) => (h, Some(p)),
            None => (rest, None),
        };
        if host.is_empty() {
            return Err(err("host is empty"));
        }
        let host = if host == "*" {
            Host::Any
        } else if let Some(domain) = host.strip_prefix("*.") {
            if domain.is_empty() || domain.contains('*') {
                return Err(err("wildcard host must look like *.example.com"));
            }
            Host::Subdomain(format!(".{}", domain.to_ascii_lowercase()))
        } else if host.contains('*') {
            return Err(err("a host wildcard is only allowed as * or *.domain"));
        } else {
            Host::Exact(host.to_ascii_lowercase())
        };
        let port = match port {
            None => {
                if scheme == Scheme::Any {
                    return Err(err("with scheme * a port is required (a number, range or *)"));
                }
                Port::Default
            }
            Some("*") => Port::Any,
            Some(p) => match p.split_once("..") {
                Some((lo, hi)) => {
                    let lo: u16 = lo.parse().map_err(|_| err("port range must be like 8000..9000"))?;
                    let hi: u16 = hi.parse().map_err(|_| err("port range must be like 8000..9000"))?;
                    if lo >= hi {
                        return Err(err("port range is empty (high end is exclusive)"));
                    }
                    Port::Range(lo as u32..hi as u32)
                }
                None => {
                    let n: u16 = p.parse().map_err(|_| err("port must be a number 1-65535, a range or *"))?;
                    Port::Range(n as u32..n as u32 + 1)
                }
            },
        };
        Ok(AllowedUrl { text: pattern.to_owned(), scheme, host, port })
    }

    /// Does this entry allow the (already parsed) URL?
    pub fn allows(&self, url: &reqwest::Url) -> bool {
        let scheme = url.scheme();
        if let Scheme::Exact(s) = &self.scheme
            && s != scheme
        {
            return false;
        }
        let Some(host) = url.host_str() else { return false };
        let host = host.to_ascii_lowercase();
        let host_ok = match &self.host {
            Host::Any => true,
            Host::Subdomain(suffix) => host.ends_with(suffix.as_str()) && host.len() > suffix.len(),
            Host::Exact(h) => *h == host,
        };
        if !host_ok {
            return false;
        }
        let Some(port) = url.port_or_known_default() else { return false };
        match &self.port {
            Port::Any => true,
            Port::Default => default_port(scheme) == Some(port),
            Port::Range(r) => r.contains(&(port as u32)),
        }
    }
}

impl AllowedUrl {
    /// The host this entry names exactly (`localhost`, an address or a name), if any.
    fn exact_host(&self) -> Option<&str> {
        match &self.host {
            Host::Exact(h) => Some(h.as_str()),
            _ => None,
        }
    }
}

/// Whether `ip` is an address on the public internet. Loopback, private (RFC 1918,
/// unique-local), link-local (incl. the cloud metadata address 169.254.169.254),
/// carrier-grade NAT, unspecified, broadcast, multicast, documentation and reserved
/// ranges are not; IPv4-mapped and -compatible IPv6 addresses are judged as IPv4.
pub fn is_public(ip: std::net::IpAddr) -> bool {
    use std::net::IpAddr;
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                || (a == 192 && b == 0 && c == 0)
                || (a == 198 && (18..20).contains(&b))
                || a >= 240)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let seg = v6.segments();
            if seg[..6] == [0, 0, 0, 0, 0, 0] && !v6.is_loopback() && !v6.is_unspecified() {
                // IPv4-compatible (deprecated) ::a.b.c.d
                return is_public(IpAddr::V4(std::net::Ipv4Addr::from(((seg[6] as u32) << 16) | seg[7] as u32)));
            }
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (seg[0] & 0xfe00) == 0xfc00
                || (seg[0] & 0xffc0) == 0xfe80
                || (seg[0] & 0xffc0) == 0xfec0
                || (seg[0] == 0x2001 && seg[1] == 0x0db8)
                || (seg[0] == 0x0064 && seg[1] == 0xff9b))
        }
    }
}

/// A plugin's whole allow-list. Empty = deny everything.
#[derive(Debug, Clone, Default)]
pub struct AllowList {
    entries: Vec<AllowedUrl>,
}

impl AllowList {
    pub fn parse(patterns: &[String]) -> Result<Self, PatternError> {
        Ok(AllowList { entries: patterns.iter().map(|p| AllowedUrl::parse(p)).collect::<Result<_, _>>()? })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn allows(&self, url: &reqwest::Url) -> bool {
        matches!(url.scheme(), "http" | "https") && self.entries.iter().any(|e| e.allows(url))
    }

    pub fn patterns(&self) -> Vec<String> {
        self.entries.iter().map(|e| e.text.clone()).collect()
    }

    /// Which non-public addresses a request to `url` may reach, decided by the entries
    /// that allow `url` (scheme, host and port) — never by another entry of the list. Only
    /// an entry that names the URL's host exactly — `localhost`, or the address itself —
    /// opens an internal address, and only for the URLs that entry allows: with
    /// `http://localhost:8080` and `https://*.example.com`, `localhost:22` stays closed and
    /// a name of `example.com` resolving to `127.0.0.1` is refused. A wildcard never
    /// reaches an internal address.
    pub fn reach(&self, url: &reqwest::Url) -> Reach {
        let Some(host) = url.host_str() else { return Reach::PublicOnly };
        let host = host.to_ascii_lowercase();
        if !self.entries.iter().any(|e| e.allows(url) && e.exact_host() == Some(host.as_str())) {
            return Reach::PublicOnly;
        }
        Reach::named(&host)
    }
}

/// The only host name that may resolve to an internal (loopback) address, when an
/// allow-list entry names it.
pub const LOCALHOST: &str = "localhost";

/// The non-public addresses one request may connect to (see [`AllowList::reach`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Public addresses only.
    PublicOnly,
    /// Public addresses, and loopback ones when the host is `localhost`.
    Loopback,
    /// Public addresses and this one address (the URL's host is this address literal).
    Address(std::net::IpAddr),
}

impl Reach {
    /// The non-public addresses a host named exactly by someone trusted to name it (an
    /// allow-list entry naming the URL's host, the registry of `warden plugin pull`) opens:
    /// `localhost` its loopback addresses, an address literal that address, any other
    /// name none (DNS is not the operator's word).
    pub fn named(host: &str) -> Reach {
        let host = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
        if host == LOCALHOST {
            return Reach::Loopback;
        }
        match host.parse::<std::net::IpAddr>() {
            Ok(ip) => Reach::Address(ip),
            Err(_) => Reach::PublicOnly,
        }
    }

    /// May a connection to `ip`, reached through the URL host `host`, be made? Checked on
    /// the address actually connected to (after DNS resolution).
    pub fn allows(self, host: &str, ip: std::net::IpAddr) -> bool {
        if is_public(ip) {
            return true;
        }
        let host = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
        match self {
            Reach::PublicOnly => false,
            Reach::Loopback => host == LOCALHOST && ip.is_loopback(),
            Reach::Address(a) => a == ip,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(pattern: &str, url: &str) -> bool {
        AllowedUrl::parse(pattern).unwrap().allows(&reqwest::Url::parse(url).unwrap())
    }

    #[test]
    fn grammar_cases() {
        let cases = [
            ("https://example.com", "https://example.com/x", true),
            ("https://example.com", "http://example.com/x", false),
            ("https://example.com", "https://example.com:8443/", false),
            ("https://*.example.com", "https://api.example.com/", true),
            ("https://*.example.com", "https://example.com/", false),
            ("https://*.example.com", "https://evil-example.com/", false),
            ("http://localhost:*", "http://localhost:1234/", true),
            ("http://localhost:*", "http://127.0.0.1:1234/", false),
            ("http://127.0.0.1:8000..8010", "http://127.0.0.1:8009/", true),
            ("http://127.0.0.1:8000..8010", "http://127.0.0.1:8010/", false),
            ("*://*:*", "https://anything.org:1/", true),
            ("https://EXAMPLE.com", "https://example.COM/", true),
        ];
        for (p, u, want) in cases {
            assert_eq!(allowed(p, u), want, "{p} vs {u}");
        }
    }

    #[test]
    fn bad_patterns_say_why() {
        for (p, why) in [
            ("example.com", "scheme is required"),
            ("ftp://x", "scheme must be"),
            ("https://x/path", "no path"),
            ("https://a*.x", "wildcard"),
            ("http://x:99999", "port must be"),
            ("*://x", "port is required"),
        ] {
            let e = AllowedUrl::parse(p).unwrap_err().to_string();
            assert!(e.contains(why), "{p}: {e}");
        }
    }

    fn ip(s: &str) -> std::net::IpAddr {
        s.parse().unwrap()
    }

    fn url(s: &str) -> reqwest::Url {
        reqwest::Url::parse(s).unwrap()
    }

    #[test]
    fn internal_addresses_need_an_entry_naming_them() {
        let any = AllowList::parse(&["*://*:*".into(), "https://*.example.com".into()]).unwrap();
        for internal in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
        ] {
            assert!(!is_public(ip(internal)), "{internal}");
            let reach = any.reach(&url("https://anything.example.com/"));
            assert!(!reach.allows("anything.example.com", ip(internal)), "{internal}");
        }
        for public in ["93.184.216.34", "1.1.1.1", "2606:4700::1111"] {
            assert!(any.reach(&url("https://x.example.com/")).allows("x.example.com", ip(public)), "{public}");
        }
        let named = AllowList::parse(&[
            "http://127.0.0.1:*".into(),
            "http://localhost:8080".into(),
            "http://169.254.169.254".into(),
        ])
        .unwrap();
        assert_eq!(named.reach(&url("http://127.0.0.1:9/")), Reach::Address(ip("127.0.0.1")));
        assert!(named.reach(&url("http://127.0.0.1:9/")).allows("127.0.0.1", ip("127.0.0.1")));
        let local = named.reach(&url("http://localhost:8080/"));
        assert_eq!(local, Reach::Loopback);
        assert!(local.allows("localhost", ip("127.0.0.1")));
        assert!(local.allows("localhost", ip("::1")));
        assert!(!local.allows("evil.example", ip("::1")), "a name resolving to loopback is not `localhost`");
        assert!(!local.allows("localhost", ip("10.0.0.1")));
        assert_eq!(named.reach(&url("http://169.254.169.254/")), Reach::Address(ip("169.254.169.254")));
        assert_eq!(named.reach(&url("http://localhost:8081/")), Reach::PublicOnly, "another port");
    }

    #[test]
    fn regression_an_internal_entry_opened_internal_addresses_for_every_entry() {
        // `localhost:8080` and `api.example.com`: neither another port of localhost (through
        // a wildcard entry) nor api.example.com resolving to loopback reaches 127.0.0.1.
        let list = AllowList::parse(&[
            "http://localhost:8080".into(),
            "http://127.0.0.1:8080".into(),
            "https://api.example.com".into(),
            "*://*:*".into(),
        ])
        .unwrap();
        for (u, host) in [
            ("https://api.example.com/", "api.example.com"),
            ("http://localhost:22/", "localhost"),
            ("http://127.0.0.1:22/", "127.0.0.1"),
            ("http://evil.example:8080/", "evil.example"),
        ] {
            let reach = list.reach(&url(u));
            assert!(!reach.allows(host, ip("127.0.0.1")), "{u}: {reach:?}");
            assert!(!reach.allows(host, ip("::1")), "{u}: {reach:?}");
        }
        assert!(list.reach(&url("http://localhost:8080/x")).allows("localhost", ip("127.0.0.1")));
        assert!(list.reach(&url("http://127.0.0.1:8080/x")).allows("127.0.0.1", ip("127.0.0.1")));
    }

    /// Hosts and ports the property test draws from: internal names and literals, public
    /// names, a wildcard's reach.
    const HOSTS: [&str; 7] =
        ["localhost", "127.0.0.1", "10.0.0.7", "169.254.169.254", "api.example.com", "a.b.example.com", "example.org"];
    const PORTS: [u16; 5] = [80, 443, 8080, 22, 9000];
    const INTERNAL: [&str; 5] = ["127.0.0.1", "::1", "10.0.0.7", "169.254.169.254", "192.168.0.1"];

    fn pattern() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let host = prop_oneof![
            proptest::sample::select(HOSTS.to_vec()).prop_map(str::to_owned),
            Just("*".to_owned()),
            Just("*.example.com".to_owned()),
        ];
        let port = prop_oneof![
            proptest::sample::select(PORTS.to_vec()).prop_map(|p| format!(":{p}")),
            Just(":*".to_owned()),
            Just(String::new()),
        ];
        (proptest::sample::select(vec!["http", "https", "*"]), host, port).prop_map(|(scheme, host, port)| {
            let port = if scheme == "*" && port.is_empty() { ":*".to_owned() } else { port };
            format!("{scheme}://{host}{port}")
        })
    }

    proptest::proptest! {
        /// Whatever else the list holds, an internal address is reached only through an
        /// entry that allows the URL itself and names its host exactly.
        #[test]
        fn internal_addresses_are_reached_only_through_the_entry_that_names_them(
            patterns in proptest::collection::vec(pattern(), 1..5),
            scheme in proptest::sample::select(vec!["http", "https"]),
            host in proptest::sample::select(HOSTS.to_vec()),
            port in proptest::sample::select(PORTS.to_vec()),
            internal in proptest::sample::select(INTERNAL.to_vec()),
        ) {
            let list = AllowList::parse(&patterns).unwrap();
            let u = url(&format!("{scheme}://{host}:{port}/"));
            let ip = ip(internal);
            let naming = list.entries.iter().any(|e| e.allows(&u) && e.exact_host() == Some(host));
            let expected = naming
                && match host.parse::<std::net::IpAddr>() {
                    Ok(literal) => literal == ip,
                    Err(_) => host == LOCALHOST && ip.is_loopback(),
                };
            proptest::prop_assert_eq!(list.reach(&u).allows(host, ip), expected, "{:?} {} {}", patterns, u, ip);
        }
    }

    #[test]
    fn empty_list_denies() {
        let l = AllowList::parse(&[]).unwrap();
        assert!(!l.allows(&reqwest::Url::parse("http://127.0.0.1/").unwrap()));
    }
}
