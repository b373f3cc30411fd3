//! `resources`: definition files (`.md`) under the agent directories, allowed URLs,
//! built-ins.

use super::super::bindings::latest::{http, resources};
use super::journal::{Durability, Interrupted};
use super::{Error, HostState, ImportError, bounded};
use crate::capability::Capability;
use crate::journal::Import;
use crate::services::{MAX_RESOURCE_BYTES, MAX_URL_BYTES};

impl HostState {
    /// `resources.read` (the WIT error is made of its error by [`super::to_plugin`]).
    async fn resources_read(&mut self, uri: String) -> Result<Vec<u8>, Error> {
        self.check(Capability::Resources)?;
        bounded("the resource URI (bytes)", uri.len(), MAX_URL_BYTES)?;
        if uri.contains('\0') {
            return Err(Error::InvalidInput("the resource URI contains a NUL byte".into()));
        }
        if uri.starts_with("http://") || uri.starts_with("https://") {
            let req = http::Request {
                method: "GET".into(),
                url: uri,
                headers: vec![],
                body: None,
                timeout_ms: None,
                auth_secret: None,
            };
            let resp = self.http_send(req).await?;
            if !(200..300).contains(&resp.status) {
                return Err(Error::Remote(format!("resource fetch returned HTTP {}", resp.status)));
            }
            return Ok(resp.body);
        }
        if let Some(text) = crate::builtin::agent_text(&uri) {
            return text.map(|t| t.as_bytes().to_vec()).map_err(Error::NotFound);
        }
        let path = uri.strip_prefix("file://").unwrap_or(&uri).to_owned();
        let roots = self.scope.services.resource_roots.clone();
        let timeout = self.io_timeout(None)?;
        // File system calls block: off the async workers, bounded by the deadline.
        let read = tokio::task::spawn_blocking(move || read_resource_file(&path, &roots));
        match tokio::time::timeout(timeout, read).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => Err(Error::Internal(format!("reading the resource failed: {e}"))),
            Err(_) => Err(Error::Timeout("reading the resource timed out".into())),
        }
    }
}

impl resources::Host for HostState {
    async fn read(&mut self, uri: String) -> Result<Vec<u8>, ImportError> {
        let args = serde_json::json!({ "uri": &uri });
        self.journaled(Import::ResourcesRead, args, Durability::Queued, Interrupted::Rerun, move |s| {
            Box::pin(s.resources_read(uri))
        })
        .await
    }
}

/// The extension of the files `resources.read` reads: definition files (agents, skills),
/// as the registry lists them. An agent directory may hold other files (an operator may
/// point one at a project holding `.env`, `warden.yaml` or the task store); those are not
/// a plugin's to read.
const RESOURCE_EXTENSION: &str = "md";

/// Reads a regular `.md` file under one of `roots` (both checked on the path with every
/// symlink resolved), at most [`MAX_RESOURCE_BYTES`] (through [`crate::bounded_read`]: no
/// FIFO or device ever blocks a thread).
fn read_resource_file(path: &str, roots: &[std::path::PathBuf]) -> Result<Vec<u8>, Error> {
    let shown = crate::text::escape_control(path).into_owned();
    let canonical = std::fs::canonicalize(path).map_err(|e| Error::NotFound(format!("{shown}: {e}")))?;
    if !roots.iter().any(|r| canonical.starts_with(r)) {
        return Err(Error::Denied(format!(
            "capability `resources` denied: {shown} is outside the configured agent directories"
        )));
    }
    if canonical.extension().and_then(|e| e.to_str()) != Some(RESOURCE_EXTENSION) {
        return Err(Error::Denied(format!(
            "capability `resources` denied: {shown} is not a definition file (`.{RESOURCE_EXTENSION}`)"
        )));
    }
    use crate::bounded_read::{ReadError, read_regular};
    match read_regular(&canonical, MAX_RESOURCE_BYTES) {
        Ok(out) => Ok(out),
        Err(ReadError::Io(e)) => Err(Error::NotFound(format!("{shown}: {e}"))),
        Err(ReadError::NotRegular) => Err(Error::InvalidInput(format!("{shown} is not a regular file"))),
        Err(ReadError::TooLarge { size, grew: false }) => {
            Err(Error::InvalidInput(format!("{shown} is {size} bytes; the limit is {MAX_RESOURCE_BYTES}")))
        }
        Err(ReadError::TooLarge { grew: true, .. }) => {
            Err(Error::InvalidInput(format!("{shown} grew past the limit of {MAX_RESOURCE_BYTES} bytes")))
        }
    }
}
