//! Compiling units in child processes, several at once. hiprtc can abort the whole process on a
//! target its LLVM does not know, so compiles run in `hipscope __compile-kernels` children: a
//! crash there becomes a [`BuildStatus::Crashed`] naming the unit it died on, and the app (its
//! terminal in raw mode, the chat's transcript) lives on.
//!
//! Each child takes one unit at a time from its stdin (`u3 infer_matvec.q4_0`: the file stem of
//! the unit's full text in the shared folder, and its name), compiles it, writes `u3.co` beside it
//! and answers with one JSON line. Units go out longest first to whichever child is free, so `jobs`
//! children keep every core busy and a dead or stuck child costs exactly the unit it held: it is
//! replaced and the queue goes on.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{BuildStatus, CHILD_SUBCOMMAND, KernelBuild, KernelUnit};
use crate::gpu::device::RuntimeKind;

/// What a pool compiles with.
pub(super) struct Pool<'a> {
    pub exe: &'a Path,
    pub backend: RuntimeKind,
    pub arch: &'a str,
    /// Most seconds one unit may take before its child is killed.
    pub timeout: Duration,
    pub jobs: usize,
}

struct Worker {
    id: usize,
    child: Child,
    stdin: Option<ChildStdin>,
    /// The unit in flight (its index in `todo`) and since when.
    busy: Option<(usize, Instant)>,
    stderr: Arc<Mutex<String>>,
    /// Killed for running past the timeout (its end reports the unit).
    killed: bool,
}

/// A line from a worker's stdout, or `None` at its end.
type Msg = (usize, Option<String>);

impl Pool<'_> {
    /// Compiles `todo`, calling `done(index, build)` as each finishes (in completion order).
    pub(super) fn run(&self, todo: &[&KernelUnit], done: &mut dyn FnMut(usize, KernelBuild)) {
        let dir = std::env::temp_dir().join(format!(
            "hipscope-compile-{}-{}-{}",
            std::process::id(),
            self.arch,
            super::unique_suffix()
        ));
        let fail_all = |status: BuildStatus, done: &mut dyn FnMut(usize, KernelBuild)| {
            for (i, u) in todo.iter().enumerate() {
                done(i, self.failed(u, status.clone()));
            }
        };
        if let Err(e) = std::fs::create_dir_all(&dir) {
            let why = format!("cannot create {}: {e}", dir.display());
            return fail_all(BuildStatus::Refused(why), done);
        }
        // The units' full texts travel through files, so a HIPSCOPE_KERNELS override reaches the
        // child unchanged.
        for (i, u) in todo.iter().enumerate() {
            if let Err(e) = std::fs::write(dir.join(format!("u{i}.hip")), u.text.as_bytes()) {
                let _ = std::fs::remove_dir_all(&dir);
                let why = format!("cannot write sources: {e}");
                return fail_all(BuildStatus::Refused(why), done);
            }
        }
        self.schedule(&dir, todo, done);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn failed(&self, u: &KernelUnit, status: BuildStatus) -> KernelBuild {
        KernelBuild {
            name: u.name.clone(),
            arch: self.arch.to_string(),
            status,
            image: None,
        }
    }

    fn spawn(&self, id: usize, dir: &Path, tx: &Sender<Msg>) -> Result<Worker, String> {
        let mut child = Command::new(self.exe)
            .arg(CHILD_SUBCOMMAND)
            .arg("--backend")
            .arg(self.backend.name())
            .arg("--arch")
            .arg(self.arch)
            .arg("--dir")
            .arg(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.exe.display()))?;
        // Both pipes are read on threads, so a chatty compiler cannot block on a full pipe.
        if let Some(out) = child.stdout.take() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(out).lines() {
                    match l {
                        Ok(l) => {
                            if tx.send((id, Some(l))).is_err() {
                                return;
                            }
                        }
                        Err(_) => break,
                    }
                }
                let _ = tx.send((id, None));
            });
        }
        let stderr = Arc::new(Mutex::new(String::new()));
        if let Some(mut err) = child.stderr.take() {
            let sink = stderr.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = err.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let mut s = sink.lock().unwrap_or_else(|p| p.into_inner());
                    s.push_str(&String::from_utf8_lossy(&buf[..n]));
                    // Only the tail is ever shown.
                    if s.len() > 64 << 10 {
                        let cut = s.len() - (16 << 10);
                        let cut = (cut..s.len()).find(|&i| s.is_char_boundary(i)).unwrap_or(0);
                        s.drain(..cut);
                    }
                }
            });
        }
        Ok(Worker {
            id,
            stdin: child.stdin.take(),
            child,
            busy: None,
            stderr,
            killed: false,
        })
    }

    fn schedule(&self, dir: &Path, todo: &[&KernelUnit], done: &mut dyn FnMut(usize, KernelBuild)) {
        let (tx, rx): (Sender<Msg>, Receiver<Msg>) = mpsc::channel();
        // Longest first: the big units start at once, the small ones fill the gaps after.
        let mut order: Vec<usize> = (0..todo.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(todo[i].text.len()));
        let mut queue: VecDeque<usize> = order.into();
        let mut workers: Vec<Worker> = Vec::new();
        let mut next_id = 0;
        let mut left = todo.len();
        let mut last_spawn_error = String::new();
        while left > 0 {
            // Keep `jobs` children for the queued units (replacing any that died).
            while workers.len() < self.jobs.max(1) && workers.len() < left {
                next_id += 1;
                match self.spawn(next_id, dir, &tx) {
                    Ok(w) => workers.push(w),
                    Err(e) => {
                        last_spawn_error = e;
                        break;
                    }
                }
            }
            if workers.is_empty() {
                // Nothing can run the rest.
                while let Some(i) = queue.pop_front() {
                    done(
                        i,
                        self.failed(todo[i], BuildStatus::Refused(last_spawn_error.clone())),
                    );
                }
                break;
            }
            for w in workers.iter_mut().filter(|w| w.busy.is_none()) {
                let Some(i) = queue.pop_front() else { break };
                w.busy = Some((i, Instant::now()));
                let line = format!("u{i} {}\n", todo[i].name);
                let sent = w
                    .stdin
                    .as_mut()
                    .is_some_and(|s| s.write_all(line.as_bytes()).and_then(|_| s.flush()).is_ok());
                if !sent {
                    // The child is gone; its end of stdout reports it.
                    w.stdin = None;
                }
            }
            match rx.recv_timeout(Duration::from_millis(20)) {
                Ok((id, Some(line))) => {
                    let Some(w) = workers.iter_mut().find(|w| w.id == id) else {
                        continue;
                    };
                    if let Some((i, b)) = parse_line(&line, self.arch, dir, todo)
                        && w.busy.is_some_and(|(j, _)| j == i)
                    {
                        w.busy = None;
                        done(i, b);
                        left -= 1;
                    }
                }
                Ok((id, None)) => {
                    // A child's stdout ended: it exited or died, with or without a unit.
                    if let Some(at) = workers.iter().position(|w| w.id == id) {
                        let mut w = workers.swap_remove(at);
                        let why = ended(&mut w.child);
                        if let Some((i, _)) = w.busy {
                            done(i, self.failed(todo[i], crashed(&why, &w.stderr)));
                            left -= 1;
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    for w in workers.iter_mut().filter(|w| !w.killed) {
                        if let Some((_, since)) = w.busy
                            && since.elapsed() > self.timeout
                        {
                            // Its stdout ends when it dies: the unit is reported then.
                            let _ = w.child.kill();
                            w.killed = true;
                            w.stdin = None;
                            w.stderr
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push_str(&format!("\ntimed out after {:?}", self.timeout));
                        }
                    }
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        for mut w in workers {
            // End of input: the child returns; one that does not is killed.
            w.stdin = None;
            let t = Instant::now();
            loop {
                match w.child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if t.elapsed() > Duration::from_secs(2) => {
                        let _ = w.child.kill();
                        let _ = w.child.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        }
    }
}

/// How a child whose stdout ended went: its exit, waited for a short while.
fn ended(child: &mut Child) -> String {
    let t = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(st)) if st.success() => return "exited before reporting".into(),
            Ok(Some(st)) => return super::describe_exit(&st),
            Ok(None) if t.elapsed() > Duration::from_secs(5) => {
                let _ = child.kill();
                let _ = child.wait();
                return "closed its output and was killed".into();
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return format!("wait failed: {e}"),
        }
    }
}

fn crashed(why: &str, stderr: &Mutex<String>) -> BuildStatus {
    let text = stderr.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let tail = super::tail_lines(&text, 6);
    BuildStatus::Crashed(if tail.is_empty() {
        why.to_string()
    } else {
        format!("{why}: {tail}")
    })
}

/// A child's report line: the unit's index and build.
fn parse_line(
    line: &str,
    arch: &str,
    dir: &Path,
    todo: &[&KernelUnit],
) -> Option<(usize, KernelBuild)> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let stem = v.get("unit")?.as_str()?;
    let i: usize = stem.strip_prefix('u')?.parse().ok()?;
    let name = todo.get(i)?.name.clone();
    let build = if v.get("ok")?.as_bool()? {
        let millis = v.get("millis").and_then(|m| m.as_f64()).unwrap_or(0.0);
        let path: PathBuf = dir.join(format!("{stem}.co"));
        match std::fs::read(&path) {
            Ok(image) => KernelBuild {
                name,
                arch: arch.to_string(),
                status: BuildStatus::Compiled { millis },
                image: Some(image),
            },
            Err(e) => KernelBuild {
                name,
                arch: arch.to_string(),
                status: BuildStatus::Failed(format!("reading {}: {e}", path.display())),
                image: None,
            },
        }
    } else {
        let log = v.get("log").and_then(|l| l.as_str()).unwrap_or("(no log)");
        KernelBuild {
            name,
            arch: arch.to_string(),
            status: BuildStatus::Failed(log.to_string()),
            image: None,
        }
    };
    Some((i, build))
}

/// The child side: compiles the units named on stdin, one a line (`u3 infer_matvec.q4_0`), from
/// `<dir>/u3.hip` (full text) into `<dir>/u3.co`, one JSON line per unit on stdout (flushed, so
/// the parent knows how far it got if the compiler aborts). Returns the exit code at the end of
/// its input.
pub fn run_child(compiler: &dyn super::KernelCompiler, arch: &str, dir: &Path) -> i32 {
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let mut parts = line.split_whitespace();
        let (Some(stem), name) = (parts.next(), parts.next().unwrap_or("kernel")) else {
            continue;
        };
        let report = match std::fs::read_to_string(dir.join(format!("{stem}.hip"))) {
            Err(e) => serde_json::json!({"unit": stem, "ok": false,
                "log": format!("cannot read the unit: {e}")}),
            Ok(text) => {
                let t = Instant::now();
                match compiler.compile(name, &text, arch) {
                    Ok(img) => match std::fs::write(dir.join(format!("{stem}.co")), &img) {
                        Ok(()) => serde_json::json!({"unit": stem, "ok": true,
                            "bytes": img.len(), "millis": t.elapsed().as_secs_f64() * 1e3}),
                        Err(e) => serde_json::json!({"unit": stem, "ok": false,
                            "log": format!("cannot write the code object: {e}")}),
                    },
                    Err(crate::gpu::device::GpuError::Compile { log, .. }) => {
                        serde_json::json!({"unit": stem, "ok": false, "log": log})
                    }
                    Err(e) => serde_json::json!({"unit": stem, "ok": false, "log": e.to_string()}),
                }
            }
        };
        let mut lock = stdout.lock();
        if writeln!(lock, "{report}")
            .and_then(|_| lock.flush())
            .is_err()
        {
            return 1;
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_lines_parse_into_builds() {
        let dir = std::env::temp_dir().join(format!("hipscope-pool-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("u1.co"), b"code").expect("write");
        let a = KernelUnit {
            name: "busy".into(),
            text: "a".into(),
        };
        let b = KernelUnit {
            name: "gemm".into(),
            text: "b".into(),
        };
        let todo = [&a, &b];
        let (i, ok) = parse_line(
            r#"{"unit":"u1","ok":true,"bytes":4,"millis":1.5}"#,
            "gfx1030",
            &dir,
            &todo,
        )
        .expect("ok line");
        assert_eq!((i, ok.name.as_str()), (1, "gemm"));
        assert_eq!(ok.image.as_deref(), Some(&b"code"[..]));
        assert_eq!(ok.status, BuildStatus::Compiled { millis: 1.5 });
        let (i, bad) = parse_line(
            r#"{"unit":"u0","ok":false,"log":"error: x"}"#,
            "gfx1030",
            &dir,
            &todo,
        )
        .expect("failed line");
        assert_eq!((i, bad.status), (0, BuildStatus::Failed("error: x".into())));
        assert!(parse_line("garbage", "gfx1030", &dir, &todo).is_none());
        assert!(parse_line(r#"{"unit":"u7","ok":true}"#, "gfx1030", &dir, &todo).is_none());
        let _ = std::fs::remove_dir_all(dir);
    }
}
