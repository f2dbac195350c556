//! The memory-bandwidth bound on decode: one token reads every weight matrix once and the whole
//! KV cache so far, so tokens/s can be at most (read bandwidth) ÷ (bytes read per token). `bench`
//! shows it beside the measured speed for any backend that can state its read bandwidth (the
//! CPU backend measures the host's, `gpu::cpu::bandwidth`). A mixture-of-experts model reads only
//! the experts each token is routed to: its bound counts the active bytes, `n_used / n_expert`
//! of every `*_exps` tensor.

use super::config::ModelConfig;
use super::gguf::GgufFile;
use crate::gpu::trace::{OpCost, OpCosts};

/// Bytes a decode step reads at `depth` tokens already in the cache: every tensor of the file
/// except the token embedding (of which one row is read; but all of it where the output head
/// is tied to it), plus keys and values of `depth` positions in every layer, each element
/// `kv_elem_bytes` wide. Of the experts' tensors (`*_exps`), the share a token uses.
pub fn decode_bytes_per_token(
    file: &GgufFile,
    config: &ModelConfig,
    depth: usize,
    kv_elem_bytes: usize,
) -> u64 {
    let has_output = file.tensor("output.weight").is_some();
    let weights: u64 = file
        .tensors()
        .iter()
        .map(|t| {
            if let Some(m) = config.moe.filter(|_| t.name.ends_with("_exps.weight")) {
                t.size / m.n_expert as u64 * m.n_used as u64
            } else if t.name == "token_embd.weight" && has_output {
                // One row.
                let rows = t.dims.iter().skip(1).product::<u64>().max(1);
                t.size / rows
            } else {
                t.size
            }
        })
        .sum();
    let kv = 2 * config.n_layers as u64 * config.kv_dim() as u64 * kv_elem_bytes as u64;
    weights + kv * depth as u64
}

/// The bytes each op of the forward pass moves, for the profile's bytes and GB/s columns, counted
/// as [`decode_bytes_per_token`] counts them: an op reads its weights as stored (a mixture of
/// experts the share a token uses; the embedding one row a token), attention reads every cached
/// position's key and value; an op writes its f32 output, attention also the token's key and
/// value. Ops are the labels' op names (`attn_q`, `attention`, `output`); a tensor
/// `blk.N.NAME.weight` is op `NAME` of layer N, `blk.N.NAME.bias` op `NAME.bias`. So the ops of one
/// decode step at position p read what the bound counts at depth p + 1 (plus the embedding row
/// when the output head is tied to it).
pub fn op_costs(file: &GgufFile, config: &ModelConfig, kv_elem_bytes: usize) -> OpCosts {
    let mut c = OpCosts::default();
    let has_output = file.tensor("output.weight").is_some();
    for t in file.tensors() {
        let (layer, rest) = match t.name.strip_prefix("blk.").and_then(|r| r.split_once('.')) {
            Some((l, rest)) => match l.parse::<u32>() {
                Ok(l) => (Some(l), rest),
                Err(_) => (None, t.name.as_str()),
            },
            None => (None, t.name.as_str()),
        };
        let op = rest.strip_suffix(".weight").unwrap_or(rest);
        let cols = t.dims.first().copied().unwrap_or(1);
        let rows = t.dims.get(1).copied().unwrap_or(1);
        let (out_elems, read) = match config.moe.filter(|_| op.ends_with("_exps")) {
            Some(m) => (
                rows * m.n_used as u64,
                t.size / m.n_expert as u64 * m.n_used as u64,
            ),
            None if t.dims.len() < 2 => (cols, t.size),
            None => (rows, t.size),
        };
        if t.name == "token_embd.weight" {
            let row = t.size / rows.max(1);
            c.insert(
                None,
                "embed",
                OpCost {
                    read_per_token: row,
                    written_per_token: cols * 4,
                    ..OpCost::default()
                },
            );
            if !has_output {
                c.insert(
                    None,
                    "output",
                    OpCost {
                        read: t.size,
                        written_per_token: rows * 4,
                        ..OpCost::default()
                    },
                );
            }
            continue;
        }
        c.insert(
            layer,
            op,
            OpCost {
                read,
                written_per_token: out_elems * 4,
                ..OpCost::default()
            },
        );
    }
    let kv = 2 * config.kv_dim() as u64 * kv_elem_bytes as u64;
    for l in 0..config.n_layers as u32 {
        c.insert(
            Some(l),
            "attention",
            OpCost {
                read_per_position: kv,
                written_per_token: config.q_dim() as u64 * 4 + kv,
                ..OpCost::default()
            },
        );
    }
    c
}

/// A decode speed's ceiling set by memory.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct DecodeBound {
    pub bytes_per_token: u64,
    /// Read bandwidth, bytes/s.
    pub bandwidth: f64,
}

impl DecodeBound {
    /// Tokens/s if every byte were read once at full bandwidth.
    pub fn tokens_per_s(&self) -> f64 {
        self.bandwidth / self.bytes_per_token.max(1) as f64
    }

    /// The fraction of the bound that `measured` tokens/s reaches.
    pub fn fraction(&self, measured: f64) -> f64 {
        measured / self.tokens_per_s()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_per_token_counts_weights_once_and_the_cache_per_position() {
        let shape = crate::model::synthetic::shape("tiny").expect("tiny shape");
        let file = crate::model::synthetic::build(
            shape,
            crate::gpu::quant::GgmlType::Q8_0,
            1,
            &mut |_, _| {},
        )
        .expect("synthetic model");
        let config = ModelConfig::from_gguf(&file).expect("config");
        let all: u64 = file.tensors().iter().map(|t| t.size).sum();
        let b0 = decode_bytes_per_token(&file, &config, 0, 4);
        match file.tensor("output.weight") {
            // Untied: the embedding contributes one row, not all of it.
            Some(_) => {
                let e = file.tensor("token_embd.weight").expect("embedding");
                assert_eq!(b0, all - e.size + e.size / e.dims[1]);
            }
            None => assert_eq!(b0, all),
        }
        let per_pos = 2 * config.n_layers as u64 * config.kv_dim() as u64;
        assert_eq!(
            decode_bytes_per_token(&file, &config, 100, 4),
            b0 + 100 * per_pos * 4
        );
        assert_eq!(
            decode_bytes_per_token(&file, &config, 100, 2),
            b0 + 100 * per_pos * 2
        );
    }

    /// A mixture of experts counts k of n experts: Qwen3-30B-A3B's cut reads its router and
    /// attention whole and 8 of its 128 experts.
    #[test]
    fn a_moe_model_counts_only_its_active_experts() {
        let shape = crate::model::synthetic::shape("mixtral-tiny-2l").expect("shape");
        let file = crate::model::synthetic::build(
            shape,
            crate::gpu::quant::GgmlType::Q8_0,
            1,
            &mut |_, _| {},
        )
        .expect("synthetic model");
        let config = ModelConfig::from_gguf(&file).expect("config");
        let m = config.moe.expect("a MoE config");
        assert_eq!((m.n_expert, m.n_used), (8, 2));
        let exps: u64 = file
            .tensors()
            .iter()
            .filter(|t| t.name.ends_with("_exps.weight"))
            .map(|t| t.size)
            .sum();
        assert!(exps > 0);
        let e = file.tensor("token_embd.weight").expect("embedding");
        let all: u64 = file.tensors().iter().map(|t| t.size).sum();
        let dense = all - exps - e.size + e.size / e.dims[1];
        assert_eq!(
            decode_bytes_per_token(&file, &config, 0, 4),
            dense + exps / 8 * 2
        );
    }

    /// The ops of a decode step at position p read what the bound counts at depth p + 1: every
    /// tensor is some op's, attention reads the cache.
    #[test]
    fn op_costs_add_up_to_the_bound() {
        for shape in ["tiny", "mixtral-tiny-2l"] {
            let s = crate::model::synthetic::shape(shape).expect("shape");
            let file = crate::model::synthetic::build(
                s,
                crate::gpu::quant::GgmlType::Q8_0,
                1,
                &mut |_, _| {},
            )
            .expect("synthetic model");
            let config = ModelConfig::from_gguf(&file).expect("config");
            let costs = op_costs(&file, &config, 2);
            let pos = 37;
            let read: u64 = costs.iter().map(|(_, c)| c.bytes(pos, 1).0).sum();
            let e = file.tensor("token_embd.weight").expect("embedding");
            let tied_row = if file.tensor("output.weight").is_none() {
                e.size / e.dims[1]
            } else {
                0
            };
            assert_eq!(
                read,
                decode_bytes_per_token(&file, &config, pos as usize + 1, 2) + tied_row,
                "{shape}"
            );
            assert!(costs.get(Some(0), "attn_qkv").is_some_and(|c| c.read > 0));
        }
    }

    #[test]
    fn bound_is_bandwidth_over_bytes() {
        let b = DecodeBound {
            bytes_per_token: 250_000_000,
            bandwidth: 50e9,
        };
        assert_eq!(b.tokens_per_s(), 200.0);
        assert_eq!(b.fraction(150.0), 0.75);
    }
}
