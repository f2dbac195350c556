//! `hipscope perplexity --kl-divergence-base FILE --kl-divergence`: the KL divergence of this
//! model's token distributions from those a base run saved (by llama-perplexity or by hipscope),
//! with the statistics llama-perplexity prints, computed as it computes them (float where it
//! uses float) so that the two tools' figures can be compared line by line.

use std::io::Write;
use std::time::Instant;

use super::logits_file::{Reader, row_len, scored_range};
use crate::app::stderr::errln;
use crate::model::forward::Logits;
use crate::model::loader::Loaded;

/// Running sums over scored tokens (llama.cpp's `kl_divergence_result`).
#[derive(Debug, Default, Clone)]
pub struct KlSums {
    sum_nll: f64,
    sum_nll2: f64,
    sum_nll_base: f64,
    sum_nll_base2: f64,
    sum_nll_nll_base: f64,
    sum_kld: f64,
    sum_kld2: f64,
    sum_p_diff: f64,
    sum_p_diff2: f64,
    sum_p_diff4: f64,
    max_p_diff: f32,
    n_same_top: usize,
    count: usize,
    /// Each token's KL divergence and probability difference, for the percentiles.
    kld_values: Vec<f32>,
    p_diff_values: Vec<f32>,
}

fn f32_at(row: &[u16], i: usize) -> f32 {
    let [a, b] = row[i].to_le_bytes();
    let [c, d] = row[i + 1].to_le_bytes();
    f32::from_le_bytes([a, b, c, d])
}

impl KlSums {
    /// Adds one scored token: `logits` of this model, `base` the saved row, `tok` the next token.
    pub fn add(&mut self, logits: &[f32], base: &[u16], tok: usize) {
        let n_vocab = logits.len();
        let (mut max_logit, mut imax) = (logits[0], 0);
        for (i, &l) in logits.iter().enumerate().skip(1) {
            if l > max_logit {
                max_logit = l;
                imax = i;
            }
        }
        let sum_exp: f64 = logits.iter().map(|&l| (l - max_logit).exp() as f64).sum();
        let log_sum_exp = sum_exp.ln() as f32;
        let (scale, min_log_prob) = (f32_at(base, 0), f32_at(base, 2));
        let q = &base[4..4 + n_vocab];

        let nll = max_logit + log_sum_exp - logits[tok];
        self.sum_nll += nll as f64;
        self.sum_nll2 += (nll * nll) as f64;
        let nll_base = -(scale * q[tok] as f32 + min_log_prob);
        self.sum_nll_base += nll_base as f64;
        self.sum_nll_base2 += (nll_base * nll_base) as f64;
        self.sum_nll_nll_base += (nll * nll_base) as f64;

        let top = max_logit + log_sum_exp;
        let mut sum = 0f64;
        let (mut imax_base, mut p_log_base_max) = (0usize, 0f32);
        for (i, (&qi, &l)) in q.iter().zip(logits).enumerate() {
            let p_log_base = scale * qi as f32 + min_log_prob;
            if i == 0 || p_log_base > p_log_base_max {
                p_log_base_max = p_log_base;
                imax_base = i;
            }
            if p_log_base > -16.0 {
                let p_base = p_log_base.exp();
                sum += (p_base * (p_log_base - l + top)) as f64;
            }
        }
        self.sum_kld += sum;
        self.sum_kld2 += sum * sum;
        self.count += 1;
        if imax == imax_base {
            self.n_same_top += 1;
        }
        let p_diff = (-nll).exp() - (-nll_base).exp();
        self.sum_p_diff += p_diff as f64;
        let p_diff2 = (p_diff * p_diff) as f64;
        self.sum_p_diff2 += p_diff2;
        self.sum_p_diff4 += p_diff2 * p_diff2;
        self.max_p_diff = self.max_p_diff.max(p_diff.abs());
        self.kld_values.push(sum as f32);
        self.p_diff_values.push(p_diff);
    }

    pub fn count(&self) -> usize {
        self.count
    }
}

/// Mean and its standard error, as llama.cpp's `mean_and_uncertainty`.
fn mean_unc(sum: f64, sum2: f64, count: usize) -> (f64, f64) {
    if count < 1 {
        return (0.0, 0.0);
    }
    let f = sum / count as f64;
    let df = sum2 / count as f64 - f * f;
    let df = if df > 0.0 && count > 10 {
        (df / (count - 1) as f64).sqrt()
    } else {
        0.0
    };
    (f, df)
}

fn covariance(a: f64, b: f64, ab: f64, count: usize) -> f64 {
    if count < 10 {
        return 0.0;
    }
    let n = count as f64;
    (ab / n - (a / n) * (b / n)) / (n - 1.0)
}

/// llama.cpp's interpolated percentile of sorted `v` (in f32 as it does).
fn percentile(v: &[f32], fraction: f32) -> f32 {
    if fraction <= 0.0 {
        return v[0];
    }
    if fraction >= 1.0 {
        return v[v.len() - 1];
    }
    let p = fraction * (v.len() - 1) as f32;
    let ip = p as usize;
    let p = p - ip as f32;
    (1.0 - p) * v[ip] + p * v[(ip + 1).min(v.len() - 1)]
}

fn median(v: &[f32]) -> f32 {
    let n = v.len();
    if n.is_multiple_of(2) {
        0.5 * (v[n / 2] + v[n / 2 - 1])
    } else {
        v[n / 2]
    }
}

/// The figures llama-perplexity prints, from the sums.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KlSummary {
    pub tokens: usize,
    pub ppl: (f64, f64),
    pub ppl_base: (f64, f64),
    pub ln_ppl_ratio: (f64, f64),
    pub kld: (f64, f64),
    /// RMS of the difference in the next token's probability.
    pub p_diff_rms: (f64, f64),
    /// Fraction of tokens where both runs' most likely token is the same.
    pub same_top: (f64, f64),
}

impl KlSums {
    pub fn summary(&self) -> KlSummary {
        let n = self.count;
        let log_ppl = mean_unc(self.sum_nll, self.sum_nll2, n);
        let log_base = mean_unc(self.sum_nll_base, self.sum_nll_base2, n);
        let cov = covariance(self.sum_nll, self.sum_nll_base, self.sum_nll_nll_base, n);
        let ratio_unc = (log_ppl.1 * log_ppl.1 + log_base.1 * log_base.1 - 2.0 * cov).sqrt();
        let mse = mean_unc(self.sum_p_diff2, self.sum_p_diff4, n);
        let rms = mse.0.sqrt();
        let top = self.n_same_top as f64 / n as f64;
        KlSummary {
            tokens: n,
            ppl: (log_ppl.0.exp(), log_ppl.0.exp() * log_ppl.1),
            ppl_base: (log_base.0.exp(), log_base.0.exp() * log_base.1),
            ln_ppl_ratio: (log_ppl.0 - log_base.0, ratio_unc),
            kld: mean_unc(self.sum_kld, self.sum_kld2, n),
            p_diff_rms: (rms, 0.5 / rms * mse.1),
            same_top: (top, (top * (1.0 - top) / (n as f64 - 1.0)).sqrt()),
        }
    }

    /// One line of the per-chunk table, as llama-perplexity prints it.
    pub fn chunk_line(&self, chunk: usize) -> String {
        let s = self.summary();
        format!(
            "{chunk:4}    {:9.4} ± {:9.4}    {:10.5} ± {:10.5}    {:10.5} ± {:10.5}    {:6.3} ± {:6.3} %    {:6.3} ± {:6.3} %",
            s.ppl.0,
            s.ppl.1,
            s.ln_ppl_ratio.0,
            s.ln_ppl_ratio.1,
            s.kld.0,
            s.kld.1,
            100.0 * s.p_diff_rms.0,
            100.0 * s.p_diff_rms.1,
            100.0 * s.same_top.0,
            100.0 * s.same_top.1
        )
    }

    /// The closing statistics, as llama-perplexity prints them (it prints none for fewer than
    /// 100 tokens, and neither does this).
    pub fn report(&self, out: &mut impl Write) -> std::io::Result<()> {
        if self.count < 100 {
            return Ok(());
        }
        let n = self.count;
        let mut kv = self.kld_values.clone();
        let mut pv = self.p_diff_values.clone();
        kv.sort_by(f32::total_cmp);
        pv.sort_by(f32::total_cmp);
        let log_ppl = mean_unc(self.sum_nll, self.sum_nll2, n);
        let log_base = mean_unc(self.sum_nll_base, self.sum_nll_base2, n);
        let (ppl, ppl_unc) = (log_ppl.0.exp(), log_ppl.0.exp() * log_ppl.1);
        let (pb, pb_unc) = (log_base.0.exp(), log_base.0.exp() * log_base.1);
        let cov = covariance(self.sum_nll, self.sum_nll_base, self.sum_nll_nll_base, n);
        let s = self.summary();
        writeln!(out, "====== Perplexity statistics ======")?;
        writeln!(
            out,
            "Mean PPL(Q)                   : {ppl:10.6} ± {ppl_unc:10.6}"
        )?;
        writeln!(
            out,
            "Mean PPL(base)                : {pb:10.6} ± {pb_unc:10.6}"
        )?;
        let cor = cov / (log_ppl.1 * log_base.1);
        writeln!(out, "Cor(ln(PPL(Q)), ln(PPL(base))): {:6.2}%", 100.0 * cor)?;
        let (r, r_unc) = s.ln_ppl_ratio;
        writeln!(
            out,
            "Mean ln(PPL(Q)/PPL(base))     : {r:10.6} ± {r_unc:10.6}"
        )?;
        writeln!(
            out,
            "Mean PPL(Q)/PPL(base)         : {:10.6} ± {:10.6}",
            r.exp(),
            r.exp() * r_unc
        )?;
        let ppl_cov = ppl * pb * cov;
        let diff_unc = (ppl_unc * ppl_unc + pb_unc * pb_unc - 2.0 * ppl_cov).sqrt();
        writeln!(
            out,
            "Mean PPL(Q)-PPL(base)         : {:10.6} ± {diff_unc:10.6}",
            ppl - pb
        )?;
        writeln!(out)?;
        writeln!(out, "====== KL divergence statistics ======")?;
        writeln!(out, "Mean    KLD: {:10.6} ± {:10.6}", s.kld.0, s.kld.1)?;
        writeln!(out, "Maximum KLD: {:10.6}", kv[kv.len() - 1])?;
        for (label, f) in [
            ("99.9%", 0.999f32),
            ("99.0%", 0.99),
            ("95.0%", 0.95),
            ("90.0%", 0.9),
        ] {
            writeln!(out, "{label}   KLD: {:10.6}", percentile(&kv, f))?;
        }
        writeln!(out, "Median  KLD: {:10.6}", median(&kv))?;
        for (label, f) in [
            ("10.0%", 0.1f32),
            (" 5.0%", 0.05),
            (" 1.0%", 0.01),
            (" 0.1%", 0.001),
        ] {
            writeln!(out, "{label}   KLD: {:10.6}", percentile(&kv, f))?;
        }
        writeln!(out, "Minimum KLD: {:10.6}", kv[0])?;
        writeln!(out)?;
        writeln!(out, "====== Token probability statistics ======")?;
        let pd = mean_unc(self.sum_p_diff, self.sum_p_diff2, n);
        writeln!(
            out,
            "Mean    Δp: {:6.3} ± {:5.3} %",
            100.0 * pd.0,
            100.0 * pd.1
        )?;
        writeln!(out, "Maximum Δp: {:6.3}%", 100.0 * pv[pv.len() - 1])?;
        for (label, f) in [
            ("99.9%", 0.999f32),
            ("99.0%", 0.99),
            ("95.0%", 0.95),
            ("90.0%", 0.9),
            ("75.0%", 0.75),
        ] {
            writeln!(out, "{label}   Δp: {:6.3}%", 100.0 * percentile(&pv, f))?;
        }
        writeln!(out, "Median  Δp: {:6.3}%", 100.0 * median(&pv))?;
        for (label, f) in [
            ("25.0%", 0.25f32),
            ("10.0%", 0.1),
            (" 5.0%", 0.05),
            (" 1.0%", 0.01),
            (" 0.1%", 0.001),
        ] {
            writeln!(out, "{label}   Δp: {:6.3}%", 100.0 * percentile(&pv, f))?;
        }
        writeln!(out, "Minimum Δp: {:6.3}%", 100.0 * pv[0])?;
        let (rms, rms_unc) = s.p_diff_rms;
        writeln!(
            out,
            "RMS Δp    : {:6.3} ± {:5.3} %",
            100.0 * rms,
            100.0 * rms_unc
        )?;
        let (t, t_unc) = s.same_top;
        writeln!(
            out,
            "Same top p: {:6.3} ± {:5.3} %",
            100.0 * t,
            100.0 * t_unc
        )?;
        Ok(())
    }
}

/// Runs the model over the chunks `base` evaluated and compares each scored token's
/// distribution with the saved one. Prints llama-perplexity's table and statistics (or, with
/// `json`, the summary as one JSON object) on stdout.
pub fn run(
    base: &mut Reader,
    loaded: &mut Loaded,
    chunks: Option<usize>,
    json: bool,
) -> anyhow::Result<KlSummary> {
    let session = &mut loaded.session;
    let h = base.header.clone();
    let vocab = session.model.config.vocab_size;
    anyhow::ensure!(
        h.n_vocab == vocab,
        "the base logits were computed over a vocabulary of {}, but this model's has {vocab}",
        h.n_vocab
    );
    let n_ctx = h.n_ctx;
    anyhow::ensure!(
        n_ctx <= session.model.n_ctx(),
        "the base logits were computed with a context of {n_ctx}, but the model was loaded with \
         {}; raise it with -c",
        session.model.n_ctx()
    );
    let bos = session
        .tokenizer
        .bos()
        .filter(|_| session.tokenizer.add_bos());
    let n_chunk = chunks.map_or(h.n_chunk, |c| c.min(h.n_chunk));
    let model = session.model_mut();
    errln!("kl_divergence: computing over {n_chunk} chunks, n_ctx={n_ctx}");
    let mut sums = KlSums::default();
    let (mut logits, mut rows) = (Vec::new(), Vec::new());
    let nv = row_len(vocab);
    let mut out = std::io::stdout().lock();
    for c in 0..n_chunk {
        let mut chunk = h.tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        let t0 = Instant::now();
        model.forward(&chunk, 0, Logits::All, &mut logits)?;
        if c == 0 {
            let secs = t0.elapsed().as_secs_f64();
            errln!(
                "kl_divergence: {secs:.2} seconds per pass - ETA {:.2} minutes",
                secs * n_chunk as f64 / 60.0
            );
            if !json {
                writeln!(
                    out,
                    "\nchunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p"
                )?;
            }
        }
        base.next_chunk(&mut rows)?;
        for (k, j) in scored_range(n_ctx).enumerate() {
            let target = h.tokens[c * n_ctx + j + 1] as usize;
            sums.add(
                &logits[j * vocab..(j + 1) * vocab],
                &rows[k * nv..(k + 1) * nv],
                target,
            );
        }
        if !json {
            writeln!(out, "{}", sums.chunk_line(c + 1))?;
        }
    }
    let summary = sums.summary();
    if json {
        writeln!(out, "{}", serde_json::to_string(&summary)?)?;
    } else {
        writeln!(out)?;
        sums.report(&mut out)?;
    }
    out.flush()?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::super::logits_file::encode_row;
    use super::*;

    fn row_for(logits: &[f32]) -> Vec<u16> {
        let mut row = vec![0u16; row_len(logits.len())];
        encode_row(logits, 0, &mut row);
        row
    }

    #[test]
    fn identical_distributions_have_no_divergence_and_the_same_top() {
        let mut s = KlSums::default();
        for k in 0..120 {
            let logits: Vec<f32> = (0..300).map(|i| ((i * 7 + k) % 53) as f32 * 0.2).collect();
            s.add(&logits, &row_for(&logits), k % 300);
        }
        let m = s.summary();
        assert!(m.kld.0.abs() < 1e-5, "{m:?}");
        assert_eq!(m.same_top.0, 1.0);
        assert!((m.ppl.0 / m.ppl_base.0 - 1.0).abs() < 1e-3);
    }

    #[test]
    fn divergence_of_two_known_distributions_matches_the_formula() {
        // base p = softmax(a), model q = softmax(b): KL(p || q) = sum p (ln p - ln q).
        let a: Vec<f32> = vec![2.0, 1.0, 0.0, -1.0];
        let b: Vec<f32> = vec![0.0, 1.5, 0.5, -0.5];
        let ls = |v: &[f32]| {
            let z: f64 = v.iter().map(|&x| (x as f64).exp()).sum();
            v.iter().map(|&x| x as f64 - z.ln()).collect::<Vec<_>>()
        };
        let (lp, lq) = (ls(&a), ls(&b));
        let want: f64 = lp.iter().zip(&lq).map(|(p, q)| p.exp() * (p - q)).sum();
        let mut s = KlSums::default();
        s.add(&b, &row_for(&a), 1);
        assert!(
            (s.summary().kld.0 - want).abs() < 1e-3,
            "{} vs {want}",
            s.summary().kld.0
        );
        assert_eq!(s.summary().same_top.0, 0.0, "top tokens differ: 0 vs 1");
    }

    #[test]
    fn percentile_interpolates_like_llama_cpp() {
        let v = [0.0f32, 1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 0.5), 2.0);
        assert_eq!(percentile(&v, 0.1), 0.4);
        assert_eq!(percentile(&v, 1.0), 4.0);
        assert_eq!(median(&[1.0, 2.0, 3.0, 10.0]), 2.5);
    }
}
