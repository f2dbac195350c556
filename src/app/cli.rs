//! Command-line interface.

use clap::{Parser, Subcommand};

use crate::app::gpu_cli;

#[derive(Parser, Debug)]
#[command(
    name = "hipscope",
    version,
    about = "Chat with a local GGUF model and watch the GPU while it runs"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Check the GPU mechanisms (stream tracking, watchdog, quit, upload verification) on this
    /// machine's GPU with real kernels.
    Selftest(gpu_cli::SelftestArgs),
    /// List the GPU kernels, or compile them for given targets (--compile --arch gfx1100,gfx1151).
    Kernels(gpu_cli::KernelsArgs),
    #[command(name = "__compile-kernels", hide = true)]
    CompileKernels(gpu_cli::CompileChildArgs),
}

pub fn run() -> i32 {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Selftest(a)) => gpu_cli::selftest(&a),
        Some(Command::Kernels(a)) => gpu_cli::kernels(&a),
        Some(Command::CompileKernels(a)) => gpu_cli::compile_child(&a),
        None => 0,
    }
}
