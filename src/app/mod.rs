//! The application edge: CLI, config, start-up, the event loop and the quit protocol.

pub use crate::gpu::dirs;

pub mod cli;
pub mod cmd;
pub mod fetch;
pub mod gpu_cli;
pub mod quit;
pub mod selftest;

/// Runs the program and returns its exit code.
pub fn main() -> i32 {
    cli::run()
}
