//! Handing a model's tensors to the backend: every weight the architecture uses, fused tensors
//! (Phi-3's `attn_qkv`, `ffn_up` holding gate and up) as one weight per part over the same bytes.

use std::sync::Arc;

use super::ModelError;
use crate::gpu::backend::{Backend, OaiMoe, SharedBytes, Weight, WeightData};
use crate::gpu::quant;
use crate::model::config::{Arch, ModelConfig, RopeScaling};
use crate::model::gguf::GgufFile;

pub(super) struct LayerWeights {
    pub(super) attn_norm: Weight,
    pub(super) wq: Weight,
    pub(super) wk: Weight,
    pub(super) wv: Weight,
    pub(super) wo: Weight,
    pub(super) bq: Option<Weight>,
    pub(super) bk: Option<Weight>,
    pub(super) bv: Option<Weight>,
    pub(super) q_norm: Option<Weight>,
    pub(super) k_norm: Option<Weight>,
    pub(super) post_attn_norm: Option<Weight>,
    pub(super) ffn_norm: Weight,
    pub(super) gate: Weight,
    pub(super) up: Weight,
    pub(super) down: Weight,
    pub(super) post_ffn_norm: Option<Weight>,
    /// A mixture-of-experts FFN: its router (`gate`, `up` and `down` are then the experts'
    /// `ffn_{gate,up,down}_exps`, every expert's rows in one weight).
    pub(super) router: Option<Weight>,
    /// gpt-oss: the output projection's bias, the attention sinks and the MoE's biases.
    pub(super) bo: Option<Weight>,
    pub(super) sinks: Option<Weight>,
    pub(super) moe_bias: Option<OaiMoe>,
}

/// Every weight of a model, on its backend.
pub(super) struct Weights {
    pub(super) tok_embd: Weight,
    pub(super) output_norm: Weight,
    pub(super) output: Weight,
    pub(super) layers: Vec<LayerWeights>,
    /// RoPE frequency factors: llama 3.1's, or Phi-3's short or long ones for this context.
    pub(super) freq_factors: Option<Weight>,
}

/// Loads the weights of `file` (checked against `config`) for a context of `n_ctx` positions.
pub(super) fn load(
    file: &Arc<GgufFile>,
    backend: &mut dyn Backend,
    config: &ModelConfig,
    n_ctx: usize,
    progress: &mut dyn FnMut(f32, &str),
) -> Result<Weights, ModelError> {
    let storage: SharedBytes = file.clone();
    let path = file.path().display().to_string();
    let total: u64 = file.tensors().iter().map(|t| t.size).sum::<u64>().max(1);
    let mut done = 0u64;
    // `part`: rows `r0..r0 + n` only (one part of a fused tensor), named `label`.
    let mut load_rows =
        |name: &str, part: Option<(usize, usize, &str)>| -> Result<Weight, ModelError> {
            let t = file
                .tensor(name)
                .ok_or_else(|| ModelError::Tensor {
                    path: path.clone(),
                    tensor: name.into(),
                    message: "missing".into(),
                })?
                .clone();
            if !quant::is_supported(t.ty) {
                return Err(ModelError::Tensor {
                    path: path.clone(),
                    tensor: name.into(),
                    message: format!("type {}", quant::unsupported(t.ty)),
                });
            }
            let (rows, cols) = t.rows_cols();
            let row_bytes = t.ty.bytes_for(cols as u64).unwrap_or(0) as usize;
            let (r0, n, label) = part.unwrap_or((0, rows, name));
            if r0 + n > rows {
                return Err(ModelError::Tensor {
                    path: path.clone(),
                    tensor: name.into(),
                    message: format!("rows {r0}..{} of {rows}", r0 + n),
                });
            }
            let data = WeightData {
                name: label,
                ty: t.ty,
                rows: n,
                cols,
                storage: &storage,
                offset: (file.data_offset() + t.offset) as usize + r0 * row_bytes,
                len: n * row_bytes,
            };
            let w = backend.load_weight(&data).map_err(|e| ModelError::Tensor {
                path: path.clone(),
                tensor: label.into(),
                message: e.to_string(),
            })?;
            done += (n * row_bytes) as u64;
            progress(done as f32 / total as f32, label);
            Ok(w)
        };
    let tok_embd = load_rows("token_embd.weight", None)?;
    let mut layers = Vec::with_capacity(config.n_layers);
    let (q_dim, kv_dim, ff) = (config.q_dim(), config.kv_dim(), config.ffn_dim);
    for l in 0..config.n_layers {
        let n = |s: &str| format!("blk.{l}.{s}");
        let opt = |s: &str| file.tensor(&n(s)).map(|_| n(s));
        let (bq, bk, bv) = (opt("attn_q.bias"), opt("attn_k.bias"), opt("attn_v.bias"));
        let attn_norm = load_rows(&n("attn_norm.weight"), None)?;
        let [wq, wk, wv] = if config.fused_qkv {
            let qkv = n("attn_qkv.weight");
            let parts = [
                (0, q_dim, n("attn_qkv.weight (q rows)")),
                (q_dim, kv_dim, n("attn_qkv.weight (k rows)")),
                (q_dim + kv_dim, kv_dim, n("attn_qkv.weight (v rows)")),
            ];
            let mut w = [Weight(0); 3];
            for (i, (r0, rows, label)) in parts.iter().enumerate() {
                w[i] = load_rows(&qkv, Some((*r0, *rows, label)))?;
            }
            w
        } else {
            [
                load_rows(&n("attn_q.weight"), None)?,
                load_rows(&n("attn_k.weight"), None)?,
                load_rows(&n("attn_v.weight"), None)?,
            ]
        };
        let wo = load_rows(&n("attn_output.weight"), None)?;
        let mut bias = [None; 3];
        for (slot, name) in bias.iter_mut().zip([bq, bk, bv]) {
            if let Some(name) = name {
                *slot = Some(load_rows(&name, None)?);
            }
        }
        let [bq, bk, bv] = bias;
        let q_norm = match opt("attn_q_norm.weight").filter(|_| config.arch.qk_norm()) {
            Some(name) => Some(load_rows(&name, None)?),
            None => None,
        };
        let k_norm = match opt("attn_k_norm.weight").filter(|_| config.arch.qk_norm()) {
            Some(name) => Some(load_rows(&name, None)?),
            None => None,
        };
        let post_attn_norm = match opt("post_attention_norm.weight").filter(|_| config.arch.gemma())
        {
            Some(name) => Some(load_rows(&name, None)?),
            None => None,
        };
        let oss = config.arch == Arch::GptOss;
        // gpt-oss's FFN norm is its `post_attention_norm` (llama.cpp's `attn_post_norm`).
        let ffn_norm = load_rows(
            &n(if oss {
                "post_attention_norm.weight"
            } else {
                "ffn_norm.weight"
            }),
            None,
        )?;
        let (bo, sinks) = if oss {
            (
                Some(load_rows(&n("attn_output.bias"), None)?),
                Some(load_rows(&n("attn_sinks.weight"), None)?),
            )
        } else {
            (None, None)
        };
        let router = match config.moe {
            Some(_) => Some(load_rows(&n("ffn_gate_inp.weight"), None)?),
            None => None,
        };
        let (gate, up) = if router.is_some() {
            (
                load_rows(&n("ffn_gate_exps.weight"), None)?,
                load_rows(&n("ffn_up_exps.weight"), None)?,
            )
        } else if config.fused_gate_up {
            let gu = n("ffn_up.weight");
            let (gl, ul) = (n("ffn_up.weight (gate rows)"), n("ffn_up.weight (up rows)"));
            (
                load_rows(&gu, Some((0, ff, &gl)))?,
                load_rows(&gu, Some((ff, ff, &ul)))?,
            )
        } else {
            (
                load_rows(&n("ffn_gate.weight"), None)?,
                load_rows(&n("ffn_up.weight"), None)?,
            )
        };
        let down = match router {
            Some(_) => load_rows(&n("ffn_down_exps.weight"), None)?,
            None => load_rows(&n("ffn_down.weight"), None)?,
        };
        let post_ffn_norm = match opt("post_ffw_norm.weight").filter(|_| config.arch.gemma()) {
            Some(name) => Some(load_rows(&name, None)?),
            None => None,
        };
        let moe_bias = match config.moe {
            Some(m) if m.oai => Some(OaiMoe {
                router_bias: load_rows(&n("ffn_gate_inp.bias"), None)?,
                gate_bias: load_rows(&n("ffn_gate_exps.bias"), None)?,
                up_bias: load_rows(&n("ffn_up_exps.bias"), None)?,
                down_bias: load_rows(&n("ffn_down_exps.bias"), None)?,
            }),
            _ => None,
        };
        layers.push(LayerWeights {
            attn_norm,
            wq,
            wk,
            wv,
            wo,
            bq,
            bk,
            bv,
            q_norm,
            k_norm,
            post_attn_norm,
            ffn_norm,
            gate,
            up,
            down,
            post_ffn_norm,
            router,
            bo,
            sinks,
            moe_bias,
        });
    }
    let output_norm = load_rows("output_norm.weight", None)?;
    let output = if config.tied_embeddings {
        tok_embd
    } else {
        load_rows("output.weight", None)?
    };
    let freq_factors = match config.rope_scaling {
        RopeScaling::FreqFactors => Some(load_rows("rope_freqs.weight", None)?),
        // llama.cpp's `get_rope_factors`: long factors only for a context past the original.
        RopeScaling::LongRope { original_ctx } if n_ctx > original_ctx => {
            Some(load_rows("rope_factors_long.weight", None)?)
        }
        RopeScaling::LongRope { .. } => Some(load_rows("rope_factors_short.weight", None)?),
        _ => None,
    };
    Ok(Weights {
        tok_embd,
        output_norm,
        output,
        layers,
        freq_factors,
    })
}
