//! Writing to stdout without panicking: `println!` panics on a closed pipe, these return the error instead so that
//! `main` can exit quietly.

use std::io::{self, IsTerminal, Write};

/// Writes `text` to stdout and flushes, so streamed tokens appear as they are generated.
pub fn print_flush(text: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// Writes one line to stdout.
pub fn print_line(text: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.write_all(b"\n")
}

/// Whether stderr is a terminal (progress bars and timings are for people).
pub fn stderr_is_terminal() -> bool {
    io::stderr().is_terminal()
}

/// Whether stdout is a terminal.
pub fn stdout_is_terminal() -> bool {
    io::stdout().is_terminal()
}
