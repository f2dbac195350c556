//! `hipscope top` full screen in a real pseudo-terminal: it draws the fixture GPU and its
//! process (or, on a tree without a GPU, the verdict line), `q` quits with exit code 0, and the
//! terminal is restored.

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use portable_pty::{CommandBuilder, PtySize, native_pty_system};

#[test]
fn top_draws_every_gpu_and_q_quits_cleanly() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/sysfs/rx7900xtx");
    top_until(&root, &["card1 AMD Radeon RX 7900 XTX", "llama-server"]);
}

/// Issue 32 item 2: no GPU in the tree: the screen says what runs models and the next step for
/// each vendor (it said only "no GPU found").
#[test]
fn top_without_a_gpu_says_the_cpu_runs_and_what_to_do() {
    let dir = tempfile::tempdir().expect("tempdir");
    for d in ["sys", "proc"] {
        std::fs::create_dir_all(dir.path().join(d)).expect("tree");
    }
    let screen = top_until(dir.path(), &["models run on the CPU", "for AMD:"]);
    assert!(screen.contains("NVIDIA"), "{screen}");
}

/// Runs `top` on the tree at `root` (`sys/`, `proc/`) until the screen shows every `want`, then
/// quits with `q` and checks the exit and the terminal; returns the last screen seen.
fn top_until(root: &std::path::Path, want: &[&str]) -> String {
    let pair = native_pty_system()
        .openpty(PtySize {
            rows: 30,
            cols: 110,
            pixel_width: 0,
            pixel_height: 0,
        })
        .expect("openpty");
    let mut cmd = CommandBuilder::new(env!("CARGO_BIN_EXE_hipscope"));
    cmd.args(["top", "--interval-ms", "100", "--sysfs-root"]);
    cmd.arg(root.join("sys"));
    cmd.arg("--procfs-root");
    cmd.arg(root.join("proc"));
    cmd.env("TERM", "xterm-256color");
    cmd.env(
        "HIPSCOPE_HOME",
        std::env::temp_dir().join("hipscope-test-home"),
    );
    let mut child = pair.slave.spawn_command(cmd).expect("spawn");
    drop(pair.slave);
    let screen = Arc::new(Mutex::new(vt100::Parser::new(
        std::num::NonZeroU16::new(30).expect("rows"),
        std::num::NonZeroU16::new(110).expect("cols"),
        0,
    )));
    let mut reader = pair.master.try_clone_reader().expect("reader");
    let sink = screen.clone();
    let t = std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().expect("screen").process(&buf[..n]);
        }
    });
    let contents = || screen.lock().expect("screen").screen().contents();
    let start = Instant::now();
    while !want.iter().all(|w| contents().contains(w)) {
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("top never drew {want:?}; the screen:\n{}", contents());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let seen = contents();
    let mut w = pair.master.take_writer().expect("writer");
    w.write_all(b"q").expect("q");
    w.flush().expect("flush");
    let code = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s.exit_code();
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("q did not quit; the screen:\n{}", contents());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(pair.master);
    let _ = t.join();
    assert_eq!(code, 0);
    let p = screen.lock().expect("screen");
    assert!(
        !p.screen().alternate_screen(),
        "still on the alternate screen"
    );
    assert!(!p.screen().hide_cursor(), "cursor left hidden");
    seen
}
