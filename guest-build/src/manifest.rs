//! Reading the few things a build needs from a guest crate's `Cargo.toml`.
//!
//! Deliberately a tiny subset of TOML (`key = "string"` lines inside `[section]` headers),
//! so building needs no TOML parser; cargo itself reports anything else wrong with the file:
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

use crate::{Error, Result};

/// What the build needs to know about one guest crate.
#[derive(Debug)]
pub struct GuestManifest {
    /// `[package] name`.
    pub package_name: String,
    /// Extra builds: output name and the cargo features to enable.
    pub variants: Vec<(String, Vec<String>)>,
}

impl GuestManifest {
    pub fn read(path: &Path) -> Result<Self> {
        let text = fs::read_to_string(path).map_err(Error::io("reading", path))?;
        Self::parse(path, &text)
    }

    fn parse(path: &Path, text: &str) -> Result<Self> {
        let lookup = |section: &str, key: &str| {
            string_entries(text, section).into_iter().find(|(k, _)| k == key).map(|(_, v)| v)
        };
        let package_name = lookup("package", "name").ok_or_else(|| Error::Manifest {
            path: path.to_path_buf(),
            reason: "no `name = \"...\"` in [package]: is this a Rust crate?".into(),
        })?;
        let variants = string_entries(text, "package.metadata.warden.variants")
            .into_iter()
            .map(|(name, features)| {
                let features = features.split(',').map(str::trim).filter(|f| !f.is_empty()).map(String::from).collect();
                (name, features)
            })
            .collect();
        Ok(Self { package_name, variants })
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
        let Some(value) = value.trim().strip_prefix('"').and_then(|v| v.split_once('"')) else {
            continue;
        };
        entries.push((key.to_string(), value.0.to_string()));
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

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
            [("name".into(), "echo-x".into()), ("version".into(), "0.1.0".into())]
        );
        assert_eq!(string_entries(text, "package.metadata.warden.variants"), [("echo-v2".into(), "v2, extra".into())]);
        assert!(string_entries(text, "lib").is_empty());
    }

    #[test]
    fn reads_names_and_variants_and_refuses_a_file_without_a_package() {
        let m = GuestManifest::parse(Path::new("C.toml"), "[package]\nname = \"my-proto\"\n").unwrap();
        assert_eq!(m.package_name, "my-proto");
        assert!(m.variants.is_empty());
        let text = "[lib]\nname = \"echo-lib\"\n[package]\nname = \"echo\"\n[package.metadata.warden.variants]\necho-v2 = \"v2\"\n";
        let m = GuestManifest::parse(Path::new("C.toml"), text).unwrap();
        assert_eq!(m.package_name, "echo");
        assert_eq!(m.variants, [("echo-v2".to_string(), vec!["v2".to_string()])]);
        let err = GuestManifest::parse(Path::new("dir/Cargo.toml"), "this is { not toml").unwrap_err();
        assert!(err.to_string().starts_with("dir/Cargo.toml: no `name"), "{err}");
        let err = GuestManifest::read(Path::new("no/such/Cargo.toml")).unwrap_err();
        assert!(err.to_string().contains("no/such/Cargo.toml"), "{err}");
    }
}
