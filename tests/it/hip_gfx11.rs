//! The real targets: gfx1100 (RX 7900 XTX) and gfx1151 (Strix Halo). Debian bookworm's ROCm 5.2
//! aborts on them, so this runs the built `hipscope` inside a Debian trixie chroot (HIP/hiprtc
//! 5.7.1, LLVM 17) made by `scripts/rocm-chroot.sh`, where it loads `libamdhip64.so.5` at run
//! time and compiles every kernel for both arches (one test each, once per run). The chroot lives
//! at `HIPSCOPE_TRIXIE_ROOT`, default `<repo>/.ci-cache/trixie`. Needs root (chroot). Fails, never
//! skips, without it (`scripts/test.sh` run without root leaves these out and says so).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    std::env::var_os("HIPSCOPE_TRIXIE_ROOT")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci-cache/trixie"))
}

/// Puts the hipscope binary into the chroot, runs it there with `args`, removes it.
fn run_in_chroot(args: &[&str], env: &[(&str, &str)]) -> Output {
    let root = root();
    let lib = root.join("usr/lib/x86_64-linux-gnu/libamdhip64.so.5");
    assert!(
        lib.exists(),
        "no trixie ROCm chroot at {} (missing {}): build it with `sudo scripts/rocm-chroot.sh {}` \
         or point HIPSCOPE_TRIXIE_ROOT at one",
        root.display(),
        lib.display(),
        root.display()
    );
    // SAFETY: geteuid only reads the process's credentials.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "chroot needs root: run this test as root (CI does)"
    );
    // The binary goes in by a hard link (no copy, so no file open for writing that a sibling
    // test's fork could inherit, which makes the exec fail with ETXTBSY, exit 126); where the
    // chroot is on another filesystem, by a copy, one run at a time.
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("hipscope-test-{}-{n}", std::process::id());
    let inside = root.join(&name);
    let exe = env!("CARGO_BIN_EXE_hipscope");
    let _one = match std::fs::hard_link(exe, &inside) {
        Ok(()) => None,
        Err(_) => {
            let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
            std::fs::copy(exe, &inside).expect("copy hipscope into the chroot");
            Some(guard)
        }
    };
    let mut cmd = Command::new("chroot");
    cmd.arg(&root)
        .arg(format!("/{name}"))
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("HOME", "/root");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output();
    let _ = std::fs::remove_file(&inside);
    let out = out.expect("run chroot");
    println!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Every kernel module compiled from source (no cache) for `arch`, in its ordinary or its
/// stamped build (kernels/prelude.h `HS_STAMPS`). One test per arch, so that the two compiles
/// (minutes each on 2 cores) can run side by side; one compiles each build, so that both builds
/// of every unit are compiled by this hiprtc for gfx11.
fn every_kernel_compiles_for(arch: &str, stamped: bool) {
    let mut args = vec!["kernels", "--compile", "--arch", arch, "--no-cache"];
    if stamped {
        args.push("--stamped");
    }
    let out = run_in_chroot(&args, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "exit {:?}", out.status);
    assert!(text.contains("compiler: hiprtc 5.7"), "{text}");
    let units = hipscope::gpu::compute::units::kernel_units(
        &hipscope::gpu::kernels::KernelSources::embedded(),
        hipscope::gpu::compute::KernelScope::All,
    )
    .expect("units");
    for u in &units {
        let row = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(u.name.as_str()))
            .unwrap_or_else(|| panic!("no row for {}", u.name));
        assert_eq!(row.matches(" ok ").count(), 1, "{}: {row}", u.name);
    }
    let n = units.len();
    assert!(text.contains(&format!("{n} of {n} compiled")), "{text}");
}

#[test]
fn every_kernel_compiles_for_gfx1100_with_hiprtc_5_7() {
    every_kernel_compiles_for("gfx1100", false);
}

#[test]
fn every_kernel_compiles_for_gfx1151_with_hiprtc_5_7_stamped() {
    every_kernel_compiles_for("gfx1151", true);
}

#[test]
fn an_arch_this_compiler_aborts_on_is_refused_and_when_forced_contained() {
    // LLVM 17 does not know gfx1200 and aborts inside comgr.
    let out = run_in_chroot(
        &["kernels", "--compile", "--arch", "gfx1200", "--no-cache"],
        &[],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("REFUSED") && text.contains("gfx12 needs ROCm 6.2"),
        "{text}"
    );
    let out = run_in_chroot(
        &["kernels", "--compile", "--arch", "gfx1200", "--no-cache"],
        &[("HIPSCOPE_FORCE_COMPILE", "1")],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "hipscope itself survived: {text}"
    );
    assert!(
        text.contains("CRASHED") && text.contains("killed by signal"),
        "{text}"
    );
}
