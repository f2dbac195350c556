//! The terminal: the app's modes (raw, alternate screen, bracketed paste, mouse, kitty keyboard
//! flags) entered by [`TerminalGuard`] and left by [`restore_terminal`] on every way out —
//! normal exit, error, panic (the quit coordinator's panic hook), SIGTERM and the hard exit (an
//! exit hook).

use std::io::{self, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use crossterm::event::{
    DisableBracketedPaste, DisableMouseCapture, EnableBracketedPaste, EnableMouseCapture,
    KeyboardEnhancementFlags, PopKeyboardEnhancementFlags, PushKeyboardEnhancementFlags,
};
use crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};

static TERMINAL_ACTIVE: AtomicBool = AtomicBool::new(false);
/// Set once an active terminal was restored: nothing may be drawn on it any more (the hard exit
/// restores it from another thread while the UI thread may still be drawing the quit screen).
static GIVEN_BACK: AtomicBool = AtomicBool::new(false);

/// What [`restore_terminal`] sends, as raw bytes for the fatal-signal handler (which may not
/// format): keyboard flags popped, mouse reports, bracketed paste and the alternate screen off,
/// the cursor shown.
const FATAL_RESTORE: &[u8] =
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
}

impl TerminalGuard {
    pub fn enter(mouse: bool) -> io::Result<TerminalGuard> {
        // A SIGBUS (a model file truncated under its map) or SIGSEGV puts these modes back too.
        crate::gpu::fatal_signal::arm_terminal(0, 1, FATAL_RESTORE);
        TERMINAL_FDS.store(
            u8::from(io::stdin().is_terminal()) | u8::from(io::stdout().is_terminal()) << 1,
            Ordering::SeqCst,
        );
        enable_raw_mode()?;
        TERMINAL_ACTIVE.store(true, Ordering::SeqCst);
        let mut out = io::stdout();
        let setup = (|| {
            crossterm::execute!(out, EnterAlternateScreen, EnableBracketedPaste)?;
            if mouse {
                crossterm::execute!(out, EnableMouseCapture)?;
            }
            Ok::<(), io::Error>(())
        })();
        if let Err(e) = setup {
            restore_terminal();
            return Err(e);
        }
        // Reports Esc and modified keys (Shift-Enter) unambiguously where the terminal speaks
        // the kitty keyboard protocol; others ignore the request.
        let _ = crossterm::execute!(
            out,
            PushKeyboardEnhancementFlags(KeyboardEnhancementFlags::DISAMBIGUATE_ESCAPE_CODES)
        );
        Ok(TerminalGuard { mouse })
    }

    pub fn mouse(&self) -> bool {
        self.mouse
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore_terminal();
    }
}

/// Leaves the app's terminal modes. Safe to call more than once, from any thread (the panic
/// hook, the hard exit).
pub fn restore_terminal() {
    // Holding stdout waits for a frame being drawn to be finished ([`draw_allowed`]).
    let held = io::stdout();
    let _held = held.lock();
    if !TERMINAL_ACTIVE.swap(false, Ordering::SeqCst) {
        return;
    }
    GIVEN_BACK.store(true, Ordering::SeqCst);
    crate::gpu::fatal_signal::disarm_terminal();
    let mut out = io::stdout();
    let _ = crossterm::execute!(
        out,
        PopKeyboardEnhancementFlags,
        DisableMouseCapture,
        DisableBracketedPaste,
        LeaveAlternateScreen,
        crossterm::cursor::Show
    );
    let _ = disable_raw_mode();
    let _ = out.flush();
}

/// Whether a frame may still be drawn: false once the terminal was given back. Ask while holding
/// stdout's lock for the whole frame, so that a restore cannot come between the two.
pub fn draw_allowed() -> bool {
    !GIVEN_BACK.load(Ordering::SeqCst)
}

/// Whether the app's screen is up (between [`TerminalGuard::enter`] and the restore).
pub fn is_active() -> bool {
    TERMINAL_ACTIVE.load(Ordering::SeqCst)
}
