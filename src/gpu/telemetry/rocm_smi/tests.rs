//! Unit tests of rocm_smi.rs: the merge, the layouts and units, and the real library here.

use super::*;

fn freqs(major: u32, n: u32, cur: u32, hz: &[u64]) -> Frequencies {
    let mut f = Frequencies([0; 272]);
    let (num, c, base) = if major >= 7 { (4, 8, 16) } else { (0, 4, 8) };
    f.0[num..num + 4].copy_from_slice(&n.to_ne_bytes());
    f.0[c..c + 4].copy_from_slice(&cur.to_ne_bytes());
    for (i, h) in hz.iter().enumerate() {
        f.0[base + 8 * i..base + 8 * i + 8].copy_from_slice(&h.to_ne_bytes());
    }
    f
}

#[test]
fn frequencies_are_read_by_the_librarys_layout() {
    let old = freqs(1, 3, 1, &[500_000_000, 1_900_000_000, 2_482_000_000]);
    assert_eq!(old.current_hz(1), Some(1_900_000_000));
    let new = freqs(7, 3, 2, &[500_000_000, 1_900_000_000, 2_482_000_000]);
    assert_eq!(new.current_hz(7), Some(2_482_000_000));
    // Read with the wrong layout, the indices are nonsense: no clock, not a wrong one.
    assert_eq!(new.current_hz(1), None);
    assert_eq!(freqs(7, 0, 0, &[]).current_hz(7), None, "no levels");
    assert_eq!(
        freqs(7, 2, 5, &[1, 2]).current_hz(7),
        None,
        "index past the end"
    );
    assert_eq!(
        freqs(1, 40, 0, &[1]).current_hz(1),
        None,
        "more than 32 levels"
    );
}

#[test]
fn bdf_ids_format_as_sysfs_addresses() {
    let id: u64 = 0x03 << 8; // domain 0, bus 3, device 0, function 0
    assert_eq!(bdf_string(id), "0000:03:00.0");
    let id = (0x0001u64 << 32) | (0xc1 << 8) | (0x1f << 3) | 0x7;
    assert_eq!(bdf_string(id), "0001:c1:1f.7");
    // ROCm 6's partition id (bits 28-31) is not part of the address.
    assert_eq!(bdf_string((3 << 28) | (0x03 << 8)), "0000:03:00.0");
}

#[test]
fn rocm_smi_fills_only_what_sysfs_left_out_and_is_credited() {
    let mut g = GpuReading {
        id: "card1".into(),
        vendor: "amd".into(),
        pci: Some("0000:03:00.0".into()),
        gpu_util_pct: Some(87.0),
        temp_edge_c: Some(61.0),
        ..Default::default()
    };
    g.credit(&[], "sysfs");
    let r = RsmiReading {
        bdf: Some(0x03 << 8),
        busy_pct: Some(12),
        temp_edge_mc: Some(55_000),
        temp_junction_mc: Some(78_500),
        power_uw: Some(268_000_000),
        sclk_hz: Some(2_482_000_000),
        fan_speed: Some(51),
        fan_rpm: Some(-1),
        ..Default::default()
    };
    merge(&mut g, &r);
    assert_eq!(g.gpu_util_pct, Some(87.0), "sysfs's reading kept");
    assert_eq!(g.temp_edge_c, Some(61.0));
    assert_eq!(g.temp_junction_c, Some(78.5), "millidegrees");
    assert_eq!(g.power_w, Some(268.0), "microwatts");
    assert_eq!(g.sclk_mhz, Some(2482), "Hz");
    assert_eq!(g.fan_pct, Some(20.0), "51 of 255");
    assert_eq!(g.fan_rpm, None, "a negative rpm is no reading");
    assert_eq!(g.from.get("gpu_util_pct"), Some(&"sysfs"));
    assert_eq!(g.from.get("temp_junction_c"), Some(&"rocm-smi"));
    assert_eq!(
        g.sources(),
        vec![
            ("sysfs", vec!["util", "temp"]),
            ("rocm-smi", vec!["hotspot", "power", "sclk", "fan"])
        ]
    );
}

#[test]
fn devices_match_cards_by_pci_address_and_unmatched_ones_are_added() {
    let mut s = TelemetrySample {
        gpus: vec![
            GpuReading {
                id: "card0".into(),
                vendor: "amd".into(),
                pci: Some("0000:c1:00.0".into()),
                ..Default::default()
            },
            GpuReading {
                id: "nvidia0".into(),
                vendor: "nvidia".into(),
                pci: Some("0000:03:00.0".into()),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let readings = [
        RsmiReading {
            index: 0,
            bdf: Some(0x03 << 8),
            name: Some("Navi 31".into()),
            vram_total: Some(24 << 30),
            ..Default::default()
        },
        RsmiReading {
            index: 1,
            bdf: Some(0xc1 << 8),
            gtt_total: Some(64 << 30),
            power_uw: Some(0),
            ..Default::default()
        },
    ];
    merge_all(&mut s, &readings);
    assert_eq!(s.gpus.len(), 3, "{:#?}", s.gpus);
    assert_eq!(s.gpus[0].gtt_total, Some(64 << 30), "matched by address");
    assert_eq!(s.gpus[0].power_w, None, "0 µW is no reading");
    assert_eq!(
        s.gpus[1].vram_total, None,
        "an NVIDIA card is never merged into"
    );
    let added = &s.gpus[2];
    assert_eq!(
        (added.id.as_str(), added.name.as_str()),
        ("rsmi0", "Navi 31")
    );
    assert_eq!(added.pci.as_deref(), Some("0000:03:00.0"));
    assert_eq!(added.from.get("vram_total"), Some(&"rocm-smi"));
}

#[test]
fn a_suspended_card_is_not_read_through_rocm_smi() {
    let s = TelemetrySample {
        gpus: vec![GpuReading {
            vendor: "amd".into(),
            pci: Some("0000:03:00.0".into()),
            suspended: true,
            ..Default::default()
        }],
        ..Default::default()
    };
    assert!(!may_read(&s, Some(0x03 << 8)));
    assert!(may_read(&s, Some(0x04 << 8)), "another card");
    assert!(may_read(&s, None), "no address: nothing to match");
}

#[test]
fn stderr_is_captured_and_restored() {
    let (v, said) = stderr_captured(|| {
        // SAFETY: writes a few bytes to fd 2.
        unsafe { libc::write(2, b"rsmi says hi\n".as_ptr().cast(), 13) };
        7
    });
    assert_eq!((v, said.as_str()), (7, "rsmi says hi\n"));
    // fd 2 is the original again: a write there is not captured by a later call's file.
    let (_, later) = stderr_captured(|| ());
    assert_eq!(later, "");
}

/// With the library this machine has (Debian's 5.2.3 here, no GPU): init fails cleanly with
/// its status and message, or reports its devices; either way nothing crashes, and a sampler
/// holding whatever came of it goes on sampling.
#[test]
fn the_real_library_initialises_or_fails_cleanly() {
    let Ok(mut smi) = RocmSmi::load() else {
        panic!(
            "librocm_smi64 is not installed here (scripts/setup.sh installs librocm-smi-dev): {}",
            LIBRARY_NAMES.join(", ")
        );
    };
    assert!(smi.version.is_some(), "rsmi_version_get answered");
    match smi.initialise() {
        Ok(n) => {
            let readings: Vec<_> = (0..n).map(|i| smi.read_device(i)).collect();
            assert_eq!(readings.len(), n as usize);
        }
        Err(RsmiError::Init { code, name, said }) => {
            assert_ne!(code, SUCCESS);
            assert!(name.starts_with("RSMI_STATUS_"), "{name}");
            // No GPU (Debian's 5.2.3 says so on stderr): nothing of it reached ours.
            let _ = said;
        }
        Err(e) => panic!("unexpected: {e}"),
    }
    let mut sources: Vec<Box<dyn Source>> = vec![Box::new(super::super::host::HostSource::new(
        &super::super::Roots::default(),
    ))];
    if let Ok(src) = RocmSmiSource::open() {
        sources.push(Box::new(src));
    }
    let mut sampler = super::super::Sampler::with_sources(sources);
    for _ in 0..2 {
        let s = sampler.sample();
        assert!(s.host.mem_total.is_some(), "the host is still sampled");
    }
}
