//! A timeline of a quantize run for finding its critical path: with `INFER_QUANTIZE_TIMELINE` set, each [`mark!`]
//! prints the milliseconds since [`start`] and the thread's name to stderr. Unset, a mark costs one load. The
//! mechanism is the start-up timeline's ([`crate::timeline`]), on a clock of its own.

use crate::timeline::Clock;

/// The quantize timeline's clock.
pub static CLOCK: Clock = Clock::new("INFER_QUANTIZE_TIMELINE");

/// Starts the clock (if `INFER_QUANTIZE_TIMELINE` is set); marks before this print nothing.
pub fn start() {
    CLOCK.start();
}

/// Prints one line of the timeline: `mark!("tensor {name} converted")`.
#[macro_export]
macro_rules! quantize_mark {
    ($($arg:tt)*) => {
        if let Some(t0) = $crate::quantize::timeline::CLOCK.started() {
            $crate::timeline::print(t0, 1, false, format_args!($($arg)*));
        }
    };
}
pub use quantize_mark as mark;
