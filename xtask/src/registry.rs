//! The OCI registry the tests of `warden plugin push | pull` start: Debian's
//! `docker-registry` (Distribution 2.8), installed with apt-get when it is missing.
//! The tests run it themselves on a free 127.0.0.1 port with a temporary storage
//! directory; xtask only makes sure the binary is there and says where.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use crate::apt;

/// The Debian package with the registry server.
const PACKAGE: &str = "docker-registry";
/// Where the package puts the server binary.
const BINARY: &str = "/usr/bin/docker-registry";

/// The registry binary, installing Debian's package when that is possible.
pub fn ensure() -> Result<PathBuf> {
    if Path::new(BINARY).is_file() {
        return Ok(BINARY.into());
    }
    if apt::available() {
        println!("xtask: no OCI registry found; installing Debian's {PACKAGE}");
        apt::install(&[PACKAGE])?;
        if Path::new(BINARY).is_file() {
            return Ok(BINARY.into());
        }
        bail!("installed {PACKAGE} but {BINARY} is still missing");
    }
    bail!(
        "the push/pull tests need an OCI registry server: apt-get install {PACKAGE} (Debian, as root), \
         or set WARDEN_REGISTRY_BIN to a Distribution `registry` binary"
    )
}
