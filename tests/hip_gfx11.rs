//! The real targets: gfx1100 (RX 7900 XTX) and gfx1151 (Strix Halo). Debian bookworm's ROCm 5.2
//! aborts on them, so this runs the built `hipscope` inside a Debian trixie chroot (HIP/hiprtc
//! 5.7.1, LLVM 17) made by `scripts/rocm-chroot.sh`, where it loads `libamdhip64.so.5` at run
//! time and compiles every kernel for both arches. The chroot lives at `HIPSCOPE_TRIXIE_ROOT`,
//! default `<repo>/.ci-cache/trixie`. Needs root (chroot). Fails, never skips, without it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    std::env::var_os("HIPSCOPE_TRIXIE_ROOT")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci-cache/trixie"))
}

/// Copies the hipscope binary into the chroot, runs it there with `args`, removes it.
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
    // One run at a time: a copy still open for writing in a sibling test's fork makes exec
    // fail with ETXTBSY (exit 126).
    static ONE_AT_A_TIME: std::sync::Mutex<u32> = std::sync::Mutex::new(0);
    let mut guard = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    *guard += 1;
    let n = *guard;
    let name = format!("hipscope-test-{}-{n}", std::process::id());
    let inside = root.join(&name);
    std::fs::copy(env!("CARGO_BIN_EXE_hipscope"), &inside).expect("copy hipscope into the chroot");
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

#[test]
fn every_kernel_compiles_for_gfx1100_and_gfx1151_with_hiprtc_5_7() {
    let out = run_in_chroot(
        &[
            "kernels",
            "--compile",
            "--arch",
            "gfx1100,gfx1151",
            "--no-cache",
        ],
        &[],
    );
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
        assert_eq!(row.matches(" ok ").count(), 2, "{}: {row}", u.name);
    }
    let n = units.len() * 2;
    assert!(text.contains(&format!("{n} of {n} compiled")), "{text}");
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
