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
//! A helper is a container lifecycle of its own, as much engine work as the session's
//! container: the attaches of cold starts and pool fills that wait at the same time share
//! one ([`Attacher`], per Docker host), so a burst of new sessions costs a few helpers, not
//! one each.
//!
//! A fork (`Sandbox::fork_session`) copies the source's image into the fork's new disk
//! volume with the same helper (`copy`): copy-on-write where the Docker host's file system
//! supports reflinks, a sparse copy otherwise, with the source's file system frozen
//! meanwhile when a container has it mounted; the same helper attaches the copy, so the
//! fork's container needs none of its own.
//!
//! The helper is the only container warden starts with a capability (CAP_SYS_ADMIN and
//! CAP_MKNOD, loop devices only; to copy a plain workspace's tree, CAP_CHOWN, CAP_FOWNER
//! and CAP_DAC_OVERRIDE and no device). It must never run anything
//! but the fixed scripts below (their only inputs are a size, a uid:gid and a copy mode,
//! chosen by warden), never mount anything but the disk volumes it attaches (several
//! sessions' when attaches are gathered: images it attaches, never mounts or reads) and,
//! to copy, the source session's disk volume read-only and its workspace volume, which it
//! only freezes; it never reads a workspace's files and never has a network.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
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
/// Output a helper may print per stream: a device or an error line of up to 300 bytes per
/// disk volume it attaches (at most [`MAX_DISKS_PER_HELPER`]), or a copy's answer.
const HELPER_OUTPUT_MAX: usize = 16 * 1024;

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

/// Defines `attach_disk`, which creates the image `$img` on first use (sparse ext4 of the
/// limit's size), attaches it to a loop device unless one already backs it (matched by
/// device and inode, as paths differ between containers), and prints the device. `$1` size
/// in bytes, `$2` owner uid:gid of its root. Run with `set -e`, in a subshell.
const ATTACH: &str = r#"attach_disk() {
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
  # The unbound devices the kernel has, in a random order: attaches at once (a burst of
  # new sessions, in one helper or several) mostly try different ones, where `losetup -f`
  # gives all of them the same first free device and all but one lose. Attaching a device
  # another attach bound meanwhile fails (EBUSY) and the next one is tried: nothing bound
  # is touched.
  for s in $(ls -d /sys/block/loop* 2>/dev/null | shuf); do
    [ -e "$s/loop" ] && continue
    n=/dev/${s##*/}
    [ -b "$n" ] || mknod "$n" b "$(cut -d: -f1 "$s/dev")" "$(cut -d: -f2 "$s/dev")" 2>/dev/null || continue
    if losetup "$n" "$img" 2>/dev/null; then dev=$n; break; fi
  done
  [ -z "$dev" ] || break
  # None free: the kernel makes one (loop-control). Another attach may take it between
  # the query and the attach: retry after a random pause, so the losers do not meet again.
  free=$(losetup -f)
  [ -b "$free" ] || mknod "$free" b 7 "${free#/dev/loop}" 2>/dev/null || true
  if losetup "$free" "$img" 2>/dev/null; then dev=$free; break; fi
  tries=$((tries + 1))
  [ "$tries" -lt 50 ] || { echo "no free loop device after $tries attempts" >&2; exit 1; }
  sleep "0.$(od -An -N1 -tu1 /dev/urandom | awk '{ printf "%03d", $1 % 200 }')"
done
printf '%s' "$dev"
}
"#;

/// Attaches the disk volumes mounted at `/disk/0`, `/disk/1`, ... at once, each in its own
/// subshell; `$@` holds a size and an owner per volume, in that order. Prints `<index>
/// <device>` per attached volume on stdout and `<index> <error>` per failed one on stderr;
/// exits 0 either way (each volume's outcome is its own).
const ATTACH_ALL: &str = r#"count=0
while [ "$#" -ge 2 ]; do
  ( set -e; img=/disk/$count/workspace.ext4; attach_disk "$1" "$2" ) >"/tmp/dev.$count" 2>"/tmp/err.$count" &
  count=$((count + 1))
  shift 2
done
wait
i=0
while [ "$i" -lt "$count" ]; do
  if [ -s "/tmp/dev.$i" ]; then
    printf '%s %s\n' "$i" "$(cat "/tmp/dev.$i")"
  else
    printf '%s %s\n' "$i" "$(head -c 300 "/tmp/err.$i" | tr '\n' ' ')" >&2
  fi
  i=$((i + 1))
done"#;

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
/// while the source is frozen would leave the source session's writes blocked). The copy's
/// attach runs after the thaw, so it never holds the source frozen.
const COPY_TIMEOUT_SECS: u32 = 45;

/// Copies the source's image (`/source`) into the disk volume (`/disk`): copy-on-write
/// (reflink) where the Docker host's file system supports it, else a sparse copy. With
/// `$1` = `freeze` the source's file system (mounted by a running container, and here at
/// `/frozen`) is frozen for the copy so the image is consistent, and thawed whatever
/// happens. With `$3` (size) and `$4` (owner) the copy is attached too, as `attach_disk`
/// does, and its device printed after `copied`: the new session's container needs it
/// next, and this saves it a helper of its own.
const COPY: &str = r#"set -e
[ -f /source/workspace.ext4 ] || { echo "the source session has no workspace image" >&2; exit 1; }
if [ "$1" = freeze ]; then
  fsfreeze -f /frozen
  trap 'fsfreeze -u /frozen' EXIT
fi
timeout "$2" cp --reflink=auto --sparse=always /source/workspace.ext4 "$img.new"
mv "$img.new" "$img"
# The source thaws before the copy is attached: its writes wait for the copy only.
if [ "$1" = freeze ]; then
  fsfreeze -u /frozen
  trap - EXIT
fi
if [ "$#" -ge 4 ]; then
  dev=$(attach_disk "$3" "$4")
  printf 'copied %s' "$dev"
else
  printf copied
fi"#;

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

/// Most disk volumes one helper attaches: a burst's attaches beyond it wait for the next
/// helper (a container's mounts are fixed when it is made, so one helper serves only the
/// volumes gathered before it starts).
const MAX_DISKS_PER_HELPER: usize = 32;
/// Helpers attaching at once on one Docker host: a second one starts while the first
/// runs, so a lone cold start never waits behind a burst's helper, and more add engine
/// load without serving anyone sooner (each gathers every attach waiting when it starts).
const MAX_ATTACH_HELPERS: usize = 2;
/// How long a helper that starts while another runs waits for more attaches before it
/// takes what waits: the others of a burst arrive within this (their cold starts began
/// together), where the first helper starts at once, so a lone cold start never waits.
const GATHER_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);
/// Longest wait of one attach for its helper's answer: the helper running when it queued
/// and its own, each bounded by [`HELPER_TIMEOUT`], and the gathering pause. Past it the
/// cold start fails with an error instead of waiting on a helper that will not come.
const ATTACH_WAIT: std::time::Duration =
    Duration::from_secs(2 * HELPER_TIMEOUT.as_secs() + 1).saturating_add(GATHER_PAUSE);

/// The disk attaches of one Docker host, gathered: every cold start (and pool fill) needs
/// its disk image attached by a disk helper, a container lifecycle of its own, as much
/// engine work as the session container itself. A burst of new sessions would start one
/// helper each; here the attaches waiting at the same time share a helper
/// ([`MAX_DISKS_PER_HELPER`], at most [`MAX_ATTACH_HELPERS`] running), so a burst of 20
/// cold starts costs about two helpers instead of 20.
pub(crate) struct Attacher {
    /// The sandbox image, which the helpers run.
    image: String,
    /// The labels of a helper container (managed and scoped, so a leftover one is pruned).
    labels: HashMap<String, String>,
    queue: std::sync::Mutex<AttachQueue>,
    /// Helpers run, and the disks they attached (`disk_helpers_total`, `disks_attached_total`).
    helpers_run: AtomicU64,
    disks_attached: AtomicU64,
}

/// Attaches waiting for a helper, and how many helpers run.
#[derive(Default)]
struct AttachQueue {
    waiting: Vec<AttachRequest>,
    helpers: usize,
}

/// One disk volume to attach, and where its answer goes.
struct AttachRequest {
    disk_volume: String,
    size: u64,
    owner: String,
    answer: tokio::sync::oneshot::Sender<Result<String, SandboxError>>,
}

impl Attacher {
    /// The attacher of one Docker host, whose helpers run `image` labelled `labels`.
    pub(crate) fn new(image: &str, labels: HashMap<String, String>) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self {
            image: image.to_string(),
            labels,
            queue: Default::default(),
            helpers_run: AtomicU64::new(0),
            disks_attached: AtomicU64::new(0),
        })
    }

    /// Creates (or reuses) the disk volume `disk_volume` (with `labels`) and its image of
    /// `size` bytes whose root `owner` (uid:gid) owns, attaches it, and returns the options
    /// of a `local` workspace volume mounting it.
    pub(crate) async fn attach(
        self: &std::sync::Arc<Self>,
        docker: &Docker,
        disk_volume: &str,
        labels: &HashMap<String, String>,
        size: u64,
        owner: &str,
    ) -> Result<VolumeOptions, SandboxError> {
        create_volume(docker, disk_volume, labels, "create disk volume").await?;
        let (answer, device) = tokio::sync::oneshot::channel();
        let request = AttachRequest { disk_volume: disk_volume.to_string(), size, owner: owner.to_string(), answer };
        let start_helper = {
            let mut queue = self.queue.lock().expect("attach queue lock");
            queue.waiting.push(request);
            let start = queue.helpers < MAX_ATTACH_HELPERS;
            queue.helpers += usize::from(start);
            // Another helper runs: this one gathers first.
            start.then_some(queue.helpers > 1)
        };
        if let Some(gather) = start_helper {
            // A task of its own: the helper serves other callers too, so it must not end
            // when this caller's future is dropped.
            tokio::spawn(self.clone().run_helpers(docker.clone(), gather));
        }
        let device = match tokio::time::timeout(ATTACH_WAIT, device).await {
            Ok(Ok(device)) => device?,
            Ok(Err(_)) => {
                return Err(SandboxError::Docker {
                    action: "attach workspace disk".into(),
                    message: "the disk helper's task ended without an answer".into(),
                });
            }
            Err(_) => {
                return Err(SandboxError::Docker {
                    action: "attach workspace disk".into(),
                    message: format!("no disk helper answered within {ATTACH_WAIT:?}"),
                });
            }
        };
        Ok(workspace_volume_options(device))
    }

    /// Helpers run and disks they attached so far.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (self.helpers_run.load(Ordering::Relaxed), self.disks_attached.load(Ordering::Relaxed))
    }

    /// Runs helpers while attaches wait, each taking all of them (up to the limit); with
    /// `gather`, after [`GATHER_PAUSE`].
    async fn run_helpers(self: std::sync::Arc<Self>, docker: Docker, gather: bool) {
        if gather {
            tokio::time::sleep(GATHER_PAUSE).await;
        }
        loop {
            let batch: Vec<AttachRequest> = {
                let mut queue = self.queue.lock().expect("attach queue lock");
                // A caller that gave up (its call timed out, its pool fill was dropped) is
                // not served: its volume may be gone by now, and the helper would make it
                // again, unlabelled, and attach an image nobody removes.
                queue.waiting.retain(|r| !r.answer.is_closed());
                if queue.waiting.is_empty() {
                    queue.helpers -= 1;
                    return;
                }
                let take = queue.waiting.len().min(MAX_DISKS_PER_HELPER);
                queue.waiting.drain(..take).collect()
            };
            let began = std::time::Instant::now();
            let mounts = batch
                .iter()
                .enumerate()
                .map(|(i, r)| volume_mount(&r.disk_volume, &format!("{DISK_MOUNT}/{i}"), false))
                .collect();
            let args: Vec<String> = batch.iter().flat_map(|r| [r.size.to_string(), r.owner.clone()]).collect();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let script = format!("{ATTACH}{ATTACH_ALL}");
            let outcome = run_helper_with(
                &docker,
                &self.image,
                self.labels.clone(),
                (&script, &args),
                HelperCaps::LoopDevices,
                mounts,
            )
            .await;
            tracing::debug!(disks = batch.len(), took_ms = began.elapsed().as_millis() as u64, "disk helper attached");
            self.helpers_run.fetch_add(1, Ordering::Relaxed);
            match outcome {
                Ok(output) => {
                    let devices = attached_devices(&output.stdout, &output.stderr, batch.len());
                    let attached = devices.iter().filter(|d| d.is_ok()).count();
                    self.disks_attached.fetch_add(attached as u64, Ordering::Relaxed);
                    for (request, device) in batch.into_iter().zip(devices) {
                        let _ = request.answer.send(device);
                    }
                }
                Err(e) => {
                    let message = e.to_string();
                    for request in batch {
                        let _ = request.answer.send(Err(SandboxError::Docker {
                            action: "attach workspace disk".into(),
                            message: message.clone(),
                        }));
                    }
                }
            }
        }
    }
}

/// Each of `count` volumes' device from a gathered helper's output ([`ATTACH_ALL`]): a
/// line `<index> /dev/loopN` on stdout, else the error its line on stderr gives.
fn attached_devices(stdout: &str, stderr: &str, count: usize) -> Vec<Result<String, SandboxError>> {
    let line_of = |text: &str, i: usize| {
        text.lines().find_map(|l| {
            l.split_once(' ').filter(|(n, _)| n.parse() == Ok(i)).map(|(_, rest)| rest.trim().to_string())
        })
    };
    (0..count)
        .map(|i| match line_of(stdout, i) {
            Some(printed) => loop_device(&printed),
            None => Err(SandboxError::Docker {
                action: "attach workspace disk".into(),
                message: format!(
                    "{} (sandbox.disk needs an engine that lets a container with CAP_SYS_ADMIN use loop devices, and an image with e2fsprogs and losetup; set `sandbox.disk: 0` to turn the limit off)",
                    line_of(stderr, i).unwrap_or_else(|| "the disk helper gave no device".into())
                ),
            }),
        })
        .collect()
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
    attach: Option<(u64, &str)>,
) -> Result<Option<VolumeOptions>, SandboxError> {
    create_volume(docker, disk_volume, &labels, "create disk volume").await?;
    let mut mounts =
        vec![volume_mount(disk_volume, DISK_MOUNT, false), volume_mount(source_disk, SOURCE_DISK_MOUNT, true)];
    mounts.extend(frozen.map(|w| volume_mount(w, SOURCE_WORKSPACE_MOUNT, false)));
    let mode = if frozen.is_some() { "freeze" } else { "plain" };
    let timeout = COPY_TIMEOUT_SECS.to_string();
    let size = attach.map(|(size, _)| size.to_string());
    let mut args = vec![mode, &timeout];
    if let (Some(size), Some((_, owner))) = (&size, attach) {
        args.extend([size.as_str(), owner]);
    }
    let script = format!("{ATTACH}{COPY}");
    let out = run_helper_with(docker, image, labels, (&script, &args), HelperCaps::LoopDevices, mounts).await?;
    match (out.stdout.trim().strip_prefix("copied"), attach) {
        (Some(""), None) => Ok(None),
        (Some(device), Some(_)) => loop_device(device.trim()).map(|d| Some(workspace_volume_options(d))),
        _ => copied(&out.stdout).map(|()| None),
    }
}

/// The options of a `local` workspace volume: the ext4 file system on a disk image's
/// loop device.
pub(crate) type VolumeOptions = HashMap<String, String>;

/// [`VolumeOptions`] for the ext4 file system on `device`.
fn workspace_volume_options(device: String) -> VolumeOptions {
    HashMap::from([
        ("type".to_string(), "ext4".to_string()),
        ("device".to_string(), device),
        // Nothing in the workspace can be a set-uid program or a device node.
        ("o".to_string(), "nosuid,nodev".to_string()),
    ])
}

/// `printed` when it is one loop device, else the error saying what the helper printed.
fn loop_device(printed: &str) -> Result<String, SandboxError> {
    if printed.starts_with("/dev/loop") && !printed.contains(char::is_whitespace) {
        Ok(printed.to_string())
    } else {
        Err(SandboxError::Docker {
            action: "attach workspace disk".into(),
            message: format!("the disk helper printed {printed:?}, not a loop device"),
        })
    }
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
    let mounts = vec![volume_mount(workspace, DISK_MOUNT, false), volume_mount(source, SOURCE_DISK_MOUNT, true)];
    let args = ["plain", &COPY_TIMEOUT_SECS.to_string()];
    let out = run_helper_with(docker, image, labels, (COPY_TREE, &args), HelperCaps::CopyTree, mounts).await?;
    copied(&out.stdout)
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
    let mounts = vec![volume_mount(disk_volume, DISK_MOUNT, false)];
    run_helper_with(docker, image, labels, (DETACH, &[]), HelperCaps::LoopDevices, mounts).await.map(drop)
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

/// What a helper that exited 0 printed (each stream cut at [`HELPER_OUTPUT_MAX`]).
struct HelperOutput {
    stdout: String,
    stderr: String,
}

/// Runs `script` as root in a network-less helper container with `caps` that mounts only
/// `mounts` (disk volumes, and a fork's source); returns what it printed, or an error
/// with its stderr when it exits non-zero.
async fn run_helper_with(
    docker: &Docker,
    image: &str,
    labels: HashMap<String, String>,
    (script, args): (&str, &[&str]),
    caps: HelperCaps,
    mounts: Vec<Mount>,
) -> Result<HelperOutput, SandboxError> {
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
        Ok(Ok((Some(0), stdout, stderr))) => Ok(HelperOutput { stdout, stderr }),
        Ok(Ok((code, _, err))) => Err(SandboxError::Docker {
            action: "workspace disk helper".into(),
            message: format!(
                "exited with {code:?}: {} (sandbox.disk needs an engine that lets a container with CAP_SYS_ADMIN use loop devices, and an image with e2fsprogs and losetup; set `sandbox.disk: 0` to turn the limit off)",
                err.trim()
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gathered_helpers_output_answers_each_volume_on_its_own() {
        let stdout = "2 /dev/loop7\n0 /dev/loop3\n3 /dev/loop 9\n";
        let stderr = "1 no free loop device after 50 attempts \n";
        let devices = attached_devices(stdout, stderr, 5);
        assert_eq!(devices[0].as_deref().ok(), Some("/dev/loop3"));
        let err = devices[1].as_ref().unwrap_err().to_string();
        assert!(err.contains("no free loop device after 50 attempts"), "{err}");
        assert_eq!(devices[2].as_deref().ok(), Some("/dev/loop7"));
        // A line that is not one device is refused, not passed on as volume options.
        let err = devices[3].as_ref().unwrap_err().to_string();
        assert!(err.contains("not a loop device"), "{err}");
        // Nothing printed for it at all.
        let err = devices[4].as_ref().unwrap_err().to_string();
        assert!(err.contains("gave no device"), "{err}");
        // Index 10 is not index 1.
        let devices = attached_devices("10 /dev/loop1\n", "", 2);
        assert!(devices[1].is_err());
    }
}
