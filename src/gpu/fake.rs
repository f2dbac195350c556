//! (One file over 700 lines on purpose: one `Device` implementation whose every method works on
//! the same scripted state, used only by tests.)
//!
//! A scripted fake device for unit tests: host memory stands in for device memory, ops queue in
//! order on one stream and complete when the script says (at once, when the test releases them,
//! or — for `hs_spin_on_flag` — only once its host flag is set). Kernels that the mechanisms use
//! (`hs_checksum`, `hs_fill_u32`, `hs_sgemm`, `hs_busy`, `hs_spin_on_flag`, `hs_clock_probe`) are
//! implemented in Rust so that uploads, verification and the GEMM fallback's argument passing can
//! be checked end to end; every kernel writes its breadcrumb and, stamped, its start and end on
//! the fake's clock. Like a real GPU, copies read their source when they execute, not when enqueued.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::gpu::checksum::host_checksum;
use crate::gpu::device::{
    BlasAvailability, Device, DeviceInfo, DevicePtr, EventProbe, GemmF32, GpuError, MemInfo, Op,
    PinnedRaw, RawBlas, RawEvent, RawFunction, RawGraph, RawModule, RuntimeError, RuntimeKind,
};
use crate::gpu::kernels::{KernelCompiler, declarations};
use crate::gpu::stream::stamp::{self as stamps, STAMP_OP};

/// How the fake behaves.
#[derive(Clone, Debug, PartialEq)]
pub struct FakeScript {
    pub total_memory: u64,
    /// Ops complete as soon as they reach the head of the queue (else only via `release`).
    pub auto_complete: bool,
    pub blas: bool,
    /// Stream capture into graphs and their replay (off: the runtime "lacks" graphs).
    pub graphs: bool,
}

impl Default for FakeScript {
    fn default() -> Self {
        FakeScript {
            total_memory: 1 << 30,
            auto_complete: true,
            blas: false,
            graphs: false,
        }
    }
}

#[derive(Clone)]
enum FakeOp {
    H2D {
        dst: u64,
        src: usize,
        len: usize,
    },
    D2H {
        dst: usize,
        src: u64,
        len: usize,
    },
    D2D {
        dst: u64,
        src: u64,
        len: usize,
    },
    /// Bytes read from a peer device when the copy was enqueued (`copy_from_peer`).
    Write {
        dst: u64,
        data: Vec<u8>,
    },
    Kernel {
        name: String,
        args: Vec<u64>,
    },
    Gemm(GemmF32),
    Record {
        event: u64,
    },
}

struct Queued {
    op: FakeOp,
    started: bool,
}

#[derive(Default)]
struct FakeState {
    script: FakeScript,
    next_addr: u64,
    device: HashMap<u64, Vec<u8>>,
    /// Host address → length of pinned allocations (the bytes are owned by `pinned_store`).
    pinned: HashMap<usize, usize>,
    pinned_store: HashMap<usize, Box<[u64]>>,
    queue: VecDeque<Queued>,
    /// Ops let through in manual mode.
    released: usize,
    executed: u64,
    /// event id → `executed` count at which it is reached (None: never recorded).
    events: HashMap<u64, Option<u64>>,
    next_event: u64,
    recorded: u64,
    modules: HashMap<u64, Vec<String>>,
    functions: HashMap<u64, String>,
    /// Parameter widths of kernels read from the loaded sources (those without a table entry).
    signatures: HashMap<String, Vec<usize>>,
    next_handle: u64,
    allocations: u64,
    corrupt_uploads: bool,
    fail_next: Option<(&'static str, i64)>,
    stream_alive: bool,
    block_queries: bool,
    queries_in_flight: usize,
    blas_handles: u64,
    log: Vec<String>,
    /// Ops captured since `begin_capture` (they do not run).
    capture: Option<Vec<FakeOp>>,
    /// Instantiated graphs by handle.
    graphs: HashMap<u64, Vec<FakeOp>>,
    /// The device's clock: each executed op advances it by its time (`op_ns`).
    clock_ns: u64,
    /// Time of an op by kernel name (`copy` for copies); others take `DEFAULT_OP_NS`.
    op_ns: HashMap<String, u64>,
    /// Timed events → the clock when the device reached them.
    timed: HashMap<u64, Option<u64>>,
}

/// The fake's time for an op without one of its own.
pub const DEFAULT_OP_NS: u64 = 1_000;

/// Test-side handle to a fake device's state.
#[derive(Clone)]
pub struct FakeControl {
    state: Arc<(Mutex<FakeState>, Condvar)>,
}

impl FakeControl {
    fn lock(&self) -> MutexGuard<'_, FakeState> {
        self.state.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets `n` more ops complete (manual mode).
    pub fn release(&self, n: usize) {
        let mut s = self.lock();
        s.released += n;
        advance(&mut s);
    }

    /// Switches between auto-completion and manual release.
    pub fn set_auto(&self, auto: bool) {
        let mut s = self.lock();
        s.script.auto_complete = auto;
        advance(&mut s);
    }

    /// Ops queued and not yet executed (event records included).
    pub fn pending(&self) -> usize {
        self.lock().queue.len()
    }

    /// Makes every later host-to-device copy write zeros (the gfx1151 failure).
    pub fn corrupt_uploads(&self, on: bool) {
        self.lock().corrupt_uploads = on;
    }

    /// The next call named `call` fails with `code`.
    pub fn fail_next(&self, call: &'static str, code: i64) {
        self.lock().fail_next = Some((call, code));
    }

    /// Makes event queries block (a wedged runtime) until unblocked.
    pub fn block_event_queries(&self, on: bool) {
        let mut s = self.lock();
        s.block_queries = on;
        drop(s);
        self.state.1.notify_all();
    }

    /// Event queries currently blocked inside the fake.
    pub fn queries_in_flight(&self) -> usize {
        self.lock().queries_in_flight
    }

    pub fn device_bytes_allocated(&self) -> u64 {
        self.lock().device.values().map(|v| v.len() as u64).sum()
    }

    pub fn live_pinned(&self) -> usize {
        self.lock().pinned.len()
    }

    pub fn live_events(&self) -> usize {
        self.lock().events.len()
    }

    pub fn live_modules(&self) -> usize {
        self.lock().modules.len()
    }

    pub fn live_blas_handles(&self) -> u64 {
        self.lock().blas_handles
    }

    /// Makes every later run of kernel `name` (or `copy`, for copies) take `ns` on the device's
    /// clock (timed events read that clock).
    pub fn set_op_time(&self, name: &str, ns: u64) {
        self.lock().op_ns.insert(name.to_string(), ns);
    }

    /// The device clock now.
    pub fn clock_ns(&self) -> u64 {
        self.lock().clock_ns
    }

    /// Graphs instantiated and not destroyed.
    pub fn live_graphs(&self) -> usize {
        self.lock().graphs.len()
    }

    pub fn stream_alive(&self) -> bool {
        self.lock().stream_alive
    }

    /// Calls made, in order (`malloc`, `launch hs_fill_u32`, `destroy_event`, …).
    pub fn log(&self) -> Vec<String> {
        self.lock().log.clone()
    }

    /// Reads device (or mapped pinned) memory directly.
    pub fn read(&self, addr: DevicePtr, len: usize) -> Option<Vec<u8>> {
        let mut s = self.lock();
        let p = resolve(&mut s, addr.0, len)?;
        // SAFETY: `resolve` checked that len bytes from p lie in one live allocation.
        Some(unsafe { std::slice::from_raw_parts(p, len) }.to_vec())
    }
}

type FakeShared = (Mutex<FakeState>, Condvar);

/// Every fake device that was asked for its peer id, for the peer copies of a split over fakes.
fn fake_peers() -> &'static Mutex<HashMap<u64, std::sync::Weak<FakeShared>>> {
    static PEERS: std::sync::OnceLock<Mutex<HashMap<u64, std::sync::Weak<FakeShared>>>> =
        std::sync::OnceLock::new();
    PEERS.get_or_init(Default::default)
}

/// The fake device.
pub struct FakeDevice {
    info: DeviceInfo,
    ctl: FakeControl,
}

impl FakeDevice {
    /// The fake device as the runtime's device `ordinal` (`fake:1 stream 0`, `fake GPU 1`): a
    /// second (third, …) GPU for the tests of a model split over several.
    pub fn with_ordinal(script: FakeScript, ordinal: u32) -> FakeDevice {
        let mut d = FakeDevice::new(script);
        d.info.ordinal = ordinal;
        if ordinal > 0 {
            d.info.name = format!("fake GPU {ordinal}");
        }
        d
    }

    pub fn new(script: FakeScript) -> FakeDevice {
        let info = DeviceInfo {
            backend: Some(RuntimeKind::Fake),
            ordinal: 0,
            name: "fake GPU".into(),
            arch: "fake".into(),
            arch_source: "script".into(),
            total_memory: script.total_memory,
            compute_units: 4,
            warp_size: 32,
            integrated: false,
            pci_bus_id: None,
            driver_version: "fake".into(),
            runtime_version: "fake".into(),
            notes: Vec::new(),
        };
        let state = FakeState {
            script,
            next_addr: 0x1000_0000,
            stream_alive: true,
            next_handle: 1,
            next_event: 1,
            ..Default::default()
        };
        FakeDevice {
            info,
            ctl: FakeControl {
                state: Arc::new((Mutex::new(state), Condvar::new())),
            },
        }
    }

    pub fn control(&self) -> FakeControl {
        self.ctl.clone()
    }

    fn lock(&self) -> MutexGuard<'_, FakeState> {
        self.ctl.lock()
    }
}

fn fail(s: &mut FakeState, call: &'static str) -> Result<(), GpuError> {
    if let Some((c, code)) = s.fail_next
        && c == call
    {
        s.fail_next = None;
        return Err(GpuError::Runtime(RuntimeError {
            backend: RuntimeKind::Fake,
            call,
            code,
            message: "injected failure".into(),
        }));
    }
    Ok(())
}

fn stream_check(s: &FakeState) -> Result<(), GpuError> {
    if s.stream_alive {
        Ok(())
    } else {
        Err(GpuError::TornDown)
    }
}

/// A host pointer for `len` bytes at `addr` (device memory or mapped pinned memory).
fn resolve(s: &mut FakeState, addr: u64, len: usize) -> Option<*mut u8> {
    for (base, buf) in s.device.iter_mut() {
        if addr >= *base && addr + len as u64 <= *base + buf.len() as u64 {
            return Some(buf[(addr - base) as usize..].as_mut_ptr());
        }
    }
    for (base, l) in s.pinned.iter() {
        let b = *base as u64;
        if addr >= b && addr + len as u64 <= b + *l as u64 {
            return Some(addr as usize as *mut u8);
        }
    }
    None
}

fn rd_u32(s: &mut FakeState, addr: u64) -> Option<u32> {
    let p = resolve(s, addr, 4)?;
    // SAFETY: resolve checked 4 bytes.
    Some(unsafe { std::ptr::read_unaligned(p as *const u32) })
}

fn rd_f32(s: &mut FakeState, addr: u64) -> Option<f32> {
    rd_u32(s, addr).map(f32::from_bits)
}

fn wr_bytes(s: &mut FakeState, addr: u64, data: &[u8]) -> Option<()> {
    let p = resolve(s, addr, data.len())?;
    // SAFETY: resolve checked the length.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
    Some(())
}

fn rd_u64(s: &mut FakeState, a: u64) -> Option<u64> {
    resolve(s, a, 8).map(|p| {
        // SAFETY: resolve checked 8 bytes.
        unsafe { std::ptr::read_unaligned(p as *const u64) }
    })
}

/// A kernel's breadcrumb as `HS_BREADCRUMB` writes it: its op seq, or inside a replayed graph
/// (bit 63 of `op`) the step block's base plus its node index, at the address the block names;
/// a stamped kernel (bit 62) writes its seq where its stamp block says, its start time (the
/// fake's clock) into its ring slot, and hands the ends of the ops before it over.
fn write_crumb(s: &mut FakeState, crumb: u64, op: u64) {
    if crumb == 0 {
        return;
    }
    match op >> 62 {
        0 => {
            let _ = wr_bytes(s, crumb, &op.to_le_bytes());
        }
        1 => {
            let seq = op & !STAMP_OP;
            if let (Some(host), Some(ring)) = (rd_u64(s, crumb), rd_u64(s, crumb + 8)) {
                let now = s.clock_ns;
                let _ = wr_bytes(s, host, &seq.to_le_bytes());
                let _ = wr_bytes(s, ring + 16 * stamps::slot(seq) as u64, &now.to_le_bytes());
                for i in 1..=stamps::BEHIND {
                    let before = seq.wrapping_sub(i);
                    if let Some(end) = rd_u64(s, end_word(crumb, before)) {
                        let at = ring + 16 * stamps::slot(before) as u64 + 8;
                        let _ = wr_bytes(s, at, &end.to_le_bytes());
                    }
                }
            }
        }
        _ => {
            if let (Some(base), Some(host)) = (rd_u64(s, crumb), rd_u64(s, crumb + 8)) {
                let v = base + (op & !(1 << 63));
                let _ = wr_bytes(s, host, &v.to_le_bytes());
            }
        }
    }
}

/// The address of op `seq`'s end word in the stamp block at `block`.
fn end_word(block: u64, seq: u64) -> u64 {
    block + 8 * (stamps::ENDS_WORD + stamps::slot(seq)) as u64
}

/// A stamped kernel that has finished raises its end word to the fake's clock.
fn write_end_stamp(s: &mut FakeState, crumb: u64, op: u64) {
    if crumb == 0 || op >> 62 != 1 {
        return;
    }
    let at = end_word(crumb, op & !STAMP_OP);
    let now = s.clock_ns;
    if let Some(old) = rd_u64(s, at) {
        let _ = wr_bytes(s, at, &old.max(now).to_le_bytes());
    }
}

/// Whether the head op can run now, and if so runs it.
fn try_execute(s: &mut FakeState) -> bool {
    let Some(head) = s.queue.front_mut() else {
        return false;
    };
    if !head.started {
        head.started = true;
        // A kernel reaching the head has started: it writes its breadcrumb.
        if let FakeOp::Kernel { args, .. } = &head.op {
            let (crumb, op) = (args[0], args[1]);
            write_crumb(s, crumb, op);
        }
    }
    let manual = !s.script.auto_complete;
    if manual && s.released == 0 {
        return false;
    }
    let Some(q) = s.queue.pop_front() else {
        return false;
    };
    let ok = run_op(s, &q.op);
    if !ok {
        s.queue.push_front(q);
        return false;
    }
    if manual {
        s.released -= 1;
    }
    s.executed += 1;
    true
}

fn advance(s: &mut FakeState) {
    while try_execute(s) {}
    // Mark the new head as started (breadcrumb) even if it cannot finish.
    if let Some(h) = s.queue.front_mut()
        && !h.started
    {
        h.started = true;
        if let FakeOp::Kernel { args, .. } = &h.op {
            let (crumb, op) = (args[0], args[1]);
            write_crumb(s, crumb, op);
        }
    }
}

/// Executes one op; false if it cannot finish yet (a spinning kernel).
fn run_op(s: &mut FakeState, op: &FakeOp) -> bool {
    let ns = match op {
        FakeOp::Kernel { name, .. } => s.op_ns.get(name).copied(),
        FakeOp::Record { .. } => Some(0),
        _ => s.op_ns.get("copy").copied(),
    };
    let done = run_op_inner(s, op);
    if done {
        s.clock_ns += ns.unwrap_or(DEFAULT_OP_NS);
        if let FakeOp::Kernel { args, .. } = op {
            write_end_stamp(s, args[0], args[1]);
        }
    }
    done
}

fn run_op_inner(s: &mut FakeState, op: &FakeOp) -> bool {
    match op {
        FakeOp::H2D { dst, src, len } => {
            let mut data = vec![0u8; *len];
            if !s.corrupt_uploads {
                // SAFETY: src is a pinned host buffer of at least len bytes (checked at enqueue),
                // or a pageable one whose caller waits for this op before letting it go.
                data.copy_from_slice(unsafe {
                    std::slice::from_raw_parts(*src as *const u8, *len)
                });
            }
            let _ = wr_bytes(s, *dst, &data);
        }
        FakeOp::D2H { dst, src, len } => {
            if let Some(p) = resolve(s, *src, *len) {
                // SAFETY: both ranges checked (dst at enqueue, src by resolve).
                unsafe { std::ptr::copy_nonoverlapping(p, *dst as *mut u8, *len) };
            }
        }
        FakeOp::D2D { dst, src, len } => {
            if let Some(p) = resolve(s, *src, *len) {
                // SAFETY: resolve checked len bytes.
                let data = unsafe { std::slice::from_raw_parts(p, *len) }.to_vec();
                let _ = wr_bytes(s, *dst, &data);
            }
        }
        FakeOp::Write { dst, data } => {
            let _ = wr_bytes(s, *dst, data);
        }
        FakeOp::Record { event } => {
            let at = s.executed + 1;
            s.events.insert(*event, Some(at));
            if s.timed.contains_key(event) {
                let now = s.clock_ns;
                s.timed.insert(*event, Some(now));
            }
            return true;
        }
        FakeOp::Gemm(g) => sgemm(s, g),
        FakeOp::Kernel { name, args } => return run_kernel(s, name, args),
    }
    true
}

fn run_kernel(s: &mut FakeState, name: &str, a: &[u64]) -> bool {
    match name {
        "hs_checksum" => {
            let (data, n, out) = (a[2], a[3] as usize, a[4]);
            let bytes = resolve(s, data, n)
                // SAFETY: resolve checked n bytes.
                .map(|p| unsafe { std::slice::from_raw_parts(p, n) }.to_vec())
                .unwrap_or_default();
            let c = host_checksum(&bytes);
            // The fake puts the whole sum into block 0's partials and zeros elsewhere.
            let mut partials = vec![0u8; 256 * 16];
            partials[..8].copy_from_slice(&c.sum.to_le_bytes());
            partials[8..16].copy_from_slice(&c.nonzero_words.to_le_bytes());
            let _ = wr_bytes(s, out, &partials);
        }
        "hs_fill_u32" => {
            let (dst, n, v) = (a[2], a[3] as usize, a[4] as u32);
            let data: Vec<u8> = (0..n).flat_map(|_| v.to_le_bytes()).collect();
            let _ = wr_bytes(s, dst, &data);
        }
        // Timing stand-ins: the fake runs them as no-ops.
        "hs_busy" | "hs_read_bw" => {}
        "hs_graph_step" => {
            let (block, base, host, pos, tok, token) = (a[2], a[3], a[4], a[5] as u32, a[6], a[7]);
            let mut b = [0u8; 20];
            b[..8].copy_from_slice(&base.to_le_bytes());
            b[8..16].copy_from_slice(&host.to_le_bytes());
            b[16..].copy_from_slice(&pos.to_le_bytes());
            let _ = wr_bytes(s, block, &b);
            if tok != 0 {
                let _ = wr_bytes(s, tok, &(token as u32).to_le_bytes());
            }
        }
        "hs_clock_probe" => {
            // One reading of the clock (never 0: the host takes 0 as "not yet"), then stopped.
            let out = a[2];
            let now = s.clock_ns.max(1);
            let _ = wr_bytes(s, out, &now.to_le_bytes());
            let _ = wr_bytes(s, out + 8, &1u64.to_le_bytes());
        }
        "hs_spin_on_flag" => {
            let (flag, result) = (a[2], a[4]);
            match rd_u32(s, flag) {
                Some(0) | None => return false,
                Some(_) => {
                    let _ = wr_bytes(s, result, &1u32.to_le_bytes());
                }
            }
        }
        "hs_sgemm" => {
            let op = |v: u64| if v as u32 == 1 { Op::T } else { Op::N };
            let g = GemmF32 {
                transa: op(a[2]),
                transb: op(a[3]),
                m: a[4] as u32 as i32,
                n: a[5] as u32 as i32,
                k: a[6] as u32 as i32,
                alpha: DevicePtr(a[7]),
                a: DevicePtr(a[8]),
                lda: a[9] as u32 as i32,
                b: DevicePtr(a[10]),
                ldb: a[11] as u32 as i32,
                beta: DevicePtr(a[12]),
                c: DevicePtr(a[13]),
                ldc: a[14] as u32 as i32,
            };
            sgemm(s, &g);
        }
        _ => {}
    }
    true
}

/// Column-major reference GEMM on fake memory.
fn sgemm(s: &mut FakeState, g: &GemmF32) {
    let alpha = rd_f32(s, g.alpha.0).unwrap_or(f32::NAN);
    let beta = rd_f32(s, g.beta.0).unwrap_or(f32::NAN);
    for j in 0..g.n as u64 {
        for i in 0..g.m as u64 {
            let mut acc = 0.0f32;
            for p in 0..g.k as u64 {
                let ai = if g.transa == Op::N {
                    i + p * g.lda as u64
                } else {
                    p + i * g.lda as u64
                };
                let bi = if g.transb == Op::N {
                    p + j * g.ldb as u64
                } else {
                    j + p * g.ldb as u64
                };
                let av = rd_f32(s, g.a.0 + 4 * ai).unwrap_or(f32::NAN);
                let bv = rd_f32(s, g.b.0 + 4 * bi).unwrap_or(f32::NAN);
                acc += av * bv;
            }
            let ci = g.c.0 + 4 * (i + j * g.ldc as u64);
            let prev = if beta == 0.0 {
                0.0
            } else {
                beta * rd_f32(s, ci).unwrap_or(f32::NAN)
            };
            let _ = wr_bytes(s, ci, &(alpha * acc + prev).to_le_bytes());
        }
    }
}

/// Parameter count of each fake kernel (crumb and op included).
fn kernel_arity(name: &str) -> Option<usize> {
    Some(match name {
        "hs_checksum" => 5,
        "hs_fill_u32" => 5,
        "hs_busy" => 5,
        "hs_read_bw" => 6,
        "hs_spin_on_flag" => 5,
        "hs_clock_probe" => 5,
        "hs_graph_step" => 8,
        "hs_sgemm" => 15,
        _ => return None,
    })
}

/// Widths in bytes of each parameter, so the fake reads exactly what the runtime would copy.
fn kernel_widths(name: &str) -> Vec<usize> {
    match name {
        "hs_checksum" => vec![8, 8, 8, 8, 8],
        "hs_fill_u32" => vec![8, 8, 8, 8, 4],
        "hs_busy" => vec![8, 8, 8, 4, 4],
        "hs_read_bw" => vec![8, 8, 8, 8, 8, 8],
        "hs_spin_on_flag" => vec![8, 8, 8, 8, 8],
        "hs_clock_probe" => vec![8, 8, 8, 8, 8],
        "hs_graph_step" => vec![8, 8, 8, 8, 8, 4, 8, 4],
        "hs_sgemm" => vec![8, 8, 4, 4, 4, 4, 4, 8, 8, 4, 8, 4, 8, 8, 4],
        _ => Vec::new(),
    }
}

/// Widths in bytes of the parameters of kernel `name` as its source declares them (literally, or
/// in a family generated per type: `kernels::declarations`).
#[cfg(test)]
fn param_widths(source: &str, name: &str) -> Option<Vec<usize>> {
    declarations(source)
        .into_iter()
        .find(|d| d.name == name)
        .map(|d| widths_of(&d.params))
}

/// Widths in bytes of a parameter list (`HS_TRACK_PARAMS` is a pointer and a u64; pointers and
/// 64-bit integers take 8, the rest 4).
fn widths_of(params: &str) -> Vec<usize> {
    let mut widths = Vec::new();
    for p in params.split(',') {
        let p = p.trim();
        if p == "HS_TRACK_PARAMS" {
            widths.extend([8, 8]);
        } else if p.contains('*') || p.contains("hs_u64") || p.contains("hs_i64") {
            widths.push(8);
        } else {
            widths.push(4);
        }
    }
    widths
}

struct FakeProbe {
    ctl: FakeControl,
}

impl EventProbe for FakeProbe {
    fn query(&self, event: RawEvent) -> Result<bool, GpuError> {
        let (m, cv) = &*self.ctl.state;
        let mut s = m.lock().unwrap_or_else(|p| p.into_inner());
        s.queries_in_flight += 1;
        while s.block_queries {
            s = cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.queries_in_flight -= 1;
        advance(&mut s);
        match s.events.get(&event.0) {
            Some(Some(at)) => Ok(s.executed >= *at),
            Some(None) => Ok(true),
            None => Err(GpuError::Runtime(RuntimeError {
                backend: RuntimeKind::Fake,
                call: "eventQuery",
                code: 400,
                message: "invalid event".into(),
            })),
        }
    }
}

impl FakeDevice {
    /// A host → device copy; `pinned_only` refuses a source outside pinned memory (the pinned
    /// path's contract), else any host memory (the pageable path, waited for by its caller).
    fn h2d(
        &mut self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        pinned_only: bool,
    ) -> Result<(), GpuError> {
        let mut s = self.lock();
        stream_check(&s)?;
        fail(&mut s, "copy_h2d")?;
        let pinned = s
            .pinned
            .iter()
            .any(|(b, l)| (src as usize) >= *b && (src as usize) + bytes <= b + l);
        if (pinned_only && !pinned) || resolve(&mut s, dst.0, bytes).is_none() {
            return Err(GpuError::InvalidArgument(
                "fake: h2d copy from unpinned memory or outside an allocation".into(),
            ));
        }
        s.queue.push_back(Queued {
            op: FakeOp::H2D {
                dst: dst.0,
                src: src as usize,
                len: bytes,
            },
            started: false,
        });
        advance(&mut s);
        Ok(())
    }

    /// A device → host copy; `pinned_only` as for [`FakeDevice::h2d`].
    fn d2h(
        &mut self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
        pinned_only: bool,
    ) -> Result<(), GpuError> {
        let mut s = self.lock();
        stream_check(&s)?;
        let pinned = s
            .pinned
            .iter()
            .any(|(b, l)| (dst as usize) >= *b && (dst as usize) + bytes <= b + l);
        if pinned_only && !pinned {
            return Err(GpuError::InvalidArgument(
                "fake: d2h copy into unpinned memory".into(),
            ));
        }
        s.queue.push_back(Queued {
            op: FakeOp::D2H {
                dst: dst as usize,
                src: src.0,
                len: bytes,
            },
            started: false,
        });
        advance(&mut s);
        Ok(())
    }
}

impl Device for FakeDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Fake
    }

    fn mem_info(&mut self) -> Result<MemInfo, GpuError> {
        let s = self.lock();
        let used: u64 = s.device.values().map(|v| v.len() as u64).sum();
        Ok(MemInfo {
            free: s.script.total_memory.saturating_sub(used),
            total: s.script.total_memory,
        })
    }

    fn device_allocations(&self) -> u64 {
        self.lock().allocations
    }

    fn malloc(&mut self, bytes: u64) -> Result<DevicePtr, GpuError> {
        let mut s = self.lock();
        fail(&mut s, "malloc")?;
        let used: u64 = s.device.values().map(|v| v.len() as u64).sum();
        if used + bytes > s.script.total_memory {
            return Err(GpuError::Runtime(RuntimeError {
                backend: RuntimeKind::Fake,
                call: "malloc",
                code: 2,
                message: "out of device memory".into(),
            }));
        }
        let addr = s.next_addr;
        s.next_addr += bytes.div_ceil(4096).max(1) * 4096 + 4096;
        s.device.insert(addr, vec![0u8; bytes as usize]);
        s.allocations += 1;
        s.log.push(format!("malloc {bytes}"));
        Ok(DevicePtr(addr))
    }

    unsafe fn free(&mut self, ptr: DevicePtr) -> Result<(), GpuError> {
        let mut s = self.lock();
        s.log.push("free".into());
        s.device.remove(&ptr.0).map(|_| ()).ok_or_else(|| {
            GpuError::Runtime(RuntimeError {
                backend: RuntimeKind::Fake,
                call: "free",
                code: 17,
                message: "invalid device pointer".into(),
            })
        })
    }

    fn alloc_pinned(&mut self, bytes: usize, _mapped: bool) -> Result<PinnedRaw, GpuError> {
        let mut s = self.lock();
        fail(&mut s, "alloc_pinned")?;
        let mut store = vec![0u64; bytes.div_ceil(8).max(1)].into_boxed_slice();
        let host = store.as_mut_ptr() as *mut u8;
        s.pinned.insert(host as usize, bytes);
        s.pinned_store.insert(host as usize, store);
        // Mapped memory is addressed by the device at its host address (unified addressing).
        Ok(PinnedRaw {
            host,
            device: Some(DevicePtr(host as u64)),
            bytes,
        })
    }

    unsafe fn free_pinned(&mut self, p: &PinnedRaw) -> Result<(), GpuError> {
        let mut s = self.lock();
        s.log.push("free_pinned".into());
        s.pinned.remove(&(p.host as usize));
        s.pinned_store.remove(&(p.host as usize));
        Ok(())
    }

    /// Registered memory counts as pinned for the copies (which check it) until unregistered.
    unsafe fn host_register(&mut self, ptr: *const u8, bytes: usize) -> Result<bool, GpuError> {
        let mut s = self.lock();
        // A runtime that cannot register answers no, as the real ones are read.
        if fail(&mut s, "host_register").is_err() {
            return Ok(false);
        }
        s.log.push(format!("host_register {bytes}"));
        s.pinned.insert(ptr as usize, bytes);
        Ok(true)
    }

    unsafe fn host_unregister(&mut self, ptr: *const u8) -> Result<(), GpuError> {
        let mut s = self.lock();
        s.log.push("host_unregister".into());
        s.pinned.remove(&(ptr as usize));
        Ok(())
    }

    fn create_event(&mut self) -> Result<RawEvent, GpuError> {
        let mut s = self.lock();
        fail(&mut s, "create_event")?;
        let id = s.next_event;
        s.next_event += 1;
        s.events.insert(id, None);
        Ok(RawEvent(id))
    }

    unsafe fn destroy_event(&mut self, e: RawEvent) -> Result<(), GpuError> {
        let mut s = self.lock();
        s.log.push("destroy_event".into());
        s.events.remove(&e.0);
        s.timed.remove(&e.0);
        Ok(())
    }

    fn create_timed_event(&mut self) -> Result<RawEvent, GpuError> {
        let mut s = self.lock();
        fail(&mut s, "create_timed_event")?;
        let id = s.next_event;
        s.next_event += 1;
        s.events.insert(id, None);
        s.timed.insert(id, None);
        Ok(RawEvent(id))
    }

    fn event_elapsed_ms(&self, start: RawEvent, end: RawEvent) -> Result<f32, GpuError> {
        let s = self.lock();
        let at = |e: RawEvent| -> Result<u64, GpuError> {
            match s.timed.get(&e.0) {
                Some(Some(t)) => Ok(*t),
                _ => Err(GpuError::Runtime(RuntimeError {
                    backend: RuntimeKind::Fake,
                    call: "eventElapsedTime",
                    code: 600,
                    message: "event not timed or not reached".into(),
                })),
            }
        };
        let (a, b) = (at(start)?, at(end)?);
        Ok((b as f64 - a as f64) as f32 / 1e6)
    }

    unsafe fn record_event(&mut self, e: RawEvent) -> Result<(), GpuError> {
        let mut s = self.lock();
        stream_check(&s)?;
        fail(&mut s, "record_event")?;
        s.recorded += 1;
        // Until the record op executes, the event is not reached.
        s.events.insert(e.0, Some(u64::MAX));
        if s.timed.contains_key(&e.0) {
            s.timed.insert(e.0, None);
        }
        s.queue.push_back(Queued {
            op: FakeOp::Record { event: e.0 },
            started: false,
        });
        advance(&mut s);
        Ok(())
    }

    fn query_event(&self, e: RawEvent) -> Result<bool, GpuError> {
        FakeProbe {
            ctl: self.ctl.clone(),
        }
        .query(e)
    }

    fn event_probe(&self) -> Arc<dyn EventProbe> {
        Arc::new(FakeProbe {
            ctl: self.ctl.clone(),
        })
    }

    unsafe fn copy_h2d(
        &mut self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.h2d(dst, src, bytes, true)
    }

    unsafe fn copy_h2d_pageable(
        &mut self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.h2d(dst, src, bytes, false)
    }

    unsafe fn copy_d2h(
        &mut self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.d2h(dst, src, bytes, true)
    }

    unsafe fn copy_d2h_pageable(
        &mut self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.d2h(dst, src, bytes, false)
    }

    fn peer_id(&self) -> Option<u64> {
        let id = Arc::as_ptr(&self.ctl.state) as u64;
        fake_peers()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, Arc::downgrade(&self.ctl.state));
        Some(id)
    }

    fn enable_peer(&mut self, peer: u64, _ordinal: u32) -> Result<bool, GpuError> {
        let peers = fake_peers().lock().unwrap_or_else(|p| p.into_inner());
        Ok(peers.get(&peer).is_some_and(|w| w.strong_count() > 0))
    }

    /// The peer's bytes as they are when the copy is enqueued (the fake's ops run as they are
    /// enqueued in its automatic mode, which the split tests use).
    unsafe fn copy_from_peer(
        &mut self,
        dst: DevicePtr,
        peer: u64,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), GpuError> {
        let state = fake_peers()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&peer)
            .and_then(|w| w.upgrade())
            .ok_or_else(|| GpuError::InvalidArgument("no such peer device".into()))?;
        let data = {
            let mut ps = state.0.lock().unwrap_or_else(|p| p.into_inner());
            let p = resolve(&mut ps, src.0, bytes).ok_or_else(|| {
                GpuError::InvalidArgument("peer copy: source outside an allocation".into())
            })?;
            // SAFETY: resolve checked that `bytes` bytes from p lie in one live allocation.
            unsafe { std::slice::from_raw_parts(p, bytes) }.to_vec()
        };
        let mut s = self.lock();
        stream_check(&s)?;
        s.log.push("copy from peer".into());
        s.queue.push_back(Queued {
            op: FakeOp::Write { dst: dst.0, data },
            started: false,
        });
        advance(&mut s);
        Ok(())
    }

    unsafe fn wait_event(&mut self, _e: RawEvent) -> Result<(), GpuError> {
        // One queue per fake device, run in order as enqueued: nothing to wait for.
        stream_check(&self.lock())
    }

    unsafe fn copy_d2d(
        &mut self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), GpuError> {
        let mut s = self.lock();
        stream_check(&s)?;
        let op = FakeOp::D2D {
            dst: dst.0,
            src: src.0,
            len: bytes,
        };
        if let Some(c) = s.capture.as_mut() {
            c.push(op);
            s.log.push("capture copy d2d".into());
            return Ok(());
        }
        s.queue.push_back(Queued { op, started: false });
        advance(&mut s);
        Ok(())
    }

    fn load_module(&mut self, image: &[u8]) -> Result<RawModule, GpuError> {
        let mut s = self.lock();
        fail(&mut s, "load_module")?;
        let text = String::from_utf8_lossy(image);
        let mut names = Vec::new();
        for d in declarations(&text) {
            s.signatures.insert(d.name.clone(), widths_of(&d.params));
            names.push(d.name);
        }
        let h = s.next_handle;
        s.next_handle += 1;
        s.modules.insert(h, names);
        Ok(RawModule(h))
    }

    fn get_function(&mut self, m: RawModule, name: &str) -> Result<RawFunction, GpuError> {
        let mut s = self.lock();
        let known = s
            .modules
            .get(&m.0)
            .is_some_and(|n| n.iter().any(|k| k == name));
        if !known {
            return Err(GpuError::Runtime(RuntimeError {
                backend: RuntimeKind::Fake,
                call: "get_function",
                code: 500,
                message: format!("no kernel {name}"),
            }));
        }
        let h = s.next_handle;
        s.next_handle += 1;
        s.functions.insert(h, name.to_string());
        Ok(RawFunction(h))
    }

    unsafe fn unload_module(&mut self, m: RawModule) -> Result<(), GpuError> {
        let mut s = self.lock();
        s.log.push("unload_module".into());
        s.modules.remove(&m.0);
        Ok(())
    }

    unsafe fn launch(
        &mut self,
        f: RawFunction,
        grid: [u32; 3],
        _block: [u32; 3],
        _shared_bytes: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), GpuError> {
        let mut s = self.lock();
        stream_check(&s)?;
        fail(&mut s, "launch")?;
        let name = s.functions.get(&f.0).cloned().ok_or_else(|| {
            GpuError::Runtime(RuntimeError {
                backend: RuntimeKind::Fake,
                call: "launch",
                code: 98,
                message: "invalid device function".into(),
            })
        })?;
        // Kernels the fake does not emulate (the inference kernels) run as no-ops; their
        // parameters are still read with the widths their source declares.
        let parsed = s.signatures.get(&name).cloned();
        let arity = kernel_arity(&name)
            .or(parsed.as_ref().map(|w| w.len()))
            .ok_or_else(|| {
                GpuError::InvalidArgument(format!("the fake device does not implement {name}"))
            })?;
        let widths = match kernel_arity(&name) {
            Some(_) => kernel_widths(&name),
            None => parsed.unwrap_or_default(),
        };
        if params.len() != arity {
            return Err(GpuError::InvalidArgument(format!(
                "fake: {name} takes {arity} parameters, got {}",
                params.len()
            )));
        }
        let args: Vec<u64> = params
            .iter()
            .zip(widths)
            .map(|(p, w)| {
                // SAFETY: the caller's params point at values at least `w` bytes wide.
                unsafe {
                    if w == 4 {
                        std::ptr::read_unaligned(*p as *const u32) as u64
                    } else {
                        std::ptr::read_unaligned(*p as *const u64)
                    }
                }
            })
            .collect();
        let _ = grid;
        if let Some(c) = s.capture.as_mut() {
            c.push(FakeOp::Kernel {
                name: name.clone(),
                args,
            });
            s.log.push(format!("capture {name}"));
            return Ok(());
        }
        s.log.push(format!("launch {name}"));
        s.queue.push_back(Queued {
            op: FakeOp::Kernel { name, args },
            started: false,
        });
        advance(&mut s);
        Ok(())
    }

    fn blas_availability(&self) -> BlasAvailability {
        if self.lock().script.blas {
            BlasAvailability::Present {
                library: "fakeBLAS".into(),
            }
        } else {
            BlasAvailability::Absent {
                reason: "the fake device has no BLAS in this script".into(),
            }
        }
    }

    fn create_blas(&mut self) -> Result<RawBlas, GpuError> {
        let mut s = self.lock();
        s.blas_handles += 1;
        Ok(RawBlas(s.blas_handles))
    }

    fn blas_stream_is_ours(&self, _h: RawBlas) -> Result<bool, GpuError> {
        Ok(self.lock().stream_alive)
    }

    unsafe fn blas_set_workspace(
        &mut self,
        _h: RawBlas,
        ptr: DevicePtr,
        bytes: u64,
    ) -> Result<(), GpuError> {
        let mut s = self.lock();
        if resolve(&mut s, ptr.0, bytes as usize).is_none() {
            return Err(GpuError::InvalidArgument(
                "fake: workspace outside memory".into(),
            ));
        }
        Ok(())
    }

    unsafe fn sgemm(&mut self, _h: RawBlas, g: &GemmF32) -> Result<(), GpuError> {
        let mut s = self.lock();
        stream_check(&s)?;
        s.queue.push_back(Queued {
            op: FakeOp::Gemm(*g),
            started: false,
        });
        advance(&mut s);
        Ok(())
    }

    unsafe fn destroy_blas(&mut self, _h: RawBlas) -> Result<(), GpuError> {
        let mut s = self.lock();
        s.log.push("destroy_blas".into());
        s.blas_handles = s.blas_handles.saturating_sub(1);
        Ok(())
    }

    fn graph_support(&self) -> Result<(), String> {
        if self.lock().script.graphs {
            Ok(())
        } else {
            Err("the fake device was scripted without graphs".into())
        }
    }

    fn begin_capture(&mut self) -> Result<(), GpuError> {
        let mut s = self.lock();
        stream_check(&s)?;
        fail(&mut s, "begin_capture")?;
        if !s.script.graphs || s.capture.is_some() {
            return Err(GpuError::InvalidArgument("fake: cannot capture".into()));
        }
        s.capture = Some(Vec::new());
        Ok(())
    }

    fn end_capture(&mut self) -> Result<RawGraph, GpuError> {
        let mut s = self.lock();
        let ops = s
            .capture
            .take()
            .ok_or_else(|| GpuError::InvalidArgument("fake: not capturing".into()))?;
        fail(&mut s, "end_capture")?;
        s.next_handle += 1;
        let h = s.next_handle;
        s.log.push(format!("graph {h}: {} ops", ops.len()));
        s.graphs.insert(h, ops);
        Ok(RawGraph(h))
    }

    unsafe fn launch_graph(&mut self, g: RawGraph) -> Result<(), GpuError> {
        let mut s = self.lock();
        stream_check(&s)?;
        fail(&mut s, "launch_graph")?;
        let ops = s
            .graphs
            .get(&g.0)
            .cloned()
            .ok_or_else(|| GpuError::InvalidArgument(format!("fake: no graph {}", g.0)))?;
        s.log.push(format!("launch graph {}", g.0));
        for op in ops {
            s.queue.push_back(Queued { op, started: false });
        }
        advance(&mut s);
        Ok(())
    }

    unsafe fn destroy_graph(&mut self, g: RawGraph) -> Result<(), GpuError> {
        self.lock().graphs.remove(&g.0);
        Ok(())
    }

    unsafe fn destroy_stream(&mut self) -> Result<(), GpuError> {
        let mut s = self.lock();
        s.log.push("destroy_stream".into());
        if !s.queue.is_empty() {
            return Err(GpuError::InvalidArgument(format!(
                "fake: stream destroyed with {} ops queued",
                s.queue.len()
            )));
        }
        s.stream_alive = false;
        Ok(())
    }
}

/// The fake's "compiler": the code object is the source text (the fake reads kernel names
/// from it).
pub struct FakeCompiler;

impl KernelCompiler for FakeCompiler {
    fn backend(&self) -> RuntimeKind {
        RuntimeKind::Fake
    }

    fn id(&self) -> String {
        "fake compiler 1".into()
    }

    fn options(&self, _arch: &str) -> Vec<String> {
        Vec::new()
    }

    fn check_target(&self, _arch: &str) -> Result<(), GpuError> {
        Ok(())
    }

    fn compile(&self, _name: &str, source: &str, _arch: &str) -> Result<Vec<u8>, GpuError> {
        Ok(source.as_bytes().to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_widths_come_from_the_kernel_source() {
        for src in crate::gpu::kernels::embedded_sources() {
            for k in crate::gpu::kernels::kernel_names(&src.text) {
                let parsed = param_widths(&src.text, &k).expect("signature");
                if kernel_arity(&k).is_some() {
                    assert_eq!(parsed, kernel_widths(&k), "{k}");
                }
            }
        }
        assert_eq!(
            param_widths(
                "HS_KERNEL void k(HS_TRACK_PARAMS, const float *x, hs_u64 n, float e)",
                "k"
            ),
            Some(vec![8, 8, 8, 8, 4])
        );
        // A kernel generated per type by a family macro over the host's type list.
        let family = "#define L(X) X(q4_0, 32)\n#define F(T, BL) \\\n    HS_KERNEL void hs_a_##T(HS_TRACK_PARAMS, hs_u64 n, \\\n        hs_u32 m) {}\nL(F)\n";
        assert_eq!(param_widths(family, "hs_a_q4_0"), Some(vec![8, 8, 8, 4]));
    }
}
