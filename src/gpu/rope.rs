//! YaRN, the RoPE scaling gpt-oss uses, as ggml computes it (`ggml_rope_yarn_corr_dims`,
//! `rope_yarn`): the CPU backend's rotation and the GPU launchers' arguments both come from here.

/// The YaRN part of RoPE, as llama.cpp passes it to `ggml_rope_ext`: `ext_factor` and the
/// correction dimensions `ggml_rope_yarn_corr_dims` computes from the original context and
/// `beta_fast`/`beta_slow`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub ext_factor: f32,
    pub corr_dims: [f32; 2],
}

impl Yarn {
    /// ggml's `ggml_rope_yarn_corr_dims` for `n_rot` rotated dimensions.
    pub fn new(n_rot: usize, n_ctx_orig: usize, base: f32, beta_fast: f32, beta_slow: f32) -> Yarn {
        let dim = |beta: f32| {
            n_rot as f32 * (n_ctx_orig as f32 / (beta * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        Yarn {
            ext_factor: 1.0,
            corr_dims: [
                dim(beta_fast).floor().max(0.0),
                dim(beta_slow).ceil().min(n_rot as f32 - 1.0),
            ],
        }
    }

    /// ggml's `rope_yarn` for pair `i` (dimension 2i): the angle from the extrapolated one
    /// (`theta_extrap`, unscaled position) and the cosine/sine scale.
    pub fn angle(&self, theta_extrap: f32, freq_scale: f32, i: usize) -> f32 {
        let interp = freq_scale * theta_extrap;
        let [lo, hi] = self.corr_dims;
        let y = (i as f32 - lo) / (hi - lo).max(0.001);
        let ramp = (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor;
        interp * (1.0 - ramp) + theta_extrap * ramp
    }

    /// The factor on cosines and sines: 1 + 0.1·ln(1/freq_scale).
    pub fn mscale(&self, freq_scale: f32) -> f32 {
        if self.ext_factor != 0.0 {
            1.0 + 0.1 * (1.0 / freq_scale).ln()
        } else {
            1.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Yarn;

    /// gpt-oss-20b's YaRN (64 rotated dimensions, original context 4096, base 150000, beta_fast
    /// 32, beta_slow 1): ggml's correction dimensions are floor(8.09) and ceil(17.40), worked out
    /// by hand from `ggml_rope_yarn_corr_dim`: 64·ln(4096 / (β·2π)) / (2·ln 150000).
    #[test]
    fn yarn_correction_dims_as_ggml() {
        let y = Yarn::new(64, 4096, 150_000.0, 32.0, 1.0);
        assert_eq!(y.corr_dims, [8.0, 18.0]);
        // Pairs below the first dimension keep the unscaled angle, those past the last the
        // interpolated one; the magnitude is 1 + 0.1·ln 32.
        assert_eq!(y.angle(3.0, 1.0 / 32.0, 2), 3.0);
        assert!((y.angle(3.0, 1.0 / 32.0, 20) - 3.0 / 32.0).abs() < 1e-7);
        assert!((y.mscale(1.0 / 32.0) - 1.346_574).abs() < 1e-5);
    }
}
