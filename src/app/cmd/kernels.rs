//! `hipscope kernels` (list or compile the kernel units, to fill the cache ahead of a first start)
//! and the hidden `hipscope __compile-kernels` that runs the kernel compiler in a child process.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use super::progress::CompileLine;
use crate::app::cmd::usage::{out, outln, stdout_gone};
use crate::app::exit_code;
use crate::app::stderr::errln;
use crate::gpu::compute::{KernelScope, units};
use crate::gpu::device::{RuntimeKind, human_bytes};
use crate::gpu::kernels::{self, BuildStatus, CompileMode, KernelCache, KernelSources, KernelUnit};

#[derive(Args, Debug, Clone)]
pub struct KernelsArgs {
    /// Compile the kernels and print a table (per compile unit × arch); fills the kernel cache.
    #[arg(long)]
    pub compile: bool,
    /// Targets, comma-separated: gfx1100,gfx1151 for HIP, sm_90 for CUDA.
    #[arg(long, value_delimiter = ',')]
    pub arch: Vec<String>,
    /// hip or cuda.
    #[arg(long, default_value = "hip")]
    pub backend: String,
    /// Only the kernels this model launches (a GGUF file, or `default`: the configured or
    /// default model); without it, every kernel.
    #[arg(long = "for", value_name = "MODEL")]
    pub for_model: Option<PathBuf>,
    /// Compile afresh (no on-disk cache).
    #[arg(long)]
    pub no_cache: bool,
    /// Compile in this process instead of in children (a compiler abort then ends hipscope).
    #[arg(long)]
    pub in_process: bool,
    /// Compile children at once (default: one per core).
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
    /// Compile the stamped build: the kernels as a trace or profile asked for at start builds
    /// them, each timing itself (kernels/prelude.h `HS_STAMPS`; docs/PROFILING.md).
    #[arg(long)]
    pub stamped: bool,
}

#[derive(Args, Debug, Clone)]
pub struct CompileChildArgs {
    #[arg(long)]
    pub backend: String,
    #[arg(long)]
    pub arch: String,
    /// Directory holding the units' full texts; code objects are written next to them.
    #[arg(long)]
    pub dir: PathBuf,
}

fn backend_kind(s: &str) -> Option<RuntimeKind> {
    match s {
        "hip" | "rocm" => Some(RuntimeKind::Hip),
        "cuda" => Some(RuntimeKind::Cuda),
        // The test device's compiler (its "code object" is the unit's text): for tests of the
        // compile machinery without a GPU compiler.
        "fake" => Some(RuntimeKind::Fake),
        _ => None,
    }
}

/// The units `--for` asks for (every unit without it), and a line saying which.
fn units_for(
    args: &KernelsArgs,
    settings: &crate::app::settings::Settings,
    sources: &KernelSources,
) -> anyhow::Result<(Vec<KernelUnit>, String)> {
    let Some(model) = &args.for_model else {
        return Ok((
            units::kernel_units(sources, KernelScope::All)?,
            "every kernel".into(),
        ));
    };
    let path = if model.as_os_str() == "default" {
        super::model_args::model_path(None, &settings.config)?
    } else {
        model.clone()
    };
    let file =
        crate::model::gguf::GgufFile::open(&path).map_err(|e| anyhow::anyhow!("--for: {e}"))?;
    let needs = crate::model::loader::kernel_needs(&file);
    let types: Vec<&str> = needs.types.kernels().map(|k| k.ty.name()).collect();
    let said = format!(
        "the kernels of {} ({}{})",
        path.display(),
        types.join(", "),
        if needs.moe { "; experts" } else { "" }
    );
    Ok((
        units::kernel_units(sources, KernelScope::Model(needs))?,
        said,
    ))
}

/// `hipscope kernels`: lists the compile units and their kernels, or with `--compile` compiles
/// each for each `--arch` (into the cache unless `--no-cache`) and prints a table. Exit code 1 if
/// any unit failed.
pub fn kernels(args: &KernelsArgs, settings: &crate::app::settings::Settings) -> i32 {
    let sources = match KernelSources::load() {
        Ok(s) => s,
        Err(e) => {
            errln!("hipscope kernels: {e}");
            return exit_code::USAGE;
        }
    };
    let (units, scope) = match units_for(args, settings, &sources) {
        Ok((u, s)) if args.stamped => (
            u.into_iter().map(KernelUnit::stamped).collect::<Vec<_>>(),
            format!("{s}, stamped build"),
        ),
        Ok(u) => u,
        Err(e) => {
            errln!("hipscope kernels: {e:#}");
            return exit_code::USAGE;
        }
    };
    if !args.compile {
        // The names' column as wide as the longest, so that the lists line up.
        let w = units.iter().map(|u| u.name.len()).max().unwrap_or(0);
        for u in &units {
            outln!("{:<w$}  {}", u.name, u.kernels().join(", "));
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
    let mut mode = if args.in_process {
        CompileMode::InProcess
    } else {
        CompileMode::isolated()
    };
    if let (CompileMode::ChildProcess { jobs, .. }, Some(n)) = (&mut mode, args.jobs) {
        *jobs = n.max(1);
    }
    outln!("compiler: {}", compiler.id());
    let jobs = match &mode {
        CompileMode::ChildProcess { jobs, .. } => format!("{jobs} at once"),
        CompileMode::InProcess => "in this process".into(),
    };
    outln!("units: {} ({scope}; {jobs})", units.len());
    let mut all = Vec::new();
    for arch in &args.arch {
        let t = Instant::now();
        let mut line = CompileLine::new();
        let builds = kernels::build_all(compiler.as_ref(), arch, &units, &cache, &mode, &mut |p| {
            line.update(p)
        });
        line.finish();
        outln!("{arch}: {:.0} ms", t.elapsed().as_secs_f64() * 1e3);
        all.push(builds);
    }
    // The table: one row per compile unit, one column per arch.
    let w = 28;
    let nw = units.iter().map(|u| u.name.len()).max().unwrap_or(0).max(6);
    out!("{:<nw$}", "kernel");
    for a in &args.arch {
        out!(" {a:<w$}");
    }
    outln!();
    for (i, u) in units.iter().enumerate() {
        out!("{:<nw$}", u.name);
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
