//! Size-limited workspaces (`sandbox.disk`): each session's /workspace is an ext4 file
//! system of that size, so the kernel itself refuses writes past the limit (ENOSPC) and the
//! Docker host's disk grows by at most the limit per session.
//!
//! The file system lives in an image file inside a second labelled volume
//! (`warden-disk-…`, never mounted into the sandbox). A short-lived *disk helper* container
//! attaches it to a loop device, and the workspace volume is a `local` volume of type ext4 on
//! that device; Docker mounts it like any other volume, so this works on any engine warden
//! can reach that lets a container use loop devices, with no host path and no root on warden's
//! side. Detaching happens when the disk volume is removed.
//!
//! A fork (`Sandbox::fork_session`) copies the source's image into the fork's new disk
//! volume with the same helper (`copy`): copy-on-write where the Docker host's file system
//! supports reflinks, a sparse copy otherwise, with the source's file system frozen
//! meanwhile when a container has it mounted.
//!
//! The helper is the only container warden starts with a capability (CAP_SYS_ADMIN and
//! CAP_MKNOD, loop devices only; to copy a plain workspace's tree, CAP_CHOWN, CAP_FOWNER
//! and CAP_DAC_OVERRIDE and no device). It must never run anything
//! but the fixed scripts below (their only inputs are a size, a uid:gid and a copy mode,
//! chosen by warden), never mount anything but the session's disk volume (and, to copy,
//! the source session's disk volume read-only and its workspace volume, which it only
//! freezes), never read a workspace's files, and never have a network.

use std::collections::HashMap;
use std::time::Duration;

use bollard::Docker;
use bollard::models::{ContainerCreateBody, DeviceMapping, HostConfig, Mount, MountTypeEnum, VolumeCreateOptions};
use bollard::query_parameters::{
    CreateContainerOptions, LogsOptions, RemoveContainerOptions, StartContainerOptions, WaitContainerOptions,
};
use futures_util::StreamExt;

use crate::error::{SandboxError, docker_status};

/// Prefix of a disk volume's name; the rest is the workspace volume's stem.
pub(crate) const DISK_PREFIX: &str = "warden-disk-";
/// Prefix of a workspace volume's name.
pub(crate) const WORKSPACE_PREFIX: &str = "warden-ws-";
/// Host-side limit for one helper run (create + mkfs + attach, or detach).
const HELPER_TIMEOUT: Duration = Duration::from_secs(60);
/// Where the helper mounts the disk volume.
const DISK_MOUNT: &str = "/disk";
/// The kernel's loop device allocator, the one device node the helper gets from the host.
const LOOP_CONTROL: &str = "/dev/loop-control";
/// Output a helper may print (a device path or an error line).
const HELPER_OUTPUT_MAX: usize = 4096;

/// Shell prelude of both scripts: device nodes for every loop device the kernel has (a
/// container starts with none), so `losetup` can query them.
const NODES: &str = r#"for s in /sys/block/loop*; do
  [ -e "$s/dev" ] || continue
  n=/dev/${s##*/}
  [ -b "$n" ] || mknod "$n" b "$(cut -d: -f1 "$s/dev")" "$(cut -d: -f2 "$s/dev")"
done
img=/disk/workspace.ext4
attached() {
  key="$(stat -c '%Hd:%Ld %i' "$img")"
  losetup -l -n -O NAME,BACK-MAJ:MIN,BACK-INO | awk -v k="$key" '$2" "$3 == k { print $1 }'
}
"#;

/// Creates the image on first use (sparse ext4 of the limit's size), attaches it to a loop
/// device unless one already backs it (matched by device and inode, as paths differ between
/// containers), and prints the device. `$1` size in bytes, `$2` owner uid:gid of its root.
const ATTACH: &str = r#"set -e
if [ ! -f "$img" ]; then
  # A leftover of an attach that failed half way is started afresh (its blocks, read
  # back through the journal area mkfs leaves unwritten below, would not read as zeros).
  rm -f "$img.new"
  truncate -s "$1" "$img.new"
  # The image is new and sparse, so its journal area already reads as zeros: writing
  # them (32 MiB per workspace, at every cold start and pool fill) is skipped.
  mkfs.ext4 -q -F -m 0 -E "root_owner=$2,lazy_journal_init=1" "$img.new" >&2
  mv "$img.new" "$img"
fi
dev=$(attached | head -n 1)
tries=0
while [ -z "$dev" ]; do
  # The unbound devices the kernel has, in a random order: helpers attaching at once
  # (a burst of new sessions) mostly try different ones, where `losetup -f` gives all of
  # them the same first free device and all but one lose. Attaching a device another
  # helper bound meanwhile fails (EBUSY) and the next one is tried: nothing bound is
  # touched.
  for s in $(ls -d /sys/block/loop* 2>/dev/null | shuf); do
    [ -e "$s/loop" ] && continue
    n=/dev/${s##*/}
    [ -b "$n" ] || mknod "$n" b "$(cut -d: -f1 "$s/dev")" "$(cut -d: -f2 "$s/dev")" 2>/dev/null || continue
    if losetup "$n" "$img" 2>/dev/null; then dev=$n; break; fi
  done
  [ -z "$dev" ] || break
  # None free: the kernel makes one (loop-control). Another helper may take it between
  # the query and the attach: retry after a random pause, so the losers do not meet again.
  free=$(losetup -f)
  [ -b "$free" ] || mknod "$free" b 7 "${free#/dev/loop}" 2>/dev/null || true
  if losetup "$free" "$img" 2>/dev/null; then dev=$free; break; fi
  tries=$((tries + 1))
  [ "$tries" -lt 50 ] || { echo "no free loop device after $tries attempts" >&2; exit 1; }
  sleep "0.$(od -An -N1 -tu1 /dev/urandom | awk '{ printf "%03d", $1 % 200 }')"
done
printf '%s' "$dev""#;

/// Detaches every loop device backed by the image (the volume is removed afterwards).
const DETACH: &str = r#"[ -f "$img" ] || exit 0
for dev in $(attached); do losetup -d "$dev"; done
exit 0"#;

/// Where the fork helper mounts the source's disk volume (read-only).
const SOURCE_DISK_MOUNT: &str = "/source";
/// Where the fork helper mounts the source's workspace volume, to freeze it (never read).
const SOURCE_WORKSPACE_MOUNT: &str = "/frozen";
/// How long the copy in the fork helper may run, seconds: past it the helper thaws the
/// source and fails, well before the host's [`HELPER_TIMEOUT`] removes it (a helper removed
/// while the source is frozen would leave the source session's writes blocked).
const COPY_TIMEOUT_SECS: u32 = 45;

/// Copies the source's image (`/source`) into the disk volume (`/disk`): copy-on-write
/// (reflink) where the Docker host's file system supports it, else a sparse copy. With
/// `$1` = `freeze` the source's file system (mounted by a running container, and here at
/// `/frozen`) is frozen for the copy so the image is consistent, and thawed whatever
/// happens.
const COPY: &str = r#"set -e
[ -f /source/workspace.ext4 ] || { echo "the source session has no workspace image" >&2; exit 1; }
if [ "$1" = freeze ]; then
  fsfreeze -f /frozen
  trap 'fsfreeze -u /frozen' EXIT
fi
timeout "$2" cp --reflink=auto --sparse=always /source/workspace.ext4 "$img.new"
mv "$img.new" "$img"
printf copied"#;

/// Copies the source workspace's tree (`/source`) into the new workspace volume (`/disk`)
/// when workspaces are plain volumes (`sandbox.disk: 0`): links stay links, nothing is
/// followed; copy-on-write per file where the file system can.
const COPY_TREE: &str = r#"set -e
timeout "$2" cp -a --reflink=auto /source/. /disk/
printf copied"#;

/// The disk volume that backs a workspace volume.
pub(crate) fn disk_of(workspace_volume: &str) -> Option<String> {
    workspace_volume.strip_prefix(WORKSPACE_PREFIX).map(|stem| format!("{DISK_PREFIX}{stem}"))
}

/// Creates (or reuses) the disk volume and its image, attaches it, and returns the options of
/// a `local` workspace volume mounting it.
pub(crate) async fn attach(
    docker: &Docker,
    image: &str,
    disk_volume: &str,
    labels: HashMap<String, String>,
    size: u64,
    owner: &str,
) -> Result<HashMap<String, String>, SandboxError> {
    create_volume(docker, disk_volume, &labels, "create disk volume").await?;
    let device = run_helper(docker, image, disk_volume, labels, ATTACH, &[&size.to_string(), owner]).await?;
    let device = device.trim();
    if !device.starts_with("/dev/loop") || device.contains(char::is_whitespace) {
        return Err(SandboxError::Docker {
            action: "attach workspace disk".into(),
            message: format!("the disk helper printed {device:?}, not a loop device"),
        });
    }
    Ok(HashMap::from([
        ("type".to_string(), "ext4".to_string()),
        ("device".to_string(), device.to_string()),
        // Nothing in the workspace can be a set-uid program or a device node.
        ("o".to_string(), "nosuid,nodev".to_string()),
    ]))
}

/// Makes `disk_volume` (new, with `labels`) hold a copy of `source_disk`'s workspace image:
/// copy-on-write where the Docker host's file system can, else sparse. `frozen`: the
/// workspace volume made from the source image while a running container mounts it,
/// frozen (`fsfreeze`) for the copy; `None` when nothing has it mounted (a paused
/// session). The caller attaches the copy as a new session's workspace.
pub(crate) async fn copy(
    docker: &Docker,
    image: &str,
    (source_disk, frozen): (&str, Option<&str>),
    disk_volume: &str,
    labels: HashMap<String, String>,
) -> Result<(), SandboxError> {
    create_volume(docker, disk_volume, &labels, "create disk volume").await?;
    let mut extra = vec![volume_mount(source_disk, SOURCE_DISK_MOUNT, true)];
    extra.extend(frozen.map(|w| volume_mount(w, SOURCE_WORKSPACE_MOUNT, false)));
    let mode = if frozen.is_some() { "freeze" } else { "plain" };
    let args = [mode, &COPY_TIMEOUT_SECS.to_string()];
    let out =
        run_helper_with(docker, image, disk_volume, labels, (COPY, &args), HelperCaps::LoopDevices, extra).await?;
    copied(&out)
}

/// Without `sandbox.disk` (plain volumes): makes the workspace volume `workspace` (new,
/// with `labels`) a copy of the workspace volume `source`'s files.
pub(crate) async fn copy_tree(
    docker: &Docker,
    image: &str,
    source: &str,
    workspace: &str,
    labels: HashMap<String, String>,
) -> Result<(), SandboxError> {
    create_volume(docker, workspace, &labels, "create workspace volume").await?;
    let extra = vec![volume_mount(source, SOURCE_DISK_MOUNT, true)];
    let args = ["plain", &COPY_TIMEOUT_SECS.to_string()];
    let out =
        run_helper_with(docker, image, workspace, labels, (COPY_TREE, &args), HelperCaps::CopyTree, extra).await?;
    copied(&out)
}

/// The copy helpers' output checked.
fn copied(out: &str) -> Result<(), SandboxError> {
    if out.trim() != "copied" {
        return Err(SandboxError::Docker {
            action: "copy workspace".into(),
            message: format!("the disk helper printed {:?}", out.trim()),
        });
    }
    Ok(())
}

/// Creates (or finds) the local volume `name` with `labels`; errors name `action`.
async fn create_volume(
    docker: &Docker,
    name: &str,
    labels: &HashMap<String, String>,
    action: &str,
) -> Result<(), SandboxError> {
    docker
        .create_volume(VolumeCreateOptions {
            name: Some(name.to_string()),
            labels: Some(labels.clone()),
            ..Default::default()
        })
        .await
        .map(drop)
        .map_err(|e| SandboxError::from_docker(action, e))
}

/// A volume mounted into a helper.
fn volume_mount(volume: &str, target: &str, read_only: bool) -> Mount {
    Mount {
        target: Some(target.into()),
        source: Some(volume.to_string()),
        typ: Some(MountTypeEnum::VOLUME),
        read_only: Some(read_only),
        ..Default::default()
    }
}

/// Detaches a disk volume's loop device(s); the caller removes the volume afterwards.
pub(crate) async fn detach(
    docker: &Docker,
    image: &str,
    disk_volume: &str,
    labels: HashMap<String, String>,
) -> Result<(), SandboxError> {
    run_helper(docker, image, disk_volume, labels, DETACH, &[]).await.map(drop)
}

/// Runs `script` as root in a network-less helper container (CAP_SYS_ADMIN + CAP_MKNOD, loop
/// devices only) that mounts only
/// `disk_volume`; returns its stdout, or an error with its stderr.
async fn run_helper(
    docker: &Docker,
    image: &str,
    disk_volume: &str,
    labels: HashMap<String, String>,
    script: &str,
    args: &[&str],
) -> Result<String, SandboxError> {
    run_helper_with(docker, image, disk_volume, labels, (script, args), HelperCaps::LoopDevices, Vec::new()).await
}

/// What a helper may do beyond an unprivileged root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HelperCaps {
    /// Attach, detach and freeze: CAP_SYS_ADMIN and CAP_MKNOD, loop devices only.
    LoopDevices,
    /// Copy a plain workspace's tree keeping owners and modes: CAP_CHOWN, CAP_FOWNER and
    /// CAP_DAC_OVERRIDE (files of any owner), no device at all.
    CopyTree,
}

/// [`run_helper`] with `extra` volumes mounted besides the disk volume (the fork's source).
async fn run_helper_with(
    docker: &Docker,
    image: &str,
    disk_volume: &str,
    labels: HashMap<String, String>,
    (script, args): (&str, &[&str]),
    caps: HelperCaps,
    extra: Vec<Mount>,
) -> Result<String, SandboxError> {
    let mut mounts = vec![volume_mount(disk_volume, DISK_MOUNT, false)];
    mounts.extend(extra);
    let mut cmd = vec!["sh".to_string(), "-c".to_string(), format!("{NODES}{script}"), "warden-disk".to_string()];
    cmd.extend(args.iter().map(|a| a.to_string()));
    let body = ContainerCreateBody {
        image: Some(image.to_string()),
        user: Some("0:0".into()),
        cmd: Some(cmd),
        entrypoint: Some(vec![]),
        labels: Some(labels),
        network_disabled: Some(true),
        host_config: Some(HostConfig {
            // Exactly what attaching a loop device takes: no other capability, no device
            // but loop-control and loop block devices (major 7).
            cap_drop: Some(vec!["ALL".into()]),
            cap_add: Some(match caps {
                HelperCaps::LoopDevices => vec!["SYS_ADMIN".into(), "MKNOD".into()],
                HelperCaps::CopyTree => vec!["CHOWN".into(), "FOWNER".into(), "DAC_OVERRIDE".into()],
            }),
            devices: (caps == HelperCaps::LoopDevices).then(|| {
                vec![DeviceMapping {
                    path_on_host: Some(LOOP_CONTROL.into()),
                    path_in_container: Some(LOOP_CONTROL.into()),
                    cgroup_permissions: Some("rwm".into()),
                }]
            }),
            device_cgroup_rules: (caps == HelperCaps::LoopDevices).then(|| vec!["b 7:* rwm".into()]),
            security_opt: Some(vec!["no-new-privileges:true".into()]),
            network_mode: Some("none".into()),
            mounts: Some(mounts),
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = docker
        .create_container(None::<CreateContainerOptions>, body)
        .await
        .map_err(|e| SandboxError::from_docker("create disk helper", e))?;
    let id = created.id;
    let outcome = tokio::time::timeout(HELPER_TIMEOUT, async {
        docker
            .start_container(&id, None::<StartContainerOptions>)
            .await
            .map_err(|e| SandboxError::from_docker("start disk helper", e))?;
        let mut code = None;
        let mut wait = docker.wait_container(&id, None::<WaitContainerOptions>);
        while let Some(r) = wait.next().await {
            match r {
                Ok(w) => code = Some(w.status_code),
                // bollard reports a non-zero exit as an error carrying the code.
                Err(bollard::errors::Error::DockerContainerWaitError { code: c, .. }) => code = Some(c),
                Err(e) if docker_status(&e).is_some() => {
                    return Err(SandboxError::from_docker("wait for disk helper", e));
                }
                Err(_) => {}
            }
        }
        let (mut out, mut err) = (String::new(), String::new());
        let opts = LogsOptions { stdout: true, stderr: true, ..Default::default() };
        let mut logs = docker.logs(&id, Some(opts));
        while let Some(Ok(chunk)) = logs.next().await {
            let (dst, bytes) = match &chunk {
                bollard::container::LogOutput::StdErr { message } => (&mut err, message),
                other => (&mut out, &other.clone().into_bytes()),
            };
            if dst.len() < HELPER_OUTPUT_MAX {
                dst.push_str(&String::from_utf8_lossy(bytes));
            }
        }
        Ok((code, out, err))
    })
    .await;
    let _ = docker.remove_container(&id, Some(RemoveContainerOptions { force: true, ..Default::default() })).await;
    match outcome {
        Err(_) => Err(SandboxError::Docker {
            action: "workspace disk helper".into(),
            message: format!("did not finish within {HELPER_TIMEOUT:?}"),
        }),
        Ok(Err(e)) => Err(e),
        Ok(Ok((Some(0), out, _))) => Ok(out),
        Ok(Ok((code, _, err))) => Err(SandboxError::Docker {
            action: "workspace disk helper".into(),
            message: format!(
                "exited with {code:?}: {} (sandbox.disk needs an engine that lets a container with CAP_SYS_ADMIN use loop devices, and an image with e2fsprogs and losetup; set `sandbox.disk: 0` to turn the limit off)",
                err.trim()
            ),
        }),
    }
}
