//! Reading a plugin file the way it is about to be judged: only a regular file, opened
//! without blocking, read up to a fixed size.
//!
//! A FIFO would block `open`/`read` until a writer appears (past any `--timeout`), a
//! device such as `/dev/zero` never ends, a directory is no library: each is refused
//! at once with a clear error. The file is opened with `O_NONBLOCK`, checked with
//! `fstat` on the open descriptor (no race with a rename), then read with a bound.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use super::ElfError;

/// Largest file read (1 GiB). Plugin libraries are a few MB; `libnccl.so` with its
/// device code is a few hundred MB.
pub const MAX_FILE_BYTES: u64 = 1 << 30;

/// The kind of a non-regular file, for the error message.
fn kind(t: std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// The bytes of the regular file `path` (symlinks followed), at most
/// [`MAX_FILE_BYTES`].
pub fn read_regular(path: &Path) -> Result<Vec<u8>, ElfError> {
    read_bounded(path, MAX_FILE_BYTES)
}

/// [`read_regular`] with a chosen bound.
pub(crate) fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, ElfError> {
    let shown = path.display();
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| ElfError(format!("{shown}: {e}")))?;
    let meta = f
        .metadata()
        .map_err(|e| ElfError(format!("{shown}: {e}")))?;
    let t = meta.file_type();
    if !t.is_file() {
        return Err(ElfError(format!(
            "{shown}: {}, not a regular file: a plugin is a shared library file",
            kind(t)
        )));
    }
    if meta.len() > max {
        return Err(ElfError(format!(
            "{shown}: {} bytes, larger than the {max}-byte limit for a library",
            meta.len()
        )));
    }
    let mut data = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    // The file may grow while it is read: the bound holds regardless.
    f.by_ref()
        .take(max + 1)
        .read_to_end(&mut data)
        .map_err(|e| ElfError(format!("{shown}: {e}")))?;
    if data.len() as u64 > max {
        return Err(ElfError(format!(
            "{shown}: grew past the {max}-byte limit while being read"
        )));
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn fifos_devices_and_directories_are_refused_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("lib.so");
        let c = std::ffi::CString::new(fifo.display().to_string()).expect("path");
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let link = dir.path().join("zero.so");
        std::os::unix::fs::symlink("/dev/zero", &link).expect("symlink");
        let start = Instant::now();
        for (p, needle) in [
            (fifo.as_path(), "a FIFO (named pipe), not a regular file"),
            (link.as_path(), "a character device, not a regular file"),
            (dir.path(), "a directory, not a regular file"),
        ] {
            let e = read_regular(p).expect_err("refused").0;
            assert!(e.contains(needle), "{e}");
        }
        assert!(start.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn regular_files_are_read_within_the_bound() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("x.so");
        let bytes: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&p, &bytes).expect("write");
        assert_eq!(read_regular(&p).expect("read"), bytes);
        let e = read_bounded(&p, 4999).expect_err("too big").0;
        assert!(
            e.contains("5000 bytes, larger than the 4999-byte limit"),
            "{e}"
        );
    }
}
