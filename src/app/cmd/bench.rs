//! `hipscope bench`: prompt processing (ppN) and generation (tgN) speed, reported as llama-bench
//! reports them — mean ± standard deviation of tokens/s over repetitions, after a warm-up run —
//! at one or more depths (`-d`: tokens already in the KV cache when the test starts). For the
//! decode test also shows its memory-bandwidth bound (`model::bound`), from the read bandwidth
//! measured at the start of the run: the host's (`gpu::cpu::bandwidth`) or the device's, by a
//! kernel that only reads (`Gpu::measure_read_bandwidth`); the header and the JSON show it.

use std::io::Write;
use std::time::Instant;

use clap::Args;

use super::model_args::{ModelArgs, load_model};
use super::usage::{MAX_CTX, whole};
use crate::gpu::cpu::bandwidth::host_read_bandwidth;
use crate::gpu::quant::dot::{Isa, PackedMatrix};
use crate::gpu::trace::{self, ProfileTable};
use crate::model::bound::{DecodeBound, decode_bytes_per_token};
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
    /// Depths to test at: tokens already in the KV cache when each test starts (comma-separated).
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    pub n_depth: Vec<usize>,
    /// Repetitions of each test.
    #[arg(short = 'r', long, default_value_t = 5, allow_negative_numbers = true,
          value_parser = whole::<usize>(1, 100_000))]
    pub repetitions: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// After each test, where its time went: each op family's calls, time and share of a step,
    /// bytes, GB/s and share of the bound, and the host/launch gap (in `--json` too). Times are
    /// taken with tracing on (docs/PROFILING.md says what that costs).
    #[arg(long)]
    pub profile: bool,
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
    pub n_depth: usize,
    pub samples_ts: Vec<f64>,
    pub avg_ts: f64,
    pub stddev_ts: f64,
    /// Graph replay of the decode step on a GPU backend: `on`, or `off (why)`; read after the
    /// test (graphs turn off by themselves where a step cannot be replayed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graphs: Option<String>,
    /// Launch overlap on a GPU backend (CUDA's programmatic dependent launch): `on`, or
    /// `off (why)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launch_overlap: Option<String>,
    /// The CPU backend's kernel instruction set (`Isa::describe`); absent on GPU backends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_kernels: Option<String>,
    /// Decode tests on the CPU backend: bytes read per token (at the middle of the test's
    /// depth range), the measured read bandwidth and the tokens/s they allow.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bound: Option<DecodeBound>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bound_ts: Option<f64>,
    /// The read bandwidth the bound is computed from, and how it was measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_bandwidth: Option<String>,
    /// How `-ngl` placed the layers on a GPU (`-ngl 16: 16/33 layers on the GPU …`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offload: Option<String>,
    /// `--profile`: where the test's measured repetitions spent their time, op by op.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<ProfileTable>,
}

/// `bandwidth.json` in the cache directory: each device's measured read bandwidth.
fn bandwidth_table() -> std::collections::BTreeMap<String, f64> {
    std::fs::read(crate::gpu::dirs::cache_dir().join("bandwidth.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Writes `bw` for `device_key` into `bandwidth.json` in the cache directory (atomically, 0600).
fn remember_bandwidth(device_key: &str, bw: f64) {
    let mut table = bandwidth_table();
    if table.get(device_key) == Some(&bw) {
        return;
    }
    table.insert(device_key.to_string(), bw);
    use crate::gpu::atomic_file::{Replace, write_bytes};
    let p = crate::gpu::dirs::cache_dir().join("bandwidth.json");
    let written = p
        .parent()
        .map_or(Ok(()), crate::gpu::dirs::create_private_dir)
        .and_then(|_| {
            let json = serde_json::to_vec_pretty(&table).unwrap_or_default();
            write_bytes(&p, Replace::Allow, &json)
        });
    if let Err(e) = written {
        tracing::warn!("could not cache the bandwidth in {}: {e}", p.display());
    }
}

/// The bandwidth `bench` measured before on this device (`bandwidth.json`), for the chat's
/// Profile panel: its bound column. Read only, never measured here.
pub fn known_bandwidth(device: &crate::gpu::snapshot::DeviceSummary) -> Option<f64> {
    bandwidth_table().get(&bandwidth_key(device)).copied()
}

/// The key of a device in `bandwidth.json`: the CPU's is the host's.
fn bandwidth_key(device: &crate::gpu::snapshot::DeviceSummary) -> String {
    if device.backend == "cpu" {
        "cpu · host".to_string()
    } else {
        format!("{} · {}", device.backend, device.name)
    }
}

/// The test's name as llama-bench writes it: `pp512`, `tg128`, `tg64 @ d1536`.
fn test_name(np: usize, ng: usize, depth: usize) -> String {
    let base = if np > 0 {
        format!("pp{np}")
    } else {
        format!("tg{ng}")
    };
    if depth > 0 {
        format!("{base} @ d{depth}")
    } else {
        base
    }
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

pub fn run(a: BenchArgs, settings: &crate::app::settings::Settings) -> anyhow::Result<i32> {
    if a.profile {
        // Kernels that time themselves, built with the model (the profile starts after the load).
        trace::ask_stamped_kernels();
    }
    let reps = a.repetitions.max(1);
    let mut args = a.model.clone();
    let longest = a
        .n_prompt
        .iter()
        .chain(&a.n_gen)
        .copied()
        .max()
        .unwrap_or(0);
    let deepest = a.n_depth.iter().copied().max().unwrap_or(0);
    // Room for the deepest, longest test, as llama-bench sizes its context.
    args.ctx_size = Some(args.ctx_size.unwrap_or(0).max(deepest + longest + 1));
    let config = &settings.config;
    let mut loaded = load_model(&args, config, SamplerConfig::default())?;
    let r = run_loaded(
        &a,
        reps,
        &mut loaded,
        &super::model_args::cpu_options(&args, config),
    );
    super::model_args::finish(loaded.session.model_mut(), r)
}

fn run_loaded(
    a: &BenchArgs,
    reps: usize,
    loaded: &mut Loaded,
    cpu: &crate::gpu::cpu::CpuOptions,
) -> anyhow::Result<i32> {
    let s = loaded.summary.clone();
    let offload = loaded.offload.clone();
    if !a.json
        && let Some(o) = &offload
    {
        writeln!(std::io::stdout().lock(), "offload: {o}")?;
    }
    let device = loaded.session.model.backend().device();
    let vocab = loaded.session.model.config.vocab_size as u64;
    let model = loaded.session.model_mut();
    let mut rng = Rng::new(1234);
    let mut logits = Vec::new();
    let mut results = Vec::new();
    let is_cpu = device.backend == "cpu";
    let n_threads = device.compute_units.unwrap_or(1);
    let cpu_kernels = is_cpu.then(|| {
        let isa = if cpu.isa.is_available() {
            cpu.isa
        } else {
            Isa::Scalar
        };
        let packed = if cpu.repack {
            PackedMatrix::packed_types(isa)
        } else {
            Vec::new()
        };
        if packed.is_empty() {
            isa.describe()
        } else {
            let names: Vec<String> = packed.iter().map(|t| t.to_string()).collect();
            format!("{}, {} repacked", isa.describe(), names.join("/"))
        }
    });
    let decodes = a.n_gen.iter().any(|&n| n > 0);
    // The read bandwidth, measured now on every run (a figure kept from an earlier run may have
    // been taken on a busy or throttled device): the host's, or the device's by a kernel that
    // only reads. Kept in the cache directory for the chat's Profile panel.
    let measured = if is_cpu {
        let bw = host_read_bandwidth(n_threads as usize);
        Some((
            bw.bytes_per_s,
            format!(
                "host, {n_threads} threads summing {} MiB, best of {} passes",
                bw.buffer_bytes >> 20,
                bw.passes
            ),
        ))
    } else if decodes {
        model.backend_mut().read_bandwidth().map(|bw| {
            (
                bw.bytes_per_s,
                format!(
                    "device, a read-only kernel over {} MiB, best of {} runs",
                    bw.buffer_bytes >> 20,
                    bw.runs
                ),
            )
        })
    } else {
        None
    };
    if let Some((bw, _)) = &measured {
        remember_bandwidth(&bandwidth_key(&device), *bw);
    }
    let bandwidth = measured.as_ref().map(|m| m.0);
    let read_bandwidth = measured
        .as_ref()
        .map(|(bw, how)| format!("{:.1} GB/s ({how})", bw / 1e9));
    // Keys and values are kept in the `--kv-type` asked for, on either backend.
    let kv_bytes = a.model.kv_type.bytes() as usize;
    if !a.json
        && let Some(k) = &cpu_kernels
    {
        writeln!(std::io::stdout().lock(), "cpu kernels: {k}")?;
    }
    if !a.json
        && let Some(r) = &read_bandwidth
    {
        writeln!(std::io::stdout().lock(), "read bandwidth: {r}")?;
    }
    if !a.json
        && let Some(g) = &device.graphs
    {
        writeln!(std::io::stdout().lock(), "graphs: {g}")?;
    }
    if !a.json
        && let Some(o) = &device.launch_overlap
    {
        writeln!(std::io::stdout().lock(), "launch overlap: {o}")?;
    }
    let file = model.file().clone();
    let config = model.config.clone();
    if a.profile {
        trace::set_bandwidth(bandwidth);
        // Every decode step of a test's repetitions (the profile's default is the last 32).
        trace::enable_profile(PROFILE_STEPS, None);
    }
    let mut depths: Vec<usize> = a.n_depth.clone();
    depths.dedup();
    if depths.is_empty() {
        depths.push(0);
    }
    for &depth in &depths {
        if depth > 0 {
            // The cache holds `depth` tokens before every test at this depth: a test writes only
            // positions from `depth` on and reads none it has not written, so one fill serves
            // every repetition and test.
            let fill: Vec<u32> = (0..depth)
                .map(|_| (rng.next_u64() % vocab) as u32)
                .collect();
            model.forward(&fill, 0, Logits::Last, &mut logits)?;
        }
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
                    model.forward(&tokens[..np], depth, Logits::Last, &mut logits)?;
                } else {
                    for (i, &tok) in tokens[..ng].iter().enumerate() {
                        model.forward(&[tok], depth + i, Logits::Last, &mut logits)?;
                    }
                }
                let secs = t.elapsed().as_secs_f64();
                if rep > 0 {
                    samples.push((np + ng) as f64 / secs);
                } else if a.profile {
                    // The warm-up run is not profiled.
                    trace::reset_profile();
                }
            }
            let profile = a
                .profile
                .then(trace::profile_now)
                .flatten()
                .and_then(|p| if np > 0 { p.prompt } else { p.decode });
            let (avg, sd) = mean_sd(&samples);
            // Read after the test: graphs turn off by themselves where a step cannot be replayed.
            let after = model.backend().device();
            let bound = bandwidth.filter(|_| ng > 0).map(|bw| DecodeBound {
                bytes_per_token: decode_bytes_per_token(&file, &config, depth + ng / 2, kv_bytes),
                bandwidth: bw,
            });
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
                n_threads,
                test: test_name(np, ng, depth),
                n_prompt: np,
                n_gen: ng,
                n_depth: depth,
                samples_ts: samples,
                avg_ts: avg,
                stddev_ts: sd,
                cpu_kernels: cpu_kernels.clone(),
                read_bandwidth: read_bandwidth.clone(),
                graphs: after.graphs,
                launch_overlap: after.launch_overlap,
                bound_ts: bound.map(|b| b.tokens_per_s()),
                bound,
                offload: offload.clone(),
                profile,
            });
            let mut out = std::io::stdout().lock();
            if !a.json && results.len() == 1 {
                print_header(&mut out)?;
            }
            if !a.json
                && let Some(r) = results.last()
            {
                print_row(&mut out, r)?;
                if let Some(p) = &r.profile {
                    for line in p.lines() {
                        writeln!(out, "{line}")?;
                    }
                }
            }
            out.flush()?;
        }
    }
    if a.profile {
        trace::disable_profile();
    }
    if a.json {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", serde_json::to_string_pretty(&results)?)?;
        out.flush()?;
    }
    Ok(0)
}

/// Decode steps a `--profile` table may cover (a test's repetitions, up to this many).
const PROFILE_STEPS: usize = 100_000;

fn print_header(out: &mut dyn Write) -> std::io::Result<()> {
    for line in header_lines() {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

fn print_row(out: &mut dyn Write, r: &BenchResult) -> std::io::Result<()> {
    writeln!(out, "{}", row(r))
}

/// The table's column widths, shared by the header and every row so that they line up.
const WIDTHS: [usize; 8] = [30, 10, 10, 10, 7, 14, 20, 16];

fn header_lines() -> [String; 2] {
    let names = [
        "model",
        "size",
        "params",
        "backend",
        "threads",
        "test",
        "t/s",
        "bound t/s",
    ];
    let left = [true, false, false, true, false, false, false, false];
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
        format!("{:>w$}", bound_cell(r), w = WIDTHS[7]),
    ];
    format!("| {} |", cells.join(" | "))
}

/// `412.3 (71%)`: the bound and the share of it reached; blank where there is none.
fn bound_cell(r: &BenchResult) -> String {
    match r.bound {
        Some(b) => format!(
            "{:.1} ({:.0}%)",
            b.tokens_per_s(),
            100.0 * b.fraction(r.avg_ts)
        ),
        None => String::new(),
    }
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
            n_depth: 0,
            samples_ts: vec![1234.5],
            avg_ts: 1234.56,
            stddev_ts: 12.3,
            cpu_kernels: None,
            read_bandwidth: None,
            graphs: None,
            launch_overlap: None,
            bound: None,
            bound_ts: None,
            offload: None,
            profile: None,
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

    #[test]
    fn test_names_follow_llama_bench() {
        assert_eq!(test_name(512, 0, 0), "pp512");
        assert_eq!(test_name(0, 128, 0), "tg128");
        assert_eq!(test_name(0, 64, 1536), "tg64 @ d1536");
        assert_eq!(test_name(2048, 0, 4096), "pp2048 @ d4096");
    }

    #[test]
    fn depth_list_parses_like_llama_bench() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            bench: BenchArgs,
        }
        let c = Cli::try_parse_from(["x", "-m", "m.gguf", "-d", "0,512,1536"]).expect("parse");
        assert_eq!(c.bench.n_depth, vec![0, 512, 1536]);
        let c = Cli::try_parse_from(["x", "-m", "m.gguf", "--n-depth", "64"]).expect("parse");
        assert_eq!(c.bench.n_depth, vec![64]);
        let c = Cli::try_parse_from(["x", "-m", "m.gguf"]).expect("parse");
        assert_eq!(c.bench.n_depth, vec![0]);
        assert!(Cli::try_parse_from(["x", "-m", "m.gguf", "-d", "deep"]).is_err());
    }
}
