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

/// Mode of a written component: readable by the warden that loads it, whoever runs it (as
/// `warden plugin pull` installs plugins); temporary files start private.
#[cfg(unix)]
const OUTPUT_MODE: u32 = 0o644;

/// Writes `bytes` to a fresh temporary file beside `path` and renames it over `path`.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut tmp = tmp_beside(path)?;
    tmp.write_all(bytes).map_err(Error::io("writing", tmp.path()))?;
    persist(tmp, path)
}

/// A temporary file beside `path` (same file system, so the final rename is atomic), created
/// exclusively under a random name (never an existing file or a planted link); removed when
/// dropped unless [`persist`]ed.
pub fn tmp_beside(path: &Path) -> Result<tempfile::NamedTempFile> {
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .tempfile_in(parent)
        .map_err(Error::io("creating a temporary file beside", path))
}

/// Renames a finished temporary file over `to` (the temporary file is removed on failure).
pub fn persist(tmp: tempfile::NamedTempFile, to: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file()
            .set_permissions(fs::Permissions::from_mode(OUTPUT_MODE))
            .map_err(Error::io("setting the mode of", tmp.path()))?;
    }
    let from = tmp.path().to_path_buf();
    tmp.persist(to).map(drop).map_err(|e| Error::Rename { from, to: to.to_path_buf(), source: e.error })
}

/// `path` made absolute against the current directory: the programs run in the guest's
/// directory, where a relative path would name something else.
fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).map_err(Error::io("resolving", path))
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
        // A link planted where a predictable temporary name would be is never followed.
        let victim = dir.path().join("victim");
        fs::write(&victim, b"keep").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(&victim, dir.path().join("x.wasm.tmp")).unwrap();
        write_atomically(&out, b"new").unwrap();
        assert_eq!(fs::read(&out).unwrap(), b"new");
        assert_eq!(fs::read(&victim).unwrap(), b"keep");
        let mut names: Vec<_> =
            fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert_eq!(names, ["victim", "x.wasm", "x.wasm.tmp"]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(fs::metadata(&out).unwrap().permissions().mode() & 0o777, OUTPUT_MODE);
        }
    }

    #[test]
    fn a_failed_write_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("missing/x.wasm");
        let err = write_atomically(&out, b"x").unwrap_err();
        assert!(
            err.to_string().starts_with("creating a temporary file beside ") && err.to_string().contains("x.wasm"),
            "{err}"
        );
    }

    #[test]
    fn missing_tools_say_what_to_install() {
        let text = Error::NoWasmToolchain.to_string();
        assert!(text.contains("rustup target add wasm32-unknown-unknown") && text.contains("rustc-web"), "{text}");
        let text = Error::NoComponentizePy { venv: "p/.venv".into() }.to_string();
        assert!(text.contains("p/.venv") && text.contains(COMPONENTIZE_PY), "{text}");
    }
}
