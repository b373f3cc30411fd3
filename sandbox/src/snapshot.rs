//! Named snapshots of a session's workspace (issue 50): what a snapshot is on the Docker
//! host, its name, its labels and the checks of its name.
//!
//! A snapshot is a stored copy of a session's workspace that no container mounts: a
//! labelled volume (`warden-snap-…`) holding a copy of the session's ext4 image (with
//! `sandbox.disk`; made by the same disk helper as a fork, copy-on-write where the Docker
//! host's file system supports it, sparse otherwise), or of its files (a plain volume,
//! `sandbox.disk: 0`). It holds the workspace and nothing else: no process, no shell state,
//! no environment, no secret of the session's tasks (they never reach the workspace image
//! from warden's side). A new session can start from it (`Sandbox::session_from_snapshot`),
//! which copies it again: the snapshot itself is never attached, so it never changes.
//!
//! Snapshots belong to a user (`warden.user`) and have a name unique for that user
//! ([`validate_name`]); the volume's name is derived from (scope, user, name) alone, so no
//! user's name can name another's snapshot. They outlive the session and the host that
//! made them: the leftover sweeps at connect and `prune` leave them alone ([`is_snapshot`]);
//! only a delete removes one.
//!
//! The sessions module builds the lifecycle on this (`Sandbox::snapshot_session`,
//! `list_snapshots`, `delete_snapshot`, `session_from_snapshot`) and applies the limits
//! (`sandbox.max_snapshots_per_user`, `sandbox.snapshot_disk_budget`).

use std::collections::HashMap;

use bollard::Docker;
use bollard::models::Volume;
use bollard::query_parameters::ListVolumesOptions;
use serde::Serialize;

use crate::config::SandboxConfig;
use crate::container::{LABEL_HOST, LABEL_MANAGED, LABEL_REPLICA, LABEL_SCOPE, LABEL_USER};
use crate::error::SandboxError;

/// Prefix of a snapshot volume's name.
pub(crate) const SNAPSHOT_PREFIX: &str = "warden-snap-";
/// Label: the snapshot's name (only snapshot volumes carry it).
pub const LABEL_SNAPSHOT: &str = "warden.snapshot";
/// Label: the id of the session the snapshot was taken of.
pub const LABEL_SNAPSHOT_OF: &str = "warden.snapshot_of";
/// Label: the volume is a session's end snapshot (`sandbox.snapshot_on_end`), not a named one.
pub const LABEL_SNAPSHOT_END: &str = "warden.snapshot_end";
/// Label: when the snapshot was taken, nanoseconds since the Unix epoch, zero-padded so
/// that the text sorts as the time (Docker's own creation time has whole seconds).
pub const LABEL_SNAPSHOT_TAKEN: &str = "warden.snapshot_taken";
/// Label: what the snapshot volume holds ([`Format`]).
pub const LABEL_SNAPSHOT_FORMAT: &str = "warden.snapshot_format";
/// Longest snapshot name: enough for a descriptive name or a date, short enough for a label
/// and a CLI line.
pub const MAX_SNAPSHOT_NAME_LEN: usize = 64;
/// Domain tag of the snapshot volume name digest: no snapshot's name can equal a session's.
const SNAPSHOT_DIGEST_DOMAIN: &[u8] = b"warden.sandbox.snapshot-names.v1";
/// Domain tag of an end snapshot's volume name (over scope, user and session id): never a
/// named snapshot's.
const END_SNAPSHOT_DIGEST_DOMAIN: &[u8] = b"warden.sandbox.end-snapshot-names.v1";

/// What a snapshot name must be, as error messages state it.
pub const SNAPSHOT_NAME_FORM: &str = "1-64 characters of ASCII letters, digits, `.`, `_` and `-`, starting with a letter or digit (e.g. `before-refactor`)";

/// What a snapshot volume holds: the workspace's kind when it was taken. A session starts
/// only from a snapshot of the kind its workspaces have now (`sandbox.disk` set or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// The ext4 image of a size-limited workspace (`workspace.ext4`, `sandbox.disk`).
    Ext4Image,
    /// The files of a plain workspace volume (`sandbox.disk: 0`).
    Files,
}

impl Format {
    /// The kind of workspace sessions under `cfg` have.
    pub(crate) fn of(cfg: &SandboxConfig) -> Format {
        if cfg.disk.0 == 0 { Format::Files } else { Format::Ext4Image }
    }

    /// The label value.
    fn as_str(self) -> &'static str {
        match self {
            Format::Ext4Image => "ext4-image",
            Format::Files => "files",
        }
    }
}

/// One snapshot as the API and the CLI show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SnapshotInfo {
    /// Its name (unique for its user).
    pub name: String,
    /// The user it belongs to.
    pub user_id: String,
    /// The session it was taken of.
    pub session_id: String,
    /// When it was taken (RFC 3339, as the Docker host reports its volume's creation).
    pub created_at: Option<String>,
    /// The Docker host (`sandbox.hosts[].endpoint`) that stores it.
    pub docker_host: String,
}

/// Checks a snapshot name: [`SNAPSHOT_NAME_FORM`]. A name is never a path, never empty,
/// never starts with `-` or `.` (no option, no hidden or relative name).
pub fn validate_name(name: &str) -> Result<(), SandboxError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_SNAPSHOT_NAME_LEN
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok { Ok(()) } else { Err(SandboxError::InvalidSnapshotName { name: shown(name), expected: SNAPSHOT_NAME_FORM }) }
}

/// A name as an error message may quote it: at most [`MAX_SNAPSHOT_NAME_LEN`] characters,
/// control characters escaped.
fn shown(name: &str) -> String {
    name.chars().take(MAX_SNAPSHOT_NAME_LEN).flat_map(char::escape_debug).collect()
}

/// The volume of `user`'s snapshot `name` in `scope`: `warden-snap-<scope>-<digest>`, the
/// digest being SHA-256 over the length-prefixed (scope, user, name) under its own domain
/// tag. Injective, as session names are.
pub(crate) fn volume_name(scope: &str, user: &str, name: &str) -> String {
    digest_name(SNAPSHOT_DIGEST_DOMAIN, [scope, user, name])
}

/// The volume of the end snapshot of `user`'s session `session` in `scope`
/// (`sandbox.snapshot_on_end`): `warden-snap-<scope>-<digest>` under its own domain tag.
pub(crate) fn end_volume_name(scope: &str, user: &str, session: &str) -> String {
    digest_name(END_SNAPSHOT_DIGEST_DOMAIN, [scope, user, session])
}

/// `warden-snap-<scope>-<SHA-256 over the length-prefixed parts under domain>`.
fn digest_name(domain: &[u8], [scope, user, name]: [&str; 3]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(domain);
    for part in [scope, user, name] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    format!("{SNAPSHOT_PREFIX}{scope}-{}", hex::encode(h.finalize()))
}

/// Labels of a snapshot volume: managed and scoped (so `docker volume ls` shows whose it
/// is), its user, name and source session — and no `warden.session` label: it is no
/// session's object, and no session's removal touches it.
pub(crate) fn labels(
    scope: &str,
    host: &str,
    replica: Option<&str>,
    (user, name, source_session): (&str, &str, &str),
    format: Format,
) -> HashMap<String, String> {
    let mut l = HashMap::from([
        (LABEL_MANAGED.to_string(), "true".to_string()),
        (LABEL_SCOPE.to_string(), scope.to_string()),
        (LABEL_HOST.to_string(), host.to_string()),
        (LABEL_USER.to_string(), user.to_string()),
        (LABEL_SNAPSHOT.to_string(), name.to_string()),
        (LABEL_SNAPSHOT_OF.to_string(), source_session.to_string()),
        (LABEL_SNAPSHOT_FORMAT.to_string(), format.as_str().to_string()),
        (LABEL_SNAPSHOT_TAKEN.to_string(), taken_now()),
    ]);
    l.extend(replica.map(|r| (LABEL_REPLICA.to_string(), r.to_string())));
    l
}

/// Refuses to start a session from the snapshot `volume` unless it holds `want` (a
/// snapshot taken before `sandbox.disk` was turned on or off).
pub(crate) async fn check_format(docker: &Docker, volume: &str, want: Format) -> Result<(), SandboxError> {
    let v = docker.inspect_volume(volume).await.map_err(|e| SandboxError::from_docker("inspect snapshot", e))?;
    let has = v.labels.get(LABEL_SNAPSHOT_FORMAT).map(String::as_str).unwrap_or_default();
    if has == want.as_str() {
        return Ok(());
    }
    Err(SandboxError::InvalidInput {
        tool: "snapshot".into(),
        message: format!(
            "the snapshot holds a workspace of kind `{has}`, and sessions here have `{}` (sandbox.disk changed since it was taken)",
            want.as_str()
        ),
    })
}

/// Labels of a session's end snapshot: as a named snapshot's, with
/// [`LABEL_SNAPSHOT_END`] instead of a name.
pub(crate) fn end_labels(
    scope: &str,
    host: &str,
    (user, session): (&str, &str),
    format: Format,
) -> HashMap<String, String> {
    let mut l = labels(scope, host, None, (user, "", session), format);
    l.remove(LABEL_SNAPSHOT);
    l.insert(LABEL_SNAPSHOT_END.to_string(), "true".to_string());
    l
}

/// The end snapshots of `scope` on one Docker host: (volume name, when taken as
/// [`LABEL_SNAPSHOT_TAKEN`] holds it), oldest first.
pub(crate) async fn list_end(docker: &Docker, scope: &str) -> Result<Vec<(String, String)>, SandboxError> {
    let label = vec![format!("{LABEL_SNAPSHOT_END}=true")];
    let volumes = scoped_volumes(docker, scope, label, "list end snapshots").await?;
    let mut out: Vec<(String, String)> = volumes
        .into_iter()
        .filter(|v| v.name.starts_with(SNAPSHOT_PREFIX))
        .map(|v| {
            let taken = v.labels.get(LABEL_SNAPSHOT_TAKEN).cloned().unwrap_or_default();
            (v.name, taken)
        })
        .collect();
    out.sort_by(|a, b| a.1.cmp(&b.1));
    Ok(out)
}

/// The managed volumes of `scope` that also carry every label filter of `label`
/// (`key` or `key=value`); errors name `action`.
async fn scoped_volumes(
    docker: &Docker,
    scope: &str,
    mut label: Vec<String>,
    action: &str,
) -> Result<Vec<Volume>, SandboxError> {
    label.extend([format!("{LABEL_MANAGED}=true"), format!("{LABEL_SCOPE}={scope}")]);
    let opts = ListVolumesOptions { filters: Some(HashMap::from([("label".to_string(), label)])) };
    docker
        .list_volumes(Some(opts))
        .await
        .map(|r| r.volumes.unwrap_or_default())
        .map_err(|e| SandboxError::from_docker(action, e))
}

/// Whether the end snapshot volume `name` exists on this Docker host.
pub(crate) async fn end_exists(docker: &Docker, name: &str) -> Result<bool, SandboxError> {
    match docker.inspect_volume(name).await {
        Ok(v) => Ok(v.labels.get(LABEL_SNAPSHOT_END).is_some_and(|x| x == "true")),
        Err(e) if crate::error::docker_status(&e) == Some(404) => Ok(false),
        Err(e) => Err(SandboxError::from_docker("inspect end snapshot", e)),
    }
}

/// Now as [`LABEL_SNAPSHOT_TAKEN`] holds it.
fn taken_now() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("{nanos:020}")
}

/// Whether a managed volume is a snapshot (which no leftover sweep removes).
pub(crate) fn is_snapshot(v: &Volume) -> bool {
    v.name.starts_with(SNAPSHOT_PREFIX) || v.labels.contains_key(LABEL_SNAPSHOT)
}

/// The snapshot a volume holds, when it is one of `scope` whose name is the one derived from
/// its labels (a volume that merely carries the labels is not believed).
fn info_of(scope: &str, v: &Volume, docker_host: &str) -> Option<SnapshotInfo> {
    let l = &v.labels;
    let user = l.get(LABEL_USER)?;
    let name = l.get(LABEL_SNAPSHOT)?;
    if l.get(LABEL_SCOPE).map(String::as_str) != Some(scope) || v.name != volume_name(scope, user, name) {
        return None;
    }
    Some(SnapshotInfo {
        name: name.clone(),
        user_id: user.clone(),
        session_id: l.get(LABEL_SNAPSHOT_OF).cloned().unwrap_or_default(),
        created_at: v.created_at.clone(),
        docker_host: docker_host.to_string(),
    })
}

/// The snapshots of `scope` on one Docker host, of `user` only when given, sorted by name.
pub(crate) async fn list(
    docker: &Docker,
    scope: &str,
    user: Option<&str>,
    docker_host: &str,
) -> Result<Vec<SnapshotInfo>, SandboxError> {
    let mut label = vec![LABEL_SNAPSHOT.to_string()];
    label.extend(user.map(|u| format!("{LABEL_USER}={u}")));
    let volumes = scoped_volumes(docker, scope, label, "list snapshots").await?;
    let mut out: Vec<SnapshotInfo> = volumes
        .iter()
        .filter_map(|v| info_of(scope, v, docker_host))
        .filter(|i| user.is_none_or(|u| i.user_id == u))
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "before-refactor", "v1.2_final", "2026-12-06", &"x".repeat(MAX_SNAPSHOT_NAME_LEN)] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-x", ".hidden", "..", "a/b", "a b", "é", "a\nb", &"x".repeat(MAX_SNAPSHOT_NAME_LEN + 1)] {
            let e = validate_name(bad).unwrap_err();
            assert!(e.to_string().contains(SNAPSHOT_NAME_FORM), "{e}");
        }
        assert!(!validate_name("a\nb").unwrap_err().to_string().contains('\n'));
    }

    #[test]
    fn volume_names_are_per_user_and_never_a_sessions() {
        let a = volume_name("s", "alice", "n");
        assert_ne!(a, volume_name("s", "bob", "n"));
        assert_ne!(a, volume_name("t", "alice", "n"));
        assert_ne!(volume_name("s", "al", "ice/n"), volume_name("s", "ali", "ce/n"));
        assert!(a.starts_with("warden-snap-s-"));
        let session = crate::container::names("s", &crate::session_key::SessionKey::new("alice", "n"));
        assert_ne!(a, session.volume);
    }
}
