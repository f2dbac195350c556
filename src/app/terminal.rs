//! The terminal: the app's modes (raw, alternate screen, bracketed paste, mouse, kitty keyboard
//! flags) entered by [`TerminalGuard`] and left by [`restore_terminal`] on every way out —
//! normal exit, error, panic (the quit coordinator's panic hook), SIGTERM and the hard exit (an
//! exit hook).

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use crossterm::event::{
    DisableBracketedPaste, DisableMouseCapture, EnableBracketedPaste, EnableMouseCapture,
    KeyboardEnhancementFlags, PopKeyboardEnhancementFlags, PushKeyboardEnhancementFlags,
};
use crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};

static TERMINAL_ACTIVE: AtomicBool = AtomicBool::new(false);

/// Puts the terminal into the app's modes; restores them when dropped (also on unwinding).
pub struct TerminalGuard {
    mouse: bool,
}

impl TerminalGuard {
    pub fn enter(mouse: bool) -> io::Result<TerminalGuard> {
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
    if !TERMINAL_ACTIVE.swap(false, Ordering::SeqCst) {
        return;
    }
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

/// Whether the app's screen is up (between [`TerminalGuard::enter`] and the restore).
pub fn is_active() -> bool {
    TERMINAL_ACTIVE.load(Ordering::SeqCst)
}
