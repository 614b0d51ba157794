//! A start-up timeline for finding where the time to the first token goes: with `INFER_TIMELINE` set, each
//! [`mark!`] prints to stderr the milliseconds since the process entered `main`, the CPU time all its threads have
//! used by then (on a busy machine the wall time includes waiting for a core; the CPU time does not), and the
//! thread's name (marks: the file opened, the tokenizer built, the matrices packed, the KV cache made, each forward
//! pass of a generation). Unset, a mark costs one load.

use std::sync::OnceLock;
use std::time::Instant;

static START: OnceLock<Option<Instant>> = OnceLock::new();

/// Starts the clock (if `INFER_TIMELINE` is set); marks before this print nothing.
pub fn start() {
    START.get_or_init(|| std::env::var_os("INFER_TIMELINE").map(|_| Instant::now()));
}

/// When the clock started, if it runs.
pub fn started() -> Option<Instant> {
    START.get().copied().flatten()
}

/// Prints one line of the timeline: `mark!("packed {name}")`.
#[macro_export]
macro_rules! timeline_mark {
    ($($arg:tt)*) => {
        if let Some(t0) = $crate::timeline::started() {
            let thread = std::thread::current();
            let name = thread.name().map_or_else(|| format!("{:?}", thread.id()), str::to_string);
            let cpu = $crate::kernels::clock::process_cpu_time().map_or(f64::NAN, |c| c.as_secs_f64() * 1e3);
            eprintln!(
                "{:8.2} ms  cpu {cpu:8.2} ms  {name:<16} {}",
                t0.elapsed().as_secs_f64() * 1e3,
                format_args!($($arg)*)
            );
        }
    };
}
pub use timeline_mark as mark;
