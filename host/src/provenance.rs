//! Where a plugin file came from: Ed25519 signatures beside plugin files
//! (`x.wasm.sig`), the operator's trusted keys (`plugins.trust`), and SHA-256 pins
//! (`plugins.pins`).
//!
//! This module owns the key, signature and pin formats and the one check every plugin
//! load goes through ([`check`]) before a single byte is compiled. It must never accept
//! a signature it could not verify against a trusted key, and never read more than
//! [`MAX_SIG_FILE`] of a signature file.
//!
//! Formats (hex, so they paste into YAML and shells):
//! - public key: 64 hex digits (32 bytes) — what `plugins.trust` lists;
//! - private key file: `ed25519-private <64 hex digits of the seed>` (mode 0600);
//! - signature file `x.wasm.sig`: `ed25519 <public key hex> <signature hex>`, a signature
//!   over the exact bytes of `x.wasm`.

use std::path::{Path, PathBuf};

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use sha2::{Digest, Sha256};

/// Largest signature file read: one line of a few hundred bytes.
pub const MAX_SIG_FILE: u64 = 4096;
/// The suffix appended to a plugin file's name for its signature.
pub const SIG_SUFFIX: &str = ".sig";
const SIG_TAG: &str = "ed25519";
const PRIVATE_TAG: &str = "ed25519-private";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProvenanceError {
    #[error("pinned to sha256 {pinned} but the file is {actual} (plugins.pins.{id})")]
    PinMismatch { id: String, pinned: String, actual: String },
    #[error("unsigned: no {sig} and plugins.require_signature is true")]
    Unsigned { sig: String },
    #[error("{sig}: not a signature file (expected `ed25519 <public key hex> <signature hex>`)")]
    Malformed { sig: String },
    #[error("{sig}: signed by key {key}, which is not in plugins.trust")]
    UntrustedKey { sig: String, key: String },
    #[error("{sig}: the signature does not match the file (the file or its signature was altered)")]
    BadSignature { sig: String },
    #[error("{0}")]
    Io(String),
}

/// The operator's provenance rules for one plugin id.
pub struct Rules<'a> {
    pub id: &'a str,
    /// Trusted public keys (hex).
    pub trust: &'a [String],
    pub require_signature: bool,
    /// The pinned SHA-256 (hex) of this id, if any.
    pub pin: Option<&'a str>,
}

/// The signature file of a plugin file.
pub fn sig_path(plugin: &Path) -> PathBuf {
    let mut name = plugin.as_os_str().to_owned();
    name.push(SIG_SUFFIX);
    PathBuf::from(name)
}

/// Checks `bytes` (read from `path`) against the rules: the pin, then the signature
/// (required, or present). Returns the verifying key's hex when signed by a trusted key.
pub fn check(path: &Path, bytes: &[u8], rules: &Rules<'_>) -> Result<Option<String>, ProvenanceError> {
    let text = read_sig_file(path)?;
    check_bytes(bytes, text.as_deref(), &sig_path(path).display().to_string(), rules)
}

/// The one check of a plugin's bytes and its signature text (`None`: unsigned), wherever
/// they came from: a file and its `.sig` ([`check`]) or a registry artifact and its
/// signature annotation (`warden plugin pull`). `shown` names where the signature was
/// looked for, in errors.
pub fn check_bytes(
    bytes: &[u8],
    sig: Option<&str>,
    shown: &str,
    rules: &Rules<'_>,
) -> Result<Option<String>, ProvenanceError> {
    // The pin first: content that is not the pinned one fails on that, whatever its signature.
    if let Some(pinned) = rules.pin {
        let actual = hex::encode(Sha256::digest(bytes));
        if !actual.eq_ignore_ascii_case(pinned) {
            return Err(ProvenanceError::PinMismatch { id: rules.id.into(), pinned: pinned.into(), actual });
        }
    }
    let Some(text) = sig else {
        return match rules.require_signature {
            true => Err(ProvenanceError::Unsigned { sig: shown.into() }),
            false => Ok(None),
        };
    };
    let (key, signature) = parse_sig(text).ok_or_else(|| ProvenanceError::Malformed { sig: shown.into() })?;
    let key_hex = hex::encode(key.as_bytes());
    if !rules.trust.iter().any(|t| t.trim().eq_ignore_ascii_case(&key_hex)) {
        return Err(ProvenanceError::UntrustedKey { sig: shown.into(), key: key_hex });
    }
    key.verify(bytes, &signature).map_err(|_| ProvenanceError::BadSignature { sig: shown.into() })?;
    Ok(Some(key_hex))
}

/// The key (hex) whose signature `sig` is over exactly `bytes`, trusted or not: what a
/// publisher checks before sending a file and its signature (`warden plugin push`).
pub fn signer(bytes: &[u8], sig: &str, shown: &str) -> Result<String, ProvenanceError> {
    let (key, signature) = parse_sig(sig).ok_or_else(|| ProvenanceError::Malformed { sig: shown.into() })?;
    key.verify(bytes, &signature).map_err(|_| ProvenanceError::BadSignature { sig: shown.into() })?;
    Ok(hex::encode(key.as_bytes()))
}

/// The signature file beside `plugin`, if there is one (bounded to [`MAX_SIG_FILE`]).
pub fn read_sig_file(plugin: &Path) -> Result<Option<String>, ProvenanceError> {
    let sig = sig_path(plugin);
    match read_bounded(&sig) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ProvenanceError::Io(format!("{}: {e}", sig.display()))),
    }
}

/// The signature file's text, read through [`crate::bounded_read`] (a FIFO or an
/// oversized file is refused without blocking or reading it whole).
fn read_bounded(path: &Path) -> std::io::Result<String> {
    use crate::bounded_read::{ReadError, read_regular};
    let bytes = read_regular(path, MAX_SIG_FILE).map_err(|e| match e {
        ReadError::Io(e) => e,
        ReadError::NotRegular => std::io::Error::other("not a regular file"),
        ReadError::TooLarge { size, .. } => std::io::Error::other(format!("{size} bytes, more than {MAX_SIG_FILE}")),
    })?;
    String::from_utf8(bytes).map_err(|_| std::io::Error::other("not UTF-8 text"))
}

fn parse_sig(text: &str) -> Option<(VerifyingKey, Signature)> {
    let mut parts = text.split_whitespace();
    if parts.next()? != SIG_TAG {
        return None;
    }
    let key: [u8; 32] = hex::decode(parts.next()?).ok()?.try_into().ok()?;
    let sig: [u8; 64] = hex::decode(parts.next()?).ok()?.try_into().ok()?;
    if parts.next().is_some() {
        return None;
    }
    Some((VerifyingKey::from_bytes(&key).ok()?, Signature::from_bytes(&sig)))
}

/// A new key pair: (private key file text, public key hex). The seed comes from the
/// operating system's random source.
pub fn generate() -> Result<(String, String), ProvenanceError> {
    let mut seed = [0u8; 32];
    getrandom::getrandom(&mut seed).map_err(|e| ProvenanceError::Io(format!("no random source: {e}")))?;
    let key = SigningKey::from_bytes(&seed);
    Ok((format!("{PRIVATE_TAG} {}\n", hex::encode(seed)), hex::encode(key.verifying_key().as_bytes())))
}

/// The signature file text for `bytes` under the private key file text `private`.
pub fn sign(private: &str, bytes: &[u8]) -> Result<String, String> {
    let mut parts = private.split_whitespace();
    let seed: [u8; 32] = match (parts.next(), parts.next().map(hex::decode), parts.next()) {
        (Some(PRIVATE_TAG), Some(Ok(seed)), None) => {
            seed.try_into().map_err(|_| "the seed is not 32 bytes".to_owned())?
        }
        _ => return Err(format!("not a private key file (expected `{PRIVATE_TAG} <64 hex digits>`)")),
    };
    let key = SigningKey::from_bytes(&seed);
    let signature = key.sign(bytes);
    Ok(format!("{SIG_TAG} {} {}\n", hex::encode(key.verifying_key().as_bytes()), hex::encode(signature.to_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signed(dir: &Path, bytes: &[u8]) -> (PathBuf, String) {
        let (private, public) = generate().unwrap();
        let path = dir.join("p.wasm");
        std::fs::write(&path, bytes).unwrap();
        std::fs::write(sig_path(&path), sign(&private, bytes).unwrap()).unwrap();
        (path, public)
    }

    fn rules<'a>(trust: &'a [String], require: bool, pin: Option<&'a str>) -> Rules<'a> {
        Rules { id: "p", trust, require_signature: require, pin }
    }

    #[test]
    fn a_signature_by_a_trusted_key_verifies_and_every_alteration_fails() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = b"\0asm component bytes".to_vec();
        let (path, public) = signed(dir.path(), &bytes);
        let trust = vec![public.clone()];
        assert_eq!(check(&path, &bytes, &rules(&trust, true, None)), Ok(Some(public.clone())));
        // Every single-byte change of the file is caught.
        for i in 0..bytes.len() {
            let mut altered = bytes.clone();
            altered[i] ^= 0x01;
            assert!(matches!(
                check(&path, &altered, &rules(&trust, true, None)),
                Err(ProvenanceError::BadSignature { .. })
            ));
        }
        // So is every change of the signature's hex (a digit flipped).
        let sig = std::fs::read_to_string(sig_path(&path)).unwrap();
        let at = sig.rfind(' ').unwrap() + 1;
        for i in at..sig.trim_end().len() {
            let mut s = sig.clone().into_bytes();
            s[i] = if s[i] == b'0' { b'1' } else { b'0' };
            std::fs::write(sig_path(&path), &s).unwrap();
            assert!(check(&path, &bytes, &rules(&trust, true, None)).is_err(), "digit {i}");
        }
        std::fs::write(sig_path(&path), &sig).unwrap();
        // Another key's signature over the same bytes is not trusted.
        let other = vec![generate().unwrap().1];
        assert!(matches!(check(&path, &bytes, &rules(&other, true, None)), Err(ProvenanceError::UntrustedKey { .. })));
    }

    #[test]
    fn unsigned_files_load_only_when_no_signature_is_required() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.wasm");
        std::fs::write(&path, b"x").unwrap();
        assert_eq!(check(&path, b"x", &rules(&[], false, None)), Ok(None));
        assert!(matches!(check(&path, b"x", &rules(&[], true, None)), Err(ProvenanceError::Unsigned { .. })));
        std::fs::write(sig_path(&path), "ed25519 zz").unwrap();
        assert!(matches!(check(&path, b"x", &rules(&[], false, None)), Err(ProvenanceError::Malformed { .. })));
    }

    #[test]
    fn a_pin_names_the_expected_and_the_actual_hash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.wasm");
        let good = hex::encode(Sha256::digest(b"x"));
        assert_eq!(check(&path, b"x", &rules(&[], false, Some(&good))), Ok(None));
        let e = check(&path, b"y", &rules(&[], false, Some(&good))).unwrap_err().to_string();
        assert!(e.contains(&good) && e.contains("plugins.pins.p"), "{e}");
    }
}
