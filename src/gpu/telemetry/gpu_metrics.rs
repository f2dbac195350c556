//! The SMU's binary metrics table, `device/gpu_metrics`, decoded by its header (format and
//! content revision: 1.0–1.5 for discrete GPUs, 2.0–2.4 for APUs, 3.0 for Strix APUs) with
//! `libdrm_amdgpu_sys` (amdgpu_top's library). Its `GpuMetrics::from_raw` works on bytes, no DRM
//! fd needed; what it does not do is check the blob's length (it zero-fills a short one, which
//! would read as 0 °C and 0 W), so that is checked here before decoding.
//!
//! Units, from the kernel's `drivers/gpu/drm/amd/include/kgd_pp_interface.h` (Linux 6.2–6.12):
//! v1.x temperatures in °C, power in W, activity in %; v2.x and v3.0 (APUs) temperatures in
//! centi-°C and power in mW. 0xFFFF (0xFFFFFFFF for 32-bit fields) marks a field the firmware
//! does not fill. One exception seen on real parts: some APU firmware fills
//! `average_socket_power` in W, not mW (Renoir's family, amdgpu_top's note citing
//! drm/amd#2321; a Raphael APU's published v2.1 decode in amdgpu_top's docs/sample.json reads 27
//! beside a GFX power of 4803 mW). A package drawing under 1 W is not a running APU, so a value
//! below 1000 is taken as W ([`apu_socket_watts`]).

use std::path::Path;

use libdrm_amdgpu_sys::AMDGPU::{
    GpuMetrics, MetricsInfo, gpu_metrics_v1_0, gpu_metrics_v1_1, gpu_metrics_v1_2,
    gpu_metrics_v1_3, gpu_metrics_v1_4, gpu_metrics_v1_5, gpu_metrics_v2_0, gpu_metrics_v2_1,
    gpu_metrics_v2_2, gpu_metrics_v2_3, gpu_metrics_v2_4, gpu_metrics_v3_0,
};

use super::{GpuReading, ReadError};

/// What was wrong with a blob.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetricsError {
    #[error("shorter than its 4-byte header ({0} bytes)")]
    NoHeader(usize),
    #[error("unknown revision {0}.{1}")]
    UnknownRevision(u8, u8),
    #[error("truncated: {got} bytes of the {want} that revision {rev} has")]
    Truncated {
        rev: String,
        got: usize,
        want: usize,
    },
}

/// The readings `gpu_metrics` gives, in the app's units.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics {
    pub revision: (u8, u8),
    pub gfx_activity_pct: Option<f32>,
    pub umc_activity_pct: Option<f32>,
    pub temp_edge_c: Option<f32>,
    pub temp_hotspot_c: Option<f32>,
    pub temp_mem_c: Option<f32>,
    /// The GPU's own temperature on an APU.
    pub temp_gfx_c: Option<f32>,
    pub socket_power_w: Option<f32>,
    pub gfx_power_w: Option<f32>,
    pub gfxclk_mhz: Option<u32>,
    pub uclk_mhz: Option<u32>,
    pub fan_rpm: Option<u32>,
}

fn size_for(rev: (u8, u8)) -> Option<usize> {
    use std::mem::size_of;
    Some(match rev {
        (1, 0) => size_of::<gpu_metrics_v1_0>(),
        (1, 1) => size_of::<gpu_metrics_v1_1>(),
        (1, 2) => size_of::<gpu_metrics_v1_2>(),
        (1, 3) => size_of::<gpu_metrics_v1_3>(),
        (1, 4) => size_of::<gpu_metrics_v1_4>(),
        (1, 5) => size_of::<gpu_metrics_v1_5>(),
        (2, 0) => size_of::<gpu_metrics_v2_0>(),
        (2, 1) => size_of::<gpu_metrics_v2_1>(),
        (2, 2) => size_of::<gpu_metrics_v2_2>(),
        (2, 3) => size_of::<gpu_metrics_v2_3>(),
        (2, 4) => size_of::<gpu_metrics_v2_4>(),
        (3, 0) => size_of::<gpu_metrics_v3_0>(),
        _ => return None,
    })
}

fn v16(v: Option<u16>) -> Option<u32> {
    v.filter(|&x| x != u16::MAX).map(u32::from)
}

fn v32(v: Option<u32>) -> Option<u32> {
    v.filter(|&x| x != u32::MAX && x != u32::from(u16::MAX))
}

/// Decodes a blob.
pub fn decode(raw: &[u8]) -> Result<Metrics, MetricsError> {
    if raw.len() < 4 {
        return Err(MetricsError::NoHeader(raw.len()));
    }
    let rev = (raw[2], raw[3]);
    let want = size_for(rev).ok_or(MetricsError::UnknownRevision(rev.0, rev.1))?;
    if raw.len() < want {
        return Err(MetricsError::Truncated {
            rev: format!("{}.{}", rev.0, rev.1),
            got: raw.len(),
            want,
        });
    }
    let m = GpuMetrics::from_raw(raw);
    let apu = rev.0 >= 2;
    // APU tables count temperatures in centi-degrees and power in milliwatts.
    let temp = |v: Option<u16>| v16(v).map(|t| if apu { t as f32 / 100.0 } else { t as f32 });
    let watts = |v: Option<u32>| v.map(|p| if apu { p as f32 / 1000.0 } else { p as f32 });
    let socket_watts = |v: Option<u32>| {
        if apu {
            v.map(apu_socket_watts)
        } else {
            watts(v)
        }
    };
    let gfx_power = if rev == (3, 0) {
        v32(m.get_average_gfx_power_u32())
    } else {
        v16(m.get_average_gfx_power())
    };
    Ok(Metrics {
        revision: rev,
        gfx_activity_pct: v16(m.get_average_gfx_activity()).map(|a| a as f32),
        umc_activity_pct: v16(m.get_average_umc_activity()).map(|a| a as f32),
        temp_edge_c: temp(m.get_temperature_edge()),
        temp_hotspot_c: temp(m.get_temperature_hotspot()),
        temp_mem_c: temp(m.get_temperature_mem()),
        temp_gfx_c: temp(m.get_temperature_gfx()),
        socket_power_w: socket_watts(v32(m.get_average_socket_power())),
        gfx_power_w: watts(gfx_power),
        gfxclk_mhz: v16(m.get_current_gfxclk()).or_else(|| v16(m.get_average_gfxclk_frequency())),
        uclk_mhz: v16(m.get_current_uclk()).or_else(|| v16(m.get_average_uclk_frequency())),
        fan_rpm: v16(m.get_current_fan_speed()),
    })
}

/// An APU table's `average_socket_power` in W: mW as the header documents it, except where the
/// firmware wrote W (a value below 1000; see the module's note).
pub fn apu_socket_watts(raw: u32) -> f32 {
    if raw < 1000 {
        raw as f32
    } else {
        raw as f32 / 1000.0
    }
}

/// Adds what the device's `gpu_metrics` has to `g`, filling only what sysfs and hwmon left
/// empty (their files are the kernel's own smoothing; the table is the firmware's).
pub fn read_into(device: &Path, g: &mut GpuReading, notes: &mut Vec<String>) {
    let path = device.join("gpu_metrics");
    let raw = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            notes.push(format!(
                "{}: {}",
                path.display(),
                ReadError::Denied.describe()
            ));
            return;
        }
        Err(_) => return,
    };
    let m = match decode(&raw) {
        Ok(m) => m,
        Err(e) => {
            notes.push(format!("{}: {e}", path.display()));
            return;
        }
    };
    g.gpu_metrics = Some(format!("{}.{}", m.revision.0, m.revision.1));
    g.gpu_util_pct = g.gpu_util_pct.or(m.gfx_activity_pct);
    g.mem_util_pct = g.mem_util_pct.or(m.umc_activity_pct);
    g.temp_edge_c = g.temp_edge_c.or(m.temp_edge_c).or(m.temp_gfx_c);
    g.temp_junction_c = g.temp_junction_c.or(m.temp_hotspot_c);
    g.temp_mem_c = g.temp_mem_c.or(m.temp_mem_c);
    g.sclk_mhz = g.sclk_mhz.or(m.gfxclk_mhz);
    g.mclk_mhz = g.mclk_mhz.or(m.uclk_mhz);
    g.fan_rpm = g.fan_rpm.or(m.fan_rpm);
    if g.apu {
        // hwmon's figure is the package's; the table splits out the GPU's share.
        g.gpu_power_w = m.gfx_power_w;
        g.power_w = g.power_w.or(m.socket_power_w);
    } else {
        g.power_w = g.power_w.or(m.socket_power_w);
    }
}

impl ReadError {
    pub fn describe(&self) -> String {
        match self {
            ReadError::Missing => "missing".into(),
            ReadError::Denied => "permission denied".into(),
            ReadError::Other(e) => e.clone(),
        }
    }
}
