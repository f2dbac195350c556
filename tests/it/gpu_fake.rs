//! The device mechanisms over the scripted fake device, whose ops complete late or never: arena,
//! staging, upload verification, the GEMM fallback's argument passing, the read probe, and the
//! device half of the quit protocol (the in-flight table, the watchdog and graphs:
//! `gpu_fake_watch.rs`, with this file's helpers).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hipscope::gpu::arena::{ArenaPlan, Region};
use hipscope::gpu::checksum::VerifyError;
use hipscope::gpu::device::{GemmF32, GpuError, Op, reference_sgemm};
use hipscope::gpu::fake::{FakeControl, FakeDevice, FakeScript};
use hipscope::gpu::handle::{Arg, GemmPath, Gpu, GpuConfig};
use hipscope::gpu::kernels::{CompileMode, KernelCache};
use hipscope::gpu::snapshot::{DeviceRelease, QuitStepStatus};

pub(crate) fn fake_gpu(script: FakeScript, cfg: GpuConfig) -> (Gpu, FakeControl) {
    let be = FakeDevice::new(script);
    let ctl = be.control();
    let mut gpu = Gpu::open(Box::new(be), cfg).expect("open fake");
    gpu.prepare_kernels(
        &KernelCache::disabled(),
        &CompileMode::InProcess,
        &hipscope::gpu::compute::scope_units(hipscope::gpu::compute::KernelScope::All)
            .expect("units"),
        &mut |_| {},
    )
    .expect("kernels");
    (gpu, ctl)
}

pub(crate) fn with_arena(script: FakeScript, cfg: GpuConfig) -> (Gpu, FakeControl) {
    let (mut gpu, ctl) = fake_gpu(script, cfg);
    gpu.create_arena(
        &ArenaPlan::new()
            .with(Region::Weights, 4 << 20)
            .with(Region::Activations, 1 << 20),
    )
    .expect("arena");
    (gpu, ctl)
}

pub(crate) fn small_cfg() -> GpuConfig {
    GpuConfig {
        staging_buffers: 2,
        staging_bytes: 4096,
        runtime_reserve: 0,
        wait_timeout: Duration::from_secs(10),
        ..GpuConfig::default()
    }
}

fn pattern(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

#[test]
fn uploads_are_verified_and_a_zeroed_upload_is_named() {
    let (mut gpu, ctl) = with_arena(FakeScript::default(), small_cfg());
    let data = pattern(10_000, 1);
    let buf = gpu
        .alloc(Region::Weights, data.len() as u64)
        .expect("alloc");
    gpu.upload_tensor("token_embd.weight", buf, &data)
        .expect("verified upload");
    assert_eq!(ctl.read(buf.ptr, data.len()).expect("read"), data);
    // The gfx1151 failure: the copy arrives as zeros.
    ctl.corrupt_uploads(true);
    let buf2 = gpu
        .alloc(Region::Weights, data.len() as u64)
        .expect("alloc");
    match gpu.upload_tensor("blk.3.ffn_down.weight", buf2, &data) {
        Err(GpuError::Verify(VerifyError::ZeroedOnDevice { tensor, bytes })) => {
            assert_eq!(tensor, "blk.3.ffn_down.weight");
            assert_eq!(bytes, 10_000);
        }
        other => panic!("expected ZeroedOnDevice, got {other:?}"),
    }
    // With verification off the same upload goes through unnoticed: that is what it guards.
    gpu.set_verify_uploads(false);
    gpu.upload_tensor("blk.4.ffn_down.weight", buf2, &data)
        .expect("unverified");
}

/// Manual completion, an op released every millisecond by a thread of its own until `stop`.
struct Releaser {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Releaser {
    fn stop(self) {
        self.stop.store(true, Ordering::Release);
        self.thread.join().expect("join");
    }
}

fn release_one_at_a_time(ctl: &FakeControl) -> Releaser {
    ctl.set_auto(false);
    let stop = Arc::new(AtomicBool::new(false));
    let (c2, s2) = (ctl.clone(), stop.clone());
    let thread = std::thread::spawn(move || {
        while !s2.load(Ordering::Acquire) {
            c2.release(1);
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    Releaser { stop, thread }
}

#[test]
fn staging_buffers_are_not_reused_before_their_copy_ran() {
    // Manual completion: ops run only when released, and a copy reads its pinned source when it
    // runs. Two 4 KiB staging buffers carry a 20 KiB tensor; reusing one too early would send
    // the wrong bytes.
    let (mut gpu, ctl) = with_arena(FakeScript::default(), small_cfg());
    let releaser = release_one_at_a_time(&ctl);
    let data = pattern(20 * 1024 + 3, 7);
    let buf = gpu
        .alloc(Region::Weights, data.len() as u64)
        .expect("alloc");
    let l = gpu.label("upload · big");
    gpu.upload(l, buf, &data).expect("upload");
    gpu.wait_idle(Duration::from_secs(10)).expect("idle");
    releaser.stop();
    assert_eq!(ctl.read(buf.ptr, data.len()).expect("read"), data);
}

#[test]
fn a_large_upload_fills_half_the_staging_buffers_at_a_time_on_several_threads() {
    // Four 1 MiB staging buffers, a 5 MiB tensor: the chunks go up two at a time, each pair
    // copied into pinned memory on several threads while the other pair is still crossing (the
    // copies run only when released, reading their pinned source then).
    let cfg = GpuConfig {
        staging_buffers: 4,
        staging_bytes: 1 << 20,
        ..small_cfg()
    };
    let (mut gpu, ctl) = fake_gpu(FakeScript::default(), cfg);
    gpu.create_arena(&ArenaPlan::new().with(Region::Weights, 8 << 20))
        .expect("arena");
    let releaser = release_one_at_a_time(&ctl);
    let data = pattern((5 << 20) + 3, 11);
    let buf = gpu
        .alloc(Region::Weights, data.len() as u64)
        .expect("alloc");
    let l = gpu.label("upload · large");
    gpu.upload(l, buf, &data).expect("upload");
    gpu.wait_idle(Duration::from_secs(10)).expect("idle");
    // And back down through the same buffers.
    let mut back = vec![0u8; data.len()];
    gpu.download(l, buf, &mut back).expect("download");
    releaser.stop();
    assert!(ctl.read(buf.ptr, data.len()).expect("read") == data);
    assert!(back == data);
}

#[test]
fn registered_host_memory_goes_up_in_place_and_is_unregistered_at_teardown() {
    // A 3 MiB "file" registered for in-place uploads: a slice of it crosses as copies straight
    // from where it lies (the fake refuses a copy from memory that is neither pinned nor
    // registered, and runs each copy only when released, reading its source then); a slice of other memory is left to the staged path; a runtime that
    // cannot register says no; teardown unregisters.
    let (mut gpu, ctl) = fake_gpu(FakeScript::default(), small_cfg());
    gpu.create_arena(&ArenaPlan::new().with(Region::Weights, 4 << 20))
        .expect("arena");
    let file: Arc<Vec<u8>> = Arc::new(pattern(3 << 20, 5));
    let keep: hipscope::gpu::backend::SharedBytes = file.clone();
    assert!(
        gpu.register_host(keep.clone(), 4096 + 17..(3 << 20) - 9)
            .expect("register")
    );
    assert!(ctl.log().iter().any(|l| l.starts_with("host_register")));
    let releaser = release_one_at_a_time(&ctl);
    let part = &file[8192..(2 << 20) + 5];
    let buf = gpu
        .alloc(Region::Weights, part.len() as u64)
        .expect("alloc");
    let l = gpu.label("stream · part");
    let seq = gpu.upload_in_place(l, buf, part).expect("in place");
    assert!(seq.is_some());
    gpu.wait_idle(Duration::from_secs(10)).expect("idle");
    releaser.stop();
    assert!(ctl.read(buf.ptr, part.len()).expect("read") == part);
    // Other memory: not in place.
    let other = pattern(4096, 9);
    assert_eq!(gpu.upload_in_place(l, buf, &other).expect("checked"), None);
    // The first page lies outside the registered range's pages: not in place either.
    assert_eq!(
        gpu.upload_in_place(l, buf, &file[..100]).expect("checked"),
        None
    );
    // A runtime that cannot register.
    ctl.fail_next("host_register", 1);
    let second: hipscope::gpu::backend::SharedBytes = Arc::new(pattern(8192, 3));
    assert!(
        !gpu.register_host(second, 0..8192)
            .expect("no, not an error")
    );
    gpu.teardown(Duration::from_secs(2), &mut |_| {});
    assert_eq!(
        ctl.log().iter().filter(|l| *l == "host_unregister").count(),
        1,
        "{:?}",
        ctl.log()
    );
}

#[test]
fn an_oversized_plan_is_refused_before_anything_is_allocated() {
    let (mut gpu, ctl) = fake_gpu(
        FakeScript {
            total_memory: 64 << 20,
            ..FakeScript::default()
        },
        small_cfg(),
    );
    let before = gpu.device_allocations();
    let e = gpu
        .create_arena(
            &ArenaPlan::new()
                .with(Region::Weights, 60 << 20)
                .with(Region::KvCache, 8 << 20),
        )
        .expect_err("too big");
    let msg = e.to_string();
    assert!(matches!(e, GpuError::InsufficientMemory { .. }), "{msg}");
    assert!(
        msg.contains("weights 60.0 MiB") && msg.contains("kv_cache 8.0 MiB"),
        "{msg}"
    );
    assert!(msg.contains("64.0 MiB free of 64.0 MiB"), "{msg}");
    assert_eq!(gpu.device_allocations(), before);
    assert!(!ctl.log().iter().any(|l| l.starts_with("malloc")));
}
#[test]
fn a_clean_teardown_runs_every_step_in_order_and_frees_everything() {
    let (mut gpu, ctl) = with_arena(
        FakeScript {
            blas: true,
            graphs: false,
            ..FakeScript::default()
        },
        small_cfg(),
    );
    gpu.start_event_prober(Duration::from_millis(1));
    let f = gpu.function("hs_busy").expect("busy");
    let out = gpu.alloc(Region::Activations, 1024).expect("alloc");
    let l = gpu.label("busy");
    for _ in 0..5 {
        gpu.launch(
            l,
            f,
            [1, 1, 1],
            [64, 1, 1],
            0,
            &[out.into(), Arg::U32(256), Arg::U32(1)],
        )
        .expect("launch");
    }
    assert_eq!(ctl.live_blas_handles(), 1);
    let mut seen = Vec::new();
    let outcome = gpu.teardown(Duration::from_secs(5), &mut |s| seen.push(s));
    assert!(outcome.clean, "{outcome:?}");
    assert_eq!(outcome.release(), DeviceRelease::Clean);
    let names: Vec<&str> = outcome.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "drain stream",
            "destroy BLAS handles",
            "destroy events",
            "unload modules",
            "free arena and pinned memory",
            "destroy stream"
        ]
    );
    assert!(
        outcome
            .steps
            .iter()
            .all(|s| s.status == QuitStepStatus::Done)
    );
    // Each step is reported twice: running, then its result.
    assert_eq!(seen.len(), 12);
    assert_eq!(ctl.live_events(), 0);
    assert_eq!(ctl.live_modules(), 0);
    assert_eq!(ctl.live_pinned(), 0);
    assert_eq!(ctl.device_bytes_allocated(), 0);
    assert_eq!(ctl.live_blas_handles(), 0);
    assert!(!ctl.stream_alive());
    let log = ctl.log();
    let pos = |s: &str| log.iter().position(|l| l == s).unwrap_or(usize::MAX);
    assert!(pos("destroy_blas") < pos("destroy_event"));
    assert!(pos("destroy_event") < pos("unload_module"));
    assert!(pos("unload_module") < pos("free"));
    assert!(pos("free") < pos("destroy_stream"));
}

#[test]
fn a_stuck_kernel_makes_the_drain_time_out_and_no_further_gpu_call_is_made() {
    let (mut gpu, ctl) = with_arena(FakeScript::default(), small_cfg());
    gpu.launch_spin_on_flag("spin forever", None, 1 << 40)
        .expect("launch");
    let calls_before = ctl.log().len();
    let outcome = gpu.teardown(Duration::from_millis(100), &mut |_| {});
    assert!(!outcome.clean);
    assert_eq!(outcome.release(), DeviceRelease::Abandoned);
    match &outcome.steps[0].status {
        QuitStepStatus::Failed(why) => {
            assert!(
                why.contains("timed out") && why.contains("spin forever"),
                "{why}"
            )
        }
        other => panic!("drain should fail, got {other:?}"),
    }
    assert!(outcome.steps.len() == 6);
    assert!(
        outcome.steps[1..]
            .iter()
            .all(|s| matches!(s.status, QuitStepStatus::Skipped(_)))
    );
    assert_eq!(
        ctl.log().len(),
        calls_before,
        "no GPU call after the drain timed out"
    );
    assert!(ctl.stream_alive());
}

#[test]
fn a_runtime_error_poisons_the_device() {
    let (mut gpu, ctl) = with_arena(FakeScript::default(), small_cfg());
    let f = gpu.function("hs_busy").expect("busy");
    let out = gpu.alloc(Region::Activations, 1024).expect("alloc");
    let l = gpu.label("busy");
    ctl.fail_next("launch", 700);
    let e = gpu
        .launch(
            l,
            f,
            [1, 1, 1],
            [64, 1, 1],
            0,
            &[out.into(), Arg::U32(256), Arg::U32(1)],
        )
        .expect_err("injected");
    assert!(matches!(e, GpuError::Runtime(_)));
    assert!(gpu.is_poisoned().is_some());
    let e = gpu
        .launch(
            l,
            f,
            [1, 1, 1],
            [64, 1, 1],
            0,
            &[out.into(), Arg::U32(256), Arg::U32(1)],
        )
        .expect_err("poisoned");
    assert!(matches!(e, GpuError::Poisoned { .. }), "{e}");
    let outcome = gpu.teardown(Duration::from_secs(1), &mut |_| {});
    assert!(!outcome.clean);
    assert!(
        outcome
            .steps
            .iter()
            .all(|s| matches!(s.status, QuitStepStatus::Skipped(_)))
    );
}

#[test]
fn the_gemm_fallback_passes_blas_arguments_through_to_the_kernel() {
    for blas in [false, true] {
        let (mut gpu, _ctl) = with_arena(
            FakeScript {
                blas,
                ..FakeScript::default()
            },
            small_cfg(),
        );
        match (blas, gpu.gemm_path()) {
            (false, GemmPath::Fallback { reason }) => {
                assert!(reason.contains("no BLAS"), "{reason}")
            }
            (true, GemmPath::Blas { library }) => assert_eq!(library, "fakeBLAS"),
            (b, p) => panic!("blas={b}: unexpected path {p:?}"),
        }
        let (m, n, k) = (5usize, 3usize, 4usize);
        let (lda, ldb, ldc) = (k + 1, n, m + 2);
        let a: Vec<f32> = (0..lda * m).map(|i| i as f32 * 0.5 - 3.0).collect();
        let b: Vec<f32> = (0..ldb * k).map(|i| 1.0 - i as f32 * 0.25).collect();
        let mut want = vec![0.0f32; ldc * n];
        reference_sgemm(Op::T, Op::T, m, n, k, &a, lda, &b, ldb, 0.0, &mut want, ldc);
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let da = gpu
            .alloc(Region::Activations, (a.len() * 4) as u64)
            .expect("a");
        let db = gpu
            .alloc(Region::Activations, (b.len() * 4) as u64)
            .expect("b");
        let dc = gpu
            .alloc(Region::Activations, (want.len() * 4) as u64)
            .expect("c");
        let l = gpu.label("gemm");
        gpu.upload(l, da, &bytes(&a)).expect("up");
        gpu.upload(l, db, &bytes(&b)).expect("up");
        let g = GemmF32 {
            transa: Op::T,
            transb: Op::T,
            m: m as i32,
            n: n as i32,
            k: k as i32,
            alpha: gpu.scalar(1.0).expect("1"),
            a: da.ptr,
            lda: lda as i32,
            b: db.ptr,
            ldb: ldb as i32,
            beta: gpu.scalar(0.0).expect("0"),
            c: dc.ptr,
            ldc: ldc as i32,
        };
        gpu.gemm_f32(l, &g).expect("gemm");
        let mut out = vec![0u8; want.len() * 4];
        gpu.download(l, dc, &mut out).expect("down");
        let got: Vec<f32> = out
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(got, want, "blas={blas}");
        // BLAS argument rules are enforced before anything is enqueued.
        let bad = GemmF32 { lda: 2, ..g };
        assert!(matches!(
            gpu.gemm_f32(l, &bad),
            Err(GpuError::InvalidArgument(_))
        ));
    }
}

#[test]
fn a_steady_state_loop_makes_no_device_allocation() {
    let (mut gpu, _ctl) = with_arena(FakeScript::default(), small_cfg());
    let f = gpu.function("hs_busy").expect("busy");
    let out = gpu.alloc(Region::Activations, 4096).expect("alloc");
    let l = gpu.label("step");
    let before = gpu.device_allocations();
    let free_before = gpu.mem_info().expect("mem").free;
    let mut host = vec![0u8; 4096];
    for _ in 0..100 {
        gpu.launch(
            l,
            f,
            [4, 1, 1],
            [256, 1, 1],
            0,
            &[out.into(), Arg::U32(1024), Arg::U32(1)],
        )
        .expect("launch");
        gpu.download(l, out, &mut host).expect("download");
    }
    assert_eq!(gpu.device_allocations(), before);
    assert_eq!(gpu.mem_info().expect("mem").free, free_before);
    let snap = gpu.arena_snapshot().expect("arena");
    assert_eq!(
        snap.device_allocations, 3,
        "weights, activations, workspace"
    );
    assert_eq!(snap.runtime_overhead, Some(0));
}

#[test]
fn with_tracking_off_no_op_is_recorded_and_no_breadcrumb_is_passed() {
    let (mut gpu, ctl) = with_arena(FakeScript::default(), small_cfg());
    let f = gpu.function("hs_busy").expect("busy");
    let out = gpu.alloc(Region::Activations, 1024).expect("alloc");
    gpu.set_tracking(false);
    let l = gpu.label("untracked");
    ctl.set_auto(false);
    let seq = gpu
        .launch(
            l,
            f,
            [1, 1, 1],
            [64, 1, 1],
            0,
            &[out.into(), Arg::U32(256), Arg::U32(1)],
        )
        .expect("launch");
    let shared = gpu.stream_shared();
    assert_eq!(shared.op(seq), None);
    assert_eq!(
        shared.read_breadcrumb(),
        0,
        "the kernel got a null breadcrumb pointer"
    );
    gpu.set_tracking(true);
    let seq2 = gpu
        .launch(
            l,
            f,
            [1, 1, 1],
            [64, 1, 1],
            0,
            &[out.into(), Arg::U32(256), Arg::U32(1)],
        )
        .expect("launch");
    assert_eq!(
        shared.op(seq2).map(|o| o.label),
        Some("untracked".to_string())
    );
    ctl.set_auto(true);
    gpu.wait_idle(Duration::from_secs(5)).expect("idle");
    assert_eq!(shared.read_breadcrumb(), seq2);
}

#[test]
fn a_failed_open_gives_back_what_it_made() {
    let be = FakeDevice::new(FakeScript::default());
    let ctl = be.control();
    ctl.fail_next("alloc_pinned", 2);
    let e = Gpu::open(Box::new(be), small_cfg())
        .err()
        .expect("open fails");
    assert!(matches!(e, GpuError::Runtime(_)), "{e}");
    assert_eq!(ctl.live_events(), 0, "the event pool was destroyed");
    assert_eq!(ctl.live_pinned(), 0);
    assert!(!ctl.stream_alive());
}

pub(crate) fn launched(c: &FakeControl, kernel: &str) -> usize {
    let want = format!("launch {kernel}");
    c.log().iter().filter(|l| **l == want).count()
}

/// `bench`'s read bandwidth (issue 33 item 8): `hs_read_bw` over a buffer of its own, a quarter
/// of the free memory at most, one warm-up launch and five timed runs of ten; the buffer is freed
/// after. With too little memory free it says so instead of measuring a cache.
#[test]
fn the_read_probe_streams_its_own_buffer_and_frees_it() {
    let (mut gpu, ctl) = with_arena(
        FakeScript {
            total_memory: 1 << 30,
            ..FakeScript::default()
        },
        small_cfg(),
    );
    let free = gpu.mem_info().expect("mem").free;
    let bw = gpu.measure_read_bandwidth().expect("measured");
    assert_eq!(bw.buffer_bytes, (free / 4) & !0xFFFF);
    assert_eq!(bw.runs, hipscope::gpu::handle::READ_PROBE_RUNS);
    assert!(bw.bytes_per_s.is_finite() && bw.bytes_per_s > 0.0, "{bw:?}");
    assert_eq!(launched(&ctl, "hs_read_bw"), 1 + 5 * 10);
    assert_eq!(launched(&ctl, "hs_fill_u32"), 1);
    assert_eq!(
        gpu.mem_info().expect("mem").free,
        free,
        "the buffer is freed"
    );

    let (mut small, _) = with_arena(
        FakeScript {
            total_memory: 200 << 20,
            ..FakeScript::default()
        },
        small_cfg(),
    );
    let e = small.measure_read_bandwidth().unwrap_err();
    assert!(e.to_string().contains("too little"), "{e}");
}

/// Launch overlap is asked for by default (the config's `launch_overlap: true`); on a runtime
/// without it, it is shown off with the reason. Turned off (`HIPSCOPE_PDL=0`), it says so.
#[test]
fn launch_overlap_is_off_with_the_reason_where_the_runtime_has_none() {
    let (gpu, _) = fake_gpu(FakeScript::default(), small_cfg());
    assert_eq!(
        gpu.launch_overlap(),
        "off (the fake runtime has no launch overlap)"
    );
    let off = GpuConfig {
        launch_overlap: false,
        ..small_cfg()
    };
    let (gpu, _) = fake_gpu(FakeScript::default(), off);
    assert_eq!(gpu.launch_overlap(), "off (HIPSCOPE_PDL=0)");
}
