//! What the engine counts, readable from any thread while it runs: gauges and counters as atomics, and latency
//! histograms with fixed buckets. Only the engine thread writes; readers take a [`StatsSnapshot`]. Formatting (for
//! example as Prometheus text) is the reader's business.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds (seconds) of the time-to-first-token and end-to-end latency buckets.
pub const LATENCY_BUCKETS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0];
/// Upper bounds (seconds) of the inter-token latency buckets.
pub const ITL_BUCKETS: &[f64] = &[0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5];

/// A histogram of durations: a count per bucket (the last bucket is +∞), the sum and the count.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_ns: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(), sum_ns: AtomicU64::new(0) }
    }

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = self.bounds.iter().position(|&b| secs <= b).unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(d.as_nanos().min(u128::from(u64::MAX)) as u64, Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            bounds: self.bounds,
            counts: self.counts.iter().map(|c| c.load(Relaxed)).collect(),
            sum_seconds: self.sum_ns.load(Relaxed) as f64 * 1e-9,
        }
    }
}

/// A histogram read at one moment.
#[derive(Debug, Clone)]
pub struct HistogramSnapshot {
    /// Upper bounds of the finite buckets, in seconds.
    pub bounds: &'static [f64],
    /// Observations per bucket (not cumulative); one more than `bounds`, the last for +∞.
    pub counts: Vec<u64>,
    pub sum_seconds: f64,
}

impl HistogramSnapshot {
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// The engine's counters. Gauges are set by the engine after every step.
#[derive(Debug)]
pub struct Stats {
    pub requests_running: AtomicU64,
    pub requests_waiting: AtomicU64,
    pub kv_blocks_used: AtomicU64,
    pub kv_blocks_total: AtomicU64,
    pub prefix_cache_blocks: AtomicU64,
    pub prefix_cache_queried_tokens: AtomicU64,
    pub prefix_cache_hit_tokens: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub preemptions: AtomicU64,
    pub steps: AtomicU64,
    pub requests_finished: AtomicU64,
    pub requests_cancelled: AtomicU64,
    pub requests_failed: AtomicU64,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
}

impl Default for Stats {
    fn default() -> Stats {
        let z = || AtomicU64::new(0);
        Stats {
            requests_running: z(),
            requests_waiting: z(),
            kv_blocks_used: z(),
            kv_blocks_total: z(),
            prefix_cache_blocks: z(),
            prefix_cache_queried_tokens: z(),
            prefix_cache_hit_tokens: z(),
            prompt_tokens: z(),
            generated_tokens: z(),
            preemptions: z(),
            steps: z(),
            requests_finished: z(),
            requests_cancelled: z(),
            requests_failed: z(),
            ttft: Histogram::new(LATENCY_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(LATENCY_BUCKETS),
        }
    }
}

impl Stats {
    pub fn snapshot(&self) -> StatsSnapshot {
        let g = |a: &AtomicU64| a.load(Relaxed);
        StatsSnapshot {
            requests_running: g(&self.requests_running),
            requests_waiting: g(&self.requests_waiting),
            kv_blocks_used: g(&self.kv_blocks_used),
            kv_blocks_total: g(&self.kv_blocks_total),
            prefix_cache_blocks: g(&self.prefix_cache_blocks),
            prefix_cache_queried_tokens: g(&self.prefix_cache_queried_tokens),
            prefix_cache_hit_tokens: g(&self.prefix_cache_hit_tokens),
            prompt_tokens: g(&self.prompt_tokens),
            generated_tokens: g(&self.generated_tokens),
            preemptions: g(&self.preemptions),
            steps: g(&self.steps),
            requests_finished: g(&self.requests_finished),
            requests_cancelled: g(&self.requests_cancelled),
            requests_failed: g(&self.requests_failed),
            ttft: self.ttft.snapshot(),
            itl: self.itl.snapshot(),
            e2e: self.e2e.snapshot(),
        }
    }
}

/// The engine's counters read at one moment (see [`Stats`] for what each means).
#[derive(Debug, Clone)]
pub struct StatsSnapshot {
    /// Requests in the batch (prefilling or generating).
    pub requests_running: u64,
    /// Requests accepted but not yet in the batch (new, or preempted and waiting to be recomputed).
    pub requests_waiting: u64,
    /// KV blocks held by requests or the prefix cache, over all layer groups.
    pub kv_blocks_used: u64,
    pub kv_blocks_total: u64,
    /// Blocks the prefix cache indexes.
    pub prefix_cache_blocks: u64,
    /// Prompt tokens looked up in the prefix cache, and how many of them it had.
    pub prefix_cache_queried_tokens: u64,
    pub prefix_cache_hit_tokens: u64,
    /// Prompt tokens of admitted requests (cached ones included), and tokens generated.
    pub prompt_tokens: u64,
    pub generated_tokens: u64,
    /// Times a running request gave its blocks back to be recomputed later.
    pub preemptions: u64,
    /// Forward passes run.
    pub steps: u64,
    pub requests_finished: u64,
    pub requests_cancelled: u64,
    pub requests_failed: u64,
    pub ttft: HistogramSnapshot,
    pub itl: HistogramSnapshot,
    pub e2e: HistogramSnapshot,
}
