//! Kernel stamps on this device (`trace/stamps.rs`): the host ring and the stamp block made the
//! first time tracing is on, and the clock calibration that maps the device's clock onto the
//! host's, run while the stream is idle — at the first traced op and every
//! [`stamps::RECALIBRATE_NS`] after.

use std::time::{Duration, Instant};

use super::{Arg, Gpu};
use crate::gpu::device::GpuError;
use crate::gpu::trace::device::TraceEvents;
use crate::gpu::trace::stamps::{self, StampRing};
use crate::gpu::trace::{self, now_ns};

/// How long the host reads the probe's clock.
const SAMPLE_NS: u64 = 200_000;
/// Readings kept at most.
const MAX_SAMPLES: usize = 256;
/// Longest wait for the probe to start on an idle stream.
const START_TIMEOUT: Duration = Duration::from_secs(1);
/// The probe's own guard: the stores it makes before it stops without the host (over a second:
/// each waits on a read of the host's flag).
const PROBE_MAX_POLLS: u64 = 2_000_000;
/// Byte offset of the probe's stop flag in its host word (its clock readings take the first 16).
const PROBE_FLAG: usize = 32;

impl Gpu {
    /// At the start of an enqueue, with tracing on and kernels of the stamped build loaded
    /// (`launch.rs`, `prepare_kernels`): makes the ring the first time and, on an idle stream,
    /// maps the clocks when the map is missing or old. Stamps that cannot be had (breadcrumbs
    /// off, no probe reading) leave kernels timed by events, said once.
    pub(super) fn trace_prepare(&mut self) -> Result<(), GpuError> {
        if self.stamp_busy
            || self.stamp_failed.is_some()
            || !trace::on()
            || self.cfg.trace_events != TraceEvents::Stamps
        {
            return Ok(());
        }
        let Some(t) = self.timer.as_ref() else {
            return Ok(());
        };
        let needs_ring = !self.stamp_ring;
        // Kernels of the ordinary build do not stamp: nothing to set up or calibrate for them.
        if !self.any_stamped {
            return Ok(());
        }
        // Before the arena (which holds the stamp block) there is nothing to stamp yet. The
        // clock is mapped on an idle stream: a busy one (the common case, one atomic load) is
        // left at once.
        if needs_ring && self.stamp_block.is_none() {
            return Ok(());
        }
        let idle = self.stream.shared().queue_depth() == 0;
        if !(needs_ring || idle && t.wants_calibration()) {
            return Ok(());
        }
        if !idle {
            let r = self.stream.poll(self.backend.as_mut());
            if self.guard(r)? < self.stream.last_seq() {
                return Ok(());
            }
        }
        self.stamp_busy = true;
        let made = if needs_ring {
            self.stamps_setup()
        } else {
            Ok(None)
        };
        let r = match made {
            Ok(None) => self.calibrate_clock(),
            other => other,
        };
        self.stamp_busy = false;
        match r {
            Ok(None) => Ok(()),
            Ok(Some(why)) => {
                tracing::warn!(
                    "trace: kernels on {} are timed by events: {why}",
                    self.stream.shared().name
                );
                self.stamp_failed = Some(why);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// The ring (pinned, mapped) and the stamp block's image; `Ok(Some(why))` when this device
    /// cannot have stamps.
    fn stamps_setup(&mut self) -> Result<Option<String>, GpuError> {
        let Some(block) = self.stamp_block else {
            return Ok(Some("no stamp block".into()));
        };
        let host_crumb = self.stream.crumb_arg();
        if host_crumb.is_null() {
            return Ok(Some("breadcrumbs are off".into()));
        }
        let r = self.backend.alloc_pinned(stamps::RING_BYTES, true);
        let ring = self.guard(r)?;
        // SAFETY: RING_BYTES fresh bytes.
        unsafe { std::ptr::write_bytes(ring.host, 0, stamps::RING_BYTES) };
        let (host, dev) = (ring.host, ring.device);
        // Freed at teardown with the host words.
        self.host_words.push(ring);
        let Some(dev) = dev else {
            return Ok(Some("mapped memory without a device address".into()));
        };
        let l = self.label("trace · stamp block");
        self.upload(l, block, &stamps::block_image(host_crumb.0, dev.0))?;
        // SAFETY: the pinned allocation above lives until teardown, which drops the timer first.
        let ring = unsafe { StampRing::new(host) };
        let nominal = stamps::nominal_ns_per_tick(self.kind());
        if let Some(t) = self.timer.as_mut() {
            t.set_stamps(ring, block.ptr.0, nominal);
        }
        self.stamp_ring = true;
        Ok(None)
    }

    /// Launches `hs_clock_probe` on the idle stream and reads its clock beside the host's for
    /// [`SAMPLE_NS`]; `Ok(Some(why))` when it never started.
    fn calibrate_clock(&mut self) -> Result<Option<String>, GpuError> {
        let w = match self.stamp_probe {
            Some(w) => w,
            None => {
                let w = self.alloc_host_word()?;
                self.stamp_probe = Some(w);
                w
            }
        };
        let host = self.host_words.get(w.0).ok_or(GpuError::TornDown)?.host;
        let (clock, stopped, flag) = (
            host as *const u64,
            // SAFETY (all three): inside the 64-byte host word.
            unsafe { host.add(8) } as *const u64,
            unsafe { host.add(PROBE_FLAG) } as *mut u32,
        );
        // SAFETY: the host word lives until teardown; the device does not use it now (the
        // stream is idle, a previous probe has stopped).
        unsafe { std::ptr::write_bytes(host, 0, 64) };
        let dev = self.host_word_device(w)?;
        let f = self.function("hs_clock_probe")?;
        let l = self.label("trace · clock calibration");
        let probe_args = [
            Arg::Ptr(dev),
            Arg::Ptr(dev.offset(PROBE_FLAG as u64)),
            Arg::U64(PROBE_MAX_POLLS),
        ];
        self.launch_now(l, f, [1, 1, 1], [32, 1, 1], 0, &probe_args, None)?;
        let samples = read_probe(clock, stopped);
        // SAFETY: as above.
        unsafe { std::ptr::write_volatile(flag, 1) };
        if samples.is_empty() {
            return Ok(Some(format!(
                "the clock probe did not start within {} s on an idle stream",
                START_TIMEOUT.as_secs()
            )));
        }
        if let Some(t) = self.timer.as_mut() {
            t.calibrate(&samples);
        }
        Ok(None)
    }

    /// Whether this device's kernels are launched stamped now (tracing on, clocks mapped).
    pub fn stamping(&self) -> bool {
        self.timer.as_ref().is_some_and(|t| t.stamping())
    }
}

/// Reads the probe's clock word until it has run [`SAMPLE_NS`] (or [`MAX_SAMPLES`] readings, or
/// the probe has stopped), as `(host_ns, ticks)` each time the value changes; empty when it
/// never started.
fn read_probe(clock: *const u64, stopped: *const u64) -> Vec<(u64, u64)> {
    let give_up = Instant::now() + START_TIMEOUT;
    let mut samples = Vec::with_capacity(MAX_SAMPLES);
    let mut last = 0u64;
    let mut first = None;
    loop {
        // The stop flag before the clock: once it is seen, the clock read after it is the
        // probe's last. SAFETY (both reads): the caller's host word, live for the call; the
        // device writes it.
        let done = unsafe { std::ptr::read_volatile(stopped) } != 0;
        let v = unsafe { std::ptr::read_volatile(clock) };
        let h = now_ns();
        if v != 0 && v != last {
            samples.push((h, v));
            last = v;
            first.get_or_insert(h);
        }
        let enough = first.is_some_and(|f| h > f + SAMPLE_NS) || samples.len() >= MAX_SAMPLES;
        if done || enough || (first.is_none() && Instant::now() > give_up) {
            return samples;
        }
        std::hint::spin_loop();
    }
}
