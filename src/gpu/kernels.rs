//! Kernel sources, their compile units, run-time compilation and the on-disk cache of compiled
//! code objects.
//!
//! `kernels/*.hip` and the headers they share (`kernels/*.h`) are embedded at build time
//! (`HIPSCOPE_KERNELS=DIR` overrides them for work on kernels). A compile unit is one source with
//! the prelude (`kernels/prelude.h`), its headers ([`INCLUDES`]) and, for the sources whose
//! kernels are generated per weight type, the type lists the host defines for it
//! (`compute/plan.rs`: `infer_matvec.q4_0` holds Q4_0's kernels only), so that a model compiles
//! what it launches and nothing else. Units are compiled by hiprtc with an explicit
//! `--offload-arch` or by nvrtc for an `sm_XX`, each in a child process where the mode asks for
//! it (`pool.rs`: several at once, a crash naming its unit), and cached (`cache.rs`) keyed by
//! backend, arch, compiler version, options and the unit's full text.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::gpu::device::{GpuError, RuntimeKind};

mod cache;
mod names;
mod pool;

pub use cache::KernelCache;
pub use names::{KernelDecl, declarations, kernel_names};

/// Prepended to every kernel source.
pub const PRELUDE: &str = include_str!("../../kernels/prelude.h");

/// The headers the sources share: (file name, text). Every `kernels/*.h` but the prelude.
pub const HEADERS: &[(&str, &str)] = &[
    ("attention.h", include_str!("../../kernels/attention.h")),
    ("dequant.h", include_str!("../../kernels/dequant.h")),
    ("mma.h", include_str!("../../kernels/mma.h")),
    ("vecdot.h", include_str!("../../kernels/vecdot.h")),
];

/// The sources shipped in the binary: (name, text). Every file in `kernels/` ending in `.hip`.
pub const EMBEDDED: &[(&str, &str)] = &[
    ("busy", include_str!("../../kernels/busy.hip")),
    ("checksum", include_str!("../../kernels/checksum.hip")),
    ("fill", include_str!("../../kernels/fill.hip")),
    ("gemm", include_str!("../../kernels/gemm.hip")),
    ("gemm_moe", include_str!("../../kernels/gemm_moe.hip")),
    (
        "infer_attention",
        include_str!("../../kernels/infer_attention.hip"),
    ),
    (
        "infer_attention_tiled",
        include_str!("../../kernels/infer_attention_tiled.hip"),
    ),
    (
        "infer_dequant",
        include_str!("../../kernels/infer_dequant.hip"),
    ),
    (
        "infer_kv_shift",
        include_str!("../../kernels/infer_kv_shift.hip"),
    ),
    (
        "infer_matvec",
        include_str!("../../kernels/infer_matvec.hip"),
    ),
    ("infer_moe", include_str!("../../kernels/infer_moe.hip")),
    ("infer_ops", include_str!("../../kernels/infer_ops.hip")),
    ("sgemm", include_str!("../../kernels/sgemm.hip")),
    ("spin", include_str!("../../kernels/spin.hip")),
];

/// The headers each source is compiled with, in this order, after the prelude (as ggml's
/// `vecdotq.cuh` serves both `mmvq.cu` and `mmq.cuh`).
pub const INCLUDES: &[(&str, &[&str])] = &[
    ("infer_attention", &["attention.h"]),
    ("infer_attention_tiled", &["attention.h", "mma.h"]),
    ("infer_matvec", &["vecdot.h"]),
    ("infer_dequant", &["dequant.h"]),
    ("gemm", &["mma.h"]),
    ("gemm_moe", &["dequant.h", "mma.h"]),
];

/// One kernel source file or header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSource {
    /// The file stem of a source (`gemm` for `kernels/gemm.hip`), a header's file name
    /// (`vecdot.h`).
    pub name: String,
    pub text: Cow<'static, str>,
}

/// The kernel sources and headers a process compiles from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSources {
    pub files: Vec<KernelSource>,
    pub headers: Vec<KernelSource>,
}

/// One compile unit: what the compiler is handed, whole, and the name its code object and cache
/// entry go by (`gemm`, `infer_matvec.q4_0`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelUnit {
    pub name: String,
    /// The prelude, the source's headers, the host's definitions and the source, with `#line`
    /// markers so that a compiler error names the file and line it is in.
    pub text: String,
}

/// What a unit of the stamped build starts with: its kernels time themselves for a trace
/// (kernels/prelude.h, `HS_STAMPS`; src/gpu/trace/stamps.rs).
const STAMPED_BUILD: &str = "#define HS_STAMPS 1\n";

impl KernelUnit {
    /// The unit's stamped build: the same name and kernels, its own text (so its own cache
    /// entry).
    pub fn stamped(self) -> KernelUnit {
        KernelUnit {
            name: self.name,
            text: format!("{STAMPED_BUILD}{}", self.text),
        }
    }

    /// The source file the unit compiles (`infer_matvec` for `infer_matvec.q4_0`).
    pub fn source(&self) -> &str {
        self.name.split('.').next().unwrap_or(&self.name)
    }

    /// The kernels the unit defines.
    pub fn kernels(&self) -> Vec<String> {
        kernel_names(&self.text)
    }
}

impl KernelSources {
    /// `HIPSCOPE_KERNELS=DIR` if set (its `*.hip` and `*.h`), else the embedded ones.
    pub fn load() -> Result<KernelSources, GpuError> {
        match std::env::var_os("HIPSCOPE_KERNELS") {
            Some(dir) if !dir.is_empty() => KernelSources::from_dir(Path::new(&dir)),
            _ => Ok(KernelSources::embedded()),
        }
    }

    pub fn embedded() -> KernelSources {
        let own = |(n, t): &(&str, &'static str)| KernelSource {
            name: n.to_string(),
            text: Cow::Borrowed(*t),
        };
        KernelSources {
            files: EMBEDDED.iter().map(own).collect(),
            headers: HEADERS.iter().map(own).collect(),
        }
    }

    pub fn from_dir(dir: &Path) -> Result<KernelSources, GpuError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| GpuError::Io { path, source }
        };
        let mut files = Vec::new();
        let mut headers = Vec::new();
        for e in std::fs::read_dir(dir).map_err(io(dir))? {
            let p = e.map_err(io(dir))?.path();
            let (Some(ext), Some(stem), Some(file)) = (
                p.extension().and_then(|x| x.to_str()),
                p.file_stem().and_then(|s| s.to_str()),
                p.file_name().and_then(|s| s.to_str()),
            ) else {
                continue;
            };
            let text = || std::fs::read_to_string(&p).map_err(io(&p));
            match ext {
                "hip" => files.push(KernelSource {
                    name: stem.to_string(),
                    text: Cow::Owned(text()?),
                }),
                // The prelude comes from the binary: it is part of the host's contract.
                "h" if file != "prelude.h" => headers.push(KernelSource {
                    name: file.to_string(),
                    text: Cow::Owned(text()?),
                }),
                _ => {}
            }
        }
        files.sort_by(|a, b| a.name.cmp(&b.name));
        headers.sort_by(|a, b| a.name.cmp(&b.name));
        if files.is_empty() {
            return Err(GpuError::InvalidArgument(format!(
                "HIPSCOPE_KERNELS={} holds no .hip files",
                dir.display()
            )));
        }
        Ok(KernelSources { files, headers })
    }

    pub fn get(&self, name: &str) -> Option<&KernelSource> {
        self.files.iter().find(|s| s.name == name)
    }

    /// The unit of source `name`: `variant` names it (`q4_0`: `infer_matvec.q4_0`), `defines`
    /// are the lines the host writes before the source (a typed source's type lists).
    pub fn unit(
        &self,
        name: &str,
        variant: Option<&str>,
        defines: &str,
    ) -> Result<KernelUnit, GpuError> {
        let src = self
            .get(name)
            .ok_or_else(|| GpuError::InvalidArgument(format!("no kernel source {name}.hip")))?;
        let mut text = format!("{PRELUDE}\n");
        let includes = INCLUDES
            .iter()
            .find(|i| i.0 == name)
            .map_or(&[][..], |i| i.1);
        for h in includes {
            let header = self.headers.iter().find(|x| x.name == *h).ok_or_else(|| {
                GpuError::InvalidArgument(format!("{name}.hip needs the header {h}, not found"))
            })?;
            text.push_str(&format!("#line 1 \"{h}\"\n{}\n", header.text));
        }
        let unit = match variant {
            Some(v) => format!("{name}.{v}"),
            None => name.to_string(),
        };
        if !defines.is_empty() {
            text.push_str(&format!("// unit {unit}\n{defines}\n"));
        }
        text.push_str(&format!("#line 1 \"{name}.hip\"\n{}", src.text));
        Ok(KernelUnit { name: unit, text })
    }
}

/// The embedded `.hip` sources (the files themselves, for checks that read them).
pub fn embedded_sources() -> Vec<KernelSource> {
    KernelSources::embedded().files
}

/// A run-time kernel compiler (hiprtc, nvrtc).
pub trait KernelCompiler {
    fn backend(&self) -> RuntimeKind;
    /// Compiler and version, part of the cache key (`hiprtc 5.2.21153 (libamdhip64.so.5)`).
    fn id(&self) -> String;
    fn options(&self, arch: &str) -> Vec<String>;
    /// Refuses targets this compiler is known to crash on or cannot build.
    fn check_target(&self, arch: &str) -> Result<(), GpuError>;
    /// Compiles one full source (prelude included) into a loadable code object.
    fn compile(&self, name: &str, source: &str, arch: &str) -> Result<Vec<u8>, GpuError>;
}

/// How one compile unit came to be (or not).
#[derive(Clone, Debug, PartialEq)]
pub enum BuildStatus {
    Compiled {
        millis: f64,
    },
    Cached,
    /// The compiler rejected the source: its log.
    Failed(String),
    /// The compiler process died (signal or abort) while on this kernel or before reaching it.
    Crashed(String),
    /// The target was refused before compiling (known-bad pairing, no compiler).
    Refused(String),
}

/// One module's build result.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelBuild {
    pub name: String,
    pub arch: String,
    pub status: BuildStatus,
    pub image: Option<Vec<u8>>,
}

impl KernelBuild {
    pub fn ok(&self) -> bool {
        self.image.is_some()
    }
}

/// A compiled module, ready for `Device::load_module`, and the kernels it defines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompiledModule {
    pub name: String,
    pub image: Vec<u8>,
    pub kernels: Vec<String>,
}

/// Where compiles run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompileMode {
    /// One unit after another in this process.
    InProcess,
    /// Re-exec this program (`hipscope __compile-kernels`) so that a compiler abort cannot take
    /// the app down with the terminal in raw mode: `jobs` children at once, each unit given at
    /// most `timeout`.
    ChildProcess {
        exe: PathBuf,
        timeout: Duration,
        jobs: usize,
    },
}

impl CompileMode {
    /// Child processes, one per core, when this program's path is known; else in-process.
    pub fn isolated() -> CompileMode {
        match self_exe() {
            Some(exe) => CompileMode::ChildProcess {
                exe,
                timeout: Duration::from_secs(300),
                jobs: default_jobs(),
            },
            None => CompileMode::InProcess,
        }
    }
}

/// Compile children to run at once: the cores this process may use.
pub fn default_jobs() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// This program's path: `/proc/self/exe`, or `argv[0]` where there is no /proc (a chroot).
pub fn self_exe() -> Option<PathBuf> {
    if let Ok(p) = std::env::current_exe()
        && p.is_file()
    {
        return Some(p);
    }
    let arg0 = PathBuf::from(std::env::args_os().next()?);
    (arg0.components().count() > 1 && arg0.is_file()).then_some(arg0)
}

/// How far a compile has got: `done` of the `total` units that were not in the cache, and an
/// estimate of the time left (`None` until a unit has finished).
#[derive(Clone, Debug, PartialEq)]
pub struct CompileProgress {
    pub arch: String,
    pub done: usize,
    pub total: usize,
    pub left: Option<Duration>,
    /// Since the compile began.
    pub elapsed: Duration,
}

impl CompileProgress {
    /// "compiling GPU kernels for gfx1100 (first run only): 3 of 9, ~4 s left"; at the end, how
    /// long it took.
    pub fn describe(&self) -> String {
        if self.done >= self.total {
            return format!(
                "compiled GPU kernels for {} in {:.1} s ({} units; cached for the next start)",
                self.arch,
                self.elapsed.as_secs_f64(),
                self.total
            );
        }
        let left = match self.left {
            Some(d) => format!(", ~{} s left", d.as_secs_f64().ceil() as u64),
            None => String::new(),
        };
        format!(
            "compiling GPU kernels for {} (first run only): {} of {}{left}",
            self.arch, self.done, self.total
        )
    }

    pub fn fraction(&self) -> f32 {
        if self.total == 0 {
            1.0
        } else {
            self.done as f32 / self.total as f32
        }
    }
}

/// Builds `units` for `arch`, from the cache where possible, compiling the rest as `mode` says and
/// storing them in the cache; `progress` hears of each compiled unit (not of cached ones). Never
/// fails as a whole: each unit carries its own status.
pub fn build_all(
    compiler: &dyn KernelCompiler,
    arch: &str,
    units: &[KernelUnit],
    cache: &KernelCache,
    mode: &CompileMode,
    progress: &mut dyn FnMut(&CompileProgress),
) -> Vec<KernelBuild> {
    let build = |u: &KernelUnit, status| KernelBuild {
        name: u.name.clone(),
        arch: arch.to_string(),
        status,
        image: None,
    };
    if let Err(e) = compiler.check_target(arch) {
        return units
            .iter()
            .map(|u| build(u, BuildStatus::Refused(e.to_string())))
            .collect();
    }
    let backend = compiler.backend();
    let id = compiler.id();
    let opts = compiler.options(arch);
    let mut out: Vec<KernelBuild> = Vec::with_capacity(units.len());
    let mut missing: Vec<(usize, String)> = Vec::new();
    for u in units {
        let key = KernelCache::key(&id, arch, &opts, &u.text);
        match cache.load(backend, arch, &u.name, &key) {
            Some(image) => out.push(KernelBuild {
                image: Some(image),
                ..build(u, BuildStatus::Cached)
            }),
            None => {
                missing.push((out.len(), key));
                out.push(build(u, BuildStatus::Refused("not built".into())));
            }
        }
    }
    if missing.is_empty() {
        return out;
    }
    let todo: Vec<&KernelUnit> = missing.iter().map(|(i, _)| &units[*i]).collect();
    // The estimate weighs each unit by its text: the long ones are the slow ones.
    let weight: Vec<f64> = todo.iter().map(|u| u.text.len() as f64).collect();
    let total_weight: f64 = weight.iter().sum();
    let start = Instant::now();
    let mut done_weight = 0.0;
    let mut done = 0;
    progress(&CompileProgress {
        arch: arch.to_string(),
        done: 0,
        total: todo.len(),
        left: None,
        elapsed: Duration::ZERO,
    });
    let mut report = |i: usize, b: KernelBuild, out: &mut Vec<KernelBuild>| {
        let (at, key) = &missing[i];
        if let Some(img) = &b.image {
            // A cache that cannot be written only costs a recompile next time.
            if let Err(e) = cache.store(backend, arch, &b.name, key, img) {
                tracing::warn!("kernel cache: {e}");
            }
        }
        out[*at] = b;
        done += 1;
        done_weight += weight[i];
        let elapsed = start.elapsed();
        let secs = elapsed.as_secs_f64();
        progress(&CompileProgress {
            arch: arch.to_string(),
            done,
            total: todo.len(),
            left: (done_weight > 0.0).then(|| {
                Duration::from_secs_f64(secs * (total_weight - done_weight) / done_weight)
            }),
            elapsed,
        });
    };
    match mode {
        CompileMode::InProcess => {
            for (i, u) in todo.iter().enumerate() {
                let b = compile_one(compiler, u, arch);
                report(i, b, &mut out);
            }
        }
        CompileMode::ChildProcess { exe, timeout, jobs } => {
            let pool = pool::Pool {
                exe,
                backend,
                arch,
                timeout: *timeout,
                jobs: *jobs,
            };
            pool.run(&todo, &mut |i, b| report(i, b, &mut out));
        }
    }
    out
}

/// Compiles one unit in this process.
pub fn compile_one(compiler: &dyn KernelCompiler, unit: &KernelUnit, arch: &str) -> KernelBuild {
    let t = Instant::now();
    let r = compiler.compile(&unit.name, &unit.text, arch);
    let millis = t.elapsed().as_secs_f64() * 1e3;
    let (status, image) = match r {
        Ok(image) => (BuildStatus::Compiled { millis }, Some(image)),
        Err(GpuError::Compile { log, .. }) => (BuildStatus::Failed(log), None),
        Err(e) => (BuildStatus::Failed(e.to_string()), None),
    };
    KernelBuild {
        name: unit.name.clone(),
        arch: arch.to_string(),
        status,
        image,
    }
}

/// Turns build results into loadable modules (each with the kernels its unit defines), or the
/// first failure as an error that names the unit and carries the compiler's log.
pub fn into_modules(
    builds: Vec<KernelBuild>,
    units: &[KernelUnit],
) -> Result<Vec<CompiledModule>, GpuError> {
    let mut out = Vec::with_capacity(builds.len());
    for b in builds {
        match (b.image, b.status) {
            (Some(image), _) => out.push(CompiledModule {
                kernels: units
                    .iter()
                    .find(|u| u.name == b.name)
                    .map(KernelUnit::kernels)
                    .unwrap_or_default(),
                name: b.name,
                image,
            }),
            (None, BuildStatus::Failed(log)) => {
                return Err(GpuError::Compile {
                    kernel: b.name,
                    arch: b.arch,
                    log,
                });
            }
            (None, BuildStatus::Crashed(status)) => {
                return Err(GpuError::CompilerCrashed {
                    arch: b.arch,
                    hint: format!("it died while compiling {}", b.name),
                    status,
                });
            }
            (None, status) => {
                return Err(GpuError::UnsupportedTarget {
                    compiler: "kernel compiler".into(),
                    arch: b.arch,
                    reason: match status {
                        BuildStatus::Refused(r) => r,
                        other => format!("{other:?}"),
                    },
                });
            }
        }
    }
    Ok(out)
}

/// The hidden subcommand's name.
pub const CHILD_SUBCOMMAND: &str = "__compile-kernels";

/// The child side of [`CompileMode::ChildProcess`] (`hipscope __compile-kernels`): compiles the
/// units the parent names on stdin. Returns the exit code.
pub fn run_compile_child(compiler: &dyn KernelCompiler, arch: &str, dir: &Path) -> i32 {
    pool::run_child(compiler, arch, dir)
}

fn unique_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn tail_lines(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

#[cfg(unix)]
fn describe_exit(st: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match st.signal() {
        Some(sig) => format!("killed by signal {sig}{}", signal_name(sig)),
        None => format!("exited with code {}", st.code().unwrap_or(-1)),
    }
}

#[cfg(not(unix))]
fn describe_exit(st: &std::process::ExitStatus) -> String {
    format!("exited with code {}", st.code().unwrap_or(-1))
}

#[cfg(unix)]
fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGABRT => " (SIGABRT: the compiler aborted)",
        libc::SIGSEGV => " (SIGSEGV: the compiler crashed)",
        libc::SIGKILL => " (SIGKILL)",
        libc::SIGBUS => " (SIGBUS)",
        libc::SIGILL => " (SIGILL)",
        _ => "",
    }
}

#[cfg(test)]
mod tests;
