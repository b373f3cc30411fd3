//! `warden plugin keygen | sign | verify | push | pull`: Ed25519 signatures for plugin
//! files (formats and checks in [`crate::provenance`]) and signed plugins through OCI
//! registries ([`crate::oci`]). Private keys are written mode 0600 and never printed.
//! Plugin files are read only through [`crate::registry::read_plugin_file`] (bounded,
//! regular files only).

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

use super::{EXIT_USAGE, Ungranted, esc, load_ungranted};
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

/// `warden plugin sign FILE --key KEY [--id ID]`: signs the statement "this content is
/// version V of plugin ID", where V is the version the component itself reports (loaded as
/// `inspect` loads it) and ID is `--id`, else the file's name without `.wasm`.
pub async fn sign(config: &Config, file: &Path, key: &Path, id: Option<&str>) -> anyhow::Result<ExitCode> {
    let private = std::fs::read_to_string(key).with_context(|| format!("cannot read {}", key.display()))?;
    let id = match id {
        Some(id) => id.to_owned(),
        None => crate::registry::plugin_id(file)
            .with_context(|| format!("{}: not a .wasm file; name the plugin id with --id", file.display()))?,
    };
    let Ungranted { bytes, loaded, .. } = load_ungranted(config, file).await?;
    let loaded =
        loaded.map_err(|e| anyhow::anyhow!("{}: cannot sign a plugin that does not load: {e}", file.display()))?;
    let version = &loaded.info.version;
    let sig =
        provenance::sign(&private, &id, version, &bytes).map_err(|e| anyhow::anyhow!("{}: {e}", key.display()))?;
    let path = provenance::sig_path(file);
    std::fs::write(&path, sig).with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("signed: plugin {id} version {version}");
    out!("{}", path.display());
    Ok(ExitCode::SUCCESS)
}

/// `warden plugin verify FILE [--trust KEY]...`: the file's signature as loading checks it
/// (with `require_signature: true`): a key trusted for the file's id, the file's content
/// and id, its pin, and the version the component reports.
pub async fn verify(config: &Config, file: &Path, extra_trust: &[String]) -> anyhow::Result<ExitCode> {
    let bytes = crate::registry::read_plugin_file(file, config.plugins.max_plugin_size)
        .await
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let trust: Vec<provenance::TrustedKey> = config
        .plugins
        .trust
        .iter()
        .cloned()
        .chain(extra_trust.iter().cloned().map(provenance::TrustedKey::Any))
        .collect();
    let id = crate::registry::plugin_id(file).unwrap_or_default();
    let rules = provenance::Rules {
        id: &id,
        trust: &trust,
        require_signature: true,
        pin: config.plugins.pins.get(&id).map(String::as_str),
    };
    let checked = match provenance::check(file, &bytes, &rules) {
        Ok(signed) => signed.expect("a signature is required"),
        Err(e) => return Ok(refused(&e.to_string())),
    };
    let loaded = match load_ungranted(config, file).await?.loaded {
        Ok(p) => p,
        Err(e) => return Ok(refused(&format!("{}: does not load: {e}", file.display()))),
    };
    let shown = provenance::sig_path(file).display().to_string();
    if let Err(e) = provenance::check_version(&checked, &loaded.info.version, &shown) {
        return Ok(refused(&e.to_string()));
    }
    let statement = &checked.statement;
    out!("ok: plugin {} version {}, signed by {}", statement.id, statement.version, checked.key);
    Ok(ExitCode::SUCCESS)
}

fn refused(error: &str) -> ExitCode {
    eprintln!("error: {}", esc(error));
    ExitCode::from(EXIT_USAGE)
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

pub async fn pull(
    config: &Config,
    source: &str,
    id: Option<&str>,
    insecure: bool,
    allow_downgrade: bool,
) -> anyhow::Result<ExitCode> {
    let dir = config.path(&config.plugins.dir);
    let pulled = match crate::oci::credentials_from_env() {
        Ok(creds) => crate::oci::pull(source, insecure, &creds, id, &dir, &config.plugins, allow_downgrade).await,
        Err(e) => Err(e),
    };
    match pulled {
        Ok(i) => {
            match &i.signed {
                Some(s) => eprintln!(
                    "signature verified: {} (plugin {} version {})",
                    s.key, s.statement.id, s.statement.version
                ),
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
