//! `hipscope perplexity`: as llama-perplexity computes it — the text is cut into chunks of the
//! context size, each chunk is evaluated from an empty cache (its first token replaced by BOS when
//! the model adds one), and only the second half of each chunk is scored, so that every scored
//! token has at least half a context before it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::Args;

use super::model_args::{ModelArgs, load_model_with};
use super::usage::whole;
use super::{kl_divergence, logits_file};
use crate::app::config::Config;
use crate::app::settings::Settings;
use crate::app::stderr::{err, errln};
use crate::model::forward::Logits;
use crate::model::loader::Loaded;
use crate::model::protocol::SamplerConfig;

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text file to score (not needed with --kl-divergence: the base file holds the tokens).
    #[arg(
        short = 'f',
        long = "file",
        value_name = "FILE",
        required_unless_present = "kl_divergence"
    )]
    pub file: Option<PathBuf>,
    /// Most chunks to score (-1: all).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true,
          value_parser = whole::<i64>(-1, i64::MAX as i128))]
    pub chunks: i64,
    /// Save every scored token's log-probabilities to FILE in llama-perplexity's format (its
    /// `--kl-divergence-base`); with --kl-divergence, read them from FILE instead.
    #[arg(
        long = "kl-divergence-base",
        visible_alias = "save-all-logits",
        value_name = "FILE"
    )]
    pub kl_divergence_base: Option<PathBuf>,
    /// Compare this model's token distributions with those saved in --kl-divergence-base FILE
    /// (KL divergence, top-token agreement, as llama-perplexity prints them).
    #[arg(long, requires = "kl_divergence_base")]
    pub kl_divergence: bool,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The result of a perplexity run.
#[derive(Clone, Debug, PartialEq)]
pub struct PerplexityResult {
    pub ppl: f64,
    /// Standard error of the estimate, as llama-perplexity reports it.
    pub ppl_err: f64,
    pub chunks: usize,
    pub n_ctx: usize,
    pub tokens: usize,
    pub scored: usize,
}

/// log softmax(logits)[target], in f64 as llama-perplexity does.
fn log_softmax_at(logits: &[f32], target: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits[target] as f64 - max - sum.ln()
}

pub fn run(a: PerplexityArgs, settings: &Settings) -> anyhow::Result<i32> {
    let config = &settings.config;
    if a.kl_divergence {
        return run_kl(a, config);
    }
    let Some(file) = &a.file else {
        anyhow::bail!("perplexity needs a text file (-f FILE)");
    };
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let mut loaded = load_model_with(&a.model, config, SamplerConfig::default(), true)?;
    let r = run_loaded(&a, file, &text, &mut loaded);
    super::model_args::finish(loaded.session.model_mut(), r)
}

/// `--kl-divergence`: the context is the base file's unless -c asks for more.
fn run_kl(a: PerplexityArgs, config: &Config) -> anyhow::Result<i32> {
    let path = a.kl_divergence_base.as_deref().expect("clap requires it");
    let mut base = logits_file::Reader::open(path)?;
    let mut model = a.model.clone();
    let n_ctx = base.header.n_ctx;
    if let Some(c) = model.ctx_size.filter(|&c| c != 0 && c < n_ctx) {
        anyhow::bail!(
            "{} was computed with a context of {n_ctx}, but -c asks for {c}; raise it with -c",
            path.display()
        );
    }
    model.ctx_size.get_or_insert(n_ctx);
    let mut loaded = load_model_with(&model, config, SamplerConfig::default(), true)?;
    let chunks = (a.chunks >= 0).then_some(a.chunks as usize);
    let r = kl_divergence::run(&mut base, &mut loaded, chunks, a.json).map(|_| 0);
    super::model_args::finish(loaded.session.model_mut(), r)
}

fn run_loaded(
    a: &PerplexityArgs,
    file: &Path,
    text: &str,
    loaded: &mut Loaded,
) -> anyhow::Result<i32> {
    let session = &mut loaded.session;
    let n_ctx = session.model.n_ctx();
    let t0 = Instant::now();
    // llama-perplexity: add_special = true, parse_special = false.
    let tokens = session.tokenizer.encode(text, true, false);
    errln!(
        "tokenized {} into {} tokens in {:.1} ms",
        file.display(),
        tokens.len(),
        t0.elapsed().as_secs_f64() * 1e3
    );
    anyhow::ensure!(
        tokens.len() >= 2 * n_ctx,
        "{} tokenizes to {} tokens; at least {} are needed for a context of {n_ctx}",
        file.display(),
        tokens.len(),
        2 * n_ctx
    );
    // Special tokens are not parsed, so a leading BOS was added because the model asks for one.
    let add_bos = session
        .tokenizer
        .bos()
        .filter(|b| tokens.first() == Some(b));
    let n_chunk_max = tokens.len() / n_ctx;
    let n_chunk = if a.chunks < 0 {
        n_chunk_max
    } else {
        (a.chunks as usize).min(n_chunk_max)
    };
    let first = n_ctx / 2;
    let vocab = session.model.config.vocab_size;
    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
    let mut logits = Vec::new();
    let mut save = match &a.kl_divergence_base {
        Some(p) => {
            errln!("saving all logits to {}", p.display());
            Some(logits_file::Writer::create(
                p, n_ctx, vocab, n_chunk, &tokens,
            )?)
        }
        None => None,
    };
    let model = session.model_mut();
    errln!("calculating perplexity over {n_chunk} chunks, n_ctx={n_ctx}");
    let mut line = String::new();
    for i in 0..n_chunk {
        let start = i * n_ctx;
        let mut chunk = tokens[start..start + n_ctx].to_vec();
        if let Some(bos) = add_bos {
            chunk[0] = bos;
        }
        let tc = Instant::now();
        model.forward(&chunk, 0, Logits::All, &mut logits)?;
        if i == 0 {
            let secs = tc.elapsed().as_secs_f64();
            errln!(
                "{secs:.2} seconds per pass - ETA {:.2} minutes",
                secs * n_chunk as f64 / 60.0
            );
        }
        for j in first..n_ctx - 1 {
            let target = tokens[start + j + 1] as usize;
            let row = &logits[j * vocab..(j + 1) * vocab];
            if let Some(w) = save.as_mut() {
                w.row(row, target)?;
            }
            let lp = log_softmax_at(row, target);
            nll -= lp;
            nll2 += lp * lp;
        }
        count += n_ctx - first - 1;
        line.push_str(&format!("[{}]{:.4},", i + 1, (nll / count as f64).exp()));
        if !a.json {
            err!("[{}]{:.4},", i + 1, (nll / count as f64).exp());
        }
    }
    if !a.json {
        errln!();
    }
    if let Some(w) = save {
        w.finish()?;
    }
    let mean = nll / count as f64;
    let ppl = mean.exp();
    let var = nll2 / count as f64 - mean * mean;
    let err = if var > 0.0 && count > 1 {
        (var / (count - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    let r = PerplexityResult {
        ppl,
        ppl_err: err,
        chunks: n_chunk,
        n_ctx,
        tokens: tokens.len(),
        scored: count,
    };
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(
            out,
            "{}",
            serde_json::json!({
                "ppl": r.ppl, "ppl_err": r.ppl_err, "chunks": r.chunks, "n_ctx": r.n_ctx,
                "tokens": r.tokens, "scored": r.scored, "per_chunk": line,
            })
        )?;
    } else {
        writeln!(
            out,
            "Final estimate: PPL = {:.4} +/- {:.5}",
            r.ppl, r.ppl_err
        )?;
    }
    out.flush()?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::log_softmax_at;

    #[test]
    fn log_softmax_matches_the_formula() {
        let l = [1.0f32, 2.0, 3.0];
        let z: f64 = l.iter().map(|&x| (x as f64).exp()).sum();
        for (i, &x) in l.iter().enumerate() {
            let want = ((x as f64).exp() / z).ln();
            assert!((log_softmax_at(&l, i) - want).abs() < 1e-12);
        }
    }
}
