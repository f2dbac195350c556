//! amdgpu's own sysfs files under `/sys/class/drm/cardN/device/`: busy percentages, memory
//! pools, the current DPM clock levels, the PCIe link, firmware versions; and the driver's
//! module parameters under `/sys/module/amdgpu/parameters/`. Needs no ROCm.
//!
//! A GPU whose `power/runtime_status` is `suspended` is not read further: reading its sensors
//! would wake it (amdgpu_top and nvtop skip it the same way).

use std::path::{Path, PathBuf};

use super::{GpuReading, ReadError, Roots, Source, TelemetrySample, gpu_metrics, hwmon, kfd};
use super::{read_num, read_text};

/// PCI vendor id of AMD.
const AMD: &str = "0x1002";

/// Device ids of APUs whose VRAM is a carve-out of system memory (Strix Halo: Radeon 8050S /
/// 8060S; Strix Point: 890M/880M), from the amdgpu.ids table.
const APU_DEVICE_IDS: &[u32] = &[0x1586, 0x150e];

/// One amdgpu DRM card: `cardN` and its `device/` directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Card {
    pub name: String,
    pub device: PathBuf,
}

/// Every amdgpu card under `root/class/drm`, in order (`card0`, `card1`, …); connectors
/// (`card1-DP-1`) and other vendors' cards left out.
pub fn cards(roots: &Roots) -> Vec<Card> {
    let Ok(rd) = std::fs::read_dir(roots.sys.join("class/drm")) else {
        return Vec::new();
    };
    let mut out: Vec<(u32, Card)> = rd
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let n: u32 = name.strip_prefix("card")?.parse().ok()?;
            let device = e.path().join("device");
            (read_text(&device.join("vendor")).ok()? == AMD).then_some((n, Card { name, device }))
        })
        .collect();
    out.sort_by_key(|(n, _)| *n);
    out.into_iter().map(|(_, c)| c).collect()
}

/// The `*` line of `pp_dpm_sclk` / `pp_dpm_mclk` (`1: 2482Mhz *`), in MHz.
pub fn current_dpm_mhz(text: &str) -> Option<u32> {
    let line = text.lines().find(|l| l.trim_end().ends_with('*'))?;
    let (_, rest) = line.split_once(':')?;
    let v = rest.trim().trim_end_matches('*').trim();
    let digits = v
        .strip_suffix("Mhz")
        .or_else(|| v.strip_suffix("MHz"))
        .unwrap_or(v);
    digits.trim().parse().ok()
}

/// `device/uevent`'s `PCI_SLOT_NAME`, e.g. `0000:03:00.0` (also the device link's name).
fn pci_slot(device: &Path) -> Option<String> {
    if let Ok(u) = read_text(&device.join("uevent"))
        && let Some(v) = u.lines().find_map(|l| l.strip_prefix("PCI_SLOT_NAME="))
    {
        return Some(v.to_string());
    }
    std::fs::canonicalize(device)
        .ok()?
        .file_name()?
        .to_str()
        .map(str::to_string)
}

fn hex(device: &Path, file: &str) -> Option<u32> {
    let t = read_text(&device.join(file)).ok()?;
    u32::from_str_radix(t.trim_start_matches("0x"), 16).ok()
}

/// Reads one card. `notes` collects files that exist and could not be read.
pub fn read_card(
    roots: &Roots,
    card: &Card,
    nodes: &[kfd::KfdNode],
    notes: &mut Vec<String>,
) -> GpuReading {
    let d = &card.device;
    let pci = pci_slot(d);
    let device_id = hex(d, "device");
    let revision = hex(d, "revision").unwrap_or(0);
    let node = pci
        .as_deref()
        .and_then(kfd::PciAddress::parse)
        .and_then(|p| kfd::node_for(nodes, &p));
    let name = read_text(&d.join("product_name"))
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            device_id.and_then(|id| libdrm_amdgpu_sys::AMDGPU::find_device_name(id, revision))
        })
        .unwrap_or_else(|| match device_id {
            Some(id) => format!("AMD GPU {id:#06x}"),
            None => "AMD GPU".into(),
        });
    let mut g = GpuReading {
        id: card.name.clone(),
        vendor: "amd".into(),
        name,
        pci,
        arch: node.map(|n| n.arch()),
        ..Default::default()
    };
    if read_text(&d.join("power/runtime_status")).is_ok_and(|s| s == "suspended") {
        g.suspended = true;
        return g;
    }
    let mut num = |file: &str| -> Option<u64> {
        match read_text(&d.join(file)) {
            Ok(t) => {
                let v = t.parse().ok();
                if v.is_none() {
                    notes.push(format!("{}: not a number: {t:.40}", d.join(file).display()));
                }
                v
            }
            Err(ReadError::Denied) => {
                notes.push(format!("{}: permission denied", d.join(file).display()));
                None
            }
            Err(_) => None,
        }
    };
    g.gpu_util_pct = num("gpu_busy_percent").map(|v| v as f32);
    g.mem_util_pct = num("mem_busy_percent").map(|v| v as f32);
    g.vram_used = num("mem_info_vram_used");
    g.vram_total = num("mem_info_vram_total");
    g.vis_vram_used = num("mem_info_vis_vram_used");
    g.vis_vram_total = num("mem_info_vis_vram_total");
    g.gtt_used = num("mem_info_gtt_used");
    g.gtt_total = num("mem_info_gtt_total");
    g.sclk_mhz = read_text(&d.join("pp_dpm_sclk"))
        .ok()
        .and_then(|t| current_dpm_mhz(&t));
    g.mclk_mhz = read_text(&d.join("pp_dpm_mclk"))
        .ok()
        .and_then(|t| current_dpm_mhz(&t));
    g.pcie_speed = read_text(&d.join("current_link_speed"))
        .ok()
        .filter(|s| !s.is_empty());
    g.pcie_width = read_num(&d.join("current_link_width"));
    // APU: KFD puts CPU cores and SIMDs on one node; else a known device id; else a VRAM
    // carve-out far smaller than GTT.
    g.apu = node.is_some_and(|n| n.cpu_cores > 0)
        || device_id.is_some_and(|id| APU_DEVICE_IDS.contains(&id))
        || matches!((g.vram_total, g.gtt_total), (Some(v), Some(t)) if v.saturating_mul(4) < t);
    g.credit(&[], "sysfs");
    let before = g.present();
    hwmon::read_into(d, &mut g, notes);
    g.credit(&before, "hwmon");
    let before = g.present();
    gpu_metrics::read_into(d, &mut g, notes);
    g.credit(&before, "gpu_metrics");
    let _ = roots;
    g
}

/// The amdgpu cards of the machine.
pub struct AmdSysfs {
    roots: Roots,
}

impl AmdSysfs {
    pub fn new(roots: &Roots) -> AmdSysfs {
        AmdSysfs {
            roots: roots.clone(),
        }
    }
}

impl Source for AmdSysfs {
    fn name(&self) -> &'static str {
        "amdgpu sysfs"
    }

    fn sample(&mut self, out: &mut TelemetrySample) {
        let cards = cards(&self.roots);
        if cards.is_empty() {
            return;
        }
        let nodes = kfd::read_nodes(&self.roots.kfd_nodes());
        for c in &cards {
            let g = read_card(&self.roots, c, &nodes, &mut out.notes);
            out.gpus.push(g);
        }
    }
}

/// amdgpu module parameters that matter for hangs: CWSR (ROCm/ROCm#5590), MES (ROCm/ROCm#5724),
/// and the recovery settings.
pub const MODULE_PARAMS: &[&str] = &[
    "cwsr_enable",
    "mes",
    "mes_kiq",
    "sched_policy",
    "lockup_timeout",
    "gpu_recovery",
    "noretry",
    "runpm",
];

/// `name = value` of the amdgpu module parameters that exist.
pub fn module_params(roots: &Roots) -> Vec<(String, String)> {
    let dir = roots.sys.join("module/amdgpu/parameters");
    MODULE_PARAMS
        .iter()
        .filter_map(|p| Some((p.to_string(), read_text(&dir.join(p)).ok()?)))
        .collect()
}

/// `cardN/name = version` from `device/fw_version/*` of every amdgpu card (readable without
/// root, unlike debugfs).
pub fn firmware(roots: &Roots) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for c in cards(roots) {
        let Ok(rd) = std::fs::read_dir(c.device.join("fw_version")) else {
            continue;
        };
        let mut files: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
        files.sort();
        for f in files {
            if let (Some(n), Ok(v)) = (f.file_name().and_then(|n| n.to_str()), read_text(&f)) {
                out.push((format!("{}/{n}", c.name), v));
            }
        }
    }
    out
}

/// The running kernel's release (`/proc/sys/kernel/osrelease`).
pub fn kernel_release(roots: &Roots) -> Option<String> {
    read_text(&roots.proc.join("sys/kernel/osrelease")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_starred_dpm_level_is_current() {
        let sclk = "0: 500Mhz\n1: 1900Mhz *\n2: 2482Mhz\n";
        assert_eq!(current_dpm_mhz(sclk), Some(1900));
        // Deep sleep level on RDNA3 and APUs.
        assert_eq!(current_dpm_mhz("S: 19Mhz *\n0: 600Mhz\n"), Some(19));
        assert_eq!(current_dpm_mhz("0: 96Mhz\n1: 456Mhz\n"), None, "no star");
        assert_eq!(current_dpm_mhz("garbage *\n"), None);
        assert_eq!(current_dpm_mhz(""), None);
    }
}
