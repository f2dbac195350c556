//! The hwmon directory of an amdgpu device (`device/hwmon/hwmonN/`): temperatures by label
//! (`edge`, `junction`, `mem`; millidegrees), power (`power1_average`, else `power1_input`, and
//! `power1_cap`; microwatts), the fan (`fan1_input` RPM, `pwm1` 0–255). On an APU the power is
//! the whole package's (CPU included), so it is labelled so.

use std::path::{Path, PathBuf};

use super::{GpuReading, PowerScope, ReadError, read_num, read_text};

/// The first `hwmon*` directory of a device.
pub fn dir(device: &Path) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(device.join("hwmon"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("hwmon"))
        })
        .collect();
    dirs.sort();
    dirs.into_iter().next()
}

fn micro(path: &Path, notes: &mut Vec<String>) -> Option<f32> {
    match read_text(path) {
        Ok(t) => match t.parse::<u64>() {
            Ok(v) => Some(v as f32 / 1e6),
            Err(_) => {
                notes.push(format!("{}: not a number: {t:.40}", path.display()));
                None
            }
        },
        Err(ReadError::Denied) => {
            notes.push(format!("{}: permission denied", path.display()));
            None
        }
        Err(_) => None,
    }
}

/// Adds what the device's hwmon reports to `g`.
pub fn read_into(device: &Path, g: &mut GpuReading, notes: &mut Vec<String>) {
    let Some(h) = dir(device) else { return };
    for i in 1..=8 {
        let Ok(label) = read_text(&h.join(format!("temp{i}_label"))) else {
            continue;
        };
        let c = read_num::<i64>(&h.join(format!("temp{i}_input"))).map(|m| m as f32 / 1000.0);
        match label.as_str() {
            "edge" => g.temp_edge_c = c,
            "junction" => g.temp_junction_c = c,
            "mem" => g.temp_mem_c = c,
            _ => {}
        }
    }
    // Older kernels and some APUs have temp1_input with no label: that is the edge sensor.
    if g.temp_edge_c.is_none() && !h.join("temp1_label").exists() {
        g.temp_edge_c = read_num::<i64>(&h.join("temp1_input")).map(|m| m as f32 / 1000.0);
    }
    g.power_w =
        micro(&h.join("power1_average"), notes).or_else(|| micro(&h.join("power1_input"), notes));
    g.power_cap_w = micro(&h.join("power1_cap"), notes);
    if g.apu {
        g.power_scope = PowerScope::Package;
    }
    g.fan_rpm = read_num(&h.join("fan1_input"));
    g.fan_pct = read_num::<u32>(&h.join("pwm1")).map(|p| p.min(255) as f32 * 100.0 / 255.0);
}
