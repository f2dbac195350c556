//! Host memory the device reads in place: a range of memory the process already holds (a model
//! file's mapping) registered with the runtime (`Device::host_register`), so that an upload
//! from it is one asynchronous copy from where the bytes lie — no copy into pinned staging on
//! the host. Op offload streams a split model's CPU layers to GPU 0 this way (llama.cpp's
//! `GGML_CUDA_REGISTER_HOST` registers its mapped files likewise).

use std::sync::Arc;

use super::Gpu;
use crate::gpu::arena::DeviceBuffer;
use crate::gpu::device::GpuError;
use crate::gpu::stream::LabelId;

/// Memory whose owner the registration keeps alive: a model file's mapping, say.
pub type HostBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// One registered range: its first byte, its length, and what keeps it mapped.
pub(super) struct Registered {
    pub(super) at: usize,
    pub(super) len: usize,
    _keep: HostBytes,
}

/// The largest piece of an in-place upload, one op each (so that the Streams panel and the
/// watchdog see a long upload's progress, as they see the staged path's chunks).
const PIECE: usize = 64 << 20;

impl Gpu {
    /// Registers bytes `range` of `keep` (widened to whole pages within it) for in-place
    /// uploads; `Ok(false)` where the runtime cannot, or the range is empty. Already registered:
    /// `Ok(true)`. The registration and `keep` last until teardown.
    pub fn register_host(
        &mut self,
        keep: HostBytes,
        range: std::ops::Range<usize>,
    ) -> Result<bool, GpuError> {
        self.check_alive()?;
        let bytes = (*keep).as_ref();
        let Some(slice) = bytes.get(range.clone()).filter(|s| !s.is_empty()) else {
            return Ok(false);
        };
        if self.registered_holds(slice) {
            return Ok(true);
        }
        let base = bytes.as_ptr() as usize;
        let page = page_size();
        let start = (slice.as_ptr() as usize / page * page).max(base);
        let end = (slice.as_ptr() as usize + slice.len())
            .next_multiple_of(page)
            .min(base + bytes.len());
        // SAFETY: [start, end) lies within `keep`'s bytes, which `Registered` keeps alive until
        // teardown unregisters it.
        let r = unsafe { self.backend.host_register(start as *const u8, end - start) };
        if !self.guard(r)? {
            return Ok(false);
        }
        self.registered.push(Registered {
            at: start,
            len: end - start,
            _keep: keep.clone(),
        });
        Ok(true)
    }

    fn registered_holds(&self, data: &[u8]) -> bool {
        let (a, n) = (data.as_ptr() as usize, data.len());
        self.registered
            .iter()
            .any(|r| a >= r.at && a + n <= r.at + r.len)
    }

    /// Uploads `data` into `dst` straight from where it lies when it lies in registered memory
    /// (`Some`: the seq of the last copy; the registration keeps it alive), else `None` and
    /// nothing is enqueued (the caller stages it: [`Gpu::upload`]).
    pub fn upload_in_place(
        &mut self,
        label: LabelId,
        dst: DeviceBuffer,
        data: &[u8],
    ) -> Result<Option<u64>, GpuError> {
        self.check_alive()?;
        if data.is_empty() || !self.registered_holds(data) {
            return Ok(None);
        }
        if data.len() as u64 > dst.bytes {
            return Err(GpuError::InvalidArgument(format!(
                "upload of {} bytes into a buffer of {}",
                data.len(),
                dst.bytes
            )));
        }
        let mut last = self.stream.last_seq();
        for (i, piece) in data.chunks(PIECE).enumerate() {
            let to = dst.ptr.offset((i * PIECE) as u64);
            // SAFETY: the source is registered and kept alive until teardown, which drains the
            // stream first; the destination range was checked above.
            last = unsafe { self.copy_up(label, to, piece.as_ptr(), piece.len()) }?;
        }
        Ok(Some(last))
    }

    /// Teardown's part: every registration undone (the stream drained before).
    pub(super) fn unregister_all(&mut self) -> Result<(), String> {
        for r in self.registered.drain(..) {
            // SAFETY: registered by `register_host`; the stream is drained, so no copy reads it.
            unsafe { self.backend.host_unregister(r.at as *const u8) }
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    }
}
