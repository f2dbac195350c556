//! The device-memory arena: one large allocation per named region, made once at model load and
//! sized from a plan, then sub-allocated with alignment. Nothing is allocated from the device
//! while generating: many small `hipMalloc`s are what hangs RDNA3 with MES firmware 0x83
//! (ROCm/ROCm#5590, #5724), and `hipMallocAsync` pools have open deadlock reports.

use crate::gpu::device::{Device, DevicePtr, GpuError, MemInfo, human_bytes};
use crate::gpu::snapshot::{ArenaSnapshot, RegionSnapshot};

/// Sub-allocation alignment: enough for every vector load and for rocBLAS/cuBLAS workspaces.
pub const ALIGN: u64 = 256;

/// A named part of the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Region {
    Weights,
    KvCache,
    Activations,
    /// BLAS workspace, verification scratch, device-side constants.
    Workspace,
}

impl Region {
    pub const ALL: [Region; 4] = [
        Region::Weights,
        Region::KvCache,
        Region::Activations,
        Region::Workspace,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Region::Weights => "weights",
            Region::KvCache => "kv_cache",
            Region::Activations => "activations",
            Region::Workspace => "workspace",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// How much each region needs, from the model plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArenaPlan {
    bytes: [u64; 4],
}

impl ArenaPlan {
    pub fn new() -> ArenaPlan {
        ArenaPlan::default()
    }

    /// Adds room for one allocation of `bytes` (rounded up to the alignment) to `region`.
    pub fn add(&mut self, region: Region, bytes: u64) -> &mut Self {
        let b = &mut self.bytes[region.index()];
        *b = b.saturating_add(align_up(bytes, ALIGN));
        self
    }

    pub fn with(mut self, region: Region, bytes: u64) -> Self {
        self.add(region, bytes);
        self
    }

    pub fn size(&self, region: Region) -> u64 {
        self.bytes[region.index()]
    }

    pub fn total(&self) -> u64 {
        self.bytes.iter().fold(0u64, |a, b| a.saturating_add(*b))
    }

    /// `weights 94.1 MiB, kv_cache 30.0 MiB, …`
    pub fn breakdown(&self) -> String {
        Region::ALL
            .iter()
            .filter(|r| self.size(**r) > 0)
            .map(|r| format!("{} {}", r.name(), human_bytes(self.size(*r))))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Refuses, with the numbers, a plan the device cannot hold (before anything is allocated).
    /// `reserve` is left free for the runtime itself (code objects, BLAS handles, scratch).
    pub fn check_fits(&self, mem: MemInfo, reserve: u64, device: &str) -> Result<(), GpuError> {
        let needed = self.total().saturating_add(reserve);
        if needed > mem.free {
            return Err(GpuError::InsufficientMemory {
                device: device.to_string(),
                needed,
                free: mem.free,
                total: mem.total,
                breakdown: format!(
                    "{}, runtime reserve {}",
                    self.breakdown(),
                    human_bytes(reserve)
                ),
            });
        }
        Ok(())
    }
}

pub fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a).saturating_mul(a)
}

/// A sub-allocation. Plain data: valid until freed or until the arena is released.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceBuffer {
    pub ptr: DevicePtr,
    pub bytes: u64,
    pub region: Region,
    offset: u64,
    reserved: u64,
}

impl DeviceBuffer {
    /// A view of `len` bytes from `offset` (checked).
    pub fn slice(&self, offset: u64, len: u64) -> Result<DeviceBuffer, GpuError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.bytes => Ok(DeviceBuffer {
                ptr: self.ptr.offset(offset),
                bytes: len,
                region: self.region,
                offset: self.offset + offset,
                reserved: 0,
            }),
            _ => Err(GpuError::InvalidArgument(format!(
                "slice {offset}+{len} outside a buffer of {} bytes",
                self.bytes
            ))),
        }
    }
}

/// First-fit allocator over one region's offsets, with coalescing frees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionAlloc {
    capacity: u64,
    /// Free ranges (offset, len), sorted by offset, never adjacent.
    free: Vec<(u64, u64)>,
    used: u64,
    high_water: u64,
}

impl RegionAlloc {
    pub fn new(capacity: u64) -> RegionAlloc {
        RegionAlloc {
            capacity,
            free: if capacity > 0 {
                vec![(0, capacity)]
            } else {
                Vec::new()
            },
            used: 0,
            high_water: 0,
        }
    }

    /// Reserves `bytes` (rounded up to `ALIGN`) at an `ALIGN`ed offset; returns (offset, len).
    pub fn alloc(&mut self, bytes: u64) -> Option<(u64, u64)> {
        let len = align_up(bytes.max(1), ALIGN);
        let i = self.free.iter().position(|&(_, l)| l >= len)?;
        let (off, l) = self.free[i];
        if l == len {
            self.free.remove(i);
        } else {
            self.free[i] = (off + len, l - len);
        }
        self.used += len;
        self.high_water = self.high_water.max(self.used);
        Some((off, len))
    }

    /// Returns a range from `alloc`.
    pub fn release(&mut self, off: u64, len: u64) {
        let i = self.free.partition_point(|&(o, _)| o < off);
        self.free.insert(i, (off, len));
        self.used = self.used.saturating_sub(len);
        // Merge with the next, then the previous neighbour.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }

    /// Frees everything (for per-step scratch).
    pub fn reset(&mut self) {
        self.free = if self.capacity > 0 {
            vec![(0, self.capacity)]
        } else {
            Vec::new()
        };
        self.used = 0;
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn high_water(&self) -> u64 {
        self.high_water
    }

    pub fn largest_free(&self) -> u64 {
        self.free.iter().map(|f| f.1).max().unwrap_or(0)
    }
}

struct RegionMem {
    base: DevicePtr,
    alloc: RegionAlloc,
}

/// The arena: its regions' device memory and their allocators.
pub struct Arena {
    regions: [Option<RegionMem>; 4],
    /// Device allocations the arena itself made (its own count; the backend counts too).
    device_allocations: u64,
    /// Device free memory just before the arena was allocated.
    free_before: u64,
    pinned_host_bytes: u64,
}

impl Arena {
    /// Checks the plan against free memory, then makes one device allocation per non-empty
    /// region. On failure, frees what it made and returns the error.
    pub fn create(
        backend: &mut dyn Device,
        plan: &ArenaPlan,
        reserve: u64,
    ) -> Result<Arena, GpuError> {
        let mem = backend.mem_info()?;
        plan.check_fits(mem, reserve, &backend.info().name)?;
        let mut regions: [Option<RegionMem>; 4] = [None, None, None, None];
        let mut made = 0;
        for r in Region::ALL {
            let size = plan.size(r);
            if size == 0 {
                continue;
            }
            match backend.malloc(size) {
                Ok(base) => {
                    made += 1;
                    regions[r.index()] = Some(RegionMem {
                        base,
                        alloc: RegionAlloc::new(size),
                    });
                }
                Err(e) => {
                    for m in regions.iter().flatten() {
                        // SAFETY: allocated just above; nothing uses it yet.
                        let _ = unsafe { backend.free(m.base) };
                    }
                    return Err(e);
                }
            }
        }
        Ok(Arena {
            regions,
            device_allocations: made,
            free_before: mem.free,
            pinned_host_bytes: 0,
        })
    }

    pub fn alloc(&mut self, region: Region, bytes: u64) -> Result<DeviceBuffer, GpuError> {
        let Some(m) = self.regions[region.index()].as_mut() else {
            return Err(GpuError::ArenaFull {
                region: region.name(),
                requested: bytes,
                largest_free: 0,
                capacity: 0,
            });
        };
        match m.alloc.alloc(bytes) {
            Some((off, len)) => Ok(DeviceBuffer {
                ptr: m.base.offset(off),
                bytes,
                region,
                offset: off,
                reserved: len,
            }),
            None => Err(GpuError::ArenaFull {
                region: region.name(),
                requested: bytes,
                largest_free: m.alloc.largest_free(),
                capacity: m.alloc.capacity(),
            }),
        }
    }

    /// Returns a buffer from `alloc` (views from `slice` are ignored).
    pub fn free(&mut self, buf: DeviceBuffer) {
        if buf.reserved == 0 {
            return;
        }
        if let Some(m) = self.regions[buf.region.index()].as_mut() {
            m.alloc.release(buf.offset, buf.reserved);
        }
    }

    /// Frees every buffer of a region at once (scratch reused each step).
    pub fn reset(&mut self, region: Region) {
        if let Some(m) = self.regions[region.index()].as_mut() {
            m.alloc.reset();
        }
    }

    pub fn device_allocations(&self) -> u64 {
        self.device_allocations
    }

    pub fn capacity(&self) -> u64 {
        self.regions
            .iter()
            .flatten()
            .map(|m| m.alloc.capacity())
            .sum()
    }

    pub(crate) fn set_pinned_host_bytes(&mut self, b: u64) {
        self.pinned_host_bytes = b;
    }

    /// A snapshot for the UI. `mem` is the device's current free/total, if just read.
    pub fn snapshot(&self, mem: Option<MemInfo>) -> ArenaSnapshot {
        let cap = self.capacity();
        let used: u64 = self.regions.iter().flatten().map(|m| m.alloc.used()).sum();
        let hw: u64 = self
            .regions
            .iter()
            .flatten()
            .map(|m| m.alloc.high_water())
            .sum();
        ArenaSnapshot {
            kind: "device".into(),
            capacity: cap,
            used,
            high_water: hw,
            regions: Region::ALL
                .iter()
                .filter_map(|r| {
                    self.regions[r.index()].as_ref().map(|m| RegionSnapshot {
                        name: r.name().into(),
                        capacity: m.alloc.capacity(),
                        used: m.alloc.used(),
                    })
                })
                .collect(),
            largest_free: self
                .regions
                .iter()
                .flatten()
                .map(|m| m.alloc.largest_free())
                .max()
                .unwrap_or(0),
            device_allocations: self.device_allocations,
            // What the device lost beyond the arena since just before it was made: the runtime's
            // own allocations (code objects, BLAS handles, event pool, scratch).
            runtime_overhead: mem
                .map(|m| self.free_before.saturating_sub(m.free).saturating_sub(cap)),
            device_total: mem.map(|m| m.total),
            device_free: mem.map(|m| m.free),
            pinned_host_bytes: self.pinned_host_bytes,
            split: None,
        }
    }

    /// Frees the regions' device memory (teardown, after the stream drained).
    ///
    /// # Safety
    /// Nothing in flight uses arena memory, and no `DeviceBuffer` is used afterwards.
    pub unsafe fn release(mut self, backend: &mut dyn Device) -> Result<(), GpuError> {
        let mut first_err = None;
        for m in self.regions.iter_mut() {
            if let Some(m) = m.take() {
                // SAFETY: per this function's contract.
                if let Err(e) = unsafe { backend.free(m.base) }
                    && first_err.is_none()
                {
                    first_err = Some(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_rounds_each_allocation_to_the_alignment() {
        let mut p = ArenaPlan::new();
        p.add(Region::Weights, 1)
            .add(Region::Weights, 256)
            .add(Region::KvCache, 300);
        assert_eq!(p.size(Region::Weights), 512);
        assert_eq!(p.size(Region::KvCache), 512);
        assert_eq!(p.total(), 1024);
        assert_eq!(p.breakdown(), "weights 512 B, kv_cache 512 B");
    }

    #[test]
    fn a_plan_larger_than_free_memory_is_refused_with_the_numbers() {
        let p = ArenaPlan::new()
            .with(Region::Weights, 3 << 30)
            .with(Region::KvCache, 1 << 30);
        let mem = MemInfo {
            free: 4 << 30,
            total: 8 << 30,
        };
        assert!(p.check_fits(mem, 0, "gpu").is_ok());
        let e = p.check_fits(mem, 256 << 20, "Radeon RX 7600").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("4.2 GiB"), "{msg}");
        assert!(msg.contains("4.0 GiB free of 8.0 GiB"), "{msg}");
        assert!(msg.contains("weights 3.0 GiB"), "{msg}");
        assert!(msg.contains("Radeon RX 7600"), "{msg}");
    }

    #[test]
    fn region_allocator_aligns_reuses_and_coalesces() {
        let mut a = RegionAlloc::new(4096);
        let (o1, l1) = a.alloc(100).expect("a");
        let (o2, l2) = a.alloc(300).expect("b");
        let (o3, l3) = a.alloc(256).expect("c");
        assert_eq!((o1, l1, o2, l2, o3, l3), (0, 256, 256, 512, 768, 256));
        assert_eq!(a.used(), 1024);
        assert_eq!(a.largest_free(), 3072);
        a.release(o2, l2);
        assert_eq!(a.used(), 512);
        // First fit reuses the hole.
        assert_eq!(a.alloc(200), Some((256, 256)));
        a.release(256, 256);
        a.release(o1, l1);
        a.release(o3, l3);
        // Everything merged back into one block.
        assert_eq!(a.largest_free(), 4096);
        assert_eq!(a.high_water(), 1024);
        assert_eq!(a.alloc(4097), None);
        assert_eq!(a.alloc(4096), Some((0, 4096)));
        assert_eq!(a.alloc(1), None);
    }

    #[test]
    fn allocator_never_hands_out_overlapping_ranges() {
        // A deterministic pseudo-random alloc/free sequence checked against a byte map.
        let cap = 64 * ALIGN;
        let mut a = RegionAlloc::new(cap);
        let mut owner = vec![0u32; (cap / ALIGN) as usize];
        let mut live: Vec<(u64, u64, u32)> = Vec::new();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for id in 1..2000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x.is_multiple_of(3) && !live.is_empty() {
                let (o, l, who) = live.swap_remove((x as usize / 3) % live.len());
                for b in o / ALIGN..(o + l) / ALIGN {
                    assert_eq!(owner[b as usize], who);
                    owner[b as usize] = 0;
                }
                a.release(o, l);
            } else if let Some((o, l)) = a.alloc((x >> 8) % (6 * ALIGN) + 1) {
                assert_eq!(o % ALIGN, 0);
                for b in o / ALIGN..(o + l) / ALIGN {
                    assert_eq!(owner[b as usize], 0, "block {b} handed out twice");
                    owner[b as usize] = id;
                }
                live.push((o, l, id));
            }
            let used: u64 = live.iter().map(|l| l.1).sum();
            assert_eq!(a.used(), used);
        }
    }

    #[test]
    fn slices_stay_inside_their_buffer() {
        let b = DeviceBuffer {
            ptr: DevicePtr(0x1000),
            bytes: 64,
            region: Region::Weights,
            offset: 0,
            reserved: 256,
        };
        let s = b.slice(16, 48).expect("fits");
        assert_eq!(s.ptr, DevicePtr(0x1010));
        assert!(b.slice(16, 49).is_err());
        assert!(b.slice(u64::MAX, 2).is_err());
    }
}
