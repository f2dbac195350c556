//! Models larger than the GPU: `-ngl N` / `--n-gpu-layers N` (llama.cpp's name and meaning) and
//! `-ngl auto`, which fits as many layers as the device's usable memory holds.
//!
//! Placement follows llama.cpp (`llama_model::load_tensors`: `i_gpu_start = n_layer + 1 − ngl`):
//! the output layer (`output_norm`, `output`) counts as one layer and is the first to go to the
//! GPU, then the repeating layers from the last one down; the token embedding stays on the CPU.
//! So `-ngl 16` on a 32-layer model puts layers 17–31 and the output on the GPU, layers 0–16 and
//! the embedding on the CPU; `-ngl 0` runs everything on the CPU; `-ngl 33` (or more) runs the
//! whole model on the GPU as without a split. A step crosses between the backends once: the
//! residual stream after the last CPU layer goes up to the GPU ([`backend::SplitBackend`]).

pub mod backend;

use std::fmt;
use std::sync::{Arc, Mutex};

use crate::gpu::backend::{
    Backend, BackendError, Buf, Instrument, KvLayout, KvShift, KvType, Memory, MemoryPlan, MoeFfn,
    OpLabel, Ops, RopeParams, Weight, WeightData,
};
use crate::gpu::budget::{UsableMemory, usable_memory};
use crate::gpu::cpu::CpuBackend;
use crate::gpu::snapshot::{ArenaSnapshot, DeviceSummary};
use crate::gpu::telemetry::Roots;
use crate::model::config::ModelConfig;
use crate::model::forward::{Model, ModelError, ModelOptions};
use crate::model::gguf::GgufFile;

/// How many layers go to the GPU: the one setting (`-ngl` on every command, `n_gpu_layers` in
/// `config.toml`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GpuLayers {
    /// As many as the device's usable memory holds after the KV cache and workspace.
    #[default]
    Auto,
    /// llama.cpp's count: the output layer and then the last `n − 1` repeating layers.
    Count(usize),
}

impl std::str::FromStr for GpuLayers {
    type Err = String;
    fn from_str(s: &str) -> Result<GpuLayers, String> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("auto") || t == "-1" {
            return Ok(GpuLayers::Auto);
        }
        t.parse::<usize>()
            .ok()
            .filter(|&n| n <= 100_000)
            .map(GpuLayers::Count)
            .ok_or_else(|| {
                format!("n-gpu-layers: {s:?} is neither auto nor a number of layers (0 to 100000)")
            })
    }
}

impl fmt::Display for GpuLayers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuLayers::Auto => f.write_str("auto"),
            GpuLayers::Count(n) => write!(f, "{n}"),
        }
    }
}

/// Which side of a split holds what.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Gpu,
    Cpu,
}

/// Where each layer of a model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub n_layers: usize,
    /// The first repeating layer on the GPU (`n_layers`: none).
    pub gpu_from: usize,
    /// `output_norm` and `output` on the GPU.
    pub output_on_gpu: bool,
    /// No `output.weight`: the token embedding is the output matrix too, so it is needed on the
    /// GPU when the output is there.
    pub tied_output: bool,
}

impl Placement {
    /// llama.cpp's placement for `-ngl ngl`.
    pub fn from_ngl(n_layers: usize, ngl: usize, tied_output: bool) -> Placement {
        Placement {
            n_layers,
            gpu_from: (n_layers + 1).saturating_sub(ngl).min(n_layers),
            output_on_gpu: ngl >= 1,
            tied_output,
        }
    }

    /// llama.cpp's count for this placement.
    pub fn ngl(&self) -> usize {
        self.gpu_layers() + usize::from(self.output_on_gpu)
    }

    /// Repeating layers on the GPU.
    pub fn gpu_layers(&self) -> usize {
        self.n_layers - self.gpu_from
    }

    /// Every layer and the embedding on the GPU: no split at all.
    pub fn all_on_gpu(&self) -> bool {
        self.gpu_from == 0 && self.output_on_gpu
    }

    pub fn layer_side(&self, l: usize) -> Side {
        if l >= self.gpu_from {
            Side::Gpu
        } else {
            Side::Cpu
        }
    }

    pub fn output_side(&self) -> Side {
        if self.output_on_gpu {
            Side::Gpu
        } else {
            Side::Cpu
        }
    }

    /// The sides a tensor (by its name, or a fused part's label `blk.3.attn_qkv.weight (q
    /// rows)`) is loaded on: `(gpu, cpu)`.
    pub fn tensor_sides(&self, name: &str) -> (bool, bool) {
        if let Some(l) = layer_of(name) {
            return match self.layer_side(l) {
                Side::Gpu => (true, false),
                Side::Cpu => (false, true),
            };
        }
        match name {
            "token_embd.weight" => (self.output_on_gpu && self.tied_output, true),
            "output.weight" => (self.output_on_gpu, !self.output_on_gpu),
            // Norms and RoPE factors: small, and used on both sides.
            _ => (self.output_on_gpu || self.gpu_from < self.n_layers, true),
        }
    }

    /// `16/33 layers on the GPU (layers 17–31 and the output), 17 on the CPU (layers 0–16 and
    /// the embedding)`.
    pub fn describe(&self) -> String {
        let total = self.n_layers + 1;
        let gpu = match (self.gpu_layers(), self.output_on_gpu) {
            (0, false) => "nothing".to_string(),
            (0, true) => "the output".to_string(),
            (n, out) => format!(
                "layers {}–{}{}",
                self.gpu_from,
                self.gpu_from + n - 1,
                if out { " and the output" } else { "" }
            ),
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
        format!(
            "{}/{total} layers on the GPU ({gpu}), {} on the CPU ({cpu})",
            self.ngl(),
            total - self.ngl()
        )
    }
}

/// `blk.17.ffn_up.weight` → 17.
fn layer_of(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("blk.")?;
    let (n, _) = rest.split_once('.')?;
    n.parse().ok()
}

/// The [`MemoryPlan`] the GPU side of `place` needs, from the whole model's `full` plan: the
/// weights placed there, the KV cache of its layers (each at most the context), the same
/// activations and workspace.
pub fn gpu_plan(
    full: &MemoryPlan,
    place: &Placement,
    file: &GgufFile,
    config: &ModelConfig,
    n_ctx: usize,
) -> MemoryPlan {
    let mut weights = 0u64;
    let mut vectors = 0u64;
    for t in file.tensors() {
        if place.tensor_sides(&t.name).0 {
            weights += t.size;
            let (rows, cols) = t.rows_cols();
            if rows == 1 {
                vectors += cols as u64;
            }
        }
    }
    let kv_cap = (place.gpu_layers() * n_ctx * config.kv_dim()) as u64;
    MemoryPlan {
        weights,
        vector_elems: vectors,
        kv_elems: full.kv_elems.min(kv_cap),
        ..*full
    }
}

/// The memory plan `Model::load` will make for `file` with `options`, without loading anything:
/// the load runs until it tells its backend the plan (a probe that keeps it and stops there).
pub fn model_plan(file: &Arc<GgufFile>, options: ModelOptions) -> Result<MemoryPlan, ModelError> {
    let seen = Arc::new(Mutex::new(None));
    match Model::load(
        file.clone(),
        Box::new(PlanProbe { plan: seen.clone() }),
        options,
        &mut |_, _| {},
    ) {
        Ok(_) => {}
        Err(ModelError::Backend(BackendError::Unsupported(m))) if m == PROBE_DONE => {}
        Err(e) => return Err(e),
    }
    let plan = *seen.lock().unwrap_or_else(|e| e.into_inner());
    plan.ok_or_else(|| {
        ModelError::Backend(BackendError::Invalid(
            "loading the model made no memory plan".into(),
        ))
    })
}

const PROBE_DONE: &str = "memory plan probe: done";

/// A backend that only records the plan it is told, then refuses to go on.
struct PlanProbe {
    plan: Arc<Mutex<Option<MemoryPlan>>>,
}
impl Ops for PlanProbe {
    fn embed(&mut self, _: Weight, _: &[u32], _: Buf) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn rms_norm(
        &mut self,
        _: Buf,
        _: Weight,
        _: Buf,
        _: usize,
        _: usize,
        _: f32,
        _: OpLabel,
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn matmul(
        &mut self,
        _: Weight,
        _: Buf,
        _: Buf,
        _: usize,
        _: OpLabel,
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn matmul_qkv(
        &mut self,
        _: [Weight; 3],
        _: [Option<Weight>; 3],
        _: Buf,
        _: [Buf; 3],
        _: usize,
        _: u32,
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    #[allow(clippy::too_many_arguments)]
    fn matmul_glu(
        &mut self,
        _: Weight,
        _: Weight,
        _: Buf,
        _: Buf,
        _: Buf,
        _: usize,
        _: usize,
        _: crate::gpu::backend::Glu,
        _: u32,
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    #[allow(clippy::too_many_arguments)]
    fn rms_norm_add(
        &mut self,
        _: Buf,
        _: Weight,
        _: Buf,
        _: Buf,
        _: usize,
        _: usize,
        _: f32,
        _: OpLabel,
        _: OpLabel,
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    #[allow(clippy::too_many_arguments)]
    fn matmul_add(
        &mut self,
        _: Weight,
        _: Buf,
        _: Buf,
        _: Buf,
        _: usize,
        _: usize,
        _: OpLabel,
        _: OpLabel,
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn moe_ffn(&mut self, _: &MoeFfn) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn add_bias(
        &mut self,
        _: Buf,
        _: Weight,
        _: usize,
        _: OpLabel,
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn rope(
        &mut self,
        _: Buf,
        _: usize,
        _: usize,
        _: usize,
        _: usize,
        _: usize,
        _: &RopeParams,
        _: OpLabel,
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn attention(
        &mut self,
        _: Buf,
        _: Buf,
        _: Buf,
        _: Buf,
        _: &crate::gpu::backend::AttnParams,
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn rope_attention(
        &mut self,
        _: Buf,
        _: Buf,
        _: Buf,
        _: Buf,
        _: &crate::gpu::backend::HeadNorms,
        _: &RopeParams,
        _: &crate::gpu::backend::AttnParams,
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn swiglu(&mut self, _: Buf, _: Buf, _: usize, _: OpLabel) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn geglu(&mut self, _: Buf, _: Buf, _: usize, _: OpLabel) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn scale(&mut self, _: Buf, _: usize, _: f32, _: OpLabel) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn add(&mut self, _: Buf, _: Buf, _: usize, _: OpLabel) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn set_exact_rows_below(&mut self, _: usize) {}
    fn copy(
        &mut self,
        _: Buf,
        _: usize,
        _: Buf,
        _: usize,
        _: usize,
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
}

impl Memory for PlanProbe {
    fn plan(&mut self, plan: &MemoryPlan) -> crate::gpu::backend::Result<()> {
        *self.plan.lock().unwrap_or_else(|e| e.into_inner()) = Some(*plan);
        Err(BackendError::Unsupported(PROBE_DONE.into()))
    }
    fn plan_bytes(&self, _: &MemoryPlan) -> Option<u64> {
        None
    }
    fn load_weight(&mut self, _: &WeightData) -> crate::gpu::backend::Result<Weight> {
        Err(probe())
    }
    fn alloc(&mut self, _: &'static str, _: usize) -> crate::gpu::backend::Result<Buf> {
        Err(probe())
    }
    fn alloc_kv_cache(&mut self, _: &KvLayout) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn kv_type(&self) -> KvType {
        KvType::F32
    }
    fn kv_shift(&mut self, _: &KvShift) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn read(&mut self, _: Buf, _: usize, _: &mut [f32]) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn write(&mut self, _: Buf, _: usize, _: &[f32]) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn arena(&self) -> ArenaSnapshot {
        ArenaSnapshot::default()
    }
}

impl Instrument for PlanProbe {
    fn device(&self) -> DeviceSummary {
        DeviceSummary::default()
    }
}

fn probe() -> BackendError {
    BackendError::Unsupported(PROBE_DONE.into())
}

/// What `-ngl` came to for a model on a device, and the sentence that says so.
#[derive(Clone, Debug, PartialEq)]
pub struct SplitChoice {
    pub place: Placement,
    pub said: String,
}

/// Resolves `-ngl` for a model whose whole plan is `full` on `gpu` (the opened GPU backend):
/// a count as given; `auto`, the most layers whose GPU plan fits in `usable` (llama.cpp's order:
/// the output first, then the last layers). An error when not even the activations and
/// workspace fit, with the numbers.
pub fn choose(
    want: GpuLayers,
    full: &MemoryPlan,
    gpu: &dyn Backend,
    usable: Option<&UsableMemory>,
    file: &GgufFile,
    config: &ModelConfig,
    n_ctx: usize,
) -> Result<SplitChoice, ModelError> {
    let n = config.n_layers;
    let tied = config.tied_embeddings;
    let needs = |p: &Placement| -> Option<u64> {
        if p.all_on_gpu() {
            gpu.plan_bytes(full)
        } else {
            gpu.plan_bytes(&gpu_plan(full, p, file, config, n_ctx))
        }
    };
    let mib = |b: u64| b >> 20;
    match want {
        GpuLayers::Count(k) => {
            let place = Placement::from_ngl(n, k, tied);
            Ok(SplitChoice {
                place,
                said: format!("-ngl {k}: {}", place.describe()),
            })
        }
        GpuLayers::Auto => {
            let Some(usable) = usable else {
                let place = Placement::from_ngl(n, n + 1, tied);
                return Ok(SplitChoice {
                    place,
                    said: format!(
                        "-ngl auto: {} (the device's free memory is not known)",
                        place.describe()
                    ),
                });
            };
            for k in (0..=n + 1).rev() {
                let place = Placement::from_ngl(n, k, tied);
                let Some(need) = needs(&place) else {
                    continue;
                };
                if need <= usable.bytes {
                    return Ok(SplitChoice {
                        place,
                        said: format!(
                            "-ngl auto: {}; {} MiB of the {} MiB usable ({})",
                            place.describe(),
                            mib(need),
                            mib(usable.bytes),
                            usable.source
                        ),
                    });
                }
            }
            let least = needs(&Placement::from_ngl(n, 0, tied)).unwrap_or(0);
            Err(ModelError::Backend(BackendError::OutOfMemory(format!(
                "-ngl auto: even with every layer on the CPU the GPU needs {} MiB for activations \
                 and workspace, {} MiB are usable ({}); use --backend cpu or a smaller batch (-b)",
                mib(least),
                mib(usable.bytes),
                usable.source
            ))))
        }
    }
}

/// Puts a model on `backend` as `-ngl` asks: unchanged on the CPU backend or when every layer
/// goes to the GPU; else a [`backend::SplitBackend`] over the GPU backend and a CPU backend
/// computing as `cpu` says. Returns the sentence saying how it was placed (`None` on the CPU).
pub fn arrange(
    file: &Arc<GgufFile>,
    gpu: Box<dyn Backend>,
    config: &ModelConfig,
    options: ModelOptions,
    want: GpuLayers,
    cpu: &crate::gpu::cpu::CpuOptions,
    roots: &Roots,
) -> Result<(Box<dyn Backend>, Option<String>), ModelError> {
    // Only a backend with device memory to plan is split.
    if gpu.plan_bytes(&MemoryPlan::default()).is_none() {
        return Ok((gpu, None));
    }
    let full = model_plan(file, options)?;
    let usable = usable_memory(&gpu.device(), roots);
    // Every sequence's positions (`--parallel`): the GPU part holds all of them.
    let n_ctx = options.n_ctx.max(1) * options.n_seq.max(1);
    let choice = choose(
        want,
        &full,
        gpu.as_ref(),
        usable.as_ref(),
        file,
        config,
        n_ctx,
    )?;
    if choice.place.all_on_gpu() {
        return Ok((gpu, Some(choice.said)));
    }
    let cpu = CpuBackend::with_options(cpu, "the CPU part of a split model (-ngl)")
        .with_kv_type(gpu.kv_type());
    let plan = gpu_plan(&full, &choice.place, file, config, n_ctx);
    let said = choice.said.clone();
    Ok((
        Box::new(backend::SplitBackend::new(
            gpu,
            Box::new(cpu),
            choice.place,
            plan,
            choice.said,
        )),
        Some(said),
    ))
}

/// `-ngl`'s value: `auto` or a number of layers (the flag's parser, shared by the chat's and the
/// headless commands' arguments).
pub fn parse_gpu_layers(s: &str) -> Result<GpuLayers, String> {
    s.parse()
}
