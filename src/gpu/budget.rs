//! How much device memory a model may plan for (`-ngl auto`). A discrete GPU: what its runtime
//! reports free. An APU (Strix Halo, Strix Point): its GPU reaches system memory through GTT,
//! so a VRAM carve-out of 512 MiB says little; the plan counts GTT's free part when that is
//! larger, and says which it used. The APU and its pools are read from amdgpu's sysfs through
//! the telemetry code (`telemetry/sysfs.rs`), at the roots given (a captured tree in tests).

use crate::gpu::snapshot::DeviceSummary;
use crate::gpu::telemetry::{GpuReading, Roots, kfd, sysfs};

/// Memory a model's GPU part may take, and where the number came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsableMemory {
    pub bytes: u64,
    /// `VRAM free (runtime)`, `GTT free on an APU (sysfs mem_info_gtt_*; VRAM carve-out 512
    /// MiB)`.
    pub source: String,
}

/// The usable memory of the opened device `dev`; `None` when not even the runtime said what is
/// free.
pub fn usable_memory(dev: &DeviceSummary, roots: &Roots) -> Option<UsableMemory> {
    let runtime = dev.free_memory.map(|bytes| UsableMemory {
        bytes,
        source: "VRAM free (runtime)".into(),
    });
    if dev.backend != "hip" {
        return runtime;
    }
    let Some(card) = amd_reading(dev, roots) else {
        return runtime;
    };
    apu_memory(&card, runtime)
}

/// On an APU, GTT's free part where it is more than the runtime's figure.
pub fn apu_memory(card: &GpuReading, runtime: Option<UsableMemory>) -> Option<UsableMemory> {
    if !card.apu {
        return runtime;
    }
    let Some(gtt_free) = card
        .gtt_total
        .zip(card.gtt_used)
        .map(|(t, u)| t.saturating_sub(u))
    else {
        return runtime;
    };
    let carve_out = card
        .vram_total
        .map_or_else(String::new, |v| format!("; VRAM carve-out {} MiB", v >> 20));
    match runtime {
        Some(r) if r.bytes >= gtt_free => Some(UsableMemory {
            source: format!(
                "{} on an APU, more than GTT's free part{carve_out}",
                r.source
            ),
            ..r
        }),
        _ => Some(UsableMemory {
            bytes: gtt_free,
            source: format!("GTT free on an APU (unified memory, sysfs mem_info_gtt_*){carve_out}"),
        }),
    }
}

/// The amdgpu card the runtime opened: the one of its architecture (KFD topology), or the only
/// card.
fn amd_reading(dev: &DeviceSummary, roots: &Roots) -> Option<GpuReading> {
    let nodes = kfd::read_nodes(&roots.kfd_nodes());
    let mut notes = Vec::new();
    let cards: Vec<GpuReading> = sysfs::cards(roots)
        .iter()
        .map(|c| sysfs::read_card(roots, c, &nodes, &mut notes))
        .collect();
    let same_arch: Vec<&GpuReading> = cards
        .iter()
        .filter(|g| g.arch.as_deref() == Some(dev.arch.as_str()))
        .collect();
    match (same_arch.as_slice(), cards.as_slice()) {
        ([one], _) => Some((*one).clone()),
        ([], [one]) => Some(one.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn fixture(name: &str) -> Roots {
        Roots::under(
            &Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/data/sysfs")
                .join(name),
        )
    }

    fn hip(arch: &str, free: u64) -> DeviceSummary {
        DeviceSummary {
            backend: "hip".into(),
            arch: arch.into(),
            free_memory: Some(free),
            ..Default::default()
        }
    }

    #[test]
    fn an_apu_plans_with_gtt_not_the_carve_out() {
        // Strix Halo fixture: VRAM carve-out 512 MiB (288 MiB used), GTT 64 GiB (20 GiB used).
        let u = usable_memory(&hip("gfx1151", 224 << 20), &fixture("strix-halo")).expect("usable");
        assert_eq!(u.bytes, (64u64 << 30) - (20u64 << 30));
        assert!(u.source.starts_with("GTT free on an APU"), "{}", u.source);
        assert!(u.source.contains("carve-out 512 MiB"), "{}", u.source);
    }

    #[test]
    fn an_apu_whose_runtime_reports_more_keeps_the_runtime_figure() {
        let u = usable_memory(&hip("gfx1151", 100 << 30), &fixture("strix-halo")).expect("usable");
        assert_eq!(u.bytes, 100 << 30);
        assert!(
            u.source.contains("on an APU, more than GTT"),
            "{}",
            u.source
        );
    }

    #[test]
    fn a_discrete_gpu_plans_with_what_its_runtime_reports_free() {
        let u = usable_memory(&hip("gfx1100", 23 << 30), &fixture("rx7900xtx")).expect("usable");
        assert_eq!(u.bytes, 23 << 30);
        assert_eq!(u.source, "VRAM free (runtime)");
        // CUDA never reads amdgpu's files, even where some exist.
        let mut cuda = hip("sm_90", 70 << 30);
        cuda.backend = "cuda".into();
        let u = usable_memory(&cuda, &fixture("strix-halo")).expect("usable");
        assert_eq!(u.bytes, 70 << 30);
    }
}
