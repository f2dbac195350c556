//! Known issues from the field, as one table: each rule names its upstream issue, says when it
//! applies (a predicate over [`Facts`] that returns what it saw), how bad it is, and what to do.
//! To add one, add a row here and a fixture that triggers it (tests/doctor_rules.rs).

use super::facts::Facts;
use super::report::{Check, Status};

pub struct Rule {
    pub id: &'static str,
    pub issue: &'static str,
    pub title: &'static str,
    pub status: Status,
    pub advice: &'static str,
    /// `Some(what was seen)` when the rule applies.
    pub applies: fn(&Facts) -> Option<String>,
}

/// `0x00000083` → 0x83.
fn hex(v: &str) -> Option<u32> {
    u32::from_str_radix(v.trim().trim_start_matches("0x"), 16).ok()
}

/// Cards whose arch is `arch`, by card name.
fn cards_with_arch<'a>(f: &'a Facts, arch: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    f.gpus
        .iter()
        .filter(move |g| g.arch.as_deref() == Some(arch))
        .map(|g| g.id.as_str())
}

fn mes_0x83(f: &Facts) -> Option<String> {
    for card in cards_with_arch(f, "gfx1151") {
        let key = format!("{card}/mes_fw_version");
        if let Some((_, v)) = f.firmware.iter().find(|(k, _)| *k == key)
            && hex(v) == Some(0x83)
        {
            return Some(format!("{card} (gfx1151) runs MES firmware {v}"));
        }
    }
    None
}

fn cwsr_gfx1151(f: &Facts) -> Option<String> {
    let card = cards_with_arch(f, "gfx1151").next()?;
    let cwsr = f.module_param("cwsr_enable")?;
    if cwsr == "0" {
        return None;
    }
    // Fixed in kernel 6.18-rc6 together with ROCm 7.2.1.
    if f.kernel_version().is_some_and(|v| v >= (6, 18)) {
        return None;
    }
    Some(format!(
        "{card} (gfx1151) with amdgpu.cwsr_enable={cwsr} on kernel {}",
        f.kernel.as_deref().unwrap_or("?")
    ))
}

fn hsa_override(f: &Facts) -> Option<String> {
    let v = f.env_var("HSA_OVERRIDE_GFX_VERSION")?;
    let target = crate::gpu::telemetry::kfd::override_arch(v).unwrap_or_else(|| "?".into());
    let real: Vec<&str> = f.gpus.iter().filter_map(|g| g.arch.as_deref()).collect();
    Some(format!(
        "HSA_OVERRIDE_GFX_VERSION={v}: kernels built for {target} run on {}",
        if real.is_empty() {
            "this GPU".to_string()
        } else {
            real.join(", ")
        }
    ))
}

fn windows_exit(f: &Facts) -> Option<String> {
    (f.os_family == "windows").then(|| "Windows HIP SDK".to_string())
}

fn apu_power(f: &Facts) -> Option<String> {
    let g = f.gpus.iter().find(|g| g.apu && g.vendor == "amd")?;
    Some(format!(
        "{} is an APU: VRAM carve-out {}, GTT {}",
        g.id,
        g.vram_total
            .map(crate::gpu::device::human_bytes)
            .unwrap_or_else(|| "?".into()),
        g.gtt_total
            .map(crate::gpu::device::human_bytes)
            .unwrap_or_else(|| "?".into())
    ))
}

pub const RULES: &[Rule] = &[
    Rule {
        id: "mes-0x83",
        issue: "ROCm/ROCm#5724",
        title: "MES firmware 0x83 on gfx1151 hangs",
        status: Status::Fail,
        advice: "update linux-firmware to a release with another MES (AMD advised 0x80)",
        applies: mes_0x83,
    },
    Rule {
        id: "cwsr-gfx1151",
        issue: "ROCm/ROCm#5590",
        title: "CWSR hangs on gfx1151 before kernel 6.18",
        status: Status::Warn,
        advice: "boot with amdgpu.cwsr_enable=0, or kernel ≥ 6.18-rc6 with ROCm ≥ 7.2.1",
        applies: cwsr_gfx1151,
    },
    Rule {
        id: "hsa-override",
        issue: "ROCm docs: HSA_OVERRIDE_GFX_VERSION",
        title: "GFX version overridden",
        status: Status::Warn,
        advice: "unset it unless your GPU's own target has no code objects",
        applies: hsa_override,
    },
    Rule {
        id: "windows-exit-hang",
        issue: "pytorch#160759, ROCm/TheRock#999",
        title: "exit hangs in __hipUnregisterFatBinary",
        status: Status::Warn,
        advice: "hipscope drains its stream before exit; other HIP programs may hang at exit",
        applies: windows_exit,
    },
    Rule {
        id: "apu-gtt",
        issue: "llama.cpp #15021",
        title: "APU: model memory is GTT, hwmon power is the package",
        status: Status::Pass,
        advice: "size models by GTT, not VRAM; GPU power comes from gpu_metrics",
        applies: apu_power,
    },
];

/// One check per rule that applies.
pub fn evaluate(f: &Facts) -> Vec<Check> {
    RULES
        .iter()
        .filter_map(|r| {
            let seen = (r.applies)(f)?;
            Some(
                Check::new(
                    "known issues",
                    r.id,
                    r.status,
                    format!("{}: {seen} ({})", r.title, r.issue),
                )
                .advise(r.advice),
            )
        })
        .collect()
}
