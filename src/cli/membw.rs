//! The memory read probe of `infer bench --bandwidth`: how fast the threads of the current rayon pool can stream a
//! buffer far larger than the caches. Decode reads every weight once per token, so this rate over the model's
//! bytes is the most tokens per second decode could reach.

use std::hint::black_box;
use std::time::Instant;

use rayon::prelude::*;

/// Bytes the probe reads per pass: well past any L3 of the machines this runs on.
const PROBE_BYTES: usize = 256 << 20;
/// Passes timed; the fastest counts (a neighbour's burst slows some, none speeds any up).
const PASSES: usize = 7;

/// The best read rate, in GB/s, of [`PASSES`] passes over a [`PROBE_BYTES`] buffer split evenly among the threads
/// of the current rayon pool (call it inside `pool.install`).
pub fn read_gbs() -> f64 {
    let words = PROBE_BYTES / 8;
    // Written once, so that every page is really there (a fresh zeroed allocation maps one shared page).
    let data: Vec<u64> = (0..words as u64).collect();
    let parts = rayon::current_num_threads().max(1);
    let mut best = f64::INFINITY;
    for _ in 0..PASSES {
        let t = Instant::now();
        let sum: u64 = data
            .par_chunks(words.div_ceil(parts))
            .map(|c| c.iter().fold(0u64, |a, &v| a.wrapping_add(v)))
            .reduce(|| 0, u64::wrapping_add);
        black_box(sum);
        best = best.min(t.elapsed().as_secs_f64());
    }
    PROBE_BYTES as f64 / best / 1e9
}
