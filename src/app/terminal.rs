//! The terminal: the app's modes (raw, alternate screen, bracketed paste, mouse, kitty keyboard
//! flags) entered by [`TerminalGuard`] and left by [`restore_terminal`] on every way out —
//! normal exit, error, panic (the quit coordinator's panic hook), SIGTERM and the hard exit (an
//! exit hook); and its input, read on a thread of its own ([`spawn_input`]). Output goes through
//! `terminal_out`'s writer thread: nothing here waits on a terminal that does not read.

use std::io::{self, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use crossterm::event::{
    EnableBracketedPaste, EnableMouseCapture, Event, KeyboardEnhancementFlags,
    PushKeyboardEnhancementFlags,
};
use crossterm::terminal::{EnterAlternateScreen, disable_raw_mode, enable_raw_mode};
use tokio::sync::mpsc::UnboundedSender;

use super::terminal_out::{self, TermOut};

static TERMINAL_ACTIVE: AtomicBool = AtomicBool::new(false);

/// How long leaving the screen waits for a terminal that takes no bytes at all.
const RESTORE_PATIENCE: Duration = Duration::from_millis(500);

/// What [`restore_terminal`] sends, as raw bytes (also for the fatal-signal handler, which may
/// not format): keyboard flags popped, mouse reports, bracketed paste and the alternate screen
/// off, the cursor shown.
const RESTORE: &[u8] =
    b"\x1b[<1u\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1015l\x1b[?1006l\x1b[?2004l\x1b[?1049l\x1b[?25h";

/// Which of stdin (bit 0) and stdout (bit 1) were the app's terminal when it started.
static TERMINAL_FDS: AtomicU8 = AtomicU8::new(0);

/// Whether the app's terminal has gone away: its other side closed (the terminal emulator or
/// tmux gone), which poll reports as a hang-up. When the terminal is not the process's
/// controlling one no SIGHUP comes, and reads just return nothing, forever.
pub fn terminal_gone() -> bool {
    #[cfg(unix)]
    {
        let mask = TERMINAL_FDS.load(Ordering::SeqCst);
        let mut fds: Vec<libc::pollfd> = [0, 1]
            .into_iter()
            .filter(|fd| mask & (1 << fd) != 0)
            .map(|fd| libc::pollfd {
                fd,
                events: 0,
                revents: 0,
            })
            .collect();
        if fds.is_empty() {
            return false;
        }
        // SAFETY: poll over a valid array of pollfd, without waiting.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
        n > 0
            && fds
                .iter()
                .any(|f| f.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0)
    }
    #[cfg(not(unix))]
    false
}

/// Puts the terminal into the app's modes; restores them when dropped (also on unwinding).
pub struct TerminalGuard {
    mouse: bool,
    out: TermOut,
}

impl TerminalGuard {
    pub fn enter(mouse: bool) -> io::Result<TerminalGuard> {
        // A SIGBUS (a model file truncated under its map) or SIGSEGV puts these modes back too.
        super::signals::arm_terminal(0, 1, RESTORE);
        TERMINAL_FDS.store(
            u8::from(io::stdin().is_terminal()) | u8::from(io::stdout().is_terminal()) << 1,
            Ordering::SeqCst,
        );
        let mut out = terminal_out::start(libc::STDOUT_FILENO)?;
        enable_raw_mode()?;
        TERMINAL_ACTIVE.store(true, Ordering::SeqCst);
        let setup = (|| {
            crossterm::queue!(out, EnterAlternateScreen, EnableBracketedPaste)?;
            if mouse {
                crossterm::queue!(out, EnableMouseCapture)?;
            }
            // Reports Esc and modified keys (Shift-Enter) unambiguously where the terminal
            // speaks the kitty keyboard protocol; others ignore the request.
            crossterm::queue!(
                out,
                PushKeyboardEnhancementFlags(KeyboardEnhancementFlags::DISAMBIGUATE_ESCAPE_CODES)
            )?;
            out.flush()
        })();
        if let Err(e) = setup {
            restore_terminal();
            return Err(e);
        }
        Ok(TerminalGuard { mouse, out })
    }

    pub fn mouse(&self) -> bool {
        self.mouse
    }

    /// A handle on the terminal's writer (the screen's backend, the clipboard).
    pub fn output(&self) -> TermOut {
        self.out.another()
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore_terminal();
    }
}

/// Leaves the app's terminal modes. Safe to call more than once, from any thread (the panic
/// hook, the hard exit). The line discipline first (one ioctl, which cannot block: a hard exit's
/// hook budget cut after the bytes under load once left the shell in raw mode), then the
/// sequences, the last bytes the writer takes (no frame after them); a terminal that does not
/// read is waited for only while it takes bytes.
pub fn restore_terminal() {
    if !TERMINAL_ACTIVE.swap(false, Ordering::SeqCst) {
        return;
    }
    super::signals::disarm_terminal();
    let _ = disable_raw_mode();
    terminal_out::give_back(RESTORE, RESTORE_PATIENCE);
}

/// Whether the app's screen is up (between [`TerminalGuard::enter`] and the restore).
pub fn is_active() -> bool {
    TERMINAL_ACTIVE.load(Ordering::SeqCst)
}

/// Reads the terminal's input on a thread of its own (`hipscope-input`) and sends each event on
/// `tx`; ends, closing the channel, when the terminal hangs up or the receiver is gone.
///
/// crossterm's reader is entered only when poll(2) has seen input and no hang-up (or, every
/// 100 ms, to pick up a resize): on a terminal that hung up its read loop never returns — read()
/// gives 0 or EIO forever and neither ends the loop (crossterm 0.29,
/// `event/source/unix/mio.rs`) — while it holds crossterm's global event lock. crossterm's
/// `EventStream` took that lock on the UI thread, which then spun at 100% of a core and never
/// began the quit (the chat left running after `item10` of tests/it/fault_injection.rs closed its
/// terminal). Here at worst this thread spins, until the loop's own hang-up check quits.
///
/// crossterm is built with `use-dev-tty`, its poll(2) source: the default mio source waits
/// edge-triggered and, when a resize and keys arrive in one wakeup, returns the resize and
/// never reads the keys until more input comes (a Ctrl-C Ctrl-C typed during a resize was
/// lost; `a_terminal_too_small_names_the_size_it_needs` caught it under load). That source
/// reads nothing on a zero timeout, hence the 1 ms waits.
pub fn spawn_input(tx: UnboundedSender<io::Result<Event>>) -> io::Result<()> {
    // crossterm reads stdin when it is a terminal, else /dev/tty: watch the same one.
    let tty = if io::stdin().is_terminal() {
        None
    } else {
        Some(std::fs::File::open("/dev/tty")?)
    };
    std::thread::Builder::new()
        .name("hipscope-input".into())
        .spawn(move || {
            use std::os::fd::AsRawFd;
            let input = tty.as_ref().map_or(libc::STDIN_FILENO, |f| f.as_raw_fd());
            while !tx.is_closed() {
                let mut fds = [
                    libc::pollfd {
                        fd: input,
                        events: libc::POLLIN,
                        revents: 0,
                    },
                    libc::pollfd {
                        fd: libc::STDOUT_FILENO,
                        events: 0,
                        revents: 0,
                    },
                ];
                // SAFETY: poll(2) over a valid array of two pollfds.
                let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, 100) };
                if n < 0 {
                    if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    return;
                }
                if fds
                    .iter()
                    .any(|f| f.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0)
                {
                    tracing::info!("the terminal hung up");
                    return;
                }
                // Input was seen: give crossterm a moment for the rest of a sequence.
                let mut wait = if n > 0 {
                    Duration::from_millis(10)
                } else {
                    Duration::from_millis(1)
                };
                loop {
                    match crossterm::event::poll(wait) {
                        Ok(true) => {
                            let ev = crossterm::event::read();
                            let failed = ev.is_err();
                            if tx.send(ev).is_err() || failed {
                                return;
                            }
                        }
                        Ok(false) => break,
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    }
                    wait = Duration::from_millis(1);
                }
            }
        })?;
    Ok(())
}
