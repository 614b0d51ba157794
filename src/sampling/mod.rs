//! Choosing the next token from the model's logits.
//!
//! Everything here is per request: a [`Sampler`] owns its parameters, its seeded RNG and its scratch buffers, so a
//! server runs one per sequence and nothing is shared between them.
//!
//! # The pipeline
//!
//! [`Sampler::sample`] applies, in this order (llama.cpp's default order):
//!
//! 0. **logit bias**: each token of the request's [`LogitBias`] has its bias added; a banned one (−∞) is never
//!    drawn, and when every token is banned sampling fails ([`SamplingError::NothingAllowed`]);
//! 1. **penalties** over the tokens among the last `repeat_last_n` of the history: the **repeat penalty** divides a
//!    positive logit by `repeat_penalty` and multiplies a zero or negative one by it (llama.cpp's convention); then
//!    a token seen `c` times loses `c × frequency_penalty + presence_penalty` (OpenAI's definition, llama.cpp's
//!    order);
//! 2. **DRY** ([`dry`]): a token that would carry on a repeat of `allowed_length` or more tokens of the history
//!    loses `multiplier × base^(length − allowed_length)` (off unless `dry.multiplier > 0`);
//!    then, with [`Sampler::sample_masked`] (structured output, [`crate::structured`]), only the tokens the mask
//!    allows go on to the next steps;
//! 3. **top-nσ**: keep the tokens whose logit is at least `max − top_n_sigma × σ`, σ the standard deviation of the
//!    logits (off unless `top_n_sigma > 0`);
//! 4. **top-k**: keep the `top_k` highest logits (0 = off);
//! 5. **typical** ([`typical`]): keep the smallest set of tokens whose surprise is closest to the entropy and whose
//!    mass reaches `typical_p` (1 = off);
//! 6. **top-p** (nucleus): keep the smallest set of highest-probability tokens whose probability mass, measured on
//!    the distribution left by the steps before at temperature 1, reaches `top_p` (1 = off);
//! 7. **min-p**: drop tokens whose probability is below `min_p` times the most likely token's (0 = off);
//! 8. **XTC** ([`xtc`]): with probability `xtc.probability`, drop every token at least `xtc.threshold` likely
//!    except the least likely of them (off unless `xtc.probability > 0`);
//! 9. **temperature**: divide the surviving logits by `temperature`, or by a temperature that follows their entropy
//!    ([`dynatemp`], off unless `dynatemp.range > 0`);
//! 10. **draw** one token from the softmax of what is left, with the sampler's own ChaCha8 RNG.
//!
//! [`mirostat`] (off unless `mirostat.version` is 1 or 2) replaces steps 3–9 with its own cut, which a feedback
//! loop on the drawn tokens' surprise moves; the temperature still applies.
//!
//! Temperature 0 means greedy: the answer is the argmax of the penalized logits (ties go to the lowest id) and the
//! RNG is not touched. The filters keep the most likely token, so they never change a greedy answer.
//!
//! # Cost
//!
//! The vocabulary is 49k–262k tokens and this runs once per generated token, so no step sorts the whole vocabulary:
//! top-k is a single scan that keeps a small buffer of the best candidates, and only those are sorted; top-p without
//! top-k finds its cut with a histogram of the probability mass and sorts one bucket; min-p is a threshold. The loops
//! over the whole vocabulary (finiteness check, max, softmax mass) are written to vectorize. All buffers live in the
//! [`Sampler`] and are reused, so a warm sampler does not allocate.
//!
//! # Reproducibility
//!
//! The RNG is ChaCha8 seeded from [`SamplingParams::seed`], whose output is specified bit for bit; `exp` is our own
//! plain-arithmetic one rather than the platform's libm; sums run over fixed lanes; and candidates are drawn in an
//! order that depends on the logits alone (highest first with ties by id after top-k, otherwise mostly id order). So
//! the same seed and the same logits give the same tokens on every platform.

use std::cmp::Ordering;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::{SystemTime, UNIX_EPOCH};

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

pub mod dry;
pub mod dynatemp;
pub mod mirostat;
pub mod order;
pub mod typical;
pub mod xtc;

pub use dry::DryParams;
pub use dynatemp::DynatempParams;
pub use mirostat::MirostatParams;
pub use order::SamplerOrder;
pub use xtc::XtcParams;

/// Why sampling parameters were refused or a token could not be sampled.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    /// A parameter is NaN, infinite, negative or out of its range.
    #[error("invalid sampling parameter {name} = {value}: expected {expected}")]
    InvalidParam { name: &'static str, value: f32, expected: &'static str },
    /// There was nothing to sample from.
    #[error("the logits are empty: nothing to sample from")]
    EmptyLogits,
    /// The model produced NaN or an infinity: generation cannot go on.
    #[error("logit {index} is not finite (NaN or infinite): the model's output is broken")]
    NonFiniteLogits { index: usize },
    /// The history holds a token id that the logits have no entry for.
    #[error("token {token} in the history is outside the vocabulary of {vocab_size} tokens")]
    TokenOutOfRange { token: u32, vocab_size: usize },
    /// More logits than 32-bit token ids can name.
    #[error("{0} logits: more than 32-bit token ids can name")]
    VocabTooLarge(usize),
    /// A mask (structured output) or the logit bias's bans allowed no token at all.
    #[error("no token of the vocabulary can continue the output (the constraint or the banned tokens exclude all)")]
    NothingAllowed,
    /// A logit bias names a token the vocabulary does not have.
    #[error("logit bias for token {token}: the vocabulary has {vocab_size} tokens")]
    BiasTokenOutOfRange { token: u32, vocab_size: usize },
    /// A logit bias is NaN, +infinity or outside [-100, 100] (−infinity bans the token).
    #[error("logit bias {bias} for token {token}: expected a number in [-100, 100], or -inf to ban the token")]
    InvalidBias { token: u32, bias: f32 },
}

/// The knobs of one request's sampling. See the [module docs](self) for what each does and in which order.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Softmax temperature, ≥ 0; 0 = greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 = off.
    pub top_k: usize,
    /// Nucleus sampling mass, in (0, 1]; 1 = off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` × the most likely one's probability, in [0, 1]; 0 = off.
    pub min_p: f32,
    /// Top-nσ: keep only tokens whose logit is within `top_n_sigma` standard deviations (of all the logits) of the
    /// largest; ≤ 0 = off (llama.cpp's −1).
    pub top_n_sigma: f32,
    /// Locally typical sampling's mass, in (0, 1]; 1 = off ([`typical`]).
    pub typical_p: f32,
    /// Repeat penalty, > 0; 1 = off, above 1 discourages repeats.
    pub repeat_penalty: f32,
    /// How many of the most recent history tokens the penalties look at; 0 = off.
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of every token among the last `repeat_last_n`, in [-2, 2]; 0 = off.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it occurs among the last `repeat_last_n`, in [-2, 2]; 0 = off.
    pub frequency_penalty: f32,
    /// Penalties on continuing a repeat of several tokens ([`dry`]).
    pub dry: DryParams,
    /// Now and then, excluding the most likely tokens ([`xtc`]).
    pub xtc: XtcParams,
    /// A temperature that follows the entropy ([`dynatemp`]).
    pub dynatemp: DynatempParams,
    /// Steering the surprise per token instead of filtering ([`mirostat`]).
    pub mirostat: MirostatParams,
    /// Seed of the sampler's RNG.
    pub seed: u64,
    /// The order of the steps, and which run ([`order`]; the default is the pipeline above).
    pub samplers: SamplerOrder,
}

impl SamplingParams {
    /// llama.cpp's defaults, with a fixed seed (callers wanting a fresh one use [`random_seed`]).
    pub const DEFAULT: SamplingParams = SamplingParams {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.05,
        top_n_sigma: -1.0,
        typical_p: 1.0,
        repeat_penalty: 1.0,
        repeat_last_n: 64,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        dry: DryParams::OFF,
        xtc: XtcParams::OFF,
        dynatemp: DynatempParams::OFF,
        mirostat: MirostatParams::OFF,
        seed: 0,
        samplers: SamplerOrder::DEFAULT,
    };

    /// Greedy decoding: temperature 0, everything else off.
    pub const GREEDY: SamplingParams = SamplingParams {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        top_n_sigma: -1.0,
        typical_p: 1.0,
        repeat_penalty: 1.0,
        repeat_last_n: 0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        dry: DryParams::OFF,
        xtc: XtcParams::OFF,
        dynatemp: DynatempParams::OFF,
        mirostat: MirostatParams::OFF,
        seed: 0,
        samplers: SamplerOrder::DEFAULT,
    };

    /// Checks every parameter's range; NaN and infinities are refused everywhere.
    pub fn validate(&self) -> Result<(), SamplingError> {
        fn check(name: &'static str, value: f32, ok: bool, expected: &'static str) -> Result<(), SamplingError> {
            if value.is_finite() && ok { Ok(()) } else { Err(SamplingError::InvalidParam { name, value, expected }) }
        }
        check("temperature", self.temperature, self.temperature >= 0.0, "a number >= 0 (0 = greedy)")?;
        check("top_p", self.top_p, self.top_p > 0.0 && self.top_p <= 1.0, "a number in (0, 1] (1 = off)")?;
        check("min_p", self.min_p, (0.0..=1.0).contains(&self.min_p), "a number in [0, 1] (0 = off)")?;
        check("top_n_sigma", self.top_n_sigma, true, "a number (<= 0 = off)")?;
        check(
            "typical_p",
            self.typical_p,
            self.typical_p > 0.0 && self.typical_p <= 1.0,
            "a number in (0, 1] (1 = off)",
        )?;
        check("repeat_penalty", self.repeat_penalty, self.repeat_penalty > 0.0, "a number > 0 (1 = off)")?;
        let in_range = |x: f32| (-PENALTY_LIMIT..=PENALTY_LIMIT).contains(&x);
        check("presence_penalty", self.presence_penalty, in_range(self.presence_penalty), "a number in [-2, 2]")?;
        check("frequency_penalty", self.frequency_penalty, in_range(self.frequency_penalty), "a number in [-2, 2]")?;
        self.dry.validate()?;
        self.xtc.validate()?;
        self.dynatemp.validate()?;
        self.mirostat.validate()
    }

    /// Whether any penalty would change the logits (given a history).
    pub fn penalizes(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0)
    }

    /// Whether this samples greedily (the RNG is never used).
    pub fn is_greedy(&self) -> bool {
        // Mirostat skips top-k, so top-k 1 does not make it greedy.
        self.temperature == 0.0
            || (self.top_k == 1 && !self.mirostat.is_on() && self.samplers.contains(order::Step::TopK))
    }
}

/// The largest logit bias either way (OpenAI's range; −infinity also bans a token).
pub const BIAS_LIMIT: f32 = 100.0;

/// Additive biases on chosen tokens' logits (OpenAI's `logit_bias`, llama.cpp's `--logit-bias`), applied before
/// everything else. A bias of −infinity bans the token: its score becomes the lowest finite number, so it is only
/// ever chosen if every token is banned, and then [`Sampler::sample`] fails with
/// [`SamplingError::NothingAllowed`] instead.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogitBias {
    /// By token id, one entry per token.
    entries: Vec<(u32, f32)>,
}

impl LogitBias {
    /// The biases, checked; a token named twice keeps its last bias.
    pub fn new(entries: impl IntoIterator<Item = (u32, f32)>) -> Result<LogitBias, SamplingError> {
        let mut all: Vec<(u32, f32)> = Vec::new();
        for (token, bias) in entries {
            if !(bias == f32::NEG_INFINITY || (-BIAS_LIMIT..=BIAS_LIMIT).contains(&bias)) {
                return Err(SamplingError::InvalidBias { token, bias });
            }
            all.push((token, bias));
        }
        // Stable: the last of equal ids ends up last, and is the one kept.
        all.sort_by_key(|&(token, _)| token);
        let mut entries: Vec<(u32, f32)> = Vec::with_capacity(all.len());
        for e in all {
            match entries.last_mut() {
                Some(last) if last.0 == e.0 => *last = e,
                _ => entries.push(e),
            }
        }
        Ok(LogitBias { entries })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The biases by token id.
    pub fn entries(&self) -> &[(u32, f32)] {
        &self.entries
    }

    /// Checks every token against a vocabulary of `vocab_size`.
    pub fn check_vocab(&self, vocab_size: usize) -> Result<(), SamplingError> {
        match self.entries.last() {
            Some(&(token, _)) if token as usize >= vocab_size => {
                Err(SamplingError::BiasTokenOutOfRange { token, vocab_size })
            }
            _ => Ok(()),
        }
    }
}

/// The largest presence or frequency penalty either way (OpenAI's range).
pub const PENALTY_LIMIT: f32 = 2.0;

impl Default for SamplingParams {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A seed from the clock, the process id and a counter: distinct for requests arriving in the same nanosecond.
pub fn random_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let count = COUNTER.fetch_add(1, AtomicOrdering::Relaxed);
    splitmix64(nanos ^ splitmix64(count ^ (u64::from(std::process::id()) << 32)))
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The id of the largest logit, the lowest id on ties. NaN entries are skipped; an empty slice (or one with no
/// number above −∞) gives 0.
pub fn argmax(logits: &[f32]) -> u32 {
    let max = max_of(logits);
    if max == f32::NEG_INFINITY {
        return 0;
    }
    logits.iter().position(|&v| v == max).map_or(0, |i| i as u32)
}

/// The natural log of token `id`'s probability under the softmax of the raw `logits` (temperature 1, no filters):
/// what OpenAI-style `logprobs` report. NaN if `id` is out of range or the logits are not finite.
pub fn logprob(logits: &[f32], id: u32) -> f32 {
    let Some(&x) = logits.get(id as usize) else { return f32::NAN };
    let max = max_of(logits);
    ((f64::from(x) - f64::from(max)) - exp_sum(logits, max).ln()) as f32
}

/// The `n` most likely tokens under the softmax of the raw `logits` (temperature 1, no filters), most likely first
/// (ties by lowest id), with their natural-log probabilities: OpenAI's `top_logprobs`. Empty for empty logits.
pub fn top_logprobs(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    if logits.is_empty() || n == 0 {
        return Vec::new();
    }
    let max = max_of(logits);
    let log_sum = exp_sum(logits, max).ln();
    let mut best = Vec::new();
    top_k_scan(logits, n.min(logits.len()), &mut best);
    best.sort_unstable_by(by_logit_desc);
    best.iter().map(|c| (c.id, ((f64::from(c.logit) - f64::from(max)) - log_sum) as f32)).collect()
}

/// Lanes for the hot loops: independent accumulators that the compiler can keep in SIMD registers. The lane an
/// element goes to depends only on its index, so results are the same on every platform.
const LANES: usize = 16;

/// The largest value, skipping NaN; −∞ for an empty slice.
fn max_of(values: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            *m = if v > *m { v } else { *m };
        }
    }
    for &v in tail {
        lanes[0] = if v > lanes[0] { v } else { lanes[0] };
    }
    lanes.iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
}

/// Top-nσ's floor, `max − n·σ` with σ the standard deviation of the scores (Tang et al., "Top-nσ: Not All Logits
/// Are You Need", 2024): the informative tokens stand out of a roughly normal mass of noise, and a floor measured in
/// its spread does not move with the temperature. Banned tokens (at `f32::MIN`) are left out of σ: they are not
/// the model's.
fn sigma_floor(scores: &[f32], max: f32, n: f32) -> f32 {
    let (mut count, mut sum, mut squares) = ([0u32; LANES], [0.0f64; LANES], [0.0f64; LANES]);
    for chunk in scores.chunks(LANES) {
        for (lane, &v) in chunk.iter().enumerate() {
            if v > f32::MIN {
                // Relative to the max: the sums stay small and the variance exact enough in f64.
                let x = f64::from(v - max);
                count[lane] += 1;
                sum[lane] += x;
                squares[lane] += x * x;
            }
        }
    }
    let n_all = f64::from(count.iter().sum::<u32>().max(1));
    let mean = sum.iter().sum::<f64>() / n_all;
    let var = (squares.iter().sum::<f64>() / n_all - mean * mean).max(0.0);
    (f64::from(max) - f64::from(n) * var.sqrt()) as f32
}

/// The softmax normalizer `z = Σ exp(logit − max)` of `cands` at temperature 1, and the distribution's entropy
/// `H = −Σ p ln p` in nats (typical sampling and dynamic temperature measure it).
fn softmax_entropy(cands: &[Cand], max: f32) -> (f64, f64) {
    let weights = cands.iter().map(|c| f64::from(exp_nonpos(c.logit - max)));
    let z: f64 = weights.clone().sum();
    let ln_z = z.ln();
    // ln p = (logit − max) − ln z; tokens of zero weight add nothing.
    let entropy = cands
        .iter()
        .zip(weights)
        .filter(|&(_, w)| w > 0.0)
        .map(|(c, w)| -(w / z) * (f64::from(c.logit - max) - ln_z))
        .sum();
    (z, entropy)
}

/// The largest logit of `cands` (−∞ for none).
fn max_of_cands(cands: &[Cand]) -> f32 {
    cands.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.logit))
}

/// Refuses logits no sampler can use: none, more than ids can number, or any NaN or infinity.
fn check_logits(logits: &[f32]) -> Result<(), SamplingError> {
    if logits.is_empty() {
        return Err(SamplingError::EmptyLogits);
    }
    if u32::try_from(logits.len()).is_err() {
        return Err(SamplingError::VocabTooLarge(logits.len()));
    }
    match first_non_finite(logits) {
        Some(index) => Err(SamplingError::NonFiniteLogits { index }),
        None => Ok(()),
    }
}

/// `out` = `logits` with `bias` added (clamped to finite values; a ban stays at `f32::MIN`).
fn biased_copy(logits: &[f32], bias: &LogitBias, out: &mut Vec<f32>) -> Result<(), SamplingError> {
    out.clear();
    out.extend_from_slice(logits);
    for &(token, b) in bias.entries() {
        let Some(v) = out.get_mut(token as usize) else {
            return Err(SamplingError::BiasTokenOutOfRange { token, vocab_size: logits.len() });
        };
        *v = (*v + b).clamp(f32::MIN, f32::MAX);
    }
    Ok(())
}

/// The ids a mask allows (bit `id % 64` of word `id / 64`), in id order, below `n`.
fn allowed(mask: &[u64], n: usize) -> impl Iterator<Item = u32> + '_ {
    mask.iter().enumerate().flat_map(move |(w, &word)| {
        let mut bits = word;
        std::iter::from_fn(move || {
            (bits != 0).then(|| {
                let id = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                id
            })
        })
        .take_while(move |&id| id < n)
        .map(|id| id as u32)
    })
}

/// The index of the first NaN or infinity.
fn first_non_finite(values: &[f32]) -> Option<usize> {
    const BLOCK: usize = 256;
    for (b, block) in values.chunks(BLOCK).enumerate() {
        // Branch-free check of a whole block (vectorizes), then locate the culprit only if there is one.
        if !block.iter().fold(true, |ok, v| ok & v.is_finite()) {
            return block.iter().position(|v| !v.is_finite()).map(|i| b * BLOCK + i);
        }
    }
    None
}

/// `exp(x)` for `x <= 0` (or −∞), in plain arithmetic: the same bits on every platform (libm's `expf` differs between
/// platforms in the last place) and vectorizable. Relative error about 2e-7; results below 2^-126 flush to 0.
#[inline(always)]
fn exp_nonpos(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75; // ln 2 split in two so that n * LN2_HI is exact
    const LN2_LO: f32 = 1.428_606_8e-6;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits
    let flush = x < -87.0;
    let x = if flush { -87.0 } else { x };
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let n_int = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let r = (x - n * LN2_HI) - n * LN2_LO;
    // Taylor polynomial of e^r on |r| <= ln2 / 2.
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let scale = f32::from_bits(((n_int + 127) << 23) as u32);
    if flush { 0.0 } else { p * scale }
}

/// The sum of `exp(v - max)` over `values` (each `v <= max`), in f64, with lane accumulators.
fn exp_sum(values: &[f32], max: f32) -> f64 {
    let mut lanes = [0.0f64; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (acc, &v) in lanes.iter_mut().zip(chunk) {
            *acc += f64::from(exp_nonpos(v - max));
        }
    }
    for &v in tail {
        lanes[0] += f64::from(exp_nonpos(v - max));
    }
    lanes.iter().sum()
}

/// One token of the final distribution: see [`Sampler::distribution`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenProb {
    pub id: u32,
    pub prob: f32,
}

/// A token still in the running, with its (penalized) logit.
#[derive(Debug, Clone, Copy)]
struct Cand {
    id: u32,
    logit: f32,
}

/// Highest logit first, then lowest id: a total order on finite logits (−0 and +0 tie, as in [`argmax`]).
fn by_logit_desc(a: &Cand, b: &Cand) -> Ordering {
    b.logit.partial_cmp(&a.logit).unwrap_or(Ordering::Equal).then(a.id.cmp(&b.id))
}

/// What the filters left.
enum Prepared {
    /// One token, chosen without the RNG.
    Greedy(u32),
    /// `cands` holds the survivors, in draw order; `max` is their largest logit.
    Candidates { max: f32 },
}

/// Samples tokens for one sequence: its parameters, its RNG and reusable scratch space.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    ln_min_p: f32,
    rng: ChaCha8Rng,
    bias: LogitBias,
    /// The biased and penalized copy of the logits (only when a bias or a penalty is on).
    penalized: Vec<f32>,
    /// The scores of the tokens a mask allows, and their ids (only when sampling with a mask).
    masked: Vec<f32>,
    masked_ids: Vec<u32>,
    /// Recent tokens, sorted, for the penalties.
    recent: Vec<u32>,
    cands: Vec<Cand>,
    weights: Vec<f32>,
    dist: Vec<TokenProb>,
    top_p: TopPScratch,
    /// DRY's sequence breakers (sorted token ids) and scratch space.
    dry_breakers: Arc<[u32]>,
    dry: dry::DryScratch,
    /// Typical sampling's ranking and survivors.
    typical_ranked: Vec<(f64, Cand)>,
    typical_kept: Vec<Cand>,
    /// Mirostat's bound on the surprise, in bits (moves after every draw).
    mirostat_mu: f32,
}

impl Sampler {
    /// A sampler for `params`, which are validated; the RNG is seeded from `params.seed`.
    pub fn new(params: SamplingParams) -> Result<Self, SamplingError> {
        params.validate()?;
        Ok(Sampler {
            params,
            ln_min_p: params.min_p.ln(),
            rng: ChaCha8Rng::seed_from_u64(params.seed),
            bias: LogitBias::default(),
            penalized: Vec::new(),
            masked: Vec::new(),
            masked_ids: Vec::new(),
            recent: Vec::new(),
            cands: Vec::new(),
            weights: Vec::new(),
            dist: Vec::new(),
            top_p: TopPScratch::default(),
            dry_breakers: Arc::from([]),
            dry: dry::DryScratch::default(),
            typical_ranked: Vec::new(),
            typical_kept: Vec::new(),
            mirostat_mu: params.mirostat.initial_mu(),
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Biases every later draw with `bias` (replacing any earlier one).
    pub fn set_logit_bias(&mut self, bias: LogitBias) {
        self.bias = bias;
    }

    /// The tokens that end a DRY match (sorted ids; [`dry::resolve_breakers`] finds them for a tokenizer). None by
    /// default.
    pub fn set_dry_breakers(&mut self, breakers: Arc<[u32]>) {
        debug_assert!(breakers.is_sorted());
        self.dry_breakers = breakers;
    }

    /// Restarts the RNG from `seed` and Mirostat's bound (as if the sampler had been built with it).
    pub fn reseed(&mut self, seed: u64) {
        self.params.seed = seed;
        self.rng = ChaCha8Rng::seed_from_u64(seed);
        self.mirostat_mu = self.params.mirostat.initial_mu();
    }

    /// Mirostat's current bound on the surprise, in bits (`2·tau` until the first draw).
    pub fn mirostat_mu(&self) -> f32 {
        self.mirostat_mu
    }

    /// Picks the next token from `logits` (one per vocabulary entry). `history` is the sequence so far (prompt and
    /// generated tokens), which the repeat penalty looks at.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32, SamplingError> {
        self.sample_inner(logits, history, None)
    }

    /// [`sample`](Self::sample) among the tokens `mask` allows only (bit `id % 64` of word `id / 64`; structured
    /// output). The mask applies after the repeat penalty and before every filter, so the filters and the draw see
    /// the model's distribution renormalized over the allowed tokens. Missing words count as zero.
    pub fn sample_masked(&mut self, logits: &[f32], history: &[u32], mask: &[u64]) -> Result<u32, SamplingError> {
        self.sample_inner(logits, history, Some(mask))
    }

    fn sample_inner(&mut self, logits: &[f32], history: &[u32], mask: Option<&[u64]>) -> Result<u32, SamplingError> {
        match self.prepare(logits, history, mask, true)? {
            Prepared::Greedy(id) => Ok(id),
            Prepared::Candidates { mut max } => {
                let (xtc, mirostat) = (self.params.xtc, self.params.mirostat);
                // The coin is tossed only when XTC is on, so a request without it draws what it drew before XTC.
                // (An order of the steps tossed it where XTC stands.)
                if xtc.is_on() && !mirostat.is_on() && !self.ordered() && self.rng.random::<f32>() < xtc.probability {
                    max = xtc::exclude_top_choices(&mut self.cands, max, xtc.threshold);
                }
                let (id, prob) = self.draw(max);
                if mirostat.is_on() {
                    self.mirostat_mu = mirostat.update(self.mirostat_mu, prob);
                }
                Ok(id)
            }
        }
    }

    /// The distribution [`sample`](Self::sample) would draw from, without drawing (the RNG is not touched): the
    /// surviving tokens with their probabilities after every step including temperature, in draw order (most likely
    /// first after top-k or a small top-p; otherwise id order). Greedy gives one token with probability 1. XTC,
    /// which acts by chance, is left out: this is the distribution when its coin says no.
    pub fn distribution(&mut self, logits: &[f32], history: &[u32]) -> Result<&[TokenProb], SamplingError> {
        self.dist.clear();
        match self.prepare(logits, history, None, false)? {
            Prepared::Greedy(id) => self.dist.push(TokenProb { id, prob: 1.0 }),
            Prepared::Candidates { max } => {
                let sum = self.weigh(max);
                let dist = &mut self.dist;
                dist.extend(
                    self.cands
                        .iter()
                        .zip(&self.weights)
                        .map(|(c, &w)| TokenProb { id: c.id, prob: (f64::from(w) / sum) as f32 }),
                );
            }
        }
        Ok(&self.dist)
    }

    /// Runs penalties, the mask and the filters; leaves the survivors in `self.cands` unless the answer is already
    /// known.
    /// The steps before the draw: fused ([`Sampler::filter`]) in the default order, else one by one
    /// ([`Sampler::filter_ordered`], which tosses XTC's coin where it stands if `toss_xtc`).
    fn prepare(
        &mut self,
        logits: &[f32],
        history: &[u32],
        mask: Option<&[u64]>,
        toss_xtc: bool,
    ) -> Result<Prepared, SamplingError> {
        if self.ordered() {
            return self.filter_ordered(logits, history, mask, toss_xtc);
        }
        let Some(mask) = mask else { return self.filter(logits, history, None) };
        // The filters run on the allowed tokens' scores alone, numbered 0..; their ids are mapped back after. The
        // mapping keeps id order, so ties and the draw order come out as without a mask.
        let mut masked = std::mem::take(&mut self.masked);
        let mut ids = std::mem::take(&mut self.masked_ids);
        let prepared = self.filter(logits, history, Some((mask, &mut masked, &mut ids)));
        let prepared = prepared.map(|p| match p {
            Prepared::Greedy(i) => Prepared::Greedy(ids[i as usize]),
            Prepared::Candidates { max } => {
                for c in &mut self.cands {
                    c.id = ids[c.id as usize];
                }
                Prepared::Candidates { max }
            }
        });
        self.masked = masked;
        self.masked_ids = ids;
        prepared
    }

    /// [`prepare`](Self::prepare) with the mask's scratch space passed in.
    fn filter(
        &mut self,
        logits: &[f32],
        history: &[u32],
        mask: Option<(&[u64], &mut Vec<f32>, &mut Vec<u32>)>,
    ) -> Result<Prepared, SamplingError> {
        check_logits(logits)?;
        let Sampler {
            params,
            ln_min_p,
            bias,
            penalized,
            recent,
            cands,
            top_p: top_p_scratch,
            dry_breakers,
            dry,
            typical_ranked,
            typical_kept,
            mirostat_mu,
            ..
        } = self;
        let window = &history[history.len().saturating_sub(params.repeat_last_n)..];
        let penalize = params.penalizes() && !window.is_empty();
        let dry_on = params.dry.is_on() && history.len() > 1;
        let scores: &[f32] = if penalize || dry_on || !bias.is_empty() {
            biased_copy(logits, bias, penalized)?;
            if penalize {
                apply_penalties(window, params, penalized, recent)?;
            }
            if dry_on {
                dry::apply(history, &params.dry, dry_breakers, penalized, dry)?;
            }
            penalized
        } else {
            logits
        };
        let scores: &[f32] = match mask {
            None => scores,
            Some((mask, masked, ids)) => {
                masked.clear();
                ids.clear();
                for id in allowed(mask, scores.len()) {
                    masked.push(scores[id as usize]);
                    ids.push(id);
                }
                if masked.is_empty() {
                    return Err(SamplingError::NothingAllowed);
                }
                masked
            }
        };

        let max = max_of(scores);
        if max == f32::MIN && bias.entries().iter().any(|&(_, b)| b == f32::NEG_INFINITY) {
            // Every token left is banned (or scores as low as a banned one).
            return Err(SamplingError::NothingAllowed);
        }
        let best = scores.iter().position(|&v| v == max).map_or(0, |i| i as u32);
        if params.is_greedy() {
            return Ok(Prepared::Greedy(best));
        }
        if params.mirostat.is_on() {
            // Even a single candidate is drawn, so that its surprise (0 bits) moves mu back up.
            mirostat::candidates(&params.mirostat, scores, (max, best), params.temperature, *mirostat_mu, cands);
            return Ok(Prepared::Candidates { max });
        }

        let vocab = scores.len();
        let top_p_on = params.top_p < 1.0;
        let typical_on = params.typical_p < 1.0;
        // Top-nσ's floor (f32::MIN, keeping all, when off): it comes first, so top-p measures the mass of what it
        // leaves.
        let floor = if params.top_n_sigma > 0.0 { sigma_floor(scores, max, params.top_n_sigma) } else { f32::MIN };
        cands.clear();
        // Total probability mass (unnormalized, relative to the max) of what top-nσ and top-k leave, for top-p.
        let mut mass = 0.0f64;
        let mut sorted = false;
        if params.top_k > 0 && params.top_k < vocab {
            top_k_scan(scores, params.top_k, cands);
            cands.sort_unstable_by(by_logit_desc);
            if floor > f32::MIN {
                cands.retain(|c| c.logit >= floor);
            }
            sorted = true;
            if top_p_on && !typical_on {
                mass = cands.iter().map(|c| f64::from(exp_nonpos(c.logit - max))).sum();
            }
        } else {
            // (With typical on, top-p measures what typical leaves: its mass is taken after it, below.)
            if top_p_on && !typical_on {
                mass = if floor > f32::MIN {
                    scores.iter().filter(|&&s| s >= floor).map(|&s| f64::from(exp_nonpos(s - max))).sum()
                } else {
                    exp_sum(scores, max)
                };
            }
            // Min-p comes after top-p, but both keep a most-likely-first prefix of the candidates, so their result
            // is the shorter prefix: dropping min-p's rejects first changes nothing and spares top-p the work.
            // Typical sampling measures the entropy of everything, so it needs them all.
            let cut = if typical_on { f32::NEG_INFINITY } else { *ln_min_p };
            cands.extend(
                scores
                    .iter()
                    .enumerate()
                    .filter(|&(_, &s)| s - max >= cut && s >= floor)
                    .map(|(i, &s)| Cand { id: i as u32, logit: s }),
            );
        }

        let mut max = max;
        if typical_on {
            typical::keep_typical(cands, max, params.typical_p, typical_ranked, typical_kept);
            sorted = true;
            // Typical sampling may drop the most likely token; top-p and min-p measure what it left.
            max = cands.first().map_or(max, |c| c.logit);
            if top_p_on {
                mass = cands.iter().map(|c| f64::from(exp_nonpos(c.logit - max))).sum();
            }
        }

        if top_p_on {
            top_p_cut(cands, max, f64::from(params.top_p) * mass, sorted, top_p_scratch);
        }

        if params.min_p > 0.0 {
            let cut = *ln_min_p;
            cands.retain(|c| c.logit - max >= cut);
        }

        match cands.as_slice() {
            [] => Ok(Prepared::Greedy(best)), // unreachable in exact arithmetic: the max survives every filter
            [only] => Ok(Prepared::Greedy(only.id)),
            _ => Ok(Prepared::Candidates { max }),
        }
    }

    /// Fills `weights` with the candidates' unnormalized probabilities at the temperature (a dynamic one if that is
    /// on); returns their sum.
    fn weigh(&mut self, max: f32) -> f64 {
        let p = &self.params;
        let t = if self.ordered() {
            // The order applied the temperature (or left it out) already.
            1.0
        } else if p.dynatemp.is_on() && !p.mirostat.is_on() {
            p.dynatemp.temperature(p.temperature, &self.cands, max)
        } else {
            p.temperature
        };
        self.weights.clear();
        if t <= 0.0 {
            // A dynamic temperature can reach 0: greedy among the candidates (the first of equal maxima).
            let best = self.cands.iter().position(|c| c.logit == max).unwrap_or(0);
            self.weights.extend((0..self.cands.len()).map(|i| if i == best { 1.0 } else { 0.0 }));
            return 1.0;
        }
        self.weights.resize(self.cands.len(), 0.0);
        let mut lanes = [0.0f64; LANES];
        for (ws, cs) in self.weights.chunks_mut(LANES).zip(self.cands.chunks(LANES)) {
            for ((w, c), acc) in ws.iter_mut().zip(cs).zip(lanes.iter_mut()) {
                // Division, not multiplication by 1/t: a tiny t makes 1/t infinite and 0 × ∞ NaN.
                *w = exp_nonpos((c.logit - max) / t);
                *acc += f64::from(*w);
            }
        }
        lanes.iter().sum()
    }

    /// Draws one of `cands` in proportion to its weight; returns it with its probability.
    fn draw(&mut self, max: f32) -> (u32, f64) {
        let sum = self.weigh(max);
        let target = self.rng.random::<f64>() * sum;
        let mut cum = 0.0f64;
        for (c, &w) in self.cands.iter().zip(&self.weights) {
            cum += f64::from(w);
            if cum > target {
                return (c.id, f64::from(w) / sum);
            }
        }
        // Rounding left the target at the very top: the last token with any weight.
        let last = self.cands.iter().zip(&self.weights).rev().find(|&(_, &w)| w > 0.0);
        last.map_or((self.cands[0].id, 1.0), |(c, &w)| (c.id, f64::from(w) / sum))
    }
}

/// Applies the penalties to the scores `out` of each distinct token of `window`: the repeat penalty, then
/// `count × frequency + presence`.
fn apply_penalties(
    window: &[u32],
    params: &SamplingParams,
    out: &mut [f32],
    recent: &mut Vec<u32>,
) -> Result<(), SamplingError> {
    recent.clear();
    recent.extend_from_slice(window);
    recent.sort_unstable();
    for run in recent.chunk_by(|a, b| a == b) {
        let token = run[0];
        let Some(v) = out.get_mut(token as usize) else {
            return Err(SamplingError::TokenOutOfRange { token, vocab_size: out.len() });
        };
        let penalty = params.repeat_penalty;
        let p = if *v > 0.0 { *v / penalty } else { *v * penalty };
        let p = p - (run.len() as f32 * params.frequency_penalty + params.presence_penalty);
        // A tiny repeat penalty can overflow a large logit: saturate rather than poison the rest with infinities.
        *v = p.clamp(f32::MIN, f32::MAX);
    }
    Ok(())
}

/// Top-p's cut: keeps the most likely candidates (largest logit `max`) until their unnormalized mass reaches
/// `target`. `sorted`: `cands` is in [`by_logit_desc`] order, so the cut is a prefix; otherwise
/// [`top_p_unsorted`] finds it without sorting.
fn top_p_cut(cands: &mut Vec<Cand>, max: f32, target: f64, sorted: bool, scratch: &mut TopPScratch) {
    if !sorted {
        return top_p_unsorted(cands, max, target, scratch);
    }
    let mut cum = 0.0f64;
    if let Some(last) = cands.iter().position(|c| {
        cum += f64::from(exp_nonpos(c.logit - max));
        cum >= target
    }) {
        cands.truncate(last + 1);
    }
}

/// Leaves the `k` best of `scores` (by [`by_logit_desc`]) in `out`, in no particular order. One pass over the
/// vocabulary: candidates go into a buffer of at most `2k` (at least `k + 64`) entries, which is cut back to the best
/// `k` whenever it fills; after a cut only scores strictly above the `k`-th best can enter. Scanning in id order makes
/// the strict comparison right for ties: a later equal score has a higher id, so it loses.
fn top_k_scan(scores: &[f32], k: usize, out: &mut Vec<Cand>) {
    debug_assert!(k >= 1);
    let limit = k.saturating_add(k.max(64));
    out.clear();
    out.reserve(limit.min(scores.len()));
    let mut threshold = f32::NEG_INFINITY;
    for (i, &s) in scores.iter().enumerate() {
        if s > threshold {
            out.push(Cand { id: i as u32, logit: s });
            if out.len() >= limit {
                out.select_nth_unstable_by(k - 1, by_logit_desc);
                out.truncate(k);
                threshold = out[k - 1].logit;
            }
        }
    }
    if out.len() > k {
        out.select_nth_unstable_by(k - 1, by_logit_desc);
        out.truncate(k);
    }
}

/// Scratch space of [`top_p_unsorted`].
#[derive(Debug, Clone, Default)]
struct TopPScratch {
    mass: Vec<f64>,
    boundary: Vec<Cand>,
}

/// Top-p over candidates that are not sorted (top-k was off), given the mass `target` to reach. Few candidates are
/// simply sorted. Many (a flat distribution can leave most of a 262k vocabulary in the nucleus) are not: a histogram
/// of their probability mass over 1024 logit buckets finds the bucket where the cumulative mass crosses `target`,
/// and only that bucket is sorted to find the exact cut. What survives keeps its order, so the draw order does not
/// depend on how the cut was found.
fn top_p_unsorted(cands: &mut Vec<Cand>, max: f32, target: f64, scratch: &mut TopPScratch) {
    const SMALL: usize = 1024;
    const BUCKETS: usize = 1024;
    if cands.len() <= SMALL {
        cands.sort_unstable_by(by_logit_desc);
        let mut cum = 0.0f64;
        if let Some(last) = cands.iter().position(|c| {
            cum += f64::from(exp_nonpos(c.logit - max));
            cum >= target
        }) {
            cands.truncate(last + 1);
        }
        return;
    }

    let lo = cands.iter().fold(max, |lo, c| lo.min(c.logit));
    let range = f64::from(max) - f64::from(lo);
    let scale = if range > 0.0 { (BUCKETS - 1) as f64 / range } else { 0.0 };
    // Monotone in the logit: a higher logit never lands in a later bucket.
    let bucket = |v: f32| (((f64::from(max) - f64::from(v)) * scale) as usize).min(BUCKETS - 1);
    let TopPScratch { mass, boundary } = scratch;
    mass.clear();
    mass.resize(BUCKETS, 0.0);
    for c in cands.iter() {
        mass[bucket(c.logit)] += f64::from(exp_nonpos(c.logit - max));
    }
    let mut cum = 0.0f64;
    let Some(cut_bucket) = mass.iter().position(|&m| {
        if cum + m >= target {
            return true;
        }
        cum += m;
        false
    }) else {
        return; // min-p already cut deeper than top-p would: keep everything
    };
    boundary.clear();
    boundary.extend(cands.iter().filter(|c| bucket(c.logit) == cut_bucket));
    boundary.sort_unstable_by(by_logit_desc);
    let cut = boundary
        .iter()
        .find(|c| {
            cum += f64::from(exp_nonpos(c.logit - max));
            cum >= target
        })
        .or(boundary.last())
        .copied();
    if let Some(cut) = cut {
        cands.retain(|c| by_logit_desc(c, &cut) != Ordering::Greater);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_nonpos_is_accurate() {
        assert_eq!(exp_nonpos(0.0), 1.0);
        assert_eq!(exp_nonpos(-0.0), 1.0);
        assert_eq!(exp_nonpos(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpos(-1e30), 0.0);
        assert_eq!(exp_nonpos(-88.0), 0.0);
        let mut x = 0.0f32;
        while x > -87.0 {
            let want = f64::from(x).exp();
            let got = f64::from(exp_nonpos(x));
            assert!(((got - want) / want).abs() < 5e-7, "exp({x}) = {got}, want {want}");
            x -= 0.0137;
        }
    }

    fn capacities(s: &Sampler) -> [usize; 7] {
        [
            s.penalized.capacity(),
            s.recent.capacity(),
            s.cands.capacity(),
            s.weights.capacity(),
            s.dist.capacity(),
            s.top_p.mass.capacity(),
            s.top_p.boundary.capacity(),
        ]
    }

    #[test]
    fn a_warm_sampler_does_not_allocate() {
        let vocab = 50_000;
        let logits = |salt: u32| -> Vec<f32> {
            (0..vocab as u32).map(|i| ((i.wrapping_mul(2_654_435_761) ^ salt) % 1000) as f32 / 100.0).collect()
        };
        let history: Vec<u32> = (0..100).map(|i| i * 31).collect();
        for params in [
            SamplingParams::default(),
            SamplingParams { repeat_penalty: 1.2, ..Default::default() },
            SamplingParams::GREEDY,
        ] {
            let mut sampler = Sampler::new(params).unwrap();
            let first = logits(0);
            sampler.sample(&first, &history).unwrap();
            let warm = capacities(&sampler);
            for salt in 1..30 {
                sampler.sample(&logits(salt), &history).unwrap();
                assert_eq!(capacities(&sampler), warm, "{params:?}");
            }
        }
    }

    #[test]
    fn max_and_finiteness_scans() {
        let mut v: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
        assert_eq!(max_of(&v), 50.0);
        assert_eq!(first_non_finite(&v), None);
        v[777] = f32::NAN;
        v[900] = f32::INFINITY;
        assert_eq!(first_non_finite(&v), Some(777));
        assert_eq!(max_of(&[]), f32::NEG_INFINITY);
        assert_eq!(max_of(&[f32::NAN, -3.0]), -3.0);
        let sum = exp_sum(&[0.0; 37], 0.0);
        assert_eq!(sum, 37.0);
    }
}
