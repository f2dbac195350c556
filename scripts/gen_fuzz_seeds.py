#!/usr/bin/env python3
"""Writes the small seed GGUFs the fuzz target starts from (fuzz/seeds/).

Command: PYTHONPATH=$HIPSCOPE_LLAMA_CPP_SRC/gguf-py python3 scripts/gen_fuzz_seeds.py
Uses the `gguf` package from llama.cpp's source (an independent writer), numpy.
"""
import os
import numpy as np
import gguf

out = os.path.join(os.path.dirname(__file__), "..", "fuzz", "seeds")
os.makedirs(out, exist_ok=True)

def bpe_vocab(w):
    toks = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ", "ab", "Ġa", "<|im_start|>", "<|im_end|>"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(toks)
    w.add_token_types([1] * (len(toks) - 2) + [3, 3])
    w.add_token_merges(["a b", "Ġ a"])
    w.add_bos_token_id(len(toks) - 2)
    w.add_eos_token_id(len(toks) - 1)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")

def llama_keys(w, dim=32, layers=1, heads=2, kv=1, ff=64, vocab=31):
    w.add_block_count(layers)
    w.add_context_length(64)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)

# 1. vocabulary only
w = gguf.GGUFWriter(os.path.join(out, "bpe-vocab.gguf"), "llama")
bpe_vocab(w)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()

# 2. an SPM vocabulary with scores and byte tokens
w = gguf.GGUFWriter(os.path.join(out, "spm-vocab.gguf"), "llama")
toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(0, 256, 37)] + ["▁", "▁a", "a", "b", "ab"]
w.add_tokenizer_model("llama")
w.add_token_list(toks)
w.add_token_scores([0.0] * 3 + [0.0] * 7 + [-1.0, -2.0, -3.0, -3.5, -2.5])
w.add_token_types([2, 3, 3] + [6] * 7 + [1] * 5)
w.add_bos_token_id(1); w.add_eos_token_id(2)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()

# 3. a one-layer llama with small tensors of several types, every value type in the metadata
w = gguf.GGUFWriter(os.path.join(out, "tiny-llama.gguf"), "llama")
llama_keys(w)
bpe_vocab(w)
w.add_array("test.nested", [[1, 2], [3]])
w.add_uint8("test.u8", 7); w.add_int16("test.i16", -3); w.add_float64("test.f64", 0.5)
w.add_bool("test.bool", True); w.add_uint64("test.u64", 1 << 40)
rng = np.random.default_rng(1)
def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)
w.add_tensor("token_embd.weight", f32(31, 32))
w.add_tensor("output_norm.weight", f32(32))
w.add_tensor("blk.0.attn_norm.weight", f32(32))
w.add_tensor("blk.0.attn_q.weight", f32(32, 32).astype(np.float16))
w.add_tensor("blk.0.attn_k.weight", f32(16, 32))
w.add_tensor("blk.0.attn_v.weight", f32(16, 32))
q8 = gguf.quants.quantize(f32(32, 32), gguf.GGMLQuantizationType.Q8_0)
w.add_tensor("blk.0.attn_output.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
w.add_tensor("blk.0.ffn_norm.weight", f32(32))
w.add_tensor("blk.0.ffn_gate.weight", f32(64, 32))
w.add_tensor("blk.0.ffn_up.weight", f32(64, 32))
w.add_tensor("blk.0.ffn_down.weight", f32(32, 64))
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()

for f in sorted(os.listdir(out)):
    print(f, os.path.getsize(os.path.join(out, f)))
