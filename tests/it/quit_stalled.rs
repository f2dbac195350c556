//! Issue 31 item 2: a terminal that stops reading (a stalled SSH session, a frozen terminal
//! emulator) must not hold the quit. The real binary answers in a pseudo-terminal whose master
//! side the test stops reading; once the chat's output has filled the kernel's buffer and a
//! write to the terminal blocks, a signal must still end the process within the quit's deadline
//! with the code of a clean quit — and give the terminal's modes back.

use crate::pty;

use std::time::{Duration, Instant};

use pty::*;

/// Whether a thread of `pid` is blocked in write(2) to its terminal (stdout or stderr).
fn blocked_writing_to_the_terminal(pid: i32) -> bool {
    let write = libc::SYS_write.to_string();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten();
    tasks.flatten().any(|t| {
        let call = std::fs::read_to_string(t.path().join("syscall")).unwrap_or_default();
        let mut words = call.split_whitespace();
        words.next() == Some(write.as_str()) && matches!(words.next(), Some("0x1" | "0x2"))
    })
}

/// Stops reading the terminal of `s` and waits until the output of `chat` (its process) is stuck
/// in the kernel: a write of it blocks. The streaming answer alone changes a few cells a token
/// and took two minutes to fill the kernel's buffer on two busy cores; the terminal changes size
/// every 50 ms meanwhile, each change a whole frame redrawn (SIGWINCH), so it fills in moments.
fn stall_until_blocked_writing(s: &Session, chat: i32) {
    s.stall(true);
    let start = Instant::now();
    let mut narrow = false;
    while !blocked_writing_to_the_terminal(chat) {
        assert!(
            start.elapsed() < ANSWER,
            "the chat's output never filled the terminal's buffer"
        );
        narrow = !narrow;
        s.resize(ROWS, if narrow { COLS - 1 } else { COLS });
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts a long answer, stops reading the terminal and waits until the chat's output is stuck
/// in the kernel (a write of it blocks).
fn answering_into_a_stalled_terminal(home: &std::path::Path) -> Session {
    let mut s = Session::start(home, &["-n", "-1"]);
    s.ask_for_a_long_answer();
    stall_until_blocked_writing(&s, s.pid());
    s
}

/// Sends `signal` and checks the process ends by a clean quit (code 0, which the quit's timer
/// would have turned into 3 had the deadline passed) with raw mode off.
fn a_signal_quits(signal: i32) {
    let home = tempfile::tempdir().unwrap();
    let mut s = answering_into_a_stalled_terminal(home.path());
    let t = Instant::now();
    // SAFETY: kill(2) on the chat's own process id.
    assert_eq!(unsafe { libc::kill(s.pid(), signal) }, 0);
    // (It reads the terminal again once the chat has ended.)
    let code = s.wait(Duration::from_secs(30));
    eprintln!("signal {signal}: the chat ended {:?} after it", t.elapsed());
    let log = std::fs::read_to_string(home.path().join("state/hipscope.log")).unwrap_or_default();
    assert_eq!(code, 0, "after {:?}; the log:\n{log}", t.elapsed());
    // The terminal's settings come back without the terminal reading; the escape sequences
    // that leave the alternate screen could not be written.
    let lflag = s.local_modes();
    assert_ne!(lflag & libc::ICANON, 0, "raw mode left on (no ICANON)");
    assert_ne!(lflag & libc::ECHO, 0, "raw mode left on (no ECHO)");
    let c = transcript(home.path());
    assert_eq!(c.turns.len(), 1, "{log}");
    assert!(!c.turns[0].answer.is_empty());
}

#[test]
fn sigterm_quits_while_the_terminal_does_not_read() {
    a_signal_quits(libc::SIGTERM);
}

#[test]
fn sighup_quits_while_the_terminal_does_not_read() {
    a_signal_quits(libc::SIGHUP);
}

/// The closing note of the last session: `item10` of tests/it/fault_injection.rs once left the chat
/// running, still answering, 23 minutes after its terminal closed. The order that does it, made
/// certain here: the chat is blocked writing to a terminal that does not read (a slow reader
/// under load), a key it has read waits for the UI thread, and the terminal goes away. The
/// write fails, the UI thread takes the key from crossterm's reader and asks it again — on the
/// hung-up terminal, where read() gives 0 or EIO forever and neither ends crossterm's loop: the
/// UI thread spun there, holding crossterm's lock, and never began the quit.
#[test]
fn a_terminal_that_closes_while_the_chat_is_blocked_writing_is_a_quit() {
    let home = tempfile::tempdir().unwrap();
    // Its own session, as in item10: closing the terminal sends no SIGHUP.
    let mut s = Session::start_detached(home.path(), &["-n", "-1"]);
    s.ask_for_a_long_answer();
    let chat = descendants(s.child.process_id().expect("pid"))
        .into_iter()
        .find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "hipscope")
        })
        .expect("the chat's process") as i32;
    stall_until_blocked_writing(&s, chat);
    // A key, read from the terminal by the chat before it goes away.
    s.send(b"x");
    let start = Instant::now();
    while s.pending_input() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the key was never read"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    s.hang_up();
    let code = s.wait(Duration::from_secs(30));
    let log = std::fs::read_to_string(home.path().join("state/hipscope.log")).unwrap_or_default();
    assert_eq!(code, 0, "{log}");
    let c = transcript(home.path());
    assert_eq!(c.turns.len(), 1);
    assert!(!c.turns[0].answer.is_empty());
}
