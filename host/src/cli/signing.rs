//! `warden plugin keygen | sign | verify | push | pull`: Ed25519 signatures for plugin
//! files (formats and checks in [`crate::provenance`]) and signed plugins through OCI
//! registries ([`crate::oci`]). Private keys are written mode 0600 and never printed.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

use super::{EXIT_USAGE, esc};
use crate::config::Config;
use crate::provenance;

pub fn keygen(out: &Path) -> anyhow::Result<ExitCode> {
    let (private, public) = provenance::generate()?;
    let key = out.with_extension("key");
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    let mut f = o.open(&key).with_context(|| format!("cannot create {} (it must not exist yet)", key.display()))?;
    std::io::Write::write_all(&mut f, private.as_bytes())?;
    std::fs::write(out.with_extension("pub"), format!("{public}\n"))?;
    eprintln!("private key: {} (keep it secret)", key.display());
    eprintln!("public key:  {} — add it to plugins.trust", out.with_extension("pub").display());
    out!("{public}");
    Ok(ExitCode::SUCCESS)
}

pub fn sign(file: &Path, key: &Path) -> anyhow::Result<ExitCode> {
    let private = std::fs::read_to_string(key).with_context(|| format!("cannot read {}", key.display()))?;
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let sig = provenance::sign(&private, &bytes).map_err(|e| anyhow::anyhow!("{}: {e}", key.display()))?;
    let path = provenance::sig_path(file);
    std::fs::write(&path, sig).with_context(|| format!("cannot write {}", path.display()))?;
    out!("{}", path.display());
    Ok(ExitCode::SUCCESS)
}

pub fn verify(config: &Config, file: &Path, extra_trust: &[String]) -> anyhow::Result<ExitCode> {
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let trust: Vec<String> = config.plugins.trust.iter().chain(extra_trust).cloned().collect();
    let id = crate::registry::plugin_id(file).unwrap_or_default();
    let rules = provenance::Rules {
        id: &id,
        trust: &trust,
        require_signature: true,
        pin: config.plugins.pins.get(&id).map(String::as_str),
    };
    match provenance::check(file, &bytes, &rules) {
        Ok(key) => {
            out!("ok: signed by {}", key.unwrap_or_default());
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("error: {}", esc(&e.to_string()));
            Ok(ExitCode::from(EXIT_USAGE))
        }
    }
}

pub async fn push(config: &Config, file: &Path, target: &str, insecure: bool) -> anyhow::Result<ExitCode> {
    let pushed = match crate::oci::credentials_from_env() {
        Ok(creds) => crate::oci::push(file, target, insecure, &creds, config.plugins.max_plugin_size).await,
        Err(e) => Err(e),
    };
    match pushed {
        Ok(p) => {
            match &p.signed_by {
                Some(key) => eprintln!("signed by {key}"),
                None => eprintln!(
                    "warning: unsigned (no {}); deployments with require_signature: true will refuse it",
                    provenance::sig_path(file).display()
                ),
            }
            out!("{}@{}", esc(target), p.digest);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("error: {}", esc(&e.to_string()));
            Ok(ExitCode::from(EXIT_USAGE))
        }
    }
}

pub async fn pull(config: &Config, source: &str, id: Option<&str>, insecure: bool) -> anyhow::Result<ExitCode> {
    let dir = config.path(&config.plugins.dir);
    let pulled = match crate::oci::credentials_from_env() {
        Ok(creds) => crate::oci::pull(source, insecure, &creds, id, &dir, &config.plugins).await,
        Err(e) => Err(e),
    };
    match pulled {
        Ok(i) => {
            match &i.signed_by {
                Some(key) => eprintln!("signature verified: {key}"),
                None => eprintln!("warning: unsigned (plugins.require_signature is false)"),
            }
            eprintln!("sha256 {} (for plugins.pins.{})", i.sha256, i.id);
            eprintln!("{} {}", if i.replaced { "replaced" } else { "installed" }, i.path.display());
            out!("{}", i.path.display());
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("error: {}", esc(&e.to_string()));
            Ok(ExitCode::from(EXIT_USAGE))
        }
    }
}
