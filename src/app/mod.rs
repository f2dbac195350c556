//! The application edge: CLI, config, start-up, the event loop and the quit protocol.

pub mod chat;
pub mod chat_args;
pub mod cli;
pub mod clipboard;
pub mod cmd;
pub mod config;
pub mod discover;
pub mod event_loop;
pub mod exit_code;
pub mod fetch;
pub mod logging;
pub mod quit;
pub mod remote_config;
pub mod serve;
pub mod serve_view;
pub mod settings;
pub mod shutdown;
pub mod signals;
pub mod stderr;
pub mod terminal;
pub mod terminal_out;
pub mod transcript;
pub mod tuning;

/// Runs the program and returns its exit code.
pub fn main() -> i32 {
    // A model file truncated under its map ends every command with a documented code.
    crate::app::signals::exit_on_bus(exit_code::FAILED);
    cli::run()
}
