//! The terminal UI: view state, `update(event)`, and pure renders, one file per panel.
