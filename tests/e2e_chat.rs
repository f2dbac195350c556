//! The real binary in a pseudo-terminal with the real SmolLM2 model on the CPU backend, watched
//! through a terminal-screen parser: ask, see the answer stream in, stop one with Esc, quit with
//! Ctrl-C, and check the exit code and that every terminal mode was put back; SIGTERM in the
//! middle of an answer leaves cleanly with the conversation so far on disk.
//!
//! The model comes from `HIPSCOPE_TEST_MODEL` (`.ci/run` sets it); without it these tests fail
//! rather than pass without running.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use portable_pty::{CommandBuilder, PtySize, native_pty_system};

const ROWS: u16 = 32;
const COLS: u16 = 110;

fn model() -> PathBuf {
    let p = std::env::var_os("HIPSCOPE_TEST_MODEL").expect(
        "HIPSCOPE_TEST_MODEL must name SmolLM2-135M-Instruct.Q4_1.gguf (the end-to-end tests \
         need the real model)",
    );
    let p = PathBuf::from(p);
    assert!(
        p.is_file(),
        "HIPSCOPE_TEST_MODEL={} is not a file",
        p.display()
    );
    p
}

/// The app running in a pseudo-terminal.
struct Session {
    screen: Arc<Mutex<vt100::Parser>>,
    writer: Box<dyn Write + Send>,
    child: Box<dyn portable_pty::Child + Send + Sync>,
    master: Box<dyn portable_pty::MasterPty + Send>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Session {
    fn start(home: &Path, extra: &[&str]) -> Session {
        Session::start_with_env(home, extra, &[])
    }

    fn start_with_env(home: &Path, extra: &[&str], env: &[(&str, &str)]) -> Session {
        Session::start_model(home, &model(), extra, env)
    }

    fn start_model(home: &Path, model: &Path, extra: &[&str], env: &[(&str, &str)]) -> Session {
        let pty = native_pty_system();
        let pair = pty
            .openpty(PtySize {
                rows: ROWS,
                cols: COLS,
                pixel_width: 0,
                pixel_height: 0,
            })
            .expect("openpty");
        let mut cmd = CommandBuilder::new(env!("CARGO_BIN_EXE_hipscope"));
        cmd.arg("chat");
        cmd.arg(model);
        cmd.args(["--backend", "cpu", "--temp", "0", "--threads", "2"]);
        cmd.args(extra);
        cmd.env("HIPSCOPE_HOME", home);
        cmd.env("TERM", "xterm-256color");
        cmd.env_remove("HIPSCOPE_CONFIG");
        cmd.env_remove("NO_COLOR");
        // A panic's message must fit on the screen the test reads.
        cmd.env("RUST_BACKTRACE", "0");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.cwd(home);
        let child = pair.slave.spawn_command(cmd).expect("spawn hipscope");
        drop(pair.slave);
        let size = |n: u16| std::num::NonZeroU16::new(n).expect("non-zero size");
        let screen = Arc::new(Mutex::new(vt100::Parser::new(size(ROWS), size(COLS), 0)));
        let mut reader = pair.master.try_clone_reader().expect("reader");
        let sink = screen.clone();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => sink.lock().expect("screen").process(&buf[..n]),
                }
            }
        });
        let writer = pair.master.take_writer().expect("writer");
        Session {
            screen,
            writer,
            child,
            master: pair.master,
            reader: Some(reader),
        }
    }

    fn contents(&self) -> String {
        self.screen.lock().expect("screen").screen().contents()
    }

    /// Waits for `text` on the screen.
    fn sees(&self, text: &str, within: Duration) {
        let start = Instant::now();
        while !self.contents().contains(text) {
            assert!(
                start.elapsed() < within,
                "never saw {text:?} within {within:?}; the screen:\n{}",
                self.contents()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).expect("write to pty");
        self.writer.flush().expect("flush pty");
    }

    fn type_line(&mut self, s: &str) {
        // Typed a little at a time, as keys arrive from a keyboard.
        for chunk in s.as_bytes().chunks(8) {
            self.send(chunk);
            std::thread::sleep(Duration::from_millis(5));
        }
        self.send(b"\r");
    }

    /// Local modes of the terminal right now (ICANON and ECHO are off in raw mode).
    fn local_modes(&self) -> libc::tcflag_t {
        let fd = self.master.as_raw_fd().expect("pty fd");
        // SAFETY: `termios` is plain data; `tcgetattr` fills it for a valid terminal fd.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::tcgetattr(fd, &mut t) };
        assert_eq!(rc, 0, "tcgetattr: {}", std::io::Error::last_os_error());
        t.c_lflag
    }

    fn pid(&self) -> i32 {
        self.child.process_id().expect("pid") as i32
    }

    /// Waits for the process to end; returns its exit code.
    fn wait(&mut self, within: Duration) -> u32 {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                if let Some(r) = self.reader.take() {
                    let _ = r.join();
                }
                return status.exit_code();
            }
            assert!(
                start.elapsed() < within,
                "hipscope did not exit within {within:?}; the screen:\n{}",
                self.contents()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Everything hipscope turned on is off again.
    fn assert_restored(&self) {
        let p = self.screen.lock().expect("screen");
        let s = p.screen();
        assert!(!s.alternate_screen(), "still on the alternate screen");
        assert_eq!(
            s.mouse_protocol_mode(),
            vt100::MouseProtocolMode::None,
            "mouse capture left on"
        );
        assert!(!s.bracketed_paste(), "bracketed paste left on");
        assert!(!s.hide_cursor(), "cursor left hidden");
        drop(p);
        let lflag = self.local_modes();
        assert_ne!(lflag & libc::ICANON, 0, "raw mode left on (no ICANON)");
        assert_ne!(lflag & libc::ECHO, 0, "raw mode left on (no ECHO)");
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // A failed test must not leave the process behind.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
    }
}

const LOAD: Duration = Duration::from_secs(120);
const ANSWER: Duration = Duration::from_secs(180);

/// Waits until the header shows an answer streaming (`N tok · R t/s`).
fn sees_streaming(s: &Session) {
    let start = Instant::now();
    loop {
        let c = s.contents();
        let first = c.lines().next().unwrap_or_default();
        if first.contains(" tok · ") && first.contains("t/s") {
            return;
        }
        assert!(
            start.elapsed() < ANSWER,
            "the answer never streamed; the screen:\n{c}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until the header shows an answer streaming with at least `n` tokens so far.
fn sees_tokens(s: &Session, n: usize) {
    let start = Instant::now();
    loop {
        let c = s.contents();
        let first = c.lines().next().unwrap_or_default().to_string();
        let count = first
            .split(" tok · ")
            .next()
            .and_then(|head| head.split_whitespace().last())
            .and_then(|w| w.parse::<usize>().ok());
        if count.is_some_and(|k| k >= n) {
            return;
        }
        assert!(
            start.elapsed() < ANSWER,
            "never saw {n} tokens streamed; the screen:\n{c}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The screen's text with every run of whitespace (line ends included) made one space, so that
/// word-wrapped text can be searched for.
fn flat(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn transcript(home: &Path) -> hipscope::app::transcript::Conversation {
    let dir = home.join("data/conversations");
    let file = hipscope::app::transcript::Transcript::latest(&dir).expect("a transcript");
    hipscope::app::transcript::read(&file).unwrap()
}

#[test]
fn ask_watch_it_stream_stop_with_esc_and_quit() {
    let home = tempfile::tempdir().unwrap();
    let mut s = Session::start(home.path(), &["-n", "200"]);
    s.sees("Type a message and press Enter", LOAD);
    let raw = s.local_modes();
    assert_eq!(raw & libc::ICANON, 0, "the app runs in raw mode");
    assert!(s.screen.lock().unwrap().screen().alternate_screen());

    // A first question, answered in full: it streams (the header counts tokens while the
    // answer grows), then the statistics line closes it.
    s.type_line("What is the capital of France?");
    s.sees("What is the capital of France?", Duration::from_secs(10));
    sees_streaming(&s);
    let start = Instant::now();
    loop {
        let c = s.contents();
        if c.contains("end of text") || c.contains("token limit") {
            break;
        }
        assert!(start.elapsed() < ANSWER, "the answer never finished:\n{c}");
        std::thread::sleep(Duration::from_millis(20));
    }
    s.sees("TTFT", Duration::from_secs(5));
    // What the screen shows is what was generated: the end of the saved answer is on it.
    let saved = transcript(home.path());
    let answer = flat(&saved.turns[0].answer);
    assert!(!answer.is_empty());
    let tail: String = {
        let words: Vec<&str> = answer.split(' ').collect();
        words[words.len().saturating_sub(4)..].join(" ")
    };
    assert!(
        flat(&s.contents()).contains(&tail),
        "{tail:?} not on the screen:\n{}",
        s.contents()
    );

    // F9 shows the diagnostics column (the terminal is narrower than the 120 columns that show
    // it unasked); its Host panel carries the sampled memory and CPU use.
    s.send(b"\x1b[20~");
    s.sees("╭ Host ", Duration::from_secs(5));
    s.sees("│cpu ", Duration::from_secs(5));
    let c = s.contents();
    let row = |label: &str| -> String {
        let line = c
            .lines()
            .find(|l| l.contains(&format!("│{label} ")))
            .unwrap();
        let after = line.split(&format!("│{label} ")).nth(1).unwrap();
        after.trim_end_matches(['│', ' ']).trim().to_string()
    };
    let cpu = row("cpu");
    let pct: f32 = cpu.trim_end_matches('%').parse().unwrap_or(-1.0);
    assert!(
        cpu.ends_with('%') && (0.0..=100.0).contains(&pct),
        "{cpu:?}:\n{c}"
    );
    assert!(row("memory").contains(" / "), "{c}");
    s.send(b"\x1b[20~");

    // A second one, stopped part-way with Esc once a few tokens are in.
    s.type_line("Write a very long story about a dragon who learns to cook.");
    sees_tokens(&s, 3);
    s.send(b"\x1b");
    s.sees("· stopped", Duration::from_secs(30));

    // Quit: the process ends with 0, and the terminal is as it was.
    s.send(b"\x03");
    let code = s.wait(Duration::from_secs(30));
    assert_eq!(code, 0, "exit code; the screen:\n{}", s.contents());
    s.assert_restored();

    // The conversation is on disk, both exchanges, the second cut short.
    let c = transcript(home.path());
    assert_eq!(c.turns.len(), 2);
    assert_eq!(c.turns[0].user, "What is the capital of France?");
    assert_eq!(flat(&c.turns[0].answer), answer);
    assert!(!c.turns[1].answer.is_empty());
    assert!(
        c.turns[1]
            .summary
            .as_deref()
            .is_some_and(|s| s.ends_with("stopped")),
        "{:?}",
        c.turns[1].summary
    );
}

#[test]
fn sigterm_mid_answer_exits_cleanly_with_the_transcript_so_far() {
    let home = tempfile::tempdir().unwrap();
    let mut s = Session::start(home.path(), &["-n", "-1"]);
    s.sees("Type a message and press Enter", LOAD);
    s.type_line("Count from 1 to 500, separated by commas.");
    sees_tokens(&s, 4);
    // SAFETY: sending a signal to our own child process.
    let rc = unsafe { libc::kill(s.pid(), libc::SIGTERM) };
    assert_eq!(rc, 0);
    let code = s.wait(Duration::from_secs(30));
    assert_eq!(code, 0, "exit code; the screen:\n{}", s.contents());
    s.assert_restored();
    let c = transcript(home.path());
    assert_eq!(c.turns.len(), 1);
    assert_eq!(c.turns[0].user, "Count from 1 to 500, separated by commas.");
    assert!(
        !c.turns[0].answer.trim().is_empty(),
        "the answer so far is saved"
    );
    // Cut by the quit, not finished on its own.
    assert!(
        c.turns[0]
            .summary
            .as_deref()
            .is_some_and(|s| s.ends_with("stopped")),
        "{:?}",
        c.turns[0].summary
    );
}

#[test]
fn resume_reopens_the_last_conversation_and_goes_on() {
    let home = tempfile::tempdir().unwrap();
    let mut s = Session::start(home.path(), &["-n", "12"]);
    s.sees("Type a message and press Enter", LOAD);
    s.type_line("Name a colour.");
    s.sees("TTFT", ANSWER);
    s.send(b"\x03");
    assert_eq!(s.wait(Duration::from_secs(30)), 0);
    let first = transcript(home.path());
    assert_eq!(first.turns.len(), 1);

    let mut s = Session::start(home.path(), &["-n", "12", "--resume"]);
    s.sees("reopened 1 exchange", LOAD);
    s.sees("Name a colour.", Duration::from_secs(5));
    // The history has the old question.
    s.send(b"\x1b[A");
    s.sees("│Name a colour.", Duration::from_secs(5));
    s.send(b"\x1b[B"); // back to the (empty) draft
    // Sent at once, loaded or not: a message typed while the model loads waits for it.
    s.type_line("And another one?");
    s.sees("And another one?", Duration::from_secs(5));
    let start = Instant::now();
    while transcript(home.path()).turns.len() < 2
        || transcript(home.path()).turns[1].summary.is_none()
    {
        assert!(start.elapsed() < ANSWER, "{}", s.contents());
        std::thread::sleep(Duration::from_millis(50));
    }
    s.send(b"\x03");
    assert_eq!(s.wait(Duration::from_secs(30)), 0);
    s.assert_restored();
    // One file, appended to: the first exchange and the new one.
    let files = std::fs::read_dir(home.path().join("data/conversations"))
        .unwrap()
        .count();
    assert_eq!(files, 1);
    let c = transcript(home.path());
    assert_eq!(c.turns.len(), 2);
    assert_eq!(c.turns[0], first.turns[0]);
    assert_eq!(c.turns[1].user, "And another one?");
    assert!(!c.turns[1].answer.is_empty());
}

#[test]
fn a_broken_config_stops_with_the_key_and_leaves_the_terminal_alone() {
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("config/config.toml");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    std::fs::write(&config, "[sampler]\ntemp = \"hot\"\n").unwrap();
    let mut s = Session::start(home.path(), &[]);
    let code = s.wait(Duration::from_secs(30));
    assert_eq!(code, 2);
    let text = s.contents();
    assert!(
        text.contains("`sampler.temp` = \"hot\" is not allowed: a number from 0 to 5"),
        "{text}"
    );
    assert!(text.contains("config.toml"), "{text}");
    s.assert_restored();
    // The user's file is left as it was.
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        "[sampler]\ntemp = \"hot\"\n"
    );
}

#[test]
fn a_model_that_fails_to_load_is_in_the_log_at_the_default_level() {
    let home = tempfile::tempdir().unwrap();
    let broken = home.path().join("broken.gguf");
    // A GGUF header that claims more tensors than the file holds.
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&1_000_000u64.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    std::fs::write(&broken, b).unwrap();
    let mut s = Session::start_model(home.path(), &broken, &[], &[]);
    s.sees("Enter/Esc dismiss", LOAD);
    s.sees("broken.gguf", Duration::from_secs(5));
    s.send(b"\x1b");
    std::thread::sleep(Duration::from_millis(300));
    s.type_line("/quit");
    assert_eq!(s.wait(Duration::from_secs(30)), 0, "{}", s.contents());
    let log = std::fs::read_to_string(home.path().join("state/hipscope.log")).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("ERROR") && l.contains("loading the model"))
        .unwrap_or_else(|| panic!("no load failure in the log:\n{log}"));
    assert!(line.contains("broken.gguf"), "{line}");
}

#[test]
fn a_panic_on_the_ui_thread_restores_the_terminal_first() {
    let home = tempfile::tempdir().unwrap();
    let mut s = Session::start_with_env(home.path(), &[], &[("HIPSCOPE_FAULT", "panic")]);
    let code = s.wait(Duration::from_secs(60));
    assert_eq!(code, 101);
    s.assert_restored();
    // The message was printed after the restore, so it is on the normal screen.
    let text = s.contents();
    assert!(text.contains("HIPSCOPE_FAULT=panic"), "{text}");
    assert!(text.contains("left without waiting for the GPU"), "{text}");
}

#[test]
fn version_prints_and_exits() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hipscope"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("hipscope {}", env!("CARGO_PKG_VERSION"))
    );
}
