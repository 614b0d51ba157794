//! The command line: one clap subcommand per job, each in its own module with an `Args` struct and a `run`.
//!
//! Commands write model text and machine-readable output to stdout, everything else (progress, timings, warnings)
//! to stderr. Errors come back as `anyhow::Error` with context naming the file, key or flag involved.

use clap::{Parser, Subcommand};

pub mod info;
pub mod output;

/// Run GGUF language models on ordinary CPUs.
#[derive(Parser, Debug)]
#[command(name = "infer", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Show a GGUF file's metadata, tensors and the SIMD level in use.
    Info(info::InfoArgs),
}

/// Runs one parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Info(args) => info::run(args),
    }
}

/// Whether an error chain bottoms out in a closed pipe (the reader went away: not our failure).
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
