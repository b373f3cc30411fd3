//! HTTP header names and the 2026-07-28 header value encoding.

pub const ACCEPT_BOTH: &str = "application/json, text/event-stream";
pub const PROTOCOL_VERSION: &str = "MCP-Protocol-Version";
pub const SESSION_ID: &str = "Mcp-Session-Id";
/// 2026-07-28: mirrors the JSON-RPC `method` of a POSTed request.
pub const METHOD: &str = "Mcp-Method";
/// 2026-07-28: mirrors `params.name` (`tools/call`, `prompts/get`) or `params.uri`
/// (`resources/read`).
pub const NAME: &str = "Mcp-Name";

/// The body field `Mcp-Name` mirrors for `method`, if it has one.
pub fn name_param(method: &str) -> Option<&'static str> {
    match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        _ => None,
    }
}

/// A header value that survives HTTP unchanged: printable ASCII without edge
/// whitespace passes verbatim, anything else becomes `=?base64?<standard base64>?=`.
pub fn encode_value(value: &str) -> String {
    let plain = value.bytes().all(|b| (0x20..=0x7e).contains(&b))
        && value.trim() == value
        && !(value.starts_with("=?base64?") && value.ends_with("?="));
    if plain { value.to_owned() } else { format!("=?base64?{}?=", base64(value.as_bytes())) }
}

/// Case-insensitive header lookup.
pub fn get<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n =
            (chunk[0] as u32) << 16 | (*chunk.get(1).unwrap_or(&0) as u32) << 8 | *chunk.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(i.as_bytes()), o);
        }
    }

    #[test]
    fn values_are_wrapped_only_when_needed() {
        assert_eq!(encode_value("get_weather"), "get_weather");
        assert_eq!(encode_value("naïve"), "=?base64?bmHDr3Zl?=");
        assert_eq!(encode_value(" x"), "=?base64?IHg=?=");
        assert_eq!(encode_value("a\nb"), "=?base64?YQpi?=");
        assert!(encode_value("=?base64?eA==?=").starts_with("=?base64?PT9"));
    }
}
