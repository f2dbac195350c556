//! The on-disk cache of compiled code objects: `<root>/<backend>-<arch>/<unit>-<key>.co`, the key
//! a hash of everything the object depends on (compiler and version, arch, options, the unit's
//! full text). Several processes may fill one cache at once (two first starts, a `hipscope
//! kernels --compile` beside a chat): each object is written to a file of its own writer and
//! renamed into place, so a reader sees a whole object or none, and two writers of one key write
//! the same bytes.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::gpu::device::{GpuError, RuntimeKind};

/// The on-disk cache of compiled kernels. `None` root: caching off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelCache {
    root: Option<PathBuf>,
}

impl KernelCache {
    pub fn disabled() -> KernelCache {
        KernelCache { root: None }
    }

    pub fn at(dir: PathBuf) -> KernelCache {
        KernelCache { root: Some(dir) }
    }

    /// `kernels/` in the cache dir (`~/.cache/hipscope/kernels`, or under `HIPSCOPE_HOME`).
    pub fn default_location() -> KernelCache {
        match crate::gpu::dirs::cache_dir() {
            Some(d) => KernelCache::at(d.join("kernels")),
            None => KernelCache::disabled(),
        }
    }

    pub fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    /// The cache key: what the compiled object depends on.
    pub fn key(compiler_id: &str, arch: &str, options: &[String], full_source: &str) -> String {
        let mut h = Sha256::new();
        for part in [compiler_id, arch, &options.join(" "), full_source] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        h.finalize()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn path(&self, backend: RuntimeKind, arch: &str, name: &str, key: &str) -> Option<PathBuf> {
        let root = self.root.as_ref()?;
        Some(
            root.join(format!("{backend}-{arch}"))
                .join(format!("{name}-{key}.co")),
        )
    }

    pub fn load(&self, backend: RuntimeKind, arch: &str, name: &str, key: &str) -> Option<Vec<u8>> {
        let p = self.path(backend, arch, name, key)?;
        std::fs::read(p).ok().filter(|b| !b.is_empty())
    }

    /// Writes atomically: to a file named for this writer (process and call), then renamed over
    /// the object's name, so that neither a crash nor a concurrent writer leaves a torn object.
    pub fn store(
        &self,
        backend: RuntimeKind,
        arch: &str,
        name: &str,
        key: &str,
        image: &[u8],
    ) -> Result<(), GpuError> {
        let Some(p) = self.path(backend, arch, name, key) else {
            return Ok(());
        };
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| GpuError::Io { path, source }
        };
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        let tmp = p.with_extension(format!(
            "tmp{}-{}",
            std::process::id(),
            super::unique_suffix()
        ));
        if let Err(e) = std::fs::write(&tmp, image) {
            let _ = std::fs::remove_file(&tmp);
            return Err(io(&tmp)(e));
        }
        std::fs::rename(&tmp, &p).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(&p)(e)
        })
    }
}
