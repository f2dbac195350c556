//! The chat's command-line flags (flattened into the CLI by `cli.rs`), and how they override the
//! config file.

use std::path::PathBuf;

use clap::Args;

use super::config::{BackendChoice, Config, LogLevel};
use crate::ui::sampler;
use crate::ui::theme::ThemeName;

/// `hipscope [chat] [MODEL] [flags]`.
#[derive(Args, Clone, Debug, Default, PartialEq)]
pub struct ChatArgs {
    /// GGUF model file (default: `model` in config.toml, else SmolLM2-135M-Instruct, fetched
    /// on first use).
    #[arg(value_name = "MODEL")]
    pub model: Option<PathBuf>,
    /// GGUF model file, as every other command takes it (the same as MODEL).
    #[arg(
        short = 'm',
        long = "model",
        value_name = "PATH",
        conflicts_with = "model"
    )]
    pub model_flag: Option<PathBuf>,
    /// Compute backend: auto, hip, cuda or cpu.
    #[arg(long, value_name = "NAME")]
    pub backend: Option<String>,
    /// Context size in tokens (default: the model's trained context, at most 4096; 0: the whole
    /// trained context, as far as memory allows).
    #[arg(short = 'c', long = "ctx-size", value_name = "N", allow_negative_numbers = true,
          value_parser = super::cmd::usage::whole::<u32>(0, super::cmd::usage::MAX_CTX))]
    pub ctx_size: Option<u32>,
    /// CPU threads (0: all cores).
    #[arg(short = 't', long, value_name = "N", allow_negative_numbers = true,
          value_parser = super::cmd::usage::whole::<u32>(0, super::cmd::usage::MAX_THREADS))]
    pub threads: Option<u32>,
    /// Layers on the GPU, as llama.cpp counts them (the output layer first, then the last
    /// layers); the rest run on the CPU. `auto`: as many as fit (also `-ngl N`).
    #[arg(long = "n-gpu-layers", visible_alias = "ngl", value_name = "N|auto",
          value_parser = parse_gpu_layers)]
    pub n_gpu_layers: Option<crate::model::split::GpuLayers>,
    /// GPU number as the runtime counts them (default: the largest discrete GPU).
    #[arg(long, value_name = "N")]
    pub device: Option<u32>,
    #[command(flatten)]
    pub split: crate::app::settings::SplitArgs,
    /// Most tokens per forward step when processing a prompt (default 512).
    #[arg(short = 'b', long = "batch-size", value_name = "N", allow_negative_numbers = true,
          value_parser = super::cmd::usage::whole::<usize>(1, super::cmd::usage::MAX_CTX))]
    pub batch_size: Option<usize>,
    /// Element type of the KV cache: f16 (default) or f32.
    #[arg(long, value_name = "TYPE", value_parser = parse_kv)]
    pub kv_type: Option<crate::gpu::compute::KvType>,
    /// System prompt.
    #[arg(long = "system-prompt", visible_alias = "sys", value_name = "TEXT")]
    pub system_prompt: Option<String>,
    /// Sampling temperature (0: greedy).
    #[arg(long, value_name = "T", allow_negative_numbers = true)]
    pub temp: Option<String>,
    /// Top-k sampling (0: off).
    #[arg(long = "top-k", value_name = "K", allow_negative_numbers = true)]
    pub top_k: Option<String>,
    /// Top-p sampling (1: off).
    #[arg(long = "top-p", value_name = "P", allow_negative_numbers = true)]
    pub top_p: Option<String>,
    /// Min-p sampling (0: off).
    #[arg(long = "min-p", value_name = "P", allow_negative_numbers = true)]
    pub min_p: Option<String>,
    /// Repeat penalty (1: off).
    #[arg(
        long = "repeat-penalty",
        value_name = "X",
        allow_negative_numbers = true
    )]
    pub repeat_penalty: Option<String>,
    /// Tokens the repeat penalty looks back over.
    #[arg(
        long = "repeat-last-n",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub repeat_last_n: Option<String>,
    /// Most tokens per answer (-1: no limit).
    #[arg(
        short = 'n',
        long = "n-predict",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub n_predict: Option<String>,
    /// Random seed.
    #[arg(short = 's', long, value_name = "N", allow_negative_numbers = true)]
    pub seed: Option<String>,
    /// Reopen the last conversation.
    #[arg(long)]
    pub resume: bool,
    /// Do not save this conversation to disk (/save still exports it).
    #[arg(long)]
    pub no_transcript: bool,
    /// Colours: dark, light or mono.
    #[arg(long, value_name = "NAME")]
    pub theme: Option<String>,
    /// Leave the mouse to the terminal (text selection without Shift; no wheel scrolling).
    #[arg(long)]
    pub no_mouse: bool,
    /// Run the GPU decode step launch by launch instead of replaying it as a graph.
    #[arg(long)]
    pub no_graphs: bool,
    /// Write a timeline of every op, copy, step and frame to FILE (Chrome trace-event JSON for
    /// ui.perfetto.dev or chrome://tracing; also `/trace on|off`; docs/PROFILING.md).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// More detail in the log file (-v debug, -vv trace).
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Log file (default: hipscope.log in the platform state directory).
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    #[command(flatten)]
    pub remote: super::remote_config::RemoteArgs,
}

impl ChatArgs {
    /// The model file named on the command line (MODEL or `-m`).
    pub fn model_path(&self) -> Option<&PathBuf> {
        self.model.as_ref().or(self.model_flag.as_ref())
    }

    /// Applies the flags on top of `config`; errors name the flag and what it accepts.
    pub fn apply(&self, config: &mut Config) -> Result<(), String> {
        if let Some(m) = self.model_path() {
            config.model = Some(m.clone());
        }
        if let Some(b) = &self.backend {
            config.backend = BackendChoice::parse(b).ok_or_else(|| {
                format!(
                    "--backend {b}: not a backend; use {}",
                    BackendChoice::ALLOWED
                )
            })?;
        }
        if let Some(n) = self.ctx_size {
            config.ctx_size = Some(n);
        }
        if let Some(n) = self.threads {
            config.threads = n;
        }
        if let Some(n) = self.n_gpu_layers {
            config.n_gpu_layers = n;
        }
        if let Some(d) = self.device {
            config.device = Some(d);
        }
        config.split = self.split.over(&config.split);
        config.device = crate::app::settings::first_gpu(config.device, &config.split)?;
        if let Some(s) = &self.system_prompt {
            config.system_prompt = s.clone();
        }
        let flags = [
            ("--temp", "temp", &self.temp),
            ("--top-k", "top_k", &self.top_k),
            ("--top-p", "top_p", &self.top_p),
            ("--min-p", "min_p", &self.min_p),
            ("--repeat-penalty", "repeat_penalty", &self.repeat_penalty),
            ("--repeat-last-n", "repeat_last_n", &self.repeat_last_n),
            ("--n-predict", "n_predict", &self.n_predict),
            ("--seed", "seed", &self.seed),
        ];
        for (flag, key, value) in flags {
            if let Some(v) = value {
                let f = sampler::field(key).ok_or_else(|| format!("{flag}: unknown setting"))?;
                (f.set)(&mut config.sampler, v)
                    .map_err(|_| format!("{flag} {v}: not allowed; use {}", f.allowed))?;
            }
        }
        if self.no_transcript {
            config.transcript.enabled = false;
        }
        if let Some(t) = &self.theme {
            config.ui.theme = ThemeName::parse(t)
                .ok_or_else(|| format!("--theme {t}: use dark, light or mono"))?;
        }
        if self.no_mouse {
            config.ui.mouse = false;
        }
        if self.no_graphs {
            config.graphs = false;
        }
        if self.verbose > 0 {
            config.log.level = config.log.level.max(LogLevel::Info).raised(self.verbose);
        }
        if let Some(f) = &self.log_file {
            config.log.file = Some(f.clone());
        }
        config.remote.selected = self.remote.resolve(&config.remote)?;
        if config.remote.selected.is_some() && self.model.is_some() {
            return Err("--remote and a MODEL file: give one or the other".into());
        }
        Ok(())
    }
}

pub use crate::model::split::parse_gpu_layers;

fn parse_kv(s: &str) -> Result<crate::gpu::compute::KvType, String> {
    s.parse()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        chat: ChatArgs,
    }

    fn args(list: &[&str]) -> ChatArgs {
        let mut v = vec!["hipscope"];
        v.extend_from_slice(list);
        Cli::try_parse_from(v).expect("parses").chat
    }

    #[test]
    fn flags_override_the_config() {
        let mut c = Config::default();
        args(&[
            "m.gguf",
            "--backend",
            "cpu",
            "-c",
            "2048",
            "--temp",
            "0.1",
            "-n",
            "-1",
            "--top-k",
            "5",
            "-vv",
            "--no-transcript",
            "--theme",
            "light",
        ])
        .apply(&mut c)
        .unwrap();
        assert_eq!(c.model, Some(PathBuf::from("m.gguf")));
        assert_eq!(c.backend, BackendChoice::Cpu);
        assert_eq!(c.ctx_size, Some(2048));
        assert_eq!(c.sampler.temp, 0.1);
        assert_eq!(c.sampler.top_k, 5);
        assert_eq!(c.sampler.n_predict, -1);
        assert_eq!(c.log.level, LogLevel::Trace);
        assert!(!c.transcript.enabled);
        assert_eq!(c.ui.theme, ThemeName::Light);
    }

    #[test]
    fn a_bad_flag_value_names_the_flag_and_what_is_allowed() {
        let mut c = Config::default();
        let e = args(&["--temp", "hot"]).apply(&mut c).unwrap_err();
        assert_eq!(e, "--temp hot: not allowed; use a number from 0 to 5");
        let e = args(&["--backend", "metal"]).apply(&mut c).unwrap_err();
        assert!(e.starts_with("--backend metal"), "{e}");
    }

    #[test]
    fn the_model_is_given_as_an_argument_or_with_dash_m() {
        let mut c = Config::default();
        args(&["-m", "a.gguf"]).apply(&mut c).unwrap();
        assert_eq!(c.model, Some(PathBuf::from("a.gguf")));
        args(&["--model", "b.gguf"]).apply(&mut c).unwrap();
        assert_eq!(c.model, Some(PathBuf::from("b.gguf")));
        let mut v = vec!["hipscope", "a.gguf", "-m", "b.gguf"];
        assert!(Cli::try_parse_from(v.drain(..)).is_err(), "both at once");
    }
}
