//! hipscope: chat with a local GGUF model in the terminal and watch the GPU while it runs.
//!
//! Layers, each importing only those below it: `app` → `ui` → `model` → `gpu`.

pub mod app;
pub mod gpu;
pub mod model;
pub mod ui;
