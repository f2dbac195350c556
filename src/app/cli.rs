//! Command-line interface: `hipscope` (chat), and the headless tools named as llama.cpp names
//! theirs. This file only parses and dispatches: each subcommand's arguments and its `run` live
//! in `app/cmd/<name>.rs`; what several commands share (`ModelArgs`, loading a model, the
//! progress line) in `app/cmd/model_args.rs` and `app/cmd/progress.rs`, which never import this.

use clap::{Parser, Subcommand};

use crate::app::chat::{ChatOptions, run_chat};
use crate::app::chat_args::ChatArgs;
use crate::app::cmd::usage;
use crate::app::{cmd, exit_code};

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
    pub chat: ChatArgs,
}

#[derive(Subcommand, Debug)]
pub enum Commands {
    /// Chat in the terminal (the default).
    Chat(ChatArgs),
    /// Generate text from a prompt, streaming it to stdout (headless).
    Generate(cmd::generate::GenerateArgs),
    /// Print the tokens of a text, as llama-tokenize does.
    Tokenize(cmd::tokenize::TokenizeArgs),
    /// Perplexity of a text file, computed as llama-perplexity computes it.
    Perplexity(cmd::perplexity::PerplexityArgs),
    /// Prompt and generation speed, as llama-bench reports them.
    Bench(cmd::bench::BenchArgs),
    /// A long scripted conversation, headless: time, tokens, memory and allocations per turn.
    Soak(cmd::soak::SoakArgs),
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
    Selftest(cmd::selftest::SelftestArgs),
    /// List the GPU kernels, or compile them for given targets (--compile --arch gfx1100,gfx1151).
    Kernels(cmd::kernels::KernelsArgs),
    /// GPU and host telemetry, full screen like nvtop (--json, --once for scripts).
    Top(cmd::top::TopArgs),
    /// Check in a minute whether GPU inference will work here (exit 0 ok, 1 a check failed).
    Doctor(cmd::doctor::DoctorArgs),
    #[command(name = "__doctor-check", hide = true)]
    DoctorCheck(cmd::doctor_child::ChildArgs),
    #[command(name = "__compile-kernels", hide = true)]
    CompileKernels(cmd::kernels::CompileChildArgs),
}

pub fn run() -> i32 {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Commands::Generate(a)) => cmd::generate::run(a),
        Some(Commands::Tokenize(a)) => cmd::tokenize::run(a),
        Some(Commands::Perplexity(a)) => cmd::perplexity::run(a),
        Some(Commands::Bench(a)) => cmd::bench::run(a),
        Some(Commands::Soak(a)) => cmd::soak::run(a),
        Some(Commands::Fetch(a)) => cmd::fetch_cmd::run(a),
        Some(Commands::Synth(a)) => cmd::synth::run(a),
        Some(Commands::Convert(a)) => cmd::synth::convert(a),
        Some(Commands::Info(a)) => cmd::info::run(a),
        Some(Commands::Top(a)) => cmd::top::run(a),
        Some(Commands::Doctor(a)) => Ok(cmd::doctor::run(a)),
        Some(Commands::DoctorCheck(a)) => Ok(cmd::doctor_child::run(a)),
        Some(Commands::Selftest(a)) => Ok(cmd::selftest::selftest(&a)),
        Some(Commands::Kernels(a)) => Ok(cmd::kernels::kernels(&a)),
        Some(Commands::CompileKernels(a)) => Ok(cmd::kernels::compile_child(&a)),
        Some(Commands::Chat(a)) => Ok(run_chat(ChatOptions::new(a))),
        None => Ok(run_chat(ChatOptions::new(cli.chat))),
    };
    match result {
        Ok(code) => code,
        Err(e) if usage::is_broken_pipe(&e) => exit_code::OK,
        Err(e) if e.downcast_ref::<usage::UsageError>().is_some() => {
            eprintln!("error: {e:#}");
            exit_code::USAGE
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            exit_code::FAILED
        }
    }
}
