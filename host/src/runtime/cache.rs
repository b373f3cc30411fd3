//! On-disk cache of compiled components.
//!
//! Keyed by the SHA-256 of the component bytes plus the engine's compatibility hash,
//! stored outside the plugin directory. Native code is only ever deserialized from an
//! entry this host wrote: the cache directory must be owned by warden's user and not
//! writable by group or others (otherwise the cache is not used at all), and every entry
//! carries an HMAC-SHA256 tag, with a key kept beside the entries (`cache.key`, mode
//! 0600), over the engine key, the component's hash and the native code. An entry whose
//! tag does not verify — tampered, truncated, or planted under another component's name —
//! is discarded and the component recompiled. It must never read native code from
//! anywhere else (in particular never from the plugin directory).

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Suffix of cache entries; `.cwasm` is wasmtime's convention for precompiled code.
const ENTRY_SUFFIX: &str = "cwasm";
/// The file beside the entries holding the HMAC key.
pub const KEY_FILE: &str = "cache.key";
/// Bytes of the HMAC key (the SHA-256 block-size-safe 256 bits).
const KEY_LEN: usize = 32;
/// Bytes of an entry's tag (HMAC-SHA256 output) in front of the native code.
const TAG_LEN: usize = 32;

type EntryMac = Hmac<Sha256>;

/// Where a component came from: compiled now or loaded from the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Compiled,
    Cached,
}

pub struct CompileCache {
    dir: Option<PathBuf>,
    engine_key: String,
    /// The HMAC key once read or created; `Err` text once the cache proved unusable.
    key: Mutex<Option<Result<[u8; KEY_LEN], String>>>,
}

impl CompileCache {
    /// `dir = None` disables caching (every load compiles).
    pub fn new(engine: &Engine, dir: Option<PathBuf>) -> Self {
        // The compatibility hash covers the wasmtime version, target and every
        // codegen-relevant Config setting, so entries never cross engines.
        struct ShaHasher(Sha256);
        impl Hasher for ShaHasher {
            fn finish(&self) -> u64 {
                0
            }
            fn write(&mut self, bytes: &[u8]) {
                self.0.update(bytes);
            }
        }
        let mut h = ShaHasher(Sha256::new());
        engine.precompile_compatibility_hash().hash(&mut h);
        let engine_key = hex::encode(&h.0.finalize()[..8]);
        CompileCache { dir, engine_key, key: Mutex::new(None) }
    }

    fn entry_path(&self, dir: &Path, content_hash: &str) -> PathBuf {
        dir.join(format!("{content_hash}-{}.{ENTRY_SUFFIX}", self.engine_key))
    }

    /// The HMAC key, after checking the directory (created private when missing). An
    /// unusable directory disables the cache for this host's lifetime, with a warning.
    fn key(&self, dir: &Path) -> Option<[u8; KEY_LEN]> {
        let mut slot = self.key.lock().unwrap();
        if slot.is_none() {
            let r = open_key(dir).map_err(|e| e.to_string());
            if let Err(e) = &r {
                tracing::warn!(dir = %dir.display(), error = %e, "compile cache not used");
            }
            *slot = Some(r);
        }
        slot.as_ref().and_then(|r| r.as_ref().ok().copied())
    }

    fn tag(&self, key: &[u8; KEY_LEN], content_hash: &str, native: &[u8]) -> EntryMac {
        let mut mac = EntryMac::new_from_slice(key).expect("HMAC takes keys of any length");
        mac.update(self.engine_key.as_bytes());
        mac.update(b"\0");
        mac.update(content_hash.as_bytes());
        mac.update(b"\0");
        mac.update(native);
        mac
    }

    /// The cache's name for a component: the hex SHA-256 of its bytes.
    pub fn content_hash(bytes: &[u8]) -> String {
        hex::encode(Sha256::digest(bytes))
    }

    /// The cached native code of the component named `content_hash`, when an entry
    /// exists and authenticates. Blocking (file I/O and deserialization).
    pub fn lookup(&self, engine: &Engine, content_hash: &str) -> Option<Component> {
        let (dir, key) = self.dir.as_deref().and_then(|d| self.key(d).map(|k| (d, k)))?;
        let path = self.entry_path(dir, content_hash);
        // Read into memory rather than mapping the file: a mapped entry that is
        // truncated or rewritten underneath a running plugin would fault the host.
        let entry = std::fs::read(&path).ok()?;
        let verified = entry.len() > TAG_LEN
            && self.tag(&key, content_hash, &entry[TAG_LEN..]).verify_slice(&entry[..TAG_LEN]).is_ok();
        if verified {
            // SAFETY: the tag proves this host wrote these bytes for exactly this
            // component and engine configuration ([`CompileCache::store`]), in a
            // directory only warden's user can write; wasmtime checks the header too.
            match unsafe { Component::deserialize(engine, &entry[TAG_LEN..]) } {
                Ok(c) => return Some(c),
                Err(e) => tracing::warn!(path = %path.display(), error = %e, "discarding unusable cache entry"),
            }
        } else {
            tracing::warn!(path = %path.display(), "discarding a cache entry that fails authentication");
        }
        let _ = std::fs::remove_file(&path);
        None
    }

    /// Stores a freshly compiled component: `artifact` when the compiler sent one,
    /// else the component serialized here. Failures only cost a later recompile.
    pub fn store(&self, content_hash: &str, component: &Component, artifact: Option<&[u8]>) {
        let Some((dir, key)) = self.dir.as_deref().and_then(|d| self.key(d).map(|k| (d, k))) else {
            return;
        };
        let path = self.entry_path(dir, content_hash);
        let serialized;
        let native = match artifact {
            Some(a) => a,
            None => match component.serialize() {
                Ok(bytes) => {
                    serialized = bytes;
                    &serialized
                }
                Err(e) => return tracing::warn!(error = %e, "cannot serialize a compiled component; not cached"),
            },
        };
        if let Err(e) = self.write_entry(&key, &path, content_hash, native) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot write compile cache; continuing without");
        }
    }

    fn write_entry(&self, key: &[u8; KEY_LEN], path: &Path, content_hash: &str, native: &[u8]) -> std::io::Result<()> {
        let tag = self.tag(key, content_hash, native).finalize().into_bytes();
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let mut f = private_file(&tmp, true)?;
        f.write_all(&tag)?;
        f.write_all(native)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        Ok(())
    }
}

/// Creates `dir` private to this user if missing, then checks it is safe to trust:
/// owned by this user and writable by nobody else.
fn check_dir(dir: &Path) -> std::io::Result<()> {
    if !dir.exists() {
        std::fs::create_dir_all(dir)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
    }
    check_private(dir, 0o022)
}

/// Refuses `path` unless it is owned by this process's user and none of the mode bits
/// in `forbidden` are set.
fn check_private(path: &Path, forbidden: u32) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::symlink_metadata(path)?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me {
            return Err(std::io::Error::other(format!(
                "{} is owned by uid {}, not by warden's user (uid {me})",
                path.display(),
                meta.uid()
            )));
        }
        if meta.mode() & forbidden != 0 {
            return Err(std::io::Error::other(format!(
                "{} has mode {:o}: group or others may change it",
                path.display(),
                meta.mode() & 0o777
            )));
        }
    }
    Ok(())
}

/// Opens (`create`: creates, truncating) a file readable and writable by this user only.
fn private_file(path: &Path, create: bool) -> std::io::Result<std::fs::File> {
    let mut o = std::fs::OpenOptions::new();
    if create {
        o.write(true).create(true).truncate(true);
    } else {
        o.read(true);
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600).custom_flags(libc::O_NOFOLLOW);
    }
    o.open(path)
}

/// Reads the HMAC key beside the entries, creating it (random, 0600) on first use.
fn open_key(dir: &Path) -> std::io::Result<[u8; KEY_LEN]> {
    use std::io::Read;
    check_dir(dir)?;
    let path = dir.join(KEY_FILE);
    if !path.exists() {
        let mut key = [0u8; KEY_LEN];
        // Two v4 UUIDs: 244 bits from the operating system's random source.
        key[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        key[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        let tmp = dir.join(format!("{KEY_FILE}.tmp{}", std::process::id()));
        let mut f = private_file(&tmp, true)?;
        f.write_all(&key)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
    }
    check_private(&path, 0o077)?;
    let mut key = [0u8; KEY_LEN];
    private_file(&path, false)?.read_exact(&mut key)?;
    Ok(key)
}
