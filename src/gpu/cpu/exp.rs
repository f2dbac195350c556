//! The softmax's exponentials, vectorizable: `libm`'s `expf` is a call per score, which at depth
//! (a prompt of n tokens takes n²/2 of them per head and layer) costs more than the dot products.
//!
//! exp(x) = 2^n · e^r with n = round(x / ln 2) and r = x − n·ln 2 in [−ln2/2, ln2/2], e^r by its
//! Taylor polynomial to degree 7 (truncation below 1e-8 relative, under f32 rounding), 2^n
//! put together in the exponent bits. Branch-free over plain arrays, so that the compiler turns
//! the loop into SIMD for whatever the build targets.

/// Arguments below this give e^−87 (e^−87.3 is the smallest normal f32).
const MIN_ARG: f32 = -87.0;

/// e^x for x ≤ 0 (the softmax's shifted scores), to within 2 units of f32 rounding; e^−87 (about
/// 1.6e-38, nothing beside the largest term's 1) for anything below −87.
#[inline(always)]
pub fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 in two parts, so that n·LN2_HI is exact for the |n| ≤ 126 used here.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // 1.5·2^23: adding and subtracting it rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(MIN_ARG, 0.0);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0 / 5040.0;
    let p = p * r + 1.0 / 720.0;
    let p = p * r + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    let p = p * r + 1.0;
    // n in −126..=0, so the exponent field n + 127 is a normal one.
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    p * scale
}

/// Replaces each score s by e^(s − max) and returns their sum (`max` must be ≥ every score).
#[inline(always)]
pub fn exp_shifted_sum(scores: &mut [f32], max: f32) -> f32 {
    let mut acc = [0f32; 8];
    let (main, rest) = scores.as_chunks_mut::<8>();
    for c in main {
        for (a, s) in acc.iter_mut().zip(c.iter_mut()) {
            *s = exp_nonpositive(*s - max);
            *a += *s;
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for s in rest {
        *s = exp_nonpositive(*s - max);
        sum += *s;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_libm_within_two_ulp_down_to_the_cutoff() {
        let mut worst = 0f64;
        let mut x = 0f32;
        while x > MIN_ARG {
            let want = (x as f64).exp();
            let got = exp_nonpositive(x) as f64;
            worst = worst.max((got - want).abs() / want);
            x -= 0.001_37;
        }
        assert!(worst < 2.5e-7, "worst relative error {worst}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(
            exp_nonpositive(-1000.0),
            0.0f32.max(exp_nonpositive(MIN_ARG))
        );
        assert!(exp_nonpositive(f32::NEG_INFINITY) < 1e-37);
    }

    #[test]
    fn shifted_sum_is_the_softmax_denominator() {
        let mut s: Vec<f32> = (0..21).map(|i| (i as f32 * 0.37).sin() * 5.0).collect();
        let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let want: f64 = s.iter().map(|&v| ((v - max) as f64).exp()).sum();
        let orig = s.clone();
        let sum = exp_shifted_sum(&mut s, max) as f64;
        assert!((sum - want).abs() / want < 1e-6, "{sum} vs {want}");
        for (e, o) in s.iter().zip(&orig) {
            let w = ((o - max) as f64).exp();
            assert!((*e as f64 - w).abs() / w < 3e-7);
        }
    }
}
