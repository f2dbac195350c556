//! Issue 32 items 2 and 3: on a machine without a usable GPU, `doctor` and `top` say in one line
//! that models run on the CPU and the next step for each vendor; `doctor --json` carries the
//! verdict, `doctor --require-gpu` exits 1, `top --json` keeps the line in its notes; and `top`
//! without a terminal prints the readings instead of failing. Run through the binary on this
//! machine (whatever it has), on an empty captured tree (no GPU anywhere), and with the fake
//! device (a GPU that works).

mod common;

use std::os::unix::process::CommandExt;
use std::process::Stdio;

use common::hipscope;

/// `--sysfs-root`/`--procfs-root` of an empty captured tree: no GPU in it.
fn empty_tree(dir: &std::path::Path) -> Vec<String> {
    for d in ["sys", "proc"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    vec![
        "--sysfs-root".into(),
        dir.join("sys").display().to_string(),
        "--procfs-root".into(),
        dir.join("proc").display().to_string(),
    ]
}

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn assert_cpu_line(line: &str) {
    assert!(!line.contains('\n'), "one line: {line}");
    for want in ["models run on the CPU", "for AMD: ", "for NVIDIA: "] {
        assert!(line.contains(want), "{want:?} missing from: {line}");
    }
}

/// This machine, for real: the verdict agrees with what the doctor found, and `--require-gpu`
/// with the verdict.
#[test]
fn doctor_on_this_machine_ends_with_a_verdict() {
    let out = hipscope().args(["doctor", "--json"]).output().expect("run");
    let v = json(&out);
    let verdict = &v["verdict"];
    let summary = verdict["summary"].as_str().expect("a summary");
    let opened = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["name"] == "device opens, kernels compile" && c["status"] == "PASS");
    if opened {
        assert_eq!(verdict["runs_on"], "gpu", "{verdict}");
    } else {
        // No GPU here (this project's CI): the CPU, and a step per vendor.
        assert_eq!(verdict["outcome"], "cpu", "{verdict}");
        assert_eq!(verdict["runs_on"], "cpu");
        assert_cpu_line(summary);
        let vendors: Vec<&str> = verdict["next"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["vendor"].as_str().unwrap())
            .collect();
        assert_eq!(vendors, ["AMD", "NVIDIA"]);
    }
    let text = hipscope().arg("doctor").output().expect("run");
    let stdout = String::from_utf8_lossy(&text.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    assert_eq!(last, format!("verdict: {summary}"), "{stdout}");
    let required = hipscope()
        .args(["doctor", "--require-gpu"])
        .output()
        .expect("run");
    let works = verdict["outcome"] == "gpu";
    assert_eq!(
        required.status.code(),
        Some(if works { 0 } else { 1 }),
        "{verdict}"
    );
}

#[test]
fn doctor_on_a_tree_without_a_gpu_says_the_cpu_runs_and_require_gpu_fails() {
    let dir = tempfile::tempdir().unwrap();
    let roots = empty_tree(dir.path());
    let out = hipscope().arg("doctor").args(&roots).output().expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "nothing failed:\n{stdout}");
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.starts_with("verdict: no GPU found"), "{stdout}");
    assert_cpu_line(last);
    let out = hipscope()
        .args(["doctor", "--require-gpu", "--json"])
        .args(&roots)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json(&out)["verdict"]["outcome"], "cpu");
}

/// The fake device is a GPU that opens and passes: the verdict says GPU inference works, and
/// `--require-gpu` is satisfied.
#[test]
fn doctor_with_a_working_gpu_says_so() {
    let out = hipscope()
        .args([
            "doctor",
            "--backend",
            "fake",
            "--only",
            "gemm",
            "--require-gpu",
            "--json",
        ])
        .output()
        .expect("run");
    let v = json(&out);
    assert_eq!(out.status.code(), Some(0), "{}", v["verdict"]);
    assert_eq!(v["verdict"]["outcome"], "gpu");
    assert!(
        v["verdict"]["summary"]
            .as_str()
            .unwrap()
            .starts_with("GPU inference works here")
    );
}

#[test]
fn top_without_a_gpu_keeps_the_reason_in_text_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let roots = empty_tree(dir.path());
    let out = hipscope()
        .args(["top", "--once", "--json"])
        .args(&roots)
        .output()
        .expect("run");
    assert!(out.status.success());
    let v = json(&out);
    let note = v["notes"][0].as_str().expect("a note");
    assert!(note.starts_with("no GPU found"), "{note}");
    assert_cpu_line(note);
    let out = hipscope()
        .args(["top", "--once"])
        .args(&roots)
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("models run on the CPU"), "{text}");
}

/// `setsid -w hipscope top </dev/null | cat`: no controlling terminal, stdin and stdout not
/// terminals. It printed "No such device or address (os error 6)"; now the readings, as
/// `--once` prints them, and a line on stderr saying why.
#[test]
fn top_without_a_terminal_prints_one_sample() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = hipscope();
    cmd.arg("top")
        .args(empty_tree(dir.path()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setsid is async-signal-safe; it detaches the child from any controlling terminal.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stdout.starts_with("host"), "{stdout}");
    assert!(stdout.contains("models run on the CPU"), "{stdout}");
    assert!(
        stderr.contains("not a terminal") && stderr.contains("top --once"),
        "{stderr}"
    );
    assert!(!stderr.contains("os error"), "{stderr}");
}
