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
//! The helper is the only container warden starts with a capability (CAP_SYS_ADMIN and
//! CAP_MKNOD, loop devices only). It must never run anything
//! but the fixed scripts below (their only inputs are a size and a uid:gid, validated by the
//! config), never mount anything but the session's disk volume, and never have a network.

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
  truncate -s "$1" "$img.new"
  mkfs.ext4 -q -F -m 0 -E "root_owner=$2" "$img.new" >&2
  mv "$img.new" "$img"
fi
dev=$(attached | head -n 1)
tries=0
while [ -z "$dev" ]; do
  # Another helper may take the free device between the query and the attach: retry.
  free=$(losetup -f)
  [ -b "$free" ] || mknod "$free" b 7 "${free#/dev/loop}" 2>/dev/null || true
  if losetup "$free" "$img" 2>/dev/null; then dev=$free; break; fi
  tries=$((tries + 1))
  [ "$tries" -lt 50 ] || { echo "no free loop device after $tries attempts" >&2; exit 1; }
  sleep 0.1
done
printf '%s' "$dev""#;

/// Detaches every loop device backed by the image (the volume is removed afterwards).
const DETACH: &str = r#"[ -f "$img" ] || exit 0
for dev in $(attached); do losetup -d "$dev"; done
exit 0"#;

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
    docker
        .create_volume(VolumeCreateOptions {
            name: Some(disk_volume.to_string()),
            labels: Some(labels.clone()),
            ..Default::default()
        })
        .await
        .map_err(|e| SandboxError::from_docker("create disk volume", e))?;
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
            cap_add: Some(vec!["SYS_ADMIN".into(), "MKNOD".into()]),
            devices: Some(vec![DeviceMapping {
                path_on_host: Some(LOOP_CONTROL.into()),
                path_in_container: Some(LOOP_CONTROL.into()),
                cgroup_permissions: Some("rwm".into()),
            }]),
            device_cgroup_rules: Some(vec!["b 7:* rwm".into()]),
            security_opt: Some(vec!["no-new-privileges:true".into()]),
            network_mode: Some("none".into()),
            mounts: Some(vec![Mount {
                target: Some(DISK_MOUNT.into()),
                source: Some(disk_volume.to_string()),
                typ: Some(MountTypeEnum::VOLUME),
                read_only: Some(false),
                ..Default::default()
            }]),
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
