//! What the in-flight table and the watchdog see over the scripted fake device, whose ops
//! complete late or never: queue depth and the oldest op from breadcrumbs and events, the watchdog
//! naming a kernel that never finishes (also when event queries stop returning, and inside a
//! replayed graph), and a step run launch by launch without graphs or across an upload.

use std::sync::mpsc::channel;
use std::time::Duration;

use hipscope::gpu::arena::Region;
use hipscope::gpu::fake::FakeScript;
use hipscope::gpu::handle::{Arg, wait_until};
use hipscope::gpu::snapshot::WatchState;
use hipscope::gpu::stream::Budget;
use hipscope::gpu::watchdog::{WatchConfig, WatchEvent, Watchdog, evaluate};

use crate::gpu_fake::{launched, small_cfg, with_arena};

#[test]
fn queue_depth_and_the_oldest_op_follow_breadcrumbs_and_events() {
    let (mut gpu, ctl) = with_arena(FakeScript::default(), small_cfg());
    let f = gpu.function("hs_busy").expect("busy");
    let out = gpu.alloc(Region::Activations, 1024).expect("alloc");
    ctl.set_auto(false);
    let labels: Vec<_> = (0..10)
        .map(|i| gpu.label(&format!("layer {i} · busy")))
        .collect();
    let base = gpu.stream_snapshot().enqueued;
    for l in &labels {
        gpu.launch(
            *l,
            f,
            [1, 1, 1],
            [64, 1, 1],
            0,
            &[out.into(), Arg::U32(256), Arg::U32(1)],
        )
        .expect("launch");
    }
    let s = gpu.stream_snapshot();
    assert_eq!(s.enqueued, base + 10);
    assert_eq!(s.queue_depth, 10);
    assert_eq!(
        s.in_flight.as_ref().map(|x| x.0.as_str()),
        Some("layer 0 · busy")
    );
    // Three finish; the fourth is now running and its breadcrumb proves the first three done.
    ctl.release(3);
    let s = gpu.stream_snapshot();
    assert_eq!(s.queue_depth, 7);
    assert_eq!(s.last_completed.as_deref(), Some("layer 2 · busy"));
    assert_eq!(
        s.in_flight.as_ref().map(|x| x.0.as_str()),
        Some("layer 3 · busy")
    );
    // The last op's completion needs an event (no later kernel writes a breadcrumb).
    gpu.mark_phase().expect("event");
    ctl.release(100);
    gpu.poll().expect("poll");
    let s = gpu.stream_snapshot();
    assert_eq!(s.queue_depth, 0);
    assert_eq!(s.last_completed.as_deref(), Some("layer 9 · busy"));
}

#[test]
fn the_watchdog_names_a_kernel_that_never_finishes_and_writes_a_report() {
    let (mut gpu, _ctl) = with_arena(FakeScript::default(), small_cfg());
    gpu.start_event_prober(Duration::from_millis(1));
    let dir = std::env::temp_dir().join(format!("hipscope-wd-{}", std::process::id()));
    let (tx, rx) = channel();
    let tx = std::sync::Mutex::new(tx);
    let dog = Watchdog::spawn(
        gpu.stream_shared(),
        gpu.info(),
        WatchConfig {
            tick: Duration::from_millis(5),
            report_dir: Some(dir.clone()),
            ..WatchConfig::default()
        },
        Box::new(move |ev| {
            if let Ok(t) = tx.lock() {
                let _ = t.send(ev);
            }
        }),
    )
    .expect("watchdog");
    let budget = Budget {
        slow: Duration::from_millis(20),
        hung: Duration::from_millis(60),
    };
    let flag = gpu
        .launch_spin_on_flag("layer 7 · attn · spin", Some(budget), 1 << 40)
        .expect("launch")
        .flag;
    let mut states = Vec::new();
    let hung = loop {
        match rx
            .recv_timeout(Duration::from_secs(10))
            .expect("watchdog event")
        {
            WatchEvent::Snapshot(s) => states.push(s.state),
            WatchEvent::Hung {
                snapshot,
                report_error,
            } => break (snapshot, report_error),
        }
    };
    let (snap, report_error) = hung;
    assert_eq!(report_error, None);
    assert_eq!(snap.state, WatchState::Hung);
    assert_eq!(snap.op.as_deref(), Some("layer 7 · attn · spin"));
    assert!(snap.op_started, "the breadcrumb shows the kernel started");
    assert!(snap.age >= Duration::from_millis(60));
    assert_eq!(snap.queue_depth, 1);
    assert!(states.contains(&WatchState::Slow), "{states:?}");
    let report =
        std::fs::read_to_string(snap.report.as_ref().expect("report path")).expect("report");
    assert!(report.contains("layer 7 · attn · spin"), "{report}");
    assert!(report.contains("[last completed]") && report.contains("[in flight, oldest first]"));
    assert!(report.contains("name: fake GPU"));
    // Released, the op finishes and the watchdog returns to OK.
    gpu.set_host_word(flag, 1).expect("release");
    gpu.wait_idle(Duration::from_secs(5)).expect("idle");
    let ok = wait_until(Duration::from_secs(5), || {
        rx.try_iter().any(
            |e| matches!(e, WatchEvent::Snapshot(s) if s.state == WatchState::Ok && s.op.is_none()),
        )
    });
    assert!(ok);
    dog.stop();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_watchdog_works_from_breadcrumbs_when_event_queries_stop_returning() {
    let (mut gpu, ctl) = with_arena(FakeScript::default(), small_cfg());
    let budget = Budget {
        slow: Duration::from_millis(1),
        hung: Duration::from_millis(2),
    };
    let flag = gpu
        .launch_spin_on_flag("layer 1 · ffn_up · spin", Some(budget), 1 << 40)
        .expect("launch")
        .flag;
    gpu.mark_phase().expect("event");
    // The runtime wedges: event queries block inside it.
    ctl.block_event_queries(true);
    gpu.start_event_prober(Duration::from_millis(1));
    assert!(wait_until(Duration::from_secs(5), || ctl
        .queries_in_flight()
        > 0));
    let shared = gpu.stream_shared();
    let now = shared.now_ns() + 5_000_000_000;
    let (snap, _) = evaluate(&shared, now, Duration::from_millis(100));
    assert!(snap.event_queries_stuck);
    assert_eq!(snap.state, WatchState::Hung);
    assert_eq!(snap.op.as_deref(), Some("layer 1 · ffn_up · spin"));
    assert!(snap.op_started);
    // The runtime recovers and the kernel is released: the stream drains and quits cleanly. (A
    // worker stuck inside a blocked query during the quit is the quit timer's case, tested in
    // a child process in tests/it/gpu_quit.rs.)
    ctl.block_event_queries(false);
    gpu.set_host_word(flag, 1).expect("release");
    let out = gpu.teardown(Duration::from_secs(5), &mut |_| {});
    assert!(out.clean, "{out:?}");
}

/// A step recorded, captured into a graph and replayed as one op: the kernel that hangs inside
/// the replay is named from its breadcrumb (the step block's base plus its node index) by the
/// Streams snapshot and the watchdog's evaluation; released, the replay completes.
#[test]
fn a_kernel_stuck_inside_a_replayed_graph_is_named_by_its_breadcrumb() {
    let (mut gpu, ctl) = with_arena(
        FakeScript {
            graphs: true,
            ..FakeScript::default()
        },
        small_cfg(),
    );
    assert!(gpu.graph_mode().is_on(), "{}", gpu.graph_mode().describe());
    let out = gpu.alloc(Region::Activations, 64).expect("buffer");
    let fill = gpu.function("hs_fill_u32").expect("fill");
    let fill_label = gpu.label("layer 0 · fill");
    // Two identical steps: the first is captured, the second replays it.
    for step in 0..2u32 {
        assert!(gpu.graph_begin_step(0).expect("begin"));
        gpu.launch(
            fill_label,
            fill,
            [1, 1, 1],
            [256, 1, 1],
            0,
            &[out.into(), Arg::U64(16), Arg::U32(7)],
        )
        .expect("recorded");
        gpu.launch(
            fill_label,
            fill,
            [1, 1, 1],
            [256, 1, 1],
            0,
            &[out.into(), Arg::U64(16), Arg::U32(9)],
        )
        .expect("recorded");
        assert_eq!(
            launched(&ctl, "hs_fill_u32"),
            0,
            "step {step}: recorded, not launched"
        );
        gpu.graph_end_step().expect("end");
        gpu.wait_idle(Duration::from_secs(5)).expect("idle");
        assert_eq!(ctl.read(out.ptr, 4).expect("read"), 9u32.to_le_bytes());
    }
    let stats = gpu.graph_stats();
    assert_eq!((stats.captures, stats.replays, stats.flushed), (1, 1, 0));
    assert_eq!(
        ctl.log()
            .iter()
            .filter(|l| l.starts_with("launch graph"))
            .count(),
        2
    );
    // A step that differs is captured afresh; this one holds a kernel that never finishes.
    assert!(gpu.graph_begin_step(0).expect("begin"));
    gpu.launch(
        fill_label,
        fill,
        [1, 1, 1],
        [256, 1, 1],
        0,
        &[out.into(), Arg::U64(16), Arg::U32(7)],
    )
    .expect("recorded");
    let budget = Budget {
        slow: Duration::from_millis(20),
        hung: Duration::from_millis(60),
    };
    let flag = gpu
        .launch_spin_on_flag("layer 3 · stuck", Some(budget), 1 << 40)
        .expect("recorded")
        .flag;
    gpu.graph_end_step().expect("end");
    let shared = gpu.stream_shared();
    let snap = gpu.stream_snapshot();
    let (label, _) = snap.in_flight.expect("the graph is in flight");
    assert_eq!(label, "decode step · graph › kernel 2/2 · layer 3 · stuck");
    // The graph op carries the budget its stuck kernel asked for.
    let (w, _) = evaluate(
        &shared,
        shared.now_ns() + 100_000_000,
        Duration::from_secs(1),
    );
    assert_eq!(w.state, WatchState::Hung);
    assert!(w.op_started);
    assert_eq!(
        w.op.as_deref(),
        Some("decode step · graph › kernel 2/2 · layer 3 · stuck")
    );
    gpu.set_host_word(flag, 1).expect("release");
    gpu.wait_idle(Duration::from_secs(5)).expect("idle");
    assert_eq!(gpu.graph_stats().captures, 2);
    let outcome = gpu.teardown(Duration::from_secs(1), &mut |_| {});
    assert!(outcome.clean, "{:?}", outcome.reason);
    assert_eq!(ctl.live_graphs(), 0, "teardown destroys the graphs");
}

/// A device that cannot capture runs the step launch by launch, saying why graphs are off; an
/// op that cannot join a step (an upload) enqueues what the step recorded first, in order.
#[test]
fn without_graphs_or_across_an_upload_the_step_runs_launch_by_launch() {
    let (mut gpu, ctl) = with_arena(FakeScript::default(), small_cfg());
    assert_eq!(
        gpu.graph_mode().describe(),
        "off (the fake device was scripted without graphs)"
    );
    assert!(!gpu.graph_begin_step(0).expect("begin"));
    let out = gpu.alloc(Region::Activations, 64).expect("buffer");
    let fill = gpu.function("hs_fill_u32").expect("fill");
    let l = gpu.label("fill");
    gpu.launch(
        l,
        fill,
        [1, 1, 1],
        [256, 1, 1],
        0,
        &[out.into(), Arg::U64(16), Arg::U32(3)],
    )
    .expect("launch");
    assert_eq!(launched(&ctl, "hs_fill_u32"), 1);

    let (mut gpu, ctl) = with_arena(
        FakeScript {
            graphs: true,
            ..FakeScript::default()
        },
        small_cfg(),
    );
    let out = gpu.alloc(Region::Activations, 64).expect("buffer");
    let fill = gpu.function("hs_fill_u32").expect("fill");
    let l = gpu.label("fill");
    assert!(gpu.graph_begin_step(0).expect("begin"));
    gpu.launch(
        l,
        fill,
        [1, 1, 1],
        [256, 1, 1],
        0,
        &[out.into(), Arg::U64(16), Arg::U32(3)],
    )
    .expect("recorded");
    assert_eq!(launched(&ctl, "hs_fill_u32"), 0);
    // The upload must land after the recorded fill: the step is flushed first.
    gpu.upload(l, out, &5u32.to_le_bytes()).expect("upload");
    assert!(!gpu.graph_step_active());
    assert_eq!(launched(&ctl, "hs_fill_u32"), 1);
    gpu.wait_idle(Duration::from_secs(5)).expect("idle");
    assert_eq!(
        ctl.read(out.ptr, 8).expect("read"),
        [5, 0, 0, 0, 3, 0, 0, 0]
    );
    assert_eq!(gpu.graph_stats().flushed, 1);
}
