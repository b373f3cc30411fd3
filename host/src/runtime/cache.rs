//! On-disk cache of compiled components.
//!
//! Keyed by the SHA-256 of the component bytes plus the engine's compatibility hash,
//! stored outside the plugin directory. Only files this module wrote are ever
//! deserialized: entries are written to a temporary file and renamed into place, and
//! the cache directory is created private to the user. It must never read native code
//! from anywhere else (in particular never from the plugin directory).

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Suffix of cache entries; `.cwasm` is wasmtime's convention for precompiled code.
const ENTRY_SUFFIX: &str = "cwasm";

/// Where a component came from: compiled now or loaded from the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Compiled,
    Cached,
}

pub struct CompileCache {
    dir: Option<PathBuf>,
    engine_key: String,
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
        CompileCache { dir, engine_key }
    }

    fn entry_path(&self, dir: &Path, content_hash: &str) -> PathBuf {
        dir.join(format!("{content_hash}-{}.{ENTRY_SUFFIX}", self.engine_key))
    }

    /// Loads `bytes` as a component, from the cache when possible.
    pub fn load(&self, engine: &Engine, bytes: &[u8]) -> wasmtime::Result<(Component, Origin, String)> {
        let content_hash = hex::encode(Sha256::digest(bytes));
        let Some(dir) = &self.dir else {
            return Ok((Component::new(engine, bytes)?, Origin::Compiled, content_hash));
        };
        let path = self.entry_path(dir, &content_hash);
        if let Ok(serialized) = std::fs::read(&path) {
            // Read into memory rather than mapping the file: a mapped entry that is
            // truncated or rewritten underneath a running plugin would fault the host.
            // SAFETY: entries are produced by `Component::serialize` of this same engine
            // configuration (the name carries its compatibility hash), written by this
            // module into a directory only this user can write; wasmtime checks the
            // header and version before using them.
            match unsafe { Component::deserialize(engine, &serialized) } {
                Ok(c) => return Ok((c, Origin::Cached, content_hash)),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "discarding unusable cache entry");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        let component = Component::new(engine, bytes)?;
        if let Err(e) = self.store(dir, &path, &component) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot write compile cache; continuing without");
        }
        Ok((component, Origin::Compiled, content_hash))
    }

    fn store(&self, dir: &Path, path: &Path, component: &Component) -> anyhow::Result<()> {
        create_private_dir(dir)?;
        let bytes = component.serialize().map_err(|e| anyhow::anyhow!("{e}"))?;
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, path)?;
        Ok(())
    }
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}
