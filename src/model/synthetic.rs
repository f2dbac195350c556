//! (Over 700 lines on purpose: the writer of a synthetic file — metadata, vocabulary, chat
//! format and tensors of each family — reads top to bottom as the GGUF it writes; the shapes
//! table is apart in `synthetic/shapes.rs`, each matrix's weight type (one type, or llama.cpp's
//! Q4_K_M mix) in `synthetic/recipe.rs`.)
//!
//! Synthetic models: random weights in the exact shapes of real ones, with a byte-level BPE
//! vocabulary of the real size and the family's control tokens and chat format, written as GGUF so that other engines (llama.cpp)
//! can run the same file. For quick checks, tests and benchmarks without downloads.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::gpu::quant::{self, GgmlType};
use crate::model::gguf::{Array, GgufFile, GgufWriter, TensorSpec, Value, ValueType};
use crate::model::sampler::Rng;

mod recipe;
mod shapes;
pub use recipe::Recipe;
pub use shapes::{SHAPES, Shape};

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("unknown synthetic model {0:?} (known: {1})")]
    UnknownShape(String, String),
    #[error("unknown quant type {0:?} (supported: {1})")]
    UnknownQuant(String, String),
    #[error("writing {path}: {cause}")]
    Io { path: String, cause: std::io::Error },
    #[error("quantizing {tensor}: {message}")]
    Quant { tensor: String, message: String },
}

pub fn shape(name: &str) -> Result<&'static Shape, SynthError> {
    SHAPES.iter().find(|s| s.name == name).ok_or_else(|| {
        let known: Vec<&str> = SHAPES.iter().map(|s| s.name).collect();
        SynthError::UnknownShape(name.into(), known.join(", "))
    })
}

/// The weight types a synthetic model can be made of.
pub fn quant_type(name: &str) -> Result<GgmlType, SynthError> {
    GgmlType::from_name(name)
        .filter(|&t| quant::is_supported(t))
        .ok_or_else(|| {
            let ok: Vec<&str> = GgmlType::all()
                .filter(|&t| quant::is_supported(t))
                .map(GgmlType::name)
                .collect();
            SynthError::UnknownQuant(name.into(), ok.join(", "))
        })
}

/// What `synth` makes a file of: a weight type, or `Q4_K_M` (llama.cpp's mix).
pub fn recipe(name: &str) -> Result<Recipe, SynthError> {
    if name.eq_ignore_ascii_case("Q4_K_M") {
        return Ok(Recipe::Q4KM);
    }
    quant_type(name).map(Recipe::Pure).map_err(|e| match e {
        SynthError::UnknownQuant(n, ok) => SynthError::UnknownQuant(n, format!("{ok}, Q4_K_M")),
        e => e,
    })
}

/// The type a matrix with rows of `cols` gets when `ty` is asked for: K-quants need rows that are
/// whole 256-element super-blocks, so narrower ones fall back as llama-quantize falls back.
pub fn type_for(ty: GgmlType, cols: usize) -> GgmlType {
    if cols.is_multiple_of(ty.block_len()) {
        return ty;
    }
    match ty {
        GgmlType::Q4K => GgmlType::Q5_0,
        GgmlType::Q5K => GgmlType::Q5_1,
        GgmlType::Q6K => GgmlType::Q8_0,
        GgmlType::Q2K | GgmlType::Q3K => GgmlType::Q4_0,
        GgmlType::Iq4Xs => GgmlType::Iq4Nl,
        _ => GgmlType::F16,
    }
}

struct Tensor {
    spec: TensorSpec,
    /// Uniform weights in [-scale, scale], plus `offset` (norm weights sit around 1).
    scale: f32,
    offset: f32,
}

/// The tensors llama.cpp's converter writes for the shape's architecture, in its names.
fn tensors(s: &Shape, ty: Recipe) -> Vec<Tensor> {
    let (d, ff, v) = (s.dim as u64, s.ffn_dim as u64, s.vocab as u64);
    let hd = s.head_dim() as u64;
    let q = s.n_heads as u64 * hd;
    let kv = s.n_kv_heads as u64 * hd;
    // Weights of std 1/sqrt(fan_in) keep activations near unit scale; uniform [-a, a] has std
    // a/sqrt(3).
    let mat = |name: String, cols: u64, rows: u64| Tensor {
        spec: TensorSpec::new(
            name.clone(),
            &[cols, rows],
            ty.matrix_type(s, &name, cols as usize),
        ),
        scale: (3.0 / cols as f32).sqrt(),
        offset: 0.0,
    };
    let vec_ = |name: String, len: u64, offset: f32, scale: f32| Tensor {
        spec: TensorSpec::new(name, &[len], GgmlType::F32),
        scale,
        offset,
    };
    let (phi3, gemma, oss) = (
        s.arch == "phi3",
        s.arch.starts_with("gemma"),
        s.arch == "gpt-oss",
    );
    let qk_norm = matches!(s.arch, "qwen3" | "qwen3moe" | "gemma3");
    // The router stays f32, as the converter keeps `ffn_gate_inp` (and llama-quantize leaves it).
    let router = |name: String, rows: u64| Tensor {
        spec: TensorSpec::new(name, &[d, rows], GgmlType::F32),
        scale: (3.0 / d as f32).sqrt(),
        offset: 0.0,
    };
    let (ne, eff) = (s.n_expert as u64, s.expert_ffn() as u64);
    // gpt-oss's experts are MXFP4 whatever the rest is, as the converter writes them.
    let exps_ty = |name: &str, cols: u64| {
        if oss {
            GgmlType::Mxfp4
        } else {
            ty.matrix_type(s, name, cols as usize)
        }
    };
    let exps = |name: String, cols: u64, rows: u64| Tensor {
        spec: TensorSpec::new(name.clone(), &[cols, rows, ne], exps_ty(&name, cols)),
        scale: (3.0 / cols as f32).sqrt(),
        offset: 0.0,
    };
    // gpt-oss's biases and sinks: f32, as the converter keeps them.
    let f32_2d = |name: String, cols: u64, rows: u64, scale: f32| Tensor {
        spec: TensorSpec::new(name, &[cols, rows], GgmlType::F32),
        scale,
        offset: 0.0,
    };
    let mut t = vec![mat("token_embd.weight".into(), d, v)];
    for l in 0..s.n_layers {
        let n = |x: &str| format!("blk.{l}.{x}");
        t.push(vec_(n("attn_norm.weight"), d, 1.0, 0.1));
        if phi3 {
            t.push(mat(n("attn_qkv.weight"), d, q + 2 * kv));
        } else {
            t.push(mat(n("attn_q.weight"), d, q));
            t.push(mat(n("attn_k.weight"), d, kv));
            t.push(mat(n("attn_v.weight"), d, kv));
        }
        if s.qkv_bias {
            t.push(vec_(n("attn_q.bias"), q, 0.0, 0.1));
            t.push(vec_(n("attn_k.bias"), kv, 0.0, 0.1));
            t.push(vec_(n("attn_v.bias"), kv, 0.0, 0.1));
        }
        if qk_norm {
            t.push(vec_(n("attn_q_norm.weight"), hd, 1.0, 0.1));
            t.push(vec_(n("attn_k_norm.weight"), hd, 1.0, 0.1));
        }
        t.push(mat(n("attn_output.weight"), q, d));
        if oss {
            t.push(vec_(n("attn_output.bias"), d, 0.0, 0.1));
            t.push(vec_(n("attn_sinks.weight"), s.n_heads as u64, 0.0, 2.0));
        }
        if gemma || oss {
            t.push(vec_(n("post_attention_norm.weight"), d, 1.0, 0.1));
        }
        if !oss {
            t.push(vec_(n("ffn_norm.weight"), d, 1.0, 0.1));
        }
        if ne > 0 {
            // The router, then the merged experts in the order Qwen's converter writes them.
            t.push(router(n("ffn_gate_inp.weight"), ne));
            t.push(exps(n("ffn_down_exps.weight"), eff, d));
            t.push(exps(n("ffn_gate_exps.weight"), d, eff));
            t.push(exps(n("ffn_up_exps.weight"), d, eff));
            if oss {
                t.push(vec_(n("ffn_gate_inp.bias"), ne, 0.0, 0.5));
                t.push(f32_2d(n("ffn_down_exps.bias"), d, ne, 0.1));
                t.push(f32_2d(n("ffn_gate_exps.bias"), eff, ne, 0.1));
                t.push(f32_2d(n("ffn_up_exps.bias"), eff, ne, 0.1));
            }
        } else if phi3 {
            // gate_up_proj as the converter keeps it: gate rows, then up rows.
            t.push(mat(n("ffn_up.weight"), d, 2 * ff));
        } else {
            t.push(mat(n("ffn_gate.weight"), d, ff));
            t.push(mat(n("ffn_up.weight"), d, ff));
        }
        if ne == 0 {
            t.push(mat(n("ffn_down.weight"), ff, d));
        }
        if gemma {
            t.push(vec_(n("post_ffw_norm.weight"), d, 1.0, 0.1));
        }
    }
    t.push(vec_("output_norm.weight".into(), d, 1.0, 0.1));
    if !s.tied {
        t.push(mat("output.weight".into(), d, v));
    }
    let pairs = s.rot_dims() as u64 / 2;
    if s.llama3_rope.is_some() {
        t.push(vec_("rope_freqs.weight".into(), pairs, 0.0, 0.0));
    }
    if s.long_rope.is_some() {
        t.push(vec_("rope_factors_long.weight".into(), pairs, 0.0, 0.0));
        t.push(vec_("rope_factors_short.weight".into(), pairs, 0.0, 0.0));
    }
    t
}

/// LongRoPE factors of the shape's length, shaped like Phi-3's: short ones near 1, long ones
/// growing with the pair's wavelength up to about the context ratio.
fn long_rope_factors(s: &Shape, long: bool) -> Vec<f32> {
    let pairs = s.rot_dims() / 2;
    let ratio = s.long_rope.map_or(1.0, |orig| s.ctx as f32 / orig as f32);
    (0..pairs)
        .map(|i| {
            let x = i as f32 / pairs.max(1) as f32;
            if long {
                1.0 + (ratio - 1.0) * x * x
            } else {
                1.0 + 0.1 * x * x
            }
        })
        .collect()
}

/// `rope.scaling.attn_factor` as llama.cpp's converter computes it for su/longrope.
fn long_rope_attn_factor(s: &Shape) -> Option<f32> {
    let orig = s.long_rope? as f64;
    let scale = s.ctx as f64 / orig;
    Some(if scale > 1.0 {
        (1.0 + scale.ln() / orig.ln()).sqrt() as f32
    } else {
        1.0
    })
}

/// llama 3.1 RoPE frequency factors, as llama.cpp's converter computes them.
fn llama3_freq_factors(s: &Shape) -> Vec<f32> {
    let Some((factor, low, high, old_ctx)) = s.llama3_rope else {
        return Vec::new();
    };
    let hd = s.rot_dims() as f32;
    let (low_wl, high_wl) = (old_ctx / low, old_ctx / high);
    (0..(hd as usize / 2))
        .map(|i| {
            let freq = 1.0 / s.rope_base.powf(2.0 * i as f32 / hd);
            let wavelen = 2.0 * std::f32::consts::PI / freq;
            if wavelen < high_wl {
                1.0
            } else if wavelen > low_wl {
                factor
            } else {
                let smooth = (old_ctx / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect()
}

/// GPT-2's byte ↔ printable-character table: bytes that are printable stand for themselves, the
/// rest map to code points from 256 up.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return b as char;
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap_or('?')
}

/// A byte-level BPE vocabulary of exactly `size` tokens: the 256 bytes, merges of earlier tokens
/// (random but fixed by the seed), and the family's control tokens.
fn vocabulary(size: usize, seed: u64, specials: &[&str]) -> (Vec<String>, Vec<String>, Vec<i32>) {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let mut seen: std::collections::HashSet<String> = tokens.iter().cloned().collect();
    let mut merges = Vec::new();
    let mut rng = Rng::new(seed ^ 0x0076_6f63_6162);
    // Letters and the space marker first, so that merges look like words.
    let common: Vec<usize> = "etaoinshrdlucmfwypvbgkjqxz"
        .bytes()
        .map(|b| b as usize)
        .chain([byte_char(b' ') as usize])
        .filter(|&i| i < 256)
        .collect();
    let n_merges = size.saturating_sub(256 + specials.len());
    while merges.len() < n_merges {
        let pick = |rng: &mut Rng, n: usize| -> usize {
            // Favour short, early tokens: square a uniform draw.
            let u = rng.next_f64();
            ((u * u) * n as f64) as usize
        };
        let a = if rng.next_u64().is_multiple_of(3) {
            common[(rng.next_u64() % common.len() as u64) as usize]
        } else {
            pick(&mut rng, tokens.len())
        };
        let b = pick(&mut rng, tokens.len());
        let joined = format!("{}{}", tokens[a], tokens[b]);
        if joined.chars().count() > 16 || !seen.insert(joined.clone()) {
            continue;
        }
        merges.push(format!("{} {}", tokens[a], tokens[b]));
        tokens.push(joined);
    }
    let mut types = vec![1i32; tokens.len()];
    for &s in specials {
        tokens.push(s.to_string());
        types.push(3);
    }
    tokens.truncate(size);
    types.truncate(size);
    (tokens, merges, types)
}

/// The control tokens and chat format a synthetic model carries: its family's real ones, so that
/// chat works as with the real model and llama.cpp's per-family vocabulary fix-ups
/// (`llama_vocab::impl::load`, which looks Phi-3's tokens up by name) find what they look for.
struct Chat {
    specials: &'static [&'static str],
    template: &'static str,
    bos: &'static str,
    eos: &'static str,
    eot: &'static str,
}

fn chat(arch: &str) -> Chat {
    match arch {
        "gemma2" | "gemma3" => Chat {
            specials: &["<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"],
            template: GEMMA,
            bos: "<bos>",
            eos: "<eos>",
            eot: "<end_of_turn>",
        },
        "phi3" => Chat {
            specials: &[
                "<unk>",
                "<s>",
                "</s>",
                "<|endoftext|>",
                "<|system|>",
                "<|user|>",
                "<|assistant|>",
                "<|end|>",
            ],
            template: PHI3,
            bos: "<s>",
            eos: "<|endoftext|>",
            eot: "<|end|>",
        },
        // gpt-oss's harmony tokens (o200k_harmony's specials), in a short harmony template.
        "gpt-oss" => Chat {
            specials: &[
                "<|startoftext|>",
                "<|endoftext|>",
                "<|start|>",
                "<|message|>",
                "<|channel|>",
                "<|constrain|>",
                "<|end|>",
                "<|return|>",
                "<|call|>",
            ],
            template: HARMONY,
            bos: "<|startoftext|>",
            eos: "<|return|>",
            eot: "<|end|>",
        },
        _ => Chat {
            specials: &["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            template: CHATML,
            bos: "<|endoftext|>",
            eos: "<|endoftext|>",
            eot: "<|im_end|>",
        },
    }
}

const GEMMA: &str = "{% for message in messages %}{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else 'user') + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";

const PHI3: &str = "{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}";

/// gpt-oss's template cut to its message loop: an assistant turn is its `final` channel, its
/// `thinking` dropped unless it is the last message without a generation prompt (as the real
/// template, `models/templates/openai-gpt-oss-120b.jinja` in llama.cpp, does).
const HARMONY: &str = "{% for message in messages %}{% if message['role'] == 'assistant' %}{% if loop.last and not add_generation_prompt and message.thinking is defined %}{{ '<|start|>assistant<|channel|>analysis<|message|>' + message.thinking + '<|end|>' }}{% endif %}{{ '<|start|>assistant<|channel|>final<|message|>' + message['content'] + '<|end|>' }}{% else %}{{ '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|start|>assistant' }}{% endif %}";

const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fn metadata(s: &Shape, ty: Recipe, seed: u64) -> Vec<(String, Value)> {
    let a = s.arch;
    let k = |x: &str| format!("{a}.{x}");
    let family = chat(a);
    let (tokens, merges, types) = vocabulary(s.vocab, seed, family.specials);
    let id = |name: &str| tokens.iter().position(|t| t == name).unwrap_or(0) as u32;
    let (bos, eos, eot) = (id(family.bos), id(family.eos), id(family.eot));
    let strings = |v: Vec<String>| {
        Value::Array(Array {
            ty: ValueType::String,
            items: v.into_iter().map(Value::String).collect(),
        })
    };
    let mut m = vec![
        ("general.architecture".to_string(), Value::from(a)),
        (
            "general.name".into(),
            Value::from(format!("synthetic {} {}", s.name, ty)),
        ),
        (
            "general.description".into(),
            Value::from(format!(
                "hipscope synthetic model: random weights (seed {seed}) in the shape of {}",
                s.name
            )),
        ),
        ("general.file_type".into(), Value::U32(ty.file_type())),
        ("general.quantization_version".into(), Value::U32(2)),
        (k("block_count"), Value::U32(s.n_layers as u32)),
        (k("context_length"), Value::U32(s.ctx as u32)),
        (k("embedding_length"), Value::U32(s.dim as u32)),
        (k("feed_forward_length"), Value::U32(s.ffn_dim as u32)),
        (k("attention.head_count"), Value::U32(s.n_heads as u32)),
        (
            k("attention.head_count_kv"),
            Value::U32(s.n_kv_heads as u32),
        ),
        (k("rope.freq_base"), Value::F32(s.rope_base)),
        (k("attention.layer_norm_rms_epsilon"), Value::F32(s.rms_eps)),
        (k("vocab_size"), Value::U32(s.vocab as u32)),
        (k("rope.dimension_count"), Value::U32(s.rot_dims() as u32)),
        ("tokenizer.ggml.model".into(), Value::from("gpt2")),
        ("tokenizer.ggml.pre".into(), Value::from("gpt-2")),
        ("tokenizer.ggml.tokens".into(), strings(tokens)),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(Array {
                ty: ValueType::I32,
                items: types.into_iter().map(Value::I32).collect(),
            }),
        ),
        ("tokenizer.ggml.merges".into(), strings(merges)),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(bos)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(eos)),
        ("tokenizer.ggml.eot_token_id".into(), Value::U32(eot)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
        (
            "tokenizer.chat_template".into(),
            Value::from(family.template),
        ),
    ];
    // The keys each architecture's converter adds (convert_hf_to_gguf.py: Qwen3Model, Gemma2Model,
    // Gemma3Model, Phi3MiniModel).
    if s.head_dim > 0 {
        m.push((k("attention.key_length"), Value::U32(s.head_dim as u32)));
        m.push((k("attention.value_length"), Value::U32(s.head_dim as u32)));
    }
    if s.n_expert > 0 {
        m.push((k("expert_count"), Value::U32(s.n_expert as u32)));
        m.push((k("expert_used_count"), Value::U32(s.n_expert_used as u32)));
    }
    if s.expert_ffn_dim > 0 {
        m.push((
            k("expert_feed_forward_length"),
            Value::U32(s.expert_ffn_dim as u32),
        ));
    }
    if let Some((factor, orig)) = s.yarn {
        m.push((k("rope.scaling.type"), Value::from("yarn")));
        m.push((k("rope.scaling.factor"), Value::F32(factor)));
        m.push((
            k("rope.scaling.original_context_length"),
            Value::U32(orig as u32),
        ));
    }
    if s.sliding_window > 0 {
        m.push((
            k("attention.sliding_window"),
            Value::U32(s.sliding_window as u32),
        ));
    }
    if s.attn_softcap > 0.0 {
        m.push((k("attn_logit_softcapping"), Value::F32(s.attn_softcap)));
    }
    if s.final_softcap > 0.0 {
        m.push((k("final_logit_softcapping"), Value::F32(s.final_softcap)));
    }
    if let (Some(orig), Some(attn_factor)) = (s.long_rope, long_rope_attn_factor(s)) {
        m.push((
            k("rope.scaling.original_context_length"),
            Value::U32(orig as u32),
        ));
        m.push((k("rope.scaling.attn_factor"), Value::F32(attn_factor)));
    }
    // llama 3 RoPE scaling travels as the `rope_freqs.weight` tensor alone, as llama.cpp's
    // converter writes it: no `rope.scaling.*` keys (llama.cpp refuses a `llama3` scaling type).
    m
}

/// Rows generated (and seeded) together: fixed, so a seed gives the same weights whatever the
/// thread count.
const CHUNK_ROWS: usize = 64;

/// Every core (`0` threads asked for).
fn thread_count(threads: usize) -> usize {
    match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

/// The tensor's bytes, its chunks generated and quantized on `threads` threads.
fn tensor_bytes(
    t: &Tensor,
    index: usize,
    seed: u64,
    s: &Shape,
    threads: usize,
) -> Result<Vec<u8>, SynthError> {
    let factors = match t.spec.name.as_str() {
        "rope_freqs.weight" => Some(llama3_freq_factors(s)),
        "rope_factors_long.weight" => Some(long_rope_factors(s, true)),
        "rope_factors_short.weight" => Some(long_rope_factors(s, false)),
        _ => None,
    };
    if let Some(f) = factors {
        return Ok(f.iter().flat_map(|f| f.to_le_bytes()).collect());
    }
    let cols = t.spec.dims[0] as usize;
    let rows: usize = t.spec.dims[1..].iter().product::<u64>() as usize;
    let ty = t.spec.ty;
    let row_bytes = cols / ty.block_len() * ty.block_bytes();
    let mut out = vec![0u8; rows * row_bytes];
    let n_chunks = rows.div_ceil(CHUNK_ROWS);
    let next = AtomicUsize::new(0);
    let failure = std::sync::Mutex::new(None);
    let out_ptr = out.as_mut_ptr() as usize;
    std::thread::scope(|scope| {
        for _ in 0..threads.min(n_chunks) {
            scope.spawn(|| {
                let mut vals = Vec::new();
                loop {
                    let c = next.fetch_add(1, Ordering::Relaxed);
                    if c >= n_chunks {
                        break;
                    }
                    let r0 = c * CHUNK_ROWS;
                    let nr = CHUNK_ROWS.min(rows - r0);
                    let mut rng = Rng::new(seed ^ ((index as u64) << 24) ^ c as u64);
                    vals.clear();
                    vals.extend(
                        (0..nr * cols)
                            .map(|_| t.offset + t.scale * (2.0 * rng.next_f64() as f32 - 1.0)),
                    );
                    match quant::quantize(ty, &vals) {
                        Ok(q) => {
                            // SAFETY: chunk c owns bytes r0*row_bytes..(r0+nr)*row_bytes of
                            // `out`, which outlives the scope; chunks are disjoint.
                            let dst = unsafe {
                                std::slice::from_raw_parts_mut(
                                    (out_ptr as *mut u8).add(r0 * row_bytes),
                                    nr * row_bytes,
                                )
                            };
                            dst.copy_from_slice(&q);
                        }
                        Err(e) => {
                            if let Ok(mut f) = failure.lock() {
                                *f = Some(e.to_string());
                            }
                            break;
                        }
                    }
                }
            });
        }
    });
    if let Some(message) = failure.into_inner().ok().flatten() {
        return Err(SynthError::Quant {
            tensor: t.spec.name.clone(),
            message,
        });
    }
    Ok(out)
}

/// Writes the synthetic model `s` with weights of type `ty` (K-quants fall back for narrow rows)
/// as GGUF to `out`, quantizing on `threads` threads (0: every core). The bytes do not depend on
/// the thread count. The next tensor is quantized while one is written, so that the disk and the
/// cores work at once (a 30B K-quant file is minutes of both).
pub fn write<W: Write>(
    s: &Shape,
    ty: impl Into<Recipe>,
    seed: u64,
    threads: usize,
    out: W,
    progress: &mut dyn FnMut(f32, &str),
) -> Result<W, SynthError> {
    let io = |cause| SynthError::Io {
        path: s.name.into(),
        cause,
    };
    let ty = ty.into();
    let threads = thread_count(threads);
    let ts = tensors(s, ty);
    let specs: Vec<TensorSpec> = ts.iter().map(|t| t.spec.clone()).collect();
    let mut w = GgufWriter::new(out, &metadata(s, ty, seed), &specs).map_err(io)?;
    std::thread::scope(|scope| {
        // One tensor ready while one is written: two tensors' bytes in memory at most.
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let ts = &ts;
        scope.spawn(move || {
            for (i, t) in ts.iter().enumerate() {
                let r = tensor_bytes(t, i, seed, s, threads);
                let failed = r.is_err();
                // The writer stopped (an error): nothing more to make.
                if tx.send(r).is_err() || failed {
                    break;
                }
            }
        });
        for (i, t) in ts.iter().enumerate() {
            progress(i as f32 / ts.len() as f32, &t.spec.name);
            let bytes = rx
                .recv()
                .map_err(|_| io(std::io::Error::other("the quantizing thread stopped")))??;
            w.write_tensor(&bytes).map_err(io)?;
        }
        Ok::<(), SynthError>(())
    })?;
    progress(1.0, "done");
    w.finish().map_err(io)
}

/// Writes the synthetic model's header to `path`, byte for byte the one `write` writes (its
/// metadata, vocabulary and tensor table), and leaves the tensor data a hole of the right length
/// (zeros; no disk blocks where the filesystem keeps sparse files). The file opens and reads as
/// `write`'s does but for the weights, in moments for any shape: what a check of the shapes'
/// hyperparameters and parameter counts needs without writing gigabytes.
pub fn write_header_file(
    s: &Shape,
    ty: impl Into<Recipe>,
    seed: u64,
    path: &Path,
) -> Result<(), SynthError> {
    let io = |cause| SynthError::Io {
        path: path.display().to_string(),
        cause,
    };
    let ty = ty.into();
    let specs: Vec<TensorSpec> = tensors(s, ty).into_iter().map(|t| t.spec).collect();
    let mut f = std::fs::File::create(path).map_err(io)?;
    let w = GgufWriter::new(&mut f, &metadata(s, ty, seed), &specs).map_err(io)?;
    let data = w.data_left();
    drop(w);
    let header = f.metadata().map_err(io)?.len();
    f.set_len(header + data).map_err(io)
}

/// Builds the synthetic model in memory, ready to load.
pub fn build(
    s: &Shape,
    ty: impl Into<Recipe>,
    seed: u64,
    progress: &mut dyn FnMut(f32, &str),
) -> Result<GgufFile, SynthError> {
    let ty = ty.into();
    let bytes = write(s, ty, seed, 0, Vec::new(), progress)?;
    let label = format!("<synthetic {} {}>", s.name, ty);
    GgufFile::from_bytes(Path::new(&label), bytes).map_err(|e| SynthError::Io {
        path: label,
        cause: std::io::Error::other(e.to_string()),
    })
}

/// Writes the synthetic model to a file, whole or not at all (`gpu::atomic_file`): an
/// interrupted or failed write never leaves a torn model under the name.
pub fn write_file(
    s: &Shape,
    ty: impl Into<Recipe>,
    seed: u64,
    path: &Path,
    progress: &mut dyn FnMut(f32, &str),
) -> Result<(), SynthError> {
    write_file_threads(s, ty, seed, 0, path, progress)
}

/// [`write_file`] on `threads` threads (0: every core).
pub fn write_file_threads(
    s: &Shape,
    ty: impl Into<Recipe>,
    seed: u64,
    threads: usize,
    path: &Path,
    progress: &mut dyn FnMut(f32, &str),
) -> Result<(), SynthError> {
    let io = |cause| SynthError::Io {
        path: path.display().to_string(),
        cause,
    };
    let ty = ty.into();
    let mut failed = None;
    let r = crate::gpu::atomic_file::write(
        path,
        crate::gpu::atomic_file::Replace::Allow,
        |f| -> std::io::Result<()> {
            match write(s, ty, seed, threads, std::io::BufWriter::new(f), progress) {
                Ok(w) => w.into_inner().map(|_| ()).map_err(|e| e.into_error()),
                Err(e) => {
                    failed = Some(e);
                    Err(std::io::Error::other("not written"))
                }
            }
        },
    );
    r.map_err(|e| failed.take().unwrap_or_else(|| io(e)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::{ModelConfig, RopeScaling};

    /// llama.cpp's converter writes llama 3 RoPE scaling as the `rope_freqs.weight` tensor and no
    /// scaling type (llama.cpp aborts on `rope.scaling.type = "llama3"`): so does `synth`, and
    /// the file reads back with the frequency factors.
    #[test]
    fn llama3_shapes_carry_rope_freqs_and_no_scaling_keys() {
        let s = shape("tiny-llama3").unwrap();
        let f = build(s, GgmlType::F32, 1, &mut |_, _| {}).unwrap();
        assert!(f.tensor("rope_freqs.weight").is_some());
        for key in ["type", "factor", "low_freq_factor", "high_freq_factor"] {
            let k = format!("llama.rope.scaling.{key}");
            assert!(
                f.get_str(&k).is_none() && f.get(&k).is_none(),
                "{k} written"
            );
        }
        let c = ModelConfig::from_gguf(&f).unwrap();
        assert_eq!(c.rope_scaling, RopeScaling::FreqFactors);
    }
}
