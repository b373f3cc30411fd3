//! Plugins as Wasm OCI artifacts: `warden plugin push FILE oci://REGISTRY/REPO:TAG` and
//! `warden plugin pull oci://REGISTRY/REPO:TAG`.
//!
//! The artifact has the layout `wkg oci push` writes (the CNCF Wasm OCI artifact layout),
//! so `wkg oci pull` reads what warden pushes and warden pulls what wkg pushed:
//! - an OCI image manifest (`application/vnd.oci.image.manifest.v1+json`) whose config has
//!   the media type [`WASM_CONFIG_MEDIA_TYPE`] (JSON: `created`, `architecture: wasm`,
//!   `os: wasip2`, `layerDigests`);
//! - exactly one layer of media type [`WASM_LAYER_MEDIA_TYPE`]: the component's bytes,
//!   titled `<id>.wasm` (`org.opencontainers.image.title`).
//!
//! The signature travels in the manifest, as the annotation [`SIGNATURE_ANNOTATION`]
//! whose value is the text of the `.sig` file `warden plugin sign` wrote. A second layer
//! would break wkg's one-layer rule, and the referrers API is missing from common
//! registries (Distribution 2.8); an annotation is fetched with the manifest, so the
//! component and its signature cannot be pulled apart. The signature states the
//! component's SHA-256, plugin id and version ([`crate::provenance::Statement`]), so
//! changing the annotation cannot make other bytes verify, nor the artifact install as
//! another plugin.
//!
//! Every token, manifest and blob is fetched by warden's own registry client ([`fetch`]:
//! every response bounded, credentials to the registry's origin only, redirects for blobs
//! only and address-checked, never with credentials); oci-client only uploads a push, with
//! the authorization warden's client got, never the credentials for a realm of its choosing.
//!
//! Pulling verifies, before a byte is written: the manifest (read by warden itself within
//! [`MAX_MANIFEST_BYTES`], and its digest when pulled by digest), its layout, the layer's
//! size ([`crate::config::PluginsConfig::max_plugin_size`]) and SHA-256 digest, that it is
//! a component, then the pin, trust and signature rules of loading, through the same
//! [`crate::provenance::check_bytes`], and that it is no rollback of the installed plugin
//! ([`crate::provenance::check_upgrade`]). Only then is the file installed, atomically: the
//! component and its signature are written to hidden temporary files in the plugin
//! directory (names the hot-reload watcher ignores), flushed, and renamed into place.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol, Config as OciConfig, ImageLayer};
use oci_client::manifest::{OciImageManifest, OciManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::{Digest, Sha256};

mod fetch;
use fetch::{Auth, RegistryClient};
pub use fetch::{MAX_BLOB_REDIRECTS, MAX_ERROR_BODY, MAX_TOKEN_BYTES};

use crate::config::PluginsConfig;
use crate::provenance;

/// The scheme of a plugin reference on the command line: `oci://REGISTRY/REPO:TAG`.
pub const SCHEME: &str = "oci://";
/// The config media type of a Wasm OCI artifact (what `wkg oci push` writes).
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The media type of the one layer: the component's bytes.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// The manifest media type (an OCI image manifest).
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// The manifest annotation that carries the plugin's signature: the text of its `.sig`.
pub const SIGNATURE_ANNOTATION: &str = "dev.warden.plugin.signature";
/// The layer annotation that names the file (`<id>.wasm`), as wkg sets it.
pub const TITLE_ANNOTATION: &str = "org.opencontainers.image.title";
/// Longest plugin id taken from an artifact: a file name, not a path.
pub const MAX_ID_LEN: usize = provenance::MAX_ID_LEN;
/// Largest manifest `pull` reads. A plugin artifact's manifest is about a kilobyte plus
/// the signature annotation (at most [`provenance::MAX_SIG_FILE`]); 4 MiB is the limit
/// common registries (Distribution, Docker Hub) put on a manifest, so anything larger is
/// not one, and a registry streaming gigabytes as a "manifest" is cut off here instead of
/// exhausting the memory of the machine that also runs `warden serve`.
pub const MAX_MANIFEST_BYTES: u64 = 4 * 1024 * 1024;
/// Bytes of a registry's error body quoted in an error.
const MAX_QUOTED_ERROR: usize = 512;
/// The manifest media types `pull` asks for (an image index too, to refuse it by name).
const MANIFEST_ACCEPT: [&str; 4] = [
    MANIFEST_MEDIA_TYPE,
    oci_client::manifest::IMAGE_MANIFEST_MEDIA_TYPE,
    oci_client::manifest::OCI_IMAGE_INDEX_MEDIA_TYPE,
    oci_client::manifest::IMAGE_MANIFEST_LIST_MEDIA_TYPE,
];
/// Time to connect to a registry before giving up.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest silence while reading from a registry before giving up (a stalled transfer).
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// The environment variable with the registry user name (HTTP Basic, with [`PASSWORD_ENV`]).
pub const USERNAME_ENV: &str = "WARDEN_REGISTRY_USERNAME";
/// The environment variable with the registry password or token; never logged or printed.
pub const PASSWORD_ENV: &str = "WARDEN_REGISTRY_PASSWORD";
/// The environment variable naming the one registry (`host[:port]`) the credentials are
/// for: any other registry a command names is accessed anonymously, so a pull from a
/// registry an attacker names never hands it the password.
pub const HOST_ENV: &str = "WARDEN_REGISTRY_HOST";
/// Longest a whole push or pull may take: bounds a registry that trickles a manifest or a
/// layer forever (each read is also bounded by [`READ_TIMEOUT`]).
pub const TRANSFER_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("{0}: expected oci://REGISTRY/REPOSITORY:TAG (or @sha256:DIGEST)")]
    BadReference(String),
    #[error(
        "--insecure (plain HTTP) is only for a registry on this machine (127.0.0.1, localhost), not {0}; \
         use HTTPS"
    )]
    InsecureRemote(String),
    #[error("set both {USERNAME_ENV} and {PASSWORD_ENV} (or neither, for anonymous access)")]
    HalfCredentials,
    #[error("set {HOST_ENV} to the registry (host[:port]) that {USERNAME_ENV} and {PASSWORD_ENV} are for")]
    CredentialsWithoutHost,
    #[error("{0} took longer than {secs} s", secs = TRANSFER_TIMEOUT.as_secs())]
    TimedOut(String),
    #[error(
        "the artifact names itself {title:?} but the repository is {repository:?}: pass --as ID to say \
         which plugin it installs as"
    )]
    AmbiguousId { title: String, repository: String },
    #[error("{0}")]
    Registry(String),
    #[error("{reference} is not a Wasm component artifact: {reason}")]
    NotWasm { reference: String, reason: String },
    #[error("{0}: not a WebAssembly component (a core module? componentize it first)")]
    NotAComponent(String),
    #[error("the layer is {size} bytes, more than the limit of {limit} bytes (plugins.max_plugin_size)")]
    TooLarge { size: u64, limit: u64 },
    #[error("the manifest of {reference} is more than {limit} bytes (MAX_MANIFEST_BYTES): not a plugin artifact")]
    ManifestTooLarge { reference: String, limit: u64 },
    #[error(
        "the manifest does not match the digest it was pulled by: expected {expected}, got {actual} (altered in the \
         registry or in transit)"
    )]
    ManifestDigestMismatch { expected: String, actual: String },
    #[error(
        "the layer's content does not match its digest: expected {expected}, got {actual} (altered in the registry or in transit)"
    )]
    DigestMismatch { expected: String, actual: String },
    #[error("cannot name the plugin from {0:?}; give a name with --as ID")]
    BadId(String),
    #[error("refused: {0}")]
    Refused(#[from] provenance::ProvenanceError),
    #[error("{0}")]
    Io(String),
}

/// What `push` published.
#[derive(Debug)]
pub struct Pushed {
    /// The manifest digest (`sha256:...`): pull by it for an immutable reference.
    pub digest: String,
    /// The signing key (hex), when the file had a `.sig`.
    pub signed_by: Option<String>,
}

/// What `pull` installed.
#[derive(Debug)]
pub struct Installed {
    pub id: String,
    pub path: PathBuf,
    /// SHA-256 (hex) of the component: what `plugins.pins` takes.
    pub sha256: String,
    /// What its signature stated, and by which trusted key.
    pub signed: Option<provenance::Signed>,
    /// Whether a plugin file of this id was there before.
    pub replaced: bool,
}

/// Registry credentials: a user name and password (or token) for one registry.
#[derive(Clone, Default)]
pub struct Credentials(Option<(String, String, String)>);

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some((host, user, _)) => write!(f, "Credentials({user}@{host}, password redacted)"),
            None => f.write_str("Credentials(anonymous)"),
        }
    }
}

impl Credentials {
    /// Anonymous access.
    pub fn anonymous() -> Self {
        Credentials(None)
    }

    /// `user` and `password` for the registry `host` (`host[:port]`) only.
    pub fn for_host(host: &str, user: &str, password: &str) -> Self {
        Credentials(Some((host.to_owned(), user.to_owned(), password.to_owned())))
    }

    /// The user name and password for `registry` when they are for it, else none (the
    /// registry client sends them to that registry's origin only, see [`fetch`]).
    fn for_registry(&self, registry: &str) -> Option<(String, String)> {
        match &self.0 {
            Some((host, user, password)) if host.eq_ignore_ascii_case(registry) => {
                Some((user.clone(), password.clone()))
            }
            _ => None,
        }
    }
}

/// Registry credentials from [`USERNAME_ENV`], [`PASSWORD_ENV`] and [`HOST_ENV`];
/// anonymous when none is set.
pub fn credentials_from_env() -> Result<Credentials, OciError> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    match (var(USERNAME_ENV), var(PASSWORD_ENV)) {
        (Some(user), Some(password)) => match var(HOST_ENV) {
            Some(host) => Ok(Credentials::for_host(host.trim(), &user, &password)),
            None => Err(OciError::CredentialsWithoutHost),
        },
        (None, None) => Ok(Credentials::anonymous()),
        _ => Err(OciError::HalfCredentials),
    }
}

/// A registry to talk to: the parsed reference, warden's registry client (every token,
/// manifest and blob, see [`fetch`]), and the OCI client that uploads a push with the
/// authorization warden's client got.
struct Remote {
    reference: Reference,
    client: Client,
    registry: RegistryClient,
}

/// Parses `oci://REGISTRY/REPO:TAG` and makes a client for it, with `credentials` if they
/// are for its registry; plain HTTP only with `insecure` and only to a loopback registry.
fn connect(target: &str, insecure: bool, credentials: &Credentials) -> Result<Remote, OciError> {
    let bad = || OciError::BadReference(target.to_owned());
    let rest = target.strip_prefix(SCHEME).ok_or_else(bad)?;
    let reference: Reference = rest.parse().map_err(|_| bad())?;
    // Without an explicit registry the parser would pick Docker Hub: refuse the guess.
    if !rest.starts_with(reference.registry()) {
        return Err(bad());
    }
    let registry = reference.resolve_registry().to_owned();
    let protocol = if insecure {
        if !is_loopback(&registry) {
            return Err(OciError::InsecureRemote(registry));
        }
        ClientProtocol::HttpsExcept(vec![registry.clone()])
    } else {
        ClientProtocol::Https
    };
    // Plain HTTP goes to this machine's registry directly: an explicit proxy list turns off
    // the system proxy (`HTTP_PROXY`), and that list exempts the registry, so neither the
    // traffic nor the credentials reach a proxy; any other plain-HTTP host (none is
    // allowed) would meet a proxy that does not exist.
    let (http_proxy, no_proxy) = if insecure {
        let host = registry.rsplit_once(':').map_or(registry.as_str(), |(h, _)| h);
        (Some(NOWHERE_PROXY.to_owned()), Some(host.to_owned()))
    } else {
        (None, None)
    };
    let config = ClientConfig {
        protocol,
        http_proxy,
        no_proxy,
        connect_timeout: Some(CONNECT_TIMEOUT),
        read_timeout: Some(READ_TIMEOUT),
        // An index would be resolved to some platform's image; a plugin artifact is one manifest.
        platform_resolver: None,
        ..ClientConfig::default()
    };
    let registry_client = RegistryClient::new(&registry, insecure, credentials.for_registry(&registry))?;
    Ok(Remote { reference, client: Client::new(config), registry: registry_client })
}

/// Mode of an installed plugin file and its signature: a plugin is not a secret, and the
/// server may run as another user than the one who pulled it.
#[cfg(unix)]
const INSTALLED_MODE: u32 = 0o644;

/// A proxy address nothing listens on (the discard port of an unroutable address).
const NOWHERE_PROXY: &str = "http://0.0.0.0:9";

/// Whether `registry` (`host[:port]`) is this machine.
fn is_loopback(registry: &str) -> bool {
    // (The reference parser takes no IPv6 literal, so the host is what precedes the port.)
    let host = registry.rsplit_once(':').map_or(registry, |(h, _)| h);
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Whether `bytes` start with a WebAssembly component header (not a core module's).
fn is_component(bytes: &[u8]) -> bool {
    // magic, then version 0x0d and layer 1 (a core module has version 1, layer 0).
    bytes.len() >= 8 && bytes[..4] == *b"\0asm" && bytes[4..8] == [0x0d, 0x00, 0x01, 0x00]
}

/// An error with its causes ("error sending request: ... : Connection refused").
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let next = cause.to_string();
        if !text.contains(&next) {
            text = format!("{text}: {next}");
        }
        source = cause.source();
    }
    text
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Publishes the component `file` (and its signature `FILE.sig`, if present and valid)
/// at `target`. Refuses a signature that does not match the file.
pub async fn push(
    file: &Path,
    target: &str,
    insecure: bool,
    credentials: &Credentials,
    max_size: u64,
) -> Result<Pushed, OciError> {
    bounded(format!("pushing to {target}"), async {
        let Remote { reference, client, registry } = connect(target, insecure, credentials)?;
        let bytes = crate::registry::read_plugin_file(file, max_size).await.map_err(OciError::Io)?;
        let shown = file.display().to_string();
        if !is_component(&bytes) {
            return Err(OciError::NotAComponent(shown));
        }
        let id = crate::registry::plugin_id(file).filter(|id| valid_id(id)).ok_or(OciError::BadId(shown))?;
        let sig = provenance::read_sig_file(file)?;
        let signed_by = match &sig {
            Some(text) => {
                let shown = provenance::sig_path(file).display().to_string();
                let signed = provenance::signer(&bytes, text, &shown)?;
                // The layer is titled `<id>.wasm`; a signature for another id would be
                // refused by every pull of it.
                if signed.statement.id != id {
                    return Err(
                        provenance::ProvenanceError::WrongId { sig: shown, signed: signed.statement.id, id }.into()
                    );
                }
                Some(signed.key)
            }
            None => None,
        };
        let digest = format!("sha256:{}", sha256_hex(&bytes));
        let config = serde_json::json!({
            "created": humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            "author": null,
            "architecture": "wasm",
            "os": "wasip2",
            "layerDigests": [digest],
            "component": null,
        });
        let config = OciConfig::new(
            serde_json::to_vec(&config).expect("JSON values serialize"),
            WASM_CONFIG_MEDIA_TYPE.into(),
            None,
        );
        let layer = ImageLayer::new(
            bytes,
            WASM_LAYER_MEDIA_TYPE.into(),
            Some(BTreeMap::from([(TITLE_ANNOTATION.to_owned(), format!("{id}.wasm"))])),
        );
        let annotations = sig.map(|s| BTreeMap::from([(SIGNATURE_ANNOTATION.to_owned(), s.trim().to_owned())]));
        let layers = [layer];
        let mut manifest = OciImageManifest::build(&layers, &config, annotations);
        manifest.media_type = Some(MANIFEST_MEDIA_TYPE.into());
        // The token comes from warden's client (bounded, credentials to the registry's
        // origin only); the OCI client is handed the result, never the credentials for a
        // realm of its own choosing.
        let scope = format!("repository:{}:pull,push", reference.repository());
        let auth = match registry.authorize(&scope).await?.auth {
            Auth::Anonymous => RegistryAuth::Anonymous,
            Auth::Basic(user, password) => RegistryAuth::Basic(user, password),
            Auth::Bearer(token) => RegistryAuth::Bearer(token),
        };
        let pushed = client
            .push(&reference, &layers, config, &auth, Some(manifest))
            .await
            .map_err(|e| OciError::Registry(format!("pushing to {target}: {}", chain(&e))))?;
        let digest = pushed.manifest_url.rsplit('/').next().unwrap_or_default().to_owned();
        tracing::info!(%target, %digest, signed = signed_by.is_some(), "plugin pushed");
        Ok(Pushed { digest, signed_by })
    })
    .await
}

/// `work`, or [`OciError::TimedOut`] naming `what` after [`TRANSFER_TIMEOUT`].
async fn bounded<T>(what: String, work: impl Future<Output = Result<T, OciError>>) -> Result<T, OciError> {
    tokio::time::timeout(TRANSFER_TIMEOUT, work).await.unwrap_or_else(|_| Err(OciError::TimedOut(what)))
}

/// A plugin id that is a plain file name: letters, digits, `.`, `_`, `-`, not hidden (the
/// ids a signature can name).
fn valid_id(id: &str) -> bool {
    provenance::valid_id(id)
}

/// The manifest of `remote`'s reference, read by warden's registry client within
/// [`MAX_MANIFEST_BYTES`] (oci-client reads a manifest whole, however large) with `auth`
/// (`withheld`: the token realm the credentials were not sent to, for the error of a
/// refusal), and checked against the reference's digest when it has one.
async fn fetch_manifest(
    remote: &Remote,
    auth: &Auth,
    withheld: Option<&str>,
    target: &str,
) -> Result<OciManifest, OciError> {
    let Remote { reference, registry, .. } = remote;
    let named = reference.digest().or(reference.tag()).unwrap_or("latest");
    let mut path = format!("v2/{}/manifests/{named}", reference.repository());
    if let Some(ns) = reference.namespace() {
        path.push_str(&format!("?ns={ns}"));
    }
    let too_large = |_| OciError::ManifestTooLarge { reference: target.to_owned(), limit: MAX_MANIFEST_BYTES };
    let what = format!("the manifest of {target}");
    let (status, body) =
        registry.get(&path, auth, &MANIFEST_ACCEPT.join(", "), MAX_MANIFEST_BYTES, &what, too_large).await?;
    if !status.is_success() {
        let refused = fetch::refusal(&what, status, &body);
        return Err(match withheld {
            Some(realm) if matches!(status.as_u16(), 401 | 403) => OciError::Registry(format!(
                "{refused} (the registry's credentials were not sent to its token service {realm}: only the \
                 registry's own origin gets them)"
            )),
            _ => refused,
        });
    }
    // Pulled by digest: the manifest must be the one named (the registry could serve any).
    let actual = format!("sha256:{}", sha256_hex(&body));
    if let Some(expected) = reference.digest()
        && !expected.eq_ignore_ascii_case(&actual)
    {
        return Err(OciError::ManifestDigestMismatch { expected: expected.to_owned(), actual });
    }
    serde_json::from_slice::<OciManifest>(&body).map_err(|e| OciError::NotWasm {
        reference: target.to_owned(),
        reason: format!("the manifest is not an OCI manifest: {e}"),
    })
}

/// Fetches the artifact at `target`, verifies it (layout, size, digest, component, then
/// the pin, trust and signature rules of `plugins`, then that it does not roll the
/// installed plugin back unless `allow_downgrade`), and installs it atomically into `dir`
/// as `ID.wasm` (`id`, else the repository's last segment; a layer titled otherwise needs
/// `id`).
pub async fn pull(
    target: &str,
    insecure: bool,
    credentials: &Credentials,
    id: Option<&str>,
    dir: &Path,
    plugins: &PluginsConfig,
    allow_downgrade: bool,
) -> Result<Installed, OciError> {
    bounded(format!("pulling {target}"), async {
        let remote = connect(target, insecure, credentials)?;
        let reference = &remote.reference;
        let scope = format!("repository:{}:pull", reference.repository());
        let authorized = remote.registry.authorize(&scope).await?;
        let auth = &authorized.auth;
        let manifest = fetch_manifest(&remote, auth, authorized.withheld.as_deref(), target).await?;
        let not_wasm = |reason: String| OciError::NotWasm { reference: target.to_owned(), reason };
        let OciManifest::Image(manifest) = manifest else {
            return Err(not_wasm("an image index, not one artifact manifest".into()));
        };
        if manifest.config.media_type != WASM_CONFIG_MEDIA_TYPE {
            return Err(not_wasm(format!(
                "config media type {:?}, expected {WASM_CONFIG_MEDIA_TYPE}",
                manifest.config.media_type
            )));
        }
        let [layer] = manifest.layers.as_slice() else {
            return Err(not_wasm(format!("{} layers, expected exactly one", manifest.layers.len())));
        };
        if layer.media_type != WASM_LAYER_MEDIA_TYPE {
            return Err(not_wasm(format!("layer media type {:?}, expected {WASM_LAYER_MEDIA_TYPE}", layer.media_type)));
        }
        let expected = layer
            .digest
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| not_wasm(format!("layer digest {:?} is not sha256", layer.digest)))?
            .to_ascii_lowercase();
        let limit = plugins.max_plugin_size;
        if u64::try_from(layer.size).unwrap_or(u64::MAX) > limit {
            return Err(OciError::TooLarge { size: layer.size.max(0) as u64, limit });
        }
        // The id (and so the grants it gets) is the operator's choice or the repository's
        // name; an artifact that calls itself something else must be named with --as, so it
        // cannot pick which installed plugin it replaces.
        let repository = reference.repository().rsplit('/').next().unwrap_or_default().to_owned();
        let id = match id {
            Some(id) => id.to_owned(),
            None => match layer.annotations.as_ref().and_then(|a| a.get(TITLE_ANNOTATION)) {
                Some(title) if title.strip_suffix(".wasm") != Some(repository.as_str()) => {
                    return Err(OciError::AmbiguousId {
                        title: title.chars().take(MAX_ID_LEN + 8).collect(),
                        repository,
                    });
                }
                _ => repository,
            },
        };
        if !valid_id(&id) {
            return Err(OciError::BadId(id));
        }
        let sig = manifest.annotations.as_ref().and_then(|a| a.get(SIGNATURE_ANNOTATION)).cloned();
        if sig.as_ref().is_some_and(|s| s.len() as u64 > provenance::MAX_SIG_FILE) {
            return Err(not_wasm(format!(
                "the {SIGNATURE_ANNOTATION} annotation is longer than {} bytes",
                provenance::MAX_SIG_FILE
            )));
        }

        // The blob, bounded, its digest verified (the registry may be lying or altered).
        // Only from the registry (or where it redirects, checked): a layer's `urls`
        // (foreign layers) are never fetched.
        let what = format!("the layer of {target}");
        let bytes = remote.registry.blob(reference.repository(), &layer.digest, auth, limit, &what).await?;
        let sha256 = sha256_hex(&bytes);
        debug_assert_eq!(sha256, expected);
        if !is_component(&bytes) {
            return Err(OciError::NotAComponent(target.to_owned()));
        }
        // The rules of loading, through the same check (see `Registry::load_file`).
        let rules = provenance::Rules {
            id: &id,
            trust: &plugins.trust,
            require_signature: plugins.require_signature,
            pin: plugins.pins.get(&id).map(String::as_str),
        };
        let shown = format!("signature annotation {SIGNATURE_ANNOTATION} of {target}");
        let signed = provenance::check_bytes(&bytes, sig.as_deref(), &shown, &rules)?;

        let path = dir.join(format!("{id}.wasm"));
        let replaced = path.exists();
        if replaced {
            // The installed version is the floor: an older signed build (a moved tag, a
            // registry serving what it once had) or a stripped signature is a rollback.
            let installed = provenance::read_sig_file(&path)?;
            provenance::check_upgrade(&id, installed.as_deref(), signed.as_ref(), allow_downgrade)?;
        }
        install(dir, &id, &bytes, sig.as_deref())
            .map_err(|e| OciError::Io(format!("installing {}: {e}", path.display())))?;
        let version = signed.as_ref().map(|s| s.statement.version.as_str()).unwrap_or("");
        tracing::info!(%target, plugin = %id, %sha256, signed = signed.is_some(), version, replaced, "plugin pulled");
        Ok(Installed { id, path, sha256, signed, replaced })
    })
    .await
}

/// Writes `ID.wasm` (and `ID.wasm.sig`, or removes a stale one) into `dir` atomically:
/// each is written in full to a hidden temporary file there (named so the watcher ignores
/// it), flushed, then renamed over the old one — the signature first, so the component
/// never appears without the signature it came with.
fn install(dir: &Path, id: &str, bytes: &[u8], sig: Option<&str>) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir)?;
    let staged = |contents: &[u8], name: &str| -> std::io::Result<tempfile::NamedTempFile> {
        let mut tmp = tempfile::Builder::new().prefix(&format!(".{name}.")).suffix(".partial").tempfile_in(dir)?;
        // Readable by a `warden serve` running as another user (tempfile creates 0600).
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            tmp.as_file().set_permissions(std::fs::Permissions::from_mode(INSTALLED_MODE))?;
        }
        tmp.write_all(contents)?;
        tmp.as_file().sync_all()?;
        Ok(tmp)
    };
    let wasm_name = format!("{id}.wasm");
    let wasm = staged(bytes, &wasm_name)?;
    let sig_target = provenance::sig_path(&dir.join(&wasm_name));
    match sig {
        Some(text) => {
            let tmp =
                staged(format!("{}\n", text.trim()).as_bytes(), &format!("{wasm_name}{}", provenance::SIG_SUFFIX))?;
            tmp.persist(&sig_target).map_err(|e| e.error)?;
        }
        None => match std::fs::remove_file(&sig_target) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        },
    }
    wasm.persist(dir.join(&wasm_name)).map_err(|e| e.error)?;
    // The renames themselves reach the disk.
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_need_the_scheme_and_a_registry_and_plain_http_only_to_loopback() {
        assert!(connect("oci://127.0.0.1:5000/warden/echo:1.0", true, &Credentials::anonymous()).is_ok());
        assert!(connect("oci://localhost:5000/echo:1", true, &Credentials::anonymous()).is_ok());
        assert!(connect("oci://ghcr.io/acme/echo:1", false, &Credentials::anonymous()).is_ok());
        assert!(matches!(
            connect("oci://ghcr.io/acme/echo:1", true, &Credentials::anonymous()),
            Err(OciError::InsecureRemote(_))
        ));
        assert!(matches!(
            connect("oci://10.0.0.1:5000/echo:1", true, &Credentials::anonymous()),
            Err(OciError::InsecureRemote(_))
        ));
        assert!(matches!(
            connect("127.0.0.1:5000/echo:1", true, &Credentials::anonymous()),
            Err(OciError::BadReference(_))
        ));
        // No registry: the parser would assume Docker Hub.
        assert!(matches!(
            connect("oci://acme/echo:1", false, &Credentials::anonymous()),
            Err(OciError::BadReference(_))
        ));
    }

    #[test]
    fn ids_are_plain_file_names() {
        for ok in ["echo", "my-plugin_2", "a.b"] {
            assert!(valid_id(ok), "{ok}");
        }
        for bad in ["", ".hidden", "../x", "a/b", "a b", &"x".repeat(MAX_ID_LEN + 1)] {
            assert!(!valid_id(bad), "{bad}");
        }
    }

    #[test]
    fn components_are_told_from_core_modules() {
        assert!(is_component(b"\0asm\x0d\x00\x01\x00rest"));
        assert!(!is_component(b"\0asm\x01\x00\x00\x00rest"));
        assert!(!is_component(b"\0as"));
    }

    /// A registry on this machine serving `app`; its port.
    async fn serve(app: axum::Router) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        port
    }

    async fn pull_from(port: u16, repo: &str) -> Result<Installed, OciError> {
        let dir = tempfile::tempdir().unwrap();
        let target = format!("oci://127.0.0.1:{port}/{repo}");
        pull(&target, true, &Credentials::anonymous(), None, dir.path(), &PluginsConfig::default(), false).await
    }

    /// `pull` read the manifest through oci-client, which reads a response whole: a
    /// registry named on the command line could stream gigabytes as a "manifest".
    #[tokio::test]
    async fn regression_a_manifest_is_read_within_max_manifest_bytes() {
        use axum::routing::get;
        // 8 MiB of JSON whitespace, streamed without a length in 64 KiB pieces ...
        let streamed = || async {
            let piece = |_| Ok::<_, std::io::Error>(vec![b' '; 64 * 1024]);
            axum::body::Body::from_stream(futures_util::stream::iter((0..128).map(piece)))
        };
        let app = axum::Router::new()
            .route("/v2/", get(|| async { "{}" }))
            .route("/v2/x/streamed/manifests/1", get(streamed))
            // ... or with a length past the limit, refused before reading.
            .route("/v2/x/declared/manifests/1", get(|| async { vec![b' '; (MAX_MANIFEST_BYTES + 1) as usize] }));
        let port = serve(app).await;
        for repo in ["x/streamed:1", "x/declared:1"] {
            match pull_from(port, repo).await {
                Err(e @ OciError::ManifestTooLarge { .. }) => {
                    assert!(e.to_string().contains(&format!("more than {MAX_MANIFEST_BYTES} bytes")), "{e}")
                }
                other => panic!("{repo}: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_manifest_pulled_by_digest_is_that_digest_and_errors_quote_the_registry_escaped() {
        use axum::routing::get;
        let app = axum::Router::new()
            .route("/v2/", get(|| async { "{}" }))
            .route("/v2/x/echo/manifests/{reference}", get(|| async { r#"{"schemaVersion":2}"# }))
            .route(
                "/v2/x/gone/manifests/1",
                get(|| async { (axum::http::StatusCode::NOT_FOUND, "no such manifest\n\u{1b}[2Jforged") }),
            );
        let port = serve(app).await;
        let named = format!("sha256:{}", "0".repeat(64));
        match pull_from(port, &format!("x/echo@{named}")).await {
            Err(OciError::ManifestDigestMismatch { expected, actual }) => {
                assert_eq!(expected, named);
                assert_eq!(actual, format!("sha256:{}", sha256_hex(br#"{"schemaVersion":2}"#)));
            }
            other => panic!("{other:?}"),
        }
        let e = pull_from(port, "x/gone:1").await.unwrap_err().to_string();
        assert!(e.contains("404") && e.contains("no such manifest\\n\\u{1b}[2Jforged"), "{e}");
    }

    /// A plugin artifact: its manifest (JSON) and its one layer (a component header).
    fn artifact() -> (String, Vec<u8>) {
        let blob = b"\0asm\x0d\x00\x01\x00 a component".to_vec();
        let digest = format!("sha256:{}", sha256_hex(&blob));
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": { "mediaType": WASM_CONFIG_MEDIA_TYPE, "digest": digest, "size": blob.len() },
            "layers": [{ "mediaType": WASM_LAYER_MEDIA_TYPE, "digest": digest, "size": blob.len() }],
        });
        (manifest.to_string(), blob)
    }

    /// The `Authorization` headers (or `-` for none) requests to a route came with.
    type Seen = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

    fn record(seen: &Seen, headers: &axum::http::HeaderMap) {
        let auth = headers.get("authorization").map(|v| v.to_str().unwrap_or("?").to_owned());
        seen.lock().unwrap().push(auth.unwrap_or_else(|| "-".into()));
    }

    /// A registry serving [`artifact`] at `x/echo:1`, its blob through `blob` (given the
    /// request's headers), with a Bearer challenge naming `realm` (`{port}` replaced by
    /// the registry's port) when there is one, and the routes of `extra`.
    async fn hostile_registry<F>(realm: Option<String>, blob: F, extra: axum::Router) -> u16
    where
        F: Fn(axum::http::HeaderMap) -> axum::response::Response + Clone + Send + Sync + 'static,
    {
        use axum::response::IntoResponse;
        use axum::routing::get;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (manifest, _) = artifact();
        let challenge =
            realm.map(|r| format!("Bearer realm=\"{}\",service=\"test\"", r.replace("{port}", &port.to_string())));
        let app = axum::Router::new()
            .route(
                "/v2/",
                get(move || {
                    let challenge = challenge.clone();
                    async move {
                        match challenge {
                            Some(c) => {
                                (axum::http::StatusCode::UNAUTHORIZED, [("www-authenticate", c)]).into_response()
                            }
                            None => "{}".into_response(),
                        }
                    }
                }),
            )
            .route("/v2/x/echo/manifests/1", get(move || async move { manifest }))
            .route("/v2/x/echo/blobs/{digest}", get(move |h: axum::http::HeaderMap| async move { blob(h) }))
            .merge(extra);
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        port
    }

    async fn pull_with(port: u16, credentials: &Credentials) -> Result<Installed, OciError> {
        let dir = tempfile::tempdir().unwrap();
        let target = format!("oci://127.0.0.1:{port}/x/echo:1");
        pull(&target, true, credentials, None, dir.path(), &PluginsConfig::default(), false).await
    }

    fn the_blob(_: axum::http::HeaderMap) -> axum::response::Response {
        use axum::response::IntoResponse;
        artifact().1.into_response()
    }

    /// Regression: the token was read by oci-client, whole: a token service streaming
    /// 300 MiB drove `warden plugin pull` past 1.2 GB of memory (and the "token" was sent
    /// back as a header). Now a token response is cut at MAX_TOKEN_BYTES.
    #[tokio::test]
    async fn regression_a_token_endpoint_streaming_hundreds_of_megabytes_is_cut_at_max_token_bytes() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let served = std::sync::Arc::new(AtomicUsize::new(0));
        let token = {
            let served = served.clone();
            move || {
                let served = served.clone();
                async move {
                    // 64 MiB of a JSON string, without a length, in 64 KiB pieces.
                    let piece = move |_| {
                        served.fetch_add(64 * 1024, Ordering::Relaxed);
                        Ok::<_, std::io::Error>(vec![b'a'; 64 * 1024])
                    };
                    let head = futures_util::stream::iter([Ok(b"{\"token\":\"".to_vec())]);
                    axum::body::Body::from_stream(futures_util::StreamExt::chain(
                        head,
                        futures_util::stream::iter((0..1024).map(piece)),
                    ))
                }
            }
        };
        let realm_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let realm = format!("http://127.0.0.1:{}/token", realm_listener.local_addr().unwrap().port());
        let app = axum::Router::new().route("/token", axum::routing::get(token));
        tokio::spawn(async move { axum::serve(realm_listener, app).await.unwrap() });
        let port = hostile_registry(Some(realm), the_blob, axum::Router::new()).await;
        let e = pull_with(port, &Credentials::anonymous()).await.unwrap_err().to_string();
        assert!(e.contains(&format!("more than {MAX_TOKEN_BYTES} bytes")), "{e}");
        let served = served.load(Ordering::Relaxed);
        // The attack ran (the stream was served from), and stopped near the limit (socket
        // buffers hold a few megabytes at most), far from its 64 MiB.
        assert!(served > 0 && served < 16 * 1024 * 1024, "{served} bytes served");
    }

    /// A token service at `/token` recording the `Authorization` of each request.
    fn token_route(seen: Seen) -> axum::Router {
        axum::Router::new().route(
            "/token",
            axum::routing::get(move |h: axum::http::HeaderMap| async move {
                record(&seen, &h);
                r#"{"token":"from-the-realm"}"#
            }),
        )
    }

    /// Regression: oci-client sent the operator's registry credentials (HTTP Basic) to
    /// whatever token realm the registry's challenge named — another host included. Now
    /// only a realm on the registry's own origin gets them; another is asked anonymously.
    #[tokio::test]
    async fn regression_registry_credentials_are_not_sent_to_a_token_realm_on_another_host() {
        // Another origin (another port of the registry's address, so it may be reached).
        let elsewhere: Seen = Default::default();
        let realm_port = hostile_registry(None, the_blob, token_route(elsewhere.clone())).await;
        let realm = format!("http://127.0.0.1:{realm_port}/token");
        let port = hostile_registry(Some(realm), the_blob, axum::Router::new()).await;
        let credentials = Credentials::for_host(&format!("127.0.0.1:{port}"), "operator", "s3cret");
        pull_with(port, &credentials).await.expect("an anonymous token pulls a public artifact");
        let seen = elsewhere.lock().unwrap().clone();
        assert!(!seen.is_empty(), "the realm elsewhere was asked for a token");
        assert!(seen.iter().all(|a| a == "-"), "credentials reached another host: {seen:?}");

        // Positive control: a realm on the registry's own origin gets them (the test sees
        // credentials where they are sent).
        let own: Seen = Default::default();
        let realm = "http://127.0.0.1:{port}/token".to_owned();
        let port = hostile_registry(Some(realm), the_blob, token_route(own.clone())).await;
        let credentials = Credentials::for_host(&format!("127.0.0.1:{port}"), "operator", "s3cret");
        pull_with(port, &credentials).await.unwrap();
        use base64::Engine;
        let basic = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("operator:s3cret"));
        assert_eq!(own.lock().unwrap().clone(), vec![basic]);
    }

    /// Regression: oci-client followed a blob's redirect anywhere — to an internal address
    /// too — and fetched it. Now a redirect is followed only to the registry's origin or to
    /// addresses the registry's own reach allows (public ones; here also 127.0.0.1, the
    /// registry's), and never with credentials.
    #[tokio::test]
    async fn regression_a_blob_redirected_to_an_internal_address_is_not_fetched() {
        use axum::response::{IntoResponse, Redirect};
        use std::sync::atomic::{AtomicUsize, Ordering};
        // An internal service on another loopback address, serving the right bytes.
        let hits = std::sync::Arc::new(AtomicUsize::new(0));
        let internal = tokio::net::TcpListener::bind("127.0.0.2:0").await.expect("127.0.0.2 is a loopback address");
        let internal_url = format!("http://127.0.0.2:{}/blob", internal.local_addr().unwrap().port());
        let counted = hits.clone();
        let app = axum::Router::new().route(
            "/blob",
            axum::routing::get(move || async move {
                counted.fetch_add(1, Ordering::Relaxed);
                artifact().1
            }),
        );
        tokio::spawn(async move { axum::serve(internal, app).await.unwrap() });
        for target in [internal_url.clone(), "http://169.254.169.254/latest/meta-data".to_owned()] {
            let to = target.clone();
            let redirect = move |_| Redirect::temporary(&to).into_response();
            let port = hostile_registry(None, redirect, axum::Router::new()).await;
            let e = pull_with(port, &Credentials::anonymous()).await.unwrap_err().to_string();
            assert!(e.contains("refused") && e.contains("internal address"), "{target}: {e}");
        }
        assert_eq!(hits.load(Ordering::Relaxed), 0, "the internal address was fetched");
        // Positive control: the internal service answers when asked directly ...
        assert!(reqwest::get(&internal_url).await.unwrap().status().is_success());
        // ... and a redirect to the registry's storage is followed, without the credentials
        // the registry itself was sent.
        let storage: Seen = Default::default();
        let seen = storage.clone();
        let stored = axum::Router::new().route(
            "/storage/blob",
            axum::routing::get(move |h: axum::http::HeaderMap| async move {
                record(&seen, &h);
                artifact().1
            }),
        );
        let port = hostile_registry(None, |_| Redirect::temporary("/storage/blob").into_response(), stored).await;
        let credentials = Credentials::for_host(&format!("127.0.0.1:{port}"), "operator", "s3cret");
        pull_with(port, &credentials).await.unwrap();
        assert_eq!(storage.lock().unwrap().clone(), vec!["-".to_owned()]);
    }

    #[test]
    fn install_replaces_atomically_and_drops_a_stale_signature() {
        let dir = tempfile::tempdir().unwrap();
        install(dir.path(), "p", b"one", Some("ed25519 aa bb")).unwrap();
        assert_eq!(std::fs::read(dir.path().join("p.wasm")).unwrap(), b"one");
        assert_eq!(std::fs::read_to_string(dir.path().join("p.wasm.sig")).unwrap(), "ed25519 aa bb\n");
        install(dir.path(), "p", b"two", None).unwrap();
        assert_eq!(std::fs::read(dir.path().join("p.wasm")).unwrap(), b"two");
        assert!(!dir.path().join("p.wasm.sig").exists());
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("p.wasm")]);
    }
}
