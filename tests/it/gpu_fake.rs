//! The device mechanisms over the scripted fake device, whose ops complete late or never: arena,
//! staging, upload verification, the in-flight table, the watchdog, the GEMM fallback's argument
//! passing, and the device half of the quit protocol.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;
use std::time::Duration;

use hipscope::gpu::arena::{ArenaPlan, Region};
use hipscope::gpu::checksum::VerifyError;
use hipscope::gpu::device::{GemmF32, GpuError, Op, reference_sgemm};
use hipscope::gpu::fake::{FakeControl, FakeDevice, FakeScript};
use hipscope::gpu::handle::{Arg, GemmPath, Gpu, GpuConfig, wait_until};
use hipscope::gpu::kernels::{CompileMode, KernelCache};
use hipscope::gpu::snapshot::{DeviceRelease, QuitStepStatus, WatchState};
use hipscope::gpu::stream::Budget;
use hipscope::gpu::watchdog::{WatchConfig, WatchEvent, Watchdog, evaluate};

fn fake_gpu(script: FakeScript, cfg: GpuConfig) -> (Gpu, FakeControl) {
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

fn with_arena(script: FakeScript, cfg: GpuConfig) -> (Gpu, FakeControl) {
    let (mut gpu, ctl) = fake_gpu(script, cfg);
    gpu.create_arena(
        &ArenaPlan::new()
            .with(Region::Weights, 4 << 20)
            .with(Region::Activations, 1 << 20),
    )
    .expect("arena");
    (gpu, ctl)
}

fn small_cfg() -> GpuConfig {
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
fn queue_depth_and_the_oldest_op_follow_breadcrumbs_and_events() {
    let (mut gpu, ctl) = with_arena(FakeScript::default(), small_cfg());
    let f = gpu.function("hs_busy").expect("busy");
    let out = gpu.alloc(Region::Activations, 1024).expect("alloc");
    ctl.set_auto(false);
    let labels: Vec<_> = (0..10)
        .map(|i| gpu.label(&format!("layer {i} · busy")))
        .collect();
    let base = gpu.stream_snapshot().enqueued;
    for l in &labels {
        gpu.launch(
            *l,
            f,
            [1, 1, 1],
            [64, 1, 1],
            0,
            &[out.into(), Arg::U32(256), Arg::U32(1)],
        )
        .expect("launch");
    }
    let s = gpu.stream_snapshot();
    assert_eq!(s.enqueued, base + 10);
    assert_eq!(s.queue_depth, 10);
    assert_eq!(
        s.in_flight.as_ref().map(|x| x.0.as_str()),
        Some("layer 0 · busy")
    );
    // Three finish; the fourth is now running and its breadcrumb proves the first three done.
    ctl.release(3);
    let s = gpu.stream_snapshot();
    assert_eq!(s.queue_depth, 7);
    assert_eq!(s.last_completed.as_deref(), Some("layer 2 · busy"));
    assert_eq!(
        s.in_flight.as_ref().map(|x| x.0.as_str()),
        Some("layer 3 · busy")
    );
    // The last op's completion needs an event (no later kernel writes a breadcrumb).
    gpu.mark_phase().expect("event");
    ctl.release(100);
    gpu.poll().expect("poll");
    let s = gpu.stream_snapshot();
    assert_eq!(s.queue_depth, 0);
    assert_eq!(s.last_completed.as_deref(), Some("layer 9 · busy"));
}

#[test]
fn the_watchdog_names_a_kernel_that_never_finishes_and_writes_a_report() {
    let (mut gpu, _ctl) = with_arena(FakeScript::default(), small_cfg());
    gpu.start_event_prober(Duration::from_millis(1));
    let dir = std::env::temp_dir().join(format!("hipscope-wd-{}", std::process::id()));
    let (tx, rx) = channel();
    let tx = std::sync::Mutex::new(tx);
    let dog = Watchdog::spawn(
        gpu.stream_shared(),
        gpu.info(),
        WatchConfig {
            tick: Duration::from_millis(5),
            report_dir: Some(dir.clone()),
            ..WatchConfig::default()
        },
        Box::new(move |ev| {
            if let Ok(t) = tx.lock() {
                let _ = t.send(ev);
            }
        }),
    )
    .expect("watchdog");
    let budget = Budget {
        slow: Duration::from_millis(20),
        hung: Duration::from_millis(60),
    };
    let flag = gpu
        .launch_spin_on_flag("layer 7 · attn · spin", Some(budget), 1 << 40)
        .expect("launch")
        .flag;
    let mut states = Vec::new();
    let hung = loop {
        match rx
            .recv_timeout(Duration::from_secs(10))
            .expect("watchdog event")
        {
            WatchEvent::Snapshot(s) => states.push(s.state),
            WatchEvent::Hung {
                snapshot,
                report_error,
            } => break (snapshot, report_error),
        }
    };
    let (snap, report_error) = hung;
    assert_eq!(report_error, None);
    assert_eq!(snap.state, WatchState::Hung);
    assert_eq!(snap.op.as_deref(), Some("layer 7 · attn · spin"));
    assert!(snap.op_started, "the breadcrumb shows the kernel started");
    assert!(snap.age >= Duration::from_millis(60));
    assert_eq!(snap.queue_depth, 1);
    assert!(states.contains(&WatchState::Slow), "{states:?}");
    let report =
        std::fs::read_to_string(snap.report.as_ref().expect("report path")).expect("report");
    assert!(report.contains("layer 7 · attn · spin"), "{report}");
    assert!(report.contains("[last completed]") && report.contains("[in flight, oldest first]"));
    assert!(report.contains("name: fake GPU"));
    // Released, the op finishes and the watchdog returns to OK.
    gpu.set_host_word(flag, 1).expect("release");
    gpu.wait_idle(Duration::from_secs(5)).expect("idle");
    let ok = wait_until(Duration::from_secs(5), || {
        rx.try_iter().any(
            |e| matches!(e, WatchEvent::Snapshot(s) if s.state == WatchState::Ok && s.op.is_none()),
        )
    });
    assert!(ok);
    dog.stop();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_watchdog_works_from_breadcrumbs_when_event_queries_stop_returning() {
    let (mut gpu, ctl) = with_arena(FakeScript::default(), small_cfg());
    let budget = Budget {
        slow: Duration::from_millis(1),
        hung: Duration::from_millis(2),
    };
    let flag = gpu
        .launch_spin_on_flag("layer 1 · ffn_up · spin", Some(budget), 1 << 40)
        .expect("launch")
        .flag;
    gpu.mark_phase().expect("event");
    // The runtime wedges: event queries block inside it.
    ctl.block_event_queries(true);
    gpu.start_event_prober(Duration::from_millis(1));
    assert!(wait_until(Duration::from_secs(5), || ctl
        .queries_in_flight()
        > 0));
    let shared = gpu.stream_shared();
    let now = shared.now_ns() + 5_000_000_000;
    let (snap, _) = evaluate(&shared, now, Duration::from_millis(100));
    assert!(snap.event_queries_stuck);
    assert_eq!(snap.state, WatchState::Hung);
    assert_eq!(snap.op.as_deref(), Some("layer 1 · ffn_up · spin"));
    assert!(snap.op_started);
    // The runtime recovers and the kernel is released: the stream drains and quits cleanly. (A
    // worker stuck inside a blocked query during the quit is the quit timer's case, tested in
    // a child process in tests/it/gpu_quit.rs.)
    ctl.block_event_queries(false);
    gpu.set_host_word(flag, 1).expect("release");
    let out = gpu.teardown(Duration::from_secs(5), &mut |_| {});
    assert!(out.clean, "{out:?}");
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

/// A step recorded, captured into a graph and replayed as one op: the kernel that hangs inside
/// the replay is named from its breadcrumb (the step block's base plus its node index) by the
/// Streams snapshot and the watchdog's evaluation; released, the replay completes.
#[test]
fn a_kernel_stuck_inside_a_replayed_graph_is_named_by_its_breadcrumb() {
    let (mut gpu, ctl) = with_arena(
        FakeScript {
            graphs: true,
            ..FakeScript::default()
        },
        small_cfg(),
    );
    assert!(gpu.graph_mode().is_on(), "{}", gpu.graph_mode().describe());
    let out = gpu.alloc(Region::Activations, 64).expect("buffer");
    let fill = gpu.function("hs_fill_u32").expect("fill");
    let fill_label = gpu.label("layer 0 · fill");
    // Two identical steps: the first is captured, the second replays it.
    for step in 0..2u32 {
        assert!(gpu.graph_begin_step(0).expect("begin"));
        gpu.launch(
            fill_label,
            fill,
            [1, 1, 1],
            [256, 1, 1],
            0,
            &[out.into(), Arg::U64(16), Arg::U32(7)],
        )
        .expect("recorded");
        gpu.launch(
            fill_label,
            fill,
            [1, 1, 1],
            [256, 1, 1],
            0,
            &[out.into(), Arg::U64(16), Arg::U32(9)],
        )
        .expect("recorded");
        assert_eq!(
            launched(&ctl, "hs_fill_u32"),
            0,
            "step {step}: recorded, not launched"
        );
        gpu.graph_end_step().expect("end");
        gpu.wait_idle(Duration::from_secs(5)).expect("idle");
        assert_eq!(ctl.read(out.ptr, 4).expect("read"), 9u32.to_le_bytes());
    }
    let stats = gpu.graph_stats();
    assert_eq!((stats.captures, stats.replays, stats.flushed), (1, 1, 0));
    assert_eq!(
        ctl.log()
            .iter()
            .filter(|l| l.starts_with("launch graph"))
            .count(),
        2
    );
    // A step that differs is captured afresh; this one holds a kernel that never finishes.
    assert!(gpu.graph_begin_step(0).expect("begin"));
    gpu.launch(
        fill_label,
        fill,
        [1, 1, 1],
        [256, 1, 1],
        0,
        &[out.into(), Arg::U64(16), Arg::U32(7)],
    )
    .expect("recorded");
    let budget = Budget {
        slow: Duration::from_millis(20),
        hung: Duration::from_millis(60),
    };
    let flag = gpu
        .launch_spin_on_flag("layer 3 · stuck", Some(budget), 1 << 40)
        .expect("recorded")
        .flag;
    gpu.graph_end_step().expect("end");
    let shared = gpu.stream_shared();
    let snap = gpu.stream_snapshot();
    let (label, _) = snap.in_flight.expect("the graph is in flight");
    assert_eq!(label, "decode step · graph › kernel 2/2 · layer 3 · stuck");
    // The graph op carries the budget its stuck kernel asked for.
    let (w, _) = evaluate(
        &shared,
        shared.now_ns() + 100_000_000,
        Duration::from_secs(1),
    );
    assert_eq!(w.state, WatchState::Hung);
    assert!(w.op_started);
    assert_eq!(
        w.op.as_deref(),
        Some("decode step · graph › kernel 2/2 · layer 3 · stuck")
    );
    gpu.set_host_word(flag, 1).expect("release");
    gpu.wait_idle(Duration::from_secs(5)).expect("idle");
    assert_eq!(gpu.graph_stats().captures, 2);
    let outcome = gpu.teardown(Duration::from_secs(1), &mut |_| {});
    assert!(outcome.clean, "{:?}", outcome.reason);
    assert_eq!(ctl.live_graphs(), 0, "teardown destroys the graphs");
}

/// A device that cannot capture runs the step launch by launch, saying why graphs are off; an
/// op that cannot join a step (an upload) enqueues what the step recorded first, in order.
#[test]
fn without_graphs_or_across_an_upload_the_step_runs_launch_by_launch() {
    let (mut gpu, ctl) = with_arena(FakeScript::default(), small_cfg());
    assert_eq!(
        gpu.graph_mode().describe(),
        "off (the fake device was scripted without graphs)"
    );
    assert!(!gpu.graph_begin_step(0).expect("begin"));
    let out = gpu.alloc(Region::Activations, 64).expect("buffer");
    let fill = gpu.function("hs_fill_u32").expect("fill");
    let l = gpu.label("fill");
    gpu.launch(
        l,
        fill,
        [1, 1, 1],
        [256, 1, 1],
        0,
        &[out.into(), Arg::U64(16), Arg::U32(3)],
    )
    .expect("launch");
    assert_eq!(launched(&ctl, "hs_fill_u32"), 1);

    let (mut gpu, ctl) = with_arena(
        FakeScript {
            graphs: true,
            ..FakeScript::default()
        },
        small_cfg(),
    );
    let out = gpu.alloc(Region::Activations, 64).expect("buffer");
    let fill = gpu.function("hs_fill_u32").expect("fill");
    let l = gpu.label("fill");
    assert!(gpu.graph_begin_step(0).expect("begin"));
    gpu.launch(
        l,
        fill,
        [1, 1, 1],
        [256, 1, 1],
        0,
        &[out.into(), Arg::U64(16), Arg::U32(3)],
    )
    .expect("recorded");
    assert_eq!(launched(&ctl, "hs_fill_u32"), 0);
    // The upload must land after the recorded fill: the step is flushed first.
    gpu.upload(l, out, &5u32.to_le_bytes()).expect("upload");
    assert!(!gpu.graph_step_active());
    assert_eq!(launched(&ctl, "hs_fill_u32"), 1);
    gpu.wait_idle(Duration::from_secs(5)).expect("idle");
    assert_eq!(
        ctl.read(out.ptr, 8).expect("read"),
        [5, 0, 0, 0, 3, 0, 0, 0]
    );
    assert_eq!(gpu.graph_stats().flushed, 1);
}

fn launched(c: &FakeControl, kernel: &str) -> usize {
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
