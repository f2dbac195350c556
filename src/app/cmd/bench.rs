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
    for line in header_lines() {
        println!("{line}");
    }
}

fn print_row(r: &BenchResult) {
    println!("{}", row(r));
}

/// The table's column widths, shared by the header and every row so that they line up.
const WIDTHS: [usize; 7] = [30, 10, 10, 10, 7, 8, 20];

fn header_lines() -> [String; 2] {
    let names = [
        "model", "size", "params", "backend", "threads", "test", "t/s",
    ];
    let left = [true, false, false, true, false, false, false];
    let head = names
        .iter()
        .zip(WIDTHS)
        .zip(left)
        .map(|((n, w), l)| {
            if l {
                format!("{n:<w$}")
            } else {
                format!("{n:>w$}")
            }
        })
        .collect::<Vec<_>>();
    // Markdown alignment marks, as llama-bench prints them: `---:` for a right-aligned column.
    let rule = WIDTHS
        .iter()
        .zip(left)
        .map(|(&w, l)| {
            if l {
                "-".repeat(w)
            } else {
                format!("{}:", "-".repeat(w - 1))
            }
        })
        .collect::<Vec<_>>();
    [
        format!("| {} |", head.join(" | ")),
        format!("| {} |", rule.join(" | ")),
    ]
}

/// MiB below 1 GiB, GiB from there (as llama-bench), so that the size fits its column.
fn size_text(bytes: u64) -> String {
    let mib = bytes as f64 / (1u64 << 20) as f64;
    if mib < 1024.0 {
        format!("{mib:.2} MiB")
    } else {
        format!("{:.2} GiB", mib / 1024.0)
    }
}

fn row(r: &BenchResult) -> String {
    let cells = [
        format!("{:<w$}", r.model_type, w = WIDTHS[0]),
        format!("{:>w$}", size_text(r.model_size), w = WIDTHS[1]),
        format!(
            "{:>w$}",
            format!("{:.2} M", r.model_n_params as f64 / 1e6),
            w = WIDTHS[2]
        ),
        format!("{:<w$}", r.backend, w = WIDTHS[3]),
        format!("{:>w$}", r.n_threads, w = WIDTHS[4]),
        format!("{:>w$}", r.test, w = WIDTHS[5]),
        format!(
            "{:>w$}",
            format!("{:.2} ± {:.2}", r.avg_ts, r.stddev_ts),
            w = WIDTHS[6]
        ),
    ];
    format!("| {} |", cells.join(" | "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Character columns of the `|` separators.
    fn bars(line: &str) -> Vec<usize> {
        line.chars()
            .enumerate()
            .filter(|(_, c)| *c == '|')
            .map(|(i, _)| i)
            .collect()
    }

    #[test]
    fn header_rule_and_rows_line_up() {
        let r = BenchResult {
            model: "m.gguf".into(),
            model_type: "llama 135M Q4_1".into(),
            model_size: 88_200_000,
            model_n_params: 134_515_008,
            backend: "cpu".into(),
            device: String::new(),
            n_threads: 2,
            test: "pp512".into(),
            n_prompt: 512,
            n_gen: 0,
            samples_ts: vec![1234.5],
            avg_ts: 1234.56,
            stddev_ts: 12.3,
        };
        let [head, rule] = header_lines();
        let line = row(&r);
        assert!(
            line.contains("84.11 MiB") && line.contains("1234.56 ± 12.30"),
            "{line}"
        );
        assert_eq!(bars(&head), bars(&rule), "{head}\n{rule}");
        assert_eq!(bars(&head), bars(&line), "{head}\n{line}");
        // A size of five digits before the point still fits its column.
        let big = row(&BenchResult {
            model_size: 20_000 << 20,
            ..r
        });
        assert_eq!(bars(&head), bars(&big), "{head}\n{big}");
        assert!(big.contains("19.53 GiB"), "{big}");
    }
}
