//! What `ModelConfig` reads from the files of the issue-15 architectures: each missing tensor
//! named, and the sliding-window keys read as llama.cpp's `load_swa_pattern` and
//! `load_arch_hparams` read them, with their defaults.

use std::path::Path;

use hipscope::gpu::quant::GgmlType;
use hipscope::model::config::{ConfigError, ModelConfig};
use hipscope::model::gguf::{Array, GgufFile, GgufWriter, TensorSpec, Value, ValueType};
use hipscope::model::synthetic;

/// `shape`'s synthetic file rewritten without tensor `drop`, each key of `set` removed and,
/// where a value is given, written with it.
fn edited(shape: &str, drop: &str, set: &[(&str, Option<Value>)]) -> GgufFile {
    let s = synthetic::shape(shape).unwrap();
    let f = synthetic::build(s, GgmlType::F32, 1, &mut |_, _| {}).unwrap();
    let mut meta: Vec<(String, Value)> = f
        .metadata()
        .iter()
        .filter(|(k, _)| !set.iter().any(|(s, _)| s == k))
        .cloned()
        .collect();
    meta.extend(
        set.iter()
            .filter_map(|(k, v)| v.clone().map(|v| (k.to_string(), v))),
    );
    let kept: Vec<_> = f.tensors().iter().filter(|t| t.name != drop).collect();
    let specs: Vec<TensorSpec> = kept
        .iter()
        .map(|t| TensorSpec::new(t.name.clone(), &t.dims, t.ty))
        .collect();
    let mut w = GgufWriter::new(Vec::new(), &meta, &specs).unwrap();
    for t in kept {
        w.write_tensor(f.tensor_data(t)).unwrap();
    }
    GgufFile::from_bytes(Path::new("edited.gguf"), w.finish().unwrap()).unwrap()
}

fn check(f: &GgufFile) -> Result<ModelConfig, ConfigError> {
    let c = ModelConfig::from_gguf(f)?;
    c.check_tensors(f)?;
    Ok(c)
}

fn flags(v: &[bool]) -> Option<Value> {
    Some(Value::Array(Array {
        ty: ValueType::Bool,
        items: v.iter().map(|&b| Value::Bool(b)).collect(),
    }))
}

#[test]
fn each_new_architecture_names_a_missing_tensor() {
    for (shape, tensor) in [
        ("tiny-qwen3", "blk.1.attn_k_norm.weight"),
        ("tiny-gemma2", "blk.0.post_ffw_norm.weight"),
        ("tiny-gemma3", "blk.3.post_attention_norm.weight"),
        ("tiny-phi3", "blk.1.attn_qkv.weight"),
        ("tiny-phi3", "rope_factors_short.weight"),
    ] {
        let e = check(&edited(shape, tensor, &[])).unwrap_err().to_string();
        assert!(e.contains(&format!("tensor {tensor} is missing")), "{e}");
    }
}

#[test]
fn sliding_window_keys_are_read_as_llama_cpp_reads_them() {
    // A per-layer pattern array overrides Gemma 3's 5:1 default.
    let pattern = [true, false, true, false, true, false];
    let key = "gemma3.attention.sliding_window_pattern";
    let c = check(&edited("tiny-gemma3", "", &[(key, flags(&pattern))])).unwrap();
    assert_eq!(c.swa_layers, pattern);
    // Without a window Gemma 3 has no local layers.
    let key = "gemma3.attention.sliding_window";
    let c = check(&edited("tiny-gemma3", "", &[(key, Some(Value::U32(0)))])).unwrap();
    assert_eq!(c.sliding_window, 0);
    // A pattern of the wrong length is refused, naming the key.
    let key = "gemma2.attention.sliding_window_pattern";
    let e = check(&edited("tiny-gemma2", "", &[(key, flags(&[true; 2]))]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("sliding_window_pattern") && e.contains("4 booleans"),
        "{e}"
    );
    // Gemma 2 without the soft-capping and window keys: llama.cpp's defaults.
    let c = check(&edited(
        "tiny-gemma2",
        "",
        &[
            ("gemma2.attn_logit_softcapping", None),
            ("gemma2.final_logit_softcapping", None),
            ("gemma2.attention.sliding_window", None),
        ],
    ))
    .unwrap();
    assert_eq!((c.attn_softcap, c.final_softcap), (Some(50.0), Some(30.0)));
    assert_eq!(c.sliding_window, 4096);
    // The query scale below the 27B size is 1/√key_length.
    assert_eq!(c.attn_scale, 1.0 / 128f32.sqrt());
}

/// The mixture-of-experts keys and tensors (issue 16), as llama.cpp's `load_hparams` and the
/// architectures' `load_arch_tensors` read them: the expert counts, qwen3moe's expert width (or
/// `feed_forward_length / expert_used_count` without it), each missing expert tensor named, and
/// impossible counts refused with the key.
#[test]
fn moe_keys_and_tensors_are_read_as_llama_cpp_reads_them() {
    use hipscope::model::config::Moe;
    let moe =
        |shape: &str, set: &[(&str, Option<Value>)]| check(&edited(shape, "", set)).map(|c| c.moe);
    assert_eq!(
        moe("mixtral-tiny-2l", &[]).unwrap(),
        Some(Moe {
            n_expert: 8,
            n_used: 2,
            ffn_dim: 256,
            oai: false
        })
    );
    assert_eq!(
        moe("tiny-qwen3moe", &[]).unwrap(),
        Some(Moe {
            n_expert: 16,
            n_used: 4,
            ffn_dim: 128,
            oai: false
        })
    );
    // Without expert_feed_forward_length llama.cpp takes n_ff / n_expert_used: 512 / 4 here,
    // the experts' width; with n_ff 1024 that no longer matches the tensors, and the shape error
    // names one.
    let no_key = ("qwen3moe.expert_feed_forward_length", None);
    assert_eq!(
        moe("tiny-qwen3moe", std::slice::from_ref(&no_key))
            .unwrap()
            .map(|m| m.ffn_dim),
        Some(128)
    );
    let e = moe(
        "tiny-qwen3moe",
        &[
            no_key,
            ("qwen3moe.feed_forward_length", Some(Value::U32(1024))),
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("blk.0.ffn_") && e.contains("[256, 256, 16]"),
        "{e}"
    );
    for (shape, tensor) in [
        ("mixtral-tiny-2l", "blk.1.ffn_gate_inp.weight"),
        ("mixtral-tiny-2l", "blk.0.ffn_up_exps.weight"),
        ("tiny-qwen3moe", "blk.1.ffn_down_exps.weight"),
    ] {
        let e = check(&edited(shape, tensor, &[])).unwrap_err().to_string();
        assert!(e.contains(tensor) && e.contains("missing"), "{e}");
    }
    for (set, says) in [
        (
            ("llama.expert_used_count", Some(Value::U32(9))),
            "llama.expert_used_count = 9",
        ),
        (
            ("llama.expert_used_count", Some(Value::U32(0))),
            "must be between 1 and the expert count 8",
        ),
        (
            ("llama.expert_count", Some(Value::U32(4096))),
            "at most 512 experts",
        ),
    ] {
        let e = moe("mixtral-tiny-2l", &[set]).unwrap_err().to_string();
        assert!(e.contains(says), "{e}");
    }
    let e = moe("tiny-qwen3moe", &[("qwen3moe.expert_count", None)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("qwen3moe.expert_count is missing"), "{e}");
}

/// gpt-oss as llama.cpp's `llama_model_openai_moe` reads it: every tensor it loads is required
/// and named when missing (the output matrix included: never tied), the window and the experts'
/// width are required keys, the even layers slide (pattern 2), YaRN comes from `rope.scaling.*`,
/// queries are scaled by 1/√n_rot.
#[test]
fn gpt_oss_keys_and_tensors_are_read_as_llama_cpp_reads_them() {
    use hipscope::model::config::{Arch, Moe, RopeScaling};
    for tensor in [
        "blk.0.attn_sinks.weight",
        "blk.1.attn_output.bias",
        "blk.0.attn_q.bias",
        "blk.1.attn_v.bias",
        "blk.0.post_attention_norm.weight",
        "blk.1.ffn_gate_inp.bias",
        "blk.0.ffn_gate_exps.bias",
        "blk.0.ffn_up_exps.bias",
        "blk.1.ffn_down_exps.bias",
        "output.weight",
    ] {
        let e = check(&edited("tiny-gpt-oss", tensor, &[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("tensor {tensor} is missing")), "{e}");
    }
    for key in [
        "gpt-oss.attention.sliding_window",
        "gpt-oss.expert_feed_forward_length",
        "gpt-oss.expert_count",
    ] {
        let e = check(&edited("tiny-gpt-oss", "", &[(key, None)]))
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("{key} is missing")), "{e}");
    }
    let c = check(&edited("tiny-gpt-oss", "", &[])).unwrap();
    assert_eq!(c.arch, Arch::GptOss);
    assert_eq!(
        (c.sliding_window, c.swa_layers.clone()),
        (16, vec![true, false])
    );
    assert_eq!(
        c.rope_scaling,
        RopeScaling::Yarn {
            factor: 32.0,
            original_ctx: 128
        }
    );
    assert_eq!(c.attn_scale, 0.125);
    assert!(!c.tied_embeddings);
    assert_eq!(
        c.moe,
        Some(Moe {
            n_expert: 8,
            n_used: 2,
            ffn_dim: 256,
            oai: true
        })
    );
    // The GPU backends run it (issue 16): sinks, YaRN and the biased experts have kernels.
    assert_eq!(c.arch.gpu_unsupported(), None);
}
