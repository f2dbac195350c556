//! The platform's directories for hipscope (XDG on Linux), overridable for tests and portable
//! installs with `HIPSCOPE_HOME` (then `cache/`, `config/`, `data/`, `state/` under it); with no
//! home directory at all, `.hipscope/` in the working directory. One answer for every caller:
//! the free functions and [`Dirs::from_env`] agree.
//!
//! Here, in the lowest layer, because the GPU runtime is the first to need them (the kernel cache,
//! hang reports); the app takes its folders from here too ([`Dirs`]). So does the rule for the
//! folders and files hipscope makes ([`create_private_dir`], [`tighten`]): folders 0700 and files
//! 0600 whatever the umask, as they may hold the user's words (Unix modes; elsewhere the
//! platform's defaults apply).

use std::path::{Path, PathBuf};

fn project() -> Option<directories::ProjectDirs> {
    directories::ProjectDirs::from("", "", "hipscope")
}

fn home(sub: &str) -> Option<PathBuf> {
    std::env::var_os("HIPSCOPE_HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(sub))
}

/// No home directory at all: everything beside the working directory.
fn fallback(sub: &str) -> PathBuf {
    Path::new(".hipscope").join(sub)
}

/// Downloaded models and compiled kernels.
pub fn cache_dir() -> PathBuf {
    home("cache")
        .or_else(|| project().map(|p| p.cache_dir().to_path_buf()))
        .unwrap_or_else(|| fallback("cache"))
}

/// The user's `config.toml`.
pub fn config_dir() -> PathBuf {
    home("config")
        .or_else(|| project().map(|p| p.config_dir().to_path_buf()))
        .unwrap_or_else(|| fallback("config"))
}

/// Conversations and hang reports.
pub fn data_dir() -> PathBuf {
    home("data")
        .or_else(|| project().map(|p| p.data_dir().to_path_buf()))
        .unwrap_or_else(|| fallback("data"))
}

/// Logs.
pub fn state_dir() -> PathBuf {
    home("state")
        .or_else(|| {
            project().map(|p| {
                p.state_dir()
                    .map_or_else(|| p.data_local_dir().join("state"), |s| s.to_path_buf())
            })
        })
        .unwrap_or_else(|| fallback("state"))
}

/// hipscope's folders (the platform's, or under `HIPSCOPE_HOME`), as values so that
/// tests can point them elsewhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dirs {
    pub config: PathBuf,
    pub data: PathBuf,
    pub cache: PathBuf,
    pub state: PathBuf,
}

impl Dirs {
    pub fn from_env() -> Dirs {
        Dirs {
            config: config_dir(),
            data: data_dir(),
            cache: cache_dir(),
            state: state_dir(),
        }
    }

    /// Takes others' permissions off the folders that hold the user's words (data: the
    /// conversations, exports and hang reports; state: the log; config), where they exist with
    /// wider ones (made by an older hipscope): what was changed, to be said once.
    pub fn tighten_private(&self) -> Vec<Tightened> {
        [&self.data, &self.state, &self.config]
            .into_iter()
            .filter_map(|d| tighten(d).ok().flatten())
            .collect()
    }

    pub fn under(root: &Path) -> Dirs {
        Dirs {
            config: root.join("config"),
            data: root.join("data"),
            cache: root.join("cache"),
            state: root.join("state"),
        }
    }
}

/// Mode of the folders hipscope makes.
pub const DIR_MODE: u32 = 0o700;
/// Mode of the files hipscope writes.
pub const FILE_MODE: u32 = 0o600;

/// Creates `dir` and any missing parents as 0700, whatever the umask (as the XDG base directory
/// specification asks for the folders it names). Folders that exist are left as they are.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, DIR_MODE);
    b.create(dir)
}

/// What [`tighten`] did to a folder or file that others could read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tightened {
    pub path: PathBuf,
    /// The permission bits before (e.g. 0o755).
    pub was: u32,
    pub now: u32,
}

impl std::fmt::Display for Tightened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} was open to other users (mode {:o}); made it {:o}, as it holds your words",
            self.path.display(),
            self.was,
            self.now
        )
    }
}

/// Takes the group's and others' permissions off `path` (a folder hipscope keeps the user's
/// words in, or such a file) if it has any and belongs to this user, so that 0755 becomes 0700
/// and 0644 becomes 0600. Says what it changed (`None`: nothing needed, or not this user's).
/// A link is not followed: its target is not hipscope's to change.
pub fn tighten(path: &Path) -> std::io::Result<Option<Tightened>> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let m = std::fs::symlink_metadata(path)?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if m.file_type().is_symlink() || m.uid() != me {
            return Ok(None);
        }
        let was = m.mode() & 0o7777;
        if was & 0o077 == 0 {
            return Ok(None);
        }
        let now = was & !0o077;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(now))?;
        Ok(Some(Tightened {
            path: path.to_path_buf(),
            was,
            now,
        }))
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn private_folders_are_0700_and_wider_ones_are_tightened_once() {
        let t = tempfile::tempdir().unwrap();
        let deep = t.path().join("a/b/c");
        // (The umask only takes bits away from 0700; the binary's tests run under umask 000.)
        create_private_dir(&deep).unwrap();
        assert_eq!(mode(&deep), 0o700);
        assert_eq!(mode(&t.path().join("a")), 0o700);

        let f = t.path().join("f");
        std::fs::write(&f, "x").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let said = tighten(&f).unwrap().expect("tightened");
        assert_eq!((said.was, said.now), (0o644, 0o600));
        assert_eq!(mode(&f), 0o600);
        assert_eq!(tighten(&f).unwrap(), None, "once");
    }
}
