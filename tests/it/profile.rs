//! The tracer and the profile (issue 34): the timeline file the binary writes is valid
//! trace-event JSON whose events nest per track, still opens when the process is killed while
//! writing it, holds every layer's ops in order inside each step; `bench --profile` reports the
//! op families of the steps; on the fake device each kernel's own stamps (or, asked, its timed
//! events) come back as its device time; and the Profile panel renders a recorded profile
//! (snapshots).

use crate::common;
use crate::ui_common;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crossterm::event::KeyCode;
use hipscope::gpu::trace::device::TraceEvents;
use hipscope::gpu::trace::writer::{parse_like_chrome, parse_like_perfetto};
use serde_json::Value;

use common::{hipscope, run_ok};
use ui_common::*;

/// Checks the trace-event format: every event an object with `ph`, `pid`, `tid` and (but for
/// metadata) a numeric `ts`; complete events a non-negative `dur` and a name. Returns the
/// complete events.
fn complete_events(events: &[Value]) -> Vec<&Value> {
    let mut out = Vec::new();
    for e in events {
        let ph = e["ph"].as_str().unwrap_or_else(|| panic!("no ph: {e}"));
        assert!(e["pid"].is_u64() && e["tid"].is_u64(), "pid/tid: {e}");
        match ph {
            "M" => assert!(e["args"]["name"].is_string() || e["args"]["sort_index"].is_u64()),
            "X" => {
                assert!(e["ts"].as_f64().is_some_and(|t| t >= 0.0), "ts: {e}");
                assert!(e["dur"].as_f64().is_some_and(|d| d >= 0.0), "dur: {e}");
                assert!(e["name"].is_string() && e["cat"].is_string(), "{e}");
                out.push(e);
            }
            "i" => assert!(e["ts"].is_number(), "{e}"),
            other => panic!("unexpected phase {other}: {e}"),
        }
    }
    out
}

/// Per track, events either nest or follow one another (what Perfetto and chrome://tracing
/// draw as slices on one row); returns the number of tracks.
fn assert_nested(events: &[&Value]) -> usize {
    let mut by_tid: BTreeMap<u64, Vec<(f64, f64, String)>> = BTreeMap::new();
    for e in events {
        let ts = e["ts"].as_f64().unwrap();
        let end = ts + e["dur"].as_f64().unwrap();
        by_tid.entry(e["tid"].as_u64().unwrap()).or_default().push((
            ts,
            end,
            e["name"].as_str().unwrap().to_string(),
        ));
    }
    // µs with ns precision: ends may meet within rounding.
    const EPS: f64 = 0.002;
    for (tid, mut evs) in by_tid.clone() {
        evs.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut stack: Vec<(f64, String)> = Vec::new();
        for (ts, end, name) in evs {
            while stack.last().is_some_and(|(e, _)| *e <= ts + EPS) {
                stack.pop();
            }
            if let Some((open_end, open)) = stack.last() {
                assert!(
                    end <= open_end + EPS,
                    "track {tid}: {name} [{ts}, {end}] overlaps {open} (ends {open_end})"
                );
            }
            stack.push((end, name));
        }
    }
    by_tid.len()
}

fn track_names(events: &[Value]) -> BTreeMap<u64, String> {
    events
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| {
            (
                e["tid"].as_u64().unwrap(),
                e["args"]["name"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// `generate --trace` on the CPU backend: a finished file is plain JSON in the trace-event
/// format; its events nest per track; the CPU stream, each pool thread, the steps, sampling and
/// detokenizing each have a track; each decode step holds every layer's ops in layer order, and
/// their sum is within the step's wall time; the file cut at any line still opens.
#[test]
fn a_cpu_trace_is_valid_nested_and_holds_every_layer_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("trace.json");
    let out = run_ok(&[
        "generate",
        "--synthetic",
        "tiny",
        "--backend",
        "cpu",
        "-t",
        "2",
        "-n",
        "6",
        "--temp",
        "0",
        "-s",
        "1",
        "--trace",
        path.to_str().unwrap(),
        "-p",
        "hello",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("trace: "), "{stderr}");
    let text = std::fs::read_to_string(&path).expect("trace written");
    let events: Vec<Value> = serde_json::from_str::<Value>(&text)
        .expect("a finished trace is valid JSON")
        .as_array()
        .expect("the JSON array format")
        .clone();
    let xs = complete_events(&events);
    let tracks = assert_nested(&xs);
    let names = track_names(&events);
    for want in [
        "cpu",
        "cpu thread 0",
        "cpu thread 1",
        "model · steps",
        "worker · sampling, detokenizing",
    ] {
        assert!(
            names.values().any(|n| n == want),
            "no track {want}: {names:?}"
        );
    }
    assert!(tracks >= 5, "{tracks} tracks");
    // The load, with each tensor.
    assert!(xs.iter().any(|e| e["name"] == "model load"));
    assert!(
        xs.iter()
            .any(|e| e["name"] == "load · blk.1.ffn_down.weight")
    );
    for slice in ["sample", "detokenize"] {
        assert!(xs.iter().any(|e| e["name"] == slice), "no {slice} slice");
    }
    // Each decode step: its ops, layer by layer in order, and the whole forward pass of them.
    let steps: Vec<&&Value> = xs.iter().filter(|e| e["name"] == "decode step").collect();
    assert!(steps.len() >= 5, "{} decode steps", steps.len());
    let n_layers = 2u64;
    for step in &steps {
        let id = step["args"]["step"].as_u64().expect("step id");
        let mut ops: Vec<&&Value> = xs
            .iter()
            .filter(|e| e["cat"] == "cpu" && e["args"]["step"].as_u64() == Some(id))
            .collect();
        ops.sort_by_key(|e| e["args"]["seq"].as_u64());
        let layers: Vec<u64> = ops
            .iter()
            .filter_map(|e| e["args"]["layer"].as_u64())
            .collect();
        assert!(layers.windows(2).all(|w| w[0] <= w[1]), "{layers:?}");
        for l in 0..n_layers {
            for op in ["attn_norm", "attn_q", "attention", "ffn_down"] {
                assert!(
                    ops.iter()
                        .any(|e| e["args"]["layer"] == l && e["args"]["op"] == op),
                    "step {id}: layer {l} has no {op}"
                );
            }
        }
        for op in ["embed", "output"] {
            assert!(ops.iter().any(|e| e["args"]["op"] == op), "no {op}");
        }
        // Weight-reading ops carry their bytes and GB/s.
        let q = ops.iter().find(|e| e["args"]["op"] == "attn_q").unwrap();
        assert!(
            q["args"]["bytes_read"].as_u64().is_some_and(|b| b > 0),
            "{q}"
        );
        assert!(q["args"]["GB/s"].as_f64().is_some(), "{q}");
        let sum: f64 = ops.iter().map(|e| e["dur"].as_f64().unwrap()).sum();
        let wall = step["dur"].as_f64().unwrap();
        assert!(sum <= wall + 0.01, "ops {sum} µs in a step of {wall} µs");
        assert!(ops.iter().all(|e| {
            let ts = e["ts"].as_f64().unwrap();
            ts >= step["ts"].as_f64().unwrap() - 0.01
                && ts + e["dur"].as_f64().unwrap() <= step["ts"].as_f64().unwrap() + wall + 0.01
        }));
    }
    // Cut at every line: what a killed process leaves still opens, with every event before it
    // (the blank lines that keep events off page boundaries hold none).
    let ends: Vec<usize> = text.match_indices('\n').map(|(i, _)| i + 1).collect();
    for &end in ends.iter().step_by(7) {
        let cut = &text[..end];
        let c = parse_like_chrome(cut).unwrap_or_else(|e| panic!("cut at {end}: {e}"));
        let before = cut.lines().filter(|l| l.contains("\"ph\"")).count();
        assert_eq!(c.len(), before.min(events.len()), "cut at {end}");
        assert_eq!(parse_like_perfetto(cut).expect("perfetto").len(), c.len());
    }
}

/// A process killed while it writes its trace leaves a file both importers open.
#[test]
fn a_trace_cut_off_by_a_kill_still_opens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("killed.json");
    let mut child = hipscope()
        .args([
            "bench",
            "--synthetic",
            "tiny",
            "--backend",
            "cpu",
            "-t",
            "1",
            "-p",
            "0",
            "-n",
            "4000",
            "-r",
            "1",
            "--trace",
            path.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    // Wait until decode steps are in the file (the writer flushes every 100 ms).
    let t = Instant::now();
    loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.matches("\"decode step\"").count() >= 3 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "no decode steps in the trace after 2 minutes"
        );
        assert!(child.try_wait().expect("wait").is_none(), "ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("kill");
    child.wait().expect("reap");
    let text = std::fs::read_to_string(&path).expect("read");
    assert!(
        !text.trim_end().ends_with(']'),
        "the kill came after the close"
    );
    let chrome = parse_like_chrome(&text).expect("chrome opens the cut-off trace");
    let perfetto = parse_like_perfetto(&text).expect("perfetto opens it");
    assert_eq!(chrome.len(), perfetto.len());
    let xs = complete_events(&chrome);
    assert_nested(&xs);
    assert!(xs.iter().filter(|e| e["name"] == "decode step").count() >= 3);
}

/// `bench --profile --json`: a table per test, rows longest first, the host/launch row last,
/// each layer's op counted once per layer per step, bytes as the bound counts them.
#[test]
fn bench_profile_reports_each_op_family_per_step() {
    let out = run_ok(&[
        "bench",
        "--synthetic",
        "tiny",
        "--backend",
        "cpu",
        "-t",
        "2",
        "-p",
        "16",
        "-n",
        "8",
        "-r",
        "2",
        "--profile",
        "--json",
    ]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let tests = v.as_array().expect("results");
    assert_eq!(tests.len(), 2);
    for t in tests {
        let p = &t["profile"];
        let rows = p["rows"].as_array().expect("rows");
        let decode = t["n_gen"].as_u64() > Some(0);
        assert_eq!(p["kind"], if decode { "decode" } else { "prompt" });
        // Two measured repetitions of 8 tokens; the last prompt of 16 in one batch.
        assert_eq!(p["steps"].as_u64(), Some(if decode { 16 } else { 1 }));
        let us: Vec<f64> = rows.iter().map(|r| r["us"].as_f64().unwrap()).collect();
        let (last, ops) = rows.split_last().unwrap();
        assert_eq!(last["op"], "host/launch");
        assert!(us[..ops.len()].windows(2).all(|w| w[0] >= w[1]), "{us:?}");
        let share: f64 = rows.iter().map(|r| r["share"].as_f64().unwrap()).sum();
        assert!((share - 1.0).abs() < 0.01, "shares add to {share}");
        let row = |op: &str| {
            ops.iter()
                .find(|r| r["op"] == op)
                .unwrap_or_else(|| panic!("no {op}"))
        };
        // tiny has two layers: two attn_q products a step, one output.
        assert_eq!(row("attn_q")["calls"].as_f64(), Some(2.0));
        assert_eq!(row("output")["calls"].as_f64(), Some(1.0));
        if decode {
            // The weights a token reads, as the bound counts them (plus outputs written and the
            // cache): the profile's bytes a step come within a few percent of the bound's.
            let bytes: u64 = ops.iter().filter_map(|r| r["bytes"].as_u64()).sum();
            let bound = t["bound"]["bytes_per_token"].as_u64().expect("bound");
            let ratio = bytes as f64 / bound as f64;
            assert!((0.95..1.15).contains(&ratio), "{bytes} vs {bound}");
            assert!(row("attn_q")["bound"].as_f64().is_some());
        }
    }
}

/// Traces, on the fake device (whose clock advances by each kernel's set time, 7 µs for the
/// fills here), four rounds of two labelled fills launched one by one (the last followed by a
/// download), then two identical steps (captured, then replayed as a graph); returns the file's
/// complete events, the track names and whether kernels were stamped.
fn fake_trace(events: TraceEvents, trace_first: bool) -> (Vec<Value>, BTreeMap<u64, String>, bool) {
    use hipscope::gpu::arena::{ArenaPlan, Region};
    use hipscope::gpu::fake::{FakeDevice, FakeScript};
    use hipscope::gpu::handle::{Arg, Gpu, GpuConfig};
    use hipscope::gpu::kernels::{CompileMode, KernelCache};
    use hipscope::gpu::trace;

    static ONE: Mutex<()> = Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let be = FakeDevice::new(FakeScript {
        graphs: true,
        ..FakeScript::default()
    });
    let ctl = be.control();
    let cfg = GpuConfig {
        trace_events: events,
        ..GpuConfig::default()
    };
    let mut gpu = Gpu::open(Box::new(be), cfg).expect("open");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("fake.json");
    // A trace on before the kernels are built gets their stamped build (as `--trace` does).
    if trace_first {
        trace::start_file(&path).expect("start");
    }
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
    let out = gpu.alloc(Region::Activations, 64).expect("buffer");
    let fill = gpu.function("hs_fill_u32").expect("fill");
    ctl.set_op_time("hs_fill_u32", 7_000);
    if !trace_first {
        trace::start_file(&path).expect("start");
    }
    let labels = [
        gpu.label("layer 0 · a · fill"),
        gpu.label("layer 1 · b · fill"),
    ];
    // Each layer's fill, launched (outside a step) or recorded (inside one).
    let fills = |gpu: &mut Gpu, v: u32| {
        for &l in &labels {
            gpu.launch(
                l,
                fill,
                [1, 1, 1],
                [256, 1, 1],
                0,
                &[out.into(), Arg::U64(16), Arg::U32(v)],
            )
            .expect("launch");
        }
    };
    for v in 0..3 {
        fills(&mut gpu, v);
        gpu.wait_idle(Duration::from_secs(5)).expect("idle");
    }
    let stamping = gpu.stamping();
    // A fill whose next op is a download: it hands no end over to a kernel, and ends where the
    // device reached the download's start event.
    fills(&mut gpu, 5);
    let l = gpu.label("logits · download");
    let mut back = [0u8; 64];
    gpu.download(l, out, &mut back).expect("download");
    gpu.wait_idle(Duration::from_secs(5)).expect("idle");
    // Two identical steps: captured, then replayed.
    for _ in 0..2 {
        assert!(gpu.graph_begin_step(0).expect("begin"));
        fills(&mut gpu, 9);
        gpu.graph_end_step().expect("end");
        gpu.wait_idle(Duration::from_secs(5)).expect("idle");
    }
    let (_, n) = trace::stop_file().expect("stop");
    assert!(n > 0);
    let outcome = gpu.teardown(Duration::from_secs(1), &mut |_| {});
    assert!(outcome.clean, "{:?}", outcome.reason);
    assert_eq!(
        ctl.live_events(),
        0,
        "teardown destroys the timed events too"
    );
    let events: Vec<Value> =
        serde_json::from_str::<Value>(&std::fs::read_to_string(&path).unwrap())
            .unwrap()
            .as_array()
            .unwrap()
            .clone();
    let names = track_names(&events);
    let xs: Vec<Value> = complete_events(&events).into_iter().cloned().collect();
    (xs, names, stamping)
}

/// The fills on the stream's own track, in order.
fn fake_fills(xs: &[Value], names: &BTreeMap<u64, String>) -> Vec<Value> {
    let stream = names
        .iter()
        .find(|(_, n)| n.as_str() == "fake:0 stream 0")
        .map(|(t, _)| *t)
        .expect("the stream's track");
    xs.iter()
        .filter(|e| e["tid"] == stream && e["cat"] == "kernel" && e["args"]["kernel"] == "fill")
        .cloned()
        .collect()
}

/// By default a kernel times itself (kernels/prelude.h): once the first traced op has made the
/// timer, the clock is mapped by a calibration launch when the stream is next idle, and every
/// later kernel carries its own start and end, which come back as its time on the device's
/// clock. A replayed graph is one event (timed events) on its own track that says it hides its
/// kernels; the device's tracks nest.
#[test]
fn fake_device_kernels_time_themselves_and_graphs_by_events() {
    let (xs, names, stamping) = fake_trace(TraceEvents::Stamps, true);
    assert!(
        stamping,
        "kernels are launched stamped once the clock is mapped"
    );
    let refs: Vec<&Value> = xs.iter().collect();
    assert_nested(&refs);
    let kernels = fake_fills(&xs, &names);
    assert_eq!(kernels.len(), 8, "{kernels:?}");
    // 7 µs on the fake's clock, from the kernel's stamps (its end handed over by the next
    // kernel). The fill before the download ends where the
    // device reached the download's start event: an event's time is placed through the events'
    // anchor, a stamp's through the clock calibration, which agree on a GPU (both clocks run in
    // real time) but not on the fake, whose clock stands still between ops; it is checked for
    // being timed by its stamps, not for its length.
    for (i, k) in kernels.iter().enumerate() {
        if i != 7 {
            assert!((k["dur"].as_f64().unwrap() - 7.0).abs() < 0.01, "{k}");
        }
    }
    // The trace was on from before the kernels were built: the arena's first upload made the
    // timer, the clock was mapped at the next idle moment, before the first fill.
    assert!(
        kernels
            .iter()
            .all(|k| k["args"]["timed by"] == "kernel stamps"),
        "{kernels:?}"
    );
    assert_eq!(kernels[0]["args"]["layer"], 0);
    assert_eq!(kernels[1]["args"]["layer"], 1);
    let probes = xs
        .iter()
        .filter(|e| e["name"] == "trace · clock calibration")
        .count();
    assert!(probes >= 1, "the calibration launch is on the timeline");
    let graphs: Vec<&Value> = xs.iter().filter(|e| e["cat"] == "graph").collect();
    assert_eq!(graphs.len(), 2, "a capture's replay and a replay");
    for g in &graphs {
        assert_eq!(g["args"]["kernels"], 2);
        assert!(g["args"]["note"].as_str().unwrap().contains("--no-graphs"));
        // The two fills inside it: 14 µs of the fake's clock.
        assert!((g["dur"].as_f64().unwrap() - 14.0).abs() < 0.01, "{g}");
        let track = &names[&g["tid"].as_u64().unwrap()];
        assert_eq!(track, "fake:0 stream 0 · graph replays");
    }
}

/// Kernels of the ordinary build — built before any trace was on, as in a chat that turns
/// `/trace on` later — are never launched stamped (their breadcrumb would take the stamp block
/// for its own): every kernel is timed by its two events, and there is no calibration launch.
/// So with `HIPSCOPE_TRACE_EVENTS=pairs`, whatever the build.
#[test]
fn fake_device_times_come_from_its_timed_events_without_the_stamped_build_or_when_asked() {
    for (events, trace_first) in [(TraceEvents::Stamps, false), (TraceEvents::Pairs, true)] {
        fake_timed_by_events(events, trace_first);
    }
}

fn fake_timed_by_events(events: TraceEvents, trace_first: bool) {
    let (xs, names, stamping) = fake_trace(events, trace_first);
    assert!(!stamping);
    let kernels = fake_fills(&xs, &names);
    assert_eq!(kernels.len(), 8, "{kernels:?}");
    for k in &kernels {
        assert!((k["dur"].as_f64().unwrap() - 7.0).abs() < 0.01, "{k}");
        assert!(k["args"].get("timed by").is_none(), "{k}");
    }
    assert!(!xs.iter().any(|e| e["name"] == "trace · clock calibration"));
}

/// A profile recorded from `bench --profile --json` of SmolLM2-135M Q4_1 on this project's
/// 2-core CPU machine (tests/data/profile_smollm2_cpu.json).
fn recorded() -> hipscope::gpu::trace::ProfileSnapshot {
    common::read_json("tests/data/profile_smollm2_cpu.json")
}

#[test]
fn profile_panel_in_the_column() {
    let mut app = loaded_cpu_app();
    feed_diagnostics(&mut app);
    app.update(key(KeyCode::F(10)));
    app.update(hipscope::ui::Msg::Profile(recorded()));
    insta::assert_snapshot!(draw(&app, 130, 40));
}

#[test]
fn profile_panel_full_screen() {
    let mut app = loaded_cpu_app();
    app.update(key(KeyCode::F(10)));
    app.update(key(KeyCode::F(10)));
    app.update(hipscope::ui::Msg::Profile(recorded()));
    app.update(hipscope::ui::Msg::Tracing(Some("/tmp/chat.json".into())));
    insta::assert_snapshot!(draw(&app, 130, 40));
}

#[test]
fn profile_panel_before_any_step() {
    let mut app = loaded_cpu_app();
    let effects = app.update(key(KeyCode::F(10)));
    assert_eq!(
        effects,
        vec![hipscope::ui::Effect::Trace(
            hipscope::ui::msg::TraceRequest::Profile(true)
        )]
    );
    insta::assert_snapshot!(draw(&app, 100, 24));
    // F10 twice more: full screen, then hidden, which stops profiling.
    assert!(app.update(key(KeyCode::F(10))).is_empty());
    assert_eq!(
        app.update(key(KeyCode::F(10))),
        vec![hipscope::ui::Effect::Trace(
            hipscope::ui::msg::TraceRequest::Profile(false)
        )]
    );
}
