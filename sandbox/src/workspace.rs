//! Confinement of tool paths to /workspace.
//!
//! A path is checked twice: lexically on the host (relative paths resolve against
//! /workspace; `..` may not climb out; absolute paths must lie under /workspace), then
//! inside the container with `realpath -m`, which resolves symlinks, and the result must
//! still lie under /workspace. This module must never hand a tool a path it has not
//! checked both ways, and never follow a path the container resolved outside the workspace.

use std::time::Duration;

use crate::container::WORKSPACE;
use crate::error::SandboxError;
use crate::session::SessionCtx;

/// Host-side limit for the resolve exec (realpath + stat).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest path accepted, bytes (Linux PATH_MAX).
pub(crate) const MAX_PATH_LEN: usize = 4096;

/// Resolves inside the container; `$1` path, `$2` `read` or `write` (write creates the
/// parent directory — only after the prefix check).
const RESOLVE: &str = r#"r=$(realpath -m -- "$1") || exit 3
case "$r" in
  /workspace|/workspace/*) ;;
  *) printf '%s' "$r"; exit 4 ;;
esac
if [ "$2" = write ]; then
  mkdir -p -- "$(dirname -- "$r")" || exit 5
fi
printf '%s\0' "$r"
if [ -e "$r" ]; then stat -c '%F|%s|%a' -- "$r"; else printf 'missing'; fi"#;

/// What the caller intends to do with the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// Look at it; nothing is created.
    Read,
    /// Write a file there; its parent directory is created when missing.
    Write,
}

/// What a confined path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    Missing,
    File,
    Dir,
    Other(String),
}

/// A path that passed both checks.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// The resolved absolute path (symlinks resolved), under /workspace.
    pub path: String,
    pub kind: Kind,
    pub size: u64,
    /// Permission bits (octal digits as given by stat), for preserving on rewrite.
    pub mode: u32,
}

/// Lexical normalisation: absolute, no `.`/`..`, and under /workspace.
pub(crate) fn lexical(path: &str) -> Result<String, SandboxError> {
    if path.is_empty() {
        return Err(SandboxError::InvalidInput {
            tool: "path".into(),
            message: "empty path".into(),
        });
    }
    if path.len() > MAX_PATH_LEN || path.contains('\0') {
        return Err(SandboxError::InvalidInput {
            tool: "path".into(),
            message: format!("path longer than {MAX_PATH_LEN} bytes or containing NUL"),
        });
    }
    let joined = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{WORKSPACE}/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for comp in joined.split('/') {
        match comp {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    let normal = format!("/{}", parts.join("/"));
    if is_inside(&normal) {
        Ok(normal)
    } else {
        Err(SandboxError::PathOutsideWorkspace {
            path: path.to_string(),
            resolved: normal,
        })
    }
}

/// True when `abs` is /workspace or below it.
pub(crate) fn is_inside(abs: &str) -> bool {
    abs == WORKSPACE
        || abs
            .strip_prefix(WORKSPACE)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Checks `path` lexically, then resolves it in the container and checks again.
pub(crate) async fn resolve(
    ctx: &SessionCtx<'_>,
    path: &str,
    purpose: Purpose,
) -> Result<Target, SandboxError> {
    let normal = lexical(path)?;
    let argv = vec![
        "bash".to_string(),
        "-c".to_string(),
        RESOLVE.to_string(),
        "warden-resolve".to_string(),
        normal,
        if purpose == Purpose::Write {
            "write"
        } else {
            "read"
        }
        .to_string(),
    ];
    let r = ctx.exec(argv, RESOLVE_TIMEOUT, false).await?;
    let out = r.stdout.bytes();
    let err = r.stderr.text();
    match r.exit_code {
        0 => {}
        4 => {
            return Err(SandboxError::PathOutsideWorkspace {
                path: path.to_string(),
                resolved: String::from_utf8_lossy(&out).into_owned(),
            });
        }
        5 => {
            return Err(SandboxError::File {
                path: path.to_string(),
                message: format!("cannot create its parent directory: {}", err.trim()),
            });
        }
        code => {
            return Err(SandboxError::File {
                path: path.to_string(),
                message: format!("cannot resolve it (exit {code}): {}", err.trim()),
            });
        }
    }
    let Some(nul) = out.iter().position(|b| *b == 0) else {
        return Err(SandboxError::File {
            path: path.to_string(),
            message: "unexpected resolver output".into(),
        });
    };
    let resolved = String::from_utf8_lossy(&out[..nul]).into_owned();
    // Second opinion on the host: the container said it is inside; make sure.
    if !is_inside(&resolved) {
        return Err(SandboxError::PathOutsideWorkspace {
            path: path.to_string(),
            resolved,
        });
    }
    let info = String::from_utf8_lossy(&out[nul + 1..]).trim().to_string();
    if info == "missing" {
        return Ok(Target {
            path: resolved,
            kind: Kind::Missing,
            size: 0,
            mode: 0o644,
        });
    }
    let mut it = info.split('|');
    let (ftype, size, mode) = (
        it.next().unwrap_or(""),
        it.next().unwrap_or("0"),
        it.next().unwrap_or("644"),
    );
    let kind = match ftype {
        "regular file" | "regular empty file" => Kind::File,
        "directory" => Kind::Dir,
        other => Kind::Other(other.to_string()),
    };
    Ok(Target {
        path: resolved,
        kind,
        size: size.parse().unwrap_or(0),
        mode: u32::from_str_radix(mode, 8).unwrap_or(0o644),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexical_confines() {
        assert_eq!(lexical("a/b/../c").unwrap(), "/workspace/a/c");
        assert_eq!(lexical("/workspace").unwrap(), "/workspace");
        assert!(lexical("../../etc/passwd").is_err());
        assert!(lexical("/etc/shadow").is_err());
        assert!(lexical("/workspacex/a").is_err());
        assert!(lexical("/workspace/../etc").is_err());
    }
}
