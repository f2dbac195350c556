//! The gated activations of the CPU reference as ggml writes them: GELU in its tanh form
//! (Gemma's feed-forward) and gpt-oss's clamped SwiGLU.

/// GELU in its tanh form, as ggml writes it (`ggml_gelu_f32`): 0.5·x·(1 + tanh(√(2/π)·x·(1 +
/// 0.044715·x²))).
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x)).tanh())
}

/// ggml's `swiglu_oai` (alpha 1.702, limit 7): x = min(gate, limit), y = clamp(up, ±limit),
/// x·σ(alpha·x)·(y + 1).
pub fn swiglu_oai(gate: f32, up: f32) -> f32 {
    const ALPHA: f32 = 1.702;
    const LIMIT: f32 = 7.0;
    let x = gate.min(LIMIT);
    let y = up.clamp(-LIMIT, LIMIT);
    x / (1.0 + (ALPHA * -x).exp()) * (y + 1.0)
}

#[cfg(test)]
mod tests {
    use super::swiglu_oai;

    /// ggml's `swiglu_oai`: the gate clamped above at 7, up to ±7, x·σ(1.702x)·(y + 1).
    #[test]
    fn swiglu_oai_clamps_as_ggml() {
        let sig = |v: f32| 1.0 / (1.0 + (-v).exp());
        assert!((swiglu_oai(10.0, -9.0) - 7.0 * sig(1.702 * 7.0) * -6.0).abs() < 1e-5);
        assert!((swiglu_oai(-2.0, 0.5) - -2.0 * sig(-3.404) * 1.5).abs() < 1e-6);
        assert!((swiglu_oai(1.0, 100.0) - sig(1.702) * 8.0).abs() < 1e-6);
    }
}
