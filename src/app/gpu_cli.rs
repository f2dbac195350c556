//! The GPU subcommands: `hipscope selftest`, `hipscope kernels`, and the hidden
//! `hipscope __compile-kernels` that runs the kernel compiler in a child process.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use crate::app::selftest::{self, SelftestOptions};
use crate::app::selftest_compute::{self, ComputeCheckOptions};
use crate::gpu::device::{BackendKind, human_bytes};
use crate::gpu::kernels::{self, BuildStatus, CompileMode, KernelCache};
use crate::gpu::select::BackendChoice;

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
    /// With --compute: synthetic shapes (default tiny,tiny-qwen2,tiny-llama3,smollm2-135m).
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
    /// Internal: run one scenario as a child process (`hang`, `quit`).
    #[arg(long, hide = true)]
    pub child: Option<String>,
}

fn parse_backend(s: &str) -> Result<BackendChoice, String> {
    s.parse()
}

#[derive(Args, Debug, Clone)]
pub struct KernelsArgs {
    /// Compile every kernel and print a table (per kernel × arch).
    #[arg(long)]
    pub compile: bool,
    /// Targets, comma-separated: gfx1100,gfx1151 for HIP, sm_90 for CUDA.
    #[arg(long, value_delimiter = ',')]
    pub arch: Vec<String>,
    /// hip or cuda.
    #[arg(long, default_value = "hip")]
    pub backend: String,
    /// Compile afresh (no on-disk cache).
    #[arg(long)]
    pub no_cache: bool,
    /// Compile in this process instead of a child (a compiler abort then ends hipscope).
    #[arg(long)]
    pub in_process: bool,
}

#[derive(Args, Debug, Clone)]
pub struct CompileChildArgs {
    #[arg(long)]
    pub backend: String,
    #[arg(long)]
    pub arch: String,
    /// Directory holding the *.hip sources; code objects are written next to them.
    #[arg(long)]
    pub dir: PathBuf,
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
        return selftest_compute::run(&ComputeCheckOptions {
            backend: args.backend,
            device: args.device,
            no_cache: args.no_cache,
            shapes: or_default(&args.shapes, selftest_compute::SHAPES),
            quants: or_default(&args.quants, selftest_compute::QUANTS),
            files: args.models.clone(),
            ops: args.ops,
        });
    }
    selftest::run(&SelftestOptions {
        backend: args.backend,
        device: args.device,
        steps: args.steps,
        no_cache: args.no_cache,
        child: args.child.clone(),
    })
}

fn backend_kind(s: &str) -> Option<BackendKind> {
    match s {
        "hip" | "rocm" => Some(BackendKind::Hip),
        "cuda" => Some(BackendKind::Cuda),
        _ => None,
    }
}

/// `hipscope kernels`: lists the kernel sources, or with `--compile` compiles each for each
/// `--arch` and prints a table. Exit code 1 if any kernel failed.
pub fn kernels(args: &KernelsArgs) -> i32 {
    let sources = match kernels::sources() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("hipscope kernels: {e}");
            return 2;
        }
    };
    if !args.compile {
        // The names' column as wide as the longest, so that the lists line up.
        let w = sources.iter().map(|s| s.name.len()).max().unwrap_or(0);
        for s in &sources {
            println!(
                "{:<w$}  {}",
                s.name,
                kernels::kernel_names(&s.text).join(", ")
            );
        }
        return 0;
    }
    let Some(backend) = backend_kind(&args.backend) else {
        eprintln!("hipscope kernels: --backend must be hip or cuda");
        return 2;
    };
    if args.arch.is_empty() {
        eprintln!("hipscope kernels: --compile needs --arch (e.g. gfx1100,gfx1151 or sm_90)");
        return 2;
    }
    let compiler = match kernels::compiler_for(backend) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("hipscope kernels: {e}");
            return 2;
        }
    };
    let cache = if args.no_cache {
        KernelCache::disabled()
    } else {
        KernelCache::default_location()
    };
    let mode = if args.in_process || backend == BackendKind::Cuda {
        CompileMode::InProcess
    } else {
        CompileMode::isolated()
    };
    println!("compiler: {}", compiler.id());
    let mut all = Vec::new();
    for arch in &args.arch {
        let t = Instant::now();
        let builds = kernels::build_all(compiler.as_ref(), arch, &sources, &cache, &mode);
        println!("{arch}: {:.0} ms", t.elapsed().as_secs_f64() * 1e3);
        all.push(builds);
    }
    // The table: one row per kernel module, one column per arch.
    let w = 28;
    print!("{:<10}", "kernel");
    for a in &args.arch {
        print!(" {a:<w$}");
    }
    println!();
    for (i, s) in sources.iter().enumerate() {
        print!("{:<10}", s.name);
        for builds in &all {
            let b = &builds[i];
            let cell = match (&b.status, &b.image) {
                (BuildStatus::Compiled { millis }, Some(img)) => {
                    format!("ok {} {millis:.0} ms", human_bytes(img.len() as u64))
                }
                (BuildStatus::Cached, Some(img)) => {
                    format!("ok {} (cached)", human_bytes(img.len() as u64))
                }
                (BuildStatus::Failed(_), _) => "FAILED".to_string(),
                (BuildStatus::Crashed(_), _) => "CRASHED".to_string(),
                (BuildStatus::Refused(_), _) => "REFUSED".to_string(),
                (_, None) => "FAILED".to_string(),
            };
            print!(" {cell:<w$}");
        }
        println!();
    }
    let mut failed = 0;
    for builds in &all {
        for b in builds {
            let why = match &b.status {
                BuildStatus::Failed(log) => Some(format!("compile error:\n{log}")),
                BuildStatus::Crashed(s) => Some(format!("the compiler crashed: {s}")),
                BuildStatus::Refused(r) => Some(format!("refused: {r}")),
                _ => None,
            };
            if let Some(why) = why {
                failed += 1;
                println!("\n{} for {}: {why}", b.name, b.arch);
            }
        }
    }
    let total: usize = all.iter().map(|b| b.len()).sum();
    println!("\n{} of {total} compiled", total - failed);
    if failed == 0 { 0 } else { 1 }
}

/// `hipscope __compile-kernels` (hidden): the child side of isolated compilation.
pub fn compile_child(args: &CompileChildArgs) -> i32 {
    let Some(backend) = backend_kind(&args.backend) else {
        eprintln!("hipscope: unknown backend {}", args.backend);
        return 2;
    };
    kernels::run_compile_child(backend, &args.arch, &args.dir)
}
