//! The chat's watchdog on a GPU, in a child process per phase: the chat's own worker
//! (`model::worker`, its backend opened by `gpu::open` with the process's one watchdog) on a
//! synthetic SmolLM2-135M (Q4_0), with `HIPSCOPE_FAULT=hang:PHASE` putting a kernel that never
//! finishes (`hs_spin_on_flag`) on the stream while the model loads, during prompt processing or
//! in a decode step. The child prints the watchdog's HUNG verdict as the UI receives it (op, age,
//! the report's path) and then quits as the chat does, with a 1 s drain; the parent checks the
//! report exists, HUNG came within the budget, and the process left within the quit's deadline.

use std::time::{Duration, Instant};

use tokio::sync::mpsc::error::TryRecvError;

use crate::app::exit_code;
use crate::app::quit::{QuitConfig, QuitCoordinator};
use crate::gpu::compute::ComputeOptions;
use crate::gpu::open::{BackendRequest, open};
use crate::gpu::snapshot::WatchState;
use crate::model::loader::LoadOptions;
use crate::model::protocol::{Command, Event, ModelSource};
use crate::model::worker::{self, WorkerOptions};

use super::setup::{SelftestOptions, print_flush};

/// A phase with this suffix runs with graph replay on; without it, off.
pub(super) const GRAPHS_SUFFIX: &str = "+graphs";

/// The quit's drain deadline in the child.
const DRAIN: Duration = Duration::from_secs(1);

/// Child: runs the worker until the watchdog reports HUNG with its report, then quits.
pub(super) fn child_chat_hang(opts: &SelftestOptions, phase: &str) -> i32 {
    let start = Instant::now();
    let ms = |t: Instant| t.duration_since(start).as_secs_f64() * 1e3;
    let graphs = phase.ends_with(GRAPHS_SUFFIX);
    let request = BackendRequest {
        choice: opts.backend,
        device: opts.device,
        threads: 0,
        compute: ComputeOptions {
            graphs,
            ..ComputeOptions::default()
        },
    };
    let q = QuitCoordinator::new(QuitConfig {
        drain_deadline: DRAIN,
        ..QuitConfig::default()
    });
    let mut w = worker::spawn(WorkerOptions {
        source: Some(ModelSource::Synthetic {
            shape: "smollm2-135m".into(),
            quant: "Q4_0".into(),
            seed: 1,
        }),
        default_model: Box::new(|_| Err("the selftest names its model".into())),
        backend: Box::new(move |sink, _, progress| open(&request, sink, progress).map(|(b, _)| b)),
        load: LoadOptions {
            n_ctx: Some(1024),
            ..LoadOptions::default()
        },
        system: None,
        drain_deadline: DRAIN,
        remote_poll: std::time::Duration::from_millis(500),
    });
    let mut hung = None;
    while hung.is_none() && start.elapsed() < Duration::from_secs(120) {
        match w.events.try_recv() {
            Ok(Event::ModelLoaded { device, .. }) => {
                print_flush(&format!(
                    "@loaded | backend={} | device={} | graphs={} | at_ms={:.0}",
                    device.backend,
                    device.name,
                    device.graphs.as_deref().unwrap_or("-"),
                    ms(Instant::now())
                ));
                if phase != "load" {
                    let _ = w.commands.send(Command::Generate {
                        user: "Write a long story about a dragon who learns to cook.".into(),
                    });
                }
            }
            Ok(Event::AnswerStarted { .. }) => print_flush(&format!(
                "@answer-started | at_ms={:.0}",
                ms(Instant::now())
            )),
            Ok(Event::Error { context, message }) => {
                print_flush(&format!("@error | {context}: {message}"))
            }
            Ok(Event::Watchdog(s))
                if s.state == WatchState::Hung
                    && (s.report.is_some() || s.report_error.is_some()) =>
            {
                hung = Some(s)
            }
            Ok(_) => {}
            Err(TryRecvError::Empty) => std::thread::sleep(Duration::from_millis(5)),
            Err(TryRecvError::Disconnected) => break,
        }
    }
    let Some(s) = hung else {
        print_flush("@no-hung | the watchdog did not report HUNG within 120 s");
        return 4;
    };
    let report = s.report.as_ref().map(|p| p.display().to_string());
    print_flush(&format!(
        "@hung | op={} | age_ms={:.0} | budget_ms={:.0} | stream={} | report={} | report_exists={} | at_ms={:.0}",
        s.op.as_deref().unwrap_or("-"),
        s.age.as_secs_f64() * 1e3,
        s.budget.as_secs_f64() * 1e3,
        s.stream,
        report
            .clone()
            .or(s.report_error.clone())
            .unwrap_or_else(|| "-".into()),
        s.report.as_ref().is_some_and(|p| p.is_file()),
        ms(Instant::now())
    ));
    // As the chat quits: the coordinator's timer bounds the whole quit, the worker drains with
    // its deadline and reports how the device was released.
    print_flush(&format!(
        "@quit-begin | deadline_ms={}",
        (q.config().drain_deadline + q.config().grace).as_millis()
    ));
    q.begin();
    let _ = w.commands.send(Command::Quit {
        drain_deadline: DRAIN,
    });
    loop {
        match w.events.try_recv() {
            Ok(Event::Exited { release }) => {
                let code = exit_code::after(release);
                print_flush(&format!("@exit | code={code}"));
                return q.finish(code, Some("the stuck kernel was not waited for"));
            }
            Ok(_) => {}
            Err(TryRecvError::Empty) => std::thread::sleep(Duration::from_millis(5)),
            // The worker is gone without an answer: the coordinator's timer ends the process.
            Err(TryRecvError::Disconnected) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// The parent's verdict on a child's output lines, exit code and quit time. With `graphs`, the
/// stuck kernel must have been named from inside the replayed graph (its breadcrumb).
pub(super) fn verdict(
    lines: &[String],
    code: Option<i32>,
    quit_ms: Option<f64>,
    graphs: bool,
) -> (bool, String) {
    let field = |prefix: &str, key: &str| -> Option<String> {
        lines.iter().find(|l| l.starts_with(prefix)).and_then(|l| {
            l.split(" | ")
                .find_map(|kv| kv.strip_prefix(&format!("{key}=")).map(str::to_string))
        })
    };
    let num = |prefix: &str, key: &str| -> f64 {
        field(prefix, key)
            .and_then(|s| s.parse().ok())
            .unwrap_or(f64::NAN)
    };
    let op = field("@hung", "op").unwrap_or_default();
    let age = num("@hung", "age_ms");
    let budget = num("@hung", "budget_ms");
    let report = field("@hung", "report").unwrap_or_else(|| "-".into());
    let exists = field("@hung", "report_exists").as_deref() == Some("true");
    let deadline = num("@quit-begin", "deadline_ms");
    // A process leaves a few ms after its timer fires.
    let left_in_time = quit_ms.is_some_and(|q| q <= deadline + 250.0);
    let graphs_on = field("@loaded", "graphs").as_deref() == Some("on");
    let in_graph = op.contains("graph › kernel");
    let pass = op.ends_with("stuck op (HIPSCOPE_FAULT)")
        && (!graphs || (graphs_on && in_graph))
        && age >= budget
        && age <= budget + 500.0
        && exists
        && left_in_time
        && code == Some(exit_code::HARD);
    (
        pass,
        format!(
            "{}HUNG '{op}' at age {age:.0} ms (budget {budget:.0} ms); report {report} ({}); \
             quit left in {:.0} ms (deadline {deadline:.0} ms), exit code {}",
            if graphs && !graphs_on {
                format!(
                    "graphs {} (wanted on); ",
                    field("@loaded", "graphs").unwrap_or_default()
                )
            } else {
                String::new()
            },
            if exists { "written" } else { "MISSING" },
            quit_ms.unwrap_or(f64::NAN),
            code.map(|c| c.to_string())
                .unwrap_or_else(|| "none (signal)".into()),
        ),
    )
}
