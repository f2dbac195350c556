//! Issue 32 items 4 and 9, through the real binary on a machine without a GPU: the chat says
//! what is true of the CPU backend (its watchdog watches the CPU's ops; there is no device
//! queue and, at rest, nothing in flight), and a terminal too small names the size it needs.

mod pty;

use std::time::{Duration, Instant};

use pty::*;

/// F9: the diagnostics column (hidden by default below 120 columns).
const F9: &[u8] = b"\x1b[20~";

#[test]
fn a_cpu_only_chat_says_cpu_and_an_idle_watchdog_says_nothing_is_in_flight() {
    let home = tempfile::tempdir().unwrap();
    let mut s = Session::start(home.path(), &[]);
    s.sees("Type a message and press Enter", LOAD);
    // Narrower than the diagnostics column needs: the header carries the watchdog's state.
    let start = Instant::now();
    loop {
        let header = s.contents().lines().next().unwrap_or_default().to_string();
        if header.contains("CPU OK") {
            assert!(!header.contains("GPU"), "{header}");
            break;
        }
        assert!(
            start.elapsed() < LOAD,
            "the header never said CPU OK:\n{}",
            s.contents()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    s.send(F9);
    s.sees("cpu · idle", Duration::from_secs(30));
    let screen = s.contents();
    assert!(screen.contains("No device queue"), "{screen}");
    assert!(screen.contains("nothing in flight"), "{screen}");
    assert!(!screen.contains("0 µs of 0 µs"), "{screen}");
    assert!(!screen.contains("queued"), "{screen}");
    s.send(b"\x03\x03");
    assert_eq!(s.wait(Duration::from_secs(30)), 0);
}

#[test]
fn a_terminal_too_small_names_the_size_it_needs() {
    let home = tempfile::tempdir().unwrap();
    let mut s = Session::start(home.path(), &[]);
    s.sees("Type a message and press Enter", LOAD);
    s.resize(5, 18);
    let start = Instant::now();
    while !flat(&s.contents()).contains("it needs at least 20×6") {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never named the minimum size:\n{}",
            s.contents()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        flat(&s.contents()).contains("too small (18×5)"),
        "{}",
        s.contents()
    );
    s.resize(ROWS, COLS);
    s.sees("Type a message and press Enter", Duration::from_secs(30));
    s.send(b"\x03\x03");
    assert_eq!(s.wait(Duration::from_secs(30)), 0);
}
