//! The quit protocol's exits, each in a child process (they end the process): this test binary
//! re-runs itself with `HIPSCOPE_QUIT_CHILD=<scenario>` and the child takes the path while the
//! parent checks the exit code and what the exit hooks printed.

use std::process::Command;
use std::time::Duration;

use hipscope::app::exit_code::{HARD as EXIT_HARD, OK as EXIT_OK, PANIC as EXIT_PANIC};
use hipscope::app::quit::{QuitConfig, QuitCoordinator};
use hipscope::gpu::arena::{ArenaPlan, Region};
use hipscope::gpu::fake::{FakeControl, FakeDevice, FakeScript};
use hipscope::gpu::handle::{Arg, Gpu, GpuConfig};
use hipscope::gpu::kernels::{CompileMode, KernelCache};

const CHILD: &str = "HIPSCOPE_QUIT_CHILD";

/// Runs this test again in a child with the scenario set; returns (exit code, stdout).
fn spawn(test: &str, scenario: &str) -> (Option<i32>, String) {
    let exe = std::env::current_exe().expect("test binary");
    let out = Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, scenario)
        .output()
        .expect("spawn child");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

fn scenario() -> Option<String> {
    std::env::var(CHILD).ok()
}

fn gpu_with_stuck_kernel() -> (Gpu, FakeControl) {
    let be = FakeDevice::new(FakeScript::default());
    let ctl = be.control();
    let mut gpu = Gpu::open(
        Box::new(be),
        GpuConfig {
            runtime_reserve: 0,
            ..GpuConfig::default()
        },
    )
    .expect("open");
    gpu.prepare_kernels(
        &KernelCache::disabled(),
        &CompileMode::InProcess,
        &hipscope::gpu::compute::scope_units(hipscope::gpu::compute::KernelScope::All)
            .expect("units"),
        &mut |_| {},
    )
    .expect("kernels");
    gpu.create_arena(&ArenaPlan::new().with(Region::Activations, 1 << 20))
        .expect("arena");
    gpu.launch_spin_on_flag("stuck kernel", None, 1 << 40)
        .expect("launch");
    (gpu, ctl)
}

fn coordinator(drain_ms: u64, grace_ms: u64) -> std::sync::Arc<QuitCoordinator> {
    let q = QuitCoordinator::new(QuitConfig {
        drain_deadline: Duration::from_millis(drain_ms),
        grace: Duration::from_millis(grace_ms),
        hook_timeout: Duration::from_secs(2),
    });
    q.add_exit_hook("restore terminal", || println!("HOOK restore terminal"));
    q.add_exit_hook("flush transcript", || println!("HOOK flush transcript"));
    q
}

#[test]
fn drain_timeout_takes_the_hard_exit_after_running_the_hooks() {
    if scenario().as_deref() == Some("drain") {
        let (gpu, _ctl) = gpu_with_stuck_kernel();
        let q = coordinator(200, 5_000);
        q.begin();
        let outcome = gpu.teardown(q.config().drain_deadline, &mut |s| {
            println!("STEP {} {:?}", s.name, s.status)
        });
        q.finish_teardown(&outcome);
        println!("UNREACHABLE returned from finish");
        return;
    }
    let (code, out) = spawn(
        "drain_timeout_takes_the_hard_exit_after_running_the_hooks",
        "drain",
    );
    assert_eq!(code, Some(EXIT_HARD), "{out}");
    assert!(out.contains("STEP drain stream Failed"), "{out}");
    assert!(out.contains("STEP destroy stream Skipped"), "{out}");
    let r = out.find("HOOK restore terminal").expect("hook ran");
    let f = out.find("HOOK flush transcript").expect("hook ran");
    assert!(r < f, "hooks run in order");
    assert!(
        out.contains("exiting with code 3 without GPU cleanup"),
        "{out}"
    );
    assert!(!out.contains("UNREACHABLE"));
}

#[test]
fn a_clean_quit_returns_zero_after_every_step() {
    if scenario().as_deref() == Some("clean") {
        let be = FakeDevice::new(FakeScript::default());
        let mut gpu = Gpu::open(Box::new(be), GpuConfig::default()).expect("open");
        gpu.prepare_kernels(
            &KernelCache::disabled(),
            &CompileMode::InProcess,
            &hipscope::gpu::compute::scope_units(hipscope::gpu::compute::KernelScope::All)
                .expect("units"),
            &mut |_| {},
        )
        .expect("kernels");
        gpu.create_arena(&ArenaPlan::new().with(Region::Activations, 1 << 20))
            .expect("arena");
        let f = gpu.function("hs_busy").expect("busy");
        let out = gpu.alloc(Region::Activations, 1024).expect("out");
        let l = gpu.label("work before quit");
        for _ in 0..8 {
            gpu.launch(
                l,
                f,
                [1, 1, 1],
                [64, 1, 1],
                0,
                &[out.into(), Arg::U32(256), Arg::U32(1)],
            )
            .expect("launch");
        }
        let q = coordinator(2_000, 5_000);
        q.begin();
        let outcome = gpu.teardown(q.config().drain_deadline, &mut |s| {
            println!("STEP {} {:?}", s.name, s.status)
        });
        let code = q.finish_teardown(&outcome);
        println!("RETURNED {code}");
        std::process::exit(code);
    }
    let (code, out) = spawn("a_clean_quit_returns_zero_after_every_step", "clean");
    assert_eq!(code, Some(EXIT_OK), "{out}");
    assert_eq!(out.matches(" Done").count(), 6, "{out}");
    assert!(
        out.contains("HOOK restore terminal") && out.contains("RETURNED 0"),
        "{out}"
    );
}

#[test]
fn a_second_interrupt_forces_the_hard_exit() {
    if scenario().as_deref() == Some("sigint") {
        let (_gpu, _ctl) = gpu_with_stuck_kernel();
        let q = coordinator(60_000, 60_000);
        q.set_interrupt_handler(|_| println!("GRACEFUL quit requested"));
        let to = q.clone();
        hipscope::app::signals::listen(move |name| to.signal(name)).expect("signals");
        // SAFETY: raising a signal at our own process; the handler thread takes it.
        unsafe { libc::raise(libc::SIGINT) };
        std::thread::sleep(Duration::from_millis(300));
        println!("FIRST handled");
        // SAFETY: as above.
        unsafe { libc::raise(libc::SIGINT) };
        std::thread::sleep(Duration::from_secs(30));
        println!("UNREACHABLE still alive");
        return;
    }
    let (code, out) = spawn("a_second_interrupt_forces_the_hard_exit", "sigint");
    assert_eq!(code, Some(EXIT_HARD), "{out}");
    let g = out
        .find("GRACEFUL quit requested")
        .expect("first interrupt");
    let h = out.find("HOOK restore terminal").expect("hooks");
    assert!(g < h, "{out}");
    assert!(out.contains("second interrupt"), "{out}");
    assert!(!out.contains("UNREACHABLE"), "{out}");
}

#[test]
fn the_quit_timer_exits_when_the_worker_is_stuck_inside_a_runtime_call() {
    if scenario().as_deref() == Some("stuck-worker") {
        let (gpu, ctl) = gpu_with_stuck_kernel();
        // The runtime wedges: the worker's own event query will never return.
        ctl.block_event_queries(true);
        let q = coordinator(100, 100);
        q.begin();
        println!("WORKER entering teardown");
        let outcome = gpu.teardown(Duration::from_secs(600), &mut |_| {});
        println!("UNREACHABLE teardown returned {}", outcome.clean);
        return;
    }
    let (code, out) = spawn(
        "the_quit_timer_exits_when_the_worker_is_stuck_inside_a_runtime_call",
        "stuck-worker",
    );
    assert_eq!(code, Some(EXIT_HARD), "{out}");
    assert!(out.contains("WORKER entering teardown"), "{out}");
    assert!(out.contains("quit did not finish within 0.2 s"), "{out}");
    assert!(out.contains("HOOK flush transcript"), "{out}");
    assert!(!out.contains("UNREACHABLE"), "{out}");
}

#[test]
fn a_panic_restores_the_terminal_and_leaves_with_101() {
    if scenario().as_deref() == Some("panic") {
        let q = coordinator(100, 100);
        q.install_panic_hook();
        let h = std::thread::spawn(|| panic!("worker bug"));
        let _ = h.join();
        std::thread::sleep(Duration::from_secs(30));
        println!("UNREACHABLE");
        return;
    }
    let (code, out) = spawn("a_panic_restores_the_terminal_and_leaves_with_101", "panic");
    assert_eq!(code, Some(EXIT_PANIC), "{out}");
    assert!(
        out.contains("worker bug") && out.contains("HOOK restore terminal"),
        "{out}"
    );
    assert!(!out.contains("UNREACHABLE"));
}
