//! What the doctor knows about the machine before running anything on a GPU: OS, kernel, ROCm,
//! the libraries that load, the environment, group membership, device node access, every GPU
//! telemetry sees, the amdgpu module parameters and firmware. Read through [`Roots`], so a
//! captured tree gives the same facts as the machine it came from.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::gpu::telemetry::{GpuReading, Roots, Sampler, kfd, read_text, rocm_smi, sysfs};

/// One library the doctor looks for: the sonames tried, newest first.
pub const LIBRARIES: &[(&str, &[&str])] = &[
    (
        "HIP",
        &["libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5"],
    ),
    (
        "hiprtc",
        &["libhiprtc.so.7", "libhiprtc.so.6", "libamdhip64.so.5"],
    ),
    (
        "rocBLAS",
        &["librocblas.so.5", "librocblas.so.4", "librocblas.so.0"],
    ),
    ("rocm-smi", rocm_smi::LIBRARY_NAMES),
    ("CUDA driver", &["libcuda.so.1"]),
    (
        "nvrtc",
        &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
    ),
    (
        "cuBLAS",
        &["libcublas.so.13", "libcublas.so.12", "libcublas.so"],
    ),
    ("NVML", &["libnvidia-ml.so.1"]),
];

/// Environment variables that change which GPU runs what.
pub const ENV_VARS: &[&str] = &[
    "HSA_OVERRIDE_GFX_VERSION",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "HSA_ENABLE_SDMA",
];

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Library {
    pub name: &'static str,
    /// The soname that loaded and the file it resolved to (its name carries the version).
    pub found: Option<(String, Option<String>)>,
}

/// Whether a device node opens for reading and writing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    Ok,
    Missing,
    Denied,
    Error(String),
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Facts {
    /// `linux`, `windows`, … (the Windows exit-hang rule keys on it).
    pub os_family: String,
    pub os: Option<String>,
    pub kernel: Option<String>,
    pub rocm_version: Option<String>,
    pub libraries: Vec<Library>,
    pub env: Vec<(String, String)>,
    /// The user's groups, by name; `None` when they could not be read.
    pub groups: Option<Vec<String>>,
    pub dev_kfd: Option<Access>,
    pub render_nodes: Vec<(String, Access)>,
    pub gpus: Vec<GpuReading>,
    pub kfd_nodes: usize,
    pub module_params: Vec<(String, String)>,
    pub firmware: Vec<(String, String)>,
    /// rocm-smi's version and what `rsmi_init` answered; `None` when the library is absent or
    /// not probed (a captured tree).
    pub rocm_smi: Option<rocm_smi::Probe>,
    /// Files that exist but could not be read.
    pub notes: Vec<String>,
}

impl Facts {
    pub fn module_param(&self, name: &str) -> Option<&str> {
        self.module_params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn env_var(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// `(major, minor)` of the running kernel.
    pub fn kernel_version(&self) -> Option<(u32, u32)> {
        let k = self.kernel.as_deref()?;
        let mut it = k.split(|c: char| !c.is_ascii_digit());
        Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
    }

    pub fn has_amd(&self) -> bool {
        self.gpus.iter().any(|g| g.vendor == "amd")
    }
}

/// `/etc` beside a captured tree's `sys/`, else the real one.
fn etc(roots: &Roots) -> PathBuf {
    if roots.is_live() {
        PathBuf::from("/etc")
    } else {
        roots
            .sys
            .parent()
            .map(|p| p.join("etc"))
            .unwrap_or_else(|| PathBuf::from("/etc"))
    }
}

/// `PRETTY_NAME` of os-release.
pub fn os_name(text: &str) -> Option<String> {
    let v = text.lines().find_map(|l| l.strip_prefix("PRETTY_NAME="))?;
    Some(v.trim().trim_matches('"').to_string())
}

fn access(path: &Path) -> Access {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
    {
        Ok(_) => Access::Ok,
        Err(e) => match e.kind() {
            std::io::ErrorKind::NotFound => Access::Missing,
            std::io::ErrorKind::PermissionDenied => Access::Denied,
            _ => Access::Error(e.to_string()),
        },
    }
}

/// Loads the first soname that loads and finds the file it resolved to in `/proc/self/maps`.
fn probe_library(name: &'static str, sonames: &[&str]) -> Library {
    for so in sonames {
        // SAFETY: loading runs the library's initialisers; these are the GPU runtimes the
        // program loads anyway, and no function of theirs is called here.
        if let Ok(lib) = unsafe { libloading::Library::new(*so) } {
            let stem = so.split(".so").next().unwrap_or(so);
            let file = std::fs::read_to_string("/proc/self/maps")
                .ok()
                .and_then(|m| {
                    m.lines()
                        .filter_map(|l| l.split_whitespace().nth(5))
                        .filter_map(|p| Path::new(p).file_name()?.to_str().map(str::to_string))
                        .find(|f| f.starts_with(&format!("{stem}.so")))
                });
            // Kept loaded: unloading a GPU runtime can run its atexit work early.
            std::mem::forget(lib);
            return Library {
                name,
                found: Some((so.to_string(), file)),
            };
        }
    }
    Library { name, found: None }
}

/// The names of the groups this process belongs to.
fn groups(etc: &Path) -> Option<Vec<String>> {
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    if n < 0 {
        return None;
    }
    let mut gids = vec![0 as libc::gid_t; n as usize + 1];
    let n = unsafe { libc::getgroups(gids.len() as i32, gids.as_mut_ptr()) };
    if n < 0 {
        return None;
    }
    gids.truncate(n as usize);
    gids.push(unsafe { libc::getegid() });
    let table = std::fs::read_to_string(etc.join("group")).ok()?;
    let mut names: Vec<String> = table
        .lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let gid: libc::gid_t = f.nth(1)?.parse().ok()?;
            gids.contains(&gid).then(|| name.to_string())
        })
        .collect();
    names.sort();
    names.dedup();
    Some(names)
}

/// What the no-GPU verdict needs and nothing more (`hipscope top`): which runtime libraries load
/// and whether `/dev/kfd` opens, on this machine (nothing for a captured tree).
pub fn runtimes(roots: &Roots) -> Facts {
    let mut f = Facts::default();
    if roots.is_live() {
        f.libraries = LIBRARIES.iter().map(|(n, s)| probe_library(n, s)).collect();
        f.dev_kfd = Some(access(&roots.dev.join("kfd")));
    }
    f
}

/// Gathers the facts. `live_probes`: load libraries, read the process's groups and open device
/// nodes (only meaningful on the machine itself, not for a captured tree).
pub fn gather(roots: &Roots, live_probes: bool) -> Facts {
    let etc = etc(roots);
    let mut sampler = Sampler::new(roots);
    let sample = sampler.sample();
    let mut f = Facts {
        os_family: std::env::consts::OS.to_string(),
        os: read_text(&etc.join("os-release"))
            .ok()
            .and_then(|t| os_name(&t)),
        kernel: sysfs::kernel_release(roots),
        rocm_version: read_text(Path::new("/opt/rocm/.info/version"))
            .ok()
            .filter(|_| roots.is_live()),
        env: ENV_VARS
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
            .collect(),
        gpus: sample.gpus,
        kfd_nodes: kfd::read_nodes(&roots.kfd_nodes()).len(),
        module_params: sysfs::module_params(roots),
        firmware: sysfs::firmware(roots),
        notes: sample.notes,
        ..Default::default()
    };
    if live_probes {
        let r = runtimes(roots);
        f.libraries = r.libraries;
        f.dev_kfd = r.dev_kfd;
        f.rocm_smi = rocm_smi::probe();
        f.groups = groups(&etc);
        if let Ok(rd) = std::fs::read_dir(roots.dev.join("dri")) {
            let mut nodes: Vec<(String, Access)> = rd
                .flatten()
                .filter_map(|e| {
                    let n = e.file_name().to_str()?.to_string();
                    n.starts_with("renderD").then(|| (n, access(&e.path())))
                })
                .collect();
            nodes.sort_by(|a, b| a.0.cmp(&b.0));
            f.render_nodes = nodes;
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_release_and_kernel_versions_parse() {
        assert_eq!(
            os_name("NAME=\"Debian\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n").as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
        let f = Facts {
            kernel: Some("6.14.0-15-generic".into()),
            ..Default::default()
        };
        assert_eq!(f.kernel_version(), Some((6, 14)));
        let g = Facts {
            kernel: Some("garbage".into()),
            ..Default::default()
        };
        assert_eq!(g.kernel_version(), None);
    }
}
