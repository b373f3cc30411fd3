//! Python guests: finding componentize-py and running it on an `app.py`.

use std::env;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::process::run;
use crate::{Error, Result, WIT_WORLD, absolute, persist, tmp_beside};

/// Builds Python guests; pinned to the line verified with this WIT and wasmtime.
pub const COMPONENTIZE_PY: &str = "componentize-py==0.25.*";

/// A plugin project's own virtualenv, searched before `PATH`.
pub const VENV_DIR: &str = ".venv";

/// The program's file name.
const PROGRAM: &str = "componentize-py";

/// A componentize-py executable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentizePy {
    program: PathBuf,
}

impl ComponentizePy {
    /// The componentize-py at `program` (e.g. in a virtualenv the caller manages).
    pub fn at(program: PathBuf) -> Self {
        Self { program }
    }

    /// The one in `dir`'s `.venv`, else the first on `PATH`.
    pub fn find(dir: &Path) -> Result<Self> {
        Self::find_with_path(dir, env::var_os("PATH").as_deref())
    }

    fn find_with_path(dir: &Path, path: Option<&OsStr>) -> Result<Self> {
        let venv = dir.join(VENV_DIR);
        let in_venv = venv.join("bin").join(PROGRAM);
        if in_venv.is_file() {
            return Ok(Self::at(in_venv));
        }
        path.into_iter()
            .flat_map(env::split_paths)
            .map(|d| d.join(PROGRAM))
            .find(|candidate| candidate.is_file())
            .map(Self::at)
            .ok_or(Error::NoComponentizePy { venv })
    }

    pub fn program(&self) -> &Path {
        &self.program
    }

    /// `componentize-py -d <wit> -w plugin componentize app [-p <path>...] -o <out>`, run in
    /// `app_dir`; `extra_paths` are searched for Python modules after `app_dir`. The
    /// component is written next to `out` and renamed over it when complete.
    pub fn componentize(&self, app_dir: &Path, wit: &Path, extra_paths: &[&Path], out: &Path) -> Result<()> {
        let (app_dir, wit, out) = (absolute(app_dir)?, absolute(wit)?, absolute(out)?);
        let extra_paths = extra_paths.iter().map(|p| absolute(p)).collect::<Result<Vec<_>>>()?;
        let extra_paths: Vec<&Path> = extra_paths.iter().map(PathBuf::as_path).collect();
        // Removed when dropped, on any failure.
        let tmp = tmp_beside(&out)?;
        run(&mut self.command(&app_dir, &wit, &extra_paths, tmp.path()))?;
        persist(tmp, &out)
    }

    fn command(&self, app_dir: &Path, wit: &Path, extra_paths: &[&Path], out: &Path) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.current_dir(app_dir).arg("-d").arg(wit).args(["-w", WIT_WORLD, "componentize", "app"]);
        if !extra_paths.is_empty() {
            // Any `-p` replaces the default search path (the current directory): keep it first.
            cmd.args(["-p", "."]);
            for path in extra_paths {
                cmd.arg("-p").arg(path);
            }
        }
        cmd.arg("-o").arg(out);
        cmd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn executable(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "#!/bin/sh\n").unwrap();
    }

    #[test]
    fn the_project_venv_comes_before_path() {
        let project = tempfile::tempdir().unwrap();
        let bin = tempfile::tempdir().unwrap();
        executable(&bin.path().join(PROGRAM));
        let found = ComponentizePy::find_with_path(project.path(), Some(bin.path().as_os_str())).unwrap();
        assert_eq!(found.program(), bin.path().join(PROGRAM));
        let venv = project.path().join(".venv/bin").join(PROGRAM);
        executable(&venv);
        let found = ComponentizePy::find_with_path(project.path(), Some(bin.path().as_os_str())).unwrap();
        assert_eq!(found.program(), venv);
    }

    #[test]
    fn missing_everywhere_names_the_venv_and_the_pin() {
        let project = tempfile::tempdir().unwrap();
        let empty = tempfile::tempdir().unwrap();
        let err = ComponentizePy::find_with_path(project.path(), Some(empty.path().as_os_str())).unwrap_err();
        assert!(matches!(&err, Error::NoComponentizePy { venv } if *venv == project.path().join(".venv")), "{err:?}");
        assert!(ComponentizePy::find_with_path(project.path(), None).is_err());
    }

    #[test]
    fn extra_paths_keep_the_app_directory_searched() {
        let cp = ComponentizePy::at("cp".into());
        let args = |extra: &[&Path]| -> Vec<String> {
            cp.command(Path::new("app"), Path::new("wit"), extra, Path::new("o.wasm"))
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        };
        assert_eq!(args(&[]), ["-d", "wit", "-w", "plugin", "componentize", "app", "-o", "o.wasm"]);
        assert_eq!(
            args(&[Path::new("sdk")]),
            ["-d", "wit", "-w", "plugin", "componentize", "app", "-p", ".", "-p", "sdk", "-o", "o.wasm"]
        );
    }
}
