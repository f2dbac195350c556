//! GPU and host telemetry: every sysfs and `/proc` reading of the program, one file per data
//! source (as amdgpu_top and bottom do), all behind the [`Source`] trait. A [`Sampler`] asks each
//! source in turn and returns one [`TelemetrySample`]; [`spawn`] runs it on its own thread at the
//! configured interval. Every reading is an `Option`: what a platform lacks stays `None`, never 0.
//!
//! The roots read (`/sys`, `/proc`, `/dev`) come from [`Roots`], so a tree captured on a real
//! machine (`hipscope doctor --capture DIR`) replays through this same code.
//!
//! Sources: [`sysfs`] (amdgpu's own files), [`hwmon`] (temperatures, power, fan),
//! [`gpu_metrics`] (the SMU's binary table), [`kfd`] (topology: arch, APU), [`fdinfo`]
//! (per-process VRAM/GTT), [`host`] (CPU and memory from `/proc`), [`nvml`] (NVIDIA),
//! [`rocm_smi`] (AMD through `librocm_smi64`, a second source that fills what sysfs left out).
//! Each reading of a GPU records the source it came from ([`GpuReading::from`]), which the
//! panel, `top` and `doctor` show.

pub mod fdinfo;
pub mod gpu_metrics;
pub mod host;
pub mod hwmon;
pub mod kfd;
pub mod nvml;
pub mod rocm_smi;
pub mod sysfs;

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde::Serialize;

/// Where the kernel's files are read from. `HIPSCOPE_SYSFS_ROOT`, `HIPSCOPE_PROCFS_ROOT` and
/// `HIPSCOPE_DEV_ROOT` (or `--sysfs-root` / `--procfs-root`) point them at a captured tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Roots {
    pub sys: PathBuf,
    pub proc: PathBuf,
    pub dev: PathBuf,
}

pub const SYSFS_ENV: &str = "HIPSCOPE_SYSFS_ROOT";
pub const PROCFS_ENV: &str = "HIPSCOPE_PROCFS_ROOT";
pub const DEV_ENV: &str = "HIPSCOPE_DEV_ROOT";

impl Default for Roots {
    fn default() -> Self {
        Roots {
            sys: PathBuf::from("/sys"),
            proc: PathBuf::from("/proc"),
            dev: PathBuf::from("/dev"),
        }
    }
}

impl Roots {
    /// The real roots, unless the environment points elsewhere.
    pub fn from_env() -> Roots {
        let pick = |key: &str, default: PathBuf| {
            std::env::var_os(key)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .unwrap_or(default)
        };
        let d = Roots::default();
        Roots {
            sys: pick(SYSFS_ENV, d.sys),
            proc: pick(PROCFS_ENV, d.proc),
            dev: pick(DEV_ENV, d.dev),
        }
    }

    /// One directory holding `sys/`, `proc/` and `dev/` (what `doctor --capture` writes).
    pub fn under(dir: &Path) -> Roots {
        Roots {
            sys: dir.join("sys"),
            proc: dir.join("proc"),
            dev: dir.join("dev"),
        }
    }

    /// Whether every root is the live system's (NVML and the runtimes only see that one).
    pub fn is_live(&self) -> bool {
        *self == Roots::default()
    }

    pub fn kfd_nodes(&self) -> PathBuf {
        self.sys.join("class/kfd/kfd/topology/nodes")
    }
}

/// Why a file gave no value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadError {
    Missing,
    Denied,
    Other(String),
}

/// The text of a small kernel file, trimmed.
pub fn read_text(path: &Path) -> Result<String, ReadError> {
    match std::fs::read(path) {
        Ok(b) => Ok(String::from_utf8_lossy(&b).trim().to_string()),
        Err(e) => Err(match e.kind() {
            ErrorKind::NotFound => ReadError::Missing,
            ErrorKind::PermissionDenied => ReadError::Denied,
            _ => ReadError::Other(format!("{}: {e}", path.display())),
        }),
    }
}

/// A number from a one-value file; `None` when missing, unreadable or not a number.
pub fn read_num<T: std::str::FromStr>(path: &Path) -> Option<T> {
    read_text(path).ok()?.parse().ok()
}

/// Which part of the package a power reading covers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PowerScope {
    /// The graphics card (a discrete GPU's board, or NVML's).
    #[default]
    Gpu,
    /// The whole APU package, CPU included (hwmon on Strix Halo).
    Package,
}

/// One GPU's readings at one instant.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuReading {
    /// `card1`, `nvidia0`: stable within a boot.
    pub id: String,
    /// `amd` or `nvidia`.
    pub vendor: String,
    pub name: String,
    pub pci: Option<String>,
    /// `gfx1100`, `sm_90`.
    pub arch: Option<String>,
    pub apu: bool,
    /// Runtime-suspended: not woken to be read, so its sensors are `None`.
    pub suspended: bool,
    /// hipscope itself has this GPU open.
    pub ours: bool,
    pub gpu_util_pct: Option<f32>,
    pub mem_util_pct: Option<f32>,
    pub vram_used: Option<u64>,
    pub vram_total: Option<u64>,
    pub vis_vram_used: Option<u64>,
    pub vis_vram_total: Option<u64>,
    pub gtt_used: Option<u64>,
    pub gtt_total: Option<u64>,
    pub temp_edge_c: Option<f32>,
    pub temp_junction_c: Option<f32>,
    pub temp_mem_c: Option<f32>,
    pub power_w: Option<f32>,
    pub power_scope: PowerScope,
    /// The GPU's own share on an APU (from `gpu_metrics`), when the main reading is the package.
    pub gpu_power_w: Option<f32>,
    pub power_cap_w: Option<f32>,
    pub sclk_mhz: Option<u32>,
    pub mclk_mhz: Option<u32>,
    pub fan_rpm: Option<u32>,
    pub fan_pct: Option<f32>,
    /// e.g. `16.0 GT/s PCIe`.
    pub pcie_speed: Option<String>,
    pub pcie_width: Option<u32>,
    /// `gpu_metrics` format.content revision, e.g. `1.3`.
    pub gpu_metrics: Option<String>,
    /// Where each reading came from: its field name (as in this JSON) → `sysfs`, `hwmon`,
    /// `gpu_metrics`, `rocm-smi` or `NVML`. A reading two sources have is the first one's.
    pub from: BTreeMap<&'static str, &'static str>,
}

/// Every reading of a [`GpuReading`] that a source supplies: its field name, a short label for
/// the screens, and whether it is present. The one list that provenance walks.
#[allow(clippy::type_complexity)]
pub const READINGS: &[(&str, &str, fn(&GpuReading) -> bool)] = &[
    ("gpu_util_pct", "util", |g| g.gpu_util_pct.is_some()),
    ("mem_util_pct", "mem busy", |g| g.mem_util_pct.is_some()),
    ("vram_used", "vram", |g| g.vram_used.is_some()),
    ("vram_total", "vram", |g| g.vram_total.is_some()),
    ("vis_vram_used", "vis vram", |g| g.vis_vram_used.is_some()),
    ("vis_vram_total", "vis vram", |g| g.vis_vram_total.is_some()),
    ("gtt_used", "gtt", |g| g.gtt_used.is_some()),
    ("gtt_total", "gtt", |g| g.gtt_total.is_some()),
    ("temp_edge_c", "temp", |g| g.temp_edge_c.is_some()),
    ("temp_junction_c", "hotspot", |g| {
        g.temp_junction_c.is_some()
    }),
    ("temp_mem_c", "mem temp", |g| g.temp_mem_c.is_some()),
    ("power_w", "power", |g| g.power_w.is_some()),
    ("gpu_power_w", "gpu power", |g| g.gpu_power_w.is_some()),
    ("power_cap_w", "power cap", |g| g.power_cap_w.is_some()),
    ("sclk_mhz", "sclk", |g| g.sclk_mhz.is_some()),
    ("mclk_mhz", "mclk", |g| g.mclk_mhz.is_some()),
    ("fan_rpm", "fan", |g| g.fan_rpm.is_some()),
    ("fan_pct", "fan", |g| g.fan_pct.is_some()),
    ("pcie_speed", "pcie", |g| g.pcie_speed.is_some()),
    ("pcie_width", "pcie", |g| g.pcie_width.is_some()),
];

impl GpuReading {
    /// The memory to show first: GTT on an APU (the model lives there, not in the small
    /// carve-out), else VRAM.
    pub fn headline_memory(&self) -> Option<(&'static str, u64, u64)> {
        let vram = self
            .vram_used
            .zip(self.vram_total)
            .map(|(u, t)| ("VRAM", u, t));
        let gtt = self
            .gtt_used
            .zip(self.gtt_total)
            .map(|(u, t)| ("GTT", u, t));
        if self.apu { gtt.or(vram) } else { vram.or(gtt) }
    }

    /// The field names of the readings present now.
    pub fn present(&self) -> Vec<&'static str> {
        READINGS
            .iter()
            .filter(|(_, _, has)| has(self))
            .map(|(k, _, _)| *k)
            .collect()
    }

    /// Credits `source` with every reading present now that was absent in `before` (what
    /// [`GpuReading::present`] returned before the source read) and has no source yet.
    pub fn credit(&mut self, before: &[&'static str], source: &'static str) {
        for k in self.present() {
            if !before.contains(&k) {
                self.from.entry(k).or_insert(source);
            }
        }
    }

    /// Each source with the short labels of the readings it gave, in [`READINGS`] order (a
    /// pool's use and total share one label).
    pub fn sources(&self) -> Vec<(&'static str, Vec<&'static str>)> {
        let mut out: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
        for (k, label, has) in READINGS {
            let Some(src) = self.from.get(k).filter(|_| has(self)) else {
                continue;
            };
            match out.iter_mut().find(|(s, _)| s == src) {
                Some((_, v)) if v.contains(label) => {}
                Some((_, v)) => v.push(label),
                None => out.push((src, vec![label])),
            }
        }
        out
    }

    /// A source as the screens name it: `gpu_metrics` with its revision (`gpu_metrics 1.3`).
    pub fn source_label(&self, source: &str) -> String {
        match (source, &self.gpu_metrics) {
            ("gpu_metrics", Some(rev)) => format!("gpu_metrics {rev}"),
            _ => source.to_string(),
        }
    }

    /// `sysfs, hwmon, gpu_metrics 1.3`: the sources that gave readings, for one line.
    pub fn source_names(&self) -> Vec<String> {
        self.sources()
            .into_iter()
            .map(|(s, _)| self.source_label(s))
            .collect()
    }
}

/// One process's use of one GPU (from `/proc/PID/fdinfo` or NVML).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ProcessUsage {
    pub pid: u32,
    pub name: String,
    /// [`GpuReading::id`] of the GPU.
    pub gpu: String,
    pub vram: Option<u64>,
    pub gtt: Option<u64>,
    /// Graphics-engine busy time since the process opened the device, ns.
    pub gfx_ns: Option<u64>,
    pub ours: bool,
}

/// One sample of the host: CPU use across all cores since the previous sample, and memory.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct HostSample {
    /// `None` for the first sample: a rate needs two readings.
    pub cpu_pct: Option<f32>,
    /// hipscope's own share of the whole machine's CPU time (same scale as `cpu_pct`).
    pub own_cpu_pct: Option<f32>,
    pub mem_used: Option<u64>,
    pub mem_total: Option<u64>,
}

/// Everything one round of sampling saw.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TelemetrySample {
    /// Milliseconds since the Unix epoch.
    pub time_ms: u64,
    pub gpus: Vec<GpuReading>,
    pub processes: Vec<ProcessUsage>,
    pub host: HostSample,
    /// Files that exist but could not be read or made no sense (`permission denied: …`).
    pub notes: Vec<String>,
}

impl TelemetrySample {
    /// The GPU hipscope computes on, else the first one.
    pub fn main_gpu(&self) -> Option<&GpuReading> {
        self.gpus.iter().find(|g| g.ours).or(self.gpus.first())
    }
}

/// One data source. `sample` adds what it knows to `out`; a source that finds nothing adds
/// nothing.
pub trait Source: Send {
    fn name(&self) -> &'static str;
    fn sample(&mut self, out: &mut TelemetrySample);
}

/// Asks every source in turn.
pub struct Sampler {
    sources: Vec<Box<dyn Source>>,
}

impl Sampler {
    /// The default sources for these roots. NVML is only asked on the live system (it cannot
    /// read a captured tree) and only when `libnvidia-ml.so.1` loads.
    pub fn new(roots: &Roots) -> Sampler {
        let mut sources: Vec<Box<dyn Source>> = vec![
            Box::new(host::HostSource::new(roots)),
            Box::new(sysfs::AmdSysfs::new(roots)),
        ];
        // rocm-smi reads the live machine only, and is loaded only where sysfs shows an amdgpu
        // card (it has nothing to add elsewhere, and its init writes to stderr when it fails).
        if roots.is_live()
            && !sysfs::cards(roots).is_empty()
            && let Ok(r) = rocm_smi::RocmSmiSource::open()
        {
            sources.push(Box::new(r));
        }
        if roots.is_live()
            && let Some(n) = nvml::NvmlSource::open()
        {
            sources.push(Box::new(n));
        }
        sources.push(Box::new(fdinfo::FdinfoSource::new(roots)));
        Sampler { sources }
    }

    pub fn with_sources(sources: Vec<Box<dyn Source>>) -> Sampler {
        Sampler { sources }
    }

    pub fn source_names(&self) -> Vec<&'static str> {
        self.sources.iter().map(|s| s.name()).collect()
    }

    pub fn sample(&mut self) -> TelemetrySample {
        let mut out = TelemetrySample {
            time_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            ..Default::default()
        };
        for s in &mut self.sources {
            s.sample(&mut out);
        }
        // A GPU is ours when this process holds it open (its fdinfo or NVML process list).
        let me = std::process::id();
        for p in &mut out.processes {
            p.ours = p.pid == me;
        }
        for g in &mut out.gpus {
            g.ours = out.processes.iter().any(|p| p.ours && p.gpu == g.id);
        }
        out
    }
}

/// Runs the sampler on its own thread every `interval`, handing each sample to `deliver`, until
/// `deliver` returns false or `stop` is signalled (or dropped). Never on the UI thread.
pub fn spawn(
    roots: Roots,
    interval: Duration,
    stop: Receiver<()>,
    mut deliver: impl FnMut(TelemetrySample) -> bool + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("hipscope-telemetry".into())
        .spawn(move || {
            let mut sampler = Sampler::new(&roots);
            loop {
                let t = Instant::now();
                if !deliver(sampler.sample()) {
                    return;
                }
                let wait = interval.saturating_sub(t.elapsed());
                match stop.recv_timeout(wait) {
                    Err(RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
            }
        })
}

/// The sampling interval from `[telemetry] interval_ms`, kept within sane bounds.
pub fn interval(ms: u64) -> Duration {
    Duration::from_millis(ms.clamp(50, 60_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_errors_say_missing_or_denied() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(read_text(&dir.path().join("nope")), Err(ReadError::Missing));
        let f = dir.path().join("v");
        std::fs::write(&f, " 42\n").expect("write");
        assert_eq!(read_num::<u32>(&f), Some(42));
        std::fs::write(&f, "garbage\n").expect("write");
        assert_eq!(read_num::<u32>(&f), None);
    }

    #[test]
    fn apus_headline_gtt_and_discrete_gpus_vram() {
        let mut g = GpuReading {
            vram_used: Some(1),
            vram_total: Some(512 << 20),
            gtt_used: Some(2),
            gtt_total: Some(64 << 30),
            ..Default::default()
        };
        assert_eq!(g.headline_memory().map(|m| m.0), Some("VRAM"));
        g.apu = true;
        assert_eq!(g.headline_memory(), Some(("GTT", 2, 64 << 30)));
    }

    #[test]
    fn each_reading_is_credited_to_the_first_source_that_gave_it() {
        let mut g = GpuReading {
            gpu_util_pct: Some(5.0),
            ..Default::default()
        };
        g.credit(&[], "sysfs");
        let before = g.present();
        g.temp_edge_c = Some(40.0);
        g.gpu_util_pct = Some(6.0); // a later source may not take it over
        g.credit(&before, "hwmon");
        let before = g.present();
        g.gpu_metrics = Some("1.3".into());
        g.fan_rpm = Some(900);
        g.credit(&before, "gpu_metrics");
        assert_eq!(g.from.get("gpu_util_pct"), Some(&"sysfs"));
        assert_eq!(g.from.get("temp_edge_c"), Some(&"hwmon"));
        assert_eq!(
            g.sources(),
            vec![
                ("sysfs", vec!["util"]),
                ("hwmon", vec!["temp"]),
                ("gpu_metrics", vec!["fan"])
            ]
        );
        assert_eq!(g.source_names(), ["sysfs", "hwmon", "gpu_metrics 1.3"]);
        // A reading that went away is no source's.
        g.fan_rpm = None;
        assert_eq!(g.source_names(), ["sysfs", "hwmon"]);
    }
}
