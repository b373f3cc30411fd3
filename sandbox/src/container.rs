//! Creating, finding and removing hardened session containers and their workspace volumes.
//!
//! In every container made here sandboxed code runs as the non-root `sandbox.user` with no
//! capabilities (the container keeps only SETUID/SETGID, for its agents to drop from root
//! to that user); it sets no-new-privileges,
//! has a read-only root with a tmpfs /tmp, a labelled named volume at /workspace, the
//! configured network (none by default), pids/memory/CPU limits and an init process.
//! A container is made for a session (labelled with its key, named after it) or for the warm
//! pool (`pool.rs`: labelled `warden.pool`, named `warden-pool.…`, renamed to the session's
//! name when handed out, its key kept in a *binding* volume); both get the same body.
//! This module must never mount the Docker socket or any host path, never run a session
//! container privileged or add capabilities (the one capable container is the disk helper
//! of `disk.rs`, which never runs sandboxed code), and never touch containers or volumes without the
//! `warden.managed=true` label. Names are derived (and so predictable): an existing container
//! or volume under one is reused, attached or removed only when its labels prove it the
//! session's or the pool's (`Owner`); anything else is a [`SandboxError::NotOwned`].

use std::collections::HashMap;
use std::sync::Arc;

use bollard::Docker;
use bollard::models::{
    ContainerCreateBody, ContainerSummary, HostConfig, Mount, MountPoint, MountTypeEnum, Volume, VolumeCreateOptions,
};
use bollard::query_parameters::{
    CreateContainerOptions, InspectContainerOptions, ListContainersOptions, ListVolumesOptions, RemoveContainerOptions,
    RemoveVolumeOptions, RenameContainerOptions, StartContainerOptions,
};

use crate::config::SandboxConfig;
use crate::egress::{self, Egress};
use crate::error::{DockerObject, SandboxError, docker_status};
use crate::session_key::SessionKey;
use crate::{disk, exec};

/// The only capabilities a session container has: what its agents need to drop from root
/// to the sandbox user. Processes of that user have none (no-new-privileges).
pub const AGENT_CAPS: [&str; 2] = ["SETUID", "SETGID"];
/// Mount point of the session's workspace volume (defined with the agent protocol, which
/// confines every file operation beneath it).
pub use crate::agent::WORKSPACE;
/// Label present on everything warden creates; nothing without it is ever touched.
pub const LABEL_MANAGED: &str = "warden.managed";
/// Label carrying the session's user id.
pub const LABEL_USER: &str = "warden.user";
/// Label carrying the session id.
pub const LABEL_SESSION: &str = "warden.session";
/// Label carrying the host scope (`sandbox.scope`).
pub const LABEL_SCOPE: &str = "warden.scope";
/// Label carrying the Docker host (`sandbox.hosts[].endpoint`) a container and its volumes
/// were placed on: with two endpoints in front of one engine, each host still adopts, counts
/// and reaps only its own.
pub const LABEL_HOST: &str = "warden.docker_host";
/// Label carrying the replica (`sandbox.replica_id`, `warden serve --replica-id`) that made
/// a container or volume; absent without replicas. A replica adopts, sweeps and removes on
/// connect only what carries its own id.
pub const LABEL_REPLICA: &str = "warden.replica";
/// Label of a container made under a named OCI runtime (`sandbox.runtime`, or the session
/// key's): the runtime's name. Absent: the engine's default runtime.
pub const LABEL_RUNTIME: &str = "warden.runtime";
/// Label of a session's container and volumes whose key names a runtime
/// ([`SessionKey::runtime`]): that runtime, part of the session's identity. Absent: the
/// key of the default runtime.
pub const LABEL_KEY_RUNTIME: &str = "warden.session_runtime";
/// Label of a container (and its volumes) made for the warm pool; it stays when the
/// container is handed to a session (labels cannot change), the session then being named
/// by the container's name and the binding volume.
pub const LABEL_POOL: &str = "warden.pool";
/// Label of a binding volume: it carries the key of the session a pooled container was
/// handed to (never mounted anywhere).
pub const LABEL_BINDING: &str = "warden.binding";
/// Name prefix of binding volumes (`warden-bind-<session stem>`).
pub(crate) const BINDING_PREFIX: &str = "warden-bind-";
/// Name prefix of pool containers; the `.` never occurs in a session's names, so a pool
/// name can never be a session's.
pub(crate) const POOL_PREFIX: &str = "warden-pool.";
/// Polls while waiting for a removal in progress elsewhere to finish.
const REMOVAL_WAIT_POLLS: u32 = 50;
/// Pause between those polls.
const REMOVAL_WAIT_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);
/// Attempts at creating a session container when the engine reports a transient conflict.
const CREATE_ATTEMPTS: u32 = 3;
/// Attempts at the workspace setup exec (the runtime occasionally fails to start a process
/// in a container that has just started).
const SETUP_ATTEMPTS: u32 = 3;
/// Pause between those attempts.
const SETUP_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(200);
/// Host-side limit for the root exec that opens /workspace to the session user.
const WORKSPACE_SETUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Deterministic Docker names of a session: its container, the workspace volume it gets
/// when created cold, and the binding volume it has when its container came from the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// The session's container.
    pub container: String,
    /// The workspace volume a cold container of the session mounts.
    pub volume: String,
    /// The binding volume naming the session a pool container was handed to.
    pub binding: String,
}

/// Domain tag of the session name digest: a new naming scheme gets a new tag, so no name of
/// one scheme can ever equal a name of another.
const NAME_DIGEST_DOMAIN: &[u8] = b"warden.sandbox.session-names.v2";
/// Domain tag of the digest of a key that names a runtime: its four parts never hash into
/// the same input as a default-runtime key's three.
const NAME_DIGEST_DOMAIN_RUNTIME: &[u8] = b"warden.sandbox.session-names.v2+runtime";

/// Deterministic, Docker-safe names for a session in a scope: `warden-<scope>-<digest>`
/// (`warden-ws-…`, `warden-bind-…`), the digest being SHA-256 over the length-prefixed
/// (scope, user id, session id). Injective: no two different tuples share a name (ids are
/// never truncated or rewritten, no separator can be forged), so no tenant's ids can name
/// another's container or volume. The scope, validated to `[A-Za-z0-9_-]`, is repeated in
/// clear for `docker ps`; the ids are in the labels.
pub fn names(scope: &str, key: &SessionKey) -> Names {
    let stem = format!("{scope}-{}", session_digest(scope, key));
    Names {
        container: format!("warden-{stem}"),
        volume: format!("{}{stem}", disk::WORKSPACE_PREFIX),
        binding: format!("{BINDING_PREFIX}{stem}"),
    }
}

/// SHA-256 (hex) of the length-prefixed (scope, user id, session id) under
/// [`NAME_DIGEST_DOMAIN`], or (scope, user id, session id, runtime) under
/// [`NAME_DIGEST_DOMAIN_RUNTIME`] for a key that names a runtime (so a session's names under
/// the default runtime are what they always were).
fn session_digest(scope: &str, key: &SessionKey) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let runtime = key.runtime.as_deref();
    h.update(if runtime.is_some() { NAME_DIGEST_DOMAIN_RUNTIME } else { NAME_DIGEST_DOMAIN });
    for part in [scope, key.user_id.as_str(), key.session_id.as_str()].into_iter().chain(runtime) {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(h.finalize())
}

/// The binding volume name that goes with a session container name.
pub(crate) fn binding_of(container_name: &str) -> Option<String> {
    container_name
        .strip_prefix("warden-")
        .filter(|stem| !container_name.starts_with(POOL_PREFIX) && !stem.is_empty())
        .map(|stem| format!("{BINDING_PREFIX}{stem}"))
}

/// A fresh, unique name for a pool container (`warden-pool.<scope>.<nonce>`); its workspace
/// volume is [`volume_of`] it.
pub(crate) fn pool_name(scope: &str) -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    let nonce = fnv1a(&[&std::process::id().to_le_bytes(), &now.to_le_bytes(), &n.to_le_bytes()]);
    format!("{POOL_PREFIX}{scope}.{nonce:016x}")
}

/// The workspace volume name that goes with a session container name.
pub(crate) fn volume_of(container_name: &str) -> String {
    match container_name.strip_prefix("warden-") {
        Some(stem) => format!("{}{stem}", disk::WORKSPACE_PREFIX),
        None => String::new(),
    }
}

/// FNV-1a 64-bit: a stable (across Rust versions) hash for names, not for security.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    /// FNV-1a 64-bit offset basis.
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    /// FNV-1a 64-bit prime.
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    for b in parts.iter().flat_map(|p| p.iter()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(PRIME);
    }
    h
}

/// Labels of a session's container and volumes (made by `replica`, if any).
pub(crate) fn labels(scope: &str, host: &str, replica: Option<&str>, key: &SessionKey) -> HashMap<String, String> {
    let mut l = HashMap::from([
        (LABEL_MANAGED.to_string(), "true".to_string()),
        (LABEL_SCOPE.to_string(), scope.to_string()),
        (LABEL_HOST.to_string(), host.to_string()),
        (LABEL_USER.to_string(), key.user_id.clone()),
        (LABEL_SESSION.to_string(), key.session_id.clone()),
    ]);
    l.extend(replica.map(|r| (LABEL_REPLICA.to_string(), r.to_string())));
    l.extend(key.runtime.as_ref().map(|r| (LABEL_KEY_RUNTIME.to_string(), r.clone())));
    l
}

/// Labels of a pool container and its volumes: no session key (it has none yet).
pub(crate) fn pool_labels(scope: &str, host: &str, replica: Option<&str>) -> HashMap<String, String> {
    let mut l = HashMap::from([
        (LABEL_MANAGED.to_string(), "true".to_string()),
        (LABEL_SCOPE.to_string(), scope.to_string()),
        (LABEL_HOST.to_string(), host.to_string()),
        (LABEL_POOL.to_string(), "true".to_string()),
    ]);
    l.extend(replica.map(|r| (LABEL_REPLICA.to_string(), r.to_string())));
    l
}

/// Whose a container or volume must be before warden reuses, attaches to or removes one
/// that already holds a name warden derived: names are predictable, so an object holding
/// one may have been made by someone else (another warden on the engine, anyone with access
/// to it) and only its labels can prove it is this scope's and session's.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Owner<'a> {
    /// A session of a scope: labelled with its key, or (a container from the warm pool and
    /// its workspace, which keep the pool's labels) the scope's pool labels with the
    /// session's binding volume carrying the key.
    Session { scope: &'a str, key: &'a SessionKey },
    /// The warm pool of a scope (a container not handed out yet, and its volumes).
    Pool { scope: &'a str },
}

/// Whether `labels` alone prove `owner`: managed, of its scope, and of its session (no
/// other) or of its pool.
pub(crate) fn labels_prove(labels: Option<&HashMap<String, String>>, owner: Owner<'_>) -> bool {
    let Some(l) = labels else { return false };
    let is = |k: &str, v: &str| l.get(k).is_some_and(|x| x == v);
    let scope = match owner {
        Owner::Session { scope, .. } | Owner::Pool { scope } => scope,
    };
    is(LABEL_MANAGED, "true")
        && is(LABEL_SCOPE, scope)
        && match owner {
            Owner::Session { key, .. } => {
                is(LABEL_USER, &key.user_id)
                    && is(LABEL_SESSION, &key.session_id)
                    && l.get(LABEL_KEY_RUNTIME) == key.runtime.as_ref()
            }
            Owner::Pool { .. } => {
                is(LABEL_POOL, "true") && !l.contains_key(LABEL_USER) && !l.contains_key(LABEL_SESSION)
            }
        }
}

/// Checks that the existing `object` named `name`, labelled `labels`, is `owner`'s: by its
/// labels, or, for a session, by the scope's pool labels and the session's binding volume.
/// [`SandboxError::NotOwned`] otherwise.
async fn check_owner(
    docker: &Docker,
    object: DockerObject,
    name: &str,
    labels: Option<&HashMap<String, String>>,
    owner: Owner<'_>,
) -> Result<(), SandboxError> {
    if labels_prove(labels, owner) {
        return Ok(());
    }
    if let Owner::Session { scope, key } = owner
        && labels_prove(labels, Owner::Pool { scope })
    {
        let binding = names(scope, key).binding;
        let bound = match docker.inspect_volume(&binding).await {
            Ok(v) => labels_prove(Some(&v.labels), owner) && v.labels.get(LABEL_BINDING).is_some_and(|b| b == "true"),
            Err(e) if docker_status(&e) == Some(404) => false,
            Err(e) => return Err(SandboxError::from_docker("inspect session binding", e)),
        };
        if bound {
            return Ok(());
        }
    }
    Err(SandboxError::NotOwned { object, name: name.to_string() })
}

/// Checks that a listed container (holding the session's name) is the session's.
pub(crate) async fn check_session_container(
    docker: &Docker,
    c: &ContainerSummary,
    scope: &str,
    key: &SessionKey,
) -> Result<(), SandboxError> {
    let name = container_name(c).unwrap_or_default();
    check_owner(docker, DockerObject::Container, &name, c.labels.as_ref(), Owner::Session { scope, key }).await
}

/// Checks the volume `name`, when it exists, is `owner`'s (absent: `Ok(false)`).
async fn check_volume(docker: &Docker, name: &str, owner: Owner<'_>) -> Result<bool, SandboxError> {
    match docker.inspect_volume(name).await {
        Ok(v) => check_owner(docker, DockerObject::Volume, name, Some(&v.labels), owner).await.map(|()| true),
        Err(e) if docker_status(&e) == Some(404) => Ok(false),
        Err(e) => Err(SandboxError::from_docker("inspect volume", e)),
    }
}

/// What making a container does about another container that already holds its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameTaken {
    /// Remove it (the scope's only user: whatever holds the name is a leftover).
    Replace,
    /// Use it when it runs (another replica made it: a session keeps one container across
    /// replicas); remove it only when it stopped, or stayed unstarted past a creator's time.
    Reuse,
}

impl NameTaken {
    /// The policy of a sandbox with these settings: [`NameTaken::Reuse`] with replicas.
    pub(crate) fn of(cfg: &SandboxConfig) -> Self {
        if cfg.replica_id.is_some() { NameTaken::Reuse } else { NameTaken::Replace }
    }
}

/// What [`create_and_start`] gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Made {
    /// A new container, with this id.
    Created(String),
    /// The running container another replica made under the name ([`NameTaken::Reuse`]),
    /// with this id and the workspace volume it mounts.
    Found { id: String, workspace: Option<String> },
}

/// The container holding `name`, when one does: its id, state and the workspace volume
/// it mounts. [`SandboxError::NotOwned`] when it is not `owner`'s: nothing calls for a
/// container of someone else's, whatever its name.
async fn holder(docker: &Docker, name: &str, owner: Owner<'_>) -> Result<Option<Holder>, SandboxError> {
    match docker.inspect_container(name, None::<InspectContainerOptions>).await {
        Ok(c) => {
            let labels = c.config.as_ref().and_then(|c| c.labels.as_ref());
            check_owner(docker, DockerObject::Container, name, labels, owner).await?;
            let state = match c.state.as_ref() {
                Some(s) if s.running == Some(true) => HolderState::Running,
                Some(s) if s.status == Some(bollard::models::ContainerStateStatusEnum::CREATED) => {
                    HolderState::Unstarted
                }
                _ => HolderState::Stopped,
            };
            Ok(Some(Holder { id: c.id.unwrap_or_default(), state, workspace: workspace_mount(c.mounts.as_deref()) }))
        }
        Err(e) if docker_status(&e) == Some(404) => Ok(None),
        Err(e) => Err(SandboxError::from_docker("inspect session container", e)),
    }
}

/// An existing container holding a name, proven `Owner`'s.
struct Holder {
    id: String,
    state: HolderState,
    /// The volume it mounts at /workspace.
    workspace: Option<String>,
}

/// The session's container, when there is one: its id, whether it runs, and the workspace
/// volume it mounts; [`SandboxError::NotOwned`] when the container holding its name is not
/// the session's.
pub(crate) async fn find(
    docker: &Docker,
    scope: &str,
    key: &SessionKey,
) -> Result<Option<(String, bool, Option<String>)>, SandboxError> {
    let held = holder(docker, &names(scope, key).container, Owner::Session { scope, key }).await?;
    Ok(held.map(|h| (h.id, h.state == HolderState::Running, h.workspace)))
}

/// How a container holding a name stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HolderState {
    Running,
    /// Created, not started: its creator may be between the two steps.
    Unstarted,
    Stopped,
}

/// Clears `name` for a new container of `owner` under `policy`: `Some` is a running
/// container to use instead ([`NameTaken::Reuse`] only). A holder that is not `owner`'s is
/// neither used nor removed ([`SandboxError::NotOwned`]).
async fn clear_name(
    docker: &Docker,
    name: &str,
    policy: NameTaken,
    owner: Owner<'_>,
) -> Result<Option<Made>, SandboxError> {
    for _ in 0..REMOVAL_WAIT_POLLS {
        match holder(docker, name, owner).await? {
            None => return Ok(None),
            // A dead container of the same name (killed, engine restarted) is in the way.
            Some(h) if policy == NameTaken::Replace => {
                remove_container(docker, &h.id).await?;
                return Ok(None);
            }
            Some(Holder { id, state: HolderState::Running, workspace }) => {
                return Ok(Some(Made::Found { id, workspace }));
            }
            Some(Holder { state: HolderState::Unstarted, .. }) => tokio::time::sleep(REMOVAL_WAIT_PAUSE).await,
            Some(Holder { id, state: HolderState::Stopped, .. }) => {
                remove_container(docker, &id).await?;
                return Ok(None);
            }
        }
    }
    // Never started within the wait: its creator died between creating and starting it.
    if let Some(h) = holder(docker, name, owner).await? {
        remove_container(docker, &h.id).await?;
    }
    Ok(None)
}

/// The container config: every hardening default in one place (pool and session
/// containers differ only in labels and in the name of their workspace volume).
fn container_body(
    cfg: &SandboxConfig,
    mut labels: HashMap<String, String>,
    volume: &str,
    egress: bool,
    runtime: Option<&str>,
) -> ContainerCreateBody {
    labels.extend(runtime.map(|r| (LABEL_RUNTIME.to_string(), r.to_string())));
    let tmpfs = HashMap::from([("/tmp".to_string(), format!("rw,nosuid,nodev,size={},mode=1777", cfg.tmp_size.0))]);
    let nano_cpus = (cfg.cpus * 1e9).round() as i64;
    // Egress: the proxy variables every tool reads (the forwarder they name is started with
    // the container, see `prepare`).
    let env = crate::environment::base_env(if egress { egress::container_env() } else { vec![] });
    let mounts = vec![Mount {
        target: Some(WORKSPACE.into()),
        source: Some(volume.to_string()),
        typ: Some(MountTypeEnum::VOLUME),
        read_only: Some(false),
        ..Default::default()
    }];
    let memory = cfg.memory.0 as i64;
    ContainerCreateBody {
        image: Some(cfg.image.clone()),
        // Root with CAP_SETUID/CAP_SETGID only: init and the idle main process, and the
        // agents before they drop to `cfg.user` (which makes them unreachable to the
        // commands they run). Nothing sandboxed ever runs as root: every command is started
        // by an agent after the drop, under no-new-privileges, with no capabilities.
        user: Some("0:0".into()),
        // An imported image has no CMD; the container only idles under init, tools exec in.
        cmd: Some(vec!["sleep".into(), "infinity".into()]),
        entrypoint: Some(vec![]),
        working_dir: Some(WORKSPACE.into()),
        env: Some(env),
        labels: Some(labels),
        network_disabled: Some(cfg.network == "none"),
        stop_timeout: Some(1),
        host_config: Some(HostConfig {
            init: Some(true),
            readonly_rootfs: Some(true),
            cap_drop: Some(vec!["ALL".into()]),
            cap_add: Some(AGENT_CAPS.iter().map(|c| c.to_string()).collect()),
            security_opt: Some(vec!["no-new-privileges:true".into()]),
            privileged: Some(false),
            network_mode: Some(cfg.network.clone()),
            pids_limit: Some(cfg.pids),
            memory: Some(memory),
            // Equal to memory: no swap, so the memory limit is real.
            memory_swap: Some(memory),
            nano_cpus: Some(nano_cpus),
            tmpfs: Some(tmpfs),
            mounts: Some(mounts),
            runtime: runtime.map(String::from),
            ipc_mode: Some("private".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Creates (or reuses) the workspace volume `volume`, creates and starts the container
/// `name` on it with `labels` (a session's or the pool's, `owner`), and opens /workspace to
/// the session user; with `sandbox.disk`, `disks` attaches the workspace's disk (gathered
/// with other cold starts on the same Docker host) unless the copy that just made it did
/// (`copied_disk`). Its first agent, which prepares it, goes to `agents`. Returns the
/// container id.
/// With [`NameTaken::Reuse`], a running container already holding `name` (another
/// replica's, made a moment earlier) is returned instead, with its workspace prepared.
/// An existing container, workspace or disk volume is reused or replaced only when it is
/// `owner`'s ([`SandboxError::NotOwned`] otherwise, nothing touched).
pub(crate) async fn create_and_start(
    (docker, disks): (&Docker, &Arc<disk::Attacher>),
    cfg: &SandboxConfig,
    (name, volume): (&str, &str),
    (labels, owner): (HashMap<String, String>, Owner<'_>),
    (egress, agents): (Option<&Egress>, &exec::AgentPool),
    policy: NameTaken,
    copied_disk: Option<disk::VolumeOptions>,
) -> Result<Made, SandboxError> {
    let began = std::time::Instant::now();
    // Checked first so that a missing image leaves nothing (not even a volume) behind.
    if let Err(e) = docker.inspect_image(&cfg.image).await {
        return Err(match docker_status(&e) {
            Some(404) => SandboxError::ImageMissing { image: cfg.image.clone() },
            _ => SandboxError::from_docker("inspect sandbox image", e),
        });
    }
    match policy {
        // Another replica's running container is used before anything is made for this one.
        NameTaken::Reuse => {
            if let Some(found) = clear_name(docker, name, policy, owner).await? {
                return reuse(docker, found).await;
            }
        }
        // A holder that is not `owner`'s is refused before anything is made.
        NameTaken::Replace => {
            holder(docker, name, owner).await?;
        }
    }
    // A workspace (or its disk) that survived is attached again only when it is `owner`'s.
    for v in std::iter::once(volume.to_string()).chain(disk::disk_of(volume)) {
        check_volume(docker, &v, owner).await?;
    }
    // Idempotent for the local driver: an existing volume of this name is returned as is,
    // which is how a recreated container keeps a workspace that survived. With a disk
    // limit the workspace is an ext4 file system on the session's disk image (see disk.rs).
    let driver_opts = match (cfg.disk.0, disk::disk_of(volume)) {
        (0, _) | (_, None) => None,
        (size, Some(disk_volume)) => {
            let attaching = std::time::Instant::now();
            let opts = match copied_disk {
                Some(opts) => opts,
                None => disks.attach(docker, &disk_volume, &labels, size, DISK_OWNER).await?,
            };
            tracing::debug!(container = %name, took_ms = attaching.elapsed().as_millis() as u64, "cold start: disk attached");
            // After a reboot the image may sit on another loop device than the volume names.
            if let Ok(v) = docker.inspect_volume(volume).await
                && v.options.get("device") != opts.get("device")
            {
                remove_volume(docker, cfg, volume).await?;
            }
            Some(opts)
        }
    };
    let made = docker
        .create_volume(VolumeCreateOptions {
            name: Some(volume.to_string()),
            labels: Some(labels.clone()),
            driver: driver_opts.as_ref().map(|_| "local".to_string()),
            driver_opts,
            ..Default::default()
        })
        .await
        .map_err(|e| SandboxError::from_docker("create workspace volume", e))?;
    // Idempotent creation returns a volume made meanwhile as it is: checked again.
    check_owner(docker, DockerObject::Volume, volume, Some(&made.labels), owner).await?;

    tracing::debug!(container = %name, took_ms = began.elapsed().as_millis() as u64, "cold start: workspace volume ready");
    // A session whose key names a runtime runs under it; everything else under the sandbox's.
    let runtime = match owner {
        Owner::Session { key, .. } => key.runtime.as_deref().or(cfg.runtime.as_deref()),
        Owner::Pool { .. } => cfg.runtime.as_deref(),
    };
    let mut attempt = 0;
    let created = loop {
        attempt += 1;
        if let Some(found) = clear_name(docker, name, policy, owner).await? {
            return reuse(docker, found).await;
        }
        let body = container_body(cfg, labels.clone(), volume, egress.is_some(), runtime);
        let opts = CreateContainerOptions { name: Some(name.to_string()), ..Default::default() };
        let created = match docker.create_container(Some(opts), body).await {
            Ok(c) => c,
            Err(e) if docker_status(&e) == Some(409) && attempt < CREATE_ATTEMPTS => continue,
            Err(e) => return Err(SandboxError::from_docker("create session container", e)),
        };
        match docker.start_container(&created.id, None::<StartContainerOptions>).await {
            Ok(()) => break created,
            Err(e) => {
                let _ = remove_container(docker, &created.id).await;
                if docker_status(&e) == Some(409) && attempt < CREATE_ATTEMPTS {
                    continue;
                }
                return Err(SandboxError::from_docker("start session container", e));
            }
        }
    };
    tracing::debug!(container = %name, took_ms = began.elapsed().as_millis() as u64, "cold start: container started");
    if let Err(e) = prepare(docker, &created.id, egress, Some((agents, &cfg.user))).await {
        let _ = remove_container(docker, &created.id).await;
        return Err(e);
    }
    tracing::debug!(container = %name, took_ms = began.elapsed().as_millis() as u64, "cold start: workspace prepared");
    Ok(Made::Created(created.id))
}

/// A running container found under the name: prepared again (idempotent: another replica
/// may be preparing it this moment, and no tool may run before the workspace is open).
/// Its egress forwarder is its maker's to start (this process opens a channel to it).
async fn reuse(docker: &Docker, found: Made) -> Result<Made, SandboxError> {
    if let Made::Found { id, .. } = &found {
        tracing::info!(container = %id, "session container made by another replica; using it");
        prepare(docker, id, None, None).await?;
    }
    Ok(found)
}

/// Starts the egress forwarder (with `egress`) and opens /workspace to the session user in
/// the running container `id`, and creates its use mark; the caller removes the container
/// when this fails. With `first_agent` (a container this process just started: where its
/// agents go, and the session user) the container's first agent does it before it serves,
/// in the same exec round trip; without (another replica's container) a one-off exec.
async fn prepare(
    docker: &Docker,
    id: &str,
    egress: Option<&Egress>,
    first_agent: Option<(&exec::AgentPool, &str)>,
) -> Result<(), SandboxError> {
    // The egress forwarder starts first: it is listening by the time the workspace setup
    // (an exec round trip) is done, before any tool can run.
    if egress.is_some() {
        exec::start_detached(docker, id, egress::FORWARDER_USER, egress::forwarder_argv("serve")).await?;
    }
    // The volume root is created root-owned; root in the container (no capabilities) still
    // owns it and may open it. Sticky bit as in /tmp.
    let mut setup_result = Ok(-1);
    for attempt in 0..SETUP_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(SETUP_RETRY_PAUSE).await;
        }
        // Also proves the image has the agent's interpreter before any tool call needs it.
        // The agent's `prepare` opens /workspace and makes, before any sandboxed code runs,
        // the root-owned files the agents trust (use mark, sweep lock, settled-process
        // records, the tools' configuration directory, the settings record); with egress it
        // waits until the forwarder listens, so no tool runs before it.
        let port = if egress.is_some() { egress::FORWARDER_PORT } else { 0 };
        setup_result = match first_agent {
            Some((agents, user)) => match agents.spawn_preparing(docker, id, user, port).await {
                Ok(()) => Ok(0),
                Err(exec::PrepareFailure::Exited(code, _)) if code != 0 => Ok(code),
                Err(f) => Err(f.into()),
            },
            None => {
                let setup = exec::agent_argv("prepare", Some(&port.to_string()));
                exec::run_housekeeping(docker, id, "0:0", setup, WORKSPACE_SETUP_TIMEOUT).await
            }
        };
        // 126: the runtime could not start the process (transient on a busy engine).
        if !matches!(setup_result, Ok(126)) {
            break;
        }
    }
    match setup_result {
        Ok(0) => Ok(()),
        Ok(code) => Err(SandboxError::Docker {
            action: "prepare /workspace".into(),
            message: if code == egress::FORWARDER_NOT_READY {
                format!("the egress forwarder did not listen on 127.0.0.1:{}", egress::FORWARDER_PORT)
            } else if code == PREPARE_UNTRUSTED {
                "a file the setup makes under /tmp exists and is not root's (planted before the setup?)".to_string()
            } else {
                format!("setup exited with {code} (the sandbox image needs bash and python3)")
            },
        }),
        Err(
            exec::ExecFailure::ContainerGone(m) | exec::ExecFailure::ContainerWedged(m) | exec::ExecFailure::Broken(m),
        ) => Err(SandboxError::Docker {
            action: "prepare /workspace".into(),
            message: format!("container stopped right after start ({m}); does the image have `sleep`?"),
        }),
        Err(exec::ExecFailure::Failed(e)) => Err(e),
    }
}

/// Owner (uid:gid) of a workspace disk's root directory: root, as a plain volume's; the
/// setup opens it to the session user.
pub(crate) const DISK_OWNER: &str = "0:0";

/// `agent.py`'s `PREPARE_UNTRUSTED`: the setup found one of the files it makes under /tmp
/// existing and not root's.
const PREPARE_UNTRUSTED: i64 = 6;

/// How long a paused session's container gets to stop before it is killed, seconds: none
/// of its processes survives a pause anyway, so they are not waited for.
const PAUSE_STOP_SECS: i32 = 0;

/// Stops a session's container for a pause (`session`): every process in it ends, its
/// workspace volume and the container itself stay, so [`start_paused`] can start it again.
pub(crate) async fn stop_for_pause(docker: &Docker, id: &str) -> Result<(), SandboxError> {
    let opts = bollard::query_parameters::StopContainerOptions { t: Some(PAUSE_STOP_SECS), ..Default::default() };
    match docker.stop_container(id, Some(opts)).await {
        Ok(()) => Ok(()),
        // 304: already stopped.
        Err(e) if docker_status(&e) == Some(304) => Ok(()),
        Err(e) => Err(SandboxError::from_docker("stop session container for a pause", e)),
    }
}

/// Starts a paused session's stopped container again and prepares it as a new one (its
/// /tmp, use mark and egress forwarder are gone with its processes), its first agent
/// going to `agents`; the caller removes it when this fails and makes a new container on
/// the same workspace.
pub(crate) async fn start_paused(
    docker: &Docker,
    cfg: &SandboxConfig,
    id: &str,
    (egress, agents): (Option<&Egress>, &exec::AgentPool),
) -> Result<(), SandboxError> {
    docker
        .start_container(id, None::<StartContainerOptions>)
        .await
        .map_err(|e| SandboxError::from_docker("start paused session container", e))?;
    prepare(docker, id, egress, Some((agents, &cfg.user))).await
}

/// Force-removes a container by id or name; absent is success.
pub(crate) async fn remove_container(docker: &Docker, id_or_name: &str) -> Result<(), SandboxError> {
    let opts = RemoveContainerOptions { force: true, v: true, ..Default::default() };
    match docker.remove_container(id_or_name, Some(opts)).await {
        Ok(()) => Ok(()),
        Err(e) if docker_status(&e) == Some(404) => Ok(()),
        // 409: removal already in progress (a concurrent remover); wait until it is gone so
        // that its name is free again.
        Err(e) if docker_status(&e) == Some(409) => {
            for _ in 0..REMOVAL_WAIT_POLLS {
                match docker.inspect_container(id_or_name, None::<InspectContainerOptions>).await {
                    Err(e) if docker_status(&e) == Some(404) => return Ok(()),
                    _ => tokio::time::sleep(REMOVAL_WAIT_PAUSE).await,
                }
            }
            Err(SandboxError::Docker {
                action: "remove session container".into(),
                message: format!("{id_or_name} is still being removed"),
            })
        }
        Err(e) => Err(SandboxError::from_docker("remove session container", e)),
    }
}

/// Removes a volume; absent is success. Retries briefly while a just-removed container
/// still holds it.
pub(crate) async fn remove_volume(docker: &Docker, cfg: &SandboxConfig, name: &str) -> Result<(), SandboxError> {
    // A disk volume's loop device goes first, or the removed image would keep its space.
    if name.starts_with(disk::DISK_PREFIX) {
        match docker.inspect_volume(name).await {
            Err(e) if docker_status(&e) == Some(404) => return Ok(()),
            Err(e) => return Err(SandboxError::from_docker("inspect disk volume", e)),
            Ok(_) => disk::detach(docker, &cfg.image, name, helper_labels(&cfg.scope)).await?,
        }
    }
    /// Attempts while the engine still reports the volume in use.
    const ATTEMPTS: u32 = 20;
    /// Pause between attempts.
    const PAUSE: std::time::Duration = std::time::Duration::from_millis(100);
    for attempt in 0..ATTEMPTS {
        match docker.remove_volume(name, Some(RemoveVolumeOptions { force: true })).await {
            Ok(()) => return Ok(()),
            Err(e) if docker_status(&e) == Some(404) => return Ok(()),
            Err(e) if docker_status(&e) == Some(409) && attempt + 1 < ATTEMPTS => {
                tokio::time::sleep(PAUSE).await;
            }
            Err(e) => return Err(SandboxError::from_docker("remove workspace volume", e)),
        }
    }
    Ok(())
}

/// Removes a workspace volume and, with `sandbox.disk`, its disk volume.
pub(crate) async fn remove_workspace(docker: &Docker, cfg: &SandboxConfig, volume: &str) -> Result<(), SandboxError> {
    remove_volume(docker, cfg, volume).await?;
    match disk::disk_of(volume) {
        Some(d) => remove_volume(docker, cfg, &d).await,
        None => Ok(()),
    }
}

/// Removes the volume `name` when it is `owner`'s (absent: success; another's:
/// [`SandboxError::NotOwned`], left alone).
async fn remove_owned_volume(
    docker: &Docker,
    cfg: &SandboxConfig,
    name: &str,
    owner: Owner<'_>,
) -> Result<(), SandboxError> {
    if check_volume(docker, name, owner).await? {
        remove_volume(docker, cfg, name).await?;
    }
    Ok(())
}

/// Removes the container holding `name`, the workspace volumes `workspaces` and the one it
/// mounts, and their disks, each only when it is `owner`'s; one that is not is left alone
/// and fails the removal ([`SandboxError::NotOwned`]) after the rest is gone.
async fn remove_owned(
    docker: &Docker,
    cfg: &SandboxConfig,
    name: &str,
    workspaces: &[&str],
    owner: Owner<'_>,
) -> Result<(), SandboxError> {
    let mut refused = None;
    let mut volumes: Vec<String> = workspaces.iter().map(|w| w.to_string()).collect();
    match holder(docker, name, owner).await {
        Ok(Some(h)) => {
            remove_container(docker, &h.id).await?;
            volumes.extend(h.workspace);
        }
        Ok(None) => {}
        Err(e @ SandboxError::NotOwned { .. }) => refused = Some(e),
        Err(e) => return Err(e),
    }
    volumes.sort();
    volumes.dedup();
    for w in volumes.iter().flat_map(|w| std::iter::once(w.clone()).chain(disk::disk_of(w))) {
        match remove_owned_volume(docker, cfg, &w, owner).await {
            Err(e @ SandboxError::NotOwned { .. }) => refused = refused.or(Some(e)),
            other => other?,
        }
    }
    refused.map_or(Ok(()), Err)
}

/// Removes a session's container (by its deterministic name), its workspace (the
/// deterministic one; `workspace`, the volume its container mounted, which is a pool volume
/// when the container came from the pool; and the one it mounts now) and its binding
/// volume — each only when it is the session's ([`SandboxError::NotOwned`] otherwise).
pub(crate) async fn remove_session(
    docker: &Docker,
    cfg: &SandboxConfig,
    key: &SessionKey,
    workspace: Option<&str>,
) -> Result<(), SandboxError> {
    let (scope, names) = (cfg.scope.as_str(), names(&cfg.scope, key));
    let owner = Owner::Session { scope, key };
    let workspaces: Vec<&str> = std::iter::once(names.volume.as_str()).chain(workspace).collect();
    // The binding goes last: it is what proves a pool container (and its volume) the session's.
    let removed = remove_owned(docker, cfg, &names.container, &workspaces, owner).await;
    let binding = remove_owned_volume(docker, cfg, &names.binding, owner).await;
    removed.and(binding)
}

/// Removes a pool container that was never handed out, and its workspace (each only when it
/// is the pool's).
pub(crate) async fn remove_pooled(docker: &Docker, cfg: &SandboxConfig, name: &str) -> Result<(), SandboxError> {
    remove_owned(docker, cfg, name, &[&volume_of(name)], Owner::Pool { scope: &cfg.scope }).await
}

/// Whether the container exists and is running (`false`: stopped, dead or gone).
pub(crate) async fn is_running(docker: &Docker, id_or_name: &str) -> Result<bool, SandboxError> {
    match docker.inspect_container(id_or_name, None::<InspectContainerOptions>).await {
        Ok(c) => Ok(c.state.and_then(|s| s.running).unwrap_or(false)),
        Err(e) if docker_status(&e) == Some(404) => Ok(false),
        Err(e) => Err(SandboxError::from_docker("inspect pool container", e)),
    }
}

/// The volume among `mounts` that is mounted at /workspace.
pub(crate) fn workspace_mount(mounts: Option<&[MountPoint]>) -> Option<String> {
    mounts?.iter().find(|m| m.destination.as_deref() == Some(WORKSPACE)).and_then(|m| m.name.clone())
}

/// Records that the pool container renamed to `names.container` serves `key`: a volume
/// named `names.binding` that carries the key in its labels (containers cannot be
/// relabelled). Never mounted; created only here, by the host, so nothing in a sandbox can
/// forge one.
pub(crate) async fn create_binding(
    docker: &Docker,
    cfg: &SandboxConfig,
    host: &str,
    names: &Names,
    key: &SessionKey,
) -> Result<(), SandboxError> {
    let mut l = labels(&cfg.scope, host, cfg.replica_id.as_deref(), key);
    l.insert(LABEL_BINDING.to_string(), "true".to_string());
    let made = docker
        .create_volume(VolumeCreateOptions { name: Some(names.binding.clone()), labels: Some(l), ..Default::default() })
        .await
        .map_err(|e| SandboxError::from_docker("create session binding", e))?;
    // Idempotent creation returns an existing volume as it is: only the session's own is one.
    let owner = Owner::Session { scope: &cfg.scope, key };
    if labels_prove(Some(&made.labels), owner) && made.labels.get(LABEL_BINDING).is_some_and(|b| b == "true") {
        Ok(())
    } else {
        Err(SandboxError::NotOwned { object: DockerObject::Volume, name: names.binding.clone() })
    }
}

/// Renames a container (a pool container becoming a session's). A container already
/// holding the name (dead, or a leftover) is removed first, as creation does; under
/// [`NameTaken::Reuse`] a running one (another replica's) fails the rename instead.
pub(crate) async fn rename(
    docker: &Docker,
    id: &str,
    (scope, key): (&str, &SessionKey),
    policy: NameTaken,
) -> Result<(), SandboxError> {
    let name = names(scope, key).container;
    let opts = RenameContainerOptions { name: name.clone() };
    match docker.rename_container(id, opts.clone()).await {
        Ok(()) => Ok(()),
        Err(e) if docker_status(&e) == Some(409) => {
            if clear_name(docker, &name, policy, Owner::Session { scope, key }).await?.is_some() {
                return Err(SandboxError::Docker {
                    action: "rename pool container".into(),
                    message: format!("{name} is another replica's running container"),
                });
            }
            docker.rename_container(id, opts).await.map_err(|e| SandboxError::from_docker("rename pool container", e))
        }
        Err(e) => Err(SandboxError::from_docker("rename pool container", e)),
    }
}

/// Every binding volume (optionally of one scope): session container name → (key, scope).
pub(crate) async fn list_bindings(
    docker: &Docker,
    scope: Option<&str>,
) -> Result<HashMap<String, (SessionKey, String)>, SandboxError> {
    let binding = format!("{LABEL_BINDING}=true");
    let opts = ListVolumesOptions { filters: Some(label_filters(scope, &[("label", binding.as_str())])) };
    let volumes = docker
        .list_volumes(Some(opts))
        .await
        .map(|r| r.volumes.unwrap_or_default())
        .map_err(|e| SandboxError::from_docker("list volumes", e))?;
    Ok(volumes
        .into_iter()
        .filter_map(|v| {
            let key = key_from_labels(Some(&v.labels))?;
            let scope = v.labels.get(LABEL_SCOPE)?.clone();
            let names = names(&scope, &key);
            // A binding is only believed under the name the key itself gives.
            (names.binding == v.name).then_some((names.container, (key, scope)))
        })
        .collect())
}

/// Labels of a disk helper container: managed and scoped, so a leftover one is pruned.
pub(crate) fn helper_labels(scope: &str) -> HashMap<String, String> {
    HashMap::from([(LABEL_MANAGED.to_string(), "true".to_string()), (LABEL_SCOPE.to_string(), scope.to_string())])
}

fn label_filters(scope: Option<&str>, extra: &[(&str, &str)]) -> HashMap<String, Vec<String>> {
    let mut label = vec![format!("{LABEL_MANAGED}=true")];
    if let Some(s) = scope {
        label.push(format!("{LABEL_SCOPE}={s}"));
    }
    let mut f = HashMap::from([("label".to_string(), label)]);
    for (k, v) in extra {
        f.entry((*k).to_string()).or_default().push((*v).to_string());
    }
    f
}

/// Every warden-managed container (running or not), optionally of one scope.
pub(crate) async fn list_managed(docker: &Docker, scope: Option<&str>) -> Result<Vec<ContainerSummary>, SandboxError> {
    let opts = ListContainersOptions { all: true, filters: Some(label_filters(scope, &[])), ..Default::default() };
    docker.list_containers(Some(opts)).await.map_err(|e| SandboxError::from_docker("list containers", e))
}

/// Every warden-managed volume, optionally only those no container references.
pub(crate) async fn list_volumes(
    docker: &Docker,
    scope: Option<&str>,
    dangling_only: bool,
) -> Result<Vec<Volume>, SandboxError> {
    let extra: &[(&str, &str)] = if dangling_only { &[("dangling", "true")] } else { &[] };
    let opts = ListVolumesOptions { filters: Some(label_filters(scope, extra)) };
    docker
        .list_volumes(Some(opts))
        .await
        .map(|r| r.volumes.unwrap_or_default())
        .map_err(|e| SandboxError::from_docker("list volumes", e))
}

/// The Docker host a managed container or volume was placed on (`None`: made before
/// placement labels existed).
pub(crate) fn host_label(labels: Option<&HashMap<String, String>>) -> Option<&str> {
    labels?.get(LABEL_HOST).map(String::as_str)
}

/// The replica that made a managed container or volume (`None`: made without replicas).
pub(crate) fn replica_label(labels: Option<&HashMap<String, String>>) -> Option<&str> {
    labels?.get(LABEL_REPLICA).map(String::as_str)
}

/// The session key a managed container or volume carries in its labels.
pub(crate) fn key_from_labels(labels: Option<&HashMap<String, String>>) -> Option<SessionKey> {
    let l = labels?;
    Some(SessionKey {
        user_id: l.get(LABEL_USER)?.clone(),
        session_id: l.get(LABEL_SESSION)?.clone(),
        runtime: l.get(LABEL_KEY_RUNTIME).cloned(),
    })
}

/// A listed container's name (without Docker's leading `/`).
pub(crate) fn container_name(c: &ContainerSummary) -> Option<String> {
    Some(c.names.as_ref()?.first()?.trim_start_matches('/').to_string())
}

/// The session a managed container serves: its key labels, or, for a container from the
/// pool, the binding that names it (`bindings` from [`list_bindings`]). `None`: a pool
/// container never handed out, or a disk helper.
pub(crate) fn session_of(c: &ContainerSummary, bindings: &HashMap<String, (SessionKey, String)>) -> Option<SessionKey> {
    let labels = c.labels.as_ref()?;
    if let Some(key) = key_from_labels(Some(labels)) {
        return Some(key);
    }
    if !labels.contains_key(LABEL_POOL) {
        return None;
    }
    let scope = labels.get(LABEL_SCOPE)?;
    bindings.get(&container_name(c)?).filter(|(_, s)| s == scope).map(|(key, _)| key.clone())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A Docker object name as the engine accepts it.
    fn docker_name_ok(n: &str) -> bool {
        let mut chars = n.chars();
        chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
            && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    }

    proptest! {
        /// Names are injective over (scope, user, session, runtime): ids that agree on a long
        /// prefix, differ only in characters a Docker name cannot hold, or move a separator
        /// from one part to the next, and the same session under two runtimes (or under the
        /// default and a named one), never share a container, workspace or binding name.
        #[test]
        fn session_names_are_injective(
            a in ("[a_-]{1,3}", "[ab._ -]{0,30}", "[ab._ -]{0,30}", proptest::option::of("[ab.-]{1,4}")),
            b in ("[a_-]{1,3}", "[ab._ -]{0,30}", "[ab._ -]{0,30}", proptest::option::of("[ab.-]{1,4}")),
        ) {
            let key = |k: &(String, String, String, Option<String>)| SessionKey::new(&k.1, &k.2).with_runtime(k.3.clone());
            let (na, nb) = (names(&a.0, &key(&a)), names(&b.0, &key(&b)));
            prop_assert_eq!(a == b, na.container == nb.container, "{:?} {:?}", na, nb);
            prop_assert_eq!(a == b, na.volume == nb.volume);
            prop_assert_eq!(a == b, na.binding == nb.binding);
            for n in [&na.container, &na.volume, &na.binding] {
                prop_assert!(docker_name_ok(n) && !n.starts_with(POOL_PREFIX), "{}", n);
            }
            prop_assert_ne!(&na.container, &nb.volume);
            prop_assert_ne!(&na.volume, &nb.binding);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]
        /// Whatever an operator writes, a configuration that validates gives a container
        /// every hardening setting: no capabilities but the agents' two, no new privileges,
        /// a read-only root, a pids, memory (without swap) and CPU limit, no host or borrowed
        /// network, never privileged, sandboxed code as a non-root user. (Each field is
        /// mostly valid, so that many whole configurations are.)
        #[test]
        fn a_valid_config_never_weakens_the_container(
            network in prop_oneof![3 => "(none|bridge|[a-z]{1,6})", 1 => "(host|container:|Host|c)[a-z:0-9]{0,6}"],
            memory in prop_oneof![
                4 => crate::config::MIN_MEMORY..(1 << 40),
                1 => prop_oneof![Just(0u64), Just(u64::MAX), Just(i64::MAX as u64 + 1), 0..crate::config::MIN_MEMORY],
            ],
            cpus in prop_oneof![
                4 => 0.01f64..64.0,
                1 => prop_oneof![Just(0.0), Just(1e-12), Just(0.004), Just(f64::NAN), Just(f64::INFINITY), Just(1e300), -2.0f64..0.01],
            ],
            pids in prop_oneof![4 => 16i64..100_000, 1 => prop_oneof![Just(-1i64), Just(0), Just(i64::MAX), -5i64..16]],
            user in prop_oneof![
                3 => "[1-9][0-9]{0,4}(:[1-9][0-9]{0,4})?",
                1 => "(0|00|\\+0|1000|65534|root)?(:(0|1000|\\+0)?)?",
            ],
        ) {
            let cfg = SandboxConfig {
                network: network.clone(),
                memory: crate::config::ByteSize(memory),
                cpus,
                pids,
                user: user.clone(),
                ..SandboxConfig::default()
            };
            if cfg.validate().is_ok() {
                let body = container_body(&cfg, HashMap::new(), "v", false, cfg.runtime.as_deref());
                let h = body.host_config.expect("host config");
                prop_assert_eq!(h.cap_drop, Some(vec!["ALL".to_string()]));
                prop_assert_eq!(h.cap_add, Some(AGENT_CAPS.iter().map(|c| c.to_string()).collect::<Vec<_>>()));
                prop_assert_eq!(h.security_opt, Some(vec!["no-new-privileges:true".to_string()]));
                prop_assert_eq!(h.readonly_rootfs, Some(true));
                prop_assert_eq!(h.privileged, Some(false));
                prop_assert!(h.pids_limit.is_some_and(|p| p >= 16), "{:?}", h.pids_limit);
                prop_assert!(h.memory.is_some_and(|m| m >= crate::config::MIN_MEMORY as i64), "{:?}", h.memory);
                prop_assert_eq!(h.memory_swap, h.memory);
                prop_assert!(h.nano_cpus.is_some_and(|n| n >= 10_000_000), "{:?} from {}", h.nano_cpus, cpus);
                let mode = h.network_mode.expect("network mode");
                prop_assert!(mode != "host" && !mode.starts_with("container:"), "{}", mode);
                prop_assert!(cfg.uid_gid().is_some_and(|(u, g)| u != 0 && g != 0), "{}", user);
                prop_assert!(h.mounts.is_some_and(|m| m.len() == 1), "only the workspace");
            }
        }
    }

    #[test]
    fn regression_a_tiny_cpu_limit_or_a_borrowed_network_weakened_the_container_silently() {
        // 0.0001 cores rounded to 0 nano-CPUs, which Docker reads as no limit at all.
        let tiny = SandboxConfig { cpus: 0.0001, ..SandboxConfig::default() };
        assert!(matches!(tiny.validate(), Err(SandboxError::Config(m)) if m.contains("cpus")));
        // `container:<name>` joined another container's network namespace.
        let borrowed = SandboxConfig { network: "container:warden-other".into(), ..SandboxConfig::default() };
        assert!(matches!(borrowed.validate(), Err(SandboxError::Config(m)) if m.contains("network")));
        // A limit past i64::MAX wrapped to a negative one.
        let huge = SandboxConfig { memory: crate::config::ByteSize(u64::MAX), ..SandboxConfig::default() };
        assert!(matches!(huge.validate(), Err(SandboxError::Config(m)) if m.contains("memory")));
    }

    #[test]
    fn the_agent_fails_its_setup_with_the_status_the_host_names() {
        assert!(crate::agent::AGENT_SOURCE.contains(&format!("\nPREPARE_UNTRUSTED = {PREPARE_UNTRUSTED}\n")));
    }

    #[test]
    fn regression_ids_sharing_a_long_prefix_named_one_container() {
        // Before: the first 24 characters of each id (others replaced by `_`) plus a 64-bit
        // FNV-1a hash; these two users of one scope and session collided (found by a rho
        // search), so the second tenant's first call attached to the first one's container.
        let (a, b) = (SessionKey::new(COLLIDING_USERS.0, "s"), SessionKey::new(COLLIDING_USERS.1, "s"));
        assert_ne!(names("t", &a), names("t", &b));
        // The ids moved between parts, or cleaned the way the old names did, stay apart too.
        assert_ne!(names("t", &SessionKey::new("a-b", "c")), names("t", &SessionKey::new("a", "b-c")));
        assert_ne!(names("t", &SessionKey::new("a.b", "c")), names("t", &SessionKey::new("a_b", "c")));
        assert_ne!(names("t-a", &SessionKey::new("b", "c")), names("t", &SessionKey::new("a-b", "c")));
    }

    /// Two user ids whose old names (scope `t`, session `s`) were equal.
    const COLLIDING_USERS: (&str, &str) =
        ("tenant-aaaaaaaaaaaaaaaaa9e7a2e0a57f47f8c", "tenant-aaaaaaaaaaaaaaaaa60a3fe52f75f5632");

    #[test]
    fn only_matching_labels_prove_an_owner() {
        let key = SessionKey::new("u", "s");
        let session = Owner::Session { scope: "sc", key: &key };
        let pool = Owner::Pool { scope: "sc" };
        let mine = labels("sc", "unix:///x", None, &key);
        assert!(labels_prove(Some(&mine), session));
        assert!(!labels_prove(Some(&mine), pool), "a session's container is no pool container");
        assert!(labels_prove(Some(&pool_labels("sc", "h", Some("r"))), pool));
        assert!(!labels_prove(Some(&pool_labels("sc", "h", None)), session), "a pool container needs its binding");
        // The same session under another runtime is another session, in both directions.
        let gvisor = key.clone().with_runtime(Some("runsc".into()));
        let theirs = labels("sc", "unix:///x", None, &gvisor);
        assert!(labels_prove(Some(&theirs), Owner::Session { scope: "sc", key: &gvisor }));
        assert!(!labels_prove(Some(&theirs), session), "a runsc session's container is not the runc session's");
        assert!(!labels_prove(Some(&mine), Owner::Session { scope: "sc", key: &gvisor }));
        assert_eq!(key_from_labels(Some(&theirs)), Some(gvisor));
        assert!(!labels_prove(None, session));
        for (k, v) in [
            (LABEL_USER, "u2"),
            (LABEL_SESSION, "s2"),
            (LABEL_SCOPE, "other"),
            (LABEL_MANAGED, "false"),
            (LABEL_POOL, "true"),
        ] {
            let mut l = mine.clone();
            l.insert(k.to_string(), v.to_string());
            let proves = labels_prove(Some(&l), session);
            assert_eq!(proves, k == LABEL_POOL, "{k}={v}");
        }
        let mut unmanaged = mine.clone();
        unmanaged.remove(LABEL_MANAGED);
        assert!(!labels_prove(Some(&unmanaged), session));
    }

    #[test]
    fn pool_names_are_unique_and_never_a_sessions() {
        let (a, b) = (pool_name("s"), pool_name("s"));
        assert_ne!(a, b);
        assert!(a.starts_with("warden-pool.s."), "{a}");
        assert_eq!(volume_of(&a), format!("warden-ws-{}", &a["warden-".len()..]));
        assert_eq!(binding_of(&a), None, "a pool container has no binding");
        // A scope named `pool` still gives session names without the pool's `.`.
        let n = names("pool", &SessionKey::new("s.x", "y"));
        assert!(!n.container.contains('.') && !n.container.starts_with(POOL_PREFIX), "{n:?}");
        assert_eq!(binding_of(&n.container).as_deref(), Some(n.binding.as_str()));
        assert!(n.binding.starts_with(BINDING_PREFIX));
    }
}
