//! The checksum of verified uploads and the error a failed check reports (the `Gpu` side,
//! which runs `hs_checksum` on the device, is in `handle/transfer.rs`). After a tensor is uploaded, a checksum computed on the device (kernel
//! `hs_checksum`) is compared with the host's; a mismatch or a tensor that arrived as zeros names
//! the tensor and stops the load. This catches the gfx1151 "weights become zeros" failures
//! (llama.cpp #28211, #25863, #26543), where uploads from mmap-backed or pinned host memory
//! arrive empty without any error from the runtime.

/// The checksum both sides compute: over little-endian 32-bit words `w_i` (the last one
/// zero-padded), `sum = Σ w_i·(2i+1) mod 2⁶⁴` and the number of non-zero words. The position
/// weight catches swapped or shifted blocks, which a plain sum would not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Checksum {
    pub sum: u64,
    pub nonzero_words: u64,
}

/// The host side of the checksum (must match `kernels/checksum.hip`).
pub fn host_checksum(data: &[u8]) -> Checksum {
    let mut sum = 0u64;
    let mut nz = 0u64;
    let mut chunks = data.chunks_exact(4);
    let mut i = 0u64;
    for c in &mut chunks {
        let w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u64;
        sum = sum.wrapping_add(w.wrapping_mul(2 * i + 1));
        nz += (w != 0) as u64;
        i += 1;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut b = [0u8; 4];
        b[..rest.len()].copy_from_slice(rest);
        let w = u32::from_le_bytes(b) as u64;
        sum = sum.wrapping_add(w.wrapping_mul(2 * i + 1));
        nz += (w != 0) as u64;
    }
    Checksum {
        sum,
        nonzero_words: nz,
    }
}

/// Why an uploaded tensor was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error(
        "tensor {tensor} ({bytes} bytes) reads back as all zeros on the device although its data \
         is not zero. This is the 'weights become zeros' failure reported on gfx1151 \
         (llama.cpp #28211, #25863, #26543): an upload from mmap-backed or pinned host memory \
         arrived empty with no error from the runtime. The load stops here; `hipscope doctor` \
         repeats the check in isolation"
    )]
    ZeroedOnDevice { tensor: String, bytes: u64 },
    #[error(
        "tensor {tensor} ({bytes} bytes) is all zeros in the model data itself: the file is \
         damaged or was written wrongly"
    )]
    ZeroInSource { tensor: String, bytes: u64 },
    #[error(
        "tensor {tensor} ({bytes} bytes) differs on the device from the host (checksum \
         {device:#018x} vs {host:#018x}, non-zero words {device_nonzero} vs {host_nonzero}): \
         the upload was corrupted; the load stops here"
    )]
    Mismatch {
        tensor: String,
        bytes: u64,
        host: u64,
        device: u64,
        host_nonzero: u64,
        device_nonzero: u64,
    },
}

/// Compares the two checksums of one tensor.
pub fn compare(
    tensor: &str,
    bytes: u64,
    host: Checksum,
    device: Checksum,
) -> Result<(), VerifyError> {
    if bytes > 0 && host.nonzero_words == 0 {
        return Err(VerifyError::ZeroInSource {
            tensor: tensor.to_string(),
            bytes,
        });
    }
    if bytes > 0 && device.nonzero_words == 0 {
        return Err(VerifyError::ZeroedOnDevice {
            tensor: tensor.to_string(),
            bytes,
        });
    }
    if host != device {
        return Err(VerifyError::Mismatch {
            tensor: tensor.to_string(),
            bytes,
            host: host.sum,
            device: device.sum,
            host_nonzero: host.nonzero_words,
            device_nonzero: device.nonzero_words,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checksum written out term by term, as the kernel computes it.
    fn naive(data: &[u8]) -> Checksum {
        let mut padded = data.to_vec();
        while !padded.len().is_multiple_of(4) {
            padded.push(0);
        }
        let mut c = Checksum::default();
        for (i, w) in padded.chunks(4).enumerate() {
            let w = u32::from_le_bytes([w[0], w[1], w[2], w[3]]) as u128;
            c.sum = ((c.sum as u128 + w * (2 * i as u128 + 1)) % (1u128 << 64)) as u64;
            c.nonzero_words += (w != 0) as u64;
        }
        c
    }

    #[test]
    fn host_checksum_matches_the_formula_for_every_tail_length() {
        let data: Vec<u8> = (0..1031u32).map(|i| (i * 37 % 251) as u8).collect();
        for len in [0, 1, 2, 3, 4, 5, 1024, 1027, 1031] {
            assert_eq!(
                host_checksum(&data[..len]),
                naive(&data[..len]),
                "len {len}"
            );
        }
        assert_eq!(host_checksum(&[1, 0, 0, 0, 1, 0, 0, 0]).sum, 1 + 3);
    }

    #[test]
    fn swapped_words_change_the_checksum() {
        let a = [1u8, 0, 0, 0, 2, 0, 0, 0];
        let b = [2u8, 0, 0, 0, 1, 0, 0, 0];
        assert_ne!(host_checksum(&a), host_checksum(&b));
    }

    #[test]
    fn comparisons_name_the_tensor_and_the_failure() {
        let host = host_checksum(&[5, 0, 0, 0]);
        let zero = host_checksum(&[0, 0, 0, 0]);
        assert_eq!(compare("t", 4, host, host), Ok(()));
        let e = compare("blk.3.ffn_down.weight", 4, host, zero).unwrap_err();
        assert!(matches!(e, VerifyError::ZeroedOnDevice { .. }));
        assert!(e.to_string().contains("blk.3.ffn_down.weight"));
        assert!(e.to_string().contains("#28211"));
        assert!(matches!(
            compare("t", 4, zero, zero),
            Err(VerifyError::ZeroInSource { .. })
        ));
        let other = host_checksum(&[6, 0, 0, 0]);
        assert!(matches!(
            compare("t", 4, host, other),
            Err(VerifyError::Mismatch { .. })
        ));
    }
}
