//! The application edge: CLI, config, start-up, the event loop and the quit protocol.

pub mod cli;
pub mod cmd;
pub mod dirs;
pub mod fetch;
pub mod gpu_cli;
pub mod quit;
pub mod selftest;
pub mod selftest_compute;

/// Runs the program and returns its exit code.
pub fn main() -> i32 {
    cli::run()
}
