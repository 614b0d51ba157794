//! The step loop: which tokens of which requests go into the next forward pass, and what happens after it.
//!
//! A step:
//! 1. Requests whose stream was dropped are removed and their blocks released.
//! 2. Every running request that is generating gets its next token into the batch. If the pool cannot give it a
//!    block, blocks only the prefix cache holds are evicted; if that is not enough, the most recently admitted
//!    request is preempted (its blocks go back; it waits to be recomputed), and so on. A request alone in a pool too
//!    small for it ends with `length` instead of waiting forever.
//! 3. Running requests still in their prompt get chunks of it, shortest remainder first, up to the step's token
//!    budget (smaller while others generate: see [`PREFILL_PER_DECODE`]; half of it while requests wait to be
//!    admitted), so a short prompt arriving behind a long one does not wait for all of it.
//! 4. Waiting requests are admitted first come, first served, while the budget, `max_seqs` and the pool allow,
//!    keeping one free block per running request so the next step can grow without preempting. A new request first
//!    takes whatever prefix of its prompt the cache has.
//! 5. One forward pass; requests whose tokens are all in the cache sample their next token and stream it (a request
//!    of several choices that just finished its prompt first forks the others, which sample from the same
//!    logits); newly full blocks go into the prefix cache; finished requests leave (their partly filled last block
//!    goes into the cache as a tail).

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock, mpsc};
use std::time::{Duration, Instant};

use crate::model::kv_cache::{BlockRef, GroupCounts};
use crate::model::{ForwardScratch, KvPool, Logits, Model, SeqStep};
use crate::structured::SortedVocab;
use crate::tokenizer::Tokenizer;

use super::prefix_cache::PrefixCache;
use super::request::{Ending, Sequence};
use super::{EngineConfig, EngineError, Request, RequestError, RequestStream, Shared, StatsSnapshot, Submission};

/// Prompt tokens a step may carry per generating request in it (and at least [`PREFILL_MIN`]), below
/// `max_batch_tokens`. On a CPU a forward pass of a few tokens costs about the time to read the weights, and each
/// token beyond ~16 adds about the same compute whether it decodes or prefills (the matmuls are compute-bound from
/// one 16-row panel on; SmolLM2 on 2 AVX-512 cores: pp512 in chunks of 16 or of 512 ran at the same rate). So a
/// step carrying `d` generating requests and at most `2·max(6, d)` prompt tokens costs at most about three times a
/// step without them, and the generating requests' inter-token latency stays within that; prompts still go through
/// at nearly the full prefill rate, and with nothing generating they take the whole budget.
pub const PREFILL_PER_DECODE: usize = 2;
/// See [`PREFILL_PER_DECODE`].
pub const PREFILL_MIN: usize = 12;

/// What one step did: the scheduler's decisions and the state they left (`infer serve --trace` prints it).
#[derive(Debug, Clone, Default)]
pub struct StepReport {
    /// Forward passes run so far, this one included.
    pub step: u64,
    /// The forward pass's wall time (zero when the step ran none).
    pub forward_time: Duration,
    /// Tokens in the forward pass (0: the step had nothing to run).
    pub batch_tokens: usize,
    /// Of those, generating requests' single tokens; the rest were prompt chunks (or recomputation).
    pub decode_tokens: usize,
    /// Requests in the batch, and which of them sampled a token (by request id, in batch order).
    pub batch_requests: usize,
    pub sampled: Vec<u64>,
    /// Each request in the forward pass, in batch order.
    pub batch: Vec<BatchEntry>,
    pub admitted: usize,
    /// Prompt tokens of the requests admitted for the first time in this step, and how many of them the prefix
    /// cache had.
    pub admitted_prompt_tokens: usize,
    pub admitted_cached_tokens: usize,
    pub preempted: usize,
    pub finished: usize,
    pub cancelled: usize,
    /// Choices that forked from their request's computed prompt ([`super::Engine::submit_n`]).
    pub forked: usize,
    /// Blocks the prefix cache gave back to make room.
    pub evicted_blocks: usize,
    /// After the step: requests in the batch and waiting, KV blocks in use (of all), blocks with more than one
    /// holder, and blocks the prefix cache indexes.
    pub running: usize,
    pub waiting: usize,
    pub kv_blocks_used: usize,
    pub kv_blocks_total: usize,
    pub kv_blocks_shared: usize,
    pub cached_blocks: usize,
}

/// What the engine thread calls after every step (see [`super::Engine::start_observed`]).
pub type StepObserver = Box<dyn FnMut(&StepReport) + Send>;

/// One request's part of a forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchEntry {
    pub id: u64,
    /// Its first position in this pass, and how many tokens it carried.
    pub start: usize,
    pub tokens: usize,
    /// One token whose logits are sampled (a generated token, or the one prompt token a prefix-cache hit left);
    /// otherwise a chunk of the prompt (or of a preempted request's recomputation).
    pub decode: bool,
}

/// The engine's state and step function, for one model. [`super::Engine`] runs one on its thread; tests and
/// benchmarks can drive one directly.
pub struct Scheduler<'m> {
    model: &'m Model,
    tokenizer: &'m Tokenizer,
    shared: Arc<Shared>,
    pool: KvPool,
    cache: Option<PrefixCache>,
    scratch: ForwardScratch,
    waiting: VecDeque<Sequence<'m>>,
    /// The vocabulary in byte order for JSON output, built on the first such request.
    json_vocab: OnceLock<Arc<SortedVocab>>,
    dry_breakers: OnceLock<Arc<[u32]>>,
    /// In admission order: preemption takes from the back.
    running: Vec<Sequence<'m>>,
}

impl<'m> Scheduler<'m> {
    /// A scheduler with its own KV pool (allocated here).
    pub fn new(model: &'m Model, tokenizer: &'m Tokenizer, config: EngineConfig) -> Result<Self, EngineError> {
        Ok(Scheduler::with_shared(model, tokenizer, Shared::new(model, config)?))
    }

    pub(crate) fn with_shared(model: &'m Model, tokenizer: &'m Tokenizer, shared: Arc<Shared>) -> Self {
        let plan = shared.plan;
        let pool = KvPool::with_blocks(&model.config, shared.config.kv_dtype, plan.blocks, plan.swa_blocks);
        let cache = shared.config.prefix_cache.then(|| PrefixCache::new(pool.block_size));
        let total: usize = (0..pool.n_groups()).map(|g| pool.blocks_total(g)).sum();
        shared.stats.kv_blocks_total.store(total as u64, Relaxed);
        Scheduler {
            model,
            tokenizer,
            shared,
            pool,
            cache,
            scratch: ForwardScratch::new(model),
            waiting: VecDeque::new(),
            json_vocab: OnceLock::new(),
            dry_breakers: OnceLock::new(),
            running: Vec::new(),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.shared.config
    }

    /// Queues a request (checked as [`super::Engine::submit`] does).
    pub fn submit(&mut self, req: Request) -> Result<RequestStream, RequestError> {
        Ok(self.submit_n(req, 1)?.remove(0))
    }

    /// Queues a request for `n` choices (see [`super::Engine::submit_n`]).
    pub fn submit_n(&mut self, req: Request, n: usize) -> Result<Vec<RequestStream>, RequestError> {
        let id = self.shared.accept(&req, n)?;
        let (sub, streams) = Submission::new(id, req, n);
        self.push(sub);
        Ok(streams)
    }

    pub(crate) fn push(&mut self, mut sub: Submission) {
        let forks = std::mem::take(&mut sub.forks);
        match Sequence::new(sub, self.tokenizer, &self.json_vocab, &self.dry_breakers) {
            Ok(mut seq) => {
                for fork in forks {
                    match Sequence::new(fork, self.tokenizer, &self.json_vocab, &self.dry_breakers) {
                        Ok(f) => seq.forks.push(f),
                        Err(refused) => self.refuse(*refused),
                    }
                }
                self.waiting.push_back(seq);
            }
            Err(refused) => {
                let why = refused.1.clone();
                self.refuse(*refused);
                for fork in forks {
                    self.refuse((fork, why.clone()));
                }
            }
        }
    }

    fn refuse(&self, (sub, why): (Submission, String)) {
        self.shared.queued.fetch_sub(1, Relaxed);
        Sequence::refuse(sub, why, &self.shared.stats);
    }

    /// Runs steps until the submission channel closes and the last request is done.
    pub(crate) fn run(&mut self, rx: &mpsc::Receiver<Submission>, mut observer: Option<StepObserver>) {
        loop {
            if self.is_idle() {
                match rx.recv() {
                    Ok(sub) => self.push(sub),
                    Err(_) => break,
                }
            }
            while let Ok(sub) = rx.try_recv() {
                self.push(sub);
            }
            let report = self.step();
            if let Some(observe) = &mut observer {
                observe(&report);
            }
        }
        if let Some(cache) = &mut self.cache {
            cache.clear(&mut self.pool);
        }
    }

    /// No request running or waiting.
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn pool(&self) -> &KvPool {
        &self.pool
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.shared.stats.snapshot()
    }

    /// Blocks in the prefix cache (0 without one).
    pub fn cached_blocks(&self) -> usize {
        self.cache.as_ref().map_or(0, PrefixCache::len)
    }

    /// Empties the prefix cache, returning its blocks to the pool.
    pub fn clear_prefix_cache(&mut self) {
        if let Some(cache) = &mut self.cache {
            cache.clear(&mut self.pool);
        }
    }

    /// Checks every block's reference count against its holders (requests and the prefix cache).
    pub fn audit(&self) -> Result<(), String> {
        let seqs = self.running.iter().chain(&self.waiting).map(|s| &s.kv);
        let cached: Vec<&BlockRef> = self.cache.iter().flat_map(PrefixCache::holds).collect();
        self.pool.audit(seqs, cached)
    }

    /// One scheduling step and forward pass (see the module documentation).
    pub fn step(&mut self) -> StepReport {
        let mut report = StepReport::default();
        let evicted = self.cache.as_ref().map_or(0, PrefixCache::evicted);
        report.cancelled = self.drop_cancelled();
        loop {
            self.plan(&mut report);
            if self.running.iter().any(|s| s.step_tokens > 0) || self.running.is_empty() {
                break;
            }
            // Nothing could move: every running request is mid-prompt and the pool is full. Give the blocks of the
            // latest one to the others (or, alone, end it).
            let last = self.running.len() - 1;
            if last == 0 {
                let seq = self.running.remove(0);
                self.end(seq, Ending::Finished { finish: super::FinishReason::Length, context_full: true });
                report.finished += 1;
            } else {
                self.preempt(last);
                report.preempted += 1;
            }
        }
        if self.running.iter().any(|s| s.step_tokens > 0) {
            self.forward(&mut report);
        }
        self.update_gauges();
        report.step = self.shared.stats.steps.load(Relaxed);
        report.evicted_blocks = (self.cache.as_ref().map_or(0, PrefixCache::evicted) - evicted) as usize;
        report.running = self.running.len();
        report.waiting = self.waiting.len();
        for g in 0..self.pool.n_groups() {
            report.kv_blocks_total += self.pool.blocks_total(g);
            report.kv_blocks_used += self.pool.blocks_total(g) - self.pool.blocks_free(g);
            report.kv_blocks_shared += self.pool.blocks_shared(g);
        }
        report.cached_blocks = self.cached_blocks();
        report
    }

    /// Ends the requests whose client went away; returns how many.
    fn drop_cancelled(&mut self) -> usize {
        let before = self.shared.stats.requests_cancelled.load(Relaxed);
        // Choices waiting to fork go first, so that a cancelled request whose forks take over (see `end`) hands
        // them only live ones.
        let mut gone = Vec::new();
        for seq in self.waiting.iter_mut().chain(self.running.iter_mut()) {
            gone.extend(seq.forks.extract_if(.., |f| f.is_cancelled()));
        }
        for seq in gone {
            self.end(seq, Ending::Cancelled);
        }
        let mut i = 0;
        while i < self.waiting.len() {
            if self.waiting[i].is_cancelled() {
                let seq = self.waiting.remove(i).expect("index checked");
                self.end(seq, Ending::Cancelled);
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].is_cancelled() {
                let seq = self.running.remove(i);
                self.end(seq, Ending::Cancelled);
            } else {
                i += 1;
            }
        }
        (self.shared.stats.requests_cancelled.load(Relaxed) - before) as usize
    }

    /// Frees blocks until every group has `need` (evicting what only the prefix cache holds).
    fn make_room(&mut self, need: &GroupCounts) -> bool {
        let enough = (0..self.pool.n_groups()).all(|g| self.pool.blocks_free(g) >= need[g]);
        enough || self.cache.as_mut().is_some_and(|c| c.evict(&mut self.pool, need))
    }

    fn plan(&mut self, report: &mut StepReport) {
        let mut budget = self.shared.config.max_batch_tokens;
        // Generating requests first: one token each, preempting from the back when the pool is short.
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].pending() != 1 || self.running[i].step_tokens > 0 {
                i += 1;
                continue;
            }
            let need = self.pool.blocks_needed(&self.running[i].kv, 1);
            if self.make_room(&need) {
                self.reserve(i, 1);
                budget -= 1;
                i += 1;
            } else if self.running.len() - 1 > i {
                self.preempt(self.running.len() - 1);
                report.preempted += 1;
            } else if i > 0 {
                // Itself the latest: it waits, and the earlier ones go on.
                self.preempt(i);
                report.preempted += 1;
            } else {
                let seq = self.running.remove(0);
                self.end(seq, Ending::Finished { finish: super::FinishReason::Length, context_full: true });
                report.finished += 1;
            }
        }
        // Prompt tokens may join at most in proportion to the generating requests' tokens (see PREFILL_PER_DECODE).
        let decodes = self.running.iter().filter(|s| s.step_tokens > 0).count();
        if decodes > 0 {
            budget = budget.min(PREFILL_MIN.max(PREFILL_PER_DECODE * decodes));
        }
        // Then running prompts, in chunks, shortest remainder first, so a short prompt is not held up behind a long
        // one; while requests wait for a place, half the budget is kept for them, for the same reason.
        let mut prompts: Vec<usize> = (0..self.running.len())
            .filter(|&i| self.running[i].pending() > 1 && self.running[i].step_tokens == 0)
            .collect();
        prompts.sort_by_key(|&i| self.running[i].pending());
        let max_seqs = self.shared.config.max_seqs;
        let mut width: usize = self.running.iter().map(Sequence::width).sum();
        let admitting = self.waiting.front().is_some_and(|s| width + s.width() <= max_seqs);
        let mut prompt_budget = if admitting { budget.div_ceil(2) } else { budget };
        for i in prompts {
            if prompt_budget == 0 {
                break;
            }
            let n = self.fit(i, self.running[i].pending().min(prompt_budget), 0);
            if n > 0 {
                self.reserve(i, n);
                budget -= n;
                prompt_budget -= n;
            }
        }
        // Then new (or preempted) requests, in order, while they fit (a request of several choices counts as that
        // many, so that they all have a place when they fork).
        while budget > 0 && self.waiting.front().is_some_and(|s| width + s.width() <= max_seqs) {
            let Some(mut seq) = self.waiting.pop_front() else { break };
            if seq.kv.is_empty() {
                self.take_cached_prefix(&mut seq);
            }
            let idx = self.running.len();
            let pending = seq.pending();
            self.running.push(seq);
            // Headroom: a block per running request, so that admitting this one does not preempt another next step.
            let n = self.fit(idx, pending.min(budget), idx);
            if n == 0 {
                let mut seq = self.running.pop().expect("pushed above");
                self.pool.release(&mut seq.kv);
                self.waiting.push_front(seq);
                break;
            }
            let seq = &mut self.running[idx];
            if std::mem::take(&mut seq.queued) {
                self.shared.queued.fetch_sub(1, Relaxed);
            }
            if seq.cached_tokens.is_none() {
                let stats = &self.shared.stats;
                let hit = seq.kv.len();
                seq.cached_tokens = Some(hit);
                report.admitted_prompt_tokens += seq.prompt_len;
                report.admitted_cached_tokens += hit;
                stats.prompt_tokens.fetch_add(seq.prompt_len as u64, Relaxed);
                if self.cache.is_some() {
                    stats.prefix_cache_queried_tokens.fetch_add(seq.prompt_len as u64, Relaxed);
                    stats.prefix_cache_hit_tokens.fetch_add(hit as u64, Relaxed);
                }
            }
            width += seq.width();
            self.reserve(idx, n);
            budget -= n;
            report.admitted += 1;
        }
    }

    /// The most of `want` tokens (from 1 up) that running request `i` can take now with `headroom` blocks left free
    /// in every group, evicting cached blocks as needed; 0 if not even one fits.
    fn fit(&mut self, i: usize, want: usize, headroom: usize) -> usize {
        let need = |pool: &KvPool, seq: &Sequence<'_>, n: usize| {
            let mut need = pool.blocks_needed(&seq.kv, n);
            need.iter_mut().for_each(|x| *x += headroom);
            need
        };
        let full = need(&self.pool, &self.running[i], want);
        if self.make_room(&full) {
            return want;
        }
        // Eviction went as far as it could: take the largest chunk what is free now allows.
        let (pool, seq) = (&self.pool, &self.running[i]);
        let fits = |n: usize| (0..pool.n_groups()).all(|g| pool.blocks_free(g) >= need(pool, seq, n)[g]);
        let (mut lo, mut hi) = (0, want);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if fits(mid) { lo = mid } else { hi = mid - 1 }
        }
        lo
    }

    fn reserve(&mut self, i: usize, n: usize) {
        let seq = &mut self.running[i];
        self.pool.reserve(&mut seq.kv, n).expect("room was made for it");
        seq.step_tokens = n;
    }

    /// Starts a fresh sequence with the longest cached prefix of its tokens (at least one token is left to run,
    /// whose logits give the next token).
    fn take_cached_prefix(&mut self, seq: &mut Sequence<'m>) {
        let Some(cache) = &mut self.cache else { return };
        let m = cache.lookup(&seq.tokens, seq.tokens.len() - 1, &self.pool);
        if m.len > 0 {
            self.pool.adopt(&mut seq.kv, &m.blocks, m.len);
            seq.cached_blocks = m.len / self.pool.block_size;
        } else {
            seq.cached_blocks = 0;
        }
    }

    /// Sends running request `i` back to the front of the queue without its blocks; it is recomputed from its
    /// tokens (the prefix cache keeps what it can of them).
    fn preempt(&mut self, i: usize) {
        let mut seq = self.running.remove(i);
        offer_to_cache(self.cache.as_mut(), &mut self.pool, &mut seq, true);
        self.pool.release(&mut seq.kv);
        seq.step_tokens = 0;
        seq.preemptions += 1;
        self.shared.stats.preemptions.fetch_add(1, Relaxed);
        self.waiting.push_front(seq);
    }

    /// A request leaves: its blocks are released (the cache keeps its computed prefix) and its stream is told.
    fn end(&mut self, mut seq: Sequence<'m>, ending: Ending) {
        let mut forks = std::mem::take(&mut seq.forks);
        if !forks.is_empty() {
            if matches!(ending, Ending::Cancelled) {
                // Its client dropped this choice only: the next one carries the prompt on (from what the prefix
                // cache kept of it), with the rest as its forks.
                let mut next = forks.remove(0);
                next.forks = forks;
                self.waiting.push_front(next);
            } else {
                // It ended before its first token (it failed, or its prompt alone filled the pool): so do they.
                for fork in forks {
                    self.end(fork, ending.clone());
                }
            }
        }
        if !matches!(ending, Ending::Failed(_)) {
            offer_to_cache(self.cache.as_mut(), &mut self.pool, &mut seq, true);
        }
        self.pool.release(&mut seq.kv);
        if std::mem::take(&mut seq.queued) {
            self.shared.queued.fetch_sub(1, Relaxed);
        }
        // The gauges first: a client told its request is done may read /metrics at once, and must not still see it
        // running (the step's own update comes only after every ending of the step).
        self.update_gauges();
        seq.finish(ending, &self.shared.stats);
    }

    fn forward(&mut self, report: &mut StepReport) {
        let result = {
            let mut items: Vec<SeqStep> = Vec::with_capacity(self.running.len());
            for seq in self.running.iter_mut().filter(|s| s.step_tokens > 0) {
                let Sequence { id, tokens, kv, step_tokens, .. } = seq;
                let start = kv.len();
                let end = start + *step_tokens;
                let logits = if end == tokens.len() { Logits::Last } else { Logits::None };
                report.batch_tokens += *step_tokens;
                let decode = end == tokens.len() && *step_tokens == 1;
                if decode {
                    report.decode_tokens += 1;
                }
                report.batch.push(BatchEntry { id: *id, start, tokens: *step_tokens, decode });
                items.push(SeqStep { tokens: &tokens[start..end], kv, logits });
            }
            report.batch_requests = items.len();
            let t = Instant::now();
            let r = self.model.forward(&mut items, &mut self.pool, &mut self.scratch);
            report.forward_time = t.elapsed();
            r
        };
        self.shared.stats.steps.fetch_add(1, Relaxed);
        if let Err(e) = result {
            // Not expected (tokens were checked and room was made), but if it happens the batch's requests fail
            // rather than the engine.
            let why = format!("forward pass failed: {e}");
            let mut i = 0;
            while i < self.running.len() {
                if self.running[i].step_tokens > 0 {
                    let seq = self.running.remove(i);
                    self.end(seq, Ending::Failed(why.clone()));
                } else {
                    i += 1;
                }
            }
            return;
        }
        let n_vocab = self.model.config.n_vocab;
        let n_ctx = self.shared.config.n_ctx;
        let mut item = 0;
        let mut ended: Vec<(usize, Ending)> = Vec::new();
        let mut forked: Vec<Sequence<'m>> = Vec::new();
        let mut forks_ended: Vec<(Sequence<'m>, Ending)> = Vec::new();
        for (i, seq) in self.running.iter_mut().enumerate() {
            if std::mem::take(&mut seq.step_tokens) == 0 {
                continue;
            }
            let logits = self.scratch.logits(item, n_vocab);
            item += 1;
            if seq.pending() == 0 {
                // The prompt is computed: the request's other choices fork from it here and sample their first
                // tokens from the same logits.
                report.forked += seq.forks.len();
                for mut fork in std::mem::take(&mut seq.forks) {
                    fork.kv = self.pool.fork(&seq.kv);
                    fork.cached_blocks = seq.cached_blocks;
                    fork.cached_tokens = seq.cached_tokens;
                    if std::mem::take(&mut fork.queued) {
                        self.shared.queued.fetch_sub(1, Relaxed);
                    }
                    report.sampled.push(fork.id);
                    match fork.take_token(logits, self.tokenizer, n_ctx, &self.shared.stats) {
                        Some(ending) => forks_ended.push((fork, ending)),
                        None => forked.push(fork),
                    }
                }
                report.sampled.push(seq.id);
                if let Some(ending) = seq.take_token(logits, self.tokenizer, n_ctx, &self.shared.stats) {
                    ended.push((i, ending));
                }
            }
        }
        // After the others, so the indices in `ended` still hold; the latest admitted, so preempted first.
        self.running.append(&mut forked);
        for seq in &mut self.running {
            // The cache takes the blocks the step filled before the sliding-window ones that left the window go (a
            // later request resuming inside this prefix needs its window).
            offer_to_cache(self.cache.as_mut(), &mut self.pool, seq, false);
            self.pool.release_passed(&mut seq.kv);
        }
        for (i, ending) in ended.into_iter().rev() {
            let seq = self.running.remove(i);
            self.end(seq, ending);
            report.finished += 1;
        }
        for (seq, ending) in forks_ended {
            self.end(seq, ending);
            report.finished += 1;
        }
    }

    fn update_gauges(&self) {
        let s = &self.shared.stats;
        s.requests_running.store(self.running.len() as u64, Relaxed);
        s.requests_waiting.store(self.waiting.len() as u64, Relaxed);
        let used: usize = (0..self.pool.n_groups()).map(|g| self.pool.blocks_total(g) - self.pool.blocks_free(g)).sum();
        s.kv_blocks_used.store(used as u64, Relaxed);
        s.prefix_cache_blocks.store(self.cached_blocks() as u64, Relaxed);
    }
}

/// Gives the prefix cache the sequence's newly full blocks (and, with `tail`, its partly filled last one).
fn offer_to_cache(cache: Option<&mut PrefixCache>, pool: &mut KvPool, seq: &mut Sequence<'_>, tail: bool) {
    let Some(cache) = cache else { return };
    let bs = pool.block_size;
    let computed = seq.kv.len();
    let full = computed / bs;
    let has_tail = tail && !computed.is_multiple_of(bs);
    if full <= seq.cached_blocks && !has_tail {
        return;
    }
    let refs: Vec<BlockRef> = (0..computed.div_ceil(bs)).map(|b| pool.block_ref(&seq.kv, b)).collect();
    cache.insert(&seq.tokens[..computed], &refs, tail, pool);
    seq.cached_blocks = full;
}
