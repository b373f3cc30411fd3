//! Confinement of tool paths to /workspace.
//!
//! A path is checked twice: lexically on the host (relative paths resolve against
//! /workspace; `..` may not climb out; absolute paths must lie under /workspace; no control
//! characters), then inside the container by the agent, which resolves symlinks beneath
//! /workspace and refuses any that lead out of it. The resolved path is what the approval
//! policy sees (besides the lexical one) and what the file operation later opens — without
//! following any link, so a link planted after the check fails the call instead of leading
//! elsewhere. This module must never hand a tool a path it has not checked both ways.

use crate::agent::{FileIdentity, KILLED_FILE_OP, Op, Status, TextClass, check_text};
use crate::container::WORKSPACE;
use crate::error::SandboxError;
use crate::exec::FILE_OP_TIMEOUT;
use crate::session::SessionCtx;

/// Longest path accepted, bytes (Linux PATH_MAX).
pub(crate) const MAX_PATH_LEN: usize = 4096;

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
    /// Hard links to it (a regular file with more than one has names the checks never saw).
    pub links: u64,
    /// Which file it is (none when missing): what a later open must find again.
    pub identity: Option<FileIdentity>,
    /// For a directory resolved with `tree`: regular files beneath it with other hard
    /// links (counted up to a few).
    pub linked: u64,
}

/// Lexical normalisation: absolute, no `.`/`..`, no control characters, under /workspace.
pub(crate) fn lexical(path: &str) -> Result<String, SandboxError> {
    if path.is_empty() {
        return Err(SandboxError::InvalidInput { tool: "path".into(), message: "empty path".into() });
    }
    if path.len() > MAX_PATH_LEN {
        return Err(SandboxError::InvalidInput {
            tool: "path".into(),
            message: format!("path longer than {MAX_PATH_LEN} bytes"),
        });
    }
    check_text("path", "path", path, TextClass::Strict)?;
    let joined = if path.starts_with('/') { path.to_string() } else { format!("{WORKSPACE}/{path}") };
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
        Err(SandboxError::PathOutsideWorkspace { path: path.to_string(), resolved: normal })
    }
}

/// True when `abs` is /workspace or below it.
pub(crate) fn is_inside(abs: &str) -> bool {
    abs == WORKSPACE || abs.strip_prefix(WORKSPACE).is_some_and(|rest| rest.starts_with('/'))
}

/// Checks `path` lexically, then resolves it in the container and checks again.
pub(crate) async fn resolve(ctx: &SessionCtx<'_>, path: &str, purpose: Purpose) -> Result<Target, SandboxError> {
    let normal = lexical(path)?;
    resolve_checked(ctx, path, &normal, purpose, false).await
}

/// Resolves an absolute path beneath /workspace as the kernel does for a shell command:
/// its `..` components are taken after the links before them (`a/link/../x` is the
/// link's parent's `x`, not `a/x`), which the lexical normalisation of [`resolve`] would
/// get wrong. `tree`: a directory also counts the hard-linked files beneath it
/// ([`Target::linked`]).
pub(crate) async fn resolve_as_kernel(ctx: &SessionCtx<'_>, path: &str, tree: bool) -> Result<Target, SandboxError> {
    if path.len() > MAX_PATH_LEN {
        return Err(SandboxError::InvalidInput {
            tool: "path".into(),
            message: format!("path longer than {MAX_PATH_LEN} bytes"),
        });
    }
    check_text("path", "path", path, TextClass::Strict)?;
    if !is_inside(path) {
        return Err(SandboxError::PathOutsideWorkspace { path: path.to_string(), resolved: path.to_string() });
    }
    resolve_checked(ctx, path, path, Purpose::Read, tree).await
}

/// Resolves `normal` (what `path` was made into) in the container and checks the answer.
async fn resolve_checked(
    ctx: &SessionCtx<'_>,
    path: &str,
    normal: &str,
    purpose: Purpose,
    tree: bool,
) -> Result<Target, SandboxError> {
    let r = ctx.call(Op::Stat { path: normal, for_write: purpose == Purpose::Write, tree }, FILE_OP_TIMEOUT).await?;
    let o = &r.outcome;
    match o.status() {
        Status::Ok => {}
        Status::Outside => {
            return Err(SandboxError::PathOutsideWorkspace {
                path: path.to_string(),
                resolved: o.get("resolved").to_string(),
            });
        }
        Status::Error(message) | Status::Refused(message) => {
            return Err(SandboxError::File { path: path.to_string(), message });
        }
        Status::Killed => {
            return Err(SandboxError::File { path: path.to_string(), message: KILLED_FILE_OP.into() });
        }
    }
    let resolved = o.get("resolved").to_string();
    // Second opinion on the host: the container said it is inside; make sure.
    if !is_inside(&resolved) || lexical(&resolved).ok().as_deref() != Some(resolved.as_str()) {
        return Err(SandboxError::PathOutsideWorkspace { path: path.to_string(), resolved });
    }
    let kind = match o.get("kind") {
        "missing" => Kind::Missing,
        "file" => Kind::File,
        "dir" => Kind::Dir,
        other => Kind::Other(other.strip_prefix("other:").unwrap_or(other).to_string()),
    };
    let identity = match (o.get("dev").parse(), o.get("ino").parse()) {
        (Ok(dev), Ok(ino)) if kind != Kind::Missing => Some(FileIdentity { dev, ino }),
        _ => None,
    };
    // The file the gate judged is the file used: same resolved path, and the same file
    // there (a hard link of a denied file renamed over an allowed name is another file).
    if let Some(approved) = ctx.approved_path {
        if approved.path != resolved {
            return Err(SandboxError::File {
                path: path.to_string(),
                message: format!(
                    "now resolves to {resolved}, not {} as when the call was approved; refused",
                    approved.path
                ),
            });
        }
        if approved.identity.is_some() && approved.identity != identity {
            return Err(SandboxError::File {
                path: path.to_string(),
                message: "was replaced by another file after the call was approved; refused".into(),
            });
        }
    }
    Ok(Target {
        path: resolved,
        kind,
        size: o.num("size").max(0) as u64,
        links: o.num("links").max(0) as u64,
        identity,
        linked: o.num("linked").max(0) as u64,
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
