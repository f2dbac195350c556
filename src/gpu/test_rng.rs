//! Test inputs for the kernel comparisons under `gpu/` (a layer that may not reach
//! `model::sampler`'s generator): a xorshift64* stream, uniform in [-1, 1).

/// A seeded stream of floats uniform in [-1, 1).
pub struct TestRng(u64);

impl TestRng {
    pub fn new(seed: u64) -> TestRng {
        TestRng(seed.max(1))
    }

    pub fn f(&mut self) -> f32 {
        let s = &mut self.0;
        *s ^= *s >> 12;
        *s ^= *s << 25;
        *s ^= *s >> 27;
        let r = s.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (r >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}
