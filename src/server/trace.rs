//! `infer serve --trace`: one line per engine step on stderr, so the scheduling the engine does (Orca's per-step
//! batch, chunked prefill, PagedAttention's shared blocks and preemption, RadixAttention's prefix hits and
//! evictions, forked choices) can be watched while it serves.
//!
//! A text line reads, for example:
//!
//! ```text
//! 2026-12-07T11:52:01.204Z step 212 fwd 31.4ms | batch 18 tok, 17 req: 16 decode, prefill #31+0:2 | run 17 wait 2 | +1 admitted (cached 48/60) 0 preempted 1 finished 0 cancelled 0 forked | kv 96/2912 used, 12 shared, cache 40, 0 evicted
//! ```
//!
//! `prefill #ID+START:N` is a chunk of N prompt tokens of request ID from position START. With `--log-format json`
//! each step is one JSON object with the same fields and the whole batch.

use serde_json::json;

use super::{LogFormat, log, timestamp};
use crate::engine::{StepObserver, StepReport};

/// Most prompt chunks a text line lists by request (the rest are counted).
const MAX_LISTED: usize = 8;

/// An observer that writes each step's line in `format`.
pub fn observer(format: LogFormat) -> StepObserver {
    Box::new(move |r: &StepReport| {
        // Steps that ran nothing and changed nothing (an idle wake-up) are not worth a line.
        if r.batch_tokens == 0 && r.cancelled == 0 && r.finished == 0 && r.preempted == 0 {
            return;
        }
        log(&line(r, format));
    })
}

/// One step's trace line.
pub fn line(r: &StepReport, format: LogFormat) -> String {
    let ts = timestamp();
    match format {
        LogFormat::Json => json!({
            "ts": ts,
            "step": r.step,
            "forward_ms": r.forward_time.as_secs_f64() * 1e3,
            "batch_tokens": r.batch_tokens,
            "decode_tokens": r.decode_tokens,
            "batch": r.batch.iter().map(|e| json!({
                "id": e.id, "start": e.start, "tokens": e.tokens, "decode": e.decode,
            })).collect::<Vec<_>>(),
            "running": r.running,
            "waiting": r.waiting,
            "admitted": r.admitted,
            "admitted_prompt_tokens": r.admitted_prompt_tokens,
            "admitted_cached_tokens": r.admitted_cached_tokens,
            "preempted": r.preempted,
            "finished": r.finished,
            "cancelled": r.cancelled,
            "forked": r.forked,
            "kv_blocks_used": r.kv_blocks_used,
            "kv_blocks_total": r.kv_blocks_total,
            "kv_blocks_shared": r.kv_blocks_shared,
            "cached_blocks": r.cached_blocks,
            "evicted_blocks": r.evicted_blocks,
        })
        .to_string(),
        LogFormat::Text => {
            let chunks: Vec<String> =
                r.batch.iter().filter(|e| !e.decode).map(|e| format!("#{}+{}:{}", e.id, e.start, e.tokens)).collect();
            let mut prefill = String::new();
            if !chunks.is_empty() {
                prefill = format!(", prefill {}", chunks[..chunks.len().min(MAX_LISTED)].join(" "));
                if chunks.len() > MAX_LISTED {
                    prefill += &format!(" and {} more", chunks.len() - MAX_LISTED);
                }
            }
            let cached = if r.admitted_prompt_tokens > 0 {
                format!(" (cached {}/{})", r.admitted_cached_tokens, r.admitted_prompt_tokens)
            } else {
                String::new()
            };
            format!(
                "{ts} step {} fwd {:.1}ms | batch {} tok, {} req: {} decode{prefill} | run {} wait {} | +{} admitted{cached} \
                 {} preempted {} finished {} cancelled {} forked | kv {}/{} used, {} shared, cache {}, {} evicted",
                r.step,
                r.forward_time.as_secs_f64() * 1e3,
                r.batch_tokens,
                r.batch_requests,
                r.decode_tokens,
                r.running,
                r.waiting,
                r.admitted,
                r.preempted,
                r.finished,
                r.cancelled,
                r.forked,
                r.kv_blocks_used,
                r.kv_blocks_total,
                r.kv_blocks_shared,
                r.cached_blocks,
                r.evicted_blocks,
            )
        }
    }
}
