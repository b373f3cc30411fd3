//! Binary-safe file transfer through Docker's archive API (tar up, tar down).
//!
//! Files never pass through a shell or an exec's output stream, so every byte survives.
//! This module must never be called with a path that `workspace::resolve` has not
//! confined, and never accept more than the caller's byte limit from the engine.

use std::io::Read;

use bollard::Docker;
use bollard::query_parameters::{DownloadFromContainerOptions, UploadToContainerOptions};
use futures_util::StreamExt;

use crate::error::{SandboxError, docker_status};

/// Slack over the file size allowed for tar headers and padding when downloading.
const TAR_OVERHEAD: u64 = 64 * 1024;

/// A tar archive holding one regular file `name` (no directories) with the given owner.
pub(crate) fn pack_file(
    name: &str,
    data: &[u8],
    mode: u32,
    uid: u64,
    gid: u64,
) -> Result<Vec<u8>, SandboxError> {
    let err = |e: std::io::Error| SandboxError::File {
        path: name.to_string(),
        message: format!("cannot pack: {e}"),
    };
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(data.len() as u64);
    header.set_mode(mode & 0o7777);
    header.set_uid(uid);
    header.set_gid(gid);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    header.set_mtime(now);
    let mut builder = tar::Builder::new(Vec::with_capacity(data.len() + 2048));
    builder.append_data(&mut header, name, data).map_err(err)?;
    builder.into_inner().map_err(err)
}

/// The contents of the first regular file in a tar archive.
pub(crate) fn unpack_file(path: &str, tar_bytes: &[u8]) -> Result<Vec<u8>, SandboxError> {
    let err = |m: String| SandboxError::File {
        path: path.to_string(),
        message: m,
    };
    let mut archive = tar::Archive::new(tar_bytes);
    let entries = archive
        .entries()
        .map_err(|e| err(format!("bad archive from engine: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| err(format!("bad archive from engine: {e}")))?;
        if entry.header().entry_type().is_file() {
            let mut out = Vec::with_capacity(entry.size() as usize);
            entry
                .read_to_end(&mut out)
                .map_err(|e| err(format!("cannot read archive: {e}")))?;
            return Ok(out);
        }
    }
    Err(err("not a regular file".into()))
}

/// Downloads one file's bytes; `max` bounds the file size.
pub(crate) async fn download(
    docker: &Docker,
    container: &str,
    path: &str,
    max: u64,
) -> Result<Vec<u8>, SandboxError> {
    let opts = DownloadFromContainerOptions {
        path: path.to_string(),
    };
    let mut stream = docker.download_from_container(container, Some(opts));
    let mut buf = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| match docker_status(&e) {
            Some(404) => SandboxError::File {
                path: path.to_string(),
                message: "does not exist".into(),
            },
            _ => SandboxError::from_docker("download file", e),
        })?;
        buf.extend_from_slice(&chunk);
        if buf.len() as u64 > max + TAR_OVERHEAD {
            return Err(SandboxError::File {
                path: path.to_string(),
                message: format!("larger than the {max}-byte limit"),
            });
        }
    }
    unpack_file(path, &buf)
}

/// Uploads a tar archive and extracts it into directory `dir`.
pub(crate) async fn upload(
    docker: &Docker,
    container: &str,
    dir: &str,
    tar_bytes: Vec<u8>,
) -> Result<(), SandboxError> {
    let opts = UploadToContainerOptions {
        path: dir.to_string(),
        // Refuse to replace a directory with a file (or the reverse).
        no_overwrite_dir_non_dir: Some("true".into()),
        ..Default::default()
    };
    docker
        .upload_to_container(container, Some(opts), bollard::body_full(tar_bytes.into()))
        .await
        .map_err(|e| SandboxError::File {
            path: dir.to_string(),
            message: format!("upload failed: {e}"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_binary() {
        let data: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
        let t = pack_file("x.bin", &data, 0o644, 1000, 1000).unwrap();
        assert_eq!(unpack_file("x.bin", &t).unwrap(), data);
    }
}
