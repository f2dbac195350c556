//! The terminal's output, written by a thread of its own, so that nothing on the UI thread ever
//! waits on the terminal (issue 31 item 2: with nothing reading the pty — a stalled SSH session, a
//! frozen terminal emulator — a write blocks until the reader comes back, and the UI thread that
//! blocked in it could not begin a quit).
//!
//! The UI hands finished frames to the writer ([`TermOut`] is the ratatui backend's `Write`: bytes
//! are gathered and handed over on `flush`). A frame is drawn only when the writer has put the
//! last one on the terminal ([`frame_ready`]); otherwise it is skipped, and the next tick tries
//! again, so a terminal that does not drain costs at most one queued frame of memory and the
//! screen catches up when it reads again (nothing is dropped half-written, so the screen never
//! tears). Leaving the screen ([`give_back`]) waits only while the terminal takes bytes.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// More than this many bytes waiting for the terminal: refused (a clipboard copy the size of a
/// book while the terminal does not read).
const MAX_QUEUED: usize = 16 << 20;
/// Written in pieces of this size, so that progress is seen while a slow terminal drains.
const PIECE: usize = 4096;

struct Shared {
    tx: Mutex<Sender<Vec<u8>>>,
    /// Bytes handed over and not yet written.
    queued: AtomicUsize,
    /// Bytes written so far: progress, for [`give_back`]'s patience.
    written: AtomicU64,
    /// The screen was given back: no frame after that.
    closed: AtomicBool,
    /// A write failed (the terminal hung up): bytes are dropped from then on.
    broken: AtomicBool,
}

static OUT: OnceLock<Arc<Shared>> = OnceLock::new();

/// Starts the writer thread for file descriptor `fd` (once; later calls return the same writer).
pub fn start(fd: i32) -> io::Result<TermOut> {
    if let Some(s) = OUT.get() {
        return Ok(TermOut::on(s.clone()));
    }
    let (tx, rx) = channel::<Vec<u8>>();
    let shared = Arc::new(Shared {
        tx: Mutex::new(tx),
        queued: AtomicUsize::new(0),
        written: AtomicU64::new(0),
        closed: AtomicBool::new(false),
        broken: AtomicBool::new(false),
    });
    let s = shared.clone();
    std::thread::Builder::new()
        .name("hipscope-terminal-out".into())
        .spawn(move || {
            for bytes in rx {
                for piece in bytes.chunks(PIECE) {
                    if !s.broken.load(Ordering::Acquire) && write_all(fd, piece).is_err() {
                        s.broken.store(true, Ordering::Release);
                    }
                    s.written.fetch_add(piece.len() as u64, Ordering::AcqRel);
                    s.queued.fetch_sub(piece.len(), Ordering::AcqRel);
                }
            }
        })?;
    let _ = OUT.set(shared);
    Ok(TermOut::on(
        OUT.get().cloned().unwrap_or_else(|| unreachable!()),
    ))
}

fn write_all(fd: i32, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: write(2) from a valid buffer of the given length.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

/// Whether the terminal has taken everything handed to it, so that a new frame may be drawn.
/// True without a writer (tests draw into a buffer).
pub fn frame_ready() -> bool {
    OUT.get()
        .is_none_or(|s| s.queued.load(Ordering::Acquire) == 0 || s.broken.load(Ordering::Acquire))
}

/// Hands `bytes` (the sequences that leave the app's modes) to the terminal as the last thing
/// written, and waits while the terminal takes them: until they are written, or it took nothing
/// for `patience`. Returns whether they were written. Nothing handed over later is written.
/// Without a writer, writes `bytes` to stdout itself.
pub fn give_back(bytes: &[u8], patience: Duration) -> bool {
    let Some(s) = OUT.get() else {
        let mut out = io::stdout();
        return out.write_all(bytes).and_then(|()| out.flush()).is_ok();
    };
    if !hand_over(s, bytes.to_vec(), true) {
        return false;
    }
    let mut seen = s.written.load(Ordering::Acquire);
    let mut since = Instant::now();
    loop {
        if s.queued.load(Ordering::Acquire) == 0 {
            return !s.broken.load(Ordering::Acquire);
        }
        let now = s.written.load(Ordering::Acquire);
        if now != seen {
            seen = now;
            since = Instant::now();
        } else if since.elapsed() >= patience {
            tracing::warn!("the terminal is not reading; left without restoring it on screen");
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Queues `bytes` for the writer; `last`: they are the last (the screen is given back). Returns
/// whether they were queued: nothing is after the last, or once the terminal is broken. The
/// check and the send are under one lock, so that no frame can slip in after the last bytes.
fn hand_over(s: &Shared, bytes: Vec<u8>, last: bool) -> bool {
    let tx = s.tx.lock().unwrap_or_else(|p| p.into_inner());
    if s.closed.load(Ordering::Acquire) {
        return false;
    }
    if last {
        s.closed.store(true, Ordering::Release);
    }
    if bytes.is_empty() || s.broken.load(Ordering::Acquire) {
        return false;
    }
    let n = bytes.len();
    s.queued.fetch_add(n, Ordering::AcqRel);
    if tx.send(bytes).is_err() {
        s.queued.fetch_sub(n, Ordering::AcqRel);
        return false;
    }
    true
}

/// A handle on the writer: gathers what is written and hands it over on `flush`.
pub struct TermOut {
    shared: Arc<Shared>,
    pending: Vec<u8>,
}

impl TermOut {
    fn on(shared: Arc<Shared>) -> TermOut {
        TermOut {
            shared,
            pending: Vec::new(),
        }
    }

    /// Another handle on the same writer (the clipboard's, beside the screen's).
    pub fn another(&self) -> TermOut {
        TermOut::on(self.shared.clone())
    }
}

impl Write for TermOut {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.pending.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let bytes = std::mem::take(&mut self.pending);
        if self.shared.queued.load(Ordering::Acquire) + bytes.len() > MAX_QUEUED {
            return Err(io::Error::other("the terminal is not reading its output"));
        }
        // After the screen was given back nothing is queued: a frame, or the cursor ratatui
        // shows when dropped, must not land on the user's shell.
        hand_over(&self.shared, bytes, false);
        Ok(())
    }
}

/// Writes `text` to stderr from a helper thread and waits at most `limit` for it: a terminal that
/// does not read must not keep a process that is leaving alive.
pub fn eprint_bounded(text: &str, limit: Duration) {
    let bytes = text.as_bytes().to_vec();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let spawned = std::thread::Builder::new()
        .name("hipscope-stderr".into())
        .spawn(move || {
            let _ = write_all(libc::STDERR_FILENO, &bytes);
            let _ = tx.send(());
        });
    if spawned.is_ok() {
        let _ = rx.recv_timeout(limit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_is_an_error_not_a_hang() {
        // A pipe whose reader is gone: EPIPE (SIGPIPE is ignored by the Rust runtime).
        let mut fds = [0; 2];
        // SAFETY: pipe(2) fills two descriptors.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: closing the read end we own.
        unsafe { libc::close(fds[0]) };
        assert!(write_all(fds[1], b"x").is_err());
        // SAFETY: closing the write end we own.
        unsafe { libc::close(fds[1]) };
    }
}
