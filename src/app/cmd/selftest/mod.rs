//! `hipscope selftest`: runs the GPU mechanisms with real kernels on whatever GPU is there and
//! prints what it saw — queue depth under a burst, the watchdog on a kernel that waits for the
//! host, HUNG and the hard-exit quit (in a child process), a normal quit (in a child process),
//! upload verification catching a zeroed tensor, no device allocation in a steady-state decode
//! loop, and what tracking costs on a decode step — the engine's own GPU forward pass on a
//! synthetic SmolLM2-135M (Q4_0), checked against the CPU backend.
//!
//! `setup.rs`: options, the result row, opening the device; `mechanisms.rs`: burst, watchdog,
//! GEMM, upload checks; `decode.rs`: steady state and tracking overhead; `child.rs`: the
//! child-process scenarios (hang, quit); `chat_hang.rs`: the chat's worker and watchdog with a
//! stuck kernel injected during load, prompt processing and decode (children too);
//! `compute.rs`: `selftest --compute`.

mod chat_hang;
mod child;
pub mod compute;
mod decode;
mod gemm_f16;
mod mechanisms;
mod setup;

use std::path::PathBuf;

use clap::Args;

use std::sync::Mutex;
use std::sync::mpsc::channel;
use std::time::Duration;

use crate::app::cmd::usage::{outln, stdout_gone};
use crate::app::exit_code;
use crate::app::stderr::errln;
use crate::gpu::arena::{ArenaPlan, Region};
use crate::gpu::device::human_bytes;
use crate::gpu::handle::GemmPath;
use crate::gpu::select::BackendChoice;
use crate::gpu::watchdog::{WatchConfig, WatchEvent, Watchdog};

use child::*;
use compute::ComputeCheckOptions;
use decode::DecodeModel;
use mechanisms::*;
pub use setup::SelftestOptions;
use setup::*;

#[derive(Args, Debug, Clone)]
pub struct SelftestArgs {
    /// auto, hip, cuda (the CPU has nothing to test).
    #[arg(long, default_value = "auto", value_parser = parse_backend)]
    pub backend: BackendChoice,
    /// Device number as the runtime counts (default: the largest discrete GPU).
    #[arg(long)]
    pub device: Option<u32>,
    /// Decode steps per round of the overhead measurement.
    #[arg(long, default_value_t = 100)]
    pub steps: usize,
    /// Compile kernels afresh instead of using the on-disk cache.
    #[arg(long)]
    pub no_cache: bool,
    /// Check the GPU forward pass against the CPU backend on synthetic models (and --model
    /// files) instead of the mechanisms.
    #[arg(long)]
    pub compute: bool,
    /// With --compute: synthetic shapes (default tiny,tiny-qwen2,tiny-llama3,smollm2-135m,
    /// tiny-qwen3,tiny-gemma2,tiny-gemma3,tiny-phi3,mixtral-tiny-2l,tiny-qwen3moe,tiny-gpt-oss,
    /// gpt-oss-20b-2l; the last in Q8_0 and Q4_K only).
    #[arg(long, value_delimiter = ',', requires = "compute")]
    pub shapes: Vec<String>,
    /// With --compute: weight types (default F32,F16,Q4_0,Q4_1,Q8_0,Q4_K,Q6_K).
    #[arg(long, value_delimiter = ',', requires = "compute")]
    pub quants: Vec<String>,
    /// With --compute: real GGUF files to check as well.
    #[arg(short = 'm', long = "model", requires = "compute")]
    pub models: Vec<PathBuf>,
    /// With --compute: compare every op of every case (a per-op error table).
    #[arg(long, requires = "compute")]
    pub ops: bool,
    /// With --compute: split each model between the GPU and the CPU as `-ngl N` does (llama.cpp's
    /// count; also `-ngl`).
    #[arg(long = "n-gpu-layers", visible_alias = "ngl", value_name = "N|auto", requires = "compute",
          value_parser = crate::model::split::parse_gpu_layers)]
    pub n_gpu_layers: Option<crate::model::split::GpuLayers>,
    /// With --compute: the split case, each model over every GPU of the runtime (`layer`), in
    /// proportion to free memory or to --tensor-split.
    #[arg(long = "split-mode", value_name = "none|layer", requires = "compute",
          value_parser = crate::model::split::parse_split_mode)]
    pub split_mode: Option<crate::model::split::SplitMode>,
    /// With --compute and --split-mode layer: each GPU's share of the layers, such as 1,1.
    #[arg(long = "tensor-split", value_name = "A,B,…", requires = "compute",
          value_parser = crate::model::split::parse_tensor_split)]
    pub tensor_split: Option<crate::model::split::TensorSplit>,
    /// With --compute and -ngl: a prompt batch's CPU layers stay on the CPU (llama.cpp's
    /// --no-op-offload); by default they run on the GPU with their weights streamed up.
    #[arg(long = "no-op-offload", requires = "compute")]
    pub no_op_offload: bool,
    /// Internal: run one scenario as a child process (`hang`, `quit`, `chat-hang:PHASE`).
    #[arg(long, hide = true)]
    pub child: Option<String>,
}

fn parse_backend(s: &str) -> Result<BackendChoice, String> {
    s.parse()
}

/// `hipscope selftest`.
pub fn selftest(args: &SelftestArgs) -> i32 {
    if args.compute {
        let or_default = |v: &Vec<String>, d: &[&str]| -> Vec<String> {
            if v.is_empty() {
                d.iter().map(|s| s.to_string()).collect()
            } else {
                v.clone()
            }
        };
        return compute::run(&ComputeCheckOptions {
            backend: args.backend,
            device: args.device,
            no_cache: args.no_cache,
            shapes: or_default(&args.shapes, compute::SHAPES),
            quants: or_default(&args.quants, compute::QUANTS),
            files: args.models.clone(),
            ops: args.ops,
            gpu_layers: args.n_gpu_layers,
            split: {
                // Op offload's smallest batch as every command takes it from the environment.
                let mut s = crate::model::split::SplitOptions::default();
                if let Err(e) =
                    crate::app::settings::split_from_env(&mut s, &|k| std::env::var_os(k))
                {
                    errln!("hipscope selftest: {e}");
                    return 2;
                }
                crate::model::split::SplitOptions {
                    mode: args.split_mode.unwrap_or_default(),
                    tensor_split: args.tensor_split.clone(),
                    main_gpu: None,
                    no_op_offload: args.no_op_offload,
                    offload_min_batch: s.offload_min_batch,
                }
            },
        });
    }
    run(&SelftestOptions {
        backend: args.backend,
        device: args.device,
        steps: args.steps,
        no_cache: args.no_cache,
        child: args.child.clone(),
    })
}

/// The entry point: parent run, or one of the child scenarios.
pub fn run(opts: &SelftestOptions) -> i32 {
    match opts.child.as_deref() {
        Some("hang") => return child_hang(opts),
        Some("quit") => return child_quit(opts),
        Some(s) if s.starts_with("chat-hang:") => {
            return chat_hang::child_chat_hang(opts, &s["chat-hang:".len()..]);
        }
        Some(other) => {
            errln!("hipscope selftest: unknown child scenario {other:?}");
            return exit_code::USAGE;
        }
        None => {}
    }
    // The decode overhead check measures tracing as `--trace` runs it: with the stamped build.
    // Its other modes and the other checks run that build too: it differs from the ordinary one
    // only in the breadcrumb's guard, and tracking's own cost (the breadcrumb store, the table)
    // is the same in both.
    crate::gpu::trace::ask_stamped_kernels();
    outln!("hipscope selftest");
    if stdout_gone() {
        // Nobody reads the results (`| head`): end quietly, before any device is opened.
        return exit_code::OK;
    }
    let (mut gpu, _) = match open(opts, false) {
        Ok(g) => g,
        Err(e) => {
            errln!("hipscope selftest: {e}");
            return exit_code::USAGE;
        }
    };
    let plan = ArenaPlan::new()
        .with(Region::Weights, 4 << 20)
        .with(Region::Activations, 8 << 20);
    if let Err(e) = gpu.create_arena(&plan) {
        errln!("hipscope selftest: {e}");
        return exit_code::USAGE;
    }
    match gpu.gemm_path() {
        GemmPath::Blas { library } => {
            outln!("gemm      {library} (bound to our stream, device pointer mode)")
        }
        GemmPath::Fallback { reason } => outln!("gemm      hipscope hs_sgemm ({reason})"),
        GemmPath::NotReady => outln!("gemm      not ready"),
    }
    outln!("graphs    {}", gpu.graph_mode().describe());

    match crate::app::settings::Tuning::from_env(&|k| std::env::var_os(k))
        .map_err(|e| e.to_string())
        .and_then(|(t, _)| crate::gpu::compute::choose_prefill(t.prefill, &gpu))
    {
        Ok(p) => outln!("prefill   {p}"),
        Err(e) => outln!("prefill   {e}"),
    }
    gpu.start_event_prober(PROBE_INTERVAL);
    let (tx, rx) = channel::<WatchEvent>();
    let tx = Mutex::new(tx);
    let cfg = WatchConfig {
        tick: Duration::from_millis(10),
        ..WatchConfig::default()
    };
    let dog = Watchdog::spawn(
        gpu.stream_shared(),
        gpu.info(),
        cfg,
        Box::new(move |ev| {
            if let Ok(t) = tx.lock() {
                let _ = t.send(ev);
            }
        }),
    );
    let dog = match dog {
        Ok(d) => d,
        Err(e) => {
            errln!("hipscope selftest: cannot start the watchdog: {e}");
            return exit_code::USAGE;
        }
    };
    let mut rows = Vec::new();
    outln!();
    rows.push(row("queue depth under a burst", burst(&mut gpu)));
    rows.push(row(
        "watchdog SLOW, then OK on release",
        slow_then_release(&mut gpu, &rx),
    ));
    rows.push(row("gemm: hs_sgemm and BLAS vs CPU", gemm(&mut gpu)));
    rows.push(row(
        "gemm f16: own kernel and BLAS vs CPU",
        gemm_f16::gemm_f16(&mut gpu),
    ));
    rows.push(row("upload verification", verify(&mut gpu)));
    match DecodeModel::open(opts) {
        Ok(mut model) => {
            if let Some(a) = model.arena() {
                outln!(
                    "arena     {} capacity, {} used, high-water {}, largest free {}, {} device \
                     allocations, runtime overhead {}, device {} free of {}, pinned host {}",
                    human_bytes(a.capacity),
                    human_bytes(a.used),
                    human_bytes(a.high_water),
                    human_bytes(a.largest_free),
                    a.device_allocations,
                    a.runtime_overhead
                        .map(human_bytes)
                        .unwrap_or_else(|| "?".into()),
                    a.device_free.map(human_bytes).unwrap_or_else(|| "?".into()),
                    a.device_total
                        .map(human_bytes)
                        .unwrap_or_else(|| "?".into()),
                    human_bytes(a.pinned_host_bytes),
                );
                let regions: Vec<String> = a
                    .regions
                    .iter()
                    .map(|r| {
                        format!(
                            "{} {}/{}",
                            r.name,
                            human_bytes(r.used),
                            human_bytes(r.capacity)
                        )
                    })
                    .collect();
                outln!("          regions: {}", regions.join(", "));
            }
            rows.push(row(
                "no device allocation in steady state",
                decode::steady(&mut model, opts.steps),
            ));
            let mut over = row(
                "tracking overhead (decode step)",
                decode::overhead(&mut model, opts.steps),
            );
            if let Err(e) = model.shutdown() {
                over.pass = false;
                over.detail = format!("{}; {e}", over.detail);
            }
            rows.push(over);
        }
        Err(e) => rows.push(Row {
            check: "decode step (GPU forward pass)",
            pass: false,
            detail: e,
        }),
    }
    let hung_seen = rx
        .try_iter()
        .filter(|e| matches!(e, WatchEvent::Hung { .. }))
        .count();
    rows.push(Row {
        check: "watchdog quiet under normal load",
        pass: hung_seen == 0,
        detail: format!("{hung_seen} HUNG event(s) during the checks above"),
    });
    dog.stop();
    let outcome = gpu.teardown(Duration::from_secs(5), &mut |_| {});
    rows.push(Row {
        check: "teardown of this process's device",
        pass: outcome.clean,
        detail: format!(
            "{} steps, {}",
            outcome.steps.len(),
            outcome.reason.as_deref().unwrap_or("all done")
        ),
    });
    outln!();
    rows.push(child_row("hang → HUNG → hard exit (child)", "hang", opts));
    rows.push(child_row("normal quit (child)", "quit", opts));
    for (check, phase) in [
        ("chat, hang in load: HUNG, report, quit", "load"),
        ("chat, hang in prefill: HUNG, report, quit", "prompt"),
        ("chat, hang in decode: HUNG, report, quit", "decode"),
        (
            "chat, hang inside a decode graph: HUNG by name",
            "decode+graphs",
        ),
    ] {
        rows.push(child_row(check, &format!("chat-hang:{phase}"), opts));
    }
    outln!();
    outln!("{:<40} {:<6} detail", "check", "result");
    outln!("{}", "-".repeat(100));
    for r in &rows {
        outln!(
            "{:<40} {:<6} {}",
            r.check,
            if r.pass { "PASS" } else { "FAIL" },
            r.detail
        );
    }
    let failed = rows.iter().filter(|r| !r.pass).count();
    outln!();
    if stdout_gone() {
        return exit_code::OK;
    }
    if failed == 0 {
        outln!("all {} checks passed", rows.len());
        0
    } else {
        outln!("{failed} of {} checks failed", rows.len());
        1
    }
}
