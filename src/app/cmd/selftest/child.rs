//! The checks that must run in a child process: HUNG and the hard-exit quit on a kernel that
//! never finishes, and a normal quit.

use std::io::{BufRead, BufReader, Write as _};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use crate::app::cmd::usage::outln;
use crate::app::exit_code;
use crate::app::quit::{QuitConfig, QuitCoordinator, describe_step};
use crate::app::stderr::errln;
use crate::gpu::arena::{ArenaPlan, Region};
use crate::gpu::device::GpuError;
use crate::gpu::handle::{Arg, Gpu};
use crate::gpu::snapshot::QuitStepStatus;
use crate::gpu::stream::Budget;
use crate::gpu::watchdog::{WatchConfig, WatchEvent, Watchdog};

use super::chat_hang::GRAPHS_SUFFIX;
use super::setup::*;

/// Runs a child scenario and turns its output and exit code into a row.
pub(super) fn child_row(check: &'static str, scenario: &str, opts: &SelftestOptions) -> Row {
    match run_child(scenario, opts) {
        Ok((pass, detail)) => Row {
            check,
            pass,
            detail,
        },
        Err(e) => Row {
            check,
            pass: false,
            detail: e,
        },
    }
}

pub(super) fn run_child(scenario: &str, opts: &SelftestOptions) -> Result<(bool, String), String> {
    let exe = crate::gpu::kernels::self_exe().ok_or("cannot find this program's path")?;
    let mut cmd = Command::new(exe);
    cmd.arg("selftest")
        .arg("--child")
        .arg(scenario)
        .arg("--backend")
        .arg(opts.backend.to_string());
    if let Some(d) = opts.device {
        cmd.arg("--device").arg(d.to_string());
    }
    if opts.no_cache {
        cmd.arg("--no-cache");
    }
    if let Some(phase) = scenario.strip_prefix("chat-hang:") {
        // `decode+graphs`: the same fault, with the decode step replayed as a graph.
        let fault = phase.strip_suffix(GRAPHS_SUFFIX).unwrap_or(phase);
        cmd.env("HIPSCOPE_FAULT", format!("hang:{fault}"));
    }
    let t0 = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the child: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = Vec::new();
    let mut quit_begin: Option<Instant> = None;
    for l in BufReader::new(stdout).lines().map_while(Result::ok) {
        if l.starts_with("@quit-begin") {
            quit_begin = Some(Instant::now());
        }
        outln!("  [{scenario}] {l}");
        lines.push(l);
    }
    let status = child.wait().map_err(|e| format!("wait: {e}"))?;
    let exited = Instant::now();
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    for l in err.lines().filter(|l| !l.trim().is_empty()) {
        outln!("  [{scenario}] stderr: {l}");
    }
    let code = status.code();
    let total = t0.elapsed();
    let quit_ms = quit_begin.map(|q| (exited - q).as_secs_f64() * 1e3);
    let field = |prefix: &str, key: &str| -> Option<String> {
        lines.iter().find(|l| l.starts_with(prefix)).and_then(|l| {
            l.split(" | ")
                .find_map(|kv| kv.strip_prefix(&format!("{key}=")).map(str::to_string))
        })
    };
    match scenario {
        s if s.starts_with("chat-hang:") => Ok(super::chat_hang::verdict(
            &lines,
            code,
            quit_ms,
            s.ends_with(GRAPHS_SUFFIX),
        )),
        "hang" => {
            let label = field("@hung", "op").unwrap_or_default();
            let detect: f64 = field("@hung", "detected_ms")
                .and_then(|s| s.parse().ok())
                .unwrap_or(f64::NAN);
            let budget: f64 = field("@hung", "budget_ms")
                .and_then(|s| s.parse().ok())
                .unwrap_or(f64::NAN);
            let report = field("@hung", "report").unwrap_or_else(|| "-".into());
            let deadline = field("@quit-begin", "deadline_ms")
                .and_then(|s| s.parse::<f64>().ok())
                .unwrap_or(f64::NAN);
            let limit = deadline + QuitConfig::default().grace.as_secs_f64() * 1e3;
            let pass = code == Some(crate::app::exit_code::HARD)
                && label == "selftest · spin on host flag (never released)"
                && detect >= budget
                && detect <= budget + 250.0
                && quit_ms.is_some_and(|q| q <= limit);
            Ok((
                pass,
                format!(
                    "HUNG '{label}' detected {detect:.0} ms after launch (budget {budget:.0} ms); \
                     quit left in {:.0} ms (drain deadline {deadline:.0} ms) with exit code {} \
                     (want {}); report {report}; child ran {:.1} s",
                    quit_ms.unwrap_or(f64::NAN),
                    code.map(|c| c.to_string())
                        .unwrap_or_else(|| "none (signal)".into()),
                    crate::app::exit_code::HARD,
                    total.as_secs_f64()
                ),
            ))
        }
        _ => {
            let steps: Vec<&String> = lines.iter().filter(|l| l.starts_with("@step")).collect();
            let done = steps.iter().filter(|l| l.contains("| status=done")).count();
            let pass = code == Some(0) && !steps.is_empty() && done == steps.len();
            Ok((
                pass,
                format!(
                    "exit code {} after {done}/{} steps done; quit took {:.0} ms",
                    code.map(|c| c.to_string())
                        .unwrap_or_else(|| "none (signal)".into()),
                    steps.len(),
                    quit_ms.unwrap_or(f64::NAN)
                ),
            ))
        }
    }
}

pub(super) fn small_arena(gpu: &mut Gpu) -> Result<(), GpuError> {
    gpu.create_arena(&ArenaPlan::new().with(Region::Activations, 1 << 20))
}

/// Child: a kernel that never finishes → HUNG → quit with a 1 s drain → hard exit (code 3).
pub(super) fn child_hang(opts: &SelftestOptions) -> i32 {
    let start = Instant::now();
    let (mut gpu, _) = match open(opts, true) {
        Ok(g) => g,
        Err(e) => {
            errln!("{e}");
            return exit_code::USAGE;
        }
    };
    let r = (|| -> Result<i32, GpuError> {
        small_arena(&mut gpu)?;
        gpu.start_event_prober(PROBE_INTERVAL);
        let (tx, rx) = channel::<WatchEvent>();
        let tx = Mutex::new(tx);
        let dog = Watchdog::spawn(
            gpu.stream_shared(),
            gpu.info(),
            WatchConfig {
                tick: Duration::from_millis(10),
                ..WatchConfig::default()
            },
            Box::new(move |ev| {
                if let Ok(t) = tx.lock() {
                    let _ = t.send(ev);
                }
            }),
        )
        .map_err(|e| GpuError::InvalidArgument(format!("watchdog: {e}")))?;
        let budget = Budget {
            slow: Duration::from_millis(100),
            hung: Duration::from_millis(500),
        };
        // The poll limit (≈ tens of seconds) only guards a shared GPU if process teardown
        // failed to stop the kernel.
        gpu.launch_spin_on_flag(
            "selftest · spin on host flag (never released)",
            Some(budget),
            30_000_000,
        )?;
        let launched = Instant::now();
        print_flush(&format!(
            "@launched | op={} | at_ms={:.0}",
            "spin",
            start.elapsed().as_secs_f64() * 1e3
        ));
        let mut hung = None;
        while launched.elapsed() < Duration::from_secs(10) {
            if let Ok(WatchEvent::Hung {
                snapshot,
                report_error,
            }) = rx.recv_timeout(Duration::from_millis(50))
            {
                hung = Some((launched.elapsed(), snapshot, report_error));
                break;
            }
        }
        let Some((at, snap, report_error)) = hung else {
            print_flush("@no-hung | the watchdog did not report HUNG within 10 s");
            return Ok(4);
        };
        print_flush(&format!(
            "@hung | op={} | detected_ms={:.0} | age_ms={:.0} | budget_ms={:.0} | started={} | depth={} | stream={} | report={}",
            snap.op.as_deref().unwrap_or("-"),
            at.as_secs_f64() * 1e3,
            snap.age.as_secs_f64() * 1e3,
            snap.budget.as_secs_f64() * 1e3,
            snap.op_started,
            snap.queue_depth,
            snap.stream,
            snap.report
                .as_ref()
                .map(|p| p.display().to_string())
                .or(report_error)
                .unwrap_or_else(|| "-".into())
        ));
        let q = QuitCoordinator::new(QuitConfig {
            drain_deadline: Duration::from_secs(1),
            ..QuitConfig::default()
        });
        q.add_exit_hook("flush", || {
            let _ = std::io::stdout().flush();
        });
        dog.stop();
        print_flush(&format!(
            "@quit-begin | deadline_ms={}",
            q.config().drain_deadline.as_millis()
        ));
        q.begin();
        let outcome = gpu.teardown(q.config().drain_deadline, &mut |s| {
            if s.status != QuitStepStatus::Running {
                print_flush(&format!(
                    "@step {} | status={}",
                    describe_step(&s),
                    status_word(&s.status)
                ));
            }
        });
        // Not clean: this does not return (hard exit, code 3).
        Ok(q.finish_teardown(&outcome))
    })();
    match r {
        Ok(code) => code,
        Err(e) => {
            errln!("{e}");
            2
        }
    }
}

pub(super) fn status_word(s: &QuitStepStatus) -> &'static str {
    match s {
        QuitStepStatus::Running => "running",
        QuitStepStatus::Done => "done",
        QuitStepStatus::Skipped(_) => "skipped",
        QuitStepStatus::Failed(_) => "failed",
    }
}

/// Child: some work in flight, then a normal quit that must end with code 0 after every step.
pub(super) fn child_quit(opts: &SelftestOptions) -> i32 {
    let (mut gpu, _) = match open(opts, true) {
        Ok(g) => g,
        Err(e) => {
            errln!("{e}");
            return exit_code::USAGE;
        }
    };
    let r = (|| -> Result<i32, GpuError> {
        small_arena(&mut gpu)?;
        gpu.start_event_prober(PROBE_INTERVAL);
        let f = gpu.function("hs_busy")?;
        let out = gpu.alloc(Region::Activations, 256 * 4)?;
        let l = gpu.label("selftest · busy before quit");
        for _ in 0..64 {
            gpu.launch(
                l,
                f,
                [1, 1, 1],
                [256, 1, 1],
                0,
                &[out.into(), Arg::U32(256), Arg::U32(20_000)],
            )?;
        }
        print_flush(&format!(
            "@in-flight | depth={}",
            gpu.stream_snapshot().queue_depth
        ));
        let q = QuitCoordinator::new(QuitConfig::default());
        q.add_exit_hook("flush", || {
            let _ = std::io::stdout().flush();
        });
        print_flush(&format!(
            "@quit-begin | deadline_ms={}",
            q.config().drain_deadline.as_millis()
        ));
        q.begin();
        let outcome = gpu.teardown(q.config().drain_deadline, &mut |s| {
            if s.status != QuitStepStatus::Running {
                print_flush(&format!(
                    "@step {} | status={}",
                    describe_step(&s),
                    status_word(&s.status)
                ));
            }
        });
        let code = q.finish_teardown(&outcome);
        print_flush(&format!("@exit | code={code}"));
        Ok(code)
    })();
    match r {
        Ok(code) => code,
        Err(e) => {
            errln!("{e}");
            2
        }
    }
}
