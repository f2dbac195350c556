//! Command-line interface: `hipscope` (chat), and the headless tools named as llama.cpp names
//! theirs. This file only parses and dispatches: each subcommand's arguments and its `run` live
//! in `app/cmd/<name>.rs`; what several commands share (`ModelArgs`, loading a model, the
//! progress line) in `app/cmd/model_args.rs` and `app/cmd/progress.rs`, which never import this.

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser, Subcommand};

use crate::app::chat::{ChatOptions, run_chat};
use crate::app::chat_args::ChatArgs;
use crate::app::cmd::usage;
use crate::app::config::ConfigError;
use crate::app::discover::{self, Places, names};
use crate::app::settings::Settings;
use crate::app::stderr::errln;
use crate::app::{cmd, exit_code};

#[derive(Parser, Debug)]
#[command(
    name = "hipscope",
    version,
    about = "Chat with a local GGUF model and watch the GPU while it runs",
    long_about = "Chat with a local GGUF model in the terminal and watch the GPU while it runs.\n\nWith no subcommand, opens the chat on the configured model (or the default SmolLM2-135M-Instruct, fetched on first use)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Commands>,
    #[command(flatten)]
    pub chat: ChatArgs,
    /// Settings file, before or after the command (default: `HIPSCOPE_CONFIG`, else config.toml
    /// in the platform config directory).
    #[arg(long, value_name = "FILE", global = true)]
    pub config: Option<std::path::PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum Commands {
    /// Chat in the terminal (the default).
    Chat(ChatArgs),
    /// Generate text from a prompt, streaming it to stdout (headless).
    Generate(cmd::generate::GenerateArgs),
    /// Print the tokens of a text, as llama-tokenize does.
    Tokenize(cmd::tokenize::TokenizeArgs),
    /// Perplexity of a text file, computed as llama-perplexity computes it.
    Perplexity(cmd::perplexity::PerplexityArgs),
    /// Prompt and generation speed, as llama-bench reports them.
    Bench(cmd::bench::BenchArgs),
    /// A long scripted conversation, headless: time, tokens, memory and allocations per turn.
    Soak(cmd::soak::SoakArgs),
    /// Download the default model (SmolLM2-135M-Instruct Q4_1) into the cache.
    Fetch(cmd::fetch_cmd::FetchArgs),
    /// Write a synthetic model (random weights, real shapes) as GGUF.
    Synth(cmd::synth::SynthArgs),
    /// Re-encode a model's weights in another type (e.g. F16), as GGUF.
    Convert(cmd::synth::ConvertArgs),
    /// Show a GGUF file's metadata and tensors.
    Info(cmd::info::InfoArgs),
    /// Check the GPU mechanisms (stream tracking, watchdog, quit, upload verification) on this
    /// machine's GPU with real kernels.
    Selftest(cmd::selftest::SelftestArgs),
    /// List the GPU kernels, or compile them for given targets (--compile --arch gfx1100,gfx1151).
    Kernels(cmd::kernels::KernelsArgs),
    /// An OpenAI-compatible endpoint with continuous batching, and a view of every request.
    Serve(cmd::serve::ServeArgs),
    /// GPU and host telemetry, full screen like nvtop (--json, --once for scripts).
    Top(cmd::top::TopArgs),
    /// Check in a minute whether GPU inference will work here (exit 0 ok, 1 a check failed).
    Doctor(cmd::doctor::DoctorArgs),
    #[command(name = "__doctor-check", hide = true)]
    DoctorCheck(cmd::doctor_child::ChildArgs),
    #[command(name = "__compile-kernels", hide = true)]
    CompileKernels(cmd::kernels::CompileChildArgs),
}

pub fn run() -> i32 {
    let cli = Cli::parse_from(llama_spellings(std::env::args_os()));
    // Every command that reads a setting resolves them here, the one way (`app/settings.rs`);
    // the chat shows the notes on its screen instead of stderr.
    let flag = cli.config.as_deref();
    let settings = || -> anyhow::Result<Settings> {
        let s = Settings::resolve(flag)?;
        for n in &s.notes {
            errln!("hipscope: {n}");
        }
        Ok(s)
    };
    let result = match cli.command {
        Some(Commands::Generate(a)) => settings().and_then(|s| cmd::generate::run(a, &s)),
        Some(Commands::Tokenize(a)) => settings().and_then(|s| cmd::tokenize::run(a, &s)),
        Some(Commands::Perplexity(a)) => settings().and_then(|s| cmd::perplexity::run(a, &s)),
        Some(Commands::Bench(a)) => settings().and_then(|s| cmd::bench::run(a, &s)),
        Some(Commands::Soak(a)) => settings().and_then(|s| cmd::soak::run(a, &s)),
        Some(Commands::Fetch(a)) => settings().and_then(|s| cmd::fetch_cmd::run(a, &s)),
        Some(Commands::Synth(a)) => cmd::synth::run(a),
        Some(Commands::Convert(a)) => cmd::synth::convert(a),
        Some(Commands::Info(a)) => cmd::info::run(a),
        Some(Commands::Top(a)) => settings().and_then(|s| cmd::top::run(a, &s)),
        Some(Commands::Serve(a)) => settings().and_then(|s| cmd::serve::run(a, &s)),
        Some(Commands::Doctor(a)) => Ok(cmd::doctor::run(a)),
        Some(Commands::DoctorCheck(a)) => Ok(cmd::doctor_child::run(a)),
        Some(Commands::Selftest(a)) => Ok(cmd::selftest::selftest(&a)),
        Some(Commands::Kernels(a)) => settings().map(|s| cmd::kernels::kernels(&a, &s)),
        Some(Commands::CompileKernels(a)) => Ok(cmd::kernels::compile_child(&a)),
        Some(Commands::Chat(a)) => Ok(chat(a, flag)),
        None => Ok(chat(cli.chat, flag)),
    };
    match result {
        Ok(code) => code,
        Err(e) if usage::is_broken_pipe(&e) => exit_code::OK,
        Err(e)
            if e.downcast_ref::<usage::UsageError>().is_some()
                || e.downcast_ref::<ConfigError>().is_some() =>
        {
            errln!("error: {e:#}");
            exit_code::USAGE
        }
        Err(e) => {
            errln!("error: {e:#}");
            exit_code::FAILED
        }
    }
}

/// The chat, with the settings resolved as every command resolves them; a file that cannot be
/// used stops it before anything is started (exit code 2), as does a model that is not there.
fn chat(mut args: ChatArgs, config: Option<&std::path::Path>) -> i32 {
    let settings = match Settings::resolve(config) {
        Ok(s) => s,
        Err(e) => {
            errln!("hipscope: {e}");
            return exit_code::USAGE;
        }
    };
    if let Err(e) = resolve_chat_model(&mut args, &settings) {
        // Before anything is written: no config file, no conversation, no log.
        e.exit();
    }
    run_chat(ChatOptions { args, settings })
}

/// llama.cpp's multi-letter short flags, which clap cannot declare, as their long names:
/// `-ngl N` → `--n-gpu-layers N`, `-sm`, `-ts`, `-mg` → `--split-mode`, `--tensor-split`,
/// `--main-gpu` (up to a `--`, after which everything is a value).
pub fn llama_spellings(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    let mut rest = false;
    args.into_iter()
        .map(|a| {
            if a == "--" {
                rest = true;
            }
            if rest {
                return a;
            }
            const SPELLINGS: [(&str, &str); 4] = [
                ("-ngl", "--n-gpu-layers"),
                ("-sm", "--split-mode"),
                ("-ts", "--tensor-split"),
                ("-mg", "--main-gpu"),
            ];
            let Some(s) = a.to_str() else { return a };
            for (short, long) in SPELLINGS {
                if s == short {
                    return long.into();
                }
                if let Some(v) = s.strip_prefix(short).and_then(|r| r.strip_prefix('=')) {
                    return format!("{long}={v}").into();
                }
            }
            a
        })
        .collect()
}

/// The chat's model argument, checked before anything is written: a file is taken as it is; a
/// name that is not a file is looked up among the models discovery finds (`hipscope llama3.2`:
/// ollama's `llama3.2:latest`) and replaced by its file; a bare word that names neither a model
/// nor a command (`hipscope serve`) is a mistyped command; anything else is a model that is not
/// there, with the closest names found. The failures are usage errors (exit 2). The commands are
/// clap's own list, so a command added later is never "unknown".
fn resolve_chat_model(args: &mut ChatArgs, settings: &Settings) -> Result<(), clap::Error> {
    let Some(path) = args.model_path().cloned() else {
        return Ok(());
    };
    if path.exists() {
        return Ok(());
    }
    let mut cmd = Cli::command();
    let word = path.to_string_lossy().into_owned();
    let lookup = names::may_be_a_name(&path).then(|| {
        let places = Places::for_names(&settings.config);
        discover::find_named(&word, &places)
    });
    let not_found = match lookup {
        Some(Ok(found)) => {
            errln!("hipscope: {word}: {}", found.label);
            match (&mut args.model, &mut args.model_flag) {
                (Some(m), _) | (None, Some(m)) => *m = found.path,
                (None, None) => {}
            }
            return Ok(());
        }
        Some(Err(e @ names::NameError::Ambiguous { .. })) => {
            return Err(cmd.error(ErrorKind::InvalidValue, e.to_string()));
        }
        Some(Err(e)) => Some(e),
        None => None,
    };
    let is_bare_word = args.model.is_some()
        && !word.is_empty()
        && !word.contains(['/', '.', ':', std::path::MAIN_SEPARATOR]);
    let model_hint = not_found.as_ref().map(names::NameError::hint);
    if !is_bare_word {
        let msg = match &not_found {
            Some(e) if !word.to_lowercase().ends_with(".gguf") => e.to_string(),
            _ => format!(
                "model file not found: {}{}",
                path.display(),
                model_hint.unwrap_or_default()
            ),
        };
        return Err(cmd.error(ErrorKind::InvalidValue, msg));
    }
    let names: Vec<String> = cmd
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(|c| c.get_name().to_string())
        .collect();
    let close = closest_commands(&word, &names);
    let hint = if close.is_empty() {
        format!("the commands are {}", names.join(", "))
    } else {
        format!("did you mean {}?", close.join(" or "))
    };
    Err(cmd.error(
        ErrorKind::InvalidSubcommand,
        format!(
            "unknown command '{word}' (and no file or model of that name): {hint}\n  \
             (`hipscope --help` lists the commands; a model file named so is given as ./{word}; \
             F2 in the chat lists the models found)"
        ),
    ))
}

/// The commands most like `word`: spelling (Jaro–Winkler, as clap's own suggestions) and the
/// words that users of ollama and llama.cpp type for them; only names in `names` are offered.
fn closest_commands(word: &str, names: &[String]) -> Vec<String> {
    const HABITS: &[(&str, &str)] = &[
        ("pull", "fetch"),
        ("download", "fetch"),
        ("run", "chat"),
        ("show", "info"),
        ("quantize", "convert"),
        ("complete", "generate"),
        ("completion", "generate"),
    ];
    let word = word.to_ascii_lowercase();
    let mut scored: Vec<(f64, &String)> = names
        .iter()
        .map(|n| (strsim::jaro_winkler(&word, n), n))
        .filter(|(s, _)| *s >= 0.8)
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut out: Vec<String> = HABITS
        .iter()
        .filter(|(w, _)| *w == word)
        .map(|(_, c)| c.to_string())
        .filter(|c| names.contains(c))
        .collect();
    for (_, n) in scored {
        if !out.contains(n) {
            out.push(n.clone());
        }
    }
    out.truncate(3);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        Cli::command()
            .get_subcommands()
            .map(|c| c.get_name().to_string())
            .collect()
    }

    #[test]
    fn close_commands_come_from_spelling_and_habits() {
        let n = names();
        assert_eq!(closest_commands("generat", &n), ["generate"]);
        assert_eq!(closest_commands("pull", &n), ["fetch"]);
        assert_eq!(closest_commands("benchmark", &n), ["bench"]);
        assert!(closest_commands("xyzzy", &n).is_empty());
    }

    #[test]
    fn every_command_name_is_accepted_as_a_command() {
        for name in names().iter().filter(|n| !n.starts_with("__")) {
            let cli = Cli::try_parse_from(["hipscope", name.as_str(), "--help"]);
            // `--help` ends the parse with DisplayHelp: the word was taken as a command.
            assert_eq!(
                cli.err().map(|e| e.kind()),
                Some(ErrorKind::DisplayHelp),
                "{name}"
            );
        }
    }

    /// The README's section "## Commands".
    fn readme_commands_section() -> &'static str {
        let readme = include_str!("../../README.md");
        let section = &readme[readme.find("\n## Commands\n").expect("a Commands section") + 1..];
        &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)]
    }

    /// Whether `cmd` takes `flag` as the README writes it (`-c`, `--kv-type`, `-ngl`).
    fn takes(cmd: &clap::Command, flag: &str) -> bool {
        let spelled = llama_spellings([std::ffi::OsString::from(flag)]);
        let flag = spelled[0].to_str().unwrap_or_default();
        if let Some(long) = flag.strip_prefix("--") {
            cmd.get_arguments().any(|a| {
                a.get_long() == Some(long)
                    || a.get_visible_aliases().is_some_and(|v| v.contains(&long))
            })
        } else if let Some(short) = flag.strip_prefix('-').filter(|s| s.len() == 1) {
            let c = short.chars().next();
            cmd.get_arguments().any(|a| a.get_short() == c)
        } else {
            false
        }
    }

    /// The README's "Commands" table names every subcommand (the chat has its own section),
    /// and every flag a row shows is one that subcommand takes.
    #[test]
    fn readme_command_table_matches_the_program() {
        let section = readme_commands_section();
        let cli = Cli::command();
        let mut listed = Vec::new();
        for row in section.lines().filter(|l| l.starts_with("| `hipscope ")) {
            let usage = row.split('`').nth(1).unwrap_or_default();
            let mut words = usage.split_whitespace().skip(1);
            let name = words.next().unwrap_or_default();
            let cmd = cli.find_subcommand(name).unwrap_or_else(|| {
                panic!("README lists `hipscope {name}`, which is not a command")
            });
            listed.push(name.to_string());
            for word in words {
                let flag = word.trim_matches(|c| matches!(c, '[' | ']' | '(' | ')' | '\\' | '|'));
                if flag.starts_with('-') && flag.len() > 1 {
                    assert!(takes(cmd, flag), "README: `hipscope {name}` has no {flag}");
                }
            }
        }
        for c in cli.get_subcommands().filter(|c| !c.is_hide_set()) {
            let name = c.get_name().to_string();
            if !["chat", "help"].contains(&name.as_str()) {
                assert!(
                    listed.contains(&name),
                    "README's table lacks `hipscope {name}`"
                );
            }
        }
    }

    /// The README's paragraph "Flags of every command that runs a model": every command it names
    /// (and no command that runs a model is left out) takes every flag of its first list, and
    /// the flags it gives the headless commands alone are theirs and not the chat's (issue 32
    /// item 7: it promised the chat `-b` and `--synthetic`, which the chat refused).
    #[test]
    fn readme_model_flags_match_every_command_that_runs_a_model() {
        let section = readme_commands_section();
        let start = section
            .find("**Flags of every command that runs a model**")
            .expect("the model flags paragraph");
        let para = &section[start..];
        let para = &para[..para.find("\n\n").unwrap_or(para.len())];
        let (shared, rest) = para
            .split_once("The headless ones also take")
            .expect("the headless commands' own flags");
        let (headless, _) = rest
            .split_once("the chat does not")
            .expect("the headless flags end with \"the chat does not\"");
        let spans = |t: &'static str| t.split('`').skip(1).step_by(2).collect::<Vec<_>>();
        let flags = |t: &'static str| -> Vec<String> {
            spans(t)
                .into_iter()
                .filter(|s| s.starts_with('-'))
                .map(|s| s.split_whitespace().next().unwrap_or_default().to_string())
                .collect()
        };
        let cli = Cli::command();
        let (names_part, _) = shared
            .split_once(':')
            .expect("the commands, then the flags");
        let named: Vec<&str> = spans(names_part)
            .into_iter()
            .filter(|s| cli.find_subcommand(s).is_some())
            .collect();
        // Every command that runs a model (it takes --synthetic) is named.
        for c in cli.get_subcommands() {
            if c.get_arguments().any(|a| a.get_long() == Some("synthetic")) {
                assert!(
                    named.contains(&c.get_name()),
                    "README's model flags leave out `{}`",
                    c.get_name()
                );
            }
        }
        assert!(names_part.contains("the chat"), "{names_part}");
        let chat = cli.find_subcommand("chat").expect("chat");
        let shared = flags(shared);
        let headless = flags(headless);
        assert!(
            shared.len() >= 8 && !headless.is_empty(),
            "{shared:?} {headless:?}"
        );
        for name in &named {
            let cmd = cli.find_subcommand(name).expect("named above");
            for f in shared.iter().chain(&headless) {
                assert!(takes(cmd, f), "README: `hipscope {name}` has no {f}");
            }
        }
        for f in &shared {
            assert!(takes(chat, f), "README: the chat has no {f}");
            // `hipscope -b 256` as well as `hipscope chat -b 256`.
            assert!(takes(&cli, f), "README: `hipscope` has no {f}");
        }
        for f in &headless {
            assert!(
                !takes(chat, f),
                "README says the chat lacks {f}, but it takes it"
            );
        }
    }
}
