//! The one error type of a plugin: [`Error`] mirrors the WIT `error` variant case for
//! case. It is plain Rust, so pure code and its native tests never need the generated
//! bindings; and it *is* the bindings' error type (they are generated with it in place of
//! their own, see [`crate::bindings`]), so a host import's error is already an [`Error`]
//! and an export returns one as is — no conversion either way.

/// Why a call failed; each case is the WIT `error` case of the same name. Expected
/// failures are values of this type; a panic (trap) is for real faults only.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The thing asked for does not exist (agent, file, task, key).
    #[error("not-found: {0}")]
    NotFound(String),
    /// The input is malformed or missing a field; the text names it.
    #[error("invalid-input: {0}")]
    InvalidInput(String),
    /// A capability or policy refused the call; the text names the capability.
    #[error("denied: {0}")]
    Denied(String),
    /// The deadline passed.
    #[error("timeout: {0}")]
    Timeout(String),
    /// A remote peer (model provider, A2A/MCP server, HTTP endpoint) failed.
    #[error("remote: {0}")]
    Remote(String),
    /// The capability exists but is not available in this host build or config.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The remote agent needs more input; the text is its question.
    #[error("input-required: {0}")]
    InputRequired(String),
    /// Anything else.
    #[error("internal: {0}")]
    Internal(String),
    /// The task was canceled while the plugin waited on the host (`clock::sleep`, an HTTP
    /// request or stream, a model or tool call). The plugin has a short grace period
    /// ([`crate::clock::remaining_ms`]) to clean up and return.
    #[error("canceled: {0}")]
    Canceled(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The message, whatever the case.
    pub fn message(&self) -> &str {
        match self {
            Self::NotFound(m)
            | Self::InvalidInput(m)
            | Self::Denied(m)
            | Self::Timeout(m)
            | Self::Remote(m)
            | Self::Unavailable(m)
            | Self::InputRequired(m)
            | Self::Internal(m)
            | Self::Canceled(m) => m,
        }
    }

    /// The case's name as in WIT (`not-found`, `invalid-input`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "not-found",
            Self::InvalidInput(_) => "invalid-input",
            Self::Denied(_) => "denied",
            Self::Timeout(_) => "timeout",
            Self::Remote(_) => "remote",
            Self::Unavailable(_) => "unavailable",
            Self::InputRequired(_) => "input-required",
            Self::Internal(_) => "internal",
            Self::Canceled(_) => "canceled",
        }
    }

    /// The same case with its message changed by `f`.
    pub fn map_message(self, f: impl FnOnce(String) -> String) -> Self {
        match self {
            Self::NotFound(m) => Self::NotFound(f(m)),
            Self::InvalidInput(m) => Self::InvalidInput(f(m)),
            Self::Denied(m) => Self::Denied(f(m)),
            Self::Timeout(m) => Self::Timeout(f(m)),
            Self::Remote(m) => Self::Remote(f(m)),
            Self::Unavailable(m) => Self::Unavailable(f(m)),
            Self::InputRequired(m) => Self::InputRequired(f(m)),
            Self::Internal(m) => Self::Internal(f(m)),
            Self::Canceled(m) => Self::Canceled(f(m)),
        }
    }

    /// The same case with `context: ` put before the message (unless the message already
    /// mentions it, so a path or URL is not repeated).
    pub fn context(self, context: &str) -> Self {
        self.map_message(|m| if m.contains(context) { m } else { format!("{context}: {m}") })
    }
}

/// JSON that does not parse or does not have the expected shape is bad input; an I/O
/// failure underneath serde_json is internal.
impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        match e.classify() {
            serde_json::error::Category::Io => Self::Internal(format!("JSON I/O: {e}")),
            _ => Self::InvalidInput(format!("invalid JSON: {e}")),
        }
    }
}

impl From<std::str::Utf8Error> for Error {
    fn from(e: std::str::Utf8Error) -> Self {
        Self::InvalidInput(format!("not UTF-8 text: {e}"))
    }
}

impl From<std::string::FromUtf8Error> for Error {
    fn from(e: std::string::FromUtf8Error) -> Self {
        Self::InvalidInput(format!("not UTF-8 text: {}", e.utf8_error()))
    }
}

#[cfg(test)]
mod tests {
    use super::Error;

    #[test]
    fn kind_and_message_follow_the_wit_case() {
        let e = Error::InputRequired("which branch?".into());
        assert_eq!((e.kind(), e.message()), ("input-required", "which branch?"));
        assert_eq!(e.to_string(), "input-required: which branch?");
        assert_eq!(Error::NotFound("x".into()).kind(), "not-found");
    }

    #[test]
    fn context_is_added_once_and_keeps_the_case() {
        let e = Error::Denied("capability `http` denied".into()).context("fetching the card");
        assert_eq!(e, Error::Denied("fetching the card: capability `http` denied".into()));
        let e = Error::NotFound("agents/a.md: no such file".into()).context("agents/a.md");
        assert_eq!(e.message(), "agents/a.md: no such file");
    }

    #[test]
    fn serde_json_failures_are_invalid_input() {
        let e: Error = serde_json::from_str::<serde_json::Value>("{nope").unwrap_err().into();
        assert!(matches!(&e, Error::InvalidInput(m) if m.starts_with("invalid JSON")), "{e}");
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code, reason = "only the shape is checked")]
        struct Shape {
            id: u32,
        }
        let e: Error = serde_json::from_str::<Shape>(r#"{"id": "one"}"#).unwrap_err().into();
        assert!(matches!(&e, Error::InvalidInput(m) if m.contains("expected u32")), "{e}");
    }

    #[test]
    fn io_failures_under_serde_json_are_internal() {
        struct Broken;
        impl std::io::Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::Error::other("disk gone"))
            }
        }
        let e: Error = serde_json::from_reader::<_, serde_json::Value>(Broken).unwrap_err().into();
        assert!(matches!(&e, Error::Internal(m) if m.contains("disk gone")), "{e}");
    }

    #[test]
    fn utf8_failures_are_invalid_input() {
        let e: Error = String::from_utf8(vec![0xff, 0xfe]).unwrap_err().into();
        assert!(matches!(&e, Error::InvalidInput(m) if m.contains("UTF-8")), "{e}");
        let truncated = "aé".as_bytes()[..2].to_vec();
        let e: Error = std::str::from_utf8(&truncated).unwrap_err().into();
        assert_eq!(e.kind(), "invalid-input");
    }
}
