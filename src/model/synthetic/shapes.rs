//! The shapes `synth` knows: real models' hyperparameters, as their GGUF files carry them.

/// The shape of a model family member.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    pub name: &'static str,
    pub arch: &'static str,
    pub n_layers: usize,
    pub dim: usize,
    pub ffn_dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub vocab: usize,
    pub ctx: usize,
    pub rope_base: f32,
    pub rms_eps: f32,
    pub tied: bool,
    pub qkv_bias: bool,
    /// llama 3.1 RoPE scaling (factor, low, high, original context) as `rope_freqs.weight`.
    pub llama3_rope: Option<(f32, f32, f32, f32)>,
    /// `attention.key_length` where it is not dim / heads (Qwen 3, Gemma); 0: dim / heads.
    pub head_dim: usize,
    /// Dimensions RoPE rotates (Phi-4-mini's partial rotary); 0: the whole head.
    pub rot_dims: usize,
    /// `attention.sliding_window` (Gemma, Phi-3); 0: none written.
    pub sliding_window: usize,
    /// Gemma 2's `attn_logit_softcapping` and `final_logit_softcapping`; 0: none written.
    pub attn_softcap: f32,
    pub final_softcap: f32,
    /// Phi-3 LongRoPE: the original context; the factor tensors and `rope.scaling.attn_factor`
    /// follow from it and `ctx` as llama.cpp's converter computes them.
    pub long_rope: Option<usize>,
    /// Mixture of experts: `expert_count`, `expert_used_count` (0: a dense FFN).
    pub n_expert: usize,
    pub n_expert_used: usize,
    /// Each expert's width where it differs from `ffn_dim` (qwen3moe's
    /// `expert_feed_forward_length`); 0: `ffn_dim`.
    pub expert_ffn_dim: usize,
    /// YaRN RoPE scaling (gpt-oss): `rope.scaling.factor` and
    /// `rope.scaling.original_context_length`.
    pub yarn: Option<(f32, usize)>,
}

/// The llama shape's defaults for the fields most shapes leave alone.
const LLAMA: Shape = Shape {
    name: "",
    arch: "llama",
    n_layers: 2,
    dim: 256,
    ffn_dim: 512,
    n_heads: 4,
    n_kv_heads: 2,
    vocab: 512,
    ctx: 512,
    rope_base: 10000.0,
    rms_eps: 1e-5,
    tied: false,
    qkv_bias: false,
    llama3_rope: None,
    head_dim: 0,
    rot_dims: 0,
    sliding_window: 0,
    attn_softcap: 0.0,
    final_softcap: 0.0,
    long_rope: None,
    n_expert: 0,
    n_expert_used: 0,
    expert_ffn_dim: 0,
    yarn: None,
};

/// Every shape `--synthetic` knows.
pub const SHAPES: &[Shape] = &[
    Shape {
        name: "tiny",
        arch: "llama",
        n_layers: 2,
        dim: 256,
        ffn_dim: 512,
        n_heads: 4,
        n_kv_heads: 2,
        vocab: 512,
        ctx: 512,
        rope_base: 10000.0,
        rms_eps: 1e-5,
        tied: false,
        qkv_bias: false,
        ..LLAMA
    },
    Shape {
        name: "tiny-qwen2",
        arch: "qwen2",
        n_layers: 2,
        dim: 256,
        ffn_dim: 512,
        n_heads: 4,
        n_kv_heads: 1,
        vocab: 512,
        ctx: 512,
        rope_base: 1_000_000.0,
        rms_eps: 1e-6,
        tied: true,
        qkv_bias: true,
        ..LLAMA
    },
    Shape {
        name: "tiny-llama3",
        arch: "llama",
        n_layers: 2,
        dim: 256,
        ffn_dim: 512,
        n_heads: 4,
        n_kv_heads: 4,
        vocab: 512,
        ctx: 512,
        rope_base: 500_000.0,
        rms_eps: 1e-5,
        tied: true,
        qkv_bias: false,
        llama3_rope: Some((8.0, 1.0, 4.0, 64.0)),
        ..LLAMA
    },
    Shape {
        name: "smollm2-135m",
        arch: "llama",
        n_layers: 30,
        dim: 576,
        ffn_dim: 1536,
        n_heads: 9,
        n_kv_heads: 3,
        vocab: 49152,
        ctx: 8192,
        rope_base: 100_000.0,
        rms_eps: 1e-5,
        tied: true,
        qkv_bias: false,
        ..LLAMA
    },
    Shape {
        name: "qwen2.5-0.5b",
        arch: "qwen2",
        n_layers: 24,
        dim: 896,
        ffn_dim: 4864,
        n_heads: 14,
        n_kv_heads: 2,
        vocab: 151_936,
        ctx: 32768,
        rope_base: 1_000_000.0,
        rms_eps: 1e-6,
        tied: true,
        qkv_bias: true,
        ..LLAMA
    },
    Shape {
        name: "llama-3.2-1b",
        arch: "llama",
        n_layers: 16,
        dim: 2048,
        ffn_dim: 8192,
        n_heads: 32,
        n_kv_heads: 8,
        vocab: 128_256,
        ctx: 131_072,
        rope_base: 500_000.0,
        rms_eps: 1e-5,
        tied: true,
        qkv_bias: false,
        llama3_rope: Some((32.0, 1.0, 4.0, 8192.0)),
        ..LLAMA
    },
    Shape {
        name: "llama-2-7b",
        arch: "llama",
        n_layers: 32,
        dim: 4096,
        ffn_dim: 11008,
        n_heads: 32,
        n_kv_heads: 32,
        vocab: 32000,
        ctx: 4096,
        rope_base: 10000.0,
        rms_eps: 1e-5,
        tied: false,
        qkv_bias: false,
        ..LLAMA
    },
    Shape {
        name: "tiny-qwen3",
        arch: "qwen3",
        n_kv_heads: 2,
        head_dim: 96,
        rope_base: 1_000_000.0,
        rms_eps: 1e-6,
        tied: true,
        ..LLAMA
    },
    Shape {
        name: "tiny-gemma2",
        arch: "gemma2",
        n_layers: 4,
        head_dim: 128,
        rms_eps: 1e-6,
        tied: true,
        sliding_window: 16,
        attn_softcap: 50.0,
        final_softcap: 30.0,
        ..LLAMA
    },
    Shape {
        name: "tiny-gemma3",
        arch: "gemma3",
        n_layers: 6,
        n_kv_heads: 1,
        head_dim: 128,
        rope_base: 1_000_000.0,
        rms_eps: 1e-6,
        tied: true,
        sliding_window: 16,
        ..LLAMA
    },
    Shape {
        name: "tiny-phi3",
        arch: "phi3",
        n_kv_heads: 4,
        ctx: 4096,
        rot_dims: 48,
        sliding_window: 2047,
        long_rope: Some(256),
        ..LLAMA
    },
    Shape {
        name: "qwen3-0.6b",
        arch: "qwen3",
        n_layers: 28,
        dim: 1024,
        ffn_dim: 3072,
        n_heads: 16,
        n_kv_heads: 8,
        head_dim: 128,
        vocab: 151_936,
        ctx: 40960,
        rope_base: 1_000_000.0,
        rms_eps: 1e-6,
        tied: true,
        ..LLAMA
    },
    Shape {
        name: "gemma3-1b",
        arch: "gemma3",
        n_layers: 26,
        dim: 1152,
        ffn_dim: 6912,
        n_heads: 4,
        n_kv_heads: 1,
        head_dim: 256,
        vocab: 262_144,
        ctx: 32768,
        rope_base: 1_000_000.0,
        rms_eps: 1e-6,
        tied: true,
        sliding_window: 512,
        ..LLAMA
    },
    Shape {
        name: "gemma2-2b",
        arch: "gemma2",
        n_layers: 26,
        dim: 2304,
        ffn_dim: 9216,
        n_heads: 8,
        n_kv_heads: 4,
        head_dim: 256,
        vocab: 256_000,
        ctx: 8192,
        rms_eps: 1e-6,
        tied: true,
        sliding_window: 4096,
        attn_softcap: 50.0,
        final_softcap: 30.0,
        ..LLAMA
    },
    // Phi-3-mini-128k-instruct (the 4k model is this shape without LongRoPE).
    Shape {
        name: "phi3-mini",
        arch: "phi3",
        n_layers: 32,
        dim: 3072,
        ffn_dim: 8192,
        n_heads: 32,
        n_kv_heads: 32,
        vocab: 32064,
        ctx: 131_072,
        sliding_window: 262_144,
        long_rope: Some(4096),
        ..LLAMA
    },
    // Phi-4-mini-instruct: grouped KV heads, a quarter of each head left unrotated.
    Shape {
        name: "phi4-mini",
        arch: "phi3",
        n_layers: 32,
        dim: 3072,
        ffn_dim: 8192,
        n_heads: 24,
        n_kv_heads: 8,
        rot_dims: 96,
        vocab: 200_064,
        ctx: 131_072,
        tied: true,
        sliding_window: 262_144,
        long_rope: Some(4096),
        ..LLAMA
    },
    // Mixture-of-experts shapes (issue 16): Mixtral-style llama and qwen3moe, small ones for the
    // llama.cpp reference tests, Qwen3-30B-A3B in full and cut to its first 2 layers.
    Shape {
        name: "mixtral-tiny",
        n_layers: 4,
        ffn_dim: 256,
        rope_base: 1_000_000.0,
        n_expert: 8,
        n_expert_used: 2,
        ..LLAMA
    },
    Shape {
        name: "mixtral-tiny-2l",
        n_layers: 2,
        ffn_dim: 256,
        rope_base: 1_000_000.0,
        n_expert: 8,
        n_expert_used: 2,
        ..LLAMA
    },
    Shape {
        name: "tiny-qwen3moe",
        arch: "qwen3moe",
        n_kv_heads: 2,
        head_dim: 96,
        rope_base: 1_000_000.0,
        rms_eps: 1e-6,
        n_expert: 16,
        n_expert_used: 4,
        expert_ffn_dim: 128,
        ..LLAMA
    },
    Shape {
        name: "qwen3-30b-a3b",
        ..QWEN3_30B_A3B
    },
    Shape {
        name: "qwen3-30b-a3b-2l",
        n_layers: 2,
        ..QWEN3_30B_A3B
    },
    // gpt-oss (issue 16): gpt-oss-20b in full, cut to its first 2 layers (one sliding, one
    // global), and a small one of the same build for the llama.cpp reference test: 2 layers of
    // width 256, 8 experts of which 2 are used, a window of 16.
    Shape {
        name: "gpt-oss-20b",
        ..GPT_OSS_20B
    },
    Shape {
        name: "gpt-oss-20b-2l",
        n_layers: 2,
        ..GPT_OSS_20B
    },
    Shape {
        name: "tiny-gpt-oss",
        n_layers: 2,
        dim: 256,
        ffn_dim: 256,
        n_heads: 8,
        n_kv_heads: 2,
        head_dim: 64,
        vocab: 512,
        ctx: 4096,
        sliding_window: 16,
        n_expert: 8,
        n_expert_used: 2,
        expert_ffn_dim: 256,
        yarn: Some((32.0, 128)),
        ..GPT_OSS_20B
    },
];

/// gpt-oss-20b as llama.cpp's converter writes it (`GptOssModel`: `expert_feed_forward_length`
/// = `intermediate_size`, `attention.sliding_window` = 128, YaRN factor 32 over an original
/// context of 4096; 64 query heads of 64 over a width of 2880).
const GPT_OSS_20B: Shape = Shape {
    name: "",
    arch: "gpt-oss",
    n_layers: 24,
    dim: 2880,
    ffn_dim: 2880,
    n_heads: 64,
    n_kv_heads: 8,
    head_dim: 64,
    vocab: 201_088,
    ctx: 131_072,
    rope_base: 150_000.0,
    rms_eps: 1e-5,
    qkv_bias: true,
    sliding_window: 128,
    n_expert: 32,
    n_expert_used: 4,
    expert_ffn_dim: 2880,
    yarn: Some((32.0, 4096)),
    ..LLAMA
};

/// Qwen3-30B-A3B (as llama.cpp's converter writes it: `feed_forward_length` is the dense
/// `intermediate_size`, the experts' width `expert_feed_forward_length`).
const QWEN3_30B_A3B: Shape = Shape {
    name: "",
    arch: "qwen3moe",
    n_layers: 48,
    dim: 2048,
    ffn_dim: 6144,
    n_heads: 32,
    n_kv_heads: 4,
    head_dim: 128,
    vocab: 151_936,
    ctx: 40960,
    rope_base: 1_000_000.0,
    rms_eps: 1e-6,
    n_expert: 128,
    n_expert_used: 8,
    expert_ffn_dim: 768,
    ..LLAMA
};

impl Shape {
    /// Dimensions of a head.
    pub fn head_dim(&self) -> usize {
        if self.head_dim > 0 {
            self.head_dim
        } else {
            self.dim / self.n_heads
        }
    }

    /// Each expert's width (MoE shapes).
    pub fn expert_ffn(&self) -> usize {
        if self.expert_ffn_dim > 0 {
            self.expert_ffn_dim
        } else {
            self.ffn_dim
        }
    }

    /// Dimensions of a head RoPE rotates.
    pub fn rot_dims(&self) -> usize {
        if self.rot_dims > 0 {
            self.rot_dims
        } else {
            self.head_dim()
        }
    }
}
