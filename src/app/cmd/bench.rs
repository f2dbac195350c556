//! `hipscope bench`: prompt processing (ppN) and generation (tgN) speed, reported as llama-bench
//! reports them — mean ± standard deviation of tokens/s over repetitions, after a warm-up run.

use std::time::Instant;

use clap::Args;

use super::model_args::{ModelArgs, load_model};
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
        default_value = "512"
    )]
    pub n_prompt: Vec<usize>,
    /// Generation lengths to test (comma-separated; 0 skips).
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    pub n_gen: Vec<usize>,
    /// Repetitions of each test.
    #[arg(short = 'r', long, default_value_t = 5)]
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
    /// Bytes of weights one generated token reads (every matrix once; of the token embedding
    /// only where it is also the output matrix). KV-cache reads are not counted.
    pub bytes_per_token: u64,
    /// The device's memory bandwidth (read plus write of a copy), GB/s; `None` on the CPU.
    pub bandwidth_gbs: Option<f64>,
    /// Generation tests: the speed at which reading `bytes_per_token` at the measured copy
    /// bandwidth takes the whole time (t/s), and how much of it was reached (%).
    pub bound_ts: Option<f64>,
    pub bound_pct: Option<f64>,
}

/// Bytes of weights one generated token reads: every tensor but the token embedding, of which
/// one row is read, unless the embedding is also the output matrix (no `output.weight`).
pub fn bytes_per_token(file: &crate::model::gguf::GgufFile) -> u64 {
    let tensors = file.tensors();
    let tied = !tensors.iter().any(|t| t.name == "output.weight");
    tensors
        .iter()
        .filter(|t| tied || t.name != "token_embd.weight")
        .map(|t| t.size)
        .sum()
}

/// The decode bound in t/s: bytes per token read at the copy bandwidth. A copy moves every byte
/// twice (read and write) and decode mostly reads, so the read rate taken is the copy's total.
pub fn decode_bound(bytes_per_token: u64, bandwidth_bytes_s: f64) -> Option<f64> {
    (bytes_per_token > 0 && bandwidth_bytes_s > 0.0)
        .then(|| bandwidth_bytes_s / bytes_per_token as f64)
}

/// The device's copy bandwidth (bytes/s), from `bandwidth.json` in the cache directory if it was
/// measured before on a device of this name, else measured now and written there.
fn cached_bandwidth(model: &mut crate::model::forward::Model, device_key: &str) -> Option<f64> {
    let path = crate::gpu::dirs::cache_dir().map(|d| d.join("bandwidth.json"));
    let mut table: std::collections::BTreeMap<String, f64> = path
        .as_ref()
        .and_then(|p| std::fs::read(p).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    if let Some(&b) = table.get(device_key) {
        return Some(b);
    }
    let b = model.backend_mut().copy_bandwidth()?;
    table.insert(device_key.to_string(), b);
    if let Some(p) = &path {
        let written = p
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|_| std::fs::write(p, serde_json::to_vec_pretty(&table).unwrap_or_default()));
        if let Err(e) = written {
            tracing::warn!("could not cache the bandwidth in {}: {e}", p.display());
        }
    }
    Some(b)
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
    let bpt = bytes_per_token(model.file());
    let bandwidth = if a.n_gen.iter().any(|&n| n > 0) {
        cached_bandwidth(model, &format!("{} · {}", device.backend, device.name))
    } else {
        None
    };
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
        let bound = bandwidth.and_then(|b| decode_bound(bpt, b));
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
            bytes_per_token: bpt,
            bandwidth_gbs: bandwidth.map(|b| b / 1e9),
            bound_ts: bound.filter(|_| ng > 0),
            bound_pct: bound.filter(|_| ng > 0).map(|b| 100.0 * avg / b),
        });
        if !a.json && results.len() == 1 {
            print_header();
        }
        if !a.json
            && let Some(r) = results.last()
        {
            print_row(r);
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    }
    Ok(0)
}

fn print_header() {
    println!(
        "| {:<30} | {:>10} | {:>10} | {:<10} | {:>7} | {:>8} | {:>20} | {:>18} |",
        "model", "size", "params", "backend", "threads", "test", "t/s", "bound"
    );
    println!(
        "| {:-<30} | {:->9}: | {:->9}: | {:-<10} | {:->6}: | {:->7}: | {:->19}: | {:->17}: |",
        "", "", "", "", "", "", "", ""
    );
}

fn print_row(r: &BenchResult) {
    println!(
        "| {:<30} | {:>7.2} MiB | {:>8.2} M | {:<10} | {:>7} | {:>8} | {:>11.2} ± {:>6.2} | {:>18} |",
        r.model_type,
        r.model_size as f64 / (1u64 << 20) as f64,
        r.model_n_params as f64 / 1e6,
        r.backend,
        r.n_threads,
        r.test,
        r.avg_ts,
        r.stddev_ts,
        bound_cell(r)
    );
}

/// `41% of 807` (percentage of the decode bound reached, and the bound in t/s), or `-`.
fn bound_cell(r: &BenchResult) -> String {
    match (r.bound_pct, r.bound_ts) {
        (Some(p), Some(b)) => format!("{p:.0}% of {b:.0}"),
        _ => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decode_bound_is_the_bandwidth_over_the_bytes_per_token() {
        // Llama-2-7B Q4_0: 3.72 GB a token at 3.0 TB/s.
        let b = decode_bound(3_720_000_000, 3.0e12).unwrap();
        assert!((b - 806.45).abs() < 0.01, "{b}");
        assert_eq!(decode_bound(0, 3.0e12), None);
        assert_eq!(decode_bound(1, 0.0), None);
    }
}
