//! An op's label read back into its parts (`layer 7 · attn_q · mv_q4_1` → layer 7, op
//! `attn_q`, kernel `mv_q4_1`; the text `OpLabel`'s `Display` and the GPU launchers write), and
//! the bytes each op moves ([`OpCosts`], filled by the model from its tensors as `bench`'s bound
//! counts them: `model::bound::op_costs`).

use std::collections::HashMap;

/// A label's parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParsedLabel<'a> {
    pub layer: Option<u32>,
    /// The op (`attn_q`, `attention`, `output`): the family the profile groups by.
    pub op: &'a str,
    /// The kernel or detail after it (`mv_q4_1`, `logits`), empty if none.
    pub kernel: &'a str,
}

/// Splits a label at its ` · ` separators.
pub fn parse_label(text: &str) -> ParsedLabel<'_> {
    let (layer, rest) = match text.strip_prefix("layer ") {
        Some(r) => match r.split_once(" · ") {
            Some((n, rest)) => match n.parse::<u32>() {
                Ok(n) => (Some(n), rest),
                Err(_) => (None, text),
            },
            None => (None, text),
        },
        None => (None, text),
    };
    let (op, kernel) = rest.split_once(" · ").unwrap_or((rest, ""));
    ParsedLabel { layer, op, kernel }
}

/// What one op reads and writes, as a function of the step: `read + read_per_position ×
/// (positions attended)` bytes read and `written_per_token × tokens` written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCost {
    /// Read once per call whatever the batch: the op's weights.
    pub read: u64,
    /// Read per token: an embedding row.
    pub read_per_token: u64,
    /// Read per position in the KV cache: attention's keys and values.
    pub read_per_position: u64,
    /// Written per token: the op's f32 output, the keys and values it stores.
    pub written_per_token: u64,
}

impl OpCost {
    /// Bytes (read, written) of one call in a step of `tokens` tokens from `pos0`: attention over
    /// positions `0..pos0 + tokens`.
    pub fn bytes(&self, pos0: u64, tokens: u64) -> (u64, u64) {
        (
            self.read + self.read_per_token * tokens + self.read_per_position * (pos0 + tokens),
            self.written_per_token * tokens,
        )
    }

    fn add(&mut self, o: &OpCost) {
        self.read += o.read;
        self.read_per_token += o.read_per_token;
        self.read_per_position += o.read_per_position;
        self.written_per_token += o.written_per_token;
    }
}

/// The bytes of every op of a model, by (layer, op name).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpCosts {
    ops: HashMap<(Option<u32>, String), OpCost>,
}

/// Ops a GPU backend runs fused, as the ops they stand for.
const FUSED: &[(&str, &[&str])] = &[
    (
        "attn_qkv",
        &[
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_q.bias",
            "attn_k.bias",
            "attn_v.bias",
        ],
    ),
    ("ffn_gate_up", &["ffn_gate", "ffn_up"]),
    ("attn_output_bias", &["attn_output.bias"]),
    // Mixture of experts: the CPU's two ops, the GPU's launches.
    ("ffn_moe_router", &["ffn_gate_inp"]),
    ("ffn_moe_router_bias", &["ffn_gate_inp.bias"]),
    ("ffn_moe_route", &["ffn_gate_inp", "ffn_gate_inp.bias"]),
    (
        "ffn_moe_experts",
        &[
            "ffn_gate_exps",
            "ffn_up_exps",
            "ffn_down_exps",
            "ffn_gate_exps.bias",
            "ffn_up_exps.bias",
            "ffn_down_exps.bias",
        ],
    ),
    (
        "ffn_moe_gate_up",
        &[
            "ffn_gate_exps",
            "ffn_up_exps",
            "ffn_gate_exps.bias",
            "ffn_up_exps.bias",
        ],
    ),
    ("ffn_moe_down", &["ffn_down_exps", "ffn_down_exps.bias"]),
];

impl OpCosts {
    pub fn insert(&mut self, layer: Option<u32>, op: &str, cost: OpCost) {
        self.ops
            .entry((layer, op.to_string()))
            .or_default()
            .add(&cost);
    }

    /// The cost of op `op` in `layer`: its own entry, or the sum of the ops a fused op stands
    /// for; `None` when nothing is known of it.
    pub fn get(&self, layer: Option<u32>, op: &str) -> Option<OpCost> {
        if let Some(c) = self.ops.get(&(layer, op.to_string())) {
            return Some(*c);
        }
        let parts = FUSED.iter().find(|(name, _)| *name == op)?.1;
        let mut sum = OpCost::default();
        let mut any = false;
        for p in parts {
            if let Some(c) = self.ops.get(&(layer, p.to_string())) {
                sum.add(c);
                any = true;
            }
        }
        any.then_some(sum)
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Every entry, for checks.
    pub fn iter(&self) -> impl Iterator<Item = (&(Option<u32>, String), &OpCost)> {
        self.ops.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::backend::OpLabel;

    #[test]
    fn labels_split_into_layer_op_and_kernel() {
        // The CPU's labels are `OpLabel`'s text; the GPU's add the kernel.
        let cpu = OpLabel::layer(7, "attn_q").to_string();
        assert_eq!(
            parse_label(&cpu),
            ParsedLabel {
                layer: Some(7),
                op: "attn_q",
                kernel: ""
            }
        );
        assert_eq!(
            parse_label("layer 12 · rope_qk + kv_store · rope_kv_f16"),
            ParsedLabel {
                layer: Some(12),
                op: "rope_qk + kv_store",
                kernel: "rope_kv_f16"
            }
        );
        assert_eq!(
            parse_label(&OpLabel::global("output").to_string()),
            ParsedLabel {
                layer: None,
                op: "output",
                kernel: ""
            }
        );
        assert_eq!(parse_label("read · logits").kernel, "logits");
        // Not a layer number: the whole text is the op.
        assert_eq!(parse_label("layer x · y").op, "layer x");
    }

    #[test]
    fn a_fused_op_costs_what_its_parts_cost() {
        let mut c = OpCosts::default();
        let w = |read| OpCost {
            read,
            written_per_token: 4,
            ..OpCost::default()
        };
        c.insert(Some(1), "attn_q", w(100));
        c.insert(Some(1), "attn_k", w(20));
        c.insert(Some(1), "attn_v", w(20));
        c.insert(Some(1), "attn_q.bias", w(1));
        let qkv = c.get(Some(1), "attn_qkv").expect("fused");
        assert_eq!(qkv.read, 141);
        assert_eq!(qkv.written_per_token, 16);
        assert_eq!(c.get(Some(2), "attn_qkv"), None);
        assert_eq!(c.get(Some(1), "nothing"), None);
        let att = OpCost {
            read_per_position: 8,
            written_per_token: 2,
            ..OpCost::default()
        };
        // Attention at positions 10..13 reads 13 positions.
        assert_eq!(att.bytes(10, 3), (104, 6));
    }
}
