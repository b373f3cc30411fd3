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
        if let Scheme::Exact(s) = &self.scheme {
            if s != scheme {
                return false;
            }
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

    #[test]
    fn empty_list_denies() {
        let l = AllowList::parse(&[]).unwrap();
        assert!(!l.allows(&reqwest::Url::parse("http://127.0.0.1/").unwrap()));
    }
}
