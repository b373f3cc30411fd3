//! The PostgreSQL server the task store's tests run against: Debian's `postgresql`
//! package (installed with apt-get when missing), a cluster made afresh in a private data
//! directory (`target/postgres`) listening on a free 127.0.0.1 port, and stopped when
//! xtask is done with it. The tests get its URL as `WARDEN_TEST_POSTGRES_URL` and create a
//! database of their own in it.
//!
//! `initdb` and the server refuse to run as root, so when xtask is root they run as the
//! package's `postgres` system user. A server a killed xtask left behind is stopped
//! before the directory is made anew, so it never blocks the next run.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::layout::Layout;
use crate::{apt, process};

/// The Debian package with the server (it depends on the versioned `postgresql-NN`).
const PACKAGE: &str = "postgresql";
/// Where Debian's packages put each major version's programs: `<dir>/<version>/bin`.
const VERSIONS_DIR: &str = "/usr/lib/postgresql";
/// The system user the package creates; the server runs as it when xtask is root.
const SYSTEM_USER: &str = "postgres";
/// The cluster's superuser, which the tests connect as (trust authentication, loopback only).
const SUPERUSER: &str = "warden";
/// How long `pg_ctl` may wait for the server to accept connections.
const START_WAIT_SECS: &str = "60";
/// Server settings for a throwaway test cluster: loopback only, no Unix socket (its path
/// under `target/` could pass the 107-byte limit), no fsync (a crash loses nothing the
/// tests need), and room for every test's connections at once.
const SERVER_OPTIONS: &str = "-c listen_addresses=127.0.0.1 -k '' -c fsync=off -c synchronous_commit=off \
                              -c full_page_writes=off -c max_connections=300";

/// A running test server; stopped on drop.
pub struct Postgres {
    bin: PathBuf,
    data: PathBuf,
    user: Option<(u32, u32)>,
    url: String,
}

impl Postgres {
    /// Installs the package if needed, makes a fresh cluster under `target/postgres` and
    /// starts it.
    pub fn start(layout: &Layout) -> Result<Postgres> {
        let bin = ensure_installed()?;
        let user = if process::is_root() { Some(system_user()?) } else { None };
        let dir = layout.target.join("postgres");
        let data = dir.join("data");
        if data.join("postmaster.pid").is_file() {
            println!("xtask: stopping the PostgreSQL a previous run left in {}", layout.rel(&data).display());
            let _ = stop(&bin, &data, user);
        }
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .with_context(|| format!("handing {} to the {SYSTEM_USER} user", dir.display()))?;
        }
        let port = free_port()?;
        println!("xtask: starting PostgreSQL ({}) on 127.0.0.1:{port}", bin.display());
        // --no-sync: the cluster is thrown away with the run.
        process::run(
            as_user(Command::new(bin.join("initdb")), user)
                .args(["-A", "trust", "-U", SUPERUSER, "-E", "UTF8", "--locale=C", "--no-sync", "-D"])
                .arg(&data),
        )
        .context("initdb failed")?;
        process::run(
            as_user(Command::new(bin.join("pg_ctl")), user)
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(dir.join("server.log"))
                .args(["-w", "-t", START_WAIT_SECS, "-o"])
                .arg(format!("-p {port} {SERVER_OPTIONS}"))
                .arg("start"),
        )
        .with_context(|| format!("PostgreSQL did not start; see {}", dir.join("server.log").display()))?;
        let url = format!("postgres://{SUPERUSER}@127.0.0.1:{port}/postgres");
        Ok(Postgres { bin, data, user, url })
    }

    /// `postgres://warden@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Err(e) = stop(&self.bin, &self.data, self.user) {
            eprintln!("xtask: stopping PostgreSQL: {e:#}");
        }
    }
}

/// `pg_ctl stop -m immediate`: the cluster is thrown away, nothing to shut down cleanly.
fn stop(bin: &Path, data: &Path, user: Option<(u32, u32)>) -> Result<()> {
    process::run(as_user(Command::new(bin.join("pg_ctl")), user).arg("-D").arg(data).args(["-m", "immediate", "stop"]))
}

/// `cmd` run as the `postgres` user when xtask is root (initdb and the server refuse root).
fn as_user(mut cmd: Command, user: Option<(u32, u32)>) -> Command {
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
    }
    cmd
}

/// The `postgres` system user's uid and gid.
fn system_user() -> Result<(u32, u32)> {
    let id = |flag: &str| {
        process::stdout_of(Command::new("id").args([flag, SYSTEM_USER]))
            .and_then(|s| s.trim().parse::<u32>().ok())
            .with_context(|| format!("the {SYSTEM_USER} system user is missing (it comes with Debian's {PACKAGE})"))
    };
    Ok((id("-u")?, id("-g")?))
}

/// A port nothing listens on right now.
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0").context("finding a free port")?.local_addr()?.port())
}

/// The newest installed major version's `bin` directory, installing the package if none is.
pub fn ensure_installed() -> Result<PathBuf> {
    if let Some(bin) = newest_installed() {
        return Ok(bin);
    }
    if apt::available() {
        println!("xtask: no PostgreSQL found; installing Debian's {PACKAGE}");
        apt::install(&[PACKAGE])?;
        if let Some(bin) = newest_installed() {
            return Ok(bin);
        }
        bail!("installed {PACKAGE} but found no {VERSIONS_DIR}/<version>/bin/initdb");
    }
    bail!(
        "the task store tests need PostgreSQL: apt-get install {PACKAGE} (Debian, as root), or set \
         WARDEN_TEST_POSTGRES_URL to a server where the tests may create databases"
    )
}

fn newest_installed() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(VERSIONS_DIR)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let major = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            (bin.join("initdb").is_file() && bin.join("pg_ctl").is_file()).then_some((major, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}
