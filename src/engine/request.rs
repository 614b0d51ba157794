//! One request inside the engine: its tokens, its KV table, and what turns sampled tokens into streamed text (its
//! sampler, stop strings and UTF-8 decoder).

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use crate::model::SeqKv;
use crate::sampling::Sampler;
use crate::sampling::dry::resolve_breakers;
use crate::stop::{StopMatcher, StopStep};
use crate::structured::{Constraint, SortedVocab};
use crate::tokenizer::Tokenizer;
use crate::tokenizer::stream::StreamDecoder;

use super::metrics::Stats;
use super::{Done, Event, FinishReason, Submission, Usage};

pub(crate) struct Sequence<'t> {
    pub id: u64,
    /// The prompt, then every generated token. Positions `kv.len()..` still have to go through the model: the
    /// last sampled token while generating, or everything after the cached prefix while (re)computing.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    pub kv: SeqKv,
    max_tokens: usize,
    ignore_eos: bool,
    logprobs: bool,
    top_logprobs: usize,
    sampler: Sampler,
    /// Structured output: which tokens may come next (JSON output only).
    constraint: Option<Constraint>,
    stop: StopMatcher,
    decoder: StreamDecoder<'t>,
    piece: String,
    tx: tokio::sync::mpsc::UnboundedSender<Event>,
    arrived: Instant,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    /// Prompt tokens the prefix cache had at the first admission (`None` before it).
    pub cached_tokens: Option<usize>,
    pub preemptions: u32,
    /// Still counted against the queue bound (until first admitted).
    pub queued: bool,
    /// Tokens this step runs through the model for the sequence (0: not in this step's batch).
    pub step_tokens: usize,
    /// Full blocks already offered to the prefix cache.
    pub cached_blocks: usize,
    /// The request's other choices, waiting for this one's prompt: they fork from it when it samples its first
    /// token (empty for a request of one choice, and after the fork).
    pub forks: Vec<Sequence<'t>>,
}

/// The end of a sequence as the scheduler sees it.
#[derive(Clone)]
pub(crate) enum Ending {
    Finished { finish: FinishReason, context_full: bool },
    Cancelled,
    Failed(String),
}

impl<'t> Sequence<'t> {
    /// The engine's state for a submission, or (should its settings be refused after all) the submission back.
    /// `json_vocab` is the vocabulary in byte order, built by the first request for JSON or grammar output; `dry_breakers` DRY's
    /// default sequence breakers, found by the first request that uses DRY. The submission's other choices are
    /// left to the caller (see [`forks`](Self::forks)).
    pub fn new(
        sub: Submission,
        tokenizer: &'t Tokenizer,
        json_vocab: &OnceLock<Arc<SortedVocab>>,
        dry_breakers: &OnceLock<Arc<[u32]>>,
    ) -> Result<Sequence<'t>, Box<(Submission, String)>> {
        let mut sampler = match Sampler::new(sub.req.sampling) {
            Ok(s) => s,
            Err(e) => return Err(Box::new((sub, e.to_string()))),
        };
        sampler.set_logit_bias(sub.req.logit_bias.clone());
        if sub.req.sampling.dry.is_on() {
            sampler.set_dry_breakers(resolve_breakers(tokenizer, sub.req.dry_breakers.as_deref(), dry_breakers));
        }
        let stop = match StopMatcher::new(sub.req.stop.iter().cloned()) {
            Ok(s) => s,
            Err(e) => return Err(Box::new((sub, e.to_string()))),
        };
        let constraint = Constraint::new(&sub.req.format, json_vocab, tokenizer);
        let Submission { id, req, tx, arrived, .. } = sub;
        let prompt_len = req.prompt.len();
        let mut tokens = req.prompt;
        tokens.reserve(req.max_tokens.min(1 << 16) + 1);
        Ok(Sequence {
            id,
            tokens,
            prompt_len,
            kv: SeqKv::keeping_passed_blocks(),
            max_tokens: req.max_tokens,
            ignore_eos: req.ignore_eos,
            logprobs: req.logprobs,
            top_logprobs: if req.logprobs { req.top_logprobs } else { 0 },
            sampler,
            constraint,
            stop,
            decoder: tokenizer.stream_decoder(true),
            piece: String::with_capacity(64),
            tx,
            arrived,
            first_token: None,
            last_token: None,
            cached_tokens: None,
            preemptions: 0,
            queued: true,
            step_tokens: 0,
            cached_blocks: 0,
            forks: Vec::new(),
        })
    }

    /// The requests this sequence stands for in the batch limit: itself and the choices waiting to fork from it.
    pub fn width(&self) -> usize {
        1 + self.forks.len()
    }

    /// Tokens still to go through the model.
    pub fn pending(&self) -> usize {
        self.tokens.len() - self.kv.len()
    }

    pub fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Whether the client went away (the stream was dropped).
    pub fn is_cancelled(&self) -> bool {
        self.tx.is_closed()
    }

    /// Samples the next token from `logits`, streams its text, and says whether the request is over.
    pub fn take_token(&mut self, logits: &[f32], tokenizer: &Tokenizer, n_ctx: usize, stats: &Stats) -> Option<Ending> {
        let sampled = match &mut self.constraint {
            None => self.sampler.sample(logits, &self.tokens),
            Some(c) => self.sampler.sample_masked(logits, &self.tokens, c.mask()),
        };
        let next = match sampled {
            Ok(t) => t,
            Err(e) => {
                let why = self.constraint.as_mut().map_or_else(|| e.to_string(), |c| c.explain(&e));
                return Some(Ending::Failed(why));
            }
        };
        let mut json_closed = false;
        if let Some(c) = &mut self.constraint {
            if let Err(e) = c.accept(next, tokenizer.token_bytes(next, true)) {
                return Some(Ending::Failed(e.to_string()));
            }
            json_closed = c.is_complete();
        }
        let now = Instant::now();
        match self.last_token {
            None => stats.ttft.observe(now - self.arrived),
            Some(prev) => stats.itl.observe(now - prev),
        }
        self.first_token.get_or_insert(now);
        self.last_token = Some(now);
        if (!self.ignore_eos && tokenizer.is_eog(next)) || self.stop.names_control_token(tokenizer, next) {
            return Some(Ending::Finished { finish: FinishReason::Stop, context_full: false });
        }
        self.tokens.push(next);
        stats.generated_tokens.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.piece.clear();
        self.decoder.push_into(next, &mut self.piece);
        let (text, stopped) = match self.stop.push(&self.piece) {
            StopStep::Continue(t) => (t.to_string(), false),
            StopStep::Stopped { text, .. } => (text.to_string(), true),
        };
        // The JSON object closed: its last bytes, held back in case they began a stop string, are final now.
        let (text, stopped) = if json_closed && !stopped {
            let (rest, stopped) = self.release_held();
            (text + &rest, stopped)
        } else {
            (text, stopped)
        };
        let logprob = self.logprobs.then(|| crate::sampling::logprob(logits, next));
        let top_logprobs = crate::sampling::top_logprobs(logits, self.top_logprobs);
        if self.tx.send(Event::Token { id: next, text, logprob, top_logprobs }).is_err() {
            return Some(Ending::Cancelled);
        }
        if stopped || json_closed {
            Some(Ending::Finished { finish: FinishReason::Stop, context_full: false })
        } else if self.generated() >= self.max_tokens {
            Some(Ending::Finished { finish: FinishReason::Length, context_full: false })
        } else if self.tokens.len() > n_ctx {
            Some(Ending::Finished { finish: FinishReason::Length, context_full: true })
        } else {
            None
        }
    }

    /// Releases what the decoder and the stop matcher still hold, and says whether that completed a stop string.
    fn release_held(&mut self) -> (String, bool) {
        let rest = self.decoder.finish();
        self.stop.finish_with(&rest)
    }

    /// Sends the last event of a request that ended.
    pub fn finish(&mut self, ending: Ending, stats: &Stats) {
        use std::sync::atomic::Ordering::Relaxed;
        match ending {
            Ending::Finished { mut finish, context_full } => {
                let mut text = String::new();
                // Unless a stop string ended the text, what the decoder and the stop matcher hold is text (an
                // end-of-generation token ruled out the stop string it may have begun).
                if self.stop.stopped().is_none() {
                    let stopped;
                    (text, stopped) = self.release_held();
                    if stopped {
                        finish = FinishReason::Stop;
                    }
                }
                let elapsed = self.arrived.elapsed();
                stats.e2e.observe(elapsed);
                stats.requests_finished.fetch_add(1, Relaxed);
                let done = Done {
                    text,
                    finish,
                    context_full,
                    usage: Usage {
                        prompt_tokens: self.prompt_len,
                        completion_tokens: self.generated(),
                        cached_tokens: self.cached_tokens.unwrap_or(0),
                    },
                    ttft: self.first_token.map(|t| t - self.arrived),
                    elapsed,
                    preemptions: self.preemptions,
                };
                let _ = self.tx.send(Event::Done(done));
            }
            Ending::Cancelled => {
                stats.requests_cancelled.fetch_add(1, Relaxed);
            }
            Ending::Failed(e) => {
                stats.requests_failed.fetch_add(1, Relaxed);
                let _ = self.tx.send(Event::Failed(e));
            }
        }
    }

    /// Refuses a submission the engine cannot take after all.
    pub fn refuse(sub: Submission, why: String, stats: &Stats) {
        stats.requests_failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let _ = sub.tx.send(Event::Failed(why));
    }
}
