//! The steady-state checks on the engine's own decode step: the GPU forward pass (`GpuCompute`
//! under `model::forward::Model`, as chat runs it, f16 KV cache) on a synthetic SmolLM2-135M in
//! Q4_0 built in memory. No device allocation in a decode loop, logits finite, the same in every
//! step and equal to the CPU backend's; and what tracking costs per decode step.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::app::cmd::usage::outln;
use crate::gpu::compute::lockstep::rel_l2;
use crate::gpu::compute::{GpuCompute, KvType};
use crate::gpu::cpu::CpuBackend;
use crate::gpu::device::human_bytes;
use crate::gpu::handle::Gpu;
use crate::gpu::snapshot::{ArenaSnapshot, DeviceRelease};
use crate::gpu::trace;
use crate::model::forward::{Logits, Model};
use crate::model::gguf::GgufFile;
use crate::model::loader;
use crate::model::protocol::ModelSource;
use crate::model::sampler::Rng;

use super::compute::{ComputeCheckOptions, end_to_end_tolerance, model_options, open_gpu};
use super::setup::SelftestOptions;

/// The model: the shape and weight type chat's default model has.
pub(super) const SHAPE: &str = "smollm2-135m";
pub(super) const QUANT: &str = "Q4_0";
/// Prompt tokens before the measured decode step (which runs at position `PROMPT`, again and
/// again: each run writes the same cache row, so every run computes the same logits).
const PROMPT: usize = 16;

/// A loaded GPU model, the decode step's token and the CPU backend's logits for that step.
pub(super) struct DecodeModel {
    model: Model,
    file: Arc<GgufFile>,
    token: u32,
    cpu_logits: Vec<f32>,
}

/// The `Gpu` under a model whose backend is a `GpuCompute`.
fn runtime(m: &mut Model) -> Result<&mut Gpu, String> {
    m.backend_mut()
        .as_any_mut()
        .and_then(|a| a.downcast_mut::<GpuCompute>())
        .and_then(|g| g.runtime_mut())
        .ok_or_else(|| "the model's backend is not a live GPU".to_string())
}

impl DecodeModel {
    /// Builds the model, loads it on the GPU and on the CPU, runs the prompt on both and the
    /// decode step once on the CPU (the reference).
    pub(super) fn open(opts: &SelftestOptions) -> Result<DecodeModel, String> {
        let source = ModelSource::Synthetic {
            shape: SHAPE.into(),
            quant: QUANT.into(),
            seed: 7,
        };
        let file = loader::open(&source, &mut |_, _| {})
            .map_err(|e| format!("building {SHAPE} {QUANT}: {e}"))?;
        let o = ComputeCheckOptions {
            backend: opts.backend,
            device: opts.device,
            no_cache: opts.no_cache,
            shapes: Vec::new(),
            quants: Vec::new(),
            files: Vec::new(),
            ops: false,
            gpu_layers: None,
            split: Default::default(),
        };
        // The cache type chat uses (the compute options' default).
        let gpu = open_gpu(&o, KvType::F16)?;
        let load = |b: Box<dyn crate::gpu::backend::Backend>| {
            Model::load(file.clone(), b, model_options(), &mut |_, _| {}).map_err(|e| e.to_string())
        };
        let mut model = load(Box::new(gpu))?;
        let mut cpu = match load(Box::new(CpuBackend::new(0))) {
            Ok(c) => c,
            Err(e) => {
                let _ = model
                    .backend_mut()
                    .shutdown(Duration::from_secs(5), &mut |_| {});
                return Err(e);
            }
        };
        let vocab = model.config.vocab_size as u64;
        let mut rng = Rng::new(0x5eed);
        let toks: Vec<u32> = (0..=PROMPT)
            .map(|_| (rng.next_u64() % vocab) as u32)
            .collect();
        let mut d = DecodeModel {
            model,
            file,
            token: toks[PROMPT],
            cpu_logits: Vec::new(),
        };
        let r = (|| {
            let mut out = Vec::new();
            cpu.forward(&toks[..PROMPT], 0, Logits::Last, &mut out)
                .map_err(|e| format!("cpu prompt: {e}"))?;
            cpu.forward(&toks[PROMPT..], PROMPT, Logits::Last, &mut d.cpu_logits)
                .map_err(|e| format!("cpu decode: {e}"))?;
            d.model
                .forward(&toks[..PROMPT], 0, Logits::Last, &mut out)
                .map_err(|e| format!("gpu prompt: {e}"))
        })();
        match r {
            Ok(()) => Ok(d),
            Err(e) => {
                let _ = d.shutdown();
                Err(e)
            }
        }
    }

    /// One decode step at position `PROMPT`; the logits in `out`.
    fn step(&mut self, out: &mut Vec<f32>) -> Result<(), String> {
        self.model
            .forward(&[self.token], PROMPT, Logits::Last, out)
            .map_err(|e| format!("gpu decode: {e}"))
    }

    pub(super) fn arena(&mut self) -> Option<ArenaSnapshot> {
        runtime(&mut self.model).ok()?.arena_snapshot()
    }

    /// Ops the stream enqueues per decode step (launches, copies, events).
    fn ops_per_step(&mut self) -> Result<u64, String> {
        let before = runtime(&mut self.model)?.stream_snapshot().enqueued;
        let mut out = Vec::new();
        self.step(&mut out)?;
        Ok(runtime(&mut self.model)?.stream_snapshot().enqueued - before)
    }

    /// The quit protocol's device half; an error when the device had to be abandoned.
    pub(super) fn shutdown(&mut self) -> Result<(), String> {
        match self
            .model
            .backend_mut()
            .shutdown(Duration::from_secs(5), &mut |_| {})
        {
            DeviceRelease::Clean => Ok(()),
            _ => Err("GPU shutdown was not clean (the device had to be abandoned)".into()),
        }
    }
}

/// Device free memory, backend allocation calls, arena allocations.
fn counters(m: &mut Model) -> Result<(u64, u64, u64), String> {
    let g = runtime(m)?;
    g.wait_idle(Duration::from_secs(10))
        .map_err(|e| e.to_string())?;
    let free = g.mem_info().map_err(|e| e.to_string())?.free;
    let arena = g
        .arena_snapshot()
        .map(|a| a.device_allocations)
        .unwrap_or(0);
    Ok((free, g.device_allocations(), arena))
}

pub(super) fn steady(d: &mut DecodeModel, steps: usize) -> Result<(bool, String), String> {
    let mut first = Vec::new();
    // Warm up (first launches may load code lazily), then measure.
    d.step(&mut first)?;
    let mut out = Vec::new();
    for _ in 0..4 {
        d.step(&mut out)?;
    }
    let (free0, allocs0, arena0) = counters(&mut d.model)?;
    let n = steps.max(50) * 2;
    let (mut differ, mut non_finite) = (0usize, 0usize);
    for _ in 0..n {
        d.step(&mut out)?;
        if out.iter().any(|x| !x.is_finite()) {
            non_finite += 1;
        }
        if out.len() != first.len()
            || out
                .iter()
                .zip(&first)
                .any(|(a, b)| a.to_bits() != b.to_bits())
        {
            differ += 1;
        }
    }
    let (free1, allocs1, arena1) = counters(&mut d.model)?;
    let ops = d.ops_per_step()?;
    let e = rel_l2(&out, &d.cpu_logits);
    let bound = end_to_end_tolerance(&d.file);
    let pass = free0 == free1
        && allocs0 == allocs1
        && arena0 == arena1
        && non_finite == 0
        && differ == 0
        && e <= bound;
    Ok((
        pass,
        format!(
            "{n} steps × {ops} ops ({SHAPE} {QUANT}, f16 KV): device free memory {} → {} (Δ {}), \
             backend allocation calls {allocs0} → {allocs1}, arena allocations {arena0} → \
             {arena1}; logits finite in {} of {n} steps, bit-identical in {} of {n}, vs CPU \
             backend ‖Δ‖/‖cpu‖ {e:.1e} (bound {bound:.0e})",
            human_bytes(free0),
            human_bytes(free1),
            free0 as i64 - free1 as i64,
            n - non_finite,
            n - differ,
        ),
    ))
}

pub(super) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

/// What tracking may cost, decode step replayed as a graph: a share of the step.
const GRAPHS_LIMIT_PCT: f64 = 3.0;

/// What tracking may cost, launch by launch: microseconds per launch. Without graphs the step of
/// this small model is launch-bound (276 launches of kernels shorter than their launch, 4–5 µs
/// of host time each on an H100 or H200: `docs/runs/`), so a fixed cost per launch reads as a
/// share of the launch rather than of the model's work, and that share moved from +1.2% to +5.9%
/// between runs of the same code. Per launch is what every model pays (the breadcrumb's store to
/// host memory, the in-flight table's entry); the limit is a tenth of a launch's own host cost,
/// under 3% of the step of any model whose kernels take 17 µs or more each.
const NO_GRAPHS_LIMIT_US_PER_OP: f64 = 0.5;

pub(super) fn overhead(d: &mut DecodeModel, steps: usize) -> Result<(bool, String), String> {
    // Measured with the decode step replayed as a graph (as chat runs it where the runtime has
    // graphs: limit 3% of the step) and launch by launch (limit 0.5 µs per launch).
    let graphs_on = runtime(&mut d.model)?.graph_mode().is_on();
    let mut pass = true;
    let mut details = Vec::new();
    for graphs in [true, false] {
        if graphs && !graphs_on {
            details.push(format!(
                "graphs: not measured ({})",
                runtime(&mut d.model)?.graph_mode().describe()
            ));
            continue;
        }
        runtime(&mut d.model)?
            .set_graphs(graphs, "off for the launch-by-launch measurement")
            .map_err(|e| e.to_string())?;
        let r = overhead_in_mode(d, steps, graphs);
        if let Ok(g) = runtime(&mut d.model) {
            let _ = g.set_graphs(graphs_on, "turned off");
        }
        let (ok, detail) = r?;
        pass &= ok;
        details.push(detail);
    }
    Ok((pass, details.join("; ")))
}

fn overhead_in_mode(
    d: &mut DecodeModel,
    steps: usize,
    graphs: bool,
) -> Result<(bool, String), String> {
    let mode = if graphs { "graphs" } else { "no graphs" };
    let mut out = Vec::new();
    let steps = steps.max(20);
    // Modes: tracking off; on (table, breadcrumbs, an event every 64 ops), as chat runs it; on
    // without breadcrumbs (to show what they cost apart from the table); on with the tracer
    // collecting (each kernel's stamps, timed events around the other ops, read back, the
    // profile built: what `--trace`, `/trace` and the Profile panel cost). The compute path has no per-layer event option, so
    // there is no "event per layer" mode to measure.
    let modes: [(&str, bool, bool, bool); 4] = [
        ("off", false, false, false),
        ("on", true, true, false),
        ("on, no crumbs", true, false, false),
        ("on, tracing", true, true, true),
    ];
    let mut times: [Vec<f64>; 4] = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    let r = (|| {
        for round in 0..7 {
            for (mi, (_, tracking, crumbs, traced)) in modes.iter().enumerate() {
                let g = runtime(&mut d.model)?;
                g.set_tracking(*tracking);
                g.set_breadcrumbs(*crumbs);
                if *traced {
                    trace::enable_profile(trace::profile::DEFAULT_STEPS, None);
                } else {
                    trace::disable_profile();
                }
                for _ in 0..5 {
                    d.step(&mut out)?;
                }
                for _ in 0..steps {
                    let t = Instant::now();
                    d.step(&mut out)?;
                    if round > 0 {
                        times[mi].push(t.elapsed().as_secs_f64() * 1e6);
                    }
                }
            }
        }
        Ok::<(), String>(())
    })();
    trace::disable_profile();
    if let Ok(g) = runtime(&mut d.model) {
        g.set_breadcrumbs(true);
        g.set_tracking(true);
    }
    r?;
    let ops = d.ops_per_step()?;
    let med: Vec<f64> = times.iter_mut().map(|t| median(t)).collect();
    let pct = |x: f64| (x - med[0]) / med[0] * 100.0;
    outln!(
        "overhead  decode step, {mode} ({SHAPE} {QUANT}: {ops} ops incl. the logits download), \
         median of {} steps per mode:",
        times[0].len()
    );
    for (i, (name, _, _, _)) in modes.iter().enumerate() {
        outln!(
            "          tracking {name:<16} {:>8.1} µs/step  {:>6.2} µs/op  {:+.2}%",
            med[i],
            med[i] / ops as f64,
            pct(med[i])
        );
    }
    outln!(
        "          tracking on+layer events  not measured: the compute path records no per-layer \
         events (only the stream's event every 64 ops, included in \"on\")"
    );
    // The limit applies to tracking as the app runs it (breadcrumbs, table, an event per 64 ops):
    // with graphs a share of the step, launch by launch a cost per launch (see the limits'
    // constants); tracing's own limit is 5% of the step as tracking runs it.
    let tracing = (med[3] - med[1]) / med[1] * 100.0;
    let per_op_us = (med[1] - med[0]) / ops.max(1) as f64;
    let (tracking_ok, tracking) = if graphs {
        (
            pct(med[1]) < GRAPHS_LIMIT_PCT,
            format!("on {:+.2}% (limit {GRAPHS_LIMIT_PCT}%)", pct(med[1])),
        )
    } else {
        (
            per_op_us < NO_GRAPHS_LIMIT_US_PER_OP,
            format!(
                "on {per_op_us:+.3} µs/launch (limit {NO_GRAPHS_LIMIT_US_PER_OP} µs; {:+.2}% of \
                 this launch-bound step)",
                pct(med[1])
            ),
        )
    };
    Ok((
        tracking_ok && tracing < 5.0,
        format!(
            "{mode}: off {:.0} µs/step; {tracking}; without breadcrumbs {:+.2}%; \
             tracing {tracing:+.2}% over on (limit 5%)",
            med[0],
            pct(med[2])
        ),
    ))
}
