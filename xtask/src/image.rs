//! The sandbox image `warden-sandbox:bookworm`, made locally when missing (there is no
//! registry to pull from): a debootstrap'ed minimal Debian imported with `docker import`.

use std::fs;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::{apt, process};

pub const SANDBOX_IMAGE: &str = "warden-sandbox:bookworm";
const SUITE: &str = "bookworm";
/// Packages beyond minbase: the agent's interpreter, Glob/Grep's ripgrep, and what the
/// `sandbox.disk` helper runs (mkfs.ext4, losetup).
const INCLUDE: &str = "python3-minimal,ripgrep,ca-certificates,bash,coreutils,e2fsprogs,mount";

/// Makes sure the sandbox image exists; fails loudly when Docker is unreachable.
pub fn ensure() -> Result<()> {
    if !process::succeeds(Command::new("docker").args([
        "version",
        "--format",
        "{{.Server.Version}}",
    ])) {
        bail!(
            "Docker is unreachable (`docker version` failed): the sandbox needs a running Docker \
             Engine that this user can reach (check the daemon, DOCKER_HOST and socket permissions)"
        );
    }
    if process::succeeds(Command::new("docker").args(["image", "inspect", SANDBOX_IMAGE])) {
        println!("xtask: sandbox image {SANDBOX_IMAGE} is present");
        return Ok(());
    }
    println!(
        "xtask: sandbox image {SANDBOX_IMAGE} is missing; building it with debootstrap (~1 min)"
    );
    let debootstrap = ensure_debootstrap()?;

    let rootfs = std::env::temp_dir().join(format!("warden-sandbox-rootfs-{}", std::process::id()));
    let result = bootstrap_and_import(&debootstrap, &rootfs);
    if rootfs.exists()
        && let Err(e) = fs::remove_dir_all(&rootfs) {
            println!("xtask: warning: could not remove {}: {e}", rootfs.display());
        }
    result?;
    println!("xtask: sandbox image {SANDBOX_IMAGE} created");
    Ok(())
}

fn ensure_debootstrap() -> Result<std::path::PathBuf> {
    let find = || {
        process::which("debootstrap").or_else(|| {
            let sbin = std::path::PathBuf::from("/usr/sbin/debootstrap");
            sbin.is_file().then_some(sbin)
        })
    };
    if let Some(path) = find() {
        return Ok(path);
    }
    if !apt::available() {
        bail!(
            "debootstrap is needed to build the sandbox image {SANDBOX_IMAGE}: install it \
             (Debian: apt-get install debootstrap) and run again as root, or create any image \
             with bash and tag it {SANDBOX_IMAGE}"
        );
    }
    apt::install(&["debootstrap"])?;
    find().context("debootstrap is still missing after installing it")
}

fn bootstrap_and_import(debootstrap: &std::path::Path, rootfs: &std::path::Path) -> Result<()> {
    if !process::is_root() {
        bail!("building the sandbox image with debootstrap needs root");
    }
    process::run(
        Command::new(debootstrap)
            .arg("--variant=minbase")
            .arg(format!("--include={INCLUDE}"))
            .arg(SUITE)
            .arg(rootfs),
    )
    .context("debootstrap failed")?;

    println!(
        "  $ tar -C {} -c . | docker import - {SANDBOX_IMAGE}",
        rootfs.display()
    );
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(rootfs)
        .args(["-c", "."])
        .stdout(Stdio::piped())
        .spawn()
        .context("could not start tar")?;
    let tar_out = tar.stdout.take().context("tar has no stdout")?;
    let import = Command::new("docker")
        .args(["import", "-", SANDBOX_IMAGE])
        .stdin(tar_out)
        .status()
        .context("could not start docker import");
    let tar_status = tar.wait().context("waiting for tar")?;
    let import = import?;
    if !tar_status.success() {
        bail!("tar of the sandbox root file system failed ({tar_status})");
    }
    if !import.success() {
        bail!("docker import of {SANDBOX_IMAGE} failed ({import})");
    }
    Ok(())
}
