//! The exclusive advisory lock (`flock`) that keeps two instances out of one conversation file,
//! and who holds it (Linux: `/proc/locks`). Advisory and Unix-only: elsewhere nothing is locked.

use std::fs::File;
use std::path::Path;

use super::TranscriptError;

/// Takes the exclusive advisory lock on a conversation file, or says who holds it.
pub(super) fn lock(file: &File, path: &Path) -> Result<(), TranscriptError> {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor this `File` owns; no memory is passed.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(TranscriptError::Locked {
                    path: path.to_path_buf(),
                    holder: lock_holder(file),
                });
            }
            return Err(TranscriptError::Io {
                path: path.to_path_buf(),
                cause: e,
            });
        }
    }
    #[cfg(not(unix))]
    let _ = (file, path);
    Ok(())
}

/// The process holding a `flock` on `file`, from `/proc/locks` (Linux: `1: FLOCK  ADVISORY
/// WRITE 1234 08:01:56789 0 EOF`, the device as hex major:minor, then the inode).
fn lock_holder(file: &File) -> Option<u32> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata().ok()?;
        let (major, minor) = (libc::major(m.dev()), libc::minor(m.dev()));
        let locks = std::fs::read_to_string("/proc/locks").ok()?;
        locks.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 6 || f[1] != "FLOCK" {
                return None;
            }
            let id: Vec<&str> = f[5].split(':').collect();
            let same = id.len() == 3
                && u32::from_str_radix(id[0], 16).ok() == Some(major)
                && u32::from_str_radix(id[1], 16).ok() == Some(minor)
                && id[2].parse::<u64>().ok() == Some(m.ino());
            same.then(|| f[4].parse().ok()).flatten()
        })
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = file;
        None
    }
}
