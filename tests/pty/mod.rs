//! The real binary in a pseudo-terminal, watched through a terminal-screen parser: shared by the
//! end-to-end chat tests and the reliability tests (issue 12).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use portable_pty::{CommandBuilder, PtySize, native_pty_system};

pub const ROWS: u16 = 32;
pub const COLS: u16 = 110;

pub fn model() -> PathBuf {
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
pub struct Session {
    pub screen: Arc<Mutex<vt100::Parser>>,
    writer: Option<Box<dyn Write + Send>>,
    pub child: Box<dyn portable_pty::Child + Send + Sync>,
    master: Option<Box<dyn portable_pty::MasterPty + Send>>,
    reader: Option<std::thread::JoinHandle<()>>,
    closing: Arc<std::sync::atomic::AtomicBool>,
    /// While set, nothing reads the terminal (a stalled SSH session, a frozen emulator).
    stalled: Arc<std::sync::atomic::AtomicBool>,
}

/// Which model a session's chat is started with.
enum Model<'a> {
    /// `HIPSCOPE_TEST_MODEL`.
    Test,
    File(&'a Path),
    /// None named.
    Default,
}

impl Session {
    pub fn start(home: &Path, extra: &[&str]) -> Session {
        Session::start_with_env(home, extra, &[])
    }

    pub fn start_with_env(home: &Path, extra: &[&str], env: &[(&str, &str)]) -> Session {
        Session::start_wrapped(home, &[], extra, env)
    }

    /// The chat in a session of its own (`setsid`): the pseudo-terminal is not its controlling
    /// terminal, so closing it sends no SIGHUP, reads just end. `setsid -w` stays behind as the
    /// terminal's session leader, waiting for hipscope and passing its exit code on; it must not
    /// die of the SIGHUP that hipscope is spared.
    pub fn start_detached(home: &Path, extra: &[&str]) -> Session {
        let wrapper = ["sh", "-c", "trap '' HUP; exec setsid -w \"$@\"", "sh"];
        Session::start_wrapped(home, &wrapper, extra, &[])
    }

    /// Asks for an answer that runs long and waits until it streams.
    pub fn ask_for_a_long_answer(&mut self) {
        self.sees("Type a message and press Enter", LOAD);
        self.type_line("Count from 1 to 500, separated by commas.");
        sees_tokens(self, 4);
    }

    /// The chat on another model file than `HIPSCOPE_TEST_MODEL`.
    pub fn start_model(home: &Path, model: &Path, extra: &[&str]) -> Session {
        Session::launch(home, &[], Model::File(model), extra, &[])
    }

    /// As [`Session::start_with_env`], run through `wrapper` (e.g. `prlimit --fsize=N --`)
    /// when it is not empty.
    pub fn start_wrapped(
        home: &Path,
        wrapper: &[&str],
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Session {
        Session::launch(home, wrapper, Model::Test, extra, env)
    }

    /// As [`Session::start_model`], with `env` set (a fake `HOME` whose model stores name it).
    pub fn start_model_with_env(
        home: &Path,
        model: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Session {
        Session::launch(home, &[], Model::File(model), extra, env)
    }

    /// The chat with no model named: the default model, fetched into `home` on first use.
    pub fn start_default_model(home: &Path, env: &[(&str, &str)]) -> Session {
        Session::launch(home, &[], Model::Default, &[], env)
    }

    /// The chat with no model file: `extra` names the engine (`--remote URL`).
    pub fn start_without_model(home: &Path, extra: &[&str], env: &[(&str, &str)]) -> Session {
        Session::launch(home, &[], Model::Default, extra, env)
    }

    fn launch(
        home: &Path,
        wrapper: &[&str],
        model_path: Model,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Session {
        let pty = native_pty_system();
        let pair = pty
            .openpty(PtySize {
                rows: ROWS,
                cols: COLS,
                pixel_width: 0,
                pixel_height: 0,
            })
            .expect("openpty");
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = CommandBuilder::new(program);
                c.args(args);
                c.arg(env!("CARGO_BIN_EXE_hipscope"));
                c
            }
            None => CommandBuilder::new(env!("CARGO_BIN_EXE_hipscope")),
        };
        cmd.arg("chat");
        match model_path {
            Model::Test => cmd.arg(model()),
            Model::File(p) => cmd.arg(p),
            Model::Default => {}
        }
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
        // Read through a descriptor of our own, polled, so that `hang_up` can close every
        // descriptor of the master side (a blocked read would keep it open).
        let master_fd = pair.master.as_raw_fd().expect("pty fd");
        // SAFETY: dup of a descriptor the master owns; the File owns the copy.
        let mut reader = unsafe {
            use std::os::fd::FromRawFd;
            std::fs::File::from_raw_fd(libc::dup(master_fd))
        };
        let sink = screen.clone();
        let closing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop = closing.clone();
        let stalled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let resting = stalled.clone();
        let reader = std::thread::spawn(move || {
            use std::os::fd::AsRawFd;
            let mut buf = [0u8; 8192];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if resting.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                let mut p = libc::pollfd {
                    fd: reader.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                if unsafe { libc::poll(&mut p, 1, 50) } <= 0 {
                    continue;
                }
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => sink.lock().expect("screen").process(&buf[..n]),
                }
            }
        });
        let writer = pair.master.take_writer().expect("writer");
        Session {
            screen,
            writer: Some(writer),
            child,
            master: Some(pair.master),
            reader: Some(reader),
            closing,
            stalled,
        }
    }

    /// Resizes the terminal to `rows` × `cols` (the app gets SIGWINCH), and the screen the test
    /// reads with it.
    pub fn resize(&self, rows: u16, cols: u16) {
        self.master
            .as_ref()
            .expect("the terminal is open")
            .resize(PtySize {
                rows,
                cols,
                pixel_width: 0,
                pixel_height: 0,
            })
            .expect("resize the pty");
        let size = |n: u16| std::num::NonZeroU16::new(n).expect("non-zero size");
        self.screen
            .lock()
            .expect("screen")
            .set_size(size(rows), size(cols));
    }

    /// Bytes typed into the terminal that the app has not read yet.
    pub fn pending_input(&self) -> usize {
        let name = self
            .master
            .as_ref()
            .expect("the terminal is open")
            .tty_name()
            .expect("the terminal's name");
        let tty = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
            .open(&name)
            .expect("open the terminal's other side");
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int for a valid descriptor.
        let rc = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&tty),
                libc::FIONREAD,
                &mut n,
            )
        };
        assert_eq!(rc, 0, "FIONREAD: {}", std::io::Error::last_os_error());
        n as usize
    }

    /// Stops reading the terminal (its output piles up until the kernel's buffer is full and
    /// the app's writes block), or reads it again.
    pub fn stall(&self, stalled: bool) {
        self.stalled
            .store(stalled, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn contents(&self) -> String {
        self.screen.lock().expect("screen").screen().contents()
    }

    /// Waits for `text` on the screen.
    pub fn sees(&self, text: &str, within: Duration) {
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

    /// Waits until `text` is no longer on the screen.
    pub fn sees_no(&self, text: &str, within: Duration) {
        let start = Instant::now();
        while self.contents().contains(text) {
            assert!(
                start.elapsed() < within,
                "{text:?} still there after {within:?}; the screen:\n{}",
                self.contents()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        let w = self.writer.as_mut().expect("the terminal is open");
        w.write_all(bytes).expect("write to pty");
        w.flush().expect("flush pty");
    }

    pub fn type_line(&mut self, s: &str) {
        // Typed a little at a time, as keys arrive from a keyboard.
        for chunk in s.as_bytes().chunks(8) {
            self.send(chunk);
            std::thread::sleep(Duration::from_millis(5));
        }
        self.send(b"\r");
    }

    /// Local modes of the terminal right now (ICANON and ECHO are off in raw mode).
    pub fn local_modes(&self) -> libc::tcflag_t {
        let fd = self
            .master
            .as_ref()
            .expect("the terminal is open")
            .as_raw_fd()
            .expect("pty fd");
        // SAFETY: `termios` is plain data; `tcgetattr` fills it for a valid terminal fd.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::tcgetattr(fd, &mut t) };
        assert_eq!(rc, 0, "tcgetattr: {}", std::io::Error::last_os_error());
        t.c_lflag
    }

    pub fn pid(&self) -> i32 {
        self.child.process_id().expect("pid") as i32
    }

    /// Closes the terminal's master side, as a terminal emulator that goes away does.
    pub fn hang_up(&mut self) {
        self.closing
            .store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        self.writer.take();
        self.master.take();
    }

    /// Waits for the process to end; returns its exit code.
    pub fn wait(&mut self, within: Duration) -> u32 {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                self.stall(false);
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
    pub fn assert_restored(&self) {
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
        // A failed test must not leave the process behind — nor what a wrapper started (`setsid
        // -w hipscope`: killing the wrapper alone left the chat running at 100% for 23 minutes).
        if let Ok(None) = self.child.try_wait() {
            if let Some(pid) = self.child.process_id() {
                for p in descendants(pid) {
                    // SAFETY: kill(2) on a process id; a stale one fails harmlessly.
                    unsafe { libc::kill(p as i32, libc::SIGKILL) };
                }
            }
            let _ = self.child.kill();
        }
    }
}

/// Every process below `pid` (Linux: /proc/PID/task/*/children).
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        let tasks = std::fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten();
        for t in tasks.flatten() {
            let kids = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            for k in kids.split_whitespace().filter_map(|k| k.parse().ok()) {
                found.push(k);
                todo.push(k);
            }
        }
    }
    found
}

pub const LOAD: Duration = Duration::from_secs(120);
pub const ANSWER: Duration = Duration::from_secs(180);

/// Waits until the header shows an answer streaming (`N tok · R t/s`).
pub fn sees_streaming(s: &Session) {
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
pub fn sees_tokens(s: &Session, n: usize) {
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
pub fn flat(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

pub fn transcript(home: &Path) -> hipscope::app::transcript::Conversation {
    let dir = home.join("data/conversations");
    let file = hipscope::app::transcript::Transcript::latest(&dir).expect("a transcript");
    hipscope::app::transcript::read(&file).unwrap()
}
