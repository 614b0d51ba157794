//! Driving generation for one conversation: prompt → prefill → decode → sample, with stop conditions, streaming
//! text and timings.
//!
//! A [`Session`] owns one sequence's KV cache and remembers the tokens in it, so a follow-up prompt that extends
//! the previous one (a chat turn) only runs the new tokens through the model. It knows nothing of terminals: text
//! goes to a callback, and cancellation is an `AtomicBool` the caller may set from a signal handler.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::model::{ForwardError, ForwardScratch, KvDtype, KvPool, Logits, Model, SeqKv, SeqStep};
use crate::sampling::{LogitBias, Sampler, SamplingError, SamplingParams, dry};
use crate::speculative::{DraftParams, DraftPolicy, DraftStats};
use crate::stop::{StopError, StopMatcher, StopStep};
use crate::structured::{Constraint, OutputFormat, SortedVocab};
use crate::tokenizer::Tokenizer;

/// Tokens per forward pass during prefill: long prompts run in chunks so memory stays bounded and Ctrl-C is seen.
pub const PREFILL_CHUNK: usize = 512;

/// What one generation asks for.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// The whole conversation so far as tokens (prompt, chat history); a prefix already in the cache is reused.
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// The shape the text must have; with [`OutputFormat::JsonObject`] generation ends when the object closes.
    pub format: OutputFormat,
    /// Biases on chosen tokens' logits (empty: none).
    pub logit_bias: LogitBias,
    /// Strings that end a DRY match ([`crate::sampling::dry`]); `None`: DRY's defaults. Read only when
    /// `sampling.dry` is on.
    pub dry_breakers: Option<Vec<String>>,
    /// Guessing ahead by prompt lookup ([`crate::speculative`]); [`DraftParams::OFF`] decodes a token per pass.
    /// The tokens are the same either way.
    pub draft: DraftParams,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token, a stop string, or the end of a constrained output (the JSON object closed).
    Stop,
    /// `max_tokens` reached, or the context filled up (see [`Generation::context_full`]).
    Length,
    /// The caller set the cancel flag.
    Cancelled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// Time spent, for tokens-per-second figures.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timings {
    /// Prompt tokens that went through the model (cached prefix excluded).
    pub prompt_tokens: usize,
    pub prompt_time: Duration,
    pub generated_tokens: usize,
    pub generate_time: Duration,
    /// From the call to the first generated token (prefill included): what a person waits before text appears.
    pub first_token: Option<Duration>,
    /// Speculation's guesses and how many stood.
    pub draft: DraftStats,
}

impl Timings {
    pub fn prompt_tps(&self) -> f64 {
        rate(self.prompt_tokens, self.prompt_time)
    }

    pub fn generate_tps(&self) -> f64 {
        rate(self.generated_tokens, self.generate_time)
    }
}

fn rate(n: usize, t: Duration) -> f64 {
    if t.is_zero() { 0.0 } else { n as f64 / t.as_secs_f64() }
}

/// The result of one generation.
#[derive(Debug, Clone)]
pub struct Generation {
    /// The text shown (stop string excluded).
    pub text: String,
    /// Generated token ids (the end-of-generation token, if any, excluded).
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
    /// Generation stopped because the context window was full.
    pub context_full: bool,
    pub timings: Timings,
}

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("the prompt is {prompt} tokens, but the context holds {n_ctx}: shorten it or raise --ctx-size")]
    PromptTooLong { prompt: usize, n_ctx: usize },
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error(transparent)]
    Stop(#[from] StopError),
    #[error(transparent)]
    Constraint(#[from] crate::structured::Refused),
    /// Constrained output found no allowed token (the constraint's account of why).
    #[error("{0}")]
    DeadEnd(String),
    #[error(transparent)]
    Forward(#[from] ForwardError),
    #[error(transparent)]
    ModelFile(#[from] crate::gguf::GgufError),
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
}

/// One sequence's state across turns.
pub struct Session<'m> {
    model: &'m Model,
    tokenizer: &'m Tokenizer,
    n_ctx: usize,
    pool: KvPool,
    kv: SeqKv,
    /// The tokens whose keys and values are in `kv`, in order.
    cached: Vec<u32>,
    scratch: ForwardScratch,
    /// The vocabulary in byte order, built on the first request for JSON or grammar output.
    json_vocab: std::sync::OnceLock<std::sync::Arc<SortedVocab>>,
    /// DRY's default sequence breakers as token ids, found by the first request that uses DRY.
    dry_breakers: std::sync::OnceLock<std::sync::Arc<[u32]>>,
    /// How many guesses pay ([`crate::speculative`]): kept across calls, so a chat's later turns start from what
    /// the earlier ones measured (the same model and threads) instead of timing a plain pass first.
    draft_policy: DraftPolicy,
    /// Most positions the cache can be taken back from its end: unlimited without sliding-window layers, which
    /// otherwise free what falls out of their window. Bounds a speculative pass, whose rejected guesses are dropped.
    rewind: usize,
}

/// Positions a sliding-window layer group holds: its window plus one prefill chunk.
fn swa_capacity(model: &Model, n_ctx: usize) -> usize {
    model.config.sliding_window.map_or(n_ctx, |w| w.saturating_add(PREFILL_CHUNK))
}

impl<'m> Session<'m> {
    /// A session with room for `n_ctx` positions. A model with sliding-window layers keeps one more window's worth
    /// of positions behind the window, so a rewind of up to that many tokens (a chat's regenerate or undo) is a
    /// truncation rather than a new prefill of the whole conversation (see [`Session::with_rewind`]).
    pub fn new(model: &'m Model, tokenizer: &'m Tokenizer, n_ctx: usize, kv_dtype: KvDtype) -> Session<'m> {
        let rewind = model.config.sliding_window.unwrap_or(0);
        Session::with_rewind(model, tokenizer, n_ctx, kv_dtype, rewind)
    }

    /// A session whose sliding-window layers (if the model has any) keep `rewind` positions behind their window.
    /// A later prompt that shares only a shorter prefix with the cache goes back to it by truncation while the
    /// window it needs is still held; further back, the prompt is prefilled again from the start.
    pub fn with_rewind(
        model: &'m Model,
        tokenizer: &'m Tokenizer,
        n_ctx: usize,
        kv_dtype: KvDtype,
        rewind: usize,
    ) -> Session<'m> {
        let swa = swa_capacity(model, n_ctx);
        Session {
            model,
            tokenizer,
            n_ctx,
            pool: KvPool::with_rewind(&model.config, kv_dtype, n_ctx, swa, rewind),
            kv: SeqKv::new(),
            cached: Vec::new(),
            scratch: ForwardScratch::new(model),
            json_vocab: std::sync::OnceLock::new(),
            dry_breakers: std::sync::OnceLock::new(),
            draft_policy: DraftPolicy::new(DraftParams::OFF),
            rewind: if model.config.sliding_window.is_some() { rewind } else { usize::MAX },
        }
    }

    /// Bytes of KV cache a [`Session::new`] with these arguments allocates (`None`: too many to count).
    pub fn kv_bytes(model: &Model, n_ctx: usize, kv_dtype: KvDtype) -> Option<u64> {
        let rewind = model.config.sliding_window.unwrap_or(0);
        KvPool::bytes_for(&model.config, kv_dtype, n_ctx, swa_capacity(model, n_ctx), rewind)
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Tokens currently in the cache.
    pub fn cached_tokens(&self) -> &[u32] {
        &self.cached
    }

    /// Forgets the cached conversation.
    pub fn reset(&mut self) {
        self.pool.release(&mut self.kv);
        self.cached.clear();
    }

    /// Generates a continuation of `req.prompt`, passing text to `on_text` as it becomes final.
    pub fn generate(
        &mut self,
        req: &GenerateRequest,
        cancel: &AtomicBool,
        on_text: &mut dyn FnMut(&str) -> std::io::Result<()>,
    ) -> Result<Generation, GenerateError> {
        if req.prompt.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        if req.prompt.len() > self.n_ctx {
            return Err(GenerateError::PromptTooLong { prompt: req.prompt.len(), n_ctx: self.n_ctx });
        }
        // The weights are read from the file's memory map: never from a file that changed since it was validated.
        self.model.file().check_unchanged()?;
        let began = Instant::now();
        let mut sampler = Sampler::new(req.sampling)?;
        req.logit_bias.check_vocab(self.model.config.n_vocab)?;
        sampler.set_logit_bias(req.logit_bias.clone());
        if req.sampling.dry.is_on() {
            sampler.set_dry_breakers(dry::resolve_breakers(
                self.tokenizer,
                req.dry_breakers.as_deref(),
                &self.dry_breakers,
            ));
        }
        let mut stop = StopMatcher::new(req.stop.iter().cloned())?;
        let mut constraint = Constraint::new(&req.format, &self.json_vocab, self.tokenizer);
        let n_vocab = self.model.config.n_vocab;
        let mut timings = Timings::default();

        // Reuse the cached prefix; at least the last prompt token must run to produce logits.
        let common = self.cached.iter().zip(&req.prompt).take_while(|(a, b)| a == b).count();
        let keep = common.min(req.prompt.len() - 1);
        if keep < self.cached.len() {
            if keep > 0 && self.pool.can_truncate(&self.kv, keep) {
                self.pool.truncate(&mut self.kv, keep);
                self.cached.truncate(keep);
            } else {
                // Nothing in common, or the sliding-window layers have freed part of the window that position `keep`
                // sees. Recomputing just those positions would need their own windows, which are gone too, and so on
                // back to the start: only a prefill from position 0 gives the same cache as before.
                self.reset();
            }
        }

        // Prefill.
        let start = Instant::now();
        let todo: Vec<u32> = req.prompt[self.cached.len()..].to_vec();
        let chunks: Vec<&[u32]> = todo.chunks(PREFILL_CHUNK).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            if cancel.load(Ordering::Relaxed) {
                return Ok(self.finish_early(FinishReason::Cancelled, timings));
            }
            let logits = if i + 1 == chunks.len() { Logits::Last } else { Logits::None };
            let mut items = [SeqStep { tokens: chunk, kv: &mut self.kv, logits }];
            self.model.forward(&mut items, &mut self.pool, &mut self.scratch)?;
            crate::timeline::mark!("prefilled {} tokens", chunk.len());
            self.cached.extend_from_slice(chunk);
        }
        timings.prompt_tokens = todo.len();
        timings.prompt_time = start.elapsed();

        // Decode. A pass feeds the token just sampled and, with speculation, the guesses that follow it; its logits
        // rows are sampled in turn while the guesses stand (see `crate::speculative`). Before a pass, `rows` is the
        // number of rows the last one produced and `row` the one sampled next; the cache holds every token fed,
        // so the last `rows - row - 1` of them are guesses not yet confirmed.
        let start = Instant::now();
        // Sized up front so the decode loop itself does not allocate.
        let room = req.max_tokens.min(self.n_ctx).saturating_add(1);
        let mut history = Vec::with_capacity(req.prompt.len() + room);
        history.extend_from_slice(&req.prompt);
        let mut tokens = Vec::with_capacity(room);
        let mut piece = String::with_capacity(64);
        let mut text = String::new();
        let mut decoder = self.tokenizer.stream_decoder(true);
        let mut finish = FinishReason::Length;
        let mut context_full = false;
        // The constrained output (a JSON value, a grammar's text) is complete: generation stops (held text is still
        // released below).
        let mut completed = false;
        let draft_max = req.draft.max.min(self.rewind);
        let mut fed: Vec<u32> = Vec::with_capacity(draft_max + 1);
        if self.draft_policy.params() != &req.draft {
            self.draft_policy = DraftPolicy::new(req.draft);
        }
        self.draft_policy.restart();
        let mut pass_start: Option<Instant> = None;
        let (mut rows, mut row) = (1, 0);
        loop {
            if tokens.len() >= req.max_tokens {
                break;
            }
            if cancel.load(Ordering::Relaxed) {
                finish = FinishReason::Cancelled;
                break;
            }
            let logits = &self.scratch.logits(0, n_vocab)[row * n_vocab..(row + 1) * n_vocab];
            let next = match &mut constraint {
                None => sampler.sample(logits, &history)?,
                Some(c) => {
                    let next = match sampler.sample_masked(logits, &history, c.mask()) {
                        Ok(next) => next,
                        Err(e) => return Err(GenerateError::DeadEnd(c.explain(&e))),
                    };
                    // The sampler draws only tokens the mask allows, so this cannot fail; an error, not a panic.
                    c.accept(next, self.tokenizer.token_bytes(next, true))?;
                    completed = c.is_complete();
                    next
                }
            };
            if timings.first_token.is_none() {
                crate::timeline::mark!("first token sampled");
                timings.first_token = Some(began.elapsed());
            }
            if (!req.ignore_eos && self.tokenizer.is_eog(next)) || stop.names_control_token(self.tokenizer, next) {
                finish = FinishReason::Stop;
                break;
            }
            tokens.push(next);
            history.push(next);
            self.draft_policy.sampled(next);
            piece.clear();
            decoder.push_into(next, &mut piece);
            match stop.push(&piece) {
                StopStep::Continue(t) => {
                    text.push_str(t);
                    on_text(t)?;
                }
                StopStep::Stopped { text: t, .. } => {
                    text.push_str(t);
                    on_text(t)?;
                    finish = FinishReason::Stop;
                    break;
                }
            }
            if completed {
                finish = FinishReason::Stop;
                break;
            }
            if tokens.len() >= req.max_tokens {
                break;
            }
            // The guess fed after this row's token was the one drawn: its logits are the next row.
            let unconfirmed = rows - row - 1;
            if unconfirmed > 0 && self.cached[self.cached.len() - unconfirmed] == next {
                timings.draft.accepted += 1;
                row += 1;
                continue;
            }
            self.drop_guesses(unconfirmed);
            if self.cached.len() >= self.n_ctx {
                context_full = true;
                break;
            }
            // The policy learns what a pass costs from the time between pass starts (its rows' sampling included).
            let now = Instant::now();
            if let Some(t) = pass_start {
                self.draft_policy.timed(rows - 1, now.duration_since(t).as_secs_f64());
            }
            pass_start = Some(now);
            // Guesses beyond the context, or beyond the tokens still wanted (the last row of a pass yields one
            // token of its own), would be wasted.
            let limit = (self.n_ctx - self.cached.len() - 1).min(req.max_tokens - tokens.len() - 1).min(draft_max);
            fed.clear();
            fed.push(next);
            fed.extend_from_slice(self.draft_policy.guesses(&history, limit));
            let logits = if fed.len() > 1 { Logits::All } else { Logits::Last };
            let mut items = [SeqStep { tokens: &fed, kv: &mut self.kv, logits }];
            self.model.forward(&mut items, &mut self.pool, &mut self.scratch)?;
            crate::timeline::mark!("decoded {} tokens", fed.len());
            self.cached.extend_from_slice(&fed);
            if fed.len() > 1 {
                timings.draft.drafted += fed.len() - 1;
                timings.draft.passes += 1;
            }
            (rows, row) = (fed.len(), 0);
        }
        // Guesses after the last token drawn are not part of the text.
        self.drop_guesses(rows - row - 1);
        if stop.stopped().is_none() {
            // Flush what the decoder and the stop matcher still hold: unless a stop string ended the text, that is
            // text (held back in case it began a stop string, which an end-of-generation token then ruled out).
            let (tail, stopped) = stop.finish_with(&decoder.finish());
            if stopped {
                finish = FinishReason::Stop;
            }
            text.push_str(&tail);
            on_text(&tail)?;
        }
        timings.generated_tokens = tokens.len();
        timings.generate_time = start.elapsed();
        Ok(Generation { text, tokens, finish, context_full, timings })
    }

    /// Takes the last `n` tokens (guesses that did not stand) out of the cache.
    fn drop_guesses(&mut self, n: usize) {
        if n > 0 {
            let keep = self.cached.len() - n;
            // `rewind` bounds every pass's guesses, so the window a query at `keep` sees is still held.
            debug_assert!(self.pool.can_truncate(&self.kv, keep));
            self.pool.truncate(&mut self.kv, keep);
            self.cached.truncate(keep);
        }
    }

    fn finish_early(&mut self, finish: FinishReason, timings: Timings) -> Generation {
        Generation { text: String::new(), tokens: Vec::new(), finish, context_full: false, timings }
    }
}
