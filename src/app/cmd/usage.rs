//! What every command shares about being called wrongly: [`UsageError`] (exit code 2, as clap's
//! own errors), the numeric argument parser that names the allowed range, and the broken-pipe
//! test that lets a command whose stdout was closed (`| head`) end quietly.

/// The largest context (`-c`) and thread count (`-t`) accepted, as in config.toml.
pub const MAX_CTX: i128 = crate::model::loader::MAX_CTX as i128;
pub const MAX_THREADS: i128 = 4096;

/// A clap value parser for a whole number from `lo` to `hi`: out of range or not a number, the
/// message says which numbers are allowed (clap reports it as a usage error, exit code 2).
pub fn whole<T: TryFrom<i128> + Clone + Send + Sync + 'static>(
    lo: i128,
    hi: i128,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static {
    move |v: &str| {
        let allowed = || format!("`{v}` is not allowed: a whole number from {lo} to {hi}");
        let n: i128 = v.trim().parse().map_err(|_| allowed())?;
        if !(lo..=hi).contains(&n) {
            return Err(allowed());
        }
        T::try_from(n).map_err(|_| allowed())
    }
}

/// A mistake in how the command was called (exit code 2, as clap's own), not a failure while
/// running it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Whether `e` is stdout closing under us (`| head`): the command ends quietly, as Unix tools do.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

static STDOUT_GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Standard output for the commands that print as they go and keep their own exit code
/// (`selftest`, `kernels`): once the reader has gone (`| head`), the rest is dropped instead of
/// panicking, and [`stdout_gone`] tells the command to end quietly with exit code 0 (after its
/// device work is released as usual).
pub fn write_out(args: std::fmt::Arguments) {
    use std::io::Write;
    use std::sync::atomic::Ordering;
    if STDOUT_GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_fmt(args).and_then(|()| o.flush())
        && e.kind() == std::io::ErrorKind::BrokenPipe
    {
        STDOUT_GONE.store(true, Ordering::Relaxed);
    }
}

/// Whether a [`write_out`] found standard output closed.
pub fn stdout_gone() -> bool {
    STDOUT_GONE.load(std::sync::atomic::Ordering::Relaxed)
}

/// `println!` through [`write_out`].
macro_rules! outln {
    () => { $crate::app::cmd::usage::write_out(format_args!("\n")) };
    ($($t:tt)*) => {
        $crate::app::cmd::usage::write_out(format_args!("{}\n", format_args!($($t)*)))
    };
}

/// `print!` through [`write_out`].
macro_rules! out {
    ($($t:tt)*) => { $crate::app::cmd::usage::write_out(format_args!($($t)*)) };
}

pub(crate) use {out, outln};
