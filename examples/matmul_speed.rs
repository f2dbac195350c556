//! Speed of the CPU matrix products: GB/s of weights streamed, per type and shape.
//!
//! `cargo run --release --example matmul_speed [-- --threads N] [--scalar] [--quick] [--only TYPE]
//! [--shape ROWSxCOLS] [--no-sweep]`
//!
//! * hot: the same matrix again and again (it stays in L2/L3 where it fits): kernel speed.
//! * sweep: every weight matrix of a SmolLM2-135M-shaped model (30 layers of q, k, v, o, gate,
//!   up, down in the given type plus the 49152×576 output in Q8_0, ~100 MB, more than the L3)
//!   one after the other, as a decode step (1 token) or a prompt chunk (64 tokens) does.
//! * dispatch: an empty job on the pool.

use std::time::{Duration, Instant};

use hipscope::gpu::cpu::matmul::{MatmulScratch, QuantMatrix, matmul};
use hipscope::gpu::cpu::pool::ThreadPool;
use hipscope::gpu::quant::dot::Isa;
use hipscope::gpu::quant::{self, GgmlType};

fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
        })
        .collect()
}

/// Quantized random weights. Quantizing large matrices with the K-type search is slow, so a
/// small random pool of rows is quantized once and tiled (the kernels do not care).
fn weights(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let sample_rows = rows.min(64);
    let q = quant::quantize(ty, &noise(sample_rows * cols, seed)).expect("quantize");
    let rb = q.len() / sample_rows;
    let mut out = Vec::with_capacity(rows * rb);
    for r in 0..rows {
        let s = (r * 7 + seed as usize) % sample_rows;
        out.extend_from_slice(&q[s * rb..(s + 1) * rb]);
    }
    out
}

/// CPU time of the calling thread, in seconds: with one thread, what the work cost regardless of
/// how long other processes kept it off the core.
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

static USE_CPU_TIME: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn now() -> f64 {
    if USE_CPU_TIME.load(std::sync::atomic::Ordering::Relaxed) {
        thread_cpu()
    } else {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_secs_f64()
    }
}

/// Seconds per call of `f`: the best of batches of about 20 ms (this machine is shared, and the
/// best batch is the one least disturbed by other processes).
fn time(mut f: impl FnMut(), budget: Duration) -> f64 {
    f();
    let t = Instant::now();
    f();
    let once = t.elapsed().as_secs_f64().max(1e-7);
    let per_batch = ((0.02 / once) as usize).clamp(1, 100_000);
    let mut samples = Vec::new();
    let start = Instant::now();
    while start.elapsed() < budget || samples.len() < 3 {
        let t = now();
        for _ in 0..per_batch {
            f();
        }
        samples.push((now() - t) / per_batch as f64);
    }
    samples.iter().copied().fold(f64::INFINITY, f64::min)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads = args
        .iter()
        .position(|a| a == "--threads")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        });
    let isa = if args.iter().any(|a| a == "--scalar") {
        Isa::Scalar
    } else {
        Isa::detect()
    };
    let budget = Duration::from_millis(if args.iter().any(|a| a == "--quick") {
        150
    } else {
        600
    });
    let pool = ThreadPool::new(threads);
    // With one thread, time by the thread's CPU clock: immune to other processes' load.
    USE_CPU_TIME.store(threads == 1, std::sync::atomic::Ordering::Relaxed);
    println!(
        "threads {threads}, kernels {}, timing by {}",
        isa.name(),
        if threads == 1 {
            "thread CPU time"
        } else {
            "wall clock (best batch)"
        }
    );

    // Dispatch: a job whose every index works 5 µs. Run in parallel it takes 5 µs plus the
    // dispatch and join; if the caller had to run a worker's index too, 10 µs or more.
    let busy = |_: usize, _: usize| {
        let t = Instant::now();
        while t.elapsed() < Duration::from_micros(5) {
            std::hint::spin_loop();
        }
    };
    let was = USE_CPU_TIME.swap(false, std::sync::atomic::Ordering::Relaxed);
    let d = time(|| pool.run(&busy), budget);
    USE_CPU_TIME.store(was, std::sync::atomic::Ordering::Relaxed);
    println!(
        "dispatch: a job of 5 µs per thread takes {:.2} µs (wall)",
        d * 1e6
    );

    println!("\nhot (same matrix repeatedly)");
    println!(
        "{:<6} {:>12} {:>6} {:>10} {:>9} {:>10}",
        "type", "rows x cols", "tokens", "MB", "µs", "GB/s"
    );
    // SmolLM2's ffn_down, ffn_gate/up and output; K types need rows of 256-multiples, so they
    // also get Llama-shaped 4096-wide rows.
    let shapes: [(usize, usize); 4] = [(576, 1536), (1536, 576), (49152, 576), (4096, 4096)];
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| GgmlType::from_name(v));
    let hot_types = [
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q5_0,
        GgmlType::F16,
    ];
    let shape = args
        .iter()
        .position(|a| a == "--shape")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.split_once('x'))
        .and_then(|(r, c)| Some((r.parse::<usize>().ok()?, c.parse::<usize>().ok()?)));
    for ty in hot_types
        .into_iter()
        .filter(|t| only.is_none_or(|o| o == *t))
    {
        for &(rows, cols) in &shapes {
            if !cols.is_multiple_of(ty.block_len()) || shape.is_some_and(|s| s != (rows, cols)) {
                continue;
            }
            let q = weights(ty, rows, cols, 1);
            let w = QuantMatrix::new(ty, rows, cols, &q).expect("matrix");
            for n_tokens in [1usize, 64] {
                let x = noise(n_tokens * cols, 2);
                let mut y = vec![0f32; rows * n_tokens];
                let mut s = MatmulScratch::with_isa(isa);
                let t = time(|| matmul(&pool, &w, &x, n_tokens, &mut y, &mut s), budget);
                println!(
                    "{:<6} {:>12} {:>6} {:>10.2} {:>9.1} {:>10.2}{}",
                    ty.name(),
                    format!("{rows}x{cols}"),
                    n_tokens,
                    q.len() as f64 / 1e6,
                    t * 1e6,
                    q.len() as f64 / t / 1e9,
                    if n_tokens > 1 {
                        format!("   {:.1} GMAC/s", (rows * cols * n_tokens) as f64 / t / 1e9)
                    } else {
                        String::new()
                    }
                );
            }
        }
    }

    if args.iter().any(|a| a == "--no-sweep") {
        return;
    }
    println!("\nsweep (SmolLM2-135M shapes, 30 layers, output Q8_0)");
    let sweep_types = [
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
    ];
    for ty in sweep_types
        .into_iter()
        .filter(|t| only.is_none_or(|o| o == *t))
    {
        let layer = [
            (576, 576),
            (192, 576),
            (192, 576),
            (576, 576),
            (1536, 576),
            (1536, 576),
            (576, 1536),
        ];
        let mut mats: Vec<(GgmlType, usize, usize, Vec<u8>)> = Vec::new();
        for l in 0..30 {
            for (i, &(r, c)) in layer.iter().enumerate() {
                mats.push((ty, r, c, weights(ty, r, c, (l * 7 + i) as u64)));
            }
        }
        mats.push((
            GgmlType::Q8_0,
            49152,
            576,
            weights(GgmlType::Q8_0, 49152, 576, 99),
        ));
        let bytes: usize = mats.iter().map(|m| m.3.len()).sum();
        for n_tokens in [1usize, 64] {
            let x576 = noise(n_tokens * 576, 3);
            let x1536 = noise(n_tokens * 1536, 4);
            let mut y = vec![0f32; 49152 * n_tokens];
            let mut s = MatmulScratch::with_isa(isa);
            let t = time(
                || {
                    for (ty, r, c, q) in &mats {
                        let w = QuantMatrix::new(*ty, *r, *c, q).expect("matrix");
                        let x = if *c == 576 { &x576 } else { &x1536 };
                        matmul(&pool, &w, x, n_tokens, &mut y[..r * n_tokens], &mut s);
                    }
                },
                budget * 3,
            );
            println!(
                "{:<6} tokens {:>3}: {:.2} ms per pass over {:.1} MB = {:.2} GB/s, {:.1} tokens/s from the matmuls alone",
                ty.name(),
                n_tokens,
                t * 1e3,
                bytes as f64 / 1e6,
                bytes as f64 / t / 1e9,
                n_tokens as f64 / t
            );
        }
    }
}
