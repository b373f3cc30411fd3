//! The browser the console tests drive: Debian's `chromium` and its WebDriver server
//! `chromium-driver`, installed with apt-get when missing. The tests start chromedriver
//! themselves on a free 127.0.0.1 port; xtask only makes sure both binaries are there and
//! says where (`WARDEN_CHROMIUM`, `WARDEN_CHROMEDRIVER`).

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use crate::apt;

/// The Debian packages with the browser and its WebDriver server.
const PACKAGES: [&str; 2] = ["chromium", "chromium-driver"];
/// Where the packages put the browser.
const CHROMIUM: &str = "/usr/bin/chromium";
/// Where the packages put the WebDriver server.
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// (browser, driver), installing Debian's packages when that is possible.
pub fn ensure() -> Result<(PathBuf, PathBuf)> {
    let present = || Path::new(CHROMIUM).is_file() && Path::new(CHROMEDRIVER).is_file();
    if present() {
        return Ok((CHROMIUM.into(), CHROMEDRIVER.into()));
    }
    if apt::available() {
        println!("xtask: no Chromium/chromedriver found; installing Debian's {}", PACKAGES.join(" "));
        apt::install(&PACKAGES)?;
        if present() {
            return Ok((CHROMIUM.into(), CHROMEDRIVER.into()));
        }
        bail!("installed {} but {CHROMIUM} or {CHROMEDRIVER} is still missing", PACKAGES.join(" "));
    }
    bail!(
        "the console tests need a browser: apt-get install {} (Debian, as root), or set WARDEN_CHROMIUM and \
         WARDEN_CHROMEDRIVER to a Chromium and its chromedriver",
        PACKAGES.join(" ")
    )
}
