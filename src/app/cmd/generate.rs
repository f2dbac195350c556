//! `hipscope generate`: text to stdout as it is produced, timings to stderr.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use clap::Args;
use clap::error::ErrorKind;

use super::model_args::{ModelArgs, load_model};
use super::usage::UsageError;
use crate::app::settings::Settings;
use crate::app::stderr::{err, errln};
use crate::model::loader::Loaded;
use crate::model::protocol::SamplerConfig;
use crate::model::session::{Control, Progress};
use crate::ui::sampler;

#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt ("-": read it from stdin, as it is read when stdin is a pipe and no prompt is
    /// given).
    #[arg(short = 'p', long, allow_hyphen_values = true)]
    pub prompt: Option<String>,
    /// Read the prompt from this file.
    #[arg(short = 'f', long, value_name = "FILE", conflicts_with = "prompt")]
    pub file: Option<PathBuf>,
    /// Apply the model's chat template (the prompt is the user's message).
    #[arg(long)]
    pub chat: bool,
    /// System prompt (with --chat).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub remote: crate::app::remote_config::RemoteArgs,
}

/// Sampler flags, named as llama.cpp names them. Each value is checked by the rule the chat's
/// `/set` and config.toml use ([`crate::ui::sampler::FIELDS`]); negative numbers are read as
/// values (`--temp -1` is out of range, not an unknown flag).
#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Tokens to generate (-1: until end of text or a full context; 0: none).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true,
          value_parser = checked::<i32>("n_predict"))]
    pub n_predict: i32,
    /// Temperature; 0 means greedy.
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true,
          value_parser = checked::<f32>("temp"))]
    pub temp: f32,
    /// Top-k sampling (0 = off).
    #[arg(long = "top-k", default_value_t = 40, allow_negative_numbers = true,
          value_parser = checked::<u32>("top_k"))]
    pub top_k: u32,
    /// Top-p sampling (1.0 = off).
    #[arg(long = "top-p", default_value_t = 0.95, allow_negative_numbers = true,
          value_parser = checked::<f32>("top_p"))]
    pub top_p: f32,
    /// Min-p sampling (0.0 = off).
    #[arg(long = "min-p", default_value_t = 0.05, allow_negative_numbers = true,
          value_parser = checked::<f32>("min_p"))]
    pub min_p: f32,
    /// Penalise repeated tokens (1.0 = off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0, allow_negative_numbers = true,
          value_parser = checked::<f32>("repeat_penalty"))]
    pub repeat_penalty: f32,
    /// How many recent tokens the repeat penalty considers.
    #[arg(long = "repeat-last-n", default_value_t = 64, allow_negative_numbers = true,
          value_parser = checked::<u32>("repeat_last_n"))]
    pub repeat_last_n: u32,
    /// RNG seed ("random" or -1: a new one each run).
    #[arg(short = 's', long, default_value = "random", value_parser = parse_seed, allow_negative_numbers = true)]
    pub seed: u64,
    /// Stop when this string is generated (repeatable).
    #[arg(long = "stop", value_name = "TEXT")]
    pub stop: Vec<String>,
}

/// A seed as the sampler settings take it (one rule: `ui::sampler`'s seed field).
fn parse_seed(v: &str) -> Result<u64, String> {
    let mut c = SamplerConfig::default();
    crate::ui::sampler::set(&mut c, "seed", v)?;
    Ok(c.seed)
}

/// A clap value parser for the sampler setting `key`: its value, if the setting's own rule
/// allows it; otherwise what is allowed (clap reports it as a usage error, exit code 2).
fn checked<T: std::str::FromStr>(
    key: &'static str,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static {
    move |v: &str| {
        let f = sampler::field(key).ok_or_else(|| format!("unknown setting {key}"))?;
        (f.set)(&mut SamplerConfig::default(), v)?;
        v.trim()
            .parse::<T>()
            .map_err(|_| format!("`{v}` is not allowed: {}", f.allowed))
    }
}

impl SamplingArgs {
    pub fn config(&self) -> SamplerConfig {
        SamplerConfig {
            temp: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed: self.seed,
            n_predict: self.n_predict,
            stop: self.stop.clone(),
        }
    }
}

/// The prompt, as llama-cli takes it: `-p TEXT`, `-f FILE`, `-p -` or a pipe on stdin; with
/// where it came from, for the message if it is empty. No prompt at all (stdin a terminal) is a
/// usage error, said before any model is loaded.
fn read_prompt(a: &GenerateArgs) -> anyhow::Result<(String, String)> {
    let stdin = || -> anyhow::Result<(String, String)> {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading the prompt from stdin")?;
        Ok((s, "the prompt on stdin".into()))
    };
    match (&a.prompt, &a.file) {
        (Some(p), _) if p == "-" => stdin(),
        (Some(p), _) => Ok((p.clone(), "--prompt".into())),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("reading the prompt from {}", f.display()))
            .map(|t| (t, format!("the prompt file {}", f.display()))),
        (None, None) if !std::io::stdin().is_terminal() => stdin(),
        (None, None) => clap::Error::raw(
            ErrorKind::MissingRequiredArgument,
            "no prompt: give one with -p TEXT, -f FILE, or on stdin (-p - or a pipe)\n",
        )
        .exit(),
    }
}

pub fn run(mut a: GenerateArgs, settings: &Settings) -> anyhow::Result<i32> {
    let sampler = a.sampling.config();
    let (prompt, from) = read_prompt(&a)?;
    if prompt.trim().is_empty() {
        return Err(UsageError(format!(
            "{from} is empty: give the text to continue (with --chat, the message to answer)"
        ))
        .into());
    }
    if a.remote.remote.is_some() {
        let ask = super::remote_cmd::Ask {
            prompt: &prompt,
            system: a.system.as_deref(),
            sampler,
        };
        return super::remote_cmd::generate(&a.remote, &settings.config, ask);
    }
    a.prompt = Some(prompt);
    let mut loaded = load_model(&a.model, &settings.config, sampler)?;
    let r = run_loaded(&a, &mut loaded);
    super::model_args::finish(loaded.session.model_mut(), r)
}

fn run_loaded(a: &GenerateArgs, loaded: &mut Loaded) -> anyhow::Result<i32> {
    let s = &loaded.summary;
    let dev = loaded.session.model.backend().device();
    errln!(
        "model: {} ({}, {}, {:.1} M parameters), context {}, backend: {} ({})",
        s.name,
        s.architecture,
        s.quant,
        s.parameters as f64 / 1e6,
        s.context_length,
        dev.backend,
        if dev.backend == "cpu" {
            format!("{} threads", dev.compute_units.unwrap_or(1))
        } else {
            format!("{} {}", dev.name, dev.arch)
        },
    );
    errln!("load time: {:.1} ms", s.load_time.as_secs_f64() * 1e3);
    let session = &mut loaded.session;
    if let Some(sys) = &a.system {
        session.set_system(sys);
    }
    // Ctrl-C stops the generation (the timings are still printed); a second one exits at once.
    let stop = Arc::new(AtomicBool::new(false));
    let _ = signal_hook::flag::register_conditional_shutdown(
        signal_hook::consts::SIGINT,
        130,
        stop.clone(),
    );
    let _ = signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone());
    // Also between prompt batches and layers: a long prompt stops within one layer.
    session.model.set_interrupt(stop.clone());
    let mut out = std::io::stdout().lock();
    // A failed write (stdout closed: `| head -1`) stops the generation; the command then ends
    // quietly with exit code 0 (see `cli::run`) after the device is shut down.
    let mut write_error: Option<std::io::Error> = None;
    let mut on = |p: Progress| {
        match p {
            Progress::Text(t) => {
                if write_error.is_none()
                    && let Err(e) = out.write_all(t.as_bytes()).and_then(|()| out.flush())
                {
                    write_error = Some(e);
                }
            }
            // A reasoning model's reasoning goes to stderr: stdout holds the answer alone.
            Progress::Reasoning(t) => err!("{t}"),
            Progress::Trimmed(t) => errln!("\n[{t}]"),
            Progress::PromptDone(_) | Progress::Prompt { .. } | Progress::Waiting => {}
        }
        if stop.load(Ordering::Relaxed) || write_error.is_some() {
            Control::Stop
        } else {
            Control::Continue
        }
    };
    let prompt = a.prompt.as_deref().unwrap_or_default();
    let answer = if a.chat {
        session.chat(prompt, &mut on)?
    } else {
        if let Err(e) = out_write(prompt) {
            return Err(e.into());
        }
        session.complete(prompt, &mut on)?
    };
    if let Some(e) = write_error {
        return Err(e.into());
    }
    let mut out = std::io::stdout().lock();
    writeln!(out)?;
    out.flush()?;
    let st = &answer.stats;
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    errln!(
        "prompt: {} tokens ({} cached), {:.1} ms, {:.1} tokens/s",
        st.prompt_tokens,
        st.cached_tokens,
        ms(st.prompt_time),
        st.prompt_tps()
    );
    errln!(
        "generation: {} tokens, {:.1} ms, {:.1} tokens/s",
        st.generated_tokens,
        ms(st.gen_time),
        st.gen_tps()
    );
    errln!("time to first token: {:.1} ms", ms(st.time_to_first_token));
    errln!("stopped: {}", super::remote_cmd::stop_text(&answer.reason));
    Ok(0)
}

/// Echoes the prompt before a raw completion, as llama.cpp does.
fn out_write(prompt: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(prompt.as_bytes())?;
    out.flush()
}
