//! Where a plugin file came from: Ed25519 signatures beside plugin files
//! (`x.wasm.sig`), the operator's trusted keys (`plugins.trust`, each for every plugin id
//! or for the ids it lists), and SHA-256 pins (`plugins.pins`).
//!
//! This module owns the key, signature and pin formats and the checks every plugin goes
//! through: [`check`] / [`check_bytes`] before a single byte is compiled (a file in the
//! plugin directory, an artifact `warden plugin pull` fetched), [`check_version`] once the
//! component has said which version it is, and the one rollback rule [`check_not_older`]:
//! before `pull` replaces an installed plugin ([`check_upgrade`]) and before the registry
//! loads a file below the version it loaded for the id. It must never accept a signature
//! it could not verify against a key trusted for the plugin's id, a signature that names
//! another id or other content, and never read more than [`MAX_SIG_FILE`] of a signature
//! file.
//!
//! A signature is over a statement, not over the bytes alone: "the content with this
//! SHA-256 is version V of plugin ID" ([`Statement`]). So a signed file renamed to another
//! id does not verify as that id (it would inherit that id's grants, secrets, state and
//! priority), one publisher's key cannot stand in for another's where `plugins.trust`
//! scopes the keys to ids, and `pull` can tell an upgrade from a rollback.
//!
//! Formats (hex, so they paste into YAML and shells):
//! - public key: 64 hex digits (32 bytes) — what `plugins.trust` lists, bare (trusted for
//!   every id) or as `{ key: <hex>, ids: [id, ...] }` ([`TrustedKey`]);
//! - private key file: `ed25519-private <64 hex digits of the seed>` (mode 0600);
//! - signature file `x.wasm.sig`, one line ([`SIG_TAG`]):
//!   `warden-sig-v2 id=<id> version=<semver> sha256=<64 hex> key=<public key hex> sig=<128 hex>`,
//!   the signature being over [`Statement::message`]. The first format,
//!   `ed25519 <public key hex> <signature hex>` over the file's bytes only, is refused
//!   with how to re-sign ([`ProvenanceError::Legacy`]).

use std::path::{Path, PathBuf};

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

/// Largest signature file read: one line of a few hundred bytes.
pub const MAX_SIG_FILE: u64 = 4096;
/// The suffix appended to a plugin file's name for its signature.
pub const SIG_SUFFIX: &str = ".sig";
/// The first word of a signature file: its format.
pub const SIG_TAG: &str = "warden-sig-v2";
/// The first word of the first format's signature files (over the bytes only; refused).
const LEGACY_SIG_TAG: &str = "ed25519";
const PRIVATE_TAG: &str = "ed25519-private";
/// The first line of every signed statement: a signature made for anything else (another
/// program's use of the same key) never reads as a statement about a plugin.
const STATEMENT_DOMAIN: &str = "warden plugin signature v2";
/// Longest plugin id a signature names (and `warden plugin pull` installs as): a file
/// name, not a path.
pub const MAX_ID_LEN: usize = 128;
/// Longest version a signature names: a semantic version with pre-release and build
/// parts fits; more is not a version.
pub const MAX_VERSION_LEN: usize = 64;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProvenanceError {
    #[error("pinned to sha256 {pinned} but the file is {actual} (plugins.pins.{id})")]
    PinMismatch { id: String, pinned: String, actual: String },
    #[error("unsigned: no {sig} and plugins.require_signature is true")]
    Unsigned { sig: String },
    #[error(
        "{sig}: not a signature file (expected `{SIG_TAG} id=<id> version=<version> sha256=<hex> key=<hex> sig=<hex>`, \
         as `warden plugin sign` writes)"
    )]
    Malformed { sig: String },
    #[error(
        "{sig}: a signature in the old format, over the file's bytes only and not its plugin id and version (so \
         it could be moved to another plugin or an older build); it is no longer accepted. Re-sign the file with \
         `warden plugin sign FILE --key KEY` and, where it is published, `warden plugin push` it again"
    )]
    Legacy { sig: String },
    #[error("{sig}: signed by key {key}, which is not in plugins.trust")]
    UntrustedKey { sig: String, key: String },
    #[error("{sig}: signed by key {key}, which plugins.trust allows only for plugin ids {ids}, not for {id}")]
    KeyNotForId { sig: String, key: String, id: String, ids: String },
    #[error("{sig}: the signature does not match the file (the file or its signature was altered)")]
    BadSignature { sig: String },
    #[error(
        "{sig}: the signature does not match the file: it signs sha256 {signed}, the file is {actual} (the file or \
         its signature was altered)"
    )]
    OtherContent { sig: String, signed: String, actual: String },
    #[error(
        "{sig}: signed for plugin id {signed}, not {id}: a signature holds only for the id it names (install it as \
         {signed}, e.g. `warden plugin pull --as {signed}`, or have it signed for {id}: `warden plugin sign FILE \
         --key KEY --id {id}`)"
    )]
    WrongId { sig: String, signed: String, id: String },
    #[error("{sig}: signed as version {signed}, but the component reports version {reported:?}")]
    WrongVersion { sig: String, signed: String, reported: String },
    #[error(
        "{id}: version {new} is older than the {} version {installed} (a rollback); {}",
        .how.floor(), .how.remedy(.id)
    )]
    Downgrade { id: String, installed: String, new: String, how: RollbackOverride },
    #[error(
        "{id}: the {} plugin is signed (version {installed}) and this one is not; {}",
        .how.floor(), .how.remedy(.id)
    )]
    UnsignedReplacement { id: String, installed: String, how: RollbackOverride },
    #[error("{0}")]
    Io(String),
}

/// How an operator lets a rollback through where [`check_not_older`] refuses one, and so
/// what its refusal says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RollbackOverride {
    /// `warden plugin pull --allow-downgrade`, against the installed file's signature.
    AllowDowngradeFlag,
    /// `plugins.pins.<id>` naming the file's SHA-256, against the version loaded for the
    /// id (a file dropped into `plugins.dir`).
    Pin,
}

impl RollbackOverride {
    /// What the version a replacement is compared with is.
    fn floor(self) -> &'static str {
        match self {
            RollbackOverride::AllowDowngradeFlag => "installed",
            RollbackOverride::Pin => "loaded",
        }
    }

    /// How to let it through anyway.
    fn remedy(self, id: &str) -> String {
        match self {
            RollbackOverride::AllowDowngradeFlag => "pass --allow-downgrade to install it anyway".into(),
            RollbackOverride::Pin => {
                format!("to load it anyway, pin its sha256 in plugins.pins.{id} (the operator's explicit choice)")
            }
        }
    }
}

/// One entry of `plugins.trust`: a public key (64 hex digits) trusted for every plugin id
/// (a bare string, the original shape), or for the listed ids only
/// (`{ key: <hex>, ids: [github] }`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(untagged)]
pub enum TrustedKey {
    /// Trusted for every plugin id.
    Any(String),
    /// Trusted for these plugin ids (file stems) only.
    Scoped { key: String, ids: Vec<String> },
}

impl TrustedKey {
    /// The public key (hex, as configured).
    pub fn key(&self) -> &str {
        match self {
            TrustedKey::Any(key) | TrustedKey::Scoped { key, .. } => key,
        }
    }

    /// The ids it is trusted for; `None`: every id.
    pub fn ids(&self) -> Option<&[String]> {
        match self {
            TrustedKey::Any(_) => None,
            TrustedKey::Scoped { ids, .. } => Some(ids),
        }
    }

    fn is(&self, key_hex: &str) -> bool {
        self.key().trim().eq_ignore_ascii_case(key_hex)
    }
}

impl<'de> serde::Deserialize<'de> for TrustedKey {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Scoped {
            key: String,
            ids: Vec<String>,
        }
        struct Entry;
        impl<'de> serde::de::Visitor<'de> for Entry {
            type Value = TrustedKey;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an Ed25519 public key (64 hex digits), or { key: <64 hex digits>, ids: [plugin ids] }")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<TrustedKey, E> {
                Ok(TrustedKey::Any(v.to_owned()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<TrustedKey, A::Error> {
                let s = <Scoped as serde::Deserialize>::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(TrustedKey::Scoped { key: s.key, ids: s.ids })
            }
        }
        deserializer.deserialize_any(Entry)
    }
}

/// The operator's provenance rules for one plugin id.
pub struct Rules<'a> {
    pub id: &'a str,
    /// `plugins.trust` (and any keys added for one command).
    pub trust: &'a [TrustedKey],
    pub require_signature: bool,
    /// The pinned SHA-256 (hex) of this id, if any.
    pub pin: Option<&'a str>,
}

/// What a signature states: the content with SHA-256 `sha256` is version `version` of the
/// plugin `id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    pub id: String,
    /// A semantic version, as written.
    pub version: String,
    /// Lower-case hex.
    pub sha256: String,
}

impl Statement {
    /// The bytes the Ed25519 signature is over: one field a line, each field's text
    /// restricted so no field can contain a line break ([`valid_id`], [`valid_version`],
    /// hex), behind a domain line.
    pub fn message(&self) -> Vec<u8> {
        format!("{STATEMENT_DOMAIN}\nid={}\nversion={}\nsha256={}\n", self.id, self.version, self.sha256).into_bytes()
    }
}

/// A signature that verified: the key (hex) and what it states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    pub key: String,
    pub statement: Statement,
}

/// A plugin id a signature may name: a plain file name of letters, digits, `.`, `_`, `-`,
/// not hidden, at most [`MAX_ID_LEN`].
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && !id.starts_with('.')
        && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// A version a signature may name: a semantic version (`1.2.0`, `2.0.0-rc.1`), so that
/// versions can be ordered, of at most [`MAX_VERSION_LEN`].
pub fn valid_version(version: &str) -> bool {
    version.len() <= MAX_VERSION_LEN && semver::Version::parse(version).is_ok()
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The signature file of a plugin file.
pub fn sig_path(plugin: &Path) -> PathBuf {
    let mut name = plugin.as_os_str().to_owned();
    name.push(SIG_SUFFIX);
    PathBuf::from(name)
}

/// Checks `bytes` (read from `path`) against the rules: the pin, then the signature
/// (required, or present). Returns what a signature by a trusted key stated.
pub fn check(path: &Path, bytes: &[u8], rules: &Rules<'_>) -> Result<Option<Signed>, ProvenanceError> {
    let text = read_sig_file(path)?;
    check_bytes(bytes, text.as_deref(), &sig_path(path).display().to_string(), rules)
}

/// The one check of a plugin's bytes and its signature text (`None`: unsigned), wherever
/// they came from: a file and its `.sig` ([`check`]) or a registry artifact and its
/// signature annotation (`warden plugin pull`). A signature must be by a key `rules.trust`
/// trusts for `rules.id`, verify, and state this content and this id. `shown` names where
/// the signature was looked for, in errors.
pub fn check_bytes(
    bytes: &[u8],
    sig: Option<&str>,
    shown: &str,
    rules: &Rules<'_>,
) -> Result<Option<Signed>, ProvenanceError> {
    // The pin first: content that is not the pinned one fails on that, whatever its signature.
    let actual = sha256_hex(bytes);
    if let Some(pinned) = rules.pin
        && !actual.eq_ignore_ascii_case(pinned.trim())
    {
        return Err(ProvenanceError::PinMismatch { id: rules.id.into(), pinned: pinned.into(), actual });
    }
    let Some(text) = sig else {
        return match rules.require_signature {
            true => Err(ProvenanceError::Unsigned { sig: shown.into() }),
            false => Ok(None),
        };
    };
    let (statement, key, signature) = parse_sig(text, shown)?;
    let key_hex = hex::encode(key.as_bytes());
    trusted_for(rules.trust, &key_hex, rules.id, shown)?;
    let signed = verified(statement, &key, &signature, key_hex, &actual, shown)?;
    if signed.statement.id != rules.id {
        return Err(ProvenanceError::WrongId { sig: shown.into(), signed: signed.statement.id, id: rules.id.into() });
    }
    Ok(Some(signed))
}

/// Whether `trust` trusts `key_hex` for the plugin `id`.
fn trusted_for(trust: &[TrustedKey], key_hex: &str, id: &str, shown: &str) -> Result<(), ProvenanceError> {
    let entries: Vec<&TrustedKey> = trust.iter().filter(|t| t.is(key_hex)).collect();
    if entries.is_empty() {
        return Err(ProvenanceError::UntrustedKey { sig: shown.into(), key: key_hex.into() });
    }
    let admits = |t: &&TrustedKey| t.ids().is_none_or(|ids| ids.iter().any(|i| i.trim() == id));
    if !entries.iter().any(admits) {
        let ids: Vec<&str> = entries.iter().flat_map(|t| t.ids().unwrap_or_default()).map(|i| i.trim()).collect();
        return Err(ProvenanceError::KeyNotForId {
            sig: shown.into(),
            key: key_hex.into(),
            id: id.into(),
            ids: ids.join(", "),
        });
    }
    Ok(())
}

/// `statement` when `signature` by `key` is over it and it states the content `actual`.
fn verified(
    statement: Statement,
    key: &VerifyingKey,
    signature: &Signature,
    key_hex: String,
    actual: &str,
    shown: &str,
) -> Result<Signed, ProvenanceError> {
    key.verify_strict(&statement.message(), signature)
        .map_err(|_| ProvenanceError::BadSignature { sig: shown.into() })?;
    if statement.sha256 != actual {
        return Err(ProvenanceError::OtherContent {
            sig: shown.into(),
            signed: statement.sha256,
            actual: actual.into(),
        });
    }
    Ok(Signed { key: key_hex, statement })
}

/// What the signature `sig` states about exactly `bytes`, by whichever key, trusted or
/// not: what a publisher checks before sending a file and its signature (`warden plugin
/// push`).
pub fn signer(bytes: &[u8], sig: &str, shown: &str) -> Result<Signed, ProvenanceError> {
    let (statement, key, signature) = parse_sig(sig, shown)?;
    let key_hex = hex::encode(key.as_bytes());
    verified(statement, &key, &signature, key_hex, &sha256_hex(bytes), shown)
}

/// The version the loaded component reports (`plugin-info`) must be the signed one, so
/// the version `warden plugins` shows and [`check_upgrade`] compares is the signer's.
pub fn check_version(signed: &Signed, reported: &str, shown: &str) -> Result<(), ProvenanceError> {
    if signed.statement.version == reported {
        return Ok(());
    }
    Err(ProvenanceError::WrongVersion {
        sig: shown.into(),
        signed: signed.statement.version.clone(),
        reported: reported.chars().take(MAX_VERSION_LEN).collect(),
    })
}

/// Before the installed plugin `id` is replaced: `installed` is the text of its signature
/// file (`None`: unsigned), `new` what the replacement's verified signature states. A
/// lower version, or an unsigned replacement of a signed plugin, is refused unless
/// `allow_downgrade` (the operator's `--allow-downgrade`). An installed signature that is
/// not a statement about `id` (another format, another id) sets no floor.
pub fn check_upgrade(
    id: &str,
    installed: Option<&str>,
    new: Option<&Signed>,
    allow_downgrade: bool,
) -> Result<(), ProvenanceError> {
    let Some(old) = installed.and_then(|t| parse_sig(t, "").ok()).map(|(s, _, _)| s).filter(|s| s.id == id) else {
        return Ok(());
    };
    check_not_older(id, Some(&old.version), new, allow_downgrade, RollbackOverride::AllowDowngradeFlag)
}

/// The one rollback rule, for `pull` ([`check_upgrade`]) and for files in the plugin
/// directory (the registry, against the highest signed version it loaded for the id):
/// with `floor` the signed version a replacement must not go below (`None`: no floor), a
/// lower signed version, or an unsigned replacement, is refused unless `allowed` (the
/// operator's override `how`, which the refusal names with both versions).
pub fn check_not_older(
    id: &str,
    floor: Option<&str>,
    new: Option<&Signed>,
    allowed: bool,
    how: RollbackOverride,
) -> Result<(), ProvenanceError> {
    let Some(floor) = floor else { return Ok(()) };
    if allowed {
        return Ok(());
    }
    let Some(new) = new else {
        return Err(ProvenanceError::UnsignedReplacement { id: id.into(), installed: floor.into(), how });
    };
    // Signed versions are semantic versions (`parse_sig`); anything else sets no floor.
    let (Ok(old), Ok(newer)) = (semver::Version::parse(floor), semver::Version::parse(&new.statement.version)) else {
        return Ok(());
    };
    if newer < old {
        return Err(ProvenanceError::Downgrade {
            id: id.into(),
            installed: floor.into(),
            new: new.statement.version.clone(),
            how,
        });
    }
    Ok(())
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

/// A signature file's statement, key and signature; the first format is told apart so
/// its error can say how to re-sign.
fn parse_sig(text: &str, shown: &str) -> Result<(Statement, VerifyingKey, Signature), ProvenanceError> {
    let malformed = || ProvenanceError::Malformed { sig: shown.into() };
    let mut parts = text.split_whitespace();
    match parts.next() {
        Some(SIG_TAG) => {}
        Some(LEGACY_SIG_TAG) => return Err(ProvenanceError::Legacy { sig: shown.into() }),
        _ => return Err(malformed()),
    }
    let mut field = |name: &str| parts.next().and_then(|p| p.strip_prefix(name)?.strip_prefix('=')).map(str::to_owned);
    let (id, version, sha256, key, sig) = (field("id"), field("version"), field("sha256"), field("key"), field("sig"));
    let (Some(id), Some(version), Some(sha256), Some(key), Some(sig)) = (id, version, sha256, key, sig) else {
        return Err(malformed());
    };
    if parts.next().is_some()
        || !valid_id(&id)
        || !valid_version(&version)
        || sha256.len() != 64
        || !sha256.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return Err(malformed());
    }
    let key: [u8; 32] = hex::decode(key).ok().and_then(|k| k.try_into().ok()).ok_or_else(malformed)?;
    let sig: [u8; 64] = hex::decode(sig).ok().and_then(|s| s.try_into().ok()).ok_or_else(malformed)?;
    let key = VerifyingKey::from_bytes(&key).map_err(|_| malformed())?;
    Ok((Statement { id, version, sha256 }, key, Signature::from_bytes(&sig)))
}

/// A new key pair: (private key file text, public key hex). The seed comes from the
/// operating system's random source.
pub fn generate() -> Result<(String, String), ProvenanceError> {
    let mut seed = [0u8; 32];
    getrandom::getrandom(&mut seed).map_err(|e| ProvenanceError::Io(format!("no random source: {e}")))?;
    let key = SigningKey::from_bytes(&seed);
    Ok((format!("{PRIVATE_TAG} {}\n", hex::encode(seed)), hex::encode(key.verifying_key().as_bytes())))
}

/// The signature file text stating that `bytes` are version `version` of the plugin `id`,
/// under the private key file text `private`.
pub fn sign(private: &str, id: &str, version: &str, bytes: &[u8]) -> Result<String, String> {
    if !valid_id(id) {
        return Err(format!(
            "cannot sign for plugin id {:?}: an id is at most {MAX_ID_LEN} letters, digits, `.`, `_` and `-`, not \
             starting with `.`",
            id.chars().take(MAX_ID_LEN + 1).collect::<String>()
        ));
    }
    if !valid_version(version) {
        return Err(format!(
            "cannot sign version {:?}: warden signs semantic versions (MAJOR.MINOR.PATCH, at most {MAX_VERSION_LEN} \
             characters), so that an upgrade can be told from a rollback; set the plugin's `plugin-info` version",
            version.chars().take(MAX_VERSION_LEN + 1).collect::<String>()
        ));
    }
    let mut parts = private.split_whitespace();
    let seed: [u8; 32] = match (parts.next(), parts.next().map(hex::decode), parts.next()) {
        (Some(PRIVATE_TAG), Some(Ok(seed)), None) => {
            seed.try_into().map_err(|_| "the seed is not 32 bytes".to_owned())?
        }
        _ => return Err(format!("not a private key file (expected `{PRIVATE_TAG} <64 hex digits>`)")),
    };
    let key = SigningKey::from_bytes(&seed);
    let statement = Statement { id: id.into(), version: version.into(), sha256: sha256_hex(bytes) };
    let signature = key.sign(&statement.message());
    Ok(format!(
        "{SIG_TAG} id={id} version={version} sha256={} key={} sig={}\n",
        statement.sha256,
        hex::encode(key.verifying_key().as_bytes()),
        hex::encode(signature.to_bytes())
    ))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn signed(dir: &Path, bytes: &[u8]) -> (PathBuf, String) {
        let (private, public) = generate().unwrap();
        let path = dir.join("p.wasm");
        std::fs::write(&path, bytes).unwrap();
        std::fs::write(sig_path(&path), sign(&private, "p", "1.0.0", bytes).unwrap()).unwrap();
        (path, public)
    }

    fn trust_any(keys: &[String]) -> Vec<TrustedKey> {
        keys.iter().cloned().map(TrustedKey::Any).collect()
    }

    fn rules<'a>(trust: &'a [TrustedKey], require: bool, pin: Option<&'a str>) -> Rules<'a> {
        Rules { id: "p", trust, require_signature: require, pin }
    }

    #[test]
    fn a_signature_by_a_trusted_key_verifies_and_every_alteration_fails() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = b"\0asm component bytes".to_vec();
        let (path, public) = signed(dir.path(), &bytes);
        let trust = trust_any(std::slice::from_ref(&public));
        let ok = check(&path, &bytes, &rules(&trust, true, None)).unwrap().unwrap();
        assert_eq!(
            (ok.key.as_str(), ok.statement.id.as_str(), ok.statement.version.as_str()),
            (&*public, "p", "1.0.0")
        );
        // Every single-byte change of the file is caught.
        for i in 0..bytes.len() {
            let mut altered = bytes.clone();
            altered[i] ^= 0x01;
            assert!(matches!(
                check(&path, &altered, &rules(&trust, true, None)),
                Err(ProvenanceError::OtherContent { .. })
            ));
        }
        // So is every change of any character of the signature line (id, version, digest,
        // key or signature): it no longer parses, names another key, or fails to verify.
        let sig = std::fs::read_to_string(sig_path(&path)).unwrap();
        let at = sig.find(" id=").unwrap();
        for i in at..sig.trim_end().len() {
            let mut s = sig.clone().into_bytes();
            s[i] = match s[i] {
                b'0' => b'1',
                b'=' | b' ' => continue,
                _ => b'0',
            };
            std::fs::write(sig_path(&path), &s).unwrap();
            assert!(check(&path, &bytes, &rules(&trust, true, None)).is_err(), "character {i}");
        }
        std::fs::write(sig_path(&path), &sig).unwrap();
        // Another key's signature over the same statement is not trusted.
        let other = trust_any(&[generate().unwrap().1]);
        assert!(matches!(check(&path, &bytes, &rules(&other, true, None)), Err(ProvenanceError::UntrustedKey { .. })));
    }

    #[test]
    fn unsigned_files_load_only_when_no_signature_is_required() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.wasm");
        std::fs::write(&path, b"x").unwrap();
        assert_eq!(check(&path, b"x", &rules(&[], false, None)), Ok(None));
        assert!(matches!(check(&path, b"x", &rules(&[], true, None)), Err(ProvenanceError::Unsigned { .. })));
        std::fs::write(sig_path(&path), "warden-sig-v2 zz").unwrap();
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

    /// The first format signed the bytes only; whoever held such a signature could move it
    /// to any id. It is refused, with how to re-sign.
    #[test]
    fn regression_an_old_format_signature_over_the_bytes_only_is_refused_with_how_to_re_sign() {
        let (private, public) = generate().unwrap();
        let seed: [u8; 32] = hex::decode(private.split_whitespace().nth(1).unwrap()).unwrap().try_into().unwrap();
        let old = SigningKey::from_bytes(&seed).sign(b"bytes");
        let text = format!("ed25519 {public} {}\n", hex::encode(old.to_bytes()));
        let trust = trust_any(std::slice::from_ref(&public));
        let e = check_bytes(b"bytes", Some(&text), "p.wasm.sig", &rules(&trust, false, None)).unwrap_err();
        assert!(matches!(e, ProvenanceError::Legacy { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("warden plugin sign FILE --key KEY") && e.contains("warden plugin push"), "{e}");
    }

    /// A key trusted for one id (`{ key, ids }`) signs for that id only, even when it signs
    /// a statement naming another id; a bare key stays trusted for every id.
    #[test]
    fn regression_a_key_scoped_to_ids_is_refused_for_any_other_id() {
        let (private, public) = generate().unwrap();
        let scoped = [TrustedKey::Scoped { key: public.clone(), ids: vec!["weather".into()] }];
        let bytes = b"component";
        for id in ["weather", "github"] {
            let sig = sign(&private, id, "1.0.0", bytes).unwrap();
            let r = Rules { id, trust: &scoped, require_signature: true, pin: None };
            let got = check_bytes(bytes, Some(&sig), "s", &r);
            match id {
                "weather" => assert!(got.is_ok(), "{got:?}"),
                _ => match got.unwrap_err() {
                    e @ ProvenanceError::KeyNotForId { .. } => {
                        let e = e.to_string();
                        assert!(e.contains("only for plugin ids weather, not for github"), "{e}");
                    }
                    e => panic!("{e:?}"),
                },
            }
        }
        let bare = trust_any(std::slice::from_ref(&public));
        let sig = sign(&private, "github", "1.0.0", bytes).unwrap();
        let r = Rules { id: "github", trust: &bare, require_signature: true, pin: None };
        assert!(check_bytes(bytes, Some(&sig), "s", &r).is_ok());
    }

    #[test]
    fn trust_entries_are_bare_keys_or_keys_with_ids_and_nothing_else() {
        let parse = |y: &str| serde_yaml::from_str::<Vec<TrustedKey>>(y);
        let key = "a".repeat(64);
        let entries = parse(&format!("[{key}, {{ key: {key}, ids: [github, weather] }}]")).unwrap();
        assert_eq!(entries[0], TrustedKey::Any(key.clone()));
        assert_eq!(entries[1], TrustedKey::Scoped { key: key.clone(), ids: vec!["github".into(), "weather".into()] });
        // Written back in the same shape.
        assert_eq!(parse(&serde_yaml::to_string(&entries).unwrap()).unwrap(), entries);
        assert!(parse(&format!("[{{ key: {key}, ids: [a], extra: 1 }}]")).is_err());
        assert!(parse(&format!("[{{ key: {key} }}]")).is_err());
        let e = parse("[[a]]").unwrap_err().to_string();
        assert!(e.contains("or { key:"), "{e}");
    }

    #[test]
    fn sign_refuses_ids_and_versions_a_statement_cannot_hold() {
        let (private, _) = generate().unwrap();
        for id in ["", ".hidden", "a/b", "a b", "a\nversion=9.9.9"] {
            assert!(sign(&private, id, "1.0.0", b"x").is_err(), "{id:?}");
        }
        for version in ["", "1", "1.0", "v1.0.0", "1.0.0\nid=x", &format!("1.0.0-{}", "a".repeat(MAX_VERSION_LEN))] {
            let e = sign(&private, "p", version, b"x").unwrap_err();
            assert!(e.contains("semantic versions"), "{version:?}: {e}");
        }
    }

    #[test]
    fn upgrades_pass_and_rollbacks_and_unsigned_replacements_need_the_flag() {
        let (private, public) = generate().unwrap();
        let installed = sign(&private, "p", "1.2.0", b"old").unwrap();
        let signed = |v: &str| {
            let sig = sign(&private, "p", v, b"new").unwrap();
            signer(b"new", &sig, "s").unwrap()
        };
        for (new, ok) in [("1.2.0", true), ("1.2.1", true), ("2.0.0", true), ("1.1.9", false), ("1.2.0-rc.1", false)] {
            let got = check_upgrade("p", Some(&installed), Some(&signed(new)), false);
            assert_eq!(got.is_ok(), ok, "{new}: {got:?}");
            if !ok {
                let e = got.unwrap_err().to_string();
                assert!(e.contains("older than the installed version 1.2.0") && e.contains("--allow-downgrade"), "{e}");
            }
            assert!(check_upgrade("p", Some(&installed), Some(&signed(new)), true).is_ok());
        }
        let e = check_upgrade("p", Some(&installed), None, false).unwrap_err();
        assert!(matches!(e, ProvenanceError::UnsignedReplacement { .. }), "{e:?}");
        assert!(check_upgrade("p", Some(&installed), None, true).is_ok());
        // Nothing installed, an unsigned one, an old-format or another id's signature: no floor.
        assert!(check_upgrade("p", None, Some(&signed("0.0.1")), false).is_ok());
        assert!(check_upgrade("q", Some(&installed), Some(&signed("0.0.1")), false).is_ok());
        let old = format!("ed25519 {public} {}", "0".repeat(128));
        assert!(check_upgrade("p", Some(&old), None, false).is_ok());
    }

    /// The directory's rule is pull's: lower signed versions and unsigned replacements of a
    /// signed plugin are refused (naming both versions and the pin that lets them in), a
    /// pinned file passes, and without a floor anything passes.
    #[test]
    fn the_directory_refuses_rollbacks_unless_pinned() {
        let (private, public) = generate().unwrap();
        let rules = Rules { id: "echo", trust: &[TrustedKey::Any(public)], require_signature: true, pin: None };
        let signed = |version: &str| {
            let sig = sign(&private, "echo", version, b"x").unwrap();
            check_bytes(b"x", Some(&sig), "echo.wasm.sig", &rules).unwrap().unwrap()
        };
        let pin = RollbackOverride::Pin;
        let e = check_not_older("echo", Some("0.2.0"), Some(&signed("0.1.0")), false, pin).unwrap_err().to_string();
        assert!(e.contains("version 0.1.0 is older than the loaded version 0.2.0"), "{e}");
        assert!(e.contains("plugins.pins.echo") && !e.contains("--allow-downgrade"), "{e}");
        let e = check_not_older("echo", Some("0.2.0"), None, false, pin).unwrap_err().to_string();
        assert!(e.contains("signed (version 0.2.0) and this one is not") && e.contains("plugins.pins.echo"), "{e}");
        assert!(check_not_older("echo", Some("0.2.0"), Some(&signed("0.1.0")), true, pin).is_ok(), "pinned");
        assert!(check_not_older("echo", Some("0.2.0"), Some(&signed("0.2.0")), false, pin).is_ok());
        assert!(check_not_older("echo", Some("0.2.0"), Some(&signed("0.10.0")), false, pin).is_ok(), "semver order");
        assert!(check_not_older("echo", None, None, false, pin).is_ok(), "no floor");
    }

    fn id() -> impl Strategy<Value = String> {
        prop_oneof![Just("github".to_owned()), Just("weather".to_owned()), "[a-z][a-z0-9._-]{0,6}"]
    }

    fn version() -> impl Strategy<Value = String> {
        (0u64..3, 0u64..3, 0u64..3).prop_map(|(a, b, c)| format!("{a}.{b}.{c}"))
    }

    proptest! {
        /// The class: a signature is accepted for a file exactly when the id it names is
        /// the file's id, the version it names is the one the component reports, and the
        /// digest it names is the file's — any mismatch in any of the three is refused.
        #[test]
        fn a_signature_holds_only_for_the_id_version_and_content_it_names(
            signed_as in (id(), version(), proptest::collection::vec(any::<u8>(), 0..16)),
            other in (id(), version(), proptest::collection::vec(any::<u8>(), 0..16)),
            // Which of the three the file differs in (each case as likely as the others,
            // "none" included), taken from `other` (which may equal the signed one).
            differs in (any::<bool>(), any::<bool>(), any::<bool>()),
        ) {
            let (private, public) = generate().unwrap();
            let (signed_id, signed_version, signed_bytes) = &signed_as;
            let pick = |d: bool, signed: &String, other: &String| if d { other.clone() } else { signed.clone() };
            let file = (
                pick(differs.0, signed_id, &other.0),
                pick(differs.1, signed_version, &other.1),
                if differs.2 { other.2.clone() } else { signed_bytes.clone() },
            );
            let (file_id, file_version, file_bytes) = &file;
            let sig = sign(&private, signed_id, signed_version, signed_bytes).unwrap();
            let trust = trust_any(std::slice::from_ref(&public));
            let r = Rules { id: file_id, trust: &trust, require_signature: true, pin: None };
            let accepted = check_bytes(file_bytes, Some(&sig), "s", &r)
                .and_then(|s| check_version(s.as_ref().unwrap(), file_version, "s"))
                .is_ok();
            let same_content = Sha256::digest(signed_bytes) == Sha256::digest(file_bytes);
            prop_assert_eq!(
                accepted,
                signed_id == file_id && signed_version == file_version && same_content,
                "signed {:?}, file {:?}", signed_as, file
            );
        }
    }
}
