//! `hipscope tokenize`: the token ids and pieces of a text, as llama-tokenize prints them.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::model::gguf::GgufFile;
use crate::model::tokenizer::Tokenizer;

#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// GGUF model (or vocabulary-only GGUF) file (default: the configured model, else
    /// SmolLM2-135M-Instruct, fetched on first use).
    #[arg(short = 'm', long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// Treat special-token text such as `<|im_start|>` as plain text.
    #[arg(long = "no-special")]
    pub no_special: bool,
    /// Do not add the BOS/EOS tokens the model asks for.
    #[arg(long = "no-bos")]
    pub no_bos: bool,
    /// Print only the ids, as a list.
    #[arg(long)]
    pub ids: bool,
    /// Print the number of tokens at the end.
    #[arg(long = "show-count")]
    pub show_count: bool,
    /// Read the text from this file instead.
    #[arg(short = 'f', long, value_name = "FILE", conflicts_with = "text")]
    pub file: Option<PathBuf>,
    /// The text to tokenize.
    #[arg(required_unless_present = "file")]
    pub text: Option<String>,
}

pub fn run(a: TokenizeArgs, settings: &crate::app::settings::Settings) -> anyhow::Result<i32> {
    let file = GgufFile::open(&super::model_args::model_path(
        a.model.as_ref(),
        &settings.config,
    )?)?;
    let tok = Tokenizer::from_gguf(&file)?;
    let text = match (&a.file, &a.text) {
        (Some(f), _) => {
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?
        }
        (None, Some(t)) => t.clone(),
        (None, None) => String::new(),
    };
    let ids = tok.encode(&text, !a.no_bos, !a.no_special);
    let mut out = std::io::stdout().lock();
    if a.ids {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        writeln!(out, "[{}]", list.join(", "))?;
    } else {
        for &id in &ids {
            let piece = String::from_utf8_lossy(&tok.piece(id, true)).into_owned();
            writeln!(out, "{id:6} -> '{piece}'")?;
        }
    }
    if a.show_count {
        writeln!(out, "Total number of tokens: {}", ids.len())?;
    }
    Ok(0)
}
