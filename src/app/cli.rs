//! Command-line interface.

use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "hipscope",
    version,
    about = "Chat with a local GGUF model and watch the GPU while it runs"
)]
pub struct Cli {}

pub fn run() -> i32 {
    let _cli = Cli::parse();
    0
}
