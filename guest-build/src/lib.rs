//! Building warden guest plugins, shared by `cargo xtask build` and `warden plugin build`.
//!
//! A guest is a directory holding either
//! - a `Cargo.toml`: a Rust crate built for [`WASM_TARGET`] with wit-bindgen by whichever
//!   toolchain is present ([`WasmToolchain`]: rustup with the target, or Debian's rustc-web
//!   with `-Zbuild-std`), then encoded into a component in-process with `wit-component`
//!   ([`encode_component`]); or
//! - an `app.py`: a Python component built by componentize-py ([`ComponentizePy`]).
//!
//! This crate owns those steps and nothing about where guests live or where outputs go:
//! the callers decide that. Every output is written atomically ([`write_atomically`]), so a
//! watching host never loads half a file. External programs are echoed on stderr before
//! they run, and their own output goes to stderr too, leaving stdout to the caller.

mod component;
pub mod manifest;
pub mod process;
mod python;
mod toolchain;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

pub use component::encode_component;
pub use manifest::GuestManifest;
pub use python::{COMPONENTIZE_PY, ComponentizePy, VENV_DIR};
pub use toolchain::{CargoBuild, DEBIAN_PACKAGES, Profile, WASM_TARGET, WasmToolchain};

/// The WIT world every guest implements (`wit/world.wit`).
pub const WIT_WORLD: &str = "plugin";

/// What a guest directory is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    /// `Cargo.toml`: a Rust crate.
    Rust,
    /// `app.py`: a componentize-py application.
    Python,
}

impl Language {
    /// The file that marks a guest directory of this language.
    pub fn marker(self) -> &'static str {
        match self {
            Self::Rust => "Cargo.toml",
            Self::Python => "app.py",
        }
    }

    /// The language of the guest in `dir` (a `Cargo.toml` wins over an `app.py`), if any.
    pub fn of_dir(dir: &Path) -> Option<Self> {
        [Self::Rust, Self::Python].into_iter().find(|lang| dir.join(lang.marker()).is_file())
    }
}

/// Why building a guest failed; every variant names the file or the step.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "no Rust toolchain here can build {WASM_TARGET} plugins. Install one of:\n  \
         rustup target add {WASM_TARGET}\n  \
         apt-get install {}   (Debian 12+, as root; builds std from source)",
        DEBIAN_PACKAGES.join(" ")
    )]
    NoWasmToolchain,
    #[error(
        "componentize-py not found in {v}/bin or on PATH. Install the pinned version with:\n  \
         python3 -m venv {v} && {v}/bin/pip install '{COMPONENTIZE_PY}'",
        v = .venv.display()
    )]
    NoComponentizePy { venv: PathBuf },
    #[error("could not start `{command}`")]
    Spawn {
        command: String,
        #[source]
        source: io::Error,
    },
    #[error("`{command}` failed ({status})")]
    Failed { command: String, status: ExitStatus },
    #[error("{}: cargo wrote no `.wasm` library for this crate (it needs `[lib] crate-type = [\"cdylib\"]`)", .manifest.display())]
    NoCoreModule { manifest: PathBuf },
    #[error("encoding {} as a component: {detail}", .core.display())]
    Encode { core: PathBuf, detail: String },
    #[error("{}: {reason}", .path.display())]
    Manifest { path: PathBuf, reason: String },
    #[error("{action} {}", .path.display())]
    Io {
        /// What was being done, e.g. `reading`.
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("renaming {} to {}", .from.display(), .to.display())]
    Rename {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl Error {
    fn io(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Self {
        let path = path.to_path_buf();
        move |source| Self::Io { action, path, source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Writes `<path>.tmp` and renames it over `path`.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = tmp_path(path);
    fs::write(&tmp, bytes).map_err(Error::io("writing", &tmp))?;
    rename(&tmp, path)
}

/// `<path>.tmp`, next to `path` (same file system, so a rename is atomic).
pub fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// `path` made absolute against the current directory: the programs run in the guest's
/// directory, where a relative path would name something else.
fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).map_err(Error::io("resolving", path))
}

fn rename(from: &Path, to: &Path) -> Result<()> {
    fs::rename(from, to).map_err(|source| Error::Rename { from: from.to_path_buf(), to: to.to_path_buf(), source })
}

/// A file's size for progress lines, e.g. `46.5 KiB`.
pub fn size_of(path: &Path) -> String {
    let bytes = fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
    } else {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cargo_toml_wins_over_an_app_py_and_nothing_is_no_guest() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Language::of_dir(dir.path()), None);
        fs::write(dir.path().join("app.py"), "").unwrap();
        assert_eq!(Language::of_dir(dir.path()), Some(Language::Python));
        fs::write(dir.path().join("Cargo.toml"), "").unwrap();
        assert_eq!(Language::of_dir(dir.path()), Some(Language::Rust));
        // A directory named like the marker is not a marker.
        let other = tempfile::tempdir().unwrap();
        fs::create_dir(other.path().join("app.py")).unwrap();
        assert_eq!(Language::of_dir(other.path()), None);
    }

    #[test]
    fn writes_atomically_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("x.wasm");
        fs::write(&out, b"old").unwrap();
        write_atomically(&out, b"new").unwrap();
        assert_eq!(fs::read(&out).unwrap(), b"new");
        assert!(!tmp_path(&out).exists());
        assert_eq!(tmp_path(&out), dir.path().join("x.wasm.tmp"));
    }

    #[test]
    fn a_failed_write_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("missing/x.wasm");
        let err = write_atomically(&out, b"x").unwrap_err();
        assert!(err.to_string().starts_with("writing ") && err.to_string().contains("x.wasm.tmp"), "{err}");
    }

    #[test]
    fn missing_tools_say_what_to_install() {
        let text = Error::NoWasmToolchain.to_string();
        assert!(text.contains("rustup target add wasm32-unknown-unknown") && text.contains("rustc-web"), "{text}");
        let text = Error::NoComponentizePy { venv: "p/.venv".into() }.to_string();
        assert!(text.contains("p/.venv") && text.contains(COMPONENTIZE_PY), "{text}");
    }
}
