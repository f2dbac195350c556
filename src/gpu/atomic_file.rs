//! Files that appear whole or not at all: written to a uniquely named temporary file beside the
//! target (`tempfile`, which removes it on every error path and on unwinding), pushed to disk,
//! then renamed into place. A full disk, an interrupted command or two runs at once never leave a
//! torn, empty or half-written target, and never a `.partial` file behind. The one home of
//! writing a whole file: synth, convert, fetch, `/save`, config.toml, the kernel cache and hang
//! reports all come here. The file is created 0600 (`tempfile`'s mode), as it may hold the user's
//! words.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// Whether an existing file at the target may be replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replace {
    /// Replace it (the rename is atomic: readers see the old or the new file).
    Allow,
    /// Keep it: the write fails with `AlreadyExists` and the temporary file is removed.
    Never,
}

/// Writes `path` with `write`, atomically. `write` gets the temporary file; an error from it (or
/// from syncing or renaming) removes the temporary file and leaves `path` as it was.
pub fn write<T, E: From<io::Error>>(
    path: &Path,
    replace: Replace,
    write: impl FnOnce(&mut File) -> Result<T, E>,
) -> Result<T, E> {
    let mut p = Pending::create(path)?;
    let value = write(p.tmp.as_file_mut())?;
    p.commit(replace)?;
    Ok(value)
}

/// A file being written a piece at a time (a logits file of gigabytes): it appears under its name
/// only at [`Pending::commit`]; dropped before that (an error, an interrupt), it is removed.
pub struct Pending {
    tmp: tempfile::NamedTempFile,
    path: PathBuf,
    dir: PathBuf,
}

impl Pending {
    /// A temporary file beside `path`, hidden and uniquely named, so that two writers never
    /// share one.
    pub fn create(path: &Path) -> io::Result<Pending> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".partial")
            .tempfile_in(&dir)?;
        Ok(Pending {
            tmp,
            path: path.to_path_buf(),
            dir,
        })
    }

    /// Pushes the file to disk and renames it into place (the rename is atomic: readers see the
    /// old file or the new one).
    pub fn commit(self, replace: Replace) -> io::Result<()> {
        self.tmp.as_file().sync_all()?;
        match replace {
            Replace::Allow => self.tmp.persist(&self.path).map_err(|e| e.error)?,
            Replace::Never => self
                .tmp
                .persist_noclobber(&self.path)
                .map_err(|e| e.error)?,
        };
        // The rename is durable once the folder's entry is (best effort: not every filesystem
        // syncs a folder).
        if let Ok(d) = File::open(&self.dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

impl io::Write for Pending {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.tmp.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.tmp.flush()
    }
}

/// The file `path` names after following symbolic links (a dotfiles link to config.toml), so
/// that a write replaces the target and leaves the link a link. A path that is not a link, or
/// does not exist, is itself. A relative target is read from the link's folder.
pub fn through_links(path: &Path) -> io::Result<PathBuf> {
    let mut p = path.to_path_buf();
    // As the kernel's own limit on links followed in one lookup (ELOOP).
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&p)?;
                p = match p.parent() {
                    Some(dir) if target.is_relative() => dir.join(target),
                    _ => target,
                };
            }
            _ => return Ok(p),
        }
    }
    Err(io::Error::other(format!(
        "{}: too many levels of symbolic links",
        path.display()
    )))
}

/// [`write`] for bytes already in memory.
pub fn write_bytes(path: &Path, replace: Replace, bytes: &[u8]) -> io::Result<()> {
    write(path, replace, |f| io::Write::write_all(f, bytes))
}

/// Whether `a` and `b` name the same file (after links), as `same-file` decides it: same device
/// and inode on Unix. `false` when either does not exist.
pub fn same_file(a: &Path, b: &Path) -> bool {
    let (Ok(ma), Ok(mb)) = (std::fs::metadata(a), std::fs::metadata(b)) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        ma.dev() == mb.dev() && ma.ino() == mb.ino()
    }
    #[cfg(not(unix))]
    {
        let _ = (ma, mb);
        matches!(
            (std::fs::canonicalize(a), std::fs::canonicalize(b)),
            (Ok(x), Ok(y)) if x == y
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_failed_write_leaves_the_target_and_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.toml");
        std::fs::write(&p, "old").unwrap();
        // A writer that runs out of space half-way, as on a full disk.
        let r: io::Result<()> = write(&p, Replace::Allow, |f| {
            io::Write::write_all(f, b"half")?;
            Err(io::Error::from_raw_os_error(libc::ENOSPC))
        });
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::ENOSPC));
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "old");
        assert_eq!(entries(dir.path()), ["config.toml"]);
    }

    #[test]
    fn a_write_replaces_or_keeps_as_asked() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.md");
        write_bytes(&p, Replace::Never, b"one").unwrap();
        let e = write_bytes(&p, Replace::Never, b"two").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "one");
        write_bytes(&p, Replace::Allow, b"three").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "three");
        assert_eq!(entries(dir.path()), ["out.md"]);
    }

    #[test]
    fn a_write_through_a_link_replaces_its_target_and_keeps_the_link() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("dotfiles")).unwrap();
        let target = dir.path().join("dotfiles/config.toml");
        std::fs::write(&target, "old").unwrap();
        let link = dir.path().join("config.toml");
        std::os::unix::fs::symlink("dotfiles/config.toml", &link).unwrap();
        let real = through_links(&link).unwrap();
        assert!(same_file(&real, &target));
        write_bytes(&real, Replace::Allow, b"new").unwrap();
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&target).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn same_file_sees_through_links() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, "x").unwrap();
        let b = dir.path().join("b");
        std::os::unix::fs::symlink(&a, &b).unwrap();
        assert!(same_file(&a, &b));
        assert!(same_file(&a, &dir.path().join(".").join("a")));
        assert!(!same_file(&a, &dir.path().join("missing")));
    }
}
