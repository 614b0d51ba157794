//! A start-up timeline for finding where the time to the first token goes: with `INFER_TIMELINE` set, each
//! [`mark!`] prints to stderr the milliseconds since the process entered `main`, the CPU time all its threads have
//! used by then (on a busy machine the wall time includes waiting for a core; the CPU time does not), and the
//! thread's name (marks: the file opened, the tokenizer built, the matrices packed, the KV cache made, each forward
//! pass of a generation). Unset, a mark costs one load.
//!
//! [`Clock`] and [`print()`] also serve `infer quantize`'s own timeline ([`crate::quantize::timeline`]).

use std::fmt;
use std::sync::OnceLock;
use std::time::Instant;

/// A timeline's start, taken only when its environment variable is set.
pub struct Clock {
    var: &'static str,
    start: OnceLock<Option<Instant>>,
}

impl Clock {
    /// A clock switched on by the environment variable `var`.
    pub const fn new(var: &'static str) -> Clock {
        Clock { var, start: OnceLock::new() }
    }

    /// Starts the clock (if its variable is set); marks before this print nothing.
    pub fn start(&self) {
        self.start.get_or_init(|| std::env::var_os(self.var).map(|_| Instant::now()));
    }

    /// When the clock started, if it runs.
    pub fn started(&self) -> Option<Instant> {
        self.start.get().copied().flatten()
    }
}

/// The start-up timeline's clock, started as the process enters `main`.
pub static STARTUP: Clock = Clock::new("INFER_TIMELINE");

/// Starts the start-up timeline (if `INFER_TIMELINE` is set).
pub fn start() {
    STARTUP.start();
}

/// Prints one timeline line to stderr: milliseconds since `t0` (to `decimals` places), with `cpu` the process's CPU
/// time so far, then the calling thread's name and `what`.
pub fn print(t0: Instant, decimals: usize, cpu: bool, what: fmt::Arguments<'_>) {
    let thread = std::thread::current();
    let name = thread.name().map_or_else(|| format!("{:?}", thread.id()), str::to_string);
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    if cpu {
        let cpu = crate::kernels::clock::process_cpu_time().map_or(f64::NAN, |c| c.as_secs_f64() * 1e3);
        eprintln!("{ms:8.decimals$} ms  cpu {cpu:8.2} ms  {name:<16} {what}");
    } else {
        eprintln!("{ms:8.decimals$} ms  {name:<16} {what}");
    }
}

/// Prints one line of the timeline: `mark!("packed {name}")`.
#[macro_export]
macro_rules! timeline_mark {
    ($($arg:tt)*) => {
        if let Some(t0) = $crate::timeline::STARTUP.started() {
            $crate::timeline::print(t0, 2, true, format_args!($($arg)*));
        }
    };
}
pub use timeline_mark as mark;
