//! [`GpuCompute`]: the forward pass's [`Backend`] on a GPU (HIP or CUDA, one kernel source), over
//! the tracked runtime [`Gpu`].
//!
//! [`Backend`]: crate::gpu::backend::Backend
//!
//! Everything the model needs is allocated once, from a plan, in the arena (`plan`); weights are
//! uploaded as stored and checksummed on the device, and the kernels dequantize them on the fly.
//! Every op is a labelled launch on the one stream (`layer 7 · attn_q · mv_q4_1`), so the stream
//! and watchdog panels name what runs; the only waits are the bounded ones inside `read` (the
//! logits download) and the quit protocol's drain.
//!
//! Arithmetic follows the CPU backend, the numerical reference: quantized weights multiply Q8
//! activations in integer dot products (decode and small batches), and prompt batches multiply
//! the same Q8-rounded activations with dequantized weight tiles through `gemm_f32` (rocBLAS,
//! cuBLAS, or hipscope's own GEMM kernel where no BLAS serves the device).
//!
//! One file per kernel family, each named after its source in `kernels/`: `matvec`
//! (`infer_matvec.hip`), `dequant` (`infer_dequant.hip`: embedding rows and the prefill GEMM),
//! `ops` (`infer_ops.hip`: norms and element-wise ops), `attention` (`infer_attention.hip`).
//! The `Backend` implementation that calls them is `backend.rs`.

mod attention;
mod backend;
mod dequant;
mod kernel_set;
mod kv_shift;
pub mod lockstep;
mod matvec;
mod moe;
mod ops;
pub mod plan;
pub mod units;

use std::collections::HashMap;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::gpu::arena::{DeviceBuffer, Region};
use crate::gpu::backend::{
    AttnParams, BackendError, BackendMonitor, Buf, Glu, HeadNorms, KvLayout, MemoryPlan, OpLabel,
    Result, RopeParams, SeqPos, Weight, WeightData, glu_separately,
};
use crate::gpu::device::{Device, DeviceInfo, DevicePtr, GemmF32, GpuError, Op, RuntimeKind};
use crate::gpu::handle::{Arg, Gpu, GpuConfig, KernelFn};
use crate::gpu::kernels::{CompileMode, CompileProgress, KernelBuild, KernelCache};
use crate::gpu::quant::{self, GgmlType};
use crate::gpu::snapshot::{
    ArenaSnapshot, DeviceRelease, DeviceSummary, QuitStep, StreamSnapshot, WatchdogSnapshot,
};
use crate::gpu::stream::{Budget, LabelId, StreamShared};
use crate::gpu::watchdog::{self, Watchdog};

pub use crate::gpu::backend::KvType;
pub use attention::flash_splits;
pub use dequant::{PrefillPath, choose_prefill, matrix_units, tensor_units};
pub use kernel_set::scope_units;
use kernel_set::{CompileCtx, Kernels};
pub use plan::{ActFormat, ComputeOptions, KernelNeeds, PrefillGemm, TypeSet};
use plan::{
    MAX_GRID_Y, MAX_HEAD_DIM, MAX_ROPE_PAIRS, MV_THREADS, TypeKernels, elementwise_grid, mv_chunks,
    mv_grid, q8_block, rope_theta_scale, tile_rows, type_kernels,
};
pub use units::KernelScope;

/// The maps a decode step looks up for every launch (labels, a type's kernels): foldhash rather
/// than SipHash, whose hashing of the label's strings was a tenth of a step's host time.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

/// How often the event prober asks the runtime about events (breadcrumbs show progress between).
const PROBE_INTERVAL: Duration = Duration::from_millis(5);
/// How often `arena()`'s cached snapshot is refreshed (it asks the runtime for free memory).
const ARENA_REFRESH: Duration = Duration::from_millis(500);

fn gpu_err(e: GpuError) -> BackendError {
    match e {
        GpuError::InsufficientMemory { .. } | GpuError::ArenaFull { .. } => {
            BackendError::OutOfMemory(e.to_string())
        }
        GpuError::InvalidArgument(m) => BackendError::Invalid(m),
        other => BackendError::Device(other.to_string()),
    }
}

fn invalid(msg: String) -> BackendError {
    BackendError::Invalid(msg)
}

struct GpuWeight {
    name: String,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    buf: DeviceBuffer,
    /// A one-row tensor kept as f32.
    vector: bool,
}

struct GpuBuf {
    name: &'static str,
    len: usize,
    buf: DeviceBuffer,
    /// Bumped by every op that writes the buffer (keys the quantized-input cache).
    version: u64,
}

struct KvCache {
    layout: KvLayout,
    k: DeviceBuffer,
    v: DeviceBuffer,
}

/// The backend's own device buffers.
struct Workspace {
    tokens: DeviceBuffer,
    xq: DeviceBuffer,
    xd: DeviceBuffer,
    xdq: Option<DeviceBuffer>,
    tile: Option<DeviceBuffer>,
    /// Flash-decoding's partial results (`attention.rs`).
    attn_part: Option<DeviceBuffer>,
}

/// What the quantized-input buffers hold now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct QuantKey {
    buf: Buf,
    version: u64,
    bs: u32,
    n_tokens: usize,
    /// The dequantized copy (GEMM path) rather than quants and scales.
    dequantized: bool,
}

/// Snapshots for other threads: the stream's lock-free view, judged as the watchdog judges it.
struct GpuMonitor {
    shared: Arc<StreamShared>,
    probe_timeout: Duration,
}

impl BackendMonitor for GpuMonitor {
    fn streams(&self) -> Vec<StreamSnapshot> {
        vec![self.shared.snapshot()]
    }

    fn watchdog(&self) -> Option<WatchdogSnapshot> {
        let now = self.shared.now_ns();
        Some(watchdog::evaluate(&self.shared, now, self.probe_timeout).0)
    }
}

/// The forward pass on a GPU.
pub struct GpuCompute {
    /// `None` after `shutdown`.
    gpu: Option<Gpu>,
    reason: String,
    opts: ComputeOptions,
    kernels: Kernels,
    warp: u32,
    weights: Vec<GpuWeight>,
    /// The room for streamed weights ([`Memory::stage_weights`]), taken at the first call, and
    /// the weight slots each call fills again.
    stage: Option<DeviceBuffer>,
    staged: Vec<usize>,
    bufs: Vec<GpuBuf>,
    kv: Option<KvCache>,
    ws: Option<Workspace>,
    plan: Option<MemoryPlan>,
    labels: FastMap<(Option<u32>, &'static str, &'static str), LabelId>,
    quant: Option<QuantKey>,
    /// Block size of the last Q8 quantization for the matrix-vector path: what an RMS norm or the
    /// attention quantizes its output for in its own launch until it has seen its own product
    /// ask (`fuse_bs`; a product that needs another size quantizes again).
    norm_bs: Option<u32>,
    /// The op that last wrote a buffer it could have quantized in the same launch (an RMS norm,
    /// the attention): the buffer, its version and the op's label, until a product reads it.
    producer: Option<(Buf, u64, OpLabel)>,
    /// Per such op (by label): the Q8 block size the first product after it asked for, so that
    /// from the next step on it quantizes for that product in its own launch even where the
    /// products around it take another size (a Q4_K_M file whose 1152-wide matrices fall back
    /// to Q5_0 / Q8_0 between Q4_K ones: Gemma 3 1B's, a quantize launch per product otherwise).
    fuse_bs: FastMap<OpLabel, u32>,
    next_version: u64,
    host_bytes: Vec<u8>,
    /// The (sequence, position) table last uploaded for a step of several sequences
    /// (`attention.rs`); empty when none is on the device.
    seq_rows_up: Vec<u32>,
    monitor: Arc<GpuMonitor>,
    arena_cache: ArenaSnapshot,
    arena_at: Option<Instant>,
    builds: Vec<KernelBuild>,
    /// How kernels first needed after the open are compiled.
    compile: CompileCtx,
    /// The process's watchdog on this device's stream (`gpu::open` starts it).
    watchdog: Option<Watchdog>,
}

impl GpuCompute {
    /// Opens `device` (chosen by `gpu::select`, for the reason given), compiles or loads the
    /// kernels and starts the event prober. Nothing is allocated on the device until `plan`.
    pub fn open(
        device: Box<dyn Device>,
        reason: &str,
        opts: ComputeOptions,
        cache: &KernelCache,
    ) -> std::result::Result<GpuCompute, GpuError> {
        Self::open_with(device, reason, opts, cache, &mut |_| {})
    }

    /// As [`GpuCompute::open`], compiling the units of `opts.kernels` (every unit when `None`) and
    /// telling `progress` how the compile goes.
    pub fn open_with(
        device: Box<dyn Device>,
        reason: &str,
        opts: ComputeOptions,
        cache: &KernelCache,
        progress: &mut dyn FnMut(&CompileProgress),
    ) -> std::result::Result<GpuCompute, GpuError> {
        let mode = match device.kind() {
            // Compiles run in child processes, several at once: hiprtc can abort the process on
            // targets it does not know, and every compiler is faster on every core.
            RuntimeKind::Hip | RuntimeKind::Cuda => CompileMode::isolated(),
            _ => CompileMode::InProcess,
        };
        let compile = CompileCtx {
            cache: cache.clone(),
            mode,
        };
        let cfg = GpuConfig {
            trace_events: opts.trace_events,
            launch_overlap: opts.launch_overlap,
            ..GpuConfig::default()
        };
        let mut gpu = Gpu::open(device, cfg)?;
        let scope = opts.kernels.map_or(KernelScope::All, |n| {
            KernelScope::Model(KernelNeeds { kv: opts.kv, ..n })
        });
        let prepared = scope_units(scope)
            .and_then(|u| kernel_set::load_units(&mut gpu, &compile, &u, progress))
            .and_then(|b| Kernels::resolve(&gpu).map(|k| (b, k)));
        let (builds, kernels) = match prepared {
            Ok(x) => x,
            Err(e) => {
                let _ = gpu.teardown(Duration::from_secs(2), &mut |_| {});
                return Err(e);
            }
        };
        if !opts.graphs {
            gpu.set_graphs(false, "turned off (--no-graphs or graphs = false)")?;
        }
        gpu.start_event_prober(PROBE_INTERVAL);
        let warp = gpu.info().warp_size.max(1);
        let monitor = Arc::new(GpuMonitor {
            shared: gpu.stream_shared(),
            probe_timeout: Duration::from_secs(1),
        });
        Ok(GpuCompute {
            gpu: Some(gpu),
            reason: reason.to_string(),
            opts,
            kernels,
            warp,
            weights: Vec::new(),
            stage: None,
            staged: Vec::new(),
            bufs: Vec::new(),
            kv: None,
            ws: None,
            plan: None,
            labels: FastMap::default(),
            quant: None,
            norm_bs: None,
            producer: None,
            fuse_bs: FastMap::default(),
            next_version: 1,
            host_bytes: Vec::new(),
            seq_rows_up: Vec::new(),
            monitor,
            arena_cache: ArenaSnapshot::default(),
            arena_at: None,
            builds,
            compile,
            watchdog: None,
        })
    }

    /// How each kernel module was obtained (compiled, from the cache).
    pub fn kernel_builds(&self) -> &[KernelBuild] {
        &self.builds
    }

    pub fn options(&self) -> &ComputeOptions {
        &self.opts
    }

    /// The runtime underneath (for the selftest's and the app's own checks).
    pub fn gpu(&self) -> Option<&Gpu> {
        self.gpu.as_ref()
    }

    /// The runtime underneath, mutably (the selftest switches tracking and breadcrumbs on it and
    /// reads its allocation counters); `None` after `shutdown`.
    pub fn runtime_mut(&mut self) -> Option<&mut Gpu> {
        self.gpu.as_mut()
    }

    fn gpu_mut(&mut self) -> Result<&mut Gpu> {
        self.gpu
            .as_mut()
            .ok_or_else(|| BackendError::Device("the device was shut down".into()))
    }

    /// The KV cache's keys and values, and where the rows of positions `pos` of sequence `seq`
    /// at `layer` lie in them ([`KvLayout::row_runs`], in bytes: first byte, first row, rows),
    /// with the bytes of one row.
    #[allow(clippy::type_complexity)]
    fn kv_runs(
        &self,
        layer: usize,
        seq: usize,
        pos: std::ops::Range<usize>,
    ) -> Result<(DeviceBuffer, DeviceBuffer, Vec<(u64, usize, usize)>, usize)> {
        let kv = self
            .kv
            .as_ref()
            .ok_or_else(|| invalid("KV rows before the KV cache was allocated".into()))?;
        let eb = self.opts.kv.bytes() as usize;
        let runs = kv.layout.row_runs(layer, seq, pos)?;
        Ok((
            kv.k,
            kv.v,
            runs.into_iter()
                .map(|(at, first, rows)| ((at * eb) as u64, first, rows))
                .collect(),
            kv.layout.kv_dim() * eb,
        ))
    }

    fn label(&mut self, l: OpLabel, kernel: &'static str) -> Result<LabelId> {
        let key = (l.layer, l.name, kernel);
        if let Some(id) = self.labels.get(&key) {
            return Ok(*id);
        }
        let text = if kernel.is_empty() {
            l.to_string()
        } else {
            format!("{l} · {kernel}")
        };
        let id = self.gpu_mut()?.label(&text);
        self.labels.insert(key, id);
        Ok(id)
    }

    fn weight(&self, w: Weight) -> Result<&GpuWeight> {
        self.weights
            .get(w.0 as usize)
            .ok_or_else(|| invalid(format!("no weight #{}", w.0)))
    }

    /// The device vector of `len` f32 behind weight `w`.
    fn vector(&self, w: Weight, len: usize) -> Result<DeviceBuffer> {
        let gw = self.weight(w)?;
        if !gw.vector || gw.cols != len {
            return Err(invalid(format!(
                "{} is not a vector of {len} elements ({} × {})",
                gw.name, gw.rows, gw.cols
            )));
        }
        Ok(gw.buf)
    }

    /// Buffer `b`, checked to hold `len` elements.
    fn buf(&self, b: Buf, len: usize) -> Result<DeviceBuffer> {
        let gb = self
            .bufs
            .get(b.0 as usize)
            .ok_or_else(|| invalid(format!("no buffer #{}", b.0)))?;
        if gb.len < len {
            return Err(invalid(format!(
                "buffer {} holds {}, {len} needed",
                gb.name, gb.len
            )));
        }
        Ok(gb.buf)
    }

    /// Marks `b` as written (after the op that writes it was enqueued).
    fn wrote(&mut self, b: Buf) {
        self.next_version += 1;
        if let Some(gb) = self.bufs.get_mut(b.0 as usize) {
            gb.version = self.next_version;
        }
    }

    fn workspace(&self) -> Result<&Workspace> {
        self.ws
            .as_ref()
            .ok_or_else(|| invalid("no memory plan yet: call plan() first".into()))
    }

    fn n_batch(&self) -> usize {
        self.plan.map_or(0, |p| p.n_batch)
    }

    #[allow(clippy::too_many_arguments)]
    fn launch(
        &mut self,
        label: OpLabel,
        kernel_name: &'static str,
        f: KernelFn,
        grid: [u32; 3],
        block: [u32; 3],
        args: &[Arg],
    ) -> Result<()> {
        let l = self.label(label, kernel_name)?;
        self.gpu_mut()?
            .launch(l, f, grid, block, 0, args)
            .map_err(gpu_err)?;
        Ok(())
    }

    /// Overwrites the first `data.len()` elements of buffer `b` (through pinned staging, on the
    /// stream). For checks that feed both backends the same inputs op by op.
    pub fn write_buffer(&mut self, b: Buf, data: &[f32]) -> Result<()> {
        self.write_at(b, 0, data)
    }

    /// Overwrites elements `offset..offset + data.len()` of buffer `b`, as
    /// [`GpuCompute::write_buffer`] does from 0.
    fn write_at(&mut self, b: Buf, offset: usize, data: &[f32]) -> Result<()> {
        self.write_as(b, offset, data, OpLabel::global("write buffer"))
    }

    /// `write_at` as an op labelled `label` (a split model's crossing names its devices).
    fn write_as(&mut self, b: Buf, offset: usize, data: &[f32], label: OpLabel) -> Result<()> {
        let dst = self
            .buf(b, offset + data.len())?
            .slice(offset as u64 * 4, data.len() as u64 * 4)
            .map_err(gpu_err)?;
        let l = self.label(label, "")?;
        // The device's floats are little-endian: on a little-endian host the data goes up as it
        // lies (a crossing of a prompt batch's activations is megabytes).
        if cfg!(target_endian = "little") {
            // SAFETY: `data` is `data.len() * 4` initialized bytes and u8 has alignment 1.
            let bytes =
                unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), data.len() * 4) };
            self.gpu_mut()?.upload(l, dst, bytes).map_err(gpu_err)?;
        } else {
            let bytes: Vec<u8> = data.iter().flat_map(|f| f.to_le_bytes()).collect();
            self.gpu_mut()?.upload(l, dst, &bytes).map_err(gpu_err)?;
        }
        self.wrote(b);
        Ok(())
    }

    /// Starts recording a decode step (`n_tokens == 1`) for graph replay when graphs are on;
    /// the token goes to `tok` through the step's setter. `false`: not recorded (upload it).
    fn begin_decode_step(&mut self, n_tokens: usize, tok: DevicePtr, token: u32) -> Result<bool> {
        let g = self.gpu_mut()?;
        // Whatever was recorded and not yet run goes first (an interrupted step, say).
        g.graph_flush().map_err(gpu_err)?;
        if n_tokens != 1 || !g.graph_mode().is_on() {
            return Ok(false);
        }
        if !g.graph_begin_step(0).map_err(gpu_err)? {
            return Ok(false);
        }
        Ok(g.graph_token(tok, token))
    }

    fn refresh_arena(&mut self, force: bool) {
        let due = force || self.arena_at.is_none_or(|t| t.elapsed() >= ARENA_REFRESH);
        if !due {
            return;
        }
        if let Some(g) = self.gpu.as_mut()
            && let Some(a) = g.arena_snapshot()
        {
            self.arena_cache = a;
            self.arena_at = Some(Instant::now());
        }
    }
}

impl Drop for GpuCompute {
    fn drop(&mut self) {
        // Never waits on the GPU here (the quit protocol does that, bounded): a device that was
        // not shut down is left to the process's exit.
        if self.gpu.is_some() {
            tracing::warn!(
                "GPU backend dropped without shutdown; its device memory is left to the process exit"
            );
        }
    }
}
