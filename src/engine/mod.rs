//! The serving engine: many requests at once through one model, one forward pass per step.
//!
//! What it does, and where the ideas come from:
//! - **Iteration-level scheduling** (Orca, Yu et al., OSDI 2022): the batch is rebuilt at every step. A request that
//!   finishes leaves at once and a waiting one takes its place; nobody waits for the longest request in a batch.
//! - **Chunked prefill** (Sarathi, Agrawal et al., 2023; vLLM's scheduler): every step carries each generating
//!   request's next token first, then chunks of prompts up to a token budget (`max_batch_tokens`, and while anyone
//!   is generating at most [`PREFILL_PER_DECODE`] prompt tokens per generating request), so a long prompt costs
//!   the others somewhat longer steps instead of one long stall.
//! - **Paged, shared KV blocks** (PagedAttention, Kwon et al., SOSP 2023): one [`KvPool`](crate::model::KvPool)
//!   for everyone, blocks reference-counted. When it runs short the scheduler stops admitting requests; if a running
//!   one cannot grow, the most recently admitted request is *preempted*: its blocks go back, and it is recomputed
//!   from its tokens later, producing the tokens it would have.
//! - **A prefix cache** (RadixAttention, Zheng et al., 2024): see [`prefix_cache`].
//! - **Parallel sampling** (PagedAttention's fork): a request for several choices ([`Engine::submit_n`]) runs its
//!   prompt once; the other choices then fork from it, holding the same blocks, and copy a shared block only when
//!   they first write into it.
//!
//! The engine knows nothing of HTTP or terminals. [`Engine`] runs a [`Scheduler`] on its own thread and hands out
//! a [`RequestStream`] per request; dropping the stream cancels the request, and its blocks are freed at the next
//! step. Tests and benchmarks can drive a [`Scheduler`] directly, one [`Scheduler::step`] at a time.
//!
//! Results do not depend on the batch: a row of a batched matmul equals the same row alone, and attention looks at
//! each token's own sequence only, so a request's greedy tokens are the same alone, with fifteen others, sharing a
//! cached prefix or after a preemption.

pub mod metrics;
pub mod prefix_cache;
mod request;
mod scheduler;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::model::kv_cache::DEFAULT_BLOCK_SIZE;
use crate::model::{KvDtype, KvPool, Model};
use crate::sampling::{LogitBias, SamplingError, SamplingParams};
use crate::stop::StopError;
pub use crate::structured::OutputFormat;
use crate::tokenizer::Tokenizer;

pub use crate::session::FinishReason;
pub use metrics::{HistogramSnapshot, StatsSnapshot};
pub use scheduler::{BatchEntry, PREFILL_MIN, PREFILL_PER_DECODE, Scheduler, StepObserver, StepReport};

/// How much memory the KV pool gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvBudget {
    /// At most this many bytes of keys and values.
    Bytes(usize),
    /// This many blocks (of [`DEFAULT_BLOCK_SIZE`] positions) for the full-attention layers.
    Blocks(usize),
}

/// The engine's settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Most positions one request may use (prompt and generated tokens).
    pub n_ctx: usize,
    /// Most requests in the batch at once.
    pub max_seqs: usize,
    /// Most tokens in one forward pass (generating requests' tokens plus prompt chunks); at least `max_seqs`.
    pub max_batch_tokens: usize,
    /// Most requests waiting to be admitted; beyond it [`Engine::submit`] refuses with [`RequestError::QueueFull`].
    pub max_queue: usize,
    pub kv: KvBudget,
    pub kv_dtype: KvDtype,
    /// Share KV blocks between requests with a common prefix.
    pub prefix_cache: bool,
    /// Worker threads of the forward pass.
    pub threads: usize,
}

impl Default for EngineConfig {
    fn default() -> EngineConfig {
        EngineConfig {
            n_ctx: 4096,
            max_seqs: 16,
            max_batch_tokens: 256,
            max_queue: 256,
            kv: KvBudget::Bytes(1 << 30),
            kv_dtype: KvDtype::F16,
            prefix_cache: true,
            threads: crate::cpu_topology::default_threads().threads,
        }
    }
}

/// Why the engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{name} must be at least {min}, got {value}")]
    TooSmall { name: &'static str, value: usize, min: usize },
    #[error(
        "the KV budget of {bytes} bytes holds no block: one block of {block_size} positions takes {block_bytes} bytes"
    )]
    KvTooSmall { bytes: usize, block_bytes: usize, block_size: usize },
    #[error("starting the engine's worker threads: {0}")]
    Threads(String),
    #[error(transparent)]
    KvDtype(#[from] crate::model::kv_cache::KvDtypeError),
}

/// Most alternatives a request may ask for at each step (OpenAI's limit for `top_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// What one request asks for.
#[derive(Debug, Clone)]
pub struct Request {
    /// The prompt as token ids (chat template applied, BOS included, as the model wants them).
    pub prompt: Vec<u32>,
    /// Most tokens to generate (at least 1); generation also ends when the request's context is full.
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens (benchmarks fix the output length this way).
    pub ignore_eos: bool,
    /// Report each generated token's log-probability ([`crate::sampling::logprob`]).
    pub logprobs: bool,
    /// With `logprobs`, also report this many most likely tokens at each step ([`crate::sampling::top_logprobs`]).
    pub top_logprobs: usize,
    /// The shape the text must have; with [`OutputFormat::JsonObject`] the request ends when the object closes.
    pub format: OutputFormat,
    /// Biases on chosen tokens' logits (empty: none).
    pub logit_bias: LogitBias,
    /// Strings that end a DRY match ([`crate::sampling::dry`]); `None`: DRY's defaults. Read only when
    /// `sampling.dry` is on.
    pub dry_breakers: Option<Vec<String>>,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("max_tokens must be at least 1")]
    NoTokens,
    #[error("the prompt is {prompt} tokens, but the context holds {n_ctx}")]
    PromptTooLong { prompt: usize, n_ctx: usize },
    #[error("the prompt is {prompt} tokens, but the whole KV pool holds {capacity}")]
    PromptExceedsPool { prompt: usize, capacity: usize },
    #[error("token id {token} is out of range (vocabulary has {n_vocab} tokens)")]
    InvalidToken { token: u32, n_vocab: usize },
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error(transparent)]
    Stop(#[from] StopError),
    #[error("top_logprobs = {0}: at most {MAX_TOP_LOGPROBS}")]
    TooManyTopLogprobs(usize),
    #[error("n = {n} choices: at least 1 and at most {max} (the requests the engine runs at once)")]
    BadChoiceCount { n: usize, max: usize },
    #[error("the queue is full: {waiting} requests are waiting")]
    QueueFull { waiting: usize },
    #[error("the engine has stopped")]
    Stopped,
}

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose keys and values came from the prefix cache.
    pub cached_tokens: usize,
}

/// The end of a request.
#[derive(Debug, Clone)]
pub struct Done {
    /// Text released at the end (held back until then by the UTF-8 decoder or a possible stop string).
    pub text: String,
    pub finish: FinishReason,
    /// Generation ended because the request's context (or, alone in it, the KV pool) was full.
    pub context_full: bool,
    pub usage: Usage,
    /// Time from submission to the first generated token.
    pub ttft: Option<Duration>,
    /// Time from submission to the end.
    pub elapsed: Duration,
    /// Times the request was preempted and recomputed.
    pub preemptions: u32,
}

/// What a request's stream carries.
#[derive(Debug, Clone)]
pub enum Event {
    /// A generated token and the text that is now final (empty while held back: an incomplete UTF-8 character, or
    /// text that may begin a stop string).
    /// `top_logprobs` holds the request's `top_logprobs` most likely tokens and their log-probabilities (empty
    /// when it asked for none).
    Token { id: u32, text: String, logprob: Option<f32>, top_logprobs: Vec<(u32, f32)> },
    /// The request ended; nothing follows.
    Done(Done),
    /// The request failed (for example, the model produced non-finite logits); nothing follows.
    Failed(String),
}

/// One request's events, in order. Dropping it cancels the request.
#[derive(Debug)]
pub struct RequestStream {
    id: u64,
    rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
}

impl RequestStream {
    /// The engine's id for the request (unique in this process).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The next event, waiting asynchronously; `None` after the last.
    pub async fn next(&mut self) -> Option<Event> {
        self.rx.recv().await
    }

    /// The next event, blocking the thread (not for use inside an async runtime); `None` after the last.
    pub fn blocking_next(&mut self) -> Option<Event> {
        self.rx.blocking_recv()
    }

    /// Polls for the next event (for callers merging several streams, such as the choices of one request);
    /// `Ready(None)` after the last.
    pub fn poll_next(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Event>> {
        self.rx.poll_recv(cx)
    }

    /// The next event if one is there already.
    pub fn try_next(&mut self) -> Option<Event> {
        self.rx.try_recv().ok()
    }

    /// Reads the stream to its end: all tokens, the whole text and the final event.
    pub fn collect(mut self) -> Result<Completion, String> {
        let mut out = Completion::default();
        while let Some(ev) = self.blocking_next() {
            match ev {
                Event::Token { id, text, logprob, .. } => {
                    out.tokens.push(id);
                    out.text.push_str(&text);
                    out.logprobs.extend(logprob);
                }
                Event::Done(done) => {
                    out.text.push_str(&done.text);
                    out.done = Some(done);
                    return Ok(out);
                }
                Event::Failed(e) => return Err(e),
            }
        }
        Err("the engine stopped before the request ended".into())
    }
}

/// A whole request's result (see [`RequestStream::collect`]).
#[derive(Debug, Clone, Default)]
pub struct Completion {
    pub tokens: Vec<u32>,
    pub text: String,
    /// One per token when the request asked for them.
    pub logprobs: Vec<f32>,
    pub done: Option<Done>,
}

/// How the KV pool is laid out, for the start-up message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolPlan {
    /// Blocks of the full-attention layers, and of the sliding-window layers (0 if none).
    pub blocks: usize,
    pub swa_blocks: usize,
    pub block_size: usize,
    pub bytes: usize,
}

impl PoolPlan {
    /// Tokens the pool holds (in the full-attention layers, which keep every position).
    pub fn tokens(&self) -> usize {
        self.blocks * self.block_size
    }

    fn new(model: &Model, cfg: &EngineConfig) -> Result<PoolPlan, EngineError> {
        let c = &model.config;
        cfg.kv_dtype.check(c)?;
        let bs = DEFAULT_BLOCK_SIZE;
        let (full_bb, swa_bb) = KvPool::block_bytes(c, cfg.kv_dtype);
        // Sliding-window layers need, per running request, the window plus one step's chunk; twice that leaves
        // room for the prefix cache's sliding-window blocks.
        let swa_cap = match c.sliding_window {
            Some(w) if swa_bb > 0 => 2 * cfg.max_seqs * ((w + cfg.max_batch_tokens).div_ceil(bs) + 2),
            _ => 0,
        };
        let blocks = match cfg.kv {
            KvBudget::Blocks(n) => n,
            KvBudget::Bytes(bytes) => {
                let both = full_bb + swa_bb;
                if swa_bb == 0 || bytes / both <= swa_cap {
                    bytes / both
                } else {
                    (bytes - swa_cap * swa_bb) / full_bb.max(1)
                }
            }
        };
        if blocks == 0 {
            let bytes = match cfg.kv {
                KvBudget::Bytes(b) => b,
                KvBudget::Blocks(_) => 0,
            };
            return Err(EngineError::KvTooSmall { bytes, block_bytes: full_bb + swa_bb, block_size: bs });
        }
        let swa_blocks = if swa_bb == 0 { 0 } else { blocks.min(swa_cap) };
        Ok(PoolPlan { blocks, swa_blocks, block_size: bs, bytes: blocks * full_bb + swa_blocks * swa_bb })
    }
}

/// What the engine's thread and its callers share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub config: EngineConfig,
    pub plan: PoolPlan,
    pub n_vocab: usize,
    pub stats: metrics::Stats,
    /// New requests not yet admitted (counted against `max_queue`).
    pub queued: AtomicUsize,
    next_id: AtomicU64,
}

impl Shared {
    pub fn new(model: &Model, config: EngineConfig) -> Result<Arc<Shared>, EngineError> {
        let min = |name, value, min| if value < min { Err(EngineError::TooSmall { name, value, min }) } else { Ok(()) };
        min("max_seqs", config.max_seqs, 1)?;
        min("max_batch_tokens", config.max_batch_tokens, config.max_seqs)?;
        min("n_ctx", config.n_ctx, 1)?;
        min("threads", config.threads, 1)?;
        let plan = PoolPlan::new(model, &config)?;
        Ok(Arc::new(Shared {
            config,
            plan,
            n_vocab: model.config.n_vocab,
            stats: metrics::Stats::default(),
            queued: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
        }))
    }

    /// Checks a request for `n` choices against the limits, and takes a place in the queue for each; returns the
    /// first choice's id (the others follow it).
    pub fn accept(&self, req: &Request, n: usize) -> Result<u64, RequestError> {
        if n == 0 || n > self.config.max_seqs {
            return Err(RequestError::BadChoiceCount { n, max: self.config.max_seqs });
        }
        if req.prompt.is_empty() {
            return Err(RequestError::EmptyPrompt);
        }
        if req.max_tokens == 0 {
            return Err(RequestError::NoTokens);
        }
        if req.prompt.len() > self.config.n_ctx {
            return Err(RequestError::PromptTooLong { prompt: req.prompt.len(), n_ctx: self.config.n_ctx });
        }
        if req.prompt.len() > self.plan.tokens() {
            return Err(RequestError::PromptExceedsPool { prompt: req.prompt.len(), capacity: self.plan.tokens() });
        }
        if let Some(&token) = req.prompt.iter().find(|&&t| t as usize >= self.n_vocab) {
            return Err(RequestError::InvalidToken { token, n_vocab: self.n_vocab });
        }
        req.sampling.validate()?;
        req.logit_bias.check_vocab(self.n_vocab)?;
        crate::stop::validate_stops(&req.stop)?;
        if req.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(RequestError::TooManyTopLogprobs(req.top_logprobs));
        }
        let max = self.config.max_queue;
        self.queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| (q + n <= max).then_some(q + n))
            .map_err(|waiting| RequestError::QueueFull { waiting })?;
        Ok(self.next_id.fetch_add(n as u64, Ordering::Relaxed))
    }
}

/// A request on its way to the engine thread.
pub(crate) struct Submission {
    pub id: u64,
    pub req: Request,
    pub tx: tokio::sync::mpsc::UnboundedSender<Event>,
    pub arrived: Instant,
    /// The request's other choices (parallel sampling): they share this one's prompt and fork from it once it is
    /// computed.
    pub forks: Vec<Submission>,
}

impl Submission {
    /// The submission of `n` choices of `req` whose ids start at `id`, and a stream per choice. Choice `i` samples
    /// with seed `seed + i`, so it is the same as a request of one choice with that seed.
    fn new(id: u64, req: Request, n: usize) -> (Submission, Vec<RequestStream>) {
        let arrived = Instant::now();
        let mut streams = Vec::with_capacity(n);
        let mut subs: Vec<Submission> = (0..n as u64)
            .map(|i| {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                let mut req = req.clone();
                req.sampling.seed = req.sampling.seed.wrapping_add(i);
                streams.push(RequestStream { id: id + i, rx });
                Submission { id: id + i, req, tx, arrived, forks: Vec::new() }
            })
            .collect();
        let mut first = subs.remove(0);
        first.forks = subs;
        (first, streams)
    }
}

/// The engine running on its own thread. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct Engine {
    shared: Arc<Shared>,
    tx: std::sync::Mutex<Option<mpsc::Sender<Submission>>>,
    thread: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Engine {
    /// Starts the engine thread with its own pool of `config.threads` workers. The KV pool is allocated there,
    /// before the first request runs.
    pub fn start(model: Arc<Model>, tokenizer: Arc<Tokenizer>, config: EngineConfig) -> Result<Engine, EngineError> {
        Engine::start_observed(model, tokenizer, config, None)
    }

    /// As [`start`](Self::start), calling `observer` on the engine thread after every step with what the step did
    /// (`infer serve --trace`). It runs between forward passes, so it should be quick.
    pub fn start_observed(
        model: Arc<Model>,
        tokenizer: Arc<Tokenizer>,
        config: EngineConfig,
        observer: Option<StepObserver>,
    ) -> Result<Engine, EngineError> {
        let shared = Shared::new(&model, config)?;
        let workers = rayon::ThreadPoolBuilder::new()
            .num_threads(shared.config.threads)
            .thread_name(|i| format!("infer-engine-{i}"))
            .build()
            .map_err(|e| EngineError::Threads(e.to_string()))?;
        let (tx, rx) = mpsc::channel::<Submission>();
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("infer-engine".into())
            .spawn(move || {
                workers.install(move || {
                    let mut sched = Scheduler::with_shared(&model, &tokenizer, thread_shared);
                    sched.run(&rx, observer);
                })
            })
            .map_err(|e| EngineError::Threads(e.to_string()))?;
        Ok(Engine { shared, tx: std::sync::Mutex::new(Some(tx)), thread: std::sync::Mutex::new(Some(thread)) })
    }

    /// Queues a request. Refused at once if it breaks a limit or the queue is full.
    pub fn submit(&self, req: Request) -> Result<RequestStream, RequestError> {
        Ok(self.submit_n(req, 1)?.remove(0))
    }

    /// Queues a request for `n` choices (OpenAI's `n`, vLLM's parallel sampling), one stream each. The prompt
    /// goes through the model once: when it is computed the other choices fork from the first, sharing its KV
    /// blocks (the partly filled last one is copied by the first choice that writes to it), and sample their
    /// first tokens from the same logits. Choice `i` samples with seed `seed + i`, so its tokens are those of a
    /// request of one choice with that seed. `n` may be at most `max_seqs`.
    pub fn submit_n(&self, req: Request, n: usize) -> Result<Vec<RequestStream>, RequestError> {
        let guard = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let tx = guard.as_ref().ok_or(RequestError::Stopped)?;
        let id = self.shared.accept(&req, n)?;
        let (sub, streams) = Submission::new(id, req, n);
        if tx.send(sub).is_err() {
            self.shared.queued.fetch_sub(n, Ordering::AcqRel);
            return Err(RequestError::Stopped);
        }
        Ok(streams)
    }

    pub fn config(&self) -> &EngineConfig {
        &self.shared.config
    }

    /// How the KV pool was sized.
    pub fn pool_plan(&self) -> PoolPlan {
        self.shared.plan
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.shared.stats.snapshot()
    }

    /// Stops taking requests, lets the engine finish the ones it has, and waits for its thread to end.
    pub fn shutdown(&self) {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // The thread finishes what it has (cancelled requests go at its next step) and exits on its own.
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}
