//! The compute-peak probe of `infer bench --peak`: how fast the threads of the current rayon pool can issue the
//! multiply-add that the kernel level's matrix products are built on ([`infer_kernels::peak`]). A prompt's matrix
//! products cannot go faster, so this is to prefill what the memory read rate is to decode.
//!
//! Each thread's rate is its work over its own CPU time, and the threads' rates add up: the peak is a property
//! of the cores, and on a busy machine the wall clock would measure the neighbours instead (a thread that waits
//! for a core spends no CPU time meanwhile).

use std::time::Instant;

use infer_kernels::clock::thread_cpu_time;
use infer_kernels::dispatch::Isa;
use infer_kernels::peak::{self, Probe};

/// Rounds per thread and pass: tens of milliseconds at the SIMD levels, long enough to outlast a clock ramp.
const ROUNDS: usize = 20_000_000;
/// Passes; each thread's fastest counts.
const PASSES: usize = 5;

/// One probe's result.
#[derive(Debug, Clone, Copy)]
pub struct Rate {
    /// Multiply-adds per second over all threads, in billions.
    pub g_macs: f64,
}

/// The f32 FMA and the integer multiply-add peaks of `isa`, on every thread of the current rayon pool at once
/// (call it inside `pool.install`).
pub fn measure(isa: Isa) -> (Rate, Rate) {
    (best_rate(|| peak::fma(isa, ROUNDS)), best_rate(|| peak::int_dot(isa, ROUNDS)))
}

fn best_rate(probe: impl Fn() -> Probe + Sync) -> Rate {
    let per_thread = rayon::broadcast(|_| {
        let mut best = f64::INFINITY;
        let mut macs = 0;
        for _ in 0..PASSES {
            // The wall clock where the platform has no thread CPU clock.
            let (cpu0, wall0) = (thread_cpu_time(), Instant::now());
            macs = probe().macs_per_round;
            let secs = match (cpu0, thread_cpu_time()) {
                (Some(a), Some(b)) => (b - a).as_secs_f64(),
                _ => wall0.elapsed().as_secs_f64(),
            };
            best = best.min(secs.max(1e-9));
        }
        macs as f64 * ROUNDS as f64 / best
    });
    Rate { g_macs: per_thread.iter().sum::<f64>() / 1e9 }
}
