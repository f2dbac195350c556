//! The host's memory read bandwidth, measured: the ceiling on decode speed for the CPU backend,
//! which reads every weight once per token.
//!
//! Measured, not looked up: the figure that matters is what these threads get on this machine
//! now (channels populated, other load, NUMA placement), as `bench`'s bound column compares with.
//! The buffer is four times the last-level cache sysfs reports (256 MiB at least), so that the
//! cache does not flatter the figure on a CPU with a large L3.

use std::path::Path;
use std::sync::OnceLock;
use std::time::Instant;

/// Bytes each measurement streams through at least: beyond most last-level caches.
const MIN_BUFFER_BYTES: usize = 256 << 20;
/// At most (a CPU with a gigabyte of stacked L3 gets 4 GiB).
const MAX_BUFFER_BYTES: usize = 4 << 30;
/// The buffer is this many times the last-level cache, so that what the cache holds from the
/// previous pass is a small part of the next.
const LLC_MULTIPLE: usize = 4;

/// Passes over the buffer; the fastest counts (the others paid for page faults or interference).
const PASSES: usize = 5;

/// The host's read bandwidth as measured by [`host_read_bandwidth`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostBandwidth {
    pub bytes_per_s: f64,
    pub buffer_bytes: usize,
    pub passes: usize,
}

/// Read bandwidth with `n_threads` threads each summing its share of a buffer four times the
/// last-level cache (256 MiB to 4 GiB), best of five passes. Measured on the first call (about
/// a second) and cached for the process; later calls return the first figure whatever their
/// thread count.
pub fn host_read_bandwidth(n_threads: usize) -> HostBandwidth {
    static CACHED: OnceLock<HostBandwidth> = OnceLock::new();
    *CACHED.get_or_init(|| {
        let bytes = buffer_bytes(last_level_cache(Path::new("/sys")));
        HostBandwidth {
            bytes_per_s: measure(n_threads.max(1), bytes, PASSES),
            buffer_bytes: bytes,
            passes: PASSES,
        }
    })
}

/// The buffer for a last-level cache of `llc` bytes (unknown: the minimum).
pub fn buffer_bytes(llc: Option<u64>) -> usize {
    let want = llc.map_or(0, |c| c as usize * LLC_MULTIPLE);
    want.clamp(MIN_BUFFER_BYTES, MAX_BUFFER_BYTES)
}

/// The last-level cache of the whole machine, from sysfs under `sys`: the largest cache of cpu0
/// (`devices/system/cpu/cpu0/cache/index*/size`, "32768K") times the number of such caches (the
/// online CPUs over the CPUs sharing it, its `shared_cpu_list`: a chiplet CPU has one L3 per
/// chiplet, and threads on every chiplet use them all). `None` where sysfs does not say.
pub fn last_level_cache(sys: &Path) -> Option<u64> {
    let cpu = sys.join("devices/system/cpu");
    let (size, shared) = std::fs::read_dir(cpu.join("cpu0/cache"))
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("index"))
        .filter_map(|e| {
            let size = parse_size(std::fs::read_to_string(e.path().join("size")).ok()?.trim())?;
            let shared = std::fs::read_to_string(e.path().join("shared_cpu_list"))
                .ok()
                .and_then(|l| count_cpus(l.trim()));
            Some((size, shared))
        })
        .max_by_key(|&(size, _)| size)?;
    let online = std::fs::read_to_string(cpu.join("online"))
        .ok()
        .and_then(|l| count_cpus(l.trim()));
    let instances = match (online, shared) {
        (Some(n), Some(per)) if per > 0 => n.div_ceil(per).max(1),
        _ => 1,
    };
    Some(size * instances)
}

/// The CPUs in a sysfs list ("0-7,64-71" is 16).
fn count_cpus(list: &str) -> Option<u64> {
    list.split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => Some(b.parse::<u64>().ok()? + 1 - a.parse::<u64>().ok()?),
            None => r.parse::<u64>().ok().map(|_| 1),
        })
        .sum()
}

/// "32768K", "1M", "512" (bytes) as sysfs writes a cache's size.
fn parse_size(s: &str) -> Option<u64> {
    let (num, mult) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 1 << 10),
        b'M' | b'm' => (&s[..s.len() - 1], 1 << 20),
        b'G' | b'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok().map(|n| n * mult)
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
    fn the_buffer_is_four_times_the_largest_cache_within_bounds() {
        let root = tempfile::tempdir().unwrap();
        let cache = root.path().join("devices/system/cpu/cpu0/cache");
        // An 8-chiplet CPU: 32 MiB of L3 per chiplet of 8 cores (16 threads).
        for (i, (size, shared)) in [("48K", "0,64"), ("1024K", "0,64"), ("32768K", "0-7,64-71")]
            .iter()
            .enumerate()
        {
            let d = cache.join(format!("index{i}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("size"), format!("{size}\n")).unwrap();
            std::fs::write(d.join("shared_cpu_list"), format!("{shared}\n")).unwrap();
        }
        // Not a cache level: ignored.
        std::fs::create_dir_all(cache.join("uevent_dir")).unwrap();
        let online = root.path().join("devices/system/cpu/online");
        std::fs::write(&online, "0-127\n").unwrap();
        let llc = last_level_cache(root.path());
        assert_eq!(llc, Some(256 << 20), "eight 32 MiB caches");
        assert_eq!(buffer_bytes(llc), 1 << 30);
        // Without the CPU lists: cpu0's cache alone.
        std::fs::remove_file(&online).unwrap();
        assert_eq!(last_level_cache(root.path()), Some(32 << 20));
        assert_eq!(count_cpus("0-7,64-71"), Some(16));
        assert_eq!(count_cpus("3"), Some(1));
        assert_eq!(
            buffer_bytes(Some(8 << 20)),
            256 << 20,
            "small L3: the minimum"
        );
        assert_eq!(buffer_bytes(Some(2 << 30)), 4 << 30, "the most");
        assert_eq!(buffer_bytes(None), 256 << 20);
        assert_eq!(last_level_cache(&root.path().join("none")), None);
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("x"), None);
    }

    #[test]
    fn a_small_measurement_is_a_plausible_rate() {
        // 8 MiB: quick; only its plausibility is checked (bytes/s between 100 MB/s and 10 TB/s),
        // since the machine's load decides the figure.
        let bw = measure(2, 8 << 20, 2);
        assert!((1e8..1e13).contains(&bw), "{bw} bytes/s");
    }
}
