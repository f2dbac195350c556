//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod quant_ref;
pub mod worker;

use std::path::PathBuf;
use std::process::{Command, Output};

/// The real default model (SmolLM2-135M-Instruct Q4_1). `scripts/test.sh` fetches it and sets
/// `HIPSCOPE_TEST_MODEL`; without it the test fails and says how to get it.
pub fn smollm2() -> PathBuf {
    let p = std::env::var_os("HIPSCOPE_TEST_MODEL").map(PathBuf::from).expect(
        "HIPSCOPE_TEST_MODEL is not set: run the tests with scripts/test.sh, or `hipscope fetch` and \
         export HIPSCOPE_TEST_MODEL=$(hipscope fetch --print-path)",
    );
    assert!(
        p.is_file(),
        "HIPSCOPE_TEST_MODEL={} does not exist",
        p.display()
    );
    p
}

/// The hipscope binary under test.
pub fn hipscope() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hipscope"));
    // Keep the tests' caches and configs away from the user's.
    c.env(
        "HIPSCOPE_HOME",
        std::env::temp_dir().join("hipscope-test-home"),
    );
    c
}

/// Runs hipscope and returns its output, failing the test with stderr if it failed.
pub fn run_ok(args: &[&str]) -> Output {
    let out = hipscope().args(args).output().expect("run hipscope");
    assert!(
        out.status.success(),
        "hipscope {args:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Compiles the C++ source `src` into `dir/name` with the system compiler (`c++`, which
/// scripts/setup.sh installs) and `flags`; the program's path, or a test failure with the
/// compiler's errors. The host harnesses of the kernel sources (`kernel_dequant_host`,
/// `kernel_emulation`) build so.
pub fn compile_cpp(dir: &std::path::Path, name: &str, src: &str, flags: &[&str]) -> PathBuf {
    let cpp = dir.join(format!("{name}.cpp"));
    std::fs::write(&cpp, src).unwrap_or_else(|e| panic!("{}: {e}", cpp.display()));
    let exe = dir.join(name);
    let out = Command::new("c++")
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(&cpp)
        .output()
        .unwrap_or_else(|e| panic!("c++ (scripts/setup.sh installs g++): {e}"));
    assert!(
        out.status.success(),
        "c++ failed on {}:\n{}",
        cpp.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Marsaglia's xorshift64 (shifts 13, 7, 17): the state's next value. Reproducible test data
/// without a dependency; the state must not be 0.
pub fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

pub fn repo_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The JSON file at `rel` in the repository (test data), read into `T`; a test failure naming
/// the file if it is missing or does not parse.
pub fn read_json<T: serde::de::DeserializeOwned>(rel: &str) -> T {
    let path = repo_path(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One of a command's output streams.
pub enum Stream {
    Stdout,
    Stderr,
}

/// Runs `cmd` with `closed` a pipe whose reading end is closed at once (`| head -c 0`, a reader
/// gone), and the other stream read whole into the output.
pub fn with_closed(mut cmd: Command, closed: Stream) -> Output {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run hipscope");
    let mut open = Vec::new();
    match closed {
        Stream::Stdout => {
            drop(child.stdout.take());
            child.stderr.take().unwrap().read_to_end(&mut open).unwrap();
        }
        Stream::Stderr => {
            drop(child.stderr.take());
            child.stdout.take().unwrap().read_to_end(&mut open).unwrap();
        }
    }
    let status = child.wait().unwrap();
    match closed {
        Stream::Stdout => Output {
            status,
            stdout: Vec::new(),
            stderr: open,
        },
        Stream::Stderr => Output {
            status,
            stdout: open,
            stderr: Vec::new(),
        },
    }
}
