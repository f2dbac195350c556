//! The terminal UI: view state, `update(msg)`, and pure renders, one file per panel.
//!
//! [`state::App`] is the state; [`state::App::update`] is the only way it changes;
//! [`screen::render`] draws it. Neither does I/O: the app layer (`app::event_loop`) feeds in
//! terminal input, worker events and ticks as [`msg::Msg`]s, and carries out the
//! [`msg::Effect`]s that come back.
//!
//! The files form layers; each imports only the layers below it (no import circles):
//! - types and drawing pieces: `msg`, `settings`, `theme`, `units`, `series`, `meter`,
//!   `wrap`, `markdown`, `input`, `commands`, `keymap`;
//! - panels and windows, one file each: `chat`, `streams`, `arena`, `watchdog`, `gpu`,
//!   `profile`, `picker`, `sampler`, `system_editor`, `help`, `error_dialog`, `quit_screen`;
//! - the state and what changes it: `state` (the `App` struct), `update` (`App::update`),
//!   `keys` (key dispatch), `actions` (what keys and commands do); and `screen`, which lays
//!   the panels out.

pub mod actions;
pub mod arena;
pub mod chat;
pub mod commands;
pub mod complete;
pub mod error_dialog;
pub mod gpu;
pub mod help;
pub mod input;
pub mod keymap;
pub mod keys;
pub mod markdown;
pub mod meter;
pub mod msg;
pub mod picker;
pub mod profile;
pub mod quit_screen;
pub mod reasoning;
pub mod remote_latency;
pub mod remote_top;
pub mod requests;
pub mod sampler;
pub mod screen;
pub mod series;
pub mod serve_screen;
pub mod settings;
pub mod state;
pub mod streams;
pub mod system_editor;
pub mod theme;
pub mod top;
pub mod units;
pub mod update;
pub mod watchdog;
pub mod wrap;

pub use msg::{Effect, Msg};
pub use screen::render;
pub use settings::Settings;
pub use state::App;
