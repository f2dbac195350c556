//! Kernel stamps: with tracing on, each hipscope kernel times itself (`HS_BREADCRUMB` in
//! kernels/prelude.h). Its first thread stores the device clock when it starts into the op's slot
//! of a ring in pinned host memory; each block raises the op's end word in the stream's stamp
//! block (device memory) to the time it leaves, and the next kernel's first thread, which starts
//! only once the op has finished, hands that end over into the ring. The host reads a slot once
//! both words are there — no runtime call per op, where two timed events per launch cost ~3.6 µs
//! each on CUDA — and maps the device clock onto its own with a calibration launch
//! (`hs_clock_probe`, `handle/stamps.rs`). Copies, vendor BLAS calls and graph replays run no
//! hipscope kernel code and keep the timed events (`device.rs`); a kernel followed by one of them
//! ends where the device reached that op's start event.

use crate::gpu::device::RuntimeKind;
pub use crate::gpu::stream::stamp::{
    BEHIND, BLOCK_BYTES, ENDS_WORD, RING_BYTES, SLOTS, STAMP_OP, block_image, slot,
};

/// Set in `Ev::b` of a kernel op timed by its stamps (a kernel's `b` is otherwise 0); the low
/// bits hold the nanoseconds of its dispatch (`device.rs`, `stamp_times`).
const STAMPED: u64 = 1 << 63;

/// `Ev::b` of a stamped kernel whose dispatch took `dispatch_ns`.
pub fn stamped_b(dispatch_ns: u64) -> u64 {
    STAMPED | (dispatch_ns & !STAMPED)
}

/// A kernel op's `Ev::b` read back: `Some(dispatch_ns)` when it was timed by its stamps.
pub fn stamped_dispatch(b: u64) -> Option<u64> {
    (b & STAMPED != 0).then_some(b & !STAMPED)
}

/// A clock map older than this is renewed at the stream's next idle moment (the two clocks
/// drift by a few parts per million; the renewal also measures the device clock's rate).
pub const RECALIBRATE_NS: u64 = 500_000_000;
/// The rate is measured between two calibrations at least this far apart.
const RATE_SPAN_NS: u64 = 100_000_000;

/// The device clock's nominal nanoseconds per tick: CUDA's `%globaltimer` counts nanoseconds,
/// HIP's `wall_clock64()` runs at 100 MHz on every AMD GPU hipscope compiles for; the fake
/// device's clock is in nanoseconds. Calibrations refine it.
pub fn nominal_ns_per_tick(kind: RuntimeKind) -> f64 {
    match kind {
        RuntimeKind::Hip => 10.0,
        RuntimeKind::Cuda | RuntimeKind::Fake => 1.0,
    }
}

/// Device clock → host clock (`trace::now_ns`), from calibration samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClockMap {
    /// The host time of device tick `ticks`.
    host_ns: u64,
    ticks: u64,
    ns_per_tick: f64,
    /// Whether `ns_per_tick` was measured (two calibrations far enough apart) or is nominal.
    pub measured: bool,
}

impl ClockMap {
    /// The map from samples `(host_ns, ticks)`: the host read `ticks` at `host_ns`, so the
    /// device wrote it at least the bus's latency earlier. Each sample bounds the offset from
    /// above; the smallest bound is kept (within that latency, ~1 µs). With a `previous` map
    /// far enough back, the rate is measured between the two; a measurement more than 10% from
    /// `nominal` is not believed. `None` without samples.
    pub fn from_samples(
        samples: &[(u64, u64)],
        nominal: f64,
        previous: Option<&ClockMap>,
    ) -> Option<ClockMap> {
        let rate = previous
            .filter(|p| p.measured)
            .map_or(nominal, |p| p.ns_per_tick);
        // The sample with the smallest host − device offset at this rate.
        let &(host_ns, ticks) = samples.iter().min_by(|a, b| {
            let off = |s: &(u64, u64)| s.0 as f64 - s.1 as f64 * rate;
            off(a).total_cmp(&off(b))
        })?;
        let mut map = ClockMap {
            host_ns,
            ticks,
            ns_per_tick: rate,
            measured: previous.is_some_and(|p| p.measured),
        };
        if let Some(p) = previous
            && host_ns > p.host_ns + RATE_SPAN_NS
            && ticks > p.ticks
        {
            let r = (host_ns - p.host_ns) as f64 / (ticks - p.ticks) as f64;
            if (r / nominal - 1.0).abs() < 0.1 {
                map.ns_per_tick = r;
                map.measured = true;
            }
        }
        Some(map)
    }

    /// The host time of device tick `t`.
    pub fn host_ns(&self, t: u64) -> u64 {
        let d = (t as i128 - self.ticks as i128) as f64 * self.ns_per_tick;
        (self.host_ns as f64 + d).round().max(0.0) as u64
    }

    /// Nanoseconds between two device ticks.
    pub fn span_ns(&self, from: u64, to: u64) -> u64 {
        (to.saturating_sub(from) as f64 * self.ns_per_tick).round() as u64
    }

    pub fn ns_per_tick(&self) -> f64 {
        self.ns_per_tick
    }

    /// When it was made (host clock).
    pub fn made_ns(&self) -> u64 {
        self.host_ns
    }
}

/// The host ring (pinned, mapped into the device; owned and freed by the `Gpu`).
pub struct StampRing {
    words: *mut u64,
}

// SAFETY: the ring is only touched by the thread that owns the `Gpu` (and the device).
unsafe impl Send for StampRing {}

impl StampRing {
    /// # Safety
    /// `host` points at [`RING_BYTES`] bytes of pinned memory, 8-byte aligned, that outlive the
    /// ring.
    pub unsafe fn new(host: *mut u8) -> StampRing {
        StampRing {
            words: host as *mut u64,
        }
    }

    /// Takes op `seq`'s start and end ticks once both are there, emptying the slot for its next
    /// op (the host empties a slot as it reads it, when its line is in the host's cache: an
    /// empty slot before each launch would cost a write to a line the device wrote, a cache
    /// miss an op).
    pub fn take(&self, seq: u64) -> Option<(u64, u64)> {
        let i = 2 * slot(seq);
        // SAFETY: i + 1 < 2 · SLOTS words (`new`'s contract); volatile: the device writes it.
        let (s, e) = unsafe {
            (
                std::ptr::read_volatile(self.words.add(i)),
                std::ptr::read_volatile(self.words.add(i + 1)),
            )
        };
        // An end before the start is left from an op given up on (`empty` came before its late
        // end): not this op's.
        if s == 0 || e < s {
            return None;
        }
        self.empty(seq);
        Some((s, e))
    }

    /// Op `seq`'s start ticks, if there (0 otherwise), without taking it.
    pub fn start(&self, seq: u64) -> u64 {
        // SAFETY: as in `take`.
        unsafe { std::ptr::read_volatile(self.words.add(2 * slot(seq))) }
    }

    /// Empties op `seq`'s slot (read, or given up on).
    pub fn empty(&self, seq: u64) {
        let i = 2 * slot(seq);
        // SAFETY: as in `take`.
        unsafe {
            std::ptr::write_volatile(self.words.add(i), 0);
            std::ptr::write_volatile(self.words.add(i + 1), 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_and_the_host_agree_on_the_layout() {
        let prelude = crate::gpu::kernels::PRELUDE;
        let define = |name: &str| {
            prelude
                .lines()
                .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
                .map(|v| v.trim().to_string())
                .unwrap_or_else(|| panic!("{name} in prelude.h"))
        };
        assert_eq!(define("HS_STAMP_OP"), "(1ULL << 62)");
        assert_eq!(STAMP_OP, 1 << 62);
        assert_eq!(define("HS_STAMP_SLOTS"), format!("{SLOTS}u"));
        assert_eq!(define("HS_STAMP_ENDS"), ENDS_WORD.to_string());
        assert_eq!(define("HS_STAMP_BEHIND"), format!("{BEHIND}u"));
        const { assert!(SLOTS > crate::gpu::stream::RING && SLOTS.is_power_of_two()) };
    }

    #[test]
    fn the_offset_is_the_tightest_sample_and_the_rate_is_measured_over_time() {
        // Device ticks at 10 ns, device tick 0 at host 5,000 ns; the host saw each value 300 to
        // 900 ns after it was written.
        let host = |t: u64, lag: u64| 5_000 + t * 10 + lag;
        let s = [
            (host(100, 900), 100),
            (host(150, 300), 150),
            (host(200, 600), 200),
        ];
        let m = ClockMap::from_samples(&s, 10.0, None).expect("map");
        assert_eq!(m.host_ns(150), host(150, 300));
        assert_eq!(m.host_ns(1_150), host(1_150, 300));
        assert_eq!(m.span_ns(100, 200), 1_000);
        assert!(!m.measured);
        // 0.2 s later, on a device clock 0.5% fast: the rate is measured.
        let t2 = 20_000_000u64;
        let later = [(5_000 + t2 * 10 + 300, (t2 as f64 * 1.005) as u64)];
        let m2 = ClockMap::from_samples(&later, 10.0, Some(&m)).expect("map");
        assert!(m2.measured);
        assert!((m2.ns_per_tick() - 10.0 / 1.005).abs() < 1e-3, "{m2:?}");
        // A rate far from the nominal one is not believed.
        let wild = [(5_000 + t2 * 10, t2 * 2)];
        let m3 = ClockMap::from_samples(&wild, 10.0, Some(&m)).expect("map");
        assert!(!m3.measured);
        assert_eq!(m3.ns_per_tick(), 10.0);
        assert!(ClockMap::from_samples(&[], 10.0, None).is_none());
    }

    #[test]
    fn a_slot_is_taken_once_both_stamps_are_there_and_left_empty() {
        let mut mem = vec![0u64; 2 * SLOTS];
        let p = mem.as_mut_ptr();
        // SAFETY: RING_BYTES of 8-byte aligned memory that outlives the ring.
        let ring = unsafe { StampRing::new(p as *mut u8) };
        let seq = SLOTS as u64 + 3;
        // SAFETY (the writes and reads): inside `mem`, standing in for the device.
        unsafe { p.add(6).write(11) };
        assert_eq!(ring.take(seq), None, "no end yet");
        unsafe { p.add(7).write(42) };
        assert_eq!(ring.take(3), Some((11, 42)), "the same slot");
        assert_eq!(unsafe { (p.add(6).read(), p.add(7).read()) }, (0, 0));
        assert_eq!(ring.take(seq), None, "taken");
        // A late end of an op given up on, then the next op's start: not taken as its end.
        unsafe { p.add(7).write(5) };
        unsafe { p.add(6).write(9) };
        assert_eq!(ring.take(seq), None);
        ring.empty(seq);
        assert_eq!(unsafe { p.add(7).read() }, 0);
        drop(mem);
    }
}
