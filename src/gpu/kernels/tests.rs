use super::*;

#[test]
fn every_kernel_file_in_the_tree_is_embedded() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let on_disk = sources_from_dir(&dir).expect("kernels/ readable");
    let names: Vec<&str> = on_disk.iter().map(|s| s.name.as_str()).collect();
    let embedded: Vec<&str> = EMBEDDED.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, embedded, "add new kernels/*.hip files to EMBEDDED");
    for s in &on_disk {
        let e = EMBEDDED.iter().find(|(n, _)| *n == s.name).map(|(_, t)| *t);
        assert_eq!(e, Some(&*s.text));
    }
}

#[test]
fn every_kernel_takes_the_tracking_parameters_and_writes_a_breadcrumb() {
    for s in embedded_sources() {
        let kernels = s.text.matches("HS_KERNEL void").count();
        assert!(kernels > 0, "{} defines no kernel", s.name);
        assert_eq!(
            s.text.matches("(HS_TRACK_PARAMS").count(),
            kernels,
            "{}: every kernel's first parameters are HS_TRACK_PARAMS",
            s.name
        );
        assert_eq!(
            s.text.matches("HS_BREADCRUMB();").count(),
            kernels,
            "{}: every kernel writes its breadcrumb",
            s.name
        );
        assert!(!s.text.contains("#include"), "{}: no includes", s.name);
    }
}

#[test]
fn kernel_names_are_read_from_the_sources() {
    let shift = embedded_sources()
        .into_iter()
        .find(|s| s.name == "infer_kv_shift")
        .expect("infer_kv_shift");
    assert_eq!(
        kernel_names(&shift.text),
        ["hs_kv_shift_f32", "hs_kv_shift_f16"]
    );
    assert_eq!(
        kernel_names("HS_KERNEL void  spaced_out (int x)"),
        ["spaced_out"]
    );
    assert!(kernel_names("// no kernels").is_empty());
}

#[test]
fn cache_keys_change_with_every_input() {
    let o = vec!["-O3".to_string()];
    let k = KernelCache::key("hiprtc 5.2", "gfx1030", &o, "src");
    assert_eq!(k.len(), 32);
    assert_ne!(k, KernelCache::key("hiprtc 5.7", "gfx1030", &o, "src"));
    assert_ne!(k, KernelCache::key("hiprtc 5.2", "gfx90a", &o, "src"));
    assert_ne!(k, KernelCache::key("hiprtc 5.2", "gfx1030", &[], "src"));
    assert_ne!(k, KernelCache::key("hiprtc 5.2", "gfx1030", &o, "src2"));
    // Length-prefixed parts: moving a character between parts changes the key.
    assert_ne!(
        KernelCache::key("ab", "c", &o, "s"),
        KernelCache::key("a", "bc", &o, "s")
    );
}

#[test]
fn cache_round_trips_and_misses_on_other_keys() {
    let dir = std::env::temp_dir().join(format!("hipscope-cache-test-{}", std::process::id()));
    let c = KernelCache::at(dir.clone());
    assert_eq!(c.load(RuntimeKind::Hip, "gfx1030", "busy", "k1"), None);
    c.store(RuntimeKind::Hip, "gfx1030", "busy", "k1", b"object")
        .expect("store");
    assert_eq!(
        c.load(RuntimeKind::Hip, "gfx1030", "busy", "k1").as_deref(),
        Some(&b"object"[..])
    );
    assert_eq!(c.load(RuntimeKind::Hip, "gfx1030", "busy", "k2"), None);
    assert_eq!(c.load(RuntimeKind::Cuda, "gfx1030", "busy", "k1"), None);
    let _ = std::fs::remove_dir_all(dir);
    assert_eq!(
        KernelCache::disabled().load(RuntimeKind::Hip, "a", "b", "c"),
        None
    );
}

#[test]
fn child_report_lines_parse() {
    let dir = std::env::temp_dir().join(format!("hipscope-child-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("busy.co"), b"code").expect("write");
    let ok = parse_child_line(
        r#"{"kernel":"busy","ok":true,"bytes":4,"millis":1.5}"#,
        "gfx1030",
        &dir,
    )
    .expect("ok line");
    assert_eq!(ok.image.as_deref(), Some(&b"code"[..]));
    assert_eq!(ok.status, BuildStatus::Compiled { millis: 1.5 });
    let bad = parse_child_line(
        r#"{"kernel":"gemm","ok":false,"log":"error: x"}"#,
        "gfx1030",
        &dir,
    )
    .expect("failed line");
    assert_eq!(bad.status, BuildStatus::Failed("error: x".into()));
    assert_eq!(parse_child_line("garbage", "gfx1030", &dir), None);
    let _ = std::fs::remove_dir_all(dir);
}
