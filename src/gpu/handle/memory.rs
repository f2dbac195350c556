//! Device memory of an opened device: the arena (created once, up front, then carved) and host
//! words (pinned host memory the device can read, flags a kernel polls).

use super::{CHECKSUM_BLOCKS, Gpu, HostWord};
use crate::gpu::arena::{Arena, ArenaPlan, DeviceBuffer, Region};
use crate::gpu::device::{BlasAvailability, DevicePtr, GpuError};

impl Gpu {
    /// `plan` with the workspace hipscope itself adds (scalars, checksum scratch, BLAS), and
    /// whether the BLAS workspace is in it.
    fn with_own_workspace(&self, plan: &ArenaPlan) -> (ArenaPlan, bool) {
        let blas = matches!(
            self.backend.blas_availability(),
            BlasAvailability::Present { .. }
        );
        let mut plan = *plan;
        plan.add(Region::Workspace, 256); // scalars
        plan.add(Region::Workspace, CHECKSUM_BLOCKS as u64 * 16);
        plan.add(Region::Workspace, super::graph::STEP_BLOCK_BYTES);
        plan.add(Region::Workspace, crate::gpu::trace::stamps::BLOCK_BYTES);
        if blas {
            plan.add(Region::Workspace, self.cfg.blas_workspace);
        }
        (plan, blas)
    }

    /// Device memory [`Gpu::create_arena`] would need free for `plan`: the arena with its own
    /// workspace, and the reserve left to the runtime (what its fit check compares).
    pub fn arena_needs(&self, plan: &ArenaPlan) -> u64 {
        self.with_own_workspace(plan)
            .0
            .total()
            .saturating_add(self.cfg.runtime_reserve)
    }

    /// Makes the arena for `plan` (plus the workspace hipscope itself needs), refusing up front
    /// if the device lacks the memory, then sets up the GEMM path.
    pub fn create_arena(&mut self, plan: &ArenaPlan) -> Result<(), GpuError> {
        self.check_alive()?;
        if self.arena.is_some() {
            return Err(GpuError::InvalidArgument("the arena already exists".into()));
        }
        let (plan, blas) = self.with_own_workspace(plan);
        let r = Arena::create(self.backend.as_mut(), &plan, self.cfg.runtime_reserve);
        let mut arena = self.guard(r)?;
        let pinned: u64 = self.staging.iter().map(|s| s.mem.bytes as u64).sum::<u64>()
            + self.crumb.as_ref().map_or(0, |c| c.bytes as u64);
        arena.set_pinned_host_bytes(pinned);
        let scalars = arena.alloc(Region::Workspace, 8)?;
        let scratch = arena.alloc(Region::Workspace, CHECKSUM_BLOCKS as u64 * 16)?;
        let step_block = arena.alloc(Region::Workspace, super::graph::STEP_BLOCK_BYTES)?;
        let stamp_block = arena.alloc(Region::Workspace, crate::gpu::trace::stamps::BLOCK_BYTES)?;
        let workspace = if blas {
            Some(arena.alloc(Region::Workspace, self.cfg.blas_workspace)?)
        } else {
            None
        };
        self.arena = Some(arena);
        self.scalars = Some(scalars);
        self.verify_scratch = Some(scratch);
        self.graphs.set_block(step_block);
        self.stamp_block = Some(stamp_block);
        let l = self.label("init · scalars 0.0, 1.0");
        let mut bytes = [0u8; 8];
        bytes[4..].copy_from_slice(&1.0f32.to_le_bytes());
        self.upload(l, scalars, &bytes)?;
        self.setup_gemm(workspace)?;
        Ok(())
    }

    pub(crate) fn verify_scratch(&self) -> Option<DeviceBuffer> {
        self.verify_scratch
    }

    pub fn alloc(&mut self, region: Region, bytes: u64) -> Result<DeviceBuffer, GpuError> {
        self.check_alive()?;
        self.arena
            .as_mut()
            .ok_or_else(|| GpuError::InvalidArgument("no arena: call create_arena first".into()))?
            .alloc(region, bytes)
    }

    pub fn free(&mut self, buf: DeviceBuffer) {
        if let Some(a) = self.arena.as_mut() {
            a.free(buf);
        }
    }

    pub fn reset_region(&mut self, region: Region) {
        if let Some(a) = self.arena.as_mut() {
            a.reset(region);
        }
    }

    /// A host word the device can read and write (zeroed). Freed at teardown.
    pub fn alloc_host_word(&mut self) -> Result<HostWord, GpuError> {
        self.check_alive()?;
        let r = self.backend.alloc_pinned(64, true);
        let p = self.guard(r)?;
        if p.device.is_none() {
            return Err(GpuError::InvalidArgument(
                "mapped memory without a device address".into(),
            ));
        }
        // SAFETY: 64 fresh bytes.
        unsafe { std::ptr::write_bytes(p.host, 0, 64) };
        self.host_words.push(p);
        Ok(HostWord(self.host_words.len() - 1))
    }

    /// The device address of a host word.
    pub fn host_word_device(&self, w: HostWord) -> Result<DevicePtr, GpuError> {
        self.host_words
            .get(w.0)
            .and_then(|p| p.device)
            .ok_or(GpuError::TornDown)
    }

    pub fn set_host_word(&self, w: HostWord, v: u32) -> Result<(), GpuError> {
        let p = self.host_words.get(w.0).ok_or(GpuError::TornDown)?;
        // SAFETY: live pinned memory (freed only by teardown, which consumes self); volatile
        // because the device reads it concurrently.
        unsafe { std::ptr::write_volatile(p.host as *mut u32, v) };
        Ok(())
    }

    pub fn host_word(&self, w: HostWord) -> Result<u32, GpuError> {
        let p = self.host_words.get(w.0).ok_or(GpuError::TornDown)?;
        // SAFETY: as in `set_host_word`.
        Ok(unsafe { std::ptr::read_volatile(p.host as *const u32) })
    }

    /// Device-side 0.0 (`[0]`) and 1.0 (`[1]`) for BLAS scalars in device pointer mode.
    pub fn scalar(&self, value: f32) -> Result<DevicePtr, GpuError> {
        let s = self
            .scalars
            .ok_or_else(|| GpuError::InvalidArgument("no arena yet".into()))?;
        if value == 0.0 {
            Ok(s.ptr)
        } else if value == 1.0 {
            Ok(s.ptr.offset(4))
        } else {
            Err(GpuError::InvalidArgument(format!(
                "no device constant {value}: upload it into the workspace region"
            )))
        }
    }
}
