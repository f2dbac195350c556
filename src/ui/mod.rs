//! The terminal UI: view state, `update(event)`, and pure renders, one file per panel.
//!
//! [`app::App`] is the state; [`app::App::update`] is the only way it changes; [`screen::render`]
//! draws it. Neither does I/O: the app layer (`app::tui`) feeds in terminal input, worker
//! events and ticks, and carries out the [`app::Effect`]s that come back.

pub mod app;
pub mod arena;
pub mod chat;
pub mod commands;
pub mod error_dialog;
pub mod gpu;
pub mod help;
pub mod input;
pub mod markdown;
pub mod meter;
pub mod picker;
pub mod quit_screen;
pub mod sampler;
pub mod screen;
pub mod series;
pub mod streams;
pub mod system_editor;
pub mod theme;
pub mod top;
pub mod units;
pub mod watchdog;

pub use app::{App, Effect, Msg, Settings};
pub use screen::render;
