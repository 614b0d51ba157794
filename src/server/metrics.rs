//! `/metrics` in the Prometheus text exposition format (version 0.0.4): the engine's gauges, counters and latency
//! histograms, the KV pool's size, and HTTP responses by status code.

use std::fmt::Write as _;
use std::sync::Mutex;

use crate::engine::{HistogramSnapshot, PoolPlan, StatsSnapshot};

/// HTTP responses by status code.
#[derive(Debug, Default)]
pub struct HttpCounters {
    by_status: Mutex<Vec<(u16, u64)>>,
}

impl HttpCounters {
    pub fn count(&self, status: u16) {
        let mut v = self.by_status.lock().unwrap_or_else(|e| e.into_inner());
        match v.iter_mut().find(|(s, _)| *s == status) {
            Some((_, n)) => *n += 1,
            None => {
                v.push((status, 1));
                v.sort_unstable();
            }
        }
    }

    pub fn snapshot(&self) -> Vec<(u16, u64)> {
        self.by_status.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn metric(out: &mut String, name: &str, kind: &str, help: &str, value: u64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
}

fn histogram(out: &mut String, name: &str, help: &str, h: &HistogramSnapshot) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    let mut cumulative = 0;
    for (bound, count) in h.bounds.iter().zip(&h.counts) {
        cumulative += count;
        let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", h.count());
    let _ = writeln!(out, "{name}_sum {}", h.sum_seconds);
    let _ = writeln!(out, "{name}_count {}", h.count());
}

/// The whole `/metrics` page.
pub fn render(s: &StatsSnapshot, plan: PoolPlan, http: &HttpCounters) -> String {
    let mut out = String::with_capacity(4096);
    let gauges: [(&str, &str, u64); 6] = [
        ("infer_requests_running", "Requests in the batch (prefilling or generating).", s.requests_running),
        ("infer_requests_waiting", "Requests waiting to be admitted (new or preempted).", s.requests_waiting),
        (
            "infer_kv_blocks_used",
            "KV blocks held by requests or the prefix cache (all layer groups).",
            s.kv_blocks_used,
        ),
        ("infer_kv_blocks_total", "KV blocks in the pool (all layer groups).", s.kv_blocks_total),
        ("infer_kv_block_tokens", "Positions per KV block.", plan.block_size as u64),
        ("infer_prefix_cache_blocks", "KV blocks indexed by the prefix cache.", s.prefix_cache_blocks),
    ];
    for (name, help, v) in gauges {
        metric(&mut out, name, "gauge", help, v);
    }
    metric(&mut out, "infer_kv_capacity_tokens", "gauge", "Tokens the KV pool holds.", plan.tokens() as u64);
    let counters: [(&str, &str, u64); 10] = [
        (
            "infer_prefix_cache_queried_tokens_total",
            "Prompt tokens looked up in the prefix cache.",
            s.prefix_cache_queried_tokens,
        ),
        (
            "infer_prefix_cache_hit_tokens_total",
            "Prompt tokens whose KV came from the prefix cache.",
            s.prefix_cache_hit_tokens,
        ),
        ("infer_prompt_tokens_total", "Prompt tokens of admitted requests.", s.prompt_tokens),
        ("infer_generated_tokens_total", "Tokens generated.", s.generated_tokens),
        ("infer_preemptions_total", "Requests preempted (blocks released, recomputed later).", s.preemptions),
        ("infer_engine_steps_total", "Forward passes run.", s.steps),
        ("infer_requests_finished_total", "Requests that ran to the end.", s.requests_finished),
        ("infer_requests_cancelled_total", "Requests cancelled because the client went away.", s.requests_cancelled),
        ("infer_requests_failed_total", "Requests that failed inside the engine.", s.requests_failed),
        ("infer_kv_pool_bytes", "Bytes of keys and values the KV pool holds.", plan.bytes as u64),
    ];
    for (name, help, v) in counters {
        let kind = if name.ends_with("_total") { "counter" } else { "gauge" };
        metric(&mut out, name, kind, help, v);
    }
    histogram(
        &mut out,
        "infer_time_to_first_token_seconds",
        "Time from arrival to the first generated token.",
        &s.ttft,
    );
    histogram(&mut out, "infer_inter_token_latency_seconds", "Time between a request's successive tokens.", &s.itl);
    histogram(&mut out, "infer_request_latency_seconds", "Time from arrival to the end of a request.", &s.e2e);
    let _ = writeln!(out, "# HELP infer_http_responses_total HTTP responses by status code.");
    let _ = writeln!(out, "# TYPE infer_http_responses_total counter");
    for (status, n) in http.snapshot() {
        let _ = writeln!(out, "infer_http_responses_total{{status=\"{status}\"}} {n}");
    }
    out
}
