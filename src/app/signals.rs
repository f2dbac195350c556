//! Every signal hipscope handles, in one place.
//!
//! - **SIGINT, SIGTERM, SIGHUP** are a quit. A thread of their own (`hipscope-signals`,
//!   signal-hook) hands each to the quit coordinator (`QuitCoordinator::signal`), which starts
//!   the quit's one deadline at the first whatever the UI thread is doing, raises the worker's
//!   interrupt and tells the event loop; a second SIGINT or SIGTERM leaves at once. (In raw mode
//!   Ctrl-C is a key, not SIGINT; SIGINT comes from `kill`.)
//! - **SIGBUS, SIGSEGV** get a last word. A memory-mapped model file truncated or overwritten
//!   while in use (a download or a copy onto it) faults on the next read of a page past its new
//!   end, and the default action kills the process with the terminal raw and in the alternate
//!   screen. The model's per-step check of the file (`GgufFile::check_unchanged`) catches most
//!   changes first; a change in the middle of a step ends here. The handler does only
//!   async-signal-safe things (`write`, `poll`, `tcsetattr`, `sigaction`): it puts the terminal
//!   back as the app registered it, says which mapped file the process was reading, puts the
//!   previous handler back (Rust's stack-overflow reporter, or the default) and returns, so the
//!   faulting access runs again and the process ends by the same signal. The conversation needs
//!   no flushing: its records are written as they happen.
//! - SIGWINCH stays crossterm's (it becomes a resize event); SIGPIPE stays ignored (Rust's
//!   runtime), so a closed pipe is a write error.

use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

/// Hands SIGINT, SIGTERM and SIGHUP, by name, to `on_signal` (the chat's: the quit coordinator's
/// [`crate::app::quit::QuitCoordinator::signal`]) on a thread of its own.
#[cfg(unix)]
pub fn listen(on_signal: impl Fn(&'static str) + Send + 'static) -> std::io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    std::thread::Builder::new()
        .name("hipscope-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                on_signal(match sig {
                    SIGINT => "SIGINT",
                    SIGHUP => "SIGHUP",
                    _ => "SIGTERM",
                });
            }
        })?;
    Ok(())
}

#[cfg(not(unix))]
pub fn listen(_on_signal: impl Fn(&'static str) + Send + 'static) -> std::io::Result<()> {
    Ok(())
}

/// What puts the terminal back: its settings from before raw mode, and the bytes that leave the
/// app's modes (alternate screen, mouse, bracketed paste, hidden cursor).
#[cfg(unix)]
struct Terminal {
    /// Where the settings are put back (the terminal input) and where the bytes go (output).
    fd: i32,
    out: i32,
    termios: libc::termios,
    restore: &'static [u8],
}

#[cfg(unix)]
static TERMINAL: OnceLock<Terminal> = OnceLock::new();
/// Whether the terminal is in the app's modes now.
static ARMED: AtomicBool = AtomicBool::new(false);
/// The first faulting thread's progress (0 none, 1 putting the terminal back and writing the
/// message, 2 done). Several threads can fault on one truncated map at once (the CPU backend's
/// pool reads it in parallel): the others wait for the first, or the process would end by their
/// signal halfway through its restore (escapes written, raw mode still on).
static HANDLING: AtomicU8 = AtomicU8::new(0);

const PATH_MAX: usize = 1024;
/// The mapped model file, for the message (a fixed buffer: the handler may not allocate or lock).
static MAPPED: [AtomicU8; PATH_MAX] = [const { AtomicU8::new(0) }; PATH_MAX];
static MAPPED_LEN: AtomicUsize = AtomicUsize::new(0);

#[cfg(unix)]
static PREVIOUS: OnceLock<[libc::sigaction; 2]> = OnceLock::new();

/// Notes the model file that is mapped now, for the message (the chat notes each model as it is
/// asked for and as it is loaded).
pub fn note_mapped_file(path: &Path) {
    let s = path.to_string_lossy();
    let bytes = &s.as_bytes()[..s.len().min(PATH_MAX)];
    MAPPED_LEN.store(0, Ordering::Release);
    for (slot, b) in MAPPED.iter().zip(bytes) {
        slot.store(*b, Ordering::Relaxed);
    }
    MAPPED_LEN.store(bytes.len(), Ordering::Release);
}

/// Installs the handler (once) and records how to put the terminal on `fd` back: call before
/// raw mode is entered. `restore`, written to `out`, leaves the app's terminal modes.
pub fn arm_terminal(fd: i32, out: i32, restore: &'static [u8]) {
    #[cfg(unix)]
    {
        // SAFETY: `termios` is plain data; tcgetattr fills it for a terminal descriptor.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        if unsafe { libc::tcgetattr(fd, &mut t) } != 0 {
            return;
        }
        let _ = TERMINAL.set(Terminal {
            fd,
            out,
            termios: t,
            restore,
        });
        install();
        ARMED.store(true, Ordering::SeqCst);
    }
    #[cfg(not(unix))]
    let _ = (fd, out, restore);
}

/// The terminal is back to normal: the handler leaves it alone.
pub fn disarm_terminal() {
    ARMED.store(false, Ordering::SeqCst);
}

#[cfg(unix)]
fn install() {
    PREVIOUS.get_or_init(|| {
        let mut old: [libc::sigaction; 2] = unsafe { std::mem::zeroed() };
        for (i, sig) in [libc::SIGBUS, libc::SIGSEGV].into_iter().enumerate() {
            // SAFETY: a handler that only calls async-signal-safe functions; `sa_mask` is
            // initialised with sigemptyset.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = handler as *const () as usize;
                sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut sa.sa_mask);
                libc::sigaction(sig, &sa, &mut old[i]);
            }
        }
        old
    });
}

/// Writes `bytes` to `fd`, giving up when the descriptor takes nothing for 200 ms (a terminal
/// that does not read must not hold the process in its fault handler).
#[cfg(unix)]
fn write_all(fd: i32, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: poll(2) on one valid pollfd; async-signal-safe.
        if unsafe { libc::poll(&mut p, 1, 200) } <= 0 || p.revents & libc::POLLOUT == 0 {
            return;
        }
        // SAFETY: write(2) on a valid buffer; async-signal-safe.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n <= 0 {
            return;
        }
        bytes = &bytes[n as usize..];
    }
}

#[cfg(unix)]
extern "C" fn handler(sig: libc::c_int, _info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    if HANDLING
        .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
    {
        last_word(sig);
        HANDLING.store(2, Ordering::SeqCst);
    } else {
        // Another thread is putting the terminal back: at most 2 s, in 1 ms naps
        // (nanosleep is async-signal-safe).
        let nap = libc::timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000,
        };
        for _ in 0..2000 {
            if HANDLING.load(Ordering::SeqCst) != 1 {
                break;
            }
            // SAFETY: nanosleep on a valid timespec; async-signal-safe.
            unsafe { libc::nanosleep(&nap, std::ptr::null_mut()) };
        }
    }
    // The previous action runs when the access faults again on return.
    if let Some(old) = PREVIOUS.get() {
        let i = usize::from(sig != libc::SIGBUS);
        // SAFETY: sigaction is async-signal-safe; `old` came from sigaction.
        unsafe { libc::sigaction(sig, &old[i], std::ptr::null_mut()) };
    }
}

/// Puts the terminal back and says which file the process was reading (the first faulting thread).
#[cfg(unix)]
fn last_word(sig: libc::c_int) {
    if ARMED.swap(false, Ordering::SeqCst)
        && let Some(t) = TERMINAL.get()
    {
        write_all(t.out, t.restore);
        // SAFETY: tcsetattr is async-signal-safe; the settings were read by tcgetattr.
        unsafe { libc::tcsetattr(t.fd, libc::TCSANOW, &t.termios) };
    }
    let err = libc::STDERR_FILENO;
    write_all(
        err,
        if sig == libc::SIGBUS {
            b"\r\nhipscope: SIGBUS: a memory-mapped file was truncated or overwritten while in use"
        } else {
            b"\r\nhipscope: SIGSEGV: invalid memory access"
        },
    );
    let len = MAPPED_LEN.load(Ordering::Acquire).min(PATH_MAX);
    if len > 0 {
        let mut buf = [0u8; PATH_MAX];
        for (b, slot) in buf.iter_mut().zip(&MAPPED[..len]) {
            *b = slot.load(Ordering::Relaxed);
        }
        write_all(err, b" (the model: ");
        write_all(err, &buf[..len]);
        write_all(err, b")");
    }
    write_all(
        err,
        b".\r\nThe conversation so far is saved; hipscope --resume reopens it.\r\n",
    );
}
