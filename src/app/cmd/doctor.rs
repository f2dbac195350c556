//! `hipscope doctor`: says in a minute whether GPU inference will work on this machine. The
//! facts and known-issue rules are `gpu::doctor`; here the functional checks run, each in a child
//! process (`hipscope __doctor-check NAME`) killed at its deadline, so that a hang or a crash is
//! reported by name and the doctor goes on.
//!
//! The report ends with the verdict (`gpu::doctor::verdict`): whether GPU inference works here,
//! and if not, that models run on the CPU and the next step for each vendor.
//!
//! Exit codes: 0 no check failed (warnings allowed), 1 a check failed or hung (or, with
//! `--require-gpu`, GPU inference does not work here), 2 usage error (clap's own, or a
//! `--capture` directory that cannot be written).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;

use super::top::RootArgs;
use crate::app::stderr::errln;
use crate::gpu::doctor::report::{Check, EXIT_FAIL, EXIT_USAGE, Report, Status};
use crate::gpu::doctor::{self, facts, verdict};
use crate::gpu::select::BackendChoice;
use crate::gpu::telemetry::Roots;

#[derive(Args, Debug, Clone)]
pub struct DoctorArgs {
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Also write the sysfs/procfs files read, and the report, under DIR (for a bug report;
    /// `--sysfs-root DIR/sys --procfs-root DIR/proc` replays it).
    #[arg(long, value_name = "DIR")]
    pub capture: Option<PathBuf>,
    /// Add the many-small-allocations check (it reproduces a known RDNA3 hang that can need a
    /// reboot: ROCm/ROCm#5590, #5724).
    #[arg(long)]
    pub stress: bool,
    /// Skip the functional checks (no GPU work at all).
    #[arg(long)]
    pub no_functional: bool,
    /// Seconds each functional check may take before it is killed and reported as hung.
    #[arg(long, value_name = "S", default_value_t = 60)]
    pub deadline: u64,
    /// auto, hip or cuda.
    #[arg(long, default_value = "auto", value_parser = parse_backend)]
    pub backend: BackendChoice,
    /// GPU number as the runtime counts them.
    #[arg(long)]
    pub device: Option<u32>,
    /// Add a check whose child hangs on purpose (to see the hang reported).
    #[arg(long, hide = true)]
    pub inject_hang: bool,
    /// Run only these functional checks (kernels, roundtrip, ordering, gemm, bandwidth,
    /// clean-exit, stress, hang), comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    pub only: Vec<String>,
    /// Exit 1 unless GPU inference works here (for scripts that need a GPU).
    #[arg(long)]
    pub require_gpu: bool,
    #[command(flatten)]
    pub roots: RootArgs,
}

fn parse_backend(s: &str) -> Result<BackendChoice, String> {
    s.parse()
}

/// What happened to a child.
#[derive(Debug)]
enum Outcome {
    Exited {
        code: Option<i32>,
        status: Option<Status>,
        detail: String,
    },
    Hung,
    SpawnFailed(String),
}

fn backend_name(b: BackendChoice) -> &'static str {
    match b {
        BackendChoice::Auto => "auto",
        BackendChoice::Hip => "hip",
        BackendChoice::Cuda => "cuda",
        BackendChoice::Cpu => "cpu",
        BackendChoice::Fake => "fake",
    }
}

fn run_child(check: &str, a: &DoctorArgs, deadline: Duration) -> (Outcome, Duration) {
    run_child_with(check, a, deadline, None)
}

/// [`run_child`] with the second GPU of a pair (the `peer` check).
fn run_child_with(
    check: &str,
    a: &DoctorArgs,
    deadline: Duration,
    peer: Option<u32>,
) -> (Outcome, Duration) {
    let t = Instant::now();
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return (Outcome::SpawnFailed(e.to_string()), t.elapsed()),
    };
    let mut cmd = Command::new(exe);
    cmd.args([
        "__doctor-check",
        check,
        "--backend",
        backend_name(a.backend),
    ]);
    if let Some(d) = a.device {
        cmd.args(["--device", &d.to_string()]);
    }
    if let Some(p) = peer {
        cmd.args(["--peer", &p.to_string()]);
    }
    let mut child = match cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return (Outcome::SpawnFailed(e.to_string()), t.elapsed()),
    };
    // Drain the pipes on threads so a chatty child cannot block on a full pipe.
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = out.as_mut() {
            let _ = o.read_to_string(&mut s);
        }
        s
    });
    let err_t = std::thread::spawn(move || {
        // A child's progress lines (a first start's kernel compile) are shown as they come.
        use std::io::BufRead;
        let mut s = String::new();
        let mut live = super::progress::LiveLine::new();
        for l in err
            .take()
            .map(std::io::BufReader::new)
            .into_iter()
            .flat_map(|r| r.lines())
        {
            let Ok(l) = l else { break };
            match l.strip_prefix(super::doctor_child::PROGRESS_PREFIX) {
                Some(p) => live.update(p),
                None => s.push_str(&format!("{l}\n")),
            }
        }
        live.finish();
        s
    });
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if t.elapsed() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return (Outcome::SpawnFailed(e.to_string()), t.elapsed()),
        }
    };
    let elapsed = t.elapsed();
    let Some(status) = status else {
        return (Outcome::Hung, elapsed);
    };
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    let result = stdout.lines().rev().find_map(|l| l.strip_prefix("RESULT "));
    let (st, detail) = match result {
        Some(r) => {
            let (w, d) = r.split_once(' ').unwrap_or((r, ""));
            let st = match w {
                "PASS" => Some(Status::Pass),
                "FAIL" => Some(Status::Fail),
                "SKIP" => Some(Status::Skip),
                _ => None,
            };
            (st, d.to_string())
        }
        None => {
            let last = stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            (None, last.chars().take(200).collect())
        }
    };
    #[cfg(unix)]
    let code = {
        use std::os::unix::process::ExitStatusExt;
        status.code().or_else(|| status.signal().map(|s| -s))
    };
    #[cfg(not(unix))]
    let code = status.code();
    (
        Outcome::Exited {
            code,
            status: st,
            detail,
        },
        elapsed,
    )
}

/// The functional checks: name, what it proves, and the upstream issue a hang names.
const FUNCTIONAL: &[(&str, &str, &str)] = &[
    (
        "kernels",
        "the model's GPU kernels compile and load",
        "a compiler that never returns",
    ),
    (
        "roundtrip",
        "host↔device round trip",
        "silent zeros: llama.cpp #28211, #25863",
    ),
    (
        "ordering",
        "kernel and copy order on one stream",
        "null-stream mixing hangs",
    ),
    (
        "gemm",
        "GEMM (BLAS and own kernel) vs CPU",
        "rocBLAS without code for this GPU",
    ),
    (
        "bandwidth",
        "device bandwidth",
        "a throttled or misconfigured link",
    ),
    (
        "clean-exit",
        "exit with work in flight",
        "exit hang: pytorch#160759, ROCm/TheRock#999",
    ),
];

/// The functional checks on the GPU `--device` names; without it, on every GPU of the runtime
/// when there are several (each check's detail naming its GPU), then a peer copy for each pair.
fn functional(a: &DoctorArgs, report: &mut Report) {
    let n = match a.device {
        Some(_) => 1,
        None => gpu_count(a),
    };
    if n < 2 {
        functional_on(a, report);
        return;
    }
    for g in 0..n {
        let start = report.checks.len();
        functional_on(
            &DoctorArgs {
                device: Some(g),
                ..a.clone()
            },
            report,
        );
        for c in &mut report.checks[start..] {
            c.detail = format!("GPU {g}: {}", c.detail);
        }
    }
    if !a.only.is_empty() && !a.only.iter().any(|o| o == "peer") {
        return;
    }
    let deadline = Duration::from_secs(a.deadline.max(1));
    for i in 0..n {
        for j in i + 1..n {
            let on = DoctorArgs {
                device: Some(i),
                ..a.clone()
            };
            let (o, t) = run_child_with("peer", &on, deadline, Some(j));
            let name = format!("peer copy GPU {i} ↔ GPU {j}");
            let mut c = match o {
                Outcome::Exited {
                    status: Some(s),
                    detail,
                    ..
                } => Check::new("functional", &name, s, detail),
                Outcome::Exited { code, detail, .. } => Check::new(
                    "functional",
                    &name,
                    Status::Fail,
                    format!(
                        "crashed (exit {}): {detail}",
                        code.map(|c| c.to_string()).unwrap_or("?".into())
                    ),
                ),
                Outcome::Hung => Check::new(
                    "functional",
                    &name,
                    Status::Fail,
                    format!(
                        "HUNG — no end within {} s, child killed",
                        deadline.as_secs()
                    ),
                ),
                Outcome::SpawnFailed(e) => Check::new(
                    "functional",
                    &name,
                    Status::Fail,
                    format!("could not start a child: {e}"),
                ),
            };
            c.ms = Some(t.as_millis() as u64);
            report.push(c);
        }
    }
}

/// GPUs of the runtime `--backend` picks, as its `probe` child counts them (`… · 2 GPUs`); 1
/// when it cannot tell.
fn gpu_count(a: &DoctorArgs) -> u32 {
    match run_child("probe", a, Duration::from_secs(a.deadline.max(1))).0 {
        Outcome::Exited {
            status: Some(Status::Pass),
            detail,
            ..
        } => detail
            .rsplit_once(" · ")
            .and_then(|(_, n)| n.strip_suffix(" GPUs").or(n.strip_suffix(" GPU")))
            .and_then(|n| n.parse().ok())
            .unwrap_or(1),
        _ => 1,
    }
}

fn functional_on(a: &DoctorArgs, report: &mut Report) {
    let sec = "functional";
    let deadline = Duration::from_secs(a.deadline.max(1));
    let (probe, ms) = run_child("probe", a, deadline);
    let ms = Some(ms.as_millis() as u64);
    let mut c = match probe {
        Outcome::Exited {
            status: Some(Status::Pass),
            detail,
            ..
        } => Check::new(sec, "device opens, kernels compile", Status::Pass, detail),
        Outcome::Exited {
            status: Some(Status::Skip),
            detail,
            ..
        } => {
            let mut c = Check::new(sec, "device", Status::Skip, detail.clone());
            c.ms = ms;
            report.push(c);
            for (name, what, _) in FUNCTIONAL {
                report.push(Check::new(
                    sec,
                    *name,
                    Status::Skip,
                    format!("{what}: no GPU"),
                ));
            }
            return;
        }
        Outcome::Exited { code, detail, .. } => {
            let c = Check::new(
                sec,
                "device opens, kernels compile",
                Status::Fail,
                format!(
                    "exit {}: {detail}",
                    code.map(|c| c.to_string()).unwrap_or("?".into())
                ),
            );
            let mut c = c.advise(
                "the GPU runtime cannot open this device; see the environment and driver sections",
            );
            c.ms = ms;
            report.push(c);
            return;
        }
        Outcome::Hung => Check::new(
            sec,
            "device opens, kernels compile",
            Status::Fail,
            format!("hung: no answer in {} s (child killed)", deadline.as_secs()),
        )
        .advise("the runtime hangs on open: check dmesg for amdgpu errors"),
        Outcome::SpawnFailed(e) => Check::new(
            sec,
            "device",
            Status::Fail,
            format!("could not start a child: {e}"),
        ),
    };
    c.ms = ms;
    let opened = c.status == Status::Pass;
    report.push(c);
    if !opened {
        return;
    }
    let mut list: Vec<(&str, &str, &str)> = FUNCTIONAL.to_vec();
    if a.stress || a.only.iter().any(|o| o == "stress") {
        list.push((
            "stress",
            "many small allocations",
            "RDNA3 hang: ROCm/ROCm#5590, #5724",
        ));
    }
    if a.inject_hang || a.only.iter().any(|o| o == "hang") {
        list.push((
            "hang",
            "injected hang (a kernel that never ends)",
            "injected on purpose",
        ));
    }
    if !a.only.is_empty() {
        list.retain(|(n, ..)| a.only.iter().any(|o| o == n));
    }
    for (name, what, issue) in list {
        // A first start's compile has a budget of its own: slow is not hung (each unit's compile
        // is bounded inside the check, which fails naming it).
        let deadline = match name {
            "kernels" => deadline.max(Duration::from_secs(1800)),
            _ => deadline,
        };
        let (o, t) = run_child(name, a, deadline);
        let mut c = match o {
            Outcome::Exited {
                status: Some(s),
                detail,
                code,
            } => {
                let mut c = Check::new(sec, name, s, format!("{what}: {detail}"));
                if s == Status::Pass && code != Some(0) {
                    c.status = Status::Fail;
                    c.detail = format!(
                        "{what}: {detail}; but the process exited with {}",
                        code.map(|c| c.to_string()).unwrap_or("?".into())
                    );
                }
                c
            }
            Outcome::Exited { code, detail, .. } => Check::new(
                sec,
                name,
                Status::Fail,
                format!(
                    "{what}: crashed (exit {}): {detail}",
                    code.map(|c| c.to_string()).unwrap_or("?".into())
                ),
            ),
            Outcome::Hung => Check::new(
                sec,
                name,
                Status::Fail,
                format!(
                    "{what}: HUNG — no end within {} s, child killed",
                    deadline.as_secs()
                ),
            )
            .advise(format!("known cause: {issue}")),
            Outcome::SpawnFailed(e) => Check::new(
                sec,
                name,
                Status::Fail,
                format!("could not start a child: {e}"),
            ),
        };
        c.ms = Some(t.as_millis() as u64);
        report.push(c);
    }
}

/// Copies the files a report rests on under `dir` (sysfs and procfs shaped as on the machine).
fn capture(roots: &Roots, dir: &Path) -> std::io::Result<usize> {
    let mut n = 0;
    let mut copy = |from: &Path, rel: &Path| -> std::io::Result<()> {
        if let Ok(bytes) = std::fs::read(from) {
            let to = dir.join(rel);
            if let Some(p) = to.parent() {
                std::fs::create_dir_all(p)?;
            }
            std::fs::write(to, bytes)?;
            n += 1;
        }
        Ok(())
    };
    let files = [
        "vendor",
        "device",
        "revision",
        "uevent",
        "product_name",
        "gpu_busy_percent",
        "mem_busy_percent",
        "mem_info_vram_total",
        "mem_info_vram_used",
        "mem_info_vis_vram_total",
        "mem_info_vis_vram_used",
        "mem_info_gtt_total",
        "mem_info_gtt_used",
        "pp_dpm_sclk",
        "pp_dpm_mclk",
        "current_link_speed",
        "current_link_width",
        "power/runtime_status",
        "gpu_metrics",
    ];
    for c in crate::gpu::telemetry::sysfs::cards(roots) {
        let rel = PathBuf::from("sys/class/drm").join(&c.name).join("device");
        for f in files {
            copy(&c.device.join(f), &rel.join(f))?;
        }
        for sub in ["fw_version"] {
            if let Ok(rd) = std::fs::read_dir(c.device.join(sub)) {
                for e in rd.flatten() {
                    copy(&e.path(), &rel.join(sub).join(e.file_name()))?;
                }
            }
        }
        if let Some(h) = crate::gpu::telemetry::hwmon::dir(&c.device) {
            let hrel = rel.join("hwmon").join(h.file_name().unwrap_or_default());
            if let Ok(rd) = std::fs::read_dir(&h) {
                for e in rd.flatten() {
                    let name = e.file_name();
                    let s = name.to_string_lossy();
                    if ["name", "temp", "power", "fan", "pwm"]
                        .iter()
                        .any(|p| s.starts_with(p))
                    {
                        copy(&e.path(), &hrel.join(&name))?;
                    }
                }
            }
        }
    }
    if let Ok(rd) = std::fs::read_dir(roots.kfd_nodes()) {
        for e in rd.flatten() {
            copy(
                &e.path().join("properties"),
                &PathBuf::from("sys/class/kfd/kfd/topology/nodes")
                    .join(e.file_name())
                    .join("properties"),
            )?;
        }
    }
    for p in crate::gpu::telemetry::sysfs::MODULE_PARAMS {
        copy(
            &roots.sys.join("module/amdgpu/parameters").join(p),
            &PathBuf::from("sys/module/amdgpu/parameters").join(p),
        )?;
    }
    for f in ["sys/kernel/osrelease", "stat", "meminfo"] {
        copy(&roots.proc.join(f), &PathBuf::from("proc").join(f))?;
    }
    copy(Path::new("/etc/os-release"), Path::new("etc/os-release"))?;
    Ok(n)
}

pub fn run(a: DoctorArgs) -> i32 {
    let roots = a.roots.roots();
    let live = roots.is_live();
    let f = facts::gather(&roots, live);
    let mut report = Report::default();
    for c in doctor::environment(&f)
        .into_iter()
        .chain(doctor::devices(&f))
        .chain(doctor::driver(&f))
    {
        report.push(c);
    }
    if a.no_functional {
        report.push(Check::new(
            "functional",
            "checks",
            Status::Skip,
            "--no-functional",
        ));
    } else if !live {
        report.push(Check::new(
            "functional",
            "checks",
            Status::Skip,
            "reading a captured tree: no GPU work",
        ));
    } else {
        functional(&a, &mut report);
    }
    let verdict = verdict::decide(&f, &report, live && !a.no_functional);
    let text = format!("{}verdict: {}\n", report.text(), verdict.summary);
    let json = serde_json::json!({ "facts": &f, "checks": &report.checks, "verdict": &verdict })
        .to_string();
    if let Some(dir) = &a.capture {
        let r = capture(&roots, dir).and_then(|n| {
            std::fs::write(dir.join("doctor.txt"), &text)?;
            std::fs::write(dir.join("doctor.json"), &json)?;
            Ok(n)
        });
        match r {
            Ok(n) => errln!("captured {n} files and the report under {}", dir.display()),
            Err(e) => {
                errln!("error: writing the capture under {}: {e}", dir.display());
                return EXIT_USAGE;
            }
        }
    }
    if a.json {
        println!("{json}");
    } else {
        print!("hipscope doctor {}{text}", env!("CARGO_PKG_VERSION"));
    }
    if a.require_gpu && !verdict.gpu_works() {
        return EXIT_FAIL;
    }
    report.exit_code()
}
