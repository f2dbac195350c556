//! `hipscope kernels` (list or compile the kernel sources) and the hidden `hipscope
//! __compile-kernels` that runs the kernel compiler in a child process.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use crate::app::cmd::usage::{out, outln, stdout_gone};
use crate::app::exit_code;
use crate::app::stderr::errln;
use crate::gpu::device::{RuntimeKind, human_bytes};
use crate::gpu::kernels::{self, BuildStatus, CompileMode, KernelCache};

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

fn backend_kind(s: &str) -> Option<RuntimeKind> {
    match s {
        "hip" | "rocm" => Some(RuntimeKind::Hip),
        "cuda" => Some(RuntimeKind::Cuda),
        _ => None,
    }
}

/// `hipscope kernels`: lists the kernel sources, or with `--compile` compiles each for each
/// `--arch` and prints a table. Exit code 1 if any kernel failed.
pub fn kernels(args: &KernelsArgs) -> i32 {
    let sources = match kernels::sources() {
        Ok(s) => s,
        Err(e) => {
            errln!("hipscope kernels: {e}");
            return exit_code::USAGE;
        }
    };
    if !args.compile {
        // The names' column as wide as the longest, so that the lists line up.
        let w = sources.iter().map(|s| s.name.len()).max().unwrap_or(0);
        for s in &sources {
            outln!(
                "{:<w$}  {}",
                s.name,
                kernels::kernel_names(&s.text).join(", ")
            );
            if stdout_gone() {
                break;
            }
        }
        return 0;
    }
    let Some(backend) = backend_kind(&args.backend) else {
        errln!("hipscope kernels: --backend must be hip or cuda");
        return exit_code::USAGE;
    };
    if args.arch.is_empty() {
        errln!("hipscope kernels: --compile needs --arch (e.g. gfx1100,gfx1151 or sm_90)");
        return exit_code::USAGE;
    }
    let compiler = match crate::gpu::select::compiler_for(backend) {
        Ok(c) => c,
        Err(e) => {
            errln!("hipscope kernels: {e}");
            return exit_code::USAGE;
        }
    };
    let cache = if args.no_cache {
        KernelCache::disabled()
    } else {
        KernelCache::default_location()
    };
    let mode = if args.in_process || backend == RuntimeKind::Cuda {
        CompileMode::InProcess
    } else {
        CompileMode::isolated()
    };
    outln!("compiler: {}", compiler.id());
    let mut all = Vec::new();
    for arch in &args.arch {
        let t = Instant::now();
        let builds = kernels::build_all(compiler.as_ref(), arch, &sources, &cache, &mode);
        outln!("{arch}: {:.0} ms", t.elapsed().as_secs_f64() * 1e3);
        all.push(builds);
    }
    // The table: one row per kernel module, one column per arch.
    let w = 28;
    let nw = sources
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(0)
        .max(6);
    out!("{:<nw$}", "kernel");
    for a in &args.arch {
        out!(" {a:<w$}");
    }
    outln!();
    for (i, s) in sources.iter().enumerate() {
        out!("{:<nw$}", s.name);
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
            out!(" {cell:<w$}");
        }
        outln!();
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
                outln!("\n{} for {}: {why}", b.name, b.arch);
            }
        }
    }
    let total: usize = all.iter().map(|b| b.len()).sum();
    outln!("\n{} of {total} compiled", total - failed);
    if failed == 0 || stdout_gone() { 0 } else { 1 }
}

/// `hipscope __compile-kernels` (hidden): the child side of isolated compilation.
pub fn compile_child(args: &CompileChildArgs) -> i32 {
    let Some(backend) = backend_kind(&args.backend) else {
        errln!("hipscope: unknown backend {}", args.backend);
        return exit_code::USAGE;
    };
    match crate::gpu::select::compiler_for(backend) {
        Ok(compiler) => kernels::run_compile_child(compiler.as_ref(), &args.arch, &args.dir),
        Err(e) => {
            errln!("hipscope: {e}");
            2
        }
    }
}
