//! Kernel sources, run-time compilation and the on-disk cache of compiled code objects.
//!
//! `kernels/*.hip` are embedded at build time (`HIPSCOPE_KERNELS=DIR` overrides them for work on
//! kernels) and compiled, behind one prelude (`kernels/prelude.h`), by hiprtc with an explicit
//! `--offload-arch` or by nvrtc for an `sm_XX`. Compiled objects are cached under the user's cache
//! directory keyed by backend, arch, compiler version, options and source hash.
//!
//! hiprtc can abort the process on targets its LLVM does not know, so HIP compiles run in a child
//! process (`hipscope __compile-kernels`, see [`run_compile_child`]); a crash there becomes a
//! [`GpuError::CompilerCrashed`] naming the arch and the kernel it died on.

use std::borrow::Cow;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::gpu::device::{GpuError, RuntimeKind};

/// Prepended to every kernel source.
pub const PRELUDE: &str = include_str!("../../kernels/prelude.h");

/// The sources shipped in the binary: (name, text). Every file in `kernels/` ending in `.hip`.
pub const EMBEDDED: &[(&str, &str)] = &[
    ("busy", include_str!("../../kernels/busy.hip")),
    ("checksum", include_str!("../../kernels/checksum.hip")),
    ("fill", include_str!("../../kernels/fill.hip")),
    ("gemm", include_str!("../../kernels/gemm.hip")),
    (
        "infer_attention",
        include_str!("../../kernels/infer_attention.hip"),
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
    ("spin", include_str!("../../kernels/spin.hip")),
];

/// One kernel source file (a module: it may define several kernels).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSource {
    /// The file stem: `gemm` for `kernels/gemm.hip`.
    pub name: String,
    pub text: Cow<'static, str>,
    /// Another source's device code compiled before this one, its kernels left out ([`USES`]).
    pub uses: Option<(String, Cow<'static, str>)>,
}

/// (source, the one it uses, the macro that leaves the used one's kernels out): `infer_moe` takes
/// `infer_matvec`'s row-dot routine, `gemm` the element functions of `infer_dequant`.
pub const USES: &[(&str, &str, &str)] = &[
    ("infer_moe", "infer_matvec", "HS_MV_TEMPLATES_ONLY"),
    ("gemm", "infer_dequant", "HS_DQ_TEMPLATES_ONLY"),
];

impl KernelSource {
    /// The text handed to the compiler: the prelude, then the file with its own line numbers.
    pub fn full_text(&self) -> String {
        let uses = match &self.uses {
            Some((name, text)) => {
                let guard = USES.iter().find(|u| u.0 == self.name).map_or("", |u| u.2);
                format!("#define {guard}\n#line 1 \"{name}.hip\"\n{text}\n#undef {guard}\n")
            }
            None => String::new(),
        };
        format!(
            "{PRELUDE}\n{uses}#line 1 \"{}.hip\"\n{}",
            self.name, self.text
        )
    }
}

/// Hands each source in [`USES`] the text of the one it uses.
fn link_uses(mut sources: Vec<KernelSource>) -> Vec<KernelSource> {
    for (user, used, _) in USES {
        let text = sources
            .iter()
            .find(|s| s.name == *used)
            .map(|s| s.text.clone());
        if let (Some(text), Some(s)) = (text, sources.iter_mut().find(|s| s.name == *user)) {
            s.uses = Some((used.to_string(), text));
        }
    }
    sources
}

/// The kernel sources: `HIPSCOPE_KERNELS=DIR` if set (its `*.hip`), else the embedded ones.
pub fn sources() -> Result<Vec<KernelSource>, GpuError> {
    match std::env::var_os("HIPSCOPE_KERNELS") {
        Some(dir) if !dir.is_empty() => sources_from_dir(Path::new(&dir)),
        _ => Ok(embedded_sources()),
    }
}

pub fn embedded_sources() -> Vec<KernelSource> {
    link_uses(
        EMBEDDED
            .iter()
            .map(|(n, t)| KernelSource {
                name: n.to_string(),
                text: Cow::Borrowed(t),
                uses: None,
            })
            .collect(),
    )
}

pub fn sources_from_dir(dir: &Path) -> Result<Vec<KernelSource>, GpuError> {
    let io = |source| GpuError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io)? {
        let e = e.map_err(io)?;
        let p = e.path();
        if p.extension().and_then(|x| x.to_str()) != Some("hip") {
            continue;
        }
        let Some(stem) = p.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        let text = std::fs::read_to_string(&p).map_err(|source| GpuError::Io {
            path: p.clone(),
            source,
        })?;
        out.push(KernelSource {
            name: stem.to_string(),
            text: Cow::Owned(text),
            uses: None,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    if out.is_empty() {
        return Err(GpuError::InvalidArgument(format!(
            "HIPSCOPE_KERNELS={} holds no .hip files",
            dir.display()
        )));
    }
    Ok(link_uses(out))
}

/// The kernels a source defines: the names after `HS_KERNEL void`.
pub fn kernel_names(text: &str) -> Vec<String> {
    text.match_indices("HS_KERNEL void")
        .filter_map(|(i, m)| {
            let rest = text[i + m.len()..].trim_start();
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
            (end > 0).then(|| rest[..end].to_string())
        })
        .collect()
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

/// The on-disk cache of compiled kernels. `None` root: caching off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelCache {
    root: Option<PathBuf>,
}

impl KernelCache {
    pub fn disabled() -> KernelCache {
        KernelCache { root: None }
    }

    pub fn at(dir: PathBuf) -> KernelCache {
        KernelCache { root: Some(dir) }
    }

    /// `kernels/` in the cache dir (`~/.cache/hipscope/kernels`, or under `HIPSCOPE_HOME`).
    pub fn default_location() -> KernelCache {
        KernelCache::at(crate::gpu::dirs::cache_dir().join("kernels"))
    }

    pub fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    /// The cache key: what the compiled object depends on.
    pub fn key(compiler_id: &str, arch: &str, options: &[String], full_source: &str) -> String {
        let mut h = Sha256::new();
        for part in [compiler_id, arch, &options.join(" "), full_source] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        h.finalize()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn path(&self, backend: RuntimeKind, arch: &str, name: &str, key: &str) -> Option<PathBuf> {
        let root = self.root.as_ref()?;
        Some(
            root.join(format!("{backend}-{arch}"))
                .join(format!("{name}-{key}.co")),
        )
    }

    pub fn load(&self, backend: RuntimeKind, arch: &str, name: &str, key: &str) -> Option<Vec<u8>> {
        let p = self.path(backend, arch, name, key)?;
        std::fs::read(p).ok().filter(|b| !b.is_empty())
    }

    /// Writes atomically (`atomic_file`), so a crash never leaves a truncated object.
    pub fn store(
        &self,
        backend: RuntimeKind,
        arch: &str,
        name: &str,
        key: &str,
        image: &[u8],
    ) -> Result<(), GpuError> {
        let Some(p) = self.path(backend, arch, name, key) else {
            return Ok(());
        };
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| GpuError::Io { path, source }
        };
        if let Some(dir) = p.parent() {
            crate::gpu::dirs::create_private_dir(dir).map_err(io(dir))?;
        }
        crate::gpu::atomic_file::write_bytes(&p, crate::gpu::atomic_file::Replace::Allow, image)
            .map_err(io(&p))
    }
}

/// How one kernel module came to be (or not).
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

/// A compiled module, ready for `Device::load_module`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompiledModule {
    pub name: String,
    pub image: Vec<u8>,
}

/// Where compiles run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompileMode {
    InProcess,
    /// Re-exec this program (`hipscope __compile-kernels`) so a compiler abort cannot take the
    /// app down with the terminal in raw mode.
    ChildProcess {
        exe: PathBuf,
        timeout: Duration,
    },
}

impl CompileMode {
    /// The child-process mode when this program's path is known (hiprtc), else in-process.
    pub fn isolated() -> CompileMode {
        match self_exe() {
            Some(exe) => CompileMode::ChildProcess {
                exe,
                timeout: Duration::from_secs(300),
            },
            None => CompileMode::InProcess,
        }
    }
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

/// Builds every source for `arch`, from the cache where possible. Never fails as a whole: each
/// module carries its own status.
pub fn build_all(
    compiler: &dyn KernelCompiler,
    arch: &str,
    sources: &[KernelSource],
    cache: &KernelCache,
    mode: &CompileMode,
) -> Vec<KernelBuild> {
    if let Err(e) = compiler.check_target(arch) {
        return sources
            .iter()
            .map(|s| KernelBuild {
                name: s.name.clone(),
                arch: arch.to_string(),
                status: BuildStatus::Refused(e.to_string()),
                image: None,
            })
            .collect();
    }
    let backend = compiler.backend();
    let id = compiler.id();
    let opts = compiler.options(arch);
    let mut out: Vec<KernelBuild> = Vec::with_capacity(sources.len());
    let mut missing: Vec<(usize, String)> = Vec::new();
    for s in sources {
        let key = KernelCache::key(&id, arch, &opts, &s.full_text());
        match cache.load(backend, arch, &s.name, &key) {
            Some(image) => out.push(KernelBuild {
                name: s.name.clone(),
                arch: arch.to_string(),
                status: BuildStatus::Cached,
                image: Some(image),
            }),
            None => {
                missing.push((out.len(), key));
                out.push(KernelBuild {
                    name: s.name.clone(),
                    arch: arch.to_string(),
                    status: BuildStatus::Refused("not built".into()),
                    image: None,
                });
            }
        }
    }
    if missing.is_empty() {
        return out;
    }
    let todo: Vec<&KernelSource> = missing.iter().map(|(i, _)| &sources[*i]).collect();
    let built = match mode {
        CompileMode::InProcess => todo
            .iter()
            .map(|s| compile_one(compiler, s, arch))
            .collect::<Vec<_>>(),
        CompileMode::ChildProcess { exe, timeout } => {
            compile_in_child(exe, backend, arch, &todo, *timeout)
        }
    };
    for ((i, key), b) in missing.into_iter().zip(built) {
        if let Some(img) = &b.image {
            // A cache that cannot be written only costs a recompile next time.
            if let Err(e) = cache.store(backend, arch, &b.name, &key, img) {
                tracing::warn!("kernel cache: {e}");
            }
        }
        out[i] = b;
    }
    out
}

/// Compiles one module in this process.
pub fn compile_one(compiler: &dyn KernelCompiler, src: &KernelSource, arch: &str) -> KernelBuild {
    let t = Instant::now();
    let r = compiler.compile(&src.name, &src.full_text(), arch);
    let millis = t.elapsed().as_secs_f64() * 1e3;
    match r {
        Ok(image) => KernelBuild {
            name: src.name.clone(),
            arch: arch.to_string(),
            status: BuildStatus::Compiled { millis },
            image: Some(image),
        },
        Err(GpuError::Compile { log, .. }) => KernelBuild {
            name: src.name.clone(),
            arch: arch.to_string(),
            status: BuildStatus::Failed(log),
            image: None,
        },
        Err(e) => KernelBuild {
            name: src.name.clone(),
            arch: arch.to_string(),
            status: BuildStatus::Failed(e.to_string()),
            image: None,
        },
    }
}

/// Turns build results into loadable modules, or the first failure as an error that names the
/// kernel and carries the compiler's log.
pub fn into_modules(builds: Vec<KernelBuild>) -> Result<Vec<CompiledModule>, GpuError> {
    let mut out = Vec::with_capacity(builds.len());
    for b in builds {
        match (b.image, b.status) {
            (Some(image), _) => out.push(CompiledModule {
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

/// Runs `exe __compile-kernels` for the given sources and reads its per-kernel report.
fn compile_in_child(
    exe: &Path,
    backend: RuntimeKind,
    arch: &str,
    todo: &[&KernelSource],
    timeout: Duration,
) -> Vec<KernelBuild> {
    let out_dir = std::env::temp_dir().join(format!(
        "hipscope-compile-{}-{}-{}",
        std::process::id(),
        arch,
        unique_suffix()
    ));
    let fail_all = |status: BuildStatus| -> Vec<KernelBuild> {
        todo.iter()
            .map(|s| KernelBuild {
                name: s.name.clone(),
                arch: arch.to_string(),
                status: status.clone(),
                image: None,
            })
            .collect()
    };
    if let Err(e) = std::fs::create_dir_all(&out_dir) {
        return fail_all(BuildStatus::Refused(format!(
            "cannot create {}: {e}",
            out_dir.display()
        )));
    }
    // Sources travel through files, so a HIPSCOPE_KERNELS override reaches the child unchanged.
    for s in todo {
        if let Err(e) = std::fs::write(out_dir.join(format!("{}.hip", s.name)), s.text.as_bytes()) {
            let _ = std::fs::remove_dir_all(&out_dir);
            return fail_all(BuildStatus::Refused(format!("cannot write sources: {e}")));
        }
    }
    let spawned = Command::new(exe)
        .arg(CHILD_SUBCOMMAND)
        .arg("--backend")
        .arg(backend.name())
        .arg("--arch")
        .arg(arch)
        .arg("--dir")
        .arg(&out_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&out_dir);
            return fail_all(BuildStatus::Refused(format!(
                "cannot start {}: {e}",
                exe.display()
            )));
        }
    };
    // Read both pipes on threads so a chatty compiler cannot block on a full pipe.
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let out_reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        if let Some(s) = stdout {
            for l in BufReader::new(s).lines() {
                match l {
                    Ok(l) => lines.push(l),
                    Err(_) => break,
                }
            }
        }
        lines
    });
    let err_reader = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut s) = stderr {
            let _ = s.read_to_string(&mut text);
        }
        text
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Ok(st),
            Ok(None) if start.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(format!("timed out after {timeout:?}"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => break Err(format!("wait failed: {e}")),
        }
    };
    let lines = out_reader.join().unwrap_or_default();
    let stderr_text = err_reader.join().unwrap_or_default();
    let mut reported: std::collections::HashMap<String, KernelBuild> =
        std::collections::HashMap::new();
    for l in &lines {
        if let Some(b) = parse_child_line(l, arch, &out_dir) {
            reported.insert(b.name.clone(), b);
        }
    }
    let crash = match &status {
        Ok(st) if st.success() => None,
        Ok(st) => Some(describe_exit(st)),
        Err(e) => Some(e.clone()),
    };
    let _ = std::fs::remove_dir_all(&out_dir);
    let tail = tail_lines(&stderr_text, 6);
    todo.iter()
        .map(|s| match reported.remove(&s.name) {
            Some(b) => b,
            None => KernelBuild {
                name: s.name.clone(),
                arch: arch.to_string(),
                status: BuildStatus::Crashed(match &crash {
                    Some(c) if tail.is_empty() => c.clone(),
                    Some(c) => format!("{c}: {tail}"),
                    None => "the compiler process reported nothing for this kernel".into(),
                }),
                image: None,
            },
        })
        .collect()
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

fn parse_child_line(line: &str, arch: &str, dir: &Path) -> Option<KernelBuild> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let name = v.get("kernel")?.as_str()?.to_string();
    if v.get("ok")?.as_bool()? {
        let millis = v.get("millis").and_then(|m| m.as_f64()).unwrap_or(0.0);
        let image = std::fs::read(dir.join(format!("{name}.co"))).ok()?;
        Some(KernelBuild {
            name,
            arch: arch.to_string(),
            status: BuildStatus::Compiled { millis },
            image: Some(image),
        })
    } else {
        let log = v
            .get("log")
            .and_then(|l| l.as_str())
            .unwrap_or("(no log)")
            .to_string();
        Some(KernelBuild {
            name,
            arch: arch.to_string(),
            status: BuildStatus::Failed(log),
            image: None,
        })
    }
}

/// The child side: compiles every `*.hip` in `dir` for `arch` in this process, writes
/// `<name>.co` next to each and one JSON line per kernel on stdout (flushed, so the parent knows
/// how far it got if the compiler aborts). Returns the exit code.
pub fn run_compile_child(compiler: &dyn KernelCompiler, arch: &str, dir: &Path) -> i32 {
    let sources = match sources_from_dir(dir) {
        Ok(s) => s,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "hipscope: {e}");
            return 2;
        }
    };
    let stdout = std::io::stdout();
    for s in &sources {
        let b = compile_one(compiler, s, arch);
        let line = match (&b.image, &b.status) {
            (Some(img), BuildStatus::Compiled { millis }) => {
                if let Err(e) = std::fs::write(dir.join(format!("{}.co", s.name)), img) {
                    serde_json::json!({"kernel": s.name, "ok": false,
                        "log": format!("cannot write the code object: {e}")})
                } else {
                    serde_json::json!({"kernel": s.name, "ok": true, "bytes": img.len(),
                        "millis": millis})
                }
            }
            (_, BuildStatus::Failed(log)) => {
                serde_json::json!({"kernel": s.name, "ok": false, "log": log})
            }
            (_, other) => {
                serde_json::json!({"kernel": s.name, "ok": false, "log": format!("{other:?}")})
            }
        };
        let mut lock = stdout.lock();
        let _ = writeln!(lock, "{line}");
        let _ = lock.flush();
    }
    0
}

#[cfg(test)]
mod tests;
