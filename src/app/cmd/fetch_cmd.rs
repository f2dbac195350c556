//! `hipscope fetch`: obtain the default model now.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use clap::Args;

use super::progress::stderr_progress;
use super::usage::whole;
use crate::app::config::FetchConfig;
use crate::app::fetch::{self, FetchOptions};
use crate::app::settings::Settings;
use crate::app::stderr::errln;

#[derive(Args, Debug)]
pub struct FetchArgs {
    /// Download again even if the model is already in the cache.
    #[arg(long)]
    pub force: bool,
    /// Only print where the model is (or would be) stored.
    #[arg(long)]
    pub print_path: bool,
    /// Seconds to wait for a connection [default: `[fetch] connect_timeout_s` in config.toml,
    /// 20].
    #[arg(long, value_name = "SECS", allow_negative_numbers = true,
          value_parser = whole::<u64>(1, 3600))]
    pub connect_timeout: Option<u64>,
    /// Seconds to wait for the server to send anything before giving up on a try [default:
    /// `[fetch] read_timeout_s`, 30].
    #[arg(long, value_name = "SECS", allow_negative_numbers = true,
          value_parser = whole::<u64>(1, 3600))]
    pub read_timeout: Option<u64>,
    /// Tries of the download (each goes on from what the last one got), with growing pauses
    /// [default: `[fetch] tries`, 4].
    #[arg(long, value_name = "N", allow_negative_numbers = true,
          value_parser = whole::<u32>(1, 20))]
    pub tries: Option<u32>,
}

impl FetchArgs {
    /// The settings file's `[fetch]` limits, with the flags given on top.
    fn options(&self, c: &FetchConfig) -> FetchOptions {
        // Ctrl-C or SIGTERM stops the download, so that its temporary files are removed (the
        // partial download stays for the next run); a second one ends the process at once.
        let cancel = Arc::new(AtomicBool::new(false));
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            let _ = signal_hook::flag::register_conditional_shutdown(sig, 130, cancel.clone());
            let _ = signal_hook::flag::register(sig, cancel.clone());
        }
        let secs = |flag: Option<u64>, set: Duration| flag.map_or(set, Duration::from_secs);
        FetchOptions {
            connect_timeout: secs(self.connect_timeout, c.connect_timeout),
            read_timeout: secs(self.read_timeout, c.read_timeout),
            attempts: self.tries.unwrap_or(c.tries),
            cancel: Some(cancel),
        }
    }
}

pub fn run(a: FetchArgs, settings: &Settings) -> anyhow::Result<i32> {
    let path = fetch::default_model_path()?;
    if a.print_path {
        writeln!(std::io::stdout(), "{}", path.display())?;
        return Ok(0);
    }
    let opts = a.options(&settings.config.fetch);
    if a.force || !path.is_file() {
        fetch::fetch_with(&path, &opts, &mut stderr_progress())?;
    } else {
        let sum = fetch::sha256_file(&path)?;
        if sum != fetch::SHA256 {
            errln!(
                "{} is corrupt (sha256 {sum}); fetching again",
                path.display()
            );
            fetch::fetch_with(&path, &opts, &mut stderr_progress())?;
        }
    }
    writeln!(std::io::stdout(), "{}", path.display())?;
    Ok(0)
}
