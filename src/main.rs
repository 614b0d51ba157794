//! The `infer` binary: parse the command line, run the command, print errors ripgrep-style.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

/// The system allocator with per-thread memory budgets, which bound the work a model file can make us do (its chat
/// template is rendered under one).
#[global_allocator]
static ALLOC: infer::kernels::budget::BudgetAlloc = infer::kernels::budget::BudgetAlloc;

fn main() -> ExitCode {
    infer::timeline::start();
    infer::kernels::signals::exit_on_sigbus(
        "error: the model file shrank or changed on disk while infer was reading it (SIGBUS); stopped. Replace a \
         model only while no infer uses it, or run with --no-mmap\n",
    );
    let cli = infer::cli::Cli::parse();
    match infer::cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // `infer ... | head` closes our stdout early: that is the reader's choice, not an error.
            if infer::cli::is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            if err.downcast_ref::<infer::cli::Interrupted>().is_some() {
                let _ = writeln!(std::io::stderr(), "note: interrupted");
                return ExitCode::from(130);
            }
            let mut stderr = std::io::stderr().lock();
            let _ = writeln!(stderr, "error: {err:#}");
            ExitCode::from(1)
        }
    }
}
