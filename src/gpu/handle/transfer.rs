//! Host↔device copies of an opened device through its pinned staging buffers, and verified
//! uploads: after a tensor is uploaded its checksum is computed on the device (`hs_checksum`) and
//! compared with the host's (the comparison and its error are in `gpu/checksum.rs`).

use super::{Arg, CHECKSUM_BLOCKS, Gpu, KernelFn};
use crate::gpu::arena::DeviceBuffer;
use crate::gpu::checksum::{Checksum, compare, host_checksum};
use crate::gpu::device::{DevicePtr, GpuError};
use crate::gpu::snapshot::ReadBandwidth;
use crate::gpu::stream::{LabelId, OpKind};
use std::time::{Duration, Instant};

impl Gpu {
    /// Takes the next staging buffer once its last op has finished.
    pub(super) fn staging_buffer(&mut self) -> Result<usize, GpuError> {
        let i = self.staging_next;
        self.staging_next = (i + 1) % self.staging.len();
        let last = self.staging[i].last_seq;
        let d = self.deadline();
        let r = self.stream.wait_for(self.backend.as_mut(), last, d);
        self.guard(r)?;
        Ok(i)
    }

    /// Copies host bytes into `dst` through pinned staging buffers, asynchronously; returns the
    /// seq of the last copy. The host slice may be dropped as soon as this returns.
    ///
    /// The chunks go in groups of half the staging buffers: a group's copies into pinned memory
    /// are made together, split over threads when large ([`par_copy`]), while the other half's
    /// chunks are still on their way to the device.
    pub fn upload(
        &mut self,
        label: LabelId,
        dst: DeviceBuffer,
        data: &[u8],
    ) -> Result<u64, GpuError> {
        self.check_alive()?;
        fits("upload", data.len(), dst)?;
        let chunk = self.cfg.staging_bytes.max(4096);
        let group = (self.staging.len() / 2).max(1);
        let mut last = self.stream.last_seq();
        let pieces: Vec<&[u8]> = data.chunks(chunk).collect();
        for (g, grp) in pieces.chunks(group).enumerate() {
            let mut bufs = Vec::with_capacity(grp.len());
            for _ in grp {
                bufs.push(self.staging_buffer()?);
            }
            let mut hosts: Vec<&mut [u8]> = Vec::with_capacity(grp.len());
            for (&b, piece) in bufs.iter().zip(grp) {
                // SAFETY: the staging buffer holds `chunk` bytes and no op uses it (waited
                // above); each of the group's buffers is distinct, so the slices do not overlap.
                hosts.push(unsafe {
                    std::slice::from_raw_parts_mut(self.staging[b].mem.host, piece.len())
                });
            }
            par_copy(&mut hosts, grp);
            for (k, (&b, piece)) in bufs.iter().zip(grp).enumerate() {
                let host = self.staging[b].mem.host;
                let off = ((g * group + k) * chunk) as u64;
                // SAFETY: the pinned source is kept until this op's event completes (the buffer
                // is reused only after `staging_buffer` waited for it); dst range checked.
                let seq = unsafe { self.copy_up(label, dst.ptr.offset(off), host, piece.len()) }?;
                self.staging[b].last_seq = seq;
                last = seq;
            }
        }
        Ok(last)
    }

    /// One host → device copy of pinned or registered memory as a tracked op (its event
    /// recorded): its seq.
    ///
    /// # Safety
    /// `src` is pinned or registered and stays valid until the op completes; `dst` holds `len`
    /// bytes.
    pub(super) unsafe fn copy_up(
        &mut self,
        label: LabelId,
        dst: crate::gpu::device::DevicePtr,
        src: *const u8,
        len: usize,
    ) -> Result<u64, GpuError> {
        let seq = self.enqueue_traced(
            OpKind::CopyH2D,
            label,
            None,
            len as u64,
            false,
            |be, _, _| {
                // SAFETY: the caller's contract.
                unsafe { be.copy_h2d(dst, src, len) }
            },
        )?;
        let d = self.deadline();
        let r = self.stream.record_event(self.backend.as_mut(), d);
        self.guard(r)?;
        Ok(seq)
    }

    /// One crossing of a model split over GPUs, peer to peer: `bytes` of `src` here into `dst`
    /// on `to`. Where the runtime and the link allow it (`enable_peer`, asked once per pair), an
    /// op on this stream records the event `to`'s stream waits on, and the copy is an op on
    /// `to`'s stream (both labelled by the caller: `cross GPU 0 → GPU 1`); the host waits for
    /// neither. `Ok(false)`: no peer copy between these two (the caller goes through the host).
    pub fn send_to_peer(
        &mut self,
        label: LabelId,
        src: DeviceBuffer,
        to: &mut Gpu,
        to_label: LabelId,
        dst: DeviceBuffer,
        bytes: usize,
    ) -> Result<bool, GpuError> {
        self.check_alive()?;
        to.check_alive()?;
        fits("peer copy", bytes, src)?;
        fits("peer copy", bytes, dst)?;
        let (Some(me), Some(_)) = (self.backend.peer_id(), to.backend.peer_id()) else {
            return Ok(false);
        };
        if self.kind() != to.kind() {
            return Ok(false);
        }
        let ordinal = self.info().ordinal;
        let allowed = match to.peers.get(&me) {
            Some(&a) => a,
            None => {
                let r = to.backend.enable_peer(me, ordinal);
                let a = to.guard(r)?;
                to.peers.insert(me, a);
                a
            }
        };
        if !allowed {
            return Ok(false);
        }
        let ev = match self.peer_event {
            Some(e) => e,
            None => {
                let r = self.backend.create_event();
                let e = self.guard(r)?;
                self.peer_event = Some(e);
                e
            }
        };
        self.enqueue_traced(
            OpKind::CopyD2D,
            label,
            None,
            bytes as u64,
            false,
            |be, _, _| {
                // SAFETY: a live event of this device.
                unsafe { be.record_event(ev) }
            },
        )?;
        // A copy writes no breadcrumb: the stream's own event shows when it is done (the
        // sender may do nothing more this step, and must not look in flight meanwhile).
        let d = self.deadline();
        let r = self.stream.record_event(self.backend.as_mut(), d);
        self.guard(r)?;
        let back = match to.peer_event {
            Some(e) => e,
            None => {
                let r = to.backend.create_event();
                let e = to.guard(r)?;
                to.peer_event = Some(e);
                e
            }
        };
        to.enqueue_traced(
            OpKind::CopyD2D,
            to_label,
            None,
            bytes as u64,
            false,
            |be, _, _| {
                // SAFETY: the event was recorded just above; both ranges were checked; the sender
                // writes `src` again only after waiting for `back` (below).
                unsafe {
                    be.wait_event(ev)?;
                    be.copy_from_peer(dst.ptr, me, src.ptr, bytes)?;
                    be.record_event(back)
                }
            },
        )?;
        let d = to.deadline();
        let r = to.stream.record_event(to.backend.as_mut(), d);
        to.guard(r)?;
        // The sender's later ops (the next batch overwriting `src`) wait for the copy, on the
        // device: the host waits for nothing.
        // SAFETY: `back` was recorded just above on the receiving stream.
        let r = unsafe { self.backend.wait_event(back) };
        self.guard(r)?;
        Ok(true)
    }

    /// Copies `out.len()` bytes from `src` to the host, waiting (with the configured deadline)
    /// for the copy: the one synchronisation point of a decode step. A large one (a split
    /// prompt's activations) has up to every staging buffer's chunk on its way at once, each
    /// copied out as it lands.
    pub fn download(
        &mut self,
        label: LabelId,
        src: DeviceBuffer,
        out: &mut [u8],
    ) -> Result<(), GpuError> {
        self.check_alive()?;
        fits("download", out.len(), src)?;
        let chunk = self.cfg.staging_bytes.max(4096);
        let ahead = self.staging.len().max(1);
        // (staging buffer, seq of its copy, the piece it fills)
        let mut landing: std::collections::VecDeque<(usize, u64, &mut [u8])> = Default::default();
        for (i, piece) in out.chunks_mut(chunk).enumerate() {
            if landing.len() == ahead
                && let Some((b, seq, to)) = landing.pop_front()
            {
                self.land(b, seq, to)?;
            }
            // The round-robin's next buffer is the oldest, copied out just above.
            let b = self.staging_buffer()?;
            let host = self.staging[b].mem.host;
            let len = piece.len();
            let off = (i * chunk) as u64;
            let seq = self.enqueue_traced(
                OpKind::CopyD2H,
                label,
                None,
                len as u64,
                false,
                |be, _, _| {
                    // SAFETY: pinned destination, idle (waited above); src range checked.
                    unsafe { be.copy_d2h(host, src.ptr.offset(off), len) }
                },
            )?;
            self.staging[b].last_seq = seq;
            landing.push_back((b, seq, piece));
        }
        while let Some((b, seq, to)) = landing.pop_front() {
            self.land(b, seq, to)?;
        }
        Ok(())
    }

    /// Waits for the copy `seq` into staging buffer `b` and copies it out into `to`.
    fn land(&mut self, b: usize, seq: u64, to: &mut [u8]) -> Result<(), GpuError> {
        let d = self.deadline();
        let r = self.stream.wait_for(self.backend.as_mut(), seq, d);
        self.guard(r)?;
        self.trace_harvest()?;
        // SAFETY: the copy into the staging buffer has completed; nothing writes it until this
        // buffer is taken again, which is after this returns.
        let from =
            unsafe { std::slice::from_raw_parts(self.staging[b].mem.host as *const u8, to.len()) };
        par_copy(&mut [to], &[from]);
        Ok(())
    }
}

/// Fewest bytes of a copy split over threads: the threads are spawned for each copy, which only
/// a copy of several megabytes repays. (At 1 MiB, Gemma 3's logits — 262,144 floats, downloaded
/// every decode step — landed through eight freshly spawned threads a token: 278 µs of a 2.1 ms
/// step on the H100, docs/runs/gpu-2026-12-06-evening.md.)
const PAR_COPY_MIN: usize = 8 << 20;

/// Copies each of `src` into the `dst` of the same index (of its length), split over half the
/// cores (two to eight threads) when there are [`PAR_COPY_MIN`] bytes or more: a weight streamed
/// up for op offload (`model/split/`) is read from a memory-mapped file, and one core's copy into
/// pinned memory, not the bus, is what bounds it (about 16 GB/s with four threads on the H100's
/// host).
fn par_copy(dst: &mut [&mut [u8]], src: &[&[u8]]) {
    let total: usize = src.iter().map(|s| s.len()).sum();
    let threads = if total >= PAR_COPY_MIN {
        std::thread::available_parallelism().map_or(2, |n| (n.get() / 2).clamp(2, 8))
    } else {
        1
    };
    // Each buffer in pieces of about total / threads bytes.
    let per = total.div_ceil(threads).max(4096);
    let mut jobs: Vec<(&mut [u8], &[u8])> = Vec::new();
    for (d, s) in dst.iter_mut().zip(src) {
        for (a, b) in d.chunks_mut(per).zip(s.chunks(per)) {
            jobs.push((a, b));
        }
    }
    if jobs.len() <= 1 || threads <= 1 {
        for (a, b) in jobs {
            a.copy_from_slice(b);
        }
        return;
    }
    let first = jobs.pop();
    std::thread::scope(|sc| {
        for (a, b) in jobs {
            sc.spawn(move || a.copy_from_slice(b));
        }
        if let Some((a, b)) = first {
            a.copy_from_slice(b);
        }
    });
}

impl Gpu {
    /// Copies host bytes from ordinary (pageable) memory straight into `dst`, with no staging,
    /// and waits for the copy. Not a path hipscope's own uploads take: `doctor` uses it to check
    /// the runtime's pageable copies, which the silent-zero reports involve.
    pub fn upload_pageable(
        &mut self,
        label: LabelId,
        dst: DeviceBuffer,
        data: &[u8],
    ) -> Result<(), GpuError> {
        self.check_alive()?;
        fits("upload", data.len(), dst)?;
        let (src, len) = (data.as_ptr(), data.len());
        let seq = self.enqueue(OpKind::CopyH2D, label, None, |be, _, _| {
            // SAFETY: `data` is borrowed until the wait below has seen the copy finish.
            unsafe { be.copy_h2d_pageable(dst.ptr, src, len) }
        })?;
        let d = self.deadline();
        let r = self.stream.wait_for(self.backend.as_mut(), seq, d);
        self.guard(r)
    }

    /// Copies `out.len()` bytes from `src` straight into ordinary (pageable) host memory, with
    /// no staging, waiting for the copy; see [`Gpu::upload_pageable`].
    pub fn download_pageable(
        &mut self,
        label: LabelId,
        src: DeviceBuffer,
        out: &mut [u8],
    ) -> Result<(), GpuError> {
        self.check_alive()?;
        fits("download", out.len(), src)?;
        let (dst, len) = (out.as_mut_ptr(), out.len());
        let seq = self.enqueue(OpKind::CopyD2H, label, None, |be, _, _| {
            // SAFETY: `out` is borrowed, and not read, until the wait below has seen the copy
            // finish.
            unsafe { be.copy_d2h_pageable(dst, src.ptr, len) }
        })?;
        let d = self.deadline();
        let r = self.stream.wait_for(self.backend.as_mut(), seq, d);
        self.guard(r)
    }
}

impl Gpu {
    /// Computes the checksum of the first `len` bytes of `buf` on the device.
    pub fn device_checksum(
        &mut self,
        tensor: &str,
        buf: DeviceBuffer,
        len: u64,
    ) -> Result<Checksum, GpuError> {
        if len > buf.bytes {
            return Err(GpuError::InvalidArgument(format!(
                "checksum of {len} bytes over a buffer of {}",
                buf.bytes
            )));
        }
        if !buf.ptr.0.is_multiple_of(4) {
            return Err(GpuError::InvalidArgument(format!(
                "checksum needs a 4-byte aligned buffer ({tensor} is at {:#x})",
                buf.ptr.0
            )));
        }
        let scratch = self
            .verify_scratch()
            .ok_or_else(|| GpuError::InvalidArgument("no arena yet: nowhere to checksum".into()))?;
        let f = self.function("hs_checksum")?;
        let label = self.label(&format!("verify · {tensor}"));
        self.launch(
            label,
            f,
            [CHECKSUM_BLOCKS, 1, 1],
            [256, 1, 1],
            0,
            &[buf.into(), Arg::U64(len), scratch.into()],
        )?;
        let mut partials = vec![0u8; CHECKSUM_BLOCKS as usize * 16];
        self.download(label, scratch, &mut partials)?;
        let mut c = Checksum::default();
        for p in partials.chunks_exact(16) {
            let mut s = [0u8; 8];
            s.copy_from_slice(&p[..8]);
            c.sum = c.sum.wrapping_add(u64::from_le_bytes(s));
            s.copy_from_slice(&p[8..]);
            c.nonzero_words += u64::from_le_bytes(s);
        }
        Ok(c)
    }

    /// Checks that `buf` holds `data`, naming `tensor` if not.
    pub fn verify_tensor(
        &mut self,
        tensor: &str,
        buf: DeviceBuffer,
        data: &[u8],
    ) -> Result<(), GpuError> {
        let device = self.device_checksum(tensor, buf, data.len() as u64)?;
        let host = host_checksum(data);
        compare(tensor, data.len() as u64, host, device).map_err(GpuError::from)
    }

    /// Uploads one named tensor and, unless verification is off, checks it on the device.
    pub fn upload_tensor(
        &mut self,
        tensor: &str,
        dst: DeviceBuffer,
        data: &[u8],
    ) -> Result<(), GpuError> {
        let label = self.label(&format!("upload · {tensor}"));
        self.upload(label, dst, data)?;
        if self.config().verify_uploads {
            self.verify_tensor(tensor, dst, data)?;
        }
        Ok(())
    }
}

/// Bytes the read-bandwidth probe streams through per launch: well beyond every GPU's last-level
/// cache (an H200's L2 is 50 MiB, an MI300X's Infinity Cache 256 MiB), so that the figure is the
/// memory's, not the cache's.
pub const READ_PROBE_BYTES: u64 = 1 << 30;
/// Launches per timed run (about 2 ms on an H200, 50 ms on an iGPU: long beside the events'
/// resolution).
const READ_PROBE_LAUNCHES: u32 = 10;
/// Timed runs; the fastest counts (the others paid for clocks ramping up or another process).
pub const READ_PROBE_RUNS: usize = 5;
/// What the probe's fold is compared with: the buffer is filled with one word, so the fold is 0.
const READ_PROBE_NEVER: u64 = 0x9E37_79B9_7F4A_7C15;

impl Gpu {
    /// Device memory read bandwidth: `hs_read_bw`, a kernel that only reads, streams a buffer of
    /// [`READ_PROBE_BYTES`] (a quarter of the free memory at most) outside the arena, ten
    /// launches per run timed by the device's own events (the host's clock where the runtime has
    /// none), best of [`READ_PROBE_RUNS`] runs. The ceiling on decode speed `bench` compares
    /// with: decoding reads the weights and writes next to nothing, so a copy's rate (read plus
    /// write, `doctor`) is not the figure. The buffer is freed before it returns.
    pub fn measure_read_bandwidth(&mut self) -> Result<ReadBandwidth, GpuError> {
        self.check_alive()?;
        let free = self.mem_info()?.free;
        let bytes = READ_PROBE_BYTES.min(free / 4) & !0xFFFF;
        if bytes < (64 << 20) {
            return Err(GpuError::InvalidArgument(format!(
                "{free} bytes free: too little to measure bandwidth"
            )));
        }
        let read = self.function("hs_read_bw")?;
        let fill = self.function("hs_fill_u32")?;
        // The buffer, and 256 bytes after it for the kernel's (never written) result.
        let r = self.backend.malloc(bytes + 256);
        let buf = self.guard(r)?;
        let r = self.read_probe(buf, bytes, read, fill);
        if self.wait_idle(Duration::from_secs(30)).is_ok() {
            // SAFETY: every op that used it has finished.
            let _ = unsafe { self.backend.free(buf) };
        }
        r
    }

    fn read_probe(
        &mut self,
        buf: DevicePtr,
        bytes: u64,
        read: KernelFn,
        fill: KernelFn,
    ) -> Result<ReadBandwidth, GpuError> {
        let label = self.label("bandwidth · read");
        // Written once, so that every page is backed and no read is of the zero page.
        self.launch(
            label,
            fill,
            [1024, 1, 1],
            [256, 1, 1],
            0,
            &[Arg::Ptr(buf), Arg::U64(bytes / 4), Arg::U32(0x5A5A_5A5A)],
        )?;
        let args = [
            Arg::Ptr(buf),
            Arg::U64(bytes / 16),
            Arg::U64(READ_PROBE_NEVER),
            Arg::Ptr(DevicePtr(buf.0 + bytes)),
        ];
        // A warm-up launch (clocks up, code loaded).
        self.launch(label, read, [2048, 1, 1], [256, 1, 1], 0, &args)?;
        self.wait_idle(Duration::from_secs(30))?;
        let events = match (
            self.backend.create_timed_event(),
            self.backend.create_timed_event(),
        ) {
            (Ok(a), Ok(b)) => Some((a, b)),
            (a, b) => {
                for e in [a, b].into_iter().flatten() {
                    // SAFETY: created above, never recorded.
                    let _ = unsafe { self.backend.destroy_event(e) };
                }
                None
            }
        };
        let mut best = f64::INFINITY;
        let r = (|| {
            for _ in 0..READ_PROBE_RUNS {
                let t = Instant::now();
                if let Some((a, _)) = events {
                    // SAFETY: a timed event of this backend, not in flight (the stream is idle).
                    let r = unsafe { self.backend.record_event(a) };
                    self.guard(r)?;
                }
                for _ in 0..READ_PROBE_LAUNCHES {
                    self.launch(label, read, [2048, 1, 1], [256, 1, 1], 0, &args)?;
                }
                if let Some((_, b)) = events {
                    // SAFETY: as above.
                    let r = unsafe { self.backend.record_event(b) };
                    self.guard(r)?;
                }
                self.wait_idle(Duration::from_secs(60))?;
                let host = t.elapsed().as_secs_f64();
                let secs = events
                    .and_then(|(a, b)| self.backend.event_elapsed_ms(a, b).ok())
                    .map_or(host, |ms| ms as f64 / 1e3);
                best = best.min(secs);
            }
            Ok::<(), GpuError>(())
        })();
        if let Some((a, b)) = events {
            for e in [a, b] {
                // SAFETY: the stream is idle (or failed): nothing will record or read it again.
                let _ = unsafe { self.backend.destroy_event(e) };
            }
        }
        r?;
        Ok(ReadBandwidth {
            bytes_per_s: (READ_PROBE_LAUNCHES as u64 * bytes) as f64 / best.max(1e-9),
            buffer_bytes: bytes,
            runs: READ_PROBE_RUNS,
        })
    }
}

/// A copy of `len` bytes fits the device buffer it reads or writes.
fn fits(what: &str, len: usize, buf: DeviceBuffer) -> Result<(), GpuError> {
    if len as u64 > buf.bytes {
        return Err(GpuError::InvalidArgument(format!(
            "{what} of {len} bytes does not fit a buffer of {} bytes",
            buf.bytes
        )));
    }
    Ok(())
}
