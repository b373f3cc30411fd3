//! Reading the few things xtask needs from a guest crate's `Cargo.toml`.
//!
//! Deliberately a tiny subset of TOML (`key = "string"` lines inside `[section]` headers),
//! so the build tool needs no TOML parser:
//!
//! ```toml
//! [package]
//! name = "echo"
//!
//! # Extra builds of this crate: `<output name> = "<comma-separated cargo features>"`.
//! [package.metadata.warden.variants]
//! echo-v2 = "v2"
//! ```

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

/// What the build needs to know about one guest crate.
pub struct GuestManifest {
    /// The library's file stem in cargo's output (`[lib] name`, else the package name, `-` → `_`).
    pub lib_name: String,
    /// Extra builds: output name and the cargo features to enable.
    pub variants: Vec<(String, Vec<String>)>,
}

impl GuestManifest {
    pub fn read(path: &Path) -> Result<Self> {
        let text =
            fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let lookup = |section: &str, key: &str| {
            string_entries(&text, section)
                .into_iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v)
        };
        let lib_name = lookup("lib", "name")
            .or_else(|| lookup("package", "name"))
            .with_context(|| format!("{}: no [package] name", path.display()))?
            .replace('-', "_");
        let variants = string_entries(&text, "package.metadata.warden.variants")
            .into_iter()
            .map(|(name, features)| {
                let features = features
                    .split(',')
                    .map(str::trim)
                    .filter(|f| !f.is_empty())
                    .map(String::from)
                    .collect();
                (name, features)
            })
            .collect();
        Ok(Self { lib_name, variants })
    }
}

/// `key = "value"` pairs directly inside `[section]`; other value types are skipped.
fn string_entries(text: &str, section: &str) -> Vec<(String, String)> {
    let mut current = String::new();
    let mut entries = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(header) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = header.trim().to_string();
            continue;
        }
        if current != section {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim().trim_matches('"');
        let Some(value) = value
            .trim()
            .strip_prefix('"')
            .and_then(|v| v.split_once('"'))
        else {
            continue;
        };
        entries.push((key.to_string(), value.0.to_string()));
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::string_entries;

    #[test]
    fn reads_string_entries_of_one_section() {
        let text = r#"
[package]
name = "echo-x" # comment
version = "0.1.0"
edition = 2024

[package.metadata.warden.variants]
echo-v2 = "v2, extra"
"#;
        assert_eq!(
            string_entries(text, "package"),
            [
                ("name".into(), "echo-x".into()),
                ("version".into(), "0.1.0".into())
            ]
        );
        assert_eq!(
            string_entries(text, "package.metadata.warden.variants"),
            [("echo-v2".into(), "v2, extra".into())]
        );
        assert!(string_entries(text, "lib").is_empty());
    }
}
