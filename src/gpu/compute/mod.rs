//! [`GpuCompute`]: the forward pass's [`Backend`] on a GPU (HIP or CUDA, one kernel source), over
//! the tracked runtime [`Gpu`].
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

pub mod lockstep;
pub mod plan;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::gpu::arena::{DeviceBuffer, Region};
use crate::gpu::backend::{
    AttnParams, Backend, BackendError, BackendMonitor, Buf, MemoryPlan, OpLabel, Result,
    RopeParams, Weight, WeightData,
};
use crate::gpu::device::{Device, GemmF32, GpuError, Op, RuntimeKind};
use crate::gpu::handle::{Arg, Gpu, GpuConfig, KernelFn};
use crate::gpu::kernels::{CompileMode, KernelBuild, KernelCache};
use crate::gpu::quant::{self, GgmlType};
use crate::gpu::snapshot::{
    ArenaSnapshot, DeviceRelease, DeviceSummary, QuitStep, StreamSnapshot, WatchdogSnapshot,
};
use crate::gpu::stream::{LabelId, StreamShared};
use crate::gpu::watchdog;

pub use plan::{ActFormat, ComputeOptions, KvType};
use plan::{
    MAX_GRID_Y, MAX_HEAD_DIM, MAX_ROPE_PAIRS, MV_THREADS, TypeKernels, elementwise_grid, mv_chunks,
    mv_grid, rope_theta_scale, tile_rows, type_kernels,
};

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
    n_layers: usize,
    n_ctx: usize,
    kv_dim: usize,
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
}

/// Kernel handles, resolved once.
struct Kernels {
    rms_norm: KernelFn,
    add_bias: KernelFn,
    add: KernelFn,
    swiglu: KernelFn,
    rope: KernelFn,
    kv_store_f32: KernelFn,
    kv_store_f16: KernelFn,
    attention_f32: KernelFn,
    attention_f16: KernelFn,
    quantize: KernelFn,
    /// Per weight type: (matrix-vector, row dequantization).
    by_type: HashMap<GgmlType, (KernelFn, KernelFn)>,
}

impl Kernels {
    fn resolve(gpu: &Gpu) -> std::result::Result<Kernels, GpuError> {
        let mut by_type = HashMap::new();
        for &ty in plan::GPU_TYPES {
            if let Some(k) = type_kernels(ty) {
                by_type.insert(
                    ty,
                    (
                        gpu.function(&format!("hs_mv_{}", k.suffix))?,
                        gpu.function(&format!("hs_dequant_rows_{}", k.suffix))?,
                    ),
                );
            }
        }
        Ok(Kernels {
            rms_norm: gpu.function("hs_rms_norm_rows")?,
            add_bias: gpu.function("hs_add_bias_rows")?,
            add: gpu.function("hs_add_inplace")?,
            swiglu: gpu.function("hs_swiglu_inplace")?,
            rope: gpu.function("hs_rope")?,
            kv_store_f32: gpu.function("hs_kv_store_f32")?,
            kv_store_f16: gpu.function("hs_kv_store_f16")?,
            attention_f32: gpu.function("hs_attention_f32")?,
            attention_f16: gpu.function("hs_attention_f16")?,
            quantize: gpu.function("hs_quantize_act")?,
            by_type,
        })
    }
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
    bufs: Vec<GpuBuf>,
    kv: Option<KvCache>,
    ws: Option<Workspace>,
    plan: Option<MemoryPlan>,
    labels: HashMap<(Option<u32>, &'static str, &'static str), LabelId>,
    quant: Option<QuantKey>,
    next_version: u64,
    host_bytes: Vec<u8>,
    monitor: Arc<GpuMonitor>,
    arena_cache: ArenaSnapshot,
    arena_at: Option<Instant>,
    builds: Vec<KernelBuild>,
}

impl GpuCompute {
    /// `dst[i] = f(dst[i], src[i])` over `len` elements: one launch of an elementwise kernel.
    fn elementwise(
        &mut self,
        f: KernelFn,
        kind: &'static str,
        dst: Buf,
        src: Buf,
        len: usize,
        label: OpLabel,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let d = self.buf(dst, len)?;
        let x = self.buf(src, len)?;
        self.launch(
            label,
            kind,
            f,
            [elementwise_grid(len as u64), 1, 1],
            [256, 1, 1],
            &[Arg::Ptr(d.ptr), Arg::Ptr(x.ptr), Arg::U64(len as u64)],
        )?;
        self.wrote(dst);
        Ok(())
    }

    /// Opens `device` (chosen by `gpu::select`, for the reason given), compiles or loads the
    /// kernels and starts the event prober. Nothing is allocated on the device until `plan`.
    pub fn open(
        device: Box<dyn Device>,
        reason: &str,
        opts: ComputeOptions,
        cache: &KernelCache,
    ) -> std::result::Result<GpuCompute, GpuError> {
        let mode = match device.kind() {
            // hiprtc can abort the process on targets it does not know: compile in a child.
            RuntimeKind::Hip => CompileMode::isolated(),
            _ => CompileMode::InProcess,
        };
        let mut gpu = Gpu::open(device, GpuConfig::default())?;
        let prepared = gpu
            .prepare_kernels(cache, &mode)
            .and_then(|b| Kernels::resolve(&gpu).map(|k| (b, k)));
        let (builds, kernels) = match prepared {
            Ok(x) => x,
            Err(e) => {
                let _ = gpu.teardown(Duration::from_secs(2), &mut |_| {});
                return Err(e);
            }
        };
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
            bufs: Vec::new(),
            kv: None,
            ws: None,
            plan: None,
            labels: HashMap::new(),
            quant: None,
            next_version: 1,
            host_bytes: Vec::new(),
            monitor,
            arena_cache: ArenaSnapshot::default(),
            arena_at: None,
            builds,
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

    fn gpu_mut(&mut self) -> Result<&mut Gpu> {
        self.gpu
            .as_mut()
            .ok_or_else(|| BackendError::Device("the device was shut down".into()))
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

    /// Quantizes `n_tokens` rows of `cols` of buffer `x` for `bs`-element blocks into the
    /// workspace (quants + scales, or their dequantized copy for the GEMM path), unless the
    /// workspace already holds exactly that.
    fn quantize_input(
        &mut self,
        x: Buf,
        n_tokens: usize,
        cols: usize,
        bs: u32,
        dequantized: bool,
        label: OpLabel,
    ) -> Result<()> {
        let src = self.buf(x, n_tokens * cols)?;
        let version = self.bufs[x.0 as usize].version;
        let key = QuantKey {
            buf: x,
            version,
            bs,
            n_tokens,
            dequantized,
        };
        if self.quant == Some(key) {
            return Ok(());
        }
        if !cols.is_multiple_of(bs as usize) {
            return Err(invalid(format!(
                "rows of {cols} are not whole blocks of {bs}"
            )));
        }
        let ws = self.workspace()?;
        let elems = (n_tokens * cols) as u64;
        if elems > ws.xq.bytes {
            return Err(invalid(format!(
                "{n_tokens} tokens × {cols} exceed the planned batch"
            )));
        }
        let (xq, xd, xdq) = if dequantized {
            let xdq = ws.xdq.ok_or_else(|| {
                invalid("the GEMM path was not planned for this batch size".into())
            })?;
            (Arg::U64(0), Arg::U64(0), Arg::Ptr(xdq.ptr))
        } else {
            (Arg::Ptr(ws.xq.ptr), Arg::Ptr(ws.xd.ptr), Arg::U64(0))
        };
        let n_blocks = elems / bs as u64;
        let f = self.kernels.quantize;
        self.launch(
            label,
            "quantize_q8",
            f,
            [n_blocks.div_ceil(128).clamp(1, 65_535) as u32, 1, 1],
            [128, 1, 1],
            &[
                Arg::Ptr(src.ptr),
                xq,
                xd,
                xdq,
                Arg::U32(bs),
                Arg::U64(n_blocks),
            ],
        )?;
        self.quant = Some(key);
        Ok(())
    }

    /// The matrix-vector path: up to 8 tokens per launch.
    #[allow(clippy::too_many_arguments)]
    fn matmul_mv(
        &mut self,
        gw_idx: usize,
        tk: TypeKernels,
        x: Buf,
        xbuf: DeviceBuffer,
        out: DeviceBuffer,
        n_tokens: usize,
        label: OpLabel,
    ) -> Result<()> {
        let (ty, rows, cols, wbuf) = {
            let w = &self.weights[gw_idx];
            (w.ty, w.rows, w.cols, w.buf)
        };
        if let ActFormat::Q8 { bs } = tk.act {
            self.quantize_input(x, n_tokens, cols, bs, false, label)?;
        }
        let (mv, _) = self.kernels.by_type[&ty];
        let (xq, xd) = {
            let ws = self.workspace()?;
            (ws.xq, ws.xd)
        };
        let kname = mv_name(tk.suffix);
        let nblocks = match tk.act {
            ActFormat::Q8 { bs } => cols / bs as usize,
            ActFormat::F32 => 0,
        };
        for (t0, nt) in mv_chunks(n_tokens) {
            self.launch(
                label,
                kname,
                mv,
                [mv_grid(rows, self.warp), 1, 1],
                [MV_THREADS, 1, 1],
                &[
                    Arg::Ptr(wbuf.ptr),
                    Arg::Ptr(xq.ptr.offset((t0 * cols) as u64)),
                    Arg::Ptr(xd.ptr.offset((t0 * nblocks * 8) as u64)),
                    Arg::Ptr(xbuf.ptr.offset((t0 * cols * 4) as u64)),
                    Arg::Ptr(out.ptr.offset((t0 * rows * 4) as u64)),
                    Arg::U32(rows as u32),
                    Arg::U32(cols as u32),
                    Arg::U32(nt as u32),
                ],
            )?;
        }
        Ok(())
    }

    /// The GEMM path: the input rounded through Q8 as the integer path rounds it, weight tiles
    /// dequantized to f32, `out[t, r0..r0+R] = tile · x[t]` by `gemm_f32` (column-major:
    /// C(rows × n) = Tileᵀ(R × cols) · X(cols × n)).
    #[allow(clippy::too_many_arguments)]
    fn matmul_gemm(
        &mut self,
        gw_idx: usize,
        tk: TypeKernels,
        x: Buf,
        xbuf: DeviceBuffer,
        out: DeviceBuffer,
        n_tokens: usize,
        label: OpLabel,
    ) -> Result<()> {
        let (ty, rows, cols, wbuf) = {
            let w = &self.weights[gw_idx];
            (w.ty, w.rows, w.cols, w.buf)
        };
        let b = match tk.act {
            ActFormat::Q8 { bs } => {
                self.quantize_input(x, n_tokens, cols, bs, true, label)?;
                self.workspace()?
                    .xdq
                    .ok_or_else(|| invalid("no GEMM input buffer".into()))?
            }
            ActFormat::F32 => xbuf,
        };
        let (one, zero) = {
            let g = self.gpu_mut()?;
            (
                g.scalar(1.0).map_err(gpu_err)?,
                g.scalar(0.0).map_err(gpu_err)?,
            )
        };
        let gemm_label = self.label(label, "gemm")?;
        if ty == GgmlType::F32 {
            // Row-major rows × cols is column-major cols × rows: used as it is.
            let g = gemm_args(wbuf, b, out, rows, 0, rows, n_tokens, cols, one, zero);
            self.gpu_mut()?.gemm_f32(gemm_label, &g).map_err(gpu_err)?;
            return Ok(());
        }
        let tile = self
            .workspace()?
            .tile
            .ok_or_else(|| invalid("no weight tile buffer (GEMM path not planned)".into()))?;
        let per = tile_rows(rows, cols, tile.bytes);
        let row_bytes = (cols / ty.block_len() * ty.block_bytes()) as u64;
        let (_, dq) = self.kernels.by_type[&ty];
        let dq_name = dequant_name(tk.suffix);
        let mut r0 = 0;
        while r0 < rows {
            let r = per.min(rows - r0);
            self.launch(
                label,
                dq_name,
                dq,
                [
                    (cols as u64).div_ceil(256).clamp(1, 1024) as u32,
                    r as u32,
                    1,
                ],
                [256, 1, 1],
                &[
                    Arg::Ptr(wbuf.ptr.offset(r0 as u64 * row_bytes)),
                    Arg::U64(0),
                    Arg::Ptr(tile.ptr),
                    Arg::U32(cols as u32),
                    Arg::U64(row_bytes),
                    Arg::U32(r as u32),
                ],
            )?;
            let g = gemm_args(tile, b, out, r, r0, rows, n_tokens, cols, one, zero);
            self.gpu_mut()?.gemm_f32(gemm_label, &g).map_err(gpu_err)?;
            r0 += r;
        }
        Ok(())
    }

    /// Overwrites the first `data.len()` elements of buffer `b` (through pinned staging, on the
    /// stream). For checks that feed both backends the same inputs op by op.
    pub fn write_buffer(&mut self, b: Buf, data: &[f32]) -> Result<()> {
        let dst = self
            .buf(b, data.len())?
            .slice(0, data.len() as u64 * 4)
            .map_err(gpu_err)?;
        let bytes: Vec<u8> = data.iter().flat_map(|f| f.to_le_bytes()).collect();
        let l = self.label(OpLabel::global("write buffer"), "")?;
        self.gpu_mut()?.upload(l, dst, &bytes).map_err(gpu_err)?;
        self.wrote(b);
        Ok(())
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

fn mv_name(suffix: &str) -> &'static str {
    match suffix {
        "f32" => "mv_f32",
        "f16" => "mv_f16",
        "bf16" => "mv_bf16",
        "q4_0" => "mv_q4_0",
        "q4_1" => "mv_q4_1",
        "q5_0" => "mv_q5_0",
        "q5_1" => "mv_q5_1",
        "q8_0" => "mv_q8_0",
        "q4_k" => "mv_q4_k",
        "q5_k" => "mv_q5_k",
        _ => "mv_q6_k",
    }
}

fn dequant_name(suffix: &str) -> &'static str {
    match suffix {
        "f32" => "dequant_f32",
        "f16" => "dequant_f16",
        "bf16" => "dequant_bf16",
        "q4_0" => "dequant_q4_0",
        "q4_1" => "dequant_q4_1",
        "q5_0" => "dequant_q5_0",
        "q5_1" => "dequant_q5_1",
        "q8_0" => "dequant_q8_0",
        "q4_k" => "dequant_q4_k",
        "q5_k" => "dequant_q5_k",
        _ => "dequant_q6_k",
    }
}

/// `out[t, r0 .. r0 + r] = A · x[t]` for `n` tokens, A an `r × cols` row-major block at `a`,
/// as a column-major GEMM (m = r, n = tokens, k = cols; C offset by r0 rows, ldc = all rows).
#[allow(clippy::too_many_arguments)]
fn gemm_args(
    a: DeviceBuffer,
    x: DeviceBuffer,
    out: DeviceBuffer,
    r: usize,
    r0: usize,
    rows: usize,
    n: usize,
    cols: usize,
    one: crate::gpu::device::DevicePtr,
    zero: crate::gpu::device::DevicePtr,
) -> GemmF32 {
    GemmF32 {
        transa: Op::T,
        transb: Op::N,
        m: r as i32,
        n: n as i32,
        k: cols as i32,
        alpha: one,
        a: a.ptr,
        lda: cols as i32,
        b: x.ptr,
        ldb: cols as i32,
        beta: zero,
        c: out.ptr.offset(r0 as u64 * 4),
        ldc: rows as i32,
    }
}

impl Backend for GpuCompute {
    fn device(&self) -> DeviceSummary {
        match &self.gpu {
            Some(g) => {
                let i = g.info();
                DeviceSummary {
                    backend: g.kind().name().into(),
                    name: i.name.clone(),
                    arch: i.arch.clone(),
                    total_memory: Some(i.total_memory),
                    free_memory: self.arena_cache.device_free,
                    compute_units: Some(i.compute_units),
                    warp_size: Some(i.warp_size),
                    reason: self.reason.clone(),
                }
            }
            None => DeviceSummary {
                backend: "gpu (shut down)".into(),
                reason: self.reason.clone(),
                ..Default::default()
            },
        }
    }

    fn plan(&mut self, plan: &MemoryPlan) -> Result<()> {
        if self.plan.is_some() {
            return Err(invalid("the memory plan was already made".into()));
        }
        if plan.n_batch > MAX_GRID_Y {
            return Err(invalid(format!(
                "batches of {} tokens (at most {MAX_GRID_Y})",
                plan.n_batch
            )));
        }
        let ap = plan::arena_plan(plan, &self.opts);
        let sizes = plan::workspace_sizes(plan, &self.opts);
        let g = self.gpu_mut()?;
        g.create_arena(&ap).map_err(gpu_err)?;
        let mut alloc = |r: Region, b: u64| g.alloc(r, b).map_err(gpu_err);
        let ws = Workspace {
            tokens: alloc(Region::Workspace, sizes.tokens)?,
            xq: alloc(Region::Workspace, sizes.xq)?,
            xd: alloc(Region::Workspace, sizes.xd)?,
            xdq: match sizes.xdq {
                0 => None,
                b => Some(alloc(Region::Workspace, b)?),
            },
            tile: match sizes.tile {
                0 => None,
                b => Some(alloc(Region::Workspace, b)?),
            },
        };
        self.ws = Some(ws);
        self.plan = Some(*plan);
        self.refresh_arena(true);
        Ok(())
    }

    fn load_weight(&mut self, d: &WeightData) -> Result<Weight> {
        if type_kernels(d.ty).is_none() || !quant::is_supported(d.ty) {
            return Err(BackendError::Unsupported(format!(
                "tensor {}: type {} is not supported on the GPU",
                d.name, d.ty
            )));
        }
        d.check()?;
        let vector = d.rows == 1;
        let converted;
        let bytes: &[u8] = if vector && d.ty != GgmlType::F32 {
            let mut v = vec![0f32; d.cols];
            quant::dequantize(d.ty, d.bytes(), &mut v)
                .map_err(|e| invalid(format!("tensor {}: {e}", d.name)))?;
            converted = v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
            &converted
        } else {
            d.bytes()
        };
        let g = self.gpu_mut()?;
        let buf = g
            .alloc(Region::Weights, bytes.len() as u64)
            .map_err(gpu_err)?;
        // Checksummed on the device against the host (the gfx1151 zeroed-weights failure).
        g.upload_tensor(d.name, buf, bytes).map_err(gpu_err)?;
        self.weights.push(GpuWeight {
            name: d.name.to_string(),
            ty: if vector { GgmlType::F32 } else { d.ty },
            rows: d.rows,
            cols: d.cols,
            buf,
            vector,
        });
        Ok(Weight(self.weights.len() as u32 - 1))
    }

    fn alloc(&mut self, name: &'static str, len: usize) -> Result<Buf> {
        let g = self.gpu_mut()?;
        let buf = g
            .alloc(Region::Activations, (len.max(1) * 4) as u64)
            .map_err(gpu_err)?;
        let l = g.label(&format!("init · zero {name}"));
        g.fill_u32(l, buf, 0).map_err(gpu_err)?;
        self.next_version += 1;
        self.bufs.push(GpuBuf {
            name,
            len,
            buf,
            version: self.next_version,
        });
        self.refresh_arena(true);
        Ok(Buf(self.bufs.len() as u32 - 1))
    }

    fn alloc_kv_cache(&mut self, n_layers: usize, n_ctx: usize, kv_dim: usize) -> Result<()> {
        let elems = n_layers
            .checked_mul(n_ctx)
            .and_then(|n| n.checked_mul(kv_dim))
            .ok_or_else(|| BackendError::OutOfMemory("KV cache size overflows".into()))?;
        let bytes = elems as u64 * self.opts.kv.bytes();
        let g = self.gpu_mut()?;
        let k = g.alloc(Region::KvCache, bytes.max(4)).map_err(gpu_err)?;
        let v = g.alloc(Region::KvCache, bytes.max(4)).map_err(gpu_err)?;
        let l = g.label("init · zero kv_cache");
        g.fill_u32(l, k, 0).map_err(gpu_err)?;
        g.fill_u32(l, v, 0).map_err(gpu_err)?;
        self.kv = Some(KvCache {
            n_layers,
            n_ctx,
            kv_dim,
            k,
            v,
        });
        self.refresh_arena(true);
        Ok(())
    }

    fn embed(&mut self, table: Weight, tokens: &[u32], out: Buf) -> Result<()> {
        let (ty, rows, cols, wbuf) = {
            let w = self.weight(table)?;
            (w.ty, w.rows, w.cols, w.buf)
        };
        let n = tokens.len();
        if n == 0 {
            return Ok(());
        }
        if n > self.n_batch() {
            return Err(invalid(format!(
                "{n} tokens in one step; the plan allows {}",
                self.n_batch()
            )));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= rows) {
            return Err(invalid(format!(
                "token id {bad} is outside the vocabulary of {rows} tokens"
            )));
        }
        let o = self.buf(out, n * cols)?;
        let tok_buf = self.workspace()?.tokens;
        self.host_bytes.clear();
        self.host_bytes
            .extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
        let l = self.label(OpLabel::global("embed"), "tokens")?;
        let bytes = std::mem::take(&mut self.host_bytes);
        let r = self.gpu_mut()?.upload(l, tok_buf, &bytes).map_err(gpu_err);
        self.host_bytes = bytes;
        r?;
        let tk = type_kernels(ty).ok_or_else(|| invalid(format!("{ty} has no kernels")))?;
        let (_, dq) = self.kernels.by_type[&ty];
        let row_bytes = (cols / ty.block_len() * ty.block_bytes()) as u64;
        self.launch(
            OpLabel::global("embed"),
            dequant_name(tk.suffix),
            dq,
            [
                (cols as u64).div_ceil(256).clamp(1, 1024) as u32,
                n as u32,
                1,
            ],
            [256, 1, 1],
            &[
                Arg::Ptr(wbuf.ptr),
                Arg::Ptr(tok_buf.ptr),
                Arg::Ptr(o.ptr),
                Arg::U32(cols as u32),
                Arg::U64(row_bytes),
                Arg::U32(rows as u32),
            ],
        )?;
        self.wrote(out);
        Ok(())
    }

    fn rms_norm(
        &mut self,
        x: Buf,
        weight: Weight,
        out: Buf,
        n_tokens: usize,
        dim: usize,
        eps: f32,
        label: OpLabel,
    ) -> Result<()> {
        if n_tokens == 0 {
            return Ok(());
        }
        let w = self.vector(weight, dim)?;
        let xb = self.buf(x, n_tokens * dim)?;
        let ob = self.buf(out, n_tokens * dim)?;
        let f = self.kernels.rms_norm;
        self.launch(
            label,
            "rms_norm",
            f,
            [n_tokens as u32, 1, 1],
            [256, 1, 1],
            &[
                Arg::Ptr(xb.ptr),
                Arg::Ptr(w.ptr),
                Arg::Ptr(ob.ptr),
                Arg::U32(dim as u32),
                Arg::F32(eps),
            ],
        )?;
        self.wrote(out);
        Ok(())
    }

    fn matmul(
        &mut self,
        w: Weight,
        x: Buf,
        out: Buf,
        n_tokens: usize,
        label: OpLabel,
    ) -> Result<()> {
        let idx = w.0 as usize;
        let (ty, rows, cols, vector) = {
            let gw = self.weight(w)?;
            (gw.ty, gw.rows, gw.cols, gw.vector)
        };
        if vector {
            return Err(invalid(format!(
                "{} is a vector, not a matrix",
                self.weights[idx].name
            )));
        }
        if n_tokens == 0 {
            return Ok(());
        }
        let tk = type_kernels(ty).ok_or_else(|| invalid(format!("{ty} has no kernels")))?;
        let xbuf = self.buf(x, n_tokens * cols)?;
        let obuf = self.buf(out, n_tokens * rows)?;
        if x == out {
            return Err(invalid(
                "a matrix product cannot write its own input".into(),
            ));
        }
        if n_tokens > self.n_batch() {
            return Err(invalid(format!(
                "{n_tokens} tokens in one product; the plan allows {}",
                self.n_batch()
            )));
        }
        let gemm = n_tokens >= self.opts.gemm_min_tokens.max(1) && self.workspace()?.xdq.is_some();
        if gemm {
            self.matmul_gemm(idx, tk, x, xbuf, obuf, n_tokens, label)?;
        } else {
            self.matmul_mv(idx, tk, x, xbuf, obuf, n_tokens, label)?;
        }
        self.wrote(out);
        Ok(())
    }

    fn add_bias(&mut self, x: Buf, bias: Weight, n_tokens: usize, label: OpLabel) -> Result<()> {
        let width = self.weight(bias)?.cols;
        let b = self.vector(bias, width)?;
        let n = (n_tokens * width) as u64;
        if n == 0 {
            return Ok(());
        }
        let xb = self.buf(x, n as usize)?;
        let f = self.kernels.add_bias;
        self.launch(
            label,
            "add_bias",
            f,
            [elementwise_grid(n), 1, 1],
            [256, 1, 1],
            &[
                Arg::Ptr(xb.ptr),
                Arg::Ptr(b.ptr),
                Arg::U32(width as u32),
                Arg::U64(n),
            ],
        )?;
        self.wrote(x);
        Ok(())
    }

    fn rope(
        &mut self,
        x: Buf,
        n_tokens: usize,
        n_heads: usize,
        head_dim: usize,
        pos0: usize,
        p: &RopeParams,
        label: OpLabel,
    ) -> Result<()> {
        let half = p.pairs(head_dim)?;
        if half > MAX_ROPE_PAIRS {
            return Err(invalid(format!(
                "RoPE over {} pairs: the kernel rotates at most {MAX_ROPE_PAIRS}",
                half
            )));
        }
        if n_tokens == 0 || half == 0 {
            return Ok(());
        }
        let factors = match p.freq_factors {
            Some(f) => Arg::Ptr(self.vector(f, half)?.ptr),
            None => Arg::U64(0),
        };
        let xb = self.buf(x, n_tokens * n_heads * head_dim)?;
        let f = self.kernels.rope;
        self.launch(
            label,
            if p.neox { "rope_neox" } else { "rope" },
            f,
            [n_tokens as u32, 1, 1],
            [128, 1, 1],
            &[
                Arg::Ptr(xb.ptr),
                Arg::U32(n_heads as u32),
                Arg::U32(head_dim as u32),
                Arg::U32(p.n_rot as u32),
                Arg::U32(pos0 as u32),
                Arg::F32(p.freq_scale),
                Arg::F32(rope_theta_scale(p.base, p.n_rot)),
                factors,
                Arg::U32(p.neox as u32),
            ],
        )?;
        self.wrote(x);
        Ok(())
    }

    fn attention(&mut self, q: Buf, k: Buf, v: Buf, out: Buf, p: &AttnParams) -> Result<()> {
        let kv_dim = p.n_kv_heads * p.head_dim;
        let q_dim = p.n_heads * p.head_dim;
        let (k_cache, v_cache, n_ctx) = {
            let kv = self
                .kv
                .as_ref()
                .ok_or_else(|| invalid("attention before the KV cache was allocated".into()))?;
            if kv.kv_dim != kv_dim
                || p.pos0 + p.n_tokens > kv.n_ctx
                || p.layer >= kv.n_layers
                || p.n_kv_heads == 0
            {
                return Err(invalid(format!(
                    "attention at layer {} positions {}..{} does not fit the KV cache ({} layers \
                     of {} positions of {})",
                    p.layer,
                    p.pos0,
                    p.pos0 + p.n_tokens,
                    kv.n_layers,
                    kv.n_ctx,
                    kv.kv_dim
                )));
            }
            (kv.k, kv.v, kv.n_ctx)
        };
        if !p.n_heads.is_multiple_of(p.n_kv_heads) || p.head_dim > MAX_HEAD_DIM {
            return Err(invalid(format!(
                "{} heads over {} KV heads of {} dimensions (heads must be a multiple of KV \
                 heads; at most {MAX_HEAD_DIM} dimensions)",
                p.n_heads, p.n_kv_heads, p.head_dim
            )));
        }
        if p.n_tokens == 0 {
            return Ok(());
        }
        if p.n_tokens > MAX_GRID_Y {
            return Err(invalid(format!("{} query rows in one call", p.n_tokens)));
        }
        let qb = self.buf(q, p.n_tokens * q_dim)?;
        let kb = self.buf(k, p.n_tokens * kv_dim)?;
        let vb = self.buf(v, p.n_tokens * kv_dim)?;
        let ob = self.buf(out, p.n_tokens * q_dim)?;
        let eb = self.opts.kv.bytes();
        let layer_off = (p.layer * n_ctx * kv_dim) as u64;
        let n = (p.n_tokens * kv_dim) as u64;
        let li = p.layer as u32;
        let (store, store_name, attn, attn_name) = match self.opts.kv {
            KvType::F32 => (
                self.kernels.kv_store_f32,
                "kv_store_f32",
                self.kernels.attention_f32,
                "attention_f32",
            ),
            KvType::F16 => (
                self.kernels.kv_store_f16,
                "kv_store_f16",
                self.kernels.attention_f16,
                "attention_f16",
            ),
        };
        self.launch(
            OpLabel::layer(li, "kv_store"),
            store_name,
            store,
            [elementwise_grid(n), 1, 1],
            [256, 1, 1],
            &[
                Arg::Ptr(kb.ptr),
                Arg::Ptr(vb.ptr),
                Arg::Ptr(k_cache.ptr),
                Arg::Ptr(v_cache.ptr),
                Arg::U64(layer_off + (p.pos0 * kv_dim) as u64),
                Arg::U64(n),
            ],
        )?;
        self.launch(
            OpLabel::layer(li, "attention"),
            attn_name,
            attn,
            [p.n_heads as u32, p.n_tokens as u32, 1],
            [128, 1, 1],
            &[
                Arg::Ptr(qb.ptr),
                Arg::Ptr(k_cache.ptr.offset(layer_off * eb)),
                Arg::Ptr(v_cache.ptr.offset(layer_off * eb)),
                Arg::Ptr(ob.ptr),
                Arg::U32(p.n_heads as u32),
                Arg::U32(p.n_kv_heads as u32),
                Arg::U32(p.head_dim as u32),
                Arg::U32(p.pos0 as u32),
                Arg::F32(p.scale),
            ],
        )?;
        self.wrote(out);
        Ok(())
    }

    fn swiglu(&mut self, gate: Buf, up: Buf, len: usize, label: OpLabel) -> Result<()> {
        let f = self.kernels.swiglu;
        self.elementwise(f, "swiglu", gate, up, len, label)
    }

    fn add(&mut self, acc: Buf, x: Buf, len: usize, label: OpLabel) -> Result<()> {
        let f = self.kernels.add;
        self.elementwise(f, "add", acc, x, len, label)
    }

    fn copy(
        &mut self,
        src: Buf,
        src_off: usize,
        dst: Buf,
        dst_off: usize,
        len: usize,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let s = self
            .buf(src, src_off + len)?
            .slice(src_off as u64 * 4, len as u64 * 4)
            .map_err(gpu_err)?;
        let d = self
            .buf(dst, dst_off + len)?
            .slice(dst_off as u64 * 4, len as u64 * 4)
            .map_err(gpu_err)?;
        let l = self.label(OpLabel::global("copy"), "")?;
        self.gpu_mut()?
            .copy_d2d(l, d, s, len as u64 * 4)
            .map_err(gpu_err)?;
        self.wrote(dst);
        Ok(())
    }

    fn read(&mut self, buf: Buf, offset: usize, out: &mut [f32]) -> Result<()> {
        let src = self
            .buf(buf, offset + out.len())?
            .slice(offset as u64 * 4, out.len() as u64 * 4)
            .map_err(gpu_err)?;
        let l = self.label(OpLabel::global("read"), "logits")?;
        let mut bytes = std::mem::take(&mut self.host_bytes);
        bytes.resize(out.len() * 4, 0);
        // Through pinned staging, waiting with the configured deadline (never unbounded).
        let r = self
            .gpu_mut()?
            .download(l, src, &mut bytes)
            .map_err(gpu_err);
        if r.is_ok() {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        self.host_bytes = bytes;
        self.refresh_arena(false);
        r
    }

    fn streams(&self) -> Vec<StreamSnapshot> {
        match &self.gpu {
            Some(g) => vec![g.stream_snapshot()],
            None => Vec::new(),
        }
    }

    fn arena(&self) -> ArenaSnapshot {
        self.arena_cache.clone()
    }

    fn monitor(&self) -> Option<Arc<dyn BackendMonitor>> {
        let m: Arc<dyn BackendMonitor> = self.monitor.clone();
        self.gpu.as_ref().map(|_| m)
    }

    fn shutdown(
        &mut self,
        drain_deadline: Duration,
        on_step: &mut dyn FnMut(QuitStep),
    ) -> DeviceRelease {
        match self.gpu.take() {
            Some(g) => g.teardown(drain_deadline, on_step).release(),
            None => DeviceRelease::Clean,
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
