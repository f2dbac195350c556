//! Command-line interface: `hipscope` (chat), and the headless tools named as llama.cpp names
//! theirs. This file only parses and dispatches: each subcommand's arguments and its `run` live
//! in `app/cmd/<name>.rs`; what several commands share (`ModelArgs`, loading a model, the
//! progress line) in `app/cmd/model_args.rs` and `app/cmd/progress.rs`, which never import this.

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser, Subcommand};

use crate::app::chat::{ChatOptions, run_chat};
use crate::app::chat_args::ChatArgs;
use crate::app::cmd::usage;
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
    let chat = match &cli.command {
        None => Some(&cli.chat),
        Some(Commands::Chat(a)) => Some(a),
        _ => None,
    };
    if let Some(e) = chat.and_then(|a| refuse_chat_model(a).err()) {
        // Before anything is written: no config file, no conversation, no log.
        e.exit();
    }
    let result = match cli.command {
        Some(Commands::Generate(a)) => cmd::generate::run(a),
        Some(Commands::Tokenize(a)) => cmd::tokenize::run(a),
        Some(Commands::Perplexity(a)) => cmd::perplexity::run(a),
        Some(Commands::Bench(a)) => cmd::bench::run(a),
        Some(Commands::Soak(a)) => cmd::soak::run(a),
        Some(Commands::Fetch(a)) => cmd::fetch_cmd::run(a),
        Some(Commands::Synth(a)) => cmd::synth::run(a),
        Some(Commands::Convert(a)) => cmd::synth::convert(a),
        Some(Commands::Info(a)) => cmd::info::run(a),
        Some(Commands::Top(a)) => cmd::top::run(a),
        Some(Commands::Serve(a)) => cmd::serve::run(a),
        Some(Commands::Doctor(a)) => Ok(cmd::doctor::run(a)),
        Some(Commands::DoctorCheck(a)) => Ok(cmd::doctor_child::run(a)),
        Some(Commands::Selftest(a)) => Ok(cmd::selftest::selftest(&a)),
        Some(Commands::Kernels(a)) => Ok(cmd::kernels::kernels(&a)),
        Some(Commands::CompileKernels(a)) => Ok(cmd::kernels::compile_child(&a)),
        Some(Commands::Chat(a)) => Ok(run_chat(ChatOptions::new(a))),
        None => Ok(run_chat(ChatOptions::new(cli.chat))),
    };
    match result {
        Ok(code) => code,
        Err(e) if usage::is_broken_pipe(&e) => exit_code::OK,
        Err(e) if e.downcast_ref::<usage::UsageError>().is_some() => {
            eprintln!("error: {e:#}");
            exit_code::USAGE
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            exit_code::FAILED
        }
    }
}

/// llama.cpp's multi-letter short flags, which clap cannot declare, as their long names:
/// `-ngl N` → `--n-gpu-layers N` (up to a `--`, after which everything is a value).
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
            match a.to_str() {
                Some("-ngl") => "--n-gpu-layers".into(),
                Some(s) if s.starts_with("-ngl=") => format!("--n-gpu-layers={}", &s[5..]).into(),
                _ => a,
            }
        })
        .collect()
}

/// The chat's model argument, checked before anything is written: a bare word that is neither a
/// file nor a command (`hipscope serve`) is a mistyped command, and a model file that does not
/// exist is refused here rather than in a chat that could never load it. Both are usage errors
/// (exit 2). The commands are clap's own list, so a command added later is never "unknown".
fn refuse_chat_model(args: &ChatArgs) -> Result<(), clap::Error> {
    let Some(path) = args.model_path() else {
        return Ok(());
    };
    if path.exists() {
        return Ok(());
    }
    let mut cmd = Cli::command();
    let word = path.to_string_lossy();
    let is_bare_word = args.model.is_some()
        && !word.is_empty()
        && !word.contains(['/', '.', std::path::MAIN_SEPARATOR]);
    if !is_bare_word {
        return Err(cmd.error(
            ErrorKind::InvalidValue,
            format!("model file not found: {}", path.display()),
        ));
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
            "unknown command '{word}' (and no file of that name): {hint}\n  \
             (`hipscope --help` lists the commands; a model file named so is given as ./{word})"
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

    /// The README's "Headless tools" table names every subcommand (the chat has its own
    /// section), and every flag a row shows is one that subcommand takes.
    #[test]
    fn readme_command_table_matches_the_program() {
        let readme = include_str!("../../README.md");
        let section = &readme[readme
            .find("## Headless tools")
            .expect("a Headless tools section")..];
        let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
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
                let takes = if let Some(long) = flag.strip_prefix("--") {
                    cmd.get_arguments().any(|a| a.get_long() == Some(long))
                } else if let Some(short) = flag.strip_prefix('-').filter(|s| s.len() == 1) {
                    let c = short.chars().next();
                    cmd.get_arguments().any(|a| a.get_short() == c)
                } else {
                    continue;
                };
                assert!(takes, "README: `hipscope {name}` has no {flag}");
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
}
