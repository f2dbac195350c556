//! Faults injected on purpose, for the end-to-end tests and `hipscope selftest`: the one switch
//! `HIPSCOPE_FAULT`, read once per process.
//!
//! - `panic`: the chat panics on its UI thread with the screen up;
//! - `hang:load`, `hang:prompt`, `hang:decode`: once, while the model loads (after its weights),
//!   during prompt processing (a batch of more than one token) or in a decode step (one token),
//!   an op that does not finish is put on the device's stream ([`Instrument::stuck_op`]: on a GPU
//!   the `hs_spin_on_flag` kernel, on the CPU the worker held inside the op), with the budget
//!   [`STUCK_BUDGET`]. The watchdog must call it HUNG, write a report, and the quit must leave
//!   within its deadline. `hang:PHASE:SECONDS` sets how long the CPU backend holds the op
//!   ([`stuck_hold`]; [`STUCK_HOLD`] otherwise): a test that waits for the op to return.
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

/// How long the CPU backend holds a stuck op unless the fault says: far past any budget, short
/// enough that a forgotten fault ends by itself.
pub const STUCK_HOLD: Duration = Duration::from_secs(60);

/// The holds `hang:PHASE:SECONDS` accepts: past the budget's HUNG, at most ten minutes.
const HOLD_SECONDS: std::ops::RangeInclusive<u64> = 3..=600;

/// What `text` asks for, and how long the CPU backend holds a stuck op; an error names what is
/// accepted.
pub fn parse(text: &str) -> Result<(Fault, Duration), String> {
    let text = text.trim();
    let refused = || {
        format!(
            "HIPSCOPE_FAULT={text:?} is not a fault; use panic, hang:load, hang:prompt or \
             hang:decode, the last three with :SECONDS (3 to 600) for how long the CPU holds the op"
        )
    };
    let mut parts = text.split(':');
    let fault = match (parts.next(), parts.next()) {
        (Some("panic"), None) => Fault::Panic,
        (Some("hang"), Some("load")) => Fault::Hang(Phase::Load),
        (Some("hang"), Some("prompt")) => Fault::Hang(Phase::Prompt),
        (Some("hang"), Some("decode")) => Fault::Hang(Phase::Decode),
        _ => return Err(refused()),
    };
    let hold = match (parts.next(), parts.next()) {
        (None, _) => STUCK_HOLD,
        (Some(n), None) => match n.parse::<u64>() {
            Ok(n) if HOLD_SECONDS.contains(&n) => Duration::from_secs(n),
            _ => return Err(refused()),
        },
        _ => return Err(refused()),
    };
    Ok((fault, hold))
}

/// The fault this process was started with (`HIPSCOPE_FAULT`) and its hold, if any. A value that
/// is not a fault is ignored with a line in the log.
fn spec() -> Option<(Fault, Duration)> {
    static FAULT: OnceLock<Option<(Fault, Duration)>> = OnceLock::new();
    *FAULT.get_or_init(|| {
        let v = std::env::var("HIPSCOPE_FAULT").ok()?;
        parse(&v).map_err(|e| tracing::warn!("{e}")).ok()
    })
}

/// The fault this process was started with (`HIPSCOPE_FAULT`), if any.
pub fn active() -> Option<Fault> {
    spec().map(|(f, _)| f)
}

/// How long the CPU backend holds the stuck op of a hang fault.
pub fn stuck_hold() -> Duration {
    spec().map_or(STUCK_HOLD, |(_, h)| h)
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
        assert_eq!(parse("panic"), Ok((Fault::Panic, STUCK_HOLD)));
        assert_eq!(
            parse("hang:decode"),
            Ok((Fault::Hang(Phase::Decode), STUCK_HOLD))
        );
        assert_eq!(
            parse(" hang:load\n"),
            Ok((Fault::Hang(Phase::Load), STUCK_HOLD))
        );
        assert_eq!(
            parse("hang:prompt:10"),
            Ok((Fault::Hang(Phase::Prompt), Duration::from_secs(10)))
        );
        for bad in [
            "hang:forever",
            "hang:decode:2",
            "hang:decode:x",
            "hang:decode:10:1",
            "panic:3",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains("hang:prompt") && e.contains(bad), "{e}");
        }
    }
}
