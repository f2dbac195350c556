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
//!
//! Several GPUs (`--split-mode layer`, `--tensor-split`, `--main-gpu`: `options.rs`): the
//! offloaded layers are cut over the GPUs as llama.cpp cuts them (the output counted as the last
//! layer, each GPU taking its share in the runtime's order), each GPU its own backend (streams,
//! arena, KV cache of its layers, watchdog), the residual stream crossing once per boundary per
//! step. By default a model that does not fit one GPU goes over all of them in proportion to
//! their free memory, said at start beside the backend's choice.

pub mod backend;
mod options;
mod placement;
mod probe;

use std::fmt;
use std::sync::Arc;

pub use options::{SplitMode, SplitOptions, TensorSplit, parse_split_mode, parse_tensor_split};
use placement::layer_of;
pub use placement::{OFFLOAD_MIN_BATCH, Placement, Side};
pub use probe::model_plan;

use crate::gpu::backend::{Backend, BackendError, MemoryPlan};
use crate::gpu::budget::{UsableMemory, usable_memory};
use crate::gpu::cpu::CpuBackend;
pub use crate::gpu::open::MoreGpus;
use crate::gpu::telemetry::Roots;
use crate::model::config::ModelConfig;
use crate::model::forward::{ModelError, ModelOptions};
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

/// The [`MemoryPlan`] GPU `g` of `place` needs, from the whole model's `full` plan: the weights
/// placed there, the KV cache of its layers (with op offload's stage on GPU 0:
/// `SplitBackend::alloc_kv_cache`), the same activations and workspace.
pub fn gpu_plan_of(
    full: &MemoryPlan,
    place: &Placement,
    g: usize,
    file: &GgufFile,
    config: &ModelConfig,
    n_ctx: usize,
) -> MemoryPlan {
    let mut weights = 0u64;
    let mut vectors = 0u64;
    for t in file.tensors() {
        if place.tensor_parts(&t.name).contains(&Side::Gpu(g)) {
            weights += t.size;
            let (rows, cols) = t.rows_cols();
            if rows == 1 {
                vectors += cols as u64;
            }
        }
    }
    let stage = g == 0 && place.streams() && place.gpu_from > 0;
    let range = place.gpu_range(g);
    let kv = crate::model::forward::kv_layout(config, n_ctx, full.n_batch, full.n_seq.max(1))
        .ok()
        .and_then(|l| {
            if stage {
                l.part_with_stage(range)
            } else {
                l.part(range)
            }
        })
        .map_or(0, |p| p.elems() as u64);
    MemoryPlan {
        weights,
        vector_elems: vectors,
        kv_elems: kv,
        stage_bytes: if g == 0 && place.streams() {
            stage_room(place, file)
        } else {
            0
        },
        ..*full
    }
}

/// The most one op of the CPU's part streams to GPU 0 under op offload: the tensors of one of
/// its layers, or of the output (the token embedding where it is the output matrix), each as
/// the GPU keeps it (a vector as f32) and aligned.
fn stage_room(place: &Placement, file: &GgufFile) -> u64 {
    use crate::gpu::arena::ALIGN;
    let mut per: std::collections::HashMap<Option<usize>, u64> = Default::default();
    for t in file.tensors() {
        let group = match layer_of(&t.name) {
            Some(l) if l < place.gpu_from => Some(l),
            Some(_) => continue,
            None if place.output_on_gpu => continue,
            None => match t.name.as_str() {
                "output.weight" | "output_norm.weight" => None,
                "token_embd.weight" if place.tied_output => None,
                _ => continue,
            },
        };
        let (rows, cols) = t.rows_cols();
        let bytes = if rows == 1 { cols as u64 * 4 } else { t.size };
        *per.entry(group).or_default() += bytes.next_multiple_of(ALIGN);
    }
    per.into_values().max().unwrap_or(0)
}

/// The plan of the GPU side of a one-GPU split (`-ngl`).
pub fn gpu_plan(
    full: &MemoryPlan,
    place: &Placement,
    file: &GgufFile,
    config: &ModelConfig,
    n_ctx: usize,
) -> MemoryPlan {
    gpu_plan_of(full, place, 0, file, config, n_ctx)
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
/// workspace fit, with the numbers. `op_offload` ([`Placement::op_offload`]): the GPU sets
/// room aside for the CPU layers' streamed weights.
#[allow(clippy::too_many_arguments)]
pub fn choose(
    want: GpuLayers,
    full: &MemoryPlan,
    gpu: &dyn Backend,
    usable: Option<&UsableMemory>,
    file: &GgufFile,
    config: &ModelConfig,
    n_ctx: usize,
    op_offload: Option<usize>,
) -> Result<SplitChoice, ModelError> {
    choose_over(
        want,
        full,
        &[(gpu, usable.cloned())],
        &[1.0],
        file,
        config,
        n_ctx,
        op_offload,
    )
}

/// [`choose`] over several GPUs taking `shares` of the layers, each with its usable memory.
#[allow(clippy::too_many_arguments)]
pub fn choose_over(
    want: GpuLayers,
    full: &MemoryPlan,
    gpus: &[(&dyn Backend, Option<UsableMemory>)],
    shares: &[f64],
    file: &GgufFile,
    config: &ModelConfig,
    n_ctx: usize,
    op_offload: Option<usize>,
) -> Result<SplitChoice, ModelError> {
    let n = config.n_layers;
    let tied = config.tied_embeddings;
    let place_for =
        |k: usize| Placement::from_split(n, k, tied, shares).with_op_offload(op_offload);
    let needs = |p: &Placement| -> Option<Vec<u64>> {
        gpus.iter()
            .enumerate()
            .map(|(g, (b, _))| {
                if p.all_on_gpu() {
                    b.plan_bytes(full)
                } else {
                    b.plan_bytes(&gpu_plan_of(full, p, g, file, config, n_ctx))
                }
            })
            .collect()
    };
    let mib = |b: u64| b >> 20;
    let usable: Option<Vec<&UsableMemory>> = gpus.iter().map(|(_, u)| u.as_ref()).collect();
    match want {
        GpuLayers::Count(k) => {
            let place = place_for(k);
            let said = format!("-ngl {k}: {}{}", place.describe(), offload_note(&place));
            Ok(SplitChoice { place, said })
        }
        GpuLayers::Auto => {
            let Some(usable) = usable else {
                let place = place_for(n + 1);
                return Ok(SplitChoice {
                    said: format!(
                        "-ngl auto: {} (the device's free memory is not known)",
                        place.describe()
                    ),
                    place,
                });
            };
            let of = |need: &[u64]| -> String {
                need.iter()
                    .zip(&usable)
                    .map(|(n, u)| {
                        format!(
                            "{} MiB of the {} MiB usable ({})",
                            mib(*n),
                            mib(u.bytes),
                            u.source
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            for k in (0..=n + 1).rev() {
                let place = place_for(k);
                let Some(need) = needs(&place) else {
                    continue;
                };
                if need.iter().zip(&usable).all(|(n, u)| *n <= u.bytes) {
                    return Ok(SplitChoice {
                        said: format!(
                            "-ngl auto: {}{}; {}",
                            place.describe(),
                            offload_note(&place),
                            of(&need)
                        ),
                        place,
                    });
                }
            }
            let least = needs(&place_for(0)).unwrap_or_default();
            let e = match (least.as_slice(), usable.as_slice()) {
                ([need], [u]) => format!(
                    "-ngl auto: even with every layer on the CPU the GPU needs {} MiB for \
                     activations and workspace, {} MiB are usable ({}); use --backend cpu or a \
                     smaller batch (-b)",
                    mib(*need),
                    mib(u.bytes),
                    u.source
                ),
                _ => format!(
                    "-ngl auto: even with every layer on the CPU the GPUs need {}; use \
                     --backend cpu or a smaller batch (-b)",
                    of(&least)
                ),
            };
            Err(ModelError::Backend(BackendError::OutOfMemory(e)))
        }
    }
}

/// What op offload does for `place`, as the placement's sentence goes on (empty where nothing
/// streams).
fn offload_note(place: &Placement) -> String {
    match place.op_offload {
        Some(n) if place.streams() => {
            format!("; prompt batches of {n}+ tokens run the CPU's layers on GPU 0 (op offload)")
        }
        _ => String::new(),
    }
}

/// Whether `choice` (one GPU's) leaves no layer on the CPU for want of memory: for `-ngl auto`
/// every layer went to the GPU; for a count, its plan fits the usable memory (or that is not
/// known).
#[allow(clippy::too_many_arguments)]
fn fits_one(
    choice: &Result<SplitChoice, ModelError>,
    want: GpuLayers,
    full: &MemoryPlan,
    gpu: &dyn Backend,
    usable: Option<&UsableMemory>,
    file: &GgufFile,
    config: &ModelConfig,
    n_ctx: usize,
) -> bool {
    let Ok(c) = choice else { return false };
    match want {
        GpuLayers::Auto => c.place.ngl() == config.n_layers + 1,
        GpuLayers::Count(_) => {
            let plan = if c.place.all_on_gpu() {
                *full
            } else {
                gpu_plan(full, &c.place, file, config, n_ctx)
            };
            match (gpu.plan_bytes(&plan), usable) {
                (Some(need), Some(u)) => need <= u.bytes,
                _ => true,
            }
        }
    }
}

/// How a model is to be placed: `-ngl`, the split over GPUs, and how the CPU part computes.
#[derive(Clone, Copy, Debug)]
pub struct Arrange<'a> {
    pub want: GpuLayers,
    pub split: &'a SplitOptions,
    /// The other GPUs of the opened one's runtime (`None`: one GPU only).
    pub more: Option<&'a MoreGpus>,
    pub cpu: &'a crate::gpu::cpu::CpuOptions,
    pub roots: &'a Roots,
}

/// Puts a model on `backend` as `-ngl` and the split settings ask: unchanged on the CPU backend
/// or when every layer goes to the one GPU; else a [`backend::SplitBackend`] over the GPU
/// backend (and, split by layers, the other GPUs `how.more` opens) and a CPU backend computing
/// as `how.cpu` says. Returns the sentence saying how it was placed (`None` on the CPU).
pub fn arrange(
    file: &Arc<GgufFile>,
    gpu: Box<dyn Backend>,
    config: &ModelConfig,
    options: ModelOptions,
    how: Arrange<'_>,
) -> Result<(Box<dyn Backend>, Option<String>), ModelError> {
    // Only a backend with device memory to plan is split.
    if gpu.plan_bytes(&MemoryPlan::default()).is_none() {
        return Ok((gpu, None));
    }
    let want = how.want;
    let full = model_plan(file, options)?;
    let usable = usable_memory(&gpu.device(), how.roots);
    // Every sequence's positions (`--parallel`): the GPU part holds all of them.
    let n_ctx = options.n_ctx.max(1) * options.n_seq.max(1);
    let one = choose(
        want,
        &full,
        gpu.as_ref(),
        usable.as_ref(),
        file,
        config,
        n_ctx,
        how.split.op_offload(),
    );
    // The other GPUs are listed only where they may be used: `layer`, or a model that does not
    // fit the first GPU.
    let wanted = match how.split.mode {
        SplitMode::None => false,
        SplitMode::Layer => true,
        SplitMode::Auto => !fits_one(
            &one,
            want,
            &full,
            gpu.as_ref(),
            usable.as_ref(),
            file,
            config,
            n_ctx,
        ),
    };
    let others = match (wanted, how.more, gpu.watch_target()) {
        (true, Some(m), Some((_, info))) => m.others(&info),
        _ => Vec::new(),
    };
    let several = !others.is_empty();
    let (Some(more), true) = (how.more, several) else {
        let mut choice = one?;
        if how.split.mode == SplitMode::Layer {
            choice.said += "; --split-mode layer: no other GPU of this runtime";
        }
        if choice.place.all_on_gpu() {
            return Ok((gpu, Some(choice.said)));
        }
        let plan = gpu_plan(&full, &choice.place, file, config, n_ctx);
        let cpu = CpuBackend::with_options(how.cpu, "the CPU part of a split model (-ngl)")
            .with_kv_type(gpu.kv_type());
        let said = choice.said.clone();
        return Ok((
            Box::new(backend::SplitBackend::new(
                vec![gpu],
                Box::new(cpu),
                choice.place,
                vec![plan],
                choice.said,
            )),
            Some(said),
        ));
    };
    over_gpus(file, gpu, &others, more, config, &full, n_ctx, how)
}

/// The split over several GPUs: opens the others, orders them as the runtime numbers them, gives
/// each its share (`--tensor-split`, else its free memory), and fits `-ngl` over them.
#[allow(clippy::too_many_arguments)]
fn over_gpus(
    file: &Arc<GgufFile>,
    gpu: Box<dyn Backend>,
    others: &[crate::gpu::device::DeviceInfo],
    more: &MoreGpus,
    config: &ModelConfig,
    full: &MemoryPlan,
    n_ctx: usize,
    how: Arrange<'_>,
) -> Result<(Box<dyn Backend>, Option<String>), ModelError> {
    let mut gpus = vec![gpu];
    let mut notes = Vec::new();
    for d in others {
        match more.open(d) {
            Ok(b) => gpus.push(b),
            Err(e) if how.split.mode == SplitMode::Auto => {
                notes.push(format!("GPU {} ({}) not used: {e}", d.ordinal, d.name));
            }
            Err(e) => {
                return Err(ModelError::Backend(BackendError::Device(format!(
                    "--split-mode layer: GPU {} ({}): {e}",
                    d.ordinal, d.name
                ))));
            }
        }
    }
    gpus.sort_by_key(|g| g.watch_target().map_or(0, |(_, i)| i.ordinal));
    let usable: Vec<Option<UsableMemory>> = gpus
        .iter()
        .map(|g| usable_memory(&g.device(), how.roots))
        .collect();
    let free: Vec<u64> = gpus
        .iter()
        .zip(&usable)
        .map(|(g, u)| {
            let d = g.device();
            u.as_ref()
                .map(|u| u.bytes)
                .or(d.free_memory)
                .or(d.total_memory)
                .unwrap_or(1)
        })
        .collect();
    let shares = how.split.shares(&free);
    // A GPU given no share holds nothing: released at once.
    let mut kept = Vec::new();
    for ((g, u), s) in gpus.into_iter().zip(usable).zip(shares) {
        if s > 0.0 {
            kept.push((g, u, s));
        } else {
            let mut g = g;
            g.shutdown(std::time::Duration::from_secs(5), &mut |_| {});
        }
    }
    if kept.is_empty() {
        return Err(ModelError::Backend(BackendError::Invalid(
            "--tensor-split gives no GPU a share".into(),
        )));
    }
    let shares: Vec<f64> = kept.iter().map(|k| k.2).collect();
    let choice = {
        let slots: Vec<(&dyn Backend, Option<UsableMemory>)> = kept
            .iter()
            .map(|(g, u, _)| (g.as_ref(), u.clone()))
            .collect();
        choose_over(
            how.want,
            full,
            &slots,
            &shares,
            file,
            config,
            n_ctx,
            how.split.op_offload(),
        )?
    };
    let plans = (0..kept.len())
        .map(|g| gpu_plan_of(full, &choice.place, g, file, config, n_ctx))
        .collect();
    let why = match how.split.mode {
        SplitMode::Layer => "--split-mode layer",
        _ => "split by layers: the model does not fit one GPU",
    };
    let by = match &how.split.tensor_split {
        Some(t) => format!("--tensor-split {t}"),
        None => {
            let gib: Vec<String> = free
                .iter()
                .map(|b| format!("{:.1}", *b as f64 / (1u64 << 30) as f64))
                .collect();
            format!("in proportion to free memory ({} GiB)", gib.join(", "))
        }
    };
    let mut said = format!("{why}, {} GPUs {by}; {}", kept.len(), choice.said);
    for n in notes {
        said += &format!("; {n}");
    }
    let gpus: Vec<Box<dyn Backend>> = kept.into_iter().map(|k| k.0).collect();
    let cpu = CpuBackend::with_options(how.cpu, "the CPU part of a split model")
        .with_kv_type(gpus[0].kv_type());
    Ok((
        Box::new(backend::SplitBackend::new(
            gpus,
            Box::new(cpu),
            choice.place,
            plans,
            said.clone(),
        )),
        Some(said),
    ))
}

/// `-ngl`'s value: `auto` or a number of layers (the flag's parser, shared by the chat's and the
/// headless commands' arguments).
pub fn parse_gpu_layers(s: &str) -> Result<GpuLayers, String> {
    s.parse()
}
