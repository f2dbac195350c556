//! The tracer in the chat (issue 34), the real binary in a pseudo-terminal with the real SmolLM2
//! model on the CPU backend: `--trace FILE` writes a timeline with the chat's own tracks (frames,
//! sampling, detokenizing, decode steps); `/trace off` closes it and says how many events it
//! holds; `/trace on FILE` starts another, closed (with its `]`) by the quit; F10 shows the
//! Profile panel with the answer's op families.

mod pty;

use std::time::{Duration, Instant};

use pty::*;
use serde_json::Value;

fn events(path: &std::path::Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str::<Value>(&text)
        .unwrap_or_else(|e| panic!("{} is not a finished trace: {e}", path.display()))
        .as_array()
        .expect("an array")
        .clone()
}

/// Waits for an answer to stream and then for the header to say idle again.
fn answer_done(s: &Session) {
    sees_streaming(s);
    let start = Instant::now();
    loop {
        let c = s.contents();
        if c.lines().next().is_some_and(|l| l.contains(" idle ")) {
            return;
        }
        assert!(start.elapsed() < ANSWER, "the answer never finished:\n{c}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn chat_traces_to_a_file_and_shows_the_profile() {
    let home = tempfile::tempdir().unwrap();
    let first = home.path().join("first.json");
    let second = home.path().join("second.json");
    let mut s = Session::start(
        home.path(),
        &["-n", "24", "--trace", first.to_str().unwrap()],
    );
    s.sees("Type a message and press Enter", LOAD);
    // F10: the Profile panel, in the diagnostics column.
    s.send(b"\x1b[21~");
    s.sees("╭ Profile", Duration::from_secs(5));
    s.type_line("Name three colours.");
    answer_done(&s);
    // The decode table with the products of every layer (30 a step in SmolLM2).
    s.sees("decode · ", Duration::from_secs(5));
    s.sees("ffn_up", Duration::from_secs(5));
    s.type_line("/trace off");
    s.sees("events in", Duration::from_secs(10));
    let ev = events(&first);
    let names: Vec<&str> = ev
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    for want in [
        "UI · frames",
        "worker · sampling, detokenizing",
        "model · steps",
        "cpu",
    ] {
        assert!(names.contains(&want), "no track {want}: {names:?}");
    }
    let count = |n: &str| ev.iter().filter(|e| e["name"] == n).count();
    assert!(count("frame") > 0);
    assert!(
        count("decode step") >= 10,
        "{} decode steps",
        count("decode step")
    );
    assert!(count("prompt batch") >= 1);
    assert!(count("sample") >= 10 && count("detokenize") >= 10);
    assert!(
        count("model load") == 1,
        "the load was traced from the start"
    );

    // A second trace, left on: the quit closes it.
    s.type_line(&format!("/trace on {}", second.display()));
    s.sees("tracing every op to", Duration::from_secs(10));
    s.type_line("And three more.");
    answer_done(&s);
    s.send(b"\x03");
    s.send(b"\x03");
    assert_eq!(s.wait(Duration::from_secs(30)), 0);
    let ev = events(&second);
    assert!(ev.iter().any(|e| e["name"] == "decode step"));
}
