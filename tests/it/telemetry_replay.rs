//! The fixture trees under tests/data/sysfs (an RX 7900 XTX and a Strix Halo APU, written by
//! make_fixtures.py from the kernel's file layouts and struct definitions) replayed through the
//! real sampler, into the GPU panel, `hipscope top` and the doctor's report; and the parsers on
//! odd input.

use std::path::{Path, PathBuf};

use hipscope::gpu::doctor::{self, facts, report::Status, rules};
use hipscope::gpu::snapshot::DeviceSummary;
use hipscope::gpu::telemetry::gpu_metrics::{self, MetricsError};
use hipscope::gpu::telemetry::{PowerScope, Roots, Sampler, TelemetrySample};
use hipscope::ui::gpu::GpuPanel;
use hipscope::ui::theme::{Theme, ThemeName};
use hipscope::ui::top::TopView;
use ratatui::Terminal;
use ratatui::backend::TestBackend;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/sysfs")
        .join(name)
}

fn sample(name: &str) -> TelemetrySample {
    Sampler::new(&Roots::under(&fixture(name))).sample()
}

#[test]
fn rx7900xtx_replays_through_the_sampler() {
    let s = sample("rx7900xtx");
    assert_eq!(
        s.gpus.len(),
        1,
        "card1-DP-1 and renderD128 are not cards: {s:#?}"
    );
    let g = &s.gpus[0];
    assert_eq!(g.id, "card1");
    assert_eq!(g.vendor, "amd");
    assert!(g.name.contains("7900 XTX"), "{}", g.name);
    assert_eq!(g.arch.as_deref(), Some("gfx1100"));
    assert_eq!(g.pci.as_deref(), Some("0000:03:00.0"));
    assert!(!g.apu);
    // sysfs and hwmon first; gpu_metrics (60 °C, 266 W, 88 %) only fills gaps.
    assert_eq!(g.gpu_util_pct, Some(87.0));
    assert_eq!(g.mem_util_pct, Some(41.0));
    assert_eq!(g.temp_edge_c, Some(61.0));
    assert_eq!(g.temp_junction_c, Some(78.0));
    assert_eq!(g.temp_mem_c, Some(70.0));
    assert_eq!(g.power_w, Some(268.0));
    assert_eq!(g.power_scope, PowerScope::Gpu);
    assert_eq!(g.power_cap_w, Some(327.0));
    assert_eq!((g.sclk_mhz, g.mclk_mhz), (Some(2482), Some(1249)));
    assert_eq!(g.fan_rpm, Some(1450));
    assert_eq!(g.pcie_width, Some(16));
    assert_eq!(g.pcie_speed.as_deref(), Some("16.0 GT/s PCIe"));
    assert_eq!(g.vram_total, Some(25_753_026_560));
    assert_eq!(g.gtt_used, Some(20_611_072));
    assert_eq!(g.gpu_metrics.as_deref(), Some("1.3"));
    assert_eq!(g.headline_memory().map(|m| m.0), Some("VRAM"));
    // Each reading says where it came from.
    assert_eq!(g.from.get("gpu_util_pct"), Some(&"sysfs"));
    assert_eq!(g.from.get("temp_junction_c"), Some(&"hwmon"));
    assert_eq!(g.from.get("power_w"), Some(&"hwmon"));
    assert_eq!(
        g.source_names(),
        ["sysfs", "hwmon"],
        "gpu_metrics filled no gap"
    );
    // Two fds of one DRM client count once; pid 1 has no DRM fd.
    assert_eq!(s.processes.len(), 1, "{:#?}", s.processes);
    let p = &s.processes[0];
    assert_eq!(
        (p.pid, p.name.as_str(), p.gpu.as_str()),
        (4242, "llama-server", "card1")
    );
    assert_eq!(p.vram, Some(1 << 30));
    assert_eq!(p.gtt, Some(2 << 20));
    assert!(!p.ours);
    assert_eq!(s.host.mem_total, Some(65_536_000 * 1024));
    assert!(s.notes.is_empty(), "{:?}", s.notes);
}

#[test]
fn strix_halo_is_an_apu_with_gtt_headline_and_package_power() {
    let s = sample("strix-halo");
    let g = &s.gpus[0];
    assert_eq!(g.arch.as_deref(), Some("gfx1151"));
    assert!(g.apu, "KFD node with CPU cores and SIMDs");
    assert_eq!(
        g.headline_memory(),
        Some(("GTT", 21_474_836_480, 68_719_476_736))
    );
    assert_eq!(g.power_w, Some(85.0));
    assert_eq!(g.power_scope, PowerScope::Package);
    assert_eq!(
        g.gpu_power_w,
        Some(62.0),
        "the GPU's share from gpu_metrics v3.0"
    );
    assert_eq!(g.gpu_metrics.as_deref(), Some("3.0"));
    assert_eq!(g.temp_edge_c, Some(58.0), "hwmon's edge sensor");
    assert_eq!(
        g.mem_util_pct, None,
        "no mem_busy_percent on this APU: left out"
    );
    assert_eq!(g.fan_rpm, None);
    assert_eq!(g.from.get("gpu_power_w"), Some(&"gpu_metrics"));
    assert_eq!(g.from.get("power_w"), Some(&"hwmon"));
}

#[test]
fn gpu_metrics_blobs_decode_by_revision() {
    let rx = std::fs::read(fixture("rx7900xtx/sys/class/drm/card1/device/gpu_metrics")).unwrap();
    let m = gpu_metrics::decode(&rx).expect("v1.3");
    assert_eq!(m.revision, (1, 3));
    assert_eq!(m.temp_edge_c, Some(60.0));
    assert_eq!(m.temp_hotspot_c, Some(77.0));
    assert_eq!(m.gfx_activity_pct, Some(88.0));
    assert_eq!(m.socket_power_w, Some(266.0));
    assert_eq!((m.gfxclk_mhz, m.uclk_mhz), (Some(2480), Some(1249)));
    assert_eq!(m.fan_rpm, Some(1440));
    assert_eq!(m.temp_gfx_c, None, "a v1 table has no APU gfx temperature");

    let sh = std::fs::read(fixture("strix-halo/sys/class/drm/card0/device/gpu_metrics")).unwrap();
    let m = gpu_metrics::decode(&sh).expect("v3.0");
    assert_eq!(m.revision, (3, 0));
    assert_eq!(m.temp_gfx_c, Some(58.1), "centi-degrees");
    assert_eq!(m.gfx_activity_pct, Some(92.0));
    assert_eq!(m.socket_power_w, Some(85.0), "milliwatts");
    assert_eq!(m.gfx_power_w, Some(62.0));
    assert_eq!(m.gfxclk_mhz, Some(2890));
    assert_eq!(m.fan_rpm, None);
}

#[test]
fn odd_gpu_metrics_are_refused_with_a_reason() {
    let rx = std::fs::read(fixture("rx7900xtx/sys/class/drm/card1/device/gpu_metrics")).unwrap();
    assert_eq!(
        gpu_metrics::decode(&rx[..2]),
        Err(MetricsError::NoHeader(2))
    );
    assert_eq!(gpu_metrics::decode(&[]), Err(MetricsError::NoHeader(0)));
    assert!(matches!(
        gpu_metrics::decode(&rx[..100]),
        Err(MetricsError::Truncated {
            got: 100,
            want: 120,
            ..
        })
    ));
    let mut unknown = rx.clone();
    unknown[2] = 9;
    assert_eq!(
        gpu_metrics::decode(&unknown),
        Err(MetricsError::UnknownRevision(9, 3))
    );
    let garbage: Vec<u8> = (0..300u32).map(|i| (i * 37 % 251) as u8).collect();
    assert!(
        gpu_metrics::decode(&garbage).is_err(),
        "revision 0x99.0x22 is no table"
    );
}

/// A copy of a fixture to spoil.
fn scratch(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let status = std::process::Command::new("cp")
        .arg("-r")
        .arg(format!("{}/.", fixture(name).display()))
        .arg(dir.path())
        .status()
        .expect("cp");
    assert!(status.success());
    dir
}

#[test]
fn broken_and_missing_files_leave_readings_out_with_a_note() {
    let d = scratch("rx7900xtx");
    let dev = d.path().join("sys/class/drm/card1/device");
    std::fs::write(dev.join("gpu_busy_percent"), "garbage\n").unwrap();
    std::fs::remove_file(dev.join("mem_busy_percent")).unwrap();
    std::fs::write(dev.join("gpu_metrics"), [0x78, 0x00, 0x01]).unwrap();
    std::fs::remove_dir_all(dev.join("hwmon")).unwrap();
    let s = Sampler::new(&Roots::under(d.path())).sample();
    let g = &s.gpus[0];
    // Garbage sysfs, truncated table, no hwmon: nothing to fall back on.
    assert_eq!(g.gpu_util_pct, None);
    assert_eq!(g.mem_util_pct, None, "missing is not 0");
    assert_eq!(g.temp_edge_c, None);
    assert_eq!(g.power_w, None);
    assert_eq!(g.vram_total, Some(25_753_026_560), "the rest still read");
    let notes = s.notes.join("\n");
    assert!(notes.contains("gpu_busy_percent: not a number"), "{notes}");
    assert!(
        notes.contains("gpu_metrics: shorter than its 4-byte header"),
        "{notes}"
    );
    assert!(
        !notes.contains("mem_busy_percent"),
        "a missing file is normal: {notes}"
    );
}

#[test]
fn a_runtime_suspended_gpu_is_not_read() {
    let d = scratch("rx7900xtx");
    let dev = d.path().join("sys/class/drm/card1/device");
    std::fs::write(dev.join("power/runtime_status"), "suspended\n").unwrap();
    let g = &Sampler::new(&Roots::under(d.path())).sample().gpus[0];
    assert!(g.suspended);
    assert_eq!(
        g.arch.as_deref(),
        Some("gfx1100"),
        "KFD topology does not wake it"
    );
    assert_eq!(
        (g.gpu_util_pct, g.temp_edge_c, g.vram_used),
        (None, None, None)
    );
}

fn draw(w: u16, h: u16, f: impl FnOnce(&mut ratatui::Frame)) -> TestBackend {
    let mut t = Terminal::new(TestBackend::new(w, h)).expect("terminal");
    t.draw(f).expect("draw");
    t.backend().clone()
}

fn panel_for(name: &str, device: DeviceSummary) -> GpuPanel {
    let mut p = GpuPanel::default();
    p.set_device(device);
    // The same tree three times: a history of three equal samples.
    for _ in 0..3 {
        p.apply(sample(name));
    }
    p
}

fn hip(name: &str, arch: &str) -> DeviceSummary {
    DeviceSummary {
        backend: "hip".into(),
        name: name.into(),
        arch: arch.into(),
        reason: "auto: libamdhip64.so.6, device 0".into(),
        ..Default::default()
    }
}

#[test]
fn gpu_panel_from_replayed_fixtures() {
    let theme = Theme::new(ThemeName::Mono);
    let rx = panel_for("rx7900xtx", hip("AMD Radeon RX 7900 XTX", "gfx1100"));
    insta::assert_snapshot!(
        "gpu_panel_rx7900xtx",
        draw(44, 24, |f| rx.render(f, f.area(), &theme))
    );
    let sh = panel_for("strix-halo", hip("AMD Radeon 8060S", "gfx1151"));
    insta::assert_snapshot!(
        "gpu_panel_strix_halo",
        draw(44, 24, |f| sh.render(f, f.area(), &theme))
    );
}

#[test]
fn a_tall_gpu_panel_draws_every_history_the_source_has() {
    let theme = Theme::new(ThemeName::Mono);
    let rx = panel_for("rx7900xtx", hip("AMD Radeon RX 7900 XTX", "gfx1100"));
    let screen = format!("{:?}", draw(44, 60, |f| rx.render(f, f.area(), &theme)));
    for label in [
        "util · 0–100%",
        "power · 0–268 W",
        "temp · 0–78 °C",
        "memory · 0–100%",
        "sclk · 0–2482 MHz",
        "fan · 0–1450 rpm",
    ] {
        assert!(screen.contains(label), "{label} missing:\n{screen}");
    }
}

#[test]
fn top_from_replayed_fixtures() {
    let theme = Theme::new(ThemeName::Mono);
    for name in ["rx7900xtx", "strix-halo"] {
        let mut v = TopView::default();
        for _ in 0..3 {
            v.apply(sample(name));
        }
        insta::assert_snapshot!(
            format!("top_{name}"),
            draw(100, 24, |f| v.render(f, f.area(), &theme))
        );
    }
}

fn fixture_facts(name: &str) -> facts::Facts {
    facts::gather(&Roots::under(&fixture(name)), false)
}

#[test]
fn doctor_report_from_replayed_fixtures() {
    for name in ["rx7900xtx", "strix-halo"] {
        let f = fixture_facts(name);
        let mut r = doctor::report::Report::default();
        for c in doctor::environment(&f)
            .into_iter()
            .chain(doctor::devices(&f))
            .chain(doctor::driver(&f))
        {
            r.push(c);
        }
        insta::assert_snapshot!(format!("doctor_{name}"), r.text());
    }
}

fn fired(f: &facts::Facts) -> Vec<&'static str> {
    rules::RULES
        .iter()
        .filter(|r| (r.applies)(f).is_some())
        .map(|r| r.id)
        .collect()
}

#[test]
fn every_known_issue_rule_has_a_fixture_that_triggers_it_and_one_that_does_not() {
    let rx = fixture_facts("rx7900xtx");
    let sh = fixture_facts("strix-halo");
    assert_eq!(fired(&rx), Vec::<&str>::new());
    assert_eq!(fired(&sh), vec!["mes-0x83", "cwsr-gfx1151", "apu-gtt"]);
    // CWSR is fixed from kernel 6.18; cwsr_enable=0 also clears it.
    let mut new_kernel = sh.clone();
    new_kernel.kernel = Some("6.18.1".into());
    assert!(!fired(&new_kernel).contains(&"cwsr-gfx1151"));
    let mut off = sh.clone();
    off.module_params.retain(|(k, _)| k != "cwsr_enable");
    off.module_params.push(("cwsr_enable".into(), "0".into()));
    assert!(!fired(&off).contains(&"cwsr-gfx1151"));
    let mut mes80 = sh.clone();
    for (k, v) in &mut mes80.firmware {
        if k.ends_with("mes_fw_version") {
            *v = "0x00000080".into();
        }
    }
    assert!(!fired(&mes80).contains(&"mes-0x83"));
    let mut over = rx.clone();
    over.env
        .push(("HSA_OVERRIDE_GFX_VERSION".into(), "11.0.0".into()));
    assert_eq!(fired(&over), vec!["hsa-override"]);
    let mut win = rx.clone();
    win.os_family = "windows".into();
    assert_eq!(fired(&win), vec!["windows-exit-hang"]);
    // Every rule is covered above.
    for r in rules::RULES {
        assert!(
            [&sh, &over, &win].iter().any(|f| (r.applies)(f).is_some()),
            "rule {} has no triggering fixture",
            r.id
        );
    }
    let statuses: Vec<Status> = rules::evaluate(&sh).iter().map(|c| c.status).collect();
    assert_eq!(statuses, vec![Status::Fail, Status::Warn, Status::Pass]);
}
