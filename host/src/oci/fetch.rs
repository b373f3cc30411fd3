//! The one HTTP client for everything warden fetches from an OCI registry — bearer
//! tokens, manifests, blobs — so the rules below hold on every path and cannot be
//! forgotten at a new one. It owns the registry's trust boundary; it never decides what
//! an artifact may be (layout, signature, rollback: that is [`super`]'s).
//!
//! - **Every response is bounded** before it is read whole: a token within
//!   [`MAX_TOKEN_BYTES`], a manifest within [`super::MAX_MANIFEST_BYTES`], a blob within
//!   the caller's limit (`plugins.max_plugin_size`), an error body within
//!   [`MAX_ERROR_BODY`]. A declared length past the limit is refused before reading.
//! - **Credentials go to the registry's own origin only** (the scheme, host and port the
//!   operator's `WARDEN_REGISTRY_HOST` names): a token realm there gets them; a realm the
//!   registry's challenge names elsewhere is asked anonymously (public repositories still
//!   pull; a private one fails with the registry's refusal, saying the credentials were
//!   withheld). Refusing such realms outright would break anonymous pulls from registries
//!   whose token service has its own host (Docker Hub's `auth.docker.io`), while sending
//!   the credentials there would hand them to any host a hostile registry names.
//! - **Anywhere but the registry's origin is address-checked**: a token realm or a blob
//!   redirect elsewhere may reach public addresses only, or the registry's own internal
//!   address when the registry itself is named by one ([`Reach::named`], the check the
//!   plugins' `http` allow-list uses: `127.0.0.1` opens `127.0.0.1`, `localhost` loopback,
//!   a name nothing). Names are checked on the address connected to (the resolver), address
//!   literals before sending; such requests never use a proxy, which would resolve names
//!   where the check cannot see. HTTPS only, unless the registry itself is plain HTTP on
//!   this machine (`--insecure`).
//! - **Redirects only for blobs** (registries hand them out to storage), at most
//!   [`MAX_BLOB_REDIRECTS`], each hop checked as above, **never with credentials**; a
//!   token or manifest answered with a redirect is an error.
//! - **Digests are always verified**: a blob's bytes against the digest it was asked by
//!   (here, while streaming); a manifest pulled by digest against it (in [`super`]).

use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_LENGTH, LOCATION, WWW_AUTHENTICATE};
use reqwest::{StatusCode, Url};
use sha2::{Digest, Sha256};

use super::{OciError, READ_TIMEOUT, chain};
use crate::capability::Reach;

/// Largest token response read. A registry token is a JWT or an opaque string of a few
/// kilobytes (Docker Hub, GHCR, GitLab, Harbor: 1-4 KiB); 64 KiB leaves room for tokens
/// carrying many scopes, while a token service streaming hundreds of megabytes (which
/// warden once read whole, then sent back as a header) is cut off here.
pub const MAX_TOKEN_BYTES: u64 = 64 * 1024;
/// Largest error body read from a registry (only quoted, cut to a few hundred bytes).
pub const MAX_ERROR_BODY: u64 = 16 * 1024;
/// Redirects followed for one blob: a registry sends a blob to its storage (S3, a CDN)
/// with one, sometimes two; a longer chain is not storage.
pub const MAX_BLOB_REDIRECTS: usize = 3;

/// How a request to the registry is authorized.
#[derive(Clone)]
pub enum Auth {
    Anonymous,
    /// The operator's credentials, as HTTP Basic: only ever to the registry's origin.
    Basic(String, String),
    /// A token from the registry's token service.
    Bearer(String),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Auth::Anonymous => "Anonymous",
            Auth::Basic(..) => "Basic(redacted)",
            Auth::Bearer(_) => "Bearer(redacted)",
        })
    }
}

/// The token and how it was got: `withheld` names a token realm that was not given the
/// credentials (it is not the registry's origin), for the error a refusal then gets.
#[derive(Debug)]
pub struct Authorized {
    pub auth: Auth,
    pub withheld: Option<String>,
}

/// The registry client: see the module docs.
pub struct RegistryClient {
    /// `scheme://host[:port]/` of the registry.
    origin: Url,
    /// The internal addresses requests elsewhere may reach (the registry's own, if any).
    reach: Reach,
    insecure: bool,
    /// The operator's credentials, when they are for this registry.
    credentials: Option<(String, String)>,
    /// To the registry's origin: the operator named it (its proxy settings apply, except
    /// for a plain-HTTP registry on this machine).
    direct: reqwest::Client,
    /// Anywhere else: no proxy, every address checked.
    elsewhere: reqwest::Client,
}

impl RegistryClient {
    /// A client for `registry` (`host[:port]`), plain HTTP when `insecure` (the caller has
    /// checked it is this machine), with `credentials` for it (or none).
    pub fn new(registry: &str, insecure: bool, credentials: Option<(String, String)>) -> Result<Self, OciError> {
        let scheme = if insecure { "http" } else { "https" };
        let origin = Url::parse(&format!("{scheme}://{registry}/"))
            .map_err(|e| OciError::BadReference(format!("{registry}: {e}")))?;
        let reach = Reach::named(origin.host_str().unwrap_or_default());
        let failed = |e: reqwest::Error| OciError::Registry(format!("cannot make an HTTP client: {}", chain(&e)));
        let mut direct = crate::http_client::operator_builder().read_timeout(READ_TIMEOUT).https_only(!insecure);
        if insecure {
            direct = direct.no_proxy();
        }
        let check: crate::services::AddressCheck = std::sync::Arc::new(move |host: &str, ip| {
            if reach.allows(host, ip) {
                Ok(())
            } else {
                Err(format!("refused: {host} is the internal address {ip}, not the registry's").into())
            }
        });
        let elsewhere = crate::http_client::builder()
            .read_timeout(READ_TIMEOUT)
            .https_only(!insecure)
            .dns_resolver(crate::services::CheckedResolver::new(check));
        Ok(RegistryClient {
            origin,
            reach,
            insecure,
            credentials,
            direct: direct.build().map_err(failed)?,
            elsewhere: elsewhere.build().map_err(failed)?,
        })
    }

    /// `scheme://registry/path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.origin, path.trim_start_matches('/'))
    }

    fn is_registry(&self, url: &Url) -> bool {
        url.origin() == self.origin.origin()
    }

    /// The client for a request to `url` after checking where it goes: the registry's
    /// origin, or elsewhere over HTTPS (plain HTTP only from an `--insecure` registry) to
    /// an address [`Self::reach`] allows.
    fn client_for(&self, url: &Url, what: &str) -> Result<&reqwest::Client, OciError> {
        if self.is_registry(url) {
            return Ok(&self.direct);
        }
        let refused = |why: String| OciError::Registry(format!("refused {what} at {url}: {why}"));
        match url.scheme() {
            "https" => {}
            "http" if self.insecure => {}
            other => return Err(refused(format!("scheme {other:?} (HTTPS only)"))),
        }
        let host = url.host_str().ok_or_else(|| refused("no host".into()))?;
        if let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>()
            && !self.reach.allows(host, ip)
        {
            return Err(refused(format!("{ip} is an internal address, not the registry's")));
        }
        Ok(&self.elsewhere)
    }

    /// A bearer token for `scope` (`repository:NAME:pull[,push]`), or how else to
    /// authorize: the registry's `/v2/` challenge names the token realm. Credentials go to
    /// a realm on the registry's origin only; elsewhere the token is asked anonymously.
    /// No challenge (an open registry), or a Basic one: the credentials as Basic, to the
    /// registry only.
    pub async fn authorize(&self, scope: &str) -> Result<Authorized, OciError> {
        let basic = || match &self.credentials {
            Some((user, password)) => Auth::Basic(user.clone(), password.clone()),
            None => Auth::Anonymous,
        };
        let v2 = self.url("v2/");
        let failed = |e: reqwest::Error| OciError::Registry(format!("reaching {v2}: {}", chain(&e)));
        let probe = self.direct.get(&v2).send().await.map_err(failed)?;
        let challenge =
            probe.headers().get_all(WWW_AUTHENTICATE).iter().find_map(|v| bearer_challenge(v.to_str().ok()?));
        // The probe's body is not needed (and not read: dropping the response closes it).
        drop(probe);
        let Some((realm, service)) = challenge else { return Ok(Authorized { auth: basic(), withheld: None }) };
        let mut url = Url::parse(&realm)
            .map_err(|e| OciError::Registry(format!("the registry's token realm {realm:?} is not a URL: {e}")))?;
        {
            let mut query = url.query_pairs_mut();
            query.append_pair("scope", scope);
            if let Some(service) = &service {
                query.append_pair("service", service);
            }
        }
        let client = self.client_for(&url, "the token realm")?;
        let mut request = client.get(url.clone());
        let withheld = match &self.credentials {
            Some((user, password)) if self.is_registry(&url) => {
                request = request.basic_auth(user, Some(password));
                None
            }
            Some(_) => Some(realm.clone()),
            None => None,
        };
        let what = format!("the token from {}", url.origin().ascii_serialization());
        let response =
            request.send().await.map_err(|e| OciError::Registry(format!("fetching {what}: {}", chain(&e))))?;
        let (status, body) = read_bounded(response, MAX_TOKEN_BYTES, &what).await?;
        if !status.is_success() {
            return Err(refusal(&what, status, &body));
        }
        #[derive(serde::Deserialize)]
        struct TokenResponse {
            token: Option<String>,
            access_token: Option<String>,
        }
        let parsed: TokenResponse = serde_json::from_slice(&body)
            .map_err(|e| OciError::Registry(format!("{what} is not a token response: {e}")))?;
        let token = parsed
            .token
            .or(parsed.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| OciError::Registry(format!("{what}: the response has no token")))?;
        // Sent back as a header: visible ASCII only (no line break can smuggle another header).
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(OciError::Registry(format!("{what}: the token is not a header value")));
        }
        Ok(Authorized { auth: Auth::Bearer(token), withheld })
    }

    /// GET `path` on the registry with `auth`, the body read within `limit` (past it,
    /// the error `too_large` makes of the size seen). No redirect is followed (one is
    /// answered as it is).
    pub async fn get(
        &self,
        path: &str,
        auth: &Auth,
        accept: &str,
        limit: u64,
        what: &str,
        too_large: impl Fn(u64) -> OciError,
    ) -> Result<(StatusCode, Vec<u8>), OciError> {
        let request = authorized(self.direct.get(self.url(path)).header(ACCEPT, accept), auth);
        let response =
            request.send().await.map_err(|e| OciError::Registry(format!("fetching {what}: {}", chain(&e))))?;
        read_bounded_with(response, limit, what, too_large).await
    }

    /// The blob `digest` (`sha256:HEX`, checked by the caller) of `repository`, at most
    /// `limit` bytes, its SHA-256 verified while it streams. The registry may redirect it
    /// (to its storage): each hop is checked ([`Self::client_for`]) and sent without
    /// credentials.
    pub async fn blob(
        &self,
        repository: &str,
        digest: &str,
        auth: &Auth,
        limit: u64,
        what: &str,
    ) -> Result<Vec<u8>, OciError> {
        let expected = digest.strip_prefix("sha256:").unwrap_or(digest).to_ascii_lowercase();
        let mut url = Url::parse(&self.url(&format!("v2/{repository}/blobs/{digest}")))
            .map_err(|e| OciError::Registry(format!("{what}: {e}")))?;
        let mut request = authorized(self.direct.get(url.clone()), auth);
        let mut hops = 0;
        let response = loop {
            let response =
                request.send().await.map_err(|e| OciError::Registry(format!("fetching {what}: {}", chain(&e))))?;
            if !response.status().is_redirection() {
                break response;
            }
            hops += 1;
            let location = response.headers().get(LOCATION).and_then(|l| l.to_str().ok());
            let next = location.and_then(|l| url.join(l).ok()).ok_or_else(|| {
                OciError::Registry(format!("{what}: a redirect ({}) without a usable Location", response.status()))
            })?;
            if hops > MAX_BLOB_REDIRECTS {
                return Err(OciError::Registry(format!("{what}: more than {MAX_BLOB_REDIRECTS} redirects")));
            }
            // Never with credentials, wherever it goes (a pre-signed storage URL needs none).
            request = self.client_for(&next, what)?.get(next.clone());
            url = next;
        };
        let status = response.status();
        if !status.is_success() {
            let (_, body) = read_bounded(response, MAX_ERROR_BODY, what).await?;
            return Err(refusal(what, status, &body));
        }
        let (_, bytes) = read_bounded_with(response, limit, what, |size| OciError::TooLarge { size, limit }).await?;
        let actual = hex::encode(Sha256::digest(&bytes));
        if actual != expected {
            return Err(OciError::DigestMismatch { expected: digest.to_owned(), actual: format!("sha256:{actual}") });
        }
        Ok(bytes)
    }
}

/// `request` with `auth` (to the registry only: callers never pass another host's request).
fn authorized(request: reqwest::RequestBuilder, auth: &Auth) -> reqwest::RequestBuilder {
    match auth {
        Auth::Anonymous => request,
        Auth::Basic(user, password) => request.basic_auth(user, Some(password)),
        Auth::Bearer(token) => request.header(AUTHORIZATION, format!("Bearer {token}")),
    }
}

/// The `realm` and `service` of a `Bearer` challenge in `header`, if it has one.
fn bearer_challenge(header: &str) -> Option<(String, Option<String>)> {
    http_auth::ChallengeParser::new(header).filter_map(Result::ok).find_map(|c| {
        if !c.scheme.eq_ignore_ascii_case("Bearer") {
            return None;
        }
        let param =
            |name: &str| c.params.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.to_unescaped());
        Some((param("realm")?, param("service")))
    })
}

/// An error for a registry's refusal, quoting its body escaped and cut.
pub fn refusal(what: &str, status: StatusCode, body: &[u8]) -> OciError {
    let quoted =
        crate::text::escape_control(&crate::text::excerpt(&String::from_utf8_lossy(body), super::MAX_QUOTED_ERROR))
            .into_owned();
    let redirect = if status.is_redirection() { " (not fetched through a redirect)" } else { "" };
    OciError::Registry(format!("fetching {what}: {status}{redirect}: {quoted}"))
}

/// The status and body of `response`, the body at most `limit` bytes.
async fn read_bounded(response: reqwest::Response, limit: u64, what: &str) -> Result<(StatusCode, Vec<u8>), OciError> {
    let too_large = |_| OciError::Registry(format!("{what}: the response is more than {limit} bytes"));
    read_bounded_with(response, limit, what, too_large).await
}

/// [`read_bounded`] with the error for a body past `limit` (given the size seen).
async fn read_bounded_with(
    mut response: reqwest::Response,
    limit: u64,
    what: &str,
    too_large: impl Fn(u64) -> OciError,
) -> Result<(StatusCode, Vec<u8>), OciError> {
    let declared = response.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if let Some(n) = declared.filter(|n| *n > limit) {
        return Err(too_large(n));
    }
    let mut body = Vec::with_capacity(declared.unwrap_or(0).min(limit) as usize);
    while let Some(chunk) =
        response.chunk().await.map_err(|e| OciError::Registry(format!("reading {what}: {}", chain(&e))))?
    {
        let size = (body.len() + chunk.len()) as u64;
        if size > limit {
            return Err(too_large(size));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((response.status(), body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_challenges_are_parsed_and_others_ignored() {
        let (realm, service) =
            bearer_challenge(r#"Bearer realm="https://auth.example.com/token",service="registry.example.com""#)
                .unwrap();
        assert_eq!(
            (realm.as_str(), service.as_deref()),
            ("https://auth.example.com/token", Some("registry.example.com"))
        );
        assert!(bearer_challenge(r#"Basic realm="registry""#).is_none());
        assert!(bearer_challenge("Bearer service=\"x\"").is_none(), "no realm, no token request");
    }
}
