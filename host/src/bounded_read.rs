//! One way to read a file that someone else controls (plugin files, their signatures,
//! agent resources): opened non-blocking and checked with `fstat` on the open descriptor,
//! so a FIFO or device never blocks a thread and a file swapped after the check is not
//! read; regular files only; at most `limit` bytes, even if the file grows while read.
//! This module never follows a decision made on a path rather than the open descriptor.

use std::io::Read;
use std::path::Path;

#[derive(Debug)]
pub enum ReadError {
    Io(std::io::Error),
    NotRegular,
    /// `size` bytes against the limit; `grew` when the file passed the limit while read.
    TooLarge {
        size: u64,
        grew: bool,
    },
}

/// Reads the regular file `path` (symbolic links followed) of at most `limit` bytes.
pub fn read_regular(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Opening a FIFO without a writer returns at once instead of waiting for one.
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path).map_err(ReadError::Io)?;
    let meta = file.metadata().map_err(ReadError::Io)?;
    if !meta.is_file() {
        return Err(ReadError::NotRegular);
    }
    if meta.len() > limit {
        return Err(ReadError::TooLarge { size: meta.len(), grew: false });
    }
    let mut out = Vec::with_capacity(meta.len() as usize);
    file.take(limit.saturating_add(1)).read_to_end(&mut out).map_err(ReadError::Io)?;
    if out.len() as u64 > limit {
        return Err(ReadError::TooLarge { size: out.len() as u64, grew: true });
    }
    Ok(out)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn fifos_and_directories_are_refused_without_blocking_and_sizes_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(read_regular(&fifo, 10), Err(ReadError::NotRegular)));
        assert!(matches!(read_regular(dir.path(), 10), Err(ReadError::NotRegular)));
        let file = dir.path().join("f");
        std::fs::write(&file, b"12345").unwrap();
        assert_eq!(read_regular(&file, 5).unwrap(), b"12345");
        assert!(matches!(read_regular(&file, 4), Err(ReadError::TooLarge { size: 5, grew: false })));
    }
}
