//! The headless subcommands, one file each with its own arguments and `run` (cargo's shape);
//! `model_args`, `progress` and `usage` are what they share. None of them imports `app::cli`, which
//! dispatches to them.

pub mod bench;
pub mod doctor;
pub mod doctor_child;
pub mod fetch_cmd;
pub mod generate;
pub mod info;
pub mod kernels;
pub mod kl_divergence;
pub mod logits_file;
pub mod model_args;
pub mod perplexity;
pub mod progress;
pub mod remote_cmd;
pub mod selftest;
pub mod serve;
pub mod soak;
pub mod synth;
pub mod tokenize;
pub mod top;
pub mod usage;
