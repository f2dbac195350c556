//! The bodies of `hipscope doctor`'s functional checks, each run as `hipscope __doctor-check
//! NAME` in a child process that the doctor kills at its deadline: a hang or a crash there is
//! reported, not suffered. A child prints `RESULT <PASS|FAIL|SKIP> <detail>` as its last line.

use crate::app::stderr::errln;
use std::time::{Duration, Instant};

use clap::Args;

use crate::gpu::arena::{ArenaPlan, Region};
use crate::gpu::compute::{KernelScope, scope_units};
use crate::gpu::device::{GemmF32, GpuError, Op, RuntimeKind, reference_sgemm};
use crate::gpu::handle::{GemmPath, Gpu, GpuConfig};
use crate::gpu::kernels::{CompileMode, KernelCache};
use crate::gpu::select::{BackendChoice, Selected, select};

#[derive(Args, Debug, Clone)]
pub struct ChildArgs {
    /// probe, kernels, roundtrip, ordering, gemm, bandwidth, clean-exit, stress, hang.
    pub check: String,
    #[arg(long, default_value = "auto", value_parser = parse_backend)]
    pub backend: BackendChoice,
    #[arg(long)]
    pub device: Option<u32>,
    /// The second GPU of the `peer` check.
    #[arg(long)]
    pub peer: Option<u32>,
}

fn parse_backend(s: &str) -> Result<BackendChoice, String> {
    s.parse()
}

/// Exit code of a child whose check says the GPU is absent (not a failure).
pub const CHILD_SKIP: i32 = 4;

fn result(status: &str, detail: &str) {
    use std::io::Write;
    println!("RESULT {status} {detail}");
    let _ = std::io::stdout().flush();
}

/// Opens the device and prepares the kernels (hiprtc in a grandchild: it can abort).
fn open(a: &ChildArgs) -> Result<Result<Gpu, String>, String> {
    let sel = select(a.backend, a.device).map_err(|e| e.to_string())?;
    let backend = match sel {
        Selected::Gpu { backend, .. } => backend,
        Selected::Cpu { reason } => return Ok(Err(reason)),
    };
    let mut gpu = Gpu::open(backend, GpuConfig::default()).map_err(|e| e.to_string())?;
    // Only what the device checks launch: the model's kernels are the `kernels` check's, with
    // a budget of their own.
    let units = scope_units(KernelScope::Doctor).map_err(|e| e.to_string())?;
    gpu.prepare_kernels(
        &KernelCache::default_location(),
        &CompileMode::isolated(),
        &units,
        &mut |_| {},
    )
    .map_err(|e| e.to_string())?;
    Ok(Ok(gpu))
}

pub fn run(a: ChildArgs) -> i32 {
    let t = Instant::now();
    let mut gpu = match open(&a) {
        Ok(Ok(g)) => g,
        Ok(Err(no_gpu)) => {
            result("SKIP", &format!("no GPU: {no_gpu}"));
            return CHILD_SKIP;
        }
        Err(e) => {
            result("FAIL", &format!("device did not open: {e}"));
            return 1;
        }
    };
    let opened_ms = t.elapsed().as_millis();
    let r: Result<(bool, String), GpuError> = match a.check.as_str() {
        "probe" => {
            let i = gpu.info().clone();
            // How many GPUs the runtime lists: the doctor checks each of several (the count
            // is the detail's last part, which it reads).
            let n = match gpu.kind() {
                RuntimeKind::Hip => crate::gpu::hip::probe().map(|v| v.len()),
                RuntimeKind::Cuda => crate::gpu::cuda::probe().map(|v| v.len()),
                RuntimeKind::Fake => Ok(1),
            }
            .unwrap_or(1);
            Ok((
                true,
                format!(
                    "{} [{}], kernels ready in {opened_ms} ms, driver {}, runtime {} · {n} GPU{}",
                    i.name,
                    i.arch,
                    i.driver_version,
                    i.runtime_version,
                    if n == 1 { "" } else { "s" }
                ),
            ))
        }
        "peer" => peer(&mut gpu, &a),
        "kernels" => kernels(&mut gpu),
        "roundtrip" => roundtrip(&mut gpu),
        "ordering" => ordering(&mut gpu),
        "gemm" => gemm(&mut gpu),
        "bandwidth" => bandwidth(&mut gpu),
        "stress" => stress(&mut gpu),
        "clean-exit" => {
            // GPU work left queued, then a plain exit: the runtime's atexit handlers run with
            // work in flight (the exit hang: pytorch#160759, ROCm/TheRock#999).
            if let Err(e) = clean_exit_work(&mut gpu) {
                result("FAIL", &format!("{e}"));
                return 1;
            }
            result("PASS", "work enqueued, exiting without synchronizing");
            std::process::exit(0);
        }
        "hang" => {
            // A kernel that never finishes, waited for with no deadline: the doctor must kill
            // this child and name it.
            let r = gpu
                .create_arena(&ArenaPlan::new().with(Region::Activations, 1 << 20))
                .and_then(|_| gpu.launch_spin_on_flag("doctor · never released", None, 30_000_000))
                .and_then(|_| gpu.wait_idle(Duration::from_secs(86_400)));
            Err(r
                .err()
                .unwrap_or(GpuError::InvalidArgument("the spin kernel finished".into())))
        }
        other => {
            result("FAIL", &format!("unknown check {other:?}"));
            return 2;
        }
    };
    let (status, detail, code) = match r {
        Ok((true, d)) => ("PASS", d, 0),
        Ok((false, d)) => ("FAIL", d, 1),
        Err(e) => ("FAIL", format!("error: {e}"), 1),
    };
    let outcome = gpu.teardown(Duration::from_secs(5), &mut |_| {});
    result(status, &detail);
    if !outcome.clean {
        // Leave without the runtime's atexit handlers: they could wait on a wedged GPU.
        crate::app::quit::hard_exit_now(code);
    }
    code
}

/// A copy between two GPUs, each way: a patterned buffer uploaded to one, handed to the other
/// as a split model's activations cross (peer to peer where the runtime and link allow it, else
/// through pinned host memory), read back from there and compared; the bandwidth is the
/// hand-over's.
fn peer(gpu: &mut Gpu, a: &ChildArgs) -> Result<(bool, String), GpuError> {
    let Some(p) = a.peer else {
        return Ok((false, "no --peer GPU named".into()));
    };
    let mut other = match open(&ChildArgs {
        device: Some(p),
        ..a.clone()
    }) {
        Ok(Ok(g)) => g,
        Ok(Err(e)) | Err(e) => return Ok((false, format!("GPU {p} did not open: {e}"))),
    };
    let bytes: usize = 64 << 20;
    let mut report = Vec::new();
    let mut ok = true;
    let r = (|| -> Result<(), GpuError> {
        for g in [&mut *gpu, &mut other] {
            g.create_arena(&ArenaPlan::new().with(Region::Activations, bytes as u64 + (1 << 20)))?;
        }
        let (ba, bb) = (
            gpu.alloc(Region::Activations, bytes as u64)?,
            other.alloc(Region::Activations, bytes as u64)?,
        );
        let (la, lb) = (
            gpu.label("doctor · peer copy"),
            other.label("doctor · peer copy"),
        );
        let mut host = vec![0u8; bytes];
        for (dir, seed) in [("→", 17u32), ("←", 31)] {
            let data = pattern(bytes / 4, seed);
            let (src, dst) = if dir == "→" {
                ((&mut *gpu, ba, la), (&mut other, bb, lb))
            } else {
                ((&mut other, bb, lb), (&mut *gpu, ba, la))
            };
            src.0.upload(src.2, src.1, &data)?;
            src.0.wait_idle(Duration::from_secs(30))?;
            let t = Instant::now();
            // Peer to peer where the runtime and the link allow it (as a split model's
            // crossings go), else through pinned host memory.
            let peer = src
                .0
                .send_to_peer(src.2, src.1, dst.0, dst.2, dst.1, bytes)?;
            if !peer {
                src.0.download(src.2, src.1, &mut host)?;
                dst.0.upload(dst.2, dst.1, &host)?;
            }
            dst.0.wait_idle(Duration::from_secs(30))?;
            src.0.wait_idle(Duration::from_secs(30))?;
            let secs = t.elapsed().as_secs_f64().max(1e-9);
            let via = if peer {
                "peer to peer"
            } else {
                "via pinned host memory"
            };
            let mut back = vec![0xA5u8; bytes];
            dst.0.download(dst.2, dst.1, &mut back)?;
            let i = a.device.map_or("?".into(), |d| d.to_string());
            let (from, to) = if dir == "→" {
                (i.clone(), p.to_string())
            } else {
                (p.to_string(), i)
            };
            match compare_words(&data, &back) {
                None => report.push(format!(
                    "{from}→{to} {via} {:.1} GB/s intact",
                    bytes as f64 / secs / 1e9
                )),
                Some(e) => {
                    ok = false;
                    report.push(format!("{from}→{to}: {e}"));
                }
            }
        }
        Ok(())
    })();
    let _ = other.teardown(Duration::from_secs(5), &mut |_| {});
    r?;
    Ok((ok, format!("64 MiB each way: {}", report.join(", "))))
}

/// Lines a child writes on stderr to say how a long step goes: the doctor shows them as they come
/// (a first start's kernel compile), and never takes them for a hang.
pub const PROGRESS_PREFIX: &str = "hipscope-progress: ";

/// The model whose kernels the `kernels` check builds: the configured one, else the default one,
/// where the file is on disk (the doctor fetches nothing).
fn model_on_disk() -> Option<std::path::PathBuf> {
    // The settings as every command resolves them (the doctor's `--config` does not reach its
    // child; `HIPSCOPE_CONFIG` does).
    let configured = crate::app::settings::Settings::resolve(None)
        .ok()
        .and_then(|s| s.config.model);
    configured
        .or_else(|| crate::app::fetch::default_model_path().ok())
        .filter(|p| p.is_file())
}

/// The kernels a model runs on this device, compiled (several at once, in child processes) or
/// found in the cache, then loaded: the model's own where its file is on disk, else those every
/// model shares.
/// How the compile goes is said on stderr as it happens; a unit the compiler rejects or dies on
/// fails the check by name. A compile has its own budget (`doctor` gives this check longer than
/// the device checks, and each unit's compile is bounded by the compile machinery itself), so a
/// slow first start is reported as slow, never as a hang.
fn kernels(gpu: &mut Gpu) -> Result<(bool, String), GpuError> {
    let (scope, what) = match model_on_disk().and_then(|p| {
        let f = crate::model::gguf::GgufFile::open(&p).ok()?;
        Some((crate::model::loader::kernel_needs(&f), p))
    }) {
        Some((needs, p)) => (
            KernelScope::Model(needs),
            format!(
                "the kernels of {}",
                p.file_name().map_or(p.display().to_string(), |n| n
                    .to_string_lossy()
                    .into_owned())
            ),
        ),
        // No model yet: the kernels every model shares (its own types' come with it).
        None => (
            KernelScope::Model(crate::gpu::compute::KernelNeeds::default()),
            "the kernels every model shares (no model on disk)".to_string(),
        ),
    };
    let units = scope_units(scope)?;
    let t = Instant::now();
    let mut compiled = 0;
    let builds = gpu.prepare_kernels(
        &KernelCache::default_location(),
        &CompileMode::isolated(),
        &units,
        &mut |p| {
            compiled = p.done;
            errln!("{PROGRESS_PREFIX}{}", p.describe());
        },
    )?;
    let cached = builds
        .iter()
        .filter(|b| matches!(b.status, crate::gpu::kernels::BuildStatus::Cached))
        .count();
    Ok((
        true,
        format!(
            "{what}: {} units for {} ready in {:.1} s ({compiled} compiled, {cached} from the cache)",
            units.len(),
            gpu.info().arch,
            t.elapsed().as_secs_f64()
        ),
    ))
}

/// A word pattern that differs per word, per size and per seed, and is never zero.
fn pattern(words: usize, seed: u32) -> Vec<u8> {
    (0..words as u32)
        .flat_map(|i| (i.wrapping_mul(2_654_435_761) ^ seed ^ 0x8000_0001).to_le_bytes())
        .collect()
}

/// What came back from one round trip, against what went out: `None` when intact.
fn compare_words(data: &[u8], back: &[u8]) -> Option<String> {
    if back == data {
        return None;
    }
    let words = data.len() / 4;
    let zeros = back.chunks(4).filter(|w| w == &[0, 0, 0, 0]).count();
    let wrong = back
        .chunks(4)
        .zip(data.chunks(4))
        .filter(|(a, b)| a != b)
        .count();
    Some(format!("{wrong} of {words} words wrong ({zeros} zero)"))
}

/// Host → device → host of patterned buffers of several sizes, each through both paths: the
/// pinned staging buffers (hipscope's own copies) and ordinary pageable memory handed straight
/// to the runtime (what other programs do; the silent-zero reports, llama.cpp #28211). Each
/// path writes its own pattern, so a copy that silently does nothing shows as the other
/// path's data; the host buffer read into starts as a sentinel, so one that writes nothing
/// shows too.
fn roundtrip(gpu: &mut Gpu) -> Result<(bool, String), GpuError> {
    let sizes: [usize; 5] = [4, 4096, 65_536 + 12, 4 << 20, 48 << 20];
    gpu.create_arena(&ArenaPlan::new().with(Region::Activations, 64 << 20))?;
    let mut bad = Vec::new();
    let l = gpu.label("doctor · round trip");
    for (n, &bytes) in sizes.iter().enumerate() {
        let buf = gpu.alloc(Region::Activations, bytes as u64)?;
        for (path, pageable) in [("pinned", false), ("pageable", true)] {
            let seed = n as u32 * 7919 + if pageable { 104_729 } else { 0 };
            let data = pattern(bytes / 4, seed);
            let mut back = vec![0xA5u8; bytes];
            if pageable {
                gpu.upload_pageable(l, buf, &data)?;
                gpu.download_pageable(l, buf, &mut back)?;
            } else {
                gpu.upload(l, buf, &data)?;
                gpu.download(l, buf, &mut back)?;
            }
            if let Some(e) = compare_words(&data, &back) {
                bad.push(format!("{bytes} B {path}: {e}"));
            }
        }
        gpu.free(buf);
    }
    let sizes_s: Vec<String> = sizes
        .iter()
        .map(|s| crate::gpu::device::human_bytes(*s as u64))
        .collect();
    Ok(if bad.is_empty() {
        (
            true,
            format!(
                "{} read back intact, pinned and pageable",
                sizes_s.join(", ")
            ),
        )
    } else {
        (
            false,
            format!("data changed on the way: {}", bad.join("; ")),
        )
    })
}

/// A kernel (fill) then a copy then a download, on one stream, many times with a new value each
/// time: any reordering shows as an old value.
fn ordering(gpu: &mut Gpu) -> Result<(bool, String), GpuError> {
    let bytes = 256u64 << 10;
    gpu.create_arena(&ArenaPlan::new().with(Region::Activations, 4 << 20))?;
    let a = gpu.alloc(Region::Activations, bytes)?;
    let b = gpu.alloc(Region::Activations, bytes)?;
    let l = gpu.label("doctor · fill then copy");
    let rounds = 32u32;
    let mut out = vec![0u8; bytes as usize];
    for r in 0..rounds {
        let v = 0x5EED_0000 | r;
        gpu.upload(l, a, &pattern(bytes as usize / 4, r))?;
        gpu.fill_u32(l, a, v)?;
        gpu.copy_d2d(l, b, a, bytes)?;
        gpu.download(l, b, &mut out)?;
        if let Some(i) = out.chunks(4).position(|w| w != v.to_le_bytes()) {
            let got =
                u32::from_le_bytes([out[i * 4], out[i * 4 + 1], out[i * 4 + 2], out[i * 4 + 3]]);
            return Ok((
                false,
                format!(
                    "round {r}: word {i} is {got:#x}, expected {v:#x} (kernel and copy out of order)"
                ),
            ));
        }
    }
    Ok((
        true,
        format!("{rounds} rounds of upload → fill kernel → copy → download in order"),
    ))
}

fn rand_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// GEMM through the BLAS (where present) and hipscope's own kernel, each against the CPU.
fn gemm(gpu: &mut Gpu) -> Result<(bool, String), GpuError> {
    let (m, n, k) = (96usize, 80usize, 160usize);
    gpu.create_arena(&ArenaPlan::new().with(Region::Activations, 4 << 20))?;
    let a = rand_f32(m * k, 1);
    let b = rand_f32(k * n, 2);
    let mut want = vec![0f32; m * n];
    reference_sgemm(Op::N, Op::N, m, n, k, &a, m, &b, k, 0.0, &mut want, m);
    let da = gpu.alloc(Region::Activations, (a.len() * 4) as u64)?;
    let db = gpu.alloc(Region::Activations, (b.len() * 4) as u64)?;
    let dc = gpu.alloc(Region::Activations, (want.len() * 4) as u64)?;
    let l = gpu.label("doctor · gemm");
    gpu.upload(l, da, &f32_bytes(&a))?;
    gpu.upload(l, db, &f32_bytes(&b))?;
    let g = GemmF32 {
        transa: Op::N,
        transb: Op::N,
        m: m as i32,
        n: n as i32,
        k: k as i32,
        alpha: gpu.scalar(1.0)?,
        a: da.ptr,
        lda: m as i32,
        b: db.ptr,
        ldb: k as i32,
        beta: gpu.scalar(0.0)?,
        c: dc.ptr,
        ldc: m as i32,
    };
    let mut paths = vec![("hipscope kernel", true)];
    if let GemmPath::Blas { .. } = gpu.gemm_path() {
        paths.push(("BLAS", false));
    }
    let mut parts = Vec::new();
    let mut ok = true;
    for (name, own) in paths {
        gpu.fill_u32(l, dc, 0x7FC0_0000)?; // NaN: a GEMM that writes nothing fails.
        if own {
            gpu.gemm_f32_fallback(l, &g)?;
        } else {
            gpu.gemm_f32(l, &g)?;
        }
        let mut out = vec![0u8; want.len() * 4];
        gpu.download(l, dc, &mut out)?;
        let err = out
            .chunks(4)
            .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .zip(&want)
            .map(|(x, y)| {
                if x.is_finite() {
                    (x - y).abs() / y.abs().max(1.0)
                } else {
                    f32::INFINITY
                }
            })
            .fold(0f32, f32::max);
        ok &= err < 1e-4;
        parts.push(format!("{name} max rel. error {err:.1e}"));
    }
    Ok((ok, format!("{m}×{n}×{k} vs CPU: {}", parts.join(", "))))
}

/// Device-to-device copy and host-to-device upload rates.
fn bandwidth(gpu: &mut Gpu) -> Result<(bool, String), GpuError> {
    let bytes = 256u64 << 20;
    gpu.create_arena(&ArenaPlan::new().with(Region::Activations, 2 * bytes + (1 << 20)))?;
    let a = gpu.alloc(Region::Activations, bytes)?;
    let b = gpu.alloc(Region::Activations, bytes)?;
    let l = gpu.label("doctor · bandwidth");
    gpu.fill_u32(l, a, 1)?;
    gpu.copy_d2d(l, b, a, bytes)?;
    gpu.wait_idle(Duration::from_secs(30))?;
    let reps = 20;
    let t = Instant::now();
    for _ in 0..reps {
        gpu.copy_d2d(l, b, a, bytes)?;
    }
    gpu.wait_idle(Duration::from_secs(60))?;
    let d2d = (2 * bytes * reps) as f64 / t.elapsed().as_secs_f64() / 1e9;
    let host = vec![0x5Au8; bytes as usize];
    let t = Instant::now();
    gpu.upload(l, a, &host)?;
    gpu.wait_idle(Duration::from_secs(60))?;
    let h2d = bytes as f64 / t.elapsed().as_secs_f64() / 1e9;
    // What `bench`'s decode bound uses: a kernel that only reads (its own buffer, outside the
    // arena).
    let read = gpu.measure_read_bandwidth()?;
    Ok((
        d2d > 1.0,
        format!(
            "device copy {d2d:.0} GB/s (read + write), read {:.0} GB/s (read-only kernel over {} \
             MiB, best of {}), upload {h2d:.1} GB/s (256 MiB)",
            read.bytes_per_s / 1e9,
            read.buffer_bytes >> 20,
            read.runs
        ),
    ))
}

/// Many small allocations from one arena with a kernel on each (the RDNA3 hang under MES
/// firmware 0x83 and CWSR: ROCm/ROCm#5590, #5724).
fn stress(gpu: &mut Gpu) -> Result<(bool, String), GpuError> {
    gpu.create_arena(&ArenaPlan::new().with(Region::Activations, 64 << 20))?;
    let l = gpu.label("doctor · small allocations");
    let t = Instant::now();
    let mut n = 0u64;
    for round in 0..50u32 {
        let mut bufs = Vec::new();
        for i in 0..200u64 {
            let b = gpu.alloc(Region::Activations, 4096 + (i % 16) * 4096)?;
            gpu.fill_u32(l, b, round)?;
            bufs.push(b);
            n += 1;
        }
        gpu.wait_idle(Duration::from_secs(30))?;
        for b in bufs {
            gpu.free(b);
        }
    }
    Ok((
        true,
        format!(
            "{n} allocations with a kernel each in {:.0} ms",
            t.elapsed().as_secs_f64() * 1e3
        ),
    ))
}

fn clean_exit_work(gpu: &mut Gpu) -> Result<(), GpuError> {
    gpu.create_arena(&ArenaPlan::new().with(Region::Activations, 64 << 20))?;
    let a = gpu.alloc(Region::Activations, 32 << 20)?;
    let b = gpu.alloc(Region::Activations, 32 << 20)?;
    let l = gpu.label("doctor · left queued at exit");
    for i in 0..200u32 {
        gpu.fill_u32(l, a, i)?;
        gpu.copy_d2d(l, b, a, 32 << 20)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::fake::{FakeControl, FakeDevice, FakeScript};

    fn fake() -> (Gpu, FakeControl) {
        let be = FakeDevice::new(FakeScript::default());
        let ctl = be.control();
        let gpu = Gpu::open(Box::new(be), GpuConfig::default()).expect("open fake");
        (gpu, ctl)
    }

    #[test]
    fn round_trips_pass_intact_and_name_silent_zeros_on_both_paths() {
        let (mut gpu, _) = fake();
        let (ok, detail) = roundtrip(&mut gpu).expect("round trip");
        assert!(ok, "{detail}");
        assert!(detail.contains("pinned and pageable"), "{detail}");

        let (mut gpu, ctl) = fake();
        ctl.corrupt_uploads(true);
        let (ok, detail) = roundtrip(&mut gpu).expect("round trip");
        assert!(!ok, "{detail}");
        for part in ["4 B pinned", "4 B pageable", "50331648 B pageable", "zero"] {
            assert!(detail.contains(part), "{part} missing: {detail}");
        }
    }

    #[test]
    fn compare_counts_wrong_and_zero_words() {
        let data = pattern(4, 1);
        assert_eq!(compare_words(&data, &data), None);
        let mut back = data.clone();
        back[..4].copy_from_slice(&[0; 4]);
        back[8] ^= 1;
        assert_eq!(
            compare_words(&data, &back).as_deref(),
            Some("2 of 4 words wrong (1 zero)")
        );
    }
}
