//! Writing to stdout and stderr without panicking: `println!` panics on a closed pipe, these return the error
//! instead so that `main` can exit quietly; the stderr macros drop the line.

use std::io::{self, IsTerminal, Write};

/// `eprintln!` without its panic: when stderr is a closed pipe (`infer ... 2>&1 | head`) the line is lost, where
/// `eprintln!` killed the command with a panic (status 101). The command's own output then meets the closed pipe
/// and ends quietly, as with `| head`.
macro_rules! eprintln_lossy {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `eprint!` without its panic (see [`eprintln_lossy`]).
macro_rules! eprint_lossy {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), $($arg)*);
    }};
}

pub(crate) use {eprint_lossy, eprintln_lossy};

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
