//! The host's memory read bandwidth, measured: the ceiling on decode speed for the CPU backend,
//! which reads every weight once per token.
//!
//! Measured, not looked up: the figure that matters is what these threads get on this machine
//! now (channels populated, other load, NUMA placement), as `bench`'s bound column compares with.

use std::sync::OnceLock;
use std::time::Instant;

/// Bytes each measurement streams through: well beyond any last-level cache.
const BUFFER_BYTES: usize = 256 << 20;

/// Passes over the buffer; the fastest counts (the others paid for page faults or interference).
const PASSES: usize = 4;

/// Read bandwidth in bytes/s with `n_threads` threads each summing its share of a 256 MiB
/// buffer, best of four passes. Measured on the first call (about half a second) and cached
/// for the process; later calls return the first figure whatever their thread count.
pub fn host_read_bandwidth(n_threads: usize) -> f64 {
    static CACHED: OnceLock<f64> = OnceLock::new();
    *CACHED.get_or_init(|| measure(n_threads.max(1), BUFFER_BYTES, PASSES))
}

/// One measurement: `bytes` (rounded down to whole u64s) split over `n_threads`, best of
/// `passes`.
pub fn measure(n_threads: usize, bytes: usize, passes: usize) -> f64 {
    let words = (bytes / 8).max(n_threads);
    // Distinct values so that no page is the shared zero page (which would read from cache).
    let buf: Vec<u64> = (0..words as u64).collect();
    let share = words.div_ceil(n_threads);
    let mut best = f64::INFINITY;
    let mut sink = 0u64;
    for _ in 0..passes.max(1) {
        let t = Instant::now();
        let total: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = buf
                .chunks(share)
                .map(|part| s.spawn(move || sum(part)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0, u64::wrapping_add)
        });
        best = best.min(t.elapsed().as_secs_f64());
        sink = sink.wrapping_add(total);
    }
    std::hint::black_box(sink);
    (words * 8) as f64 / best.max(1e-9)
}

/// Sum with eight independent lanes, so that the adds keep up with memory and vectorize.
fn sum(xs: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let (chunks, rest) = xs.as_chunks::<8>();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(v);
        }
    }
    let tail = rest.iter().fold(0u64, |s, &v| s.wrapping_add(v));
    acc.iter().fold(tail, |s, &v| s.wrapping_add(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_is_exact() {
        let xs: Vec<u64> = (0..1001).collect();
        assert_eq!(sum(&xs), 1000 * 1001 / 2);
    }

    #[test]
    fn a_small_measurement_is_a_plausible_rate() {
        // 8 MiB: quick; only its plausibility is checked (bytes/s between 100 MB/s and 10 TB/s),
        // since the machine's load decides the figure.
        let bw = measure(2, 8 << 20, 2);
        assert!((1e8..1e13).contains(&bw), "{bw} bytes/s");
    }
}
