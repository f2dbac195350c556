//! The integration tests, in one binary (one link, one process; issue 30 item 11). Each module
//! was one `tests/<topic>.rs` file; docs/TESTING.md says how to add one. The shared helpers:
//! `common` (the binary, repository paths, the real model), `pty` (the app in a
//! pseudo-terminal), `ui_common` (the UI on a test backend with a fake worker).

mod common;
mod pty;
mod ui_common;

mod arch_config;
mod arch_reference;
mod base_model_chat;
mod cli_real_model;
mod cli_usage;
mod doctor_cli;
mod e2e_chat;
mod fault_injection;
mod forward_reference;
mod fuzz_regressions;
mod gguf_interop;
mod gpu_compute_fake;
mod gpu_fake;
mod gpu_kernel_units;
mod gpu_metrics_published;
mod gpu_quit;
mod hip_gfx11;
mod hip_runtime;
mod kl_divergence;
mod kv_shift;
mod layering;
mod lockstep_fused;
mod model_names;
mod no_gpu;
mod offload;
mod perplexity_reference;
mod quant_matmul;
mod quant_mxfp4;
mod quant_props;
mod quant_reference;
mod quant_repack;
mod reasoning_chat;
mod reasoning_templates;
mod reliability;
mod remote_config;
mod remote_fake;
mod remote_llama;
mod save_pty;
mod session;
mod session_limits;
mod setup_script;
mod synth_llama_loads;
mod telemetry_replay;
mod template_reference;
mod tokenizer_conformance;
mod tokenizer_smollm2;
mod top_pty;
mod ui_first_hour;
mod ui_loop;
mod ui_snapshots;
mod ui_update;
mod watchdog_chat;
mod worker_context;
