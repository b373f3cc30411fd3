//! Where things are: the workspace root and the build outputs under `target/`.

use std::env;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The project's directories and output paths, all absolute.
pub struct Layout {
    /// The workspace root (parent of `xtask/`).
    pub root: PathBuf,
    /// Cargo's target directory (`$CARGO_TARGET_DIR` if set, else `<root>/target`).
    pub target: PathBuf,
}

impl Layout {
    pub fn discover() -> Result<Self> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .context("xtask's manifest directory has no parent")?
            .to_path_buf();
        let target = match env::var_os("CARGO_TARGET_DIR") {
            Some(dir) if !dir.is_empty() => env::current_dir().context("reading the current directory")?.join(dir),
            _ => root.join("target"),
        };
        Ok(Self { root, target })
    }

    /// The current WIT version of the package (`wit/0.3.0/`), which every bundled plugin,
    /// SDK and template is built against (`wit/0.1.0/` is frozen; only the `echo` test
    /// plugin still builds against it).
    pub fn wit(&self) -> PathBuf {
        self.root.join("wit/0.3.0")
    }

    /// The Rust guest SDK crate (`warden-guest`) every bundled plugin depends on.
    pub fn rust_sdk(&self) -> PathBuf {
        self.root.join("sdk/rust")
    }

    /// The directory holding the Python guest SDK package (`warden_guest/`), put on
    /// componentize-py's path for every Python guest.
    pub fn python_sdk(&self) -> PathBuf {
        self.root.join("sdk/python")
    }

    /// The real-world fixtures (agent files, A2A cards): `$WARDEN_FIXTURES`, else the copy
    /// kept in the repository at `tests/fixtures` (so a clone in any folder finds them).
    pub fn fixtures(&self) -> Option<PathBuf> {
        if let Some(p) = env::var_os("WARDEN_FIXTURES").filter(|v| !v.is_empty()) {
            return Some(PathBuf::from(p));
        }
        Some(self.root.join("tests/fixtures")).filter(|p| p.is_dir())
    }

    /// The dev-profile host binary the tests run.
    pub fn warden_dev_bin(&self) -> PathBuf {
        self.target.join("debug").join("warden")
    }

    pub fn warden_bin(&self) -> PathBuf {
        self.target.join("release").join("warden")
    }

    /// Bundled plugins, shipped: `target/plugins`.
    pub fn plugins_out(&self) -> PathBuf {
        self.target.join("plugins")
    }

    /// Test plugins, never shipped: `target/test-plugins`.
    pub fn test_plugins_out(&self) -> PathBuf {
        self.target.join("test-plugins")
    }

    /// One target dir shared by all guest crates (their compiler differs from the host's).
    pub fn wasm_build(&self) -> PathBuf {
        self.target.join("wasm-build")
    }

    /// The Python virtualenv (componentize-py, protocol peers for the tests).
    pub fn py_venv(&self) -> PathBuf {
        self.target.join("py-venv")
    }

    /// A path relative to the root, for messages.
    pub fn rel<'a>(&self, path: &'a Path) -> &'a Path {
        path.strip_prefix(&self.root).unwrap_or(path)
    }
}
