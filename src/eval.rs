//! Measuring a model on text: perplexity by llama-perplexity's method, and how far one model's next-token
//! distributions are from another's (the statistics of llama-perplexity's KL-divergence mode, computed with both
//! models side by side instead of through a file of saved logits).
//!
//! The method: the text is tokenized once (with BOS if the model adds one) and cut into chunks of `n_ctx` tokens;
//! each chunk is run from an empty cache with its first token replaced by BOS, and only the predictions of its
//! second half are scored (positions `n_ctx/2 .. n_ctx-1`, each predicting the next token), so every scored token
//! has at least `n_ctx/2` tokens of context. Perplexity is `exp` of the mean negative log-likelihood, and its
//! uncertainty `ppl · sqrt(var(nll) / (count - 1))`, as llama-perplexity prints it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rayon::prelude::*;
use serde::Serialize;

use crate::model::{ForwardError, ForwardScratch, KvDtype, KvPool, Logits, Model, SeqKv, SeqStep};
use crate::session::{GenerateRequest, Session};
use crate::tokenizer::Tokenizer;

/// Positions whose logits are computed in one forward pass: bounds the logits buffer (`PIECE × n_vocab` floats,
/// 67 MB for Gemma 3's 262,144-token vocabulary).
const PIECE: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("the text has {have} tokens; -c {n_ctx} needs at least {need} (two chunks, as llama-perplexity)")]
    TooFewTokens { have: usize, need: usize, n_ctx: usize },
    #[error("-c {0} is too small: chunks need at least 4 tokens")]
    ContextTooSmall(usize),
    #[error("the models' vocabularies differ ({base} and {other} tokens): compare needs the same tokenizer")]
    VocabMismatch { base: usize, other: usize },
    #[error("interrupted")]
    Cancelled,
    #[error(transparent)]
    Forward(#[from] ForwardError),
    #[error(transparent)]
    Generate(#[from] crate::session::GenerateError),
}

/// Runs one sequence through a model from position 0, a piece at a time.
pub struct Runner<'m> {
    model: &'m Model,
    pool: KvPool,
    kv: SeqKv,
    scratch: ForwardScratch,
    n_vocab: usize,
    /// Time spent in forward passes and tokens run, for a prompt-processing rate.
    pub busy: Duration,
    pub tokens_run: usize,
}

impl<'m> Runner<'m> {
    /// A runner with room for `n_ctx` positions in a KV cache of `kv` (which the model's heads must allow:
    /// [`KvDtype::check`]).
    pub fn new(model: &'m Model, n_ctx: usize, kv: KvDtype) -> Runner<'m> {
        let swa = model.config.sliding_window.map_or(n_ctx, |w| (w + PIECE).min(n_ctx).max(1));
        Runner {
            model,
            pool: KvPool::new(&model.config, kv, n_ctx, swa),
            kv: SeqKv::new(),
            scratch: ForwardScratch::new(model),
            n_vocab: model.config.n_vocab,
            busy: Duration::ZERO,
            tokens_run: 0,
        }
    }

    /// Forgets the sequence.
    pub fn reset(&mut self) {
        self.pool.release(&mut self.kv);
    }

    /// The scratch buffers (to gather activation statistics).
    pub fn scratch_mut(&mut self) -> &mut ForwardScratch {
        &mut self.scratch
    }

    /// Appends `tokens` to the sequence; with `logits`, returns theirs (`tokens.len() × n_vocab`), else nothing.
    pub fn feed(&mut self, tokens: &[u32], logits: bool) -> Result<&[f32], ForwardError> {
        let t0 = Instant::now();
        let want = if logits { Logits::All } else { Logits::None };
        let mut items = [SeqStep { tokens, kv: &mut self.kv, logits: want }];
        self.model.forward(&mut items, &mut self.pool, &mut self.scratch)?;
        self.busy += t0.elapsed();
        self.tokens_run += tokens.len();
        Ok(if logits { self.scratch.logits(0, self.n_vocab) } else { &[] })
    }

    /// Runs `chunk` from an empty cache: the first half without logits, then the rest in pieces, calling
    /// `scored(pos, logits)` for each piece starting at position `pos >= first`.
    pub fn run_chunk(
        &mut self,
        chunk: &[u32],
        first: usize,
        mut scored: impl FnMut(usize, &[f32]),
    ) -> Result<(), ForwardError> {
        self.reset();
        for piece in chunk[..first].chunks(crate::session::PREFILL_CHUNK) {
            self.feed(piece, false)?;
        }
        let mut pos = first;
        for piece in chunk[first..].chunks(PIECE) {
            let logits = self.feed(piece, true)?;
            scored(pos, logits);
            pos += piece.len();
        }
        Ok(())
    }
}

/// The text as llama-perplexity tokenizes it: the model's BOS (if it adds one), then the text with no special-token
/// parsing.
pub fn tokenize_text(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    tokenizer.encode(text, true, false)
}

/// The chunks of `tokens` to score: `min(max_chunks, len / n_ctx)` of `n_ctx` tokens, each starting with `bos`
/// (if the model adds one) in place of its first token.
pub fn chunks(
    tokens: &[u32],
    n_ctx: usize,
    max_chunks: Option<usize>,
    bos: Option<u32>,
) -> Result<Vec<Vec<u32>>, EvalError> {
    if n_ctx < 4 {
        return Err(EvalError::ContextTooSmall(n_ctx));
    }
    if tokens.len() < 2 * n_ctx {
        return Err(EvalError::TooFewTokens { have: tokens.len(), need: 2 * n_ctx, n_ctx });
    }
    let n = (tokens.len() / n_ctx).min(max_chunks.unwrap_or(usize::MAX)).max(1);
    Ok((0..n)
        .map(|i| {
            let mut c = tokens[i * n_ctx..(i + 1) * n_ctx].to_vec();
            if let Some(b) = bos {
                c[0] = b;
            }
            c
        })
        .collect())
}

/// Running sums of negative log-likelihoods.
#[derive(Debug, Clone, Copy, Default)]
struct Nll {
    sum: f64,
    sum2: f64,
    count: usize,
}

impl Nll {
    fn add(&mut self, v: f64) {
        self.sum += v;
        self.sum2 += v * v;
        self.count += 1;
    }

    fn ppl(&self) -> f64 {
        (self.sum / self.count.max(1) as f64).exp()
    }

    /// llama-perplexity's uncertainty of the perplexity.
    fn ppl_err(&self) -> f64 {
        let n = self.count as f64;
        let mean = self.sum / n;
        let var = self.sum2 / n - mean * mean;
        if self.count > 1 && var > 0.0 { self.ppl() * (var / (n - 1.0)).sqrt() } else { 0.0 }
    }
}

/// `ln softmax(logits)` into `out`, with the sum taken in f64.
fn log_softmax(logits: &[f32], out: &mut [f32]) {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let sum: f64 = logits.iter().map(|&v| ((v - max) as f64).exp()).sum();
    let lse = max + sum.ln() as f32;
    for (o, &v) in out.iter_mut().zip(logits) {
        *o = v - lse;
    }
}

/// The negative log-likelihood of `token` under `logits`.
fn nll_of(logits: &[f32], token: u32) -> f64 {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let sum: f64 = logits.iter().map(|&v| ((v - max) as f64).exp()).sum();
    (max as f64 + sum.ln()) - logits[token as usize] as f64
}

/// A perplexity measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Perplexity {
    pub ppl: f64,
    /// llama-perplexity's `+/-`.
    pub ppl_err: f64,
    pub n_ctx: usize,
    pub chunks: usize,
    /// Tokens scored (`chunks × (n_ctx - 1 - n_ctx/2)`).
    pub tokens_scored: usize,
    /// Tokens in the whole text.
    pub tokens_text: usize,
    /// The running perplexity after each chunk (llama-perplexity's `[1]x,[2]y,...`).
    pub running: Vec<f64>,
    pub seconds: f64,
}

/// Perplexity of `model` on `tokens` (see the module notes). `on_chunk(i, n, running_ppl)` hears of each chunk.
/// Setting `cancel` stops after the chunk in progress: the result then covers the chunks finished (`chunks`), or is
/// [`EvalError::Cancelled`] if none was.
#[allow(clippy::too_many_arguments)]
pub fn perplexity(
    model: &Model,
    tokens: &[u32],
    n_ctx: usize,
    kv: KvDtype,
    max_chunks: Option<usize>,
    bos: Option<u32>,
    cancel: &AtomicBool,
    on_chunk: &mut dyn FnMut(usize, usize, f64),
) -> Result<Perplexity, EvalError> {
    let start = Instant::now();
    let chunks = chunks(tokens, n_ctx, max_chunks, bos)?;
    let first = n_ctx / 2;
    let mut runner = Runner::new(model, n_ctx, kv);
    let n_vocab = model.config.n_vocab;
    let (mut nll, mut running) = (Nll::default(), Vec::new());
    for (i, chunk) in chunks.iter().enumerate() {
        if cancel.load(Ordering::Relaxed) {
            break;
        }
        runner.run_chunk(chunk, first, |pos, logits| {
            let values: Vec<f64> = logits
                .par_chunks(n_vocab)
                .enumerate()
                .filter(|(r, _)| pos + r + 1 < n_ctx)
                .map(|(r, row)| nll_of(row, chunk[pos + r + 1]))
                .collect();
            values.into_iter().for_each(|v| nll.add(v));
        })?;
        running.push(nll.ppl());
        on_chunk(i, chunks.len(), nll.ppl());
    }
    if running.is_empty() {
        return Err(EvalError::Cancelled);
    }
    Ok(Perplexity {
        ppl: nll.ppl(),
        ppl_err: nll.ppl_err(),
        n_ctx,
        chunks: running.len(),
        tokens_scored: nll.count,
        tokens_text: tokens.len(),
        running,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Per-position statistics of OTHER's next-token distribution against BASE's.
#[derive(Debug, Clone, Default)]
pub struct Divergence {
    kld: Vec<f32>,
    same_top: usize,
    dp_sum: f64,
    base: Nll,
    other: Nll,
}

/// One position's numbers.
#[derive(Debug, Clone, Copy)]
struct Position {
    kld: f64,
    same_top: bool,
    dp: f64,
    nll_base: f64,
    nll_other: f64,
}

fn position(base: &[f32], other: &[f32], next: u32, lb: &mut [f32], lo: &mut [f32]) -> Position {
    log_softmax(base, lb);
    log_softmax(other, lo);
    let kld: f64 = lb.iter().zip(lo.iter()).map(|(&a, &b)| (a as f64).exp() * (a - b) as f64).sum();
    let argmax =
        |v: &[f32]| v.iter().enumerate().fold((0, f32::NEG_INFINITY), |m, (i, &x)| if x > m.1 { (i, x) } else { m }).0;
    let n = next as usize;
    Position {
        kld: kld.max(0.0),
        same_top: argmax(base) == argmax(other),
        dp: (lo[n] as f64).exp() - (lb[n] as f64).exp(),
        nll_base: -lb[n] as f64,
        nll_other: -lo[n] as f64,
    }
}

impl Divergence {
    /// Adds the positions of one piece: `base` and `other` hold `rows × n_vocab` logits, and `next[r]` is the
    /// token that followed row `r`.
    pub fn add(&mut self, base: &[f32], other: &[f32], next: &[u32], n_vocab: usize) {
        let rows: Vec<Position> = base
            .par_chunks(n_vocab)
            .zip(other.par_chunks(n_vocab))
            .zip(next.par_iter())
            .map_init(|| (vec![0f32; n_vocab], vec![0f32; n_vocab]), |(lb, lo), ((b, o), &t)| position(b, o, t, lb, lo))
            .collect();
        for p in rows {
            self.kld.push(p.kld as f32);
            self.same_top += p.same_top as usize;
            self.dp_sum += p.dp;
            self.base.add(p.nll_base);
            self.other.add(p.nll_other);
        }
    }

    /// The summary (mean and percentiles as llama-perplexity computes them).
    pub fn report(&self) -> DivergenceReport {
        let n = self.kld.len();
        let mut sorted = self.kld.clone();
        sorted.sort_by(f32::total_cmp);
        let percentile = |f: f64| -> Option<f64> {
            if sorted.is_empty() {
                return None;
            }
            let p = f * (sorted.len() - 1) as f64;
            let (i, frac) = (p as usize, p - p.floor());
            let hi = sorted[(i + 1).min(sorted.len() - 1)] as f64;
            Some((1.0 - frac) * sorted[i] as f64 + frac * hi)
        };
        let mean = |s: f64| (n > 0).then(|| s / n as f64);
        DivergenceReport {
            positions: n,
            top1_agreement: mean(self.same_top as f64),
            kld_mean: mean(self.kld.iter().map(|&k| k as f64).sum()),
            kld_median: percentile(0.5),
            kld_p99: percentile(0.99),
            kld_max: sorted.last().map(|&k| k as f64),
            delta_p_mean: mean(self.dp_sum),
            ppl_base: (n > 0).then(|| self.base.ppl()),
            ppl_other: (n > 0).then(|| self.other.ppl()),
        }
    }
}

/// How OTHER's predictions differ from BASE's over a set of positions. Fields are `None` over no positions.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct DivergenceReport {
    pub positions: usize,
    /// Fraction of positions where both models' most likely token is the same.
    pub top1_agreement: Option<f64>,
    /// Mean KL(BASE ‖ OTHER) of the next-token distributions, in nats.
    pub kld_mean: Option<f64>,
    pub kld_median: Option<f64>,
    pub kld_p99: Option<f64>,
    pub kld_max: Option<f64>,
    /// Mean of p_OTHER − p_BASE of the token that actually came next.
    pub delta_p_mean: Option<f64>,
    /// Each model's perplexity on the same tokens.
    pub ppl_base: Option<f64>,
    pub ppl_other: Option<f64>,
}

fn check_vocab(base: &Model, other: &Model) -> Result<usize, EvalError> {
    let (b, o) = (base.config.n_vocab, other.config.n_vocab);
    if b != o {
        return Err(EvalError::VocabMismatch { base: b, other: o });
    }
    Ok(b)
}

/// Text statistics of OTHER against BASE over the chunks of `tokens` (see the module notes), both models run side
/// by side a piece at a time. Also returns each model's prompt-processing rate in tokens/s. Setting `cancel` stops
/// after the chunk in progress: the statistics then cover the chunks finished, or the result is
/// [`EvalError::Cancelled`] if none was.
#[allow(clippy::too_many_arguments)]
pub fn compare_text(
    base: &Model,
    other: &Model,
    tokens: &[u32],
    n_ctx: usize,
    kv: KvDtype,
    max_chunks: Option<usize>,
    bos: Option<u32>,
    cancel: &AtomicBool,
    on_chunk: &mut dyn FnMut(usize, usize),
) -> Result<(DivergenceReport, [f64; 2]), EvalError> {
    let n_vocab = check_vocab(base, other)?;
    let chunks = chunks(tokens, n_ctx, max_chunks, bos)?;
    let first = n_ctx / 2;
    let (mut rb, mut ro) = (Runner::new(base, n_ctx, kv), Runner::new(other, n_ctx, kv));
    let mut div = Divergence::default();
    for (i, chunk) in chunks.iter().enumerate() {
        if cancel.load(Ordering::Relaxed) {
            if i == 0 {
                return Err(EvalError::Cancelled);
            }
            break;
        }
        rb.reset();
        ro.reset();
        for piece in chunk[..first].chunks(crate::session::PREFILL_CHUNK) {
            rb.feed(piece, false)?;
            ro.feed(piece, false)?;
        }
        // The last position predicts nothing inside the chunk, as in llama-perplexity.
        let scored = &chunk[first..n_ctx - 1];
        let mut pos = first;
        for piece in scored.chunks(PIECE) {
            let lb = rb.feed(piece, true)?.to_vec();
            let lo = ro.feed(piece, true)?;
            div.add(&lb, lo, &chunk[pos + 1..pos + 1 + piece.len()], n_vocab);
            pos += piece.len();
        }
        on_chunk(i, chunks.len());
    }
    let rate = |r: &Runner| r.tokens_run as f64 / r.busy.as_secs_f64().max(1e-9);
    Ok((div.report(), [rate(&rb), rate(&ro)]))
}

/// OTHER teacher-forced on `tokens` against BASE: statistics of the positions that predict `tokens[first..]`.
pub fn compare_continuation(
    base: &Model,
    other: &Model,
    tokens: &[u32],
    first: usize,
    kv: KvDtype,
) -> Result<DivergenceReport, EvalError> {
    let n_vocab = check_vocab(base, other)?;
    let mut div = Divergence::default();
    if first == 0 || first >= tokens.len() {
        return Ok(div.report());
    }
    let (mut rb, mut ro) = (Runner::new(base, tokens.len(), kv), Runner::new(other, tokens.len(), kv));
    for piece in tokens[..first - 1].chunks(crate::session::PREFILL_CHUNK) {
        rb.feed(piece, false)?;
        ro.feed(piece, false)?;
    }
    let mut pos = first - 1;
    for piece in tokens[first - 1..tokens.len() - 1].chunks(PIECE) {
        let lb = rb.feed(piece, true)?.to_vec();
        let lo = ro.feed(piece, true)?;
        div.add(&lb, lo, &tokens[pos + 1..pos + 1 + piece.len()], n_vocab);
        pos += piece.len();
    }
    Ok(div.report())
}

/// A greedy continuation and its speed.
#[derive(Debug, Clone, Serialize)]
pub struct Greedy {
    pub tokens: Vec<u32>,
    pub text: String,
    pub prompt_tps: f64,
    pub generate_tps: f64,
}

/// Greedy-generates up to `n` tokens after `prompt` (stopping early at an end-of-generation token).
pub fn greedy(
    model: &Model,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    n: usize,
    kv: KvDtype,
    cancel: &AtomicBool,
) -> Result<Greedy, EvalError> {
    let n_ctx = prompt.len() + n + 1;
    let mut session = Session::new(model, tokenizer, n_ctx, kv);
    let req = GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens: n,
        sampling: crate::sampling::SamplingParams::GREEDY,
        stop: Vec::new(),
        ignore_eos: false,
        format: crate::structured::OutputFormat::Text,
        draft: crate::speculative::DraftParams::OFF,
        logit_bias: Default::default(),
        dry_breakers: None,
    };
    let g = session.generate(&req, cancel, &mut |_| Ok(()))?;
    Ok(Greedy {
        tokens: g.tokens,
        text: g.text,
        prompt_tps: g.timings.prompt_tps(),
        generate_tps: g.timings.generate_tps(),
    })
}

/// How many leading tokens two sequences share.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_distributions_have_zero_divergence() {
        let logits: Vec<f32> = (0..20).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut d = Divergence::default();
        d.add(&logits, &logits, &[3, 7], 10);
        let r = d.report();
        assert_eq!(r.positions, 2);
        assert!(r.kld_mean.unwrap().abs() < 1e-7);
        assert_eq!(r.top1_agreement, Some(1.0));
        assert_eq!(r.ppl_base, r.ppl_other);
    }

    #[test]
    fn kld_matches_the_formula() {
        // p = softmax([0, ln 3]) = (1/4, 3/4), q = (1/2, 1/2): KL = 1/4 ln(1/2) + 3/4 ln(3/2).
        let (b, o) = ([0.0, 3f32.ln()], [1.0f32, 1.0]);
        let mut d = Divergence::default();
        d.add(&b, &o, &[1], 2);
        let r = d.report();
        let want = 0.25 * 0.5f64.ln() + 0.75 * 1.5f64.ln();
        assert!((r.kld_mean.unwrap() - want).abs() < 1e-6, "{r:?}");
        assert!((r.delta_p_mean.unwrap() - (0.5 - 0.75)).abs() < 1e-6);
        assert_eq!(r.top1_agreement, Some(0.0), "argmax 1 vs a tie resolved to 0");
        assert!((r.ppl_base.unwrap() - 4.0 / 3.0).abs() < 1e-5);
    }

    #[test]
    fn chunks_replace_the_first_token_with_bos() {
        let tokens: Vec<u32> = (10..30).collect();
        let c = chunks(&tokens, 8, None, Some(1)).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c[1], [1, 19, 20, 21, 22, 23, 24, 25]);
        assert!(matches!(chunks(&tokens, 11, None, None), Err(EvalError::TooFewTokens { need: 22, .. })));
        assert_eq!(chunks(&tokens, 8, Some(1), None).unwrap().len(), 1);
    }
}
