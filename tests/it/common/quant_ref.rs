//! Reference arithmetic shared by the CPU matrix-product tests (quant_matmul, quant_repack).

use hipscope::gpu::quant::dot::Activation;
use hipscope::gpu::quant::{self, GgmlType};

/// Q4_1/Q5_1 take llama.cpp's Q8_1 activation, whose sum term `s` is stored rounded to f16
/// rather than as d·Σq: what the kernels add beyond the dequantized activation is m·(s − d·Σq)
/// per block (m: the block's offset).
pub fn q8_1_excess(ty: GgmlType, q_row: &[u8], act: &Activation, t: usize) -> f64 {
    let bytes = match ty {
        GgmlType::Q4_1 => 20,
        GgmlType::Q5_1 => 24,
        _ => return 0.0,
    };
    let (qs, ds) = act.q8x32(t);
    q_row
        .chunks_exact(bytes)
        .zip(qs)
        .zip(ds)
        .map(|((b, a), ds)| {
            let m = quant::f16_to_f32(u16::from_le_bytes([b[2], b[3]])) as f64;
            let sum: i32 = a.qs.iter().map(|&v| v as i32).sum();
            m * (ds[1] as f64 - ds[0] as f64 * sum as f64)
        })
        .sum()
}
