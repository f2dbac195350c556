//! Faults injected on purpose, for the end-to-end tests and `hipscope selftest`: the one switch
//! `HIPSCOPE_FAULT`, read once per process.
//!
//! - `panic`: the chat panics on its UI thread with the screen up;
//! - `hang:load`, `hang:prompt`, `hang:decode`: once, while the model loads (after its weights),
//!   during prompt processing (a batch of more than one token) or in a decode step (one token),
//!   an op that does not finish is put on the device's stream ([`Instrument::stuck_op`]: on a GPU
//!   the `hs_spin_on_flag` kernel, on the CPU the worker held inside the op), with the budget
//!   [`STUCK_BUDGET`]. The watchdog must call it HUNG, write a report, and the quit must leave
//!   within its deadline.
//!
//! [`Instrument::stuck_op`]: crate::gpu::backend::Instrument::stuck_op

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::gpu::stream::Budget;

/// Where a hang is injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Load,
    Prompt,
    Decode,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    Panic,
    Hang(Phase),
}

/// The injected op's budget: SLOW after half a second, HUNG after two.
pub const STUCK_BUDGET: Budget = Budget {
    slow: Duration::from_millis(500),
    hung: Duration::from_secs(2),
};

/// What `text` asks for; an error names what is accepted.
pub fn parse(text: &str) -> Result<Fault, String> {
    Ok(match text.trim() {
        "panic" => Fault::Panic,
        "hang:load" => Fault::Hang(Phase::Load),
        "hang:prompt" => Fault::Hang(Phase::Prompt),
        "hang:decode" => Fault::Hang(Phase::Decode),
        other => {
            return Err(format!(
                "HIPSCOPE_FAULT={other:?} is not a fault; use panic, hang:load, hang:prompt or \
                 hang:decode"
            ));
        }
    })
}

/// The fault this process was started with (`HIPSCOPE_FAULT`), if any. A value that is not a
/// fault is ignored with a line in the log.
pub fn active() -> Option<Fault> {
    static FAULT: OnceLock<Option<Fault>> = OnceLock::new();
    *FAULT.get_or_init(|| {
        let v = std::env::var("HIPSCOPE_FAULT").ok()?;
        parse(&v).map_err(|e| tracing::warn!("{e}")).ok()
    })
}

/// True once per process, at the first call for the phase the hang fault names.
pub fn hang_now(phase: Phase) -> bool {
    static FIRED: AtomicBool = AtomicBool::new(false);
    active() == Some(Fault::Hang(phase)) && !FIRED.swap(true, Ordering::AcqRel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_and_others_are_refused_with_the_list() {
        assert_eq!(parse("panic"), Ok(Fault::Panic));
        assert_eq!(parse("hang:decode"), Ok(Fault::Hang(Phase::Decode)));
        assert_eq!(parse(" hang:load\n"), Ok(Fault::Hang(Phase::Load)));
        let e = parse("hang:forever").unwrap_err();
        assert!(e.contains("hang:prompt"), "{e}");
    }
}
