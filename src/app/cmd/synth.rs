//! `hipscope synth` writes a synthetic model; `hipscope convert` re-encodes a model's weights.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use super::progress::ProgressLine;
use super::usage::UsageError;
use crate::app::stderr::errln;
use crate::gpu::atomic_file::{self, Replace};
use crate::gpu::quant::{self, GgmlType};
use crate::model::gguf::{GgufFile, GgufWriter, TensorSpec, Value};
use crate::model::synthetic;

#[derive(Args, Debug)]
pub struct SynthArgs {
    /// Shape: tiny, tiny-qwen2, tiny-llama3, smollm2-135m, qwen2.5-0.5b, llama-3.2-1b, llama-2-7b,
    /// qwen3-0.6b, gemma3-1b, gemma2-2b, phi3-mini, phi4-mini, tiny-qwen3, tiny-gemma2,
    /// tiny-gemma3, tiny-phi3; mixtures of experts: qwen3-30b-a3b, qwen3-30b-a3b-2l (its first 2
    /// layers), mixtral-tiny, mixtral-tiny-2l, tiny-qwen3moe; gpt-oss (MXFP4 experts, CPU backend
    /// only): gpt-oss-20b, gpt-oss-20b-2l, tiny-gpt-oss.
    pub name: String,
    /// Weight type (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
    /// IQ4_NL, IQ4_XS, MXFP4), or Q4_K_M: llama-quantize's mix (Q6_K output, Q6_K attn_v and
    /// ffn_down in some layers, Q4_K elsewhere).
    #[arg(long, default_value = "Q8_0")]
    pub quant: String,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output file (written beside it and renamed into place when whole).
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: PathBuf,
    /// Threads that quantize (0: every core). The file is the same whatever the count.
    #[arg(short = 't', long, value_name = "N", default_value_t = 0)]
    pub threads: usize,
}

pub fn run(a: SynthArgs) -> anyhow::Result<i32> {
    let shape = synthetic::shape(&a.name).map_err(|e| UsageError(e.to_string()))?;
    let ty = synthetic::recipe(&a.quant).map_err(|e| UsageError(e.to_string()))?;
    let mut bar = ProgressLine::new("writing");
    synthetic::write_file_threads(shape, ty, a.seed, a.threads, &a.output, &mut |f, t| {
        bar.update(f, t)
    })?;
    bar.finish();
    let size = std::fs::metadata(&a.output).map(|m| m.len()).unwrap_or(0);
    errln!(
        "wrote {} ({} {}, {:.1} MiB)",
        a.output.display(),
        shape.name,
        ty,
        size as f64 / (1 << 20) as f64
    );
    Ok(0)
}

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// Input GGUF.
    pub input: PathBuf,
    /// Type for the weight matrices (vectors such as norms stay F32).
    #[arg(long = "type", value_name = "TYPE")]
    pub ty: String,
    /// Output file.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: PathBuf,
    /// Re-quantize weights that are already quantized (as llama-quantize's flag): the result is
    /// worse than quantizing the original F32/F16/BF16 weights to the same type.
    #[arg(long)]
    pub allow_requantize: bool,
}

/// Why re-quantizing `f`'s quantized matrices to `to` is refused, if it is: a quantized weight
/// carries the first quantization's error, which quantizing again adds to (llama-quantize refuses
/// the same without `--allow-requantize`). Widening to a float type loses nothing and is allowed.
fn requantize_refusal(f: &GgufFile, to: GgmlType) -> Option<String> {
    if to.block_len() == 1 {
        return None;
    }
    let mut quantized: Vec<&str> = f
        .tensors()
        .iter()
        .filter(|t| t.dims.len() >= 2 && t.ty.block_len() > 1 && t.ty != to)
        .map(|t| t.ty.name())
        .collect();
    quantized.sort_unstable();
    quantized.dedup();
    (!quantized.is_empty()).then(|| {
        format!(
            "its weights are already quantized ({}): quantizing them again to {to} adds a second \
             rounding error to the first and loses quality; convert the F32/F16/BF16 original \
             instead, or pass --allow-requantize to do it anyway",
            quantized.join(", ")
        )
    })
}

pub fn convert(a: ConvertArgs) -> anyhow::Result<i32> {
    let ty = synthetic::quant_type(&a.ty).map_err(|e| UsageError(e.to_string()))?;
    // The input is memory-mapped while the output is written: writing over it would tear the
    // pages being read (SIGBUS). Through the temporary file below it would survive, but the
    // user surely meant another name.
    if atomic_file::same_file(&a.input, &a.output) {
        return Err(UsageError(format!(
            "convert: the output {} is the input file {}; name another output",
            a.output.display(),
            a.input.display()
        ))
        .into());
    }
    let f = GgufFile::open(&a.input)?;
    if !a.allow_requantize
        && let Some(why) = requantize_refusal(&f, ty)
    {
        anyhow::bail!("not converting {}: {why}", a.input.display());
    }
    let mut meta: Vec<(String, Value)> = f
        .metadata()
        .iter()
        .filter(|(k, _)| k != "general.alignment")
        .cloned()
        .collect();
    // The file's type is the one its matrices now have, as llama-quantize writes it.
    if let Some(ft) = meta.iter_mut().find(|(k, _)| k == "general.file_type") {
        ft.1 = Value::U32(crate::model::gguf::ftype::ftype_of(ty));
    }
    let plan: Vec<(TensorSpec, GgmlType)> = f
        .tensors()
        .iter()
        .map(|t| {
            let (_, cols) = t.rows_cols();
            let target = if t.dims.len() < 2 {
                t.ty
            } else {
                synthetic::type_for(ty, cols)
            };
            (TensorSpec::new(&t.name, &t.dims, target), t.ty)
        })
        .collect();
    let specs: Vec<TensorSpec> = plan.iter().map(|(s, _)| s.clone()).collect();
    let mut bar = ProgressLine::new("converting");
    // Written beside the output and renamed into place at the end: an interrupted or failed
    // convert leaves no torn output (and an existing one as it was).
    atomic_file::write(&a.output, Replace::Allow, |out| -> anyhow::Result<()> {
        let mut w = GgufWriter::new(std::io::BufWriter::new(out), &meta, &specs)?;
        let mut floats = Vec::new();
        for (i, (t, (spec, from))) in f.tensors().iter().zip(&plan).enumerate() {
            bar.update(i as f32 / plan.len() as f32, &t.name);
            let data = f.tensor_data(t);
            if spec.ty == *from {
                w.write_tensor(data)?;
                continue;
            }
            floats.resize(t.n_elements() as usize, 0.0);
            quant::dequantize(*from, data, &mut floats)
                .with_context(|| format!("{}: tensor {}", a.input.display(), t.name))?;
            let q = quant::quantize(spec.ty, &floats)
                .with_context(|| format!("quantizing {} to {}", t.name, spec.ty))?;
            w.write_tensor(&q)?;
        }
        w.finish()?;
        Ok(())
    })
    .with_context(|| format!("writing {}", a.output.display()))?;
    bar.finish();
    errln!("wrote {}", a.output.display());
    Ok(0)
}
