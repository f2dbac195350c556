//! `hipscope info`: a GGUF file's metadata and tensors.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use clap::Args;

use crate::model::config::ModelConfig;
use crate::model::gguf::GgufFile;

#[derive(Args, Debug)]
pub struct InfoArgs {
    /// GGUF file.
    pub model: PathBuf,
    /// List every tensor.
    #[arg(long)]
    pub tensors: bool,
}

pub fn run(a: InfoArgs) -> anyhow::Result<i32> {
    let f = GgufFile::open(&a.model)?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{}: GGUF v{}, {} metadata keys, {} tensors, {:.2} M parameters, alignment {}",
        a.model.display(),
        f.version(),
        f.metadata().len(),
        f.tensors().len(),
        f.parameter_count() as f64 / 1e6,
        f.alignment()
    )?;
    // What llama.cpp calls the file (`print_info: file type = …`).
    let source = match f.get_u64("general.file_type") {
        Some(v) if crate::model::gguf::ftype::ftype_name(v as u32).is_some() => {
            format!("general.file_type {v}")
        }
        Some(v) => format!("general.file_type {v} unknown: the type most bytes have"),
        None => "no general.file_type: the type most bytes have".to_string(),
    };
    writeln!(
        out,
        "file type: {} ({source})",
        f.type_label().unwrap_or_else(|| "?".into())
    )?;
    for (k, v) in f.metadata() {
        writeln!(out, "  {k:<44} {}", v.summary())?;
    }
    let mut by_type: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    for t in f.tensors() {
        let e = by_type.entry(t.ty.name()).or_default();
        e.0 += 1;
        e.1 += t.size;
    }
    writeln!(out, "tensor types:")?;
    for (ty, (n, bytes)) in by_type {
        writeln!(
            out,
            "  {ty:<8} {n:5} tensors  {:10.2} MiB",
            bytes as f64 / (1 << 20) as f64
        )?;
    }
    if a.tensors {
        for t in f.tensors() {
            writeln!(
                out,
                "  {:<40} {:<8} {:?} at {}",
                t.name,
                t.ty.name(),
                t.dims,
                f.data_offset() + t.offset
            )?;
        }
    }
    match ModelConfig::from_gguf(&f).and_then(|c| c.check_tensors(&f).map(|_| c)) {
        Ok(c) => writeln!(
            out,
            "runnable: {} ({} layers, dim {}, {} heads / {} kv heads, vocab {}, trained context {})",
            c.arch_name, c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.vocab_size, c.train_ctx
        )?,
        Err(e) => writeln!(out, "not runnable here: {e}")?,
    }
    out.flush()?;
    Ok(0)
}
