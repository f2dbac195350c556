//! Where each part of a split model runs ([`Placement`]: llama.cpp's placement for `-ngl` and
//! `--tensor-split`, and op offload's switch) and which part holds which tensor ([`Side`]).

use std::fmt;

/// Which part of a split holds what: the CPU, or the `n`th GPU of the split (in the runtime's
/// order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    Cpu,
    Gpu(usize),
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Side::Cpu => f.write_str("CPU"),
            Side::Gpu(g) => write!(f, "GPU {g}"),
        }
    }
}

/// Where each layer of a model runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub n_layers: usize,
    /// The first repeating layer on a GPU (`n_layers`: none).
    pub gpu_from: usize,
    /// With several GPUs, where each GPU after the first starts (ascending, from `gpu_from` to
    /// `n_layers`; equal bounds: a GPU without repeating layers); empty with one GPU.
    pub gpu_bounds: Vec<usize>,
    /// `output_norm` and `output` on a GPU.
    pub output_on_gpu: bool,
    /// Which GPU holds the output (llama.cpp's split treats it as layer `n_layers`).
    pub output_gpu: usize,
    /// No `output.weight`: the token embedding is the output matrix too, so it is needed on the
    /// GPU when the output is there.
    pub tied_output: bool,
    /// Op offload (llama.cpp's, on unless `--no-op-offload`), with the fewest tokens of a batch
    /// it takes ([`OFFLOAD_MIN_BATCH`] unless set): the ops of such a batch in a layer the CPU
    /// holds run on GPU 0, their weights streamed up as each op comes; the attention stays with
    /// the CPU's KV cache, and decode on the CPU.
    pub op_offload: Option<usize>,
}

/// The fewest tokens of a batch whose CPU layers run on the GPU under op offload: llama.cpp's
/// CUDA backend offloads an op of at least 32 rows (`GGML_OP_OFFLOAD_MIN_BATCH`'s default in
/// `ggml-cuda.cu`).
pub const OFFLOAD_MIN_BATCH: usize = 32;

impl Placement {
    /// llama.cpp's placement for `-ngl ngl` on one GPU.
    pub fn from_ngl(n_layers: usize, ngl: usize, tied_output: bool) -> Placement {
        Placement::from_split(n_layers, ngl, tied_output, &[1.0])
    }

    /// llama.cpp's placement for `-ngl ngl` over GPUs taking `shares` of the layers
    /// (`llama_model::load_tensors`: the offloaded layers, the output counted as the last,
    /// cut where the cumulative shares pass each layer's fraction).
    pub fn from_split(n_layers: usize, ngl: usize, tied_output: bool, shares: &[f64]) -> Placement {
        let i_start = (n_layers + 1).saturating_sub(ngl);
        let gpu_from = i_start.min(n_layers);
        let act = ngl.min(n_layers + 1);
        let k = shares.len().max(1);
        let total: f64 = shares.iter().filter(|x| x.is_finite() && **x > 0.0).sum();
        let mut cum = Vec::with_capacity(k);
        let mut run = 0.0;
        for i in 0..k {
            let x = shares.get(i).copied().filter(|x| x.is_finite() && *x > 0.0);
            run += if total > 0.0 {
                x.unwrap_or(0.0) / total
            } else {
                1.0 / k as f64
            };
            cum.push(run);
        }
        // The GPU of layer `il` (`n_layers`: the output): the first whose cumulative share
        // passes the layer's fraction (std::upper_bound).
        let dev = |il: usize| -> usize {
            if act == 0 {
                return 0;
            }
            let x = (il - i_start) as f32 / act as f32;
            cum.iter().position(|&c| c as f32 > x).unwrap_or(k - 1)
        };
        let gpu_bounds = (1..k)
            .map(|g| {
                (gpu_from..n_layers)
                    .find(|&l| dev(l) >= g)
                    .unwrap_or(n_layers)
            })
            .collect();
        Placement {
            n_layers,
            gpu_from,
            gpu_bounds,
            output_on_gpu: ngl >= 1,
            output_gpu: if ngl >= 1 { dev(n_layers) } else { 0 },
            tied_output,
            op_offload: None,
        }
    }

    /// This placement with op offload from batches of `min_batch` tokens (`None`: off).
    pub fn with_op_offload(mut self, min_batch: Option<usize>) -> Placement {
        self.op_offload = min_batch.map(|n| n.max(1));
        self
    }

    /// Whether a prompt batch streams weights to GPU 0: op offload is on and the CPU holds a
    /// layer or the output.
    pub fn streams(&self) -> bool {
        self.op_offload.is_some() && (self.gpu_from > 0 || !self.output_on_gpu)
    }

    /// llama.cpp's count for this placement.
    pub fn ngl(&self) -> usize {
        self.gpu_layers() + usize::from(self.output_on_gpu)
    }

    /// GPUs in the split.
    pub fn n_gpus(&self) -> usize {
        self.gpu_bounds.len() + 1
    }

    /// Repeating layers on GPU `g`.
    pub fn gpu_range(&self, g: usize) -> std::ops::Range<usize> {
        let start = match g {
            0 => self.gpu_from,
            g => self.gpu_bounds.get(g - 1).copied().unwrap_or(self.n_layers),
        };
        let end = self.gpu_bounds.get(g).copied().unwrap_or(self.n_layers);
        start..end.max(start)
    }

    /// Repeating layers on the GPUs.
    pub fn gpu_layers(&self) -> usize {
        self.n_layers - self.gpu_from
    }

    /// Every layer and the embedding on one GPU: no split at all.
    pub fn all_on_gpu(&self) -> bool {
        self.gpu_from == 0 && self.output_on_gpu && self.n_gpus() == 1
    }

    pub fn layer_side(&self, l: usize) -> Side {
        if l < self.gpu_from {
            Side::Cpu
        } else {
            Side::Gpu(self.gpu_bounds.iter().filter(|&&b| b <= l).count())
        }
    }

    pub fn output_side(&self) -> Side {
        if self.output_on_gpu {
            Side::Gpu(self.output_gpu)
        } else {
            Side::Cpu
        }
    }

    /// The parts a tensor (by its name, or a fused part's label `blk.3.attn_qkv.weight (q
    /// rows)`) is loaded on.
    pub fn tensor_parts(&self, name: &str) -> Vec<Side> {
        if let Some(l) = layer_of(name) {
            return vec![self.layer_side(l)];
        }
        let out = self.output_side();
        match name {
            "token_embd.weight" if self.output_on_gpu && self.tied_output => vec![Side::Cpu, out],
            "token_embd.weight" => vec![Side::Cpu],
            "output.weight" => vec![out],
            // Norms and RoPE factors: small, and used everywhere.
            _ if self.output_on_gpu || self.gpu_from < self.n_layers => std::iter::once(Side::Cpu)
                .chain((0..self.n_gpus()).map(Side::Gpu))
                .collect(),
            _ => vec![Side::Cpu],
        }
    }

    /// The sides a tensor is loaded on: `(on a GPU, on the CPU)`.
    pub fn tensor_sides(&self, name: &str) -> (bool, bool) {
        let p = self.tensor_parts(name);
        (
            p.iter().any(|s| matches!(s, Side::Gpu(_))),
            p.contains(&Side::Cpu),
        )
    }

    /// `16/33 layers on the GPU (layers 17–31 and the output), 17 on the CPU (layers 0–16 and
    /// the embedding)`; with several GPUs, each GPU's layers.
    pub fn describe(&self) -> String {
        let total = self.n_layers + 1;
        let span = |r: std::ops::Range<usize>, out: bool| -> String {
            let and = if out { " and the output" } else { "" };
            match r.len() {
                0 if out => "the output".to_string(),
                0 => "nothing".to_string(),
                _ => format!("layers {}–{}{and}", r.start, r.end - 1),
            }
        };
        let gpu = if self.n_gpus() == 1 {
            span(self.gpu_from..self.n_layers, self.output_on_gpu)
        } else {
            (0..self.n_gpus())
                .map(|g| {
                    let out = self.output_side() == Side::Gpu(g);
                    format!("GPU {g}: {}", span(self.gpu_range(g), out))
                })
                .collect::<Vec<_>>()
                .join("; ")
        };
        let cpu = match self.gpu_from {
            0 => "the embedding".to_string(),
            n => format!(
                "layers 0–{}, the embedding{}",
                n - 1,
                if self.output_on_gpu {
                    ""
                } else {
                    " and the output"
                }
            ),
        };
        let on = match self.n_gpus() {
            1 => "the GPU".to_string(),
            k => format!("{k} GPUs"),
        };
        format!(
            "{}/{total} layers on {on} ({gpu}), {} on the CPU ({cpu})",
            self.ngl(),
            total - self.ngl()
        )
    }
}

/// `blk.17.ffn_up.weight` → 17.
pub(super) fn layer_of(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("blk.")?;
    let (n, _) = rest.split_once('.')?;
    n.parse().ok()
}
