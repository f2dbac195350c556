//! `hipscope fetch`: obtain the default model now.

use clap::Args;

use super::progress::stderr_progress;
use crate::app::fetch;

#[derive(Args, Debug)]
pub struct FetchArgs {
    /// Download again even if the model is already in the cache.
    #[arg(long)]
    pub force: bool,
    /// Only print where the model is (or would be) stored.
    #[arg(long)]
    pub print_path: bool,
}

pub fn run(a: FetchArgs) -> anyhow::Result<i32> {
    let path = fetch::default_model_path()?;
    if a.print_path {
        println!("{}", path.display());
        return Ok(0);
    }
    if a.force || !path.is_file() {
        fetch::fetch(&path, &mut stderr_progress())?;
    } else {
        let sum = fetch::sha256_file(&path)?;
        if sum != fetch::SHA256 {
            eprintln!(
                "{} is corrupt (sha256 {sum}); fetching again",
                path.display()
            );
            fetch::fetch(&path, &mut stderr_progress())?;
        }
    }
    println!("{}", path.display());
    Ok(0)
}
