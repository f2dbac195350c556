//! `hipscope doctor`'s findings that need no GPU work: the environment, the devices telemetry
//! sees, the driver's parameters and firmware, and the known-issue rules — all pure functions of
//! [`Facts`], so fixture trees test them. The functional checks (child processes) live with the
//! command in `app/cmd/doctor.rs`.

pub mod facts;
pub mod report;
pub mod rules;
pub mod verdict;

use facts::{Access, Facts};
use report::{Check, Status};

use crate::gpu::device::human_bytes;

fn access_check(name: String, a: &Access, needed: bool) -> Check {
    let sec = "environment";
    match a {
        Access::Ok => Check::new(sec, name, Status::Pass, "opens for read and write"),
        Access::Missing if needed => Check::new(sec, name, Status::Fail, "missing")
            .advise("load the amdgpu driver (modprobe amdgpu) or check the container's --device flags"),
        Access::Missing => Check::new(sec, name, Status::Skip, "missing (no AMD GPU found)"),
        Access::Denied => Check::new(sec, name, if needed { Status::Fail } else { Status::Warn }, "permission denied")
            .advise("add yourself to the render and video groups (usermod -aG render,video $USER), then log in again"),
        Access::Error(e) => Check::new(sec, name, Status::Warn, e.clone()),
    }
}

/// Environment: OS, kernel, ROCm, libraries, variables, groups, device nodes.
pub fn environment(f: &Facts) -> Vec<Check> {
    let sec = "environment";
    let mut out = vec![Check::new(
        sec,
        "os",
        Status::Pass,
        format!(
            "{} · kernel {}",
            f.os.as_deref().unwrap_or(&f.os_family),
            f.kernel.as_deref().unwrap_or("unknown")
        ),
    )];
    out.push(match &f.rocm_version {
        Some(v) => Check::new(
            sec,
            "rocm",
            Status::Pass,
            format!("/opt/rocm/.info/version: {v}"),
        ),
        None => Check::new(
            sec,
            "rocm",
            Status::Skip,
            "no /opt/rocm/.info/version (distribution packages, or none)",
        ),
    });
    for l in &f.libraries {
        out.push(match &l.found {
            Some((so, file)) => {
                let found = match file {
                    Some(file) if file != so => format!("{so} ({file})"),
                    _ => so.clone(),
                };
                if l.name == "rocm-smi" {
                    rocm_smi_check(f, found)
                } else {
                    Check::new(sec, l.name, Status::Pass, found)
                }
            }
            None => Check::new(sec, l.name, Status::Skip, "not found"),
        });
    }
    for (k, v) in &f.env {
        out.push(Check::new(
            sec,
            k.clone(),
            Status::Pass,
            format!("set to {v:?}"),
        ));
    }
    let amd = f.has_amd();
    if let Some(groups) = &f.groups {
        let missing: Vec<&str> = ["render", "video"]
            .into_iter()
            .filter(|g| !groups.iter().any(|x| x == g))
            .collect();
        let root = unsafe { libc::geteuid() } == 0;
        out.push(if missing.is_empty() || root {
            Check::new(
                sec,
                "groups",
                Status::Pass,
                if root {
                    "running as root".to_string()
                } else {
                    "in render and video".to_string()
                },
            )
        } else {
            Check::new(
                sec,
                "groups",
                if amd { Status::Warn } else { Status::Skip },
                format!("not in {}", missing.join(", ")),
            )
            .advise("usermod -aG render,video $USER, then log in again")
        });
    }
    if let Some(a) = &f.dev_kfd {
        out.push(access_check("/dev/kfd".into(), a, amd));
    }
    for (n, a) in &f.render_nodes {
        out.push(access_check(format!("/dev/dri/{n}"), a, amd));
    }
    if amd && f.render_nodes.is_empty() && f.dev_kfd.is_some() {
        out.push(
            Check::new(sec, "/dev/dri/renderD*", Status::Fail, "no render node")
                .advise("check the amdgpu driver and the container's --device flags"),
        );
    }
    out
}

/// The rocm-smi library: its version and what `rsmi_init` said. A failed init is expected with
/// no AMD GPU; with one it is worth a warning (hipscope reads sysfs itself and goes on).
fn rocm_smi_check(f: &Facts, found: String) -> Check {
    let sec = "environment";
    let Some(p) = &f.rocm_smi else {
        return Check::new(sec, "rocm-smi", Status::Pass, found);
    };
    let amd = f.gpus.iter().filter(|g| g.vendor == "amd").count();
    let head = format!("{found} · library {}", p.version);
    match (&p.error, p.devices) {
        (None, Some(n)) if n as usize == amd => Check::new(
            sec,
            "rocm-smi",
            Status::Pass,
            format!("{head} · rsmi_init ok, {n} device{}", if n == 1 { "" } else { "s" }),
        ),
        (None, Some(n)) => Check::new(
            sec,
            "rocm-smi",
            Status::Warn,
            format!("{head} · rsmi_init ok, {n} devices, sysfs shows {amd} amdgpu card{}", if amd == 1 { "" } else { "s" }),
        )
        .advise("rocm-smi and sysfs disagree: check /dev/kfd access and that the library matches the driver"),
        (Some(e), _) if amd == 0 => Check::new(
            sec,
            "rocm-smi",
            Status::Pass,
            format!("{head} · no AMD GPU: {e}"),
        ),
        (e, _) => Check::new(
            sec,
            "rocm-smi",
            Status::Warn,
            format!("{head} · {}", e.as_deref().unwrap_or("no answer")),
        )
        .advise("telemetry reads sysfs without it; for rocm-smi itself, check /dev/kfd access and that the library matches the driver"),
    }
}

/// Devices: every GPU telemetry sees, with what kind it is.
pub fn devices(f: &Facts) -> Vec<Check> {
    let sec = "devices";
    let mut out = Vec::new();
    if f.gpus.is_empty() {
        out.push(Check::new(
            sec,
            "gpus",
            Status::Skip,
            "no GPU in sysfs (amdgpu) or NVML",
        ));
    }
    for g in &f.gpus {
        let mut d = vec![g.name.clone()];
        if let Some(a) = &g.arch {
            d.push(a.clone());
        }
        if let Some(p) = &g.pci {
            d.push(p.clone());
        }
        d.push(if g.apu {
            "APU".into()
        } else {
            "discrete".into()
        });
        if let Some(t) = g.vram_total {
            d.push(format!("VRAM {}", human_bytes(t)));
        }
        if let Some(t) = g.gtt_total {
            d.push(format!("GTT {}", human_bytes(t)));
        }
        if g.suspended {
            d.push("runtime-suspended (not woken)".into());
        }
        let from = g.source_names();
        if !from.is_empty() {
            d.push(format!("read from {}", from.join(", ")));
        }
        let missing_arch = g.vendor == "amd" && g.arch.is_none() && !g.suspended;
        let mut c = Check::new(
            sec,
            g.id.clone(),
            if missing_arch {
                Status::Warn
            } else {
                Status::Pass
            },
            d.join(" · "),
        );
        if missing_arch {
            c = c.advise("no KFD topology node for it: the amdgpu KFD is off or the GPU is not supported by ROCm");
        }
        out.push(c);
    }
    for n in &f.notes {
        out.push(Check::new(sec, "sysfs", Status::Warn, n.clone()));
    }
    out
}

/// Driver: amdgpu module parameters and firmware versions, then the known-issue rules.
pub fn driver(f: &Facts) -> Vec<Check> {
    let sec = "driver";
    let mut out = Vec::new();
    if !f.module_params.is_empty() {
        let p: Vec<String> = f
            .module_params
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        out.push(Check::new(sec, "amdgpu params", Status::Pass, p.join(" ")));
    } else if f.has_amd() {
        out.push(Check::new(
            sec,
            "amdgpu params",
            Status::Warn,
            "/sys/module/amdgpu/parameters not readable",
        ));
    }
    let mes: Vec<String> = f
        .firmware
        .iter()
        .filter(|(k, _)| {
            k.ends_with("/mes_fw_version")
                || k.ends_with("/mec_fw_version")
                || k.ends_with("/smc_fw_version")
        })
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if !mes.is_empty() {
        out.push(Check::new(sec, "firmware", Status::Pass, mes.join(" ")));
    }
    out.extend(rules::evaluate(f));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::telemetry::{GpuReading, rocm_smi::Probe};

    fn facts(amd_cards: usize, probe: Probe) -> Facts {
        Facts {
            gpus: (0..amd_cards)
                .map(|i| GpuReading {
                    id: format!("card{i}"),
                    vendor: "amd".into(),
                    ..Default::default()
                })
                .collect(),
            rocm_smi: Some(probe),
            ..Default::default()
        }
    }

    fn probe(devices: Option<u32>, error: Option<&str>) -> Probe {
        Probe {
            soname: "librocm_smi64.so.1".into(),
            version: "1.0.0".into(),
            devices,
            error: error.map(str::to_string),
        }
    }

    #[test]
    fn rocm_smi_is_reported_with_its_version_and_what_init_said() {
        let init_failed = "rsmi_init failed: RSMI_STATUS_INIT_ERROR (8)";
        // No AMD GPU: a failed init is expected, and said.
        let c = rocm_smi_check(&facts(0, probe(None, Some(init_failed))), "so".into());
        assert_eq!(c.status, Status::Pass);
        assert!(c.detail.contains("library 1.0.0"), "{}", c.detail);
        assert!(
            c.detail.contains("no AMD GPU: rsmi_init failed"),
            "{}",
            c.detail
        );
        // An AMD GPU rocm-smi cannot see: a warning, and telemetry goes on without it.
        let c = rocm_smi_check(&facts(1, probe(None, Some(init_failed))), "so".into());
        assert_eq!(c.status, Status::Warn);
        assert!(c.advice.contains("sysfs"), "{}", c.advice);
        let c = rocm_smi_check(&facts(1, probe(Some(1), None)), "so".into());
        assert_eq!(
            (c.status, c.detail.ends_with("1 device")),
            (Status::Pass, true)
        );
        let c = rocm_smi_check(&facts(2, probe(Some(1), None)), "so".into());
        assert_eq!(c.status, Status::Warn, "{}", c.detail);
    }
}
