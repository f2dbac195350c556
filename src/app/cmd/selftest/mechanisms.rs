//! The mechanism checks on one opened device: queue depth under a burst, the watchdog on a
//! kernel that waits for the host, the GEMM path against the host reference, and upload
//! verification catching a zeroed tensor.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use crate::app::cmd::usage::outln;
use crate::gpu::arena::Region;
use crate::gpu::checksum::VerifyError;
use crate::gpu::device::{GemmF32, GpuError, Op, reference_sgemm};
use crate::gpu::handle::{Arg, GemmPath, Gpu, KernelFn, SpinOnFlag};
use crate::gpu::snapshot::WatchState;
use crate::gpu::stream::{Budget, LabelId, StreamShared};
use crate::gpu::watchdog::WatchEvent;

/// Samples queue depth from the shared stream view on its own thread (as the UI does).
pub(super) fn sample_depth(
    shared: Arc<StreamShared>,
    stop: Arc<AtomicBool>,
    every: Duration,
) -> std::thread::JoinHandle<Vec<(f64, u64)>> {
    std::thread::spawn(move || {
        let t = Instant::now();
        let mut out = Vec::new();
        while !stop.load(Ordering::Acquire) {
            shared.fold_breadcrumb();
            out.push((t.elapsed().as_secs_f64() * 1e3, shared.queue_depth()));
            std::thread::sleep(every);
        }
        shared.fold_breadcrumb();
        out.push((t.elapsed().as_secs_f64() * 1e3, shared.queue_depth()));
        out
    })
}

pub(super) fn busy_kernel(gpu: &Gpu) -> Result<KernelFn, GpuError> {
    gpu.function("hs_busy")
}

pub(super) fn burst(gpu: &mut Gpu) -> Result<(bool, String), GpuError> {
    let f = busy_kernel(gpu)?;
    let out = gpu.alloc(Region::Activations, 256 * 4)?;
    let l = gpu.label("selftest · busy (calibration)");
    // Calibrate: iterations for about 0.3 ms per kernel on this GPU.
    let probe_iters = 20_000u32;
    gpu.wait_idle(Duration::from_secs(10))?;
    let t = Instant::now();
    for _ in 0..10 {
        gpu.launch(
            l,
            f,
            [1, 1, 1],
            [256, 1, 1],
            0,
            &[out.into(), Arg::U32(256), Arg::U32(probe_iters)],
        )?;
    }
    gpu.wait_idle(Duration::from_secs(30))?;
    let per = t.elapsed().as_secs_f64() / 10.0;
    let iters = ((probe_iters as f64) * 0.3e-3 / per.max(1e-6)).clamp(1_000.0, 5_000_000.0) as u32;
    let n = 256;
    let labels: Vec<LabelId> = (0..n)
        .map(|i| gpu.label(&format!("selftest · burst {i}/{n} · busy")))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_depth(
        gpu.stream_shared(),
        stop.clone(),
        Duration::from_micros(500),
    );
    let t0 = Instant::now();
    for l in &labels {
        gpu.launch(
            *l,
            f,
            [1, 1, 1],
            [256, 1, 1],
            0,
            &[out.into(), Arg::U32(256), Arg::U32(iters)],
        )?;
    }
    let enqueue_ms = t0.elapsed().as_secs_f64() * 1e3;
    gpu.mark_phase()?;
    gpu.wait_idle(Duration::from_secs(60))?;
    let drain_ms = t0.elapsed().as_secs_f64() * 1e3;
    std::thread::sleep(Duration::from_millis(2));
    stop.store(true, Ordering::Release);
    let samples = sampler.join().unwrap_or_default();
    let peak = samples.iter().map(|s| s.1).max().unwrap_or(0);
    let last = samples.last().map(|s| s.1).unwrap_or(u64::MAX);
    // A coarse timeline: the depth at a few instants.
    let marks = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0];
    let timeline: Vec<String> = marks
        .iter()
        .map(|m| {
            let at = m * drain_ms;
            let d = samples
                .iter()
                .find(|s| s.0 >= at)
                .or(samples.last())
                .map(|s| s.1)
                .unwrap_or(0);
            format!("{at:.0}ms:{d}")
        })
        .collect();
    outln!(
        "burst     {n} × hs_busy({iters} iters ≈ {:.2} ms each), enqueued in {enqueue_ms:.1} ms, \
         drained in {drain_ms:.1} ms",
        per * iters as f64 / probe_iters as f64 * 1e3
    );
    outln!("          queue depth: {}", timeline.join("  "));
    let pass = peak >= (n as u64 * 3 / 4) && last == 0;
    Ok((
        pass,
        format!(
            "peak {peak} of {n}, then 0 after {drain_ms:.0} ms ({} samples)",
            samples.len()
        ),
    ))
}

pub(super) fn slow_then_release(
    gpu: &mut Gpu,
    rx: &Receiver<WatchEvent>,
) -> Result<(bool, String), GpuError> {
    let budget = Budget {
        slow: Duration::from_millis(100),
        hung: Duration::from_secs(5),
    };
    let _ = rx.try_iter().count();
    let SpinOnFlag {
        flag,
        result,
        label: l,
    } = gpu.launch_spin_on_flag(
        "selftest · spin on host flag (released)",
        Some(budget),
        50_000_000,
    )?;
    let t = Instant::now();
    let mut slow_at = None;
    while t.elapsed() < Duration::from_secs(2) {
        if let Ok(WatchEvent::Snapshot(s)) = rx.recv_timeout(Duration::from_millis(20))
            && s.state == WatchState::Slow
            && s.op.as_deref() == Some("selftest · spin on host flag (released)")
        {
            slow_at = Some((t.elapsed(), s.op_started));
            break;
        }
    }
    gpu.set_host_word(flag, 1)?;
    let released = Instant::now();
    gpu.wait_idle(Duration::from_secs(10))?;
    let done_ms = released.elapsed().as_secs_f64() * 1e3;
    let mut out = [0u8; 4];
    gpu.download(l, result, &mut out)?;
    let code = u32::from_le_bytes(out);
    let mut ok_after = false;
    let t2 = Instant::now();
    while t2.elapsed() < Duration::from_secs(1) {
        if let Ok(WatchEvent::Snapshot(s)) = rx.recv_timeout(Duration::from_millis(20))
            && s.state == WatchState::Ok
        {
            ok_after = true;
            break;
        }
    }
    match slow_at {
        Some((at, started)) => Ok((
            code == 1 && ok_after && started,
            format!(
                "SLOW at {:.0} ms (budget 100 ms; breadcrumb says started: {started}), released \
                 by the host flag, finished {done_ms:.1} ms later (result {code}), then OK",
                at.as_secs_f64() * 1e3
            ),
        )),
        None => Ok((false, "the watchdog never reported SLOW".into())),
    }
}

/// Deterministic pseudo-random floats in [-1, 1).
pub(super) fn rand_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

pub(super) fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|f| f.to_le_bytes()).collect()
}

pub(super) fn bytes_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub(super) fn gemm(gpu: &mut Gpu) -> Result<(bool, String), GpuError> {
    let mut worst = 0.0f32;
    let mut runs = Vec::new();
    let cases = [
        (Op::N, Op::N, 0.0f32),
        (Op::T, Op::N, 0.0),
        (Op::N, Op::T, 1.0),
    ];
    let (m, n, k) = (67usize, 45usize, 83usize);
    for (ta, tb, beta) in cases {
        let lda = if ta == Op::N { m + 3 } else { k + 5 };
        let ldb = if tb == Op::N { k + 1 } else { n + 2 };
        let ldc = m + 7;
        let a = rand_f32(lda * if ta == Op::N { k } else { m }, 11);
        let b = rand_f32(ldb * if tb == Op::N { n } else { k }, 23);
        let c0 = rand_f32(ldc * n, 37);
        let mut want = c0.clone();
        reference_sgemm(ta, tb, m, n, k, &a, lda, &b, ldb, beta, &mut want, ldc);
        let da = gpu.alloc(Region::Activations, (a.len() * 4) as u64)?;
        let db = gpu.alloc(Region::Activations, (b.len() * 4) as u64)?;
        let dc = gpu.alloc(Region::Activations, (c0.len() * 4) as u64)?;
        let l = gpu.label("selftest · gemm");
        gpu.upload(l, da, &f32_bytes(&a))?;
        gpu.upload(l, db, &f32_bytes(&b))?;
        let g = GemmF32 {
            transa: ta,
            transb: tb,
            m: m as i32,
            n: n as i32,
            k: k as i32,
            alpha: gpu.scalar(1.0)?,
            a: da.ptr,
            lda: lda as i32,
            b: db.ptr,
            ldb: ldb as i32,
            beta: gpu.scalar(beta)?,
            c: dc.ptr,
            ldc: ldc as i32,
        };
        let paths: Vec<(&str, bool)> = match gpu.gemm_path() {
            GemmPath::Blas { .. } => vec![("hs_sgemm", true), ("blas", false)],
            _ => vec![("hs_sgemm", true)],
        };
        for (name, fallback) in paths {
            gpu.upload(l, dc, &f32_bytes(&c0))?;
            if fallback {
                gpu.gemm_f32_fallback(l, &g)?;
            } else {
                gpu.gemm_f32(l, &g)?;
            }
            let mut out = vec![0u8; c0.len() * 4];
            gpu.download(l, dc, &mut out)?;
            let got = bytes_f32(&out);
            let mut err = 0.0f32;
            for j in 0..n {
                for i in 0..m {
                    let (x, y) = (got[i + j * ldc], want[i + j * ldc]);
                    err = err.max((x - y).abs() / y.abs().max(1.0));
                }
            }
            // Rows past m must be untouched.
            let untouched = (0..n).all(|j| (m..ldc).all(|i| got[i + j * ldc] == c0[i + j * ldc]));
            if !untouched {
                err = f32::INFINITY;
            }
            worst = worst.max(err);
            runs.push(format!("{name} {ta:?}{tb:?}"));
        }
        gpu.free(da);
        gpu.free(db);
        gpu.free(dc);
    }
    Ok((
        worst < 1e-4,
        format!(
            "{m}×{n}×{k}, {} runs ({}), max rel. error {worst:.2e}",
            runs.len(),
            runs.join(", ")
        ),
    ))
}

pub(super) fn verify(gpu: &mut Gpu) -> Result<(bool, String), GpuError> {
    let data: Vec<u8> = f32_bytes(&rand_f32(256 * 1024, 99));
    let good = gpu.alloc(Region::Weights, data.len() as u64)?;
    gpu.upload_tensor("selftest.good.weight", good, &data)?;
    // The gfx1151 failure, staged: the tensor is zeroed after its upload.
    let zeroed_name = "blk.0.ffn_down.weight (zeroed on purpose)";
    let zeroed = gpu.alloc(Region::Weights, data.len() as u64)?;
    let l = gpu.label("selftest · upload then zero");
    gpu.upload(l, zeroed, &data)?;
    gpu.fill_u32(l, zeroed, 0)?;
    let caught_zero = match gpu.verify_tensor(zeroed_name, zeroed, &data) {
        Err(GpuError::Verify(VerifyError::ZeroedOnDevice { tensor, .. })) => tensor == zeroed_name,
        _ => false,
    };
    // One corrupted 256-byte block in the middle.
    let bad_name = "blk.1.attn_q.weight (one block overwritten)";
    let bad = gpu.alloc(Region::Weights, data.len() as u64)?;
    gpu.upload(l, bad, &data)?;
    gpu.fill_u32(l, bad.slice(512 * 1024, 256)?, 0xDEAD_BEEF)?;
    let caught_mismatch = match gpu.verify_tensor(bad_name, bad, &data) {
        Err(GpuError::Verify(VerifyError::Mismatch { tensor, .. })) => tensor == bad_name,
        _ => false,
    };
    Ok((
        caught_zero && caught_mismatch,
        format!(
            "1 MiB tensor verified OK; zeroed tensor {}; overwritten block {}",
            if caught_zero {
                "caught and named"
            } else {
                "NOT caught"
            },
            if caught_mismatch {
                "caught and named"
            } else {
                "NOT caught"
            }
        ),
    ))
}
