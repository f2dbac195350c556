//! Token sampling, in llama.cpp's order: repeat penalty → top-k → top-p → min-p → temperature →
//! draw. Temperature 0 is greedy (the most likely token after the penalty).

use std::collections::VecDeque;

use crate::model::protocol::SamplerConfig;

/// xoshiro256** seeded through splitmix64: small, fast, and the same sequence on every platform,
/// so a seed reproduces a generation.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let r = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        r
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Approximately standard normal (sum of uniforms; enough for random weights).
    pub fn next_normal(&mut self) -> f32 {
        let s: f64 = (0..4).map(|_| self.next_f64()).sum();
        ((s - 2.0) * 3f64.sqrt()) as f32
    }
}

/// llama.cpp's "random seed" value.
pub const RANDOM_SEED: u64 = 0xFFFF_FFFF;

#[derive(Clone, Copy, Debug, PartialEq)]
struct Candidate {
    id: u32,
    logit: f32,
    p: f32,
}

/// Samples tokens from logits; keeps the recent-token window for the repeat penalty.
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Rng,
    recent: VecDeque<u32>,
    cands: Vec<Candidate>,
    /// [`Sampler::penalized`]'s list, kept for its allocation.
    pen: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Sampler {
        let seed = if cfg.seed == RANDOM_SEED {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        } else {
            cfg.seed
        };
        Sampler {
            rng: Rng::new(seed),
            cfg,
            recent: VecDeque::new(),
            cands: Vec::new(),
            pen: Vec::new(),
        }
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Forgets the recent tokens (a new conversation).
    pub fn reset(&mut self) {
        self.recent.clear();
    }

    /// Records a token that entered the context (prompt or generated), for the repeat penalty.
    pub fn accept(&mut self, tok: u32) {
        if self.cfg.repeat_last_n == 0 {
            return;
        }
        self.recent.push_back(tok);
        while self.recent.len() > self.cfg.repeat_last_n as usize {
            self.recent.pop_front();
        }
    }

    /// The recent tokens' logits after the repeat penalty, by id (distinct, ascending, within
    /// the vocabulary) into `self.pen`; empty without a penalty. As llama.cpp (and CTRL):
    /// positive logits shrink, negative ones grow.
    fn penalized(&mut self, logits: &[f32]) {
        self.pen.clear();
        let p = self.cfg.repeat_penalty;
        if p == 1.0 {
            return;
        }
        for &t in &self.recent {
            if let Some(&l) = logits.get(t as usize) {
                let l = logit_of(l);
                self.pen.push((t, if l > 0.0 { l / p } else { l * p }));
            }
        }
        self.pen.sort_unstable_by_key(|e| e.0);
        self.pen.dedup_by_key(|e| e.0);
    }

    /// Picks the next token from `logits` (one per vocabulary entry).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        self.sample_excluding(logits, &[])
    }

    /// [`Sampler::sample`] with the tokens of `excluded` never picked (`serve`'s `ignore_eos`:
    /// their logits as minus infinity, without a copy of the logits).
    pub fn sample_excluding(&mut self, logits: &[f32], excluded: &[u32]) -> u32 {
        self.penalized(logits);
        for &t in excluded {
            if (t as usize) < logits.len() {
                match self.pen.binary_search_by_key(&t, |e| e.0) {
                    Ok(i) => self.pen[i].1 = f32::NEG_INFINITY,
                    Err(i) => self.pen.insert(i, (t, f32::NEG_INFINITY)),
                }
            }
        }
        if self.cfg.temp <= 0.0 {
            return greedy(logits, &self.pen);
        }
        let k = self.cfg.top_k as usize;
        if k > 0 && k < logits.len() {
            top_k_into(&mut self.cands, logits, k, &self.pen);
        } else {
            self.cands.clear();
            self.cands
                .extend(logits.iter().enumerate().map(|(i, &l)| Candidate {
                    id: i as u32,
                    logit: logit_of(l),
                    p: 0.0,
                }));
            for &(id, l) in &self.pen {
                self.cands[id as usize].logit = l;
            }
        }
        let c = &self.cfg;
        self.cands.sort_unstable_by(desc);
        softmax(&mut self.cands, 1.0);
        if c.top_p < 1.0 {
            let mut cum = 0.0;
            let mut keep = self.cands.len();
            for (i, cand) in self.cands.iter().enumerate() {
                cum += cand.p;
                if cum >= c.top_p {
                    keep = i + 1;
                    break;
                }
            }
            self.cands.truncate(keep.max(1));
        }
        if c.min_p > 0.0
            && let Some(top) = self.cands.first().map(|c| c.p)
        {
            let floor = top * c.min_p;
            let keep = self.cands.iter().take_while(|x| x.p >= floor).count();
            self.cands.truncate(keep.max(1));
        }
        softmax(&mut self.cands, c.temp);
        draw(&self.cands, self.rng.next_f64() as f32)
    }
}

/// The candidate at `r` (in [0, 1)) of the probabilities' running sum. Where rounding leaves
/// the sum just under `r`, the least likely candidate with any probability: never one at minus
/// infinity (a token [`Sampler::sample_excluding`] excludes has p = 0).
fn draw(cands: &[Candidate], r: f32) -> u32 {
    let mut cum = 0.0;
    for cand in cands {
        cum += cand.p;
        if r < cum {
            return cand.id;
        }
    }
    cands
        .iter()
        .rev()
        .find(|c| c.p > 0.0)
        .or(cands.first())
        .map_or(0, |c| c.id)
}

/// A logit as the sampler ranks it: NaN as minus infinity.
fn logit_of(l: f32) -> f32 {
    if l.is_nan() { f32::NEG_INFINITY } else { l }
}

/// Largest logit first.
fn desc(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit)
}

/// Logits scanned in chunks of this many: a chunk whose largest value cannot enter the
/// candidates found so far is skipped after one vectorized max.
const CHUNK: usize = 32;

/// The largest value of a chunk (NaN ignored, minus infinity for none), in 8 lanes so that it
/// vectorizes.
fn chunk_max(chunk: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; 8];
    let mut lanes = chunk.chunks_exact(8);
    for c in &mut lanes {
        for i in 0..8 {
            m[i] = if c[i] > m[i] { c[i] } else { m[i] };
        }
    }
    let tail = lanes
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |a, &x| if x > a { x } else { a });
    m.iter().fold(tail, |a, &x| if x > a { x } else { a })
}

/// Whether token `id` has a penalized logit in `pen` (sorted by id).
fn in_pen(pen: &[(u32, f32)], id: u32) -> bool {
    pen.binary_search_by_key(&id, |e| e.0).is_ok()
}

/// The most likely token, the lowest id among equals: the recent tokens at their penalized
/// logits (`pen`), every other token at its own.
fn greedy(logits: &[f32], pen: &[(u32, f32)]) -> u32 {
    let mut best: Option<(u32, f32)> = None;
    for (ci, chunk) in logits.chunks(CHUNK).enumerate() {
        if best.is_some_and(|(_, b)| chunk_max(chunk) <= b) {
            continue;
        }
        for (j, &l) in chunk.iter().enumerate() {
            let (id, l) = ((ci * CHUNK + j) as u32, logit_of(l));
            if best.is_none_or(|(_, b)| l > b) && !in_pen(pen, id) {
                best = Some((id, l));
            }
        }
    }
    for &(id, l) in pen {
        if best.is_none_or(|(bi, b)| l > b || (l == b && id < bi)) {
            best = Some((id, l));
        }
    }
    best.map_or(0, |b| b.0)
}

/// The `k` (< the vocabulary) largest candidates, in no order, into `out`: the recent tokens at
/// their penalized logits (`pen`), every other token at its own. One pass over the logits: a
/// candidate enters a buffer of 4k while it beats the k-th largest kept at the buffer's last
/// cut, the buffer cut back to its k largest each time it fills. (Every token into the list
/// and a selection over all of them took 334 µs a token on a 151,936-entry vocabulary; this,
/// 28 µs. The worst order, logits ascending by token id, takes 740 µs: every token enters. A
/// larger buffer halves little of that and costs the usual case half again.)
fn top_k_into(out: &mut Vec<Candidate>, logits: &[f32], k: usize, pen: &[(u32, f32)]) {
    out.clear();
    let cap = (4 * k).max(64);
    // The k-th largest at the last cut; nothing at or below it can be among the k largest.
    let mut floor: Option<f32> = None;
    for (ci, chunk) in logits.chunks(CHUNK).enumerate() {
        if floor.is_some_and(|f| chunk_max(chunk) <= f) {
            continue;
        }
        for (j, &l) in chunk.iter().enumerate() {
            let (id, logit) = ((ci * CHUNK + j) as u32, logit_of(l));
            if floor.is_some_and(|f| logit <= f) || in_pen(pen, id) {
                continue;
            }
            out.push(Candidate { id, logit, p: 0.0 });
            if out.len() == cap {
                out.select_nth_unstable_by(k - 1, desc);
                out.truncate(k);
                floor = Some(out[k - 1].logit);
            }
        }
    }
    out.extend(
        pen.iter()
            .map(|&(id, logit)| Candidate { id, logit, p: 0.0 }),
    );
    if out.len() > k {
        out.select_nth_unstable_by(k - 1, desc);
        out.truncate(k);
    }
}

/// Probabilities of sorted candidates at temperature `temp`.
fn softmax(cands: &mut [Candidate], temp: f32) {
    let Some(max) = cands.first().map(|c| c.logit) else {
        return;
    };
    let mut sum = 0.0;
    for c in cands.iter_mut() {
        c.p = ((c.logit - max) / temp).exp();
        sum += c.p;
    }
    for c in cands.iter_mut() {
        c.p /= sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(f: impl FnOnce(&mut SamplerConfig)) -> SamplerConfig {
        let mut c = SamplerConfig {
            seed: 42,
            ..SamplerConfig::default()
        };
        f(&mut c);
        c
    }

    #[test]
    fn greedy_takes_the_argmax() {
        let mut s = Sampler::new(cfg(|c| c.temp = 0.0));
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9]), 1);
        assert_eq!(s.sample(&[f32::NAN, -5.0, -4.0]), 2);
    }

    #[test]
    fn repeat_penalty_follows_llama_cpp() {
        // Token 1 (logit 3.0) seen recently: 3.0 / 2 = 1.5 < 2.9, so token 3 wins.
        let mut s = Sampler::new(cfg(|c| {
            c.temp = 0.0;
            c.repeat_penalty = 2.0;
        }));
        s.accept(1);
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9]), 3);
        // Negative logits are multiplied: -1.0 * 2 = -2.0 < -1.5.
        let mut s = Sampler::new(cfg(|c| {
            c.temp = 0.0;
            c.repeat_penalty = 2.0;
        }));
        s.accept(0);
        assert_eq!(s.sample(&[-1.0, -1.5]), 1);
    }

    #[test]
    fn excluded_tokens_are_never_picked() {
        let logits = [0.1, 3.0, -1.0, 2.9, 2.8];
        let mut s = Sampler::new(cfg(|c| c.temp = 0.0));
        assert_eq!(s.sample_excluding(&logits, &[1]), 3);
        assert_eq!(s.sample_excluding(&logits, &[1, 3, 9]), 4);
        // Sampled: top-k 2 of what is left, never token 1 or 3, over many draws.
        let mut s = Sampler::new(cfg(|c| {
            c.top_k = 2;
            c.temp = 5.0;
        }));
        let picked: std::collections::BTreeSet<u32> = (0..200)
            .map(|_| s.sample_excluding(&logits, &[3, 1]))
            .collect();
        assert_eq!(picked, [0, 4].into());
        // A penalized recent token excluded too.
        let mut s = Sampler::new(cfg(|c| {
            c.temp = 0.0;
            c.repeat_penalty = 1.1;
        }));
        s.accept(1);
        assert_eq!(s.sample_excluding(&logits, &[1]), 3);
    }

    #[test]
    fn a_draw_past_the_sum_never_lands_on_an_excluded_token() {
        let c = |id, p| Candidate { id, logit: 0.0, p };
        // Sorted as the sampler sorts them; token 9 excluded (p = 0), the sum short of 1.
        let cands = [c(4, 0.6), c(2, 0.399_999), c(9, 0.0)];
        assert_eq!(draw(&cands, 0.3), 4);
        assert_eq!(draw(&cands, 0.7), 2);
        assert_eq!(draw(&cands, 0.999_999_9), 2);
    }

    #[test]
    fn top_k_one_is_greedy() {
        let mut s = Sampler::new(cfg(|c| {
            c.temp = 5.0;
            c.top_k = 1;
        }));
        for _ in 0..50 {
            assert_eq!(s.sample(&[0.0, 1.0, 0.5]), 1);
        }
    }

    #[test]
    fn min_p_and_top_p_cut_the_tail() {
        // p ≈ [0.665, 0.245, 0.090]: min_p 0.2 keeps the first two (0.09 < 0.133).
        let logits = [2.0, 1.0, 0.0];
        let mut s = Sampler::new(cfg(|c| {
            c.temp = 1.0;
            c.top_k = 0;
            c.top_p = 1.0;
            c.min_p = 0.2;
        }));
        for _ in 0..300 {
            assert_ne!(s.sample(&logits), 2);
        }
        // top_p 0.6 keeps only the first (0.665 ≥ 0.6).
        let mut s = Sampler::new(cfg(|c| {
            c.temp = 1.0;
            c.top_k = 0;
            c.top_p = 0.6;
            c.min_p = 0.0;
        }));
        for _ in 0..100 {
            assert_eq!(s.sample(&logits), 0);
        }
    }

    #[test]
    fn frequencies_follow_the_softmax() {
        let logits = [1.0f32, 0.0, -1.0];
        let mut s = Sampler::new(cfg(|c| {
            c.temp = 1.0;
            c.top_k = 0;
            c.top_p = 1.0;
            c.min_p = 0.0;
        }));
        let n = 20000;
        let mut counts = [0usize; 3];
        for _ in 0..n {
            counts[s.sample(&logits) as usize] += 1;
        }
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        for (i, &l) in logits.iter().enumerate() {
            let expect = (l as f64).exp() / z;
            let got = counts[i] as f64 / n as f64;
            // 4 standard deviations of a binomial proportion.
            let tol = 4.0 * (expect * (1.0 - expect) / n as f64).sqrt();
            assert!((got - expect).abs() < tol, "token {i}: {got} vs {expect}");
        }
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 17) as f32 * 0.3).collect();
        let draw = |seed| {
            let mut s = Sampler::new(cfg(|c| c.seed = seed));
            (0..20).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    /// The one-pass top-k and argmax against the plain way (every token a candidate at its
    /// penalized logit, then a selection) on random vocabularies: ascending, descending and
    /// shuffled logits, NaNs, many equal values, penalized tokens in and out of the top.
    #[test]
    fn one_pass_selection_equals_selecting_over_every_token() {
        let mut rng = Rng::new(5);
        for case in 0..300 {
            let n = 1 + (rng.next_u64() % 700) as usize;
            let mut logits: Vec<f32> = (0..n)
                .map(|_| match rng.next_u64() % 10 {
                    0 => f32::NAN,
                    1 => 1.5,
                    _ => rng.next_normal() * 4.0,
                })
                .collect();
            match case % 3 {
                0 => logits.sort_by(f32::total_cmp),
                1 => logits.sort_by(|a, b| b.total_cmp(a)),
                _ => {}
            }
            let mut recent: Vec<u32> = (0..rng.next_u64() % 20)
                .map(|_| (rng.next_u64() % (n as u64 + 3)) as u32)
                .collect();
            let penalty = [1.0, 1.3, 0.7][case % 3];
            let mut s = Sampler::new(cfg(|c| c.repeat_penalty = penalty));
            for &t in &recent {
                s.accept(t);
            }
            s.penalized(&logits);
            // The plain way.
            let mut all: Vec<Candidate> = logits
                .iter()
                .enumerate()
                .map(|(i, &l)| Candidate {
                    id: i as u32,
                    logit: logit_of(l),
                    p: 0.0,
                })
                .collect();
            recent.sort_unstable();
            recent.dedup();
            if penalty != 1.0 {
                for &t in &recent {
                    if let Some(c) = all.get_mut(t as usize) {
                        c.logit = if c.logit > 0.0 {
                            c.logit / penalty
                        } else {
                            c.logit * penalty
                        };
                    }
                }
            }
            let first_max = all
                .iter()
                .fold(None::<Candidate>, |b, &x| match b {
                    Some(b) if b.logit >= x.logit => Some(b),
                    _ => Some(x),
                })
                .map_or(0, |b| b.id);
            assert_eq!(greedy(&logits, &s.pen), first_max, "case {case}");
            let k = 1 + (rng.next_u64() % n as u64) as usize;
            if k < n {
                let mut got = Vec::new();
                top_k_into(&mut got, &logits, k, &s.pen);
                all.sort_by(desc);
                let want: Vec<u32> = all[..k].iter().map(|c| c.logit.to_bits()).collect();
                got.sort_by(desc);
                // The same k values (equal values may be other tokens of that value), each at
                // its token's logit.
                assert_eq!(
                    got.iter().map(|c| c.logit.to_bits()).collect::<Vec<_>>(),
                    want
                );
                for c in &got {
                    assert_eq!(
                        c.logit.to_bits(),
                        all.iter().find(|a| a.id == c.id).unwrap().logit.to_bits()
                    );
                }
            }
        }
    }
}
