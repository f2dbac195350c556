//! `hipscope bench`: prompt processing (ppN) and generation (tgN) speed, reported as llama-bench
//! reports them — mean ± standard deviation of tokens/s over repetitions, after a warm-up run.

use std::io::Write;
use std::time::Instant;

use clap::Args;

use super::model_args::{ModelArgs, load_model};
use super::usage::{MAX_CTX, whole};
use crate::model::forward::Logits;
use crate::model::loader::Loaded;
use crate::model::protocol::SamplerConfig;
use crate::model::sampler::Rng;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt lengths to test (comma-separated; 0 skips).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512",
        allow_negative_numbers = true,
        value_parser = whole::<usize>(0, MAX_CTX)
    )]
    pub n_prompt: Vec<usize>,
    /// Generation lengths to test (comma-separated; 0 skips).
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128",
        allow_negative_numbers = true,
        value_parser = whole::<usize>(0, MAX_CTX)
    )]
    pub n_gen: Vec<usize>,
    /// Repetitions of each test.
    #[arg(short = 'r', long, default_value_t = 5, allow_negative_numbers = true,
          value_parser = whole::<usize>(1, 100_000))]
    pub repetitions: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchResult {
    pub model: String,
    pub model_type: String,
    pub model_size: u64,
    pub model_n_params: u64,
    pub backend: String,
    pub device: String,
    pub n_threads: u32,
    pub test: String,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub samples_ts: Vec<f64>,
    pub avg_ts: f64,
    pub stddev_ts: f64,
}

fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 {
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

pub fn run(a: BenchArgs) -> anyhow::Result<i32> {
    let reps = a.repetitions.max(1);
    let mut args = a.model.clone();
    let longest = a
        .n_prompt
        .iter()
        .chain(&a.n_gen)
        .copied()
        .max()
        .unwrap_or(0);
    // Room for the longest test, as llama-bench sizes its context.
    args.ctx_size = Some(args.ctx_size.unwrap_or(0).max(longest + 1));
    let mut loaded = load_model(&args, SamplerConfig::default())?;
    let r = run_loaded(&a, reps, &mut loaded);
    super::model_args::finish(loaded.session.model_mut(), r)
}

fn run_loaded(a: &BenchArgs, reps: usize, loaded: &mut Loaded) -> anyhow::Result<i32> {
    let s = loaded.summary.clone();
    let device = loaded.session.model.backend().device();
    let vocab = loaded.session.model.config.vocab_size as u64;
    let model = loaded.session.model_mut();
    let mut rng = Rng::new(1234);
    let mut logits = Vec::new();
    let mut results = Vec::new();
    let tests = a
        .n_prompt
        .iter()
        .filter(|&&n| n > 0)
        .map(|&n| (n, 0))
        .chain(a.n_gen.iter().filter(|&&n| n > 0).map(|&n| (0, n)));
    for (np, ng) in tests {
        let mut samples = Vec::with_capacity(reps);
        // Warm-up run first (page in the weights, spin up threads), as llama-bench does.
        for rep in 0..=reps {
            let tokens: Vec<u32> = (0..np.max(ng))
                .map(|_| (rng.next_u64() % vocab) as u32)
                .collect();
            let t = Instant::now();
            if np > 0 {
                model.forward(&tokens[..np], 0, Logits::Last, &mut logits)?;
            } else {
                for (pos, &tok) in tokens[..ng].iter().enumerate() {
                    model.forward(&[tok], pos, Logits::Last, &mut logits)?;
                }
            }
            let secs = t.elapsed().as_secs_f64();
            if rep > 0 {
                samples.push((np + ng) as f64 / secs);
            }
        }
        let (avg, sd) = mean_sd(&samples);
        results.push(BenchResult {
            model: s.name.clone(),
            model_type: format!(
                "{} {:.0}M {}",
                s.architecture,
                s.parameters as f64 / 1e6,
                s.quant
            ),
            model_size: s.file_bytes,
            model_n_params: s.parameters,
            backend: device.backend.clone(),
            device: device.name.clone(),
            n_threads: device.compute_units.unwrap_or(1),
            test: if np > 0 {
                format!("pp{np}")
            } else {
                format!("tg{ng}")
            },
            n_prompt: np,
            n_gen: ng,
            samples_ts: samples,
            avg_ts: avg,
            stddev_ts: sd,
        });
        let mut out = std::io::stdout().lock();
        if !a.json && results.len() == 1 {
            print_header(&mut out)?;
        }
        if !a.json
            && let Some(r) = results.last()
        {
            print_row(&mut out, r)?;
        }
        out.flush()?;
    }
    if a.json {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", serde_json::to_string_pretty(&results)?)?;
        out.flush()?;
    }
    Ok(0)
}

fn print_header(out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "| {:<30} | {:>10} | {:>10} | {:<10} | {:>7} | {:>8} | {:>20} |",
        "model", "size", "params", "backend", "threads", "test", "t/s"
    )?;
    writeln!(
        out,
        "| {:-<30} | {:->9}: | {:->9}: | {:-<10} | {:->6}: | {:->7}: | {:->19}: |",
        "", "", "", "", "", "", ""
    )
}

fn print_row(out: &mut dyn Write, r: &BenchResult) -> std::io::Result<()> {
    writeln!(
        out,
        "| {:<30} | {:>7.2} MiB | {:>8.2} M | {:<10} | {:>7} | {:>8} | {:>11.2} ± {:>6.2} |",
        r.model_type,
        r.model_size as f64 / (1u64 << 20) as f64,
        r.model_n_params as f64 / 1e6,
        r.backend,
        r.n_threads,
        r.test,
        r.avg_ts,
        r.stddev_ts
    )
}
