//! The kernel stamps' layout, shared by the kernels (kernels/prelude.h `HS_STAMP_*`), the host's
//! reader (`trace/stamps.rs`, `trace/device.rs`) and the fake device: like the breadcrumb's
//! encoding (`graph.rs`), part of the stream's tracking contract with its kernels.

/// Set in a kernel's `hs_op` when it stamps itself (`HS_STAMP_OP`).
pub const STAMP_OP: u64 = 1 << 62;
/// Slots of the ring (`HS_STAMP_SLOTS`): more than the stream's in-flight table
/// (`stream::RING`), so a slot is free again once its op is read back.
pub const SLOTS: usize = 8192;
/// Word of the stamp block where the per-slot end words start (`HS_STAMP_ENDS`).
pub const ENDS_WORD: usize = 8;
/// Ops before a stamped kernel whose ends it hands over (`HS_STAMP_BEHIND`).
pub const BEHIND: u64 = 3;
/// Bytes of the stamp block in device memory: the header words, then an end word a slot.
pub const BLOCK_BYTES: u64 = ((ENDS_WORD + SLOTS) * 8) as u64;
/// Bytes of the host ring: a start and an end word a slot.
pub const RING_BYTES: usize = SLOTS * 16;

/// The host ring's slot of op `seq`.
pub fn slot(seq: u64) -> usize {
    (seq % SLOTS as u64) as usize
}

/// The stamp block's first words as the kernels read them: the host breadcrumb's and the host
/// ring's device addresses, the rest (and every end word) zero.
pub fn block_image(host_crumb: u64, host_ring: u64) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_BYTES as usize];
    b[..8].copy_from_slice(&host_crumb.to_le_bytes());
    b[8..16].copy_from_slice(&host_ring.to_le_bytes());
    b
}
