//! `gpu_metrics` tables as real cards filled them, replayed through the real sampler.
//!
//! No raw `gpu_metrics` file captured from a real card was found in a public repository
//! (searched 2026-11-25: amdgpu_top and libdrm-amdgpu-sys-rs ship none; in issue threads the
//! nearest is ROCm/rocm-systems#5036, where a maintainer asked an RX 7700 XT owner for a
//! `hexdump -C` of the file, and the reply could not be read in full here). What is published is amdgpu_top's decode of real tables, every field
//! by name: `docs/dump.json` (an RX 9060 XT, gfx1200, table v1.3) and `docs/sample.json` (a
//! Raphael APU, gfx1036, table v2.1), Umio-Yasuno/amdgpu_top at f81e5bd (MIT). The tables below
//! are re-encoded from those decodes field by field: the values and the fields left unfilled
//! (0xFFFF) are the firmware's; the bytes are ours. They are not captures, and say so.

use std::mem::{offset_of, size_of};
use std::path::Path;

use hipscope::gpu::telemetry::gpu_metrics;
use hipscope::gpu::telemetry::{PowerScope, Roots, Sampler};
use libdrm_amdgpu_sys::AMDGPU::{gpu_metrics_v1_3, gpu_metrics_v2_1};

/// A table of `size` bytes, every field unfilled (0xFF), with its header.
fn table(size: usize, rev: (u8, u8)) -> Vec<u8> {
    let mut b = vec![0xFFu8; size];
    b[..2].copy_from_slice(&(size as u16).to_le_bytes());
    b[2] = rev.0;
    b[3] = rev.1;
    b
}

fn put16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

/// amdgpu_top docs/dump.json, device 0: "AMD Radeon RX 9060 XT", GFX1200, gpu_metrics header
/// {structure_size 120, format 1, content 3}.
fn rx9060xt_v1_3() -> Vec<u8> {
    type T = gpu_metrics_v1_3;
    let mut b = table(size_of::<T>(), (1, 3));
    for (off, v) in [
        (offset_of!(T, temperature_edge), 50),
        (offset_of!(T, temperature_hotspot), 73),
        (offset_of!(T, temperature_mem), 74),
        (offset_of!(T, temperature_vrgfx), 49),
        (offset_of!(T, temperature_vrsoc), 45),
        (offset_of!(T, temperature_vrmem), 48),
        (offset_of!(T, average_socket_power), 178),
        (offset_of!(T, average_gfxclk_frequency), 3018),
        (offset_of!(T, average_uclk_frequency), 2517),
        (offset_of!(T, average_vclk0_frequency), 25),
        (offset_of!(T, average_dclk0_frequency), 25),
        (offset_of!(T, average_vclk1_frequency), 0),
        (offset_of!(T, average_dclk1_frequency), 0),
        (offset_of!(T, current_gfxclk), 3018),
        (offset_of!(T, current_socclk), 1371),
        (offset_of!(T, current_uclk), 1258),
        (offset_of!(T, current_vclk0), 25),
        (offset_of!(T, current_dclk0), 25),
        (offset_of!(T, current_vclk1), 25),
        (offset_of!(T, current_dclk1), 25),
        (offset_of!(T, pcie_link_width), 16),
        (offset_of!(T, pcie_link_speed), 25),
        (offset_of!(T, voltage_soc), 797),
        (offset_of!(T, voltage_gfx), 894),
        (offset_of!(T, voltage_mem), 1351),
    ] {
        put16(&mut b, off, v);
    }
    b
}

/// amdgpu_top docs/sample.json, device 0: "AMD Radeon Graphics", GFX1036 (Raphael), APU,
/// gpu_metrics header {structure_size 120, format 2, content 1}.
fn raphael_v2_1() -> Vec<u8> {
    type T = gpu_metrics_v2_1;
    let mut b = table(size_of::<T>(), (2, 1));
    for (off, v) in [
        (offset_of!(T, temperature_gfx), 4300),
        (offset_of!(T, temperature_soc), 4750),
        (offset_of!(T, average_socket_power), 27),
        (offset_of!(T, average_soc_power), 12846),
        (offset_of!(T, average_gfx_power), 4803),
        (offset_of!(T, average_gfxclk_frequency), 600),
        (offset_of!(T, average_socclk_frequency), 1200),
        (offset_of!(T, average_uclk_frequency), 3000),
        (offset_of!(T, average_fclk_frequency), 3000),
        (offset_of!(T, average_vclk_frequency), 400),
        (offset_of!(T, average_dclk_frequency), 300),
    ] {
        put16(&mut b, off, v);
    }
    b
}

#[test]
fn the_published_tables_have_the_sizes_their_headers_say() {
    // Both decodes report structure_size 120: the binding's structs agree with the firmware's.
    assert_eq!(size_of::<gpu_metrics_v1_3>(), 120);
    assert_eq!(size_of::<gpu_metrics_v2_1>(), 120);
}

#[test]
fn a_real_rdna4_v1_3_table_decodes_to_its_published_values() {
    let m = gpu_metrics::decode(&rx9060xt_v1_3()).expect("v1.3");
    assert_eq!(m.revision, (1, 3));
    assert_eq!(
        (m.temp_edge_c, m.temp_hotspot_c, m.temp_mem_c),
        (Some(50.0), Some(73.0), Some(74.0))
    );
    assert_eq!(m.socket_power_w, Some(178.0), "W in a v1 table");
    assert_eq!((m.gfxclk_mhz, m.uclk_mhz), (Some(3018), Some(1258)));
    // The firmware left these unfilled: none, not 65535.
    assert_eq!((m.gfx_activity_pct, m.umc_activity_pct), (None, None));
    assert_eq!(m.fan_rpm, None);
}

#[test]
fn a_real_apu_table_that_reports_socket_power_in_watts_is_read_as_watts() {
    let m = gpu_metrics::decode(&raphael_v2_1()).expect("v2.1");
    assert_eq!(m.revision, (2, 1));
    assert_eq!(m.temp_gfx_c, Some(43.0), "centi-degrees");
    assert_eq!(m.gfx_power_w, Some(4.803), "mW");
    assert_eq!(
        m.socket_power_w,
        Some(27.0),
        "27 is watts here: 27 mW would be no running APU"
    );
    assert_eq!(m.gfxclk_mhz, Some(600), "the average when no current clock");
    assert_eq!(
        gpu_metrics::apu_socket_watts(85_000),
        85.0,
        "mW as documented"
    );
}

/// A one-card sysfs tree holding only what identifies an amdgpu card and its table.
fn tree(dir: &Path, device_id: &str, blob: &[u8]) {
    let dev = dir.join("sys/class/drm/card0/device");
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::write(dev.join("vendor"), "0x1002\n").unwrap();
    std::fs::write(dev.join("device"), format!("{device_id}\n")).unwrap();
    std::fs::write(dev.join("gpu_metrics"), blob).unwrap();
    std::fs::create_dir_all(dir.join("proc")).unwrap();
}

#[test]
fn the_published_tables_replay_through_the_sampler() {
    let d = tempfile::tempdir().unwrap();
    tree(d.path(), "0x7590", &rx9060xt_v1_3());
    let s = Sampler::new(&Roots::under(d.path())).sample();
    let g = &s.gpus[0];
    assert_eq!(g.gpu_metrics.as_deref(), Some("1.3"));
    assert_eq!(g.temp_edge_c, Some(50.0));
    assert_eq!(g.temp_junction_c, Some(73.0));
    assert_eq!(g.power_w, Some(178.0));
    assert_eq!(g.power_scope, PowerScope::Gpu);
    assert_eq!(g.gpu_util_pct, None, "unfilled in the table, no sysfs file");
    assert_eq!(g.from.get("power_w"), Some(&"gpu_metrics"));
    assert!(s.notes.is_empty(), "{:?}", s.notes);

    let d = tempfile::tempdir().unwrap();
    tree(d.path(), "0x164e", &raphael_v2_1());
    let g = &Sampler::new(&Roots::under(d.path())).sample().gpus[0];
    assert_eq!(g.gpu_metrics.as_deref(), Some("2.1"));
    assert_eq!(g.temp_edge_c, Some(43.0), "the GPU's own temperature");
    assert_eq!(g.power_w, Some(27.0));
    assert_eq!(g.sclk_mhz, Some(600));
    assert_eq!(g.source_names(), ["gpu_metrics 2.1"]);
}
