use super::*;

#[test]
fn every_kernel_file_in_the_tree_is_embedded() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let on_disk = KernelSources::from_dir(&dir).expect("kernels/ readable");
    assert_eq!(
        on_disk,
        KernelSources::embedded(),
        "add new kernels/*.hip files to EMBEDDED, *.h files to HEADERS"
    );
    for (src, headers) in INCLUDES {
        assert!(on_disk.get(src).is_some(), "INCLUDES names {src}.hip");
        for h in *headers {
            assert!(HEADERS.iter().any(|x| x.0 == *h), "{src}.hip includes {h}");
        }
    }
}

#[test]
fn a_unit_is_the_prelude_headers_definitions_and_source_in_order() {
    let s = KernelSources::embedded();
    let u = s
        .unit("infer_matvec", Some("q4_0"), "#define HS_MARK 1")
        .expect("unit");
    assert_eq!(u.name, "infer_matvec.q4_0");
    assert_eq!(u.source(), "infer_matvec");
    let at = |needle: &str| u.text.find(needle).unwrap_or_else(|| panic!("{needle}"));
    assert!(u.text.starts_with(PRELUDE));
    assert!(at("#line 1 \"vecdot.h\"") < at("#define HS_MARK 1"));
    assert!(at("#define HS_MARK 1") < at("#line 1 \"infer_matvec.hip\""));
    let plain = s.unit("busy", None, "").expect("busy");
    assert_eq!(plain.name, "busy");
    assert_eq!(plain.kernels(), ["hs_busy"]);
    assert!(s.unit("nothing", None, "").is_err());
}

#[test]
fn every_kernel_takes_the_tracking_parameters_and_writes_a_breadcrumb() {
    let all = KernelSources::embedded();
    for s in all.files.iter().chain(&all.headers) {
        let kernels = s.text.matches("HS_KERNEL void").count();
        if s.name.ends_with(".h") {
            assert_eq!(kernels, 0, "{}: headers hold no kernels", s.name);
            assert!(!s.text.contains("#include"), "{}: no includes", s.name);
            continue;
        }
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
        // First: the guard it declares stamps the kernel's start and, at every return, its end
        // (kernels/prelude.h), so no block may leave before it.
        for (at, _) in s.text.match_indices("(HS_TRACK_PARAMS") {
            let body = &s.text[at..];
            let open = body.find('{').expect("a body");
            let first =
                body[open + 1..].trim_start_matches(|c: char| c.is_whitespace() || c == '\\');
            assert!(
                first.starts_with("HS_BREADCRUMB();"),
                "{}: the kernel at byte {at} does not start with HS_BREADCRUMB()",
                s.name
            );
        }
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
