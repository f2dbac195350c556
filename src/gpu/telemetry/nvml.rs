//! NVIDIA GPUs through NVML (`nvml-wrapper`, which loads `libnvidia-ml.so.1` at run time): no
//! library or no driver → no source, and the program runs on.

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;

use super::{GpuReading, ProcessUsage, Source, TelemetrySample};

pub struct NvmlSource {
    nvml: Nvml,
    /// Why a device call failed, said once per (device, call) rather than every sample.
    warned: std::collections::BTreeSet<String>,
}

impl NvmlSource {
    /// `None` when NVML is absent or does not initialise (no NVIDIA driver).
    pub fn open() -> Option<NvmlSource> {
        match Nvml::init() {
            Ok(nvml) => Some(NvmlSource {
                nvml,
                warned: Default::default(),
            }),
            Err(e) => {
                tracing::debug!("NVML not available: {e}");
                None
            }
        }
    }

    /// The driver's version, for doctor.
    pub fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }

    pub fn nvml_version(&self) -> Option<String> {
        self.nvml.sys_nvml_version().ok()
    }
}

/// `00000000:01:00.0` (NVML) → `0000:01:00.0` (sysfs, fdinfo).
pub fn short_bus_id(id: &str) -> String {
    match id.split_once(':') {
        Some((dom, rest)) if dom.len() > 4 => {
            format!("{}:{rest}", &dom[dom.len() - 4..]).to_ascii_lowercase()
        }
        _ => id.to_ascii_lowercase(),
    }
}

impl Source for NvmlSource {
    fn name(&self) -> &'static str {
        "NVML"
    }

    fn sample(&mut self, out: &mut TelemetrySample) {
        let Ok(n) = self.nvml.device_count() else {
            return;
        };
        for i in 0..n {
            let Ok(d) = self.nvml.device_by_index(i) else {
                continue;
            };
            let id = format!("nvidia{i}");
            let mut warn = |what: &str, e: &dyn std::fmt::Display| {
                if self.warned.insert(format!("{id} {what}")) {
                    tracing::debug!("NVML {what} on {id}: {e}");
                }
            };
            macro_rules! ok {
                ($what:expr, $e:expr) => {
                    match $e {
                        Ok(v) => Some(v),
                        Err(e) => {
                            warn($what, &e);
                            None
                        }
                    }
                };
            }
            let util = ok!("utilization", d.utilization_rates());
            let mem = ok!("memory", d.memory_info());
            let cc = ok!("compute capability", d.cuda_compute_capability());
            let mut g = GpuReading {
                id: id.clone(),
                vendor: "nvidia".into(),
                name: ok!("name", d.name()).unwrap_or_else(|| format!("NVIDIA GPU {i}")),
                pci: ok!("pci", d.pci_info()).map(|p| short_bus_id(&p.bus_id)),
                arch: cc.map(|c| format!("sm_{}{}", c.major, c.minor)),
                gpu_util_pct: util.as_ref().map(|u| u.gpu as f32),
                mem_util_pct: util.as_ref().map(|u| u.memory as f32),
                vram_used: mem.as_ref().map(|m| m.used),
                vram_total: mem.as_ref().map(|m| m.total),
                temp_edge_c: ok!("temperature", d.temperature(TemperatureSensor::Gpu))
                    .map(|t| t as f32),
                power_w: ok!("power", d.power_usage()).map(|mw| mw as f32 / 1000.0),
                power_cap_w: ok!("power limit", d.enforced_power_limit())
                    .map(|mw| mw as f32 / 1000.0),
                sclk_mhz: ok!("sm clock", d.clock_info(Clock::SM)),
                mclk_mhz: ok!("memory clock", d.clock_info(Clock::Memory)),
                // Data-centre parts have no fan: NotSupported, left out.
                fan_pct: ok!("fan", d.fan_speed(0)).map(|p| p as f32),
                pcie_speed: ok!("pcie gen", d.current_pcie_link_gen())
                    .map(|g| format!("PCIe gen {g}")),
                pcie_width: ok!("pcie width", d.current_pcie_link_width()),
                ..Default::default()
            };
            g.credit(&[], "NVML");
            for p in ok!("processes", d.running_compute_processes()).unwrap_or_default() {
                let name = std::fs::read_to_string(format!("/proc/{}/comm", p.pid))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default();
                out.processes.push(ProcessUsage {
                    pid: p.pid,
                    name,
                    gpu: id.clone(),
                    vram: match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => Some(b),
                        UsedGpuMemory::Unavailable => None,
                    },
                    ..Default::default()
                });
            }
            out.gpus.push(g);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn nvml_bus_ids_shorten_to_sysfs_form() {
        assert_eq!(super::short_bus_id("00000000:1B:00.0"), "0000:1b:00.0");
        assert_eq!(super::short_bus_id("0000:03:00.0"), "0000:03:00.0");
    }
}
