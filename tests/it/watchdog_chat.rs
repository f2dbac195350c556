//! Issue 12, item 1: the chat's hang watchdog. One watchdog thread per process, started with the
//! device, watches the CPU backend's ops as it watches a GPU stream. An op that never finishes is
//! injected with `HIPSCOPE_FAULT=hang:PHASE` (the same switch `hipscope selftest` uses on a GPU)
//! while the model loads, during prompt processing and in a decode step; each time the watchdog
//! must call it HUNG once its budget (2 s) has passed, write a report whose path the banner shows,
//! and the quit must leave within its deadline although the worker never comes back.

use crate::pty;

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pty::*;

/// The quit's deadline in this test: drain 500 ms + grace 500 ms.
const QUIT_DEADLINE: Duration = Duration::from_millis(1000);
/// What a busy 2-core machine may add to it (the hard exit restores the terminal, flushes).
const SLACK: Duration = Duration::from_secs(3);

fn write_config(home: &Path) {
    let dir = home.join("config");
    // Private, as hipscope makes it (a wider folder gets a note in place of the welcome).
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .unwrap();
    std::fs::write(
        dir.join("config.toml"),
        "[quit]\ndrain_timeout_ms = 500\ngrace_ms = 500\n",
    )
    .unwrap();
}

fn reports(home: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(home.join("data/reports"))
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// A field of the report (`age: 2.013 s (budget 2.000 s)` → `2.013 s (budget 2.000 s)`).
fn field<'a>(report: &'a str, key: &str) -> &'a str {
    report
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}: ")))
        .unwrap_or_else(|| panic!("no {key:?} in the report:\n{report}"))
}

fn hang(phase: &str, op: &str) {
    let home = tempfile::tempdir().unwrap();
    write_config(home.path());
    let fault = format!("hang:{phase}");
    let mut s = Session::start_with_env(home.path(), &[], &[("HIPSCOPE_FAULT", &fault)]);
    if phase != "load" {
        s.sees("Type a message and press Enter", LOAD);
        s.type_line("Write a long story about a dragon who learns to cook.");
    }
    s.sees("CPU HUNG", ANSWER);
    // The banner names the report once the watchdog has written it.
    s.sees("report written to", Duration::from_secs(5));
    let written = reports(home.path());
    assert_eq!(written.len(), 1, "one report: {written:?}");
    let screen = flat(&s.contents());
    assert!(
        screen.contains(&format!("report written to {}", written[0].display())),
        "the banner names {}; the screen:\n{}",
        written[0].display(),
        s.contents()
    );
    assert!(
        screen.contains(op),
        "the banner names {op:?}:\n{}",
        s.contents()
    );

    let report = std::fs::read_to_string(&written[0]).unwrap();
    assert_eq!(field(&report, "state"), "Hung");
    assert_eq!(field(&report, "op"), op);
    assert_eq!(field(&report, "backend"), "cpu");
    assert_eq!(field(&report, "stream"), "cpu");
    assert_eq!(field(&report, "op started (breadcrumb)"), "yes");
    // HUNG as soon as the budget has passed: the age when the report was written.
    let age = field(&report, "age");
    assert!(age.ends_with("(budget 2.000 s)"), "{age}");
    let secs: f64 = age.split(' ').next().unwrap().parse().unwrap();
    assert!(
        (2.0..3.0).contains(&secs),
        "HUNG after {secs} s for a budget of 2 s"
    );

    // The worker is held inside the op and never reads the quit: the quit leaves without it,
    // within its deadline, with the code for "left without waiting for the device".
    let t = Instant::now();
    s.send(b"\x04");
    let code = s.wait(QUIT_DEADLINE + SLACK);
    let took = t.elapsed();
    assert_eq!(code, 3, "exit code; the screen:\n{}", s.contents());
    assert!(
        took >= QUIT_DEADLINE,
        "left after {took:?}, before the quit's deadline: the stuck op was not waited for"
    );
    s.assert_restored();
}

#[test]
fn item1_a_stuck_op_while_the_model_loads_is_hung_reported_and_quit_in_time() {
    hang("load", "load · stuck op (HIPSCOPE_FAULT)");
}

#[test]
fn item1_a_stuck_op_during_prompt_processing_is_hung_reported_and_quit_in_time() {
    hang("prompt", "layer 15 · stuck op (HIPSCOPE_FAULT)");
}

#[test]
fn item1_a_stuck_op_in_a_decode_step_is_hung_reported_and_quit_in_time() {
    hang("decode", "layer 15 · stuck op (HIPSCOPE_FAULT)");
}
