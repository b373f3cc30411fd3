//! A reference's `metadata` (the operator's free-form key/value pairs) with typed getters
//! whose errors name the key, so a bad configuration reads as `metadata `timeout` "soon":
//! expected …` rather than a bare parse error.
//!
//! Conventions (docs/plugin-authors.md): values are strings (YAML numbers and booleans
//! arrive as their text); a blank value counts as absent; `name` and `description` are the
//! host's, everything else is the plugin's contract.

use std::fmt::Display;
use std::str::FromStr;

use crate::error::{Error, Result};

/// Borrowed view of `subagent-reference.metadata`.
#[derive(Debug, Clone, Copy)]
pub struct Metadata<'a> {
    pairs: &'a [(String, String)],
}

impl<'a> Metadata<'a> {
    pub fn new(pairs: &'a [(String, String)]) -> Self {
        Self { pairs }
    }

    /// The value of `key` as written, `None` when absent or blank (for templates whose
    /// surrounding whitespace matters).
    pub fn raw(&self, key: &str) -> Option<&'a str> {
        self.pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str()).filter(|v| !v.trim().is_empty())
    }

    /// The value of `key`, trimmed; `None` when absent or blank.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.raw(key).map(str::trim)
    }

    /// The value of `key`, trimmed, or an `invalid-input` error naming the key.
    pub fn require(&self, key: &str) -> Result<&'a str> {
        self.get(key).ok_or_else(|| Error::InvalidInput(format!("metadata `{key}` is required")))
    }

    /// The value of `key` parsed as `T` (`None` when absent); a value that does not parse
    /// is an `invalid-input` error naming the key, the value and the reason.
    pub fn parse<T>(&self, key: &str) -> Result<Option<T>>
    where
        T: FromStr,
        T::Err: Display,
    {
        self.get(key).map(|v| v.parse::<T>().map_err(|e| invalid(key, v, &e.to_string()))).transpose()
    }

    /// A boolean: `true`/`false`, `yes`/`no`, `on`/`off`, `1`/`0` (any case).
    pub fn flag(&self, key: &str) -> Result<Option<bool>> {
        self.get(key)
            .map(|v| match v.to_ascii_lowercase().as_str() {
                "true" | "yes" | "on" | "1" => Ok(true),
                "false" | "no" | "off" | "0" => Ok(false),
                _ => Err(invalid(key, v, "expected true or false")),
            })
            .transpose()
    }

    /// A duration in milliseconds: `250ms`, `30s`, `2m`, `1h` or a bare number of seconds.
    pub fn duration_ms(&self, key: &str) -> Result<Option<u32>> {
        self.get(key).map(|v| parse_duration_ms(key, v)).transpose()
    }
}

/// Metadata as the WIT carries it, from literals: `pairs(&[("url", "http://x")])` (for
/// tests of code that reads references).
pub fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn invalid(key: &str, value: &str, why: &str) -> Error {
    Error::InvalidInput(format!("metadata `{key}` {value:?}: {why}"))
}

/// `text` (the value of metadata `key`) as milliseconds; see [`Metadata::duration_ms`].
/// At least 1 ms, at most `u32::MAX` (the WIT `timeout-ms` type).
pub fn parse_duration_ms(key: &str, text: &str) -> Result<u32> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| invalid(key, t, "expected e.g. 30s, 1500ms, 2m"))?;
    let factor = match unit.trim() {
        "ms" => 1.0,
        "" | "s" | "sec" | "secs" => 1000.0,
        "m" | "min" | "mins" => 60_000.0,
        "h" => 3_600_000.0,
        other => return Err(invalid(key, t, &format!("unknown unit {other:?}"))),
    };
    let ms = n * factor;
    if !(1.0..=f64::from(u32::MAX)).contains(&ms) {
        return Err(invalid(key, t, "out of range"));
    }
    Ok(ms as u32)
}

#[cfg(test)]
mod tests {
    use super::{Metadata, pairs, parse_duration_ms};
    use crate::Error;

    #[test]
    fn get_trims_and_treats_blank_as_absent() {
        let p = pairs(&[("url", "  http://x  "), ("empty", "   "), ("body", " {} \n")]);
        let m = Metadata::new(&p);
        assert_eq!(m.get("url"), Some("http://x"));
        assert_eq!(m.get("empty"), None);
        assert_eq!(m.get("missing"), None);
        assert_eq!(m.raw("body"), Some(" {} \n"));
        assert_eq!(m.raw("empty"), None);
    }

    #[test]
    fn require_names_the_missing_key() {
        let p = pairs(&[("url", "")]);
        let e = Metadata::new(&p).require("url").unwrap_err();
        assert_eq!(e, Error::InvalidInput("metadata `url` is required".into()));
    }

    #[test]
    fn parse_gives_typed_values_and_errors_naming_key_and_value() {
        let p = pairs(&[("retries", "3"), ("port", "eighty")]);
        let m = Metadata::new(&p);
        assert_eq!(m.parse::<u32>("retries"), Ok(Some(3)));
        assert_eq!(m.parse::<u32>("absent"), Ok(None));
        let e = m.parse::<u16>("port").unwrap_err();
        assert_eq!(e.kind(), "invalid-input");
        assert!(e.message().starts_with("metadata `port` \"eighty\": invalid digit"), "{e}");
    }

    #[test]
    fn flags_accept_the_usual_spellings_only() {
        let p = pairs(&[("a", "TRUE"), ("b", "off"), ("c", "1"), ("d", "maybe")]);
        let m = Metadata::new(&p);
        assert_eq!((m.flag("a"), m.flag("b"), m.flag("c")), (Ok(Some(true)), Ok(Some(false)), Ok(Some(true))));
        assert_eq!(m.flag("none"), Ok(None));
        assert!(m.flag("d").unwrap_err().message().contains("metadata `d` \"maybe\""));
    }

    #[test]
    fn durations_take_units_and_name_the_key_when_wrong() {
        assert_eq!(parse_duration_ms("timeout", "1500ms"), Ok(1500));
        assert_eq!(parse_duration_ms("timeout", "2"), Ok(2000));
        assert_eq!(parse_duration_ms("timeout", "0.5s"), Ok(500));
        assert_eq!(parse_duration_ms("timeout", "2m"), Ok(120_000));
        assert_eq!(parse_duration_ms("timeout", "1h"), Ok(3_600_000));
        for bad in ["soon", "5 fortnights", "0", "9999999h"] {
            let e = parse_duration_ms("timeout", bad).unwrap_err();
            assert!(e.message().starts_with("metadata `timeout`"), "{bad}: {e}");
        }
        let p = pairs(&[("poll", "250ms")]);
        assert_eq!(Metadata::new(&p).duration_ms("poll"), Ok(Some(250)));
        assert_eq!(Metadata::new(&p).duration_ms("timeout"), Ok(None));
    }
}
