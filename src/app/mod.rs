//! The application edge: CLI, config, start-up, the event loop and the quit protocol.

pub use crate::gpu::dirs;

pub mod atomic_file;
pub mod backend;
pub mod chat_args;
pub mod cli;
pub mod clipboard;
pub mod cmd;
pub mod config;
pub mod discover;
pub mod fetch;
pub mod gpu_cli;
pub mod logging;
pub mod quit;
pub mod selftest;
pub mod selftest_compute;
pub mod shutdown;
pub mod transcript;
pub mod tui;

/// Runs the program and returns its exit code.
pub fn main() -> i32 {
    cli::run()
}
