//! The Python side: a virtualenv at `target/py-venv` holding componentize-py (to build
//! Python guest plugins) and, for the tests, the protocol peers (A2A, MCP servers).
//!
//! Packages are installed with pip only when missing or at the wrong version. This module
//! only keeps the virtualenv; building a Python guest with it (and deciding when that build
//! is up to date) is `guest.rs`'s.

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

use warden_guest_build::{COMPONENTIZE_PY, ComponentizePy};

use crate::layout::Layout;
use crate::{apt, process};

/// Protocol peers the end-to-end tests start.
pub const TEST_REQUIREMENTS: &[&str] = &["a2a-sdk==1.3.0", "mcp==2.3.0", "uvicorn", "starlette", "httpx"];

/// Prints the requirements (`name` or `name==version`, `==x.y.*` allowed) that are not
/// satisfied by the installed distributions.
const MISSING_SCRIPT: &str = r#"
import sys, importlib.metadata as md
for req in sys.argv[1:]:
    name, _, want = req.partition("==")
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        print(req)
        continue
    if want and not (have == want or (want.endswith(".*") and have.startswith(want[:-1]))):
        print(req)
"#;

/// The project's virtualenv.
pub struct Python {
    venv: PathBuf,
}

impl Python {
    /// Creates the virtualenv if needed and makes sure componentize-py is in it.
    pub fn ensure(layout: &Layout) -> Result<Self> {
        let python = Self { venv: layout.py_venv() };
        if !python.interpreter().is_file() {
            python.create(layout)?;
        }
        python.require(&[COMPONENTIZE_PY])?;
        Ok(python)
    }

    /// The venv's interpreter (what tests get as `WARDEN_PYTHON`).
    pub fn interpreter(&self) -> PathBuf {
        self.venv.join("bin").join("python")
    }

    fn create(&self, layout: &Layout) -> Result<()> {
        println!("xtask: creating the Python virtualenv {}", layout.rel(&self.venv).display());
        let create = || process::run(Command::new("python3").arg("-m").arg("venv").arg(&self.venv));
        if create().is_ok() {
            return Ok(());
        }
        // Debian splits `venv`/`ensurepip` into python3-venv.
        if apt::available() {
            apt::install(&["python3-venv"])?;
            let _ = fs::remove_dir_all(&self.venv);
            return create();
        }
        bail!(
            "could not create a Python virtualenv with `python3 -m venv`: install Python 3 \
             with its venv module (Debian: apt-get install python3-venv)"
        )
    }

    /// Installs whichever of `requirements` are missing.
    pub fn require(&self, requirements: &[&str]) -> Result<()> {
        let missing =
            process::stdout_of(Command::new(self.interpreter()).arg("-c").arg(MISSING_SCRIPT).args(requirements))
                .with_context(|| format!("checking Python packages with {}", self.interpreter().display()))?;
        let missing: Vec<&str> = missing.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        if missing.is_empty() {
            return Ok(());
        }
        println!("xtask: pip-installing into the virtualenv: {}", missing.join(" "));
        process::run(
            Command::new(self.interpreter())
                .args(["-m", "pip", "install", "--disable-pip-version-check"])
                .args(&missing),
        )
    }

    /// The virtualenv's componentize-py (installed by [`Python::ensure`]).
    pub fn componentize_py(&self) -> ComponentizePy {
        ComponentizePy::at(self.venv.join("bin").join("componentize-py"))
    }

    /// The Python guest SDK's unit tests (plain CPython, fake bindings; see
    /// `sdk/python/tests`).
    pub fn test_sdk(&self, layout: &Layout) -> Result<()> {
        println!("xtask: unit tests of the Python guest SDK");
        process::run(
            Command::new(self.interpreter())
                .current_dir(layout.python_sdk())
                .args(["-m", "unittest", "discover", "-s", "tests"]),
        )
        .context("unit tests of the Python guest SDK failed")
    }
}
