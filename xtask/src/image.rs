//! The sandbox image `warden-sandbox:bookworm`, made locally (there is no registry to pull
//! from): a debootstrap'ed minimal Debian, the Debian packages of `sandbox/image/packages.txt`
//! installed with apt-get in a chroot, the Python packages of
//! `sandbox/image/python-packages.txt` installed with pip into the virtualenv [`VENV`] (their
//! console scripts linked into [`LINK_DIR`], on the sandbox's `PATH`), then `docker import`.
//!
//! The image carries the digest of its recipe (the two lists, [`INCLUDE`], [`SUITE`],
//! [`RECIPE_VERSION`]) in the label [`RECIPE_LABEL`]; `ensure` builds the image when it is
//! missing and rebuilds it when that label is missing or differs ("recipe changed").
//!
//! Owns the image's contents and the temporary root file system they are built in. Never
//! removes or archives that root file system while anything is mounted beneath it (a
//! bind-mounted `/dev` would be emptied on the host, or archived into the image), and never
//! leaves build-time host files (resolver configuration, CA bundle) in the image.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::layout::Layout;
use crate::{apt, process};

pub const SANDBOX_IMAGE: &str = "warden-sandbox:bookworm";
const SUITE: &str = "bookworm";
/// Packages beyond minbase that the sandbox itself needs, so not left to the editable list:
/// the agent's interpreter, Glob/Grep's ripgrep, and what the `sandbox.disk` helper runs
/// (mkfs.ext4, losetup).
const INCLUDE: &str = "python3-minimal,ripgrep,ca-certificates,bash,coreutils,e2fsprogs,mount";
/// Debian packages for the agents (one per line, `#` comments), relative to the workspace root.
const PACKAGES_FILE: &str = "sandbox/image/packages.txt";
/// Pinned pip requirements baked into [`VENV`], relative to the workspace root.
const PYTHON_PACKAGES_FILE: &str = "sandbox/image/python-packages.txt";
/// Version of the build steps below: bump it whenever they change what the image holds, so
/// existing images are rebuilt (the lists are part of the digest on their own).
const RECIPE_VERSION: u32 = 1;
/// Image label holding the recipe digest the image was built from.
const RECIPE_LABEL: &str = "warden.image.recipe";
/// The virtualenv holding `python-packages.txt`: kept apart from Debian's Python so pip
/// never fights apt over /usr/lib/python3 (PEP 668).
const VENV: &str = "/opt/warden/venv";
/// Where the listed Python packages' console scripts are linked: first on the `PATH` the
/// sandbox gives every command (sandbox/src/container.rs `CONTAINER_PATH`) and empty in
/// Debian, so nothing needs to change in the sandbox for them to be found.
const LINK_DIR: &str = "/usr/local/bin";
/// `PATH` for the build steps run in the chroot (the image's own default).
const CHROOT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Where the host's CA bundle is put in the chroot while pip runs (removed afterwards):
/// behind a TLS-inspecting proxy PyPI only verifies with the host's bundle.
const BUILD_CA: &str = "/tmp/warden-build-ca.pem";
/// The requirements file inside the chroot while pip runs (removed afterwards).
const BUILD_REQUIREMENTS: &str = "/tmp/warden-requirements.txt";
/// [`LINK_SCRIPT`] inside the chroot while it runs (removed afterwards).
const BUILD_LINK_SCRIPT: &str = "/tmp/warden-link-scripts.py";
/// Host environment variables passed into the chroot's apt-get and pip (proxies, indexes);
/// everything else of the host's environment stays out.
const PASSED_ENV: &[&str] = &[
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_DEFAULT_TIMEOUT",
];
/// Host variables naming the CA bundle pip should trust, in order of preference.
const CA_ENV: &[&str] = &["PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"];

/// Links the console scripts of the listed distributions into the link directory; refuses a
/// name that any directory of the default `PATH` already has (it would shadow or be shadowed).
/// Runs in the chroot with the venv's interpreter: argv = venv bin, link dir, path, names...
const LINK_SCRIPT: &str = r#"import os, sys, importlib.metadata as md
venv_bin, link_dir, path = sys.argv[1], sys.argv[2], sys.argv[3].split(":")
for name in sys.argv[4:]:
    scripts = [ep.name for ep in md.distribution(name).entry_points if ep.group == "console_scripts"]
    if not scripts:
        print(f"  {name}: no console scripts")
    for script in scripts:
        taken = [d for d in path if os.path.lexists(os.path.join(d, script))]
        if taken:
            sys.exit(f"{script} (from {name}) is already in {taken[0]}: it would shadow or be shadowed")
        os.symlink(os.path.join(venv_bin, script), os.path.join(link_dir, script))
        print(f"  {link_dir}/{script} -> {venv_bin}/{script} ({name})")
"#;

/// What goes into the image beyond [`INCLUDE`], read from the two lists.
struct Recipe {
    debian: Vec<String>,
    python: Vec<String>,
}

impl Recipe {
    fn load(layout: &Layout) -> Result<Self> {
        let debian = read_list(&layout.root.join(PACKAGES_FILE))?;
        for name in &debian {
            if !valid_debian_name(name) {
                bail!("{PACKAGES_FILE}: {name:?} is not a Debian package name");
            }
        }
        let python = read_list(&layout.root.join(PYTHON_PACKAGES_FILE))?;
        for req in &python {
            if req.starts_with('-') || requirement_name(req).is_none() {
                bail!(
                    "{PYTHON_PACKAGES_FILE}: {req:?} is not a requirement (`name==version`; \
                     pip options are not accepted)"
                );
            }
        }
        if !python.is_empty() && !debian.iter().any(|p| p == "python3-venv") {
            bail!("{PYTHON_PACKAGES_FILE} needs python3-venv in {PACKAGES_FILE}");
        }
        Ok(Self { debian, python })
    }

    /// SHA-256 of everything that decides the image's contents (comments and blank lines
    /// excluded, so editing them rebuilds nothing).
    fn digest(&self) -> Result<String> {
        let text = format!(
            "warden sandbox image recipe v{RECIPE_VERSION}\nsuite {SUITE}\ninclude {INCLUDE}\n\
             venv {VENV}\nlinks {LINK_DIR}\n[debian]\n{}\n[python]\n{}\n",
            self.debian.join("\n"),
            self.python.join("\n"),
        );
        sha256(text.as_bytes())
    }
}

/// The non-comment, non-blank lines of a list, trimmed.
fn read_list(path: &Path) -> Result<Vec<String>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .map(|line| line.split('#').next().unwrap_or("").trim())
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect())
}

/// Debian policy package names (optionally `=version` or `:arch`), never an option.
fn valid_debian_name(name: &str) -> bool {
    let base = name.split(['=', ':']).next().unwrap_or("");
    base.len() >= 2
        && base.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && base.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c))
        && !name.contains(char::is_whitespace)
}

/// The distribution name a requirement line starts with (`mcp-server-git==1` → `mcp-server-git`).
fn requirement_name(req: &str) -> Option<&str> {
    let end = req.find(|c: char| !(c.is_ascii_alphanumeric() || "._-".contains(c))).unwrap_or(req.len());
    Some(&req[..end]).filter(|name| !name.is_empty())
}

fn sha256(data: &[u8]) -> Result<String> {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("could not start sha256sum")?;
    child.stdin.take().context("sha256sum has no stdin")?.write_all(data).context("writing to sha256sum")?;
    let out = child.wait_with_output().context("waiting for sha256sum")?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.split_whitespace().next() {
        Some(hex) if out.status.success() && hex.len() == 64 => Ok(hex.to_owned()),
        _ => bail!("sha256sum failed ({})", out.status),
    }
}

/// The recipe label of the image: `None` when the image is missing, `Some("")` when it has none.
fn image_recipe() -> Option<String> {
    let format = format!("{{{{index .Config.Labels \"{RECIPE_LABEL}\"}}}}");
    process::stdout_of(Command::new("docker").args(["image", "inspect", "--format", &format, SANDBOX_IMAGE]))
        .map(|label| label.trim().trim_start_matches("<no value>").to_owned())
}

fn image_size() -> Option<u64> {
    process::stdout_of(Command::new("docker").args(["image", "inspect", "--format", "{{.Size}}", SANDBOX_IMAGE]))
        .and_then(|size| size.trim().parse().ok())
}

fn image_id() -> Option<String> {
    process::stdout_of(Command::new("docker").args(["image", "inspect", "--format", "{{.Id}}", SANDBOX_IMAGE]))
        .map(|id| id.trim().to_owned())
}

fn megabytes(bytes: Option<u64>) -> String {
    bytes.map_or("size unknown".into(), |b| format!("{:.0} MB", b as f64 / 1e6))
}

/// Makes sure the sandbox image exists and was built from the current recipe; fails loudly
/// when Docker is unreachable.
pub fn ensure(layout: &Layout) -> Result<()> {
    if !process::succeeds(Command::new("docker").args(["version", "--format", "{{.Server.Version}}"])) {
        bail!(
            "Docker is unreachable (`docker version` failed): the sandbox needs a running Docker \
             Engine that this user can reach (check the daemon, DOCKER_HOST and socket permissions)"
        );
    }
    let recipe = Recipe::load(layout)?;
    let digest = recipe.digest()?;
    let short = &digest[..12];
    let old_id = match image_recipe() {
        Some(label) if label == digest => {
            println!("xtask: sandbox image {SANDBOX_IMAGE} is present (recipe {short}, {})", megabytes(image_size()));
            return Ok(());
        }
        Some(label) => {
            let was = if label.is_empty() { "no recipe label" } else { &label[..label.len().min(12)] };
            println!(
                "xtask: sandbox image {SANDBOX_IMAGE}: recipe changed (image: {was}, recipe: {short}); \
                 rebuilding it with debootstrap (~2 min)"
            );
            image_id()
        }
        None => {
            println!("xtask: sandbox image {SANDBOX_IMAGE} is missing; building it with debootstrap (~2 min)");
            None
        }
    };
    let debootstrap = ensure_debootstrap().and_then(|path| {
        if !process::is_root() {
            bail!("building the sandbox image with debootstrap needs root");
        }
        Ok(path)
    });
    let debootstrap = match (debootstrap, &old_id) {
        (Ok(path), _) => path,
        // An image made another way (tagged by hand, built elsewhere) stays usable.
        (Err(e), Some(_)) => {
            println!("xtask: warning: keeping the existing {SANDBOX_IMAGE}, it cannot be rebuilt here: {e:#}");
            return Ok(());
        }
        (Err(e), None) => return Err(e),
    };

    let started = Instant::now();
    let rootfs = std::env::temp_dir().join(format!("warden-sandbox-rootfs-{}", std::process::id()));
    let result = build_rootfs(&debootstrap, &rootfs, &recipe).and_then(|()| import(&rootfs, &digest));
    remove_rootfs(&rootfs);
    result?;
    println!(
        "xtask: sandbox image {SANDBOX_IMAGE} created in {:.0} s (recipe {short}, {})",
        started.elapsed().as_secs_f64(),
        megabytes(image_size())
    );
    // The replaced image, unless a container still uses it (then Docker refuses; harmless).
    if let Some(old) = old_id.filter(|old| image_id().as_ref() != Some(old)) {
        let _ = process::succeeds(Command::new("docker").args(["image", "rm", &old]));
    }
    Ok(())
}

fn ensure_debootstrap() -> Result<PathBuf> {
    let find = || {
        process::which("debootstrap").or_else(|| {
            let sbin = PathBuf::from("/usr/sbin/debootstrap");
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

/// debootstrap, then the two lists installed in a chroot; everything mounted for that is
/// unmounted before this returns, on failure too.
fn build_rootfs(debootstrap: &Path, rootfs: &Path, recipe: &Recipe) -> Result<()> {
    process::run(
        Command::new(debootstrap).arg("--variant=minbase").arg(format!("--include={INCLUDE}")).arg(SUITE).arg(rootfs),
    )
    .context("debootstrap failed")?;

    let result = Chroot::enter(rootfs).and_then(|chroot| chroot.install(recipe));
    unmount_all(rootfs)?;
    result
}

/// The root file system mounted for installing into it: `/proc` and `/dev`, the host's
/// resolver configuration, no service starts. Undone by [`unmount_all`] and `finish`.
struct Chroot<'a> {
    root: &'a Path,
}

impl<'a> Chroot<'a> {
    fn enter(root: &'a Path) -> Result<Self> {
        process::run(Command::new("mount").args(["-t", "proc", "proc"]).arg(root.join("proc")))?;
        process::run(Command::new("mount").arg("--bind").arg("/dev").arg(root.join("dev")))?;
        let resolv = root.join("etc/resolv.conf");
        let _ = fs::remove_file(&resolv);
        fs::copy("/etc/resolv.conf", &resolv).context("copying /etc/resolv.conf into the chroot")?;
        // Packages must not start services in the build root (invoke-rc.d asks this).
        write_executable(&root.join("usr/sbin/policy-rc.d"), "#!/bin/sh\nexit 101\n")?;
        Ok(Self { root })
    }

    /// `program args` run inside the chroot with a clean environment (plus proxies).
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("chroot");
        cmd.arg(self.root).arg(program).env_clear();
        cmd.env("PATH", CHROOT_PATH)
            .env("HOME", "/root")
            .env("LC_ALL", "C.UTF-8")
            .env("DEBIAN_FRONTEND", "noninteractive");
        for name in PASSED_ENV {
            if let Some(value) = std::env::var_os(name) {
                cmd.env(name, value);
            }
        }
        cmd
    }

    fn install(self, recipe: &Recipe) -> Result<()> {
        let result = self.install_packages(recipe);
        // Build-time files go even when a step failed (the root is removed then anyway).
        let finished = self.finish();
        result.and(finished)
    }

    fn install_packages(&self, recipe: &Recipe) -> Result<()> {
        if !recipe.debian.is_empty() {
            process::run(self.command("apt-get").arg("update")).context("apt-get update in the image")?;
            process::run(
                self.command("apt-get").args(["install", "-y", "--no-install-recommends"]).args(&recipe.debian),
            )
            .with_context(|| format!("installing {PACKAGES_FILE} in the image"))?;
        }
        if recipe.python.is_empty() {
            return Ok(());
        }
        process::run(self.command("python3").args(["-m", "venv", VENV]))
            .context("creating the image's Python virtualenv")?;
        self.write(BUILD_REQUIREMENTS, &(recipe.python.join("\n") + "\n"))?;
        let mut pip = self.command(&format!("{VENV}/bin/pip"));
        pip.args(["install", "--no-cache-dir", "--disable-pip-version-check", "--no-input", "-r"])
            .arg(BUILD_REQUIREMENTS);
        if let Some(bundle) = CA_ENV.iter().filter_map(std::env::var_os).map(PathBuf::from).find(|p| p.is_file()) {
            fs::copy(&bundle, self.path(BUILD_CA))
                .with_context(|| format!("copying {} into the chroot", bundle.display()))?;
            pip.env("PIP_CERT", BUILD_CA);
        }
        process::run(&mut pip).with_context(|| format!("installing {PYTHON_PACKAGES_FILE} in the image"))?;
        let names = recipe.python.iter().filter_map(|r| requirement_name(r));
        self.write(BUILD_LINK_SCRIPT, LINK_SCRIPT)?;
        process::run(
            self.command(&format!("{VENV}/bin/python"))
                .args([BUILD_LINK_SCRIPT, &format!("{VENV}/bin"), LINK_DIR, CHROOT_PATH])
                .args(names),
        )
        .context("linking the Python packages' commands")
    }

    /// Removes what only the build needed: apt's caches and lists, the build files, the
    /// host's resolver configuration (Docker provides its own to containers).
    fn finish(&self) -> Result<()> {
        let _ = process::succeeds(self.command("apt-get").arg("clean"));
        for file in ["/usr/sbin/policy-rc.d", BUILD_CA, BUILD_REQUIREMENTS, BUILD_LINK_SCRIPT] {
            let path = self.path(file);
            if path.exists() {
                fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
            }
        }
        for dir in ["var/lib/apt/lists", "root/.cache"] {
            let path = self.root.join(dir);
            if path.is_dir() {
                for entry in fs::read_dir(&path)? {
                    let entry = entry?.path();
                    if entry.file_name().is_some_and(|n| n == "lock" || n == "partial") {
                        continue;
                    }
                    if entry.is_dir() {
                        fs::remove_dir_all(&entry)?;
                    } else {
                        fs::remove_file(&entry)?;
                    }
                }
            }
        }
        fs::write(self.root.join("etc/resolv.conf"), "").context("emptying the image's resolv.conf")
    }

    fn path(&self, absolute: &str) -> PathBuf {
        self.root.join(absolute.trim_start_matches('/'))
    }

    fn write(&self, absolute: &str, text: &str) -> Result<()> {
        let path = self.path(absolute);
        fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
    }
}

fn write_executable(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("making {} executable", path.display()))
}

/// Mount points at or beneath `root`, in mount order (from /proc/self/mountinfo).
fn mounts_under(root: &Path) -> Vec<PathBuf> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|point| PathBuf::from(point.replace("\\040", " ")))
        .filter(|point| point.starts_with(root))
        .collect()
}

/// Unmounts everything beneath `root`, innermost (latest) first; fails if anything stays.
fn unmount_all(root: &Path) -> Result<()> {
    for point in mounts_under(root).iter().rev() {
        if !process::succeeds(Command::new("umount").arg(point)) {
            // Busy (a straggling process): detach it now, it goes when released.
            let _ = process::succeeds(Command::new("umount").arg("--lazy").arg(point));
        }
    }
    let left = mounts_under(root);
    if !left.is_empty() {
        bail!("still mounted beneath the image root: {left:?}");
    }
    Ok(())
}

/// Removes the build root, unless something is still mounted beneath it.
fn remove_rootfs(rootfs: &Path) {
    if !rootfs.exists() {
        return;
    }
    if let Err(e) = unmount_all(rootfs) {
        println!("xtask: warning: not removing {}: {e:#}", rootfs.display());
        return;
    }
    if let Err(e) = fs::remove_dir_all(rootfs) {
        println!("xtask: warning: could not remove {}: {e}", rootfs.display());
    }
}

/// `tar | docker import` with the recipe label.
fn import(rootfs: &Path, digest: &str) -> Result<()> {
    if !mounts_under(rootfs).is_empty() {
        bail!("refusing to archive {}: something is still mounted beneath it", rootfs.display());
    }
    let label = format!("LABEL {RECIPE_LABEL}={digest}");
    println!("  $ tar -C {} -c . | docker import --change '{label}' - {SANDBOX_IMAGE}", rootfs.display());
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(rootfs)
        .args(["-c", "."])
        .stdout(Stdio::piped())
        .spawn()
        .context("could not start tar")?;
    let tar_out = tar.stdout.take().context("tar has no stdout")?;
    let import = Command::new("docker")
        .args(["import", "--change", &label, "-", SANDBOX_IMAGE])
        .stdin(tar_out)
        .stdout(Stdio::null())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_drop_comments_and_blanks() {
        let dir = std::env::temp_dir().join(format!("xtask-image-list-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("list.txt");
        fs::write(&file, "# head\n\ngit  # vcs\n  jq\n#python3\n").unwrap();
        assert_eq!(read_list(&file).unwrap(), ["git", "jq"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn debian_names_are_checked() {
        for ok in ["git", "python3-pip", "g++", "libc6:amd64", "jq=1.6-2.1"] {
            assert!(valid_debian_name(ok), "{ok}");
        }
        for bad in ["-oAPT::Foo=1", "Git", "a", "git curl", ""] {
            assert!(!valid_debian_name(bad), "{bad}");
        }
    }

    #[test]
    fn requirement_names() {
        assert_eq!(requirement_name("mcp-server-git==2026.10.19"), Some("mcp-server-git"));
        assert_eq!(requirement_name("foo[bar]>=1"), Some("foo"));
        assert_eq!(requirement_name("==1"), None);
    }

    #[test]
    fn digest_follows_the_lists_only() {
        let a = Recipe { debian: vec!["git".into()], python: vec!["x==1".into()] };
        let b = Recipe { debian: vec!["git".into()], python: vec!["x==2".into()] };
        let a2 = Recipe { debian: vec!["git".into()], python: vec!["x==1".into()] };
        assert_eq!(a.digest().unwrap(), a2.digest().unwrap());
        assert_ne!(a.digest().unwrap(), b.digest().unwrap());
    }
}
