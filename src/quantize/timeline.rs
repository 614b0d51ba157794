//! A timeline of a quantize run for finding its critical path: with `INFER_QUANTIZE_TIMELINE` set, each [`mark!`]
//! prints the milliseconds since [`start`] and the thread's name to stderr. Unset, a mark costs one load.

use std::sync::OnceLock;
use std::time::Instant;

static START: OnceLock<Option<Instant>> = OnceLock::new();

/// Starts the clock (if `INFER_QUANTIZE_TIMELINE` is set); marks before this print nothing.
pub fn start() {
    START.get_or_init(|| std::env::var_os("INFER_QUANTIZE_TIMELINE").map(|_| Instant::now()));
}

/// When the clock started, if it runs.
pub fn started() -> Option<Instant> {
    START.get().copied().flatten()
}

/// Prints one line of the timeline: `mark!("tensor {name} converted")`.
#[macro_export]
macro_rules! quantize_mark {
    ($($arg:tt)*) => {
        if let Some(t0) = $crate::quantize::timeline::started() {
            let thread = std::thread::current();
            let name = thread.name().map_or_else(|| format!("{:?}", thread.id()), str::to_string);
            eprintln!("{:8.1} ms  {name:<16} {}", t0.elapsed().as_secs_f64() * 1e3, format_args!($($arg)*));
        }
    };
}
pub use quantize_mark as mark;
