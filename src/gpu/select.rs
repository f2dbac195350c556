//! Device and device choice: `--backend auto|hip|cuda|cpu` and `--device N`. `auto` tries HIP,
//! then CUDA, then the CPU, and says which and why. Without `--device`, the largest discrete GPU
//! is used (a Ryzen desktop with an RX 7900 XTX also exposes its integrated GPU). Device numbers
//! are the runtime's, after `HIP_VISIBLE_DEVICES` / `CUDA_VISIBLE_DEVICES`, which the runtimes
//! apply themselves.

use std::fmt;
use std::str::FromStr;

use crate::gpu::device::{Device, DeviceInfo, GpuError, RuntimeKind, human_bytes};
use crate::gpu::kernels::KernelCompiler;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendChoice {
    #[default]
    Auto,
    Hip,
    Cuda,
    Cpu,
    /// The scripted fake device (for dry runs of the selftest and tests; not listed in help).
    Fake,
}

impl BackendChoice {
    /// The choices a user may name (the fake device is for tests only).
    pub const ALLOWED: &'static str = "\"auto\", \"hip\", \"cuda\" or \"cpu\"";

    /// A user's choice (config file, chat flags): the fake device is not one.
    pub fn parse(s: &str) -> Option<BackendChoice> {
        s.parse().ok().filter(|&c| c != BackendChoice::Fake)
    }

    pub fn name(self) -> &'static str {
        match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Hip => "hip",
            BackendChoice::Cuda => "cuda",
            BackendChoice::Cpu => "cpu",
            BackendChoice::Fake => "fake",
        }
    }
}

impl FromStr for BackendChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(BackendChoice::Auto),
            "hip" | "rocm" => Ok(BackendChoice::Hip),
            "cuda" => Ok(BackendChoice::Cuda),
            "cpu" => Ok(BackendChoice::Cpu),
            "fake" => Ok(BackendChoice::Fake),
            other => Err(format!(
                "unknown backend {other:?} (auto, hip, cuda or cpu)"
            )),
        }
    }
}

impl fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The outcome of selection.
pub enum Selected {
    Gpu {
        backend: Box<dyn Device>,
        reason: String,
    },
    Cpu {
        reason: String,
    },
}

impl Selected {
    pub fn reason(&self) -> &str {
        match self {
            Selected::Gpu { reason, .. } | Selected::Cpu { reason } => reason,
        }
    }
}

/// The default device: discrete before integrated, then the most memory, then the lowest index.
pub fn pick_default(devices: &[DeviceInfo]) -> Option<&DeviceInfo> {
    devices.iter().min_by(|a, b| {
        a.integrated
            .cmp(&b.integrated)
            .then(b.total_memory.cmp(&a.total_memory))
            .then(a.ordinal.cmp(&b.ordinal))
    })
}

/// Picks `requested` or the default among `devices`, explaining the choice.
pub fn pick(
    backend: RuntimeKind,
    devices: &[DeviceInfo],
    requested: Option<u32>,
) -> Result<(u32, String), GpuError> {
    let list = || {
        devices
            .iter()
            .map(|d| {
                format!(
                    "{}: {} ({}, {}{})",
                    d.ordinal,
                    d.name,
                    d.arch,
                    human_bytes(d.total_memory),
                    if d.integrated { ", integrated" } else { "" }
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    let visible = match backend {
        RuntimeKind::Hip => ["HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"].as_slice(),
        RuntimeKind::Cuda => ["CUDA_VISIBLE_DEVICES"].as_slice(),
        RuntimeKind::Fake => [].as_slice(),
    };
    let env_note: String = visible
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| format!(" ({k}={v})")))
        .collect();
    match requested {
        Some(n) => match devices.iter().find(|d| d.ordinal == n) {
            Some(d) => Ok((
                n,
                format!("{backend} device {n} ({}) as requested{env_note}", d.name),
            )),
            None => Err(GpuError::InvalidArgument(format!(
                "--device {n}: {backend} sees {} device(s){env_note}: {}",
                devices.len(),
                list()
            ))),
        },
        None => {
            let d = pick_default(devices).ok_or_else(|| GpuError::NoDevice {
                backend,
                detail: "no devices listed".into(),
            })?;
            let why = if devices.len() == 1 {
                "the only device".to_string()
            } else if !d.integrated && devices.iter().any(|x| x.integrated) {
                "the largest discrete GPU".to_string()
            } else {
                "the GPU with the most memory".to_string()
            };
            Ok((
                d.ordinal,
                format!(
                    "{backend} device {} ({}, {}): {why} of {}{env_note}",
                    d.ordinal,
                    d.name,
                    human_bytes(d.total_memory),
                    devices.len()
                ),
            ))
        }
    }
}

fn open_hip(device: Option<u32>) -> Result<(Box<dyn Device>, String), GpuError> {
    let rt = crate::gpu::hip::HipRuntime::load()?;
    let devices = rt.devices()?;
    let (n, why) = pick(RuntimeKind::Hip, &devices, device)?;
    let be = rt.open(n)?;
    Ok((Box::new(be), why))
}

fn open_cuda(device: Option<u32>) -> Result<(Box<dyn Device>, String), GpuError> {
    let devices = crate::gpu::cuda::probe()?;
    let (n, why) = pick(RuntimeKind::Cuda, &devices, device)?;
    let be = crate::gpu::cuda::CudaDevice::open(n)?;
    Ok((Box::new(be), why))
}

/// Opens the chosen backend's device, or explains why the CPU is used.
pub fn select(choice: BackendChoice, device: Option<u32>) -> Result<Selected, GpuError> {
    match choice {
        BackendChoice::Hip => {
            let (backend, reason) = open_hip(device)?;
            Ok(Selected::Gpu {
                backend,
                reason: format!("hip: {reason}"),
            })
        }
        BackendChoice::Cuda => {
            let (backend, reason) = open_cuda(device)?;
            Ok(Selected::Gpu {
                backend,
                reason: format!("cuda: {reason}"),
            })
        }
        BackendChoice::Fake => Ok(Selected::Gpu {
            backend: Box::new(crate::gpu::fake::FakeDevice::new(
                crate::gpu::fake::FakeScript::default(),
            )),
            reason: "fake: the scripted test device, as requested".into(),
        }),
        BackendChoice::Cpu => Ok(Selected::Cpu {
            reason: "cpu: as requested".into(),
        }),
        BackendChoice::Auto => {
            let hip_err = match open_hip(device) {
                Ok((backend, reason)) => {
                    return Ok(Selected::Gpu {
                        backend,
                        reason: format!("auto: {reason}"),
                    });
                }
                Err(e) => e,
            };
            let cuda_err = match open_cuda(device) {
                Ok((backend, reason)) => {
                    return Ok(Selected::Gpu {
                        backend,
                        reason: format!("auto: HIP unavailable ({}); {reason}", short(&hip_err)),
                    });
                }
                Err(e) => e,
            };
            Ok(Selected::Cpu {
                reason: format!(
                    "auto: HIP unavailable ({}); CUDA unavailable ({}); using the CPU",
                    short(&hip_err),
                    short(&cuda_err)
                ),
            })
        }
    }
}

/// Whether an explicit GPU choice can start, without opening a device: the runtime loads, lists
/// devices and `device` is among them. For refusing `--backend hip|cuda` before a program commits
/// to it (the chat, before it takes the terminal); `auto`, `cpu` and `fake` always pass.
pub fn preflight(choice: BackendChoice, device: Option<u32>) -> Result<(), GpuError> {
    let (kind, devices) = match choice {
        BackendChoice::Hip => (RuntimeKind::Hip, crate::gpu::hip::probe()?),
        BackendChoice::Cuda => (RuntimeKind::Cuda, crate::gpu::cuda::probe()?),
        BackendChoice::Auto | BackendChoice::Cpu | BackendChoice::Fake => return Ok(()),
    };
    pick(kind, &devices, device).map(|_| ())
}

fn short(e: &GpuError) -> String {
    match e {
        GpuError::LibraryMissing { what, .. } => format!("no {what}"),
        GpuError::NoDevice { detail, .. } => format!("no device: {detail}"),
        other => other.to_string(),
    }
}

/// The run-time kernel compiler of a runtime, loaded from its libraries (hiprtc, nvrtc).
pub fn compiler_for(runtime: RuntimeKind) -> Result<Box<dyn KernelCompiler>, GpuError> {
    match runtime {
        RuntimeKind::Hip => Ok(Box::new(crate::gpu::hip::rtc::Hiprtc::load()?)),
        RuntimeKind::Cuda => Ok(Box::new(crate::gpu::cuda::Nvrtc::load()?)),
        RuntimeKind::Fake => Ok(Box::new(crate::gpu::fake::FakeCompiler)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(ordinal: u32, gib: u64, integrated: bool) -> DeviceInfo {
        DeviceInfo {
            ordinal,
            name: format!("gpu{ordinal}"),
            arch: "gfx1100".into(),
            total_memory: gib << 30,
            integrated,
            ..Default::default()
        }
    }

    #[test]
    fn default_is_the_largest_discrete_gpu() {
        // A Ryzen desktop: the iGPU (sharing 32 GiB of RAM) comes first and reports more memory.
        let devs = [dev(0, 32, true), dev(1, 24, false), dev(2, 16, false)];
        assert_eq!(pick_default(&devs).map(|d| d.ordinal), Some(1));
        let (n, why) = pick(RuntimeKind::Hip, &devs, None).expect("pick");
        assert_eq!(n, 1);
        assert!(why.contains("largest discrete"), "{why}");
        // A Strix Halo alone: the APU is the device.
        assert_eq!(
            pick_default(&[dev(0, 96, true)]).map(|d| d.ordinal),
            Some(0)
        );
        assert_eq!(pick_default(&[]), None);
    }

    #[test]
    fn an_explicit_device_must_exist() {
        let devs = [dev(0, 24, false)];
        assert_eq!(pick(RuntimeKind::Hip, &devs, Some(0)).expect("ok").0, 0);
        let e = pick(RuntimeKind::Hip, &devs, Some(3))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--device 3") && e.contains("gpu0"), "{e}");
    }

    #[test]
    fn backend_names_parse() {
        assert_eq!("HIP".parse(), Ok(BackendChoice::Hip));
        assert_eq!("auto".parse(), Ok(BackendChoice::Auto));
        assert!("metal".parse::<BackendChoice>().is_err());
    }
}
