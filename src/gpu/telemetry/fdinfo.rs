//! Per-process GPU memory from `/proc/PID/fdinfo/FD` of DRM file descriptors (the kernel's
//! `Documentation/gpu/drm-usage-stats.rst`): `drm-pdev` names the device, `drm-client-id` one
//! open of it (several fds may share a client: counted once), `drm-memory-vram` /
//! `drm-memory-gtt` (or `drm-resident-*` on kernels ≥ 6.11) its memory, `drm-engine-gfx` its busy
//! time in ns. Every process we may read is listed, as nvtop does; others are skipped silently.
//! Parsed here: libdrm_amdgpu_sys (0.9.0) has no fdinfo reader (amdgpu_top keeps its own in
//! the app's crate).

use std::collections::BTreeMap;
use std::path::Path;

use super::{ProcessUsage, Roots, Source, TelemetrySample};

/// One DRM client as its fdinfo describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Client {
    pub driver: String,
    pub pdev: String,
    pub client_id: u64,
    pub vram: Option<u64>,
    pub gtt: Option<u64>,
    pub gfx_ns: Option<u64>,
}

/// `123 KiB` → bytes. The units the kernel writes: none, KiB, MiB, GiB.
fn bytes(v: &str) -> Option<u64> {
    let mut it = v.split_whitespace();
    let n: u64 = it.next()?.parse().ok()?;
    let mul = match it.next() {
        None => 1,
        Some("KiB") => 1 << 10,
        Some("MiB") => 1 << 20,
        Some("GiB") => 1 << 30,
        Some(_) => return None,
    };
    n.checked_mul(mul)
}

/// Parses one fdinfo file; `None` unless it is a DRM client with a device and an id.
pub fn parse(text: &str) -> Option<Client> {
    let mut c = Client::default();
    let mut id = None;
    let mut resident_vram = None;
    let mut resident_gtt = None;
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        match k.trim() {
            "drm-driver" => c.driver = v.to_string(),
            "drm-pdev" => c.pdev = v.to_string(),
            "drm-client-id" => id = v.parse().ok(),
            "drm-memory-vram" => c.vram = bytes(v),
            "drm-memory-gtt" => c.gtt = bytes(v),
            "drm-resident-vram" => resident_vram = bytes(v),
            "drm-resident-gtt" => resident_gtt = bytes(v),
            "drm-engine-gfx" => c.gfx_ns = v.trim_end_matches("ns").trim().parse().ok(),
            _ => {}
        }
    }
    c.client_id = id?;
    if c.pdev.is_empty() || c.driver.is_empty() {
        return None;
    }
    c.vram = c.vram.or(resident_vram);
    c.gtt = c.gtt.or(resident_gtt);
    Some(c)
}

/// The DRM clients of one process (each client once).
pub fn clients_of(pid_dir: &Path) -> Vec<Client> {
    let Ok(rd) = std::fs::read_dir(pid_dir.join("fdinfo")) else {
        return Vec::new();
    };
    let mut seen = BTreeMap::new();
    for e in rd.flatten() {
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        if !text.contains("drm-client-id") {
            continue;
        }
        if let Some(c) = parse(&text) {
            seen.entry((c.pdev.clone(), c.client_id)).or_insert(c);
        }
    }
    seen.into_values().collect()
}

/// Lists every readable process's use of the GPUs already in the sample (matched by PCI
/// address). Processes NVML already reported are left to it.
pub struct FdinfoSource {
    roots: Roots,
}

impl FdinfoSource {
    pub fn new(roots: &Roots) -> FdinfoSource {
        FdinfoSource {
            roots: roots.clone(),
        }
    }
}

fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.saturating_add(y)),
        (x, y) => x.or(y),
    }
}

impl Source for FdinfoSource {
    fn name(&self) -> &'static str {
        "fdinfo"
    }

    fn sample(&mut self, out: &mut TelemetrySample) {
        let by_pci: BTreeMap<String, String> = out
            .gpus
            .iter()
            .filter(|g| g.vendor == "amd")
            .filter_map(|g| Some((g.pci.clone()?, g.id.clone())))
            .collect();
        if by_pci.is_empty() {
            return;
        }
        let Ok(rd) = std::fs::read_dir(&self.roots.proc) else {
            return;
        };
        let mut found = Vec::new();
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let mut per_gpu: BTreeMap<String, ProcessUsage> = BTreeMap::new();
            for c in clients_of(&e.path()) {
                let Some(gpu) = by_pci.get(&c.pdev) else {
                    continue;
                };
                let p = per_gpu.entry(gpu.clone()).or_insert_with(|| ProcessUsage {
                    pid,
                    gpu: gpu.clone(),
                    ..Default::default()
                });
                p.vram = add(p.vram, c.vram);
                p.gtt = add(p.gtt, c.gtt);
                p.gfx_ns = add(p.gfx_ns, c.gfx_ns);
            }
            if per_gpu.is_empty() {
                continue;
            }
            let name = std::fs::read_to_string(e.path().join("comm"))
                .map(|s| s.trim().to_string())
                .unwrap_or_default();
            for mut p in per_gpu.into_values() {
                p.name = name.clone();
                found.push(p);
            }
        }
        found.sort_by(|a, b| (b.vram, a.pid).cmp(&(a.vram, b.pid)));
        out.processes.extend(found);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // As amdgpu writes it (Linux 6.8, drivers/gpu/drm/amd/amdgpu/amdgpu_fdinfo.c).
    const FDINFO: &str = "pos:\t0\nflags:\t02100002\nmnt_id:\t26\nino:\t1074\n\
        drm-driver:\tamdgpu\ndrm-client-id:\t42\ndrm-pdev:\t0000:03:00.0\npasid:\t32771\n\
        drm-memory-vram:\t1048576 KiB\ndrm-memory-gtt: \t2048 KiB\ndrm-memory-cpu: \t0 KiB\n\
        drm-engine-gfx:\t123456789 ns\ndrm-engine-compute:\t0 ns\n";

    #[test]
    fn amdgpu_fdinfo_parses_in_bytes() {
        let c = parse(FDINFO).expect("a DRM client");
        assert_eq!(c.pdev, "0000:03:00.0");
        assert_eq!(c.client_id, 42);
        assert_eq!(c.vram, Some(1 << 30));
        assert_eq!(c.gtt, Some(2 << 20));
        assert_eq!(c.gfx_ns, Some(123_456_789));
    }

    #[test]
    fn non_drm_and_odd_fdinfo_is_skipped() {
        assert_eq!(parse("pos:\t0\nflags:\t02\n"), None);
        assert_eq!(
            parse("drm-driver:\tamdgpu\ndrm-pdev:\t0000:03:00.0\n"),
            None,
            "no id"
        );
        let odd = parse(
            "drm-driver: amdgpu\ndrm-pdev: x\ndrm-client-id: 1\ndrm-memory-vram: 12 parsecs\n",
        );
        assert_eq!(odd.expect("client").vram, None);
        // Kernels ≥ 6.11 also write drm-resident-*.
        let new =
            parse("drm-driver: amdgpu\ndrm-pdev: p\ndrm-client-id: 3\ndrm-resident-vram: 4 MiB\n");
        assert_eq!(new.expect("client").vram, Some(4 << 20));
    }
}
