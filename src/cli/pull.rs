//! `infer pull NAME...`: fetch registry models into the cache, verified, and print their paths.
//!
//! Progress and status go to stderr; stdout gets one path per model, so `infer run -m "$(infer pull gemma3)"` works.

use anyhow::Context as _;
use clap::Args;

use crate::cli::output::print_line;
use crate::registry::{self, Registry};

#[derive(Args, Debug)]
pub struct PullArgs {
    /// Registry names to fetch (see `infer list`).
    #[arg(required = true, value_name = "NAME")]
    pub names: Vec<String>,
    /// Fetch again even if a verified copy is cached.
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: PullArgs) -> anyhow::Result<()> {
    let registry = Registry::load()?;
    // Check every name before fetching anything, so a typo in the last one does not cost a download first.
    let entries = args.names.iter().map(|name| registry.lookup(name)).collect::<Result<Vec<_>, _>>()?;
    for entry in entries {
        let path = registry::pull(entry, args.force).with_context(|| format!("cannot pull '{}'", entry.name))?;
        print_line(&path.display().to_string())?;
    }
    Ok(())
}
