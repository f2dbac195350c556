//! Command-line interface: `hipscope` (chat), and the headless tools named as llama.cpp names
//! theirs.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::app::{cmd, gpu_cli};
use crate::gpu::compute::KvType;
use crate::gpu::select::BackendChoice;

#[derive(Parser, Debug)]
#[command(
    name = "hipscope",
    version,
    about = "Chat with a local GGUF model and watch the GPU while it runs",
    long_about = "Chat with a local GGUF model in the terminal and watch the GPU while it runs.\n\nWith no subcommand, opens the chat on the configured model (or the default SmolLM2-135M-Instruct, fetched on first use)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Commands>,
    #[command(flatten)]
    pub chat: crate::app::chat_args::ChatArgs,
}

#[derive(Subcommand, Debug)]
pub enum Commands {
    /// Chat in the terminal (the default).
    Chat(crate::app::chat_args::ChatArgs),
    /// Generate text from a prompt, streaming it to stdout (headless).
    Generate(cmd::generate::GenerateArgs),
    /// Print the tokens of a text, as llama-tokenize does.
    Tokenize(cmd::tokenize::TokenizeArgs),
    /// Perplexity of a text file, computed as llama-perplexity computes it.
    Perplexity(cmd::perplexity::PerplexityArgs),
    /// Prompt and generation speed, as llama-bench reports them.
    Bench(cmd::bench::BenchArgs),
    /// Download the default model (SmolLM2-135M-Instruct Q4_1) into the cache.
    Fetch(cmd::fetch_cmd::FetchArgs),
    /// Write a synthetic model (random weights, real shapes) as GGUF.
    Synth(cmd::synth::SynthArgs),
    /// Re-encode a model's weights in another type (e.g. F16), as GGUF.
    Convert(cmd::synth::ConvertArgs),
    /// Show a GGUF file's metadata and tensors.
    Info(cmd::info::InfoArgs),
    /// Check the GPU mechanisms (stream tracking, watchdog, quit, upload verification) on this
    /// machine's GPU with real kernels.
    Selftest(gpu_cli::SelftestArgs),
    /// List the GPU kernels, or compile them for given targets (--compile --arch gfx1100,gfx1151).
    Kernels(gpu_cli::KernelsArgs),
    #[command(name = "__compile-kernels", hide = true)]
    CompileKernels(gpu_cli::CompileChildArgs),
}

/// Where the model comes from and how it is set up; shared by every command that runs one.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model file (default: the configured model, else SmolLM2-135M-Instruct, fetched on
    /// first use).
    #[arg(short = 'm', long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// Use a synthetic model of this shape instead (tiny, smollm2-135m, qwen2.5-0.5b,
    /// llama-3.2-1b, llama-2-7b).
    #[arg(long, value_name = "NAME", conflicts_with = "model")]
    pub synthetic: Option<String>,
    /// Weight type of the synthetic model.
    #[arg(
        long,
        value_name = "TYPE",
        default_value = "Q8_0",
        requires = "synthetic"
    )]
    pub quant: String,
    /// Seed of the synthetic model's weights.
    #[arg(long, value_name = "N", default_value_t = 1, requires = "synthetic")]
    pub synthetic_seed: u64,
    /// Context size in tokens (default: the model's, at most 4096; 0: the model's trained
    /// context, as far as memory allows).
    #[arg(short = 'c', long = "ctx-size", value_name = "N", allow_negative_numbers = true,
          value_parser = whole::<usize>(0, MAX_CTX))]
    pub ctx_size: Option<usize>,
    /// CPU threads (default: all cores).
    #[arg(short = 't', long, value_name = "N", default_value_t = 0, allow_negative_numbers = true,
          value_parser = whole::<usize>(0, MAX_THREADS))]
    pub threads: usize,
    /// Most tokens per forward step when processing a prompt.
    #[arg(
        short = 'b',
        long = "batch-size",
        value_name = "N",
        default_value_t = 512,
        allow_negative_numbers = true,
        value_parser = whole::<usize>(1, MAX_CTX)
    )]
    pub batch_size: usize,
    /// Where the model runs: auto (HIP, then CUDA, then the CPU), hip, cuda or cpu.
    #[arg(long, value_name = "NAME", default_value = "auto", value_parser = parse_backend)]
    pub backend: BackendChoice,
    /// GPU number as the runtime counts them (default: the largest discrete GPU).
    #[arg(long, value_name = "N")]
    pub device: Option<u32>,
    /// Element type of the KV cache on a GPU (f16 or f32; the CPU keeps f32).
    #[arg(long, value_name = "TYPE", default_value = "f16", value_parser = parse_kv)]
    pub kv_type: KvType,
}

/// The largest context (`-c`) and thread count (`-t`) accepted, as in config.toml.
pub const MAX_CTX: i128 = 1 << 24;
pub const MAX_THREADS: i128 = 4096;

/// A clap value parser for a whole number from `lo` to `hi`: out of range or not a number, the
/// message says which numbers are allowed (clap reports it as a usage error, exit code 2).
pub fn whole<T: TryFrom<i128> + Clone + Send + Sync + 'static>(
    lo: i128,
    hi: i128,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static {
    move |v: &str| {
        let allowed = || format!("`{v}` is not allowed: a whole number from {lo} to {hi}");
        let n: i128 = v.trim().parse().map_err(|_| allowed())?;
        if !(lo..=hi).contains(&n) {
            return Err(allowed());
        }
        T::try_from(n).map_err(|_| allowed())
    }
}

/// A mistake in how the command was called (exit code 2, as clap's own), not a failure while
/// running it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Whether `e` is stdout closing under us (`| head`): the command ends quietly, as Unix tools do.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn parse_backend(s: &str) -> Result<BackendChoice, String> {
    s.parse()
}

fn parse_kv(s: &str) -> Result<KvType, String> {
    s.parse()
}

pub fn run() -> i32 {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Commands::Generate(a)) => cmd::generate::run(a),
        Some(Commands::Tokenize(a)) => cmd::tokenize::run(a),
        Some(Commands::Perplexity(a)) => cmd::perplexity::run(a),
        Some(Commands::Bench(a)) => cmd::bench::run(a),
        Some(Commands::Fetch(a)) => cmd::fetch_cmd::run(a),
        Some(Commands::Synth(a)) => cmd::synth::run(a),
        Some(Commands::Convert(a)) => cmd::synth::convert(a),
        Some(Commands::Info(a)) => cmd::info::run(a),
        Some(Commands::Selftest(a)) => Ok(gpu_cli::selftest(&a)),
        Some(Commands::Kernels(a)) => Ok(gpu_cli::kernels(&a)),
        Some(Commands::CompileKernels(a)) => Ok(gpu_cli::compile_child(&a)),
        Some(Commands::Chat(a)) => Ok(crate::app::tui::run_chat(
            crate::app::tui::ChatOptions::new(a),
        )),
        None => Ok(crate::app::tui::run_chat(
            crate::app::tui::ChatOptions::new(cli.chat),
        )),
    };
    match result {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => 0,
        Err(e) if e.downcast_ref::<UsageError>().is_some() => {
            eprintln!("error: {e:#}");
            2
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    }
}
