//! `infer info MODEL [--json]`: what is in a GGUF file.

use clap::Args;

#[derive(Args, Debug)]
pub struct InfoArgs {
    /// Model: a .gguf path or a registry name.
    pub model: Option<String>,
    /// Print one JSON object instead of the human-readable report.
    #[arg(long)]
    pub json: bool,
}

pub fn run(_args: InfoArgs) -> anyhow::Result<()> {
    anyhow::bail!("infer info: the GGUF reader is not wired in yet")
}
